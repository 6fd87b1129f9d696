"""The GPU window's tools (tools/gpu_window): it reuses a committed measurement only for the same engine, GPU
and options, trains with the fastest variant that passed, gives the sweep what an evaluation costs, builds only the
datasets with a run left, stops the sweep at the window's end and writes every phase down."""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, run

from tools.gpu_window import measurements
from tools.gpu_window import window as gpu_window


@pytest.fixture
def window(tmp_path, monkeypatch) -> gpu_window.Window:
    """A GPU window in ``tmp_path`` (its state folder and OUT, ``tmp_path / "out"``), ten minutes long."""
    monkeypatch.setattr(gpu_window, "ROOT", tmp_path)
    monkeypatch.setattr(measurements, "ROOT", tmp_path)
    monkeypatch.chdir(tmp_path)
    gpu_window.STATE.mkdir(parents=True)
    (tmp_path / "out").mkdir()
    return gpu_window.Window(tmp_path / "out", time.time() + 600)


def test_a_window_reuses_a_committed_measurement_of_the_same_engine_gpu_and_options(tmp_path, monkeypatch):
    monkeypatch.setattr(measurements, "ROOT", tmp_path)
    engine = {"engine": "abc", "gpu": "NVIDIA H100 80GB HBM3"}

    def write(folder, name, gpu="NVIDIA H100 80GB HBM3", hash_="abc", **top):
        path = tmp_path / "results" / folder / f"{name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        doc = {"records": [{"engine": hash_, "member_updates_per_s": 1.0}], "info": {"gpu": gpu}, **top}
        path.write_text(json.dumps(doc))
        return path

    write("gpu-h100-2026-11-20", "throughput", hash_="old", options=["--compile"])
    write("gpu-h200-2026-11-27", "throughput", gpu="NVIDIA H200", options=["--compile"])
    assert measurements.committed("throughput", engine, options=["--compile"]) is None
    mine = write("gpu-h100-2026-11-26", "throughput", options=["--compile"])
    assert measurements.committed("throughput", engine, options=["--compile"]) == mine
    assert measurements.committed("throughput", engine, options=[]) is None  # measured with other options
    assert measurements.committed("variants", engine) is None
    # two on one day: the one measured later, whatever the folders' names
    later = write("gpu-h100-a-2026-11-27", "evaluation", info={"gpu": engine["gpu"], "date": "2026-11-27 13:34 UTC"})
    write("gpu-h100-b-2026-11-27", "evaluation", info={"gpu": engine["gpu"], "date": "2026-11-27 06:59 UTC"})
    assert measurements.committed("evaluation", engine) == later


