"""The run loop: trains the seeds of one (dataset, model) as one ensemble (``dt_primal.training.step``)
and, around the step, at their periods: logging to TensorBoard and the progress bar, divergence
checks, batched evaluation of every member at once, atomic checkpoints (``dt_primal.checkpoint``),
and SIGINT/SIGTERM handling with exact ``--resume``. Several processes or GPUs train data-parallel
under ``torchrun``."""
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
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

from dt_primal.checkpoint import (check_same_dataset, load_members, model_from_checkpoint, rng_state, save_checkpoints,
                                  set_rng_state)
from dt_primal.config import PRECISIONS, Config
from dt_primal.data import Trajectories, WindowSampler
from dt_primal.errors import UserError
from dt_primal.evaluation.checks import env_sizes
from dt_primal.evaluation.policy import Policy
from dt_primal.evaluation.reports import headline
from dt_primal.evaluation.rollout import rollout
from dt_primal.model.transformer import DecisionTransformer
from dt_primal.precision import resolve_precision
from dt_primal.provenance import provenance
from dt_primal.training.step import TrainStep
from envs import Task

# what --resume may change; every other option is the run's own (architecture, optimisation, returns)
CHANGEABLE_ON_RESUME = ("steps", "eval_every", "eval_episodes", "eval_episodes_during", "checkpoint_every",
                        "log_every", "device", "out", "targets", "compile", "cuda_graph", "precision", "dataset",
                        "env", "download", "ref_min", "ref_max")


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


def check_env_matches(data: Trajectories, task: Task) -> None:
    obs_dim, act_dim = env_sizes(task)
    if (data.obs_dim, data.act_dim) != (obs_dim, act_dim):
        raise UserError(f"The dataset {data.source} has observations of size {data.obs_dim} and actions of size "
                        f"{data.act_dim}, but {task.gym_id} has {obs_dim} and {act_dim}: it was not recorded in that "
                        f"environment. Pass the right --env.")


def check_unchanged(saved: Config, cfg: Config, path: Path) -> None:
    """--resume continues a run with its own settings: an option it cannot change is refused."""
    changed = [f"--{f.name.replace('_', '-')} {getattr(cfg, f.name)} (the run has {getattr(saved, f.name)})"
               for f in dataclasses.fields(Config)
               if f.name not in CHANGEABLE_ON_RESUME and getattr(cfg, f.name) != getattr(saved, f.name)]
    if changed:
        raise UserError(f"--resume cannot change {', '.join(changed)}: {path} continues with the settings it was "
                        f"started with. Leave these options out to continue it, or choose another --out to start a new "
                        f"run with them (only {', '.join('--' + n.replace('_', '-') for n in CHANGEABLE_ON_RESUME[:7])} "
                        f"and the data source may change).")


def check_steps_left(step: int, steps: int, where: Path) -> None:
    """--resume of a run already past --steps has nothing to train: refused; one exactly at --steps
    only runs the final evaluation (a run stopped during it), which is said."""
    if step > steps:
        raise UserError(f"{where} is already at step {step}, past --steps {steps}: there is nothing to train. Give "
                        f"--steps above {step} to train it further, or evaluate it with evaluate.py.")
    if step == steps:
        print(f"--resume: {where} is already at step {step} = --steps; nothing to train, only the final evaluation "
              f"runs (give a larger --steps to train further)")


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


def member_dirs(out: Path, seeds: list[int] | None) -> list[Path]:
    """Where each member writes: OUT/seed_N for ``--seeds``, OUT itself for a single ``--seed``."""
    return [out / f"seed_{s}" for s in seeds] if seeds else [out]


