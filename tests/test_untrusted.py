"""Files a user is given, made by a hostile sender: they choose no code, read no other file, allocate no
more than they hold, and end in one message with status 2."""

import io
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from conftest import QUICK, assert_user_error, exit_of, make_episodes, write_minari
from gymnasium.envs.registration import EnvSpec

from commands.sweep import records
from datasets.loaders import load_dataset
from datasets.synthetic import write_d4rl
from dt_primal import checkpoint, untrusted
from dt_primal.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
TINY = [*QUICK, "--steps", "2"]  # a tiny run, as the other bad-input tests train it


def run(*args, env=None):
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
    )


@pytest.fixture
def marker_module(tmp_path):
    """A module that, imported, creates a file: (folder to put on PYTHONPATH, the file)."""
    target = tmp_path / "imported"
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "dtp_marker.py").write_text(f"open({str(target)!r}, 'w').close()\n")
    return tmp_path / "mods", target


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


# --- code or imports chosen by a file ---


def test_minari_metadata_without_spaces_cannot_make_its_environment(tmp_path, minari_home):
    target = tmp_path / "created"
    evil = spec(entry_point="io:open", kwargs={"file": str(target), "mode": "w"})
    minari_dataset("evil/hopper/nospace-v0", minari_home, observation_space=None, action_space=None, env_spec=evil)
    res = run(
        "train.py",
        "--dataset",
        "evil/hopper/nospace-v0",
        *TINY,
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


def test_a_checkpoints_environment_id_is_a_registered_mujoco_one(run_dir, tmp_path, marker_module):  # noqa: F811
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


# --- other files read ---


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


# --- memory: sizes declared in the file are checked before anything is allocated ---


def test_a_compressed_checkpoint_entry_is_refused_before_it_is_inflated(run_dir, tmp_path):  # noqa: F811
    with (
        zipfile.ZipFile(run_dir / "last.pt") as src,
        zipfile.ZipFile(tmp_path / "packed.pt", "w", zipfile.ZIP_DEFLATED) as dst,
    ):
        for entry in src.infolist():
            dst.writestr(entry.filename, src.read(entry))
    with pytest.raises(UserError, match="is compressed, which torch.save never writes"):
        checkpoint.read_checkpoint(tmp_path / "packed.pt")


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
    from dt_primal import machine

    write_d4rl(tmp_path / "hopper.hdf5", make_episodes(lengths=(40, 25)))
    monkeypatch.setattr(machine, "available_bytes", lambda device: (4000, "available memory"))
    with pytest.raises(UserError, match="more than this machine can hold while converting it"):
        load_dataset(str(tmp_path / "hopper.hdf5"), env="hopper")


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
        untrusted.load_pickle(tmp_path / "short.pkl")


def test_a_records_archive_entry_larger_than_a_record_is_not_read(tmp_path):
    with tarfile.open(tmp_path / "big.tgz", "w:gz") as tar:
        info = tarfile.TarInfo("hopper/dt/seed_0/eval.json")
        info.size = untrusted.MAX_RECORD + 1
        tar.addfile(info, io.BytesIO(b" " * info.size))
    with pytest.raises(UserError, match="declares 16777217 bytes, where a run record is a few kB"):
        records.from_archive(tmp_path / "big.tgz")


def test_records_are_bounded_in_total_json_and_never_read_through_a_link(tmp_path):
    """An archive of many records of 16 MiB each (80 kB per GiB compressed) wrote them all; a record that is not
    JSON was copied as it was; packing a folder followed links."""
    with tarfile.open(tmp_path / "bomb.tgz", "w:gz") as tar:
        for i in range(5):
            info = tarfile.TarInfo(f"d/dt/seed_{i}/eval.json")
            info.size = untrusted.MAX_RECORD
            tar.addfile(info, io.BytesIO(b" " * info.size))
    assert (tmp_path / "bomb.tgz").stat().st_size < 200_000
    with pytest.raises(UserError, match="more than 64 MiB of records"):
        records.from_archive(tmp_path / "bomb.tgz")
    with tarfile.open(tmp_path / "text.tgz", "w:gz") as tar:
        info = tarfile.TarInfo("d/dt/seed_0/eval.json")
        info.size = 5
        tar.addfile(info, io.BytesIO(b"hello"))
    with pytest.raises(UserError, match="eval.json is not JSON"):
        records.from_archive(tmp_path / "text.tgz")
    sweep, elsewhere = tmp_path / "sweep", tmp_path / "elsewhere" / "seed_1"
    (sweep / "d" / "dt" / "seed_0").mkdir(parents=True)
    (sweep / "d" / "dt" / "seed_0" / "eval.json").write_text('{"step": 1}')
    elsewhere.mkdir(parents=True)
    (elsewhere / "eval.json").write_text('{"secret": 1}')
    (sweep / "d" / "dt" / "seed_1").symlink_to(elsewhere)
    (sweep / "d" / "dt" / "seed_0" / "evals.jsonl").symlink_to(elsewhere / "eval.json")
    assert records.from_folder(sweep) == {"d/dt/seed_0/eval.json": b'{"step": 1}'}


# --- the run folder ---


def assert_exits_2(main, capsys, *phrases):
    """``main`` under the commands' error exit: status 2 and one ``error:`` paragraph naming ``phrases``."""
    code, err = exit_of(main, capsys)
    assert code == 2 and err.startswith("error: ") and "Traceback" not in err, err
    assert all(phrase in err for phrase in phrases), (phrases, err)


def train_py(capsys, *argv, phrase):
    """``train.py argv``, in this process (it stops before training), refused naming ``phrase``."""
    from dt_primal.cli.train import train_command

    assert_exits_2(lambda: train_command([str(a) for a in argv], load_dataset), capsys, phrase)


def test_a_run_never_writes_through_a_link_nor_over_a_users_file(tmp_path, capsys):
    data = tmp_path / "hopper_tiny.hdf5"
    write_d4rl(data, make_episodes(lengths=(40, 25), seed=3))
    precious = tmp_path / "precious.txt"
    for name in (".train.lock", "eval.json", "dataset.json"):
        precious.write_text("mine")
        out = tmp_path / f"out{name}"
        out.mkdir()
        (out / name).symlink_to(precious)
        train_py(capsys, "--dataset", data, *TINY, "--out", out, phrase=f"{out / name} is a symbolic link")
        assert precious.read_text() == "mine"
    for name in ("eval.json", "dataset.json"):
        out = tmp_path / f"own{name}"
        out.mkdir()
        (out / name).write_text("my notes")
        phrase = f"already holds {name}, which no run of dt-primal wrote there"
        train_py(capsys, "--dataset", data, *TINY, "--out", out, phrase=phrase)
        assert (out / name).read_text() == "my notes"
    res = run("train.py", "--dataset", str(data), *TINY, "--out", str(out))  # and so does the command
    assert_user_error(res, "already holds dataset.json")


def test_evaluate_never_overwrites_an_unrelated_table_beside_its_report(run_dir, tmp_path):  # noqa: F811
    (tmp_path / "X.md").write_text("# my notes\n")
    res = run("evaluate.py", str(run_dir / "last.pt"), "--episodes", "1", "--out", str(tmp_path / "X.json"))
    assert_user_error(res, "is not a table evaluate.py wrote")
    assert (tmp_path / "X.md").read_text() == "# my notes\n"


# --- a message where there was a traceback or a wrong answer ---


def test_empty_and_special_files_are_a_message(run_dir, tmp_path):  # noqa: F811
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


def test_torchs_refusal_of_a_blocked_module_is_named(run_dir, tmp_path):  # noqa: F811
    class System:
        def __reduce__(self):
            return os.system, ("true",)

    ckpt = torch.load(run_dir / "last.pt", weights_only=True)
    torch.save({**ckpt, "step": System()}, tmp_path / "evil.pt")
    with pytest.raises(UserError, match=r"reading it would call posix.system"):
        checkpoint.read_checkpoint(tmp_path / "evil.pt")


@pytest.mark.parametrize(
    "change, phrase",
    [
        (lambda c: c["rng"]["numpy"].update(key=[1, 2, 3]), "The training state in "),
        (lambda c: c.update(step="876"), "is damaged: its step is '876', not a count"),
    ],
)
def test_a_damaged_training_state_is_a_message_on_resume(run_dir, tmp_path, change, phrase):  # noqa: F811
    out = tmp_path / "run"
    shutil.copytree(run_dir, out)
    ckpt = torch.load(out / "last.pt", weights_only=True)
    change(ckpt)
    torch.save(ckpt, out / "last.pt")
    res = run("train.py", "--resume", "--out", str(out), "--steps", "4")
    assert res.returncode == 2 and "Traceback" not in res.stderr and "error: " in res.stderr and phrase in res.stderr, (
        res.stderr
    )


def test_resume_after_a_crash_that_cut_the_last_line_of_the_curve(run_dir, tmp_path):  # noqa: F811
    out = tmp_path / "run"
    shutil.copytree(run_dir, out)
    (out / "evals.jsonl").write_text('["not", "a point"]\n{"step": 1, "rep')
    res = run("train.py", "--resume", "--out", str(out), "--steps", "3")
    assert res.returncode == 0, res.stderr
    assert "left out 2 damaged lines" in res.stderr


def test_damaged_minari_data_and_metadata_are_a_message(minari_home):
    folder = minari_dataset("evil/hopper/cut-v0", minari_home)
    main = folder / "main_data.hdf5"
    main.write_bytes(main.read_bytes()[: main.stat().st_size // 2])
    with pytest.raises(UserError, match="evil/hopper/cut-v0"):
        load_dataset("evil/hopper/cut-v0")
    minari_dataset("evil/hopper/refs-v0", minari_home, ref_min_score="low", ref_max_score=100.0)
    with pytest.raises(UserError, match="ref_min_score low and ref_max_score 100.0, which cannot normalise"):
        load_dataset("evil/hopper/refs-v0")


def test_a_pickle_holding_a_huge_integer(tmp_path):
    eps = make_episodes(lengths=(5, 6))
    trajs = [
        dict(
            observations=e["observations"][:-1],
            actions=e["actions"],
            rewards=e["rewards"].tolist(),
            terminals=e["terminations"],
        )
        for e in eps
    ]
    trajs[0]["rewards"][0] = 10**400
    (tmp_path / "int.pkl").write_bytes(pickle.dumps(trajs))
    with pytest.raises(UserError, match="'rewards' of trajectory 0 is not an array of numbers"):
        load_dataset(str(tmp_path / "int.pkl"), env="hopper")


@pytest.mark.parametrize(
    "change, phrase, acting",
    [
        (lambda c: c["model"][next(iter(c["model"]))].fill_(float("nan")), "holds NaN or infinite weights", True),
        (lambda c: c.update(state_std=torch.zeros(11)), "a spread that is not positive", True),
        (lambda c: c["task"].update(ref_min=5.0, ref_max=5.0), "cannot normalise a score", False),
        (lambda c: c["config"].pop("targets"), "a run config needs exactly the fields", False),
    ],
)
def test_values_that_would_make_every_score_or_action_nan(run_dir, tmp_path, change, phrase, acting):  # noqa: F811
    import dt_primal

    ckpt = torch.load(run_dir / "last.pt", weights_only=True)
    change(ckpt)
    torch.save(ckpt, tmp_path / "last.pt")
    res = run("evaluate.py", str(tmp_path / "last.pt"), "--episodes", "1", "--out", str(tmp_path / "ev.json"))
    assert_user_error(res, phrase)
    if acting:  # a policy needs no task
        with pytest.raises(UserError, match=phrase):
            dt_primal.load_policy(tmp_path / "last.pt")


def test_options_out_of_range(tmp_path, capsys):
    from commands.sweep.command import main as sweep

    data = tmp_path / "hopper.hdf5"
    write_d4rl(data, make_episodes(lengths=(40, 25), seed=3))
    huge = "--warmup-steps must be at most 1e+15"
    train_py(capsys, "--dataset", data, "--warmup-steps", 10**26, "--out", tmp_path / "a", phrase=huge)
    for jobs in ("0", "-1"):
        argv = ["--datasets", "hopper", "--models", "dt", "--seeds", "0", "--jobs", jobs, "--out", str(tmp_path / "s")]
        assert_exits_2(lambda: sweep(argv), capsys, f"--jobs must be at least 1 (got {jobs})")  # noqa: B023
    not_text = os.fsdecode(os.fsencode(tmp_path) + b"/\xff")  # as Python hands a command line's bytes over
    train_py(capsys, "--dataset", data, "--out", not_text, phrase="--out holds bytes that are not UTF-8 text")


def test_a_malformed_record_is_a_message_in_the_aggregation(run_dir, tmp_path):  # noqa: F811
    seed = tmp_path / "sweep" / "hopper" / "dt" / "seed_0"
    seed.mkdir(parents=True)
    for text, phrase in (
        ('{"step": 3, "targets": [{"target": "high"}]}', "lacks a step count or per-target reports"),
        ('{"step": ', "is not JSON"),
    ):
        (seed / "eval.json").write_text(text)
        res = run(
            "-m",
            "commands.sweep",
            "--datasets",
            "hopper",
            "--models",
            "dt",
            "--seeds",
            "0",
            "--out",
            str(tmp_path / "sweep"),
            "--aggregate-only",
        )
        assert_user_error(res, f"The run record {seed / 'eval.json'}", phrase)


def test_a_records_archive_whose_file_and_folder_share_a_path_writes_nothing(tmp_path):
    record = json.dumps({"step": 1}).encode()
    with tarfile.open(tmp_path / "clash.tgz", "w:gz") as tar:
        for name in ("a/seed_0/eval.json", "a/seed_0/eval.json/seed_1/eval.json"):
            info = tarfile.TarInfo(name)
            info.size = len(record)
            tar.addfile(info, io.BytesIO(record))
    res = run("-m", "commands.sweep.records", str(tmp_path / "clash.tgz"), str(tmp_path / "dst"))
    assert_user_error(res, "a file, folder or link is in the way", "Nothing was written")
    assert not (tmp_path / "dst").exists() or not any((tmp_path / "dst").rglob("*.json"))


def test_a_dataset_id_with_shell_syntax_is_never_suggested_as_a_command(tmp_path):
    folder = tmp_path / "ds" / "data"
    folder.mkdir(parents=True)
    (folder / "metadata.json").write_text(json.dumps({"dataset_id": "x; rm -rf ~ \x1b[2J"}))
    with pytest.raises(UserError) as exc:
        load_dataset(str(tmp_path / "ds"))
    assert "rm -rf" not in str(exc.value) and "\x1b" not in str(exc.value)


def test_a_fifo_a_device_or_a_folder_is_named_and_refused_without_waiting(tmp_path):
    """Every file a user gives is opened without blocking and checked on the open file: a FIFO as a record
    (dataset.json, evals.jsonl, a throughput file) hung, /dev/zero read until memory ran out."""
    from dt_primal.records import read_curve
    from dt_primal.untrusted import read_json

    fifo = tmp_path / "dataset.json"
    os.mkfifo(fifo)
    for path, kind in ((fifo, "FIFO"), (Path("/dev/zero"), "device"), (tmp_path, "folder")):
        with pytest.raises(UserError, match=kind):
            read_json(path, "The record", "")
        with pytest.raises(UserError, match=kind):
            read_curve(path)
    with pytest.raises(UserError, match="too long"):
        read_json(tmp_path / ("x" * 300), "The record", "")
    (tmp_path / "big.json").write_bytes(b" " * 100 + b"1")
    with pytest.raises(UserError, match="larger than 50 bytes"):
        read_json(tmp_path / "big.json", "The record", "", limit=50)
    assert read_json(tmp_path / "big.json", "The record", "", limit=101) == 1
    point = {"step": 1, "reports": [{"target": 1.0, "episodes": 1, "normalized_mean": 5.0}]}
    (tmp_path / "evals.jsonl").write_text(json.dumps(point) + "\n" + "[" * (2**20 + 1) + "\n")
    assert read_curve(tmp_path / "evals.jsonl") == [point]  # an overlong line is left out, unparsed


@pytest.mark.parametrize("content", ["fifo", "/dev/zero", '{"records": [{"members": 1e400}]}'])
def test_a_gpu_windows_throughput_file_is_checked_before_the_window_starts(tmp_path, content):
    path = tmp_path / "throughput.json"
    if content == "fifo":
        os.mkfifo(path)
    elif content.startswith("/dev"):
        path = Path(content)
    else:
        path.write_text(content)
    cmd = [sys.executable, "-m", "commands.gpu_window", "start", "--out", str(tmp_path / "out")]
    res = subprocess.run([*cmd, "--throughput", str(path)], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert res.returncode == 2 and "--throughput" in res.stderr and "Traceback" not in res.stderr, res.stderr


def test_an_arrow_dataset_without_pyarrow_says_to_install_it(monkeypatch):
    """Not "check the dataset id": the id is right, a package is missing."""
    from minari.storage.datasets_root_dir import get_dataset_path

    from dt_primal.loaders import load_minari

    write_minari("tests/arrowish-v0", make_episodes(lengths=(20, 30), seed=1))
    meta_path = get_dataset_path("tests/arrowish-v0") / "data" / "metadata.json"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps(meta | {"data_format": "arrow"}))
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow fails, installed or not
    with pytest.raises(UserError, match=r"Arrow format.*pip install pyarrow"):
        load_minari("tests/arrowish-v0")


def test_a_sweeps_tables_and_figures_replace_a_link_in_its_folder_never_write_through_it(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from commands.sweep.plots import save_figure
    from commands.sweep.tables import write_csv

    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    for name in ("results.csv", "results.png"):
        (tmp_path / name).symlink_to(victim)
    write_csv([], tmp_path / "results.csv")
    save_figure(plt.figure(), tmp_path / "results.png", 50)
    assert victim.read_text() == "keep"
    assert not (tmp_path / "results.csv").is_symlink() and (tmp_path / "results.csv").read_text().startswith("dataset")
    assert (tmp_path / "results.png").read_bytes()[:4] == b"\x89PNG"
