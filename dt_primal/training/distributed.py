"""The processes of one run: several processes or GPUs train data-parallel under ``torchrun``, each on an
equal share of every batch; they join one process group, take rank 0's precision, and stop together at the
same step when any of them gets SIGINT or SIGTERM (after a checkpoint, for an exact ``--resume``). A run of
one process skips all of it."""

from __future__ import annotations

import contextlib
import datetime
import os
import signal
from pathlib import Path

import torch
import torch.distributed as dist

from dt_primal.config import PRECISIONS, Config
from dt_primal.errors import UserError
from dt_primal.machine import resolve_device
from dt_primal.precision import resolve_precision


def check_batch_split(batch_size: int, world: int) -> None:
    """Under torchrun every process trains on an equal share of every batch."""
    if batch_size % world:
        raise UserError(
            f"--batch-size {batch_size} must be divisible by the number of processes ({world}), "
            f"which each train on an equal share of every batch."
        )


@contextlib.contextmanager
def distributed(device: str):
    """Join the process group when started by torchrun with several processes (NCCL on CUDA, gloo
    on CPU). Yields ``(rank, world_size)``, ``(0, 1)`` when not distributed."""
    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        yield 0, 1
        return
    dev = resolve_device(device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    try:
        yield dist.get_rank(), dist.get_world_size()
        if dev.type == "cpu":
            # gloo: every process waits here, on its own thread, for the others (rank 0's final evaluation),
            # so that gloo's worker threads release the last all-reduce's tensors now and not while the
            # interpreter shuts down, which aborts the process (dist.barrier would hold them until its end)
            dist.monitored_barrier(timeout=datetime.timedelta(days=1))
    finally:
        dist.destroy_process_group()


def agreed_precision(cfg: Config, device: torch.device, rank: int) -> str:
    """``cfg.precision`` resolved for ``device`` (``dt_primal.precision``: auto measures on a CPU),
    printed once; under torchrun every process takes rank 0's."""
    precision, why = resolve_precision(cfg.precision, device, cfg.d_model)
    if dist.is_initialized():
        agreed = torch.tensor([PRECISIONS.index(precision)], device=device)
        dist.broadcast(agreed, 0)
        precision = PRECISIONS[int(agreed)]
    if rank == 0:
        print(f"precision: {precision} ({why})")
    return precision


class StopSignal:
    """SIGINT/SIGTERM set a flag; the loop checkpoints at the end of the step and stops.

    The handler writes only ``received``; ``signum`` is what all processes agreed on. A signal that lands while the
    all-reduce is in flight is then kept for the next step instead of being overwritten by the reduced value.
    """

    def __init__(self, device: torch.device):
        self.received, self.signum, self.device = 0, 0, device

    def __enter__(self):
        self.old = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def _handle(self, signum, frame):
        self.received = signum

    def __exit__(self, *exc):
        for s, h in self.old.items():
            signal.signal(s, h)

    def requested(self) -> bool:
        """Whether this process, or under torchrun any process, got a signal: all stop at the same step."""
        self.signum = self.received
        if dist.is_initialized():
            flag = torch.tensor([self.signum], device=self.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            self.signum = int(flag)
        return self.signum != 0


class Interrupted(Exception):
    def __init__(self, signum: int, step: int, path: Path):
        super().__init__(
            f"stopped by signal {signal.Signals(signum).name} at step {step}; checkpoint {path}; continue with --resume"
        )
        self.signum = signum
