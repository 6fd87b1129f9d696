"""The benchmarks that rank and profile the training step and fit an evaluation's cost: the variants' check can
fail, the profile names every kernel above 1 % with its phase and counts what runs outside compiled regions, and
an evaluation's start-up and its forward pass's first steps are timed apart from its steps."""

import dataclasses
import types

import pytest
import torch
from conftest import SMALL, hopper_file

from bench import step_kernels, step_variants
from datasets.loaders import load_dataset
from dt_primal.config import Config
from dt_primal.model import attention
from dt_primal.training.step import step_mode
from dt_primal.training.throughput import engine_hash

TINY_CONFIG = Config(**SMALL, steps=12, checkpoint_every=1000)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return load_dataset(str(hopper_file(tmp_path_factory.mktemp("tools"))))


def test_a_variant_passes_only_when_it_computes_the_step_of_the_defaults(data, monkeypatch):
    math = dataclasses.replace(TINY_CONFIG, attention_kernel="math", model="dt")
    good = step_variants.check(math, data)
    assert good["passed"] and good["loss_error"] < 1e-5, good
    probs = attention.attention_probs
    monkeypatch.setattr(attention, "attention_probs", lambda q, k, mask: probs(q, k, torch.ones_like(mask)))
    bad = step_variants.check(math, data)  # the written-out attention sees later tokens: another function
    assert not bad["passed"] and bad["update_error"] > 0.1, bad


def test_the_profile_names_the_phase_of_every_kernel_and_what_runs_outside_compiled_regions(data):
    r = step_kernels.profile_step(
        dataclasses.replace(TINY_CONFIG, model="primal"), data, members=2, warmup=1, updates=2, peak_tflops=2.0
    )
    assert {"sample", "gather + forward + loss", "backward", "AdamW"} <= set(r["phases"])
    assert r["kernels"] and all(k["share"] >= 0.01 and k["phase"] in r["phases"] for k in r["kernels"])
    assert sum(k["share"] for k in r["kernels"]) <= 1 + 1e-9
    eager = r["outside_compiled"]["total"]
    assert eager > 100 and r["outside_compiled"]["counts"]["aten::randint"] == 2  # eager: everything is outside
    assert r["mode"] == "eager" and r["engine"] == engine_hash()
    # the tiny model's matrix products: at least 2·d_model² multiply-adds per token and linear layer
    assert 2 * 32**2 * 8 * 20 / 1e9 < r["gflop_per_member_update"] < 1.0
    assert r["share_of_peak"] == pytest.approx(r["tflops_while_busy"] / 2.0) and r["tflops_while_busy"] > 0


def test_step_mode_names_the_options_that_differ_from_the_defaults():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert step_mode(TINY_CONFIG, cpu) == "eager" and step_mode(TINY_CONFIG, cuda) == "captured"
    fast = dataclasses.replace(TINY_CONFIG, compile=True, optimizer="compiled", compile_mode="max-autotune")
    assert step_mode(fast, cuda) == "compiled+captured, optimizer compiled, max-autotune"
    assert step_mode(dataclasses.replace(TINY_CONFIG, attention_kernel="math"), cpu) == "eager, attention math"


def test_no_variant_is_fastest_when_none_passed():
    assert step_variants.fastest({"records": [{"passed": False, "member_updates_per_s": 9.0}]}) is None


def test_the_evaluation_fit_takes_the_start_up_apart_from_the_steps():
    """bench/eval_overhead.py: a rollout's start-up, timed apart, counts once, not spread over its steps."""
    from bench.eval_overhead import fit

    rollout = lambda n, steps: dict(episodes=n, steps=steps, total_s=3.0 + steps * (0.01 + n * 2e-5), start_s=3.0)
    records = [rollout(600, 100), rollout(1800, 100)]
    assert fit(records) == pytest.approx({"step_s": 0.01, "env_step_s": 2e-5, "start_s": 3.0})
    spread = fit([{k: v for k, v in r.items() if k != "start_s"} for r in records])
    assert spread["start_s"] == 0 and spread["step_s"] == pytest.approx(0.04)  # 3 s over 100 steps, in each
    warm = [r | {"total_s": r["total_s"] + 1.5, "first_forward_s": 1.5} for r in records]  # the forward's first steps
    assert fit(warm) == pytest.approx({"step_s": 0.01, "env_step_s": 2e-5, "start_s": 4.5})


def test_evaluations_beside_training_are_fitted_on_the_eager_forward_pass_in_turn():
    """On CUDA the final evaluation replays its forward pass pipelined, those beside training act eagerly in turn."""
    from bench.eval_overhead import fits
    from dt_primal.evaluation.rollout import default_env_workers

    rollout = lambda n, step_s, forward, pipeline: (
        dict(episodes=n, workers=default_env_workers("cuda", n), steps=100, total_s=100 * (step_s + n * 2e-5))
        | dict(forward=forward, pipeline=pipeline)
    )
    records = [rollout(n, 0.01, "captured", p) for n in (1200, 1800) for p in (True, False)]
    records += [rollout(n, 0.004, "eager", False) for n in (1200, 1800)]
    fitted = fits(records, "cuda")
    assert fitted["evaluation"]["step_s"] == pytest.approx(0.01) and fitted["evaluation"]["pipelined"]
    assert fitted["evaluation_in_turn"]["step_s"] == pytest.approx(0.004)
    assert fits(records[:4], "cuda")["evaluation_in_turn"]["step_s"] == pytest.approx(0.01)  # no eager: captured's
    on_a_cpu = [r | {"workers": 1} for r in records[4:]]  # in its own process, in turn: as evaluations run there
    assert "evaluation_in_turn" not in fits(on_a_cpu, "cpu")


def test_the_evaluation_profile_times_the_forward_passs_first_steps_apart(monkeypatch):
    """What the forward pass's calls cost up to its first with a full context (a capture, kernels' first use),
    beyond later calls, is its own column, not part of the per-step time."""
    from bench import eval_overhead
    from envs import TASKS

    clock = [0.0]  # the benchmark's clock, which only the forward pass advances: no wall time is asserted

    class Timed(eval_overhead.DecisionTransformer):  # 50 ms at the first call with a full context, else 1 ms
        slept = False

        def forward(self, states, actions, returns_to_go, timesteps, valid=None, last_only=False):
            full = states.shape[2] == self.config.context
            clock[0] += 0.05 if full and not self.slept else 0.001
            self.slept = self.slept or full
            return torch.zeros(*states.shape[:2], 1, actions.shape[-1]), []

    monkeypatch.setattr(eval_overhead, "DecisionTransformer", Timed)
    monkeypatch.setattr(eval_overhead, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    task = eval_overhead.common.task_with(TASKS["hopper"], terminate_when_unhealthy=False, max_episode_steps=40)
    r = eval_overhead.in_rollout(task, 6, 1, 40, "cpu", 3)
    assert r["first_forward"] == pytest.approx(0.049)
    assert r["forward"] == pytest.approx(0.05 + 39 * 0.001)
