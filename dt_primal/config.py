"""The one config object shared by ``train.py`` and ``evaluate.py`` (defaults: the paper's, docs/method.md,
"Hyper-parameters")."""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

from dt_primal.errors import UserError
from dt_primal.model.architecture import (
    ACTIVATIONS,
    ATTENTION_KERNELS,
    EMBED_INITS,
    MODELS,
    TIMESTEP_INITS,
    ModelConfig,
    of_exact_fields,
)

if TYPE_CHECKING:
    from envs import Task

PRECISIONS = ("auto", "fp32", "tf32", "bf16")  # dt_primal.precision
# the fields that take one of a few names
CHOICES = {
    "model": MODELS,
    "embed_init": EMBED_INITS,
    "timestep_init": TIMESTEP_INITS,
    "activation": ACTIVATIONS,
    "precision": PRECISIONS,
    "compile_mode": ("default", "max-autotune"),
    "optimizer": ("fused", "compiled"),
    "attention_kernel": ATTENTION_KERNELS,
}

# KSVD rank s of the paper's run script, per D4RL dataset (docs/method.md, "Hyper-parameters"; hopper-medium: 64).
PAPER_S = {
    ("halfcheetah", "medium"): 64,
    ("halfcheetah", "medium-replay"): 32,
    ("halfcheetah", "medium-expert"): 96,
    ("hopper", "medium"): 64,
    ("hopper", "medium-replay"): 64,
    ("hopper", "medium-expert"): 64,
    ("walker2d", "medium"): 96,
    ("walker2d", "medium-replay"): 96,
    ("walker2d", "medium-expert"): 96,
}
DEFAULT_S = 64
DEFAULT_MAX_EP_LEN = 1000  # timestep embedding rows for a task without an episode limit
# fields newer than some records (checkpoints, eval.json, throughput files), at the value every record written
# before them had: the model's MLP activation and timestep table (what it computes, also ModelConfig fields),
# the step's compile mode, optimizer and attention kernel and where intermediate evaluations ran (how it runs),
# and the share of the data trained on
ADDED_TO_MODEL = {"activation": "gelu", "timestep_init": "gpt2"}
ADDED_TO_STEP = {"compile_mode": "default", "optimizer": "fused", "attention_kernel": "sdpa", "eval_overlap": False}
ADDED_TO_DATA = {"top_percent": 100.0}
ADDED_LATER = {**ADDED_TO_MODEL, **ADDED_TO_STEP, **ADDED_TO_DATA}
# the ModelConfig fields that are not a Config field as it is
MODEL_ONLY_FIELDS = ("state_dim", "act_dim", "s", "max_ep_len")


def option(default, help: str):
    """A Config field whose ``--option`` has ``help`` (``add_config_args``), written once, here."""
    return field(default=default, metadata={"help": help})


