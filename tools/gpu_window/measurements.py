"""The measurements a GPU window reads and writes: the figures it plans with (``results/gpu-window-constants.json``,
each with its source), the committed measurement files under ``results/gpu-*/`` and the rules for reusing them.

Every file here is a benchmark's ``--json``: ``{"info": {"gpu", "date", ...}, "records": [...], ...}``, its records
carrying the training step's engine hash (``dt_primal.training.throughput.engine_hash``: the step's modules and
torch's version). A ranking of the step's variants (``variants.json``), a throughput (``throughput.json``, with the
train.py ``options`` it was measured with) and an evaluation profile (``evaluation.json``) are reused instead of
measured again when they were measured with the same engine on the same GPU (the rules of each below). Only the
standard library: the window's process imports no dt_primal.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONSTANTS = ROOT / "results" / "gpu-window-constants.json"


def constant(name: str) -> float:
    """One figure the window plans with, as measured (``CONSTANTS``)."""
    return json.loads(CONSTANTS.read_text())[name]["value"]


BUILD_S = constant("build_s")  # the longest the first datasets' builds may take on a GPU machine
BUILD_STEPS = constant("build_steps")  # the transitions of the build BUILD_S was measured with
LEAST_TRAINING = constant("least_training_s")  # the window's seconds no measurement may take
SETTLE_S = constant("settle_s")  # the longest the sweep's start waits for the builds
PROFILE_STEPS = int(constant("profile_steps"))  # the fewest steps of a profile's rollouts that may plan a sweep


def committed(
    name: str, engine: dict, any_gpu: bool = False, any_engine: bool = False, keep=lambda doc: True, **fields
) -> Path | None:
    """The newest ``results/gpu-*/NAME.json`` (by its folder's date, then its own ``measured_at``) measured
    with ``engine`` ({"engine", "gpu"}: the step's hash and this GPU's name), every record of it under that
    hash (under any, with ``any_engine``), on that GPU (on any, with ``any_gpu``), with the top-level
    ``fields`` given, that ``keep(doc)``."""
    docs = []
    for path in ROOT.glob(f"results/gpu-*/{name}.json"):
        try:
            docs.append((path, json.loads(path.read_text())))
        except (OSError, ValueError):
            continue
    for path, doc in sorted(docs, key=lambda pd: (pd[0].parent.name[-10:], measured_at(pd[1])), reverse=True):
        try:
            records = doc["records"]
            gpu = any_gpu or doc["info"]["gpu"] == engine.get("gpu")
            same = gpu and records and all(doc.get(k) == v for k, v in fields.items()) and keep(doc)
            hashed = any_engine or all(r.get("engine", doc.get("engine")) == engine.get("engine") for r in records)
            if same and hashed:
                return path
        except (KeyError, TypeError, AttributeError):
            continue
    return None


def measured_at(doc) -> str:
    """When a bench's ``--json`` was written ("YYYY-MM-DD HH:MM UTC"), "" where it does not say."""
    info = doc.get("info") if isinstance(doc, dict) else None
    date = info.get("date") if isinstance(info, dict) else None
    return date if isinstance(date, str) else ""


def fit_for_budgets(doc: dict) -> bool:
    """Whether an evaluation profile's fit (``bench/eval_overhead.py --json``) may plan a sweep: its rollouts timed
    their start-up apart, or ran ``PROFILE_STEPS`` steps or more (else they spread it over their steps)."""
    return all("start_s" in r or r.get("steps", 0) >= PROFILE_STEPS for r in doc["records"])


def committed_evaluation(engine: dict) -> Path | None:
    """The newest evaluation profile committed for this GPU (under any engine) that may plan a sweep."""
    return committed("evaluation", engine, any_engine=True, keep=fit_for_budgets)


def committed_fit(engine: dict, complete: bool) -> bool:
    """Whether what an evaluation costs with the captured acting forward pass is committed for this GPU, as a fit
    that may plan a sweep (``fit_for_budgets``); ``complete``: measured with its episodes' halves pipelined and in
    turn, and with the eager forward pass that evaluations beside training act with, its start-up and its forward
    pass's first steps timed apart."""
    try:
        records = json.loads(committed_evaluation(engine).read_text())["records"]
        apart = all("start_s" in r and "first_forward_s" in r for r in records)
        both = {r.get("forward") for r in records} >= {"captured", "eager"} and any(r.get("pipeline") for r in records)
        return any(r.get("forward") == "captured" for r in records) and (apart and both or not complete)
    except (AttributeError, OSError, ValueError, KeyError, TypeError):
        return False


CHECK = """import sys
from commands.sweep.budget import load_throughput
from dt_primal.cli import run_main
run_main(lambda: load_throughput(sys.argv[1]))"""


def read_measurements(path: Path) -> dict:
    """``--throughput``: checked by the sweep's own reader (``commands.sweep.budget.load_throughput``: a regular
    file of at most 16 MiB, JSON, with valid records) in a child process, as this one imports no dt_primal; its
    message and exit 2 when it is not such a file."""
    check = subprocess.run([sys.executable, "-c", CHECK, str(path)], cwd=ROOT, capture_output=True)
    if check.returncode:
        print(f"--throughput: {check.stderr.decode(errors='replace').strip()[-800:]}", file=sys.stderr)
        sys.exit(2)
    return json.loads(path.read_bytes())


def given_options(doc: dict) -> list[str]:
    """The train.py options a ``--throughput`` file (``read_measurements``) was measured with: as a window wrote
    them, else (an older file) --compile where it has compiled measurements."""
    if isinstance(doc.get("options"), list) and all(isinstance(o, str) for o in doc["options"]):
        return doc["options"]
    return ["--compile"] if any("compiled" in str(r.get("mode")) for r in doc["records"]) else []
