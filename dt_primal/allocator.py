"""glibc malloc settings for the big, short-lived tensors of a forward pass on a CPU."""
from __future__ import annotations

import ctypes

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h


def retain_freed_memory() -> bool:
    """Ask glibc's malloc to keep freed blocks below 256 MiB for reuse. By default it hands big
    freed blocks back to the OS and page-faults fresh ones in on the next allocation, which took
    a third of the batched evaluation's forward pass on a CPU (docs/benchmarks.md, "Evaluation
    speed"). Process-wide; ``train.py``, ``evaluate.py`` and the benchmarks call it at start-up.
    Returns False, changing nothing, where the C library is not glibc."""
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, 256 << 20) and mallopt(M_TRIM_THRESHOLD, 512 << 20))
