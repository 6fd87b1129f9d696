import dataclasses
import json
import math
import threading
import time
import types

import numpy as np
import pytest
import torch
from conftest import SMALL, TINY, hopper_file, needs_cuda, run

from datasets.loaders import load_dataset
from dt_primal.config import Config
from dt_primal.errors import UserError
from dt_primal.training import loop
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
    assert "normalised score" in res.stdout and "evaluating 6 episodes" in res.stderr  # the final one's progress

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


def _curve(folder):
    return [json.loads(line) for line in (folder / "evals.jsonl").read_text().splitlines()]


def _scores(curve) -> np.ndarray:
    """Each evaluation's reports as numbers, their keys in one order."""
    return np.array([[[r[k] for k in sorted(r)] for r in p["reports"]] for p in curve], dtype=float)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
def test_evaluations_beside_training_score_as_in_line_ones(tmp_path, monkeypatch, device):
    """--eval-overlap on: each intermediate evaluation runs in a thread on a copy of that step's weights while
    training goes on (slowed here so that training is steps ahead by the time it acts; its environments in two
    worker processes, which the evaluation's thread forks while training runs): the same scores, weights
    and final evaluation as evaluations in line (on CUDA to rounding: the copy acts eagerly, in line the forward
    pass is a replayed CUDA graph, and their last bits differ). On CUDA the step is a captured graph by step 4, and
    the evaluation acts on its own stream."""
    slow = loop.rollout
    threads = []

    def rollout(*args, **kwargs):
        threads.append(threading.current_thread() is threading.main_thread())
        time.sleep(0.5 if len(threads) < 3 else 0)
        return slow(*args, **kwargs, env_workers=2)  # worker processes forked beside training, as on a GPU

    monkeypatch.setattr(loop, "rollout", rollout)
    data = load_dataset(str(hopper_file(tmp_path)), env="hopper")
    cfg = Config(**{**SMALL, "eval_every": 4, "eval_episodes": 2, "device": device}, steps=12, eval_episodes_during=2)
    runs = {}
    for overlap in (False, True):
        threads.clear()
        runs[overlap] = train(
            dataclasses.replace(cfg, out=str(tmp_path / str(overlap)), eval_overlap=overlap), data, seeds=[1, 2]
        )
        assert threads == ([False, False, True] if overlap else [True, True, True])  # the final one in line
    for seed in (1, 2):
        folders = [tmp_path / str(overlap) / f"seed_{seed}" for overlap in (False, True)]
        off, on = map(_curve, folders)
        assert [p["step"] for p in on] == [4, 8] and [p["overlapped"] for p in on] == [True, True]
        assert not any(p["overlapped"] for p in off)
        np.testing.assert_allclose(_scores(on), _scores(off), rtol=0 if device == "cpu" else 1e-6, atol=0)
        assert all(p["seconds"] >= 0.5 for p in on + off)
        a, b = (torch.load(f / "last.pt", weights_only=True) for f in folders)
        for k in a["model"]:
            torch.testing.assert_close(a["model"][k], b["model"][k], rtol=0, atol=0, msg=k)
        assert (a["config"]["eval_overlap"], b["config"]["eval_overlap"]) == (False, True)
    assert [r["targets"] for r in runs[True]] == [r["targets"] for r in runs[False]]


@pytest.mark.parametrize("kernel", ["sdpa", "math"])
def test_the_copy_evaluated_beside_training_runs_the_training_steps_attention_kernel(kernel):
    from dt_primal.model.attention import SoftmaxAttention, use_attention_kernel
    from dt_primal.model.transformer import DecisionTransformer
    from dt_primal.training.overlapped_eval import OverlappedEvaluation

    model = use_attention_kernel(DecisionTransformer(Config(**SMALL).model_config(11, 3), members=2), kernel)
    beside = OverlappedEvaluation(model, lambda copy, **options: None, torch.device("cpu"), kernel)
    kernels = [m.sdpa for m in beside.copy.modules() if isinstance(m, SoftmaxAttention)]
    assert kernels and kernels == [m.sdpa for m in model.modules() if isinstance(m, SoftmaxAttention)]
    assert set(kernels) == {kernel == "sdpa"}


def test_the_copy_evaluated_beside_training_acts_without_a_cuda_graph():
    from dt_primal.model.transformer import DecisionTransformer
    from dt_primal.training.overlapped_eval import OverlappedEvaluation

    model = DecisionTransformer(Config(**SMALL).model_config(11, 3), members=2)
    beside = OverlappedEvaluation(model, lambda copy, **options: options, torch.device("cpu"), "math")
    assert beside.policy == {"capture": False}


