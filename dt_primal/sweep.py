"""``python -m dt_primal.sweep``: a grid of (dataset × model × seed) training runs. The seeds of each
(dataset, model) train in one process as one ensemble (``train.py --seeds``), several groups at
once (``--jobs``, e.g. sharing one GPU); finished runs are skipped and interrupted ones resumed
(several sweeps may share one folder: a group that one of them is training is locked). Then one
aggregated table (Markdown, CSV), a bar chart and learning curves. Scores are those of the **last**
checkpoint of each run.

  python -m dt_primal.sweep --datasets dt-primal/hopper/medium-replay-v0 --models dt primal \\
      --seeds 0 1 2 --jobs 2 --out runs/sweep -- --preset quick --steps 5000
  python -m dt_primal.sweep --datasets table4 --jobs 6 --out runs/table4   # the paper's Table 4, 54 runs
"""
from __future__ import annotations

import argparse
import csv
import fcntl
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
# the nine D4RL datasets of the paper's Table 4, as the offline suite builds them
TABLE4 = [f"dt-primal/{env}/{level}-v0" for env in ("halfcheetah", "hopper", "walker2d")
          for level in ("medium", "medium-replay", "medium-expert")]


def group_dir(out: Path, dataset: str, model: str) -> Path:
    slug = dataset.replace("/", "_").replace(os.sep, "_").removesuffix(".hdf5").removesuffix(".pkl")
    return out / slug / model


def run_dir(out: Path, dataset: str, model: str, seed: int) -> Path:
    return group_dir(out, dataset, model) / f"seed_{seed}"


BUSY = None  # run_group's status for a group that another sweep is training (-N would be a signal's exit status)


def run_group(dataset: str, model: str, seeds: list[int], out: Path, extra: list[str],
              threads: int) -> tuple[Path, list[int], int | None]:
    """Train the seeds of (dataset, model) that have not finished, as ensembles: those that started
    resume together, the others start together. A group another sweep holds is left to it.
    Returns (group dir, the seeds trained, exit status or BUSY)."""
    gd = group_dir(out, dataset, model)
    gd.mkdir(parents=True, exist_ok=True)
    with open(gd / ".lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released when this process ends, however it ends
        except BlockingIOError:
            return gd, [], BUSY
        todo = [s for s in seeds if not (run_dir(out, dataset, model, s) / "eval.json").exists()]
        started = [s for s in todo if (run_dir(out, dataset, model, s) / "last.pt").exists()]
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        for part, resume in ((started, True), ([s for s in todo if s not in started], False)):
            if not part:
                continue
            cmd = [sys.executable, str(ROOT / "train.py"), "--dataset", dataset, "--model", model,
                   "--seeds", *map(str, part), "--out", str(gd), *extra, *(["--resume"] if resume else [])]
            with open(gd / "train.log", "a") as log:
                log.write(f"$ {' '.join(cmd)}\n"); log.flush()
                rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT).returncode
            if rc:
                return gd, todo, rc
        return gd, todo, 0


def collect(out: Path, datasets: list[str], models: list[str], seeds: list[int]) -> list[dict]:
    """One row per (dataset, model): the seeds that finished and, per target, their normalised score
    mean ± std (ddof 0), with the seeds' final scores."""
    rows = []
    for d in datasets:
        for m in models:
            paths = {s: run_dir(out, d, m, s) / "eval.json" for s in seeds}
            finished = [s for s, path in paths.items() if path.exists()]
            if not finished:
                continue
            evals = [json.loads(paths[s].read_text()) for s in finished]
            targets = [r["target"] for r in evals[0]["targets"]]
            per_target = []
            for i, t in enumerate(targets):
                scores = np.array([e["targets"][i]["normalized_mean"] for e in evals])
                per_target.append({"target": t, "mean": float(scores.mean()), "std": float(scores.std()),
                                   "seeds": scores.tolist()})
            rows.append({"dataset": d, "model": m, "finished_seeds": finished, "step": evals[0]["step"],
                         "episodes": evals[0]["targets"][0]["episodes"], "targets": per_target})
    return rows


