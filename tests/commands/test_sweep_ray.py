"""The sweep's Ray backend on a real local Ray instance: the local pool's table, and a group whose worker
is killed mid-run is run again by Ray and resumes from its checkpoint."""

import json
import os
import signal
import threading
import time

import pytest
from conftest import TINY, make_episodes, run

from commands.sweep.command import main
from commands.sweep.grid import group_dir, run_dir
from datasets.synthetic import write_d4rl

SWEEP_RUN = ["--env", "hopper", *TINY, "--batch-size", "16", "--warmup-steps", "2", "--eval-every", "1000"]
SWEEP_RUN += ["--eval-episodes", "2"]

pytestmark = pytest.mark.xdist_group("ray")  # one test process runs them all, with one Ray instance


@pytest.fixture(scope="module")
def ray():
    ray = pytest.importorskip("ray")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)  # a new instance
    yield ray
    ray.shutdown()


def datasets(tmp_path) -> list[str]:
    paths = [tmp_path / f"hopper_{seed}.hdf5" for seed in (3, 4)]
    for seed, path in zip((3, 4), paths):
        write_d4rl(path, make_episodes(lengths=(40, 25, 60, 33), seed=seed))
    return [str(p) for p in paths]


def sweep(*args: str) -> None:
    main(["--models", "primal", "--seeds", "0", "1", *args])


def test_ray_backend_gives_the_local_pools_table(tmp_path, ray, capsys):
    data = datasets(tmp_path)
    sweep(
        "--datasets",
        *data,
        "--jobs",
        "2",
        "--threads",
        "1",
        "--out",
        str(tmp_path / "local"),
        "--",
        *SWEEP_RUN,
        "--steps",
        "6",
    )
    sweep(
        "--datasets",
        *data,
        "--backend",
        "ray",
        "--cpus-per-task",
        "1",
        "--out",
        str(tmp_path / "ray"),
        "--",
        *SWEEP_RUN,
        "--steps",
        "6",
    )
    printed = capsys.readouterr().out
    assert printed.count("done (seeds 0 1)") == 2  # the two datasets (one task) as one ensemble on each backend
    local, on_ray = ((tmp_path / out / "results.md").read_text() for out in ("local", "ray"))
    assert on_ray == local and all(f"| {d} | primal |" in local for d in data)
    assert (tmp_path / "ray" / "results.csv").read_text() == (tmp_path / "local" / "results.csv").read_text()
    log = (group_dir(tmp_path / "ray", data[0], "primal") / "train.log").read_text()
    assert log.count("$ python -m commands.train ") == 1 and f"--dataset {data[0]} {data[1]} " in log
    assert (
        "--seeds 0 1 " in log
        and "its output is in" in (group_dir(tmp_path / "ray", data[1], "primal") / "train.log").read_text()
    )


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
def test_a_killed_ray_task_is_run_again_and_resumes_from_its_checkpoint(tmp_path, ray, capsys, signum):
    data, out, steps = datasets(tmp_path)[0], tmp_path / "sweep", 300
    gd = group_dir(out, data, "primal")
    killed = {}

    def kill_after_first_checkpoint():  # SIGKILL: a lost node or out of memory; SIGTERM: a node shutting down
        while not (run_dir(out, data, "primal", 0) / "last.pt").exists():
            time.sleep(0.01)
        killed["pid"] = json.loads((gd / ".train.lock").read_text())["pid"]
        os.kill(killed["pid"], signum)

    killer = threading.Thread(target=kill_after_first_checkpoint, daemon=True)
    killer.start()
    sweep(
        "--datasets",
        data,
        "--backend",
        "ray",
        "--out",
        str(out),
        "--",
        *SWEEP_RUN,
        "--steps",
        str(steps),
        "--checkpoint-every",
        "20",
    )
    killer.join(timeout=1)
    assert "pid" in killed and "done (seeds 0 1)" in capsys.readouterr().out
    log = (gd / "train.log").read_text()
    commands = [line for line in log.splitlines() if line.startswith("$ ")]
    assert len(commands) == 2 and not commands[0].endswith("--resume")
    assert "--seeds 0 1 --out" in commands[1] and commands[1].endswith("--resume")  # run again by Ray: resumes
    resumed = [int(line.rsplit(" ", 1)[1]) for line in log.splitlines() if line.startswith("resumed from ")]
    assert len(resumed) == 1 and 0 < resumed[0] < steps
    for seed in (0, 1):
        assert json.loads((run_dir(out, data, "primal", seed) / "eval.json").read_text())["step"] == steps
    if signum == signal.SIGKILL:  # from a periodic checkpoint, in another worker
        assert resumed[0] % 20 == 0 and json.loads((gd / ".train.lock").read_text())["pid"] != killed["pid"]
    else:
        assert f"stopped by signal SIGTERM at step {resumed[0]}" in log  # it wrote that checkpoint when it stopped


def test_without_ray_the_sweep_says_how_to_install_it(tmp_path):
    code = (
        "import sys; sys.modules['ray'] = None; from dt_primal.cli import run_main; from commands.sweep.command "
        "import main; "
        f"run_main(lambda: main(['--datasets', 'x', '--backend', 'ray', '--out', {str(tmp_path)!r}]))"
    )
    res = run("-c", code, timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert (
        res.stderr.startswith("error: --backend ray needs Ray") and "pip install -r requirements-ray.txt" in res.stderr
    )
