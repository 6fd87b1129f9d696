"""Behaviour policies of the offline suite (the D4RL recipe, docs/method.md, "Datasets"), trained online with
stable-baselines3: SAC for hopper and walker2d, TQC (sb3-contrib) for halfcheetah, as the
hosted Minari MuJoCo datasets were made.

A run resumes from its last checkpoint (model + replay buffer). At every evaluation the actor is
exported; the first export whose score reaches ``MEDIUM_SCORE`` becomes the *medium* policy and
the replay buffer up to that moment becomes the *medium-replay* transitions; the best later
export is kept as ``best.pt``. It becomes the *expert* (``expert.pt``) once its score, measured
over ``EXPERT_EPISODES`` episodes, reaches ``EXPERT_SCORE`` (the learner then stops), or when the
1M-step run finishes: a 10-episode evaluation alone never makes an expert. Exports are small and
committed under ``datasets/policies/<env>/``.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from envs import Task
from datasets.rollout import collect

POLICY_DIR = Path(__file__).parent / "policies"
MEDIUM_SCORE = 40.0  # normalised score: about a third of an expert's return, as D4RL's medium policies
EXPERT_SCORE, EXPERT_EPISODES = 75.0, 100  # the suite's expert target (docs/datasets.md)
ALGOS = {"halfcheetah": "TQC", "hopper": "SAC", "walker2d": "SAC"}


class GaussianActor(nn.Module):
    """The tanh-Gaussian actor of SB3's SAC/TQC (same parameter names), runnable without SB3."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: tuple[int, ...] = (256, 256)):
        super().__init__()
        layers, d = [], obs_dim
        for h in hidden:
            layers += [nn.Linear(d, h), nn.ReLU()]
            d = h
        self.latent_pi = nn.Sequential(*layers)
        self.mu = nn.Linear(d, act_dim)
        self.log_std = nn.Linear(d, act_dim)
        self.hidden = tuple(hidden)

    @torch.no_grad()
    def act(self, obs: np.ndarray, generator: torch.Generator | None = None) -> np.ndarray:
        """Sampled actions in [-1, 1] (the stochastic policy that generates D4RL-style data)."""
        z = self.latent_pi(torch.as_tensor(obs, dtype=torch.float32))
        mu, std = self.mu(z), self.log_std(z).clamp(-20, 2).exp()
        return torch.tanh(mu + std * torch.randn(mu.shape, generator=generator)).numpy()

    def export(self) -> dict:
        return {"obs_dim": self.latent_pi[0].in_features, "act_dim": self.mu.out_features,
                "hidden": self.hidden, "state_dict": self.state_dict()}

    @classmethod
    def load(cls, path: str | os.PathLike) -> tuple["GaussianActor", dict]:
        """An exported policy and its ``meta`` (learner step, seed, score at export)."""
        blob = torch.load(path, map_location="cpu", weights_only=True)
        actor = cls(blob["obs_dim"], blob["act_dim"], tuple(blob["hidden"]))
        actor.load_state_dict(blob["state_dict"])
        return actor.eval(), blob["meta"]

    @classmethod
    def from_sb3(cls, model) -> "GaussianActor":
        sb3 = model.actor
        hidden = tuple(m.out_features for m in sb3.latent_pi if isinstance(m, nn.Linear))
        actor = cls(sb3.latent_pi[0].in_features, sb3.mu.out_features, hidden)
        actor.load_state_dict({k: v for k, v in sb3.state_dict().items() if k.split(".")[0] in ("latent_pi", "mu", "log_std")})
        return actor.eval()


def evaluate_actor(actor: GaussianActor, task: Task, episodes: int, seed: int) -> np.ndarray:
    """Returns of ``episodes`` episodes of the stochastic actor."""
    gen = torch.Generator().manual_seed(seed)
    eps = collect(task, lambda o: actor.act(o, gen), num_episodes=episodes, seed=seed)
    return np.array([e["rewards"].sum() for e in eps])


