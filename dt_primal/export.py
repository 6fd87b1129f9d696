"""A trained policy (``python -m dt_primal.cli.export CKPT OUT.onnx``) as an ONNX graph that runs without PyTorch.

The graph is one step of acting: the last K steps of normalised states (B, K, obs_dim), actions (B, K,
act_dim), returns-to-go (B, K, 1) and timesteps (B, K) → the newest step's action (B, act_dim), with the
batch B and the steps K (1..context) dynamic; DT, Primal.+DT (Causal Primal-Attention with its causal
running means) and PrimalFormer alike, in fp32. The file's metadata holds what acting needs beside it:
the normalisation statistics, reward scale, context length, episode limit, the task's action bounds,
and the run's config and task. ``dt_primal.load_policy("policy.onnx")`` acts with it on onnxruntime and
NumPy (docs/policy.md). Exporting needs torch, onnx and onnxscript (``pip install onnx onnxscript``).
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from pathlib import Path

import numpy as np
import torch

from dt_primal.files.checkpoint import model_from_checkpoints, read_checkpoint
from dt_primal.files.onnx import metadata_props
from dt_primal.files.writing import check_target, write_file

INPUTS = ("states", "actions", "returns_to_go", "timesteps")


class NextAction(torch.nn.Module):
    """One member's newest action from the last K steps of one batch of episodes (the acting forward pass)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, states, actions, returns_to_go, timesteps):
        pred, _ = self.model(states[None], actions[None], returns_to_go[None], timesteps[None], last_only=True)
        return pred[0, :, -1]


def metadata(ckpt: dict) -> dict[str, str]:
    """What acting needs beside the graph, as the ONNX file's metadata (JSON values)."""
    from dt_primal.evaluation.checks import task_limits
    from envs import Task

    arch, run = ckpt["model_config"], ckpt["config"]
    try:
        limits = task_limits(Task.from_record(ckpt["task"]))
        bounds = [limits.low.tolist(), limits.high.tolist()]
    except Exception:  # the task's environment cannot be made here: the model's own range
        bounds = [[-1.0] * arch["act_dim"], [1.0] * arch["act_dim"]]
    values = {
        "state_mean": np.asarray(ckpt["state_mean"], float).tolist(),
        "state_std": np.asarray(ckpt["state_std"], float).tolist(),
        "reward_scale": run["reward_scale"],
        "context": arch["context"],
        "max_ep_len": arch["max_ep_len"],
        "action_bounds": bounds,
        "model_config": arch,
        "config": run,
        "task": ckpt["task"],
        "step": ckpt["step"],
        "dataset": ckpt["dataset"],
    }
    return metadata_props(values)


def export(checkpoint: str | Path, out: str | Path) -> Path:
    """Write the ONNX policy of the checkpoint ``checkpoint`` (read as train.py's, safely) to ``out``, one file."""
    import onnx

    check_target(out, "The ONNX policy")
    ckpt = read_checkpoint(checkpoint)
    model = model_from_checkpoints([ckpt], "cpu").train(False)
    cfg, K = model.config, model.config.context
    example = (
        torch.zeros(2, K, cfg.state_dim),
        torch.zeros(2, K, cfg.act_dim),
        torch.zeros(2, K, 1),
        torch.arange(K).repeat(2, 1),
    )
    dynamic = {name: {0: "batch", 1: "steps"} for name in INPUTS} | {"action": {0: "batch"}}
    quiet = logging.getLogger("torch.onnx"), logging.getLogger("torch._dynamo")
    levels = [log.level for log in quiet]
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):  # the exporter's progress lines
        warnings.simplefilter("ignore")
        for log in quiet:
            log.setLevel(logging.ERROR)
        program = torch.onnx.export(
            NextAction(model),
            example,
            input_names=list(INPUTS),
            output_names=["action"],
            dynamic_axes=dynamic,
            dynamo=True,
            verbose=False,
        )
    for log, level in zip(quiet, levels):
        log.setLevel(level)
    proto = program.model_proto
    onnx.helper.set_model_props(proto, metadata(ckpt))
    out = Path(out)
    write_file(out, proto.SerializeToString(), "The ONNX policy")  # weights inside the file: a policy is one file
    return out
