"""The training: ``train.py``'s run, from its inputs to its checkpoints.

loop.py          ``train``: the run loop and its named parts (set-up, step, periodic evaluation,
                 checkpoint, the final evaluation)
step.py          one update of every member, as one function of device tensors
members.py       the members of a run (dataset, seed, folder, normalisation), and which datasets can
                 share an ensemble
checks.py        the run's inputs checked against each other, the task and its folder before anything trains
run_folder.py    the folder a run writes (--out), held by one run at a time
"""
