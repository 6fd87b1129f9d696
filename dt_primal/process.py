"""Process-wide settings of the command-line programs, made by ``configure_process`` as a command's
first step and never on import: a program that imports dt_primal keeps its process as it was.

- OpenMP threads that spin while they wait slow torch down badly whenever another process shares
  the cores (a training step took 4x the time with OpenMP's default; docs/benchmarks.md, "Profile").
  The policy is read once, when torch's OpenMP runtime loads, so this runs before ``import torch``;
  a value in the environment still wins.
- glibc's malloc hands big freed blocks back to the OS and page-faults fresh ones in on the next
  allocation: about 30 000 page faults per training step at the default size, which made a bf16
  step take 1.1x the CPU time. Freed blocks below 256 MiB are kept for reuse instead (no effect where
  the C library is not glibc).

- MuJoCo's warning about HalfCheetah's deprecated 'settotalmass', printed for every environment made,
  is dropped (``envs.quiet_mujoco_warnings``).
- Standard output and error print any text: a character their encoding lacks (an ASCII terminal and
  "±", a path's undecodable bytes) is written as an escape instead of stopping the command.

TF32 is no process-wide setting here: ``--precision tf32`` enables it around the training step and
the evaluation's forward passes only (``dt_primal.precision``).
"""

from __future__ import annotations

import ctypes
import os
import sys


def configure_process(threads: int | None = None, wait_policy: str | None = "PASSIVE") -> None:
    """The settings of a dt-primal command: OpenMP's ``wait_policy`` (unless the environment names one;
    None leaves OpenMP's default), glibc's malloc keeping freed blocks, and ``threads`` CPU threads for
    torch if given. Call it before anything imports torch (the commands' first lines do)."""
    if wait_policy is not None:
        os.environ.setdefault("OMP_WAIT_POLICY", wait_policy)  # too late for OpenMP once torch is loaded
    _keep_freed_memory()
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):  # a text stream of the interpreter's (not a test's replacement)
            stream.reconfigure(errors="backslashreplace")
    from envs import quiet_mujoco_warnings  # Gymnasium and MuJoCo, not torch

    quiet_mujoco_warnings()
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


def _keep_freed_memory() -> None:
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return
    mallopt(M_MMAP_THRESHOLD, 256 << 20)
    mallopt(M_TRIM_THRESHOLD, 512 << 20)


def exit_with_parent(every: float = 1.0) -> None:
    """In a worker process (a pool's initializer): end it, and so what it runs (an ffmpeg writer), once the
    process that started it has gone, killed or not; a pool's idle worker would otherwise wait for work forever.
    A thread looks every ``every`` seconds."""
    import threading
    import time

    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()
