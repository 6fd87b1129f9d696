"""Minari datasets recorded on tasks other than D4RL's three: the task, its time limit, reference
scores and targets come from the dataset; a D4RL task reports as before."""

import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from conftest import TINY, make_episodes, run

from datasets.loaders import load_dataset
from datasets.synthetic import write_d4rl
from dt_primal.config import Config
from dt_primal.errors import UserError
from dt_primal.evaluation.reports import aggregate, markdown, report
from dt_primal.training.checks import check_run_inputs
from envs import TASKS, derived_targets, task_for

ROOT = Path(__file__).resolve().parents[2]
RUN = [*TINY, "--steps", "20", "--warmup-steps", "5", "--batch-size", "8", "--eval-every", "1000"]
RUN += ["--eval-episodes", "2"]


def record(dataset_id: str, env_id: str, max_steps: int, episodes: int = 4, seed: int = 0, **metadata) -> None:
    """A Minari dataset of random-action episodes in ``env_id`` with a time limit of ``max_steps``
    (which its metadata records, as it does the environment's kwargs)."""
    import minari
    from minari.data_collector.episode_buffer import EpisodeBuffer

    env = gym.make(env_id, max_episode_steps=max_steps)
    env.action_space.seed(seed)
    buffers = []
    for i in range(episodes):
        obs, steps = [env.reset(seed=seed + i)[0]], []
        while not steps or not (steps[-1][2] or steps[-1][3]):
            action = env.action_space.sample()
            o, reward, terminated, truncated, _ = env.step(action)
            obs.append(o)
            steps.append((action, reward, terminated, truncated))
        actions, rewards, terms, truncs = zip(*steps)
        buffers.append(
            EpisodeBuffer(
                observations=np.array(obs),
                actions=np.array(actions),
                rewards=list(rewards),
                terminations=list(terms),
                truncations=list(truncs),
            )
        )
    minari.create_dataset_from_buffers(
        dataset_id, buffers, env=env, algorithm_name="random", author="tests", **metadata
    )
    env.close()


@pytest.fixture(autouse=True)
def minari_home(session_minari_home, monkeypatch):
    """This module's tests read the datasets its module-wide fixtures record once, in the session's folder."""
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(session_minari_home))
    return session_minari_home


@pytest.fixture(scope="module")
def pendulum():
    record("tests/invertedpendulum/random-v0", "InvertedPendulum-v5", max_steps=40)
    return "tests/invertedpendulum/random-v0"


@pytest.fixture(scope="module")
def ant():
    record("tests/ant/random-v0", "Ant-v5", max_steps=25, episodes=3, ref_min_score=-50.0, ref_max_score=150.0)
    return "tests/ant/random-v0"


def train(tmp_path, dataset, *args):
    out = tmp_path / "run"
    res = run("train.py", "--dataset", dataset, "--out", str(out), *RUN, *args)
    assert res.returncode == 0, res.stderr
    return res, out


def test_a_task_without_reference_scores_reports_returns_and_a_null_score(tmp_path, pendulum):
    data = load_dataset(pendulum)
    returns = data.episode_returns()
    assert data.task.gym_id == "InvertedPendulum-v5" and data.task.time_limit == 40  # the recorded environment
    assert data.task.ref_min is None and data.task.targets == derived_targets(returns)
    assert data.task.targets[0] == pytest.approx(returns.max(), rel=1e-3) and len(data.task.targets) == 2

    res, out = train(tmp_path, pendulum)
    assert f"targets {data.task.targets[0]:g}, {data.task.targets[1]:g} (from the dataset" in res.stdout
    assert res.stdout.count("InvertedPendulum-v5 is not a D4RL task") == 1
    ckpt_cfg = __import__("torch").load(out / "last.pt", weights_only=True)["config"]
    assert ckpt_cfg["max_ep_len"] == 40  # the task's episode limit, stored resolved
    result = json.loads((out / "eval.json").read_text())
    assert result["task"] == "InvertedPendulum-v5"
    assert [r["target"] for r in result["targets"]] == list(data.task.targets)
    for r in result["targets"]:
        assert r["normalized_mean"] is None and r["normalized_std"] is None
        assert r["return_mean"] > 0 and max(r["lengths"]) <= 40
    assert "normalised score – (2 episodes)" in res.stdout

    ev = tmp_path / "ev.json"
    res = run("evaluate.py", str(out / "last.pt"), "--episodes", "2", "--out", str(ev))
    assert res.returncode == 0, res.stderr
    assert json.loads(ev.read_text())["across_checkpoints"][0]["normalized_mean"] is None
    assert ev.with_suffix(".md").read_text().splitlines()[2].endswith("| – |")
    # references given afterwards normalise the same returns
    res = run(
        "evaluate.py", str(out / "last.pt"), "--episodes", "2", "--out", str(ev), "--ref-min", "0", "--ref-max", "10"
    )
    assert res.returncode == 0, res.stderr
    r = json.loads(ev.read_text())["across_checkpoints"][0]
    assert r["normalized_mean"] == pytest.approx(10 * r["return_mean"])


def test_reference_scores_come_from_the_metadata_or_the_user(tmp_path, ant):
    res, out = train(tmp_path, ant, "--max-ep-len", "30")
    result = json.loads((out / "eval.json").read_text())
    assert result["task"] == "Ant-v5"
    for r in result["targets"]:
        assert max(r["lengths"]) <= 25  # the recorded time limit, though --max-ep-len is 30
        assert r["normalized_mean"] == pytest.approx(100 * (r["return_mean"] + 50) / 200)
    assert "reference returns ref_min -50 and ref_max 150" in res.stdout

    data = load_dataset(ant, ref_scores=(0.0, 100.0))  # --ref-min / --ref-max win over the metadata
    assert (data.task.ref_min, data.task.ref_max) == (0.0, 100.0)


