"""The sweep runner, its tables and the spectrum analysis, on tiny runs."""

import csv
import fcntl
import json
import shutil

import numpy as np
import torch
from conftest import ROOT, SWEEP_RUN, hopper_file, make_episodes, run

from commands import tables
from commands.spectrum import layer_spectra
from commands.sweep.grid import group_dir, run_dir
from commands.sweep.results import collect
from datasets.synthetic import write_d4rl
from dt_primal.config import Config
from dt_primal.model.transformer import DecisionTransformer


def sweep(tmp_path, *data, seeds=("0", "1")):
    return run(
        "-m",
        "commands.sweep",
        "--datasets",
        *map(str, data),
        "--models",
        "dt",
        "primal",
        "--seeds",
        *seeds,
        "--jobs",
        "2",
        "--out",
        str(tmp_path / "sweep"),
        "--",
        *SWEEP_RUN,
        timeout=400,
    )


def test_sweep_trains_each_group_of_seeds_once_as_one_ensemble_and_aggregates(tmp_path):
    data = hopper_file(tmp_path)
    out = tmp_path / "sweep"
    held = group_dir(out, str(data), "dt")
    held.mkdir(parents=True)
    with open(held / ".lock", "w") as lock:  # as another sweep training that group would hold it
        fcntl.flock(lock, fcntl.LOCK_EX)
        res = sweep(tmp_path, data)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "left to the sweep that is training it" in res.stdout and not (held / "train.log").exists()
    logs = [group_dir(out, str(data), m) / "train.log" for m in ("dt", "primal")]
    assert logs[1].read_text().count("$ ") == 1 and "--seeds 0 1 " in logs[1].read_text()  # one ensemble
    assert sweep(tmp_path, data).returncode == 0  # the lock is free now: only that group trains
    assert [log.read_text().count("$ ") for log in logs] == [1, 1]
    md = (out / "results.md").read_text()
    assert "| dt |" in md and "| primal |" in md and "average" in md and "last checkpoint" in md
    rows = list(csv.DictReader((out / "results.csv").read_text().splitlines()))
    assert len(rows) == 2 * 2  # models x targets
    assert all(r["n_seeds"] == "2" and np.isfinite(float(r["normalized_mean"])) for r in rows)
    assert (out / "results.png").stat().st_size > 0 and (out / "curves.png").stat().st_size > 0
    (run_dir(out, str(data), "dt", 1) / "eval.json").unlink()  # as if seed 1 had been stopped after its checkpoint
    again = sweep(tmp_path, data)  # finished runs are skipped, the unfinished one resumes alone
    assert again.returncode == 0 and "done (seeds 1)" in again.stdout
    last = [line for line in logs[0].read_text().splitlines() if line.startswith("$ ")][-1]
    assert "--seeds 1 --out" in last and last.endswith("--resume")
    assert [log.read_text().count("$ ") for log in logs] == [2, 1]


def test_ensembles_of_several_datasets_train_side_by_side_in_one_out(tmp_path):
    """Table 4's layout: each model's group is one ensemble over a task's datasets, the groups at once."""
    data = [hopper_file(tmp_path), tmp_path / "hopper_other.hdf5"]
    write_d4rl(data[1], make_episodes(lengths=(30, 45, 20), seed=4))
    res = sweep(tmp_path, *data, seeds=("0",))
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count("done (seeds 0)") == 2 and "FAILED" not in res.stdout
    assert all(
        (run_dir(tmp_path / "sweep", str(d), m, 0) / "eval.json").exists() for d in data for m in ("dt", "primal")
    )


def test_spectrum_curves_are_cumulative_fractions():
    torch.manual_seed(0)
    cfg = Config(model="primal", d_model=32, n_head=2, n_layer=2, s=8, dropout=0.0)
    net = DecisionTransformer(cfg.model_config(11, 3)).eval()
    K = 5
    batch = {
        "states": torch.randn(4, K, 11),
        "actions": torch.rand(4, K, 3),
        "returns_to_go": torch.randn(4, K, 1),
        "timesteps": torch.arange(K).repeat(4, 1),
    }  # windows of one model: (B, K, ...)
    curves = layer_spectra(net, batch)
    assert len(curves) == 2
    for c in curves:
        assert c.shape == (3 * K,) and np.all(np.diff(c) >= -1e-12) and abs(c[-1] - 1) < 1e-9
    phi = net.blocks[1].attn.attention_matrix(torch.randn(1, 1, 3 * K, 32))
    assert phi.shape == (1, 1, 2, 3 * K, 3 * K) and phi.abs().max() <= 1 + 1e-6  # cosine similarities


