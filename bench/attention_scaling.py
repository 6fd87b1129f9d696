"""Time and peak memory of forward + backward through ONE transformer block (dt_primal.model.transformer.Block)
as the sequence grows: softmax attention (SDPA) against Causal Primal-Attention.

  python -m bench.attention_scaling   # 60 .. 12000 tokens; writes docs/benchmarks.md, docs/attention_scaling.png
  python -m bench.attention_scaling --quick    # smoke check, < 1 min

Three blocks, each as the training loop runs it (train mode, a padding mask of all-real tokens,
as DecisionTransformer always passes one):
  softmax        dropout 0.1 (the paper's setting): PyTorch's CPU SDPA has no fused kernel with
                 attention dropout, so it runs the math path and stores the L x L matrices;
  softmax-flash  dropout 0: the CPU flash-attention kernel (what inference gets);
  primal         Causal Primal-Attention, s = 64, dropout 0.1 (residual only).
Each (block, length) point runs in a fresh subprocess (so peak memory is not polluted by an
earlier point) and reports: the median time of fwd+bwd, the peak of live tensor bytes during one
fwd+bwd from torch.profiler's allocator events, and the growth of the process's peak RSS.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys

import bench.common as common  # first: sets OMP_WAIT_POLICY before torch loads

import torch

from dt_primal.cli import command_parser

RESULTS = common.SCRATCH / "attention_scaling.json"  # raw points of the last full run
KINDS = {"softmax": (False, 0.1), "softmax-flash": (False, 0.0), "primal": (True, 0.1)}
LABELS = {
    "softmax": "softmax, dropout 0.1 (SDPA math path)",
    "softmax-flash": "softmax, dropout 0 (SDPA flash kernel)",
    "primal": "primal (s = 64)",
}


def profiled_peak_bytes(fn) -> int:
    """Peak of live bytes allocated through PyTorch's CPU allocator while ``fn`` runs, above the
    level at its start: the running sum of the profiler's [memory] events (+alloc, -free) in
    time order. Counts every tensor (activations saved for backward, gradients, temporaries); not
    counted: scratch memory that oneDNN/MKL allocate themselves."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    live = peak = 0
    for _, n in events:
        live += n
        peak = max(peak, live)
    return peak


