"""The training step: one update of every member of an ensemble, as one function of device tensors.

A step draws each member's batch from its own generator (and its own dataset), computes each
member's loss (eq. 10: action MSE + η · mean J²) in one forward pass of the member-batched model
(``dt_primal.model.members``), backpropagates, clips each member's gradient by its own norm, sets the
warm-up learning rate from the step counter, and takes an AdamW step; each member has its own
moments (AdamW is element-wise, so stacked weights give every member its own optimizer).
It reads and writes device tensors only: no host synchronisation and no Python-side state change,
so on CUDA it is captured once into a CUDA graph and replayed. Everything periodic (logging,
evaluation, checkpoints, signals) stays outside, in ``dt_primal.training.loop``.

How it runs (none of it changes what it computes): ``--compile`` compiles the gather of the windows
with the loss (its backward follows); ``--optimizer compiled`` compiles the clipping, AdamW and the
loss bookkeeping as one function (``fused``: PyTorch's fused AdamW kernel, the rest multi-tensor
operations); ``--compile-mode max-autotune`` lets the compiler time its kernels' configurations;
``--attention-kernel math`` writes softmax attention out instead of calling SDPA, for the compiler to
fuse. Only the per-member draws of the window starts run outside a compiled region then.
"""

from __future__ import annotations

import contextlib
import functools
import warnings

import torch
import torch.distributed as dist

from dt_primal.config import Config
from dt_primal.data import WindowSampler
from dt_primal.machine import capture_graph, on_side_stream
from dt_primal.model.attention import use_attention_kernel
from dt_primal.model.build import loss_of
from dt_primal.precision import autocast, resolve_precision, tf32

WARMUP_CALLS = 3  # eager steps on a side stream before a CUDA graph capture, as torch.cuda.graph needs


def no_phase(name: str):
    return contextlib.nullcontext()


def step_mode(cfg: Config, device: torch.device) -> str:
    """How ``cfg``'s step runs on ``device``, as its throughput is recorded: ``eager``, ``compiled``,
    ``captured`` or ``compiled+captured``, then the options that differ from the defaults, e.g.
    ``compiled+captured, optimizer compiled, attention math, max-autotune``."""
    captured = device.type == "cuda" and cfg.cuda_graph
    mode = "+".join(m for m, on in (("compiled", cfg.compile), ("captured", captured)) if on) or "eager"
    extra = [f"optimizer {cfg.optimizer}"] if cfg.optimizer != "fused" else []
    extra += [f"attention {cfg.attention_kernel}"] if cfg.attention_kernel != "sdpa" else []
    extra += [cfg.compile_mode] if cfg.compile and cfg.compile_mode != "default" else []
    return ", ".join([mode, *extra])


def clip_per_member(grads: list[torch.Tensor], max_norm: float) -> None:
    """``clip_grad_norm_`` for every member at once: grads (M, ...) are scaled in place, member m's by
    min(1, max_norm / (‖g_m‖ + 1e-6)), ‖g_m‖ its global L2 norm over all its parameters. Multi-tensor
    operations, as ``clip_grad_norm_``'s: one norm for all the members' gradient slices, one scaling for
    all the gradients, whatever the number of members."""
    M = grads[0].shape[0]
    norms = torch.stack(torch._foreach_norm([m for g in grads for m in g.unbind(0)])).view(len(grads), M)
    coef = (max_norm / (torch.linalg.vector_norm(norms, dim=0) + 1e-6)).clamp(max=1.0)
    torch._foreach_mul_(grads, [coef.view((M,) + (1,) * (g.dim() - 1)) for g in grads])


