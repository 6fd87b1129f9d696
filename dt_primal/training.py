"""Training loop: AdamW with linear warm-up, gradient clipping, optional bf16 autocast,
TensorBoard, atomic checkpoints with exact ``--resume``, periodic and final batched evaluation,
and data-parallel training over several processes or GPUs (``torchrun``, PyTorch DDP)."""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import signal
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

from dt_primal.config import Config
from dt_primal.data import Trajectories, WindowSampler
from dt_primal.errors import UserError
from dt_primal.evaluation import rollout
from dt_primal.model import DecisionTransformer, dt_loss
from envs import Task, get_task


CHECKPOINT_KEYS = {"model", "config", "state_mean", "state_std", "task", "obs_dim", "act_dim", "step", "dataset"}
TRAINING_STATE_KEYS = {"optimizer", "scheduler", "rng"}  # needed by --resume only


def resolve_device(name: str) -> torch.device:
    """``auto``/``cpu``/``cuda``/``cuda:N``; under torchrun, ``cuda`` is this process's GPU (LOCAL_RANK)."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError("--device cuda was asked for but PyTorch sees no CUDA GPU here; use --device cpu "
                        "(or install the CUDA build of torch==2.13.0 on a GPU machine).")
    if name == "cuda" and "LOCAL_RANK" in os.environ:
        name = f"cuda:{os.environ['LOCAL_RANK']}"
    return torch.device(name)


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
    finally:
        dist.destroy_process_group()


def save_checkpoint(path: Path, payload: dict) -> None:
    """Atomic: write and flush a temporary file, then rename it over ``path``, so that a crash or a
    full disk at any moment leaves the previous checkpoint intact."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        raise UserError(f"Could not write the checkpoint {path} ({exc}); the previous one there is intact. Free "
                        f"disk space or fix the folder's permissions, then continue with --resume.") from exc
    finally:
        tmp.unlink(missing_ok=True)


def load_checkpoint(path: str | os.PathLike, device: torch.device | str = "cpu", resume: bool = False) -> dict:
    """A checkpoint written by ``train``, checked for what evaluation (and, with ``resume``, a
    continued run) needs; every problem is a UserError that says what to do."""
    try:
        ckpt = torch.load(path, map_location=device, weights_only=False)
    except FileNotFoundError:
        raise UserError(f"Checkpoint {path} does not exist; train.py writes DIR/last.pt.") from None
    except Exception as exc:
        raise UserError(f"Checkpoint {path} cannot be read ({type(exc).__name__}: {exc}); it is truncated or "
                        f"corrupted. Use an earlier copy or retrain.") from exc
    needed = CHECKPOINT_KEYS | (TRAINING_STATE_KEYS if resume else set())
    missing = sorted(needed - set(ckpt if isinstance(ckpt, dict) else ()))
    if missing:
        raise UserError(f"{path} is not a dt-primal checkpoint that can be {'resumed' if resume else 'evaluated'} "
                        f"(it lacks {', '.join(missing)}); give a DIR/last.pt written by train.py.")
    try:
        Config(**ckpt["config"]).validate()
        task = get_task(ckpt["task"])
    except (TypeError, ValueError, UserError) as exc:
        raise UserError(f"{path} was written by an incompatible version of dt-primal or is damaged ({exc}). Use "
                        f"the version that wrote it, or retrain.") from exc
    obs_dim, act_dim = env_sizes(task)
    if (ckpt["obs_dim"], ckpt["act_dim"]) != (obs_dim, act_dim):
        raise UserError(f"{path} holds a model for observations of size {ckpt['obs_dim']} and actions of size "
                        f"{ckpt['act_dim']}, but its task {task.gym_id} has {obs_dim} and {act_dim}: the file is "
                        f"damaged. Use an earlier copy or retrain.")
    return ckpt


def model_from_checkpoint(ckpt: dict, device: torch.device | str = "cpu") -> tuple[DecisionTransformer, Config]:
    cfg = Config(**ckpt["config"])
    model = DecisionTransformer(cfg, ckpt["obs_dim"], ckpt["act_dim"]).to(device)
    try:
        model.load_state_dict(ckpt["model"])
    except RuntimeError as exc:
        raise UserError(f"The checkpoint's weights do not fit a '{cfg.model}' model with d_model {cfg.d_model}, "
                        f"{cfg.n_layer} layers and {cfg.n_head} heads (its config disagrees with its weights: "
                        f"{str(exc).splitlines()[0]}). The file is incompatible or damaged.") from exc
    return model, cfg


