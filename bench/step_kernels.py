"""Where one training update's time goes: every kernel above 1 % of the device time, named in full, with
the phase of the step that launched it, the device time per phase, the operators that run outside
the compiled regions, and the update's FLOPs against the device's peak.

  python -m bench.step_kernels --device cuda --members 9 -- --compile --optimizer compiled   # on a GPU, < 1 min
  python -m bench.step_kernels --members 2 -- --compile --optimizer compiled  # on a CPU: operators, not kernels
  python -m bench.step_kernels --quick                                         # smoke check, < 1 min

The library's training step (``dt_primal.training.throughput.fresh_step``, Primal.+DT at the paper's size,
bf16 on CUDA, fp32 on a CPU; options after ``--`` are train.py's) runs ``--warmup`` updates, then
``--updates`` updates under ``torch.profiler``, uncaptured so that each kernel's launch names its phase
(the step's ``record_function`` labels: sample, gather + forward + loss, backward, optimizer or, compiled,
clip + AdamW + bookkeeping). On a CPU the "kernels" are the operators' self time. The FLOPs of one update
are counted by ``torch.utils.flop_counter.FlopCounterMode`` on an eager update (the matrix products and
attention); over the profiled device time they give the utilisation of ``--peak-tflops`` while the device is
busy (a captured step's wall time adds only the gaps between replays). Writes a JSON file (``--json``) and
prints the tables last.
"""

from __future__ import annotations

import collections
import dataclasses
import json

import bench.common as common

import torch
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils.flop_counter import FlopCounterMode

from bench.step_variants import setting_parser, variant_config
from datasets.loaders import load_dataset
from dt_primal.cli import split_train_options
from dt_primal.config import Config
from dt_primal.training.step import step_mode
from dt_primal.training.throughput import engine_hash, fresh_step

PHASES = (
    "sample",
    "gather + forward + loss",
    "backward",
    "optimizer",
    "clip + AdamW + bookkeeping",
    "clip gradients",
    "AdamW",
    "loss bookkeeping",
)
COMPILED = ("Torch-Compiled Region", "CompiledFunction", "## Call CompiledFxGraph")
VIEWS = {"aten::" + v for v in ("view", "_unsafe_view", "reshape", "t", "transpose", "permute", "expand")} | {
    "aten::" + v for v in ("unsqueeze", "squeeze", "select", "slice", "unbind", "split", "detach", "alias")
}


def ancestors(event):
    while event is not None:
        yield event
        event = event.cpu_parent


def phase_of(event) -> str:
    """The innermost phase label above ``event``; the autograd engine's work (on CUDA in a thread of its
    own, outside the labels of the thread that called backward) is the backward's."""
    names = [e.name for e in ancestors(event)]
    inner = next((n for n in names if n in PHASES), None)
    if inner:
        return inner
    return "backward" if any("Backward" in n or n.startswith("autograd::engine") for n in names) else "unlabelled"


def outside_compiled(events) -> collections.Counter:
    """Operators (views aside) run by no other operator and by no compiled region: what eager Python launches."""
    counts = collections.Counter()
    for e in events:
        if not e.name.startswith("aten::") or e.name in VIEWS:
            continue
        above = [a.name for a in ancestors(e.cpu_parent)]
        if not any(n.startswith("aten::") or n.startswith(COMPILED) or "Backward" in n for n in above):
            counts[e.name] += 1
    return counts


def kernels(events, cuda: bool) -> list[tuple[str, str, float]]:
    """(kernel name, phase, microseconds) of every kernel launched (on a CPU: every event's self time)."""
    if cuda:
        return [(k.name, phase_of(e), k.duration) for e in events for k in e.kernels]
    skip = set(PHASES) | {"ProfilerStep*"}
    return [(e.name, phase_of(e), e.self_cpu_time_total) for e in events if e.name not in skip]


def flops_per_update(cfg: Config, data, members: int) -> float:
    """The FLOPs of one eager update of ``members`` members (the same arithmetic as compiled)."""
    step = fresh_step(dataclasses.replace(cfg, compile=False), data, range(members), cfg.device, capture=False)
    step()
    with FlopCounterMode(display=False) as flops:
        step()
    return flops.get_total_flops()


