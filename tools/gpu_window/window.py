"""The phases of a GPU window (README.md): the datasets built in the background, the imports checked, the
step's variants ranked and measured (or the committed measurements read, ``measurements.py``), the budgeted sweep
of Table 4 started detached with the CUDA tests beside it, and the records, logs and measurements packed into OUT
every ``PACK_EVERY`` seconds. Each phase is a child process with a time limit; a failed phase is written down in
``window.json`` and the next one goes on with what passed. Only the standard library runs in this process.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .measurements import (
    BUILD_S,
    BUILD_STEPS,
    PROFILE_STEPS,
    ROOT,
    SETTLE_S,
    committed,
    committed_evaluation,
    committed_fit,
    given_options,
)

STATE = Path("runs/gpu-window")  # this machine's side, under ROOT: the measurements, logs, the window's end
SWEEP = Path("runs/table4")  # the sweep (relative: the records name no machine path)
RECORDED, MODELS, SEEDS = Path("results/table4"), ["dt", "primal"], [0, 1, 2]  # the runs of Table 4, committed
# Table 4's datasets in the sweep's priority order, those with a run neither committed nor in SWEEP
LEFT = f"""from pathlib import Path
from commands.sweep.grid import TABLE4_BY_GAIN, all_finished
left = [d for d in TABLE4_BY_GAIN if not all_finished(d, {MODELS}, {SEEDS}, Path('{SWEEP}'), Path('{RECORDED}'))]
print(' '.join(left))
"""
EVAL_EPISODES = ["60", "600", "1800"]  # a 3-member group's intermediate and final evaluations, a 9-member one's final
MEMBERS = [3, 6, 9]  # member counts measured (a group is a task's datasets x 3 seeds): far from linear in them
DT_MEMBERS = [3, 9]  # the DT model's own step (the sweep's budget takes Primal.+DT's rate where DT's is missing)
# the captured step's, acting's and the evaluations beside training's CUDA tests
CUDA_TESTS = [
    "tests/dt_primal/training/test_ensemble.py",
    "tests/dt_primal/evaluation/test_policy.py",
    "tests/dt_primal/training/test_train.py",
]
PACK_EVERY = 20.0
MARGIN = 25.0  # seconds before the window's end when training stops: the runs' checkpoints, the last pack
ENGINE = """import json, torch
from dt_primal.training.throughput import engine_hash
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
print(json.dumps({"engine": engine_hash(), "gpu": gpu}))"""
IMPORTS = "torch numpy gymnasium mujoco minari h5py tqdm tensorboard matplotlib pytest".split()
PROBE = f"""import importlib, json
versions = {{}}
for name in {IMPORTS!r}:
    try:
        versions[name] = getattr(importlib.import_module(name), "__version__", "?")
    except Exception as exc:
        versions[name] = "missing: " + type(exc).__name__
