"""``python -m dt_primal.sweep``: a grid of (dataset × model × seed) training runs. Per model, the
datasets whose models share an architecture and their seeds train in one process as one ensemble
(``train.py --dataset ... --seeds ...``, through ``dt_primal.run.train_command``; Table 4 is six
ensembles, docs/ensembles.md), several groups at once: a local process pool (``--jobs``, e.g.
sharing one GPU), or one Ray task per group on a Ray cluster (``--backend ray``); finished runs are
skipped and interrupted ones resumed (several sweeps may share one folder: a group that one of them
is training is locked). Then one aggregated table (Markdown, CSV), a bar chart and learning curves.
Scores are those of the **last** checkpoint of each run, beside each seed's mean of its last three
evaluations.

Two DT baselines: this folder's ``dt`` runs share Primal.+DT's settings ("DT (matched settings)");
the DT paper's own ("DT (DT paper's settings)", the paper's Table 4 row) is a sweep of its own with
``--models dt -- --preset dt-paper``, whose folder ``--baseline`` adds to the tables.

  python -m dt_primal.sweep --datasets dt-primal/hopper/medium-replay-v0 --models dt primal \\
      --seeds 0 1 2 --jobs 2 --out runs/sweep -- --preset quick --steps 5000
  python -m dt_primal.sweep --datasets table4 --jobs 6 --out runs/table4   # the paper's Table 4, 54 runs in 6 ensembles
  python -m dt_primal.sweep --datasets table4 --models dt --jobs 3 --out runs/table4-dt-paper -- --preset dt-paper
  python -m dt_primal.sweep --datasets table4 --out runs/table4 --baseline runs/table4-dt-paper --aggregate-only
  python -m dt_primal.sweep --datasets table4 --backend ray --ray-address auto --gpus-per-task 0.25 --out /shared/table4
"""
from __future__ import annotations

from dt_primal.process import configure_process

if __name__ == "__main__":
    configure_process()  # a command: its process-wide settings, before torch loads

import argparse
import contextlib
import csv
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, TextIO

import numpy as np

from dt_primal.cli import run_main
from dt_primal.errors import UserError
from dt_primal.evaluation import mean_std, pm, score, table
from dt_primal.run import Loader, application_loader, train_command
from dt_primal.runfolder import dataset_slug

ROOT = Path(__file__).resolve().parents[1]
# the nine D4RL datasets of the paper's Table 4, as the offline suite builds them
TABLE4 = [f"dt-primal/{env}/{level}-v0" for env in ("halfcheetah", "hopper", "walker2d")
          for level in ("medium", "medium-replay", "medium-expert")]


def group_dir(out: Path, dataset: str, model: str) -> Path:
    return out / dataset_slug(dataset) / model


def run_dir(out: Path, dataset: str, model: str, seed: int) -> Path:
    return group_dir(out, dataset, model) / f"seed_{seed}"


BUSY = None  # run_group's status for a group that another sweep is training (-N would be a signal's exit status)
COMMAND = [sys.executable, "-m", "dt_primal.run"]  # train.py, as the library runs it
# how a backend runs one train command: (its arguments, the group's train.log) -> exit status
Trainer = Callable[[list[str], TextIO], int]


def run_group(datasets: list[str], model: str, seeds: list[int], out: Path, extra: list[str],
              trainer: Trainer) -> tuple[str, list[int], int | None]:
    """Train the runs of (``datasets``, model) that have not finished: datasets whose models share an
    architecture (``ensemble_groups``), as ensembles: the runs that started resume together, the others
    start together (datasets with the same seeds left in one ensemble). A group another sweep holds
    (any of its folders) is left to it. Returns (the group's folders, the seeds trained, exit status or BUSY)."""
    dirs = [group_dir(out, d, model) for d in datasets]
    name = " + ".join(map(str, dirs))
    with contextlib.ExitStack() as held:
        for gd in dirs:
            gd.mkdir(parents=True, exist_ok=True)
            lock = held.enter_context(open(gd / ".lock", "w"))
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released when this process ends, however it ends
            except BlockingIOError:
                return name, [], BUSY
        todo = {d: [s for s in seeds if not (run_dir(out, d, model, s) / "eval.json").exists()] for d in datasets}
        trained = sorted({s for left in todo.values() for s in left})
        for resume in (True, False):
            parts: dict[tuple[int, ...], list[str]] = {}  # seeds -> the datasets with those seeds to train
            for d, left in todo.items():
                part = tuple(s for s in left if (run_dir(out, d, model, s) / "last.pt").exists() == resume)
                if part:
                    parts.setdefault(part, []).append(d)
            for part, ds in parts.items():
                rc = train_ensemble(ds, model, list(part), out, extra, trainer, resume)
                if rc:
                    return name, trained, rc
        return name, trained, 0


