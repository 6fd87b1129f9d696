"""Behaviour policies of the offline suite (the D4RL recipe, docs/method.md, "Datasets"), trained
online with stable-baselines3: SAC for hopper and walker2d, TQC (sb3-contrib) for halfcheetah, as
the hosted Minari MuJoCo datasets were made.

A run resumes from its last checkpoint (model, optimisers, replay buffer). At every evaluation the
actor is exported; the first export whose score reaches ``MEDIUM_SCORE`` becomes the *medium*
policy and the replay buffer up to that moment becomes the *medium-replay* transitions; the best
later export is kept as ``best.pt``. An evaluation (10 episodes) within ``MEASURE_MARGIN`` of the
expert target of ``EXPERT_VERSION`` is measured again over ``EXPERT_EPISODES`` episodes; if that
mean reaches the target, the export becomes ``expert-v<version>.pt`` and the learner stops. A
measured export outranks any unmeasured one for ``best.pt`` (a lucky 10-episode evaluation is not
enough), and when the run ends without an expert, ``best.pt`` becomes the expert. Exports are small
and committed under ``datasets/policies/<env>/``.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn

from datasets.rollout import collect
from datasets.transitions import half_precision, load_transitions, save_transitions
from dt_primal.errors import UserError
from dt_primal.files.reading import read_json
from dt_primal.files.writing import write_file
from envs import Task

POLICY_DIR = Path(__file__).parent / "policies"
MEDIUM_SCORE = 40.0  # normalised score: about a third of an expert's return, as D4RL's medium policies
EXPERT_EPISODES = 100
EXPERT_TARGETS = {  # per expert version: the normalised mean over EXPERT_EPISODES episodes an expert reaches
    0: {"halfcheetah": 75.0, "hopper": 75.0, "walker2d": 75.0},  # the suite's first experts
    1: {"halfcheetah": 88.0, "hopper": 100.0, "walker2d": 100.0},  # D4RL's expert level
}
EXPERT_VERSION = max(EXPERT_TARGETS)  # the expert a learner trains for now
MEASURE_MARGIN = 5.0  # normalised points below the target from which an evaluation is measured again
BUFFER_SIZE = 1_000_000  # replay buffer (SB3's default), whatever the run's length
LEARNING_RATE = 3e-4  # SB3's and D4RL's; a lower one learns in more steps, so its replay buffer holds more
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
        return {
            "obs_dim": self.latent_pi[0].in_features,
            "act_dim": self.mu.out_features,
            "hidden": self.hidden,
            "state_dict": self.state_dict(),
        }

    @classmethod
    def load(cls, path: str | os.PathLike) -> tuple[GaussianActor, dict]:
        """An exported policy and its ``meta`` (learner step, seed, score at export)."""
        blob = torch.load(path, map_location="cpu", weights_only=True)
        actor = cls(blob["obs_dim"], blob["act_dim"], tuple(blob["hidden"]))
        actor.load_state_dict(blob["state_dict"])
        return actor.eval(), blob["meta"]

    @classmethod
    def from_sb3(cls, model) -> GaussianActor:
        sb3 = model.actor
        hidden = tuple(m.out_features for m in sb3.latent_pi if isinstance(m, nn.Linear))
        actor = cls(sb3.latent_pi[0].in_features, sb3.mu.out_features, hidden)
        actor.load_state_dict(
            {k: v for k, v in sb3.state_dict().items() if k.split(".")[0] in ("latent_pi", "mu", "log_std")}
        )
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
    return dict(
        observations=obs.astype(np.float32),
        final_observations=nxt[ends].astype(np.float32),
        actions=buffer.actions[:n, 0].astype(np.float32),
        rewards=buffer.rewards[:n, 0].astype(np.float32),
        terminations=done & ~truncated,
        truncations=truncated,
        lengths=lengths,
    )


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


def expert_file(version: int) -> str:
    return f"expert-v{version}.pt"


def learner_suffix(version: int) -> str:
    """How the files of learner ``version`` are named: medium.pt, medium_replay.npz and learner.json for the
    first, medium-v1.pt, medium_replay-v1.npz and learner-v1.json for the next."""
    return f"-v{version}" if version else ""


LEARNER_FILES = (("medium", "pt"), ("learner", "json"), ("medium_replay", "npz"))  # what a learner version commits


def adopt_learner(task: Task, source: Path, version: int, policy_dir: Path = POLICY_DIR) -> list[Path]:
    """Commit-ready copies of a learner's medium exports (``train-policy --until-medium --policy-dir``) as the
    files of learner ``version`` of ``task``: its medium policy, its replay buffer with half-precision
    observations and actions (``half_precision``) and its history; never over an existing version."""
    remedy = "It cannot be read as a learner's history: point --learner at the folder train-policy exported into."
    progress = read_json(source / "learner.json", "The learner's history", remedy)
    if not isinstance(progress, dict) or progress.get("task") != task.name or progress.get("medium_step") is None:
        raise UserError(f"{source} holds no {task.name} learner that reached medium level (its learner.json).")
    names = [f"{stem}{learner_suffix(version)}.{ext}" for stem, ext in LEARNER_FILES]
    targets = [policy_dir / task.name / name for name in names]
    if version < 1 or any(t.exists() for t in targets):
        raise UserError(f"Learner version {version} of {task.name} exists or is not a new version (1 or more).")
    try:  # everything read and converted before anything is written
        policy = (source / "medium.pt").read_bytes()
        buffer = half_precision(load_transitions(source / "medium_replay.npz"))
    except (OSError, ValueError, UserError) as exc:
        raise UserError(f"{source} holds no usable medium exports: {exc}") from None
    write_file(targets[0], policy, "The medium policy")
    write_file(targets[1], json.dumps(progress, indent=1), "The learner's history")
    write_file(targets[2], lambda f: save_transitions(f, buffer), "The replay buffer")
    return targets


def measure_candidate(
    task: Task,
    actor: GaussianActor,
    step: int,
    progress: dict,
    version: int = EXPERT_VERSION,
    episodes: int = EXPERT_EPISODES,
) -> bool:
    """Measure the export of ``step`` over ``episodes`` episodes (once: recorded in ``progress``);
    whether its mean reaches the expert target of ``version``."""
    key = str(step)
    if key not in progress["measured"]:
        score = task.normalize(evaluate_actor(actor, task, episodes, seed=20_000 + step))
        progress["measured"][key] = [float(score.mean()), float(score.std()), episodes]
        print(
            f"{task.name} policy of step {step} over {episodes} episodes: normalised {score.mean():.1f} ± "
            f"{score.std():.1f}",
            flush=True,
        )
    return progress["measured"][key][0] >= EXPERT_TARGETS[version][task.name]


def keep_if_best(
    task: Task, actor: GaussianActor, step: int, score: float, episodes: int, progress: dict, save_best
) -> bool:
    """Rank the export of ``step`` (``score`` over ``episodes`` episodes) against ``best.pt``, measuring it
    over ``EXPERT_EPISODES`` episodes when it comes within ``MEASURE_MARGIN`` of the target; ``save_best()``
    writes it as the new best. Whether its measurement reaches the target."""
    reached = False
    if score >= EXPERT_TARGETS[EXPERT_VERSION][task.name] - MEASURE_MARGIN:
        reached = measure_candidate(task, actor, step, progress)
        score, episodes = progress["measured"][str(step)][0], EXPERT_EPISODES
    rank = lambda n, s: (n >= EXPERT_EPISODES, s)  # measured first, then the higher score
    if rank(episodes, score) > rank(progress.get("best_episodes", 0), progress["best_score"]):
        save_best()
        progress.update(best_step=step, best_score=score, best_episodes=episodes)
    return reached


def new_progress(task: Task, seed: int, algo: str, medium_score: float, learning_rate: float) -> dict:
    """The learner's history (``learner.json``, committed; read by `python -m datasets stats`)."""
    return {
        "task": task.name,
        "algo": algo,
        "seed": seed,
        "medium_score": medium_score,
        "learning_rate": learning_rate,
        "evals": [],
        "cpu_seconds": 0.0,
        "medium_step": None,
        "best_step": None,
        "best_score": -float("inf"),
        "best_episodes": 0,
        "measured": {},
        "experts": {},
    }