print(json.dumps(versions))"""


class Window:
    """The account of the window: phases with their seconds, the measurements and the notes, as JSON."""

    def __init__(self, out: Path, end: float):
        self.out, self.end = out, end
        self.doc = json.loads((STATE / "window.json").read_text()) if (STATE / "window.json").exists() else {}
        self.doc.setdefault("phases", [])
        self.doc["window_end"] = end

    def left(self) -> float:
        return self.end - time.time()

    def run(self, name: str, cmd: list[str], limit: float, reserve: float = 0.0) -> bool:
        """``cmd`` as a phase of at most ``limit`` seconds, less where it would leave under ``reserve``
        seconds of the window (then skipped below 10 s); whether it passed."""
        limit, t0 = min(limit, self.left() - MARGIN - reserve), time.time()
        if limit < 10:
            kept = f", {reserve:.0f} s of it kept for training" if reserve else ""
            self.phase(name, t0, "skipped", f"{self.left():.0f} s of the window were left{kept}")
            return False
        log = STATE / f"{name.replace(' ', '-')}.log"
        with open(log, "w") as f:
            try:
                rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, timeout=limit).returncode
            except subprocess.TimeoutExpired:
                rc = "timed out"
        tail = log.read_text(errors="replace")[-600:]
        self.phase(name, t0, "passed" if rc == 0 else f"failed ({rc})", tail if rc else "")
        return rc == 0

    def phase(self, name: str, t0: float, status: str, note: str = "") -> None:
        self.doc["phases"].append(dict(name=name, seconds=round(time.time() - t0, 1), status=status, note=note))
        print(f"[{time.strftime('%H:%M:%S')}] {name}: {status} in {time.time() - t0:.0f} s", flush=True)
        self.save()

    def save(self) -> None:
        text = json.dumps(self.doc, indent=1)
        (STATE / "window.json").write_text(text)
        (self.out / "window.json").write_text(text)


def machine_facts() -> dict:
    """The seconds since the machine's first process started (its start-up before this command, as far as it
    shows), and its logical CPUs against its physical cores (Linux's /proc; what is unreadable is left out)."""
    facts: dict = {"cpus": os.cpu_count()}
    with contextlib.suppress(OSError, ValueError, IndexError):
        ticks = int(Path("/proc/1/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        facts["up_s"] = round(uptime - ticks / os.sysconf("SC_CLK_TCK"), 1)
    with contextlib.suppress(OSError):
        blocks = Path("/proc/cpuinfo").read_text().split("\n\n")
        field = lambda b, key: next((ln.split(":", 1)[1].strip() for ln in b.splitlines() if ln.startswith(key)), "")
        facts["cores"] = len({(field(b, "physical id"), field(b, "core id")) for b in blocks if field(b, "processor")})
        facts["cpu"] = field(blocks[0], "model name")
    return facts


def install_wheels() -> str:
    """Install ``.whl/*.whl`` into ``.whl/site`` and put it first on the children's PYTHONPATH."""
    wheels = sorted((ROOT / ".whl").glob("*.whl"))
    site = ROOT / ".whl" / "site"
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), str(ROOT), os.environ.get("PYTHONPATH")]))
    os.environ.setdefault("MINARI_DATASETS_PATH", str(ROOT / ".whl" / "minari"))
    os.environ["PYTHONUNBUFFERED"] = "1"
    if wheels:
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
        subprocess.run([*cmd, "--upgrade", "--target", str(site), *map(str, wheels)], check=True, capture_output=True)
    return f"{len(wheels)} wheels"


def quick_build(dataset: str) -> bool:
    """A medium-replay: built in seconds from committed transitions, where the other levels roll a policy out."""
    return dataset.split("/")[2].startswith("medium-replay")


def build_order(datasets: list[str], count: int) -> dict[str, list[str]]:
    """The datasets to build per task: the first ``count`` of ``datasets`` taken task by task, in the order the
    tasks first appear (a group trains one task's datasets: the first task's largest group first), and every
    quick one (``quick_build``)."""
    tasks = list(dict.fromkeys(d.split("/")[1] for d in datasets))
    by_task: dict[str, list[str]] = {}
    for i, d in enumerate(sorted(datasets, key=lambda d: tasks.index(d.split("/")[1]))):
        if i < count or quick_build(d):
            by_task.setdefault(d.split("/")[1], []).append(d)
    return by_task


def start_builds(w: Window, datasets: list[str], count: int, steps: int | None) -> list[subprocess.Popen]:
    """One ``python -m datasets build`` per task, all at once, in the background (``w.doc["builds"]``: the
    datasets of each, in the order of the processes)."""
    procs = []
    w.doc["builds"] = list(build_order(datasets, count).values())
    for ids in w.doc["builds"]:
        log = open(STATE / f"build-{ids[0].split('/')[1]}.log", "w")
        cmd = [sys.executable, "-m", "datasets", "build", "--dataset", *ids, "--jobs", str(len(ids))]
        cmd += ["--missing", *(["--steps", str(steps)] if steps else [])]
        procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT))
    return procs


def reported_built(dataset: str) -> bool:
    """Whether its task's build log (``start_builds``) says ``dataset`` is built, its process still running."""
    log = STATE / f"build-{dataset.split('/')[1]}.log"
    line = re.compile(rf"^built {re.escape(dataset)}(:|$)", re.MULTILINE)  # alone where built before (--missing)
    return log.exists() and line.search(log.read_text(errors="replace")) is not None