@dataclass
class Config:
    # data
    dataset: str = option(
        "dt-primal/halfcheetah/medium-replay-v1",
        "the dataset (default dt-primal/halfcheetah/medium-replay-v1); train.py takes several whose models share "
        "an architecture, trained as one ensemble, each member on its own dataset (docs/ensembles.md)",
    )
    env: str | None = option(
        None,
        "evaluation task when the dataset's metadata names none: any registered Gymnasium id, or halfcheetah, "
        "hopper, walker2d",
    )
    download: bool = option(
        False,
        "fetch a hosted Minari dataset that is not present locally (through the Hugging Face hub; default off)",
    )
    top_percent: float = option(
        100.0,
        "train only on the best episodes by return, best first, until they hold this percent of the dataset's "
        "steps (default 100: all of it; with --model bc, the DT paper's %%BC); states are still normalised with "
        "the whole dataset's statistics",
    )
    # model (docs/method.md, "The model")
    model: str = option(
        "primal",
        "primal (default: Primal.+DT, its last block Causal Primal-Attention), dt (softmax only), primalformer "
        "(every block primal) or bc (behaviour cloning: the DT paper's MLP from the last K states, which ignores "
        "the target return; by default d_model 128 and lr 1e-4, as that paper's code)",
    )
    n_layer: int = 3
    d_model: int = 256
    n_head: int = 4
    context: int = option(20, "timesteps K the model sees (3K tokens; default 20)")
    dropout: float = 0.1
    activation: str = option(
        "relu",
        "the MLP activation of every block: relu (default: both papers' code, d3rlpy) or gelu (GPT-2's; what "
        "checkpoints without this field used)",
    )
    max_ep_len: int | None = option(None, "timestep embedding size (default: the task's episode limit, else 1000)")
    s: int | None = option(
        None,
        "KSVD rank of the primal attention (default: the paper's value for the dataset, else 64)",
    )
    eta: float = option(0.05, "weight of the KSVD loss (eq. 10; default 0.05)")
    embed_init: str = option(
        "torch",
        "initialisation of the return, state and action embeddings and the action head: torch (default: "
        "PyTorch's, as the DT paper's code and d3rlpy) or gpt2 (N(0, 0.02), as every other layer; "
        'docs/results.md, "Initialisation")',
    )
    timestep_init: str = option(
        "torch",
        "initialisation of the timestep embedding table: torch (default: N(0, 1), PyTorch's, as both papers' "
        "code) or gpt2 (N(0, 0.02), as d3rlpy; what checkpoints without this field used)",
    )
    # optimisation
    steps: int = 100_000
    batch_size: int = 64
    lr: float = 1e-3
    weight_decay: float = 1e-4
    warmup_steps: int = 10_000
    grad_clip: float = 0.25
    precision: str = option(
        "auto",
        "auto (default): bf16 autocast on CUDA, and on a CPU where a start-up measurement finds bf16 matrix "
        "products faster, else fp32 (evaluate.py: the run's own, but fp32 where bf16 is slow); fp32; tf32 (TF32 "
        'matrix products on CUDA); bf16 (autocast). docs/benchmarks.md, "Precision auto"',
    )
    compile: bool = option(
        False,
        "torch.compile the gather of the training windows with the members' loss, its backward following (default off)",
    )
    compile_mode: str = option(
        "default",
        "with --compile: default, or max-autotune (the compiler times its kernels' configurations; longer compiling)",
    )
    optimizer: str = option(
        "fused",
        "AdamW as fused (default: PyTorch's fused kernel) or compiled (the clipping, AdamW and the loss sums as "
        "one compiled function); the same update. python -m bench.step_variants ranks these on a GPU",
    )
    attention_kernel: str = option(
        "sdpa",
        "softmax attention through sdpa (default: PyTorch's fused kernels) or math (written out, for --compile to "
        "fuse); the same function",
    )
    cuda_graph: bool = option(
        True,
        "on CUDA, capture the training step once as a CUDA graph and replay it (default on)",
    )
    # returns and evaluation (docs/method.md, "Evaluation protocol")
    reward_scale: float = 1000.0
    targets: list[float] | None = option(
        None,
        "returns to condition on (default: the task's two for halfcheetah, hopper and walker2d; otherwise the "
        "dataset's best episode return and the middle of its episode returns' range, halfway between the worst "
        "and the best)",
    )
    ref_min: float | None = option(
        None,
        "reference return for a normalised score of 0 (default: the dataset's metadata, else D4RL's for "
        "halfcheetah, hopper and walker2d, else no normalised score); give with --ref-max",
    )
    ref_max: float | None = option(None, "reference return for a normalised score of 100; give with --ref-min")
    eval_every: int = 10_000
    eval_episodes_during: int = option(10, "episodes per target at each intermediate evaluation (default 10)")
    eval_episodes: int = option(100, "episodes per target at the final evaluation (default 100)")
    eval_overlap: bool = option(
        True,
        "intermediate evaluations beside training (default on): a copy of the step's weights evaluated in a "
        "thread while training goes on; the same scores as in line, on CUDA to rounding (--no-eval-overlap)",
    )
    # bookkeeping
    seed: int = 0
    device: str = option("auto", "auto (default: CUDA where there is a GPU, else the CPU), cpu, cuda or cuda:N")
    out: str = "runs/default"
    checkpoint_every: int = 10_000
    log_every: int = 200

    def resolved_s(self) -> int:
        """``s`` if set, else the paper's value for this dataset (the paper's run script), else 64."""
        if self.s is not None:
            return self.s
        from envs import find_task

        task = find_task(self.dataset)
        m = re.search(r"medium-replay|medium-expert|medium", self.dataset.lower().replace("_", "-"))
        return PAPER_S.get((task.name if task else None, m.group(0) if m else None), DEFAULT_S)

    @property
    def ref_scores(self) -> tuple[float, float] | None:
        return None if self.ref_min is None else (self.ref_min, self.ref_max)

    def resolved(self, task: Task) -> Config:
        """This config with ``s`` and ``max_ep_len`` resolved for ``task``, as checkpoints store them."""
        return dataclasses.replace(
            self, s=self.resolved_s(), max_ep_len=self.max_ep_len or task.time_limit or DEFAULT_MAX_EP_LEN
        )

    def unresolved(self) -> Config:
        """This config, resolved for its dataset, made ready for another: ``s`` and ``max_ep_len`` unset again
        where they are what ``resolved`` gives this dataset, kept where the run was given other values."""
        from envs import find_task

        unset = dataclasses.replace(self, s=None, max_ep_len=None)
        task = find_task(self.dataset)
        if task is None:
            return unset
        own = unset.resolved(task)
        return dataclasses.replace(
            unset,
            s=None if self.s == own.s else self.s,
            max_ep_len=None if self.max_ep_len == own.max_ep_len else self.max_ep_len,
        )

    @classmethod
    def from_record(cls, record: object) -> Config:
        """The run config a checkpoint or an exported policy stored: exactly this class's fields (the readers
        take the dict's values), valid; ValueError or UserError when it is not one. The step's fields added later
        and the data's (``ADDED_TO_STEP``, ``ADDED_TO_DATA``) are filled in; the model's only the checkpoint reader
        fills (every export records them)."""
        record = {**ADDED_TO_STEP, **ADDED_TO_DATA, **record} if isinstance(record, dict) else record
        return of_exact_fields(cls, record, "a run config").validate()

    def model_config(self, state_dim: int, act_dim: int) -> ModelConfig:
        """The architecture this run trains for observations of size ``state_dim`` and actions of size
        ``act_dim`` (``s`` and ``max_ep_len`` as ``resolved`` gives them, else their defaults)."""
        same = {f.name: getattr(self, f.name) for f in fields(ModelConfig) if f.name not in MODEL_ONLY_FIELDS}
        return ModelConfig(
            state_dim=state_dim,
            act_dim=act_dim,
            s=self.resolved_s(),
            max_ep_len=self.max_ep_len or DEFAULT_MAX_EP_LEN,
            **same,
        )

    def validate(self) -> Config:
        problems = []
        for name, choices in CHOICES.items():
            if getattr(self, name) not in choices:
                problems.append(
                    f"--{name.replace('_', '-')} must be one of {', '.join(choices)} (got {getattr(self, name)!r})"
                )
        if self.d_model <= 0 or self.n_head <= 0 or self.d_model % self.n_head:
            problems.append(f"--d-model ({self.d_model}) must be a positive multiple of --n-head ({self.n_head})")
        for name in (
            "n_layer",
            "context",
            "batch_size",
            "max_ep_len",
            "eval_every",
            "eval_episodes",
            "eval_episodes_during",
            "checkpoint_every",
            "log_every",
        ):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                problems.append(f"--{name.replace('_', '-')} must be at least 1 (got {getattr(self, name)})")
        if self.s is not None and self.s <= 0:
            problems.append(f"--s (KSVD rank) must be positive (got {self.s})")
        if self.steps < 0 or self.warmup_steps < 0:
            problems.append(f"--steps and --warmup-steps cannot be negative (got {self.steps}, {self.warmup_steps})")
        if self.targets is not None and len(self.targets) == 0:
            problems.append("--targets needs at least one return to condition on")
        if not re.fullmatch(r"auto|cpu|cuda(:[0-9]+)?", str(self.device)):
            problems.append(f"--device must be auto, cpu, cuda or cuda:N (got {self.device!r})")
        # one condition that must hold, so that NaN (which fails every comparison) fails it
        if not (
            0 <= self.dropout < 1
            and self.eta >= 0
            and self.lr > 0
            and self.weight_decay >= 0
            and self.grad_clip > 0
            and self.reward_scale > 0
        ):
            problems.append(
                "need 0 <= --dropout < 1, --eta >= 0, --lr > 0, --weight-decay >= 0, --grad-clip > 0 "
                "and --reward-scale > 0"
            )
        if not 0 < self.top_percent <= 100:
            problems.append(f"--top-percent must be above 0 and at most 100 (got {self.top_percent:g})")
        problems += _value_problems(self)
        if problems:
            raise UserError("Invalid configuration: " + "; ".join(problems) + ". Fix these options and run again.")
        return self