def write_tables(rows: list[dict], models: list[str], out: Path) -> str:
    lines = ["| dataset | model | seeds | steps | high target | low target |", "|---|---|---|---|---|---|"]
    for r in rows:
        cells = [f"{t['mean']:.1f} ± {t['std']:.1f} ({t['target']:g})" for t in r["targets"]]
        lines.append(f"| {r['dataset']} | {r['model']} | {len(r['finished_seeds'])} | {r['step']} | " + " | ".join(cells) + " |")
    # the average row compares like with like: only datasets where every model has a result
    common = [d for d in dict.fromkeys(r["dataset"] for r in rows)
              if all(any(r["dataset"] == d and r["model"] == m for r in rows) for m in models)]
    for m in models:
        mine = [r for r in rows if r["model"] == m and r["dataset"] in common]
        if mine:
            avg = [np.mean([r["targets"][i]["mean"] for r in mine]) for i in range(len(mine[0]["targets"]))]
            lines.append(f"| **average ({len(mine)} dataset{'s' if len(mine) != 1 else ''})** | {m} | | | " + " | ".join(f"**{a:.1f}**" for a in avg) + " |")
    md = "\n".join(lines) + ("\n\nNormalised score of the **last checkpoint** of each run (not the best), mean ± std "
                             "(ddof 0) across seeds of the per-seed mean over the final evaluation episodes.\n")
    (out / "results.md").write_text(md)
    with open(out / "results.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["dataset", "model", "target", "normalized_mean", "normalized_std", "n_seeds", "steps", "episodes", "seed_scores"])
        for r in rows:
            for t in r["targets"]:
                w.writerow([r["dataset"], r["model"], t["target"], f"{t['mean']:.3f}", f"{t['std']:.3f}", len(r["finished_seeds"]),
                            r["step"], r["episodes"], " ".join(f"{s:.3f}" for s in t["seeds"])])
    return md


def plot_bars(rows: list[dict], models: list[str], out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    fig, axes = plt.subplots(2, 1, figsize=(max(6, 1.6 * len(datasets)), 8), sharey=True)  # one panel per target
    width = 0.8 / len(models)
    for ti, ax in enumerate(axes):
        for mi, m in enumerate(models):
            got = {r["dataset"]: r["targets"][ti] for r in rows if r["model"] == m}
            xs = [i + mi * width for i, d in enumerate(datasets) if d in got]
            ax.bar(xs, [got[d]["mean"] for d in datasets if d in got], width,
                   yerr=[got[d]["std"] for d in datasets if d in got], capsize=3, label=m)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(datasets))])
        ax.set_xticklabels([d.split("/")[-2] + "\n" + d.split("/")[-1] if d.count("/") >= 2 else d for d in datasets], fontsize=8)
        ax.set_title(["high target", "low target"][ti] if ti < 2 else f"target {ti}")
        ax.set_ylabel("normalised score (last checkpoint)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(out / "results.png", dpi=120)
    plt.close(fig)


def plot_curves(out: Path, rows: list[dict]) -> dict:
    """Normalised score (high target) against steps for each of ``collect``'s rows: mean and min–max
    band over its finished seeds. Returns how many seeds each drawn (dataset, model) curve averages."""
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
            m, curves = row["model"], []
            for s in row["finished_seeds"]:
                rd = run_dir(out, d, m, s)
                pts = [json.loads(l) for l in (rd / "evals.jsonl").read_text().splitlines()] if (rd / "evals.jsonl").exists() else []
                pts.append(json.loads((rd / "eval.json").read_text()))
                curves.append({p["step"]: p["reports" if "reports" in p else "targets"][0]["normalized_mean"] for p in pts})
            steps = sorted(set.intersection(*(set(c) for c in curves)))  # a row has at least one finished seed
            if not steps:
                continue
            y = np.array([[c[s] for s in steps] for c in curves])
            ax.plot(steps, y.mean(0), label=f"{m} ({len(curves)} seeds)")
            ax.fill_between(steps, y.min(0), y.max(0), alpha=0.2)
            drawn[d, m] = len(curves)
        ax.set_title(d, fontsize=9); ax.set_xlabel("training step"); ax.set_ylabel("normalised score")
        if ax.lines:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=120)
    plt.close(fig)
    return drawn


def main() -> None:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    p = argparse.ArgumentParser(prog="python -m dt_primal.sweep", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datasets", nargs="+", required=True,
                   help="dataset ids or files; 'table4' stands for the nine datasets of the paper's Table 4")
    p.add_argument("--models", nargs="+", default=["dt", "primal"], choices=["dt", "primal", "primalformer"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--jobs", type=int, default=1, help="(dataset, model) groups trained at once")
    p.add_argument("--threads", type=int, default=None, help="CPU threads per run (default: the cores divided by --jobs)")
    p.add_argument("--out", type=Path, default=Path("runs/sweep"))
    p.add_argument("--aggregate-only", action="store_true", help="only rebuild the tables and plots")
    args = p.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    args.datasets = [d for spec in args.datasets for d in (TABLE4 if spec == "table4" else [spec])]
    args.out.mkdir(parents=True, exist_ok=True)
    groups = [(d, m) for d in args.datasets for m in args.models]
    if not args.aggregate_only:
        threads = args.threads or max(1, (os.cpu_count() or 1) // args.jobs)
        t0, failed = time.time(), []
        with ThreadPoolExecutor(args.jobs) as pool:
            futures = [pool.submit(run_group, d, m, args.seeds, args.out, extra, threads) for d, m in groups]
            for i, f in enumerate(futures, 1):
                gd, trained, rc = f.result()
                seeds = f"seeds {' '.join(map(str, trained))}" if trained else "all seeds"
                status = {0: f"done ({seeds})" if trained else "done before",
                          BUSY: "left to the sweep that is training it"}.get(rc, f"FAILED (exit {rc}, see {gd}/train.log)")
                print(f"[{i}/{len(groups)}] {gd} {status} ({(time.time() - t0) / 60:.1f} min)", flush=True)
                if rc not in (0, BUSY):
                    failed.append(gd)
        if failed:
            print(f"{len(failed)} groups failed; fix and run the same command again (finished runs are skipped).")
    rows = collect(args.out, args.datasets, args.models, args.seeds)
    if not rows:
        sys.exit("no finished run to aggregate yet")
    print(write_tables(rows, args.models, args.out))
    plot_bars(rows, args.models, args.out)
    plot_curves(args.out, rows)
    print(f"wrote {args.out}/results.md, results.csv, results.png, curves.png")


if __name__ == "__main__":
    main()
