"""dt-primal: Decision Transformers with Causal Primal-Attention (Chen et al., NeurIPS 2023).

Two process-wide settings for CPUs, made on import (docs/benchmarks.md, "Profile"):
- OpenMP threads that spin while they wait slow torch down badly whenever another process shares
  the cores (the training step ran 1.5x faster with PASSIVE). Set before torch is first imported;
  a value in the environment still wins.
- glibc's malloc hands big freed blocks back to the OS and page-faults fresh ones in on the next
  allocation: about 30 000 page faults per training step at SPEC §4 size, which made a bf16 step
  take 1.1x the CPU time. Freed blocks below 256 MiB are kept for reuse instead (no effect where
  the C library is not glibc).
"""
import ctypes
import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def _keep_freed_memory() -> None:
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return
    mallopt(M_MMAP_THRESHOLD, 256 << 20)
    mallopt(M_TRIM_THRESHOLD, 512 << 20)


_keep_freed_memory()


def __getattr__(name: str):
    """``dt_primal.load_policy`` (dt_primal.policy), imported on first use: torch loads only when needed."""
    if name == "load_policy":
        from dt_primal.policy import load_policy
        return load_policy
    raise AttributeError(f"module 'dt_primal' has no attribute {name!r}")


__all__ = ["load_policy"]