def test_the_window_trains_with_the_fastest_variant_that_passed_and_measures_nothing_twice(
    window, tmp_path, monkeypatch
):
    w = window
    w.doc.update(device="cuda", reserve=0, engine={"engine": "abc", "gpu": "G"})
    fast = ["--compile", "--optimizer", "compiled"]
    variants = [
        dict(variant="compiled", options=["--compile"], passed=True, member_updates_per_s=2.0),
        dict(variant="all compiled", options=fast, passed=True, member_updates_per_s=3.0),
        dict(variant="wrong", options=["--attention-kernel", "math"], passed=False, member_updates_per_s=9.0),
    ]
    phases = []

    def run(name, cmd, limit, reserve=0.0):  # the phases' commands, as a GPU would answer them
        phases.append(name)
        model = "dt" if "dt" in cmd else "primal"
        records = variants if name == "variants" else [{"model": model, "members": 3, "engine": "abc"}]
        doc = {"records": records, "info": {"gpu": "G"}} | ({"engine": "abc"} if name == "variants" else {})
        Path(cmd[cmd.index("--json") + 1]).write_text(json.dumps(doc))
        return True

    monkeypatch.setattr(w, "run", run)
    args = argparse.Namespace(throughput=None, variants_limit=200, compile_limit=150)
    assert gpu_window.measure(w, args, gpu_window.rank_variants(w, args)) == fast
    assert phases == ["variants", "throughput", "throughput dt"]
    measured = json.loads((tmp_path / "out" / "throughput.json").read_text())
    assert [r["model"] for r in measured["records"]] == ["primal", "dt"] and measured["options"] == fast
    committed = tmp_path / "results" / "gpu-g-2026-11-28"
    committed.mkdir(parents=True)
    for name in ("variants", "throughput"):
        shutil.copy(tmp_path / "out" / f"{name}.json", committed)
    phases.clear()
    assert gpu_window.measure(w, args, gpu_window.rank_variants(w, args)) == fast and phases == []
    assert w.doc["phases"][-1]["note"] == "measured before: results/gpu-g-2026-11-28/throughput.json"  # no machine path
    w.doc["engine"]["gpu"] = "another GPU"  # the same engine's ranking is taken from it; the throughput is measured
    assert gpu_window.measure(w, args, gpu_window.rank_variants(w, args)) == fast
    assert phases == ["throughput", "throughput dt"]
    w.doc["engine"]["engine"] = "changed"  # a ranking of another engine is not
    phases.clear()
    gpu_window.rank_variants(w, args)
    assert phases == ["variants"]
    w.doc["engine"]["gpu"] = "G"  # a throughput of this engine on this GPU names the options it was measured with
    doc = json.loads((committed / "throughput.json").read_text())
    for r in doc["records"]:
        r["engine"] = "changed"
    (committed / "throughput.json").write_text(json.dumps(doc | {"options": ["--compile"]}))
    phases.clear()
    assert gpu_window.measure(w, args, gpu_window.rank_variants(w, args)) == ["--compile"] and phases == []
    w.doc["engine"]["gpu"] = "a third GPU"  # there: the options of the other GPU's throughput, measured again
    assert gpu_window.measure(w, args, gpu_window.rank_variants(w, args)) == ["--compile"]
    assert phases == ["throughput", "throughput dt"]


def test_a_given_throughput_file_sets_the_options_the_sweep_trains_with(tmp_path):
    """An older window's file (no options recorded) trains compiled where it measured compiled; a newer one names
    its options, which must agree with its records' modes for the sweep's budget to find them."""
    h200 = measurements.read_measurements(ROOT / "results" / "gpu-h200-2026-11-26" / "throughput.json")
    assert measurements.given_options(h200) == ["--compile"]
    record = {"model": "primal", "d_model": 256, "n_head": 4, "precision": "bf16", "members": 3}
    record |= {"mode": "captured", "member_updates_per_s": 700.0, "warmup_s": 5.0}
    (tmp_path / "t.json").write_text(json.dumps({"records": [record], "options": ["--optimizer", "compiled"]}))
    assert measurements.given_options(measurements.read_measurements(tmp_path / "t.json")) == [
        "--optimizer",
        "compiled",
    ]


def test_the_window_imports_only_the_standard_library_until_its_wheels_are_installed():
    """``start`` installs the packages the GPU machine lacks: its own process imports none, nor dt_primal."""
    code = (
        "import runpy, sys\nsys.argv = ['gpu_window', 'start', '--help']\n"
        "try:\n    runpy.run_module('tools.gpu_window', run_name='__main__')\nexcept SystemExit:\n    pass\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'dt_primal', 'envs', 'datasets', 'numpy', 'torch'}))"
    )
    res = run("-c", code)
    assert res.returncode == 0 and res.stdout.strip().endswith("[]"), res.stdout[-300:] + res.stderr


