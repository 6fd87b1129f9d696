"""Datasets a user gives (D4RL files, decision-transformer pickles, Minari datasets): what is read, what is
refused (status 2, a message naming the file's fault), and that reading one runs no code, opens no other file and
allocates no more than the file holds."""

import json
import pickle
import shutil
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from conftest import (
    SMALL,
    TWO_STEPS,
    Payload,
    assert_user_error,
    dt_trajectories,
    hopper_file,
    make_episodes,
    raises,
    run,
    small_config,
    write_minari,
    write_pickle,
)
from gymnasium.envs.registration import EnvSpec

from datasets.loaders import load_dataset
from datasets.synthetic import write_d4rl
from dt_primal import machine
from dt_primal.config import make_config
from dt_primal.data import Trajectories, WindowSampler
from dt_primal.errors import UserError
from dt_primal.files.pickles import load_pickle
from dt_primal.model.transformer import DecisionTransformer, dt_loss
from dt_primal.training import checks

pytestmark = pytest.mark.usefixtures("one_thread")  # in-process runs: one thread, as the subprocesses


# --- which dataset ---


def test_a_missing_dataset_file(tmp_path):
    assert_user_error(
        run("train.py", "--dataset", tmp_path / "missing.hdf5", "--out", tmp_path / "x"), "does not exist"
    )


def test_unknown_dataset_id_says_how_to_get_one(tmp_path):
    res = run("train.py", "--dataset", "nobody/hopper/nothing-v0", "--out", str(tmp_path))
    assert_user_error(res, "nobody/hopper/nothing-v0", "dt-primal/<env>/<level>-v0", "--download", ".hdf5")


def test_unknown_suite_dataset_and_unknown_env(tmp_path):
    with raises("suite ids are dt-primal/<env>/<level>-v<N>"):
        load_dataset("dt-primal/ant/medium-v0")
    with raises("python -m datasets build --env hopper --level medium"):
        load_dataset("dt-primal/hopper/medium-v0", build=False)  # as in a multi-process run
    with raises("torchrun", "minari download"):
        load_dataset("mujoco/hopper/never-made-v0", download=True, build=False)  # before any network access
    write_d4rl(tmp_path / "d.hdf5", make_episodes())
    with raises("--env ant", "Did you mean: `Ant`?"):
        load_dataset(str(tmp_path / "d.hdf5"), env="ant")
    with raises("pass --env"):
        load_dataset(str(tmp_path / "d.hdf5"))


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
        with raises("tests/hopper/folder-v0", "give its id", f"MINARI_DATASETS_PATH={minari_home} "):
            load_dataset(str(path))
    assert load_dataset("tests/hopper/folder-v0").lengths.tolist() == [7, 3, 12]


def test_a_dataset_id_with_shell_syntax_is_never_suggested_as_a_command(tmp_path):
    folder = tmp_path / "ds" / "data"
    folder.mkdir(parents=True)
    (folder / "metadata.json").write_text(json.dumps({"dataset_id": "x; rm -rf ~ \x1b[2J"}))
    with pytest.raises(UserError) as exc:
        load_dataset(str(tmp_path / "ds"))
    assert "rm -rf" not in str(exc.value) and "\x1b" not in str(exc.value)


def test_dataset_from_another_environment(tmp_path):
    res = run("train.py", "--dataset", str(hopper_file(tmp_path)), "--env", "walker2d", "--out", str(tmp_path / "x"))
    assert_user_error(res, "observations of size 11", "Walker2d-v5 has 17", "--env")


def test_metadata_of_another_task_than_env_is_refused():
    eps = make_episodes(obs_dim=17, act_dim=6)  # Walker2d-v5 and HalfCheetah-v5 have the same sizes
    write_minari("tests/walker2d/sizes-v0", eps, env="Walker2d-v5")
    with raises("Walker2d-v5", "--env halfcheetah", "HalfCheetah-v5"):
        load_dataset("tests/walker2d/sizes-v0", env="halfcheetah")
    assert load_dataset("tests/walker2d/sizes-v0", env="walker2d").env == "Walker2d-v5"


