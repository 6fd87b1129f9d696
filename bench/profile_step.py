"""Where one training step goes at the Primal.+DT paper's size on this CPU, and what changes its speed.

  python -m bench.profile_step            # profile + variants, writes the "Profile" section
  python -m bench.profile_step --quick    # smoke check, < 1 min

1. torch.profiler over a few steps of the library's training step (dt_primal.training.throughput.fresh_step,
   Primal.+DT, d_model 256, 4 heads, 3 layers, K 20, batch 64), in fp32 and in bf16 autocast: time
   per part of the step (record_function labels) and the top operators by self CPU time.
2. The same step timed in a fresh process per variant (OpenMP reads its settings at start-up):
   OMP_WAIT_POLICY PASSIVE (what the benchmarks use) or OpenMP's default, 1 or 2 threads,
   PyTorch's dropout masks instead of the cheap CPU masks, --compile (torch.compile of the members'
   loss), bf16 autocast.
3. The floor the matrix products set: the step's matmul FLOPs over the rate this CPU's GEMM
   reaches, against the step's time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys

import bench.common as common

import torch

from datasets.loaders import load_dataset
from dt_primal.cli import command_parser
from dt_primal.config import make_config
from dt_primal.model.dropout import torch_masks
from dt_primal.training.throughput import fresh_step

# name: (environment changes, fresh_step options, config changes, description)
VARIANTS = {
    "baseline": ({}, {}, {}, "as the training loop runs it (fp32, 2 threads), OMP_WAIT_POLICY=PASSIVE"),
    "omp-default": (
        {"DT_PRIMAL_BENCH_OMP": "unset", "OMP_WAIT_POLICY": None},
        {},
        {},
        "OMP_WAIT_POLICY unset: OpenMP's default spin-waiting (the commands set PASSIVE "
        "unless the environment names a policy)",
    ),
    "1-thread": ({"OMP_NUM_THREADS": "1"}, {}, {}, "1 thread"),
    "torch-dropout": (
        {},
        {"torch_dropout": True},
        {},
        "PyTorch's dropout masks instead of dt_primal.model.dropout's cheap CPU masks (the model's CPU-only seam)",
    ),
    "bf16": ({}, {}, {"precision": "bf16"}, "--precision bf16 (autocast)"),
    "bf16-torch-dropout": ({}, {"torch_dropout": True}, {"precision": "bf16"}, "bf16 with PyTorch's dropout masks"),
    "compile": (
        {"TORCHINDUCTOR_CACHE_DIR": f"{common.SCRATCH}/inductor-{os.getpid()}"},
        {},
        {"compile": True},
        "torch.compile(model), default mode, empty compile cache (first steps not timed)",
    ),
}


def load_data():
    return load_dataset(str(common.hopper_hdf5(common.SCRATCH / "hopper-random-100k.hdf5")), env="hopper")


def spec_config(**changes):
    return make_config("paper", model="primal", s=64, device="cpu", **{"precision": "fp32", **changes})


def profile(steps: int, precision: str) -> tuple[str, str, str]:
    from torch.profiler import ProfilerActivity, record_function
    from torch.profiler import profile as torch_profile

    step = fresh_step(spec_config(precision=precision), load_data(), [0], phase=record_function)
    for _ in range(3):
        step()
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    events = prof.key_averages()
    phases = [
        e
        for e in events
        if e.key in ("sample", "forward + loss", "backward", "clip gradients", "AdamW", "loss bookkeeping")
    ]  # TrainStep's phase labels
    total = sum(e.cpu_time_total for e in phases)
    phase_rows = [
        [e.key, f"{e.cpu_time_total / steps / 1e3:.1f}", f"{100 * e.cpu_time_total / total:.1f}%"]
        for e in sorted(phases, key=lambda e: -e.cpu_time_total)
    ]
    ops = sorted(
        (e for e in events if e.key not in {p.key for p in phases} and not e.key.startswith("ProfilerStep")),
        key=lambda e: -e.self_cpu_time_total,
    )
    self_total = sum(e.self_cpu_time_total for e in events)
    op_rows = [
        [
            f"`{e.key}`",
            f"{e.self_cpu_time_total / steps / 1e3:.1f}",
            f"{100 * e.self_cpu_time_total / self_total:.1f}%",
            f"{e.count // steps}",
        ]
        for e in ops[:15]
    ]
    share = lambda keys: 100 * sum(e.self_cpu_time_total for e in events if e.key in keys) / self_total
    sample = next((100 * e.cpu_time_total / total for e in phases if e.key == "sample"), 0.0)
    summary = (
        f"{precision}: data sampling takes {sample:.1f}% of the step: not visible. Matrix products (`aten::mm`, "
        f"`aten::addmm`, `aten::bmm`) take {share({'aten::mm', 'aten::addmm', 'aten::bmm'}):.0f}% of the self "
        f"CPU time; copies (`aten::copy_`: the head-major layout attention needs"
        f"{', and dtype casts under autocast' if precision == 'bf16' else ''}) "
        f"{share({'aten::copy_'}):.0f}%; the dropout masks (`aten::random_`, `aten::bernoulli_`) "
        f"{share({'aten::random_', 'aten::bernoulli_'}):.0f}%; the rest is element-wise kernels and the optimizer."
    )
    return (
        common.md_table(["part of the step", "ms per step (profiled)", "share"], phase_rows),
        common.md_table(["operator", "self CPU ms per step", "share of self CPU", "calls per step"], op_rows),
        summary,
    )


def matmul_floor(precision: str) -> tuple[float, float]:
    """GFLOP of one training step's matrix products (``torch.utils.flop_counter``) and the GFLOP/s
    this CPU's GEMM reaches in ``precision`` on the MLP's first product, 3840×256 @ 256×1024."""
    from torch.utils.flop_counter import FlopCounterMode

    step = fresh_step(spec_config(precision=precision), load_data(), [0])
    step()
    with FlopCounterMode(display=False) as counter:
        step()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    a, b = torch.randn(3840, 256, dtype=dtype), torch.randn(256, 1024, dtype=dtype)
    seconds = common.timed(lambda: a @ b, 50, warmup=5)["seconds"]
    return counter.get_total_flops() / 1e9, 2 * 3840 * 256 * 1024 / seconds / 1e9


def run_variant(name: str, warmup: int, steps: int) -> dict:
    _, options, changes, _ = VARIANTS[name]
    options = dict(options)
    masks = torch_masks() if options.pop("torch_dropout", False) else contextlib.nullcontext()
    with masks:  # dropout as on a GPU where the variant asks
        step = fresh_step(spec_config(**changes), load_data(), [0], **options)
        first = common.seconds(step, warmup)
        timed = common.timed(step, steps, warmup=0)
    return {
        "variant": name,
        **timed,
        "warmup_seconds": first,
        "threads": torch.get_num_threads(),
        "omp": os.environ.get("OMP_WAIT_POLICY", "unset"),
    }


def parse_args():
    p = command_parser(__doc__)
    p.add_argument("--steps", type=int, default=20, help="timed steps per variant (median)")
    p.add_argument("--profile-steps", type=int, default=5)
    p.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    p.add_argument("--quick", action="store_true", help="smoke check: 1 profiled step, 3 timed steps, 2 variants")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per variant (compile: at least 10)")
    p.add_argument("--variant", help=argparse.SUPPRESS)  # worker mode
    args = p.parse_args()
    if args.quick:
        args.steps, args.warmup, args.profile_steps, args.variants = 2, 1, 1, ["baseline", "omp-default"]
    return args


def profiles(steps: int) -> list[str]:
    """The profiler's tables in fp32 and in bf16 autocast, as Markdown lines."""
    lines = []
    for precision in ("fp32", "bf16"):
        phase_table, op_table, summary = profile(steps, precision)
        title = f"**{precision}**" + (" (autocast)" if precision == "bf16" else "")
        lines += [title, "", phase_table, "", op_table, "", summary, ""]
        print(phase_table, "\n\n", op_table, flush=True)
    return lines


