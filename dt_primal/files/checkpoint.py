"""Checkpoint I/O. A checkpoint (``DIR/last.pt``) is one seed's run, self-describing: its weights and
their architecture (``ModelConfig``, every field resolved), the run's config, the task (its
environment, reference scores and targets), the normalisation statistics and, for ``--resume``, its
AdamW moments and random generator states, and the weights of an intermediate evaluation that ran
beside training unrecorded when it was written. A member of an ensemble writes the same file as a run of
that seed alone, so either can evaluate or resume it.

The file holds tensors and plain data only (``torch.save``; read with ``dt_primal.files.torch_archive``, which
runs no code), and its format version: 2 since 2026-11-25. Format 1 files (no version; NumPy arrays
and NumPy's generator state as a tuple) are read through the same allow-list and upgraded as they load.
"""

from __future__ import annotations

import dataclasses
import os
import random
from pathlib import Path

import numpy as np
import torch

from dt_primal.config import ADDED_LATER, ADDED_TO_MODEL, Config
from dt_primal.errors import UserError
from dt_primal.files.reading import acts_finite, is_count
from dt_primal.files.run_folder import PREVIOUS
from dt_primal.files.torch_archive import load_torch
from dt_primal.files.writing import write_beside
from dt_primal.model.architecture import ModelConfig
from dt_primal.model.build import build_model
from dt_primal.model.members import stack_members

FORMAT = 2
CHECKPOINT_KEYS = {"format", "model", "model_config", "config", "state_mean", "state_std", "task", "step", "dataset"}
TRAINING_STATE_KEYS = {"optimizer", "rng"}  # needed by --resume only
# read by --resume only, in a checkpoint written while an evaluation ran beside training (``pending_evaluation``)
PENDING = "pending_evaluation"
FORMAT_1_KEYS = {"model", "config", "state_mean", "state_std", "task", "obs_dim", "act_dim", "step", "dataset"}


def plain(value):
    """``value`` as a checkpoint stores it: NumPy arrays as tensors and NumPy numbers as Python's,
    inside dicts, lists and tuples."""
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value.copy())
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(plain(v) for v in value)
    return value


def member_checkpoint(
    *,
    model: dict,
    optimizer: dict,
    step: int,
    rng: dict,
    config: Config,
    task,
    state_mean: np.ndarray,
    state_std: np.ndarray,
    dataset: str,
    model_config: ModelConfig,
    pending: tuple[int, dict] | None = None,
) -> dict:
    """One member's checkpoint, as ``save_checkpoints`` writes it (its ``format`` added there): the keys
    ``CHECKPOINT_KEYS`` and ``TRAINING_STATE_KEYS`` that ``read_checkpoint`` and ``load_checkpoint`` read, and
    ``pending``, the step and member weights of an evaluation running beside training, not yet recorded."""
    return {
        **({PENDING: {"step": pending[0], "model": pending[1]}} if pending else {}),
        "model": model,
        "optimizer": optimizer,
        "step": step,
        "rng": rng,
        "config": dataclasses.asdict(config),
        "task": dataclasses.asdict(task),
        "state_mean": state_mean,
        "state_std": state_std,
        "dataset": dataset,
        "model_config": dataclasses.asdict(model_config),
    }


def _write(path: Path, payload: dict) -> Path:
    """``payload`` written beside ``path`` and flushed to disk (``write_beside``); returns where."""

    def save(f) -> None:
        try:
            torch.save(plain({**payload, "format": FORMAT}), f)
        except RuntimeError as exc:  # the archive writer's failed write (a full disk, a file-size limit)
            raise OSError(str(exc).splitlines()[0]) from exc

    return write_beside(path, save, "The checkpoint")


def save_checkpoints(paths: list[Path], payloads: list[dict]) -> None:
    """Write every member's checkpoint so that a crash, a kill or a full disk at any moment loses
    nothing: all new files are written first, then each replaces its old one by a rename; with several
    members each old one is kept as ``prev.pt`` until all are renamed (``load_members`` falls back
    to it)."""
    tmps, existed = [], [path.exists() for path in paths]
    try:
        for path, payload in zip(paths, payloads):
            tmps.append(_write(path, payload))
        for path in paths if len(paths) > 1 else ():
            if path.exists():
                os.link(path, path.with_name(PREVIOUS + ".tmp"))
                os.replace(path.with_name(PREVIOUS + ".tmp"), path.with_name(PREVIOUS))
        for tmp, path in zip(tmps, paths):
            os.replace(tmp, path)
        for path in paths:
            path.with_name(PREVIOUS).unlink(missing_ok=True)
    except OSError as exc:
        kept = "the previous one is intact" if any(existed) else "no earlier checkpoint was there"
        raise UserError(
            f"Could not write the checkpoint {paths[0] if len(paths) == 1 else paths} ({exc}); {kept}. Free disk "
            f"space or fix the folder's permissions, then continue with --resume."
        ) from exc
    finally:
        for leftover in tmps + [path.with_name(PREVIOUS + ".tmp") for path in paths]:
            leftover.unlink(missing_ok=True)