def test_while_an_evaluation_runs_beside_it_training_queues_at_most_run_ahead_updates(monkeypatch):
    """``pace`` after each update: an event per update, and a wait on the oldest beyond ``run_ahead``; nothing
    once the evaluation has ended, nor without a limit (a stand-in for CUDA's events and the thread)."""
    from dt_primal.model.transformer import DecisionTransformer
    from dt_primal.training.overlapped_eval import RUN_AHEAD, OverlappedEvaluation

    waited = []

    class Event:
        def record(self):
            self.n = len(recorded)
            recorded.append(self)

        def synchronize(self):
            waited.append(self.n)

    recorded, alive = [], [True]  # the events recorded; whether the evaluation's thread runs
    monkeypatch.setattr(torch.cuda, "Event", Event)
    model = DecisionTransformer(Config(**SMALL).model_config(11, 3))
    beside = OverlappedEvaluation(model, lambda copy, **options: None, torch.device("cpu"), "math")
    beside.stream, beside.thread = object(), types.SimpleNamespace(is_alive=lambda: alive[0], join=lambda: None)
    for _ in range(5):
        beside.pace()
    assert RUN_AHEAD == 2 and waited == [0, 1, 2] and len(beside.queued) == 2  # updates 3 and 4 still queued
    alive[0] = False
    beside.pace()
    beside.step, beside.outcome, beside.stream = 4, ([], 1.0), None  # collect's wait on the stream: CUDA's
    assert len(recorded) == 5 and beside.collect() == (4, [], 1.0) and not beside.queued
    beside.stream, beside.thread, beside.run_ahead = object(), types.SimpleNamespace(is_alive=lambda: True), None
    beside.pace()
    assert len(recorded) == 5


@needs_cuda
def test_training_replays_its_cuda_graph_while_an_evaluation_beside_it_acts(tmp_path):
    """Training's captured step (whose dropout advances the default CUDA generator) replays while the evaluation
    beside it acts at several widths: neither fails. A forward pass captured in the evaluation's thread would
    make the replay raise "Offset increment outside graph capture"."""
    from dt_primal.evaluation.policy import Policy
    from dt_primal.training.overlapped_eval import OverlappedEvaluation
    from dt_primal.training.step import WARMUP_CALLS
    from dt_primal.training.throughput import fresh_step

    data = load_dataset(str(hopper_file(tmp_path)), env="hopper")
    cfg = Config(**SMALL)  # dropout 0.1
    step = fresh_step(cfg, data, seeds=[1, 2], device="cuda")
    for _ in range(WARMUP_CALLS + 1):
        step()
    assert step.graph is not None
    mean, std = data.state_stats()

    def act_with(copy, **options):
        return Policy(copy, mean, std, cfg.reward_scale, cfg.context, "bf16", **options)

    def evaluate(policy):
        with torch.autocast("cuda", torch.bfloat16, cache_enabled=False):
            for width in (48, 32, 24, 16, 12, 8) * 3:
                x = [torch.zeros(2, width, cfg.context, d, device="cuda") for d in (data.obs_dim, data.act_dim, 1)]
                policy.forward(*x, torch.zeros(2, width, cfg.context, dtype=torch.long, device="cuda"))
        return [], 0.0

    beside = OverlappedEvaluation(step.model, act_with, torch.device("cuda"), cfg.attention_kernel)
    beside.start(step.model, 4, evaluate)
    replays = 0
    while beside.thread.is_alive() or replays < 10:
        step()
        beside.pace()  # as the loop does
        replays += 1
    assert beside.collect() == (4, [], 0.0)
    torch.cuda.synchronize()


@needs_cuda
def test_paced_training_has_at_most_run_ahead_updates_queued_on_a_cuda_device(tmp_path):
    """While an evaluation runs beside it, the update ``RUN_AHEAD`` before the one just queued has ended."""
    from dt_primal.training.overlapped_eval import RUN_AHEAD, OverlappedEvaluation
    from dt_primal.training.step import WARMUP_CALLS
    from dt_primal.training.throughput import fresh_step

    data = load_dataset(str(hopper_file(tmp_path)), env="hopper")
    cfg = Config(**SMALL)
    step = fresh_step(cfg, data, seeds=[1, 2], device="cuda")
    for _ in range(WARMUP_CALLS + 1):
        step()
    beside = OverlappedEvaluation(step.model, lambda copy, **options: None, torch.device("cuda"), "math")
    beside.thread = types.SimpleNamespace(is_alive=lambda: True)  # an evaluation running
    ended = []
    for _ in range(20):
        step()
        ended.append(torch.cuda.Event())  # recorded before pace's own: done once pace has waited for that
        ended[-1].record()
        beside.pace()
        assert len(ended) <= RUN_AHEAD or ended[-RUN_AHEAD - 1].query()
    torch.cuda.synchronize()