def env_sizes(task: Task) -> tuple[int, int]:
    """Observation and action sizes of the task's environment."""
    env = task.make()
    sizes = env.observation_space.shape[0], env.action_space.shape[0]
    env.close()
    return sizes


def check_env_matches(data: Trajectories, task: Task) -> None:
    obs_dim, act_dim = env_sizes(task)
    if (data.obs_dim, data.act_dim) != (obs_dim, act_dim):
        raise UserError(f"The dataset {data.source} has observations of size {data.obs_dim} and actions of size "
                        f"{data.act_dim}, but {task.gym_id} has {obs_dim} and {act_dim}: it was not recorded in that "
                        f"environment. Pass the right --env.")


def check_same_dataset(ckpt: dict, data: Trajectories, path: Path) -> None:
    """A run continues on the data it was trained on (same sizes and observation mean)."""
    same = (ckpt["obs_dim"], ckpt["act_dim"]) == (data.obs_dim, data.act_dim) and \
        np.allclose(data.observations.mean(0), ckpt["state_mean"], rtol=1e-5, atol=1e-6)
    if not same:
        raise UserError(f"{path} was trained on {ckpt['dataset']}, but this run loaded {data.source}, which holds "
                        f"other data. Resume with --dataset {ckpt['dataset']}, or choose another --out to start a "
                        f"new run.")


def _rng_state(gen: torch.Generator) -> dict:
    return {"torch": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "numpy": np.random.get_state(), "python": random.getstate(), "sampler": gen.get_state()}


def _set_rng_state(state: dict, gen: torch.Generator) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"]:
        torch.cuda.set_rng_state_all(state["cuda"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    gen.set_state(state["sampler"])


class _StopSignal:
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
        super().__init__(f"stopped by signal {signal.Signals(signum).name} at step {step}; checkpoint {path}; "
                         f"continue with --resume")
        self.signum = signum


def make_optimizer(model: torch.nn.Module, cfg: Config, fused: bool = False):
    """AdamW and its schedule: linear warm-up over ``warmup_steps``, then constant (SPEC §4)."""
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, fused=fused)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(1, cfg.warmup_steps)))
    return opt, sched


def _rank_loss(model, batch: dict, eta: float, rank: int, world: int):
    """``dt_loss`` of this process's share of the batch. DDP averages gradients over the processes;
    weighting the action MSE by the share's part of the batch's valid steps makes that average the
    gradient of the whole batch's loss (the MSE over all its valid steps)."""
    if world == 1:
        return dt_loss(model, batch, eta)
    n = len(batch["valid"]) // world
    share = {k: v[rank * n:(rank + 1) * n] for k, v in batch.items()}
    weight = world * share["valid"].sum() / batch["valid"].sum()
    loss, action_loss, Js = dt_loss(model, share, eta)
    return loss + (weight - 1) * action_loss, weight * action_loss, Js