def read_checkpoint(path: str | os.PathLike) -> dict:
    """The checkpoint at ``path`` as this version writes it, with the normalisation statistics as NumPy
    arrays, checked for what acting with its model needs; read on the CPU without running code, with
    torch and NumPy only. Every problem is a UserError that says what to do."""
    try:
        ckpt = load_torch(path)
    except UserError:
        raise
    except Exception as exc:
        raise UserError(
            f"Checkpoint {path} cannot be read ({type(exc).__name__}: {str(exc).splitlines()[0]}); it is "
            f"truncated or corrupted. Use an earlier copy or retrain."
        ) from exc
    keys = set(ckpt if isinstance(ckpt, dict) else ())
    if "format" not in keys and FORMAT_1_KEYS <= keys:
        ckpt = _upgrade(ckpt, path)
    missing = sorted(CHECKPOINT_KEYS - set(ckpt if isinstance(ckpt, dict) else ()))
    if missing:
        raise UserError(
            f"{path} is not a dt-primal checkpoint (it lacks {', '.join(missing)}); give a DIR/last.pt "
            f"written by train.py."
        )
    if ckpt["format"] != FORMAT:
        raise UserError(
            f"{path} has checkpoint format {ckpt['format']}, which this version of dt-primal (format "
            f"{FORMAT}) cannot read; use the version that wrote it."
        )
    for part, later in (("model_config", ADDED_TO_MODEL), ("config", ADDED_LATER)):
        if isinstance(ckpt[part], dict):
            ckpt[part] = {**later, **ckpt[part]}
    try:
        arch = ModelConfig.from_record(ckpt["model_config"])
        ckpt["state_mean"], ckpt["state_std"] = (
            np.asarray(ckpt[k], np.float32).reshape(arch.state_dim) for k in ("state_mean", "state_std")
        )
    except (TypeError, ValueError) as exc:
        raise UserError(
            f"{path} was written by an incompatible version of dt-primal or is damaged ({exc}). Use "
            f"the version that wrote it, or retrain."
        ) from exc
    _check_values(ckpt, path)
    return ckpt


def _check_values(ckpt: dict, path) -> None:
    """What acting needs of the values: a step count, finite weights, and statistics and a reward scale that stay
    finite in float32 (``acts_finite``: a NaN or a zero there turns every action into NaN)."""
    step = ckpt["step"]
    if not is_count(step):
        raise UserError(
            f"{path} is damaged: its step is {str(step)[:40]!r}, not a count. Use an earlier copy or retrain."
        )
    bad = _nonfinite(ckpt["model"])
    if bad is None:
        raise UserError(f"{path} is damaged: its model is not a set of named tensors. Use an earlier copy or retrain.")
    if bad:
        raise UserError(
            f"{path} holds NaN or infinite weights ({', '.join(bad[:3])}), so every action would be NaN: "
            f"the run diverged or the file is damaged. Use an earlier checkpoint or retrain."
        )
    mean, std = ckpt["state_mean"], ckpt["state_std"]
    scale = ckpt["config"].get("reward_scale") if isinstance(ckpt["config"], dict) else None
    if not acts_finite(mean, std, scale):
        raise UserError(
            f"{path} holds observation statistics or a reward scale that acting in float32 cannot use (state_std "
            f"min {np.nanmin(std) if std.size else 0:g}, reward_scale {str(scale)[:40]}: not finite, not positive, "
            f"or so small that dividing by it overflows), which would make every action NaN; the file is "
            f"damaged. Use an earlier copy or retrain."
        )


def _nonfinite(weights: object) -> list[str] | None:
    """The names of ``weights``' floating tensors holding a NaN or an infinity; None when ``weights`` is not a
    dict of named tensors."""
    if not isinstance(weights, dict) or not all(isinstance(w, torch.Tensor) for w in weights.values()):
        return None
    return [k for k, w in weights.items() if w.is_floating_point() and not torch.isfinite(w).all()]


