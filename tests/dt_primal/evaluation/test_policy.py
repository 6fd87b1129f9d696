"""``dt_primal.load_policy``: a trained model that acts with torch and NumPy only, exactly as evaluation does."""

import numpy as np
import pytest
import torch
from conftest import FORMAT1, needs_cuda, run

from dt_primal import load_policy
from dt_primal.evaluation.policy import Policy, policy_from_checkpoints
from dt_primal.evaluation.rollout import rollout
from dt_primal.files.checkpoint import load_checkpoint
from envs import TASKS

pytestmark = pytest.mark.usefixtures("one_thread")  # in-process runs: one thread, as the subprocesses

# a process in which gymnasium, mujoco and minari cannot be imported, acting with the policy of argv[1] on the
# observations and rewards of argv[2]; it writes the actions to argv[3]
ACT_WITHOUT_SIMULATORS = """
import sys
class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("gymnasium", "mujoco", "minari"):
            raise ImportError(f"{name} is not installed here")
sys.meta_path.insert(0, Absent())
import numpy as np
import dt_primal
policy = dt_primal.load_policy(sys.argv[1])
steps = np.load(sys.argv[2])
policy.reset(float(steps["target"]))
actions = [policy.act(steps["obs"][0])] + [policy.act(o, reward=r) for o, r in zip(steps["obs"][1:], steps["rewards"])]
assert not {"gymnasium", "mujoco", "minari", "envs"} & set(sys.modules)
np.save(sys.argv[3], np.stack(actions))
"""


def evaluation_steps(path, target, episodes=1):
    """The observations, rewards and actions of evaluate.py's path (load_checkpoint, policy_from_checkpoints,
    rollout) for one Hopper episode conditioned on ``target``."""
    policy = policy_from_checkpoints([load_checkpoint(path)])
    seen = []
    act = policy.act
    policy.act = lambda obs, reward, live: (
        seen.append((obs.copy(), np.array(reward), act(obs, reward, live))) or seen[-1][2]
    )
    rollout(policy, TASKS["hopper"], [target], episodes, seeds=[100_000])
    return seen


@pytest.mark.parametrize("which", ["new", "format 1"])
def test_load_policy_acts_without_gymnasium_mujoco_or_minari_as_evaluation_does(run_dir, tmp_path, which):  # noqa: F811
    path = run_dir / "last.pt" if which == "new" else FORMAT1 / "last.pt"
    seen = evaluation_steps(path, 3600.0)
    obs = np.stack([o.reshape(-1) for o, _, _ in seen])
    rewards = np.array([r.reshape(-1)[0] for _, r, _ in seen[1:]])
    np.savez(tmp_path / "steps.npz", obs=obs, rewards=rewards, target=3600.0)
    res = run("-c", ACT_WITHOUT_SIMULATORS, str(path), str(tmp_path / "steps.npz"), str(tmp_path / "actions.npy"))
    assert res.returncode == 0, res.stderr
    actions = np.load(tmp_path / "actions.npy")
    assert len(actions) > 10 and actions.dtype == np.float32 and np.abs(actions).max() <= 1
    np.testing.assert_array_equal(actions, np.stack([a.reshape(-1) for _, _, a in seen]))


def test_one_policy_acts_for_one_environment_or_a_batch(run_dir):  # noqa: F811
    policy = load_policy(run_dir / "last.pt")
    assert policy.context == 20 and policy.config.max_ep_len == 50 and policy.state_mean.shape == (11,)
    assert policy.run_config["reward_scale"] == 1000.0
    rng = np.random.default_rng(0)
    obs, rewards, targets = rng.normal(size=(6, 3, 11)), rng.normal(size=(6, 3)), np.array([3600.0, 1800.0, 900.0])
    policy.reset(targets)
    batched = np.stack([policy.act(obs[t], rewards[t]) for t in range(6)])
    assert batched.shape == (6, 3, 3)
    for i in range(3):
        policy.reset(targets[i])
        one = np.stack([policy.act(obs[t, i], reward=rewards[t, i]) for t in range(6)])
        assert one.shape == (6, 3)
        np.testing.assert_allclose(one, batched[:, i], atol=1e-6)
    policy.reset(3600.0)
    first = policy.act(obs[0, 0], reward=123.0)  # no reward before the first action: ignored
    policy.reset(3600.0)
    np.testing.assert_array_equal(first, policy.act(obs[0, 0]))


def test_a_policy_acts_beyond_its_context_and_its_episode_length():
    torch.manual_seed(0)
    from dt_primal.config import Config
    from dt_primal.model.transformer import DecisionTransformer

    model = DecisionTransformer(Config(d_model=16, n_head=2, n_layer=1, context=3, max_ep_len=4).model_config(2, 1))
    policy = Policy(model.train(False), np.zeros(2), np.ones(2), 1.0, 3)
    policy.reset(1.0)
    actions = [policy.act(np.full(2, t / 10), reward=0.1) for t in range(8)]
    assert all(a.shape == (1,) and np.isfinite(a).all() for a in actions)
    assert policy.history[0].shape == (1, 1, 3, 2)  # the last K steps only


