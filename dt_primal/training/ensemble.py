"""A run's ensemble: which dataset and seed each member trains, with its config, folder and
normalisation; which datasets can share an ensemble; a fresh model of all of them."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import numpy as np
import torch

from dt_primal.config import Config
from dt_primal.data import Trajectories
from dt_primal.errors import UserError
from dt_primal.files.run_folder import CHECKPOINT, member_folders
from dt_primal.model.architecture import ModelConfig, evaluation_targets, has_ksvd
from dt_primal.model.build import build_model
from dt_primal.model.members import member_state, stack_members
from dt_primal.training.checks import check_env_matches
from envs import Task


@dataclasses.dataclass
class Member:
    """One (dataset, seed) of an ensemble: its data, its config (``dataset``, ``seed``, ``out`` and the
    resolved architecture fields its own), task, conditioning targets, folder and normalisation."""

    index: int  # of its dataset among the run's
    data: Trajectories
    cfg: Config
    task: Task
    folder: Path
    state_mean: np.ndarray | None = None
    state_std: np.ndarray | None = None

    @property
    def targets(self) -> list[float | None]:
        return evaluation_targets(self.cfg.model, self.cfg.targets or self.task.targets)

    @property
    def last(self) -> Path:
        return self.folder / CHECKPOINT


def architecture(sizes: tuple[int, int], task: Task, cfg: Config) -> tuple:
    """What a dataset's model and evaluation depend on beyond the run's options, for ``cfg`` resolved
    for its ``task``: observation and action ``sizes``, episode length, the KSVD rank (resolved per
    dataset; of no matter without primal layers) and the number of targets. Datasets that agree on
    it train as one ensemble; the tasks themselves may differ (docs/ensembles.md)."""
    targets = evaluation_targets(cfg.model, cfg.targets or task.targets)
    return tuple(sizes), cfg.max_ep_len, cfg.s if has_ksvd(cfg.model) else None, len(targets)


def model_config(m: Member) -> ModelConfig:
    """Member m's architecture (all members' agree, ``ensemble_members`` checks; a softmax-only model's
    rank ``s`` is its dataset's, though no weight depends on it)."""
    return m.cfg.model_config(m.data.obs_dim, m.data.act_dim)


def ensemble_members(cfg: Config, datasets: dict[str, Trajectories], seeds: list[int] | None) -> list[Member]:
    """The members of a run, dataset by dataset and seed by seed, in their folders (``member_folders``).
    Datasets whose ``architecture`` differs cannot share an ensemble: a UserError says to train them apart."""
    several = len(datasets) > 1  # then the folders are OUT/DATASET/MODEL/seed_N, also for one seed
    folders = iter(member_folders(Path(cfg.out), seeds or ([cfg.seed] if several else None), list(datasets), cfg.model))
    members = [
        Member(i, data, dataclasses.replace(cfg, dataset=spec, seed=seed).resolved(data.task), data.task, next(folders))
        for i, (spec, data) in enumerate(datasets.items())
        for seed in seeds or [cfg.seed]
    ]
    for m in members:
        m.cfg = dataclasses.replace(m.cfg, out=str(m.folder))
    for data in datasets.values():
        check_env_matches(data, data.task)
    first = members[0]
    key = lambda m: architecture((m.data.obs_dim, m.data.act_dim), m.task, m.cfg)
    odd = [m for m in members if key(m) != key(first)]
    if odd:
        (a, *_), (b, *_) = key(odd[0]), key(first)
        raise UserError(
            f"{odd[0].cfg.dataset} and {first.cfg.dataset} cannot train as one ensemble: their models differ "
            f"(observation and action sizes {a} and {b}, KSVD rank s {odd[0].cfg.s} and {first.cfg.s}, "
            f"episode length {odd[0].cfg.max_ep_len} and {first.cfg.max_ep_len}) or their numbers of "
            f"targets do. Train them in separate runs (python -m commands.sweep groups the datasets that "
            f"can share one)."
        )
    return members


def fresh_model(cfg: ModelConfig, seeds: list[int], device: torch.device | str) -> torch.nn.Module:
    """A model of ``len(seeds)`` members, member m initialised as a run of ``seeds[m]`` alone (a model
    of one member built after seeding Python, NumPy and torch with it). Leaves the process's
    generators seeded by the last seed (dropout draws from them)."""
    build = lambda n: build_model(cfg, members=n)
    states = []
    for seed in seeds:
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        states.append(member_state(build(1).to(device), 0))
    return stack_members(build, states, device)
