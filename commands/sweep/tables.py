"""A sweep's rows as tables: results.md and results.csv, with Primal.+DT's gap to each DT baseline in
standard errors."""

from __future__ import annotations

import csv
import io
from itertools import combinations
from pathlib import Path

import numpy as np

from commands.sweep.results import DT_MATCHED, DT_PAPER, LABEL_NOTES, LABELS
from dt_primal.evaluation import intervals as iv
from dt_primal.evaluation.reports import table, target_text
from dt_primal.files.writing import write_file


def short(dataset: str) -> str:
    """A dataset as tables and plots name it: task/level, without a first version's -v0."""
    return "/".join(dataset.split("/")[-2:]).removesuffix("-v0") if dataset.count("/") >= 2 else dataset


def cell(t: dict | None) -> str:
    """The mean over seeds with its 95 % bootstrap interval over them."""
    return "–" if t is None else iv.interval(t["seeds"]).text()


KINDS = (("last", "last checkpoint"), ("last3", "mean of last 3 evaluations"))


def seed_scores(row: dict, ti: int, kind: str) -> list[float] | None:
    """The seeds' scores of ``row`` at target ``ti``: at the last checkpoint (``kind`` "last") or each
    seed's mean of its last three evaluations ("last3")."""
    t = row["targets"][ti] if ti < len(row["targets"]) else None
    t = t if kind == "last" or t is None else t.get("last3")
    return None if t is None else t["seeds"]


def comparable(rows: list[dict]) -> tuple[list[str], list[str]]:
    """The row labels and the datasets of normalised scores that every label has (like with like)."""
    labels = list(dict.fromkeys(r["label"] for r in rows))
    norm = [r for r in rows if r.get("unit") != "return"]
    datasets = [
        d
        for d in dict.fromkeys(r["dataset"] for r in norm)
        if all(any(r["dataset"] == d and r["label"] == lab for r in norm) for lab in labels)
    ]
    return labels, datasets


def interval_sections(rows: list[dict]) -> str:
    """Markdown: across the datasets every label has, each label's IQM, mean, median and optimality gap,
    and the probability of improvement of every pair of labels, all with 95 % stratified-bootstrap
    intervals, per target, at the last checkpoint and for the mean of the last three evaluations."""
    labels, datasets = comparable(rows)
    if not datasets:
        return ""
    n_t = max(len(r["targets"]) for r in rows)
    which = lambda i: ["high", "low"][i] if n_t == 2 else f"{i + 1}"
    row = {(r["dataset"], r["label"]): r for r in rows}
    scores = lambda lab, ti, kind: [seed_scores(row[d, lab], ti, kind) for d in datasets]
    settings = [(ti, kind, name) for ti in range(n_t) for kind, name in KINDS]
    agg_lines, poi_lines = [], []
    for ti, kind, name in settings:
        for lab in labels:
            if all(x is not None for x in scores(lab, ti, kind)):
                est = iv.aggregates(scores(lab, ti, kind))
                agg_lines.append([lab, which(ti), name, *[f"**{est[k].text()}**" for k in iv.AGGREGATES]])
        for a, b in combinations(labels[::-1], 2):  # the later model over the earlier: Primal.+DT over DT
            xa, xb = scores(a, ti, kind), scores(b, ti, kind)
            if all(x is not None for x in xa + xb):
                poi_lines.append([f"P({a} > {b})", which(ti), name, iv.probability_of_improvement(xa, xb).text(2)])
    n = f"{len(datasets)} dataset{'s' * (len(datasets) != 1)}"
    md = (
        f"\nAcross the {n} every model has, all runs (95 % stratified-bootstrap intervals: each dataset's seeds "
        f"resampled within it; IQM: the mean of the middle half of all runs; mean and median: of the datasets' "
        f"means; optimality gap: how far runs fall short of {iv.GAMMA:g} on average, lower is better):\n\n"
    )
    md += table(["model", "target", "score", *iv.AGGREGATES], agg_lines) + "\n"
    if poi_lines:
        md += (
            "\nProbability of improvement: the chance that a run of the first model scores above a run of the "
            "second on a dataset (ties count half), averaged over the datasets, with its 95 % interval; 0.5 is "
            "no difference:\n\n" + table(["", "target", "score", "P"], poi_lines) + "\n"
        )
    return md


