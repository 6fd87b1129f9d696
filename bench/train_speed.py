"""Training throughput (updates/s) of dt-primal against the peer implementations (experiments/peers.py:
Hugging Face transformers' DecisionTransformerModel and d3rlpy's DecisionTransformer).

  python -m bench.train_speed                 # both papers' sizes, fp32 and bf16, with peers if installed
  python -m bench.train_speed --no-peers
  python -m bench.train_speed --quick         # smoke check, < 1 min

One update = sample a batch of 64 windows of K = 20 steps + one optimisation step. For dt-primal it
is the library's training step (dt_primal.training.throughput.fresh_step: the TrainStep train.py runs):
WindowSampler.sample, dt_loss (under bf16 autocast when asked), backward, gradient clipping at 0.25,
warm-up learning rate, fused AdamW, loss bookkeeping. The data are a D4RL-style hdf5 of Hopper-shaped random data
(obs 11, act 3, 100k steps), read by datasets.loaders like any dataset, and given to the peers too.
Both sides: ``--warmup`` untimed updates, then ``--updates`` timed; updates/s = updates / their
total wall time (experiments/peers.py's definition). Also given: updates per CPU-second of the process
(all threads), which the other jobs on a shared machine disturb much less than wall time.
Settings are timed in rounds (dt-primal dt, dt-primal primal, hf, d3rlpy back to back) so the
machine's load is alike for all; with ``--rounds`` > 1 each number is the median over rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from pathlib import Path

import bench.common as common

from datasets.loaders import load_dataset
from dt_primal.cli import command_parser
from dt_primal.config import make_config
from dt_primal.training.throughput import fresh_step

PEERS_PYTHON = Path(os.environ.get("DT_PRIMAL_PEERS_PYTHON", Path.home() / ".venvs/peers/bin/python"))
PEERS_SCRIPT = common.ROOT / "experiments" / "peers.py"
SIZES = {"Primal.+DT paper (d_model 256, 4 heads)": (256, 4), "DT paper (d_model 128, 1 head)": (128, 1)}
DATA = common.SCRATCH / "hopper-random-100k.hdf5"


def time_dt_primal(data, model: str, d_model: int, heads: int, precision: str, warmup: int, updates: int) -> dict:
    cfg = make_config("paper", model=model, d_model=d_model, n_head=heads, precision=precision, s=64, device="cpu")
    step = fresh_step(cfg, data, [0])
    for _ in range(warmup):
        step()
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(updates):
        step()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"updates_per_s": updates / wall, "updates_per_cpu_s": updates / cpu}


def peers_available() -> bool:
    return PEERS_PYTHON.exists() and PEERS_SCRIPT.exists()


def time_peer(peer: str, hdf5: Path, d_model: int, heads: int, precision: str, warmup: int, updates: int) -> dict:
    cmd = [
        str(PEERS_PYTHON),
        str(PEERS_SCRIPT),
        "--peer",
        peer,
        "--hdf5",
        str(hdf5),
        "--d-model",
        str(d_model),
        "--heads",
        str(heads),
        "--layers",
        "3",
        "--precision",
        precision,
        "--updates",
        str(updates),
        "--warmup",
        str(warmup),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=common.ROOT)
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or ["no output"])[-1]}
    r = json.loads(out.stdout.strip().splitlines()[-1])
    # experiments/peers.py gives process CPU time in its notes ("... (N updates per CPU-s)") when it measures it
    cpu = [
        float(part.split("(")[1].split()[0]) for part in r.get("notes", "").split("; ") if "updates per CPU-s" in part
    ]
    return {"updates_per_s": r["updates_per_s"], "updates_per_cpu_s": cpu[0] if cpu else None, "version": r["version"]}


def fmt(r: dict | None, key: str = "updates_per_s") -> str:
    if r is None:
        return "–"
    if "error" in r:
        return "failed"
    return f"{r[key]:.2f}" if r.get(key) is not None else "–"


def main() -> None:
    p = command_parser(__doc__)
    p.add_argument("--updates", type=int, default=30, help="timed updates per setting")
    p.add_argument("--warmup", type=int, default=5, help="untimed updates first")
    p.add_argument("--rounds", type=int, default=3, help="time every setting this many times, report medians")
    p.add_argument("--precisions", nargs="+", choices=("fp32", "bf16"), default=["fp32", "bf16"])
    p.add_argument("--sizes", nargs="+", choices=["spec", "dt"], default=["spec", "dt"])
    p.add_argument("--no-peers", action="store_true", help="time dt-primal only")
    p.add_argument("--quick", action="store_true", help="smoke check: DT-paper size, fp32, 3 updates")
    p.add_argument("--replot", action="store_true", help="rewrite the section from the last full run's saved results")
    args = p.parse_args()
    if args.quick:
        args.updates, args.warmup, args.precisions, args.sizes = 3, 1, ["fp32"], ["dt"]
    if args.replot:
        saved = common.load_results("train_speed")
        write(saved["records"], argparse.Namespace(**saved["args"]), saved["peers"], saved["steps"], saved["info"])
        return
    hdf5 = common.hopper_hdf5(DATA, steps=100_000)
    data = load_dataset(str(hdf5), env="hopper")
    peers = [] if args.no_peers or not peers_available() else ["hf", "d3rlpy"]
    records = []  # one dict per (round, size, precision, implementation)
    for _ in range(args.rounds):
        for size, (d, h) in SIZES.items():
            if ("spec" if d == 256 else "dt") not in args.sizes:
                continue
            for prec in args.precisions:
                for who in ["dt", "primal"] + peers:
                    r = (
                        time_dt_primal(data, who, d, h, prec, args.warmup, args.updates)
                        if who in ("dt", "primal")
                        else time_peer(who, hdf5, d, h, prec, args.warmup, args.updates)
                    )
                    records.append({"size": size, "precision": prec, "who": who} | r)
                    print(
                        f"{size:32s} {prec} {who:7s} {fmt(r)} updates/s, {fmt(r, 'updates_per_cpu_s')} per CPU-s "
                        f"(load {common.load_avg():.2f})",
                        flush=True,
                    )
    info = (
        None
        if args.quick
        else common.save_results(
            "train_speed", {"records": records, "args": vars(args), "peers": peers, "steps": len(data.rewards)}
        )["info"]
    )
    write(records, args, peers, len(data.rewards), info)


def write(records: list[dict], args, peers: list[str], steps: int, info: dict | None) -> None:
    sizes = list(dict.fromkeys(r["size"] for r in records))

    def med(size: str, prec: str, who: str) -> dict | None:
        rs = [r for r in records if (r["size"], r["precision"], r["who"]) == (size, prec, who)]
        ok = [r for r in rs if "error" not in r]
        if not ok:
            return rs[0] if rs else None
        out = {
            k: statistics.median(r[k] for r in ok)
            for k in ("updates_per_s", "updates_per_cpu_s")
            if ok[0].get(k) is not None
        }
        return out | {"version": ok[0].get("version")}

    rows = []
    for size in sizes:
        for prec in args.precisions:
            m = {who: med(size, prec, who) for who in ["dt", "primal"] + peers}
            row = [size, prec] + [f"{fmt(m[w])} ({fmt(m[w], 'updates_per_cpu_s')})" for w in ["dt", "primal"] + peers]
            for key in ("updates_per_s", "updates_per_cpu_s"):
                ok = [m[w][key] for w in peers if m[w] and m[w].get(key) is not None]
                row.append(" / ".join(f"{m[w][key] / max(ok):.2f}×" for w in ("dt", "primal")) if ok else "–")
            rows.append(row)
    versions = {w: next((r.get("version") for r in records if r["who"] == w and r.get("version")), "?") for w in peers}
    header = (
        ["size", "precision", "dt-primal --model dt", "dt-primal --model primal"]
        + [
            {"hf": f"HF transformers {versions.get('hf')}", "d3rlpy": f"d3rlpy {versions.get('d3rlpy')}"}[w]
            for w in peers
        ]
        + ["dt / primal ÷ faster peer (wall)", "dt / primal ÷ faster peer (CPU)"]
    )
    if not peers:
        header, rows = header[:4], [r[:4] for r in rows]
    lines = [
        f"Updates per second (in brackets: updates per CPU-second of the process, all threads), batch 64, K 20, "
        f"3 layers, dropout 0.1, s 64 for primal; {args.warmup} untimed then {args.updates} timed updates per "
        f"setting{f', median of {args.rounds} rounds' if args.rounds > 1 else ''}. Data: {DATA.name} "
        f"({steps:,} steps of Hopper-shaped random data, D4RL hdf5, made by bench/common.py). "
        f"Peers: `experiments/peers.py` in ~/.venvs/peers (same torch), each update = its own sampler + training "
        f"step, under the same OMP_WAIT_POLICY and thread count.",
        "",
        common.md_table(header, rows),
        "",
    ]
    if peers:
        lines.append(
            "Ratios: dt-primal's updates/s divided by the faster peer's at the same size and precision "
            "(`--model dt` / `--model primal`). All three do the same kind of work, mostly matrix products "
            "(see \"Profile\"; sampling is 0.1% of dt-primal's step). dt-primal's lead has two sources. "
            "(1) Fewer FLOPs: only s_t tokens predict, so its last block computes attention output and MLP "
            "at those tokens alone (exact; the peers run it on all 3K tokens), about a fifth of a 3-layer "
            "model's block FLOPs. (2) Cheaper dropout masks (`dt_primal/model/dropout.py`): PyTorch's CPU dropout "
            "draws one Bernoulli sample per element, serially, which took a quarter of a bf16 step's CPU "
            "time; dt-primal draws four 16-bit uniforms per 64-bit random number and writes out the "
            "attention math in training so that attention dropout uses them too. The peers pay the full "
            "Bernoulli cost, which weighs most in bf16, where the matrix products run on the CPU's bf16 "
            "units. Under bf16 autocast (dt-primal's default on CPUs with AMX/avx512_bf16; the peers run "
            "fp32 by default) every implementation gains 1.3-1.8× here. In fp32 the matrix products, the "
            'same ones the peers run, bound the step (55% of its CPU time in "Profile"), so the lead '
            "stays at the FLOPs saved plus the dropout."
        )
    if not peers:
        lines.append(
            "Peers not timed: "
            + (
                "--no-peers given."
                if args.no_peers
                else f"{PEERS_PYTHON} or {PEERS_SCRIPT} is missing (see experiments/peers-requirements.txt); "
                f"run this again once they exist."
            )
        )
    body = "\n".join(lines)
    common.write_section("train_speed", "Training speed: dt-primal vs peers", body, args.quick, info=info)


if __name__ == "__main__":
    main()
