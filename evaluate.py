"""Evaluate checkpoints or exported policies with batched rollouts and write a JSON report and a
Markdown table (``python evaluate.py --help``). The command is
``dt_primal.evaluation.command.evaluate_command``."""

from dt_primal.console import evaluate

if __name__ == "__main__":
    evaluate()
