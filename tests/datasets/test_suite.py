"""The offline suite at a tiny scale, with throwaway behaviour policies in a temporary folder."""

import json
import re
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import run

import datasets.suite as suite
from datasets.behaviour import GaussianActor
from datasets.loaders import load_dataset
from datasets.rollout import collect, collect_rows, merge
from datasets.transitions import half_precision, load_transitions, save_transitions
from envs import TASKS

ROOT = Path(__file__).resolve().parents[2]

HOPPER = TASKS["hopper"]
STEPS = 300


@pytest.fixture(scope="module")
def policies(tmp_path_factory):
    """medium.pt, the experts expert-v0.pt and expert-v1.pt, and medium_replay.npz as the learner exports them,
    and a second and a third learner's medium-vN.pt and medium_replay-vN.npz (half-precision observations), which
    make hopper's medium-vN, medium-replay-vN and medium-expert-v(N + 1) here, N = 1, 2."""
    root = tmp_path_factory.mktemp("policies")
    folder = root / "hopper"
    folder.mkdir()
    for i, name in enumerate(("medium.pt", "expert-v0.pt", "expert-v1.pt", "medium-v1.pt", "medium-v2.pt")):
        torch.manual_seed(i)
        meta = {
            "task": "hopper",
            "algo": "SAC",
            "train_seed": 0,
            "step": 1000 * (i + 1),
            "learner_cpu_seconds": 1.0,
            "eval_return_mean": 0.0,
            "eval_normalized": 0.0,
        }
        torch.save({**GaussianActor(11, 3, (16,)).export(), "meta": meta}, folder / name)
    rng = np.random.default_rng(0)
    eps = collect(HOPPER, lambda o: rng.uniform(-1, 1, (len(o), 3)).astype(np.float32), num_steps=500, num_envs=4)
    (folder / "learner.json").write_text(json.dumps({"task": "hopper"}))  # the first learners' has no medium score
    buffer = as_buffer(eps)
    save_transitions(folder / "medium_replay.npz", buffer)
    for version, scale in ((1, -1), (2, 0.5)):
        (folder / f"learner-v{version}.json").write_text(json.dumps({"task": "hopper", "medium_score": 60.0}))
        save_transitions(
            folder / f"medium_replay-v{version}.npz", half_precision({**buffer, "actions": scale * buffer["actions"]})
        )
    mp = pytest.MonkeyPatch()
    mp.setattr(suite, "POLICY_DIR", root)
    for level, newest in (("medium", 2), ("medium-replay", 2), ("medium-expert", 3)):
        mp.setitem(suite.VERSIONS[level], "hopper", newest)
    yield folder
    mp.undo()


def as_buffer(eps: list[dict]) -> dict[str, np.ndarray]:
    """Episodes as a learner's replay buffer stores them."""
    return dict(
        observations=np.concatenate([e["observations"][:-1] for e in eps]),
        final_observations=np.stack([e["observations"][-1] for e in eps]),
        actions=np.concatenate([e["actions"] for e in eps]),
        rewards=np.concatenate([e["rewards"] for e in eps]),
        terminations=np.concatenate([e["terminations"] for e in eps]),
        truncations=np.concatenate([e["truncations"] for e in eps]),
        lengths=np.array([len(e["actions"]) for e in eps]),
    )


@pytest.mark.parametrize("level", suite.LEVELS)
def test_every_level_builds_and_loads_through_the_pipeline(policies, level):
    import minari

    dataset_id = suite.build(HOPPER, level, steps=STEPS, seed=0)
    assert dataset_id == f"dt-primal/hopper/{level}-v{suite.VERSIONS[level]['hopper']}"  # the newest by default
    data = load_dataset(dataset_id)
    assert data.env == "Hopper-v5" and data.obs_dim == 11 and data.act_dim == 3
    expected = {"medium-expert": 2 * STEPS, "medium-replay": None}.get(level, STEPS)
    if expected is not None:
        assert len(data.rewards) == expected
    ds = minari.load_dataset(dataset_id)
    meta = ds.storage.metadata
    assert meta["ref_min_score"] == HOPPER.ref_min and meta["ref_max_score"] == HOPPER.ref_max
    assert minari.get_normalized_score(ds, np.array([HOPPER.ref_max]))[0] == pytest.approx(1.0)  # a fraction
    assert level in meta["description"] and "Seeds:" in meta["description"]
    assert ds.env_spec.id == "Hopper-v5"
    for ep in ds.iterate_episodes():  # each episode ends on termination or truncation (flagged only at its end)
        flags = ep.terminations | ep.truncations
        assert flags[-1] and not flags[:-1].any() and len(ep.observations) == len(ep.actions) + 1
        assert len(ep.actions) <= 1000


