"""Options and configs that cannot work, alone or against the data, the checkpoints and the machine: refused
before anything runs (status 2, the option named), or a note where they may be meant."""

import argparse
import dataclasses
import json
import os

import numpy as np
import pytest
import torch
from conftest import (
    SMALL,
    TINY,
    TWO_STEPS,
    assert_user_error,
    exits_2,
    hopper_file,
    make_episodes,
    raises,
    run,
    small_config,
    train_exits_2,
    two_steps,
)

from commands import tables
from commands.sweep import command as sweep
from datasets import __main__ as datasets_main
from datasets.loaders import load_dataset
from datasets.synthetic import write_d4rl
from dt_primal import machine
from dt_primal.cli import train as train_cli
from dt_primal.config import Config, make_config
from dt_primal.evaluation import checks as evaluate_checks
from dt_primal.training import checks, memory
from dt_primal.training import loop as training

pytestmark = pytest.mark.usefixtures("one_thread")  # in-process runs: one thread, as the subprocesses


# --- options alone ---


def test_impossible_configs_are_all_named_at_once(tmp_path):
    res = run(
        "train.py",
        "--d-model",
        "30",
        "--n-head",
        "4",
        "--s",
        "0",
        "--context",
        "0",
        "--steps",
        "-1",
        "--out",
        str(tmp_path),
    )
    assert_user_error(
        res,
        "--d-model (30) must be a positive multiple of --n-head (4)",
        "--s (KSVD rank)",
        "--context must be at least 1",
        "--steps and --warmup-steps cannot be negative",
    )


@pytest.mark.parametrize(
    "change, phrase",
    [
        (dict(model="gpt"), "--model must be one of"),
        (dict(d_model=30, n_head=4), "positive multiple of --n-head"),
        (dict(s=-3), "--s (KSVD rank) must be positive"),
        (dict(context=0), "--context must be at least 1"),
        (dict(steps=-5), "cannot be negative"),
        (dict(targets=[]), "--targets needs at least one return"),
        (dict(eval_episodes=0), "--eval-episodes must be at least 1"),
        (dict(lr=float("nan")), "--lr > 0"),
        (dict(grad_clip=0.0), "--grad-clip > 0"),
    ],
)
def test_impossible_config(change, phrase):
    with raises(phrase):
        make_config(**change)


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
        small_config(**change)


def test_options_out_of_range(tmp_path, capsys):
    from commands.sweep.command import main as sweep

    data = tmp_path / "hopper.hdf5"
    write_d4rl(data, make_episodes(lengths=(40, 25), seed=3))
    huge = "--warmup-steps must be at most 1e+15"
    train_exits_2(capsys, "--dataset", data, "--warmup-steps", 10**26, "--out", tmp_path / "a", phrase=huge)
    for jobs in ("0", "-1"):
        argv = ["--datasets", "hopper", "--models", "dt", "--seeds", "0", "--jobs", jobs, "--out", str(tmp_path / "s")]
        exits_2(lambda: sweep(argv), capsys, f"--jobs must be at least 1 (got {jobs})")  # noqa: B023
    not_text = os.fsdecode(os.fsencode(tmp_path) + b"/\xff")  # as Python hands a command line's bytes over
    train_exits_2(capsys, "--dataset", data, "--out", not_text, phrase="--out holds bytes that are not UTF-8 text")


def test_abbreviated_options_are_unknown_in_every_command(tmp_path, capsys):
    res = run("evaluate.py", "x.pt", "--env", "walker2d", "--out", str(tmp_path / "e.json"), timeout=120)
    assert res.returncode == 2 and "unrecognized arguments: --env walker2d" in res.stderr, res.stderr
    for parse in (
        lambda: train_cli.parser().parse_args(["--eval-ep", "3"]),
        lambda: sweep.main(["--datasets", "x", "--model", "dt", "--out", str(tmp_path)]),
        lambda: datasets_main.main(["stats", "--episode", "3"]),
        lambda: tables.main(["--chec"]),  # every command's parser is dt_primal.cli.command_parser
    ):
        with pytest.raises(SystemExit) as exit_:
            parse()
        assert exit_.value.code == 2 and "unrecognized arguments: --" in capsys.readouterr().err


@pytest.mark.parametrize(
    "seeds, phrase",
    [
        (["--seeds", "0", "-2"], "--seeds must be between 0 and 4294967295 (got -2)"),
        (["--seeds", "3", "3"], "--seeds lists a seed twice (3 3)"),
        (["--seeds", "0", "1", "--seed", "5"], "--seed 5 and --seeds 0 1 were both given"),
    ],
)
def test_seeds_that_cannot_seed_the_members(tmp_path, seeds, phrase):
    res = two_steps(tmp_path, *seeds, "--out", str(tmp_path / "r"))
    assert_user_error(res, phrase)


