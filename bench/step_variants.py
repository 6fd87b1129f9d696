"""The training step's options that only a GPU can rank, checked and timed in one command.

  python -m bench.step_variants --device cuda --json OUT/variants.json   # on a GPU: about 3 minutes
  python -m bench.step_variants --quick                                 # smoke check on a CPU, < 2 min

Each variant is a set of train.py options (compiling, the AdamW kernel, the attention kernel, the compile mode,
the precision; docs/configuration.md). Each runs in a process of its own, all at once (the compilations
overlap on the CPU's cores) and then timed one after the other, alone. Each is first **checked**: 2
members trained 4 updates from the same start (dropout 0) by the variant and by the eager step with the
default options in the variant's precision must agree (losses and weight changes within the tolerance of the
precision) and stay finite; then **timed**: ``--members`` members, ``--warmup`` untimed updates (capture,
compilation), ``--updates`` timed ones (``dt_primal.training.throughput.time_updates``, Primal.+DT at the
paper's size). The table, fastest first, is printed last; ``--json`` writes it with the engine's hash for
``python -m tools.gpu_window``, which trains with the fastest variant that passed (``fastest``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import bench.common as common

import torch

from datasets.loaders import load_dataset
from dt_primal.cli import command_parser
from dt_primal.config import add_config_args, make_config, overrides
from dt_primal.precision import resolve_precision
from dt_primal.training.step import step_mode
from dt_primal.training.throughput import engine_hash, fresh_step, time_updates

COMPILED = ["--compile"]
VARIANTS = {  # name: train.py options (precision bf16 unless they name one)
    "captured": [],
    "compiled": COMPILED,
    "compiled, optimizer compiled": COMPILED + ["--optimizer", "compiled"],
    "compiled, attention math": COMPILED + ["--attention-kernel", "math"],
    "compiled, optimizer compiled, attention math": COMPILED
    + ["--optimizer", "compiled", "--attention-kernel", "math"],
    "compiled, optimizer compiled, max-autotune": COMPILED
    + ["--optimizer", "compiled", "--compile-mode", "max-autotune"],
    "compiled, optimizer compiled, tf32": COMPILED + ["--optimizer", "compiled", "--precision", "tf32"],
}
QUICK = ["captured", "compiled, optimizer compiled, attention math"]
# relative error allowed of the losses, and of the weights' change over the checked updates, per precision
TOLERANCE = {"fp32": (1e-4, 1e-3), "tf32": (1e-2, 0.25), "bf16": (2e-2, 0.25)}


def variant_config(options: list[str], device: str, quick: bool):
    """The Config of train.py's ``options`` for Primal.+DT at the paper's size (the DT paper's with ``quick``) on
    ``device``, in bf16 on a GPU."""
    parser = argparse.ArgumentParser(prog="train.py options after --", allow_abbrev=False)
    add_config_args(parser)
    base = dict(model="primal", s=64, device=device, precision="bf16" if device != "cpu" else "fp32")
    base |= dict(d_model=128, n_head=1) if quick else {}
    return make_config("paper", **(base | overrides(parser.parse_args(options))))


def setting_parser(description: str) -> argparse.ArgumentParser:
    """A step benchmark's parser with ``--device`` and ``--members`` (9 by default: a task's three datasets × three
    seeds, the sweep's group); with ``variant_config``, the setting it measures."""
    p = command_parser(description)
    p.add_argument("--device", default="cpu")
    p.add_argument("--members", type=int, default=9, help="members trained at once (default: 9)")
    return p


def trained(cfg, data, updates: int):
    """Losses (updates, 2 members) and weights (before, after) of ``updates`` updates of 2 fresh members."""
    step = fresh_step(cfg, data, [0, 1], cfg.device)
    before = torch.cat([p.detach().float().flatten() for p in step.params.values()])
    losses = []
    for _ in range(updates):
        step.sums.zero_()
        step()
        losses.append(step.sums[:, 0].clone())
    after = torch.cat([p.detach().float().flatten() for p in step.params.values()])
    return torch.stack(losses).cpu(), before.cpu(), after.cpu()


def check(cfg, data, updates: int = 4) -> dict:
    """The variant against the eager step with the default options in its precision (module docstring)."""
    cfg = dataclasses.replace(cfg, dropout=0.0)
    eager = dict(compile=False, cuda_graph=False, optimizer="fused", attention_kernel="sdpa", compile_mode="default")
    loss_ref, w0, w_ref = trained(dataclasses.replace(cfg, **eager), data, updates)
    loss, w0_v, w = trained(cfg, data, updates)
    loss_err = float(((loss - loss_ref).abs() / loss_ref.abs()).max())
    update_err = float((w - w_ref).norm() / (w_ref - w0).norm())
    tol_loss, tol_update = TOLERANCE[resolve_precision(cfg.precision, torch.device(cfg.device), cfg.d_model)[0]]
    finite = bool(torch.isfinite(loss).all() and torch.isfinite(w).all() and torch.equal(w0, w0_v))
    passed = finite and loss_err <= tol_loss and update_err <= tol_update
    return {"passed": passed, "loss_error": loss_err, "update_error": update_err, "tolerance": [tol_loss, tol_update]}


def run_variant(name: str, args) -> dict:
    """The worker of one variant: checked, then compiled and captured at ``--members`` members, then, once
    the file ``--go`` exists (the others are compiled by then), timed."""
    torch.manual_seed(0)
    cfg = variant_config(VARIANTS[name], args.device, args.quick)
    data = load_dataset(str(common.hopper_hdf5(common.SCRATCH / "hopper-random-100k.hdf5")), env="hopper")
    checked = check(cfg, data)
    torch._dynamo.reset()
    step = fresh_step(cfg, data, range(args.members), cfg.device)
    warm = time_updates(step, args.warmup, 1)["warmup_s"]
    args.go.with_suffix(".ready").touch()
    while not args.go.exists():
        time.sleep(0.05)
    timed = time_updates(step, 0, args.updates) | {"warmup_s": warm}
    mode = step_mode(cfg, torch.device(cfg.device))
    setting = dict(model=cfg.model, d_model=cfg.d_model, n_head=cfg.n_head, mode=mode, precision=step.precision)
    return {"variant": name, "options": VARIANTS[name]} | setting | timed | checked


def rank(args) -> list[dict]:
    """Every variant's worker at once (the checks and compilations overlap, on the CPU's cores), then each
    timed alone, in turn; a worker not ready within ``--limit`` seconds, or failing, is a failed variant.
    ``--json`` is written after each variant, so that a ranking cut short still names what it timed."""
    folder = Path(tempfile.mkdtemp(prefix="step-variants-"))
    workers = {}
    for i, name in enumerate(args.variants):
        cmd = [
            sys.executable,
            "-m",
            __spec__.name,
            "--variant",
            name,
            "--device",
            args.device,
            "--members",
            str(args.members),
        ]
        cmd += ["--warmup", str(args.warmup), "--updates", str(args.updates), "--go", str(folder / f"{i}.go")]
        log = open(folder / f"{i}.log", "w+")
        workers[name] = (
            subprocess.Popen(cmd + (["--quick"] if args.quick else []), stdout=log, stderr=log, cwd=common.ROOT),
            log,
            i,
        )
    deadline = time.time() + args.limit
    records = []
    for name, (proc, log, i) in workers.items():
        while proc.poll() is None and not (folder / f"{i}.ready").exists() and time.time() < deadline:
            time.sleep(0.1)
        if proc.poll() is None and not (folder / f"{i}.ready").exists():
            proc.kill()  # still checking or compiling at the deadline
        (folder / f"{i}.go").touch()
        try:
            proc.wait(60)  # its timed updates: a second or two
        except subprocess.TimeoutExpired:
            proc.kill()
        log.seek(0)
        lines = log.read().strip().splitlines() or ["no output"]
        try:
            r = json.loads(lines[-1]) if proc.returncode == 0 else None
        except ValueError:
            r = None
        why = f"not ready within {args.limit:.0f} s" if proc.returncode == -9 else lines[-1][-300:]
        records.append(r or {"variant": name, "options": VARIANTS[name], "passed": False, "failed": why})
        print(name, "->", json.dumps({k: v for k, v in records[-1].items() if k != "options"}), flush=True)
        save(args, records)
    for proc, _, _ in workers.values():
        proc.kill()
    shutil.rmtree(folder, ignore_errors=True)
    return records


def save(args, records: list[dict]) -> dict:
    """The ranking, fastest first, with the engine's hash and the machine; written to ``--json`` if given."""
    records = sorted(records, key=lambda r: -r.get("member_updates_per_s", 0.0))
    doc = {"engine": engine_hash(), "members": args.members, "records": records, "info": common.run_info()}
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1, default=str))
    return doc