def load_learner(
    task: Task, work_dir: Path, out: Path, seed: int, algo: str | None, medium_score: float | None, learning_rate: float
):
    """The SB3 learner and its history: from ``work_dir`` (model, optimisers and the full replay
    buffer), else from the snapshot ``learner.zip`` with the replay buffer refilled from the committed
    transitions (``history.npz`` until medium level, then ``medium_replay.npz``) and the history cut
    back to the snapshot's step, else new. A resumed learner keeps its algorithm and medium score
    unless ``algo`` or ``medium_score`` are given; a new one takes the task's (``ALGOS``, ``MEDIUM_SCORE``) and
    ``learning_rate`` (a resumed one keeps its own)."""
    from sb3_contrib import TQC
    from stable_baselines3 import SAC

    env, progress_path = task.make(), out / "learner.json"
    resuming, committed = (work_dir / "model.zip").exists(), (out / "learner.zip").exists()
    progress = (
        json.loads(progress_path.read_text())
        if (resuming or committed) and progress_path.exists()
        else new_progress(task, seed, algo or ALGOS[task.name], MEDIUM_SCORE, learning_rate)
    )
    progress["algo"] = algo if algo is not None else progress.get("algo", ALGOS[task.name])
    progress["medium_score"] = medium_score if medium_score is not None else progress.get("medium_score", MEDIUM_SCORE)
    algo_class = {"SAC": SAC, "TQC": TQC}[progress["algo"]]
    if resuming:
        model = algo_class.load(work_dir / "model.zip", env=env, device="cpu")
        model.load_replay_buffer(work_dir / "replay.pkl")
        print(f"resumed {task.name} at step {model.num_timesteps}")
    elif committed:
        model = algo_class.load(out / "learner.zip", env=env, device="cpu", buffer_size=BUFFER_SIZE)
        transitions = out / ("history.npz" if (out / "history.npz").exists() else "medium_replay.npz")
        n = restore_replay(model.replay_buffer, load_transitions(transitions))
        print(
            f"resumed {task.name} at step {model.num_timesteps} from the committed learner ({n} transitions of "
            f"{transitions.name})"
        )
        # the history may go past the snapshot: those steps are done again (their CPU time stays counted)
        progress["evals"] = [e for e in progress["evals"] if e["step"] <= model.num_timesteps]
        if not (out / "best.pt").exists():  # not committed: the best export so far is found again
            progress.update(best_step=None, best_score=-float("inf"), best_episodes=0)
    else:
        model = algo_class(
            "MlpPolicy",
            env,
            learning_rate=learning_rate,
            learning_starts=10_000,
            buffer_size=BUFFER_SIZE,
            seed=seed,
            device="cpu",
            verbose=0,
        )
    return model, progress


