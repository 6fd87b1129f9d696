"""Checks of ``evaluate.py``'s inputs, made before anything is evaluated, and those every evaluation
shares with training: targets the model can be conditioned on, and episodes that fit in memory at
once. A problem is a ``UserError`` that says what is wrong and what to do.

  check_evaluate_args(args)             right after its arguments are parsed
  check_evaluate_run(args, ckpts)       once the checkpoints are loaded
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from dt_primal.config import Config
from dt_primal.errors import UserError
from dt_primal.evaluation.reports import REPORT_TABLE_HEAD
from dt_primal.evaluation.video import check_folder
from dt_primal.files.reading import read_json
from dt_primal.files.run_folder import check_no_links
from dt_primal.machine import check_device, gib, gpu_index, memory_bytes, on_gpu
from envs import Task, TaskLimits

# A conditioning return (a target or a return-to-go divided by --reward-scale) goes through a linear
# embedding and a layer norm whose squares overflow float32 from about 1e19 on (every action is then
# NaN); 1e9 leaves a wide margin and is far beyond any meaningful return of these tasks.
SCALED_RETURN_LIMIT = 1e9

# What one evaluation episode costs besides its buffers: a MuJoCo environment (about 1.1 MB measured
# for Hopper-v5 and HalfCheetah-v5) and its share of the bookkeeping.
ENV_BYTES = 2 << 20


def check_targets(targets: list[float], reward_scale: float) -> None:
    """Targets the model can be conditioned on (finite ones: ``Config.validate``, ``envs.Task``): within
    ±SCALED_RETURN_LIMIT once divided by --reward-scale (beyond that the return embedding overflows
    float32 and every return is NaN)."""
    huge = [t for t in targets if not abs(t / reward_scale) <= SCALED_RETURN_LIMIT]
    if huge:
        raise UserError(
            f"--targets {' '.join(f'{t:g}' for t in huge)} divided by --reward-scale {reward_scale:g} gives "
            f"a conditioning return of {huge[0] / reward_scale:.3g}, beyond the ±{SCALED_RETURN_LIMIT:.0e} "
            f"the model's float32 arithmetic handles safely (from about 1e19 on its return embedding "
            f"overflows and every result is NaN). Give targets near the returns the task can reach."
        )


def check_evaluation_memory(
    episodes: int, context: int, obs_dim: int, act_dim: int, device: str, what: str, fix: str
) -> None:
    """All evaluation episodes run at once: an environment each and buffers of their last ``context``
    steps on the device. Refuse a count that cannot fit in this machine's memory (or its GPU's)."""
    buffers = episodes * context * (obs_dim + act_dim + 1) * 4
    host = episodes * ENV_BYTES
    gpu = on_gpu(device)
    problems = []
    ram = memory_bytes()
    if ram and host + (0 if gpu else buffers) > ram:
        problems.append(
            f"about {gib(host + (0 if gpu else buffers))} of memory for their environments"
            f"{'' if gpu else ' and buffers'}, more than this machine's {gib(ram)}"
        )
    if gpu and torch.cuda.is_available():
        total = torch.cuda.get_device_properties(gpu_index(device)).total_memory
        if buffers > total:
            problems.append(f"{gib(buffers)} of GPU memory for their buffers, more than the GPU's {gib(total)}")
    if problems:
        raise UserError(
            f"The evaluation would run {episodes:,} episodes at once ({what}), which needs "
            f"{' and '.join(problems)}. {fix}"
        )


def _is_report(path: Path) -> bool:
    """Whether ``path`` holds a report that evaluate.py wrote (which it may replace)."""
    try:
        return "across_checkpoints" in read_json(path, "The report", "", limit=256 << 20)
    except (UserError, TypeError):
        return False


def _is_report_table(path: Path) -> bool:
    """Whether ``path`` holds a Markdown table that evaluate.py wrote (which it may replace)."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.readline(4096).rstrip("\n") == REPORT_TABLE_HEAD
    except (OSError, UnicodeDecodeError):
        return False


def check_video_args(args) -> None:
    """``--video DIR``, ``--video-episodes N`` (1 to --episodes) and ``--side-by-side`` (needs --video)."""
    if not 1 <= args.video_episodes <= args.episodes:
        raise UserError(
            f"--video-episodes must be between 1 and --episodes {args.episodes} (got {args.video_episodes})."
        )
    if args.side_by_side and args.video is None:
        raise UserError("--side-by-side puts rendered episodes side by side: give --video DIR too.")
    check_folder(args.video)


