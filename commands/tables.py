"""``python -m commands.tables``: the tables of docs/results.md, made from the committed records under
``results/`` by the sweep's own aggregation (``commands.sweep.results.collect``), so that a figure and its
record cannot disagree. Each table sits between ``<!-- BEGIN generated: NAME -->`` and
``<!-- END generated: NAME -->`` in the document; the prose around them is written by hand.

  python -m commands.tables            # rewrite the generated parts of docs/results.md
  python -m commands.tables --check    # exit 1 if docs/results.md differs from what the records give

Table 4 comes from ``results/table4`` (the full protocol), from ``results/table4-cpu`` (the reduced one) and,
as clearly marked legacy sections under each, from every ``results/legacy/table4-full-*`` and ``table4-cpu-*``
folder: moving rows' records there (``git mv``) and regenerating is all it takes to replace them.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np

from commands.sweep.grid import TABLE4, TABLE4_VERSIONS
from commands.sweep.plots import plot_intervals
from commands.sweep.results import DT_MATCHED, LABELS, collect, label_of
from commands.sweep.tables import cell, comparable, gap_rows, gap_table, interval_sections, seed_scores, short
from datasets.suite import suite_id
from dt_primal.cli import command_parser, run_main
from dt_primal.config import ADDED_LATER, Config
from dt_primal.errors import UserError
from dt_primal.evaluation.intervals import Estimate
from dt_primal.evaluation.reports import pm, table
from dt_primal.files.reading import read_json
from dt_primal.files.records import read_record
from dt_primal.files.run_folder import DATASET_RECORD, RECORD, run_dir, seed_folder
from dt_primal.training.resume import recorded_dataset

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "results.md"
CURRENT = "results/table4-cpu"
FULL = "results/table4"  # the full protocol, on a GPU
FULL_LEGACY = "table4-full*"  # under LEGACY: full-protocol rows Table 4 no longer uses
LEGACY = "results/legacy"
PRIMAL = LABELS["primal"]

# the published scores compared with, and the comparisons beside Table 4: data, each file saying what it holds
PUBLISHED = json.loads((ROOT / "results" / "published.json").read_text())
PAPER = {k: (tuple(r["primal_dt"]), tuple(r["dt"])) for k, r in PUBLISHED["rows"].items()}  # (Primal.+DT, DT)
DT_OWN = {k: r["dt_own"] for k, r in PUBLISHED["rows"].items()}
PAPER_SEEDS, PAPER_GAIN = PUBLISHED["seeds"], PUBLISHED["gain"]
BASELINES = PUBLISHED["baselines"]["rows"]  # BC, 10 %BC and DT as the DT paper, CORL and the IQL paper report them
YARDSTICK = "results/yardstick"  # our BC (bc/) and 10 %BC (bc10/), full protocol
CONDITIONING = "results/conditioning"  # python -m commands.conditioning's records, one folder per dataset
SLACK = 5.0  # points a score may fall below the published range and still count as in it
COMPARISONS = json.loads((ROOT / "results" / "comparisons.json").read_text())["sections"]
ORDER = [
    f"{env}/{level}"
    for level in ("medium-expert", "medium", "medium-replay")
    for env in ("halfcheetah", "hopper", "walker2d")
]  # the paper's row order
# the first columns of every table of scores: which runs, then their normalised scores
SCORE_COLUMNS = (
    "dataset",
    "model",
    "seeds",
    "high target: last checkpoint",
    "low target: last checkpoint",
    "high / low: mean of last 3 evaluations",
)
MODEL_FIELDS = (
    "activation",
    "embed_init",
    "timestep_init",
)  # model choices whose defaults changed since the first records


def setting(config: dict, name: str):
    """A record's config value ``name``; for a field added later, the value every record without it had."""
    return config.get(name, ADDED_LATER.get(name))


def records(group: Path, seeds) -> list[dict]:
    return [read_record(seed_folder(group, s) / RECORD, made=True) for s in seeds]