def fastest(doc: dict) -> dict | None:
    """The fastest record of a ``--json`` file that passed its check, or None."""
    passed = [r for r in doc.get("records", []) if isinstance(r, dict) and r.get("passed") is True]
    return max(passed, key=lambda r: r["member_updates_per_s"], default=None)


def main() -> None:
    p = setting_parser(__doc__)
    p.add_argument("--warmup", type=int, default=8, help="untimed updates (at least 5: capture, compilation)")
    p.add_argument("--updates", type=int, default=50)
    p.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    p.add_argument(
        "--limit", type=float, default=150, help="seconds for all variants' checks and compilations (run at once)"
    )
    common.add_json_options(p, "the ranking")
    p.add_argument("--quick", action="store_true", help="DT-paper size, 2 members, 2 variants, a few updates")
    p.add_argument("--variant", help=argparse.SUPPRESS)  # worker mode
    p.add_argument("--go", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.quick:
        args.members, args.warmup, args.updates, args.variants = 2, 5, 3, QUICK
    if args.variant:
        print(json.dumps(run_variant(args.variant, args)))
        return
    if args.from_json:
        return section(json.loads(args.from_json.read_text()), quick=False)
    section(save(args, rank(args)), args.quick)


def section(doc: dict, quick: bool) -> None:
    """The ranking as the section of docs/benchmarks.md for its device (its GPU's name on CUDA)."""
    rows = [
        [
            r["variant"],
            " ".join(r["options"]) or "(defaults)",
            f"{r['member_updates_per_s']:.0f}" if "member_updates_per_s" in r else "",
            f"{r['warmup_s']:.0f}" if "warmup_s" in r else "",
            "passed" if r["passed"] else "failed",
            r.get("failed") or f"loss {r['loss_error']:.1e}, update {r['update_error']:.1e}",
        ]
        for r in doc["records"]
    ]
    header = ["variant", "train.py options", f"member-updates/s ({doc['members']})", "warm-up s", "check", "errors"]
    best = fastest(doc)
    body = "\n\n".join(
        [
            f"The training step's variants at {doc['members']} members, Primal.+DT at the paper's size, bf16 unless "
            f"named (engine {doc['engine']}), fastest first; check: losses and updates against the captured "
            "step's within the tolerances of `step_variants.py`.",
            common.md_table(header, rows),
            f"fastest that passed: {best and best['variant']} ({best and ' '.join(best['options']) or 'defaults'})",
        ]
    )
    title = f"Step variants ranked ({doc['info'].get('gpu') or 'cpu'})"
    common.write_section("step_variants" + common.gpu_suffix(doc["info"]), title, body, quick, doc["info"])


if __name__ == "__main__":
    main()
