"""The one exception type users see: a one-paragraph message that says what to do."""


class UserError(Exception):
    """Bad input (dataset, checkpoint, config). Command-line entry points print it and exit 2."""