def gap_rows(rows: list[dict], a: str, b: str) -> list[dict]:
    """Per dataset where rows labelled ``a`` and ``b`` both exist, per target: a − b at the last
    checkpoint and for the mean of the last three evaluations, with the standard error of that
    difference from the seed spread, sqrt(s_a²/n_a + s_b²/n_b) (s: std with ddof 1), and the gap in
    units of it."""
    out = []
    for d in dict.fromkeys(r["dataset"] for r in rows):
        ra = next((r for r in rows if r["dataset"] == d and r["label"] == a), None)
        rb = next((r for r in rows if r["dataset"] == d and r["label"] == b), None)
        if ra is None or rb is None:
            continue
        for ta, tb in zip(ra["targets"], rb["targets"]):
            entry = {"dataset": d, "target": ta["target"]}
            for key, xa, xb in (("last", ta, tb), ("last3", ta.get("last3"), tb.get("last3"))):
                if xa is None or xb is None:
                    continue
                sa, sb = np.array(xa["seeds"]), np.array(xb["seeds"])
                var = (sa.var(ddof=1) / len(sa) if len(sa) > 1 else np.nan) + (
                    sb.var(ddof=1) / len(sb) if len(sb) > 1 else np.nan
                )
                gap, se = float(sa.mean() - sb.mean()), float(np.sqrt(var))
                entry[key] = {
                    "a": float(sa.mean()),
                    "b": float(sb.mean()),
                    "gap": gap,
                    "se": se,
                    "z": gap / se if se > 0 else float("nan"),
                    "n_a": len(sa),
                    "n_b": len(sb),
                }
            out.append(entry)
    return out


def gap_table(gaps: list[dict], a: str, b: str) -> str:
    """Markdown of ``gap_rows``: per dataset and target, a − b and the gap in standard errors."""
    if not gaps:
        return ""

    def fmt(g):
        if g is None:
            return "–"
        if not np.isfinite(g["z"]):
            return (
                f"{g['gap']:+.1f} (no SE: {min(g['n_a'], g['n_b'])} seed{'s' if min(g['n_a'], g['n_b']) != 1 else ''})"
            )
        return f"{g['gap']:+.1f} (SE {g['se']:.1f}, {g['z']:+.1f} SE)"

    rows = [[short(g["dataset"]), target_text(g["target"]), fmt(g.get("last")), fmt(g.get("last3"))] for g in gaps]
    head = ["dataset", "target", f"{a} − {b}: last checkpoint", "mean of last 3 evaluations"]
    return table(head, rows) + (
        "\n\nGap: difference of the means over seeds. SE: its standard error from the seed "
        "spread, sqrt(s_a²/n_a + s_b²/n_b), s the std with ddof 1; with 3 seeds a side, "
        "|gap| > 2.8 SE is about a two-sided 5% Welch test.\n"
    )


def average_lines(rows: list[dict], labels: list[str], n_t: int) -> list[list]:
    """A table line per row label: its mean over the datasets where every label has a result (like with
    like), at the last checkpoint and for the mean of the last three evaluations."""
    common = [
        d
        for d in dict.fromkeys(r["dataset"] for r in rows)
        if all(any(r["dataset"] == d and r["label"] == lab for r in rows) for lab in labels)
    ]
    lines = []
    for lab in labels:
        mine = [r for r in rows if r["label"] == lab and r["dataset"] in common and r.get("unit") != "return"]
        if mine:
            at = lambda i, mine=mine: [r["targets"][i] for r in mine if i < len(r["targets"])]  # BC: one, no target
            avg = [f"**{np.mean([t['mean'] for t in at(i)]):.1f}**" if at(i) else "–" for i in range(n_t)]
            avg3 = [
                f"**{np.mean([t['last3']['mean'] for t in at(i)]):.1f}**"
                if at(i) and all("last3" in t for t in at(i))
                else "–"
                for i in range(n_t)
            ]
            datasets = f"{len(mine)} dataset{'s' if len(mine) != 1 else ''}"
            lines.append([f"**average ({datasets})**", mine[0]["name"], lab, "", "", *avg, *avg3])
    return lines