def test_same_seed_same_dataset_other_seed_other_dataset(policies):
    first = load_dataset(suite.build(HOPPER, "medium", steps=STEPS, seed=3))
    again = load_dataset(suite.build(HOPPER, "medium", steps=STEPS, seed=3))
    other = load_dataset(suite.build(HOPPER, "medium", steps=STEPS, seed=4))
    np.testing.assert_array_equal(first.observations, again.observations)
    np.testing.assert_array_equal(first.actions, again.actions)
    assert not np.array_equal(first.actions, other.actions)


@pytest.mark.parametrize("version", [0, 1, 2])
def test_medium_expert_holds_exactly_the_episodes_of_its_parts(policies, version):
    parts = [
        load_dataset(suite.build(HOPPER, lvl, steps=STEPS, seed=1, version=v))
        for lvl, v in zip(("medium", "expert"), suite.MEDIUM_EXPERT[version])
    ]
    both = load_dataset(suite.build(HOPPER, "medium-expert", steps=STEPS, seed=1, version=version))
    np.testing.assert_array_equal(both.lengths, np.concatenate([p.lengths for p in parts]))
    for k in ("observations", "actions", "rewards"):
        np.testing.assert_array_equal(getattr(both, k), np.concatenate([getattr(p, k) for p in parts]))


def test_each_expert_version_is_its_own_dataset_rolled_out_with_its_own_policy(policies):
    import minari

    old, new = (load_dataset(suite.build(HOPPER, "expert", steps=STEPS, version=v)) for v in (0, 1))
    assert not np.array_equal(old.actions, new.actions)
    descriptions = [
        minari.load_dataset(f"dt-primal/hopper/expert-v{v}").storage.metadata["description"] for v in (0, 1)
    ]
    assert "learner step 2000" in minari.load_dataset("dt-primal/hopper/expert-v0").storage.metadata["algorithm_name"]
    assert "at least 75 normalised" in descriptions[0] and "at least 100 normalised" in descriptions[1]
    assert "--version 1" in descriptions[1]


@pytest.mark.parametrize(
    "bad", ["dt-primal/hopper/expert-v2", "dt-primal/walker2d/medium-v2", "dt-primal/hopper/expert", "x/y/z-v0"]
)
def test_a_suite_id_with_a_version_that_does_not_exist_is_refused(bad):
    from dt_primal.errors import UserError

    with pytest.raises(UserError, match="at most the newest version: " + re.escape(suite.versions_text() + ".")):
        suite.parse_suite_id(bad)


def test_each_task_has_its_own_newest_versions():
    assert suite.suite_id("walker2d", "medium") == "dt-primal/walker2d/medium-v1"
    assert suite.suite_id("halfcheetah", "medium-expert") == "dt-primal/halfcheetah/medium-expert-v2"
    assert suite.suite_id("walker2d", "random") == "dt-primal/walker2d/random-v0"
    assert suite.parse_suite_id("dt-primal/walker2d/medium-expert-v2")[2] == 2
    assert suite.source_files("medium-expert", 2) == ["medium-v1.pt", "expert-v1.pt"]
    assert suite.source_files("medium-replay", 1) == ["medium_replay-v1.npz", "medium-v1.pt"]


def test_a_newer_learners_medium_replay_is_its_own_buffer_read_at_half_precision(policies):
    old, new = (load_dataset(suite.build(HOPPER, "medium-replay", steps=10**6, version=v)) for v in (0, 1))
    z = load_transitions(policies / "medium_replay-v1.npz")
    assert z["observations"].dtype == np.float16
    assert new.observations.dtype == new.actions.dtype == np.float32
    np.testing.assert_allclose(new.actions, -old.actions, rtol=2**-11)  # the second learner's own transitions
    np.testing.assert_allclose(new.observations, old.observations, rtol=2**-11, atol=1e-7)
    assert not np.array_equal(new.observations, old.observations)  # rounded, as stored
    np.testing.assert_array_equal(new.actions, z["actions"].astype(np.float32))  # as stored


def test_a_medium_datasets_description_gives_its_learners_medium_score(policies):
    import minari

    for version, score in ((0, "40.0"), (1, "60.0")):
        suite.build(HOPPER, "medium", steps=STEPS, version=version)
        description = minari.load_dataset(f"dt-primal/hopper/medium-v{version}").storage.metadata["description"]
        assert f"reached a normalised score of {score}," in description


