"""Sweeps: grids of (dataset × model × seed) training runs and their tables (``python -m commands.sweep``).

command.py       the command line
grid.py          the sweep's folders; each (dataset, model) group trained as one ensemble, locally
ray_cluster.py   the same groups as Ray tasks on a cluster
results.py       the finished runs read back as rows of scores
tables.py        results.md / results.csv, and the gap between two models
plots.py         results.png and curves.png
"""
