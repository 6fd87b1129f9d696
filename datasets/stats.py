"""``python -m datasets stats``: what the built suite holds and how good its behaviour policies are,
printed and written to ``docs/datasets.md``, with the learners' curves beside it (``datasets-learners.png``)."""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path

import numpy as np

from datasets.behaviour import (
    EXPERT_EPISODES,
    EXPERT_TARGETS,
    EXPERT_VERSION,
    POLICY_DIR,
    GaussianActor,
    evaluate_actor,
    expert_file,
)
from datasets.loaders import load_dataset
from datasets.suite import LEVELS, SUITE_NAMESPACE, VERSIONS, dataset_dir, is_built, suite_id
from dt_primal.errors import UserError
from dt_primal.files.reading import is_number, read_bytes, read_json
from dt_primal.files.writing import check_target, write_file
from envs import TASKS, Task

D4RL = json.loads((Path(__file__).parent / "d4rl_v2.json").read_text())  # D4RL v2's statistics, as published
BEST_PERCENT = 10  # the share of the steps whose best episodes %BC trains on


def d4rl_row(dataset_id: str) -> str:
    """A suite dataset's normalised scores as %BC would see them (std, max, and the mean of the best episodes
    holding ``BEST_PERCENT`` % of the steps) beside D4RL v2's dataset of the same task and level."""
    data = load_dataset(dataset_id, build=False)
    norm, best = (data.task.normalize(d.episode_returns()) for d in (data, data.best_episodes(BEST_PERCENT)))
    key = "/".join(dataset_id.split("/")[1:]).rsplit("-v", 1)[0]
    ref = D4RL["datasets"].get(key)
    theirs = (
        "–"
        if ref is None
        else f"{ref['steps']}, {ref['episodes']}, {ref['mean']:.1f} ± {ref['std']:.1f}, {ref['max']:.1f}"
    )
    return (
        f"| {dataset_id} | {len(data.rewards)}, {len(data.lengths)}, {norm.mean():.1f} ± {norm.std():.1f}, "
        f"{norm.max():.1f} | {best.mean():.1f} ({len(best)} episodes) | {theirs} |"
    )


def build_info(dataset_id: str) -> dict:
    """What a build wrote of itself (``build.json``): its seconds and the load average then, read as any file a
    user may be given (a regular file of at most a record's size, JSON), each a finite number or left out."""
    path = dataset_dir(dataset_id) / "build.json"
    if not path.exists():
        return {}
    info = read_json(path, "The build record", "Build the dataset again (python -m datasets build).")
    if not isinstance(info, dict):
        return {}
    return {k: info[k] for k in ("seconds", "load_average") if is_number(info.get(k))}


def dataset_row(dataset_id: str) -> str:
    """A Minari dataset of any task; its normalised scores as a run on it would compute them ("–" without
    reference scores)."""
    data = load_dataset(dataset_id, build=False)
    returns = data.episode_returns()
    norm = data.task.normalize(returns)
    info = build_info(dataset_id)
    seconds = f"{info['seconds']:.0f}" if "seconds" in info else "?"
    if "load_average" in info:  # the machine's other work slows a build down
        seconds += f" (load {info['load_average']:.1f})"
    limit = data.task.time_limit
    cut = ~data.terminals & (data.lengths < limit) if limit else np.zeros(len(data.lengths), bool)
    normalised = "–" if norm is None else f"{norm.mean():.1f} ({norm.min():.1f} – {norm.max():.1f})"
    if norm is not None and cut.any() and not cut.all():  # episodes a step budget cut short pull the mean down
        normalised += f"; {norm[~cut].mean():.1f} without the {cut.sum()} cut short"
    return (
        f"| {dataset_id} | {len(data.lengths)} | {len(data.rewards)} | {returns.mean():.1f} ± {returns.std():.1f} | "
        f"{returns.min():.1f} | {returns.max():.1f} | {normalised} | {seconds} |"
    )


def policy_cell(task: Task, path: Path, episodes: int, promoted: dict | None) -> str:
    """A fresh ``episodes``-episode measurement of one exported policy (and the one that promoted it)."""
    actor, meta = GaussianActor.load(path)
    r = evaluate_actor(actor, task, episodes, seed=12345)
    s = task.normalize(r)
    cell = f"step {meta['step']}: return {r.mean():.0f} ± {r.std():.0f}, **normalised {s.mean():.1f} ± {s.std():.1f}**"
    if promoted:  # the measurement that made it the expert (other seeds)
        m = promoted.get("measured")
        on = f"{m[0]:.1f} ± {m[1]:.1f} over {m[2]} other episodes" if m else ""
        if promoted.get("below_target"):
            cell += f" (the best export of a run that ended below the target{'; chosen on ' + on if on else ''})"
        else:
            cell += f" (promoted on {on})"
    return cell


