"""Bad input that used to get through: each case now ends in one ``error:`` paragraph (status 2) that
says what to do, or a ``note:`` when the input may be meant."""

import argparse
import dataclasses
import errno
import json
import os
import pickle
import signal
import subprocess
import sys

import h5py
import numpy as np
import pytest
import torch
from conftest import ENV, QUICK, ROOT, assert_user_error, exit_of, hopper_file, make_episodes, raises, run, write_minari

from datasets import suite
from datasets.loaders import load_dataset
from datasets.synthetic import write_d4rl
from dt_primal import machine, run_folder
from dt_primal.cli import run_main
from dt_primal.cli.train import train_command
from dt_primal.config import Config, make_config
from dt_primal.data import Trajectories
from dt_primal.errors import phase
from dt_primal.evaluation import checks as evaluate_checks
from dt_primal.evaluation.reports import write_report
from dt_primal.training import checks, memory
from dt_primal.training.resume import record_dataset


def train_py(*args, timeout=120):
    return subprocess.run(
        [sys.executable, "train.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=ENV
    )


def hopper_data(tmp_path, name="hopper_tiny.hdf5", **change):
    """The tiny Hopper file of test_train (4 episodes, 158 steps) with some arrays changed."""
    eps = make_episodes(lengths=(40, 25, 60, 33), seed=3)
    for key, f in change.items():
        eps = [dict(e, **{key: f(e[key])}) for e in eps]
    write_d4rl(tmp_path / name, eps)
    return tmp_path / name


def cfg(**change):
    return make_config(
        **{
            **dict(
                dataset="tiny",
                d_model=32,
                n_head=2,
                n_layer=2,
                s=8,
                device="cpu",
                batch_size=8,
                eval_episodes=1,
                steps=10,
                warmup_steps=2,
            ),
            **change,
        }
    )


# --- the rows of the report: actions, long episodes, targets, --out, two runs, a directory ---


def test_actions_outside_the_action_space_are_refused_naming_column_range_and_bounds(tmp_path):
    path = hopper_data(tmp_path, actions=lambda a: a * 3)
    res = train_py("--dataset", str(path), *QUICK, "--steps", "2", "--out", str(tmp_path / "run"))
    assert_user_error(
        res,
        "actions outside Hopper-v5's action space",
        "[-1, 1] in every column",
        "column 0 ranges from -2.",
        "--rescale-actions",
    )
    assert not (tmp_path / "run").exists()  # a refused run leaves no folder behind


def test_rescale_actions_scales_them_into_the_bounds_and_says_so(tmp_path, capsys):
    data = load_dataset(str(hopper_data(tmp_path, actions=lambda a: a * 3)))
    raw = data.actions.copy()
    checks.check_run_inputs(data, cfg(), rescale_actions=True)
    note = capsys.readouterr().err
    assert (
        note.startswith("note: --rescale-actions: scaled the dataset's actions into Hopper-v5's bounds")
        and "column 2 divided by 2.9" in note
    )
    assert np.abs(data.actions).max() <= 1 and np.isclose(np.abs(data.actions).max(0), 1).all()
    np.testing.assert_allclose(data.actions * np.abs(raw).max(0), raw, rtol=1e-5)  # only scaled
    checks.check_run_inputs(data, cfg())  # now inside: accepted without the flag

    res = train_py("--dataset", data.source, *QUICK, "--steps", "2", "--rescale-actions", "--out", str(tmp_path / "r"))
    assert res.returncode == 0 and "note: --rescale-actions: scaled" in res.stderr, res.stderr


def test_actions_at_the_bounds_are_fine(tmp_path):
    data = load_dataset(str(hopper_data(tmp_path, actions=lambda a: np.clip(a * 3, -1, 1))))
    checks.check_run_inputs(data, cfg())


def test_episode_longer_than_max_ep_len_names_the_longest_and_the_flag(tmp_path):
    write_d4rl(tmp_path / "hopper.hdf5", make_episodes(lengths=(1500, 30)))
    res = train_py("--dataset", str(tmp_path / "hopper.hdf5"), *QUICK, "--steps", "2", "--out", str(tmp_path / "r"))
    assert_user_error(
        res,
        "episodes longer than --max-ep-len 1000",
        "the longest (episode 0) has 1500 steps",
        "Pass --max-ep-len 1500",
        "'timeouts'",
    )
    data = load_dataset(str(tmp_path / "hopper.hdf5"))
    checks.check_run_inputs(data, cfg(max_ep_len=1500))  # the flag that fixes it


def test_huge_and_non_finite_targets_are_refused(tmp_path):
    res = train_py(
        "--dataset",
        str(hopper_file(tmp_path)),
        *QUICK,
        "--steps",
        "2",
        "--targets",
        "1e30",
        "--out",
        str(tmp_path / "r"),
    )
    assert_user_error(res, "--targets 1e+30 divided by --reward-scale 1000", "conditioning return of 1e+27")
    for bad in (float("nan"), float("inf"), -float("inf")):
        with raises("--targets must be finite"):
            cfg(targets=[3600.0, bad])
    with raises("--targets 1e+13 divided by --reward-scale 1000"):
        evaluate_checks.check_targets([1e13], 1000.0)
    evaluate_checks.check_targets([-1e6, 3600.0], 1000.0)  # negative targets are fine


def test_a_target_far_above_the_data_trains_with_one_note(tmp_path, capsys):
    data = load_dataset(str(hopper_file(tmp_path)))
    checks.check_run_inputs(data, cfg(targets=[1e6, 2e6, 3600.0]))
    err = capsys.readouterr().err
    assert err.count("note:") == 1 and "--targets 1e+06 2e+06 are far above every return in the dataset" in err
    checks.check_run_inputs(data, cfg())  # the task's own targets: no note
    assert capsys.readouterr().err == ""


def test_data_returns_that_overflow_after_scaling_name_reward_scale(tmp_path):
    res = train_py(
        "--dataset",
        str(hopper_file(tmp_path)),
        *QUICK,
        "--steps",
        "2",
        "--reward-scale",
        "1e-42",
        "--out",
        str(tmp_path / "r"),
    )
    assert_user_error(res, "returns-to-go up to", "divided by --reward-scale 1e-42", "Pass a larger --reward-scale")
    data = load_dataset(str(hopper_data(tmp_path, rewards=lambda r: r * 1e14)))
    with raises("Pass a larger --reward-scale (--reward-scale 1e+14"):
        checks.check_run_inputs(data, cfg())


def test_out_naming_an_existing_file(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    res = train_py(
        "--dataset", str(hopper_file(tmp_path)), *QUICK, "--steps", "2", "--out", str(tmp_path / "notes.txt")
    )
    assert_user_error(res, f"--out {tmp_path / 'notes.txt'} is an existing file, not a folder")
    assert (tmp_path / "notes.txt").read_text() == "mine"
    with raises("which is a file, not a folder"):
        with run_folder.hold_run_folder(tmp_path / "notes.txt" / "run"):
            pass


def test_a_second_run_on_the_same_out_is_refused_while_the_first_holds_it(tmp_path):
    out = tmp_path / "run"
    with run_folder.hold_run_folder(out):  # the first run, in this process
        res = train_py("--dataset", str(hopper_file(tmp_path)), *QUICK, "--steps", "2", "--out", str(out))
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
        "import sys, time; from dt_primal.run_folder import hold_run_folder\n"
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
        res = train_py(
            "--dataset", str(hopper_file(tmp_path)), *QUICK, "--steps", "2", "--seeds", "0", "1", "--out", str(out)
        )
    assert res.returncode == 0, res.stderr
    assert (out / "seed_1" / "eval.json").exists()


def test_dataset_naming_a_directory(tmp_path):
    with raises(f"--dataset {tmp_path} is a directory, not a dataset file"):
        load_dataset(str(tmp_path))
    hopper_file(tmp_path)
    with raises(f"It holds {tmp_path / 'hopper_tiny.hdf5'}: give one of them"):
        load_dataset(str(tmp_path))


def test_a_minari_folder_or_its_data_file_says_to_give_the_id(minari_home):
    write_minari("tests/hopper/folder-v0", make_episodes())
    folder = minari_home / "tests" / "hopper" / "folder-v0"
    for path in (folder, folder / "data" / "main_data.hdf5"):
        with raises(
            f"It is the Minari dataset tests/hopper/folder-v0: give its id instead, with $MINARI_DATASETS_PATH "
            f"pointing at the folder that holds it (MINARI_DATASETS_PATH={minari_home} "
        ):
            load_dataset(str(path))
    assert load_dataset("tests/hopper/folder-v0").lengths.tolist() == [7, 3, 12]


# --- wrong dtypes and values in the files ---


def _hdf5(path, **arrays):
    write_d4rl(path, make_episodes())
    with h5py.File(path, "a") as f:
        for key, value in arrays.items():
            del f[key]
            f[key] = value
    return str(path)


N = 22  # steps of make_episodes()


@pytest.mark.parametrize(
    "change, phrase",
    [
        (dict(rewards=np.array([b"1.5"] * N)), "'rewards' holds text (bytes) (dtype |S3), not real numbers"),
        (dict(rewards=np.zeros(N, np.complex64)), "'rewards' holds complex numbers"),
        (dict(observations=np.full((N, 11), 1e39)), "'observations' has 242 values beyond float32's range"),
        (
            dict(terminals=np.full(N, 0.5)),
            "'terminals' must be true/false (or 0/1) at each step, but has 22 other values",
        ),
        (dict(timeouts=np.r_[np.zeros(N - 1), np.nan]), "'timeouts' must be true/false"),
        (dict(rewards=np.float32(3)), "'rewards' is a single value, not an array"),
        (dict(actions=np.array([[(1, 2.0)] * 3] * N, dtype=[("a", "i4"), ("b", "f4")])), "'actions' holds records"),
    ],
)
def test_wrong_dtypes_in_a_d4rl_file(tmp_path, change, phrase):
    with raises(phrase):
        load_dataset(_hdf5(tmp_path / "hopper.hdf5", **change))


def test_integer_observations_and_actions_are_converted_to_float32(tmp_path):
    eps = make_episodes()
    ints = [
        dict(
            e,
            observations=np.rint(e["observations"] * 100).astype(np.int64),
            actions=np.sign(e["actions"]).astype(np.int8),
            terminations=e["terminations"].astype(np.uint8),
        )
        for e in eps
    ]
    write_d4rl(tmp_path / "hopper.hdf5", ints)
    data = load_dataset(str(tmp_path / "hopper.hdf5"))
    assert data.observations.dtype == data.actions.dtype == np.float32
    np.testing.assert_array_equal(data.observations[:7], ints[0]["observations"][:-1])
    assert data.lengths.tolist() == [7, 3, 12]
    checks.check_run_inputs(data, cfg())


@pytest.mark.parametrize(
    "trajectory, phrase",
    [
        (
            dict(observations=[[0.0] * 11, [0.0] * 10], actions=np.zeros((2, 3)), rewards=np.zeros(2)),
            "'observations' of trajectory 0 is not an array of numbers",
        ),
        (
            dict(observations=np.zeros((2, 11)), actions=np.zeros((2, 3)), rewards=np.array(["a", "b"])),
            "'rewards' of trajectory 0 holds text",
        ),
        (
            dict(observations=np.zeros((2, 11)), actions=np.zeros((2, 3)), rewards=np.zeros(2), dones=np.array([0, 2])),
            "'terminals' of trajectory 0 must be true/false",
        ),
    ],
)
def test_wrong_values_in_a_decision_transformer_pickle(tmp_path, trajectory, phrase):
    (tmp_path / "hopper.pkl").write_bytes(pickle.dumps([trajectory]))
    with raises(phrase):
        load_dataset(str(tmp_path / "hopper.pkl"))


def test_a_pickled_d4rl_dict_says_what_it_is(tmp_path):
    (tmp_path / "hopper.pkl").write_bytes(
        pickle.dumps({"observations": np.zeros((3, 11)), "actions": np.zeros((3, 3))})
    )
    with raises("found dict. It holds one dict of arrays, as a D4RL file does"):
        load_dataset(str(tmp_path / "hopper.pkl"))


def test_dict_observations_are_refused():
    eps = [
        dict(
            observations={"achieved_goal": np.zeros((3, 2)), "observation": np.zeros((3, 4))},
            actions=np.zeros((2, 3)),
            rewards=np.zeros(2),
        )
    ]
    with raises("'observations' of episode 0 is a dict (keys achieved_goal, observation)"):
        Trajectories.from_episodes(eps, source="x")


def test_metadata_of_another_task_than_env_is_refused():
    eps = make_episodes(obs_dim=17, act_dim=6)  # Walker2d-v5 and HalfCheetah-v5 have the same sizes
    write_minari("tests/walker2d/sizes-v0", eps, env="Walker2d-v5")
    with raises("was recorded on Walker2d-v5 (its metadata says so), but --env halfcheetah asks for HalfCheetah-v5"):
        load_dataset("tests/walker2d/sizes-v0", env="halfcheetah")
    assert load_dataset("tests/walker2d/sizes-v0", env="walker2d").env == "Walker2d-v5"


def test_observations_too_large_to_normalise(tmp_path):
    data = load_dataset(str(hopper_data(tmp_path, observations=lambda o: o * 1e20)))
    with raises("observations too large to normalise in float32: column 0 reaches"):
        checks.check_run_inputs(data, cfg())


def test_a_dataset_that_changed_on_disk_between_two_resumes(tmp_path):
    path, out = hopper_file(tmp_path), tmp_path / "run"
    assert train_py("--dataset", str(path), *QUICK, "--steps", "2", "--out", str(out)).returncode == 0
    assert json.loads((out / "dataset.json").read_text())["steps"] == 158
    with h5py.File(path, "a") as f:
        rewards = f["rewards"][()]
        f["rewards"][0] = rewards[0] + 1  # same size, same observations (so the same normalisation): one reward differs
    res = train_py("--resume", "--out", str(out), "--steps", "4")
    assert_user_error(
        res,
        f"The dataset {path} changed since the run in {out} started",
        "158 steps in 4 episodes, as many as when the run started, but other values",
        "Restore the data",
    )
    with h5py.File(path, "a") as f:
        f["rewards"][0] = rewards[0]
    data = load_dataset(str(path))
    with run_folder.hold_run_folder(out) as folder:
        record_dataset(folder, data, resume=True)  # the data it started on: continues


# --- options ---


@pytest.mark.parametrize(
    "change, phrase",
    [
        (dict(dataset=""), "--dataset is empty"),
        (dict(out=" "), "--out is empty"),
        (dict(env=""), "--env is empty"),
        (dict(seed=-1), "--seed must be between 0 and 4294967295 (got -1)"),
        (dict(seed=2**32), "--seed must be between 0 and 4294967295"),
        (dict(reward_scale=float("inf")), "--reward-scale must be finite"),
        (dict(lr=float("inf"), weight_decay=float("inf")), "--lr, --weight-decay must be finite"),
        (dict(device="gpu"), "--device must be auto, cpu, cuda or cuda:N (got 'gpu')"),
        (dict(device="cuda:x"), "--device must be auto, cpu, cuda or cuda:N"),
    ],
)
def test_options_that_used_to_pass_validation(change, phrase):
    with raises(phrase):
        cfg(**change)


@pytest.mark.parametrize(
    "seeds, phrase",
    [
        (["--seeds", "0", "-2"], "--seeds must be between 0 and 4294967295 (got -2)"),
        (["--seeds", "3", "3"], "--seeds lists a seed twice (3 3)"),
        (["--seeds", "0", "1", "--seed", "5"], "--seed 5 and --seeds 0 1 were both given"),
    ],
)
def test_seeds_that_cannot_seed_the_members(tmp_path, seeds, phrase):
    res = train_py(
        "--dataset", str(hopper_file(tmp_path)), *QUICK, "--steps", "2", *seeds, "--out", str(tmp_path / "r")
    )
    assert_user_error(res, phrase)


def test_a_gpu_index_this_machine_lacks(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with raises("--device cuda:2 names a GPU this machine does not have: PyTorch sees 2 (cuda:0 to cuda:1)"):
        machine.check_device("cuda:2")
    machine.check_device("cuda:1")


def test_max_ep_len_far_beyond_any_episode_is_refused_and_below_the_time_limit_noted(tmp_path, capsys):
    data = load_dataset(str(hopper_file(tmp_path)))
    with raises("--max-ep-len 100000000 is far more than any episode needs"):
        checks.check_run_inputs(data, cfg(max_ep_len=10**8))
    checks.check_run_inputs(data, cfg(max_ep_len=100))
    assert "note: --max-ep-len 100 is below Hopper-v5's time limit of 1000 steps" in capsys.readouterr().err


def test_warm_up_longer_than_the_run_is_noted(tmp_path, capsys):
    data = load_dataset(str(hopper_file(tmp_path)))
    checks.check_run_inputs(data, cfg(steps=2000, warmup_steps=10000))
    err = capsys.readouterr().err
    assert "note: --warmup-steps 10000 is more than --steps 2000" in err and "reaches only 20% of --lr 0.001" in err
    checks.check_run_inputs(data, cfg(steps=2000, warmup_steps=200))
    assert capsys.readouterr().err == ""


def test_an_evaluation_that_cannot_fit_in_memory_is_refused_before_training(tmp_path):
    data = load_dataset(str(hopper_file(tmp_path)))
    with raises("The evaluation would run 20,000,000 episodes at once (--eval-episodes 10000000 x 2 targets x 1 seed)"):
        checks.check_run_inputs(data, cfg(eval_episodes=10**7))
    with raises("Lower --eval-episodes-during"):
        checks.check_run_inputs(data, cfg(eval_episodes_during=10**7), seeds=[0, 1])


# --- out of memory, full or read-only disks, Ctrl-C while building a dataset ---


def test_gpu_out_of_memory_is_a_message_with_the_options_that_need_less(capsys):
    def main():
        raise torch.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of "
            "79.1 GiB of which 1.2 GiB is free. Including non-PyTorch memory, ..."
        )

    code, err = exit_of(main, capsys)
    assert code == 2 and err.strip().startswith("error: Out of GPU memory") and "Traceback" not in err
    assert "Tried to allocate 20.00 GiB" in err and "--batch-size" in err and "--eval-episodes" in err

    def evaluation():  # the evaluation, tagged where it starts: only its options
        with phase("evaluation"):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")

    code, err = exit_of(evaluation, capsys)
    assert code == 2 and "in the evaluation" in err and "--eval-episodes" in err and "--batch-size" not in err

    def evaluate_py():  # evaluate.py's rollouts: its own option
        with phase("evaluate.py"):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")

    code, err = exit_of(evaluate_py, capsys)
    assert code == 2 and "while evaluating" in err and "lower --episodes" in err and "--eval-episodes" not in err


def test_cpu_out_of_memory_while_training(tmp_path, monkeypatch, capsys):
    # 10^14 windows: more than any address space, so the allocation fails at once on every machine; the check
    # of a batch's memory, which refuses it before training, is switched off here to reach the allocator
    monkeypatch.setattr(memory, "available_bytes", lambda device: (0, "memory"))
    argv = [
        "--dataset",
        str(hopper_file(tmp_path)),
        *QUICK,
        "--steps",
        "2",
        "--batch-size",
        "100000000000000",
        "--out",
        str(tmp_path / "r"),
    ]
    code, err = exit_of(lambda: train_command(argv, load_dataset), capsys)
    assert code == 2 and "Traceback" not in err, err
    assert "\nerror: Out of memory while training" in err and "lower --batch-size" in err


def test_a_full_or_read_only_disk_is_a_message(capsys):
    def full():
        raise OSError(errno.ENOSPC, "No space left on device", "runs/x/eval.json")

    code, err = exit_of(full, capsys)
    assert code == 2 and "error: Could not write runs/x/eval.json (No space left on device). Free disk space" in err
    assert "--resume" in err

    def read_only():
        raise PermissionError(errno.EACCES, "Permission denied", "runs/x/evals.jsonl")

    code, err = exit_of(read_only, capsys)
    assert code == 2 and "Could not write runs/x/evals.jsonl (Permission denied). Make it writable" in err

    def other():
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", "x")

    with pytest.raises(FileNotFoundError):  # not a disk problem: a bug, with its traceback
        run_main(other)


def test_a_report_that_cannot_be_written(tmp_path, monkeypatch):
    results = [
        {
            "checkpoint": "a",
            "targets": [
                {
                    "target": 1.0,
                    "return_mean": 1.0,
                    "return_std": 0.0,
                    "normalized_mean": 1.0,
                    "normalized_std": 0.0,
                    "episodes": 1,
                }
            ],
        }
    ]

    def no_space(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fdopen", no_space)  # the report's new file, before it is renamed into place
    with raises(f"Could not write the report {tmp_path / 'r.json'} (No space left on device)"):
        write_report(results, tmp_path / "r.json")


def test_an_out_folder_that_cannot_be_written(tmp_path, monkeypatch):
    def denied(self, *args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(self))

    monkeypatch.setattr(type(tmp_path), "mkdir", denied)
    with raises(
        f"Cannot write into --out {tmp_path / 'ro' / 'run'} (Permission denied); choose a folder you can write to"
    ):
        with run_folder.hold_run_folder(tmp_path / "ro" / "run"):
            pass


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_out_folder(tmp_path):
    (tmp_path / "ro").mkdir(mode=0o555)
    res = train_py("--dataset", str(hopper_file(tmp_path)), *QUICK, "--steps", "2", "--out", str(tmp_path / "ro" / "r"))
    assert_user_error(res, "Cannot write into --out", "Permission denied")


def test_ctrl_c_while_building_a_suite_dataset(capsys, monkeypatch):
    def interrupted_rollouts(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(suite, "_rollouts", interrupted_rollouts)
    code, err = exit_of(lambda: load_dataset("dt-primal/hopper/random-v0"), capsys)
    assert code == 130
    assert err.strip() == (
        "interrupted while building dt-primal/hopper/random-v0; the partly built dataset does not "
        "count, so the next run that needs it builds it again from the start"
    )
    assert not suite.is_built("dt-primal/hopper/random-v0")

    from concurrent.futures.process import BrokenProcessPool

    def broken_rollouts(*args, **kwargs):
        raise BrokenProcessPool("A process in the process pool was terminated abruptly")

    monkeypatch.setattr(suite, "_rollouts", broken_rollouts)
    with raises("Building dt-primal/hopper/random-v0 stopped: a worker process ended abruptly"):
        load_dataset("dt-primal/hopper/random-v0")
    with raises("Building dt-primal/hopper/random-v0 stopped"):  # python -m datasets build: the same message
        suite.build(suite.TASKS["hopper"], "random", steps=10)


# --- evaluate.py's options (dt_primal.evaluation.checks.check_evaluate_args / check_evaluate_run) ---


def _args(tmp_path, **change):
    ckpt = tmp_path / "last.pt"
    ckpt.write_bytes(b"PK")
    return argparse.Namespace(
        **{
            **dict(
                checkpoints=[ckpt],
                episodes=2,
                out=tmp_path / "ev.json",
                env_workers=None,
                targets=None,
                seed=None,
                device=None,
                precision=None,
            ),
            **change,
        }
    )


def test_evaluate_options(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    cases = [
        (dict(out=tmp_path), "is a directory; give the JSON file to write"),
        (dict(out=tmp_path / "last.pt"), "would overwrite the checkpoint"),
        (dict(out=tmp_path / "last.md"), "would overwrite the checkpoint"),  # its Markdown table would
        (dict(out=tmp_path / "notes.txt"), "already exists and is not an evaluation report"),
        (dict(out=tmp_path / "notes.txt" / "ev.json"), "which is a file, not a folder"),
        (dict(env_workers=-1), "--env-workers must be at least 1"),
        (dict(episodes=0), "--episodes must be at least 1"),
        (dict(targets=[float("nan")]), "--targets must be finite"),
        # the options' one check, Config's, as train.py's
        (dict(device="gpu"), "--device must be auto, cpu, cuda or cuda:N (got 'gpu')"),
        (dict(precision="fp16"), "--precision must be one of auto, fp32, tf32, bf16 (got 'fp16')"),
        (dict(seed=-1), "--seed must be between 0 and 4294967295 (got -1)"),
    ]
    for change, phrase in cases:
        args = _args(tmp_path, **change)
        if change.get("out") == tmp_path / "last.md":
            args.checkpoints = [tmp_path / "last.md"]
            args.checkpoints[0].write_bytes(b"PK")
            args.out = tmp_path / "last.json"
        with raises(phrase):
            evaluate_checks.check_evaluate_args(args)
    (tmp_path / "ev.json").write_text(json.dumps({"checkpoints": [], "across_checkpoints": []}))
    evaluate_checks.check_evaluate_args(_args(tmp_path))  # an earlier report is replaced


def test_evaluate_targets_and_episodes_against_the_checkpoints(tmp_path):
    cfg = Config(dataset="tiny", max_ep_len=1000)
    ckpt = {
        "config": dataclasses.asdict(cfg),
        "task": "hopper",
        "model_config": dataclasses.asdict(cfg.model_config(11, 3)),
    }
    with raises("--targets 1e+30 divided by --reward-scale 1000"):
        evaluate_checks.check_evaluate_run(_args(tmp_path, targets=[1e30]), [ckpt])
    with raises("--episodes 10000000 per target of 2 checkpoints"):
        evaluate_checks.check_evaluate_run(_args(tmp_path, episodes=10**7), [ckpt, ckpt])
    evaluate_checks.check_evaluate_run(_args(tmp_path, targets=[3600.0]), [ckpt])
    with raises(
        "holds a model for observations of size 11 and actions of size 3, but its task HalfCheetah-v5 has 17 and 6"
    ):
        evaluate_checks.check_evaluate_run(_args(tmp_path), [{**ckpt, "task": "halfcheetah"}])


def test_evaluate_py_checks_its_options_and_the_targets_against_the_checkpoint(tmp_path):
    res = train_py("--dataset", str(hopper_file(tmp_path)), *QUICK, "--steps", "2", "--out", str(tmp_path / "run"))
    assert res.returncode == 0, res.stderr

    def evaluate_py(*args):
        return subprocess.run(
            [sys.executable, "evaluate.py", str(tmp_path / "run" / "last.pt"), "--episodes", "1", *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            env=ENV,
        )

    assert_user_error(evaluate_py("--out", str(tmp_path)), "is a directory; give the JSON file to write")
    assert_user_error(
        evaluate_py("--out", str(tmp_path / "ev.json"), "--env-workers", "0"), "--env-workers must be at least 1"
    )
    assert_user_error(
        evaluate_py("--out", str(tmp_path / "ev.json"), "--targets", "1e30"),
        "--targets 1e+30 divided by --reward-scale 1000",
    )
    assert not (tmp_path / "ev.json").exists()


def test_a_path_too_long_for_the_file_system_is_a_message_in_any_command(tmp_path):
    long = tmp_path / ("x" * 300)
    for argv in (
        ["train.py", "--preset", "quick", "--steps", "1", "--out", long],
        ["evaluate.py", f"{long}.pt", "--out", tmp_path / "e.json"],
        ["-m", "commands.sweep.records", f"{long}.tgz", tmp_path / "r"],
    ):
        res = run(*map(str, argv))
        assert res.returncode == 2 and "too long for the file system" in res.stderr, (argv[0], res.stderr[-300:])
