"""--resume: a run continues only as itself, from every member's checkpoint or from none, with only the
options it may change, and on the data it started on.

That data is checked two ways: ``dataset.json`` in each member's folder records the size of the data and a
hash of every array (``record_dataset``, when the run starts), so that data changed since then is refused
even at the same size; a checkpoint's own sizes and observation mean (``check_same_dataset``) catch what
the record cannot, a run written without one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import numpy as np

from dt_primal.config import Config
from dt_primal.data import Trajectories
from dt_primal.errors import UserError
from dt_primal.files.reading import read_json
from dt_primal.files.run_folder import CHECKPOINT, DATASET_RECORD, SEED_FOLDERS, RunFolder, cannot_write, seed_of
from dt_primal.files.writing import write_file

# what --resume may change; every other option is the run's own (architecture, optimisation, returns)
CHANGEABLE_ON_RESUME = (
    "steps",
    "eval_every",
    "eval_episodes",
    "eval_episodes_during",
    "checkpoint_every",
    "log_every",
    "device",
    "out",
    "targets",
    "compile",
    "compile_mode",
    "optimizer",
    "attention_kernel",
    "cuda_graph",
    "eval_overlap",
    "precision",
    "dataset",
    "env",
    "download",
    "ref_min",
    "ref_max",
)


def check_unchanged(saved: Config, cfg: Config, path: Path) -> None:
    """--resume continues a run with its own settings: an option it cannot change is refused."""
    changed = [
        f"--{f.name.replace('_', '-')} {getattr(cfg, f.name)} (the run has {getattr(saved, f.name)})"
        for f in dataclasses.fields(Config)
        if f.name not in CHANGEABLE_ON_RESUME and getattr(cfg, f.name) != getattr(saved, f.name)
    ]
    if changed:
        raise UserError(
            f"--resume cannot change {', '.join(changed)}: {path} continues with the settings it was "
            f"started with. Leave these options out to continue it, or choose another --out to start a new "
            f"run with them (only {', '.join('--' + n.replace('_', '-') for n in CHANGEABLE_ON_RESUME[:7])} "
            f"and the data source may change)."
        )


def check_steps_left(step: int, steps: int, where: Path) -> None:
    """--resume of a run already past --steps has nothing to train: refused; one exactly at --steps
    only runs the final evaluation (a run stopped during it), which is said."""
    if step > steps:
        raise UserError(
            f"{where} is already at step {step}, past --steps {steps}: there is nothing to train. Give "
            f"--steps above {step} to train it further, or evaluate it with evaluate.py."
        )
    if step == steps:
        print(
            f"--resume: {where} is already at step {step} = --steps; nothing to train, only the final evaluation "
            f"runs (give a larger --steps to train further)"
        )


def resuming(lasts: list[Path], cfg: Config, seeds: list[int] | None, resume: bool) -> bool:
    """Whether the run continues from checkpoints (``resume`` and every member has one); refuses to start
    over an existing run, and to resume only some members."""
    found = [last.exists() for last in lasts]
    if not resume and any(found):
        held = next(last for last, f in zip(lasts, found) if f)
        raise UserError(
            f"{held.parent} already holds a run ({held}); pass --resume to continue it, or choose another "
            f"--out (or delete that folder) to start again."
        )
    if resume and any(found) and not all(found):
        raise UserError(
            f"Only some seeds of {cfg.out} have a checkpoint "
            f"({', '.join(str(last) for last, f in zip(lasts, found) if f)}); "
            f"resume those with --seeds listing them, and train the others in another run."
        )
    listed = [seed_of(p.parent) for p in Path(cfg.out).glob(f"{SEED_FOLDERS}/{CHECKPOINT}")]
    listed = sorted(s for s in listed if s is not None)
    if resume and not seeds and not any(found) and listed:
        names = " ".join(map(str, listed))
        raise UserError(f"{cfg.out} holds the seeds {names} of an ensemble; resume them with --seeds {names}.")
    if resume and not any(found):
        print(f"--resume: no checkpoint in {cfg.out}, starting from scratch")
    return resume and all(found)


def fingerprint(data: Trajectories) -> dict:
    """The size of ``data`` and a hash of every array of it."""
    h = hashlib.blake2b(digest_size=16)
    for a in (data.observations, data.actions, data.rewards, data.lengths, data.terminals):
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.data)
    return {
        "source": data.source,
        "steps": int(len(data.rewards)),
        "episodes": int(len(data.lengths)),
        "hash": h.hexdigest(),
    }


def check_same_dataset(ckpt: dict, data: Trajectories, path: Path) -> None:
    """A run continues on the data it was trained on (same sizes and observation mean)."""
    arch = ckpt["model_config"]
    same = (arch["state_dim"], arch["act_dim"]) == (data.obs_dim, data.act_dim) and np.allclose(
        data.observations.mean(0), ckpt["state_mean"], rtol=1e-5, atol=1e-6
    )
    if not same:
        raise UserError(
            f"{path} was trained on {ckpt['dataset']}, but this run loaded {data.source}, which holds "
            f"other data. Resume with --dataset {ckpt['dataset']}, or choose another --out to start a "
            f"new run."
        )


def recorded_dataset(record: Path) -> dict | None:
    """A member's ``dataset.json`` (with its data's ``hash``), or None where it is missing or damaged (on
    resume: then written anew)."""
    if not record.exists():
        return None
    try:
        then = read_json(record, "The dataset record", "", limit=64 << 10)
    except UserError:
        return None
    return then if isinstance(then, dict) and then.get("hash") is not None else None


def record_dataset(folder: RunFolder, data: Trajectories | list[Trajectories], resume: bool) -> None:
    """Refuse to continue (``resume``) a member whose recorded dataset differs from its data (``data``,
    or one per dataset of the run); record it where a run starts (and where a run written without
    the record continues)."""
    if not folder.enabled:
        return
    datas = data if isinstance(data, list) else [data]
    prints = [fingerprint(d) for d in datas]
    per_dataset = len(folder.members) // len(datas)
    for i, member in enumerate(folder.members):
        data, now = datas[i // per_dataset], prints[i // per_dataset]
        record = member / DATASET_RECORD
        if (member / CHECKPOINT).exists():
            if not resume:
                continue  # training refuses to start over an existing run
            then = recorded_dataset(record)
            if then is not None and then["hash"] == now["hash"]:
                continue
            if then is not None:
                same = (then.get("steps"), then.get("episodes")) == (now["steps"], now["episodes"])
                size = f"{now['steps']} steps in {now['episodes']} episodes" + (
                    ", as many as when the run started, but other values"
                    if same
                    else f", where the run started on {then.get('steps')} steps in {then.get('episodes')} episodes"
                )
                raise UserError(
                    f"The dataset {data.source} changed since the run in {member} started: it now holds {size} "
                    f"({record} records what the run trained on), so --resume would continue on other data. "
                    f"Restore the data the run started with, or start a new run with another --out."
                )
        try:
            write_file(record, json.dumps(now, indent=1), "The dataset record")
        except OSError as exc:
            raise cannot_write(member, exc) from None