def test_learning_curves_average_only_the_finished_runs(tmp_path):
    import warnings

    from commands.sweep.plots import plot_curves

    point = lambda step, score: {"step": step, "targets": [{"target": 3600, "episodes": 2, "normalized_mean": score}]}
    for seed, finished in ((0, True), (1, True), (2, False)):
        rd = run_dir(tmp_path, "d/x/y-v0", "dt", seed)
        rd.mkdir(parents=True)
        (rd / "evals.jsonl").write_text(json.dumps(point(5, 10.0 + seed)) + "\n")
        if finished:
            (rd / "eval.json").write_text(json.dumps(point(10, 20.0)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. matplotlib's "no artists with labels" for an empty panel
        drawn = plot_curves(tmp_path, collect(tmp_path, ["d/x/y-v0"], ["dt", "primal"], [0, 1, 2]))
    assert drawn == {("d/x/y-v0", "dt"): 2}  # the unfinished seed 2 and the model without runs are left out
    assert (tmp_path / "curves.png").stat().st_size > 0


def test_a_runs_settings_come_from_its_eval_json_alone(tmp_path):
    """Committed records keep eval.json without checkpoint or train.log: the DT baseline is still told apart."""
    import dataclasses
    import json

    from commands.sweep.results import run_settings
    from dt_primal.config import make_config

    (tmp_path / "seed_0").mkdir()
    cfg = make_config("dt-paper", dataset="tiny", seed=0, precision="fp32")  # as a run records it, resolved
    (tmp_path / "seed_0" / "eval.json").write_text(json.dumps({"config": dataclasses.asdict(cfg)}))
    assert run_settings(tmp_path, 0) == {
        "d_model": 128,
        "n_head": 1,
        "lr": 1e-4,
        "precision": "fp32",
        "top_percent": 100.0,
    }
    (tmp_path / "seed_0" / "eval.json").write_text(json.dumps({}))
    assert run_settings(tmp_path, 0) is None


def test_plots_say_whether_they_show_normalised_scores_or_returns():
    from commands.sweep.plots import y_label

    scored, unscored = {"unit": "normalised"}, {"unit": "return"}  # a task without reference scores
    assert y_label([scored, scored]) == "normalised score"
    assert y_label([unscored]) == "return"
    assert "return" in y_label([scored, unscored]) and "normalised" in y_label([scored, unscored])


def test_runs_with_a_committed_record_are_not_trained_again(tmp_path):
    """--recorded: a run whose eval.json is in the committed folder counts as finished; the rest train into --out,
    datasets with the same seeds left in one ensemble."""
    from commands.sweep.grid import run_group

    recorded, out = tmp_path / "results", tmp_path / "runs"
    for d, s in (("a", 0), ("b", 0), ("b", 1)):
        run_dir(recorded, d, "dt", s).mkdir(parents=True)
        (run_dir(recorded, d, "dt", s) / "eval.json").write_text("{}")
    calls = []

    def trainer(argv, log):
        calls.append(
            (
                argv[argv.index("--dataset") + 1 : argv.index("--model")],
                argv[argv.index("--seeds") + 1 : argv.index("--out")],
            )
        )
        return 0

    assert run_group(["a", "b", "c"], "dt", [0, 1], out, [], trainer, recorded=recorded)[1:] == ([0, 1], 0)
    assert sorted(calls) == [(["a"], ["1"]), (["c"], ["0", "1"])]
    calls.clear()
    assert run_group(["b"], "dt", [0, 1], out, [], trainer, recorded=recorded)[1:] == ([], 0) and not calls
    assert run_group(["b"], "dt", [0, 1], out, [], trainer)[1:] == ([0, 1], 0)  # without --recorded it trains


def test_records_travel_as_one_small_archive_and_an_archive_cannot_write_elsewhere(tmp_path):
    """Pack the finished runs' records (no checkpoint, log or unfinished run), unpack them into the committed
    folder once; a differing record is refused; an archive's other members are never written."""
    import io
    import tarfile

    from commands.sweep.records import main

    runs = tmp_path / "runs"
    for s in (0, 1):
        folder = run_dir(runs, "dt-primal/hopper/medium-replay-v0", "dt", s)
        folder.mkdir(parents=True)
        (folder / "evals.jsonl").write_text(f'{{"step": {s}}}\n')
        (folder / "last.pt").write_bytes(b"weights")
        if s == 0:  # seed 1 has not finished
            (folder / "eval.json").write_text("{}")
            (folder / "dataset.json").write_text("{}")
    main([str(runs), str(tmp_path / "records.tgz")])
    main([str(tmp_path / "records.tgz"), str(tmp_path / "results")])
    got = sorted(
        p.relative_to(tmp_path / "results").as_posix() for p in (tmp_path / "results").rglob("*") if p.is_file()
    )
    seed0 = "dt-primal_hopper_medium-replay-v0/dt/seed_0"
    assert got == [f"{seed0}/dataset.json", f"{seed0}/eval.json", f"{seed0}/evals.jsonl"]
    main([str(tmp_path / "records.tgz"), str(tmp_path / "results")])  # again: nothing new, nothing refused
    (run_dir(runs, "dt-primal/hopper/medium-replay-v0", "dt", 0) / "eval.json").write_text('{"other": 1}')
    res = run("-m", "commands.sweep.records", runs, tmp_path / "results", timeout=60)
    assert res.returncode == 2 and "already holds different records" in res.stderr
    with tarfile.open(tmp_path / "evil.tgz", "w:gz") as tar:
        for name in ("../outside/seed_0/eval.json", "/abs/seed_0/eval.json", "x/seed_0/run.py"):
            info = tarfile.TarInfo(name)
            info.size = 2
            tar.addfile(info, io.BytesIO(b"{}"))
        link = tarfile.TarInfo("y/seed_0/eval.json")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
    main([str(tmp_path / "evil.tgz"), str(tmp_path / "into")])
    assert not (tmp_path / "outside").exists() and not any((tmp_path / "into").rglob("*.*"))


def test_a_table_says_when_runs_of_one_dataset_trained_on_different_builds_of_it(tmp_path):
    shutil.copytree(ROOT / "results" / "table4", tmp_path / "table4")
    rows = collect(tmp_path / "table4", ["dt-primal/hopper/medium-v0"], ["dt"], [0, 1, 2])
    assert tables.data_builds(rows).startswith("Each dataset's runs trained on one build of it")
    record = tmp_path / "table4" / "dt-primal_hopper_medium-v0" / "dt" / "seed_2" / "dataset.json"
    record.write_text(json.dumps(json.loads(record.read_text()) | {"hash": "0123456789abcdef"}))
    mixed = tables.data_builds(rows)
    assert mixed.startswith("**Runs of one dataset trained on different builds of it**")
    assert "01234567 (DT (matched settings) seed 2)" in mixed and "911f2067 (DT (matched settings) seed 0, " in mixed