def acting_pair(device="cpu", model_name="primal", precision="fp32", **capture):
    """A 3-member policy acting eagerly, and the same acting through ``CapturedForward`` (``capture``: its
    arguments, e.g. a stand-in for the CUDA graph on a CPU)."""
    from dt_primal.config import Config
    from dt_primal.evaluation.policy import CapturedForward
    from dt_primal.model.transformer import DecisionTransformer

    torch.manual_seed(0)
    cfg = Config(model=model_name, d_model=16, n_head=2, n_layer=2, context=4, max_ep_len=50, s=4)
    model = DecisionTransformer(cfg.model_config(5, 2), members=3).to(device).train(False)
    eager = Policy(model, np.zeros(5), np.ones(5), 10.0, 4, precision, capture=False)
    captured = Policy(model, np.zeros(5), np.ones(5), 10.0, 4, precision, capture=False)
    captured.forward = CapturedForward(model, 4, **capture)
    return eager, captured


def act_side_by_side(eager, captured, steps=30, n=20):
    """Both policies over ``steps`` steps of n episodes per member that end one after another (the live width
    shrinks through several buckets); their actions at every step, side by side."""
    rng = np.random.default_rng(0)
    live = np.ones((3, n), bool)
    for p in (eager, captured):
        p.reset(np.full((3, n), 5.0))
    pairs = []
    for t in range(steps):
        obs, reward = rng.normal(size=(3, n, 5)), rng.normal(size=(3, n))
        pairs.append(tuple(p.act(obs, reward, live=live) for p in (eager, captured)))
        live[:, : max(0, t - 4)] = False  # from the 6th step on, one more episode of every member ends each step
    return pairs


def stand_in_graph(captures: list):
    """``cuda_graph``'s stand-in on a CPU: the replay recomputes into the captured output."""

    def graph_of(fn):
        out = fn()
        captures.append(out.shape[1])
        return (lambda: out.copy_(fn())), out

    return graph_of


def test_the_captured_forward_acts_as_the_eager_one_as_episodes_end():
    """Eager while the context fills, then replayed at width buckets (8, 12, 16, 24 ...) that follow the live
    width down, every action the eager pass's."""
    captures = []
    eager, captured = acting_pair(graph_of=stand_in_graph(captures))
    for a, b in act_side_by_side(eager, captured):
        np.testing.assert_allclose(b, a, atol=1e-5)
    assert captures == [24, 16, 12, 8] and captured.forward.on


@pytest.mark.parametrize("fault", ["stale", "raises"])
def test_a_graph_that_fails_or_differs_is_dropped_for_the_eager_pass(fault):
    def graph_of(fn):
        if fault == "raises":
            raise RuntimeError("operation not permitted when stream is capturing")
        out = fn()
        return (lambda: None), out  # replays leave the output as captured, on zeros

    eager, captured = acting_pair(graph_of=graph_of)
    with pytest.warns(RuntimeWarning, match="acting without a CUDA graph from now on"):
        pairs = act_side_by_side(eager, captured, steps=8)
    for a, b in pairs:
        np.testing.assert_allclose(b, a, atol=1e-5)
    assert not captured.forward.on


@pytest.mark.parametrize("model_name", ["dt", "primal"])
@needs_cuda
def test_the_cuda_graph_of_acting_acts_as_the_eager_pass_on_cuda(model_name):
    import warnings

    eager, captured = acting_pair("cuda", model_name, "bf16")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        pairs = act_side_by_side(eager, captured)
    for a, b in pairs:
        np.testing.assert_allclose(b, a, atol=3e-2)
    assert captured.forward.on and captured.forward.width == 8


@needs_cuda
def test_the_pipelined_evaluation_on_cuda_gives_each_half_the_episodes_it_gives_alone():
    """Each half acts through a CUDA graph of its own (``Policy.twin``), captured and checked as episodes end, while
    the other half's environments step: no fallback, no graph dropped, and each half's episodes those it gives in an
    evaluation of its own."""
    import warnings

    from dt_primal.config import Config
    from dt_primal.model.transformer import DecisionTransformer

    torch.manual_seed(0)
    cfg = Config(model="primal", d_model=16, n_head=2, n_layer=2, context=4, max_ep_len=60, s=4)
    model = DecisionTransformer(cfg.model_config(11, 3), members=2).to("cuda").train(False)
    policy, hopper = Policy(model, np.zeros(11), np.ones(11), 1000.0, 4, "bf16"), TASKS["hopper"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        piped = rollout(policy, hopper, [3600.0, 1800.0], 8, seeds=[5, 9], env_workers=2)
        halves = ((3600.0, [5, 9]), (1800.0, [13, 17]))  # the second half's seeds: 8 after the first's
        alone = [rollout(policy, hopper, [target], 8, seeds=seeds, env_workers=1) for target, seeds in halves]
    for m in range(2):
        for half, reports in zip(piped[m], (alone[0][m][0], alone[1][m][0])):
            assert half["lengths"] == reports["lengths"]
            np.testing.assert_allclose(half["returns"], reports["returns"], rtol=1e-5)
    assert policy.forward.on and policy.forward.width > 0  # acted through its graph
