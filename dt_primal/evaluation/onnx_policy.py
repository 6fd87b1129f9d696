"""Acting with a policy exported to ONNX (``python -m dt_primal.cli.export``) on onnxruntime and NumPy: no
torch. The bookkeeping is ``Acting``'s, as the PyTorch ``Policy``'s; the forward pass is the file's graph.

  policy = dt_primal.load_policy("policy.onnx")
  policy.reset(target_return=3600.0)
  action = policy.act(obs)                   # then policy.act(obs, reward=reward) each later step

An .onnx file is read as untrusted (``dt_primal.files.onnx.check_onnx_policy``): from its bytes, so that
it cannot name other files (external weights are refused), with onnxruntime's standard operators only,
and its metadata checked against the graph's inputs before anything acts.
"""

from __future__ import annotations

import os

import numpy as np

from dt_primal.errors import UserError
from dt_primal.evaluation.acting import Acting


class OnnxPolicy(Acting):
    """One exported model acting (members 1): ``session`` an onnxruntime session of the graph, ``meta``
    its checked metadata (``check_onnx_policy``)."""

    device = "cpu"
    precision = "fp32"

    def __init__(self, session, meta: dict):
        self.session, self.meta = session, meta
        self.max_ep_len = meta["max_ep_len"]
        self.action_bounds = np.asarray(meta["action_bounds"], np.float32)
        act_dim = len(meta["action_bounds"][0])
        super().__init__(1, act_dim, meta["state_mean"], meta["state_std"], meta["reward_scale"], meta["context"])
        self.run_config = meta["config"]

    def _predict(self, states, actions, rtg, timesteps, live: np.ndarray | None) -> np.ndarray:
        """The newest step's action (1, N, act_dim) of the live episodes, zeros for the others."""
        n = states.shape[1]
        live = np.ones((1, n), bool) if live is None else live
        rows, width = self.live_rows(live)
        out = np.zeros((1, n, self.act_dim), np.float32)
        if width == 0:
            return out
        r = rows[0]
        feed = {
            "states": np.ascontiguousarray(states[0, r]),
            "actions": np.ascontiguousarray(actions[0, r]),
            "returns_to_go": np.ascontiguousarray(rtg[0, r]),
            "timesteps": np.ascontiguousarray(np.broadcast_to(timesteps, (width, len(timesteps)))),
        }
        try:
            action = self.session.run(["action"], feed)[0]
        except Exception as exc:  # onnxruntime's own errors: a graph that fails on these inputs
            raise UserError(
                f"The ONNX policy failed while acting ({type(exc).__name__}: {str(exc)[:200]}); the file is "
                f"damaged or was not written by python -m dt_primal.cli.export. Export it again."
            ) from None
        if np.shape(action) != (width, self.act_dim) or not np.isfinite(action).all():
            raise UserError(
                f"The ONNX policy gave actions of shape {np.shape(action)} (expected {(width, self.act_dim)}) "
                f"{'that are not all finite ' if np.shape(action) == (width, self.act_dim) else ''}for "
                f"{width} finite observations; the file is damaged. Export it again."
            )
        out[0, r] = action
        return out * live[..., None]


def load_onnx_policy(path: str | os.PathLike) -> OnnxPolicy:
    """The policy of the ONNX export at ``path``, on onnxruntime's CPU."""
    from dt_primal.files.onnx import check_onnx_policy

    session, meta = check_onnx_policy(path)
    return OnnxPolicy(session, meta)


def onnx_run(path: str | os.PathLike) -> dict:
    """What evaluate.py reads of a checkpoint, from an exported policy's metadata: its config, model
    config, task, step, dataset and normalisation, and ``onnx``: the policy itself, loaded once. The run's
    parts are checked as a checkpoint's are (``Config.from_record``, ``ModelConfig.from_record``, ``Task.from_record``)
    and against the graph's sizes."""
    from gymnasium.error import Error as GymError

    from dt_primal.config import Config
    from dt_primal.model.architecture import ModelConfig
    from envs import Task

    policy = load_onnx_policy(path)
    meta = policy.meta
    try:
        arch = ModelConfig.from_record(meta["model_config"])
        Config.from_record(meta["config"])
        Task.from_record(meta["task"])
        sizes = (arch.state_dim, arch.act_dim, arch.context, arch.max_ep_len)
        ok = sizes == (len(meta["state_mean"]), policy.act_dim, meta["context"], meta["max_ep_len"])
        ok = ok and type(meta["step"]) is int and meta["step"] >= 0 and isinstance(meta["dataset"], str)
    except (TypeError, ValueError, KeyError, UserError, GymError):
        ok = False
    if not ok:
        raise UserError(f"{path}: the run record in its metadata is damaged (config, architecture, task or step).")
    keys = ("config", "model_config", "task", "step", "dataset", "state_mean", "state_std")
    return {k: meta[k] for k in keys} | {"onnx": policy}