def test_an_expert_missing_from_the_checkout_says_where_to_find_it(policies, monkeypatch, tmp_path):
    from dt_primal.errors import UserError

    monkeypatch.setattr(suite, "POLICY_DIR", tmp_path)
    with pytest.raises(
        UserError,
        match=r"expert-v0.pt is missing: it belongs to an older version, which left the tree. .* `git show "
        r"\$\(git log -1 --format=%h -- datasets/policies/hopper/expert-v0.pt\)~1:datasets/policies/hopper/"
        r"expert-v0.pt > datasets/policies/hopper/expert-v0.pt`",
    ):
        suite.build(HOPPER, "expert", steps=STEPS, version=0)
    import shutil

    shutil.copytree(policies, tmp_path / "hopper", ignore=shutil.ignore_patterns("expert-v1.pt"))
    shutil.rmtree(suite.dataset_dir("dt-primal/hopper/medium-v0"), ignore_errors=True)
    with pytest.raises(UserError, match=r"expert-v1.pt is missing: the hopper behaviour learner has not exported it"):
        suite.build(HOPPER, "medium-expert", steps=STEPS, version=1)
    assert not suite.is_built("dt-primal/hopper/medium-v0")  # stopped before building its first part


def test_what_the_tree_cannot_build_yet_is_left_out_by_name(policies, tmp_path, monkeypatch, capsys):
    """`datasets build --env all` and the sweep's `table4` skip a dataset whose expert is not trained yet."""
    import shutil

    shutil.copytree(policies, tmp_path / "walker2d", ignore=shutil.ignore_patterns("expert-v1.pt"))  # none built
    monkeypatch.setattr(suite, "POLICY_DIR", tmp_path)
    ids = [
        f"dt-primal/walker2d/{level}"
        for level in ("random-v0", "medium-replay-v0", "medium-expert-v0", "medium-expert-v1")
    ]
    assert suite.buildable(ids) == ids[:3]
    assert capsys.readouterr().out == (
        "left out: dt-primal/walker2d/medium-expert-v1 (datasets/policies/walker2d/"
        "expert-v1.pt is not in this checkout; docs/datasets.md)\n"
    )


def test_the_sweeps_table4_is_the_versions_its_records_use_that_the_tree_can_build(policies, tmp_path, monkeypatch):
    from commands.sweep import command
    from commands.sweep.grid import TABLE4

    assert [d for d in TABLE4 if "hopper" in d] == [
        f"dt-primal/hopper/{level}" for level in ("medium-v0", "medium-replay-v2", "medium-expert-v1")
    ]
    trained = []
    run = lambda groups, args, extra, deadline: trained.extend(groups) or []
    monkeypatch.setattr(command, "run_groups_locally", run)
    with pytest.raises(SystemExit, match="no finished run"):
        command.main(["--datasets", "table4", "--models", "dt", "--out", str(tmp_path)])
    assert sorted(d for datasets, _ in trained for d in datasets) == sorted(d for d in TABLE4 if "hopper" in d)


def test_medium_replay_keeps_the_learners_history(policies):
    full = load_dataset(suite.build(HOPPER, "medium-replay", steps=10**6, version=0))
    z = load_transitions(policies / "medium_replay.npz")
    np.testing.assert_array_equal(full.actions, z["actions"])  # every transition, in order
    small = load_dataset(suite.build(HOPPER, "medium-replay", steps=120, version=0))
    assert 120 <= len(small.rewards) < len(full.rewards)
    # scaled down, it still spans the history: its first and last episodes are the learner's first and last
    np.testing.assert_array_equal(small.actions[: small.lengths[0]], full.actions[: full.lengths[0]])
    np.testing.assert_array_equal(small.actions[-small.lengths[-1] :], full.actions[-full.lengths[-1] :])


def test_build_if_missing_builds_once_and_redoes_an_interrupted_build(policies, capsys):
    import shutil

    dataset_id = suite.suite_id("hopper", "random")
    shutil.rmtree(suite.dataset_dir(dataset_id), ignore_errors=True)
    suite.build_if_missing(dataset_id, steps=STEPS)
    suite.build_if_missing(dataset_id, steps=STEPS)
    assert capsys.readouterr().out.count("building it now") == 1
    assert json.loads((suite.dataset_dir(dataset_id) / "build.json").read_text())["steps"] == STEPS
    # a build killed while writing leaves files but no build.json: it is built again, not loaded
    (suite.dataset_dir(dataset_id) / "build.json").unlink()
    (suite.dataset_dir(dataset_id) / "data" / "main_data.hdf5").write_bytes(b"half a file")
    suite.build_if_missing(dataset_id, steps=STEPS)
    assert capsys.readouterr().out.count("building it now") == 1
    assert len(load_dataset(dataset_id).rewards) == STEPS