def replay_episodes(buffer) -> dict[str, np.ndarray]:
    """Every transition stored in an SB3 replay buffer, as flat arrays plus episode lengths.

    An episode ends where the learner flagged it done, or where the next stored observation is not
    this transition's next observation: the learner was resumed mid-episode, so the episode was
    cut. Cut episodes and the trailing unfinished one end truncated. (SB3 stores a step's
    transition after its callbacks run, so at a checkpoint the buffer holds one transition fewer
    than the step count: only ``buffer.pos`` counts.)"""
    n = buffer.buffer_size if buffer.full else buffer.pos
    obs, nxt = buffer.observations[:n, 0], buffer.next_observations[:n, 0]
    done, timeout = buffer.dones[:n, 0].astype(bool), buffer.timeouts[:n, 0].astype(bool)
    cut = np.append(np.any(nxt[:-1] != obs[1:], axis=1), True) & ~done
    ends = np.flatnonzero(done | cut)
    truncated = timeout | cut
    lengths = np.diff(np.concatenate([[-1], ends]))
    return dict(observations=obs.astype(np.float32), final_observations=nxt[ends].astype(np.float32),
                actions=buffer.actions[:n, 0].astype(np.float32), rewards=buffer.rewards[:n, 0].astype(np.float32),
                terminations=done & ~truncated, truncations=truncated, lengths=lengths)


def restore_replay(buffer, z) -> int:
    """Refill an empty SB3 replay buffer from transitions exported by ``replay_episodes``."""
    n = len(z["rewards"])
    ends = np.cumsum(z["lengths"]) - 1
    nxt = np.empty_like(z["observations"])
    nxt[:-1] = z["observations"][1:]
    nxt[ends] = z["final_observations"]
    buffer.observations[:n, 0], buffer.next_observations[:n, 0] = z["observations"], nxt
    buffer.actions[:n, 0], buffer.rewards[:n, 0] = z["actions"], z["rewards"]
    buffer.dones[:n, 0], buffer.timeouts[:n, 0] = z["terminations"] | z["truncations"], z["truncations"]
    buffer.pos = n
    return n


def promote_if_expert(task: Task, out: Path, progress: dict, episodes: int = EXPERT_EPISODES) -> bool:
    """Measure ``best.pt`` over ``episodes`` episodes once its 10-episode score reaches
    ``EXPERT_SCORE``; copy it to ``expert.pt`` if the measured mean does too. Records the
    measurement in ``progress`` so a policy is measured once."""
    step = progress["expert_step"]
    if (out / "expert.pt").exists() or progress["expert_score"] < EXPERT_SCORE or progress.get("expert_checked") == step:
        return (out / "expert.pt").exists()
    actor, _ = GaussianActor.load(out / "best.pt")
    score = task.normalize(evaluate_actor(actor, task, episodes, seed=20_000 + step))
    progress["expert_checked"], progress["expert_measured"] = step, [float(score.mean()), float(score.std()), episodes]
    print(f"{task.name} best policy (step {step}) over {episodes} episodes: normalised {score.mean():.1f} ± {score.std():.1f}", flush=True)
    if score.mean() >= EXPERT_SCORE:
        shutil.copyfile(out / "best.pt", out / "expert.pt")
    return (out / "expert.pt").exists()