def _save_atomic(save, path: Path) -> None:
    """``save(file)`` (SB3's savers take an open binary file) into ``path``, written beside it and renamed."""
    write_file(path, save, "The learner's state")


class Learner:
    """One task's learner between its evaluations: what it exports when (medium and medium-replay at its first
    evaluation at ``progress["medium_score"]`` or above, then the expert), and the state a resume needs."""

    def __init__(self, task: Task, work_dir: Path, out: Path, progress: dict, seed: int, eval_episodes: int):
        self.task, self.work_dir, self.out, self.progress = task, work_dir, out, progress
        self.seed, self.eval_episodes = seed, eval_episodes
        self.expert = out / expert_file(EXPERT_VERSION)

    def evaluate(self, model, step: int, cpu_seconds: Callable[[], float], until_medium: bool) -> bool:
        """The learner's policy at ``step``: evaluated, recorded and exported where due (with the learner's CPU
        seconds then); whether to stop."""
        actor = GaussianActor.from_sb3(model)
        returns = evaluate_actor(actor, self.task, self.eval_episodes, seed=10_000 + step)
        score = float(self.task.normalize(returns.mean()))
        mean, std = float(returns.mean()), float(returns.std())
        self.progress["evals"].append({"step": step, "return_mean": mean, "return_std": std, "normalized": score})
        print(f"{self.task.name} step {step}: return {mean:.0f} ± {std:.0f}, normalised {score:.1f}", flush=True)
        meta = {"task": self.task.name, "algo": self.progress["algo"], "train_seed": self.seed, "step": step}
        meta |= {"eval_return_mean": mean, "eval_normalized": score}
        export = lambda: {**actor.export(), "meta": meta | {"learner_cpu_seconds": cpu_seconds()}}
        progress = self.progress
        if progress["medium_step"] is None and score >= progress["medium_score"]:
            torch.save(export(), self.out / "medium.pt")
            save_transitions(self.out / "medium_replay.npz", replay_episodes(model.replay_buffer))
            (self.out / "history.npz").unlink(missing_ok=True)
            progress["medium_step"] = step
            return until_medium
        if progress["medium_step"] is None:
            return False
        save_best = lambda: torch.save(export(), self.out / "best.pt")
        if not keep_if_best(self.task, actor, step, score, self.eval_episodes, progress, save_best):
            return False
        torch.save(export(), self.expert)
        progress["experts"][str(EXPERT_VERSION)] = {"step": step, "measured": progress["measured"][str(step)]}
        return True

    def save_state(self, model) -> None:
        """Everything a resume needs: in ``work_dir``, and the snapshot a fresh clone continues from."""
        _save_atomic(model.save, self.work_dir / "model.zip")
        _save_atomic(model.save_replay_buffer, self.work_dir / "replay.pkl")
        _save_atomic(model.save, self.out / "learner.zip")
        if self.progress["medium_step"] is None:  # until medium level a fresh clone also needs every transition
            history = lambda p: save_transitions(p, replay_episodes(model.replay_buffer))
            _save_atomic(history, self.out / "history.npz")
        write_file(self.out / "learner.json", json.dumps(self.progress, indent=1), "The learner's progress")

    def expert_below_target(self) -> None:
        """A learner that ended below its target: its best export is the expert."""
        if (self.out / "best.pt").exists() and not self.expert.exists():
            shutil.copyfile(self.out / "best.pt", self.expert)
            best = self.progress["best_step"]
            measured = self.progress["measured"].get(str(best))
            self.progress["experts"][str(EXPERT_VERSION)] = {"step": best, "below_target": True, "measured": measured}
            write_file(self.out / "learner.json", json.dumps(self.progress, indent=1), "The learner's progress")