def settle_builds(builds: list[subprocess.Popen], limit: float) -> None:
    """Wait, at most ``limit`` s, until the builds have ended (a medium-replay takes seconds, a rollout on all
    cores about a minute), so that the sweep plans with the datasets built rather than with a bound of the
    builds' time."""
    end = time.time() + limit
    while any(p.poll() is None for p in builds) and time.time() < end:
        time.sleep(0.5)


def bench(w: Window, name: str, options: list[str], members: list[int], limit: float, *more: str) -> dict | None:
    """``bench.ensemble_speed`` at the paper's size with train.py's ``options`` (bf16 unless they name a
    precision); its records, or None."""
    out = STATE / f"{name.replace(' ', '-')}.json"
    cmd = [sys.executable, "-m", "bench.ensemble_speed", "--device", w.doc["device"], *bench_options(options)]
    cmd += ["--members", *map(str, members), "--json", str(out), "--updates", "50", *more]
    if not w.run(name, cmd, limit, w.doc["reserve"]) or not out.exists():
        return None
    return json.loads(out.read_text())


def bench_options(options: list[str]) -> list[str]:
    """``bench.ensemble_speed``'s options for train.py's ``options`` (a variant of ``bench.step_variants``)."""
    rest, precision = list(options), "bf16"
    if "--precision" in rest:
        i = rest.index("--precision")
        precision = rest[i + 1]
        del rest[i : i + 2]
    mode = "compiled+captured" if "--compile" in rest else "captured"
    return ["--modes", mode, "--precisions", precision, *(a for a in rest if a != "--compile")]


def rank_variants(w: Window, args) -> list[str]:
    """The train.py options of the fastest variant of the step that passed its check: from a committed
    ranking of this engine on this GPU, else the options of a committed throughput of it there, else the
    same on another GPU (ranking takes minutes: a window spent on measuring trains nothing), else ranked
    now (``bench.step_variants``); else --compile."""
    engine, path = w.doc.get("engine", {}), None
    for any_gpu in (False, True):
        path = committed("variants", engine, any_gpu=any_gpu)
        measured = path is None and committed("throughput", engine, any_gpu=any_gpu)
        if measured and isinstance(options := json.loads(measured.read_text()).get("options"), list):
            w.phase("variants", time.time(), "passed", f"the options of {measured.relative_to(ROOT)}")
            return [str(o) for o in options]
        if path:
            break
    if path is None:
        path = STATE / "variants.json"
        cmd = [sys.executable, "-m", "bench.step_variants", "--device", w.doc["device"], "--json", str(path)]
        ready = args.variants_limit - 60  # the variants compile at once, then each is timed for a second or two
        w.run("variants", cmd + ["--limit", f"{ready:.0f}"], args.variants_limit, w.doc["reserve"])
    else:
        w.phase("variants", time.time(), "passed", f"ranked before: {path.relative_to(ROOT)}")
    try:
        doc = json.loads(path.read_text())
        best = max((r for r in doc["records"] if r.get("passed") is True), key=lambda r: r["member_updates_per_s"])
        shutil.copy(path, w.out / "variants.json")
    except (OSError, ValueError, KeyError, TypeError):
        return ["--compile"]
    w.doc["variant"] = best["variant"]
    return list(best["options"])


