"""What the tests share: temporary Minari homes, tiny datasets and runs, the tiny model's options, and
the assertions every bad-input test makes (status 2, one message, no traceback), a hostile pickle."""

import contextlib
import dataclasses
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from dt_primal.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
# the tiny model, as train.py's options and as Config fields
SMALL = dict(dataset="tiny", d_model=32, n_head=2, n_layer=2, s=8)
SMALL |= dict(warmup_steps=5, batch_size=8, eval_every=1000, eval_episodes=1)
SMALL |= dict(device="cpu", precision="fp32")  # with auto, two processes on a loaded machine may time bf16 differently


def as_options(settings: dict, *names: str) -> list[str]:
    """``settings``' ``names`` as train.py options (``--d-model 32 ...``)."""
    return [a for n in names for a in ("--" + n.replace("_", "-"), str(settings[n]))]


TINY = as_options(SMALL, "d_model", "n_head", "n_layer", "s", "device", "precision")  # the tiny model, on a CPU
QUICK = [*TINY, *as_options(SMALL, "batch_size", "eval_every", "eval_episodes"), "--warmup-steps", "2"]
TWO_STEPS = [*QUICK, "--steps", "2"]  # a run of two steps, the bad-input tests' tiny run
SWEEP_RUN = ["--env", "hopper", *TINY, "--steps", "6", "--warmup-steps", "2", "--eval-every", "3"]
SWEEP_RUN += ["--eval-episodes-during", "1", "--eval-episodes", "2"]  # what a sweep's tiny runs train
FORMAT1 = ROOT / "tests" / "fixtures" / "format1"  # last.pt: 3 steps on hopper.pkl, written by commit 3d6ec5d


@pytest.fixture(autouse=True, scope="session")
def session_minari_home(tmp_path_factory):
    """The Minari datasets that module-wide fixtures write or read live in a temporary folder."""
    path = tmp_path_factory.mktemp("minari")
    mp = pytest.MonkeyPatch()
    mp.setenv("MINARI_DATASETS_PATH", str(path))
    yield path
    mp.undo()


@pytest.fixture(autouse=True)
def minari_home(tmp_path_factory, monkeypatch):
    """Every Minari dataset a test writes or reads lives in a temporary folder of its own: no test sees what
    another made, whichever test process runs it and in whatever order."""
    path = tmp_path_factory.mktemp("minari")
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(path))
    return path


def make_episodes(lengths=(7, 3, 12), obs_dim=11, act_dim=3, seed=0):
    """Hopper-sized episodes in the Minari layout (T+1 observations); the last one times out."""
    rng = np.random.default_rng(seed)
    eps = []
    for i, n in enumerate(lengths):
        term = np.zeros(n, bool)
        trunc = np.zeros(n, bool)
        (trunc if i == len(lengths) - 1 else term)[-1] = True
        eps.append(
            dict(
                observations=rng.normal(size=(n + 1, obs_dim)).astype(np.float32),
                actions=rng.uniform(-1, 1, (n, act_dim)).astype(np.float32),
                rewards=rng.normal(size=n).astype(np.float32),
                terminations=term,
                truncations=trunc,
            )
        )
    return eps


def hopper_file(tmp_path, name="hopper_tiny.hdf5", **change) -> Path:
    """A D4RL file of 4 Hopper-sized episodes (158 steps), ``change`` mapping an array's key to a function of it."""
    from datasets.synthetic import write_d4rl

    eps = make_episodes(lengths=(40, 25, 60, 33), seed=3)
    for key, f in change.items():
        eps = [dict(e, **{key: f(e[key])}) for e in eps]
    write_d4rl(tmp_path / name, eps)
    return tmp_path / name


def small_config(**change):
    """The tiny model's run config (``SMALL``) with ``change``."""
    from dt_primal.config import make_config

    return make_config(**{**SMALL, **change})


def write_minari(dataset_id, episodes, env="Hopper-v5", data_format="hdf5"):
    """``episodes`` as the Minari dataset ``dataset_id`` (Minari's Arrow writer needs the observations in the
    space's dtype, float64 for the MuJoCo tasks)."""
    import minari
    from minari.data_collector.episode_buffer import EpisodeBuffer

    buffers = [
        EpisodeBuffer(
            observations=e["observations"].astype(np.float64) if data_format == "arrow" else e["observations"],
            actions=e["actions"],
            rewards=e["rewards"].tolist(),
            terminations=e["terminations"].tolist(),
            truncations=e["truncations"].tolist(),
        )
        for e in episodes
    ]
    minari.create_dataset_from_buffers(dataset_id, buffers, env=env, author="tests", data_format=data_format)


