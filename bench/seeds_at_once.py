"""How long N seeds take at once against one: `python -m dt_primal.sweep` runs 1 seed, then N seeds
as N concurrent train.py processes (`--jobs N`) on the same machine (the same GPU with --device
cuda), each with training and its final evaluation, at SPEC §4 settings (Primal.+DT).

  python bench/seeds_at_once.py                  # CPU, 300 steps per seed, 3 seeds against 1
  python bench/seeds_at_once.py --device cuda --steps 2000
  python bench/seeds_at_once.py --quick          # smoke check, < 1 min

Measured: the sweep's wall time and its children's CPU time, each run's training rate (its
perf/steps_per_s TensorBoard scalars) and its final evaluation time (eval.json). The sweep gives
each run the machine's cores divided by --jobs as threads (at least 1).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import common

from dt_primal.sweep import run_dir

WORK = Path("/tmp/dt-primal-bench/seeds_at_once")


def sweep(n: int, hdf5: Path, args) -> dict:
    """Train seeds 0..n-1 at once through the sweep; wall and CPU time, per-run rates and eval times."""
    out = WORK / f"seeds{n}"
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "dt_primal.sweep", "--datasets", str(hdf5), "--models", "primal",
           "--seeds", *map(str, range(n)), "--jobs", str(n), "--out", str(out), "--",
           *common.short_run_args(args.steps, args.eval_episodes, args.precision, args.device)]
    wall, cpu = common.run_timed(cmd)
    runs = [run_dir(out, str(hdf5), "primal", s) for s in range(n)]
    return {"n": n, "wall": wall, "cpu": cpu,
            "rates": [common.training_rate(rd) for rd in runs],
            "eval_s": [json.loads((rd / "eval.json").read_text())["eval_seconds"] for rd in runs],
            "command": " ".join(cmd)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=3, help="seeds run at once, timed against one (default 3)")
    p.add_argument("--steps", type=int, default=300, help="training steps per seed")
    p.add_argument("--eval-episodes", type=int, default=100, help="final evaluation episodes per target")
    p.add_argument("--device", default="cpu", help="cpu or cuda (all seeds share the one GPU)")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--quick", action="store_true", help="smoke check: 2 seeds, 6 steps, 3 episodes per target")
    args = p.parse_args()
    if args.quick:
        args.seeds, args.steps, args.eval_episodes = 2, 6, 3
    if args.seeds < 2:
        p.error("--seeds must be at least 2")
    hdf5 = common.hopper_hdf5("/tmp/dt-primal-bench/hopper-random-100k.hdf5")
    one, many = sweep(1, hdf5, args), sweep(args.seeds, hdf5, args)
    n = args.seeds
    rows = [[f"{r['n']} seed{'s' * (r['n'] > 1)}, --jobs {r['n']}", f"**{r['wall']:.0f} s**", f"{r['cpu']:.0f} s",
             " / ".join(f"{x:.2f}" for x in r["rates"]), f"{sum(r['rates']):.2f}",
             " / ".join(f"{x:.1f}" for x in r["eval_s"])] for r in (one, many)]
    ratio = many["wall"] / one["wall"]
    body = "\n".join([
        f"{n} seeds trained at once (`python -m dt_primal.sweep --jobs {n}`: {n} train.py processes on the same "
        f"{'GPU' if args.device.startswith('cuda') else 'CPU'}) against 1 seed alone, Primal.+DT at SPEC §4 size "
        f"(d_model 256, 4 heads, 3 layers, K 20, batch 64), {args.precision}, --device {args.device}, {args.steps} "
        f"training steps per seed on hopper-random-100k.hdf5 and the final evaluation of 2 targets × "
        f"{args.eval_episodes} episodes (short: a policy trained on random data falls within a few dozen steps). "
        f"Wall time of the whole sweep (startup, training, evaluation, tables); CPU time of all its processes. "
        f"The sweep gives each run the cores divided by --jobs as threads (at least one). Commands:", "",
        "```", one["command"], many["command"], "```", "",
        common.md_table(["runs", "wall time", "CPU time", "training steps/s of each run", "steps/s, all runs",
                         "final evaluation s, each run"], rows), "",
        f"**{n} seeds at once take {ratio:.2f}× the wall time of one** (one after another, about {n}×); "
        f"the machine trains {sum(many['rates']) / sum(one['rates']):.2f}× as many steps per second in all."])
    common.write_section("seeds_at_once", "Seeds at once: N seeds against one", body, args.quick)


if __name__ == "__main__":
    main()
