"""The sweep on a Ray cluster (``--backend ray``): one Ray task per (dataset, model) group, which
``run_group`` trains on a worker in that process; Ray runs a group again when its worker or node dies."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

from commands.sweep.grid import group_dir, in_process, python_path, run_group
from datasets.loaders import load_dataset
from dt_primal.cli.train import Loader
from dt_primal.errors import UserError


class Stopped(Exception):
    """A group's training stopped by SIGINT or SIGTERM (a node being shut down) after writing its checkpoints."""


def ray_group(
    datasets: list[str],
    model: str,
    seeds: list[int],
    out: Path,
    extra: list[str],
    load_dataset: Loader,
    threads: int,
    cwd: str,
    recorded: Path | None,
) -> tuple[str, list[int], int | None]:
    """One Ray task: ``run_group`` on a worker, in the sweep's folder ``cwd`` where this node has it (relative
    paths mean what they mean to the sweep). When Ray runs it again, after its worker or node died or
    a signal stopped it, the seeds that had written a checkpoint resume from their ``last.pt``."""
    if os.path.isdir(cwd):
        os.chdir(cwd)
    gd, trained, rc = run_group(datasets, model, seeds, out, extra, in_process(load_dataset, threads), recorded)
    if rc in (128 + signal.SIGINT, 128 + signal.SIGTERM):
        raise Stopped(f"{gd} stopped by signal {rc - 128} after its checkpoint")
    return gd, trained, rc


RAY_RETRIES = 3  # times Ray runs a group again after its worker or node died or a signal stopped it


def import_ray():
    try:
        import ray
    except ImportError:
        raise UserError(
            "--backend ray needs Ray, which is not installed here (it is optional): install it with "
            "'pip install -r requirements-ray.txt' (on every node of the cluster, with the same Python "
            "and dt-primal), or leave out --backend ray to train in the local process pool."
        ) from None
    return ray


def start_ray(address: str | None):
    """Connect to the Ray cluster at ``address`` ('auto', HOST:PORT), or start a local instance."""
    ray = import_ray()
    if ray.is_initialized():
        return ray
    cannot = (
        f"Could not connect to the Ray cluster at --ray-address {address} ({{}}). Start it first (ray start --head "
        f"on one machine, ray start --address HEAD:6379 on the others), or leave out --ray-address for a local "
        f"Ray instance."
    )
    host, _, port = (address or "").rpartition(":")
    if host and "://" not in address:  # HOST:PORT: Ray itself would retry an unreachable one for minutes
        try:
            socket.create_connection((host, int(port)), timeout=10).close()
        except (OSError, ValueError) as exc:
            raise UserError(cannot.format(exc)) from None
    try:
        ray.init(address=address or "local", include_dashboard=False, log_to_driver=False)  # local: a new instance
    except ConnectionError as exc:
        raise UserError(cannot.format(exc)) from None
    return ray


def run_groups_on_ray(groups: list[tuple[list[str], str]], args, extra: list[str]):
    """Yield ``run_group``'s result for each group as its Ray task finishes; for a task Ray gave up on
    (its worker died more than ``RAY_RETRIES`` times), the reason instead of an exit status."""
    ray = start_ray(args.ray_address)
    gpus = args.gpus_per_task if args.gpus_per_task is not None else float(ray.cluster_resources().get("GPU", 0) > 0)
    task = ray.remote(
        num_cpus=args.cpus_per_task,
        num_gpus=gpus,
        max_retries=RAY_RETRIES,
        retry_exceptions=[Stopped],
        runtime_env={"env_vars": {"PYTHONPATH": python_path()}},
    )(ray_group)
    threads = max(1, round(args.cpus_per_task))
    pending = {
        task.remote(d, m, args.seeds, args.out, extra, load_dataset, threads, os.getcwd(), args.recorded): (
            d,
            m,
        )
        for d, m in groups
    }
    while pending:
        (done,), _ = ray.wait(list(pending))
        d, m = pending.pop(done)
        try:
            yield ray.get(done)
        except ray.exceptions.RayError as exc:
            yield (
                " + ".join(str(group_dir(args.out, x, m)) for x in d),
                [],
                f"{type(exc).__name__} on Ray: {str(exc).strip().splitlines()[-1]}",
            )
