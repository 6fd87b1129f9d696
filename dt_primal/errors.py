"""The one exception type users see (a one-paragraph message that says what to do), and the phase of
the work an error came from."""

from __future__ import annotations

import contextlib


class UserError(Exception):
    """Bad input (dataset, checkpoint, config). Command-line entry points print it and exit 2."""


@contextlib.contextmanager
def phase(name: str):
    """Work of the phase ``name`` ("training", "evaluation", "evaluate.py"): an exception raised inside
    carries it as ``exc.phase`` (the innermost phase), so that running out of memory names the options
    that need less."""
    try:
        yield
    except Exception as exc:
        if getattr(exc, "phase", None) is None:
            with contextlib.suppress(AttributeError):
                exc.phase = name
        raise