def made_with(rows: list[dict]) -> str:
    """One paragraph on how ``rows``' records were made, read from their config and provenance."""
    recs = [r for row in rows for r in records(Path(row["dir"]), row["finished_seeds"])]

    def values(get):
        return ", ".join(sorted({str(get(r)) for r in recs}))

    cfg = lambda k: values(lambda r: setting(r["config"], k))
    prov = [r["provenance"] for r in recs]
    commits = sorted({p["commit"][:7] for p in prov})
    rebuilt = sum(bool(p.get("reconstructed")) for p in prov)
    configs = sum(p.get("reconstructed", {}).get("config", "").startswith("config reconstructed") for p in prov)
    text = (
        f"{len(recs)} runs · d_model {cfg('d_model')}, {cfg('n_layer')} layers, {cfg('n_head')} heads · "
        f"{cfg('steps')} steps (warm-up {cfg('warmup_steps')}), lr {cfg('lr')} · precision {cfg('precision')} · "
        f"MLP activation {cfg('activation')} · `--embed-init` {cfg('embed_init')} · `--timestep-init` "
        f"{cfg('timestep_init')} · final evaluation "
        f"{cfg('eval_episodes')} episodes per target · device: {values(lambda r: r['provenance']['device'])} · "
        f"torch {values(lambda r: r['provenance']['versions']['torch'])} · commit{'s' * (len(commits) > 1)} "
        f"{', '.join(commits)} · {values(lambda r: r['provenance']['date'][:10])}"
    )
    if rebuilt:
        text += (
            f". The provenance of {rebuilt} of these records (and the config of {configs}) was reconstructed "
            f"afterwards from the commands that made them and the git history: each record's "
            f"`provenance.reconstructed` says from what, and whether its commit is exact"
        )
    old = [
        f"{k} {cfg(k)} (now {getattr(Config(), k)})"
        for k in MODEL_FIELDS
        if {setting(r["config"], k) for r in recs} != {getattr(Config(), k)}
    ]
    if old:
        text += f". **Not the current model**: {', '.join(old)}"
    return text + ". " + data_builds(rows)


def data_builds(rows: list[dict]) -> str:
    """Whether each dataset's runs trained on one build of it (the hash their ``dataset.json`` records): a build
    is the same on one machine, not on every CPU (docs/suite.md), so runs made on different machines may not."""
    builds: dict[str, dict[str, list[str]]] = {}
    for row in rows:
        for s in row["finished_seeds"]:
            doc = recorded_dataset(seed_folder(Path(row["dir"]), s) / DATASET_RECORD)
            h = str(doc["hash"])[:8] if doc else "missing or damaged"
            builds.setdefault(short(row["dataset"]), {}).setdefault(h, []).append(f"{row['label']} seed {s}")
    mixed = {d: b for d, b in builds.items() if len(b) > 1}
    if not mixed:
        return "Each dataset's runs trained on one build of it (the hash in their `dataset.json`)."
    return "**Runs of one dataset trained on different builds of it** (a build is the same on one machine, not " + (
        "on every CPU: docs/suite.md): "
        + "; ".join(f"{d}: " + ", ".join(f"{h} ({', '.join(r)})" for h, r in b.items()) for d, b in mixed.items())
        + "."
    )


def vs_paper(ours: dict | None, paper: tuple[float, float]) -> str:
    """Ours − the paper at the high target, in standard errors of the two seed spreads."""
    if ours is None:
        return "missing"
    s = np.asarray(ours["seeds"])
    se = np.sqrt((s.var(ddof=1) / len(s) if len(s) > 1 else np.nan) + paper[1] ** 2 / PAPER_SEEDS)
    gap = s.mean() - paper[0]
    return f"{gap:+.1f} ({gap / se:+.1f} SE)" if np.isfinite(se) and se > 0 else f"{gap:+.1f} (no SE)"


