"""Acting with trained Decision Transformers in PyTorch: the ``Policy`` of one checkpoint
(``dt_primal.load_policy``) or of several at once (evaluation). Needs torch and NumPy only.

  policy = dt_primal.load_policy("runs/hopper/last.pt")
  policy.reset(target_return=3600.0)
  action = policy.act(obs)                   # the first step: no reward yet
  action = policy.act(obs, reward=reward)    # each later step: the reward the last action earned
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable

import numpy as np
import torch

from dt_primal.evaluation.acting import Acting
from dt_primal.files.checkpoint import model_from_checkpoints, read_checkpoint
from dt_primal.machine import capture_graph, on_side_stream
from dt_primal.model.transformer import DecisionTransformer
from dt_primal.precision import acting_precision, autocast, tf32


class TorchArrays:
    """``NumpyArrays``' operations on torch tensors on ``device``: acting's state stays there."""

    def __init__(self, device: torch.device):
        self.device = device

    def asarray(self, x):
        return torch.as_tensor(np.asarray(x), dtype=torch.float32, device=self.device)

    def zeros(self, shape):
        return torch.zeros(shape, device=self.device)

    def cat(self, arrays, axis):
        return torch.cat(arrays, axis)

    def broadcast(self, x, shape):
        return x.expand(shape)

    def arange(self, start, stop):
        return torch.arange(start, stop, device=self.device)

    def numpy(self, x) -> np.ndarray:
        return x.cpu().numpy()


def width_bucket(width: int) -> int:
    """The smallest of 8, 12, 16, 24, 32, 48, ... (the powers of two and 1.5 times them) that is at least ``width``."""
    b = 8
    while b < width:
        b = b * 3 // 2 if b & (b - 1) == 0 else b * 4 // 3
    return b


def cuda_graph(fn: Callable[[], torch.Tensor]) -> tuple[Callable[[], None], torch.Tensor]:
    """``fn()`` captured as a CUDA graph after two runs on a side stream: its replay and the output it writes."""
    on_side_stream(lambda: [fn() for _ in range(2)])
    graph, out = capture_graph(fn, capture_error_mode="thread_local")  # other threads may use CUDA meanwhile
    return graph.replay, out


class CapturedForward:
    """The acting forward pass (``model(..., last_only=True)``), replayed as a CUDA graph once the context is
    full: an eager pass launches some 300 operations, about 10 ms of host time on an H100 machine whatever
    its width (docs/benchmarks.md, "Evaluation: where a step's time goes"), a replay one. The graph is
    captured at a width bucket (``width_bucket``: the rows past the live ones hold older inputs, and their
    outputs are dropped) and kept while the bucket lasts (widths only shrink within an evaluation). Its first
    replay is checked against the eager pass: if it differs, or the capture fails, this acts eagerly from
    then on, with a warning. ``capture`` False: always the eager pass (a CPU's). ``graph_of``: ``cuda_graph``, or
    a stand-in with its signature. The caller's autocast must not cache casts (``dt_primal.precision.autocast``):
    the graph would outlive the cache. ``phase(name)``, a context manager as the training step's, brackets each
    pass ("forward") and each capture within it ("capture") for profiling."""

    ATOL = 3e-2  # actions in [-1, 1]; bf16 passes of different widths differ by about 1e-2

    def __init__(self, model, context: int, capture: bool = True, graph_of=cuda_graph, phase=contextlib.nullcontext):
        self.model, self.context, self.graph_of, self.phase = model, context, graph_of, phase
        self.on, self.width, self.checked = capture, 0, False
        self.inputs, self.replay, self.output = [], None, None  # a bucket's input buffers, its graph, its output

    def eager(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.model(*inputs, last_only=True)[0]

    def __call__(self, states, actions, rtg, timesteps) -> torch.Tensor:
        """The newest step's actions (M, width, 1, act_dim) for inputs (M, width, K, ...)."""
        with self.phase("forward"):
            return self._act(states, actions, rtg, timesteps)

    def _act(self, states, actions, rtg, timesteps) -> torch.Tensor:
        inputs, width = (states, actions, rtg, timesteps), states.shape[1]
        if not self.on or states.shape[2] < self.context or self.model.training:
            return self.eager(*inputs)
        if width_bucket(width) != self.width and not self._capture(width_bucket(width), inputs):
            return self.eager(*inputs)
        for buffer, x in zip(self.inputs, inputs):
            buffer[:, :width].copy_(x)
        self.replay()
        out = self.output[:, :width].clone()
        if not self.checked:
            self.checked, expected = True, self.eager(*inputs)
            if not torch.allclose(out.float(), expected.float(), rtol=0.0, atol=self.ATOL):
                return self._give_up(
                    f"its actions differ from the eager pass's by up to {(out - expected).abs().max():.3g}", expected
                )
        return out

    def _capture(self, width: int, inputs) -> bool:
        self.replay = self.output = None  # the last bucket's graph and memory go first
        try:
            self.inputs = [x.new_zeros((x.shape[0], width, *x.shape[2:])) for x in inputs]
            with self.phase("capture"):
                self.replay, self.output = self.graph_of(lambda: self.eager(*self.inputs))
        except (RuntimeError, torch.cuda.OutOfMemoryError) as exc:
            self._give_up(f"capturing it failed ({type(exc).__name__}: {str(exc)[:200]})")
            return False
        self.width, self.checked = width, False
        return True

    def _give_up(self, why: str, result=None):
        warnings.warn(f"acting without a CUDA graph from now on: {why}", RuntimeWarning, stacklevel=3)
        self.on, self.width, self.replay, self.output, self.inputs = False, 0, None, None, []
        return result


class Policy(Acting):
    """Acts with the members of ``model`` (a ``DecisionTransformer`` of one member or several, which
    run as one forward pass), conditioned on a target return that drops by each reward /
    ``reward_scale`` (docs/method.md): each action is the model's prediction from the last ``context``
    steps of normalised observations ``(obs - state_mean) / state_std``, returns-to-go and earlier
    actions, at its timesteps (the bookkeeping: ``dt_primal.evaluation.acting.Acting``).

    ``state_mean``/``state_std``: (obs_dim,) or one row per member. ``model``: a ``DecisionTransformer``
    or anything with its ``members``, ``config.act_dim``, ``device`` (else its parameters'), ``training``,
    ``train(mode)``, ``max_ep_len`` and its call on (members, N, K, ...) inputs with ``last_only``.
    ``capture``: on CUDA, replay the forward pass as a CUDA graph (``CapturedForward``). ``phase``: the forward
    pass's profiling hook (``CapturedForward``)."""

    def __init__(
        self,
        model: DecisionTransformer,
        state_mean,
        state_std,
        reward_scale: float,
        context: int,
        precision: str = "fp32",
        capture: bool = True,
        phase=contextlib.nullcontext,
    ):
        self.model, self.precision = model, precision
        self.device = getattr(model, "device", None) or next(model.parameters()).device
        self.config = model.config  # the members' ModelConfig
        self.arrays = TorchArrays(self.device)
        self.forward = CapturedForward(model, context, capture and self.device.type == "cuda", phase=phase)
        super().__init__(model.members, self.config.act_dim, state_mean, state_std, reward_scale, context)

    @property
    def max_ep_len(self) -> int:
        return self.model.max_ep_len

    @contextlib.contextmanager
    def evaluating(self):
        """The model in evaluation mode (no dropout) inside, as it was after (training's periodic evaluation
        acts with the model it trains)."""
        was_training = self.model.training
        self.model.train(False)
        try:
            yield
        finally:
            self.model.train(was_training)

    def twin(self) -> Policy:
        """``Acting.twin``, with a forward pass of its own (its CUDA graphs are captured at its widths)."""
        twin = super().twin()
        forward = self.forward
        twin.forward = type(forward)(self.model, self.context, forward.on, forward.graph_of, forward.phase)
        return twin

    @torch.no_grad()
    def act(self, obs, reward=0.0, live=None) -> np.ndarray:
        return super().act(obs, reward, live)

    def _predict(self, states, actions, rtg, timesteps, live: np.ndarray | None) -> torch.Tensor:
        """The newest step's action (M, N, act_dim) of every member's live episodes (zeros for the others),
        in one forward pass of the model on as many episodes per member as the member with the most live
        ones has (``Acting.live_rows``)."""
        M, n = states.shape[:2]
        live = np.ones((M, n), bool) if live is None else live
        rows, width = self.live_rows(live)
        out = states.new_zeros(M, n, self.act_dim)
        if width == 0:
            return out
        index = (torch.arange(M, device=self.device)[:, None], torch.as_tensor(rows, device=self.device))
        with autocast(self.precision, self.device.type, cache_casts=False), tf32(self.precision):
            pred = self.forward(states[index], actions[index], rtg[index], timesteps.expand(M, width, -1))
        out[index] = pred[:, :, -1].float()
        return out * torch.as_tensor(live, device=self.device)[..., None]


def policy_from_checkpoints(
    ckpts: list[dict], device: torch.device | str = "cpu", precision: str | None = None
) -> Policy:
    """One Policy of the models of ``ckpts`` (``read_checkpoint``'s; one architecture, one reward
    scale), each with its own normalisation; ``precision`` (None or auto: the first run's, see
    ``acting_precision``)."""
    model = model_from_checkpoints(ckpts, device).train(False)
    run = ckpts[0]["config"]
    mean, std = (
        np.stack([c[k] for c in ckpts]) if len(ckpts) > 1 else ckpts[0][k] for k in ("state_mean", "state_std")
    )
    precision = acting_precision(precision, run["precision"], torch.device(device), model.config.d_model)[0]
    policy = Policy(model, mean, std, run["reward_scale"], model.config.context, precision)
    policy.run_config = run
    return policy


def load_checkpoint_policy(
    path: str | os.PathLike, device: torch.device | str = "cpu", precision: str | None = None
) -> Policy:
    """The policy of the checkpoint at ``path`` (a ``last.pt`` written by train.py), read without
    running any code from the file, on ``device``, at the run's precision (bf16 becomes fp32 on a CPU
    where bf16 is slow) unless ``precision`` (fp32, tf32 or bf16) is given."""
    return policy_from_checkpoints([read_checkpoint(path)], device, precision)