def train_ensemble(datasets: list[str], model: str, seeds: list[int], out: Path, extra: list[str], trainer: Trainer,
                   resume: bool) -> int:
    """One ``train.py --dataset ... --seeds ...`` into the sweep's layout, logged in the first dataset's
    train.log (the others' logs name the command and where its output went); its exit status."""
    where = group_dir(out, datasets[0], model) if len(datasets) == 1 else out  # several: OUT/DATASET/MODEL/seed_N
    argv = ["--dataset", *datasets, "--model", model, "--seeds", *map(str, seeds), "--out", str(where), *extra,
            *(["--resume"] if resume else [])]
    logs = [group_dir(out, d, model) / "train.log" for d in datasets]
    for i, log_path in enumerate(logs):
        cut = log_path.exists() and log_path.read_bytes()[-1:] not in (b"", b"\n")  # a killed run's last line
        with open(log_path, "a") as log:
            log.write(f"{chr(10) if cut else ''}$ python -m dt_primal.run {' '.join(argv)}\n")
            if i:
                log.write(f"(one ensemble with {datasets[0]}: its output is in {logs[0]})\n")
    with open(logs[0], "a") as log:
        return trainer(argv, log)


def train_options(argv: list[str]) -> tuple[str, dict]:
    """The preset and the Config fields that a train.py command line ``argv`` sets."""
    from dt_primal.config import add_config_args, overrides
    p = argparse.ArgumentParser(allow_abbrev=False, add_help=False)
    p.add_argument("--preset", default="paper")
    add_config_args(p)
    known, _ = p.parse_known_args(argv)
    return known.preset, overrides(known)


def ensemble_groups(datasets: list[str], models: list[str], extra: list[str]) -> list[tuple[list[str], str]]:
    """The (datasets, model) groups that train as one ensemble each: per model, the datasets whose models
    share an architecture (``dt_primal.training.architecture``; in Table 4 the three datasets of a task,
    except halfcheetah's with Primal.+DT, whose KSVD rank differs per dataset). A dataset whose task
    its name does not tell trains alone."""
    from dt_primal.checks import env_sizes
    from dt_primal.config import make_config
    from dt_primal.training import architecture
    from envs import find_task
    preset, given = train_options(extra)
    groups: dict[tuple, list[str]] = {}
    for m in models:
        for d in datasets:
            task = find_task(given.get("env") or d)
            cfg = make_config(preset, **{**given, "dataset": d, "model": m})
            key = (m, d) if task is None else (m, architecture(env_sizes(task), task, cfg.resolved(task)))
            groups.setdefault(key, []).append(d)
    return [(ds, key[0]) for key, ds in groups.items()]


def python_path() -> str:
    """``$PYTHONPATH`` with this checkout first: what the trainers' processes import (on every node of a cluster)."""
    return os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))


def in_subprocess(threads: int) -> Trainer:
    """The local pool's trainer: ``python -m dt_primal.run`` in a child process with ``threads`` CPU threads, in
    the sweep's folder (relative paths mean what they mean to the sweep), importing this checkout."""
    def trainer(argv: list[str], log: TextIO) -> int:
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": python_path()}
        return subprocess.run([*COMMAND, *argv], stdout=log, stderr=subprocess.STDOUT, env=env).returncode
    return trainer


