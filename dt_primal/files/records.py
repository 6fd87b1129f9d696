"""A run's records, written and read here alone: ``eval.json`` (its final evaluation, with its config and
provenance: ``evaluation.reports.run_record``) and ``evals.jsonl`` (its learning curve: one JSON object per
evaluation during training, a step and its reports). Read as files a user may be given: bounded
(``reading.read_json``, ``read_bytes``) and checked for the numbers the tables read."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from dt_primal.errors import UserError
from dt_primal.files.reading import MAX_RECORD, is_count, is_number, read_bytes, read_json
from dt_primal.files.writing import write_file

MAX_LINE = 2**20  # a line of evals.jsonl: one evaluation's reports, a few kB
MAX_SCORE = 1e9  # a target, return or score the tables read: MuJoCo's are under 1e5; means of them stay finite
UNKEPT = ("returns", "lengths")  # per-episode lists: in eval.json, not in every line of the curve


def write_record(path: Path, record: dict) -> None:
    """A run's ``eval.json``."""
    write_file(path, json.dumps(record, indent=1), "The run record")


def append_point(path: Path, step: int, reports: list[dict], seconds: float, overlapped: bool) -> None:
    """One evaluation during training, as a line of ``evals.jsonl``: its step, reports, seconds and whether it
    overlapped training (``--eval-overlap``)."""
    kept = [{k: v for k, v in r.items() if k not in UNKEPT} for r in reports]
    point = {"step": step, "reports": kept, "seconds": round(seconds, 3), "overlapped": overlapped}
    with open(path, "a") as f:
        f.write(json.dumps(point) + "\n")


def keep_curve(path: Path, last_step: int) -> None:
    """``evals.jsonl`` without the evaluations after ``last_step`` (those of a run continued from an older
    checkpoint), and without damaged lines."""
    kept = "".join(json.dumps(c) + "\n" for c in read_curve(path) if c["step"] <= last_step)
    write_file(path, kept, "The learning curve")


def _reports_ok(reports: object) -> bool:
    """A list of per-target reports (``evaluation.reports.report``), each with the numbers the tables read; or one
    report without a target (of a policy that ignores it, BC)."""
    in_range = lambda x: is_number(x) and abs(x) <= MAX_SCORE
    return (
        isinstance(reports, list)
        and bool(reports)
        and all(
            isinstance(r, dict)
            and (in_range(r.get("target")) or (r.get("target") is None and len(reports) == 1))
            and is_count(r.get("episodes", 0))
            and (
                in_range(r.get("normalized_mean"))
                or (r.get("normalized_mean") is None and in_range(r.get("return_mean")))
            )
            for r in reports
        )
    )


def evaluated_alike(reports: list[dict]) -> tuple:
    """What must agree between the seeds of one row, and between a run's evaluations: the targets, in order,
    and whether the scores are normalised or returns (``evaluation.reports.score``)."""
    return tuple((r["target"], r.get("normalized_mean") is None) for r in reports)


def read_record(path, reports: bool = True, made: bool = False) -> dict:
    """A finished run's ``eval.json``, a JSON object checked for what the tables read: its step and its
    reports, each number finite and at most ``MAX_SCORE`` (``reports`` False: only that it is an object, for its
    config); ``made``: also its config and how it was made (``provenance``: commit, device, versions, date)."""
    record = read_json(
        path,
        "The run record",
        "Restore it from the run's folder or from git, or evaluate its checkpoint again.",
    )
    if not (
        isinstance(record, dict)
        and (not reports or is_count(record.get("step")) and _reports_ok(record.get("targets")))
    ):
        raise UserError(
            f"The run record {path} lacks a step count or per-target reports with numbers (as train.py "
            f"writes them in eval.json); it is damaged. Restore it, or evaluate its checkpoint again."
        )
    if made and not _made_ok(record):
        raise UserError(
            f"The run record {path} does not say how it was made (its config, and a provenance with the commit, "
            f"device, library versions and date, as train.py writes them); a table cannot cite it. Restore it."
        )
    return record


def _made_ok(record: dict) -> bool:
    prov = record.get("provenance")
    return (
        isinstance(record.get("config"), dict)
        and isinstance(prov, dict)
        and all(isinstance(prov.get(k), str) for k in ("device", "date"))
        and (prov.get("commit") is None or isinstance(prov.get("commit"), str))
        and isinstance(prov.get("versions"), dict)
        and isinstance(prov["versions"].get("torch"), str)
    )


def read_curve(path) -> list[dict]:
    """The evaluations of a run's ``evals.jsonl`` (one JSON object per line: a step and its reports); a line
    that is not one (such as the last line of a run killed while writing it) is left out, and said."""
    if not os.path.exists(path):
        return []
    curve, damaged = [], 0
    for line in read_bytes(path, "The learning curve", 4 * MAX_RECORD).decode(errors="replace").splitlines():
        try:
            point = json.loads(line) if len(line) <= MAX_LINE else None
        except (ValueError, RecursionError):
            point = None
        if isinstance(point, dict) and is_count(point.get("step")) and _reports_ok(point.get("reports")):
            curve.append(point)
        else:
            damaged += bool(line.strip())
    if damaged:
        print(
            f"note: {path}: left out {damaged} damaged line{'s' * (damaged > 1)} (a run killed while writing "
            f"one, or an edited file)",
            file=sys.stderr,
        )
    return curve