def test_the_window_gives_the_sweep_what_an_evaluation_costs_on_this_gpu(window, tmp_path):
    """Measured in this window (bench/eval_overhead.py --json), else committed for this GPU under any engine."""
    w = window
    w.doc.update(engine={"engine": "new", "gpu": "G"})
    (gpu_window.STATE / "throughput.json").write_text(json.dumps({"records": [{"model": "primal"}]}))
    gpu_window.add_evaluation(w)  # none measured, none committed: the file stays as it was
    assert "evaluation" not in json.loads((gpu_window.STATE / "throughput.json").read_text())
    committed = tmp_path / "results" / "gpu-g-2026-11-27"
    committed.mkdir(parents=True)
    old = {"records": [{"episodes": 60, "steps": 200}], "evaluation": {"step_s": 0.003, "env_step_s": 4e-5}}
    old["info"] = {"gpu": "G"}
    (committed / "evaluation.json").write_text(json.dumps(old))
    newer = committed.parent / "gpu-g-2026-11-28"  # rollouts of 100 steps, their start-up not timed apart
    newer.mkdir()
    (newer / "evaluation.json").write_text(json.dumps(old | {"records": [{"episodes": 60, "steps": 100}]}))
    gpu_window.add_evaluation(w)  # the newest fit that may plan a sweep
    for folder in (gpu_window.STATE, tmp_path / "out"):
        assert json.loads((folder / "throughput.json").read_text())["evaluation"] == old["evaluation"]
    in_turn = {"evaluation": {"step_s": 0.001}, "evaluation_in_turn": {"step_s": 0.002}}
    (tmp_path / "out" / "evaluation.json").write_text(json.dumps(old | in_turn))
    gpu_window.add_evaluation(w)  # this window's own measurement wins, with its fit of evaluations beside training
    given = json.loads((gpu_window.STATE / "throughput.json").read_text())
    assert {k: given[k] for k in in_turn} == in_turn
    (tmp_path / "out" / "evaluation.json").write_text(json.dumps(old))
    gpu_window.add_evaluation(w)
    assert "evaluation_in_turn" not in json.loads((gpu_window.STATE / "throughput.json").read_text())


def test_the_window_measures_the_evaluation_until_one_as_evaluations_run_is_committed(window, tmp_path):
    w = window
    w.doc.update(engine={"engine": "new", "gpu": "G"})
    fits = lambda: [measurements.committed_fit(w.doc["engine"], complete) for complete in (False, True)]
    assert fits() == [False, False]  # none committed
    committed = tmp_path / "results" / "gpu-g-2026-11-27"
    committed.mkdir(parents=True)
    record = {"episodes": 60, "steps": 200}
    eager = {"records": [record], "evaluation": {"step_s": 0.011}, "info": {"gpu": "G"}}  # no "forward"
    (committed / "evaluation.json").write_text(json.dumps(eager))
    assert fits() == [False, False]
    captured = eager | {"records": [record | {"forward": "captured"}, record | {"forward": "eager"}]}
    (committed / "evaluation.json").write_text(json.dumps(captured))
    assert fits() == [True, False]  # the budget has a fit; the pipelined evaluation is still to be measured
    pipelined = captured | {"records": [record | {"forward": "captured", "pipeline": True}]}
    (committed / "evaluation.json").write_text(json.dumps(pipelined))
    assert fits() == [True, False]  # ... and its start-up timed apart
    apart = record | {"forward": "captured", "pipeline": True, "steps": 100, "start_s": 2.0}
    (committed / "evaluation.json").write_text(json.dumps(pipelined | {"records": [apart]}))
    assert fits() == [True, False]  # ... and the forward pass's first steps, and the eager pass beside training's
    apart |= {"first_forward_s": 1.0}
    beside = apart | {"forward": "eager", "pipeline": False}
    (committed / "evaluation.json").write_text(json.dumps(pipelined | {"records": [apart]}))
    assert fits() == [True, False]
    (committed / "evaluation.json").write_text(json.dumps(pipelined | {"records": [apart, beside]}))
    assert fits() == [True, True]
    short = pipelined | {"records": [record | {"forward": "captured", "pipeline": True, "steps": 100}]}
    (committed / "evaluation.json").write_text(json.dumps(short))
    assert fits() == [False, False]  # 100 steps, the start-up spread over them: no fit to plan with
    w.doc["engine"]["gpu"] = "another GPU"
    assert fits() == [False, False]


