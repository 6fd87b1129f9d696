"""Batched evaluation (SPEC §5): every episode of every target runs at once in one vector env,
with one forward pass per environment step for all live episodes."""
from __future__ import annotations

import numpy as np
import torch
from tqdm import tqdm

from dt_primal.model import DecisionTransformer
from envs import Task, make_vector_env


@torch.no_grad()
def rollout(model: DecisionTransformer, task: Task, targets: list[float], episodes: int, state_mean: np.ndarray,
            state_std: np.ndarray, reward_scale: float, context: int, device: torch.device | str = "cpu",
            seed: int = 0, precision: str = "fp32", asynchronous: bool = False, progress: bool = False) -> list[dict]:
    """Run ``episodes`` episodes per target; returns one report dict per target with the keys
    ``target, return_mean, return_std, normalized_mean, normalized_std, episodes`` (+ raw returns
    and lengths). The conditioning return drops by reward / scale after each step."""
    was_training = model.training
    model.eval()
    n = episodes * len(targets)
    env = make_vector_env(task, n, asynchronous=asynchronous)
    obs, _ = env.reset(seed=seed)
    obs_dim, act_dim = env.single_observation_space.shape[0], env.single_action_space.shape[0]
    mean, std = (torch.as_tensor(a, dtype=torch.float32, device=device) for a in (state_mean, state_std))
    T = model.max_ep_len
    states = torch.zeros(n, T, obs_dim, device=device)
    actions = torch.zeros(n, T, act_dim, device=device)
    rtg = torch.zeros(n, T, 1, device=device)
    rtg[:, 0, 0] = torch.tensor(np.repeat(targets, episodes), dtype=torch.float32, device=device) / reward_scale
    timesteps = torch.arange(T, device=device)
    returns, lengths = np.zeros(n), np.zeros(n, dtype=np.int64)
    alive = np.ones(n, dtype=bool)
    autocast = torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=precision == "bf16")
    bar = tqdm(total=T, disable=not progress, desc=f"evaluating {n} episodes", unit="step", mininterval=2)
    for t in range(T):
        states[:, t] = (torch.as_tensor(obs, dtype=torch.float32, device=device) - mean) / std
        live = torch.as_tensor(np.flatnonzero(alive), device=device)
        lo = max(0, t + 1 - context)
        with autocast:
            pred, _ = model(states[live, lo:t + 1], actions[live, lo:t + 1], rtg[live, lo:t + 1],
                            timesteps[lo:t + 1].expand(len(live), -1), last_only=True)
        actions[live, t] = pred[:, -1].float()
        step_actions = np.zeros((n, act_dim), dtype=np.float32)
        step_actions[alive] = actions[live, t].cpu().numpy()
        obs, rewards, terms, truncs, _ = env.step(step_actions)
        returns[alive] += rewards[alive]
        lengths[alive] += 1
        if t + 1 < T:
            rtg[:, t + 1, 0] = rtg[:, t, 0] - torch.as_tensor(rewards, dtype=torch.float32, device=device) / reward_scale
        alive &= ~(terms | truncs)
        bar.update(1)
        if not alive.any():
            break
    bar.close()
    env.close()
    model.train(was_training)
    reports = []
    for i, target in enumerate(targets):
        r = returns[i * episodes:(i + 1) * episodes]
        score = task.normalize(r)
        reports.append({"target": float(target), "return_mean": float(r.mean()), "return_std": float(r.std()),
                        "normalized_mean": float(score.mean()), "normalized_std": float(score.std()),
                        "episodes": int(episodes), "returns": r.tolist(),
                        "lengths": lengths[i * episodes:(i + 1) * episodes].tolist()})
    return reports


def aggregate(results: list[dict]) -> dict:
    """Per-checkpoint results plus, per target, the mean ± std (ddof 0) across checkpoints (seeds)
    of each checkpoint's mean return and mean normalised score."""
    targets = [r["target"] for r in results[0]["targets"]]
    if any([r["target"] for r in res["targets"]] != targets for res in results):
        raise ValueError("the checkpoints were evaluated on different targets")
    across = []
    for i, target in enumerate(targets):
        norm = np.array([res["targets"][i]["normalized_mean"] for res in results])
        ret = np.array([res["targets"][i]["return_mean"] for res in results])
        across.append({"target": target, "return_mean": float(ret.mean()), "return_std": float(ret.std()),
                       "normalized_mean": float(norm.mean()), "normalized_std": float(norm.std()),
                       "episodes": int(sum(res["targets"][i]["episodes"] for res in results)),
                       "checkpoints": len(results)})
    return {"checkpoints": results, "across_checkpoints": across}


def markdown(summary: dict) -> str:
    """Markdown table of ``aggregate``'s output."""
    lines = ["| checkpoint | target | episodes | return | normalised score |", "|---|---|---|---|---|"]
    for res in summary["checkpoints"]:
        for r in res["targets"]:
            lines.append(f"| {res['checkpoint']} | {r['target']:g} | {r['episodes']} | {r['return_mean']:.1f} ± "
                         f"{r['return_std']:.1f} | {r['normalized_mean']:.1f} ± {r['normalized_std']:.1f} |")
    for r in summary["across_checkpoints"]:
        lines.append(f"| **mean ± std over {r['checkpoints']} checkpoints** | {r['target']:g} | {r['episodes']} | "
                     f"{r['return_mean']:.1f} ± {r['return_std']:.1f} | **{r['normalized_mean']:.1f} ± {r['normalized_std']:.1f}** |")
    return "\n".join(lines) + "\n\nWithin a checkpoint: mean ± std over episodes. Across checkpoints: mean ± std " \
                              "(ddof 0) of the per-checkpoint means.\n"
