"""``python -m datasets stats``: what the built suite holds and how good its behaviour policies are,
printed and written to ``docs/datasets.md``."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from datasets.behaviour import EXPERT_EPISODES, EXPERT_SCORE, POLICY_DIR, GaussianActor, evaluate_actor
from datasets.suite import LEVELS, SUITE_NAMESPACE, dataset_dir, is_built, suite_id
from datasets.loaders import load_dataset
from envs import TASKS, Task


def dataset_row(dataset_id: str) -> str:
    """A Minari dataset of any task; its normalised scores as a run on it would compute them ("–" without
    reference scores)."""
    data = load_dataset(dataset_id, build=False)
    returns = data.episode_returns()
    norm = data.task.normalize(returns)
    build = dataset_dir(dataset_id) / "build.json"
    info = json.loads(build.read_text()) if build.exists() else {}
    seconds = f"{info['seconds']:.0f}" if info else "?"
    if "load_average" in info:  # the machine's other work slows a build down
        seconds += f" (load {info['load_average']:.1f})"
    normalised = "–" if norm is None else f"{norm.mean():.1f} ({norm.min():.1f} – {norm.max():.1f})"
    return (f"| {dataset_id} | {len(data.lengths)} | {len(data.rewards)} | {returns.mean():.1f} ± {returns.std():.1f} | "
            f"{returns.min():.1f} | {returns.max():.1f} | {normalised} | {seconds} |")


def policy_row(task: Task, episodes: int) -> str | None:
    """The learner's history and a fresh ``episodes``-episode measurement of medium and expert."""
    folder = POLICY_DIR / task.name
    if not (folder / "learner.json").exists():
        return None
    learner = json.loads((folder / "learner.json").read_text())
    cells = []
    for level in ("medium", "expert"):
        path = folder / f"{level}.pt"
        if not path.exists():
            best = folder / "best.pt"
            cells.append(f"not yet (best so far: step {learner['expert_step']}, {learner['expert_score']:.1f} over 10 "
                         f"episodes; it becomes the expert once it measures ≥ {EXPERT_SCORE:g} over "
                         f"{EXPERT_EPISODES} episodes, or when the 1M-step run ends)" if level == "expert" and best.exists()
                         else "not reached yet")
            continue
        actor, meta = GaussianActor.load(path)
        r = evaluate_actor(actor, task, episodes, seed=12345)
        s = task.normalize(r)
        cell = f"step {meta['step']}: return {r.mean():.0f} ± {r.std():.0f}, **normalised {s.mean():.1f} ± {s.std():.1f}**"
        if level == "expert" and "expert_measured" in learner:  # the measurement that promoted it (other seeds)
            m, sd, n = learner["expert_measured"]
            cell += f" (promoted on {m:.1f} ± {sd:.1f} over {n} other episodes)"
        cells.append(cell)
    last = learner["evals"][-1] if learner["evals"] else {"step": 0, "normalized": float("nan")}
    return (f"| {task.name} | {learner['algo']} | {last['step']} ({last['normalized']:.1f}) | "
            f"{learner['cpu_seconds'] / 3600:.2f} | {cells[0]} | {cells[1]} |")


def stats(out: Path, episodes: int = 100, datasets: list[str] = ()) -> str:
    """The built suite datasets and ``datasets`` (Minari ids of any task), and the behaviour policies."""
    built = [suite_id(t, lvl) for t in TASKS for lvl in LEVELS if is_built(suite_id(t, lvl))]
    given = [d for d in datasets if d.split("/")[0] != SUITE_NAMESPACE or is_built(d)]
    rows = [dataset_row(d) for d in dict.fromkeys(built + given)]  # a built suite dataset given again: one row
    policies = [r for r in (policy_row(TASKS[t], episodes) for t in TASKS) if r]
    text = "\n".join([
        "# The offline dataset suite", "",
        f"Datasets `{SUITE_NAMESPACE}/<env>/<level>-v0` built on this machine (`python -m datasets build`) and any "
        "given with `--datasets`; normalised scores use each dataset's reference returns (the D4RL ones for the "
        "suite; – for a task without any). Regenerate this page with `python -m datasets stats`.", "",
        "## Built datasets", "",
        "| dataset | episodes | steps | return mean ± std | min | max | normalised mean (min – max) | build s (1-min load average) |",
        "|---|---|---|---|---|---|---|---|", *(rows or ["| (none built yet) | | | | | | | |"]), "",
        f"## Behaviour policies (measured: {episodes} episodes of the stochastic policy that makes the data)", "",
        "| env | algorithm | learner step (last eval, normalised) | learner CPU hours | medium | expert |",
        "|---|---|---|---|---|---|", *(policies or ["| (no learner has run yet) | | | | | |"]), "",
        "Targets: expert ≥ 75 normalised on each task, medium between 30 and 65.", ""])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return text
