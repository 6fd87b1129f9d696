"""Training throughput of ensembles: updates/s and member-updates/s of the library's training step
(``dt_primal.training.step.TrainStep``, what ``train.py --seeds`` runs) for ensembles of several sizes, run
eagerly, compiled (``--compile``) or captured as a CUDA graph, at the Primal.+DT paper's size and at
the DT paper's size, in fp32 / tf32 / bf16. The members are one tensor dimension of the model
(``dt_primal.model.members``).

  python -m bench.ensemble_speed                          # CPU: 1 and 3 members, eager, fp32 and bf16
  python -m bench.ensemble_speed --device cuda --members 1 3 9 18 --modes eager captured compiled+captured \\
      --precisions fp32 tf32 bf16 --sizes spec dt         # the whole GPU grid
  python -m bench.ensemble_speed --count-ops --members 1 4 --sizes spec --precisions fp32   # operations per update
  python -m bench.ensemble_speed --quick                  # smoke check, < 1 min

One update = every member draws its batch of 64 windows (K 20) and takes one AdamW step. Each
setting: ``--warmup`` untimed updates (they include the capture or the compilation), then
``--updates`` timed ones, with the device synchronised before and after. Data: Hopper-shaped
random data (100k steps), as the other training benchmarks.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path

import bench.common as common

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from datasets.loaders import load_dataset
from dt_primal.cli import command_parser
from dt_primal.config import CHOICES, make_config
from dt_primal.model.dropout import torch_masks
from dt_primal.training.step import step_mode
from dt_primal.training.throughput import fresh_step, time_updates

MODES = ("eager", "captured", "compiled", "compiled+captured")
MODELS = {"primal": "Primal.+DT", "dt": "DT"}  # the records' model (older ones: Primal.+DT)
SIZES = {
    "spec": ("Primal.+DT paper (d_model 256, 4 heads)", dict(d_model=256, n_head=4)),
    "dt": ("DT paper (d_model 128, 1 head)", dict(d_model=128, n_head=1)),
}


VIEWS = {
    "view",
    "_unsafe_view",
    "reshape",
    "t",
    "transpose",
    "permute",
    "expand",
    "unsqueeze",
    "squeeze",
    "select",
    "slice",
    "unbind",
    "split",
    "split_with_sizes",
    "detach",
    "alias",
    "as_strided",
    "lift_fresh",
}


class OpCounter(TorchDispatchMode):
    """Counts the ATen operations that run, views aside: each is about one kernel launch on a GPU."""

    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in VIEWS and not name.startswith("_record_function"):
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))


def library_step(
    data, size: str, members: int, precision: str, device: str, compile: bool = False, capture: bool = True, **options
):
    """The library's training step for one setting (Primal.+DT unless ``options`` name a ``model``); ``options``:
    Config fields, such as those of how the step runs (``optimizer``, ``attention_kernel``, ``compile_mode``)."""
    fixed = dict(device=device, precision=precision, compile=compile, cuda_graph=capture, **SIZES[size][1])
    cfg = make_config("paper", **({"model": "primal", "s": 64} | options | fixed))
    return fresh_step(cfg, data, range(members), device, capture=capture)


def count_ops(data, size: str, members: int, precision: str, device: str) -> dict:
    """ATen operations (views aside) in one eager update, the second: what a CUDA graph of the step replays."""
    step = library_step(data, size, members, precision, device, capture=False)
    with torch_masks():  # PyTorch's dropout masks, as on a GPU
        step()
        with OpCounter() as counter:
            step()
    return {
        "size": size,
        "members": members,
        "precision": precision,
        "ops": sum(counter.ops.values()),
        "top": counter.ops.most_common(6),
    }


def time_setting(
    data, size: str, members: int, mode: str, precision: str, device: str, warmup: int, updates: int, **options
) -> dict:
    # each setting compiles afresh (else Dynamo's recompile limit silently runs later ones eagerly)
    torch._dynamo.reset()
    step = library_step(
        data, size, members, precision, device, compile="compiled" in mode, capture="captured" in mode, **options
    )
    d_model, n_head = SIZES[size][1]["d_model"], SIZES[size][1]["n_head"]
    mode = step_mode(step.cfg, torch.device(device))  # with the options: what a sweep's budget looks up
    setting = dict(size=size, model=step.cfg.model, d_model=d_model, n_head=n_head, mode=mode, precision=precision)
    return setting | time_updates(step, warmup, updates)


def settings(args):
    """(size, precision, mode, members, untimed updates) of every setting asked for."""
    for size in args.sizes:
        for precision in args.precisions:
            for mode in args.modes:
                for m in args.members:
                    yield size, precision, mode, m, max(args.warmup, 5 if "captured" in mode else 1)


def engine_options(args) -> dict:
    """The model and the options of how the step runs that were given (train.py's names), as Config fields."""
    return {k: getattr(args, k) for k in ("model", "optimizer", "attention_kernel", "compile_mode") if getattr(args, k)}


def key(r: dict) -> tuple:
    """What a record's member counts are compared within: its model, size, precision and mode."""
    return r.get("model", "primal"), r["size"], r["precision"], r["mode"]


def measure(args, data) -> list[dict]:
    """Time every setting asked for, printing each."""
    records = []
    for size, precision, mode, m, warmup in settings(args):
        r = time_setting(data, size, m, mode, precision, args.device, warmup, args.updates, **engine_options(args))
        records.append(r)
        print(
            f"{r['model']:6s} {SIZES[size][0]:32s} {precision} {mode:17s} {m:2d} members: {r['ms_per_update']:.1f} ms, "
            f"{r['updates_per_s']:.1f} updates/s, {r['member_updates_per_s']:.1f} member-updates/s "
            f"(load {common.load_avg():.2f})",
            flush=True,
        )
    return records


def parse_args():
    p = command_parser(__doc__)
    p.add_argument("--device", default="cpu")
    p.add_argument("--members", type=int, nargs="+", default=[1, 3])
    p.add_argument(
        "--modes",
        nargs="+",
        choices=MODES,
        default=["eager"],
        help="eager (--no-cuda-graph), captured (the default on CUDA), compiled (--compile --no-cuda-graph), "
        "compiled+captured (--compile)",
    )
    p.add_argument("--precisions", nargs="+", choices=("fp32", "tf32", "bf16"), default=["fp32", "bf16"])
    for name in ("model", "optimizer", "attention_kernel", "compile_mode"):  # train.py's: the model, how it runs
        p.add_argument("--" + name.replace("_", "-"), choices=CHOICES[name], default=None, help="as train.py's")
    p.add_argument("--sizes", nargs="+", choices=list(SIZES), default=["spec"])
    p.add_argument("--updates", type=int, default=10, help="timed updates per setting")
    p.add_argument("--warmup", type=int, default=5, help="untimed updates first (at least 5 when capturing)")
    p.add_argument(
        "--count-ops",
        action="store_true",
        help="count the ATen operations of one eager update per size, precision and member count instead of "
        "timing (views aside: each is about one kernel launch on a GPU); writes its own section",
    )
    p.add_argument(
        "--json",
        type=Path,
        default=None,
        help="also write the measurements to this file (what python -m commands.sweep --throughput reads)",
    )
    p.add_argument(
        "--from-json",
        type=Path,
        nargs="+",
        default=None,
        help="write the section from these --json files (measurements made elsewhere, e.g. on a GPU machine) "
        "instead of measuring",
    )
    p.add_argument("--quick", action="store_true", help="smoke check: DT-paper size, 1 and 2 members, 2 updates")
    args = p.parse_args()
    if args.quick:
        args.members, args.sizes, args.updates, args.warmup, args.precisions = [1, 2], ["dt"], 2, 1, ["fp32"]
    return args


COLUMNS = [
    "model",
    "size",
    "precision",
    "mode",
    "members",
    "ms per update (wall)",
    "CPU ms per update",
    "updates/s",
    "member-updates/s",
    "warm-up s",
]


def throughput_body(args, records: list[dict]) -> str:
    """The section's text: one row per measured setting, and how members scale against one."""
    rows = [
        [
            MODELS[r.get("model", "primal")],
            SIZES[r["size"]][0],
            r["precision"],
            r["mode"],
            r["members"],
            f"{r['ms_per_update']:.1f}",
            f"{r['cpu_ms_per_update']:.0f}",
            f"{r['updates_per_s']:.1f}",
            f"**{r['member_updates_per_s']:.1f}**",
            f"{r['warmup_s']:.1f}",
        ]
        for r in records
    ]
    single = {key(r): r["ms_per_update"] for r in records if r["members"] == 1}
    notes = [
        f"{MODELS[r.get('model', 'primal')]}, {SIZES[r['size']][0]}, {r['precision']}, {r['mode']}: "
        f"{r['members']} members take {r['ms_per_update'] / single[key(r)]:.2f}× the time of one per update, i.e. "
        f"{r['members'] * single[key(r)] / r['ms_per_update']:.2f}× its member-updates/s"
        for r in records
        if r["members"] > 1 and key(r) in single
    ]
    intro = (
        f"The library's training step (`dt_primal.training.step.TrainStep`) on `--device {args.device}`, "
        "3 layers, K 20, batch 64 per member, s 64 (Primal.+DT's KSVD block): the command's timed updates "
        "after its untimed ones (capture and compilation happen there: see the warm-up column). The members are "
        "one tensor dimension of the model (docs/ensembles.md)."
    )
    return "\n".join([intro, "", common.md_table(COLUMNS, rows), "", *[f"- {n}" for n in notes]])


def main() -> None:
    args = parse_args()
    hopper = None if args.from_json else common.hopper_hdf5(common.SCRATCH / "hopper-random-100k.hdf5")
    data = hopper and load_dataset(str(hopper), env="hopper")
    if args.count_ops:
        return ops_section(args, data)
    if args.from_json:
        docs = [json.loads(path.read_text()) for path in args.from_json]
        records, info = [r for doc in docs for r in doc["records"]], docs[0]["info"]
    else:
        records, info = measure(args, data), common.run_info()
        if args.json:
            args.json.write_text(json.dumps({"records": records, "info": info}, indent=1, default=str))
    sizes = "" if args.sizes == ["spec"] else "_" + "_".join(args.sizes)
    section = common.device_key("ensemble_speed", args.device) + common.gpu_suffix(info) + sizes
    if not args.quick and not args.from_json:
        common.save_results(section, {"records": records, "args": vars(args)})
    title = f"Ensembles: training throughput ({info.get('gpu') or args.device}, "
    title += f"{', '.join(SIZES[s][0] for s in args.sizes)})"
    common.write_section(section, title, throughput_body(args, records), args.quick, info)


def ops_section(args, data) -> None:
    """``--count-ops``: the operations of one update for every setting asked for, as a section of docs/benchmarks.md."""
    records = [
        count_ops(data, size, m, precision, args.device)
        for size in args.sizes
        for precision in args.precisions
        for m in args.members
    ]
    for r in records:
        print(f"{SIZES[r['size']][0]:32s} {r['precision']} {r['members']:2d} members: {r['ops']} ops", flush=True)
    rows = [
        [
            SIZES[r["size"]][0],
            r["precision"],
            r["members"],
            f"**{r['ops']}**",
            ", ".join(f"`{name}` {n}" for name, n in r["top"]),
        ]
        for r in records
    ]
    body = "\n".join(
        [
            "ATen operations in one eager update of the library's training step "
            f"(`dt_primal.training.step.TrainStep`) on "
            f"`--device {args.device}`, Primal.+DT (3 layers, K 20, batch 64 per member, s 64), views aside, counted "
            f"by a "
            "`TorchDispatchMode`; PyTorch's dropout masks, as on a GPU. On a GPU each is about one kernel launch, "
            f"and a "
            "CUDA graph of the step replays them all; `--compile` fuses the gather's, forward's and backward's into "
            "fewer kernels, and `--optimizer compiled` the clipping's and AdamW's (what still runs outside compiled "
            "regions: `python -m bench.step_kernels`).",
            "",
            common.md_table(["size", "precision", "members", "operations per update", "most frequent"], rows),
        ]
    )
    common.write_section("ensemble_ops", "Ensembles: operations per update", body, args.quick, device=args.device)


if __name__ == "__main__":
    main()