def in_process(load_dataset: Loader, threads: int) -> Trainer:
    """A Ray worker's trainer: ``train_command`` in this process, its output into the log and its exit
    status returned as the command line's would be (a bug's traceback goes to the log, status 1)."""
    def trainer(argv: list[str], log: TextIO) -> int:
        configure_process(threads=threads)
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            try:
                run_main(lambda: train_command(argv, load_dataset))
            except SystemExit as exc:
                return exc.code if isinstance(exc.code, int) else int(exc.code is not None)
            except Exception:
                traceback.print_exc()
                return 1
        return 0
    return trainer


class Stopped(Exception):
    """A group's training stopped by SIGINT or SIGTERM (a node being shut down) after writing its checkpoints."""


def ray_group(datasets: list[str], model: str, seeds: list[int], out: Path, extra: list[str], load_dataset: Loader,
              threads: int, cwd: str) -> tuple[str, list[int], int | None]:
    """One Ray task: ``run_group`` on a worker, in the sweep's folder ``cwd`` where this node has it (relative
    paths mean what they mean to the sweep). When Ray runs it again, after its worker or node died or
    a signal stopped it, the seeds that had written a checkpoint resume from their ``last.pt``."""
    if os.path.isdir(cwd):
        os.chdir(cwd)
    gd, trained, rc = run_group(datasets, model, seeds, out, extra, in_process(load_dataset, threads))
    if rc in (128 + signal.SIGINT, 128 + signal.SIGTERM):
        raise Stopped(f"{gd} stopped by signal {rc - 128} after its checkpoint")
    return gd, trained, rc


RAY_RETRIES = 3  # times Ray runs a group again after its worker or node died or a signal stopped it


def import_ray():
    try:
        import ray
    except ImportError:
        raise UserError("--backend ray needs Ray, which is not installed here (it is optional): install it with "
                        "'pip install -r requirements-ray.txt' (on every node of the cluster, with the same Python "
                        "and dt-primal), or leave out --backend ray to train in the local process pool.") from None
    return ray


def start_ray(address: str | None):
    """Connect to the Ray cluster at ``address`` ('auto', HOST:PORT), or start a local instance."""
    ray = import_ray()
    if ray.is_initialized():
        return ray
    cannot = (f"Could not connect to the Ray cluster at --ray-address {address} ({{}}). Start it first (ray start --head "
              f"on one machine, ray start --address HEAD:6379 on the others), or leave out --ray-address for a local "
              f"Ray instance.")
    host, _, port = (address or "").rpartition(":")
    if host and "://" not in address:  # HOST:PORT: Ray itself would retry an unreachable one for minutes
        try:
            socket.create_connection((host, int(port)), timeout=10).close()
        except (OSError, ValueError) as exc:
            raise UserError(cannot.format(exc)) from None
    try:
        ray.init(address=address or "local", include_dashboard=False, log_to_driver=False)  # local: a new instance
    except ConnectionError as exc:
        raise UserError(cannot.format(exc)) from None
    return ray


def run_groups_on_ray(groups: list[tuple[list[str], str]], args, extra: list[str]):
    """Yield ``run_group``'s result for each group as its Ray task finishes; for a task Ray gave up on
    (its worker died more than ``RAY_RETRIES`` times), the reason instead of an exit status."""
    from dt_primal.sweep import Stopped, ray_group  # sent to the workers by name, also when this file runs as __main__
    ray = start_ray(args.ray_address)
    gpus = args.gpus_per_task if args.gpus_per_task is not None else float(ray.cluster_resources().get("GPU", 0) > 0)
    task = ray.remote(num_cpus=args.cpus_per_task, num_gpus=gpus, max_retries=RAY_RETRIES, retry_exceptions=[Stopped],
                      runtime_env={"env_vars": {"PYTHONPATH": python_path()}})(ray_group)
    threads = max(1, round(args.cpus_per_task))
    pending = {task.remote(d, m, args.seeds, args.out, extra, application_loader(), threads, os.getcwd()): (d, m)
               for d, m in groups}
    while pending:
        (done,), _ = ray.wait(list(pending))
        d, m = pending.pop(done)
        try:
            yield ray.get(done)
        except ray.exceptions.RayError as exc:
            yield " + ".join(str(group_dir(args.out, x, m)) for x in d), [], \
                f"{type(exc).__name__} on Ray: {str(exc).strip().splitlines()[-1]}"