def row_key(dataset: str) -> str:
    """A Table 4 row's name, ``env/level``, whatever the dataset's version."""
    return re.sub(r"-v[0-9]+$", "", short(dataset))


def held(folder: Path) -> list[str]:
    """The Table 4 datasets whose records ``folder`` holds, in whichever version it holds them."""
    keys = [row_key(d) for d in TABLE4]
    ids = [p.name.replace("_", "/") for p in folder.glob("dt-primal_*") if p.is_dir()]
    return sorted((d for d in ids if row_key(d) in keys), key=lambda d: keys.index(row_key(d)))


def seeds_needed(rows: list[dict], gap: float = PAPER_GAIN) -> tuple[float, int] | None:
    """(the standard error now, the seeds per dataset that would resolve ``gap``) for Primal.+DT − DT on the
    mean over the datasets both have, from the seed spread of the high target's last checkpoint: the
    difference's standard error with n seeds a side is sqrt(Σ_d (s_dt,d² + s_primal,d²) / n) / D (s: std
    with ddof 1), and a two-sided 5 % test finds ``gap`` 80 % of the time once gap ≥ 2.8 of it."""
    row = {(r["dataset"], r["model"]): r for r in rows if r.get("unit") != "return"}
    datasets = [d for d, m in row if m == "dt" and (d, "primal") in row]
    if not datasets:
        return None
    spread = [np.var(seed_scores(row[d, m], 0, "last"), ddof=1) for d in datasets for m in ("dt", "primal")]
    n_now = min(len(seed_scores(row[d, m], 0, "last")) for d in datasets for m in ("dt", "primal"))
    if n_now < 2:
        return None
    total = float(np.sum(spread)) / len(datasets) ** 2
    return float(np.sqrt(total / n_now)), int(np.ceil(total * (2.8 / gap) ** 2))


def resolution(rows: list[dict]) -> str:
    """What these seeds can resolve: the standard error of Primal.+DT − DT on the mean, and the seeds a
    +PAPER_GAIN gap would need."""
    got = seeds_needed(rows)
    if got is None:
        return ""
    se, n = got
    return (
        f"\nWhat these seeds can resolve: on the mean over these datasets (high target, last checkpoint), the "
        f"seed spread gives Primal.+DT − DT a standard error of {se:.1f} points, so an interval of about "
        f"±{1.96 * se:.1f}; the paper's claimed gain of +{PAPER_GAIN} on the mean would be found by a two-sided 5 % "
        f"test 80 % of the time with about **{n} seeds per dataset** at this spread (an ensemble of that many "
        f"members trains in one process: `--seeds`).\n"
    )


