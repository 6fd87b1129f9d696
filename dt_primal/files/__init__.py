"""Every kind of file the library reads or writes, one module each. Researchers exchange checkpoints and
datasets, so every reader treats a file it is given as hostile: nothing in it may choose code to run, a module
to import, another file to read, or how much memory to allocate; a file that breaks a rule is a ``UserError``
that names the rule, and nothing named in it was called. Every file a user will read is written one way.

reading.py        regular files only, bounded reads, JSON records
writing.py        the one writer: beside the name, flushed, renamed (never through a link, never partial)
pickles.py        plain data in pickles (a checkpoint's data.pkl, a decision-transformer dataset)
torch_archive.py  checkpoint archives as torch.save writes them
hdf5.py           HDF5 files (D4RL, Minari's main_data.hdf5)
minari.py         Minari dataset folders and their metadata; minari_hdf5.py, minari_arrow.py: their episodes
onnx.py           exported policies, and the keys of their metadata
checkpoint.py     the checkpoint format (last.pt), written and read
records.py        a run's records (eval.json, evals.jsonl)
run_folder.py     the run folder's layout and its lock
loaders.py        any dataset source into the one in-memory format
"""