def _check_training_state(ckpt: dict, path) -> None:
    """The random generators' states a continued run restores, tried on fresh generators first."""
    try:
        state = ckpt["rng"]
        s = state["numpy"]
        np.random.RandomState().set_state(
            (s["bit_generator"], s["key"].numpy().astype(np.uint32), s["pos"], s["has_gauss"], s["gauss"])
        )
        random.Random().setstate(state["python"])
        torch.Generator().set_state(state["torch"])
        sampler = state["sampler"]  # the sampler's generator lives on the training device (CUDA: 16 bytes)
        if not (isinstance(sampler, torch.Tensor) and sampler.dtype == torch.uint8 and sampler.dim() == 1):
            raise TypeError("the sampler's generator state is not a byte tensor")
        if not all(isinstance(c, torch.Tensor) for c in state["cuda"]):
            raise TypeError("the CUDA generators' states are not tensors")
    except Exception as exc:  # the file's values, whatever they are
        raise UserError(
            f"The training state in {path} is damaged ({type(exc).__name__}: {str(exc)[:160]}); evaluate "
            f"it with evaluate.py, or start a new run with another --out."
        ) from None


def load_checkpoint(path: str | os.PathLike, resume: bool = False) -> dict:
    """``read_checkpoint``, checked also for what evaluation (and, with ``resume``, a continued run)
    needs: the run's config and task."""
    from gymnasium.error import Error as GymError  # Gymnasium and MuJoCo: acting with a model does not need them

    from envs import Task

    ckpt = read_checkpoint(path)
    if resume and not TRAINING_STATE_KEYS <= set(ckpt):
        raise UserError(
            f"{path} is not a dt-primal checkpoint that can be resumed (it lacks "
            f"{', '.join(sorted(TRAINING_STATE_KEYS - set(ckpt)))}); give a DIR/last.pt written by train.py."
        )
    if resume and not (isinstance(ckpt["optimizer"], dict) and "exp_avg" in ckpt["optimizer"]):
        raise UserError(
            f"{path} was written by an earlier version of dt-primal, whose optimizer state this one "
            f"cannot continue; evaluate it with evaluate.py, or resume it with the version that wrote it."
        )
    if resume:
        _check_training_state(ckpt, path)
    try:
        Config.from_record(ckpt["config"])
        Task.from_record(ckpt["task"])
    except (TypeError, ValueError, KeyError, UserError, GymError) as exc:
        raise UserError(
            f"{path} was written by an incompatible version of dt-primal or is damaged ({exc}). Use "
            f"the version that wrote it, or retrain."
        ) from exc
    return ckpt


def pending_evaluation(ckpts: list[dict], where) -> tuple[int, list[dict]] | None:
    """The step and the members' weights of the intermediate evaluation that ran beside training, unrecorded,
    when the members' checkpoints (``load_members``) were written; None when none ran. Checked: one step for
    all, not after the checkpoints' own, and finite weights."""
    pending = [c.get(PENDING) for c in ckpts]
    if all(p is None for p in pending):
        return None
    ok = all(isinstance(p, dict) and is_count(p.get("step")) and _nonfinite(p.get("model")) == [] for p in pending)
    step = pending[0]["step"] if ok else None
    if not ok or any(p["step"] != step for p in pending) or not 0 < step <= ckpts[0]["step"]:
        raise UserError(
            f"The training state in {where} is damaged (its unrecorded evaluation is not one of a step it trained, "
            f"with finite weights); evaluate it with evaluate.py, or start a new run with another --out."
        )
    return step, [p["model"] for p in pending]