def table4(folder: Path, datasets: list[str] = TABLE4) -> str:
    """Table 4 from the records in ``folder`` of ``datasets`` (one per row): every dataset of the paper's table,
    both models, ours beside the paper's with the difference in standard errors; a row without records is
    named missing."""
    rows = collect(folder, datasets, ["dt", "primal"], [0, 1, 2])
    found = {(row_key(r["dataset"]), r["model"]): r for r in rows}
    names = {row_key(d): short(d) for d in datasets}
    if not rows:
        return f"No records in `{folder.relative_to(ROOT)}` yet: all {2 * len(names)} rows are missing.\n"
    head = [
        *SCORE_COLUMNS,
        "per seed (high)",
        "paper (its Table 4)",
        "ours − paper (high)",
        "DT paper's own",
    ]
    lines, missing = [], []
    for key in (k for k in ORDER if k in names):
        for model, label, paper in (("dt", DT_MATCHED, PAPER[key][1]), ("primal", PRIMAL, PAPER[key][0])):
            row = found.get((key, model))
            own = f"{DT_OWN[key]:.1f}" if model == "dt" else "–"
            if row is None:
                missing.append(f"{names.get(key, key)} {label}")
                lines.append([names.get(key, key), label, 0, *["missing"] * 4, pm(*paper), "missing", own])
                continue
            hi, lo = row["targets"][0], row["targets"][1]
            last3 = f"{cell(hi.get('last3'))} / {cell(lo.get('last3'))}"
            lines.append(
                [
                    f"{short(row['dataset'])} ({hi['target']:g} / {lo['target']:g})",
                    label,
                    len(row["finished_seeds"]),
                    cell(hi),
                    cell(lo),
                    last3,
                    ", ".join(f"{v:.1f}" for v in hi["seeds"]),
                    pm(*paper),
                    vs_paper(hi, paper),
                    own,
                ]
            )
    both = [k for k in ORDER if (k, "dt") in found and (k, "primal") in found]
    for model, label, i in (("dt", DT_MATCHED, 1), ("primal", PRIMAL, 0)):
        mine = [found[k, model] for k in both]
        if mine:
            avg = [f"**{np.mean([r['targets'][t]['mean'] for r in mine]):.1f}**" for t in (0, 1)]
            paper = f"{np.mean([PAPER[k][i][0] for k in both]):.1f}"
            own = f"{np.mean([DT_OWN[k] for k in both]):.1f}" if model == "dt" else "–"
            name = f"**average of {len(both)} dataset{'s' * (len(both) != 1)}**"
            lines.append([name, label, "", *avg, "", "", paper, "", own])
    md = table(head, lines) + "\n\n"
    present = f"All {2 * len(names)} rows are present."
    md += f"Missing (no record): {', '.join(missing)}.\n\n" if missing else f"{present}\n\n"
    md += f"Records: [`{folder.relative_to(ROOT)}/`](../{folder.relative_to(ROOT)}/). Made with: {made_with(rows)}\n"
    md += interval_sections(rows) + resolution(rows)
    if folder.parent.name != "legacy" and comparable(rows)[1]:  # drawn by main (draw_figures)
        md += f"\n![95 % intervals, {folder.name}]({folder.name}-intervals.png)\n"
    gaps = gap_rows(rows, PRIMAL, DT_MATCHED)
    if gaps:
        md += f"\n{PRIMAL} − {DT_MATCHED}, per dataset:\n\n" + gap_table(gaps, PRIMAL, DT_MATCHED)
    return md


def table4_sections(current: str = CURRENT, legacy: str = "table4-cpu*") -> str:
    """The Table 4 of ``current``, then each legacy one (``results/legacy/<legacy>``: rows made on earlier versions
    of the datasets or with earlier settings), each under its own heading."""
    md = table4(ROOT / current)
    for folder in sorted((ROOT / LEGACY).glob(legacy)):
        md += (
            f"\n### Legacy: `{folder.relative_to(ROOT)}`\n\nRows made before, kept as they were made; the table "
            f"above replaces them.\n\n" + table4(folder, held(folder))
        )
    return md


def compare(parts: list[tuple[str, list[str], str, str]], datasets: list[str], a: str, b: str) -> str:
    """Rows of several record folders side by side, (folder, models, label, name) each, and a − b in standard
    errors; a short table of the rows' settings under it."""
    rows = []
    for folder, models, label, name in parts:
        found = collect(ROOT / folder, datasets, models, [0, 1, 2])
        if not found:  # records moved (to results/legacy/) and results/comparisons.json still names their old folder
            raise UserError(
                f"{folder} holds no records of {', '.join(models)} on {', '.join(datasets)}: point "
                "results/comparisons.json at the folder that holds them."
            )
        rows += [dict(r, label=label or r["label"], name=name or r["name"]) for r in found]
    rows = [r for d in datasets for r in rows if r["dataset"] == d]
    head = [*SCORE_COLUMNS, "records"]
    lines = [
        [
            short(r["dataset"]),
            r["label"],
            len(r["finished_seeds"]),
            cell(r["targets"][0]),
            cell(r["targets"][1]),
            f"{cell(r['targets'][0].get('last3'))} / {cell(r['targets'][1].get('last3'))}",
            f"`{Path(r['dir']).relative_to(ROOT).parent.parent}`",
        ]
        for r in rows
    ]
    md = table(head, lines) + "\n" + interval_sections(rows) + "\n" + gap_table(gap_rows(rows, a, b), a, b)
    folders = list(dict.fromkeys(f for f, *_ in parts))
    return (
        md
        + "\n"
        + "\n".join(
            f"- `{f}`: {made_with([r for r in rows if Path(r['dir']).is_relative_to(ROOT / f)])}" for f in folders
        )
        + "\n"
    )


