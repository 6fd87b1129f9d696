"""The installed command lines (``[project.scripts]`` in pyproject.toml): ``dt-primal-train``,
``dt-primal-evaluate`` and ``dt-primal-export``. Each makes the commands' process-wide settings first
(``configure_process``: before torch loads), then imports its command and runs it under ``run_main`` (the
messages and exit statuses of bad input). A checkout's ``train.py`` and ``evaluate.py`` run the same
functions."""

from __future__ import annotations

import sys
from collections.abc import Callable

from dt_primal.process import configure_process


def train(loader: Callable[[], Callable] | None = None) -> None:
    """``dt-primal-train``: ``train_command`` with the standard formats' ``load_dataset``, or the one
    ``loader()`` returns (imported after the process settings: a checkout's reads its suite too)."""
    configure_process()
    from dt_primal.cli import run_main
    from dt_primal.cli.train import train_command
    from dt_primal.files.loaders import load_dataset

    run_main(lambda: train_command(sys.argv[1:], loader() if loader else load_dataset))


def evaluate() -> None:
    """``dt-primal-evaluate``: ``evaluate_command``."""
    configure_process()
    from dt_primal.cli import run_main
    from dt_primal.cli.evaluate import evaluate_command

    run_main(lambda: evaluate_command(sys.argv[1:]))


def export() -> None:
    """``dt-primal-export``: ``python -m dt_primal.cli.export``."""
    configure_process()
    from dt_primal.cli.export import main

    main(prog="dt-primal-export")
