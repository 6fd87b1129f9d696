"""Table 4 on a GPU machine held for a short time (README.md): two commands, one right after the other.

  python -m tools.gpu_window start --out OUT --window 850   # at once when the machine is up
  python -m tools.gpu_window wait --out OUT                  # the next command, at once

``start`` builds the first datasets, measures the step (or reads its committed measurements), starts the
budgeted sweep of Table 4 detached, and packs the finished runs' records into OUT until its ``--seconds`` are
spent; ``wait`` packs until the sweep has ended or the window is over, then measures what the window did not.
Back on the CPU machine: ``python -m commands.sweep.records OUT/records.tgz results/table4``, then
``python -m commands.tables``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .measurements import LEAST_TRAINING, read_measurements
from .window import MARGIN, start, wait


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(  # as dt_primal.cli.command_parser's: this process imports no dt_primal
        prog="python -m tools.gpu_window",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    p.add_argument("what", choices=["start", "wait"])
    p.add_argument("--out", type=Path, required=True, help="the folder that comes back (8 files at most)")
    p.add_argument(
        "--window",
        type=float,
        default=850,
        help="start: seconds from now until the machine goes (README.md: the machine's start-up before it, less)",
    )
    p.add_argument("--seconds", type=float, default=560, help="start: seconds this command may take")
    p.add_argument("--device", default="cuda")
    p.add_argument(
        "--build", type=int, default=3, help="start: datasets built, from the first in priority order, task by task"
    )
    p.add_argument("--build-steps", type=int, default=None, help="start: transitions per dataset (a rehearsal's)")
    p.add_argument(
        "--compile-limit", type=float, default=150, help="start: seconds for the compiled measurement (then captured)"
    )
    p.add_argument(
        "--throughput",
        type=Path,
        default=None,
        help="start: measurements made before on this kind of GPU (a window's throughput.json) instead of measuring",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="start: also profile 9 members with the chosen options (bench/step_kernels.py: every kernel above 1 %% "
        "with its phase, under a minute) and the evaluation (bench/eval_overhead.py: forward, stepping, the rest)",
    )
    p.add_argument(
        "--variants-limit",
        type=float,
        default=200,
        help="start: seconds for ranking the step's variants (bench/step_variants.py; if it fails: --compile)",
    )
    p.add_argument(
        "--least-training",
        type=float,
        default=LEAST_TRAINING,
        help="start: seconds of the window kept for training: a measurement phase that would eat into them is cut",
    )
    argv = sys.argv[1:] if argv is None else argv
    cut = argv.index("--") if "--" in argv else len(argv)
    args = p.parse_args(argv[:cut])
    if not (MARGIN + 30 <= args.window < 86_400 and 0 < args.seconds <= args.window):
        p.error(f"need {MARGIN + 30:.0f} <= --window < 86400 and 0 < --seconds <= --window (seconds)")
    args.out = args.out.resolve()
    args.throughput = args.throughput and args.throughput.resolve()
    args.measured = args.throughput and read_measurements(args.throughput)  # before the window's time is spent
    args.sweep_args = argv[cut + 1 :]  # after --: train.py options for every run
    args.out.mkdir(parents=True, exist_ok=True)
    (start if args.what == "start" else wait)(args)


if __name__ == "__main__":
    main()