def run_point(kind: str, length: int, batch: int, d_model: int, heads: int, s: int, budget_s: float) -> dict:
    """One (block, length) point; runs in its own process."""
    from dt_primal.config import Config
    from dt_primal.model.transformer import Block

    primal, dropout = KINDS[kind]
    torch.manual_seed(0)
    cfg = Config(d_model=d_model, n_head=heads, s=s, dropout=dropout).model_config(state_dim=1, act_dim=1)
    block = Block(cfg, primal=primal, members=1).train()
    x = torch.randn(1, batch, length, d_model, requires_grad=True)  # one member
    valid = torch.ones(1, batch, length, dtype=torch.bool)

    def fwd_bwd():
        y, J = block(x, valid)
        loss = y.sum() if J is None else y.sum() + J.sum()
        loss.backward()
        block.zero_grad(set_to_none=True)
        x.grad = None

    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    first = common.seconds(fwd_bwd)  # also the warm-up of the timing below
    rss_growth = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) * 1024
    repeats = int(min(10, max(3, budget_s // max(first, 1e-3))))
    return {
        "kind": kind,
        "length": length,
        "batch": batch,
        **common.timed(fwd_bwd, repeats, warmup=0),
        "peak_bytes": profiled_peak_bytes(fwd_bwd),
        "rss_growth_bytes": rss_growth,
    }


def attention_matrix_bytes(length: int, batch: int, heads: int) -> int:
    return 4 * batch * heads * length * length


def plot(results: list[dict], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, kind in enumerate(KINDS):
        pts = [r for r in results if r["kind"] == kind]
        if not pts:
            continue
        L, color = [r["length"] for r in pts], f"C{i}"
        axes[0].loglog(L, [r["seconds"] * 1e3 for r in pts], "o-", color=color, label=LABELS[kind] + ", wall")
        axes[0].loglog(
            L, [r["cpu_seconds"] * 1e3 for r in pts], "x--", color=color, alpha=0.6, label="  CPU time (all threads)"
        )
        axes[1].loglog(L, [r["peak_bytes"] / 2**20 for r in pts], "o-", color=color, label=LABELS[kind])
    for ax, what in zip(axes, ("forward + backward time (ms)", "peak tensor memory (MiB)")):
        ax.set_xlabel("sequence length (tokens)")
        ax.set_ylabel(what)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(
        "One transformer block (d_model 256, 4 heads), batch 1, forward + backward, on "
        + common.cpu_model().split(" (")[0]
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def crossover(by: dict, lengths: list[int], other: str, key: str) -> int | None:
    """The first measured length from which primal stays faster than ``other``."""
    both = [L for L in lengths if (other, L) in by and ("primal", L) in by]
    for i, L in enumerate(both):
        if all(by[("primal", M)][key] < by[(other, M)][key] for M in both[i:]):
            return L
    return None


def slopes(results: list[dict], kinds: list[str], fit_from: int) -> list[list[str]]:
    """Per block: the log-log slopes of time, CPU time and memory against length, from ``fit_from`` tokens on."""
    fits = []
    for kind in kinds:
        big = [r for r in results if r["kind"] == kind and r["length"] >= fit_from]
        if len(big) >= 2:
            L = [r["length"] for r in big]
            measures = ("seconds", "cpu_seconds", "peak_bytes")
            fitted = [f"{common.loglog_slope(L, [r[k] for r in big]):.2f}" for k in measures]
            fits.append([LABELS[kind], *fitted, f"{L[0]}–{L[-1]}"])
    return fits


def report(results: list[dict], args, skipped: list[str]) -> str:
    by = {(r["kind"], r["length"]): r for r in results}
    lengths = sorted({r["length"] for r in results})
    kinds = [k for k in KINDS if any(r["kind"] == k for r in results)]
    t_rows, m_rows = [], []
    for L in lengths:
        t_row, m_row = [L], [L]
        for kind in kinds:
            r = by.get((kind, L))
            t_row.append(f"{r['seconds'] * 1e3:.1f} ({r['cpu_seconds'] * 1e3:.1f})" if r else "skipped")
            m_row.append(f"{r['peak_bytes'] / 2**20:.1f} ({r['rss_growth_bytes'] / 2**20:.0f})" if r else "skipped")
        p = by.get(("primal", L))
        for other in [k for k in kinds if k != "primal"]:
            o = by.get((other, L))
            t_row.append(
                f"{o['seconds'] / p['seconds']:.2f}× ({o['cpu_seconds'] / p['cpu_seconds']:.2f}×)" if p and o else "–"
            )
            m_row.append(f"{o['peak_bytes'] / p['peak_bytes']:.1f}×" if p and o else "–")
        t_rows.append(t_row)
        m_rows.append(m_row)
    others = [k for k in kinds if k != "primal"]
    lines = [
        f"One `dt_primal.model.transformer.Block` (d_model {args.d_model}, {args.heads} heads, MLP 4·d_model, s "
        f"{args.s} for primal), "
        f"batch {args.batch}, train mode, padding mask of all-real tokens (as `DecisionTransformer` always passes); "
        f"forward + backward of `y.sum() (+ J.sum())` to the input and all weights. Each point runs in a fresh "
        f"process. **Time**: median of 3-10 runs after a warm-up, wall clock and, in brackets, CPU time of the "
        f"process (all threads; other jobs on this shared machine disturb it much less). **Memory**: peak of live "
        f"tensor bytes during one fwd+bwd above the level before it, from the allocator events of "
        f"`torch.profiler.profile(profile_memory=True)` summed in time order (weights and input excluded; every "
        f"activation saved for backward, gradient and temporary included; scratch buffers that oneDNN/MKL "
        f"allocate themselves are not seen); in brackets the cross-check: growth of the peak resident set "
        f"(`ru_maxrss`) during the process's first fwd+bwd (adds allocator slack and one-off library buffers, so "
        f"about 20 MiB of noise at small sizes).",
        "",
        "Time, ms (CPU ms):",
        "",
        common.md_table(["tokens"] + [LABELS[k] for k in kinds] + [f"{k} / primal" for k in others], t_rows),
        "",
        "Peak tensor memory, MiB (RSS growth, MiB):",
        "",
        common.md_table(["tokens"] + [LABELS[k] for k in kinds] + [f"{k} / primal" for k in others], m_rows),
        "",
    ]
    fits = slopes(results, kinds, args.fit_from)
    lines += [
        f"Log-log slopes fitted on lengths ≥ {args.fit_from} (1 = linear, 2 = quadratic; at shorter lengths "
        f"fixed per-call costs flatten the curves):",
        "",
        common.md_table(["block", "wall-time slope", "CPU-time slope", "memory slope", "lengths"], fits),
        "",
    ]
    for other in others:
        w, c = crossover(by, lengths, other, "seconds"), crossover(by, lengths, other, "cpu_seconds")
        lines.append(
            f"- primal is faster than {LABELS[other]} from **{w} tokens** on (wall) / from {c} tokens on (CPU time)"
            if w or c
            else f"- primal is not faster than {LABELS[other]} at any measured length"
        )
    lines += [f"- skipped: {s}" for s in skipped]
    lines += [
        "- the softmax-flash memory still grows faster than linearly because `SoftmaxAttention` turns any "
        "padding mask into a dense (B, 1, L, L) boolean mask (the CPU flash kernel then expands it to a float "
        "mask); without a mask (`is_causal=True`) it would be linear too. At K = 20 (60 tokens) none of this matters.",
        "- how long the whole DT's sequences are in this project: 3K = 60 tokens, where all three blocks cost about "
        "the same; the advantage of primal attention appears from about a thousand tokens.",
    ]
    if not args.quick:
        lines += ["", "![time and memory against length](attention_scaling.png)"]
    return "\n".join(lines)


def main() -> None:
    p = command_parser(__doc__)
    p.add_argument("--lengths", type=int, nargs="+", default=[60, 120, 240, 480, 960, 1920, 3840, 6000, 12000])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--s", type=int, default=64)
    p.add_argument("--kinds", nargs="+", choices=list(KINDS), default=list(KINDS))
    p.add_argument(
        "--max-attention-gib", type=float, default=1.0, help="skip softmax math past one L x L tensor this big"
    )
    p.add_argument("--budget", type=float, default=15.0, help="seconds of timed runs per point (3 to 10 runs)")
    p.add_argument("--fit-from", type=int, default=480, help="fit the slopes on lengths >= this")
    p.add_argument("--quick", action="store_true", help="smoke check: 60 and 480 tokens, short budget, doc in /tmp")
    p.add_argument("--replot", action="store_true", help=f"only rebuild the section and plot from {RESULTS}")
    p.add_argument("--point", nargs=2, metavar=("KIND", "LENGTH"), help=argparse.SUPPRESS)  # worker mode
    args = p.parse_args()
    if args.point:
        print(
            json.dumps(
                run_point(args.point[0], int(args.point[1]), args.batch, args.d_model, args.heads, args.s, args.budget)
            )
        )
        return
    if args.quick:
        args.lengths, args.budget, args.fit_from = [60, 480], 1.0, 60
    results, skipped, info = [], [], None
    if args.replot:
        saved = json.loads(RESULTS.read_text())
        results, skipped, info, args.lengths = saved["results"], saved["skipped"], saved.get("info"), []
    for L in args.lengths:
        for kind in args.kinds:
            if kind == "softmax" and attention_matrix_bytes(L, args.batch, args.heads) > args.max_attention_gib * 2**30:
                skipped.append(
                    f"{LABELS[kind]} at {L} tokens (one attention tensor would be "
                    f"{attention_matrix_bytes(L, args.batch, args.heads) / 2**30:.1f} GiB; raise --max-attention-gib)"
                )
                continue
            cmd = [sys.executable, "-m", __spec__.name, "--point", kind, str(L)] + [
                f"--{k}={getattr(args, k.replace('-', '_'))}" for k in ("batch", "d-model", "heads", "s", "budget")
            ]
            out = subprocess.run(cmd, capture_output=True, text=True, cwd=common.ROOT)
            if out.returncode != 0:
                skipped.append(f"{LABELS[kind]} at {L} tokens (failed: {out.stderr.strip().splitlines()[-1:]})")
                continue
            r = json.loads(out.stdout.strip().splitlines()[-1])
            results.append(r)
            print(
                f"{kind:14s} L={L:6d}  {r['seconds'] * 1e3:9.1f} ms (CPU {r['cpu_seconds'] * 1e3:9.1f})  peak "
                f"{r['peak_bytes'] / 2**20:8.1f} MiB  "
                f"rss +{r['rss_growth_bytes'] / 2**20:7.0f} MiB  (load {common.load_avg():.2f})",
                flush=True,
            )
    if not args.quick:
        if not args.replot:
            info = common.run_info()
            RESULTS.parent.mkdir(parents=True, exist_ok=True)
            RESULTS.write_text(json.dumps({"results": results, "skipped": skipped, "info": info}, indent=1))
        common.DOC.parent.mkdir(parents=True, exist_ok=True)
        plot(results, common.DOC.parent / "attention_scaling.png")
    body = report(results, args, skipped)
    common.write_section(
        "attention_scaling", "Attention scaling: one block, softmax vs primal", body, args.quick, info=info
    )


if __name__ == "__main__":
    main()
