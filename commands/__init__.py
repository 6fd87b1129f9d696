"""The repository's command lines, above the library: training (``commands.train``, what ``train.py``
runs), sweeps (``python -m commands.sweep``), the tables of docs/results.md (``python -m commands.tables``)
and the attention spectrum (``python -m commands.spectrum``).

Imports run one way: ``envs`` <- ``dt_primal`` (the library) <- ``datasets`` (the offline suite) <- these
commands, ``train.py`` and ``evaluate.py``."""