def ablation() -> str:
    """The KSVD ablation on halfcheetah medium-replay: scores, and J² and Λ from the committed TensorBoard logs."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    dataset = "dt-primal/halfcheetah/medium-replay-v0"
    lines = []
    for folder in [reference(), *(ROOT / "results/ablation" / name for name in ("eta0", "s64", "s96"))]:
        rows = collect(folder, [dataset], ["primal"], [0, 1, 2])
        if not rows:
            continue
        row, runs = rows[0], [seed_folder(Path(rows[0]["dir"]), s) for s in rows[0]["finished_seeds"]]
        cfg = records(Path(row["dir"]), row["finished_seeds"])[0]["config"]
        logs = [EventAccumulator(str(next(r.glob("events.out.tfevents.*")))).Reload() for r in runs]
        j2, lam = (
            np.mean([[log.Scalars(tag)[i].value for i in (-1, 0)] for log in logs], 0)
            for tag in ("ksvd/J_squared", "ksvd/lambda_mean/0")
        )
        lines.append(
            [
                f"η {cfg['eta']:g}, s {cfg['s']}",
                len(runs),
                cell(row["targets"][0]),
                cell(row["targets"][1]),
                ", ".join(f"{v:.1f}" for v in row["targets"][0]["seeds"]),
                f"{j2[0]:.1e} ({j2[1]:.1e})",
                f"{lam[0]:.2f} ({lam[1]:.2f})",
                f"`{folder.relative_to(ROOT)}`",
            ]
        )
    head = [
        "setting",
        "seeds",
        "target 12000",
        "target 6000",
        "per seed (12000)",
        "KSVD J² at the end (first logged)",
        "Λ mean at the end (start)",
        "records",
    ]
    return table(head, lines) + "\n"


def reference() -> Path:
    """The Table-4 records the ablation's runs differ from by η or s only: the current ones if they match, else
    the legacy one that does."""
    probe = run_dir(Path(), "dt-primal/halfcheetah/medium-replay-v0", "primal", 0) / RECORD
    abl = json.loads((ROOT / "results/ablation/eta0" / probe).read_text())["config"]
    keys = ("d_model", "steps", "activation", "embed_init", "timestep_init", "precision")
    same = lambda c: all(setting(c, k) == setting(abl, k) for k in keys)
    for folder in [ROOT / CURRENT, *sorted((ROOT / LEGACY).glob("table4-*"))]:
        if (folder / probe).exists() and same(json.loads((folder / probe).read_text())["config"]):
            return folder
    return ROOT / CURRENT


def published(values: list) -> tuple[str, float | None, float | None]:
    """A row of published scores ([DT paper, CORL as [mean, std], IQL paper], any of them null) as text, and the
    lowest and highest of them."""
    means = [v[0] if isinstance(v, list) else v for v in values]
    text = " / ".join("–" if v is None else pm(*v) if isinstance(v, list) else f"{v:.1f}" for v in values)
    known = [m for m in means if m is not None]
    return text, min(known, default=None), max(known, default=None)


def in_range(score: float | None, low: float | None, high: float | None) -> str:
    """Whether ``score`` lies in [low - SLACK, high + SLACK]: "in", "below" or "above"."""
    if score is None or low is None:
        return "–"
    return "below" if score < low - SLACK else "above" if score > high + SLACK else "in"


def verdict(bc10: str, dt: str) -> str:
    """What our 10 %BC and our DT against their published ranges say about a dataset's gap."""
    if "–" in (bc10, dt):
        return "–"
    if dt != "below":
        return "DT in range" if bc10 != "below" else "DT in range; the data's best part is weaker"
    return "the data (10 %BC short too)" if bc10 == "below" else "training (10 %BC in range, DT short): a defect"