def test_the_cuda_tests_run_beside_the_sweep_and_their_result_is_written_down_when_they_end(window):
    w = window
    gpu_window.tests_ended(w)  # not started: nothing to write
    w.doc["cuda_tests_started"] = time.time()
    gpu_window.tests_ended(w)  # still running: nothing yet
    assert w.doc["phases"] == []
    (gpu_window.STATE / "cuda-tests.log").write_text("E   AssertionError: actions differ\n1 failed")
    (gpu_window.STATE / "cuda-tests.rc").write_text("1\n")
    gpu_window.pack(w)
    gpu_window.pack(w)  # written down once
    assert [(p["name"], p["status"]) for p in w.doc["phases"]] == [("cuda tests", "failed (1)")]
    assert "actions differ" in w.doc["phases"][0]["note"]


def test_the_cuda_tests_are_started_detached_and_leave_their_exit_status(window, tmp_path, monkeypatch):
    w = window
    # a project of its own: else pytest's root may be an ancestor (a setup.py there), and -k also matches the
    # names of the folders below it, tmp_path's among them, which names cuda
    (tmp_path / "suite").mkdir()
    (tmp_path / "suite" / "pytest.ini").write_text("[pytest]\n")
    tests = "def test_on_cuda():\n    pass\n\ndef test_other():\n    raise ValueError\n"
    (tmp_path / "suite" / "test_gpu.py").write_text(tests)
    monkeypatch.setattr(gpu_window, "CUDA_TESTS", ["suite/test_gpu.py"])
    gpu_window.start_tests(w)
    deadline = time.time() + 120
    while not (gpu_window.STATE / "cuda-tests.rc").exists() and time.time() < deadline:
        time.sleep(0.2)
    time.sleep(0.5)  # the status written
    gpu_window.tests_ended(w)
    assert [(p["name"], p["status"]) for p in w.doc["phases"]] == [("cuda tests", "passed")]  # -k cuda: one test


def test_the_sweep_stops_at_the_windows_end_and_plans_the_groups_that_wait_for_a_build_after_it(window, monkeypatch):
    """The builds' remaining time shortens the plan of the groups that need them, not the sweep's time."""
    started = []
    monkeypatch.setattr(
        gpu_window.subprocess, "Popen", lambda cmd, **kw: started.append(cmd) or argparse.Namespace(pid=1)
    )
    w = window
    w.doc["device"] = "cuda"
    gpu_window.start_sweep(w, ["--compile"], [], ["dt-primal/hopper/medium-v0"], left=170.0)
    cmd = started[0]
    budget = float(cmd[cmd.index("--time-budget") + 1].rstrip("s"))
    assert 600 - gpu_window.MARGIN - 2 <= budget <= 600 - gpu_window.MARGIN
    assert cmd[cmd.index("--building") + 1 : cmd.index("--build-wait") + 2] == [
        "dt-primal/hopper/medium-v0",
        "--build-wait",
        "170s",
    ]
    gpu_window.start_sweep(w, [], [], [], left=0.0)  # everything built: nothing to wait for
    assert "--building" not in started[1] and "--build-wait" not in started[1]


def test_the_window_builds_each_dataset_at_the_version_its_row_uses(window, monkeypatch):
    """Its build commands, run as ``python -m datasets`` runs them, make exactly the ids given: walker2d's medium-v0
    where the task's newest medium is another version."""
    import datasets.__main__ as datasets_main
    from datasets.suite import VERSIONS

    started, built = [], []
    monkeypatch.setattr(
        gpu_window.subprocess, "Popen", lambda cmd, **kw: started.append(cmd) or argparse.Namespace(pid=1)
    )
    ids = ["dt-primal/walker2d/medium-v0", "dt-primal/walker2d/medium-replay-v1", "dt-primal/hopper/medium-replay-v0"]
    gpu_window.start_builds(window, ids, 3, None)
    monkeypatch.setattr(datasets_main, "build_at_once", lambda dataset_ids, *a: built.extend(dataset_ids))
    monkeypatch.setattr(datasets_main, "build_id", lambda dataset_id, *a: built.append(dataset_id))
    for cmd in started:
        datasets_main.main(cmd[cmd.index("build") :])
    assert VERSIONS["medium"]["walker2d"] != 0 and sorted(built) == sorted(ids)


