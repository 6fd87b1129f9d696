"""What the commands do to their process and what the library leaves alone; --precision auto."""

import json
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, SMALL, TWO_STEPS, hopper_file, one_thread_env, run

from datasets.loaders import load_dataset
from dt_primal import precision
from dt_primal.cli.evaluate import evaluate_command
from dt_primal.config import Config, make_config
from dt_primal.files import checkpoint
from dt_primal.training import loop as training

# imports that change os.environ themselves (gymnasium hides pygame's greeting): made before the snapshot
THIRD_PARTY = "import gymnasium, h5py, minari, numpy, torch, tqdm"
LIBRARY = (
    "dt_primal, dt_primal.cli.console, dt_primal.cli.train, dt_primal.cli.evaluate, dt_primal.files.loaders, "
    "commands.train, commands.sweep.command, commands.spectrum, dt_primal.training.loop, "
    "dt_primal.evaluation.rollout, dt_primal.evaluation.checks, dt_primal.training.checks, dt_primal.files.checkpoint, "
    "dt_primal.cli, dt_primal.precision, dt_primal.process, "
    "datasets.loaders, envs"
)


def python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in one_thread_env().items() if k != "OMP_WAIT_POLICY"},
    )


# --- no import-time side effects; the commands' own settings ---


def test_importing_the_library_leaves_the_process_as_it_was():
    res = python(f"""
import os, torch
{THIRD_PARTY}
before, threads, tf32 = dict(os.environ), torch.get_num_threads(), torch.backends.cuda.matmul.allow_tf32
import {LIBRARY}
assert dict(os.environ) == before, set(os.environ.items()) ^ set(before.items())
assert "OMP_WAIT_POLICY" not in os.environ
assert (torch.get_num_threads(), torch.backends.cuda.matmul.allow_tf32) == (threads, tf32)
print("unchanged")""")
    assert res.returncode == 0 and "unchanged" in res.stdout, res.stderr


@pytest.mark.parametrize(
    "command",
    [
        "path:train.py",
        "path:evaluate.py",
        "module:commands.train",
        "module:commands.sweep",
        "module:commands.spectrum",
        "module:datasets",
        "console:train",
        "console:evaluate",
        "console:export",
    ],
)
def test_every_command_sets_the_wait_policy_before_torch_loads(command):
    """An import hook records OMP_WAIT_POLICY at the moment torch is first imported (its OpenMP reads it then)."""
    kind, name = command.split(":")
    res = python(f"""
import importlib.abc, os, runpy, sys
seen = []
class Spy(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname == "torch" and not seen:
            seen.append(os.environ.get("OMP_WAIT_POLICY"))
sys.meta_path.insert(0, Spy())
sys.argv = ["{name}", "--help"]
try:
    if "{kind}" == "console":  # an installed command line: pyproject.toml's [project.scripts]
        import dt_primal.cli.console
        dt_primal.cli.console.{name}()
    else:
        runpy.run_{kind}("{name}", run_name="__main__")
except SystemExit:
    pass
print("policy at torch import:", seen)""")
    assert "policy at torch import: ['PASSIVE']" in res.stdout, (res.stdout[-500:], res.stderr[-2000:])


def test_configure_process_keeps_a_policy_given_and_sets_threads():
    res = python("""
import os
os.environ["OMP_WAIT_POLICY"] = "ACTIVE"
from dt_primal.process import configure_process
configure_process(threads=1)
import torch
print(os.environ["OMP_WAIT_POLICY"], torch.get_num_threads())""")
    assert res.stdout.split() == ["ACTIVE", "1"], res.stderr


def test_tf32_is_switched_on_inside_its_block_only():
    saved = torch.backends.cuda.matmul.allow_tf32
    with precision.tf32("tf32"):
        assert torch.backends.cuda.matmul.allow_tf32
    assert torch.backends.cuda.matmul.allow_tf32 == saved
    with precision.tf32("bf16"):
        assert torch.backends.cuda.matmul.allow_tf32 == saved


# --- --precision auto ---


def test_auto_is_the_default_of_the_config_and_of_every_preset():
    assert Config().precision == "auto"
    assert all(make_config(p).precision == "auto" for p in ("paper", "quick", "dt-paper"))
    assert make_config("quick", precision="fp32").precision == "fp32"


