"""Interruptions and failures mid-run (Ctrl-C, SIGTERM, out of memory, a full disk, a non-finite loss) end in
one message and lose nothing already written."""

import errno
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from conftest import (
    ROOT,
    SMALL,
    TINY,
    TWO_STEPS,
    exit_of,
    hopper_file,
    one_thread_env,
    raises,
    run,
)

from datasets import suite
from datasets.loaders import load_dataset
from dt_primal.cli import run_main
from dt_primal.cli.train import train_command
from dt_primal.config import make_config
from dt_primal.errors import UserError, phase
from dt_primal.evaluation.reports import write_report
from dt_primal.files import checkpoint
from dt_primal.model.transformer import dt_loss
from dt_primal.training import loop as training
from dt_primal.training import memory, step

pytestmark = pytest.mark.usefixtures("one_thread")  # in-process runs: one thread, as the subprocesses


def test_ctrl_c_outside_the_training_loop_is_one_line(capsys):
    def interrupted():
        raise KeyboardInterrupt

    try:
        run_main(interrupted)
    except (SystemExit, KeyboardInterrupt) as exc:
        outcome = exc
    assert isinstance(outcome, SystemExit) and outcome.code == 130
    assert capsys.readouterr().err.strip().startswith("interrupted")


def test_ctrl_c_while_building_a_suite_dataset(capsys, monkeypatch):
    def interrupted_rollouts(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(suite, "rollouts", interrupted_rollouts)
    code, err = exit_of(lambda: load_dataset("dt-primal/hopper/random-v0"), capsys)
    assert code == 130
    assert err.strip().count("\n") == 0 and "interrupted while building dt-primal/hopper/random-v0" in err, err
    assert "builds it again" in err
    assert not suite.is_built("dt-primal/hopper/random-v0")

    from concurrent.futures.process import BrokenProcessPool

    def broken_rollouts(*args, **kwargs):
        raise BrokenProcessPool("A process in the process pool was terminated abruptly")

    monkeypatch.setattr(suite, "rollouts", broken_rollouts)
    with raises("Building dt-primal/hopper/random-v0 stopped: a worker process ended abruptly"):
        load_dataset("dt-primal/hopper/random-v0")
    with raises("Building dt-primal/hopper/random-v0 stopped"):  # python -m datasets build: the same message
        suite.build(suite.TASKS["hopper"], "random", steps=10)


def test_sigterm_checkpoints_and_resume_matches_an_uninterrupted_run(tmp_path):
    data = load_dataset(str(hopper_file(tmp_path)))
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [
            sys.executable,
            "train.py",
            "--dataset",
            data.source,
            *TINY,
            "--batch-size",
            "8",
            "--warmup-steps",
            "5",
            "--eval-every",
            "100000",
            "--eval-episodes",
            "1",
            "--seed",
            "5",
            "--checkpoint-every",
            "5",
            "--steps",
            "100000",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        env=one_thread_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 120
    while not (out / "last.pt").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert "stopped by signal SIGTERM" in stderr and "continue with --resume" in stderr
    stopped = torch.load(out / "last.pt", weights_only=True)["step"]
    assert 5 <= stopped < 100000

    res = run("train.py", "--resume", "--out", str(out), "--steps", str(stopped + 10))  # settings from the checkpoint
    assert res.returncode == 0, res.stderr
    assert f"resumed from {out / 'last.pt'} at step {stopped}" in res.stdout
    training.train(
        make_config(
            **{
                **SMALL,
                "seed": 5,
                "checkpoint_every": 5,
                "eval_every": 100000,
                "steps": stopped + 10,
                "out": str(tmp_path / "straight"),
            }
        ),
        data,
    )
    a, b = (torch.load(p / "last.pt", weights_only=True) for p in (out, tmp_path / "straight"))
    assert a["step"] == b["step"] == stopped + 10
    for k in a["model"]:
        torch.testing.assert_close(a["model"][k], b["model"][k], rtol=0, atol=0, msg=k)


def _nan_loss_at(at):
    calls = 0

    def loss(*args):
        nonlocal calls
        calls += 1
        total, action, j2 = dt_loss(*args)
        return (total * float("nan") if calls == at else total), action, j2

    return loss


def _inf_gradient_at(at, clip=step.clip_per_member):
    calls = 0

    def clip_with_inf(grads, max_norm):  # that step's loss is finite, its update is not
        nonlocal calls
        calls += 1
        if calls == at:
            grads[0].fill_(float("inf"))
        return clip(grads, max_norm)

    return clip_with_inf


@pytest.mark.parametrize(
    "target, poison, at, kept",
    [
        ("dt_primal.model.build.dt_loss", _nan_loss_at, 13, 10),
        ("dt_primal.training.step.clip_per_member", _inf_gradient_at, 10, 5),
    ],
)
def test_non_finite_loss_or_weights_stop_the_run_and_keep_the_last_good_checkpoint(
    tmp_path, monkeypatch, target, poison, at, kept
):
    monkeypatch.setattr(target, poison(at))
    out = tmp_path / "run"
    cfg = make_config(**SMALL, steps=20, checkpoint_every=5, log_every=5, out=str(out))
    with pytest.raises(UserError) as refusal:
        training.train(cfg, load_dataset(str(hopper_file(tmp_path))))
    message = str(refusal.value)
    assert f"by step {(at + 4) // 5 * 5}" in message and f"keeps the weights of step {kept}" in message, message
    ckpt = checkpoint.load_checkpoint(out / "last.pt")
    assert ckpt["step"] == kept and all(torch.isfinite(v).all() for v in ckpt["model"].values())


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
        *TWO_STEPS,
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
    with raises(f"{tmp_path / 'r.json'}", "No space left on device"):
        write_report(results, tmp_path / "r.json")