def test_an_arrow_dataset_without_pyarrow_says_to_install_it(monkeypatch):
    """Not "check the dataset id": the id is right, a package is missing."""
    from minari.storage.datasets_root_dir import get_dataset_path

    from dt_primal.files.loaders import load_minari

    write_minari("tests/arrowish-v0", make_episodes(lengths=(20, 30), seed=1))
    meta_path = get_dataset_path("tests/arrowish-v0") / "data" / "metadata.json"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps(meta | {"data_format": "arrow"}))
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow fails, installed or not
    with pytest.raises(UserError, match=r"Arrow format.*pip install pyarrow"):
        load_minari("tests/arrowish-v0")


# --- D4RL files ---


def d4rl_file(path, **change):
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
        load_dataset(d4rl_file(tmp_path / "hopper.hdf5", **change))


N = 22  # steps of make_episodes()


@pytest.mark.parametrize(
    "change, phrase",
    [
        (dict(rewards=np.array([b"1.5"] * N)), "'rewards' holds text (bytes) (dtype |S3), not real numbers"),
        (dict(rewards=np.zeros(N, np.complex64)), "'rewards' holds complex numbers"),
        (dict(observations=np.full((N, 11), 1e39)), "'observations' has 242 values beyond float32's range"),
        (
            dict(terminals=np.full(N, 0.5)),
            "'terminals' must be true/false",
        ),
        (dict(timeouts=np.r_[np.zeros(N - 1), np.nan]), "'timeouts' must be true/false"),
        (dict(rewards=np.float32(3)), "'rewards' is a single value, not an array"),
        (dict(actions=np.array([[(1, 2.0)] * 3] * N, dtype=[("a", "i4"), ("b", "f4")])), "'actions' holds records"),
    ],
)
def test_wrong_dtypes_in_a_d4rl_file(tmp_path, change, phrase):
    with raises(phrase):
        load_dataset(d4rl_file(tmp_path / "hopper.hdf5", **change))


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
    checks.check_run_inputs(data, small_config())


def test_truncated_dataset_files(tmp_path):
    (tmp_path / "cut.hdf5").write_bytes(Path(d4rl_file(tmp_path / "good.hdf5")).read_bytes()[:3000])
    (tmp_path / "cut.pkl").write_bytes(pickle.dumps([{"a": np.zeros(100)}])[:50])
    for name in ("cut.hdf5", "cut.pkl"):
        with raises("truncated"):
            load_dataset(str(tmp_path / name), env="hopper")


def test_an_hdf5_file_reads_no_other_file(tmp_path):
    secret = tmp_path / "secret.bin"
    secret.write_bytes(np.arange(100, dtype=np.float32).tobytes())
    eps = make_episodes(lengths=(10, 15))
    write_d4rl(tmp_path / "hopper.hdf5", eps)
    n = 25
    with h5py.File(tmp_path / "source.hdf5", "w") as f:
        f["rewards"] = np.ones(n, np.float32)
    variants = {
        "external raw file": lambda f: f.create_dataset(
            "rewards", (n,), np.float32, external=[(str(secret), 0, 4 * n)]
        ),
        "external link": lambda f: f.__setitem__(
            "rewards", h5py.ExternalLink(str(tmp_path / "source.hdf5"), "/rewards")
        ),
        "virtual dataset": lambda f: f.create_virtual_dataset("rewards", _layout(tmp_path / "source.hdf5", n)),
    }
    for name, make in variants.items():
        path = tmp_path / f"hopper-{name.replace(' ', '_')}.hdf5"
        shutil.copy(tmp_path / "hopper.hdf5", path)
        with h5py.File(path, "a") as f:
            del f["rewards"]
            make(f)
        with pytest.raises(UserError, match="dt-primal reads no file but the one given"):
            load_dataset(str(path), env="hopper")


def _layout(source: Path, n: int) -> h5py.VirtualLayout:
    layout = h5py.VirtualLayout(shape=(n,), dtype=np.float32)
    layout[:] = h5py.VirtualSource(str(source), "rewards", shape=(n,))
    return layout