@pytest.mark.parametrize("share, chosen", [(0.3, "bf16"), (2.5, "fp32"), (60.0, "fp32")])
def test_auto_on_a_cpu_follows_the_measurement(monkeypatch, share, chosen):
    monkeypatch.setattr(precision, "bf16_share", lambda d_model: share)
    resolved, why = precision.resolve_precision("auto", torch.device("cpu"), 128)
    assert resolved == chosen and f"{share:.2f}x the fp32 time" in why


def test_cuda_takes_bf16_and_an_explicit_precision_wins_without_measuring(monkeypatch):
    monkeypatch.setattr(precision, "bf16_share", lambda d_model: pytest.fail("measured"))
    assert precision.resolve_precision("auto", torch.device("cuda"), 128)[0] == "bf16"
    for given in ("fp32", "tf32", "bf16"):
        assert precision.resolve_precision(given, torch.device("cpu"), 128) == (given, "as set")


def test_the_measurement_gives_a_ratio_and_leaves_the_threads():
    threads = torch.get_num_threads()
    share = precision.bf16_share(64)
    assert 0 < share < float("inf") and torch.get_num_threads() == threads


@pytest.mark.parametrize("share, chosen", [(0.3, "bf16"), (2.5, "fp32")])
def test_a_run_records_the_resolved_precision(tmp_path, monkeypatch, capsys, share, chosen):
    monkeypatch.setattr(precision, "bf16_share", lambda d_model: share)
    data = load_dataset(str(hopper_file(tmp_path)))
    training.train(make_config(**{**SMALL, "precision": "auto"}, steps=2, out=str(tmp_path / "run")), data)
    assert capsys.readouterr().out.count(f"precision: {chosen} (auto: ") == 1
    assert json.loads((tmp_path / "run" / "eval.json").read_text())["config"]["precision"] == chosen
    assert checkpoint.load_checkpoint(tmp_path / "run" / "last.pt")["config"]["precision"] == chosen

    # evaluate.py's auto (its default): the run's own, but fp32 where bf16 is slow; said and recorded
    for share_now, used in ((share, chosen), (2.5, "fp32")):
        monkeypatch.setattr(precision, "bf16_share", lambda d_model, share_now=share_now: share_now)
        report = tmp_path / f"ev{share_now}.json"
        evaluate_command(
            [str(tmp_path / "run" / "last.pt"), "--episodes", "1", "--device", "cpu", "--out", str(report)]
        )
        assert f"precision: {used} (auto: " in capsys.readouterr().out
        assert json.loads(report.read_text())["checkpoints"][0]["precision"] == used


ASCII = {"PYTHONIOENCODING": "ascii"}  # a terminal without "±"


def test_a_terminal_that_cannot_print_plus_minus_gets_an_escape_and_the_run_goes_on(tmp_path):
    res = run("train.py", "--dataset", hopper_file(tmp_path), *TWO_STEPS, "--out", tmp_path / "run", env=ASCII)
    assert res.returncode == 0 and "return" in res.stdout and "\\xb1" in res.stdout, res.stderr


@pytest.mark.parametrize("value", ["bogus", "wgl"])
def test_a_mujoco_gl_that_cannot_work_is_a_note_and_evaluation_goes_on(run_dir, tmp_path, value):
    """MuJoCo refused MUJOCO_GL as it loaded, and every command stopped at import with a traceback."""
    out = tmp_path / "r.json"
    args = [run_dir / "last.pt", "--episodes", "1", "--device", "cpu", "--out", out]
    res = run("evaluate.py", *args, env={"MUJOCO_GL": value})
    assert res.returncode == 0 and f"note: MUJOCO_GL={value} cannot be used here" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr and json.loads(out.read_text())["checkpoints"]


def test_a_checkpoint_path_that_is_not_utf8_is_evaluated_and_reported(run_dir, tmp_path):
    """A path's bytes that are not UTF-8 stopped evaluate.py with a UnicodeEncodeError while writing its report."""
    import os
    import shutil

    folder = tmp_path / os.fsdecode(b"ck\xff")
    folder.mkdir()
    shutil.copy(run_dir / "last.pt", folder / "last.pt")
    out = tmp_path / "r.json"
    res = run("evaluate.py", folder / "last.pt", "--episodes", "1", "--device", "cpu", "--out", out)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert json.loads(out.read_text())["checkpoints"][0]["checkpoint"].endswith(os.fsdecode(b"ck\xff/last.pt"))
    assert "ck\\udcff" in out.with_suffix(".md").read_text()  # the table names the path, escaped