def yardstick(datasets: list[str] = TABLE4) -> str:
    """BC and 10 %BC at the full protocol on ``datasets`` (Table 4 rows, at any versions) beside their published
    scores and our full-protocol DT and Primal.+DT on the same versions (high target), with a verdict per dataset:
    does the data or the training explain where DT falls short?"""
    mine = {name: collect(ROOT / YARDSTICK / name, datasets, ["bc"], [0, 1, 2]) for name in ("bc", "bc10")}
    if not any(mine.values()):
        return f"No records in `{YARDSTICK}` yet.\n"
    ours = {(r["dataset"], name): r for name, rows in mine.items() for r in rows}
    for folder in [ROOT / FULL, *sorted((ROOT / LEGACY).glob(FULL_LEGACY))]:
        ours |= {(r["dataset"], r["model"]): r for r in collect(folder, datasets, ["dt", "primal"], [0, 1, 2])}
    score = lambda dataset, name: ours[dataset, name]["targets"][0] if (dataset, name) in ours else None
    lines = []
    for dataset in sorted((d for d in datasets if row_key(d) in ORDER), key=lambda d: ORDER.index(row_key(d))):
        key = row_key(dataset)
        pub = BASELINES[key]
        bc_text, *_ = published(pub["bc"])
        bc10_text, lo10, hi10 = published(pub["bc10"])
        dt_text, lo_dt, hi_dt = published([*pub["dt"], PAPER[key][1][0]])
        mean = lambda t: None if t is None else t["mean"]
        bc10, dt = score(dataset, "bc10"), score(dataset, "dt")
        bc10_vs, dt_vs = in_range(mean(bc10), lo10, hi10), in_range(mean(dt), lo_dt, hi_dt)
        lines.append(
            [
                short(dataset),
                cell(score(dataset, "bc")),
                bc_text,
                cell(bc10),
                bc10_text,
                bc10_vs,
                cell(dt),
                cell(score(dataset, "primal")),
                dt_text,
                dt_vs,
                verdict(bc10_vs, dt_vs),
            ]
        )
    head = [
        "dataset",
        "BC (ours)",
        "BC: DT paper / CORL / IQL paper",
        "10 %BC (ours)",
        "10 %BC: DT paper / CORL / IQL paper",
        "10 %BC vs range",
        "DT (ours, high target)",
        "Primal.+DT (ours, high target)",
        "DT: DT paper / CORL / Primal.+DT paper",
        "DT vs range",
        "what explains DT's gap",
    ]
    return (
        table(head, lines)
        + f"\n\nOurs: normalised score of the last checkpoint, mean over seeds [95 % bootstrap interval]; DT and "
        f"Primal.+DT from the full protocol's records of the same version (`{FULL}`, or `{LEGACY}/table4-full-*` "
        f"for a version Table 4 no longer uses; missing where no GPU window has made the row yet). "
        f"In range: within the lowest and highest published score widened by {SLACK:g} points. Records: "
        f"[`{YARDSTICK}/`](../{YARDSTICK}/). Made with: {made_with(mine['bc'] + mine['bc10'])}\n"
    )


def earlier_versions() -> list[str]:
    """For each Table 4 dataset, every earlier version with yardstick records, oldest first (none where Table 4
    still uses the first)."""
    have = {d for name in ("bc", "bc10") for d in held(ROOT / YARDSTICK / name)}
    earlier = []
    for env, levels in TABLE4_VERSIONS.items():
        for level, version in levels.items():
            earlier += [d for d in (suite_id(env, level, v) for v in range(version)) if d in have]
    return earlier