def _upgrade(ckpt: dict, path: str | os.PathLike) -> dict:
    """A format 1 checkpoint (written before 2026-11-25) in format 2."""
    try:
        ckpt["model_config"] = _older_model_config(ckpt)
        if isinstance(ckpt.get("rng", {}).get("numpy"), tuple):
            ckpt["rng"]["numpy"] = _numpy_state(ckpt["rng"]["numpy"])
    except (TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:
        raise UserError(
            f"{path} was written by an earlier version of dt-primal and is damaged ({type(exc).__name__}: "
            f"{exc}). Use an earlier copy or retrain."
        ) from exc
    return {**{k: v for k, v in ckpt.items() if k not in ("obs_dim", "act_dim")}, "format": FORMAT}


def _older_model_config(ckpt: dict) -> dict:
    """The architecture of a checkpoint written before checkpoints stored it: from its config, its
    sizes and, for fields its config left unresolved, its weights' shapes; the config gets them too,
    so that --resume continues with them; fields it predates take their values then (``config.ADDED_LATER``)."""
    cfg, weights = ckpt["config"], ckpt["model"]
    for name, value in ADDED_LATER.items():
        cfg.setdefault(name, value)
    if cfg["s"] is None:  # the KSVD rank is Λ's width; a softmax-only model has no rank (any value builds it)
        cfg["s"] = next((v.shape[-1] for k, v in weights.items() if k.endswith("attn.Lambda")), 64)
    if cfg["max_ep_len"] is None:
        cfg["max_ep_len"] = weights["embed_timestep.weight"].shape[0]
    own = {"state_dim": ckpt["obs_dim"], "act_dim": ckpt["act_dim"]}
    return {**own, **{f.name: cfg[f.name] for f in dataclasses.fields(ModelConfig) if f.name not in own}}


def load_members(paths: list[Path]) -> list[dict]:
    """The checkpoints of an ensemble's members for ``--resume``, all at one step: a member whose
    ``last.pt`` is newer than the others' (the run stopped while renaming) continues from its
    ``prev.pt``."""
    ckpts = [load_checkpoint(p, resume=True) for p in paths]
    step = min(c["step"] for c in ckpts)
    for i, (path, ckpt) in enumerate(zip(paths, ckpts)):
        prev = path.with_name(PREVIOUS)
        if ckpt["step"] != step and prev.exists():
            ckpts[i] = load_checkpoint(prev, resume=True)
    if len({c["step"] for c in ckpts}) > 1:
        steps = ", ".join(f"{p.parent.name}: {c['step']}" for p, c in zip(paths, ckpts))
        raise UserError(
            f"The seeds' checkpoints are at different steps ({steps}), so they cannot continue as one "
            f"ensemble; resume each alone with --seed N --out DIR/seed_N --resume."
        )
    return ckpts


def model_from_checkpoints(ckpts: list[dict], device: torch.device | str = "cpu") -> torch.nn.Module:
    """The checkpoints' models, with their weights, as the members of one model (``dt_primal.model.members``);
    they share the first one's architecture."""
    cfg = ModelConfig.from_record(ckpts[0]["model_config"])
    try:
        return stack_members(lambda n: build_model(cfg, members=n), [c["model"] for c in ckpts], device)
    except (RuntimeError, TypeError, AttributeError, KeyError) as exc:
        raise UserError(
            f"The checkpoint's weights do not fit a '{cfg.model}' model with d_model {cfg.d_model}, "
            f"{cfg.n_layer} layers and {cfg.n_head} heads (its config disagrees with its weights: "
            f"{str(exc).splitlines()[0]}). The file is incompatible or damaged."
        ) from exc


def model_from_checkpoint(ckpt: dict, device: torch.device | str = "cpu") -> torch.nn.Module:
    """The checkpoint's model (one member), with its weights."""
    return model_from_checkpoints([ckpt], device)


def rng_state(gen: torch.Generator) -> dict:
    """The process's random generators and a member's batch generator ``gen``, as tensors and plain data."""
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": _numpy_state(np.random.get_state()),
        "python": random.getstate(),
        "sampler": gen.get_state(),
    }


def _numpy_state(state: tuple) -> dict:
    """NumPy's legacy generator state (``np.random.get_state()``) as plain data and a tensor."""
    name, key, pos, has_gauss, gauss = state
    return {
        "bit_generator": str(name),
        "key": torch.from_numpy(np.asarray(key, np.int64)),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "gauss": float(gauss),
    }


def set_rng_state(state: dict, gen: torch.Generator) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"]:
        torch.cuda.set_rng_state_all(state["cuda"])
    s = state["numpy"]
    np.random.set_state((s["bit_generator"], s["key"].numpy().astype(np.uint32), s["pos"], s["has_gauss"], s["gauss"]))
    random.setstate(state["python"])
    if state["sampler"].numel() != gen.get_state().numel():  # a CUDA generator's state is 16 bytes, a CPU one's 5056
        raise ValueError(
            f"its batch generator is not one of a {gen.device.type.upper()} run: resume it on the kind of device "
            f"it was trained on"
        )
    gen.set_state(state["sampler"])
