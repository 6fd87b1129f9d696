"""What the benchmarks share: machine description, timing, a Hopper-shaped dataset, the library's
training step, and writing one section of docs/benchmarks.md.

Import this module before torch: it makes the commands' process-wide settings
(``dt_primal.process.configure_process``: ``OMP_WAIT_POLICY=PASSIVE`` unless the environment
already sets it, as experiments/peers.py does, and glibc's malloc keeping freed blocks), so dt-primal and
the peers are timed under the same OpenMP policy. On a shared 2-core machine OpenMP's default spin-waiting makes a
2-thread step several times slower whenever another process holds a core (see docs/benchmarks.md, "Profile").
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from dt_primal.evaluation.reports import table as md_table  # noqa: E402,F401 (the library's Markdown tables)
from dt_primal.process import configure_process  # noqa: E402

# as the commands do, before torch loads; DT_PRIMAL_BENCH_OMP=unset leaves OpenMP's default, for comparison
configure_process(wait_policy=None if os.environ.get("DT_PRIMAL_BENCH_OMP") == "unset" else "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from dt_primal.provenance import cpu_info  # noqa: E402

DOC = ROOT / "docs" / "benchmarks.md"
QUICK_DOC = Path(tempfile.gettempdir()) / "dt-primal-benchmarks-quick.md"  # --quick smoke runs never overwrite DOC
SCRATCH = (
    Path(tempfile.gettempdir()) / "dt-primal-bench"
)  # generated data, runs and raw results, outside the repository
DOC_HEADER = "# Benchmarks\n"  # a new docs/benchmarks.md; its introduction and list of commands are written by hand


# ----------------------------------------------------------------------------- machine


def cpu_model() -> str:
    """The CPU's model name (the one ``provenance`` records), with the vector units bf16 speed depends on."""
    extras = [f for f in ("avx512f", "avx512_bf16", "amx_bf16") if f in cpu_info("flags").split()]
    return cpu_info() + (f" ({', '.join(extras)})" if extras else "")


def machine() -> dict:
    import gymnasium

    return {
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "gymnasium": gymnasium.__version__,
        "python": platform.python_version(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "unset"),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def load_avg() -> float:
    return os.getloadavg()[0]


def add_json_options(p, what: str = "the measurements") -> None:
    """A benchmark's ``--json`` (also write ``what`` to this file) and ``--from-json`` (write its section from
    such a file, e.g. a GPU machine's, instead of measuring)."""
    p.add_argument("--json", type=Path, default=None, help=f"also write {what} to this file")
    p.add_argument(
        "--from-json", type=Path, default=None, help="write the section from this --json file (a GPU machine's)"
    )


def command_line() -> str:
    """This benchmark's command as typed in the checkout: ``python -m bench.NAME`` and its arguments."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    run = ["-m", spec.name] if spec else [os.path.relpath(sys.argv[0], ROOT)]
    return "python " + " ".join(shlex.quote(a) for a in run + sys.argv[1:])


# ------------------------------------------------------------------------------ timing


def seconds(fn, calls: int = 1) -> float:
    """Wall seconds of ``calls`` calls of ``fn`` (a warm-up, say: compilation and first allocations)."""
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return time.perf_counter() - t0


def timed(fn, repeats: int, warmup: int = 1) -> dict:
    """``seconds`` and ``cpu_seconds``, the median wall and process CPU seconds (all threads) of ``repeats``
    calls of ``fn`` after ``warmup`` untimed ones, and ``times``, all wall times. On a shared machine the CPU
    time is disturbed much less by other jobs than the wall time."""
    for _ in range(warmup):
        fn()
    walls, cpus = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return {"seconds": statistics.median(walls), "cpu_seconds": statistics.median(cpus), "times": walls}


def loglog_slope(x, y) -> float:
    """Least-squares slope of log y against log x (1: linear, 2: quadratic)."""
    return float(np.polyfit(np.log(np.asarray(x, float)), np.log(np.asarray(y, float)), 1)[0])


# ------------------------------------------------------------------------------- data


def hopper_hdf5(path: str | Path, steps: int = 100_000, seed: int = 0) -> Path:
    """A D4RL-style hdf5 file of Hopper-shaped random data (``datasets.synthetic.hopper_episodes``: obs 11,
    act 3, rewards in [0, 4), episodes of 50..1000 steps). Written once; an existing file is reused."""
    from datasets.synthetic import hopper_episodes, write_d4rl
    from dt_primal.files.writing import write_file

    path = Path(path)
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    write_file(path, lambda f: write_d4rl(f, hopper_episodes(steps, seed)), "The benchmark's dataset")
    return path


# ----------------------------------------------------------------------- training step


def short_run_args(steps: int, eval_episodes: int, precision: str, device: str = "cpu") -> list[str]:
    """train.py options of a short measured run on Hopper data: ``steps`` training steps, no
    intermediate evaluation, one checkpoint, then the final evaluation."""
    return [
        "--env",
        "hopper",
        "--device",
        device,
        "--precision",
        precision,
        "--steps",
        str(steps),
        "--eval-every",
        str(steps),
        "--checkpoint-every",
        str(steps),
        "--log-every",
        str(max(1, min(100, steps // 3))),
        "--eval-episodes",
        str(eval_episodes),
    ]


def run_timed(cmd: list[str]) -> tuple[float, float]:
    """Run ``cmd`` from the repository root: (wall seconds, CPU seconds of it and its children).
    Exits with the end of its output if it fails."""
    print(" ".join(cmd), flush=True)
    cpu0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall, cpu1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd[1:3])} failed (exit {proc.returncode}):\n{proc.stdout[-1500:]}\n{proc.stderr[-1500:]}")
    return wall, (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)


def training_rate(out: Path) -> float:
    """A train.py run's training steps/s: the mean of its perf/steps_per_s TensorBoard scalars,
    weighted by the steps of each logging window."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(out), size_guidance={"scalars": 0})
    acc.Reload()
    events = acc.Scalars("perf/steps_per_s")
    steps = np.diff([0] + [e.step for e in events])
    return float(steps.sum() / sum(n / e.value for n, e in zip(steps, events)))


def task_with(task, **make_kwargs):
    """A copy of an envs.Task whose environments get extra ``gym.make`` arguments, e.g.
    ``terminate_when_unhealthy=False`` (episodes run to the time limit) or ``max_episode_steps``."""
    import dataclasses

    import gymnasium as gym

    from envs import Task

    @dataclasses.dataclass(frozen=True)
    class _Task(Task):
        def make(self, **kwargs):
            return gym.make(self.gym_id, **make_kwargs, **kwargs)

    return _Task(**dataclasses.asdict(task))


# ------------------------------------------------------------------------------- report


def run_info() -> dict:
    """Machine, versions, date, load and command of this run (stored with raw results)."""
    return machine() | {"load": load_avg(), "command": command_line()}


RESULTS_DIR = SCRATCH  # raw results of the last full run of each benchmark (for --replot)


def shown(cmd: list[str]) -> str:
    """``cmd`` as the docs show it: ``python`` for this interpreter, ``$TMPDIR`` for the temporary folder."""
    return " ".join("python" if a == sys.executable else a for a in cmd).replace(tempfile.gettempdir(), "$TMPDIR")


def save_results(name: str, payload: dict) -> dict:
    """Store ``payload`` (+ run_info() as "info") for ``--replot``; returns it."""
    payload = payload | {"info": payload.get("info") or run_info()}
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / f"{name}.json").write_text(json.dumps(payload, indent=1, default=str))
    return payload