def run_groups_locally(groups: list[tuple[list[str], str]], args, extra: list[str]):
    """Yield ``run_group``'s result for each group, ``--jobs`` groups at once, each in a child process."""
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.jobs)
    with ThreadPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(run_group, d, m, args.seeds, args.out, extra, in_subprocess(threads)) for d, m in groups]
        for f in futures:
            yield f.result()


DT_MATCHED = "DT (matched settings)"  # --model dt at Primal.+DT's settings: the controlled comparison
DT_PAPER = "DT (DT paper's settings)"  # --preset dt-paper: the settings the paper's Table 4 compares with
LABELS = {"dt": DT_MATCHED, "primal": "Primal.+DT", "primalformer": "PrimalFormer"}
LABEL_NOTES = {
    DT_MATCHED: "`--model dt` at the same settings as Primal.+DT (the controlled comparison)",
    DT_PAPER: "`--model dt --preset dt-paper`: the original DT paper's d_model 128, 1 head, lr 1e-4, as the "
              "paper's Table 4 compared (docs/method.md, Hyper-parameters)",
}
SETTINGS = ("d_model", "n_head", "lr")  # what tells the two DT baselines apart
RECORDED = SETTINGS + ("precision",)  # what run_settings reports


def run_settings(group: Path, seed: int) -> dict | None:
    """The ``RECORDED`` settings a finished run trained with: from its eval.json, else its checkpoint, else
    the last train command line the sweep logged in the group's train.log; None when none is there
    (records written before eval.json held the run's config keep only eval.json and evals.jsonl)."""
    from dt_primal.config import PRESETS, make_config
    cfg = json.loads((group / f"seed_{seed}" / "eval.json").read_text()).get("config", {})
    if all(k in cfg for k in RECORDED):
        return {k: cfg[k] for k in RECORDED}
    ckpt = group / f"seed_{seed}" / "last.pt"
    if ckpt.exists():
        from dt_primal.checkpoint import read_checkpoint
        cfg = read_checkpoint(ckpt)["config"]
        return {k: cfg[k] for k in RECORDED} if all(k in cfg for k in RECORDED) else None
    log = group / "train.log"
    cmds = [line[2:].split() for line in log.read_text().splitlines() if line.startswith("$ ")] if log.exists() else []
    command = lambda a: a.endswith("train.py") or a == "dt_primal.run"  # earlier sweeps logged train.py by path
    if not cmds or not any(map(command, cmds[-1])):
        return None
    preset, given = train_options(cmds[-1][next(i for i, a in enumerate(cmds[-1]) if command(a)) + 1:])
    if preset not in PRESETS:
        return None
    try:
        cfg = make_config(preset, **given)
    except Exception:
        return None
    return {k: getattr(cfg, k) for k in RECORDED}


def label_of(model: str, settings: dict | None, default: str | None) -> str:
    """The row's label: a DT's from the settings it trained with when they are known (the DT paper's
    d_model, heads and lr, or else the matched baseline), otherwise ``default`` or the model's."""
    if model == "dt" and settings is not None:
        from dt_primal.config import PRESETS
        paper = all(settings[k] == PRESETS["dt-paper"][k] for k in SETTINGS)
        return DT_PAPER if paper else DT_MATCHED
    return default or LABELS.get(model, model)


def curve_points(rd: Path) -> list[dict]:
    """A finished run's evaluations in step order: those during training (evals.jsonl) and the final
    one (eval.json), each as {"step", "scores": ``score`` per target}."""
    final = json.loads((rd / "eval.json").read_text())
    pts = [json.loads(line) for line in (rd / "evals.jsonl").read_text().splitlines() if line.strip()] \
        if (rd / "evals.jsonl").exists() else []
    pts = [p for p in pts if p["step"] < final.get("step", float("inf"))] + [final]
    return [{"step": p["step"], "scores": [score(r) for r in p["reports" if "reports" in p else "targets"]]}
            for p in pts]


