"""BC's training throughput on this machine: the library's training step (``dt_primal.training.throughput``) of
``--model bc`` at its defaults (d_model 128, 3 layers, K = 20, batch 64, fp32), for ensembles of 1, 9 (a
task's three datasets x three seeds) and 18 members, with each thread count given.

  python -m bench.bc_speed                       # 1, 9 and 18 members; 1 and 2 threads
  python -m bench.bc_speed --quick               # smoke check, seconds
  ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 python -m bench.bc_speed   # as a CPU without bf16 units

Hopper-shaped data (``common.hopper_hdf5``: obs 11, act 3); HalfCheetah's and Walker2d's obs 17 make the
first layer 1.5 times as wide.
"""

from __future__ import annotations

import os

import bench.common as common  # sets OMP_WAIT_POLICY before torch loads

import torch

from datasets.loaders import load_dataset
from dt_primal.cli import command_parser
from dt_primal.config import make_config
from dt_primal.training.throughput import fresh_step, time_updates


def main() -> None:
    p = command_parser(__doc__)
    p.add_argument("--members", type=int, nargs="+", default=[1, 9, 18])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--updates", type=int, default=300, help="timed updates per setting")
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    if args.quick:
        args.members, args.threads, args.updates = [1, 2], [1], 10
    data = load_dataset(str(common.hopper_hdf5(common.SCRATCH / "hopper-random-100k.hdf5")))
    cfg = make_config(model="bc", precision="fp32", device="cpu", dataset="hopper-random-100k")
    rows = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        for members in args.members:
            r = time_updates(fresh_step(cfg, data, range(members)), warmup=20, updates=args.updates)
            rows.append(
                [
                    threads,
                    members,
                    f"{r['ms_per_update']:.1f}",
                    f"{r['updates_per_s']:.0f}",
                    f"{r['member_updates_per_s']:.0f}",
                    f"{r['cpu_ms_per_update']:.1f}",
                ]
            )
            print(rows[-1], flush=True)
    head = ["threads", "members", "ms per update", "updates/s", "member-updates/s", "CPU ms per update"]
    body = (
        "BC (`--model bc`, d_model 128, 3 layers, K = 20, batch 64, fp32) on Hopper-shaped data, "
        f"{args.updates} timed updates after 20 untimed, through the library's training step:\n\n"
        + common.md_table(head, rows)
        + "\n\nA full-protocol run is 100k updates: at the updates/s above, one ensemble trains in "
        "100000 / (updates/s) seconds, plus its evaluations."
    )
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA")  # a CPU without bf16 units, as most users' (docs/benchmarks.md)
    key, title = "bc_speed", "BC: training throughput on a CPU"
    if isa:
        aten = os.environ.get("ATEN_CPU_CAPABILITY")
        key, title = f"{key}_{isa.lower()}", f"{title}, oneDNN held to {isa} (ATEN_CPU_CAPABILITY={aten})"
    common.write_section(key, title, body, args.quick)


if __name__ == "__main__":
    main()
