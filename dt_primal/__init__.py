"""dt-primal: Decision Transformers with Causal Primal-Attention (Chen et al., NeurIPS 2023).

Importing it changes nothing in the process: the command-line programs make their process-wide
settings themselves (``dt_primal.process.configure_process``)."""


def __getattr__(name: str):
    """``dt_primal.load_policy`` (dt_primal.evaluation.acting), imported on first use: torch loads only for a
    checkpoint, not for an ONNX export."""
    if name == "load_policy":
        from dt_primal.evaluation.acting import load_policy

        return load_policy
    raise AttributeError(f"module 'dt_primal' has no attribute {name!r}")


__all__ = ["load_policy"]