CSV_COLUMNS = (
    "dataset",
    "model",
    "label",
    "target",
    "normalized_mean",
    "normalized_std",
    "n_seeds",
    "steps",
    "episodes",
    "seed_scores",
    "last3_mean",
    "last3_std",
    "last3_seed_scores",
    "score",
)


def write_csv(rows: list[dict], path: Path) -> None:
    """One CSV line per (row, target): ``CSV_COLUMNS``."""
    as_text = lambda values: " ".join(f"{v:.3f}" for v in values)
    f = io.StringIO(newline="")  # written beside the file and renamed (write_file: never through a link)
    w = csv.writer(f)
    w.writerow(CSV_COLUMNS)
    for r in rows:
        for t in r["targets"]:
            l3 = t.get("last3") or {}
            w.writerow(
                [
                    r["dataset"],
                    r["name"],
                    r["label"],
                    t["target"],
                    f"{t['mean']:.3f}",
                    f"{t['std']:.3f}",
                    len(r["finished_seeds"]),
                    r["step"],
                    r["episodes"],
                    as_text(t["seeds"]),
                    f"{l3['mean']:.3f}" if l3 else "",
                    f"{l3['std']:.3f}" if l3 else "",
                    as_text(l3["seeds"]) if l3 else "",
                    "return" if r.get("unit") == "return" else "normalised",
                ]
            )
    write_file(path, f.getvalue(), "The table")


def write_tables(rows: list[dict], out: Path, name: str = "results") -> str:
    """``name``.md and ``name``.csv in ``out``: per (dataset, row) both targets' normalised scores at the
    last checkpoint and the mean of the last three evaluations, the average of each row label over the
    datasets where every label has a result, what each label means, and (when Primal.+DT and a DT are
    both there) Primal.+DT − DT in standard errors."""
    labels = list(dict.fromkeys(r["label"] for r in rows))
    n_t = max(len(r["targets"]) for r in rows)
    which = lambda i: ["high target", "low target"][i] if n_t == 2 else f"target {i + 1}"
    if all(t["target"] is None for r in rows for t in r["targets"]):
        which = lambda i: "no target"
    columns = lambda r: r["targets"] + [None] * (n_t - len(r["targets"]))
    head = (
        ["dataset", "model", "what it is", "seeds", "steps"]
        + [f"{which(i)}: last checkpoint" for i in range(n_t)]
        + [f"{which(i)}: mean of last 3 evaluations" for i in range(n_t)]
    )
    lines = [
        [
            r["dataset"] + (" (returns)" if r.get("unit") == "return" else ""),
            r["name"],
            r["label"],
            len(r["finished_seeds"]),
            r["step"],
            *[f"{cell(t)} ({target_text(t['target'])})" if t else "–" for t in columns(r)],
            *[cell(t.get("last3")) if t else "–" for t in columns(r)],
        ]
        for r in rows
    ]
    lines += average_lines(rows, labels, n_t)
    notes = [f"- **{lab}**: {LABEL_NOTES[lab]}." for lab in labels if lab in LABEL_NOTES]
    md = table(head, lines) + (
        "\n\nNormalised score of the **last checkpoint** of each run (not the best; the headline, as "
        "the paper reports it): the mean across seeds of the per-seed mean over the final evaluation "
        "episodes, with its 95 % bootstrap interval over the seeds (seeded: the same records give the same "
        "interval). Beside it, the same for each seed's **mean of its last three "
        "evaluations** (the final one and the two intermediate ones before it, which use fewer "
        "episodes): how much the last-checkpoint number owes to where training stopped.\n"
    )
    if any(r.get("unit") == "return" for r in rows):
        md += (
            "\nDatasets marked (returns) are on tasks without reference scores: their cells are returns, not "
            "normalised scores, and the averages leave them out.\n"
        )
    if notes:
        md += "\n" + "\n".join(notes) + "\n"
    md += interval_sections(rows)
    primal = LABELS["primal"]
    for dt in (DT_PAPER, DT_MATCHED):
        if primal in labels and dt in labels:
            md += f"\n{primal} − {dt}:\n\n" + gap_table(gap_rows(rows, primal, dt), primal, dt)
    write_file(out / f"{name}.md", md, "The table")
    write_csv(rows, out / f"{name}.csv")
    return md
