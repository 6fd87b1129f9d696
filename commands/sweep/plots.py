"""A sweep's rows as pictures: results.png (a bar per row and dataset), curves.png (learning curves) and
intervals.png (95 % bootstrap intervals: per dataset, aggregates, probability of improvement, performance
profiles)."""

from __future__ import annotations

import io
from itertools import combinations
from pathlib import Path

import numpy as np

from commands.sweep.results import curve_points
from commands.sweep.tables import comparable, seed_scores, short
from dt_primal.evaluation import intervals as iv
from dt_primal.files.run_folder import group_dir, seed_folder
from dt_primal.files.writing import write_file


def save_figure(fig, path: Path, dpi: int) -> None:
    """``fig`` as a PNG at ``path``, written beside it and renamed (``write_file``: never through a link)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    write_file(path, buf.getvalue(), "The figure")


def y_label(rows: list[dict]) -> str:
    """What ``rows``' scores are: normalised scores, returns (tasks without reference scores), or both."""
    units = {r.get("unit", "normalised") for r in rows}
    return {frozenset({"normalised"}): "normalised score", frozenset({"return"}): "return"}.get(
        frozenset(units), "normalised score (return where a task has no reference scores)"
    )


def plot_bars(rows: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    labels = list(dict.fromkeys(r["label"] for r in rows))
    n_t = max(len(r["targets"]) for r in rows)
    fig, axes = plt.subplots(
        n_t, 1, figsize=(max(6, 1.6 * len(datasets) * max(1, len(labels) / 2)), 4 * n_t), sharey=True, squeeze=False
    )  # one panel per target
    width = 0.8 / len(labels)
    for ti, ax in enumerate(axes[:, 0]):
        for li, lab in enumerate(labels):
            got = {r["dataset"]: r["targets"][ti] for r in rows if r["label"] == lab and ti < len(r["targets"])}
            xs = [i + li * width for i, d in enumerate(datasets) if d in got]
            ax.bar(
                xs,
                [got[d]["mean"] for d in datasets if d in got],
                width,
                yerr=[got[d]["std"] for d in datasets if d in got],
                capsize=3,
                label=lab,
            )
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(datasets))])
        ax.set_xticklabels([short(d).replace("/", "\n") for d in datasets], fontsize=8)
        ax.set_title(["high target", "low target"][ti] if n_t == 2 else f"target {ti + 1}")
        ax.set_ylabel(f"{y_label(rows)} (last checkpoint)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, out / "results.png", 120)
    plt.close(fig)


def plot_curves(out: Path, rows: list[dict], plot_dir: Path | None = None) -> dict:
    """Normalised score (or return: ``y_label``) of the high target against steps for each of
    ``collect``'s rows: mean and min–max band over its finished seeds, into ``plot_dir`` (default
    ``out``)/curves.png. Returns how many seeds each drawn (dataset, row name) curve averages."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    cols = min(3, len(datasets))
    n_rows = -(-len(datasets) // cols)
    fig, axes = plt.subplots(n_rows, cols, figsize=(4.5 * cols, 3.5 * n_rows), squeeze=False)
    for ax in axes.flat[len(datasets) :]:
        ax.set_visible(False)
    drawn = {}
    for ax, d in zip(axes.flat, datasets):
        for row in (r for r in rows if r["dataset"] == d):
            gd = Path(row["dir"]) if "dir" in row else group_dir(out, d, row["model"])
            curves = [
                {p["step"]: p["scores"][0] for p in curve_points(seed_folder(gd, s))} for s in row["finished_seeds"]
            ]
            steps = sorted(set.intersection(*(set(c) for c in curves)))  # a row has at least one finished seed
            if not steps:
                continue
            y = np.array([[c[s] for s in steps] for c in curves])
            ax.plot(steps, y.mean(0), label=f"{row.get('label', row['model'])} ({len(curves)} seeds)")
            ax.fill_between(steps, y.min(0), y.max(0), alpha=0.2)
            drawn[d, row.get("name", row["model"])] = len(curves)
        ax.set_title(d, fontsize=9)
        ax.set_xlabel("training step")
        ax.set_ylabel(y_label([r for r in rows if r["dataset"] == d]))
        if ax.lines:
            ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, (plot_dir or out) / "curves.png", 120)
    plt.close(fig)
    return drawn


def plot_intervals(rows: list[dict], out: Path, name: str = "intervals.png") -> bool:
    """The high target's last-checkpoint scores with 95 % bootstrap intervals (``dt_primal.evaluation.intervals``):
    per dataset, the aggregates across the datasets every model has, the probability of improvement of
    every pair of models and the performance profiles. False (nothing drawn) when no dataset has every model."""
    labels, datasets = comparable(rows)
    if not datasets:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    row = {(r["dataset"], r["label"]): r for r in rows}
    scores = {lab: [seed_scores(row[d, lab], 0, "last") for d in datasets] for lab in labels}
    fig, ax = plt.subplots(1, 4, figsize=(20, max(3.5, 0.45 * len(datasets) * len(labels))), squeeze=True)
    colour = {lab: f"C{i}" for i, lab in enumerate(labels)}
    whisker = lambda e: [[e.value - (e.low if e.low is not None else e.value)], [(e.high or e.value) - e.value]]
    for i in range(len(datasets)):
        for j, lab in enumerate(labels):
            e = iv.interval(scores[lab][i])
            ax[0].errorbar(e.value, i + 0.8 * j / len(labels), xerr=whisker(e), fmt="o", color=colour[lab], capsize=3)
    ax[0].set_yticks(range(len(datasets)), [short(d) for d in datasets], fontsize=8)
    ax[0].set_title("per dataset: mean over seeds")
    for k, metric in enumerate(iv.AGGREGATES):
        for j, lab in enumerate(labels):
            e = iv.aggregates(scores[lab])[metric]
            ax[1].errorbar(e.value, k + 0.8 * j / len(labels), xerr=whisker(e), fmt="o", color=colour[lab], capsize=3)
    ax[1].set_yticks(range(len(iv.AGGREGATES)), list(iv.AGGREGATES))
    ax[1].set_title(f"across {len(datasets)} datasets")
    pairs = list(combinations(labels[::-1], 2))
    for k, (a, b) in enumerate(pairs):
        e = iv.probability_of_improvement(scores[a], scores[b])
        ax[2].errorbar(e.value, k, xerr=whisker(e), fmt="o", color="k", capsize=3)
    ax[2].axvline(0.5, color="grey", ls=":")
    ax[2].set_yticks(range(len(pairs)), [f"P({a}\n> {b})" for a, b in pairs], fontsize=8)
    ax[2].set_xlim(0, 1)
    ax[2].set_title("probability of improvement")
    taus = np.linspace(0, 120, 121)
    for lab in labels:
        ax[3].plot(taus, iv.performance_profile(scores[lab], taus), color=colour[lab], label=lab)
    ax[3].set_xlabel("normalised score τ")
    ax[3].set_ylabel("fraction of runs above τ")
    ax[3].set_title("performance profile")
    ax[3].legend(fontsize=8)
    for a in ax[:2]:
        a.set_xlabel("normalised score (high target, last checkpoint)")
    fig.tight_layout()
    save_figure(fig, out / name, 110)
    plt.close(fig)
    return True