def policy_row(task: Task, episodes: int) -> str | None:
    """The learner's history, and medium and each expert version measured over ``episodes`` episodes."""
    folder = POLICY_DIR / task.name
    if not (folder / "learner.json").exists():
        return None
    learner = json.loads((folder / "learner.json").read_text())
    cells = [
        policy_cell(task, folder / "medium.pt", episodes, None)
        if (folder / "medium.pt").exists()
        else "not reached yet"
    ]
    for version in range(EXPERT_VERSION + 1):
        path, target = folder / expert_file(version), EXPERT_TARGETS[version][task.name]
        if path.exists():
            cells.append(policy_cell(task, path, episodes, learner["experts"].get(str(version))))
        elif version == EXPERT_VERSION and learner["best_step"] is not None:
            cells.append(
                f"not yet (best so far: step {learner['best_step']}, {learner['best_score']:.1f} over "
                f"{learner.get('best_episodes') or 10} episodes; an export becomes the expert once it measures "
                f"≥ {target:g} over {EXPERT_EPISODES} episodes)"
            )
        else:
            cells.append("not in this checkout" if version < EXPERT_VERSION else "not reached yet")
    last = learner["evals"][-1] if learner["evals"] else {"step": 0, "normalized": float("nan")}
    return (
        f"| {task.name} | {learner['algo']} | {last['step']} ({last['normalized']:.1f}) | "
        f"{learner['cpu_seconds'] / 3600:.2f} | {' | '.join(cells)} |"
    )


