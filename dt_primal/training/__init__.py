"""The training: ``train.py``'s run, from its inputs to its checkpoints.

  loop.py          the run loop: set-up, steps, periodic evaluation, checkpoints, the final evaluation
  step.py          one update of every member, as one function of device tensors
  checks.py        the run's inputs checked against each other and the task before anything trains
  run_folder.py    the folder a run writes (--out), held by one run at a time
"""
