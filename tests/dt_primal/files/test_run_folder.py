"""The run folder (--out): which runs may hold it at once, what a run never writes over, and resuming in it."""

import errno
import json
import os
import shutil
import signal
import subprocess
import sys

import h5py
import pytest
from conftest import (
    ROOT,
    SMALL,
    TWO_STEPS,
    assert_user_error,
    hopper_file,
    make_episodes,
    raises,
    run,
    small_config,
    train_exits_2,
    two_steps,
    write_pickle,
)

from datasets.loaders import load_dataset
from datasets.synthetic import write_d4rl
from dt_primal.config import make_config
from dt_primal.files import run_folder
from dt_primal.training import loop as training
from dt_primal.training.resume import record_dataset

pytestmark = pytest.mark.usefixtures("one_thread")  # in-process runs: one thread, as the subprocesses


# --- holding it ---


def test_out_naming_an_existing_file(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    res = two_steps(tmp_path, "--out", str(tmp_path / "notes.txt"))
    assert_user_error(res, f"--out {tmp_path / 'notes.txt'}", "existing file")
    assert (tmp_path / "notes.txt").read_text() == "mine"
    with raises("which is a file, not a folder"):
        with run_folder.hold_run_folder(tmp_path / "notes.txt" / "run"):
            pass


def test_a_second_run_on_the_same_out_is_refused_while_the_first_holds_it(tmp_path):
    out = tmp_path / "run"
    with run_folder.hold_run_folder(out):  # the first run, in this process
        res = two_steps(tmp_path, "--out", str(out))
        assert_user_error(
            res, f"--out {out} is in use by another train.py run (pid {os.getpid()}", "Wait for it to end"
        )
        assert not (out / "last.pt").exists()
        with raises(f"--out {out} is in use by another train.py run"):
            with run_folder.hold_run_folder(out, seeds=[0, 1]):
                pass
    with run_folder.hold_run_folder(tmp_path, seeds=[0, 1]) as folder:  # an ensemble's member folders are held too
        assert folder.members == [tmp_path / "seed_0", tmp_path / "seed_1"]
        with raises(f"--out {tmp_path / 'seed_1'} is in use"):
            with run_folder.hold_run_folder(tmp_path / "seed_1"):
                pass


def test_ensembles_of_other_datasets_share_an_out_and_the_same_members_do_not(tmp_path):
    """A sweep's groups run at once in one --out: each holds its OUT/DATASET/MODEL folders, not OUT."""
    hopper, walker = (
        ["dt-primal/hopper/medium-v0", "dt-primal/hopper/medium-replay-v0"],
        ["dt-primal/walker2d/medium-v0", "dt-primal/walker2d/medium-replay-v0"],
    )
    with run_folder.hold_run_folder(tmp_path, [0, 1], datasets=hopper, model="dt"):
        with (
            run_folder.hold_run_folder(tmp_path, [0, 1], datasets=walker, model="dt"),
            run_folder.hold_run_folder(tmp_path, [0, 1], datasets=hopper, model="primal"),
        ):
            pass
        group = tmp_path / "dt-primal_hopper_medium-replay-v0" / "dt"
        with raises(f"--out {group} is in use"):  # other seeds of the same dataset and model: their report clashes
            with run_folder.hold_run_folder(tmp_path, [2], datasets=[walker[0], hopper[1]], model="dt"):
                pass


def test_a_killed_run_leaves_no_lock_that_blocks(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    code = (
        "import sys, time; from dt_primal.files.run_folder import hold_run_folder\n"
        f"with hold_run_folder({str(out)!r}):\n print('held', flush=True); time.sleep(600)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    with raises("in use by another train.py run"):
        with run_folder.hold_run_folder(out):
            pass
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=30)
    holder.stdout.close()
    assert (out / run_folder.LOCK_NAME).exists()  # the file stays; its lock went with the process
    with run_folder.hold_run_folder(out):
        pass


def test_the_sweeps_lock_on_the_same_folder_does_not_block_its_train_py(tmp_path):
    import fcntl

    out = tmp_path / "group"
    out.mkdir()
    with open(out / ".lock", "w") as lock:  # what commands.sweep holds while its train.py child runs in the folder
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        res = two_steps(tmp_path, "--seeds", "0", "1", "--out", str(out))
    assert res.returncode == 0, res.stderr
    assert (out / "seed_1" / "eval.json").exists()


def test_an_out_folder_that_cannot_be_written(tmp_path, monkeypatch, capsys):
    def denied(self, *args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(self))

    monkeypatch.setattr(type(tmp_path), "mkdir", denied)
    with raises(f"--out {tmp_path / 'ro' / 'run'}", "Permission denied"):
        with run_folder.hold_run_folder(tmp_path / "ro" / "run"):
            pass
    data = hopper_file(tmp_path)  # and train.py says so before training
    train_exits_2(
        capsys, "--dataset", data, *TWO_STEPS, "--out", tmp_path / "ro" / "r", phrase="Cannot write into --out"
    )


def test_a_run_never_writes_through_a_link_nor_over_a_users_file(tmp_path, capsys):
    data = tmp_path / "hopper_tiny.hdf5"
    write_d4rl(data, make_episodes(lengths=(40, 25), seed=3))
    precious = tmp_path / "precious.txt"
    for name in (".train.lock", "eval.json", "dataset.json"):
        precious.write_text("mine")
        out = tmp_path / f"out{name}"
        out.mkdir()
        (out / name).symlink_to(precious)
        train_exits_2(capsys, "--dataset", data, *TWO_STEPS, "--out", out, phrase=f"{out / name} is a symbolic link")
        assert precious.read_text() == "mine"
    for name in ("eval.json", "dataset.json"):
        out = tmp_path / f"own{name}"
        out.mkdir()
        (out / name).write_text("my notes")
        phrase = f"already holds {name}, which no run of dt-primal wrote there"
        train_exits_2(capsys, "--dataset", data, *TWO_STEPS, "--out", out, phrase=phrase)
        assert (out / name).read_text() == "my notes"
    res = run("train.py", "--dataset", str(data), *TWO_STEPS, "--out", str(out))  # and so does the command
    assert_user_error(res, "already holds dataset.json")


# --- resuming in it ---


def test_resume_refuses_other_data_and_a_fresh_run_refuses_an_old_folder(run_dir, tmp_path):
    data = load_dataset(str(run_dir.parent / "hopper_tiny.hdf5"))
    cfg = small_config(steps=5, max_ep_len=50, out=str(run_dir))
    with raises("already holds a run"):
        training.train(cfg, data)
    write_pickle(tmp_path / "hopper.pkl", make_episodes(lengths=(30, 40), seed=9))
    other = load_dataset(str(tmp_path / "hopper.pkl"))
    with raises(f"Resume with --dataset {data.source}"):
        training.train(cfg, other, resume=True)


def test_a_dataset_that_changed_on_disk_between_two_resumes(tmp_path):
    path, out = hopper_file(tmp_path), tmp_path / "run"
    assert run("train.py", "--dataset", str(path), *TWO_STEPS, "--out", str(out)).returncode == 0
    assert json.loads((out / "dataset.json").read_text())["steps"] == 158
    with h5py.File(path, "a") as f:
        rewards = f["rewards"][()]
        f["rewards"][0] = rewards[0] + 1  # same size, same observations (so the same normalisation): one reward differs
    res = run("train.py", "--resume", "--out", str(out), "--steps", "4")
    assert_user_error(
        res,
        f"The dataset {path} changed since the run in {out} started",
        "as many as when the run started, but other values",
    )
    with h5py.File(path, "a") as f:
        f["rewards"][0] = rewards[0]
    data = load_dataset(str(path))
    with run_folder.hold_run_folder(out) as folder:
        record_dataset(folder, data, resume=True)  # the data it started on: continues


def test_resume_after_a_crash_that_cut_the_last_line_of_the_curve(run_dir, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(run_dir, out)
    (out / "evals.jsonl").write_text('["not", "a point"]\n{"step": 1, "rep')
    res = run("train.py", "--resume", "--out", str(out), "--steps", "3")
    assert res.returncode == 0, res.stderr
    assert "left out 2 damaged lines" in res.stderr


def test_resume_of_a_run_past_steps_says_so(tmp_path, capsys):
    data = load_dataset(str(hopper_file(tmp_path)))
    cfg = make_config(**SMALL, steps=3, out=str(tmp_path / "run"))
    training.train(cfg, data)
    with raises(f"{tmp_path / 'run' / 'last.pt'}", "already at step 3", "--steps 2"):
        training.train(make_config(**SMALL, steps=2, out=cfg.out), data, resume=True)
    capsys.readouterr()
    training.train(cfg, data, resume=True)  # exactly at --steps: the final evaluation again, and a line saying so
    assert "already at step 3 = --steps; nothing to train, only the final evaluation runs" in capsys.readouterr().out
