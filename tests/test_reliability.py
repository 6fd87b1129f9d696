"""Bad input gets a one-paragraph error that says what to do; interruptions lose nothing."""

import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from conftest import ENV, ROOT, SMALL, TINY, assert_user_error, hopper_file, make_episodes, raises, write_pickle

from datasets.loaders import load_dataset
from datasets.synthetic import write_d4rl
from dt_primal import checkpoint
from dt_primal.cli import run_main
from dt_primal.config import make_config
from dt_primal.data import WindowSampler
from dt_primal.model.transformer import DecisionTransformer, dt_loss
from dt_primal.training import loop as training
from dt_primal.training import step

pytestmark = pytest.mark.usefixtures("one_thread")  # in-process runs: one thread, as the subprocesses


def run(*args):
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300, env=ENV)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny hopper dataset and a 3-step run on it: (data, run folder)."""
    tmp = tmp_path_factory.mktemp("tiny")
    data = load_dataset(str(hopper_file(tmp)))
    training.train(make_config(**SMALL, steps=3, out=str(tmp / "run")), data)
    return data, tmp / "run"


# --- bad input, through the command line ---


def test_unknown_dataset_id_says_how_to_get_one(tmp_path):
    res = run("train.py", "--dataset", "nobody/hopper/nothing-v0", "--out", str(tmp_path))
    assert_user_error(res, "nobody/hopper/nothing-v0", "dt-primal/<env>/<level>-v0", "--download", ".hdf5")


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


def test_dataset_from_another_environment(tmp_path):
    res = run("train.py", "--dataset", str(hopper_file(tmp_path)), "--env", "walker2d", "--out", str(tmp_path / "x"))
    assert_user_error(res, "observations of size 11", "Walker2d-v5 has 17", "--env")


def test_truncated_checkpoint_in_evaluate_and_resume(tiny, tmp_path):
    blob = (tiny[1] / "last.pt").read_bytes()
    (tmp_path / "last.pt").write_bytes(blob[: len(blob) // 2])
    res = run("evaluate.py", str(tmp_path / "last.pt"), "--episodes", "1", "--out", str(tmp_path / "ev.json"))
    assert_user_error(res, "truncated or corrupted")
    res = run("train.py", "--resume", "--out", str(tmp_path))
    assert_user_error(res, "truncated or corrupted")


# --- bad input, through the functions ---


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


def test_unknown_suite_dataset_and_unknown_env(tmp_path):
    with raises("suite ids are dt-primal/<env>/<level>-v<N>"):
        load_dataset("dt-primal/ant/medium-v0")
    with raises("python -m datasets build --env hopper --level medium"):
        load_dataset("dt-primal/hopper/medium-v0", build=False)  # as in a multi-process run
    with raises("a multi-process (torchrun) run does not download datasets. Download it first with minari download"):
        load_dataset("mujoco/hopper/never-made-v0", download=True, build=False)  # before any network access
    write_d4rl(tmp_path / "d.hdf5", make_episodes())
    with raises(
        "--env ant is not an environment Gymnasium knows (Environment `ant` doesn't exist. Did you mean: `Ant`?)"
    ):
        load_dataset(str(tmp_path / "d.hdf5"), env="ant")
    with raises("does not name the task it was recorded on; pass --env"):
        load_dataset(str(tmp_path / "d.hdf5"))


def _hdf5(path, **change):
    """A valid D4RL file (22 steps) with some keys replaced (None: removed, "group": an hdf5 group)."""
    write_d4rl(path, make_episodes())
    with h5py.File(path, "a") as f:
        for key, value in change.items():
            del f[key]
            if isinstance(value, str):
                f.create_group(key)
            elif value is not None:
                f[key] = value
    return str(path)


NO_STEPS = dict(
    observations=np.zeros((0, 11)),
    actions=np.zeros((0, 3)),
    rewards=np.zeros(0),
    terminals=np.zeros(0),
    timeouts=np.zeros(0),
)


@pytest.mark.parametrize(
    "change, phrase",
    [
        (dict(rewards=None), "lacks the keys rewards"),
        (dict(rewards="group"), "not in the D4RL layout"),
        (dict(actions=np.zeros((21, 3))), "'actions' has 21 rows but 'rewards' has 22"),
        (dict(observations=np.zeros(22)), "wrong shapes"),
        (dict(rewards=np.r_[np.nan, np.zeros(21)]), "1 NaN/inf values in 'rewards'"),
        (dict(observations=np.full((22, 11), np.inf)), "242 NaN/inf values in 'observations'"),
        (NO_STEPS, "holds no steps"),
    ],
)
def test_bad_d4rl_file(tmp_path, change, phrase):
    with raises(phrase):
        load_dataset(_hdf5(tmp_path / "hopper.hdf5", **change))


def test_truncated_dataset_files(tmp_path):
    (tmp_path / "cut.hdf5").write_bytes(Path(_hdf5(tmp_path / "good.hdf5")).read_bytes()[:3000])
    (tmp_path / "cut.pkl").write_bytes(pickle.dumps([{"a": np.zeros(100)}])[:50])
    for name in ("cut.hdf5", "cut.pkl"):
        with raises("truncated"):
            load_dataset(str(tmp_path / name), env="hopper")


def _pickle(path, episodes):
    write_pickle(path, episodes)
    return str(path)


def _changed(episode, key, value):
    """The default episodes (lengths 7, 3, 12) with one array replaced."""
    eps = make_episodes()
    eps[episode][key] = value
    return eps


EMPTY = dict(
    observations=np.zeros((1, 11), np.float32),
    actions=np.zeros((0, 3), np.float32),
    rewards=np.zeros(0, np.float32),
    terminations=np.zeros(0, bool),
    truncations=np.zeros(0, bool),
)


@pytest.mark.parametrize(
    "episodes, phrase",
    [
        ([], "holds no episodes"),
        (make_episodes()[:1] + [EMPTY] + make_episodes()[1:], "1 empty episodes"),
        ([EMPTY, EMPTY], "holds no steps"),
        (_changed(1, "actions", np.zeros((3, 6))), "differ in observation/action shapes"),
        (_changed(1, "rewards", np.zeros(2)), "trajectory 1 has shapes"),
        (_changed(2, "actions", np.full((12, 3), np.nan)), "36 NaN/inf values in 'actions'"),
    ],
)
def test_bad_decision_transformer_pickle(tmp_path, episodes, phrase):
    with raises(phrase):
        load_dataset(_pickle(tmp_path / "hopper.pkl", episodes))


def test_pickle_trajectory_without_rewards(tmp_path):
    trajectory = {"observations": np.zeros((2, 11)), "actions": np.zeros((2, 3))}
    (tmp_path / "hopper.pkl").write_bytes(pickle.dumps([trajectory]))
    with raises("trajectory 0 lacks the keys rewards"):
        load_dataset(str(tmp_path / "hopper.pkl"))


def test_single_step_episodes_are_valid_training_data(tmp_path):
    data = load_dataset(_pickle(tmp_path / "hopper.pkl", make_episodes(lengths=(1,) * 6 + (5,))))
    assert data.lengths.tolist() == [1] * 6 + [5]
    batch = WindowSampler(data, 4, 1.0, *data.state_stats()).sample(64, torch.Generator().manual_seed(0))
    assert (batch["valid"].sum(1) == 1).any()  # windows with a single real step
    model = DecisionTransformer(make_config(**SMALL).model_config(data.obs_dim, data.act_dim))
    loss, _, _ = dt_loss(model, {k: v[None] for k, v in batch.items()}, 0.05)  # one member
    loss.sum().backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in model.parameters())


def test_damaged_or_incompatible_checkpoints(tiny, tmp_path):
    ckpt = torch.load(tiny[1] / "last.pt", weights_only=True)

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


def test_resume_refuses_other_data_and_a_fresh_run_refuses_an_old_folder(tiny, tmp_path):
    data, folder = tiny
    cfg = make_config(**SMALL, steps=5, out=str(folder))
    with raises("already holds a run"):
        training.train(cfg, data)
    other = load_dataset(_pickle(tmp_path / "hopper.pkl", make_episodes(lengths=(30, 40), seed=9)))
    with raises(f"Resume with --dataset {data.source}"):
        training.train(cfg, other, resume=True)


def test_batch_must_split_evenly_over_processes(tiny, monkeypatch, tmp_path):
    monkeypatch.setattr(training.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(training.dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(training.dist, "get_rank", lambda: 0)
    with raises("--batch-size 7 must be divisible by the number of processes (2)"):
        training.train(make_config(**{**SMALL, "batch_size": 7}, out=str(tmp_path)), tiny[0])


# --- interruptions ---


def test_ctrl_c_outside_the_training_loop_is_one_line(capsys):
    def interrupted():
        raise KeyboardInterrupt

    try:
        run_main(interrupted)
    except (SystemExit, KeyboardInterrupt) as exc:
        outcome = exc
    assert isinstance(outcome, SystemExit) and outcome.code == 130
    assert capsys.readouterr().err.strip().startswith("interrupted")


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


def test_sigterm_checkpoints_and_resume_matches_an_uninterrupted_run(tiny, tmp_path):
    data, _ = tiny
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
        env=ENV,
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
        ("dt_primal.training.step.dt_loss", _nan_loss_at, 13, 10),
        ("dt_primal.training.step.clip_per_member", _inf_gradient_at, 10, 5),
    ],
)
def test_non_finite_loss_or_weights_stop_the_run_and_keep_the_last_good_checkpoint(
    tiny, tmp_path, monkeypatch, target, poison, at, kept
):
    monkeypatch.setattr(target, poison(at))
    cfg = make_config(**SMALL, steps=20, checkpoint_every=5, log_every=5, out=str(tmp_path))
    with raises(
        f"(or the weights non-finite) by step {(at + 4) // 5 * 5}; training stopped and "
        f"{tmp_path / 'last.pt'} keeps the weights of step {kept}"
    ):
        training.train(cfg, tiny[0])
    ckpt = checkpoint.load_checkpoint(tmp_path / "last.pt")
    assert ckpt["step"] == kept and all(torch.isfinite(v).all() for v in ckpt["model"].values())
