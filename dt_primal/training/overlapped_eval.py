"""Intermediate evaluations beside training: the weights of an evaluation step are copied into a second
model, which a thread evaluates (on CUDA, on its own stream) while the training loop goes on, so that
training does not wait for the environments. Its reports are the ones the same evaluation would give in
line (on CUDA to rounding: in line the forward pass is a replayed CUDA graph, here it runs eagerly): the copy
holds that step's weights, acting draws no random numbers, and the loop records them
(``collect``) in step order, before the next evaluation starts, before a stop and before the final one.
While one runs on CUDA, training queues at most ``RUN_AHEAD`` updates on the device (``pace``).
"""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Callable

import torch

from dt_primal.model.attention import use_attention_kernel
from dt_primal.model.build import build_model

RUN_AHEAD = 2  # training's updates queued on the device while an evaluation runs beside it (None: no limit)


class OverlappedEvaluation:
    """Evaluations of ``model``'s weights at a step, run beside training one at a time. ``act_with(copy,
    capture=False)`` gives the policy that acts, without a CUDA graph, with ``copy``, a model of ``model``'s
    architecture with ``attention_kernel`` (the training step's, ``use_attention_kernel``) built here (no random
    numbers drawn) that ``start(model, step, evaluate)`` refills before it runs ``evaluate(policy)`` (its reports
    and seconds) in a thread; ``collect()`` waits for it and gives ``(step, reports, seconds)`` (None when none
    ran) or raises what it raised."""

    def __init__(self, model: torch.nn.Module, act_with: Callable, device: torch.device, attention_kernel: str):
        with torch.device("meta"):
            copy = build_model(model.config, model.members)
        self.copy = use_attention_kernel(copy.to_empty(device=device).train(False), attention_kernel)
        # eager acting: a CUDA graph captured in this thread would mark the process's default CUDA generator as
        # capturing while training's graph replays (and advances it for dropout), which PyTorch refuses
        self.policy = act_with(self.copy, capture=False)
        # on CUDA its own stream, ahead of training's kernels: an evaluation step waits on its few small ones
        self.stream = torch.cuda.Stream(device, priority=-1) if device.type == "cuda" else None
        self.thread, self.step, self.outcome = None, None, None
        self.run_ahead, self.queued = RUN_AHEAD, collections.deque()

    @torch.no_grad()
    def start(self, model: torch.nn.Module, step: int, evaluate: Callable) -> None:
        """Evaluate ``model``'s weights as they are after ``step`` updates, in a thread (after ``collect``)."""
        assert self.thread is None, "collect() the last evaluation first"
        torch._foreach_copy_(list(self.copy.state_dict().values()), list(model.state_dict().values()))
        if self.stream is not None:  # the copy is made on training's stream before the evaluation reads it
            self.stream.wait_stream(torch.cuda.current_stream())
        self.step, self.outcome = step, None
        self.thread = threading.Thread(target=self._run, args=(evaluate,), name=f"evaluation {step}", daemon=True)
        self.thread.start()

    def pace(self) -> None:
        """After each training update: while an evaluation runs (on CUDA), wait until no more than ``run_ahead``
        updates are queued on the device, so that the evaluation's small kernels and transfers wait behind few
        of training's (without it the host queues up to a log interval's updates). Costs training nothing while
        the host queues an update faster than the device runs one."""
        if self.stream is None or self.run_ahead is None or self.thread is None or not self.thread.is_alive():
            return
        self.queued.append(torch.cuda.Event())
        self.queued[-1].record()
        while len(self.queued) > self.run_ahead:
            self.queued.popleft().synchronize()

    def _run(self, evaluate: Callable) -> None:
        try:
            with torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext():
                self.outcome = evaluate(self.policy)
        except BaseException as exc:  # raised again by collect(), in the training loop's thread
            self.outcome = exc

    def running(self) -> int | None:
        """The step of the evaluation started and not yet collected (its weights: ``copy``); None when none."""
        return self.step if self.thread is not None else None

    def collect(self) -> tuple[int, list, float] | None:
        """The running evaluation's step, reports and seconds, once it has ended; None when none runs."""
        if self.thread is None:
            return None
        self.thread.join()
        self.thread = None
        self.queued.clear()
        if self.stream is not None:
            torch.cuda.current_stream().wait_stream(self.stream)
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.step, *self.outcome
