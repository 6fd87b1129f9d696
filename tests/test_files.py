"""Checkpoints and datasets as files a user is given: what they hold, and that reading them runs no code."""

import ast
import dataclasses
import json
import pickle
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import ENV, FORMAT1, ROOT, SMALL, make_episodes

from commands.sweep.grid import group_dir
from datasets.loaders import load_dataset
from dt_primal import checkpoint
from dt_primal.config import Config, make_config
from dt_primal.errors import UserError
from dt_primal.training.loop import train
from dt_primal.untrusted import load_torch

pytestmark = pytest.mark.usefixtures("one_thread")  # in-process runs: one thread, as the subprocesses


def run(*args):
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300, env=ENV)


# --- the model owns its config ---


def test_the_model_owns_its_config():
    """model/transformer.py builds a DecisionTransformer from its ModelConfig alone: it imports nothing of the
    run's config."""
    tree = ast.parse((ROOT / "dt_primal" / "model" / "transformer.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | {
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
    }
    assert "dt_primal.config" not in imported


def test_a_checkpoint_holds_tensors_plain_data_and_the_resolved_architecture(run_dir):
    raw = torch.load(run_dir / "last.pt", weights_only=True)  # no allow-list: nothing but tensors and plain data
    assert raw["format"] == checkpoint.FORMAT
    assert isinstance(raw["state_mean"], torch.Tensor) and isinstance(raw["rng"]["numpy"]["key"], torch.Tensor)
    json.dumps({k: v for k, v in raw.items() if k not in ("model", "optimizer", "rng", "state_mean", "state_std")})
    ckpt = checkpoint.load_checkpoint(run_dir / "last.pt")
    assert ckpt["model_config"] == dataclasses.asdict(make_config(**SMALL, max_ep_len=50).model_config(11, 3))
    model = checkpoint.model_from_checkpoint(ckpt)
    assert model.config.s == 8 and model.embed_timestep.weight.shape[1] == 50  # (members, rows, d_model)


# --- checkpoints written before (format 1) ---


def test_a_checkpoint_written_by_an_earlier_version_evaluates(tmp_path):
    res = run("evaluate.py", str(FORMAT1 / "last.pt"), "--episodes", "1", "--out", str(tmp_path / "ev.json"))
    assert res.returncode == 0, res.stderr
    assert json.loads((tmp_path / "ev.json").read_text())["checkpoints"][0]["step"] == 3


def test_a_checkpoint_written_by_an_earlier_version_resumes_exactly(tmp_path):
    """Resumed at its step 3, it ends with the weights of a run of 5 steps: the optimizer moments and the
    random generators' states (NumPy's as a tuple of an array) carried over. To float rounding: the file's
    first 3 steps ran before the weights had a member dimension, whose batched products round differently
    (about 1e-7 here; a step moves these weights by about 1e-3)."""
    shutil.copytree(FORMAT1, tmp_path / "resumed")
    data = load_dataset(str(FORMAT1 / "hopper.pkl"))
    cfg = dataclasses.replace(
        Config(**checkpoint.load_checkpoint(FORMAT1 / "last.pt")["config"]),
        steps=5,
        dataset=str(FORMAT1 / "hopper.pkl"),
    )
    train(dataclasses.replace(cfg, out=str(tmp_path / "straight")), data)
    train(dataclasses.replace(cfg, out=str(tmp_path / "resumed")), data, resume=True)
    a, b = (torch.load(tmp_path / d / "last.pt", weights_only=True) for d in ("straight", "resumed"))
    assert a["step"] == b["step"] == 5
    for k in a["model"]:
        torch.testing.assert_close(a["model"][k], b["model"][k], rtol=0, atol=1e-6, msg=k)


def test_an_old_architecture_comes_from_the_weights_never_from_the_datasets_name(tmp_path):
    """Checkpoints written before they stored the KSVD rank and episode length: both are read off the
    weights (the dataset's name would give the paper's rank for walker2d-medium, 96); no activation: GELU."""
    old = load_torch(FORMAT1 / "last.pt")
    assert isinstance(old["state_mean"], np.ndarray) and isinstance(old["rng"]["numpy"], tuple)
    old["config"].update(s=None, max_ep_len=None, dataset="dt-primal/walker2d/medium-v0")
    del old["config"]["activation"]
    torch.save(old, tmp_path / "older.pt")
    arch = checkpoint.read_checkpoint(tmp_path / "older.pt")["model_config"]
    assert (arch["s"], arch["max_ep_len"], arch["activation"], arch["state_dim"]) == (4, 100, "gelu", 11)


# --- files that would run code ---


class Payload:
    """Unpickled, it creates a file."""

    def __init__(self, target):
        self.target = str(target)

    def __reduce__(self):
        return open, (self.target, "w")


def test_a_checkpoint_that_would_run_code_is_refused_by_every_command(run_dir, tmp_path):
    """evaluate.py and train.py --resume refuse it; the sweep's tables read only records, never a checkpoint."""
    target = tmp_path / "created"
    ckpt = torch.load(run_dir / "last.pt", weights_only=True)
    for folder in ("evil", "sweep/hopper/primal/seed_0"):
        (tmp_path / folder).mkdir(parents=True)
        torch.save({**ckpt, "config": {**ckpt["config"], "note": Payload(target)}}, tmp_path / folder / "last.pt")
    record = json.loads((run_dir / "eval.json").read_text())  # a finished run whose record lacks its config
    (tmp_path / "sweep/hopper/primal/seed_0/eval.json").write_text(json.dumps({**record, "config": {}}))
    assert group_dir(tmp_path / "sweep", "hopper", "primal") == tmp_path / "sweep/hopper/primal"
    for command in [
        ("evaluate.py", str(tmp_path / "evil" / "last.pt"), "--out", str(tmp_path / "ev.json")),
        ("train.py", "--resume", "--out", str(tmp_path / "evil")),
    ]:
        res = run(*command)
        assert res.returncode == 2, (command, res.stderr)
        assert "was refused: reading it would call io.open" in res.stderr and "Traceback" not in res.stderr, res.stderr
        assert not target.exists(), command
    sweep = ("--datasets", "hopper", "--models", "primal", "--seeds", "0", "--out", str(tmp_path / "sweep"))
    res = run("-m", "commands.sweep", *sweep, "--aggregate-only")
    assert res.returncode == 0 and "Traceback" not in res.stderr and not target.exists(), res.stderr


def test_a_dataset_pickle_that_would_run_code_is_refused(tmp_path):
    target = tmp_path / "created"
    with open(tmp_path / "evil.pkl", "wb") as f:
        pickle.dump([{"observations": Payload(target), "actions": [], "rewards": []}], f)
    res = run("train.py", "--dataset", str(tmp_path / "evil.pkl"), "--env", "hopper", "--out", str(tmp_path / "run"))
    assert res.returncode == 2 and "evil.pkl was refused: reading it would call io.open" in res.stderr, res.stderr
    assert not target.exists()


def test_dataset_pickles_of_plain_data_load_under_numpy_1_and_2_names(tmp_path):
    eps = make_episodes(lengths=(5, 6))
    trajs = [
        dict(
            observations=e["observations"][:-1],
            actions=e["actions"],
            rewards=e["rewards"],
            terminals=e["terminations"],
            dones=np.float32(0),
        )
        for e in eps
    ]
    blobs = {f"protocol {p}": pickle.dumps(trajs, protocol=p) for p in (2, 4, 5)}
    blobs["NumPy 1"] = blobs["protocol 2"].replace(b"numpy._core", b"numpy.core")  # protocol 2 names globals as text
    for name, blob in blobs.items():
        (tmp_path / "data.pkl").write_bytes(blob)
        assert load_dataset(str(tmp_path / "data.pkl"), env="hopper").lengths.tolist() == [5, 6], name


# --- a checkpoint write that fails part-way ---


def test_a_write_that_fails_inside_the_archive_writer_keeps_the_previous_checkpoint(tmp_path):
    """A file-size limit (as a full disk) hit while torch.save writes: a clean message, the old file intact."""
    script = """
import resource, signal, sys, torch
from pathlib import Path
from dt_primal.checkpoint import save_checkpoints
from dt_primal.errors import UserError
path = Path(sys.argv[1])
save_checkpoints([path], [{"model": {"w": torch.ones(10)}}])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))
try:
    save_checkpoints([path], [{"model": {"w": torch.zeros(100_000)}}])
except UserError as exc:
    print(exc)
"""
    res = run("-c", script, str(tmp_path / "last.pt"))
    assert res.returncode == 0 and "the previous one is intact" in res.stdout and "unexpected pos" in res.stdout, res
    assert torch.equal(torch.load(tmp_path / "last.pt", weights_only=True)["model"]["w"], torch.ones(10))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]


