"""The evaluation: acting with trained models in their tasks and reporting their scores.

acting.py        ``dt_primal.load_policy`` and what acting keeps between steps, whatever runs the model
policy.py        the PyTorch policy of one or several checkpoints
onnx_policy.py   the policy of an ONNX export, on onnxruntime and NumPy
intervals.py     seed-averaged scores with 95 % bootstrap intervals
rollout.py       batched evaluation: every episode of every target and member at once
video.py         evaluated episodes replayed and rendered offscreen as MP4 and PNG strips
reports.py       the reports, their aggregation across seeds or checkpoints, and tables
checks.py        ``evaluate.py``'s inputs, and the targets and memory every evaluation needs
"""