def test_an_hdf5_declaring_more_rows_than_it_stores_is_refused(tmp_path):
    with h5py.File(tmp_path / "hopper-big.hdf5", "w") as f:
        for key, width in (("observations", 11), ("actions", 3)):
            f.create_dataset(key, (30_000_000, width), np.float32, chunks=(1000, width))
        for key in ("rewards", "terminals", "timeouts"):
            f.create_dataset(key, (30_000_000,), np.float32, chunks=(1000,))
    assert (tmp_path / "hopper-big.hdf5").stat().st_size < 100_000
    with pytest.raises(UserError, match="more than any compression can restore"):
        load_dataset(str(tmp_path / "hopper-big.hdf5"), env="hopper")


def test_data_that_cannot_fit_in_memory_is_refused_before_it_is_read(tmp_path, monkeypatch):

    write_d4rl(tmp_path / "hopper.hdf5", make_episodes(lengths=(40, 25)))
    monkeypatch.setattr(machine, "available_bytes", lambda device: (4000, "available memory"))
    with pytest.raises(UserError, match="more than this machine can hold while converting it"):
        load_dataset(str(tmp_path / "hopper.hdf5"), env="hopper")


# --- decision-transformer pickles ---


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


def test_pickle_trajectory_without_rewards(tmp_path):
    trajectory = {"observations": np.zeros((2, 11)), "actions": np.zeros((2, 3))}
    (tmp_path / "hopper.pkl").write_bytes(pickle.dumps([trajectory]))
    with raises("trajectory 0 lacks the keys rewards"):
        load_dataset(str(tmp_path / "hopper.pkl"))


def test_a_pickled_d4rl_dict_says_what_it_is(tmp_path):
    (tmp_path / "hopper.pkl").write_bytes(
        pickle.dumps({"observations": np.zeros((3, 11)), "actions": np.zeros((3, 3))})
    )
    with raises("found dict. It holds one dict of arrays, as a D4RL file does"):
        load_dataset(str(tmp_path / "hopper.pkl"))


def test_a_pickle_holding_a_huge_integer(tmp_path):
    trajs = dt_trajectories(make_episodes(lengths=(5, 6)))
    trajs[0]["rewards"] = [10**400, *trajs[0]["rewards"][1:].tolist()]
    (tmp_path / "int.pkl").write_bytes(pickle.dumps(trajs))
    with pytest.raises(UserError, match="'rewards' of trajectory 0 is not an array of numbers"):
        load_dataset(str(tmp_path / "int.pkl"), env="hopper")


def test_single_step_episodes_are_valid_training_data(tmp_path):
    data = load_dataset(_pickle(tmp_path / "hopper.pkl", make_episodes(lengths=(1,) * 6 + (5,))))
    assert data.lengths.tolist() == [1] * 6 + [5]
    batch = WindowSampler(data, 4, 1.0, *data.state_stats()).sample(64, torch.Generator().manual_seed(0))
    assert (batch["valid"].sum(1) == 1).any()  # windows with a single real step
    model = DecisionTransformer(make_config(**SMALL).model_config(data.obs_dim, data.act_dim))
    loss, _, _ = dt_loss(model, {k: v[None] for k, v in batch.items()}, 0.05)  # one member
    loss.sum().backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in model.parameters())


def test_dict_observations_are_refused():
    eps = [
        dict(
            observations={"achieved_goal": np.zeros((3, 2)), "observation": np.zeros((3, 4))},
            actions=np.zeros((2, 3)),
            rewards=np.zeros(2),
        )
    ]
    with raises("'observations' of episode 0", "dict", "achieved_goal, observation"):
        Trajectories.from_episodes(eps, source="x")


def test_a_dataset_pickle_that_would_run_code_is_refused(tmp_path):
    target = tmp_path / "created"
    with open(tmp_path / "evil.pkl", "wb") as f:
        pickle.dump([{"observations": Payload(target), "actions": [], "rewards": []}], f)
    res = run("train.py", "--dataset", str(tmp_path / "evil.pkl"), "--env", "hopper", "--out", str(tmp_path / "run"))
    assert res.returncode == 2 and "evil.pkl was refused: reading it would call io.open" in res.stderr, res.stderr
    assert not target.exists()


