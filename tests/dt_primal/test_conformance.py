"""Every model variant through the whole product, one test each: fit, resume, evaluate, export to ONNX and
act through ``dt_primal.load_policy`` from the checkpoint and from the export alike."""

import dataclasses
import json

import numpy as np
import pytest
from conftest import make_episodes, small_config

import dt_primal
from datasets.loaders import load_dataset
from datasets.synthetic import write_d4rl
from dt_primal.evaluation.rollout import rollout
from dt_primal.files.checkpoint import load_checkpoint
from dt_primal.model.architecture import MODELS
from dt_primal.training.loop import train
from envs import TASKS

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

HOPPER = TASKS["hopper"]
TARGETS = [3600.0, 1800.0]


def first_actions(policy, steps: int = 6) -> np.ndarray:
    """The actions ``policy`` takes over ``steps`` steps of one Hopper episode per target (fixed seeds)."""
    envs = [HOPPER.make() for _ in TARGETS]
    obs = np.stack([env.reset(seed=7 + i)[0] for i, env in enumerate(envs)]).astype(np.float32)
    policy.reset(np.array(TARGETS))
    live, reward, taken = np.ones(len(TARGETS), bool), None, []
    for _ in range(steps):
        action = policy.act(obs, live=live) if reward is None else policy.act(obs, reward=reward, live=live)
        taken.append(np.asarray(action))
        stepped = [env.step(a) for env, a in zip(envs, action)]
        obs = np.stack([s[0] for s in stepped]).astype(np.float32)
        reward = np.array([s[1] for s in stepped], np.float32)
    return np.stack(taken)


@pytest.mark.parametrize("model", MODELS)
def test_every_model_fits_resumes_evaluates_exports_and_loads(model, tmp_path):
    from dt_primal.export import export

    data_file = tmp_path / "hopper_tiny.hdf5"
    write_d4rl(data_file, make_episodes(lengths=(40, 25), seed=3))
    data = load_dataset(str(data_file), env="hopper")
    run = tmp_path / "run"
    cfg = small_config(dataset=str(data_file), env="hopper", model=model, steps=2, context=4, max_ep_len=50)
    cfg = dataclasses.replace(cfg, out=str(run))
    train(cfg, data)
    assert load_checkpoint(run / "last.pt")["step"] == 2
    [report] = train(dataclasses.replace(cfg, steps=4), data, resume=True)
    assert load_checkpoint(run / "last.pt", resume=True)["step"] == 4
    assert json.loads((run / "eval.json").read_text()) == json.loads(json.dumps(report)) and report["step"] == 4
    assert all(np.isfinite(r["return_mean"]) for r in report["targets"])

    policy = dt_primal.load_policy(run / "last.pt")
    [scores] = rollout(policy, HOPPER, TARGETS, 1)
    assert [s["target"] for s in scores] == TARGETS and all(np.isfinite(s["return_mean"]) for s in scores)
    actions = first_actions(policy)
    assert actions.shape == (6, len(TARGETS), 3) and np.all(np.abs(actions) <= 1)

    onnx_policy = dt_primal.load_policy(export(run / "last.pt", tmp_path / "policy.onnx"))
    np.testing.assert_allclose(first_actions(onnx_policy), actions, atol=1e-4)
