"""Evaluation reports: one target's episodes summarised, the aggregation across seeds or checkpoints,
how scores are printed and tabled, and a report written as JSON with its Markdown table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from dt_primal.errors import UserError
from dt_primal.files.writing import write_file
from dt_primal.model.architecture import conditions_on_return

if TYPE_CHECKING:  # reports are read and tabled without Gymnasium and MuJoCo
    from envs import Task


def report(task: Task, target: float | None, returns: np.ndarray, lengths: np.ndarray) -> dict:
    """One target's episodes (``target`` None: of a policy that ignores it): mean ± std of return and
    normalised score (None for a task without reference scores), and the raw values."""
    score = task.normalize(returns)
    return {
        "target": None if target is None else float(target),
        "return_mean": float(returns.mean()),
        "return_std": float(returns.std()),
        "normalized_mean": None if score is None else float(score.mean()),
        "normalized_std": None if score is None else float(score.std()),
        "episodes": len(returns),
        "returns": returns.tolist(),
        "lengths": lengths.tolist(),
    }


def run_record(
    checkpoint: str, step: int, task: str, dataset: str, config: dict, targets: list[dict], provenance: dict, **extra
) -> dict:
    """The one record of an evaluated checkpoint, as train.py writes it (``eval.json``) and evaluate.py
    reports it: what was evaluated (the checkpoint, its step, task, dataset, model and seed), the
    per-target ``report``s, how it was made (``provenance``) and the run's config; ``extra``: what the
    writer adds (train.py: the ensemble and the evaluation's seconds; evaluate.py: its precision)."""
    return {
        "checkpoint": checkpoint,
        "step": step,
        "task": task,
        "dataset": dataset,
        "model": config["model"],
        "seed": config["seed"],
        **extra,
        "targets": targets,
        "provenance": provenance,
        "config": config,
    }


def mean_std(values) -> dict:
    """The one aggregation across seeds (or checkpoints): mean ± std (ddof 0) of their values, and the values."""
    v = np.asarray(values, dtype=float)
    return {"mean": float(v.mean()), "std": float(v.std()), "seeds": v.tolist()}


def target_text(target: float | None) -> str:
    """A target as reports print it; "none" for a policy that ignores the target return (BC)."""
    return "none" if target is None else f"{target:g}"


def pm(mean: float, std: float) -> str:
    return f"{mean:.1f} ± {std:.1f}"


def table(head: list[str], rows: list[list]) -> str:
    """A Markdown table."""
    return "\n".join(
        ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        + ["| " + " | ".join(map(str, row)) + " |" for row in rows]
    )


def _d4rl_tasks() -> dict:
    from envs import TASKS

    return TASKS


def scoring(task: Task, targets: list[float] | None = None, model: str = "primal") -> str:
    """What a run conditions on and how it scores, said once at its start: the targets (``targets``,
    else the task's) and where they come from, or that the ``model`` ignores them; the normalised score's
    reference returns, or why there is no normalised score."""
    if not conditions_on_return(model):
        origin = None
    elif targets:
        origin = "--targets"
    elif task.name in _d4rl_tasks():
        origin = f"{task.name}'s defaults"
    else:
        origin = "from the dataset: its best episode return and the middle of its episode returns' range"
    lines = [
        f"{task.gym_id}: targets {', '.join(f'{t:g}' for t in targets or task.targets)} ({origin})"
        if origin
        else f"{task.gym_id}: no target ({model} ignores the target return: one evaluation per seed)"
    ]
    if task.ref_min is None:
        lines.append(
            f"normalised score: none ({task.gym_id} is not a D4RL task and its dataset's metadata gives no "
            f"ref_min_score/ref_max_score), so reports give returns and a normalised score of null (JSON) or "
            f"– (tables); give --ref-min and --ref-max to normalise"
        )
    else:
        lines.append(
            f"normalised score: 100 * (return - ref_min) / (ref_max - ref_min), reference returns ref_min "
            f"{task.ref_min:g} and ref_max {task.ref_max:g}"
        )
    return "\n".join(lines)


def normalized_text(r: dict) -> str:
    """A report's normalised score "mean ± std", or "–" without reference scores."""
    return "–" if r["normalized_mean"] is None else pm(r["normalized_mean"], r["normalized_std"])


def across_text(r: dict, key: str = "normalized") -> str:
    """An across-checkpoints mean with its 95 % interval, "mean [low, high]" (``aggregate``); "–" without
    reference scores."""
    from dt_primal.evaluation.intervals import Estimate

    if r[f"{key}_mean"] is None:
        return "–"
    return Estimate(r[f"{key}_mean"], *(r.get(f"{key}_interval") or (None, None))).text()


def score(report: dict) -> float:
    """A target's normalised score, or its mean return for a task without reference scores."""
    return report["return_mean"] if report["normalized_mean"] is None else report["normalized_mean"]


def headline(report: dict) -> str:
    """``score`` as a run prints it: "return ..." where it is a return."""
    return ("" if report["normalized_mean"] is not None else "return ") + f"{score(report):.1f}"


def aggregate(results: list[dict]) -> dict:
    """Per-checkpoint results plus, per target, the mean ± std (ddof 0) across the checkpoints (seeds) evaluated at
    it of each checkpoint's mean return and mean normalised score, with the 95 % bootstrap interval of
    each mean over the checkpoints (``dt_primal.evaluation.intervals``; None for one checkpoint)."""
    from dt_primal.evaluation.intervals import interval

    def bounds(values) -> list[float] | None:
        e = interval(values)
        return None if e.low is None else [e.low, e.high]

    targets = list(dict.fromkeys(r["target"] for res in results for r in res["targets"]))
    across = []
    for target in targets:  # over the checkpoints evaluated at it (BC's: at none)
        at = [r for res in results for r in res["targets"] if r["target"] == target]
        norm = [r["normalized_mean"] for r in at]
        norm = None if None in norm else mean_std(norm)
        ret = mean_std([r["return_mean"] for r in at])
        across.append(
            {
                "target": target,
                "return_mean": ret["mean"],
                "return_std": ret["std"],
                "return_interval": bounds(ret["seeds"]),
                "normalized_mean": None if norm is None else norm["mean"],
                "normalized_std": None if norm is None else norm["std"],
                "normalized_interval": None if norm is None else bounds(norm["seeds"]),
                "episodes": int(sum(r["episodes"] for r in at)),
                "checkpoints": len(at),
            }
        )
    return {"checkpoints": results, "across_checkpoints": across}


REPORT_COLUMNS = ["checkpoint", "target", "episodes", "return", "normalised score"]
REPORT_TABLE_HEAD = "| " + " | ".join(REPORT_COLUMNS) + " |"  # the first line of every report table


def markdown(summary: dict) -> str:
    """Markdown table of ``aggregate``'s output."""
    rows = [
        [
            res["checkpoint"],
            target_text(r["target"]),
            r["episodes"],
            pm(r["return_mean"], r["return_std"]),
            normalized_text(r),
        ]
        for res in summary["checkpoints"]
        for r in res["targets"]
    ]
    rows += [
        [
            f"**mean over {r['checkpoints']} checkpoints [95 % interval]**",
            target_text(r["target"]),
            r["episodes"],
            across_text(r, "return"),
            f"**{across_text(r)}**",
        ]
        for r in summary["across_checkpoints"]
    ]
    return (
        table(REPORT_COLUMNS, rows)
        + "\n\nWithin a checkpoint: mean ± std over episodes. Across checkpoints: the mean of the "
        "per-checkpoint means with its 95 % bootstrap interval over the checkpoints (seeds).\n"
    )


def write_report(results: list[dict], path: Path) -> dict:
    """JSON at ``path`` and the Markdown table beside it (same name, .md); returns the summary."""
    summary = aggregate(results)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_file(path, json.dumps(summary, indent=1), "The report")
        write_file(path.with_suffix(".md"), markdown(summary), "The report's table")
    except OSError as exc:
        raise UserError(
            f"Could not write the report {path} ({exc.strerror or exc}). Give an --out in a folder you can "
            f"write to, with free space, and run the command again."
        ) from None
    return summary