def test_a_run_that_needs_a_dataset_being_built_waits_for_it_instead_of_building_it_again(policies, capsys):
    """python -m datasets build holds the dataset's build lock, so a sweep's group that starts meanwhile (a GPU
    window starts training before every build has finished) waits for it and then loads it."""
    import fcntl
    import shutil
    import threading
    import time

    dataset_id = suite.suite_id("walker2d", "random")
    shutil.rmtree(suite.dataset_dir(dataset_id), ignore_errors=True)
    builder = threading.Thread(target=suite.build, args=(TASKS["walker2d"], "random"), kwargs=dict(steps=STEPS))
    builder.start()
    lock = suite.dataset_dir(dataset_id).parent / f".{suite.dataset_dir(dataset_id).name}.build-lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    held = False
    while builder.is_alive() and not held:  # until the builder holds the lock
        with open(lock, "a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                held = True
        time.sleep(0.01)
    suite.build_if_missing(dataset_id, steps=STEPS)  # waits for the builder's lock, then finds it built
    builder.join()
    assert held and "building it now" not in capsys.readouterr().out and suite.is_built(dataset_id)


def test_learner_continues_on_a_fresh_clone_from_committed_files(tmp_path):
    """Only datasets/policies/<env>/ survives into a new checkout: the learner must go on from it,
    with its replay history intact (the medium-replay data)."""
    import shutil

    from datasets.behaviour import train_behaviour

    policy_dir, work = tmp_path / "policies", tmp_path / "work"
    train_behaviour(HOPPER, work, total_steps=600, eval_every=300, eval_episodes=2, policy_dir=policy_dir)
    first = load_transitions(policy_dir / "hopper" / "history.npz")
    # SB3 stores a step's transition after the checkpoint callback: 599 are stored at step 600
    assert len(first["rewards"]) == 599 and first["lengths"].sum() == 599
    assert np.abs(first["observations"]).sum(1).min() > 0  # no unwritten (all-zero) buffer rows
    shutil.rmtree(work)  # a fresh clone has no local checkpoint
    train_behaviour(HOPPER, work, total_steps=900, eval_every=300, eval_episodes=2, policy_dir=policy_dir)
    after = load_transitions(policy_dir / "hopper" / "history.npz")
    assert len(after["rewards"]) == 898  # step 600's transition was never stored: the learner stopped there
    for k in ("observations", "actions", "rewards"):
        np.testing.assert_array_equal(after[k][:599], first[k])
    learner = json.loads((policy_dir / "hopper" / "learner.json").read_text())
    assert [e["step"] for e in learner["evals"]] == [300, 600, 900] and learner["cpu_seconds"] > 0


def test_a_learner_resumed_from_an_older_snapshot_drops_the_history_after_it(tmp_path):
    """The committed history may be newer than the last committed snapshot: the steps after the
    snapshot are done again, once each in the history, and the best export (never committed) is
    found again."""
    import shutil

    from datasets.behaviour import train_behaviour

    policy_dir, work, folder = tmp_path / "policies", tmp_path / "work", tmp_path / "policies" / "hopper"
    train_behaviour(HOPPER, work, total_steps=600, eval_every=300, eval_episodes=1, policy_dir=policy_dir)
    shutil.copyfile(folder / "learner.zip", tmp_path / "snapshot-600.zip")
    train_behaviour(HOPPER, work, total_steps=900, eval_every=300, eval_episodes=1, policy_dir=policy_dir)
    learner = json.loads((folder / "learner.json").read_text())
    learner["best_step"], learner["best_score"] = 900, 50.0  # as if the lost steps had made a best export
    (folder / "learner.json").write_text(json.dumps(learner))
    shutil.rmtree(work)  # another machine: the newer history is committed, the snapshot is the one of step 600
    shutil.copyfile(tmp_path / "snapshot-600.zip", folder / "learner.zip")
    train_behaviour(HOPPER, work, total_steps=1200, eval_every=300, eval_episodes=1, policy_dir=policy_dir)
    learner = json.loads((folder / "learner.json").read_text())
    assert [e["step"] for e in learner["evals"]] == [300, 600, 900, 1200]
    assert learner["best_step"] is None and learner["best_score"] == -float("inf")  # below medium: none yet


def test_history_export_ends_an_episode_the_learner_cut_by_resuming():
    """A learner resumed mid-episode starts a new episode in the same replay buffer without any
    done flag in between: the export must not merge the two."""
    import gymnasium as gym
    from stable_baselines3.common.buffers import ReplayBuffer

    from datasets.behaviour import replay_episodes, restore_replay

    env = gym.make("Hopper-v5", terminate_when_unhealthy=False)
    buf = ReplayBuffer(50, env.observation_space, env.action_space, device="cpu")
    true_next = []
    for seed, n, flag_last in ((0, 7, False), (1, 5, True)):  # a cut episode, then one ending by time limit
        obs, _ = env.reset(seed=seed)
        for i in range(n):
            a = env.action_space.sample()
            nxt, r, _, _, _ = env.step(a)
            last = flag_last and i == n - 1
            buf.add(obs[None], nxt[None], a[None], np.array([r]), np.array([last]), [{"TimeLimit.truncated": last}])
            true_next.append(nxt)
            obs = nxt
    z = replay_episodes(buf)
    assert z["lengths"].tolist() == [7, 5]
    assert z["truncations"].tolist() == [False] * 6 + [True] + [False] * 4 + [True] and not z["terminations"].any()
    np.testing.assert_allclose(z["final_observations"], np.stack([true_next[6], true_next[11]]), rtol=1e-6)
    fresh = ReplayBuffer(50, env.observation_space, env.action_space, device="cpu")
    assert restore_replay(fresh, z) == 12
    np.testing.assert_allclose(fresh.next_observations[:12, 0], np.stack(true_next), rtol=1e-6)
    assert replay_episodes(fresh)["lengths"].tolist() == [7, 5]


def assert_same_episodes(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            np.testing.assert_array_equal(x[k], y[k])


def test_a_rollout_split_by_envs_gives_the_whole_batch_episodes_bit_for_bit(policies):
    """Rows of the vector env run apart (policy and random actions, episodes ending at different steps in
    different rows, a budget that cuts the last step) merge into collect's episodes, in its order."""
    actor, _ = GaussianActor.load(policies / "medium.pt")

    def policy():  # a fresh generator per rollout, as each rollout part has its own
        gen = torch.Generator().manual_seed(5)
        return lambda o: actor.act(o, gen)

    def uniform():
        rng = np.random.default_rng(5)
        return lambda o: rng.uniform(-1, 1, (len(o), 3)).astype(np.float32)

    for act in (policy, uniform):
        whole = collect(HOPPER, act(), num_steps=1003, num_envs=8, seed=5)
        assert sum(len(e["actions"]) for e in whole) == 1003 and len(whole) > 8
        for split in ([[0, 3, 6], [1, 4, 7], [2, 5]], [[7], [0, 1, 2, 3, 4, 5, 6]]):
            shards = [collect_rows(HOPPER, act(), rows, num_steps=1003, num_envs=8, seed=5) for rows in split]
            assert_same_episodes(whole, merge(shards))


def test_collect_rows_refuses_rows_outside_the_batch():
    for rows in ([], [8], [-1], [1, 1]):
        with pytest.raises(ValueError, match="distinct env indices below 8"):
            collect_rows(HOPPER, lambda o: np.zeros((len(o), 3), np.float32), rows, num_steps=100, num_envs=8)


def test_rollout_parts_give_the_same_data_in_worker_processes():
    serial = suite.rollouts(HOPPER, None, 400, seed=3, processes=1)
    sharded = suite.rollouts(HOPPER, None, 400, seed=3, processes=4)  # 2 processes per part
    assert sum(len(e["actions"]) for e in serial) == 400
    assert_same_episodes(serial, sharded)


def test_halfcheetah_is_made_without_the_settotalmass_warning_line_in_a_command(capfd):
    """The commands drop the line (evaluation makes one env per episode: it would repeat); importing envs
    leaves MuJoCo's process-wide warning handler as it was."""
    script = "import envs; envs.TASKS['halfcheetah'].make().close()"
    printed = run("-c", script)
    assert "settotalmass" in printed.stderr + printed.stdout
    from dt_primal.process import configure_process

    configure_process(wait_policy=None)
    TASKS["halfcheetah"].make().close()
    captured = capfd.readouterr()
    assert "settotalmass" not in captured.err + captured.out


EXPERT = "expert-v1.pt"  # the expert a learner trains for now


def test_a_learner_below_expert_level_exports_its_expert_only_when_it_finishes(tmp_path, monkeypatch):
    """Below the expert target the best policy is only ``best.pt`` until the learner's run ends: an
    expert dataset is never built from a half-trained learner."""
    import datasets.behaviour as behaviour

    monkeypatch.setattr(behaviour, "MEDIUM_SCORE", -1e9)  # medium at the first evaluation
    folder = tmp_path / "policies" / "hopper"
    behaviour.train_behaviour(
        HOPPER, tmp_path / "work", total_steps=300, eval_every=300, eval_episodes=1, policy_dir=tmp_path / "policies"
    )
    assert (folder / "medium.pt").exists() and not (folder / "best.pt").exists() and not (folder / EXPERT).exists()
    behaviour.train_behaviour(
        HOPPER, tmp_path / "work", total_steps=600, eval_every=300, eval_episodes=1, policy_dir=tmp_path / "policies"
    )
    assert (folder / EXPERT).read_bytes() == (folder / "best.pt").read_bytes()
    progress = json.loads((folder / "learner.json").read_text())
    assert progress["best_step"] == 600 and progress["experts"] == {
        "1": {"step": 600, "below_target": True, "measured": None}
    }


def test_an_evaluation_measured_at_expert_level_becomes_the_expert_and_stops_the_learner(tmp_path, monkeypatch):
    import datasets.behaviour as behaviour

    monkeypatch.setattr(behaviour, "MEDIUM_SCORE", -1e9)
    monkeypatch.setitem(behaviour.EXPERT_TARGETS[behaviour.EXPERT_VERSION], "hopper", -1e9)
    folder = tmp_path / "policies" / "hopper"
    behaviour.train_behaviour(
        HOPPER, tmp_path / "work", total_steps=1200, eval_every=300, eval_episodes=1, policy_dir=tmp_path / "policies"
    )
    progress = json.loads((folder / "learner.json").read_text())
    assert [e["step"] for e in progress["evals"]] == [300, 600]  # stopped at the first promotion
    assert list(progress["measured"]) == ["600"] and progress["measured"]["600"][2] == behaviour.EXPERT_EPISODES
    assert progress["experts"]["1"] == {"step": 600, "measured": progress["measured"]["600"]}
    assert GaussianActor.load(folder / EXPERT)[1]["step"] == 600
    behaviour.train_behaviour(
        HOPPER, tmp_path / "work", total_steps=1200, eval_every=300, eval_episodes=1, policy_dir=tmp_path / "policies"
    )  # an expert exists: nothing more to do
    assert len(json.loads((folder / "learner.json").read_text())["evals"]) == 2


def test_a_lucky_evaluation_neither_becomes_the_expert_nor_replaces_a_better_measured_export(tmp_path, monkeypatch):
    """10 episodes are not enough: the 100-episode measurement decides the expert and ``best.pt``."""
    import datasets.behaviour as behaviour

    monkeypatch.setattr(behaviour, "MEDIUM_SCORE", -1e9)  # medium at the first evaluation (step 300)
    ten, hundred = {600: 96.0, 900: 100.0, 1200: 80.0}, {600: 97.0, 900: 91.0}  # normalised, by learner step

    def evaluate(actor, task, episodes, seed):
        step = seed - (20_000 if episodes >= behaviour.EXPERT_EPISODES else 10_000)
        score = (hundred if episodes >= behaviour.EXPERT_EPISODES else ten).get(step, 50.0)
        return np.full(episodes, task.ref_min + score / 100 * (task.ref_max - task.ref_min))

    monkeypatch.setattr(behaviour, "evaluate_actor", evaluate)
    folder = tmp_path / "policies" / "hopper"
    behaviour.train_behaviour(
        HOPPER, tmp_path / "work", total_steps=1200, eval_every=300, eval_episodes=1, policy_dir=tmp_path / "policies"
    )
    progress = json.loads((folder / "learner.json").read_text())
    assert [e["step"] for e in progress["evals"]] == [300, 600, 900, 1200]  # 900's 100 over 10 never stopped it
    assert sorted(progress["measured"]) == ["600", "900"]  # 1200 is more than MEASURE_MARGIN below the target
    assert (progress["best_step"], progress["best_episodes"]) == (600, behaviour.EXPERT_EPISODES)
    assert progress["best_score"] == pytest.approx(97.0, abs=1e-3)
    assert progress["experts"]["1"] == {"step": 600, "below_target": True, "measured": progress["measured"]["600"]}
    assert GaussianActor.load(folder / EXPERT)[1]["step"] == 600


def test_stats_page_lists_each_built_dataset_and_measures_the_policies(policies, tmp_path, monkeypatch):
    import minari

    import datasets.stats as stats

    learner = {
        "algo": "SAC",
        "cpu_seconds": 7200.0,
        "evals": [{"step": 3000, "normalized": 80.0}],
        "best_step": 3000,
        "best_score": 80.0,
        "experts": {
            "0": {"step": 2000, "measured": [77.7, 1.5, 100]},
            "1": {"step": 3000, "below_target": True, "measured": [96.0, 2.0, 100]},
        },
    }
    (policies / "learner.json").write_text(json.dumps(learner))
    monkeypatch.setattr(stats, "POLICY_DIR", policies.parent)
    monkeypatch.setattr(stats, "TASKS", {"hopper": HOPPER})
    suite.build(HOPPER, "random", steps=3000, seed=0)  # about 47 steps in each of the 64 rollout environments
    suite.build(HOPPER, "expert", steps=STEPS, seed=0, version=0)
    notes = f"{stats.NOTES}\n\n## Why these learners\n\nWritten by hand.\n"
    elsewhere = "| dt-primal/hopper/medium-v0 | 9 | 9000 | built on another machine |"
    (tmp_path / "datasets.md").write_text(
        f"an older page\n\n{elsewhere}\n| dt-primal/hopper/random-v0 | stale |\n\n" + notes
    )
    page = stats.stats(tmp_path / "datasets.md", episodes=2)
    assert (tmp_path / "datasets.md").read_text() == page
    assert page.endswith(notes) and "an older page" not in page  # the notes survive, the rest is regenerated
    assert elsewhere in page and "stale" not in page  # a row of a dataset not built here is kept, a built one measured
    ds = minari.load_dataset("dt-primal/hopper/random-v0")
    assert f"| dt-primal/hopper/random-v0 | {ds.total_episodes} | 3000 |" in page
    assert "| dt-primal/hopper/expert-v0 |" in page  # an older version that is built is listed too
    data = load_dataset("dt-primal/hopper/random-v0", build=False)
    norm, cut = HOPPER.normalize(data.episode_returns()), ~data.terminals & (data.lengths < HOPPER.time_limit)
    assert 0 < cut.sum() < len(cut)  # each rollout environment's last episode, cut short by the step budget
    assert f"; {norm[~cut].mean():.1f} without the {cut.sum()} cut short |" in page
    assert "| medium | expert-v0 | expert-v1 |" in page and "expert-v1 ≥ hopper 100" in page
    row = next(line for line in page.splitlines() if line.startswith("| hopper | SAC |"))
    assert "| 3000 (80.0) | 2.00 |" in row
    medium, old, new = row.split(" | ")[4:7]
    assert (
        medium.startswith("step 1000: return") and old.startswith("step 2000: return") and new.startswith("step 3000")
    )
    assert "promoted on 77.7 ± 1.5 over 100 other episodes" in old
    assert "ended below the target; chosen on 96.0 ± 2.0 over 100 other episodes)" in new
    assert (
        "![learning curves](datasets-learners.png)" in page and (tmp_path / "datasets-learners.png").stat().st_size > 0
    )
    beside = next(line for line in page.splitlines() if line.startswith("| dt-primal/hopper/random-v0 | 3000, "))
    best = HOPPER.normalize(data.best_episodes(10).episode_returns())
    assert f"| {best.mean():.1f} ({len(best)} episodes) |" in beside and beside.endswith("| – |")  # no D4RL figures
    again = stats.stats(tmp_path / "datasets.md", episodes=0)  # the policies as the page measured them
    assert row in again.splitlines() and "measured: 2 episodes" in again


def test_adopt_copies_a_learners_medium_exports_as_a_new_version_once(policies, tmp_path):
    from datasets.behaviour import adopt_learner
    from dt_primal.errors import UserError

    learner = tmp_path / "learner"
    learner.mkdir()
    (learner / "medium.pt").write_bytes((policies / "medium.pt").read_bytes())
    (learner / "medium_replay.npz").write_bytes((policies / "medium_replay.npz").read_bytes())
    (learner / "learner.json").write_text(json.dumps({"task": "hopper", "medium_step": 1000, "medium_score": 44}))
    out = tmp_path / "policies"
    (out / "hopper").mkdir(parents=True)
    written = adopt_learner(HOPPER, learner, 1, out)
    assert sorted(p.name for p in written) == ["learner-v1.json", "medium-v1.pt", "medium_replay-v1.npz"]
    stored, source = load_transitions(written[2]), load_transitions(learner / "medium_replay.npz")
    assert stored["observations"].dtype == stored["actions"].dtype == np.float16
    assert np.array_equal(stored["rewards"], source["rewards"])
    np.testing.assert_allclose(stored["actions"], source["actions"], rtol=2**-11)
    with pytest.raises(UserError, match="exists or is not a new version"):
        adopt_learner(HOPPER, learner, 1, out)
    with pytest.raises(UserError, match="holds no walker2d learner that reached medium level"):
        adopt_learner(TASKS["walker2d"], learner, 2, out)
    (learner / "medium_replay.npz").unlink()
    with pytest.raises(UserError, match="holds no usable medium exports"):
        adopt_learner(HOPPER, learner, 2, out)
    assert not list((out / "hopper").glob("*-v2*"))  # nothing written
    (learner / "learner.json").write_text("{")
    with pytest.raises(UserError, match="cannot be read as a learner's history"):
        adopt_learner(HOPPER, learner, 2, out)


def test_datasets_built_at_once_are_each_reported_as_soon_as_built(monkeypatch, capsys):
    """A medium-replay (seconds) is reported before the medium built beside it (minutes): a sweep that waits
    for the builds knows it can start its groups."""

    def child(argv, **kw):  # the child `python -m datasets build` of one dataset
        dataset_id = argv[argv.index("--dataset") + 1]
        time.sleep(0.5 if dataset_id.endswith("/medium-v0") else 0.0)
        out = f"built {dataset_id}: 10 episodes\n"
        return subprocess.CompletedProcess(argv, 0, out, "")

    monkeypatch.setattr(suite.subprocess, "run", child)
    suite.build_at_once(["dt-primal/hopper/medium-v0", "dt-primal/hopper/medium-replay-v0"], jobs=2)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "built dt-primal/hopper/medium-replay-v0",
        "built dt-primal/hopper/medium-v0",
    ]


def test_build_takes_suite_ids_each_at_its_own_version(policies, capsys):
    """``build --dataset`` builds the ids given (not each level's newest version), and refuses --env, --level
    or --version beside it and an id that is not the suite's before building anything."""
    from datasets.__main__ import main
    from dt_primal.errors import UserError

    ids = ["dt-primal/hopper/medium-replay-v0", "dt-primal/hopper/medium-replay-v1"]
    main(["build", "--dataset", *ids, "--steps", str(STEPS)])
    built = [line.split(":")[0] for line in capsys.readouterr().out.splitlines() if line.startswith("built")]
    assert built == [f"built {d}" for d in ids]
    assert not np.array_equal(load_dataset(ids[0]).actions, load_dataset(ids[1]).actions)
    for bad in (["--version", "0"], ["--env", "hopper"], ["--level", "medium"]):
        with pytest.raises(UserError, match="give it without --env, --level, --version"):
            main(["build", "--dataset", ids[0], *bad])
    with pytest.raises(UserError, match="Unknown suite dataset"):
        main(["build", "--dataset", ids[0], "dt-primal/hopper/medium-v7"])
    with pytest.raises(UserError, match="build needs --env and --level"):
        main(["build", "--env", "hopper"])


def test_a_build_needs_at_least_one_process():
    from datasets.__main__ import main
    from dt_primal.errors import UserError

    with pytest.raises(UserError, match="--processes must be at least 1"):
        main(["build", "--env", "hopper", "--level", "random", "--steps", "10", "--processes", "0"])


def test_train_policy_hands_each_option_to_the_learner(monkeypatch, tmp_path):
    """Every ``train-policy`` option reaches ``train_behaviour`` under its own name; a learning rate outside
    (0, 1) is refused before any learner starts."""
    import datasets.behaviour as behaviour
    from datasets.__main__ import main
    from dt_primal.errors import UserError

    calls = []
    monkeypatch.setattr(behaviour, "train_behaviour", lambda task, work, **kw: calls.append((task, work, kw)))
    main(["train-policy", "--env", "hopper", "--steps", "7", "--seed", "3", "--policy-dir", str(tmp_path)])
    main(["train-policy", "--env", "walker2d", "--work-dir", str(tmp_path / "w"), "--algo", "TQC", "--until-medium"])
    (task, work, kw), (task2, work2, kw2) = calls
    assert (task.name, work, kw["total_steps"], kw["seed"], kw["policy_dir"]) == (
        "hopper",
        Path("runs/behaviour/hopper"),
        7,
        3,
        tmp_path,
    )
    assert (task2.name, work2, kw2["algo"], kw2["until_medium"], kw2["policy_dir"]) == (
        "walker2d",
        tmp_path / "w",
        "TQC",
        True,
        behaviour.POLICY_DIR,
    )
    assert set(kw) == {
        "total_steps",
        "eval_every",
        "seed",
        "policy_dir",
        "algo",
        "medium_score",
        "until_medium",
        "learning_rate",
    }
    with pytest.raises(UserError, match="--learning-rate must lie between 0 and 1"):
        main(["train-policy", "--env", "hopper", "--learning-rate", "2"])
    assert len(calls) == 2


def test_stats_reads_its_page_and_build_records_as_untrusted_files(tmp_path, monkeypatch):
    """``datasets stats`` refuses a FIFO or a device as its page before measuring anything, and reads a build's
    record as any record: a FIFO, a link to a device or a string where a number belongs is no hang and no
    traceback."""
    import os

    import datasets.stats as stats
    from dt_primal.errors import UserError

    os.mkfifo(tmp_path / "page.md")
    monkeypatch.setattr(stats, "policy_row", lambda *a: pytest.fail("measured before checking --out"))
    with pytest.raises(UserError, match="page.md"):
        stats.stats(tmp_path / "page.md", episodes=2)
    (tmp_path / "zero.md").symlink_to("/dev/zero")
    with pytest.raises(UserError, match="zero.md"):
        stats.stats(tmp_path / "zero.md", episodes=2)
    folder = tmp_path / "ds"
    folder.mkdir()
    monkeypatch.setattr(stats, "dataset_dir", lambda dataset_id: folder)
    (folder / "build.json").write_text('{"seconds": "fast", "load_average": 1.5}')
    assert stats.build_info("any") == {"load_average": 1.5}
    (folder / "build.json").unlink()
    os.mkfifo(folder / "build.json")
    with pytest.raises(UserError, match="build.json"):
        stats.build_info("any")
    (folder / "build.json").unlink()
    (folder / "build.json").symlink_to("/dev/zero")
    with pytest.raises(UserError, match="build.json"):
        stats.build_info("any")