def test_a_dataset_its_build_reports_built_is_not_waited_for(window):
    """The build of walker2d's medium-replay ends in seconds, its process goes on with medium's."""
    log = gpu_window.STATE / "build-walker2d.log"
    assert not gpu_window.reported_built("dt-primal/walker2d/medium-replay-v0")  # no log yet
    log.write_text("built dt-primal/walker2d/medium-replay-v0: 1022 episodes, 199996 steps in 3 s\n")
    assert gpu_window.reported_built("dt-primal/walker2d/medium-replay-v0")
    assert not gpu_window.reported_built("dt-primal/walker2d/medium-v0")
    with log.open("a") as f:  # --missing: one built before is reported by its id alone
        f.write("built dt-primal/walker2d/medium-v0\n")
    assert gpu_window.reported_built("dt-primal/walker2d/medium-v0")
    assert not gpu_window.reported_built("dt-primal/walker2d/medium-v")


def test_the_sweeps_start_waits_for_the_builds_at_most_its_limit(window):
    running, ended = argparse.Namespace(poll=lambda: None), argparse.Namespace(poll=lambda: 0)
    t0 = time.time()
    gpu_window.settle_builds([ended, running], limit=0.6)  # one still running: waits to the limit
    assert 0.6 <= time.time() - t0 < 5
    t0 = time.time()
    gpu_window.settle_builds([ended, ended], limit=30)  # all ended: nothing to wait for
    assert time.time() - t0 < 5


def test_the_window_builds_the_first_tasks_datasets_first_and_every_medium_replay():
    from commands.sweep.grid import TABLE4_BY_GAIN

    order = gpu_window.build_order(TABLE4_BY_GAIN, 3)
    assert order == {
        "hopper": [f"dt-primal/hopper/{level}" for level in ("medium-v0", "medium-replay-v2", "medium-expert-v1")],
        "walker2d": ["dt-primal/walker2d/medium-replay-v1"],
        "halfcheetah": ["dt-primal/halfcheetah/medium-replay-v1"],
    }
    assert gpu_window.build_order(TABLE4_BY_GAIN, 5)["walker2d"] == [
        "dt-primal/walker2d/medium-replay-v1",
        "dt-primal/walker2d/medium-v1",
    ]


def test_the_window_builds_only_datasets_with_a_table4_run_left(tmp_path):
    """``LEFT`` lists, in the sweep's priority order, the datasets with a run neither committed nor finished in
    the window's sweep; a dataset all of whose runs are done is not built again."""
    from commands.sweep.grid import TABLE4_BY_GAIN
    from dt_primal.files.run_folder import RECORD, run_dir

    done = "dt-primal/hopper/medium-v0"
    for m in gpu_window.MODELS:
        for s in gpu_window.SEEDS:
            folder = run_dir(tmp_path / ("results/table4" if s else "runs/table4"), done, m, s)  # committed or not
            folder.mkdir(parents=True)
            (folder / RECORD).write_text("{}")
    (run_dir(tmp_path / "results/table4", TABLE4_BY_GAIN[1], "dt", 0) / RECORD).parent.mkdir(parents=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-c", gpu_window.LEFT]
    left = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, check=True).stdout.split()
    assert left == [d for d in TABLE4_BY_GAIN if d != done]
    assert list(gpu_window.build_order(left, 3)) == ["walker2d", "hopper", "halfcheetah"]
    assert gpu_window.build_order(left, 3)["walker2d"] == [
        f"dt-primal/walker2d/{level}" for level in ("medium-replay-v1", "medium-v1", "medium-expert-v2")
    ]