def test_env_names_any_registered_gymnasium_environment(tmp_path):
    eps = make_episodes(lengths=(9, 5), obs_dim=4, act_dim=1)
    write_d4rl(tmp_path / "pendulum.hdf5", eps)
    data = load_dataset(str(tmp_path / "pendulum.hdf5"), env="InvertedPendulum-v5")
    assert data.task.gym_id == "InvertedPendulum-v5" and data.task.spec is None and data.task.time_limit == 1000
    assert Config(max_ep_len=None).resolved(data.task).max_ep_len == 1000
    with pytest.raises(UserError, match="--env Pendulumm-v5 is not an environment Gymnasium knows"):
        load_dataset(str(tmp_path / "pendulum.hdf5"), env="Pendulumm-v5")
    discrete = load_dataset(str(tmp_path / "pendulum.hdf5"), env="CartPole-v1")
    with pytest.raises(UserError, match="a Decision Transformer here needs vectors of real numbers"):
        check_run_inputs(discrete, Config())


def test_d4rl_tasks_keep_their_aliases_references_and_targets():
    for name, task in TASKS.items():
        assert task_for(name) == task == task_for(task.gym_id)
    hopper = task_for("Hopper-v4")
    assert (hopper.name, hopper.gym_id, hopper.ref_min, hopper.ref_max, hopper.targets) == (
        "hopper",
        "Hopper-v4",
        -20.272305,
        3234.3,
        (3600.0, 1800.0),
    )
    returns = np.array([13.716, 12.965])
    r = report(TASKS["hopper"], 3600.0, returns, np.array([17, 16]))
    assert r["normalized_mean"] == pytest.approx(100 * (returns.mean() + 20.272305) / (3234.3 + 20.272305))
    summary = aggregate([{"checkpoint": "a", "targets": [r]}])
    assert "| a | 3600 | 2 | 13.3 ± 0.4 | 1.0 ± 0.0 |" in markdown(summary)


def test_a_d4rl_run_reports_as_before(tmp_path):
    """The report of a tiny hopper run, as dt-primal wrote it before any task was accepted (with the MLP
    activation and the timestep table of that time: GELU, N(0, 0.02))."""
    path = tmp_path / "hopper_tiny.hdf5"
    write_d4rl(path, make_episodes(lengths=(40, 25, 60, 33), seed=3))
    _, out = train(tmp_path, str(path), "--seed", "0", "--activation", "gelu", "--timestep-init", "gpt2")
    result = json.loads((out / "eval.json").read_text())
    assert result["task"] == "Hopper-v5"
    assert (result["config"]["seed"], result["config"]["d_model"], result["config"]["model"]) == (0, 32, "primal")
    assert [sorted(r) for r in result["targets"]] == [
        sorted(
            [
                "target",
                "return_mean",
                "return_std",
                "normalized_mean",
                "normalized_std",
                "episodes",
                "returns",
                "lengths",
            ]
        )
    ] * 2
    assert [(r["target"], r["lengths"]) for r in result["targets"]] == [(3600.0, [21, 21]), (1800.0, [21, 21])]
    assert [r["normalized_mean"] for r in result["targets"]] == pytest.approx([0.9594043592, 0.9600319493], rel=1e-4)


def test_stats_and_the_sweep_take_any_task(tmp_path, pendulum, ant):
    from commands.sweep.grid import run_dir
    from commands.sweep.results import collect
    from commands.sweep.tables import write_tables
    from datasets.stats import stats

    text = stats(tmp_path / "datasets.md", episodes=1, datasets=[pendulum, ant, pendulum])
    assert sum(line.startswith(f"| {pendulum} |") for line in text.splitlines()) == 1  # given twice: one row
    row = next(line for line in text.splitlines() if line.startswith(f"| {pendulum} | 4 |"))
    assert row.split(" | ")[-2] == "–"  # no reference scores
    assert next(line for line in text.splitlines() if line.startswith(f"| {ant} | 3 |")).split(" | ")[-2] != "–"

    for dataset, normalized in ((pendulum, None), (ant, 40.0)):
        for seed in (0, 1):
            rd = run_dir(tmp_path, dataset, "dt", seed)
            rd.mkdir(parents=True)
            (rd / "eval.json").write_text(
                json.dumps(
                    {
                        "step": 20,
                        "targets": [
                            {
                                "target": 10.0,
                                "episodes": 2,
                                "return_mean": 5.0 + seed,
                                "normalized_mean": None if normalized is None else normalized + seed,
                            }
                        ],
                    }
                )
            )
    md = write_tables(collect(tmp_path, [pendulum, ant], ["dt"], [0, 1]), tmp_path)
    # two seeds, 5 and 6 (40 and 41): the mean with its bootstrap interval over them
    assert (
        f"| {pendulum} (returns) | dt |" in md
        and "| 5.5 [5.0, 6.0] (10) |" in md
        and "| 40.5 [40.0, 41.0] (10) |" in md
    )
    assert "| **average (1 dataset)** | dt |" in md and "Datasets marked (returns)" in md


def test_reference_scores_that_cannot_normalise_are_refused_unless_the_user_gives_others():
    record(
        "tests/invertedpendulum/flat-v0",
        "InvertedPendulum-v5",
        max_steps=20,
        episodes=2,
        ref_min_score=100.0,
        ref_max_score=100.0,
    )
    with pytest.raises(UserError, match="cannot normalise a score"):
        load_dataset("tests/invertedpendulum/flat-v0")
    task = load_dataset("tests/invertedpendulum/flat-v0", ref_scores=(0.0, 1000.0)).task
    assert (task.ref_min, task.ref_max) == (0.0, 1000.0)
