"""Checkpoints as files a user is given: what they hold, the earlier format, and that damaged or hostile ones
are refused by every command (status 2, the fault named) without running their code."""

import dataclasses
import json
import os
import re
import shutil
import zipfile

import numpy as np
import pytest
import torch
from conftest import (
    FORMAT1,
    SMALL,
    Payload,
    assert_user_error,
    raises,
    run,
)
from gymnasium.envs.registration import EnvSpec

from commands.sweep.grid import group_dir
from datasets.loaders import load_dataset
from dt_primal.config import Config, make_config
from dt_primal.errors import UserError
from dt_primal.files import checkpoint
from dt_primal.files.torch_archive import load_torch
from dt_primal.training.loop import train

pytestmark = pytest.mark.usefixtures("one_thread")  # in-process runs: one thread, as the subprocesses


# --- what a checkpoint holds ---


def test_a_checkpoint_holds_tensors_plain_data_and_the_resolved_architecture(run_dir):
    raw = torch.load(run_dir / "last.pt", weights_only=True)  # no allow-list: nothing but tensors and plain data
    assert raw["format"] == checkpoint.FORMAT
    assert isinstance(raw["state_mean"], torch.Tensor) and isinstance(raw["rng"]["numpy"]["key"], torch.Tensor)
    json.dumps({k: v for k, v in raw.items() if k not in ("model", "optimizer", "rng", "state_mean", "state_std")})
    ckpt = checkpoint.load_checkpoint(run_dir / "last.pt")
    assert ckpt["model_config"] == dataclasses.asdict(make_config(**SMALL, max_ep_len=50).model_config(11, 3))
    model = checkpoint.model_from_checkpoint(ckpt)
    assert model.config.s == 8 and model.embed_timestep.weight.shape[1] == 50  # (members, rows, d_model)


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


# --- damaged checkpoints ---