def train(cfg: Config, data: Trajectories, resume: bool = False, seeds: list[int] | None = None) -> list[dict] | None:
    """Train ``seeds`` (default: ``cfg.seed`` alone, into ``cfg.out``) as one ensemble, each member
    into OUT/seed_N, exactly as each seed would train alone; returns each member's final evaluation
    report (also written to its ``eval.json``). Under torchrun every process draws the same batches
    and trains on its share; rank 0 alone writes files and evaluates, and the other ranks return None."""
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    task = data.task
    cfg = cfg.resolved(task)  # checkpoints store the rank and episode length they were trained with
    seed_list = seeds or [cfg.seed]
    if len(set(seed_list)) < len(seed_list):
        raise UserError(f"--seeds lists a seed twice ({' '.join(map(str, seed_list))}); give each seed once.")
    dirs = member_dirs(Path(cfg.out), seeds)
    lasts = [d / "last.pt" for d in dirs]
    device = resolve_device(cfg.device)
    check_env_matches(data, task)
    if not resume and any(p.exists() for p in lasts):
        held = next(p for p in lasts if p.exists())
        raise UserError(f"{held.parent} already holds a run ({held}); pass --resume to continue it, or choose another "
                        f"--out (or delete that folder) to start again.")
    if cfg.batch_size % world:
        raise UserError(f"--batch-size {cfg.batch_size} must be divisible by the number of processes ({world}), "
                        f"which each train on an equal share of every batch.")
    found = [p.exists() for p in lasts]
    if resume and any(found) and not all(found):
        raise UserError(f"Only some seeds of {cfg.out} have a checkpoint ({', '.join(str(p) for p, f in zip(lasts, found) if f)}); "
                        f"resume those with --seeds listing them, and train the others in another run.")
    members = sorted(Path(cfg.out).glob("seed_*/last.pt"))
    if resume and not seeds and not any(found) and members:
        listed = " ".join(sorted((p.parent.name.removeprefix("seed_") for p in members), key=int))
        raise UserError(f"{cfg.out} holds the seeds {listed} of an ensemble; resume them with --seeds {listed}.")
    ckpts = load_members(lasts) if resume and all(found) else None
    if resume and ckpts is None:
        print(f"--resume: no checkpoint in {cfg.out}, starting from scratch")
    if ckpts is not None:
        check_steps_left(ckpts[0]["step"], cfg.steps, lasts[0] if len(lasts) == 1 else Path(cfg.out))
    targets = cfg.targets or list(task.targets)
    if ckpts is not None:
        for path, ckpt, seed in zip(lasts, ckpts, seed_list):
            check_same_dataset(ckpt, data, path)
            check_unchanged(Config(**ckpt["config"]), dataclasses.replace(cfg, seed=seed), path)
        state_mean, state_std = ckpts[0]["state_mean"], ckpts[0]["state_std"]
    else:
        state_mean, state_std = data.state_stats()

    cfg = dataclasses.replace(cfg, precision=agreed_precision(cfg, device, rank))  # recorded resolved

    # each member as its seed alone: initialised and drawing batches from its seed; dropout draws from
    # the process's generator. Under torchrun every rank seeds alike and draws the same batches and
    # masks, so a checkpoint holds the state of all of them and --resume is exact with any number of processes.
    models, gens = [], []
    for i, seed in enumerate(seed_list):
        random.seed(seed); np.random.seed(seed); torch.manual_seed(seed)
        gens.append(torch.Generator(device=device).manual_seed(seed))
        models.append(model_from_checkpoint(ckpts[i], device) if ckpts else
                      DecisionTransformer(cfg.model_config(data.obs_dim, data.act_dim)).to(device))
    sampler = WindowSampler(data, cfg.context, cfg.reward_scale, state_mean, state_std, device)
    train_step = TrainStep(cfg, models, sampler, gens, device, rank, world, capture=cfg.cuda_graph)
    ensemble = train_step.ensemble
    step, saved_step = 0, None
    if ckpts is not None:
        try:
            train_step.load_state(ckpts[0]["step"], [c["optimizer"] for c in ckpts])
            for ckpt, gen in zip(ckpts, gens):
                set_rng_state(ckpt["rng"], gen)
        except (ValueError, KeyError, TypeError, RuntimeError) as exc:
            raise UserError(f"The training state in {lasts[0]} is damaged ({type(exc).__name__}: {exc}); evaluate "
                            f"it with evaluate.py, or start a new run with another --out.") from exc
        step = saved_step = ckpts[0]["step"]
        print(f"resumed from {lasts[0] if len(lasts) == 1 else cfg.out} at step {step}")
    eval_seeds = [s + 100_000 for s in seed_list]

    def checkpoint():
        nonlocal saved_step
        save_checkpoints(lasts, [{
            "model": ensemble.state_dict(i), "optimizer": train_step.member_optimizer_state(i), "step": step,
            "rng": rng_state(gens[i]), "config": dataclasses.asdict(dataclasses.replace(cfg, seed=seed, out=str(d))),
            "task": dataclasses.asdict(task), "state_mean": state_mean, "state_std": state_std, "dataset": data.source,
            "model_config": dataclasses.asdict(ensemble.template.config)} for i, (seed, d) in enumerate(zip(seed_list, dirs))])
        saved_step = step

    policy = Policy(ensemble, state_mean, state_std, cfg.reward_scale, cfg.context, cfg.precision)

    def evaluate(episodes: int) -> list[list[dict]]:
        return rollout(policy, task, targets, episodes, seeds=eval_seeds)

    writers, curve_paths = [], [d / "evals.jsonl" for d in dirs]
    if rank == 0:
        for d, curve_path in zip(dirs, curve_paths):
            d.mkdir(parents=True, exist_ok=True)
            curve = [json.loads(l) for l in curve_path.read_text().splitlines()] if curve_path.exists() else []
            curve = [c for c in curve if c["step"] <= step]  # drop evaluations newer than the checkpoint
            curve_path.write_text("".join(json.dumps(c) + "\n" for c in curve))
            writers.append(SummaryWriter(str(d)))

    def log(sums: np.ndarray, seconds: float):
        lam = {i: b.attn.Lambda for i, b in enumerate(ensemble.template.blocks) if hasattr(b.attn, "Lambda")}
        lr = float(train_step.lr)
        for m, writer in enumerate(writers):
            loss_v, action_v, j2_v = sums[m]
            writer.add_scalar("loss/total", loss_v, step)
            writer.add_scalar("loss/action_mse", action_v, step)
            writer.add_scalar("perf/steps_per_s", n_log / seconds, step)
            writer.add_scalar("lr", lr, step)
            if lam:
                writer.add_scalar("ksvd/J_squared", j2_v, step)
                for k, i in enumerate(lam):
                    values = ensemble.params[f"blocks.{i}.attn.Lambda"][m].detach()
                    writer.add_scalar(f"ksvd/lambda_mean/{k}", values.mean().item(), step)
                    writer.add_scalar(f"ksvd/lambda_abs_max/{k}", values.abs().max().item(), step)
        bar.set_postfix(loss=" ".join(f"{a:.4f}" for a in sums[:, 1]), ups=f"{n_log / seconds:.1f}")

    def evaluate_and_record():
        per_member = evaluate(cfg.eval_episodes_during)
        for writer, curve_path, reports in zip(writers, curve_paths, per_member):
            for r in reports:
                if r["normalized_mean"] is not None:
                    writer.add_scalar(f"eval/normalized_{r['target']:g}", r["normalized_mean"], step)
                writer.add_scalar(f"eval/return_{r['target']:g}", r["return_mean"], step)
            with curve_path.open("a") as f:
                f.write(json.dumps({"step": step, "reports": [{k: v for k, v in r.items() if k not in ("returns", "lengths")}
                                                               for r in reports]}) + "\n")
        bar.write(f"step {step}: " + "; ".join(
            f"seed {s}: " + ", ".join(f"target {r['target']:g} -> {headline(r)}" for r in reports)
            for s, reports in zip(seed_list, per_member)))

    def close():
        bar.close()
        for writer in writers:
            writer.close()

    if cfg.compile and rank == 0 and step < cfg.steps:
        print("--compile: the first steps compile the members' loss (about 20-30 s on an H100, a minute or more on a "
              "CPU) before the progress bar moves")
    t_log, n_log = time.perf_counter(), 0
    who = f"seed {seed_list[0]}" if len(seed_list) == 1 else f"seeds {' '.join(map(str, seed_list))}"
    bar = tqdm(total=cfg.steps, initial=step, desc=f"{cfg.model} {who}", unit="step", mininterval=5, disable=rank != 0)
    with _StopSignal(device) as stop:
        while step < cfg.steps:
            train_step()
            step += 1; n_log += 1
            bar.update(1)
            stopping = stop.requested()
            eval_now = step % cfg.eval_every == 0 and step < cfg.steps
            save_now = step % cfg.checkpoint_every == 0 or step == cfg.steps or stopping
            if step % cfg.log_every == 0 or eval_now or save_now:  # so no checkpoint or evaluation of bad weights
                sums = train_step.sums
                if world > 1:
                    dist.all_reduce(sums)
                    sums /= world
                sums_v = (sums / n_log).cpu().numpy()
                finite = np.isfinite(sums_v).all(1) & ensemble.all_finite().cpu().numpy()
                if not finite.all():
                    kept = "no checkpoint was written" if saved_step is None else \
                        f"{lasts[0] if len(lasts) == 1 else cfg.out + '/seed_*/last.pt'} keeps the weights of step {saved_step}"
                    bad = ", ".join(str(s) for s, ok in zip(seed_list, finite) if not ok)
                    close()
                    raise UserError(f"The loss became {sums_v[~finite][0, 0]} (or the weights non-finite) by step {step}"
                                    f"{'' if len(seed_list) == 1 else f' for seed {bad}'}; training stopped and {kept}. "
                                    f"Start again with a lower --lr or --grad-clip, or --precision fp32, or check the "
                                    f"dataset for extreme values.")
                if rank == 0:
                    log(sums_v, time.perf_counter() - t_log)
                sums.zero_(); t_log, n_log = time.perf_counter(), 0
            if eval_now and rank == 0:
                evaluate_and_record()
            if save_now and rank == 0:
                checkpoint()
            if stopping:
                close()
                if world > 1:
                    dist.barrier()  # until rank 0 has written the checkpoint
                raise Interrupted(stop.signum, step, lasts[0] if len(lasts) == 1 else Path(cfg.out) / "seed_*/last.pt")
    bar.close()
    if rank != 0:
        return None
    if not lasts[0].exists():  # zero steps asked for: still leave a checkpoint to evaluate
        checkpoint()
    t0 = time.perf_counter()
    per_member = evaluate(cfg.eval_episodes)
    seconds = time.perf_counter() - t0
    results, made = [], provenance(device)
    for writer, d, last, seed, reports in zip(writers, dirs, lasts, seed_list, per_member):
        for r in reports:
            if r["normalized_mean"] is not None:
                writer.add_scalar(f"eval/normalized_{r['target']:g}", r["normalized_mean"], step)
        writer.close()
        result = {"checkpoint": os.path.relpath(last, cfg.out),  # relative to --out: the record names no machine path
                  "step": step, "task": task.gym_id, "dataset": data.source,
                  "model": cfg.model, "seed": seed, "ensemble": seed_list, "eval_seconds": seconds, "targets": reports,
                  "config": dataclasses.asdict(dataclasses.replace(cfg, seed=seed)),  # the record says how it was made
                  "provenance": made}
        (d / "eval.json").write_text(json.dumps(result, indent=1))
        results.append(result)
    return results
