"""``python -m commands.train ARGS`` is ``python train.py ARGS`` (how a sweep's local workers start a group):
``dt_primal.cli.train.train_command`` reading data with a checkout's ``datasets.loaders``, which
also builds the offline suite's datasets."""

from dt_primal.cli.console import train


def suite_loader():
    """``datasets.loaders.load_dataset``, imported when called: after the process settings (it loads torch)."""
    from datasets.loaders import load_dataset

    return load_dataset


if __name__ == "__main__":
    train(suite_loader)