def _value_problems(cfg: Config) -> list[str]:
    """Validation beyond the ranges above: values that pass a comparison but still break a run (inf,
    empty strings, seeds NumPy cannot take)."""
    problems = []
    infinite = [name for name in ("lr", "eta", "weight_decay", "reward_scale") if math.isinf(float(getattr(cfg, name)))]
    if infinite:
        problems.append(f"{', '.join('--' + n.replace('_', '-') for n in infinite)} must be finite")
    if (cfg.ref_min is None) != (cfg.ref_max is None):
        problems.append("--ref-min and --ref-max go together (give both)")
    elif cfg.ref_min is not None and not (
        math.isfinite(cfg.ref_min) and math.isfinite(cfg.ref_max) and cfg.ref_min != cfg.ref_max
    ):
        problems.append(f"--ref-min and --ref-max must be finite and differ (got {cfg.ref_min:g}, {cfg.ref_max:g})")
    if cfg.targets is not None and not all(math.isfinite(t) for t in cfg.targets):
        problems.append(f"--targets must be finite returns (got {' '.join(f'{t:g}' for t in cfg.targets)})")
    problems += seed_problems([cfg.seed], "--seed")
    for name in ("dataset", "out") + (("env",) if cfg.env is not None else ()):
        if not str(getattr(cfg, name)).strip():
            problems.append(f"--{name} is empty")
        try:
            str(getattr(cfg, name)).encode("utf-8")
        except UnicodeEncodeError:
            problems.append(f"--{name} holds bytes that are not UTF-8 text ({getattr(cfg, name)!r}); rename it")
    huge = [
        f.name
        for f in fields(cfg)
        if f.type.startswith("int") and isinstance(getattr(cfg, f.name), int) and getattr(cfg, f.name) > MAX_COUNT
    ]
    if huge:
        problems.append(f"{', '.join('--' + n.replace('_', '-') for n in huge)} must be at most {MAX_COUNT:.0e}")
    return problems