def test_a_path_too_long_for_the_file_system_is_a_message_in_any_command(tmp_path):
    long = tmp_path / ("x" * 300)
    for argv in (
        ["train.py", "--preset", "quick", "--steps", "1", "--out", long],
        ["evaluate.py", f"{long}.pt", "--out", tmp_path / "e.json"],
        ["-m", "commands.sweep.records", f"{long}.tgz", tmp_path / "r"],
    ):
        res = run(*map(str, argv))
        assert res.returncode == 2 and "too long for the file system" in res.stderr, (argv[0], res.stderr[-300:])


# --- against the data ---


def test_actions_outside_the_action_space_are_refused_naming_column_range_and_bounds(tmp_path):
    path = hopper_file(tmp_path, actions=lambda a: a * 3)
    res = run("train.py", "--dataset", str(path), *TWO_STEPS, "--out", str(tmp_path / "run"))
    assert_user_error(
        res,
        "actions outside Hopper-v5's action space",
        "[-1, 1] in every column",
        "column 0 ranges from -2.",
        "--rescale-actions",
    )
    assert not (tmp_path / "run").exists()  # a refused run leaves no folder behind


def test_rescale_actions_scales_them_into_the_bounds_and_says_so(tmp_path, capsys):
    data = load_dataset(str(hopper_file(tmp_path, actions=lambda a: a * 3)))
    raw = data.actions.copy()
    checks.check_run_inputs(data, small_config(), rescale_actions=True)
    note = capsys.readouterr().err
    assert (
        note.startswith("note: --rescale-actions: scaled the dataset's actions into Hopper-v5's bounds")
        and "column 2 divided by 2.9" in note
    )
    assert np.abs(data.actions).max() <= 1 and np.isclose(np.abs(data.actions).max(0), 1).all()
    np.testing.assert_allclose(data.actions * np.abs(raw).max(0), raw, rtol=1e-5)  # only scaled
    checks.check_run_inputs(data, small_config())  # now inside: accepted without the flag

    res = run("train.py", "--dataset", data.source, *TWO_STEPS, "--rescale-actions", "--out", str(tmp_path / "r"))
    assert res.returncode == 0 and "note: --rescale-actions: scaled" in res.stderr, res.stderr


def test_actions_at_the_bounds_are_fine(tmp_path):
    data = load_dataset(str(hopper_file(tmp_path, actions=lambda a: np.clip(a * 3, -1, 1))))
    checks.check_run_inputs(data, small_config())


def test_episode_longer_than_max_ep_len_names_the_longest_and_the_flag(tmp_path):
    write_d4rl(tmp_path / "hopper.hdf5", make_episodes(lengths=(1500, 30)))
    res = run("train.py", "--dataset", str(tmp_path / "hopper.hdf5"), *TWO_STEPS, "--out", str(tmp_path / "r"))
    assert_user_error(
        res,
        "episodes longer than --max-ep-len 1000",
        "the longest (episode 0) has 1500 steps",
        "Pass --max-ep-len 1500",
        "'timeouts'",
    )
    data = load_dataset(str(tmp_path / "hopper.hdf5"))
    checks.check_run_inputs(data, small_config(max_ep_len=1500))  # the flag that fixes it


def test_max_ep_len_far_beyond_any_episode_is_refused_and_below_the_time_limit_noted(tmp_path, capsys):
    data = load_dataset(str(hopper_file(tmp_path)))
    with raises("--max-ep-len 100000000 is far more than any episode needs"):
        checks.check_run_inputs(data, small_config(max_ep_len=10**8))
    checks.check_run_inputs(data, small_config(max_ep_len=100))
    assert "note: --max-ep-len 100 is below Hopper-v5's time limit of 1000 steps" in capsys.readouterr().err


def test_huge_and_non_finite_targets_are_refused(tmp_path):
    res = two_steps(
        tmp_path,
        "--targets",
        "1e30",
        "--out",
        str(tmp_path / "r"),
    )
    assert_user_error(res, "--targets 1e+30 divided by --reward-scale 1000", "conditioning return of 1e+27")
    for bad in (float("nan"), float("inf"), -float("inf")):
        with raises("--targets must be finite"):
            small_config(targets=[3600.0, bad])
    with raises("--targets 1e+13 divided by --reward-scale 1000"):
        evaluate_checks.check_targets([1e13], 1000.0)
    evaluate_checks.check_targets([-1e6, 3600.0], 1000.0)  # negative targets are fine


def test_a_target_far_above_the_data_trains_with_one_note(tmp_path, capsys):
    data = load_dataset(str(hopper_file(tmp_path)))
    checks.check_run_inputs(data, small_config(targets=[1e6, 2e6, 3600.0]))
    err = capsys.readouterr().err
    assert err.count("note:") == 1 and "--targets 1e+06 2e+06 are far above every return in the dataset" in err
    checks.check_run_inputs(data, small_config())  # the task's own targets: no note
    assert capsys.readouterr().err == ""


