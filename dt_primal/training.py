"""Training loop: AdamW with linear warm-up, gradient clipping, optional bf16 autocast,
TensorBoard, checkpoints with exact ``--resume``, periodic and final batched evaluation."""
from __future__ import annotations

import dataclasses
import json
import os
import random
import signal
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

from dt_primal.config import Config
from dt_primal.data import Trajectories, WindowSampler
from dt_primal.errors import UserError
from dt_primal.evaluation import rollout
from dt_primal.model import DecisionTransformer, dt_loss
from envs import Task, get_task


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError("--device cuda was asked for but PyTorch sees no CUDA GPU here; use --device cpu "
                        "(or install the CUDA build of torch==2.13.0 on a GPU machine).")
    return torch.device(name)


def save_checkpoint(path: Path, payload: dict) -> None:
    """Atomic: write a temporary file, then rename, so a crash leaves the previous one intact."""
    tmp = path.with_name(path.name + ".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: str | os.PathLike, device: torch.device | str = "cpu") -> dict:
    try:
        ckpt = torch.load(path, map_location=device, weights_only=False)
    except FileNotFoundError:
        raise UserError(f"Checkpoint {path} does not exist; train.py writes DIR/last.pt.") from None
    except Exception as exc:
        raise UserError(f"Checkpoint {path} cannot be read ({type(exc).__name__}: {exc}); it is truncated or "
                        f"corrupted. Use an earlier copy or retrain.") from exc
    if not isinstance(ckpt, dict) or not {"model", "config", "state_mean", "state_std", "task"} <= set(ckpt):
        raise UserError(f"{path} is not a dt-primal checkpoint (it lacks the model, config or normalisation "
                        f"statistics); give a DIR/last.pt written by train.py.")
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


def check_env_matches(data: Trajectories, task: Task) -> None:
    env = task.make()
    obs_dim, act_dim = env.observation_space.shape[0], env.action_space.shape[0]
    env.close()
    if (data.obs_dim, data.act_dim) != (obs_dim, act_dim):
        raise UserError(f"The dataset {data.source} has observations of size {data.obs_dim} and actions of size "
                        f"{data.act_dim}, but {task.gym_id} has {obs_dim} and {act_dim}: it was not recorded in that "
                        f"environment. Pass the right --env.")


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
    """SIGINT/SIGTERM set a flag; the loop checkpoints at the next step and stops."""

    def __init__(self):
        self.signum = None

    def __enter__(self):
        self.old = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def _handle(self, signum, frame):
        self.signum = signum

    def __exit__(self, *exc):
        for s, h in self.old.items():
            signal.signal(s, h)


class Interrupted(Exception):
    def __init__(self, signum: int, step: int, path: Path):
        super().__init__(f"stopped by signal {signal.Signals(signum).name} at step {step}; checkpoint {path}; "
                         f"continue with --resume")
        self.signum = signum


def train(cfg: Config, data: Trajectories, resume: bool = False) -> dict:
    """Train one seed; returns the final evaluation report (also written to ``out/eval.json``)."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    device = resolve_device(cfg.device)
    task = get_task(data.env)
    check_env_matches(data, task)
    targets = cfg.targets or list(task.targets)
    ckpt = load_checkpoint(out / "last.pt", device) if resume and (out / "last.pt").exists() else None
    if resume and ckpt is None:
        print(f"--resume: no checkpoint in {out}, starting from scratch")
    if ckpt is not None:  # the checkpoint's model and data settings win; steps and evaluation may change
        saved = Config(**ckpt["config"])
        keep = ("steps", "eval_every", "eval_episodes", "eval_episodes_during", "checkpoint_every", "log_every",
                "device", "out", "targets")
        cfg = dataclasses.replace(saved, **{k: getattr(cfg, k) for k in keep})
        state_mean, state_std = ckpt["state_mean"], ckpt["state_std"]
    else:
        state_mean, state_std = data.state_stats()

    random.seed(cfg.seed); np.random.seed(cfg.seed); torch.manual_seed(cfg.seed)
    gen = torch.Generator(device=device).manual_seed(cfg.seed)
    sampler = WindowSampler(data, cfg.context, cfg.reward_scale, state_mean, state_std, device)
    model = DecisionTransformer(cfg, data.obs_dim, data.act_dim).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, fused=device.type == "cuda")
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(1, cfg.warmup_steps)))
    step = 0
    if ckpt is not None:
        model.load_state_dict(ckpt["model"]); opt.load_state_dict(ckpt["optimizer"]); sched.load_state_dict(ckpt["scheduler"])
        _set_rng_state(ckpt["rng"], gen)
        step = ckpt["step"]
        print(f"resumed from {out / 'last.pt'} at step {step}")

    def checkpoint():
        save_checkpoint(out / "last.pt", {
            "model": model.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
            "step": step, "rng": _rng_state(gen), "config": dataclasses.asdict(cfg), "task": task.name,
            "state_mean": state_mean, "state_std": state_std, "obs_dim": data.obs_dim, "act_dim": data.act_dim,
            "dataset": data.source})

    def evaluate(episodes: int) -> list[dict]:
        return rollout(model, task, targets, episodes, state_mean, state_std, cfg.reward_scale, cfg.context,
                       device, seed=cfg.seed + 100_000, precision=cfg.precision)

    curve_path = out / "evals.jsonl"
    curve = [json.loads(l) for l in curve_path.read_text().splitlines()] if curve_path.exists() else []
    curve = [c for c in curve if c["step"] <= step]  # drop evaluations newer than the checkpoint
    curve_path.write_text("".join(json.dumps(c) + "\n" for c in curve))

    writer = SummaryWriter(str(out))
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.precision == "bf16")
    sums = torch.zeros(3, device=device)  # loss, action loss, mean J² over the logging window
    model.train()
    t_log, n_log = time.perf_counter(), 0
    bar = tqdm(total=cfg.steps, initial=step, desc=f"{cfg.model} seed {cfg.seed}", unit="step", mininterval=5)
    with _StopSignal() as stop:
        while step < cfg.steps:
            batch = sampler.sample(cfg.batch_size, gen)
            with autocast:
                loss, action_loss, Js = dt_loss(model, batch, cfg.eta)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            sched.step()
            step += 1; n_log += 1
            with torch.no_grad():
                j2 = torch.stack([(J.detach() ** 2).mean() for J in Js]).mean() if Js else torch.zeros((), device=device)
                sums += torch.stack([loss.detach().float(), action_loss.detach().float(), j2.float()])
            bar.update(1)
            if step % cfg.log_every == 0 or step == cfg.steps or step % cfg.checkpoint_every == 0 or stop.signum:
                loss_v, action_v, j2_v = (sums / n_log).tolist()
                if not np.isfinite(loss_v):
                    raise UserError(f"The loss became {loss_v} by step {step}; training stopped and {out / 'last.pt'} "
                                    f"keeps the last good weights. Lower --lr, use --precision fp32, or check the "
                                    f"dataset for extreme values.")
                dt = time.perf_counter() - t_log
                writer.add_scalar("loss/total", loss_v, step)
                writer.add_scalar("loss/action_mse", action_v, step)
                writer.add_scalar("perf/steps_per_s", n_log / dt, step)
                writer.add_scalar("lr", sched.get_last_lr()[0], step)
                if Js:
                    writer.add_scalar("ksvd/J_squared", j2_v, step)
                    for i, block in enumerate(b for b in model.blocks if hasattr(b.attn, "Lambda")):
                        lam = block.attn.Lambda.detach()
                        writer.add_scalar(f"ksvd/lambda_mean/{i}", lam.mean().item(), step)
                        writer.add_scalar(f"ksvd/lambda_abs_max/{i}", lam.abs().max().item(), step)
                bar.set_postfix(loss=f"{action_v:.4f}", ups=f"{n_log / dt:.1f}")
                sums.zero_(); t_log, n_log = time.perf_counter(), 0
            if step % cfg.eval_every == 0 and step < cfg.steps:
                reports = evaluate(cfg.eval_episodes_during)
                for r in reports:
                    writer.add_scalar(f"eval/normalized_{r['target']:g}", r["normalized_mean"], step)
                    writer.add_scalar(f"eval/return_{r['target']:g}", r["return_mean"], step)
                with curve_path.open("a") as f:
                    f.write(json.dumps({"step": step, "reports": [{k: v for k, v in r.items() if k not in ("returns", "lengths")}
                                                                   for r in reports]}) + "\n")
                bar.write(f"step {step}: " + ", ".join(f"target {r['target']:g} -> {r['normalized_mean']:.1f}" for r in reports))
            if step % cfg.checkpoint_every == 0 or step == cfg.steps or stop.signum:
                checkpoint()
            if stop.signum:
                bar.close(); writer.close()
                raise Interrupted(stop.signum, step, out / "last.pt")
    bar.close()
    if not (out / "last.pt").exists():  # zero steps asked for: still leave a checkpoint to evaluate
        checkpoint()
    t0 = time.perf_counter()
    reports = evaluate(cfg.eval_episodes)
    for r in reports:
        writer.add_scalar(f"eval/normalized_{r['target']:g}", r["normalized_mean"], step)
    writer.close()
    result = {"checkpoint": str(out / "last.pt"), "step": step, "task": task.gym_id, "dataset": data.source,
              "model": cfg.model, "seed": cfg.seed, "eval_seconds": time.perf_counter() - t0, "targets": reports}
    (out / "eval.json").write_text(json.dumps(result, indent=1))
    return result
