"""dt-primal: Decision Transformers with Causal Primal-Attention (Chen et al., NeurIPS 2023).

Importing it changes nothing in the process: the command-line programs make their process-wide
settings themselves (``dt_primal.process.configure_process``)."""

from __future__ import annotations

import os
from pathlib import Path


def load_policy(path: str | os.PathLike, device="cpu", precision: str | None = None):
    """The policy of ``path``: a checkpoint (``last.pt`` of train.py) as a PyTorch ``Policy`` on ``device``
    at the run's precision unless ``precision`` is given; an ONNX export (``.onnx``, ``python -m
    dt_primal.export``) as an ``OnnxPolicy`` on onnxruntime's CPU, which needs no torch (imported here only
    for a checkpoint). Both read the file without running any code from it."""
    if Path(path).suffix == ".onnx":
        from dt_primal.evaluation.onnx_policy import load_onnx_policy

        return load_onnx_policy(path)
    from dt_primal.evaluation.policy import load_checkpoint_policy

    return load_checkpoint_policy(path, device, precision)


__all__ = ["load_policy"]