def conditioning() -> str:
    """Per dataset and model, the conditioning curve's two numbers (docs/method.md, "Return conditioning") from
    the committed ``conditioning.json`` records, mean over seeds [95 % interval], and BC's score."""
    rows = [row for path in sorted((ROOT / CONDITIONING).glob("*/conditioning.json")) for row in _curve_rows(path)]
    head = ["dataset", "model", "seeds", "tracking gap", "beyond the best", "score (ignores the target)"]
    return table(head, rows) if rows else f"No records in `{CONDITIONING}` yet."


def _curve_rows(path: Path) -> list[list]:
    """One conditioning record's rows; a record swept without a dataset (``--targets`` alone) is named by its task."""
    remedy = "Make it again with python -m commands.conditioning."
    record = read_json(path, "The conditioning record", remedy)
    try:
        data = record["data"] or {}
        marks = ("best_normalized", "median_normalized")
        name = short(data["dataset"]) if data else record["task"]
        if all(isinstance(data.get(k), (int, float)) for k in marks):
            name += " (best episode {:.1f}, median {:.1f})".format(*(data[k] for k in marks))
        rows = []
        for m in record["models"]:
            numbers = m.get("summary")
            gap, beyond = (_estimate_text(numbers[k]) if numbers else "–" for k in ("tracking_gap", "beyond_best"))
            flat = "–" if numbers else _estimate_text(m["points"][0][m["scale"]])
            rows.append([name, label_of(m["model"], None, None), len(m["seeds"]), gap, beyond, flat])
        return rows
    except (KeyError, TypeError, IndexError, AttributeError, ValueError) as exc:
        raise UserError(f"{path} is not a conditioning record ({type(exc).__name__}: {exc}). {remedy}") from None


def _estimate_text(e: dict | None) -> str:
    """A record's {"mean", "interval"} as every table writes an estimate (``Estimate.text``)."""
    return "–" if e is None else Estimate(e["mean"], *(e["interval"] or (None, None))).text()


SECTIONS = {
    "yardstick": yardstick,
    "yardstick-earlier": lambda: yardstick(earlier_versions()),
    "conditioning": conditioning,
    "table4": table4_sections,
    "table4-full": lambda: table4_sections(FULL, FULL_LEGACY),
    "ablation": ablation,
    **{
        name: lambda c=c: compare([tuple(p) for p in c["parts"]], c["datasets"], *c["compare"])
        for name, c in COMPARISONS.items()
    },
}
BLOCK = re.compile(r"(<!-- BEGIN generated: (?P<name>[\w-]+) -->\n).*?(<!-- END generated: (?P=name) -->)", re.S)


def render(text: str) -> str:
    """``text`` (docs/results.md) with every generated block made again from the records."""
    return BLOCK.sub(lambda m: m.group(1) + SECTIONS[m.group("name")]().rstrip("\n") + "\n" + m.group(3), text)


def draw_figures() -> None:
    """The intervals figure of the current and the full-protocol Table 4 (``table4``'s links), into docs/."""
    for folder in (ROOT / CURRENT, ROOT / FULL):
        plot_intervals(collect(folder, TABLE4, ["dt", "primal"], [0, 1, 2]), DOC.parent, f"{folder.name}-intervals.png")


def main(argv: list[str] | None = None) -> None:
    p = command_parser(__doc__, prog="python -m commands.tables")
    p.add_argument("--check", action="store_true", help="only compare: exit 1 if docs/results.md is out of date")
    args = p.parse_args(argv)
    old = DOC.read_text()
    new = render(old)
    if args.check:
        if new != old:
            sys.exit("docs/results.md differs from what the records give: run python -m commands.tables")
        print("docs/results.md matches the records")
        return
    DOC.write_text(new)
    draw_figures()
    print(f"wrote {DOC.relative_to(ROOT)} and its figures")


if __name__ == "__main__":
    run_main(main)