def test_dataset_pickles_of_plain_data_load_under_numpy_1_and_2_names(tmp_path):
    trajs = [dict(t, dones=np.float32(0)) for t in dt_trajectories(make_episodes(lengths=(5, 6)))]
    blobs = {f"protocol {p}": pickle.dumps(trajs, protocol=p) for p in (2, 4, 5)}
    blobs["NumPy 1"] = blobs["protocol 2"].replace(b"numpy._core", b"numpy.core")  # protocol 2 names globals as text
    for name, blob in blobs.items():
        (tmp_path / "data.pkl").write_bytes(blob)
        assert load_dataset(str(tmp_path / "data.pkl"), env="hopper").lengths.tolist() == [5, 6], name


def _pickle_of(*ops: bytes) -> bytes:
    """A protocol-2 pickle of the opcodes ``ops``."""
    return b"\x80\x02" + b"".join(ops) + b"."


def test_a_pickle_declaring_a_huge_array_allocates_nothing(tmp_path):
    ndarray, reconstruct = b"cnumpy\nndarray\n", b"cnumpy._core.multiarray\n_reconstruct\n"
    shape = b"J\x00\x2d\x31\x01K\x0b\x86"  # (20_000_000, 11), as BININT and BININT1
    direct = _pickle_of(ndarray, b"(", shape, b"tR")
    rebuilt = _pickle_of(reconstruct, ndarray, shape, b"C\x01b\x87R")
    for blob, phrase in (
        (direct, "calls numpy.ndarray directly"),
        (rebuilt, "NumPy's own pickles start from an empty"),
    ):
        (tmp_path / "big.pkl").write_bytes(blob)
        assert len(blob) < 200
        with pytest.raises(UserError, match=phrase):
            load_dataset(str(tmp_path / "big.pkl"), env="hopper")
    # an array whose bytes do not match its declared shape
    state = pickle.dumps(np.zeros(4, np.float32), protocol=2).replace(b"K\x04\x85", b"J\x00\x2d\x31\x01\x85")
    (tmp_path / "short.pkl").write_bytes(state)
    with pytest.raises(UserError, match="declares 20000000 values of float32 but holds 4"):
        load_pickle(tmp_path / "short.pkl")


# --- Minari datasets: their metadata chooses no code ---


def minari_dataset(dataset_id, minari_home, **change) -> Path:
    """A local Minari dataset of 3 Hopper episodes whose metadata.json has ``change`` (None: key removed)."""
    write_minari(dataset_id, make_episodes())
    path = minari_home / dataset_id / "data" / "metadata.json"
    meta = json.loads(path.read_text())
    for k, v in change.items():
        meta.pop(k) if v is None else meta.__setitem__(k, v)
    path.write_text(json.dumps(meta))
    return path.parent


def spec(**fields):
    return EnvSpec(
        **{
            "id": "Hopper-v5",
            "entry_point": "gymnasium.envs.mujoco.hopper_v5:HopperEnv",
            "max_episode_steps": 1000,
            **fields,
        }
    ).to_json()


def test_minari_metadata_without_spaces_cannot_make_its_environment(tmp_path, minari_home):
    target = tmp_path / "created"
    evil = spec(entry_point="io:open", kwargs={"file": str(target), "mode": "w"})
    minari_dataset("evil/hopper/nospace-v0", minari_home, observation_space=None, action_space=None, env_spec=evil)
    res = run(
        "train.py",
        "--dataset",
        "evil/hopper/nospace-v0",
        *TWO_STEPS,
        "--out",
        str(tmp_path / "run"),
        env={"MINARI_DATASETS_PATH": str(minari_home)},
    )
    assert_user_error(res, "lacks its observation_space", "a file may not make an environment")
    minari_dataset("evil/hopper/fine-v0", minari_home)
    res = run(
        "-m",
        "datasets",
        "combine",
        "evil/hopper/nospace-v0",
        "evil/hopper/fine-v0",
        "--into",
        "evil/hopper/c-v0",
        env={"MINARI_DATASETS_PATH": str(minari_home)},
    )
    assert_user_error(res, "lacks its observation_space")
    assert not target.exists()