def dt_trajectories(episodes) -> list[dict]:
    """``episodes`` as a decision-transformer pickle holds them: one dict of arrays per trajectory."""
    return [
        dict(
            observations=e["observations"][:-1],
            next_observations=e["observations"][1:],
            actions=e["actions"],
            rewards=e["rewards"],
            terminals=e["terminations"],
        )
        for e in episodes
    ]


def write_pickle(path, episodes):
    """``episodes`` as a decision-transformer pickle."""
    path.write_bytes(pickle.dumps(dt_trajectories(episodes)))


# the tests that need a CUDA GPU (the GPU machine's window runs them with -k cuda)
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CI has none)")


def one_thread_env(**extra) -> dict:
    """The test's environment as it is now (its Minari home among it), with one thread (faster on a busy machine,
    and the same numbers in-process) and ``extra``: what a test's child processes run with."""
    return {**os.environ, "OMP_NUM_THREADS": "1", **extra}


def run(*args, env=None, timeout=300):
    """``python ARGS`` in the repository root, one thread, ``env`` added to the environment: its completed
    process, output captured."""
    return subprocess.run(
        [sys.executable, *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=one_thread_env(**(env or {})),
    )


def two_steps(tmp_path, *options):
    """``train.py`` on ``hopper_file(tmp_path)``, two steps of the tiny model, with ``options`` (``--out`` among
    them): its completed process."""
    return run("train.py", "--dataset", hopper_file(tmp_path), *TWO_STEPS, *options)


def assert_refused(code: int, err: str, *phrases) -> None:
    """A command's refusal: exit status 2 and one ``error:`` paragraph naming ``phrases``; no traceback."""
    assert code == 2 and err.startswith("error: ") and "Traceback" not in err, err
    for phrase in phrases:
        assert phrase in err, (phrase, err)


def assert_user_error(res, *phrases):
    """``assert_refused`` of a command run in a child process (``run``)."""
    assert_refused(res.returncode, res.stderr, *phrases)


@contextlib.contextmanager
def raises(*phrases):
    """A UserError whose message names each of ``phrases`` (the option, the value, the file: not the sentence)."""
    with pytest.raises(UserError) as refusal:
        yield refusal
    for phrase in phrases:
        assert phrase in str(refusal.value), (phrase, str(refusal.value))


def exit_of(main, capsys):
    """The exit status and stderr of ``main`` run as the commands run it (``run_main``)."""
    from dt_primal.cli import run_main

    with pytest.raises(SystemExit) as exit_info:
        run_main(main)
    return exit_info.value.code, capsys.readouterr().err


def exits_2(main, capsys, *phrases):
    """``assert_refused`` of ``main`` run in this process as the commands run it."""
    assert_refused(*exit_of(main, capsys), *phrases)


def train_exits_2(capsys, *argv, phrase):
    """``train.py ARGV`` in this process, refused before training with status 2, naming ``phrase``."""
    from datasets.loaders import load_dataset
    from dt_primal.cli.train import train_command

    exits_2(lambda: train_command([str(a) for a in argv], load_dataset), capsys, phrase)


class Payload:
    """Unpickled, it creates the file ``target``: what a hostile checkpoint or dataset would do."""

    def __init__(self, target):
        self.target = str(target)

    def __reduce__(self):
        return open, (self.target, "w")


@pytest.fixture
def marker_module(tmp_path):
    """A module that, imported, creates a file: (folder to put on PYTHONPATH, the file)."""
    target = tmp_path / "imported"
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "dtp_marker.py").write_text(f"open({str(target)!r}, 'w').close()\n")
    return tmp_path / "mods", target


@pytest.fixture(scope="module")
def one_thread():
    """In-process runs use one thread too, so their weights can equal a subprocess's bit for bit (a module
    asks for it with ``pytestmark = pytest.mark.usefixtures("one_thread")``)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_run(folder: Path, **change) -> Path:
    """A 2-step run of the tiny model (``SMALL`` with ``change``) on two Hopper episodes written to
    ``folder/hopper_tiny.hdf5``, in ``folder/run``: that run folder."""
    from datasets.loaders import load_dataset
    from datasets.synthetic import write_d4rl
    from dt_primal.training.loop import train

    data = folder / "hopper_tiny.hdf5"
    write_d4rl(data, make_episodes(lengths=(40, 25), seed=3))
    cfg = small_config(**{"dataset": str(data), "env": "hopper", "steps": 2, "max_ep_len": 50, **change})
    train(dataclasses.replace(cfg, out=str(folder / "run")), load_dataset(str(data), env="hopper"))
    return folder / "run"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """The folder of a ``tiny_run``, one per test module."""
    return tiny_run(tmp_path_factory.mktemp("run"))