def test_refused_and_damaged_checkpoints_say_why(run_dir, tmp_path):
    ckpt = torch.load(run_dir / "last.pt", weights_only=True)
    torch.save({**ckpt, "format": 3}, tmp_path / "newer.pt")
    with pytest.raises(UserError, match="has checkpoint format 3"):
        checkpoint.read_checkpoint(tmp_path / "newer.pt")
    torch.save({**ckpt, "step": Payload(tmp_path / "x")}, tmp_path / "evil.pt")
    with pytest.raises(UserError, match="unpickling anything else can run code"):
        checkpoint.read_checkpoint(tmp_path / "evil.pt")


def test_an_environment_spec_that_names_other_code_is_refused(run_dir, tmp_path):
    """A checkpoint's task (or a dataset's metadata) may give its environment's kwargs and time limit, never
    the code gym.make imports and calls to build it."""
    from gymnasium.envs.registration import EnvSpec

    from envs import task_for

    target = tmp_path / "created"
    spec = EnvSpec(id="Hopper-v5", entry_point="subprocess:run", kwargs={"args": ["touch", str(target)]}).to_json()
    ckpt = torch.load(run_dir / "last.pt", weights_only=True)
    torch.save({**ckpt, "task": {**ckpt["task"], "spec": spec}}, tmp_path / "last.pt")
    res = run("evaluate.py", str(tmp_path / "last.pt"), "--episodes", "1", "--out", str(tmp_path / "ev.json"))
    assert res.returncode == 2 and "names the code subprocess:run to build Hopper-v5" in res.stderr, res.stderr
    with pytest.raises(ValueError, match="a file may not choose code to run"):
        task_for("Hopper-v5", spec)
    assert not target.exists()
    import gymnasium as gym

    assert task_for("Hopper-v5", gym.spec("Hopper-v5").to_json()).gym_id == "Hopper-v5"  # its own entry point


def test_evaluate_py_records_each_checkpoint_as_training_records_its_run(run_dir, tmp_path):
    """One record schema: evaluate.py's report holds, per checkpoint, what train.py's eval.json holds (the
    config and provenance included), besides what each writer adds."""
    res = run("evaluate.py", str(run_dir / "last.pt"), "--episodes", "1", "--out", str(tmp_path / "ev.json"))
    assert res.returncode == 0, res.stderr
    evaluated = json.loads((tmp_path / "ev.json").read_text())["checkpoints"][0]
    trained = json.loads((run_dir / "eval.json").read_text())
    assert set(evaluated) - {"precision"} == set(trained) - {"ensemble", "eval_seconds"}
    assert evaluated["config"] == trained["config"] and evaluated["provenance"].keys() == trained["provenance"].keys()