def test_a_wrapper_or_an_id_cannot_make_gymnasium_import_a_module(tmp_path, minari_home, marker_module):
    mods, target = marker_module
    wrapped = json.loads(spec())
    wrapped["additional_wrappers"] = [
        {"name": "make", "entry_point": "gymnasium.envs.registration:make", "kwargs": {"id": "dtp_marker:Env"}}
    ]
    minari_dataset("evil/hopper/wrapper-v0", minari_home, env_spec=json.dumps(wrapped))
    minari_dataset("evil/hopper/module-v0", minari_home, env_spec=spec(id="dtp_marker:Hopper-v5"))
    sys.path.insert(0, str(mods))
    try:
        with pytest.raises(UserError, match="names the code gymnasium.envs.registration:make"):
            load_dataset("evil/hopper/wrapper-v0")
        with pytest.raises(UserError, match="'dtp_marker:Hopper-v5' is not a registered Gymnasium id"):
            load_dataset("evil/hopper/module-v0")
    finally:
        sys.path.remove(str(mods))
    assert "dtp_marker" not in sys.modules and not target.exists()


def test_a_datasets_environment_options_are_numbers_only(minari_home, tmp_path):
    xml = tmp_path / "sender.xml"
    minari_dataset("evil/hopper/xml-v0", minari_home, env_spec=spec(kwargs={"xml_file": str(xml)}))
    with pytest.raises(UserError, match="passes xml_file to Hopper-v5's constructor"):
        load_dataset("evil/hopper/xml-v0")
    minari_dataset(
        "evil/hopper/options-v0",
        minari_home,
        env_spec=spec(kwargs={"healthy_reward": 2.0}),
        ref_min_score=0.0,
        ref_max_score=100.0,
    )
    task = load_dataset("evil/hopper/options-v0").task
    assert json.loads(task.spec)["kwargs"] == {"healthy_reward": 2.0}  # a numeric option is the dataset's own
    older = {}  # as Gymnasium 1.0 wrote it, with two fields this version's EnvSpec no longer takes
    for key, value in json.loads(spec()).items():
        older[key] = value
        if key in ("order_enforce", "disable_env_checker"):
            older["autoreset" if key == "order_enforce" else "apply_api_compatibility"] = False
    minari_dataset("hosted/hopper/gymnasium1-v0", minari_home, env_spec=json.dumps(older))
    assert load_dataset("hosted/hopper/gymnasium1-v0").task.gym_id == "Hopper-v5"  # read as Minari reads it


