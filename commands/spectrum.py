"""``python -m commands.spectrum``: how low-rank each layer's attention is (the paper's Figure 1).

For windows of a checkpoint's dataset, each layer's attention matrix — softmax probabilities, or
for a primal layer the kernel K_ij = <φ(q̄_i), φ(k̄_j)> it implies — is decomposed by SVD and the
cumulative explained variance Σ_{j≤k} σ_j² / Σ_j σ_j² is averaged over windows and heads.

  python -m commands.spectrum runs/dt/last.pt runs/primal/last.pt --out docs/spectrum
"""

from __future__ import annotations

from dt_primal.process import configure_process

if __name__ == "__main__":
    configure_process()  # a command: its process-wide settings, before torch loads

from pathlib import Path

import numpy as np
import torch

from commands.sweep.plots import save_figure
from datasets.loaders import load_dataset
from dt_primal.cli import command_parser, run_main
from dt_primal.cli.train import Loader
from dt_primal.data import WindowSampler
from dt_primal.files.checkpoint import load_checkpoint, model_from_checkpoint
from dt_primal.files.writing import write_file
from envs import Task


@torch.no_grad()
def layer_spectra(model, batch: dict) -> list[np.ndarray]:
    """Per layer: the mean cumulative explained variance curve (3K,) of a one-member model's attention
    matrices on ``batch``, windows (B, K, ...)."""
    inputs = []
    hooks = [b.attn.register_forward_pre_hook(lambda m, args: inputs.append((m, args[0]))) for b in model.blocks]
    model(*(batch[k][None] for k in ("states", "actions", "returns_to_go", "timesteps")))
    for h in hooks:
        h.remove()
    curves = []
    for attn, x in inputs:
        s = torch.linalg.svdvals(attn.attention_matrix(x)[0].double())  # (B, H, L)
        var = s**2
        curves.append((var.cumsum(-1) / var.sum(-1, keepdim=True)).mean((0, 1)).numpy())
    return curves


def full_windows(ckpt: dict, n: int, seed: int, load_dataset: Loader) -> dict:
    """``n`` windows of the checkpoint's dataset (read by ``load_dataset``) with all K steps real (no padding)."""
    cfg = ckpt["config"]
    data = load_dataset(ckpt["dataset"], Task.from_record(ckpt["task"]).gym_id)
    sampler = WindowSampler(data, cfg["context"], cfg["reward_scale"], ckpt["state_mean"], ckpt["state_std"])
    gen = torch.Generator().manual_seed(seed)
    batch = sampler.sample(4 * n, gen)
    keep = batch["valid"].all(1).nonzero().flatten()[:n]
    return {k: v[keep] for k, v in batch.items()}


def main() -> None:
    p = command_parser(__doc__, prog="python -m commands.spectrum")
    p.add_argument("checkpoints", nargs="+", type=Path)
    p.add_argument("--windows", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("docs/spectrum"), help="writes OUT.png and OUT.md")
    args = p.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [
        "| checkpoint | model | layer | attention | top-1 | top-5 | top-10 | rank for 90% | rank for 99% |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    fig, axes = plt.subplots(1, len(args.checkpoints), figsize=(4.5 * len(args.checkpoints), 3.6), squeeze=False)
    for ax, path in zip(axes[0], args.checkpoints):
        ckpt = load_checkpoint(path)
        model = model_from_checkpoint(ckpt).eval()
        cfg = model.config
        ksvd = f", s {model.config.s}, η {cfg.eta:g}" if cfg.model != "dt" else ""
        curves = layer_spectra(model, full_windows(ckpt, args.windows, args.seed, load_dataset))
        for i, (curve, block) in enumerate(zip(curves, model.blocks)):
            kind = "primal K" if hasattr(block.attn, "Lambda") else "softmax"
            ax.plot(np.arange(1, len(curve) + 1), curve, label=f"layer {i + 1} ({kind})")
            rows.append(
                f"| {path} | {cfg.model}{ksvd} | {i + 1} | {kind} | {curve[0]:.3f} | {curve[4]:.3f} | {curve[9]:.3f} | "
                f"{int(np.searchsorted(curve, 0.9)) + 1} | {int(np.searchsorted(curve, 0.99)) + 1} |"
            )
        ax.set_title(f"{cfg.model}{ksvd}: {path.parent.name}", fontsize=9)
        ax.set_xlabel("number of singular values")
        ax.set_ylabel("cumulative explained variance")
        ax.set_xscale("log")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, args.out.with_suffix(".png"), 120)
    table = "\n".join(rows) + f"\n\nMean over {args.windows} full windows (3K tokens) and all heads.\n"
    write_file(args.out.with_suffix(".md"), table, "The table")
    print(table)


if __name__ == "__main__":
    run_main(main)
