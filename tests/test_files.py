"""Checkpoints and datasets as files a user is given: what they hold and how they are read."""
import ast
import dataclasses
from pathlib import Path

import pytest
import torch

from dt_primal import checkpoint
from dt_primal.config import make_config

ROOT = Path(__file__).resolve().parents[1]
SMALL = dict(dataset="tiny", d_model=32, n_head=2, n_layer=2, s=8, warmup_steps=5, batch_size=8, eval_every=1000,
             eval_episodes=1, device="cpu")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A 2-step run on a tiny hopper dataset: its folder."""
    from conftest import make_episodes
    from datasets.loaders import load_dataset
    from datasets.synthetic import write_d4rl
    from dt_primal.training import train
    tmp = tmp_path_factory.mktemp("run")
    write_d4rl(tmp / "hopper_tiny.hdf5", make_episodes(lengths=(40, 25), seed=3))
    data = load_dataset(str(tmp / "hopper_tiny.hdf5"), env="hopper")
    train(make_config(**{**SMALL, "dataset": str(tmp / "hopper_tiny.hdf5")}, env="hopper", steps=2, max_ep_len=50,
                      out=str(tmp / "run")), data)
    return tmp / "run"


def test_the_model_owns_its_config():
    """model.py builds a DecisionTransformer from its ModelConfig alone: it imports nothing of the run's config."""
    tree = ast.parse((ROOT / "dt_primal" / "model.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | \
        {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert "dt_primal.config" not in imported and "dt_primal.model" not in imported


def test_checkpoint_stores_the_resolved_architecture(run):
    ckpt = checkpoint.load_checkpoint(run / "last.pt")
    assert ckpt["model_config"] == dataclasses.asdict(make_config(**SMALL, max_ep_len=50).model_config(11, 3))
    model, _ = checkpoint.model_from_checkpoint(ckpt)
    assert model.config.s == 8 and model.embed_timestep.weight.shape[1] == 50  # (members, rows, d_model)