def test_damaged_minari_data_and_metadata_are_a_message(minari_home):
    folder = minari_dataset("evil/hopper/cut-v0", minari_home)
    main = folder / "main_data.hdf5"
    main.write_bytes(main.read_bytes()[: main.stat().st_size // 2])
    with pytest.raises(UserError, match="evil/hopper/cut-v0"):
        load_dataset("evil/hopper/cut-v0")
    minari_dataset("evil/hopper/refs-v0", minari_home, ref_min_score="low", ref_max_score=100.0)
    with pytest.raises(UserError, match="ref_min_score low and ref_max_score 100.0, which cannot normalise"):
        load_dataset("evil/hopper/refs-v0")


def test_a_minari_hdf5_dataset_loads_as_minari_reads_it(minari_home):
    import minari

    minari_dataset("hosted/hopper/read-v0", minari_home)
    theirs = list(minari.load_dataset("hosted/hopper/read-v0").iterate_episodes())
    ours = load_dataset("hosted/hopper/read-v0")
    starts = np.cumsum([0, *ours.lengths])
    assert list(ours.lengths) == [len(ep.actions) for ep in theirs]
    for ep, a, b in zip(theirs, starts, starts[1:]):
        assert np.array_equal(ours.observations[a:b], ep.observations[:-1])
        assert np.array_equal(ours.actions[a:b], ep.actions) and np.array_equal(ours.rewards[a:b], ep.rewards)
    assert list(ours.terminals) == [bool(ep.terminations.any()) for ep in theirs]


@pytest.mark.parametrize(
    "damage, match",
    [
        (lambda f: f.__delitem__("episode_1/actions"), "lacks the array episode_1/actions"),
        (lambda f: _replace(f, "episode_0/observations", np.zeros((8, 5), np.float32)), r"\(rows, 11\)"),
        (lambda f: _replace(f, "episode_2/rewards", np.array([b"x"] * 12)), "episode_2/rewards holds"),
        (lambda f: _replace(f, "episode_0/rewards", np.zeros(9)), "with 7 rows"),
        (lambda f: _replace(f, "episode_2/actions", np.zeros((13, 3), np.float32)), "declares 22 steps in all"),
        (lambda f: _shorten(f, "episode_1"), "episodes hold 21 steps, its metadata.json declares 22"),
    ],
    ids=["missing", "width", "strings", "rows", "more steps", "fewer steps"],
)
def test_a_damaged_minari_hdf5_episode_is_a_message(minari_home, damage, match):
    folder = minari_dataset("evil/hopper/episode-v0", minari_home)
    with h5py.File(folder / "main_data.hdf5", "a") as f:
        damage(f)
    with pytest.raises(UserError, match=match):
        load_dataset("evil/hopper/episode-v0")


def _replace(f, name: str, values: np.ndarray) -> None:
    del f[name]
    f[name] = values


def _shorten(f, episode: str) -> None:
    """The episode one step shorter, every array of it."""
    for key in ("observations", "actions", "rewards", "terminations", "truncations"):
        _replace(f, f"{episode}/{key}", f[f"{episode}/{key}"][:-1])


def test_download_fetches_a_hosted_dataset_through_the_hub(tmp_path, monkeypatch, minari_home):
    """``--download`` as a user with a network runs it: Minari's default remote, the Hugging Face hub, through
    huggingface_hub (in the requirements); the hub's API is answered here by a local stand-in, a folder laid out
    as the farama-minari repositories are."""
    import shutil
    import types

    import minari.storage.remotes.huggingface as hf
    from huggingface_hub.errors import EntryNotFoundError

    from datasets.loaders import load_dataset

    hub = tmp_path / "hub"
    write_minari("mujoco/hopper/medium-v0", make_episodes())  # made here, then moved to the hub
    (hub / "farama-minari" / "mujoco" / "hopper").mkdir(parents=True)
    shutil.move(minari_home / "mujoco" / "hopper" / "medium-v0", hub / "farama-minari" / "mujoco" / "hopper")
    namespace = {"datasets": ["mujoco/hopper/medium-v0"], "namespaces": ["mujoco/hopper"]}
    (hub / "farama-minari" / "mujoco" / "namespace_metadata.json").write_text(json.dumps(namespace))
    (hub / "farama-minari" / "mujoco" / "hopper" / "namespace_metadata.json").write_text("{}")
    shutil.rmtree(minari_home / "mujoco")

    class Hub:  # the calls Minari's HuggingFaceStorage makes, answered from ``hub``
        def __init__(self, token=None):
            pass

        def list_datasets(self, author, dataset_name=None):
            repos = [p.name for p in (hub / author).iterdir() if dataset_name in (None, p.name)]
            return [types.SimpleNamespace(id=f"{author}/{name}") for name in repos]

        def hf_hub_download(self, repo_id, filename, repo_type, local_dir=None, force_download=False):
            src = hub / repo_id / filename
            if not src.is_file():
                raise EntryNotFoundError(f"{repo_id}: no {filename}")
            if local_dir is None:
                return str(src)
            (Path(local_dir) / filename).parent.mkdir(parents=True, exist_ok=True)
            return shutil.copy(src, Path(local_dir) / filename)

        def snapshot_download(self, repo_id, allow_patterns, repo_type, local_dir):
            part = allow_patterns.removesuffix("*")
            shutil.copytree(hub / repo_id / part, Path(local_dir) / part, dirs_exist_ok=True)

    monkeypatch.setattr(hf, "HfApi", Hub)
    installed = sys.modules["huggingface_hub"]
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # as without the requirement: said, not a traceback
    with raises('pip install "dt-primal[hf]"'):
        load_dataset("mujoco/hopper/medium-v0", download=True)
    monkeypatch.setitem(sys.modules, "huggingface_hub", installed)
    with raises("is neither a dataset file nor a Minari dataset", "--download"):
        load_dataset("mujoco/hopper/medium-v0")
    data = load_dataset("mujoco/hopper/medium-v0", download=True)
    assert data.lengths.tolist() == [7, 3, 12] and data.task.name == "hopper"
    assert load_dataset("mujoco/hopper/medium-v0").lengths.tolist() == [7, 3, 12]  # local from now on
