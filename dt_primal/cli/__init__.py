"""What every command shares: its parser, and its error exit (a ``UserError``, running out of memory or disk,
a path too long or a Ctrl-C becomes one message and an exit status, never a traceback)."""

from __future__ import annotations

import argparse
import errno
import re
import sys

from dt_primal.errors import UserError

_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
_NOT_WRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS)


def command_parser(description: str, prog: str | None = None) -> argparse.ArgumentParser:
    """A command's parser: its description as written, and no abbreviated options (argparse would complete
    ``--eval-ep`` to ``--eval-episodes``, and read a misspelt option as another)."""
    return argparse.ArgumentParser(
        prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )


def subcommand(subparsers, name: str, help: str) -> argparse.ArgumentParser:
    """A subcommand's parser (``subparsers`` from ``add_subparsers``), with no abbreviated options either."""
    return subparsers.add_parser(name, allow_abbrev=False, help=help)


def split_train_options(argv: list[str] | None = None) -> tuple[list[str], list[str]]:
    """A command's own arguments, and the train.py options given after ``--`` (``sys.argv`` by default)."""
    argv = sys.argv[1:] if argv is None else argv
    cut = argv.index("--") if "--" in argv else len(argv)
    return argv[:cut], argv[cut + 1 :]


def run_main(main) -> None:
    """Run ``main()``; a UserError becomes a one-paragraph message and exit status 2, and so do running
    out of (GPU) memory and a full or read-only disk; a Ctrl-C that training did not catch (during the
    final evaluation, say) a line and status 130."""
    try:
        main()
    except UserError as exc:
        _fail(str(exc))
    except KeyboardInterrupt as exc:
        print(f"\ninterrupted {exc or '(checkpoints already written are intact)'}", file=sys.stderr)
        sys.exit(130)
    except MemoryError as exc:  # NumPy
        _fail(out_of_memory_message(exc, "memory"), mid_line=True)
    except RuntimeError as exc:
        torch = sys.modules.get("torch")  # loaded by whatever raised its out-of-memory error; a command may not use it
        if torch is not None and isinstance(exc, torch.OutOfMemoryError):  # CUDA's (or another accelerator's)
            _fail(out_of_memory_message(exc, "GPU memory"), mid_line=True)
        if "can't allocate memory" not in str(exc) and "not enough memory" not in str(exc):  # PyTorch's CPU allocator
            raise
        _fail(out_of_memory_message(exc, "memory"), mid_line=True)
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:  # any path of any command: a message, not a traceback
            name = str(exc.filename or "a path")
            _fail(f"{name[:100]}{'...' if len(name) > 100 else ''} is a name too long for the file system; shorten it.")
        if exc.errno not in _DISK_FULL + _NOT_WRITABLE:
            raise
        _fail(write_error_message(exc), mid_line=True)


def _fail(message: str, mid_line: bool = False) -> None:
    """``mid_line``: the error may interrupt a progress bar's line, so start a new one."""
    print(f"{chr(10) if mid_line else ''}error: {message}", file=sys.stderr)
    sys.exit(2)


def out_of_memory_message(exc: BaseException, memory: str) -> str:
    """What ran out and which options need less: the batch while training, the episodes run at once
    while evaluating (the phase the work tagged, ``dt_primal.errors.phase``; both when untagged)."""
    text = re.sub(r"^\[enforce fail[^\]]*\]\s*err == 0\.\s*", "", str(exc).strip())  # PyTorch's CPU allocator
    detail = ". ".join(text.split(". ")[:2]).splitlines()[0].rstrip(".") if text else type(exc).__name__
    where = getattr(exc, "phase", None)
    if where == "evaluate.py":
        return (
            f"Out of {memory} while evaluating ({detail}). All episodes of all checkpoints run at once: lower "
            f"--episodes, or evaluate fewer checkpoints per command."
        )
    evaluation = (
        "lower --eval-episodes (the final evaluation) or --eval-episodes-during (those during training); "
        "both may change when the run continues with --resume"
    )
    training = (
        "lower --batch-size, train fewer --seeds at once or a smaller model (in a new --out), or use "
        "--precision bf16 (which --resume may change)"
    )
    what, fix = {
        "evaluation": ("in the evaluation, which runs all its episodes at once", evaluation),
        "training": ("while training", training),
    }.get(where, ("", f"{training}; for the evaluation, {evaluation}"))
    return (
        f"Out of {memory}{' ' + what if what else ''} ({detail}). To need less, {fix}. Checkpoints already "
        f"written are intact."
    )


def write_error_message(exc: OSError) -> str:
    where = f" {exc.filename}" if exc.filename else ""
    if exc.errno in _DISK_FULL:
        fix = "Free disk space (or choose another --out)"
    else:
        fix = "Make it writable, or choose another --out"
    return (
        f"Could not write{where} ({exc.strerror or exc}). {fix}, then run the command again; a train.py run "
        f"continues from its last checkpoint with --resume (checkpoints already written are intact)."
    )
