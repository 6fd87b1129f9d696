"""Train a Decision Transformer (dt), Primal.+DT (primal, default) or PrimalFormer on an offline
dataset, evaluate it, and write DIR/last.pt, DIR/eval.json and TensorBoard events
(``python train.py --help``; the command is ``dt_primal.run.train_command``).
"""
import sys

from datasets.loaders import load_dataset
from dt_primal.cli import run_main
from dt_primal.run import train_command

if __name__ == "__main__":
    run_main(lambda: train_command(sys.argv[1:], load_dataset))
