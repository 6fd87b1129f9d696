"""``python -m commands.sweep``: see ``commands.sweep.command``."""

from dt_primal.process import configure_process

configure_process()  # a command: its process-wide settings, before torch loads

from commands.sweep.command import main  # noqa: E402
from dt_primal.cli import run_main  # noqa: E402

run_main(main)
