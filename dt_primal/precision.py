"""The arithmetic of the training step and the evaluation's forward passes (``--precision``).

fp32; tf32 (fp32 with TF32 matrix products on CUDA); bf16 (autocast: matrix products in bfloat16,
weights and optimizer in fp32); auto, the default: bf16 on CUDA, and on a CPU bf16 only where a short
measurement at start-up finds bf16 matrix products of the model's own shapes clearly faster than
fp32 ones (CPUs with native bf16 units, AVX-512 BF16 or AMX), else fp32: where the CPU has no bf16
units, bf16 products are emulated and about 100x slower (docs/benchmarks.md, "Precision auto").
"""

from __future__ import annotations

import contextlib
import time

import torch

from dt_primal.config import PRECISIONS

# bf16 is chosen on a CPU when its matrix product takes at most this share of the fp32 one: the
# autocast casts and the element-wise work around the products gain nothing from bf16.
BF16_SHARE = 0.8
MEASURE_FLOPS = 2**27  # of one measured product: its rows are a part of a batch's 3 x K x batch tokens
MEASURE_PAIRS = 5  # timed pairs of products (fp32, bf16), fewer once MEASURE_SECONDS have passed
MEASURE_SECONDS = 0.2


def resolve_precision(precision: str, device: torch.device, d_model: int) -> tuple[str, str]:
    """``(precision, why)``: ``precision`` itself unless it is auto, which becomes bf16 on CUDA, on a
    CPU bf16 where ``bf16_share`` finds it faster, and fp32 elsewhere."""
    if precision != "auto":
        return precision, "as set"
    if device.type == "cuda":
        return "bf16", "auto: bf16 autocast on CUDA"
    if device.type != "cpu":
        return "fp32", f"auto: fp32 on {device.type}"
    t0 = time.perf_counter()
    share = bf16_share(d_model)
    chosen = "bf16" if share <= BF16_SHARE else "fp32"
    return chosen, (
        f"auto: on this CPU a bf16 matrix product of the model's shapes took {share:.2f}x the fp32 time "
        f"(measured in {time.perf_counter() - t0:.2f} s)"
    )


def acting_precision(given: str | None, trained: str, device: torch.device, d_model: int) -> tuple[str, str]:
    """``(precision, why)`` for acting with a run trained at ``trained``: ``given`` unless it is auto or
    None, which keep the run's own, except that bf16 on a CPU becomes fp32 where bf16 is slow there."""
    if given not in (None, "auto"):
        return given, "as set"
    if trained in ("bf16", "auto"):
        return resolve_precision("auto", torch.device(device), d_model)
    return trained, "auto: the run's own"


def bf16_share(d_model: int) -> float:
    """The time of a bf16-autocast matrix product over that of the same fp32 product, for the shape of
    the MLP's first product (rows x d_model @ d_model x 4 d_model, 64 to 512 rows): the best of a few
    interleaved pairs after a warm-up, on one thread (the ratio is the arithmetic units', and one
    thread is disturbed least by other processes on the cores); fewer pairs where bf16 is slow."""
    rows = min(512, max(64, MEASURE_FLOPS // (8 * d_model * d_model)))
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(rows, d_model, generator=generator)
    w = torch.randn(d_model, 4 * d_model, generator=generator)
    bf16 = autocast("bf16", "cpu")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        best, start = [float("inf")] * 2, time.perf_counter()
        for pair in range(MEASURE_PAIRS + 1):  # the first pair warms up (oneDNN builds its kernels)
            for k, context in enumerate((contextlib.nullcontext(), bf16)):
                with context:
                    t0 = time.perf_counter()
                    x @ w
                    best[k] = min(best[k], time.perf_counter() - t0) if pair else best[k]
            if pair >= 2 and time.perf_counter() - start > MEASURE_SECONDS:
                break
        return best[1] / max(best[0], 1e-9)
    finally:
        torch.set_num_threads(threads)


def autocast(precision: str, device_type: str, cache_casts: bool = True) -> torch.autocast:
    """The forward pass's autocast: bf16 for ``precision`` bf16, else disabled; ``cache_casts=False``
    for a step captured as a CUDA graph, which a cache of casts would outlive."""
    if precision not in PRECISIONS or precision == "auto":
        raise ValueError(f"precision {precision!r}: give fp32, tf32 or bf16 (resolve auto with resolve_precision)")
    return torch.autocast(device_type, dtype=torch.bfloat16, enabled=precision == "bf16", cache_enabled=cache_casts)


@contextlib.contextmanager
def tf32(precision: str):
    """For ``precision`` tf32, TF32 matrix products on CUDA (forward and backward) inside the block:
    PyTorch's process-wide switches, set on entry and restored on exit; nothing for the others."""
    if precision != "tf32":
        yield
        return
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