def check_evaluate_args(args) -> None:
    """evaluate.py's options, before any checkpoint is loaded: ``args`` has ``checkpoints, episodes,
    out, env_workers`` and optionally ``targets, seed, device, precision``."""
    if args.episodes < 1:
        raise UserError(f"--episodes must be at least 1 (got {args.episodes}).")
    check_video_args(args)
    if args.env_workers is not None and args.env_workers < 1:
        raise UserError(f"--env-workers must be at least 1 (got {args.env_workers}); leave it out for the default.")
    names = ("device", "precision", "seed", "targets")
    given = {k: getattr(args, k) for k in names if getattr(args, k, None) is not None}
    Config(**given).validate()  # the options' one check, as train.py's (the targets' scaled bound: per checkpoint)
    device = given.get("device")
    if device is not None:
        check_device(device)
    check_report_path(Path(args.out), [Path(c) for c in args.checkpoints])


def check_report_path(out: Path, checkpoints: list[Path] = ()) -> None:
    """``out`` (and the Markdown table beside it) can be written, and writing them destroys no other file."""
    if out.is_dir():
        raise UserError(
            f"--out {out} is a directory; give the JSON file to write, e.g. --out {out / 'eval.json'} "
            f"(the Markdown table goes beside it)."
        )
    for path in (out, out.with_suffix(".md")):
        if any(path.exists() and c.exists() and path.resolve() == c.resolve() for c in checkpoints):
            raise UserError(
                f"--out {out} would overwrite the checkpoint {path} with the report; give another file, "
                f"e.g. --out {out.with_name('eval.json')}."
            )
    check_no_links(out.parent, (out.name, out.with_suffix(".md").name))
    if out.exists() and not _is_report(out):
        raise UserError(
            f"--out {out} already exists and is not an evaluation report, so writing the report would "
            f"destroy it; give another file (an earlier report there would be replaced)."
        )
    table = out.with_suffix(".md")
    if table.exists() and not _is_report_table(table):
        raise UserError(
            f"{table}, where the report's Markdown table goes (beside --out {out}), already exists and is "
            f"not a table evaluate.py wrote, so writing the report would destroy it; give another --out."
        )
    parent = next((p for p in [out.parent, *out.parent.parents] if p.exists()), Path("."))
    if not parent.is_dir():
        raise UserError(f"--out {out} lies under {parent}, which is a file, not a folder; give another path.")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(
            f"--out {out} cannot be written: {parent} is not writable (read-only or not yours). Give a "
            f"path in a folder you can write to."
        )


def task_limits(task: Task) -> TaskLimits:
    """``task.limits()``: an environment that cannot be made, or whose spaces are not flat boxes, is refused."""
    try:
        return task.limits()
    except ValueError as exc:
        raise UserError(str(exc)) from exc


def env_sizes(task: Task) -> tuple[int, int]:
    """Observation and action sizes of the task's environment (``task_limits``)."""
    limits = task_limits(task)
    return limits.obs_dim, len(limits.low)


def check_evaluate_run(args, ckpts: list[dict]) -> None:
    """evaluate.py once its checkpoints are loaded: each model's sizes against its task's environment,
    the targets against each checkpoint's --reward-scale, and whether all the episodes fit in memory at once."""
    episodes_total = 0
    for path, ckpt in zip(args.checkpoints, ckpts):
        cfg, arch = ckpt["config"], ckpt["model_config"]
        task = Task.from_record(ckpt["task"])
        sizes = env_sizes(task)
        if (arch["state_dim"], arch["act_dim"]) != sizes:
            raise UserError(
                f"{path} holds a model for observations of size {arch['state_dim']} and actions of size "
                f"{arch['act_dim']}, but its task {task.gym_id} has {sizes[0]} and {sizes[1]}: the file is "
                f"damaged. Use an earlier copy or retrain."
            )
        targets = list(getattr(args, "targets", None) or cfg["targets"] or task.targets)
        check_targets(targets, cfg["reward_scale"])
        episodes_total += args.episodes * len(targets)
    cfg = ckpts[0]["config"]
    arch = ckpts[0]["model_config"]
    check_evaluation_memory(
        episodes_total,
        max(c["model_config"]["context"] for c in ckpts),
        arch["state_dim"],
        arch["act_dim"],
        getattr(args, "device", None) or "auto",
        f"--episodes {args.episodes} per target of {len(ckpts)} checkpoint{'s' if len(ckpts) > 1 else ''}",
        "Lower --episodes, or evaluate fewer checkpoints per command.",
    )