def test_the_seconds_a_finished_sweep_leaves_measure_the_evaluation_one_run_and_the_steps_profile(window, monkeypatch):
    w = window
    w.doc.update(device="cuda", options=["--compile"])
    ran = []
    monkeypatch.setattr(gpu_window, "committed_fit", lambda engine, complete: not complete)

    commands = {}

    def run(name, cmd, limit, reserve=0.0):  # as a GPU would answer
        ran.append((name, cmd[2], reserve))
        commands[name] = cmd
        if "--json" in cmd:
            Path(cmd[cmd.index("--json") + 1]).write_text(json.dumps({"records": [{"members": 1}]}))
        return True

    monkeypatch.setattr(w, "run", run)
    gpu_window.measure_after_the_sweep(w)
    profile = commands["evaluation profile"]  # short, what the end of a window leaves room for
    assert profile[profile.index("--steps") + 1] == "100"
    assert {"pipelined", "in-turn", "captured", "eager"} <= set(profile)  # both orders, both forward passes
    assert ran == [
        ("evaluation profile", "bench.eval_overhead", 0.0),
        ("one run", "bench.ensemble_speed", 0.0),
        ("profile", "bench.step_kernels", 0.0),
    ]
    assert json.loads((w.out / "one-run.json").read_text())["records"] == [{"members": 1}]
    gpu_window.profile_evaluation(w)  # the whole profile, before a sweep: rollouts as long as a plan needs
    profile = commands["evaluation profile"]
    assert profile[profile.index("--steps") + 1] == str(measurements.PROFILE_STEPS)
    assert profile[profile.index("--episodes") + 1 : profile.index("--steps")] == gpu_window.EVAL_EPISODES
    ran.clear()
    gpu_window.measure_after_the_sweep(w)  # the evaluation and the step measured before in this window: not again
    assert [name for name, _, _ in ran] == ["one run"]
    ran.clear()
    (w.out / "evaluation.json").unlink()
    monkeypatch.setattr(gpu_window, "committed_fit", lambda engine, complete: True)
    gpu_window.measure_after_the_sweep(w)  # a complete committed fit: not measured again
    assert "evaluation profile" not in [name for name, _, _ in ran]


def test_a_phase_the_window_has_no_time_left_for_is_skipped_with_the_seconds_that_were_left(window):
    window.end = time.time() + gpu_window.MARGIN + 5
    assert not window.run("profile", ["true"], 90, reserve=25)
    assert not window.run("one run", ["true"], 90)
    profile, one = window.doc["phases"]
    assert profile["status"] == one["status"] == "skipped"
    assert profile["note"].endswith("s of the window were left, 25 s of it kept for training")
    assert one["note"].endswith("s of the window were left")
    assert gpu_window.MARGIN <= int(one["note"].split()[0]) <= gpu_window.MARGIN + 5


def test_the_window_writes_down_how_long_the_machine_was_up_and_its_cores():
    facts = gpu_window.machine_facts()
    assert facts["up_s"] > 0 and 1 <= facts["cores"] <= facts["cpus"] == os.cpu_count(), facts
    if shutil.which("ps"):  # procps's own reading of the same
        started = float(subprocess.run(["ps", "-o", "etimes=", "-p", "1"], capture_output=True, text=True).stdout)
        assert abs(facts["up_s"] - started) <= 2


def test_a_variants_options_become_the_throughput_benchmarks():
    assert gpu_window.bench_options([]) == ["--modes", "captured", "--precisions", "bf16"]
    options = ["--compile", "--optimizer", "compiled", "--precision", "tf32"]
    assert gpu_window.bench_options(options) == [
        "--modes",
        "compiled+captured",
        "--precisions",
        "tf32",
        "--optimizer",
        "compiled",
    ]