def measure(w: Window, args, options: list[str]) -> list[str]:
    """The training step's throughput with train.py's ``options``, written to OUT/throughput.json: from
    ``--throughput``, or committed for this engine on this GPU, or measured now; if measuring fails or takes
    too long, captured without options. Returns the options the sweep trains with."""
    if args.throughput:  # read and checked by main, as the sweep checks it (budget.load_throughput)
        path, doc = args.throughput, args.measured
    else:  # this repository's own records
        path = committed("throughput", w.doc.get("engine", {}), options=options)
        doc = path and json.loads(path.read_text())
    if doc:
        shown = path.relative_to(ROOT) if path.is_absolute() and path.is_relative_to(ROOT) else path
        w.phase("throughput", time.time(), "passed", f"measured before: {shown}")  # no machine path
    if doc is None:
        doc = bench(w, "throughput", options, MEMBERS, args.compile_limit)
    if doc is None and options:
        options, doc = [], bench(w, "throughput captured", [], MEMBERS, 90)
    has_dt = doc is not None and any(r.get("model") == "dt" for r in doc["records"] if isinstance(r, dict))
    if doc is not None and not has_dt and not args.throughput:
        dt = bench(w, "throughput dt", options + ["--model", "dt"], DT_MEMBERS, args.compile_limit / 2)
        doc["records"] += dt["records"] if dt else []
    if doc:  # else the sweep measures in its first seconds
        doc["options"] = options
        save_throughput(w, doc)
    w.doc["options"] = options
    return options


def profile_evaluation(w: Window, short: bool = False) -> None:
    """``bench.eval_overhead``: 60, 600 and 1,800 episodes of ``PROFILE_STEPS`` steps, the acting forward pass
    captured, the episodes' halves pipelined (as evaluations run) and in turn, and the same with the eager forward
    pass (as evaluations beside training act), into OUT/evaluation.json (about 40 s on an H100: stopped after 100 s,
    when the committed fit serves); ``short``: 600 and 1,800 episodes of 100 steps (what the end of a window may
    leave room for)."""
    rollout = [sys.executable, "-m", "bench.eval_overhead", "--device", w.doc["device"], "--workers", "0"]
    sizes = [*EVAL_EPISODES[1:], "--steps", "100"] if short else [*EVAL_EPISODES, "--steps", str(PROFILE_STEPS)]
    rollout += ["--episodes", *sizes, "--forward", "captured", "eager", "--pipeline", "pipelined", "in-turn"]
    w.run("evaluation profile", [*rollout, "--json", str(w.out / "evaluation.json")], 100, w.doc["reserve"])


def profile_step(w: Window, options: list[str]) -> None:
    """``bench.step_kernels``: where 9 members' update with ``options`` spends its device time, kernel by kernel
    and phase by phase, into OUT/profile.json (about 26 s on an H100)."""
    profile = [sys.executable, "-m", "bench.step_kernels", "--device", w.doc["device"], "--members", "9"]
    profile += ["--warmup", "3", "--updates", "3", "--json", str(w.out / "profile.json"), "--", *options]
    w.run("profile", profile, 90, w.doc["reserve"])


def measure_after_the_sweep(w: Window) -> None:
    """In the seconds a finished sweep leaves of the window (each phase skipped where it would not end MARGIN
    s before it): the evaluation's profile, short, unless measured or committed complete (``committed_fit``; the
    group's own evaluations measure those beside training and the final one, not the pipelined one against the one
    in turn nor their start-up), one run's updates/s (OUT/one-run.json), then the step's profile unless measured
    (OUT/profile.json)."""
    w.doc["reserve"] = 0.0
    if not (w.out / "evaluation.json").exists() and not committed_fit(w.doc.get("engine", {}), complete=True):
        profile_evaluation(w, short=True)
    one = bench(w, "one run", w.doc.get("options", []), [1], 90)
    if one:
        (w.out / "one-run.json").write_text(json.dumps(one, indent=1))
    if not (w.out / "profile.json").exists():
        profile_step(w, w.doc.get("options", []))


def add_evaluation(w: Window) -> None:
    """What an evaluation costs on this GPU (``bench/eval_overhead.py --json``'s fit: per step of the batched
    rollout and per environment step; and its fit acting and stepping in turn, where measured), measured now or
    committed (under any engine), into the throughput file the sweep's budget reads (without it, the budget's
    default rate: ``commands.sweep.budget``)."""
    path = w.out / "evaluation.json"
    path = path if path.exists() else committed_evaluation(w.doc.get("engine", {}))
    measured = STATE / "throughput.json"
    try:
        fits = json.loads(path.read_text())
        doc = json.loads(measured.read_text())
        doc["evaluation"] = w.doc["evaluation"] = fits["evaluation"]
    except (AttributeError, OSError, ValueError, KeyError, TypeError):
        return
    doc.pop("evaluation_in_turn", None)
    if "evaluation_in_turn" in fits:  # what an evaluation beside training costs (it acts and steps in turn)
        doc["evaluation_in_turn"] = fits["evaluation_in_turn"]
    save_throughput(w, doc)


