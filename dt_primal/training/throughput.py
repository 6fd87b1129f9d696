"""Training throughput: the library's training step for new members, timed. What the benchmarks and a
sweep's time budget (``commands.sweep.budget``) measure."""

from __future__ import annotations

import functools
import hashlib
import time
from pathlib import Path

import torch

from dt_primal.config import Config
from dt_primal.data import Trajectories
from dt_primal.training.ensemble import fresh_model
from dt_primal.training.step import TrainStep

ENGINE = ("training/step.py", "model", "data.py", "precision.py", "machine.py")  # under dt_primal/: what makes the step


@functools.cache
def engine_hash() -> str:
    """A hash of the modules that make the training step (``ENGINE``) and of torch's version: a throughput
    measured under the same hash (on the same GPU) still holds, so it need not be measured again. Read once
    per process (every timed setting records it)."""
    root = Path(__file__).resolve().parents[1]
    paths = [root / name for name in ENGINE]
    files = sorted(f for p in paths for f in ([p] if p.suffix == ".py" else p.glob("*.py")))
    h = hashlib.sha256(torch.__version__.encode())
    for f in files:
        h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def fresh_step(cfg: Config, data: Trajectories, seeds, device="cpu", capture: bool = True, phase=None) -> TrainStep:
    """The training step of ``train.py --seeds ...`` for new members ``seeds`` on ``data``: each initialised
    and drawing batches from its seed. ``capture``: on CUDA, replay it as a CUDA graph; ``phase(name)``
    labels its parts (``TrainStep``)."""
    model = fresh_model(cfg.model_config(data.obs_dim, data.act_dim), list(seeds), torch.device(device))
    mean, std = data.state_stats()
    return TrainStep.of_members(cfg, model, data, mean, std, seeds, device, capture=capture, phase=phase)


def time_updates(step: TrainStep, warmup: int, updates: int) -> dict:
    """``warmup`` untimed updates (the capture and the compilation happen there), then ``updates`` timed
    ones, the device synchronised before and after: wall and CPU ms per update, updates/s,
    member-updates/s and the warm-up's seconds."""
    cuda = step.step.device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    members = len(step.generators)
    t0 = time.perf_counter()
    for _ in range(warmup):
        step()
    sync()
    first = time.perf_counter() - t0
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(updates):
        step()
    sync()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {
        "engine": engine_hash(),
        "members": members,
        "updates": updates,
        "ms_per_update": 1e3 * wall / updates,
        "updates_per_s": updates / wall,
        "member_updates_per_s": members * updates / wall,
        "cpu_ms_per_update": 1e3 * cpu / updates,
        "warmup_s": first,
    }