def train_behaviour(
    task: Task,
    work_dir: Path,
    total_steps: int = 3_000_000,
    eval_every: int = 20_000,
    eval_episodes: int = 10,
    seed: int = 0,
    policy_dir: Path = POLICY_DIR,
    algo: str | None = None,
    medium_score: float | None = None,
    until_medium: bool = False,
    learning_rate: float = LEARNING_RATE,
) -> None:
    """Train (or resume, ``load_learner``) the behaviour learner of ``task`` with ``algo``; export medium
    (its first evaluation at ``medium_score`` or above) and medium-replay, then (unless ``until_medium``)
    the expert of ``EXPERT_VERSION``, until ``total_steps`` or an expert. ``learning_rate`` is a new learner's."""
    from stable_baselines3.common.callbacks import BaseCallback

    torch.set_num_threads(1)
    work_dir, out = Path(work_dir), Path(policy_dir) / task.name
    work_dir.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    if (out / expert_file(EXPERT_VERSION)).exists():
        print(f"{task.name}: {expert_file(EXPERT_VERSION)} exists, the learner is done")
        return
    model, progress = load_learner(task, work_dir, out, seed, algo, medium_score, learning_rate)
    learner = Learner(task, work_dir, out, progress, seed, eval_episodes)

    class Checkpoint(BaseCallback):
        t0 = time.process_time()

        def _on_step(self) -> bool:
            if self.num_timesteps % eval_every:
                return True
            cpu = lambda: progress["cpu_seconds"] + time.process_time() - self.t0
            done = learner.evaluate(self.model, self.num_timesteps, cpu, until_medium)
            now = time.process_time()
            progress["cpu_seconds"] += now - self.t0
            self.t0 = now
            learner.save_state(self.model)
            return not done

    model.learn(max(total_steps - model.num_timesteps, 0), callback=Checkpoint(), reset_num_timesteps=False)
    learner.expert_below_target()
