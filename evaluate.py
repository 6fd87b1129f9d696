"""Evaluate checkpoints or exported policies with batched rollouts and write a JSON report and a
Markdown table (``python evaluate.py --help``). The command is
``dt_primal.cli.evaluate.evaluate_command``."""

from dt_primal.cli.console import evaluate

if __name__ == "__main__":
    evaluate()
