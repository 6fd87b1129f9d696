"""The architecture of a Decision Transformer (``ModelConfig``) and the choices of its fields: plain data,
without torch, so that a config or a record can be read where torch is not needed."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

# dt: softmax only | primal: last block primal | primalformer: all primal | bc: an MLP, behaviour cloning
MODELS = ("dt", "primal", "primalformer", "bc")
EMBED_INITS = ("torch", "gpt2")
TIMESTEP_INITS = ("torch", "gpt2")
ACTIVATIONS = ("relu", "gelu")
ATTENTION_KERNELS = ("sdpa", "math")  # how softmax attention runs (not the architecture: same function)


def conditions_on_return(model: str) -> bool:
    """Whether the model named ``model`` acts on a target return (BC ignores it: one evaluation, no target)."""
    return model != "bc"


def evaluation_targets(model: str, targets) -> list[float | None]:
    """The targets a model named ``model`` is evaluated at: ``targets``, or one evaluation without a target
    (``[None]``) for a model that ignores it."""
    return list(targets) if conditions_on_return(model) else [None]


def has_ksvd(model: str) -> bool:
    """Whether the model named ``model`` has primal layers (a KSVD rank ``s`` and loss)."""
    return model in ("primal", "primalformer")


@dataclass(frozen=True)
class ModelConfig:
    """The architecture of a DecisionTransformer, every field resolved; a checkpoint stores it as a
    plain dict (``dataclasses.asdict``) beside the weights. ``eta`` weighs the KSVD loss (eq. 10)."""

    state_dim: int
    act_dim: int
    model: str
    n_layer: int
    d_model: int
    n_head: int
    context: int  # K timesteps, 3K tokens
    dropout: float
    activation: str  # of every block's MLP
    max_ep_len: int  # timestep embedding rows
    s: int  # KSVD rank
    eta: float
    embed_init: str  # the return/state/action embeddings and the action head: torch | gpt2
    timestep_init: str  # the timestep table: torch (N(0, 1)) | gpt2 (N(0, 0.02))

    def __post_init__(self):
        sizes = (
            self.state_dim,
            self.act_dim,
            self.n_layer,
            self.d_model,
            self.n_head,
            self.context,
            self.max_ep_len,
            self.s,
        )
        if (
            not all(isinstance(v, int) and v > 0 for v in sizes)
            or self.d_model % self.n_head
            or self.model not in MODELS
            or self.activation not in ACTIVATIONS
            or self.embed_init not in EMBED_INITS
            or self.timestep_init not in TIMESTEP_INITS
        ):
            raise ValueError(f"not a valid architecture: {self}")

    @classmethod
    def from_record(cls, record: dict) -> ModelConfig:
        """The config a checkpoint stored; ValueError when it is not one."""
        return of_exact_fields(cls, record, "an architecture")


def of_exact_fields(cls, record: object, what: str):
    """The dataclass ``cls`` of a stored ``record``: a dict of exactly its fields (a reader's values); ValueError
    naming them otherwise. The one reading of a stored config, the run's and the architecture's."""
    names = {f.name for f in dataclasses.fields(cls)}
    if not isinstance(record, dict) or set(record) != names:
        raise ValueError(f"{what} needs exactly the fields {', '.join(sorted(names))}")
    return cls(**record)