def learner_curves(path: Path) -> bool:
    """Each learner's 10-episode evaluations against its step, with the expert targets; a 256-colour
    PNG (small enough to commit). False when no learner has a history."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image

    learners = {
        t: json.loads((POLICY_DIR / t / "learner.json").read_text())
        for t in TASKS
        if (POLICY_DIR / t / "learner.json").exists()
    }
    if not learners:
        return False
    fig, axes = plt.subplots(1, len(learners), figsize=(4 * len(learners), 3.2), squeeze=False)
    for ax, (name, learner) in zip(axes[0], learners.items()):
        steps = [e["step"] for e in learner["evals"]]
        ax.plot(steps, [e["normalized"] for e in learner["evals"]], lw=1, label="10-episode evaluation")
        for version, targets in EXPERT_TARGETS.items():
            ax.axhline(targets[name], ls="--", lw=0.8, color=f"C{version + 1}", label=f"expert-v{version} target")
        for version, promoted in learner["experts"].items():
            if promoted.get("measured"):
                ax.plot(
                    promoted["step"],
                    promoted["measured"][0],
                    "o",
                    color=f"C{int(version) + 1}",
                    label=f"expert-v{version}, 100 episodes",
                )
        ax.set(
            title=f"{name} ({learner['algo']}, {learner['cpu_seconds'] / 3600:.1f} CPU h)",
            xlabel="learner step",
            ylabel="normalised return",
        )
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, dpi=90)
    plt.close(fig)
    png = io.BytesIO()
    Image.open(buf).convert("RGB").quantize(256).save(png, format="png", optimize=True)
    write_file(path, png.getvalue(), "The learners' figure")
    return True


NOTES = "<!-- notes: written by hand, kept as they are by `python -m datasets stats` -->"
BESIDE = "## Beside D4RL v2"


def section(text: str, heading: str) -> list[str]:
    """The lines of ``text`` under ``heading`` up to the next heading."""
    lines = text.splitlines()
    start = lines.index(heading) + 1 if heading in lines else len(lines)
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("#")), len(lines))
    return lines[start:end]


def stats(out: Path, episodes: int = 100, datasets: list[str] = ()) -> str:
    """The built suite datasets and ``datasets`` (Minari ids of any task), the behaviour policies and
    their learners' curves; the notes of an existing page (from ``NOTES`` on), and its rows of suite datasets
    not built on this machine, are kept."""
    curves = check_target(out.with_name(out.stem + "-learners.png"), "The learners' figure")
    old = page(check_target(out, "--out"))
    every = [suite_id(t, lvl, v) for t in TASKS for lvl in LEVELS for v in range(VERSIONS[lvl][t] + 1)]
    kept = {line.split(" | ")[0][2:]: line for line in old.splitlines() if line.startswith(f"| {SUITE_NAMESPACE}/")}
    listed = [d for d in every if is_built(d) or d in kept]
    given = [d for d in datasets if d.split("/")[0] != SUITE_NAMESPACE or is_built(d)]
    # a built suite dataset given again: one row; one not built here: its row as the page had it
    rows = [dataset_row(d) if is_built(d) or d not in kept else kept[d] for d in dict.fromkeys(listed + given)]
    kept_beside = {line.split(" | ")[0][2:]: line for line in section(old, BESIDE) if line.startswith("| ")}
    beside = [d4rl_row(d) if is_built(d) else kept_beside[d] for d in listed if is_built(d) or d in kept_beside]
    heading = next((line for line in old.splitlines() if line.startswith("## Behaviour policies (measured: ")), None)
    if episodes == 0 and heading:  # the policies' rows as the page has them, measured before
        episodes = int(re.search(r"(\d+) episodes", heading).group(1))
        policies = [line for line in section(old, heading) if line.startswith("| ")][1:]
    else:
        policies = [r for r in (policy_row(TASKS[t], episodes) for t in TASKS) if r]
    experts = list(range(EXPERT_VERSION + 1))
    targets = "; ".join(f"expert-v{v} ≥ " + ", ".join(f"{t} {EXPERT_TARGETS[v][t]:g}" for t in TASKS) for v in experts)
    text = "\n".join(
        [
            "# The offline dataset suite",
            "",
            f"Datasets `{SUITE_NAMESPACE}/<env>/<level>-v<N>` built on this machine (`python -m datasets build`; a "
            f"suite "
            "dataset not built here keeps the row this page had, measured where it was built) and any "
            "given with `--datasets`; normalised scores use each dataset's reference returns (the D4RL ones for the "
            "suite; – for a task without any). The expert and medium-expert levels have one version per expert policy; "
            "`build` makes the newest unless given `--version`. A build's rollouts stop at its step budget, which cuts "
            "short the last episode of each of its parallel environments (64 in a 1M-step build; in medium-replay, the "
            "learner's restarts cut some): the normalised mean is also given without them. Regenerate this page with "
            "`python -m datasets stats`.",
            "",
            "## Built datasets",
            "",
            "| dataset | episodes | steps | return mean ± std | min | max | normalised mean (min – max) | build s "
            "(1-min load average) |",
            "|---|---|---|---|---|---|---|---|",
            *(rows or ["| (none built yet) | | | | | | | |"]),
            "",
            BESIDE,
            "",
            f"Normalised scores of the episodes (D4RL's reference returns), and the mean of the best episodes holding "
            f"{BEST_PERCENT} % of the steps: the data {BEST_PERCENT} %BC trains on (`--top-percent {BEST_PERCENT}`). "
            f"D4RL v2: {D4RL['about'].split('Source: ')[1]}",
            "",
            "| dataset | steps, episodes, normalised mean ± std, max | best 10 % of the steps: normalised mean | "
            "D4RL v2: steps, episodes, normalised mean ± std, max |",
            "|---|---|---|---|",
            *beside,
            "",
            f"## Behaviour policies (measured: {episodes} episodes of the stochastic policy that makes the data)",
            "",
            "| env | algorithm | learner step (last eval, normalised) | learner CPU hours | medium | "
            + " | ".join(f"expert-v{v}" for v in experts)
            + " |",
            "|---|---|---|---|---|" + "---|" * len(experts),
            *(policies or ["| (no learner has run yet) | | | | |" + " |" * len(experts)]),
            "",
            f"Targets (normalised mean over {EXPERT_EPISODES} episodes): {targets}; medium between 30 and 65.",
            "",
            *([f"![learning curves]({curves.name})", ""] if learner_curves(curves) else []),
            *([old[old.index(NOTES) :].rstrip(), ""] if NOTES in old else []),
        ]
    )
    write_file(out, text, "--out")
    return text


def page(out: Path) -> str:
    """The page ``stats`` rewrites, as it is (its notes and the rows of datasets not built here are kept): a
    regular UTF-8 file of at most 16 MiB, or nothing yet."""
    if not os.path.lexists(out):
        return ""
    data = read_bytes(out, "--out", 16 * 2**20)
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise UserError(f"--out {out} is not UTF-8 text: not a page this command wrote. Give another --out.") from None
