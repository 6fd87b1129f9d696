"""The evaluation: acting with trained models in their tasks and reporting their scores.

policy.py        a trained model that acts (``dt_primal.load_policy``)
rollout.py       batched evaluation: every episode of every target and member at once
reports.py       the reports, their aggregation across seeds or checkpoints, and tables
checks.py        ``evaluate.py``'s inputs, and the targets and memory every evaluation needs
"""
