"""The training: ``train.py``'s run, from its inputs to its checkpoints.

loop.py          ``train``: the run loop and its named parts (set-up, step, periodic evaluation,
                 checkpoint, the final evaluation)
step.py          one update of every member, as one function of device tensors
ensemble.py      the members of a run (dataset, seed, folder, normalisation), and which datasets can
                 share an ensemble
checks.py        the run's data and options checked against the task before anything trains
memory.py        what the step needs in memory, refused before it is allocated
resume.py        --resume: every member or none, the options a run may change, the data it started on
distributed.py   the processes of a torchrun run: process group, agreed precision, stopping together
throughput.py    the step of new members, timed (the benchmarks, a sweep's time budget)
"""