MAX_SEED = 2**32 - 1  # NumPy's seeds are 32-bit


def seed_problems(seeds: list[int], option: str) -> list[str]:
    """The one check of seeds (``--seed``, ``--seeds``): they seed NumPy's generators, which take 0 to 2^32 - 1,
    each member its own."""
    bad = [s for s in seeds if not 0 <= s <= MAX_SEED]
    problems = [f"{option} must be between 0 and {MAX_SEED} (got {' '.join(map(str, bad))})"] if bad else []
    if len(set(seeds)) < len(seeds):
        problems.append(f"{option} lists a seed twice ({' '.join(map(str, seeds))}); give each seed once")
    return problems


MAX_COUNT = 10**15  # sizes and step counts beyond this are typing mistakes (10^26 overflows 64-bit counters)


# paper: the defaults (the Primal.+DT paper's, docs/method.md, "Hyper-parameters").
# quick: small settings for the newcomer's first run, minutes on a 2-core CPU instead of hours.
# dt-paper: the DT baseline as the original Decision Transformer paper trained it, the settings the
#   Primal.+DT paper's Table 4 compares with (its DT row is Flowformer's reproduction of DT): d_model 128,
#   1 head, lr 1e-4; K, batch, steps, warm-up and the rest as the defaults. `--model dt` at the defaults
#   is the matched baseline instead.
PRESETS = {
    "paper": {},
    "quick": dict(
        d_model=128,
        steps=2000,
        warmup_steps=200,
        eval_every=1000,
        eval_episodes_during=5,
        eval_episodes=10,
        checkpoint_every=500,
    ),
    "dt-paper": dict(model="dt", d_model=128, n_head=1, lr=1e-4),
}
# a model's own defaults, under any preset: BC's are the DT paper's code's (its hidden width and learning rate;
# K, layers, dropout, batch, steps, warm-up and weight decay as the defaults)
MODEL_DEFAULTS = {"bc": dict(d_model=128, lr=1e-4)}


def add_config_args(parser: argparse.ArgumentParser, only: tuple[str, ...] | None = None) -> None:
    """One ``--field-name`` option per Config field (or per field in ``only``); defaults are left
    unset (None) so that presets and checkpoints can tell what the user really asked for."""
    for f in fields(Config):
        if only is not None and f.name not in only:
            continue
        # --s has an alias: torchrun's own argument parser refuses --s as an ambiguous abbreviation
        flags = ["--" + f.name.replace("_", "-")] + (["--ksvd-rank"] if f.name == "s" else [])
        if f.type == "bool":
            parser.add_argument(
                *flags,
                action=argparse.BooleanOptionalAction,
                default=None,
                help=f.metadata.get("help", f"default {'on' if f.default else 'off'}"),
            )
        elif f.name == "dataset":
            parser.add_argument(
                *flags,
                nargs="+",
                default=None,
                help=f.metadata["help"],
            )
        elif f.name == "targets":
            parser.add_argument(
                *flags,
                type=float,
                nargs="+",
                default=None,
                help=f.metadata["help"],
            )
        elif f.name in CHOICES:
            parser.add_argument(
                *flags, choices=CHOICES[f.name], default=None, help=f.metadata.get("help", f"default {f.default}")
            )
        else:
            kind = {"int": int, "float": float}.get(f.type.replace(" | None", ""), str)
            parser.add_argument(*flags, type=kind, default=None, help=f.metadata.get("help", f"default {f.default}"))


def overrides(args: argparse.Namespace) -> dict:
    """The Config fields the user set on the command line; of several ``--dataset``, the first."""
    names = {f.name for f in fields(Config)}
    given = {k: v for k, v in vars(args).items() if k in names and v is not None}
    if isinstance(given.get("dataset"), list):
        given["dataset"] = given["dataset"][0]
    return given


def make_config(preset: str = "paper", **changes) -> Config:
    if preset not in PRESETS:
        raise UserError(f"Unknown preset {preset!r}: choose one of {', '.join(PRESETS)}.")
    model = changes.get("model", PRESETS[preset].get("model", Config.model))
    return dataclasses.replace(Config(), **{**MODEL_DEFAULTS.get(model, {}), **PRESETS[preset], **changes}).validate()
