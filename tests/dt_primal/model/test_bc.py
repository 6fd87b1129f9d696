"""BC and %BC: the DT paper's MLP from the last K states, trained on all the data or on its best episodes
(``--top-percent``), through the same training, checkpoints, evaluation and policy as the transformers."""

import json

import numpy as np
import pytest
import torch
from conftest import TWO_STEPS, assert_user_error, hopper_file, run, small_config

from datasets.loaders import load_dataset
from dt_primal import load_policy
from dt_primal.data import Trajectories
from dt_primal.model.architecture import ModelConfig
from dt_primal.model.bc import MLPPolicy, bc_loss, newest_last
from dt_primal.model.members import MemberLinear

pytestmark = pytest.mark.usefixtures("one_thread")

ARCH = dict(state_dim=3, act_dim=2, model="bc", n_layer=3, d_model=16, n_head=1, context=4, dropout=0.0)
ARCH |= dict(activation="relu", max_ep_len=50, s=8, eta=0.0, embed_init="torch", timestep_init="torch")


def test_the_mlp_has_the_dt_papers_layers_and_pads_a_short_history_with_zeros():
    model = MLPPolicy(ModelConfig(**ARCH), members=2)
    linears = [m for m in model.mlp if isinstance(m, MemberLinear)]
    assert [tuple(m.weight.shape[1:]) for m in linears] == [(16, 12), (16, 16), (16, 16), (2, 16)]
    history = torch.randn(2, 5, 2, 3)  # two steps of an episode so far
    padded = torch.cat([torch.zeros(2, 5, 2, 3), history], 2)
    short, full = model(history)[0], model(padded)[0]
    assert short.shape == (2, 5, 1, 2) and torch.equal(short, full) and short.abs().max() < 1


def test_a_window_is_learnt_at_its_newest_step_from_the_states_up_to_it():
    states = torch.arange(1, 1 + 2 * 4 * 3, dtype=torch.float32).view(1, 2, 4, 3)
    actions = torch.arange(1, 1 + 2 * 4 * 2, dtype=torch.float32).view(1, 2, 4, 2)
    valid = torch.tensor([[[True, True, False, False], [True] * 4]])
    batch = {"states": states * valid[..., None], "actions": actions * valid[..., None], "valid": valid}
    aligned, target = newest_last(batch)
    assert torch.equal(aligned[0, 0], torch.cat([torch.zeros(2, 3), states[0, 0, :2]]))  # right-padded -> newest last
    assert torch.equal(aligned[0, 1], states[0, 1])
    assert torch.equal(target[0], torch.stack([actions[0, 0, 1], actions[0, 1, 3]]))
    model = MLPPolicy(ModelConfig(**ARCH))
    loss, action, j2 = bc_loss(model, batch, eta=1.0)
    want = ((model(aligned)[0][:, :, 0] - target) ** 2).mean()
    torch.testing.assert_close(loss, want.view(1)) and torch.testing.assert_close(action, loss)
    assert not j2.any()


def episodes_with_returns(returns, lengths):
    obs = [np.zeros((n, 2), np.float32) for n in lengths]
    rewards = [np.full(n, r / n, np.float32) for r, n in zip(returns, lengths)]
    eps = [dict(observations=o, actions=np.zeros((len(o), 1), np.float32), rewards=r) for o, r in zip(obs, rewards)]
    return Trajectories.from_episodes(eps)


def test_top_percent_keeps_the_best_episodes_until_they_would_hold_more_than_their_share():
    data = episodes_with_returns(returns=[5, 50, 20, 40, 10], lengths=[10, 30, 20, 25, 15])  # 100 steps
    assert data.best_episodes(100) is data
    kept = data.best_episodes(55)  # 50 (30 steps), then 40 (25 more: 55); 20 would make 75
    assert list(kept.lengths) == [30, 25] and np.isclose(sorted(kept.episode_returns()), [40, 50]).all()
    assert len(kept.observations) == len(kept.rewards) == 55
    assert list(data.best_episodes(54).lengths) == [30]
    assert list(data.best_episodes(1).lengths) == [30]  # the best one always, however long


def test_bc_and_top_percent_train_evaluate_export_and_resume(tmp_path):
    data = hopper_file(tmp_path)  # four episodes of 40, 25, 60 and 33 steps
    out = tmp_path / "bc"
    res = run("train.py", "--dataset", data, *TWO_STEPS, "--model", "bc", "--top-percent", "60", "--out", out)
    assert res.returncode == 0, res.stderr
    assert "no target (bc ignores the target return" in res.stdout and "target none" in res.stdout
    record = json.loads((out / "eval.json").read_text())
    kept = load_dataset(str(data)).best_episodes(60)
    trained_on = dict(top_percent=60.0, episodes=len(kept.lengths), steps=len(kept.rewards))
    assert record["trained_on"] == trained_on | dict(of_episodes=4, of_steps=158)
    assert len(kept.rewards) <= 0.6 * 158 < len(kept.rewards) + 60
    assert record["model"] == "bc" and [r["target"] for r in record["targets"]] == [None]
    assert record["config"]["d_model"] == 32 and record["config"]["lr"] == 1e-4  # TINY's width; BC's own lr

    res = run("evaluate.py", out / "last.pt", "--episodes", "2", "--out", tmp_path / "ev.json")
    assert res.returncode == 0, res.stderr
    assert [r["target"] for r in json.loads((tmp_path / "ev.json").read_text())["across_checkpoints"]] == [None]
    policy = load_policy(out / "last.pt")
    policy.reset(1.0)
    first = policy.act(np.zeros(11))
    policy.reset(1e6)
    assert np.array_equal(policy.act(np.zeros(11)), first)  # the target return changes nothing

    res = run("train.py", "--out", out, "--resume", "--steps", "4", "--top-percent", "50")
    assert_user_error(res, "--top-percent 50.0 (the run has 60.0)")
    res = run("train.py", "--out", out, "--resume", "--steps", "4")
    assert res.returncode == 0, res.stderr
    assert json.loads((out / "eval.json").read_text())["step"] == 4


@pytest.mark.parametrize("percent", ["0", "-5", "101", "nan"])
def test_a_top_percent_outside_0_to_100_is_refused(tmp_path, percent):
    res = run("train.py", "--dataset", hopper_file(tmp_path), *TWO_STEPS, "--top-percent", percent, "--out", tmp_path)
    assert_user_error(res, "--top-percent must be above 0 and at most 100")


def test_a_top_percent_that_keeps_no_full_context_is_refused(tmp_path):
    res = run("train.py", "--dataset", hopper_file(tmp_path), *TWO_STEPS, "--top-percent", "20", "--context", "50")
    assert_user_error(res, "--top-percent 20 keeps the best 1 of 4 episodes", "none of them holds a full context")


def test_bc_takes_the_dt_papers_defaults_unless_given():
    assert (small_config(model="bc", d_model=256).d_model, small_config(model="bc").lr) == (256, 1e-4)
    from dt_primal.config import make_config

    assert (make_config(model="bc").d_model, make_config(model="bc", lr=3e-4).lr) == (128, 3e-4)