def test_an_evaluation_beside_training_that_fails_runs_again_in_line(tmp_path, monkeypatch):
    """A RuntimeError in the evaluation's thread (as a CUDA error would be) is a warning: that evaluation runs again
    in the loop's thread on its copy of the weights, the later ones in line too, with the in-line run's scores."""
    works = loop.rollout
    threads = []

    def rollout(*args, **kwargs):
        threads.append(threading.current_thread() is threading.main_thread())
        if not threads[-1]:
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
        return works(*args, **kwargs)

    monkeypatch.setattr(loop, "rollout", rollout)
    data = load_dataset(str(hopper_file(tmp_path)), env="hopper")
    cfg = Config(**{**SMALL, "eval_every": 4}, steps=12, eval_episodes_during=2, seed=3)
    train(dataclasses.replace(cfg, out=str(tmp_path / "in-line"), eval_overlap=False), data)
    threads.clear()
    with pytest.warns(RuntimeWarning, match="an evaluation beside training failed .*it runs again in line"):
        train(dataclasses.replace(cfg, out=str(tmp_path / "beside")), data)
    assert threads == [False, True, True, True]  # step 4 beside (failed), step 4 again, step 8, the final one
    beside, in_line = _curve(tmp_path / "beside"), _curve(tmp_path / "in-line")
    assert [(p["step"], p["overlapped"]) for p in beside] == [(4, False), (8, False)]
    assert [p["reports"] for p in beside] == [p["reports"] for p in in_line]


def test_resume_from_an_evaluation_step_runs_the_evaluation_its_curve_lacks(tmp_path):
    """A run killed while an evaluation ran beside training has the checkpoint of that step without its point in
    evals.jsonl (as has a run of 8 steps, its last step not evaluated during training); continued, it evaluates
    that step first, so its curve and weights are an uninterrupted run's."""
    data = load_dataset(str(hopper_file(tmp_path)), env="hopper")
    cfg = Config(**{**SMALL, "eval_every": 4}, steps=12, checkpoint_every=4, eval_episodes_during=2, seed=2)
    train(dataclasses.replace(cfg, out=str(tmp_path / "straight")), data)
    split = tmp_path / "split"
    train(dataclasses.replace(cfg, out=str(split), steps=8), data)
    assert [p["step"] for p in _curve(split)] == [4]
    train(dataclasses.replace(cfg, out=str(split)), data, resume=True)
    straight = _curve(tmp_path / "straight")
    assert [p["step"] for p in straight] == [4, 8]
    assert [p["reports"] for p in _curve(split)] == [p["reports"] for p in straight]
    a, b = (torch.load(p / "last.pt", weights_only=True) for p in (tmp_path / "straight", split))
    for k in a["model"]:
        torch.testing.assert_close(a["model"][k], b["model"][k], rtol=0, atol=0, msg=k)


class Killed(BaseException):
    """A kill at a chosen moment: nothing after it runs, as after SIGKILL."""


def test_an_evaluation_beside_training_that_a_kill_cut_off_runs_when_the_run_continues(tmp_path, monkeypatch):
    """Killed after a checkpoint written while step 4's evaluation still ran beside training (step 6), a run
    keeps step 4's weights in that checkpoint; continued, it evaluates them first, so its curve and weights are
    an uninterrupted run's. A record of an evaluation after the checkpoint's step is refused as damage."""
    data = load_dataset(str(hopper_file(tmp_path)), env="hopper")
    cfg = Config(**{**SMALL, "eval_every": 4}, steps=12, checkpoint_every=3, eval_episodes_during=2, seed=2)
    train(dataclasses.replace(cfg, out=str(tmp_path / "straight"), eval_overlap=False), data)
    slow, release = loop.rollout, threading.Event()

    def rollout(*args, **kwargs):  # the evaluation beside training lasts until the kill
        if threading.current_thread() is not threading.main_thread():
            release.wait(60)
        return slow(*args, **kwargs)

    def checkpoint(run):
        save(run)
        if run.step == 6:
            raise Killed

    monkeypatch.setattr(loop, "rollout", rollout)
    save = loop.TrainingRun.checkpoint
    monkeypatch.setattr(loop.TrainingRun, "checkpoint", checkpoint)
    split = tmp_path / "split"
    with pytest.raises(Killed):
        train(dataclasses.replace(cfg, out=str(split)), data)
    release.set()
    monkeypatch.undo()
    assert _curve(split) == [] and torch.load(split / "last.pt", weights_only=True)["pending_evaluation"]["step"] == 4
    train(dataclasses.replace(cfg, out=str(split)), data, resume=True)
    straight = _curve(tmp_path / "straight")
    assert [p["step"] for p in _curve(split)] == [p["step"] for p in straight] == [4, 8]
    assert [p["reports"] for p in _curve(split)] == [p["reports"] for p in straight]
    a, b = (torch.load(p / "last.pt", weights_only=True) for p in (tmp_path / "straight", split))
    for k in a["model"]:
        torch.testing.assert_close(a["model"][k], b["model"][k], rtol=0, atol=0, msg=k)

    ckpt = torch.load(split / "last.pt", weights_only=True)  # at step 12: an evaluation of step 13 is damage
    ckpt["pending_evaluation"] = {"step": 13, "model": {k: w.clone() for k, w in ckpt["model"].items()}}
    torch.save(ckpt, split / "last.pt")
    with pytest.raises(UserError, match="is damaged .*unrecorded evaluation is not one of a step it trained"):
        train(dataclasses.replace(cfg, out=str(split), steps=16), data, resume=True)


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
