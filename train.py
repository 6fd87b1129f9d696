"""Train a Decision Transformer (dt), Primal.+DT (primal, default) or PrimalFormer on an offline
dataset, evaluate it, and write DIR/last.pt, DIR/eval.json and TensorBoard events
(``python train.py --help``). The command is ``dt_primal.cli.train.train_command``; a checkout's
data include the offline suite (``datasets.loaders``)."""

from commands.train import suite_loader
from dt_primal.cli.console import train

if __name__ == "__main__":
    train(suite_loader)