def save_throughput(w: Window, doc: dict) -> None:
    """The measurements the sweep reads (this machine's side) and that come back (OUT)."""
    for folder in (STATE, w.out):
        (folder / "throughput.json").write_text(json.dumps(doc, indent=1))


def start_tests(w: Window) -> None:
    """The CUDA tests (``CUDA_TESTS``), detached beside the sweep's first seconds (its processes start and
    compile then, the tests hold the GPU for seconds), so that training starts sooner; ``pack`` writes down
    their result once they have ended."""
    cmd = shlex.join(["timeout", "120", sys.executable, "-m", "pytest", "-q", "-x", "-k", "cuda", *CUDA_TESTS])
    log, rc = STATE / "cuda-tests.log", STATE / "cuda-tests.rc"
    subprocess.Popen(["sh", "-c", f"{cmd} > {shlex.quote(str(log))} 2>&1; echo $? > {shlex.quote(str(rc))}"], cwd=ROOT)
    w.doc["cuda_tests_started"] = time.time()


def tests_ended(w: Window) -> None:
    """The CUDA tests' result as a phase, once their exit status is there."""
    rc = STATE / "cuda-tests.rc"
    if "cuda_tests_started" not in w.doc or w.doc.get("cuda_tests_ended") or not rc.exists():
        return
    status = rc.read_text().strip()
    if not status:  # being written
        return
    tail = "" if status == "0" else (STATE / "cuda-tests.log").read_text(errors="replace")[-600:]
    w.phase("cuda tests", w.doc["cuda_tests_started"], "passed" if status == "0" else f"failed ({status})", tail)
    w.doc["cuda_tests_ended"] = True


def pack(w: Window) -> None:
    """The records of the finished runs, the sweep's log and the measurements into OUT."""
    tests_ended(w)
    if SWEEP.exists():  # the records command knows the run folders' layout; this process imports no dt_primal
        cmd = [sys.executable, "-m", "commands.sweep.records", str(SWEEP), str(w.out / "records.tgz")]
        packed = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60).stdout
        found = re.search(r"the records of ([0-9]+) finished run", packed)
        w.doc["finished_runs"] = int(found.group(1)) if found else 0
    logs = [*sorted(STATE.glob("*.log")), *sorted(SWEEP.glob("*/*/train.log"))]
    text = "".join(f"==> {p}\n{p.read_text(errors='replace')[-20_000:]}\n" for p in logs)
    (w.out / "logs.txt").write_text(text)
    w.save()


