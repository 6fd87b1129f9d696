"""The machine a command runs on: the device it names (``--device``), the memory it has free, and how work is
captured as a CUDA graph there."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

import torch

from dt_primal.errors import UserError


def check_device(device: str) -> None:
    """A ``cuda:N`` that this machine has (``cuda`` without a GPU is refused when the device is resolved)."""
    if device.startswith("cuda:") and torch.cuda.is_available():
        count = torch.cuda.device_count()
        if int(device.split(":")[1]) >= count:
            raise UserError(
                f"--device {device} names a GPU this machine does not have: PyTorch sees {count} "
                f"(cuda:0{f' to cuda:{count - 1}' if count > 1 else ''}). Pick one of them, or cuda."
            )


def memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB"


def on_gpu(device: str) -> bool:
    """Whether ``device`` (auto, cpu, cuda, cuda:N) means a CUDA GPU: cuda, cuda:N, or auto where there is one."""
    return device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())


def gpu_index(device: str) -> int:
    """The index of the GPU that ``device`` (cuda, cuda:N, auto) means; torch must see CUDA."""
    return int(device.split(":")[1]) if ":" in device else torch.cuda.current_device()


def available_bytes(device: str) -> tuple[int, str]:
    """Memory a run can still take on ``device`` (0 when unknown), and what it is called."""
    if on_gpu(device):
        if not torch.cuda.is_available():
            return 0, "GPU memory"
        return torch.cuda.mem_get_info(gpu_index(device))[0], "free GPU memory"
    try:
        with open("/proc/meminfo") as f:
            kib = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))
        return kib << 10, "available memory"
    except (OSError, StopIteration, ValueError, IndexError):
        return memory_bytes(), "memory"


def resolve_device(name: str) -> torch.device:
    """``auto``/``cpu``/``cuda``/``cuda:N``; under torchrun, ``cuda`` is this process's GPU (LOCAL_RANK)."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(
            "--device cuda was asked for but PyTorch sees no CUDA GPU here; use --device cpu "
            "(or install the CUDA build of torch==2.13.0 on a GPU machine)."
        )
    if name == "cuda" and "LOCAL_RANK" in os.environ:
        name = f"cuda:{os.environ['LOCAL_RANK']}"
    return torch.device(name)


def on_side_stream(fn: Callable[[], object]) -> None:
    """``fn()`` on a fresh CUDA stream that waits for the current one, which then waits for it: how work runs
    before a CUDA graph capture (the warm-up ``torch.cuda.graph`` needs)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)


def capture_graph(fn: Callable[[], object], generators: Iterable[torch.Generator] = (), **options):
    """``fn()`` recorded, not run, as a CUDA graph (``options``: ``torch.cuda.graph``'s), the random generators it
    draws from registered so that each replay draws anew; the graph and the output its replays write."""
    graph = torch.cuda.CUDAGraph()
    for g in generators:
        graph.register_generator_state(g)
    with torch.cuda.graph(graph, **options):
        out = fn()
    return graph, out