class TrainStep:
    """``step()`` trains every member of ``model`` (a member-batched model, ``build_model``) one update;
    ``generators[i]`` draws member i's batches from the sampler's dataset ``datasets[i]`` (default: 0 for all).

    Under torchrun (``world`` > 1) every process draws the same batches, trains on its share and the
    gradients are averaged over the processes, weighted so that the update is the one-process update
    of the whole batch. ``capture``: on CUDA, replay the step as a CUDA graph (after WARMUP_CALLS
    eager steps); the config's ``compile``, ``optimizer``, ``compile_mode`` and ``attention_kernel``
    say what is compiled (module docstring). ``phase(name)``, a context manager such as
    ``torch.profiler.record_function``, labels the parts for profiling (a compiled part is one phase).
    """

    def __init__(
        self,
        cfg: Config,
        model: torch.nn.Module,
        sampler: WindowSampler,
        generators: list[torch.Generator],
        device: torch.device,
        rank: int = 0,
        world: int = 1,
        capture: bool = True,
        phase=None,
        datasets: list[int] | None = None,
    ):
        self.cfg, self.sampler, self.generators, self.rank, self.world = cfg, sampler, generators, rank, world
        self.model = use_attention_kernel(model.train(), cfg.attention_kernel)
        self.loss = loss_of(cfg.model)
        self.params = dict(model.named_parameters())
        self.datasets = datasets or [0] * len(generators)
        self.first = sampler.first_steps(self.datasets)  # (M,): where each member's dataset starts in the store
        self.phase = phase or no_phase
        self.capture = capture and device.type == "cuda" and world == 1
        self.step = torch.zeros((), dtype=torch.int64, device=device)  # updates done
        self.lr = torch.zeros((), device=device)  # set from ``step`` before every update
        compiled = cfg.optimizer == "compiled"  # foreach AdamW, which the compiler fuses with the clipping
        self.opt = torch.optim.AdamW(
            list(self.params.values()),
            lr=self.lr,
            weight_decay=cfg.weight_decay,
            fused=not compiled,
            foreach=compiled,
            capturable=self.capture or compiled,
        )
        self.sums = torch.zeros(len(generators), 3, device=device)  # per member: loss, action loss, mean J² since reset
        self.precision = resolve_precision(cfg.precision, device, cfg.d_model)[0]  # train() gives it resolved
        self.autocast = autocast(self.precision, device.type, cache_casts=False)
        mode = "max-autotune-no-cudagraphs" if cfg.compile_mode == "max-autotune" else None  # this class captures
        self.losses = torch.compile(self._losses, mode=mode) if cfg.compile else self._losses
        self.optimize = (
            torch.compile(functools.partial(self._optimize, no_phase), mode=mode)
            if compiled
            else functools.partial(self._optimize, self.phase)
        )
        self.graph, self.calls = None, 0

    def _losses(self, starts: torch.Tensor):
        """For the windows starting at ``starts`` (M, B) in each member's dataset: the sum over members of the
        loss (what is backpropagated), and per member (M,) the loss this process backpropagates, the action
        MSE and mean J²."""
        batch = self.sampler.windows(starts + self.first[:, None])
        if self.world > 1:  # this process's share of every member's batch
            n = batch["valid"].shape[1] // self.world
            share = {k: v[:, self.rank * n : (self.rank + 1) * n] for k, v in batch.items()}
            weight = self.world * share["valid"].flatten(1).sum(1) / batch["valid"].flatten(1).sum(1)
            batch = share
        loss, action, j2 = self.loss(self.model, batch, self.cfg.eta)
        if self.world > 1:  # the share's action MSE weighted by its part of the batch's valid steps
            loss, action = loss + (weight - 1) * action, weight * action
        return loss.sum(), loss, action, j2

    def _starts(self) -> torch.Tensor:
        """Where every member's windows start, drawn from its own generator in its own dataset: (M, B)."""
        return torch.stack(
            [self.sampler.starts(self.cfg.batch_size, g, d) for g, d in zip(self.generators, self.datasets)]
        )

    def _update(self) -> None:
        """The step itself: device work only (gradients start unset, as after ``zero_grad``)."""
        with self.phase("sample"):
            starts = self._starts()
        with self.phase("gather + forward + loss"), self.autocast:
            total, loss, action, j2 = self.losses(starts)
        with self.phase("backward"):
            total.backward()
        grads = [p.grad for p in self.params.values()]
        if self.world > 1:
            with self.phase("all-reduce"):
                flat = torch.cat([g.flatten() for g in grads])
                dist.all_reduce(flat)
                for g, f in zip(grads, flat.div_(self.world).split([g.numel() for g in grads])):
                    g.copy_(f.view_as(g))
        with self.phase("clip + AdamW + bookkeeping" if self.cfg.optimizer == "compiled" else "optimizer"):
            self.optimize(grads, loss.detach(), action.detach(), j2.detach())

    @torch.no_grad()
    def _optimize(self, phase, grads: list[torch.Tensor], loss, action, j2) -> None:
        """Clip each member's gradient, set the warm-up learning rate, take the AdamW step and add the
        losses (M,) to the running sums."""
        with phase("clip gradients"):
            clip_per_member(grads, self.cfg.grad_clip)
        with phase("AdamW"):
            warmup = (self.step + 1) / max(1, self.cfg.warmup_steps)  # linear warm-up, then constant (docs/method.md)
            self.lr.copy_(self.cfg.lr * warmup.clamp(max=1.0))
            self.opt.step()
            self.step += 1
        with phase("loss bookkeeping"):
            self.sums += torch.stack([loss.float(), action.float(), j2.float()], 1)

    def __call__(self) -> None:
        if self.graph is not None:
            self.graph.replay()
            return
        with tf32(self.precision):  # captured with the graph, so replays keep it
            self._eager_or_capture()

    def _eager_or_capture(self) -> None:
        self.calls += 1
        if not self.capture:
            self.opt.zero_grad(set_to_none=True)
            self._update()
        elif self.calls <= WARMUP_CALLS:
            on_side_stream(self._warm_up)
        else:  # capture (which records, not runs), then run this step by replaying
            self.opt.zero_grad(set_to_none=True)
            self.graph, _ = capture_graph(self._update, self.generators)
            self.graph.replay()

    def _warm_up(self) -> None:
        """One eager step before the capture (``on_side_stream``); AdamW's note on ``capturable`` is expected."""
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "This instance was constructed with capturable=True")
            self.opt.zero_grad(set_to_none=True)
            self._update()

    @classmethod
    def of_members(cls, cfg: Config, model, data, state_mean, state_std, seeds, device, **options) -> TrainStep:
        """The step of ``model``'s members on ``data`` (one dataset, or a list that ``options["datasets"]``
        indexes per member, with one ``state_mean``/``state_std`` each), each member drawing its batches from
        the generator of its seed; ``options``: the constructor's."""
        device = torch.device(device)
        gens = [torch.Generator(device=device).manual_seed(seed) for seed in seeds]
        sampler = WindowSampler(data, cfg.context, cfg.reward_scale, state_mean, state_std, device)
        return cls(cfg, model, sampler, gens, device, **options)

    # ------------------------------------------------------------------ state of one member

    def member_optimizer_state(self, i: int) -> dict:
        """Member i's AdamW state, by parameter name: {"step", "exp_avg": {...}, "exp_avg_sq": {...}}."""
        names = list(self.params)
        states = [self.opt.state.get(p, {}) for p in self.params.values()]
        return {
            "step": int(self.step),
            **{k: {n: s[k][i].detach().clone() for n, s in zip(names, states) if s} for k in ("exp_avg", "exp_avg_sq")},
        }

    def load_state(self, step: int, members: list[dict]) -> None:
        """Continue at update ``step`` from each member's ``member_optimizer_state``."""
        self.step.fill_(step)
        if step == 0:
            return
        for name, p in self.params.items():
            self.opt.state[p] = {
                "step": torch.tensor(float(step), device=p.device),
                **{
                    k: torch.empty_like(p).copy_(torch.stack([m[k][name] for m in members]))
                    for k in ("exp_avg", "exp_avg_sq")
                },
            }  # in the weight's memory layout
