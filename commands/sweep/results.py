"""A sweep folder's finished runs read back as rows: per (dataset, model) the seeds that finished and
their scores at the last checkpoint and over the last three evaluations, labelled by the settings
they trained with."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dt_primal.config import ADDED_LATER, PRESETS
from dt_primal.errors import UserError
from dt_primal.evaluation.reports import mean_std, score
from dt_primal.files.reading import is_count
from dt_primal.files.records import evaluated_alike, read_curve, read_record
from dt_primal.files.run_folder import CURVE, RECORD, group_dir, linked, run_dir, seed_folder

DT_MATCHED = "DT (matched settings)"  # --model dt at Primal.+DT's settings: the controlled comparison
DT_PAPER = "DT (DT paper's settings)"  # --preset dt-paper: the settings the paper's Table 4 compares with
LABELS = {"dt": DT_MATCHED, "primal": "Primal.+DT", "primalformer": "PrimalFormer", "bc": "BC"}
LABEL_NOTES = {
    DT_MATCHED: "`--model dt` at the same settings as Primal.+DT (the controlled comparison)",
    DT_PAPER: "`--model dt --preset dt-paper`: the original DT paper's d_model 128, 1 head, lr 1e-4, as the "
    "paper's Table 4 compared (docs/method.md, Hyper-parameters)",
}
SETTINGS = ("d_model", "n_head", "lr")  # what tells the two DT baselines apart
RECORDED = SETTINGS + ("precision", "top_percent")  # what run_settings reports


def run_settings(group: Path, seed: int) -> dict | None:
    """The ``RECORDED`` settings a finished run trained with, from the config its eval.json records; None
    for a record without them."""
    cfg = read_record(seed_folder(group, seed) / RECORD, reports=False).get("config")
    if not isinstance(cfg, dict):
        return None
    cfg = {**ADDED_LATER, **cfg}
    return {k: cfg[k] for k in RECORDED} if all(k in cfg for k in RECORDED) else None


def label_of(model: str, settings: dict | None, default: str | None) -> str:
    """The row's label: a DT's from the settings it trained with when they are known (the DT paper's
    d_model, heads and lr, or else the matched baseline), BC's from the share of the data it trained on ("BC",
    "10 %BC"), otherwise ``default`` or the model's."""
    percent = (settings or {}).get("top_percent", 100)
    if model == "bc" and percent < 100:
        return f"{percent:g} %BC"
    if model == "dt" and settings is not None:
        paper = all(settings[k] == PRESETS["dt-paper"][k] for k in SETTINGS)
        return DT_PAPER if paper else DT_MATCHED
    return default or LABELS.get(model, model)


def curve_points(rd: Path) -> list[dict]:
    """A finished run's evaluations in step order: those during training (evals.jsonl) and the final
    one (eval.json), each as {"step", "scores": ``score`` per target}; all evaluated alike."""
    final = read_record(rd / RECORD)
    pts = [p for p in read_curve(rd / CURVE) if p["step"] < final["step"]] + [final]
    odd = [p["step"] for p in pts[:-1] if evaluated_alike(p["reports"]) != evaluated_alike(final["targets"])]
    if odd:
        raise UserError(
            f"{rd / CURVE}: its evaluation at step {odd[0]} has other targets (or returns where the final one has "
            f"scores) than {rd / RECORD}; a curve is read only where every point was evaluated alike."
        )
    return [
        {"step": p["step"], "scores": [score(r) for r in p["reports" if "reports" in p else "targets"]]} for p in pts
    ]


LAST_N = 3  # "mean of the last three evaluations" beside the last checkpoint


def last_evaluations(curve: list[dict], config: object) -> list[dict] | None:
    """A curve's (``curve_points``) last ``LAST_N`` points, when they are the final evaluation and the evaluation
    steps just before it (every ``eval_every`` steps of the run's recorded ``config``); None where one is missing
    (a point lost, or a config that does not say), so that no mean mixes other steps than its row's other seeds'."""
    every = config.get("eval_every") if isinstance(config, dict) else None
    if not is_count(every) or every == 0 or not curve:
        return None
    final = curve[-1]["step"]
    last_periodic = (final - 1) // every * every
    steps = [last_periodic - k * every for k in reversed(range(LAST_N - 1))] + [final]
    return curve[-LAST_N:] if steps[0] > 0 and [p["step"] for p in curve[-LAST_N:]] == steps else None


def seed_records(out: Path, dataset: str, model: str, seeds: list[int]) -> tuple[list[int], list[dict]]:
    """The seeds of one row that finished and their records (``read_record``), refused with a message naming the
    record where one is read through a link (it may lie outside ``out``) or where the seeds were not evaluated
    alike (other targets, or returns beside scores: a mean of them means nothing)."""
    paths = {s: run_dir(out, dataset, model, s) / RECORD for s in seeds}
    for path in paths.values():
        if linked(path, out):
            raise UserError(f"{path} is read through a link; a sweep's records are its own files. Copy it there.")
    finished = [s for s, path in paths.items() if path.exists()]
    evals = [read_record(paths[s]) for s in finished]
    for s, e in zip(finished, evals):
        if evaluated_alike(e["targets"]) != evaluated_alike(evals[0]["targets"]):
            raise UserError(
                f"{paths[s]} was evaluated with other targets (or returns where seed {finished[0]} has scores) "
                f"than {paths[finished[0]]}; the seeds of one row are averaged only when evaluated alike."
            )
    return finished, evals


def collect(
    out: Path,
    datasets: list[str],
    models: list[str],
    seeds: list[int],
    label: str | None = None,
    name: str | None = None,
) -> list[dict]:
    """One row per (dataset, model) of the sweep folder ``out``: the seeds that finished and, per
    target, their normalised score mean ± std (ddof 0) at the last checkpoint, with the seeds' final
    scores, and the same for each seed's mean of its last three evaluations (the final one and the
    two before it, which used fewer episodes). ``label`` names the rows whose settings cannot be
    read (default: the model's, "DT (matched settings)" for dt); ``name``, their short name in the
    table's model column and the plots' keys (default: the model)."""
    rows = []
    for d in datasets:
        for m in models:
            gd = group_dir(out, d, m)
            finished, evals = seed_records(out, d, m, seeds)
            if not finished:
                continue
            lasts = [
                last_evaluations(curve_points(run_dir(out, d, m, s)), e.get("config")) for s, e in zip(finished, evals)
            ]
            targets = [r["target"] for r in evals[0]["targets"]]
            per_target = []
            for i, t in enumerate(targets):
                entry = {"target": t, **mean_std([score(e["targets"][i]) for e in evals])}
                if all(lasts) and len({tuple(p["step"] for p in last) for last in lasts}) == 1:
                    entry["last3"] = {
                        **mean_std([np.mean([p["scores"][i] for p in last]) for last in lasts]),
                        "steps": [p["step"] for p in lasts[0]],
                    }
                per_target.append(entry)
            settings = run_settings(gd, finished[0])
            rows.append(
                {
                    "dataset": d,
                    "model": m,
                    "name": name or m,
                    "label": label_of(m, settings, label),
                    "settings": settings,
                    "dir": str(gd),
                    "finished_seeds": finished,
                    "step": evals[0]["step"],
                    "episodes": evals[0]["targets"][0]["episodes"],
                    "targets": per_target,
                    "unit": "return" if evals[0]["targets"][0]["normalized_mean"] is None else "normalised",
                }
            )
    return rows