LAST_N = 3  # "mean of the last three evaluations" beside the last checkpoint


def collect(out: Path, datasets: list[str], models: list[str], seeds: list[int], label: str | None = None,
            name: str | None = None) -> list[dict]:
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
            paths = {s: run_dir(out, d, m, s) / "eval.json" for s in seeds}
            finished = [s for s, path in paths.items() if path.exists()]
            if not finished:
                continue
            evals = [json.loads(paths[s].read_text()) for s in finished]
            curves = [curve_points(run_dir(out, d, m, s)) for s in finished]
            targets = [r["target"] for r in evals[0]["targets"]]
            per_target = []
            for i, t in enumerate(targets):
                entry = {"target": t, **mean_std([score(e["targets"][i]) for e in evals])}
                if all(len(c) >= LAST_N for c in curves):
                    entry["last3"] = {**mean_std([np.mean([p["scores"][i] for p in c[-LAST_N:]]) for c in curves]),
                                      "steps": [p["step"] for p in curves[0][-LAST_N:]]}
                per_target.append(entry)
            settings = run_settings(gd, finished[0])
            rows.append({"dataset": d, "model": m, "name": name or m, "label": label_of(m, settings, label),
                         "settings": settings, "dir": str(gd), "finished_seeds": finished, "step": evals[0]["step"],
                         "episodes": evals[0]["targets"][0]["episodes"], "targets": per_target,
                         "unit": "return" if evals[0]["targets"][0]["normalized_mean"] is None else "normalised"})
    return rows


def short(dataset: str) -> str:
    return "/".join(dataset.split("/")[-2:]).removesuffix("-v0") if dataset.count("/") >= 2 else dataset


def cell(t: dict | None) -> str:
    return "–" if t is None else pm(t["mean"], t["std"])


def gap_rows(rows: list[dict], a: str, b: str) -> list[dict]:
    """Per dataset where rows labelled ``a`` and ``b`` both exist, per target: a − b at the last
    checkpoint and for the mean of the last three evaluations, with the standard error of that
    difference from the seed spread, sqrt(s_a²/n_a + s_b²/n_b) (s: std with ddof 1), and the gap in
    units of it."""
    out = []
    for d in dict.fromkeys(r["dataset"] for r in rows):
        ra = next((r for r in rows if r["dataset"] == d and r["label"] == a), None)
        rb = next((r for r in rows if r["dataset"] == d and r["label"] == b), None)
        if ra is None or rb is None:
            continue
        for ta, tb in zip(ra["targets"], rb["targets"]):
            entry = {"dataset": d, "target": ta["target"]}
            for key, xa, xb in (("last", ta, tb), ("last3", ta.get("last3"), tb.get("last3"))):
                if xa is None or xb is None:
                    continue
                sa, sb = np.array(xa["seeds"]), np.array(xb["seeds"])
                var = (sa.var(ddof=1) / len(sa) if len(sa) > 1 else np.nan) + (sb.var(ddof=1) / len(sb) if len(sb) > 1 else np.nan)
                gap, se = float(sa.mean() - sb.mean()), float(np.sqrt(var))
                entry[key] = {"a": float(sa.mean()), "b": float(sb.mean()), "gap": gap, "se": se,
                              "z": gap / se if se > 0 else float("nan"), "n_a": len(sa), "n_b": len(sb)}
            out.append(entry)
    return out


