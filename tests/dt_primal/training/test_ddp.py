"""Data-parallel training with torchrun on two CPU processes (gloo)."""

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch
from conftest import ROOT, TINY, hopper_file, one_thread_env

from datasets.loaders import load_dataset
from dt_primal.config import Config
from dt_primal.training.loop import train

pytestmark = pytest.mark.usefixtures("one_thread")  # in-process runs: one thread, as the subprocesses

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone", "train.py"]
# no dropout: each rank draws masks for its share of the batch, one process for all of it
# --ksvd-rank, not TINY's --s: torchrun's own parser would take --s for an abbreviation of one of its options
ARGS = ["--ksvd-rank" if a == "--s" else a for a in TINY] + ["--dropout", "0", "--batch-size", "8"]
ARGS += ["--warmup-steps", "5", "--eval-every", "100000", "--eval-episodes", "1", "--seed", "3"]


def saved(out):
    return torch.load(out / "last.pt", weights_only=True)


def one_process(out, ckpt, data, resume=False, **change):
    """Train in this process with the settings of ``ckpt``."""
    train(dataclasses.replace(Config(**ckpt["config"]), out=str(out), **change), data, resume=resume)
    return saved(out)


def test_two_processes_give_the_weights_of_one_with_the_same_batch(tmp_path):
    data = load_dataset(str(hopper_file(tmp_path)))
    two = subprocess.run(
        [*TORCHRUN, "--dataset", data.source, *ARGS, "--steps", "20", "--out", str(tmp_path / "two")],
        cwd=ROOT,
        env=one_thread_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert two.returncode == 0, two.stderr
    a = saved(tmp_path / "two")
    b = one_process(tmp_path / "one", a, data)
    assert a["step"] == b["step"] == 20
    for k in a["model"]:
        torch.testing.assert_close(a["model"][k], b["model"][k], rtol=0, atol=1e-5, msg=k)
    # rank 0 alone writes, evaluates and reports
    assert len(list((tmp_path / "two").glob("events.out.tfevents*"))) == 1
    assert json.loads((tmp_path / "two" / "eval.json").read_text())["step"] == 20
    assert two.stdout.count("seed 3 target 3600") == 1


def test_a_signal_to_one_process_stops_all_at_the_same_step_with_a_checkpoint(tmp_path):
    data = load_dataset(str(hopper_file(tmp_path)))
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [*TORCHRUN, "--dataset", data.source, *ARGS, "--steps", "100000", "--checkpoint-every", "5", "--out", str(out)],
        cwd=ROOT,
        env=one_thread_env(),
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 120
    while not (out / "last.pt").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    workers = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    assert workers, proc.communicate()[1]
    os.kill(int(workers[0]), signal.SIGTERM)  # as when one node of a job is preempted
    _, stderr = proc.communicate(timeout=120)
    steps = re.findall(r"stopped by signal SIGTERM at step (\d+)", stderr)
    assert len(steps) == 2 and steps[0] == steps[1], stderr
    ckpt = saved(out)
    assert ckpt["step"] == int(steps[0])
    assert one_process(out, ckpt, data, steps=ckpt["step"] + 2, resume=True)["step"] == ckpt["step"] + 2


def test_a_signal_that_lands_during_the_all_reduce_is_kept_for_the_next_step(monkeypatch):
    import dt_primal.training.distributed as distributed

    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: True)
    # the signal arrives while this process waits in the all-reduce; the other process had none to report
    monkeypatch.setattr(distributed.dist, "all_reduce", lambda flag, op: os.kill(os.getpid(), signal.SIGTERM))
    with distributed.StopSignal(torch.device("cpu")) as stop:
        assert not stop.requested()
        monkeypatch.setattr(distributed.dist, "all_reduce", lambda flag, op: None)
        assert stop.requested() and stop.signum == signal.SIGTERM