def profile_step(cfg: Config, data, members: int, warmup: int, updates: int, peak_tflops: float) -> dict:
    """The profile of ``updates`` uncaptured updates of ``members`` members after ``warmup``."""
    flops = flops_per_update(cfg, data, members)
    step = fresh_step(cfg, data, range(members), cfg.device, capture=False, phase=record_function)
    for _ in range(warmup):
        step()
    cuda = cfg.device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        for _ in range(updates):
            step()
        sync()
    events = prof.events()
    with profile(activities=[ProfilerActivity.CPU]) as one:
        step()
    by_kernel, by_phase = collections.defaultdict(float), collections.defaultdict(float)
    launches = collections.Counter()
    for name, phase, us in kernels(events, cuda):
        by_kernel[name, phase] += us
        by_phase[phase] += us
        launches[name, phase] += 1
    total = sum(by_phase.values()) or 1.0
    outside = outside_compiled(one.events())
    tflops = flops * updates / (total * 1e-6) / 1e12
    return {
        "mode": step_mode(cfg, torch.device(cfg.device)),
        "device": cfg.device,
        "members": members,
        "precision": step.precision,
        "engine": engine_hash(),
        "device_ms_per_update": total / updates / 1e3,
        "gflop_per_member_update": flops / members / 1e9,
        "tflops_while_busy": tflops,
        "peak_tflops": peak_tflops,
        "share_of_peak": tflops / peak_tflops,
        "phases": {p: us / updates / 1e3 for p, us in sorted(by_phase.items(), key=lambda kv: -kv[1])},
        "kernels": [
            {"name": n, "phase": p, "share": us / total, "ms_per_update": us / updates / 1e3, "per_update": c}
            for (n, p), us in sorted(by_kernel.items(), key=lambda kv: -kv[1])
            if us / total >= 0.01
            for c in [launches[n, p] / updates]
        ],
        "outside_compiled": {"total": sum(outside.values()), "counts": dict(outside.most_common())},
    }


def report(r: dict) -> str:
    time = "device ms" if r["device"].startswith("cuda") else "CPU ms (operators' self time)"
    phases = common.md_table(
        ["phase", f"{time} per update", "share"],
        [[p, f"{ms:.3f}", f"{ms / r['device_ms_per_update']:.1%}"] for p, ms in r["phases"].items()],
    )
    rows = [
        [f"{k['share']:.1%}", f"{k['ms_per_update']:.3f}", f"{k['per_update']:g}", k["phase"], k["name"]]
        for k in r["kernels"]
    ]
    out = r["outside_compiled"]
    return "\n\n".join(
        [
            f"{r['mode']}, {r['precision']}, {r['members']} members: {r['device_ms_per_update']:.2f} {time} per "
            f"update (uncaptured); operators outside compiled regions per update: {out['total']} "
            f"({', '.join(f'{n} {c}' for n, c in list(out['counts'].items())[:8])}); "
            f"{r['gflop_per_member_update']:.1f} GFLOP per member-update, {r['tflops_while_busy']:.1f} TFLOP/s over "
            f"the {time}: {r['share_of_peak']:.1%} of {r['peak_tflops']:g}",
            phases,
            common.md_table(["share", f"{time} per update", "launches per update", "phase", "kernel (in full)"], rows),
        ]
    )


def main() -> None:
    p = setting_parser(__doc__)
    p.add_argument("--warmup", type=int, default=5, help="untimed updates first (compilation happens there)")
    p.add_argument("--updates", type=int, default=5, help="profiled updates")
    p.add_argument(
        "--peak-tflops",
        type=float,
        default=989.4,
        help="the device's peak for the precision, in TFLOP/s (default: an H100's or H200's dense bf16)",
    )
    common.add_json_options(p, "the profile")
    p.add_argument("--quick", action="store_true", help="smoke check: DT-paper size, 2 members, 2 updates")
    own, options = split_train_options()
    args = p.parse_args(own)
    if args.from_json:
        return section(json.loads(args.from_json.read_text()), quick=False)
    if args.quick:
        args.members, args.warmup, args.updates = 2, 1, 2
    cfg = variant_config(options, args.device, args.quick)
    data = load_dataset(str(common.hopper_hdf5(common.SCRATCH / "hopper-random-100k.hdf5")), env="hopper")
    r = profile_step(cfg, data, args.members, args.warmup, args.updates, args.peak_tflops)
    r |= {"info": common.run_info()}
    if args.json:
        args.json.write_text(json.dumps(r, indent=1, default=str))
    section(r, args.quick)


def section(r: dict, quick: bool) -> None:
    """The profile as the section of docs/benchmarks.md for its device (its GPU's name on CUDA)."""
    where = r["info"].get("gpu") or r["device"]
    title = f"Profile: where a compiled update's time goes ({where}, {r['members']} members)"
    common.write_section("step_kernels" + common.gpu_suffix(r["info"]), title, report(r), quick, r["info"])


if __name__ == "__main__":
    main()