def load_results(name: str) -> dict:
    path = RESULTS_DIR / f"{name}.json"
    if not path.exists():
        sys.exit(f"--replot: {path} does not exist; run the benchmark without --replot first.")
    return json.loads(path.read_text())


def device_key(key: str, device: str) -> str:
    """The section key of a measurement on ``device``: ``key`` on a CPU, ``key_cuda`` (``key_cuda1``, ...) else."""
    return key if device == "cpu" else key + "_" + device.replace(":", "")


def gpu_suffix(info: dict) -> str:
    """``_h100``, ``_h200``, ...: a section key's suffix for the GPU a measurement ran on ("" without one)."""
    gpu = info.get("gpu")
    return "_" + gpu.lower().replace("nvidia ", "").split()[0] if gpu else ""


def write_measured_section(name: str, title: str, body: str, quick: bool, doc: dict) -> None:
    """``write_section`` of a measurement ``doc`` ({"device", "info"}), keyed and titled by its GPU's name
    (``gpu_suffix``), or by its device where it ran on none (``device_key``)."""
    suffix = gpu_suffix(doc["info"])
    key = name + suffix if suffix else device_key(name, doc["device"])
    write_section(key, f"{title} ({doc['info'].get('gpu') or doc['device']})", body, quick, doc["info"])


def write_section(
    key: str, title: str, body: str, quick: bool, info: dict | None = None, device: str | None = None
) -> None:
    """Replace (or append) the section ``key`` of docs/benchmarks.md (of QUICK_DOC for a ``quick``
    smoke run) and print ``body``. ``info``: run_info() of the measurement when it was taken
    earlier (default: now). ``device``: the section is that device's (``device_key``), named in the title."""
    if device:
        key, title = device_key(key, device), f"{title} ({device})"
    m = info or run_info()
    gpu = f"{m['gpu']} · " if m.get("gpu") else ""
    head = (
        f"## {title}\n\n"
        f"*{m['date']}* · {gpu}{m['cpu']}, {m['cores']} cores, {m['torch_threads']} torch threads · "
        f"torch {m['torch']}, gymnasium {m['gymnasium']}, Python {m['python']} · "
        f"OMP_WAIT_POLICY={m['omp_wait_policy']} · 1-min load average at the end: {m['load']:.2f}\n\n"
        f"```\n{m['command']}\n```\n\n"
    )
    section = f"<!-- BEGIN {key} -->\n{head}{body.strip()}\n<!-- END {key} -->"
    doc = QUICK_DOC if quick else DOC
    doc.parent.mkdir(parents=True, exist_ok=True)
    text = doc.read_text() if doc.exists() else DOC_HEADER
    pattern = re.compile(rf"<!-- BEGIN {re.escape(key)} -->.*?<!-- END {re.escape(key)} -->", re.S)
    text = pattern.sub(lambda _: section, text) if pattern.search(text) else text.rstrip() + "\n\n" + section + "\n"
    doc.write_text(text)
    print(body)