def start_sweep(w: Window, options: list[str], sweep_args: list[str], building: list[str], left: float) -> None:
    """The budgeted sweep of Table 4, detached, in this machine's runs/table4, stopped MARGIN seconds before the
    window's end; ``building``: the datasets being built now, which may still take ``left`` seconds: the groups
    that need them are planned to start after that."""
    budget = w.left() - MARGIN
    cmd = [sys.executable, "-m", "commands.sweep", "--datasets", "table4", "--models", *MODELS]
    cmd += ["--seeds", *map(str, SEEDS), "--out", str(SWEEP), "--recorded", str(RECORDED)]
    cmd += ["--time-budget", f"{budget:.0f}s", "--throughput", str(STATE / "throughput.json")]
    cmd += ["--building", *building, "--build-wait", f"{left:.0f}s"] if building else []
    cmd += ["--"]
    cmd += ["--device", w.doc["device"], *options, *sweep_args]
    if not (STATE / "throughput.json").exists():  # no measurement passed: the sweep measures in its first seconds
        i = cmd.index("--throughput")
        del cmd[i : i + 2]
    log = open(STATE / "sweep.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
    w.doc.update(sweep_pid=proc.pid, sweep_command=" ".join(cmd[1:]), sweep_budget_s=round(budget))
    w.phase("sweep started", time.time(), "passed", f"budget {budget:.0f} s, builds may take {left:.0f} s of it")


def sweep_running(w: Window) -> bool:
    pid = w.doc.get("sweep_pid")
    if not pid:
        return False
    try:
        os.waitpid(pid, os.WNOHANG)  # reap it when this process started it
    except ChildProcessError:
        pass
    return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()


def keep_packing(w: Window, until: float) -> None:
    """Pack every PACK_EVERY seconds until ``until``, the sweep's end or the window's end."""
    while sweep_running(w) and time.time() < min(until, w.end):
        time.sleep(min(PACK_EVERY, max(0.0, min(until, w.end) - time.time())))
        pack(w)
    pack(w)


def start(args) -> None:
    t_start = time.time()
    os.chdir(ROOT)
    shutil.rmtree(STATE, ignore_errors=True)
    STATE.mkdir(parents=True)
    w = Window(args.out, t_start + args.window)
    w.doc.update(device=args.device, started=time.strftime("%Y-%m-%dT%H:%M:%S%z"), machine=machine_facts())
    t0 = time.time()
    try:
        w.phase("wheels", t0, "passed", install_wheels())
    except subprocess.CalledProcessError as exc:
        w.phase("wheels", t0, "failed", (exc.stderr or b"")[-600:].decode(errors="replace"))
    t0 = time.time()
    found = subprocess.run([sys.executable, "-c", LEFT], cwd=ROOT, capture_output=True, text=True)
    if found.returncode:  # then nothing is built, and the sweep trains only what is
        w.phase("datasets left", t0, f"failed ({found.returncode})", found.stderr[-600:])
    builds = start_builds(w, found.stdout.split(), args.build, args.build_steps)  # first: the sweep waits for them
    w.run("imports", [sys.executable, "-c", PROBE], 60)
    w.doc["versions"] = (STATE / "imports.log").read_text()[-2000:]
    if w.run("engine", [sys.executable, "-c", ENGINE], 60):
        w.doc["engine"] = json.loads((STATE / "engine.log").read_text().strip().splitlines()[-1])
    if args.device.startswith("cuda"):
        w.doc["reserve"] = args.least_training
        options = measure(w, args, given_options(args.measured) if args.throughput else rank_variants(w, args))
        if args.profile:
            profile_step(w, options)
    else:
        options = []
    # the sweep starts once the builds have ended, or SETTLE_S after they started: a group whose datasets are
    # still being built then waits for them (their build lock), planned to start when the builds may have ended
    settle_builds(builds, max(0.0, SETTLE_S - (time.time() - t0)))
    if args.device.startswith("cuda"):
        # after the builds: the cores are the workers'
        if args.profile or not committed_fit(w.doc.get("engine", {}), complete=False):
            profile_evaluation(w)
        add_evaluation(w)
    rcs = [p.poll() for p in builds]
    failed, still = [rc for rc in rcs if rc not in (0, None)], rcs.count(None)
    build_s = BUILD_S * (args.build_steps or BUILD_STEPS) / BUILD_STEPS  # a rehearsal's small datasets: less
    left = max(0.0, build_s - (time.time() - t0)) if still else 0.0
    status = f"failed (exit statuses {failed})" if failed else f"{still} still building" if still else "built"
    w.phase("datasets", t0, status)
    building = [d for ids, rc in zip(w.doc["builds"], rcs) if rc is None for d in ids if not reported_built(d)]
    start_sweep(w, options, args.sweep_args, building, left)
    if args.device.startswith("cuda"):
        start_tests(w)
    keep_packing(w, t_start + args.seconds)


def wait(args) -> None:
    os.chdir(ROOT)
    w = Window(args.out, json.loads((STATE / "window.json").read_text())["window_end"])
    t0 = time.time()
    keep_packing(w, w.end)
    ended = not sweep_running(w)
    w.phase("waited for the sweep", t0, "sweep ended" if ended else "window over")
    if ended and w.doc.get("device", "").startswith("cuda"):
        measure_after_the_sweep(w)