def time_variant(name: str, args) -> list[str]:
    """One variant timed in a fresh process with its environment: its table row."""
    env_changes, _, _, description = VARIANTS[name]
    env = dict(os.environ)
    for k, v in env_changes.items():
        env.pop(k, None) if v is None else env.__setitem__(k, v)
    cmd = [sys.executable, "-m", __spec__.name, "--variant", name, "--steps", str(args.steps)]
    out = subprocess.run(cmd + ["--warmup", str(args.warmup)], capture_output=True, text=True, env=env, cwd=common.ROOT)
    if out.returncode != 0:
        return [name, description, "failed: " + (out.stderr.strip().splitlines() or [""])[-1][:120], "", "", ""]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    load = f"{common.load_avg():.1f}"
    return [
        name,
        description,
        f"{r['seconds'] * 1e3:.0f}",
        f"{r['cpu_seconds'] * 1e3:.0f}",
        f"{1 / r['seconds']:.2f}",
        f"{r['warmup_seconds']:.1f}",
        load,
    ]


def with_speedups(rows: list[list[str]]) -> bool:
    """Each timed row gets its speed against the baseline's (CPU, wall); whether there was a baseline."""
    base = next((r for r in rows if r[0] == "baseline" and r[3].isdigit()), None)
    for r in rows if base else []:
        r.append(f"{float(base[3]) / float(r[3]):.2f}× ({float(base[2]) / float(r[2]):.2f}×)" if r[3].isdigit() else "")
    return base is not None


