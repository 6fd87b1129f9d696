"""The sweep's rollout clips (``--video``): per dataset and model, its best and its worst seed (by their final
normalised score, or return, at the first target) evaluated for one episode per target and filmed side by
side (``evaluate.py --video --side-by-side``: docs/policy.md, "Watching it")."""

from __future__ import annotations

from pathlib import Path

from dt_primal.cli.evaluate import evaluate_command
from dt_primal.files.run_folder import CHECKPOINT, dataset_slug, seed_folder


def best_and_worst(row: dict) -> list[int]:
    """The seeds of ``row`` (``results.collect``) with the highest and the lowest final score at its first
    target; one seed where only one finished."""
    scores = dict(zip(row["finished_seeds"], row["targets"][0]["seeds"]))
    ranked = sorted(scores, key=scores.get, reverse=True)
    return list(dict.fromkeys([ranked[0], ranked[-1]]))


def film(rows: list[dict], folder: Path) -> list[Path]:
    """Clips of every row's best and worst seed in ``folder``/DATASET_MODEL/; the folders written."""
    written = []
    for row in rows:
        seeds = best_and_worst(row)
        ckpts = [seed_folder(Path(row["dir"]), s) / CHECKPOINT for s in seeds]
        if not all(c.exists() for c in ckpts):
            continue  # the runs of another sweep folder (--baseline) or checkpoints deleted since
        dest = folder / f"{dataset_slug(row['dataset'])}_{row['name']}"
        side = ["--side-by-side"] if len(ckpts) > 1 else []
        evaluate_command(
            [*map(str, ckpts), "--episodes", "1", "--video", str(dest), *side, "--out", str(dest / "eval.json")]
        )
        written.append(dest)
    return written