def test_data_returns_that_overflow_after_scaling_name_reward_scale(tmp_path):
    res = two_steps(
        tmp_path,
        "--reward-scale",
        "1e-42",
        "--out",
        str(tmp_path / "r"),
    )
    assert_user_error(res, "returns-to-go up to", "divided by --reward-scale 1e-42", "Pass a larger --reward-scale")
    data = load_dataset(str(hopper_file(tmp_path, rewards=lambda r: r * 1e14)))
    with raises("Pass a larger --reward-scale (--reward-scale 1e+14"):
        checks.check_run_inputs(data, small_config())


def test_observations_too_large_to_normalise(tmp_path):
    data = load_dataset(str(hopper_file(tmp_path, observations=lambda o: o * 1e20)))
    with raises("observations too large to normalise in float32: column 0 reaches"):
        checks.check_run_inputs(data, small_config())


def test_warm_up_longer_than_the_run_is_noted(tmp_path, capsys):
    data = load_dataset(str(hopper_file(tmp_path)))
    checks.check_run_inputs(data, small_config(steps=2000, warmup_steps=10000))
    err = capsys.readouterr().err
    assert "note: --warmup-steps 10000 is more than --steps 2000" in err and "reaches only 20% of --lr 0.001" in err
    checks.check_run_inputs(data, small_config(steps=2000, warmup_steps=200))
    assert capsys.readouterr().err == ""


# --- against the machine ---


def test_a_gpu_index_this_machine_lacks(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with raises("--device cuda:2", "PyTorch sees 2"):
        machine.check_device("cuda:2")
    machine.check_device("cuda:1")


def test_a_batch_that_cannot_fit_in_memory_is_refused_before_training(tmp_path, monkeypatch):
    res = run(
        "train.py",
        "--dataset",
        str(hopper_file(tmp_path)),
        *TINY,
        "--batch-size",
        "100000000",
        "--steps",
        "2",
        "--out",
        str(tmp_path / "run"),
        timeout=120,
    )
    assert_user_error(
        res, "--batch-size 100000000 needs at least", "for the activations of one training step", "Lower --batch-size"
    )
    monkeypatch.setattr(memory, "available_bytes", lambda device: (1 << 30, "available memory"))
    cfg = make_config("quick", batch_size=256)
    memory.check_batch_memory(cfg, members=2)  # at least 0.7 GiB: may fit
    with raises("more than the 1.0 GiB of available memory here"):
        memory.check_batch_memory(cfg, members=3)
    for changes in ({"d_model": 8192, "n_head": 4}, {"s": 10**9}):  # the weights alone: not a batch to lower
        with raises("The model's weights, gradients and optimizer state need about"):
            memory.check_batch_memory(make_config("quick", **changes), members=1)
    with raises("Even one window of context 1000000"):  # was: "Lower --batch-size (about 0 fits at most)"
        memory.check_batch_memory(make_config("quick", context=10**6), members=1)


def test_an_evaluation_that_cannot_fit_in_memory_is_refused_before_training(tmp_path):
    data = load_dataset(str(hopper_file(tmp_path)))
    with raises("--eval-episodes 10000000", "20,000,000 episodes"):
        checks.check_run_inputs(data, small_config(eval_episodes=10**7))
    with raises("Lower --eval-episodes-during"):
        checks.check_run_inputs(data, small_config(eval_episodes_during=10**7), seeds=[0, 1])


def test_batch_must_split_evenly_over_processes(monkeypatch, tmp_path):
    data = load_dataset(str(hopper_file(tmp_path)))
    monkeypatch.setattr(training.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(training.dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(training.dist, "get_rank", lambda: 0)
    with raises("--batch-size 7 must be divisible by the number of processes (2)"):
        training.train(make_config(**{**SMALL, "batch_size": 7}, out=str(tmp_path / "run")), data)


# --- evaluate.py's options, against its checkpoints ---


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
                video=None,
                video_episodes=1,
                side_by_side=False,
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
    res = two_steps(tmp_path, "--out", str(tmp_path / "run"))
    assert res.returncode == 0, res.stderr

    def evaluate_py(*args):
        return run("evaluate.py", str(tmp_path / "run" / "last.pt"), "--episodes", "1", *args, timeout=120)

    assert_user_error(evaluate_py("--out", str(tmp_path)), "is a directory; give the JSON file to write")
    assert_user_error(
        evaluate_py("--out", str(tmp_path / "ev.json"), "--env-workers", "0"), "--env-workers must be at least 1"
    )
    assert_user_error(
        evaluate_py("--out", str(tmp_path / "ev.json"), "--targets", "1e30"),
        "--targets 1e+30 divided by --reward-scale 1000",
    )
    assert not (tmp_path / "ev.json").exists()