def floor_rows(rows: list[list[str]]) -> list[list[str]]:
    """Per precision: the step's matrix products alone at this CPU's GEMM rate, against the timed step."""
    floors = []
    for precision, variant in (("fp32", "baseline"), ("bf16", "bf16")):
        gflop, rate = matmul_floor(precision)
        floor_ms = gflop / rate * 1e3
        step_ms = next((float(r[2]) for r in rows if r[0] == variant and r[2].isdigit()), None)
        timed = [f"{step_ms:.0f}", f"{100 * floor_ms / step_ms:.0f}%"] if step_ms else ["not timed", ""]
        floors.append([precision, f"{gflop:.1f}", f"{rate:.0f}", f"{floor_ms:.0f}", *timed])
    return floors


VARIANT_COLUMNS = ["variant", "what", "ms per step (wall)", "CPU ms per step", "updates/s (wall)", "warm-up s"]
FLOOR_COLUMNS = [
    "precision",
    "matrix products, GFLOP per step",
    "GEMM rate, GFLOP/s",
    "floor: the products alone, ms",
    "step, ms (variant median, wall)",
    "floor ÷ step",
]


def report(args, profiled: list[str], rows: list[list[str]], base: bool) -> str:
    columns = VARIANT_COLUMNS + ["load avg after"] + (["speed vs baseline: CPU (wall)"] if base else [])
    return "\n".join(
        [
            "Primal.+DT at the paper's size (d_model 256, 4 heads, 3 layers, K 20, batch 64, s 64), the library's "
            "training step (`dt_primal.training.step.TrainStep`, what `train.py` runs, through "
            f"`dt_primal.training.throughput.fresh_step`), on {len(load_data().rewards):,} steps of Hopper-shaped "
            f"random data. Profile: `torch.profiler` (CPU) over {args.profile_steps} steps after 3 warm-up steps, "
            "in fp32 and in bf16 autocast; the profiler's own overhead inflates the numbers a little.",
            "",
            *profiled,
            f"Variants, each in a fresh process: median of {args.steps} steps after {args.warmup} untimed steps "
            f"(compile: {max(10, args.warmup)}; their total time, in the warm-up column, includes compilation).",
            "",
            common.md_table(columns, rows),
            "",
            "On a machine shared with other jobs the wall time mostly measures how much of the 2 cores this process "
            "got; CPU time per step (all threads) measures the work and is the fairer comparison between variants "
            "(with both cores free, the 2-thread wall time would approach CPU / 2).",
            "",
            "What bounds the step: its matrix products alone, run at the rate this CPU's GEMM reaches on one of the "
            "step's largest products (3840×256 @ 256×1024, the MLP's first layer), would take the floor below; many "
            "of the step's products are smaller or thinner and run slower than that. The rest of the step is "
            "element-wise kernels, copies, dropout masks and the optimizer (the operator tables above). The peers "
            "run at least the same products, plus the last block at the return and action tokens.",
            "",
            common.md_table(FLOOR_COLUMNS, floor_rows(rows)),
        ]
    )


def main() -> None:
    args = parse_args()
    if args.variant:  # a worker: one variant, timed
        warmup = max(10, args.warmup) if args.variant == "compile" else args.warmup
        print(json.dumps(run_variant(args.variant, warmup, args.steps)))
        return
    profiled = profiles(args.profile_steps)
    rows = []
    for name in args.variants:
        rows.append(time_variant(name, args))
        print(" | ".join(rows[-1]), f"(load {common.load_avg():.2f})", flush=True)
    base = with_speedups(rows)
    title = "Profile: one training step at the Primal.+DT paper's size"
    common.write_section("profile", title, report(args, profiled, rows, base), args.quick)


if __name__ == "__main__":
    main()
