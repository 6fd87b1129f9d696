"""``python -m commands.conditioning CKPT... --out DIR``: does a return-conditioned policy earn what it is asked
for? Each checkpoint is evaluated over a sweep of target returns (by default ``--points`` targets from zero to
1.5 × the dataset's best episode return, ``--episodes`` episodes each, all targets and checkpoints batched as
evaluate.py batches them), and DIR gets:

  conditioning.json   per checkpoint and per model: the return and normalised score achieved at each target
                      (mean and 95 % interval), and the curve's two summary numbers (docs/method.md)
  conditioning.png    achieved against asked (normalised), one line per model with its seeds' interval, the
                      diagonal, the dataset's best and median episode returns marked, BC as a flat line
  evaluation.json     evaluate.py's own report of the same episodes (and its .md table)

A BC checkpoint among CKPT is evaluated once (it ignores the target) and drawn flat. Every other option is
evaluate.py's (--env-workers, --precision, --device, --seed, --video DIR ...) and works as it does there:

  python -m commands.conditioning runs/sweep/*/dt/seed_*/last.pt runs/sweep/*/primal/seed_*/last.pt --out runs/cond
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from pathlib import Path

import numpy as np

from dt_primal.cli import command_parser, run_main
from dt_primal.errors import UserError
from dt_primal.evaluation import intervals as iv
from dt_primal.files.writing import write_file

MAX_TARGETS = 100  # more would take long and draw nothing clearer
BEYOND = 1.5  # the default sweep ends at this multiple of the dataset's best episode return


def parser() -> argparse.ArgumentParser:
    p = command_parser(__doc__, prog="python -m commands.conditioning")
    p.add_argument("checkpoints", nargs="+", type=Path, help="checkpoints (last.pt) or exported policies (.onnx)")
    p.add_argument("--out", type=Path, required=True, help="the folder of conditioning.json and conditioning.png")
    p.add_argument("--targets", type=float, nargs="+", default=None, help="the target returns (default: the sweep)")
    p.add_argument("--points", type=int, default=10, help="targets of the default sweep (default 10)")
    p.add_argument("--episodes", type=int, default=10, help="episodes per target and checkpoint (default 10)")
    p.add_argument(
        "--dataset",
        default=None,
        help="the dataset whose best and median episode returns set the sweep and are marked (default: the "
        "first checkpoint's, when it is a suite id such as dt-primal/hopper/medium-replay-v2)",
    )
    return p


def check_targets(targets: list[float]) -> list[float]:
    """``targets`` if they can be swept: 1 to ``MAX_TARGETS`` finite returns; a UserError otherwise."""
    if not targets:
        raise UserError("--targets needs at least one return to condition on.")
    if len(targets) > MAX_TARGETS:
        raise UserError(f"--targets gives {len(targets)} returns; a sweep takes at most {MAX_TARGETS}.")
    if not all(math.isfinite(t) for t in targets):
        raise UserError(f"--targets must be finite returns (got {' '.join(f'{t:g}' for t in targets)}).")
    return [float(t) for t in targets]


def sweep(best: float, points: int) -> list[float]:
    """``points`` targets evenly from zero to ``BEYOND`` × the best episode return ``best``."""
    if not 2 <= points <= MAX_TARGETS:
        raise UserError(f"--points must be between 2 and {MAX_TARGETS} (got {points}).")
    return [round(float(t), 1) for t in np.linspace(0.0, BEYOND * best, points)]


def dataset_of(args) -> str | None:
    """The dataset to mark: ``--dataset``, else the first checkpoint's when it is a suite id (a path recorded in
    a checkpoint is never opened: the file may come from anyone)."""
    from datasets.suite import SUITE_NAMESPACE, parse_suite_id
    from dt_primal.files.checkpoint import load_checkpoint

    if args.dataset is not None:
        return args.dataset
    first = args.checkpoints[0]
    recorded = None if first.suffix == ".onnx" else load_checkpoint(first).get("dataset")
    if isinstance(recorded, str) and recorded.startswith(SUITE_NAMESPACE + "/"):
        parse_suite_id(recorded)
        return recorded
    return None


def data_returns(spec: str) -> dict:
    """The best and median episode returns of the dataset ``spec``."""
    from datasets.loaders import load_dataset

    returns = load_dataset(spec).episode_returns()
    return {"dataset": spec, "best_return": float(returns.max()), "median_return": float(np.median(returns))}


def estimate(values) -> dict:
    """The mean of ``values`` with its 95 % bootstrap interval (None where there are fewer than two)."""
    e = iv.interval(np.asarray(values, dtype=float))
    return {"mean": e.value, "interval": None if e.low is None else [e.low, e.high]}


def summary_numbers(targets: list[float], achieved: list[float], best: float) -> dict:
    """A curve's two numbers, normalised (docs/method.md): ``tracking_gap``, the mean absolute gap between the
    score achieved and the score asked over the targets up to the data's best ``best``; ``beyond_best``, the best
    score achieved less the data's best."""
    inside = [abs(a - t) for t, a in zip(targets, achieved) if t <= best + 1e-9]
    return {"tracking_gap": float(np.mean(inside)) if inside else None, "beyond_best": float(max(achieved) - best)}


def run_curve(record: dict, normalize) -> dict:
    """One checkpoint's points: per target, the return and normalised score achieved (mean and interval over its
    episodes)."""
    points = []
    for r in record["targets"]:
        returns = np.asarray(r["returns"], dtype=float)
        point = {"target": r["target"], "episodes": r["episodes"], "return": estimate(returns)}
        point["normalized"] = None if normalize is None else estimate(normalize(returns))
        point["target_normalized"] = None if normalize is None or r["target"] is None else float(normalize(r["target"]))
        points.append(point)
    return {"checkpoint": record["checkpoint"], "model": record["model"], "seed": record["seed"], "points": points}