def gap_table(gaps: list[dict], a: str, b: str) -> str:
    """Markdown of ``gap_rows``: per dataset and target, a − b and the gap in standard errors."""
    if not gaps:
        return ""
    def fmt(g):
        if g is None:
            return "–"
        if not np.isfinite(g["z"]):
            return f"{g['gap']:+.1f} (no SE: {min(g['n_a'], g['n_b'])} seed{'s' if min(g['n_a'], g['n_b']) != 1 else ''})"
        return f"{g['gap']:+.1f} (SE {g['se']:.1f}, {g['z']:+.1f} SE)"
    rows = [[short(g["dataset"]), f"{g['target']:g}", fmt(g.get("last")), fmt(g.get("last3"))] for g in gaps]
    head = ["dataset", "target", f"{a} − {b}: last checkpoint", "mean of last 3 evaluations"]
    return table(head, rows) + ("\n\nGap: difference of the means over seeds. SE: its standard error from the seed "
                               "spread, sqrt(s_a²/n_a + s_b²/n_b), s the std with ddof 1; with 3 seeds a side, "
                               "|gap| > 2.8 SE is about a two-sided 5% Welch test.\n")


def write_tables(rows: list[dict], out: Path, name: str = "results") -> str:
    """``name``.md and ``name``.csv in ``out``: per (dataset, row) both targets' normalised scores at the
    last checkpoint and the mean of the last three evaluations, the average of each row label over the
    datasets where every label has a result, what each label means, and (when Primal.+DT and a DT are
    both there) Primal.+DT − DT in standard errors."""
    labels = list(dict.fromkeys(r["label"] for r in rows))
    n_t = max(len(r["targets"]) for r in rows)
    which = lambda i: ["high target", "low target"][i] if n_t == 2 else f"target {i + 1}"
    head = ["dataset", "model", "what it is", "seeds", "steps"] + [f"{which(i)}: last checkpoint" for i in range(n_t)] \
        + [f"{which(i)}: mean of last 3 evaluations" for i in range(n_t)]
    lines = [[r["dataset"] + (" (returns)" if r.get("unit") == "return" else ""), r["name"], r["label"],
              len(r["finished_seeds"]), r["step"],
              *[f"{cell(t)} ({t['target']:g})" for t in r["targets"]], *[cell(t.get("last3")) for t in r["targets"]]]
             for r in rows]
    # the average rows compare like with like: only datasets where every label has a result
    common = [d for d in dict.fromkeys(r["dataset"] for r in rows)
              if all(any(r["dataset"] == d and r["label"] == lab for r in rows) for lab in labels)]
    for lab in labels:
        mine = [r for r in rows if r["label"] == lab and r["dataset"] in common and r.get("unit") != "return"]
        if mine:
            avg = [f"**{np.mean([r['targets'][i]['mean'] for r in mine]):.1f}**" for i in range(n_t)]
            avg3 = [f"**{np.mean([r['targets'][i]['last3']['mean'] for r in mine]):.1f}**"
                    if all("last3" in r["targets"][i] for r in mine) else "–" for i in range(n_t)]
            lines.append([f"**average ({len(mine)} dataset{'s' if len(mine) != 1 else ''})**", mine[0]["name"], lab, "", "",
                          *avg, *avg3])
    notes = [f"- **{lab}**: {LABEL_NOTES[lab]}." for lab in labels if lab in LABEL_NOTES]
    md = table(head, lines) + ("\n\nNormalised score of the **last checkpoint** of each run (not the best; the headline, as "
                             "the paper reports it), mean ± std (ddof 0) across seeds of the per-seed mean over the final "
                             "evaluation episodes. Beside it, the mean over seeds of each seed's **mean of its last three "
                             "evaluations** (the final one and the two intermediate ones before it, which use fewer "
                             "episodes): how much the last-checkpoint number owes to where training stopped.\n")
    if any(r.get("unit") == "return" for r in rows):
        md += ("\nDatasets marked (returns) are on tasks without reference scores: their cells are returns, not "
               "normalised scores, and the averages leave them out.\n")
    if notes:
        md += "\n" + "\n".join(notes) + "\n"
    primal = LABELS["primal"]
    for dt in (DT_PAPER, DT_MATCHED):
        if primal in labels and dt in labels:
            md += f"\n{primal} − {dt}:\n\n" + gap_table(gap_rows(rows, primal, dt), primal, dt)
    (out / f"{name}.md").write_text(md)
    with open(out / f"{name}.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["dataset", "model", "label", "target", "normalized_mean", "normalized_std", "n_seeds", "steps", "episodes",
                    "seed_scores", "last3_mean", "last3_std", "last3_seed_scores", "score"])
        for r in rows:
            for t in r["targets"]:
                l3 = t.get("last3")
                w.writerow([r["dataset"], r["name"], r["label"], t["target"], f"{t['mean']:.3f}", f"{t['std']:.3f}",
                            len(r["finished_seeds"]), r["step"], r["episodes"], " ".join(f"{s:.3f}" for s in t["seeds"]),
                            "" if l3 is None else f"{l3['mean']:.3f}", "" if l3 is None else f"{l3['std']:.3f}",
                            "" if l3 is None else " ".join(f"{s:.3f}" for s in l3["seeds"]),
                            "return" if r.get("unit") == "return" else "normalised"])
    return md


