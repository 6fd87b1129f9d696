"""Train a Decision Transformer (dt), Primal.+DT (primal, default) or PrimalFormer on an offline
dataset, evaluate it, and write DIR/last.pt, DIR/eval.json and TensorBoard events
(``python train.py --help``; the command is ``commands.train.train_command``).
"""

import sys

from dt_primal.process import configure_process

if __name__ == "__main__":
    configure_process()  # a command: its process-wide settings, before torch loads

from commands.train import train_command  # noqa: E402
from datasets.loaders import load_dataset  # noqa: E402
from dt_primal.cli import run_main  # noqa: E402

if __name__ == "__main__":
    run_main(lambda: train_command(sys.argv[1:], load_dataset))
