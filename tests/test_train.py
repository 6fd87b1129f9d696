import dataclasses
import json
import math

import numpy as np
import torch
from conftest import SMALL, TINY, hopper_file, run

from datasets.loaders import load_dataset
from dt_primal.config import Config
from dt_primal.training.loop import train


def test_end_to_end_train_then_evaluate(tmp_path):
    out = tmp_path / "run"
    res = run(
        "train.py",
        "--dataset",
        str(hopper_file(tmp_path)),
        "--model",
        "primal",
        "--steps",
        "30",
        "--warmup-steps",
        "5",
        "--eval-every",
        "15",
        "--eval-episodes-during",
        "1",
        "--eval-episodes",
        "3",
        "--out",
        str(out),
        *TINY,
    )
    assert res.returncode == 0, res.stderr
    result = json.loads((out / "eval.json").read_text())
    assert result["step"] == 30 and result["task"] == "Hopper-v5"
    made = result["provenance"]  # the record says how it was made
    assert (
        len(made["commit"].removesuffix("-dirty")) == 40
        and made["device"]
        and made["versions"]["torch"] == torch.__version__
    )
    assert [r["target"] for r in result["targets"]] == [3600.0, 1800.0]
    for r in result["targets"]:
        assert r["episodes"] == 3 and math.isfinite(r["normalized_mean"]) and r["return_mean"] > 0
    assert (out / "last.pt").exists() and list(out.glob("events.out.tfevents*"))
    assert [json.loads(line)["step"] for line in (out / "evals.jsonl").read_text().splitlines()] == [15]
    assert "normalised score" in res.stdout

    res = run(
        "evaluate.py", str(out / "last.pt"), str(out / "last.pt"), "--episodes", "2", "--out", str(tmp_path / "ev.json")
    )
    assert res.returncode == 0, res.stderr
    report = json.loads((tmp_path / "ev.json").read_text())
    for r in report["across_checkpoints"]:
        assert {"target", "return_mean", "return_std", "normalized_mean", "normalized_std", "episodes"} <= set(r)
        assert r["episodes"] == 4 and r["normalized_std"] == 0.0  # the same checkpoint twice, same seed
    assert (tmp_path / "ev.md").read_text().startswith("| checkpoint")


def test_resume_gives_the_same_weights_as_an_uninterrupted_run(tmp_path):
    data = load_dataset(str(hopper_file(tmp_path)), env="hopper")
    cfg = Config(**SMALL, steps=24, checkpoint_every=1000, seed=7)
    train(dataclasses.replace(cfg, out=str(tmp_path / "straight")), data)
    train(dataclasses.replace(cfg, out=str(tmp_path / "split"), steps=10), data)  # "interrupted" at step 10
    train(dataclasses.replace(cfg, out=str(tmp_path / "split")), data, resume=True)
    a = torch.load(tmp_path / "straight" / "last.pt", weights_only=True)
    b = torch.load(tmp_path / "split" / "last.pt", weights_only=True)
    assert a["step"] == b["step"] == 24
    for k in a["model"]:
        torch.testing.assert_close(a["model"][k], b["model"][k], rtol=0, atol=0, msg=k)
    np.testing.assert_array_equal(a["state_mean"], b["state_mean"])


def test_compiled_training_gives_the_weights_of_eager_training(tmp_path, capsys):
    """--compile changes how the step runs, not what it computes (dropout 0: no random masks)."""
    data = load_dataset(str(hopper_file(tmp_path)), env="hopper")
    cfg = Config(**{**SMALL, "warmup_steps": 2}, steps=6, dropout=0.0, checkpoint_every=1000, seed=3)
    from torch._dynamo.utils import counters

    train(dataclasses.replace(cfg, out=str(tmp_path / "eager")), data)
    assert "--compile" not in capsys.readouterr().out
    counters.clear()
    train(dataclasses.replace(cfg, out=str(tmp_path / "compiled"), compile=True), data)
    assert counters["stats"]["unique_graphs"] >= 1  # the step really ran through torch.compile
    assert "--compile: the first steps compile" in capsys.readouterr().out  # the silent first minute is explained
    a = torch.load(tmp_path / "eager" / "last.pt", weights_only=True)
    b = torch.load(tmp_path / "compiled" / "last.pt", weights_only=True)
    assert b["config"]["compile"] and not a["config"]["compile"]
    for k in a["model"]:
        torch.testing.assert_close(a["model"][k], b["model"][k], rtol=1e-4, atol=1e-5, msg=k)