def compiled(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """``torch.compile`` for training: on CUDA in ``reduce-overhead`` mode (CUDA graphs, which remove
    the per-kernel launch cost that bounds a model this small); on CPU in the default mode, which
    does not pay there (docs/benchmarks.md, "Profile")."""
    return torch.compile(model, mode="reduce-overhead" if device.type == "cuda" else None)


def optimisation_step(model, forward, batch: dict, opt, sched, cfg: Config, autocast, sums: torch.Tensor,
                      rank: int = 0, world: int = 1, phase=None) -> None:
    """One update: ``dt_loss`` (eq. 10: action MSE + η · mean J²) of this process's
    share of ``batch`` under ``autocast``, backward, gradient clipping, AdamW and schedule steps; adds
    (loss, action loss, mean J²) to ``sums`` on the device, without a host synchronisation.
    ``forward`` is ``model`` or its DDP/compiled wrapper; ``phase(name)``, a context manager such
    as ``torch.profiler.record_function``, labels the parts for profiling."""
    phase = phase or (lambda name: contextlib.nullcontext())
    with phase("forward + loss"), autocast:
        loss, action_loss, Js = _rank_loss(forward, batch, cfg.eta, rank, world)
    with phase("backward"):
        opt.zero_grad(set_to_none=True)
        loss.backward()
    with phase("clip_grad_norm_"):
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    with phase("AdamW + scheduler"):
        opt.step()
        sched.step()
    with phase("loss bookkeeping"), torch.no_grad():
        j2 = torch.stack([(J.detach() ** 2).mean() for J in Js]).mean() if Js else torch.zeros((), device=sums.device)
        sums += torch.stack([loss.detach().float(), action_loss.detach().float(), j2.float()])


def _all_finite(model: torch.nn.Module) -> bool:
    return bool(torch.stack([torch.isfinite(p).all() for p in model.parameters()]).all())


def train(cfg: Config, data: Trajectories, resume: bool = False) -> dict | None:
    """Train one seed; returns the final evaluation report (also written to ``out/eval.json``).
    Under torchrun every process draws the same batch and trains on its share of it; rank 0 alone
    writes files and evaluates, and the other ranks return None."""
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    out = Path(cfg.out)
    last = out / "last.pt"
    device = resolve_device(cfg.device)
    task = get_task(data.env)
    check_env_matches(data, task)
    if last.exists() and not resume:
        raise UserError(f"{out} already holds a run ({last}); pass --resume to continue it, or choose another "
                        f"--out (or delete that folder) to start again.")
    if cfg.batch_size % world:
        raise UserError(f"--batch-size {cfg.batch_size} must be divisible by the number of processes ({world}), "
                        f"which each train on an equal share of every batch.")
    out.mkdir(parents=True, exist_ok=True)
    targets = cfg.targets or list(task.targets)
    ckpt = load_checkpoint(last, device, resume=True) if resume and last.exists() else None
    if resume and ckpt is None:
        print(f"--resume: no checkpoint in {out}, starting from scratch")
    if ckpt is not None:  # the checkpoint's model and data settings win; steps and evaluation may change
        check_same_dataset(ckpt, data, last)
        saved = Config(**ckpt["config"])
        keep = ("steps", "eval_every", "eval_episodes", "eval_episodes_during", "checkpoint_every", "log_every",
                "device", "out", "targets", "compile")
        cfg = dataclasses.replace(saved, **{k: getattr(cfg, k) for k in keep})
        state_mean, state_std = ckpt["state_mean"], ckpt["state_std"]
    else:
        state_mean, state_std = data.state_stats()

    # every rank seeds alike: they draw the same batches (and dropout masks), so a checkpoint holds the
    # state of all of them and --resume is exact, also with another number of processes
    random.seed(cfg.seed); np.random.seed(cfg.seed); torch.manual_seed(cfg.seed)
    gen = torch.Generator(device=device).manual_seed(cfg.seed)
    sampler = WindowSampler(data, cfg.context, cfg.reward_scale, state_mean, state_std, device)
    if ckpt is not None:
        model = model_from_checkpoint(ckpt, device)[0]
    else:
        model = DecisionTransformer(cfg, data.obs_dim, data.act_dim).to(device)
    opt, sched = make_optimizer(model, cfg, fused=device.type == "cuda")
    step, saved_step = 0, None
    if ckpt is not None:
        try:
            opt.load_state_dict(ckpt["optimizer"]); sched.load_state_dict(ckpt["scheduler"])
            _set_rng_state(ckpt["rng"], gen)
        except (ValueError, KeyError, TypeError, RuntimeError) as exc:
            raise UserError(f"The training state in {last} is damaged ({type(exc).__name__}: {exc}); evaluate "
                            f"it with evaluate.py, or start a new run with another --out.") from exc
        step = saved_step = ckpt["step"]
        print(f"resumed from {last} at step {step}")
    ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None) \
        if world > 1 else model
    forward = compiled(ddp, device) if cfg.compile else ddp

    def checkpoint():
        nonlocal saved_step
        save_checkpoint(last, {
            "model": model.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
            "step": step, "rng": _rng_state(gen), "config": dataclasses.asdict(cfg), "task": task.name,
            "state_mean": state_mean, "state_std": state_std, "obs_dim": data.obs_dim, "act_dim": data.act_dim,
            "dataset": data.source})
        saved_step = step

    def evaluate(episodes: int) -> list[dict]:
        return rollout(model, task, targets, episodes, state_mean, state_std, cfg.reward_scale, cfg.context,
                       device, seed=cfg.seed + 100_000, precision=cfg.precision)

    def log(loss_v: float, action_v: float, j2_v: float, seconds: float):
        writer.add_scalar("loss/total", loss_v, step)
        writer.add_scalar("loss/action_mse", action_v, step)
        writer.add_scalar("perf/steps_per_s", n_log / seconds, step)
        writer.add_scalar("lr", sched.get_last_lr()[0], step)
        primal = [b.attn for b in model.blocks if hasattr(b.attn, "Lambda")]
        if primal:
            writer.add_scalar("ksvd/J_squared", j2_v, step)
            for i, attn in enumerate(primal):
                lam = attn.Lambda.detach()
                writer.add_scalar(f"ksvd/lambda_mean/{i}", lam.mean().item(), step)
                writer.add_scalar(f"ksvd/lambda_abs_max/{i}", lam.abs().max().item(), step)
        bar.set_postfix(loss=f"{action_v:.4f}", ups=f"{n_log / seconds:.1f}")

    def evaluate_and_record():
        reports = evaluate(cfg.eval_episodes_during)
        for r in reports:
            writer.add_scalar(f"eval/normalized_{r['target']:g}", r["normalized_mean"], step)
            writer.add_scalar(f"eval/return_{r['target']:g}", r["return_mean"], step)
        with curve_path.open("a") as f:
            f.write(json.dumps({"step": step, "reports": [{k: v for k, v in r.items() if k not in ("returns", "lengths")}
                                                           for r in reports]}) + "\n")
        bar.write(f"step {step}: " + ", ".join(f"target {r['target']:g} -> {r['normalized_mean']:.1f}" for r in reports))

    curve_path = out / "evals.jsonl"
    writer = None
    if rank == 0:
        curve = [json.loads(l) for l in curve_path.read_text().splitlines()] if curve_path.exists() else []
        curve = [c for c in curve if c["step"] <= step]  # drop evaluations newer than the checkpoint
        curve_path.write_text("".join(json.dumps(c) + "\n" for c in curve))
        writer = SummaryWriter(str(out))
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.precision == "bf16")
    sums = torch.zeros(3, device=device)  # loss, action loss, mean J² over the logging window
    model.train()
    t_log, n_log = time.perf_counter(), 0
    bar = tqdm(total=cfg.steps, initial=step, desc=f"{cfg.model} seed {cfg.seed}", unit="step", mininterval=5,
               disable=rank != 0)
    with _StopSignal(device) as stop:
        while step < cfg.steps:
            optimisation_step(model, forward, sampler.sample(cfg.batch_size, gen), opt, sched, cfg, autocast, sums, rank, world)
            step += 1; n_log += 1
            bar.update(1)
            stopping = stop.requested()
            eval_now = step % cfg.eval_every == 0 and step < cfg.steps
            save_now = step % cfg.checkpoint_every == 0 or step == cfg.steps or stopping
            if step % cfg.log_every == 0 or eval_now or save_now:  # so no checkpoint or evaluation of bad weights
                if world > 1:
                    dist.all_reduce(sums)
                    sums /= world
                loss_v, action_v, j2_v = (sums / n_log).tolist()
                if not (np.isfinite(loss_v) and _all_finite(model)):
                    kept = "no checkpoint was written" if saved_step is None else \
                        f"{last} keeps the weights of step {saved_step}"
                    raise UserError(f"The loss became {loss_v} (or the weights non-finite) by step {step}; training "
                                    f"stopped and {kept}. Start again with a lower --lr or --grad-clip, or "
                                    f"--precision fp32, or check the dataset for extreme values.")
                if rank == 0:
                    log(loss_v, action_v, j2_v, time.perf_counter() - t_log)
                sums.zero_(); t_log, n_log = time.perf_counter(), 0
            if eval_now and rank == 0:
                evaluate_and_record()
            if save_now and rank == 0:
                checkpoint()
            if stopping:
                bar.close()
                if writer:
                    writer.close()
                if world > 1:
                    dist.barrier()  # until rank 0 has written the checkpoint
                raise Interrupted(stop.signum, step, last)
    bar.close()
    if rank != 0:
        return None
    if not last.exists():  # zero steps asked for: still leave a checkpoint to evaluate
        checkpoint()
    t0 = time.perf_counter()
    reports = evaluate(cfg.eval_episodes)
    for r in reports:
        writer.add_scalar(f"eval/normalized_{r['target']:g}", r["normalized_mean"], step)
    writer.close()
    result = {"checkpoint": str(last), "step": step, "task": task.gym_id, "dataset": data.source,
              "model": cfg.model, "seed": cfg.seed, "eval_seconds": time.perf_counter() - t0, "targets": reports}
    (out / "eval.json").write_text(json.dumps(result, indent=1))
    return result