def y_label(rows: list[dict]) -> str:
    """What ``rows``' scores are: normalised scores, returns (tasks without reference scores), or both."""
    units = {r.get("unit", "normalised") for r in rows}
    return {frozenset({"normalised"}): "normalised score", frozenset({"return"}): "return"}.get(
        frozenset(units), "normalised score (return where a task has no reference scores)")


def plot_bars(rows: list[dict], out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    labels = list(dict.fromkeys(r["label"] for r in rows))
    n_t = max(len(r["targets"]) for r in rows)
    fig, axes = plt.subplots(n_t, 1, figsize=(max(6, 1.6 * len(datasets) * max(1, len(labels) / 2)), 4 * n_t),
                             sharey=True, squeeze=False)  # one panel per target
    width = 0.8 / len(labels)
    for ti, ax in enumerate(axes[:, 0]):
        for li, lab in enumerate(labels):
            got = {r["dataset"]: r["targets"][ti] for r in rows if r["label"] == lab and ti < len(r["targets"])}
            xs = [i + li * width for i, d in enumerate(datasets) if d in got]
            ax.bar(xs, [got[d]["mean"] for d in datasets if d in got], width,
                   yerr=[got[d]["std"] for d in datasets if d in got], capsize=3, label=lab)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(datasets))])
        ax.set_xticklabels([d.split("/")[-2] + "\n" + d.split("/")[-1] if d.count("/") >= 2 else d for d in datasets], fontsize=8)
        ax.set_title(["high target", "low target"][ti] if n_t == 2 else f"target {ti + 1}")
        ax.set_ylabel(f"{y_label(rows)} (last checkpoint)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "results.png", dpi=120)
    plt.close(fig)


def plot_curves(out: Path, rows: list[dict], plot_dir: Path | None = None) -> dict:
    """Normalised score (or return: ``y_label``) of the high target against steps for each of
    ``collect``'s rows: mean and min–max band over its finished seeds, into ``plot_dir`` (default
    ``out``)/curves.png. Returns how many seeds each drawn (dataset, row name) curve averages."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    cols = min(3, len(datasets))
    n_rows = -(-len(datasets) // cols)
    fig, axes = plt.subplots(n_rows, cols, figsize=(4.5 * cols, 3.5 * n_rows), squeeze=False)
    for ax in axes.flat[len(datasets):]:
        ax.set_visible(False)
    drawn = {}
    for ax, d in zip(axes.flat, datasets):
        for row in (r for r in rows if r["dataset"] == d):
            gd = Path(row["dir"]) if "dir" in row else group_dir(out, d, row["model"])
            curves = [{p["step"]: p["scores"][0] for p in curve_points(gd / f"seed_{s}")} for s in row["finished_seeds"]]
            steps = sorted(set.intersection(*(set(c) for c in curves)))  # a row has at least one finished seed
            if not steps:
                continue
            y = np.array([[c[s] for s in steps] for c in curves])
            ax.plot(steps, y.mean(0), label=f"{row.get('label', row['model'])} ({len(curves)} seeds)")
            ax.fill_between(steps, y.min(0), y.max(0), alpha=0.2)
            drawn[d, row.get("name", row["model"])] = len(curves)
        ax.set_title(d, fontsize=9); ax.set_xlabel("training step")
        ax.set_ylabel(y_label([r for r in rows if r["dataset"] == d]))
        if ax.lines:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig((plot_dir or out) / "curves.png", dpi=120)
    plt.close(fig)
    return drawn


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    p = argparse.ArgumentParser(allow_abbrev=False, prog="python -m dt_primal.sweep", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datasets", nargs="+", required=True,
                   help="dataset ids or files; 'table4' stands for the nine datasets of the paper's Table 4")
    p.add_argument("--models", nargs="+", default=["dt", "primal"], choices=["dt", "primal", "primalformer"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--backend", choices=["local", "ray"], default="local",
                   help="local: a pool of --jobs child processes on this machine (default); ray: one Ray task per "
                        "(dataset, model) group, on a Ray cluster (pip install -r requirements-ray.txt)")
    p.add_argument("--jobs", type=int, default=1, help="local: ensembles (groups of datasets of one model) trained at once")
    p.add_argument("--threads", type=int, default=None,
                   help="local: CPU threads per run (default: the cores divided by --jobs)")
    p.add_argument("--ray-address", default=None,
                   help="ray: the cluster, 'auto' (the one this machine belongs to) or HOST:PORT; default: a local "
                        "Ray instance on this machine")
    p.add_argument("--gpus-per-task", type=float, default=None,
                   help="ray: GPUs per group, a fraction shares one (0.25: four groups per GPU); default: 1 when the "
                        "cluster has GPUs, else 0")
    p.add_argument("--cpus-per-task", type=float, default=1, help="ray: CPUs per group, also its training threads")
    p.add_argument("--out", type=Path, default=Path("runs/sweep"))
    p.add_argument("--aggregate-only", action="store_true", help="only rebuild the tables and plots")
    p.add_argument("--baseline", type=Path, default=None,
                   help="a sweep folder of the DT paper's baseline (--models dt -- --preset dt-paper ...): its runs join "
                        "the tables as \"DT (DT paper's settings)\" beside this folder's \"DT (matched settings)\"")
    p.add_argument("--report-dir", type=Path, default=None,
                   help="where the tables and plots go (default --out)")
    args = p.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    args.datasets = [d for spec in args.datasets for d in (TABLE4 if spec == "table4" else [spec])]
    args.out.mkdir(parents=True, exist_ok=True)
    groups = ensemble_groups(args.datasets, args.models, extra)
    if not args.aggregate_only:
        t0, failed = time.time(), []
        results = (run_groups_on_ray if args.backend == "ray" else run_groups_locally)(groups, args, extra)
        for i, (gd, trained, rc) in enumerate(results, 1):
            seeds = f"seeds {' '.join(map(str, trained))}" if trained else "all seeds"
            failure = rc if isinstance(rc, str) else f"exit {rc}"  # a string: why Ray gave up on the group
            status = {0: f"done ({seeds})" if trained else "done before",
                      BUSY: "left to the sweep that is training it"}.get(rc, f"FAILED ({failure}, see train.log there)")
            print(f"[{i}/{len(groups)}] {gd} {status} ({(time.time() - t0) / 60:.1f} min)", flush=True)
            if rc not in (0, BUSY):
                failed.append(gd)
        if failed:
            print(f"{len(failed)} groups failed; fix and run the same command again (finished runs are skipped).")
    rows = collect(args.out, args.datasets, args.models, args.seeds)
    if args.baseline:  # the DT-paper runs of another sweep folder, beside this one's rows
        extra = collect(args.baseline, args.datasets, ["dt"], args.seeds, label=DT_PAPER, name="dt (dt-paper)")
        rows = [r for d in args.datasets for r in rows + extra if r["dataset"] == d]
    if not rows:
        sys.exit("no finished run to aggregate yet")
    report = args.report_dir or args.out
    report.mkdir(parents=True, exist_ok=True)
    print(write_tables(rows, report))
    plot_bars(rows, report)
    plot_curves(args.out, rows, report)
    print(f"wrote {report}/results.md, results.csv, results.png, curves.png")


if __name__ == "__main__":
    run_main(main)