def model_curves(runs: list[dict], norm_best: float | None) -> list[dict]:
    """Per model, the mean over its checkpoints (seeds) at each target with its interval over them, and the
    summary numbers of each seed's curve averaged the same way."""
    models = {}
    for run in runs:
        models.setdefault(run["model"], []).append(run)
    curves = []
    for model, members in models.items():
        key = "normalized" if members[0]["points"][0]["normalized"] is not None else "return"
        targets = [p["target"] for p in members[0]["points"]]
        per_seed = np.array([[p[key]["mean"] for p in run["points"]] for run in members])
        curve = {"model": model, "seeds": [run["seed"] for run in members], "scale": key}
        asked = [p["target_normalized"] for p in members[0]["points"]]
        curve["points"] = [
            {"target": t, "target_normalized": a, key: estimate(per_seed[:, i])}
            for i, (t, a) in enumerate(zip(targets, asked))
        ]
        if norm_best is not None and key == "normalized" and targets[0] is not None:
            numbers = [run["summary"] for run in members]
            known = {k: [n[k] for n in numbers if n[k] is not None] for k in numbers[0]}
            curve["summary"] = {k: estimate(v) if v else None for k, v in known.items()}
        curves.append(curve)
    return curves


def conditioning(report: dict, task, data: dict | None) -> dict:
    """The record ``conditioning.json`` holds, from evaluate.py's ``report`` of the sweep."""
    normalize = None if task.ref_min is None else task.normalize
    norm = (lambda value: float(normalize(np.asarray(value)))) if normalize else None
    runs = [run_curve(record, normalize) for record in report["checkpoints"]]
    best = None if data is None or norm is None else norm(data["best_return"])
    for run in runs:
        pts = run["points"]
        if best is not None and pts[0]["target"] is not None:
            asked = [norm(p["target"]) for p in pts]
            run["summary"] = summary_numbers(asked, [p["normalized"]["mean"] for p in pts], best)
    if data is not None and norm is not None:
        data = data | {"best_normalized": best, "median_normalized": norm(data["median_return"])}
    return {"task": task.gym_id, "data": data, "runs": runs, "models": model_curves(runs, best)}


def main(argv=None) -> None:
    from dt_primal.cli.evaluate import evaluate_command

    args, rest = parser().parse_known_args(argv)  # the rest: evaluate.py's options
    spec = dataset_of(args)
    data = data_returns(spec) if spec is not None else None
    if args.targets is None and data is None:
        raise UserError(
            "No dataset to set the sweep from: give --dataset (the one the checkpoints were trained on) or --targets."
        )
    targets = check_targets(args.targets if args.targets is not None else sweep(data["best_return"], args.points))
    report, task = evaluate_command(
        [
            *map(str, args.checkpoints),
            *rest,
            "--episodes",
            str(args.episodes),
            "--out",
            str(args.out / "evaluation.json"),
        ]
        + ["--targets", *map(str, targets)]
    )
    record = conditioning(report, task, data)
    given = sys.argv[1:] if argv is None else argv
    record["command"] = shlex.join(["python", "-m", "commands.conditioning", *map(str, given)])
    write_file(args.out / "conditioning.json", json.dumps(record, indent=1), "The conditioning record")
    plot(record, args.out / "conditioning.png")
    print(f"wrote {args.out / 'conditioning.json'} and {args.out / 'conditioning.png'}")


def plot(record: dict, path: Path) -> None:
    """Achieved against asked, one line per model (its seeds' interval shaded), the diagonal, the data's best and
    median episodes, and BC (which ignores the target) as a flat line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from commands.sweep.plots import save_figure
    from commands.sweep.results import label_of

    fig, ax = plt.subplots(figsize=(6, 4.5))
    norm = bool(record["models"]) and record["models"][0]["scale"] == "normalized"
    x = "target_normalized" if norm else "target"
    conditioned = [m for m in record["models"] if m["points"][0]["target"] is not None]
    for m in conditioned:
        asked = [p[x] for p in m["points"]]
        got = [p[m["scale"]] for p in m["points"]]
        ax.plot(
            asked,
            [g["mean"] for g in got],
            marker="o",
            label=f"{label_of(m['model'], None, None)} ({len(m['seeds'])} seeds)",
        )
        if all(g["interval"] for g in got):
            ax.fill_between(asked, *zip(*[g["interval"] for g in got]), alpha=0.2)
    for m in record["models"]:
        if m["points"][0]["target"] is None:
            ax.axhline(
                m["points"][0][m["scale"]]["mean"],
                color="grey",
                linestyle="--",
                label=label_of(m["model"], None, None),
            )
    top = max((p[x] for m in conditioned for p in m["points"]), default=1.0)
    ax.plot([0, top], [0, top], color="black", linewidth=0.8, label="achieved = asked")
    if record["data"] is not None:
        for key, style in (("best", ":"), ("median", "-.")):
            value = record["data"][f"{key}_{'normalized' if norm else 'return'}"]
            ax.axvline(value, color="tab:red", linestyle=style, linewidth=0.8, label=f"data's {key} episode")
    unit = "normalised score" if norm else "return"
    ax.set(
        xlabel=f"target ({unit})",
        ylabel=f"achieved ({unit})",
        title=(record["data"] or {}).get("dataset", record["task"]),
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path, 120)
    plt.close(fig)


if __name__ == "__main__":
    run_main(main)
