"""Acting latency of an exported policy: ``policy.act`` for one observation and for a batch of 100, the
PyTorch policy of a checkpoint (``dt_primal.load_policy("last.pt")``, fp32) against its ONNX export on
onnxruntime (``dt_primal.load_policy("policy.onnx")``), and the exported file's size.

  python -m bench.onnx_policy                   # the paper's model size (Primal.+DT and DT), fresh weights
  python -m bench.onnx_policy --quick           # smoke check, < 1 min

Each setting: both policies act on the same observations, alternately (paired), with a full context of
K = 20 steps behind them; ``--rounds`` rounds of ``--calls`` calls each, the median of the per-round ms
per call reported for each, and the median of the per-round ratios. Weights are fresh (speed does not
depend on training): a checkpoint written by ``dt_primal.files.checkpoint`` as train.py writes it.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

import bench.common as common

import numpy as np

from dt_primal import load_policy
from dt_primal.cli import command_parser
from dt_primal.config import make_config
from dt_primal.export import export

OBS, ACT = 11, 3  # Hopper's sizes


def checkpoint(model: str, folder: Path) -> Path:
    """A train.py checkpoint of fresh weights at the paper's size (0 training steps)."""
    from datasets.loaders import load_dataset
    from dt_primal.training.loop import train

    data = load_dataset(str(common.hopper_hdf5(common.SCRATCH / "hopper-random-100k.hdf5")), env="hopper")
    cfg = make_config("paper", model=model, env="hopper", steps=0, eval_episodes=1, out=str(folder / model))
    train(cfg, data)
    return folder / model / "last.pt"


def time_act(policy, obs: np.ndarray, calls: int) -> float:
    """ms per ``act`` call on ``obs`` (N, obs_dim), after the context is full."""
    policy.reset(np.full(len(obs), 3600.0))
    for _ in range(20):
        policy.act(obs, reward=1.0)
    t0 = time.perf_counter()
    for _ in range(calls):
        policy.act(obs, reward=1.0)
    return 1e3 * (time.perf_counter() - t0) / calls


def main() -> None:
    p = command_parser(__doc__)
    p.add_argument("--models", nargs="+", default=["primal", "dt"])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 100])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--calls", type=int, default=50)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    if args.quick:
        args.models, args.rounds, args.calls = ["primal"], 2, 5
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models:
            ckpt = checkpoint(model, Path(tmp))
            onnx_file = export(ckpt, Path(tmp) / f"{model}.onnx")
            policies = {"PyTorch": load_policy(ckpt, precision="fp32"), "onnxruntime": load_policy(onnx_file)}
            for n in args.batches:
                obs = np.random.default_rng(0).standard_normal((n, OBS)).astype(np.float32)
                ms = {name: [] for name in policies}
                for _ in range(args.rounds):
                    for name, policy in policies.items():
                        ms[name].append(time_act(policy, obs, args.calls))
                ratio = statistics.median(a / b for a, b in zip(ms["PyTorch"], ms["onnxruntime"]))
                med = {name: statistics.median(v) for name, v in ms.items()}
                size = onnx_file.stat().st_size / 2**20
                rows.append(
                    [model, n, f"{med['PyTorch']:.2f}", f"{med['onnxruntime']:.2f}", f"**{ratio:.2f}×**", f"{size:.1f}"]
                )
                print(" | ".join(map(str, rows[-1])), flush=True)
    body = (
        "`policy.act` with a full context (K 20), ms per call, median of the rounds; the ratio is PyTorch's time "
        "over onnxruntime's, median of the paired rounds (above 1: onnxruntime is faster). Fresh weights at "
        "the paper's size (d_model 256, 3 layers, 4 heads), Hopper's sizes, fp32 on both.\n\n"
        + common.md_table(["model", "observations per call", "PyTorch ms", "onnxruntime ms", "ratio", "ONNX MiB"], rows)
    )
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA")  # oneDNN held to an older instruction set, as most users' CPUs
    title = "Acting latency: PyTorch against its ONNX export" + (f" (oneDNN held to {isa})" if isa else "")
    common.write_section("onnx_policy" + (f"_{isa.lower()}" if isa else ""), title, body, args.quick)


if __name__ == "__main__":
    main()
