"""N seeds as one ensemble against N separate runs: `train.py --seeds 0 .. N-1` (one process, one
ensemble) against N `train.py --seed i` processes started at once (each with the machine's cores
divided by N as threads, at least one, as the sweep gave them before ensembles) and against one seed
alone, on the same machine (the same GPU with --device cuda), each with training and its final
evaluation, at the paper's settings (Primal.+DT).

  python bench/seeds_at_once.py                  # CPU, 300 steps per seed, 3 seeds
  python bench/seeds_at_once.py --device cuda --steps 2000
  python bench/seeds_at_once.py --quick          # smoke check, < 1 min

Measured: wall time and the children's CPU time, each run's training rate (its perf/steps_per_s
TensorBoard scalars) and its final evaluation time (eval.json).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import common

WORK = common.SCRATCH / "seeds_at_once"


def train_cmd(hdf5: Path, out: Path, seeds: list[int] | None, seed: int, args) -> list[str]:
    return [
        sys.executable,
        "train.py",
        "--dataset",
        str(hdf5),
        "--model",
        "primal",
        "--out",
        str(out),
        *(["--seeds", *map(str, seeds)] if seeds else ["--seed", str(seed)]),
        *common.short_run_args(args.steps, args.eval_episodes, args.precision, args.device),
    ]


def results(runs: list[Path]) -> dict:
    return {
        "rates": [common.training_rate(rd) for rd in runs],
        "eval_s": [json.loads((rd / "eval.json").read_text())["eval_seconds"] for rd in runs],
    }


def ensemble(n: int, hdf5: Path, args) -> dict:
    out = WORK / f"ensemble{n}"
    shutil.rmtree(out, ignore_errors=True)
    cmd = train_cmd(hdf5, out, list(range(n)) if n > 1 else None, 0, args)
    wall, cpu = common.run_timed(cmd)
    runs = [out / f"seed_{s}" for s in range(n)] if n > 1 else [out]
    return {
        "label": "1 seed alone" if n == 1 else f"{n} seeds as one ensemble (`--seeds`)",
        "n": n,
        "wall": wall,
        "cpu": cpu,
        "command": common.shown(cmd[1:]),
    } | results(runs)


def separate(n: int, hdf5: Path, args) -> dict:
    """n train.py processes started together, each with cores // n threads."""
    shutil.rmtree(WORK / "separate", ignore_errors=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // n))}
    cmds = [train_cmd(hdf5, WORK / "separate" / f"seed_{s}", None, s, args) for s in range(n)]
    t0, c0 = time.perf_counter(), os.times()
    procs = [
        subprocess.Popen(c, cwd=common.ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for c in cmds
    ]
    for proc in procs:
        if proc.wait() != 0:
            sys.exit(f"a separate run failed:\n{proc.stderr.read()[-1500:]}")
    wall, c1 = time.perf_counter() - t0, os.times()
    return {
        "label": f"{n} separate runs at once",
        "n": n,
        "wall": wall,
        "cpu": (c1.children_user - c0.children_user) + (c1.children_system - c0.children_system),
        "command": f"{n} x " + common.shown(cmds[0][1:]).replace("seed_0", "seed_N").replace("--seed 0", "--seed N"),
    } | results([WORK / "separate" / f"seed_{s}" for s in range(n)])


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    p.add_argument("--seeds", type=int, default=3, help="seeds (default 3)")
    p.add_argument("--steps", type=int, default=300, help="training steps per seed")
    p.add_argument("--eval-episodes", type=int, default=100, help="final evaluation episodes per target")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--precision", choices=("fp32", "tf32", "bf16"), default="fp32")
    p.add_argument("--quick", action="store_true", help="smoke check: 2 seeds, 6 steps, 3 episodes per target")
    args = p.parse_args()
    if args.quick:
        args.seeds, args.steps, args.eval_episodes = 2, 6, 3
    if args.seeds < 2:
        p.error("--seeds must be at least 2")
    hdf5 = common.hopper_hdf5(common.SCRATCH / "hopper-random-100k.hdf5")
    n = args.seeds
    one, ens, sep = ensemble(1, hdf5, args), ensemble(n, hdf5, args), separate(n, hdf5, args)
    rows = [
        [
            r["label"],
            f"**{r['wall']:.0f} s**",
            f"{r['cpu']:.0f} s",
            " / ".join(f"{x:.2f}" for x in r["rates"]),
            f"{r['n'] * r['rates'][0] if r is ens else sum(r['rates']):.2f}",
            " / ".join(f"{x:.1f}" for x in r["eval_s"][: 1 if r is ens else None]),
        ]
        for r in (one, ens, sep)
    ]
    body = "\n".join(
        [
            f"{n} seeds as one ensemble against {n} separate runs at once and against 1 seed alone, Primal.+DT at the "
            f"paper's size (d_model 256, 4 heads, 3 layers, K 20, batch 64), {args.precision}, --device {args.device}, "
            f"{args.steps} training steps per seed on hopper-random-100k.hdf5 and the final evaluation of 2 targets × "
            f"{args.eval_episodes} episodes per seed (short: a policy trained on random data falls within a few dozen "
            f"steps; the ensemble evaluates all its members at once). Wall time of each whole command (start-up, "
            "training, evaluation); CPU time of all its processes. An ensemble's training rate is its updates/s "
            f"(every "
            f"member takes one update each); its member-updates/s are that × {n}. Commands (from the repository root):",
            "",
            "```",
            *(r["command"] for r in (one, ens, sep)),
            "```",
            "",
            common.md_table(
                [
                    "runs",
                    "wall time",
                    "CPU time",
                    "training steps/s of each run",
                    "member-updates/s in all",
                    "final evaluation s",
                ],
                rows,
            ),
            "",
            f"**The ensemble of {n} took {ens['wall'] / one['wall']:.2f}× the wall time of one seed, and "
            f"{ens['wall'] / sep['wall']:.2f}× that of {n} separate runs at once** (one after another would take about "
            f"{n}× one seed).",
        ]
    )
    common.write_section("seeds_at_once", "Seeds: one ensemble against separate runs", body, args.quick)


if __name__ == "__main__":
    main()
