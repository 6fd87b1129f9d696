"""How a record was made: the commit, the device and the library versions, stored in every ``eval.json``."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

import torch

# dt-primal's own version is None in a checkout (not installed), where the commit names the code instead
LIBRARIES = ("dt-primal", "torch", "numpy", "gymnasium", "mujoco", "minari")


def commit() -> str | None:
    """``$DT_PRIMAL_COMMIT`` when set (a copy of the tree on another machine, whose .git, if any, need not
    be its own), else the checkout's commit, with ``-dirty`` when tracked files differ from it; None
    outside a checkout of dt-primal (an installed copy, even inside another project's repository)."""
    if os.environ.get("DT_PRIMAL_COMMIT"):
        return os.environ["DT_PRIMAL_COMMIT"][:80]
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--show-toplevel", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
        )
        if head.returncode or Path(head.stdout.splitlines()[0]).resolve() != root:
            return None
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.splitlines()[1] + ("-dirty" if dirty else "")


def cpu_info(field: str = "model name") -> str:
    """A field of this machine's first CPU in /proc/cpuinfo ("model name", "flags"); the platform's processor
    name for a model name where there is no such file, else ""."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.split(":", 1)[0].strip() == field:
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return (platform.processor() or platform.machine()) if field == "model name" else ""


def device_name(device: torch.device | str) -> str:
    """The GPU's name on CUDA, else the CPU's model name and core count."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    threads = torch.get_num_threads()
    return f"{cpu_info()} ({threads} thread{'s' if threads > 1 else ''})"


def provenance(device: torch.device | str, code: str | None = None) -> dict:
    """How a record is made now, on ``device``; ``code``: the commit read when the work began (``commit()``), for
    a run whose checkout may move on while it trains (its modules were loaded then)."""
    versions = {"python": platform.python_version(), "cuda": torch.version.cuda}
    for lib in LIBRARIES:
        try:
            versions[lib] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            versions[lib] = None
    return {
        "commit": code or commit(),
        "device": device_name(device),
        "versions": versions,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