def test_truncated_checkpoint_in_evaluate_and_resume(run_dir, tmp_path):
    blob = (run_dir / "last.pt").read_bytes()
    (tmp_path / "last.pt").write_bytes(blob[: len(blob) // 2])
    res = run("evaluate.py", str(tmp_path / "last.pt"), "--episodes", "1", "--out", str(tmp_path / "ev.json"))
    assert_user_error(res, "truncated or corrupted")
    res = run("train.py", "--resume", "--out", str(tmp_path))
    assert_user_error(res, "truncated or corrupted")


def test_damaged_or_incompatible_checkpoints(run_dir, tmp_path):
    ckpt = torch.load(run_dir / "last.pt", weights_only=True)

    def save(name, **change):
        torch.save({**ckpt, **change}, tmp_path / name)
        return tmp_path / name

    (tmp_path / "noise.pt").write_bytes(os.urandom(4000))
    torch.save({"state_dict": ckpt["model"]}, tmp_path / "other.pt")  # some other program's checkpoint
    cases = [
        (tmp_path / "noise.pt", "truncated or corrupted"),
        (tmp_path / "missing.pt", "does not exist"),
        (tmp_path / "other.pt", "not a dt-primal checkpoint"),
        (save("newer.pt", config={**ckpt["config"], "flash": True}), "incompatible version"),
        (save("arch.pt", model_config={**ckpt["model_config"], "flash": True}), "incompatible version"),
        (save("sizes.pt", model_config={**ckpt["model_config"], "state_dim": 17}), "or is damaged (cannot reshape"),
    ]
    for path, phrase in cases:
        with raises(phrase):
            checkpoint.load_checkpoint(path)
    torch.save({k: v for k, v in ckpt.items() if k != "optimizer"}, tmp_path / "weights.pt")
    checkpoint.load_checkpoint(tmp_path / "weights.pt")  # enough to evaluate, not to resume
    with raises("lacks optimizer"):
        checkpoint.load_checkpoint(tmp_path / "weights.pt", resume=True)
    for change in (dict(model="dt"), dict(d_model=64), dict(act_dim=2)):  # another model kind, other dimensions
        bad = checkpoint.load_checkpoint(save("bad.pt", model_config={**ckpt["model_config"], **change}))
        with raises("do not fit"):
            checkpoint.model_from_checkpoint(bad)


def test_empty_and_special_files_are_a_message(run_dir, tmp_path):
    import dt_primal

    (tmp_path / "empty.pt").write_bytes(b"")
    os.mkfifo(tmp_path / "fifo.pt")
    for path, phrase in (
        (tmp_path / "empty.pt", "is empty (0 bytes)"),
        ("/dev/null", "is a device, not a regular file"),
        (tmp_path / "fifo.pt", "is a FIFO (named pipe), not a regular file"),
    ):
        with pytest.raises(UserError, match=re.escape(phrase)):
            dt_primal.load_policy(path)
    res = run("evaluate.py", str(tmp_path / "fifo.pt"), "--out", str(tmp_path / "ev.json"))
    assert_user_error(res, "FIFO (named pipe), not a regular file")
    out = tmp_path / "resume"
    out.mkdir()
    (out / "last.pt").write_bytes(b"")
    assert_user_error(run("train.py", "--resume", "--out", str(out)), "is empty (0 bytes)")


@pytest.mark.parametrize(
    "change, phrase",
    [
        (lambda c: c["rng"]["numpy"].update(key=[1, 2, 3]), "The training state in "),
        (lambda c: c.update(step="876"), "is damaged: its step is '876', not a count"),
        (lambda c: c["rng"].update(sampler=torch.zeros(16, dtype=torch.uint8)), "resume it on the kind of device"),
    ],
)
def test_a_damaged_training_state_is_a_message_on_resume(run_dir, tmp_path, change, phrase):
    out = tmp_path / "run"
    shutil.copytree(run_dir, out)
    ckpt = torch.load(out / "last.pt", weights_only=True)
    change(ckpt)
    torch.save(ckpt, out / "last.pt")
    res = run("train.py", "--resume", "--out", str(out), "--steps", "4")
    assert res.returncode == 2 and "Traceback" not in res.stderr and "error: " in res.stderr and phrase in res.stderr, (
        res.stderr
    )


@pytest.mark.parametrize(
    "change, phrase, acting",
    [
        (lambda c: c["model"][next(iter(c["model"]))].fill_(float("nan")), "holds NaN or infinite weights", True),
        (lambda c: c.update(state_std=torch.zeros(11)), "state_std min 0", True),
        (lambda c: c.update(state_std=torch.full((11,), 1e-45, dtype=torch.float64)), "state_std min 1.4013e-45", True),
        (lambda c: c["config"].update(reward_scale=1e-320), "reward_scale 1e-320", True),
        (lambda c: c["config"].update(reward_scale=-1000.0), "reward_scale -1000.0", True),
        (lambda c: c["task"].update(ref_min=5.0, ref_max=5.0), "cannot normalise a score", False),
        (lambda c: c["config"].pop("targets"), "a run config needs exactly the fields", False),
    ],
)
def test_values_that_would_make_every_score_or_action_nan(run_dir, tmp_path, change, phrase, acting):
    import dt_primal

    ckpt = torch.load(run_dir / "last.pt", weights_only=True)
    change(ckpt)
    torch.save(ckpt, tmp_path / "last.pt")
    res = run("evaluate.py", str(tmp_path / "last.pt"), "--episodes", "1", "--out", str(tmp_path / "ev.json"))
    assert_user_error(res, phrase)
    if acting:  # a policy needs no task
        with pytest.raises(UserError, match=phrase):
            dt_primal.load_policy(tmp_path / "last.pt")


# --- hostile checkpoints ---


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


def test_refused_and_damaged_checkpoints_say_why(run_dir, tmp_path):
    ckpt = torch.load(run_dir / "last.pt", weights_only=True)
    torch.save({**ckpt, "format": 3}, tmp_path / "newer.pt")
    with pytest.raises(UserError, match="has checkpoint format 3"):
        checkpoint.read_checkpoint(tmp_path / "newer.pt")
    torch.save({**ckpt, "step": Payload(tmp_path / "x")}, tmp_path / "evil.pt")
    with pytest.raises(UserError, match="unpickling anything else can run code"):
        checkpoint.read_checkpoint(tmp_path / "evil.pt")


def test_torchs_refusal_of_a_blocked_module_is_named(run_dir, tmp_path):
    class System:
        def __reduce__(self):
            return os.system, ("true",)

    ckpt = torch.load(run_dir / "last.pt", weights_only=True)
    torch.save({**ckpt, "step": System()}, tmp_path / "evil.pt")
    with pytest.raises(UserError, match=r"reading it would call posix.system"):
        checkpoint.read_checkpoint(tmp_path / "evil.pt")


def test_an_environment_spec_that_names_other_code_is_refused(run_dir, tmp_path):
    """A checkpoint's task (or a dataset's metadata) may give its environment's kwargs and time limit, never
    the code gym.make imports and calls to build it."""

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


def test_a_checkpoints_environment_id_is_a_registered_mujoco_one(run_dir, tmp_path, marker_module):
    mods, target = marker_module
    ckpt = torch.load(run_dir / "last.pt", weights_only=True)
    cases = {
        "dtp_marker:Hopper-v5": "not a registered Gymnasium id",
        "Nope-v5": "Environment `Nope` doesn't exist",
        "CartPole-v1": "needs vectors of real numbers",
    }
    for gym_id, phrase in cases.items():
        torch.save({**ckpt, "task": {**ckpt["task"], "gym_id": gym_id}}, tmp_path / "last.pt")
        res = run(
            "evaluate.py",
            str(tmp_path / "last.pt"),
            "--episodes",
            "1",
            "--out",
            str(tmp_path / "ev.json"),
            env={"PYTHONPATH": str(mods)},
        )
        assert_user_error(res, phrase)
    assert not target.exists()


@pytest.mark.parametrize(
    "view, phrase",
    [
        (lambda w: w[:1].expand(2 * 10**7, *w.shape[1:]), "viewed with strides (0, "),  # one row as 2e7 rows
        (lambda w: w.as_strided((w.shape[0] * 4, w.shape[1]), (1, 1)), "viewed with strides (1, 1)"),  # overlapping
    ],
)
def test_a_tensor_viewed_larger_than_its_storage_is_refused_before_it_is_read(run_dir, tmp_path, view, phrase):
    import dt_primal

    ckpt = torch.load(run_dir / "last.pt", weights_only=True)
    ckpt["model"]["embed_timestep.weight"] = view(ckpt["model"]["embed_timestep.weight"])
    torch.save(ckpt, tmp_path / "last.pt")
    assert (tmp_path / "last.pt").stat().st_size < 2 * (run_dir / "last.pt").stat().st_size
    res = run("evaluate.py", str(tmp_path / "last.pt"), "--episodes", "1", "--out", str(tmp_path / "ev.json"))
    assert_user_error(res, str(tmp_path / "last.pt"), phrase)
    with pytest.raises(UserError, match=re.escape(phrase)):
        dt_primal.load_policy(tmp_path / "last.pt")


def test_a_view_is_dense_and_inside_its_storage_or_refused():
    from dt_primal.files.torch_archive import dense_in_storage

    w = torch.randn(4, 3)
    assert all(dense_in_storage(t) for t in (w, w.t(), w[1:], torch.empty(0, 3), torch.tensor(1.0)))
    assert not any(dense_in_storage(t) for t in (w[:1].expand(5, 3), w[:, ::2], w.as_strided((4, 3), (1, 1))))
    beyond = torch.zeros(10)
    view = beyond[:]
    beyond.untyped_storage().resize_(8)  # the view now reaches past its storage's end
    assert not dense_in_storage(view)


def test_views_that_share_one_storage_are_refused_beyond_the_files_size(run_dir, tmp_path):
    ckpt = torch.load(run_dir / "last.pt", weights_only=True)
    w = ckpt["model"]["embed_timestep.weight"]
    ckpt["model"].update({f"copy{i}": w[:] for i in range(200)})  # 200 names for one storage
    torch.save(ckpt, tmp_path / "last.pt")
    with raises(str(tmp_path / "last.pt"), "views sharing their storage"):
        checkpoint.read_checkpoint(tmp_path / "last.pt")


def test_a_compressed_checkpoint_entry_is_refused_before_it_is_inflated(run_dir, tmp_path):
    with (
        zipfile.ZipFile(run_dir / "last.pt") as src,
        zipfile.ZipFile(tmp_path / "packed.pt", "w", zipfile.ZIP_DEFLATED) as dst,
    ):
        for entry in src.infolist():
            dst.writestr(entry.filename, src.read(entry))
    with pytest.raises(UserError, match="is compressed, which torch.save never writes"):
        checkpoint.read_checkpoint(tmp_path / "packed.pt")


# --- writing one ---


def test_a_crash_while_writing_a_checkpoint_keeps_the_previous_one(tmp_path, monkeypatch):
    path = tmp_path / "last.pt"
    checkpoint.save_checkpoints([path], [{"step": 1}])

    def half_then_crash(obj, f):
        f.write(b"PK\x03\x04 half a checkpoint")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", half_then_crash)
    with raises("No space left on device); the previous one is intact"):
        checkpoint.save_checkpoints([path], [{"step": 2}])
    assert torch.load(path)["step"] == 1 and os.listdir(tmp_path) == ["last.pt"]
    path.unlink()
    with raises("No space left on device); no earlier checkpoint was there"):
        checkpoint.save_checkpoints([path], [{"step": 2}])
    assert os.listdir(tmp_path) == []


def test_a_write_that_fails_inside_the_archive_writer_keeps_the_previous_checkpoint(tmp_path):
    """A file-size limit (as a full disk) hit while torch.save writes: a clean message, the old file intact."""
    script = """
import resource, signal, sys, torch
from pathlib import Path
from dt_primal.files.checkpoint import save_checkpoints
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