def train_behaviour(task: Task, work_dir: Path, total_steps: int = 1_000_000, eval_every: int = 20_000,
                    eval_episodes: int = 10, seed: int = 0, policy_dir: Path = POLICY_DIR) -> None:
    """Train (or resume) the behaviour learner of ``task`` and export medium/medium-replay/expert,
    until ``total_steps`` or until an expert is promoted (``promote_if_expert``).

    Resumes from ``work_dir`` (model + full replay buffer) when it holds a checkpoint, else from the
    committed ``learner.zip`` with the replay buffer refilled from the committed transitions
    (``history.npz`` until medium level, then ``medium_replay.npz``): a fresh clone continues the
    learner, with an older replay buffer after medium level."""
    from stable_baselines3 import SAC
    from stable_baselines3.common.callbacks import BaseCallback
    from sb3_contrib import TQC

    torch.set_num_threads(1)
    algo = {"SAC": SAC, "TQC": TQC}[ALGOS[task.name]]
    work_dir, out = Path(work_dir), Path(policy_dir) / task.name
    work_dir.mkdir(parents=True, exist_ok=True); out.mkdir(parents=True, exist_ok=True)
    progress_path = out / "learner.json"  # committed: the learner's history, read by `python -m datasets stats`
    resuming, committed = (work_dir / "model.zip").exists(), (out / "learner.zip").exists()
    progress = json.loads(progress_path.read_text()) if (resuming or committed) and progress_path.exists() else {
        "task": task.name, "algo": ALGOS[task.name], "seed": seed, "evals": [], "cpu_seconds": 0.0,
        "medium_step": None, "expert_step": None, "expert_score": -float("inf")}
    if promote_if_expert(task, out, progress):
        progress_path.write_text(json.dumps(progress, indent=1))
        print(f"{task.name}: expert.pt promoted, the learner is done")
        return
    env = task.make()
    if resuming:
        model = algo.load(work_dir / "model.zip", env=env, device="cpu")
        model.load_replay_buffer(work_dir / "replay.pkl")
        print(f"resumed {task.name} at step {model.num_timesteps}")
    elif committed:
        model = algo.load(out / "learner.zip", env=env, device="cpu", buffer_size=total_steps)
        transitions = out / ("history.npz" if (out / "history.npz").exists() else "medium_replay.npz")
        n = restore_replay(model.replay_buffer, dict(np.load(transitions)))
        print(f"resumed {task.name} at step {model.num_timesteps} from the committed learner ({n} transitions of {transitions.name})")
    else:
        model = algo("MlpPolicy", env, learning_starts=10_000, buffer_size=total_steps, seed=seed, device="cpu", verbose=0)

    class Checkpoint(BaseCallback):
        t0 = time.process_time()

        def _on_step(self) -> bool:
            step = self.num_timesteps
            if step % eval_every:
                return True
            actor = GaussianActor.from_sb3(self.model)
            returns = evaluate_actor(actor, task, eval_episodes, seed=10_000 + step)
            score = float(task.normalize(returns.mean()))
            progress["evals"].append({"step": step, "return_mean": float(returns.mean()),
                                      "return_std": float(returns.std()), "normalized": score})
            now = time.process_time(); progress["cpu_seconds"] += now - self.t0; self.t0 = now
            meta = {"task": task.name, "algo": ALGOS[task.name], "train_seed": seed, "step": step,
                    "learner_cpu_seconds": progress["cpu_seconds"],
                    "eval_return_mean": float(returns.mean()), "eval_normalized": score}
            if progress["medium_step"] is None and score >= MEDIUM_SCORE:
                torch.save({**actor.export(), "meta": meta}, out / "medium.pt")
                np.savez_compressed(out / "medium_replay.npz", **replay_episodes(self.model.replay_buffer))
                (out / "history.npz").unlink(missing_ok=True)
                progress["medium_step"] = step
            elif progress["medium_step"] is not None and score > progress["expert_score"]:
                torch.save({**actor.export(), "meta": meta}, out / "best.pt")
                progress["expert_step"], progress["expert_score"] = step, score
            self.model.save(work_dir / "model.tmp.zip"); os.replace(work_dir / "model.tmp.zip", work_dir / "model.zip")
            self.model.save_replay_buffer(work_dir / "replay.tmp.pkl"); os.replace(work_dir / "replay.tmp.pkl", work_dir / "replay.pkl")
            # what a fresh clone needs to continue: the learner and, until medium level, every transition
            self.model.save(out / "learner.tmp.zip"); os.replace(out / "learner.tmp.zip", out / "learner.zip")
            if progress["medium_step"] is None:
                np.savez_compressed(out / "history.tmp.npz", **replay_episodes(self.model.replay_buffer))
                os.replace(out / "history.tmp.npz", out / "history.npz")
            print(f"{task.name} step {step}: return {returns.mean():.0f} ± {returns.std():.0f}, normalised {score:.1f}", flush=True)
            done = progress["expert_step"] == step and promote_if_expert(task, out, progress)
            progress_path.write_text(json.dumps(progress, indent=1))
            return not done

    model.learn(total_steps - model.num_timesteps, callback=Checkpoint(), reset_num_timesteps=False)
    if (out / "best.pt").exists() and not (out / "expert.pt").exists():  # finished: the best policy after medium is the expert
        shutil.copyfile(out / "best.pt", out / "expert.pt")
