"""Records read from a user's files (run records, curves, records archives, a GPU window's throughput file), and
the reports and tables written beside a user's files."""

import io
import json
import os
import tarfile
from pathlib import Path

import pytest
from conftest import (
    assert_user_error,
    run,
    tiny_run,
)

from commands.sweep import records
from dt_primal.errors import UserError
from dt_primal.files.reading import MAX_RECORD

pytestmark = pytest.mark.usefixtures("one_thread")  # in-process runs: one thread, as the subprocesses


def test_evaluate_py_records_each_checkpoint_as_training_records_its_run(run_dir, tmp_path):
    """One record schema: evaluate.py's report holds, per checkpoint, what train.py's eval.json holds (the
    config and provenance included), besides what each writer adds."""
    res = run("evaluate.py", str(run_dir / "last.pt"), "--episodes", "1", "--out", str(tmp_path / "ev.json"))
    assert res.returncode == 0, res.stderr
    evaluated = json.loads((tmp_path / "ev.json").read_text())["checkpoints"][0]
    trained = json.loads((run_dir / "eval.json").read_text())
    assert set(evaluated) - {"precision"} == set(trained) - {"ensemble", "eval_seconds", "trained_on"}
    assert evaluated["config"] == trained["config"] and evaluated["provenance"].keys() == trained["provenance"].keys()


def test_a_malformed_record_is_a_message_in_the_aggregation(run_dir, tmp_path):
    seed = tmp_path / "sweep" / "hopper" / "dt" / "seed_0"
    seed.mkdir(parents=True)
    for text, phrase in (
        ('{"step": 3, "targets": [{"target": "high"}]}', "lacks a step count or per-target reports"),
        ('{"step": ', "is not JSON"),
    ):
        (seed / "eval.json").write_text(text)
        res = run(
            "-m",
            "commands.sweep",
            "--datasets",
            "hopper",
            "--models",
            "dt",
            "--seeds",
            "0",
            "--out",
            str(tmp_path / "sweep"),
            "--aggregate-only",
        )
        assert_user_error(res, f"The run record {seed / 'eval.json'}", phrase)


def test_a_fifo_a_device_or_a_folder_is_named_and_refused_without_waiting(tmp_path):
    """Every file a user gives is opened without blocking and checked on the open file: a FIFO as a record
    (dataset.json, evals.jsonl, a throughput file) hung, /dev/zero read until memory ran out."""
    from dt_primal.files.reading import read_json
    from dt_primal.files.records import read_curve

    fifo = tmp_path / "dataset.json"
    os.mkfifo(fifo)
    for path, kind in ((fifo, "FIFO"), (Path("/dev/zero"), "device"), (tmp_path, "folder")):
        with pytest.raises(UserError, match=kind):
            read_json(path, "The record", "")
        with pytest.raises(UserError, match=kind):
            read_curve(path)
    with pytest.raises(UserError, match="too long"):
        read_json(tmp_path / ("x" * 300), "The record", "")
    (tmp_path / "big.json").write_bytes(b" " * 100 + b"1")
    with pytest.raises(UserError, match="larger than 50 bytes"):
        read_json(tmp_path / "big.json", "The record", "", limit=50)
    assert read_json(tmp_path / "big.json", "The record", "", limit=101) == 1
    point = {"step": 1, "reports": [{"target": 1.0, "episodes": 1, "normalized_mean": 5.0}]}
    (tmp_path / "evals.jsonl").write_text(json.dumps(point) + "\n" + "[" * (2**20 + 1) + "\n")
    assert read_curve(tmp_path / "evals.jsonl") == [point]  # an overlong line is left out, unparsed


def test_a_records_archive_entry_larger_than_a_record_is_not_read(tmp_path):
    with tarfile.open(tmp_path / "big.tgz", "w:gz") as tar:
        info = tarfile.TarInfo("hopper/dt/seed_0/eval.json")
        info.size = MAX_RECORD + 1
        tar.addfile(info, io.BytesIO(b" " * info.size))
    with pytest.raises(UserError, match="declares 16777217 bytes, where a run record is a few kB"):
        records.from_archive(tmp_path / "big.tgz")


def test_records_are_bounded_in_total_json_and_never_read_through_a_link(tmp_path):
    """An archive of many records of 16 MiB each (80 kB per GiB compressed) wrote them all; a record that is not
    JSON was copied as it was; packing a folder followed links."""
    with tarfile.open(tmp_path / "bomb.tgz", "w:gz") as tar:
        for i in range(5):
            info = tarfile.TarInfo(f"d/dt/seed_{i}/eval.json")
            info.size = MAX_RECORD
            tar.addfile(info, io.BytesIO(b" " * info.size))
    assert (tmp_path / "bomb.tgz").stat().st_size < 200_000
    with pytest.raises(UserError, match="more than 64 MiB of records"):
        records.from_archive(tmp_path / "bomb.tgz")
    with tarfile.open(tmp_path / "text.tgz", "w:gz") as tar:
        info = tarfile.TarInfo("d/dt/seed_0/eval.json")
        info.size = 5
        tar.addfile(info, io.BytesIO(b"hello"))
    with pytest.raises(UserError, match="eval.json is not JSON"):
        records.from_archive(tmp_path / "text.tgz")
    sweep, elsewhere = tmp_path / "sweep", tmp_path / "elsewhere" / "seed_1"
    (sweep / "d" / "dt" / "seed_0").mkdir(parents=True)
    (sweep / "d" / "dt" / "seed_0" / "eval.json").write_text('{"step": 1}')
    elsewhere.mkdir(parents=True)
    (elsewhere / "eval.json").write_text('{"secret": 1}')
    (sweep / "d" / "dt" / "seed_1").symlink_to(elsewhere)
    (sweep / "d" / "dt" / "seed_0" / "evals.jsonl").symlink_to(elsewhere / "eval.json")
    assert records.from_folder(sweep) == {"d/dt/seed_0/eval.json": b'{"step": 1}'}


@pytest.mark.parametrize("kind", ["long header", "skipped member", "bzip2 member"])
def test_a_records_archive_is_read_within_a_byte_budget(tmp_path, monkeypatch, kind):
    """A pax header was read whole (1 GiB from a 4.6 MiB .tgz) and a member that is no record was decompressed to
    be skipped (16 GiB of zeros in 13 kB): reading stops at the budget of decompressed bytes, with a message."""
    monkeypatch.setattr(records, "MAX_ARCHIVE", 2**20)  # 1 MiB here: the same code path as 256 MiB
    mode, path = ("w:bz2", tmp_path / "a.tgz") if kind == "bzip2 member" else ("w:gz", tmp_path / "a.tgz")
    with tarfile.open(path, mode, format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("d/dt/seed_0/eval.json")
        info.size = 2
        if kind == "long header":
            info.pax_headers = {"comment": "x" * 2**21}
        else:
            big = tarfile.TarInfo("d/dt/seed_0/model.bin")
            big.size = 2**22
            tar.addfile(big, io.BytesIO(bytes(big.size)))
        tar.addfile(info, io.BytesIO(b"{}"))
    with pytest.raises(UserError, match="took more than 1 MiB"):
        records.from_archive(path)


def test_a_records_archive_that_is_no_regular_file_or_names_a_record_twice_is_refused(tmp_path):
    import os

    os.mkfifo(tmp_path / "fifo.tgz")
    (tmp_path / "zero.tgz").symlink_to("/dev/zero")
    for name, kind in (("fifo.tgz", "FIFO"), ("zero.tgz", "device")):
        with pytest.raises(UserError, match=kind):
            records.from_archive(tmp_path / name)
    with tarfile.open(tmp_path / "twice.tgz", "w:gz") as tar:
        for data in (b'{"step": 1}', b'{"step": 2}'):
            info = tarfile.TarInfo("d/dt/seed_0/eval.json")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with pytest.raises(UserError, match="two different records named d/dt/seed_0/eval.json"):
        records.from_archive(tmp_path / "twice.tgz")


def test_packing_records_replaces_a_link_at_the_archive_and_refuses_a_folder_first(tmp_path):
    sweep = tmp_path / "sweep" / "d" / "dt" / "seed_0"
    sweep.mkdir(parents=True)
    (sweep / "eval.json").write_text('{"step": 1}')
    (tmp_path / "outside").write_text("keep")
    (tmp_path / "r.tgz").symlink_to(tmp_path / "outside")
    assert run("-m", "commands.sweep.records", tmp_path / "sweep", tmp_path / "r.tgz").returncode == 0
    assert (tmp_path / "outside").read_text() == "keep" and not (tmp_path / "r.tgz").is_symlink()
    assert records.from_archive(tmp_path / "r.tgz") == {"d/dt/seed_0/eval.json": b'{"step": 1}'}
    (tmp_path / "dir.tgz").mkdir()
    res = run("-m", "commands.sweep.records", tmp_path / "sweep", tmp_path / "dir.tgz")
    assert res.returncode == 2 and "is a folder" in res.stderr and not list((tmp_path / "dir.tgz").iterdir())


def test_a_records_archive_whose_file_and_folder_share_a_path_writes_nothing(tmp_path):
    record = json.dumps({"step": 1}).encode()
    with tarfile.open(tmp_path / "clash.tgz", "w:gz") as tar:
        for name in ("a/seed_0/eval.json", "a/seed_0/eval.json/seed_1/eval.json"):
            info = tarfile.TarInfo(name)
            info.size = len(record)
            tar.addfile(info, io.BytesIO(record))
    res = run("-m", "commands.sweep.records", str(tmp_path / "clash.tgz"), str(tmp_path / "dst"))
    assert_user_error(res, "a file, folder or link is in the way", "Nothing was written")
    assert not (tmp_path / "dst").exists() or not any((tmp_path / "dst").rglob("*.json"))


@pytest.mark.parametrize("content", ["fifo", "/dev/zero", '{"records": [{"members": 1e400}]}'])
def test_a_gpu_windows_throughput_file_is_checked_before_the_window_starts(tmp_path, content):
    path = tmp_path / "throughput.json"
    if content == "fifo":
        os.mkfifo(path)
    elif content.startswith("/dev"):
        path = Path(content)
    else:
        path.write_text(content)
    res = run("-m", "tools.gpu_window", "start", "--out", tmp_path / "out", "--throughput", path, timeout=60)
    assert res.returncode == 2 and "--throughput" in res.stderr and "Traceback" not in res.stderr, res.stderr


def test_evaluate_never_overwrites_an_unrelated_table_beside_its_report(run_dir, tmp_path):
    (tmp_path / "X.md").write_text("# my notes\n")
    res = run("evaluate.py", str(run_dir / "last.pt"), "--episodes", "1", "--out", str(tmp_path / "X.json"))
    assert_user_error(res, "is not a table evaluate.py wrote")
    assert (tmp_path / "X.md").read_text() == "# my notes\n"


def test_a_sweeps_tables_and_figures_replace_a_link_in_its_folder_never_write_through_it(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from commands.sweep.plots import save_figure
    from commands.sweep.tables import write_csv

    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    for name in ("results.csv", "results.png"):
        (tmp_path / name).symlink_to(victim)
    write_csv([], tmp_path / "results.csv")
    save_figure(plt.figure(), tmp_path / "results.png", 50)
    assert victim.read_text() == "keep"
    assert not (tmp_path / "results.csv").is_symlink() and (tmp_path / "results.csv").read_text().startswith("dataset")
    assert (tmp_path / "results.png").read_bytes()[:4] == b"\x89PNG"


def test_a_run_records_the_commit_it_started_from_not_the_one_it_ended_at(tmp_path, monkeypatch):
    """A run loads its code when it starts; a checkout that moves on while it trains does not change what ran."""
    from dt_primal import provenance
    from dt_primal.training import loop

    monkeypatch.setattr(loop, "commit", lambda: "abc1234-dirty")  # read as the run starts
    monkeypatch.setattr(provenance, "commit", lambda: "def5678")  # the checkout when the run ends
    run = tiny_run(tmp_path)
    assert json.loads((run / "eval.json").read_text())["provenance"]["commit"] == "abc1234-dirty"


def _record(target=3600.0, normalized=50.0, returned=1600.0, **more) -> dict:
    report = {"target": target, "episodes": 2, "normalized_mean": normalized, "return_mean": returned}
    return {"step": 10, "targets": [report], **more}


@pytest.mark.parametrize(
    "seed_1, phrase",
    [
        (_record(normalized=10**400), "lacks a step count or per-target reports with numbers"),
        (_record(normalized=1e308), "lacks a step count or per-target reports with numbers"),
        (_record(target=1800.0), "was evaluated with other targets"),
        (_record(normalized=None, returned=5000.0), "returns where seed 0 has scores"),
    ],
)
def test_the_seeds_of_a_row_are_averaged_only_when_valid_and_evaluated_alike(tmp_path, seed_1, phrase):
    """A 400-digit score was an OverflowError, 1e308 an infinite mean, other targets an IndexError or a silent
    average (a "normalised" 2,500 of a score and a return)."""
    from commands.sweep.results import collect
    from dt_primal.files.run_folder import run_dir

    for seed, record in enumerate([_record(), seed_1]):
        folder = run_dir(tmp_path, "d", "dt", seed)
        folder.mkdir(parents=True)
        (folder / "eval.json").write_text(json.dumps(record))
    with pytest.raises(UserError, match=phrase):
        collect(tmp_path, ["d"], ["dt"], [0, 1])


def test_a_row_reads_no_record_through_a_link_and_no_curve_of_other_targets(tmp_path):
    from commands.sweep.results import collect
    from dt_primal.files.run_folder import run_dir

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "eval.json").write_text(json.dumps(_record()))
    sweep = tmp_path / "sweep"
    run_dir(sweep, "d", "dt", 0).parent.mkdir(parents=True)
    run_dir(sweep, "d", "dt", 0).symlink_to(elsewhere)
    with pytest.raises(UserError, match="read through a link"):
        collect(sweep, ["d"], ["dt"], [0])
    run_dir(sweep, "d", "dt", 0).unlink()
    folder = run_dir(sweep, "d", "dt", 0)
    folder.mkdir()
    (folder / "eval.json").write_text(json.dumps(_record()))
    point = {"step": 5, "reports": _record(target=1800.0)["targets"]}
    (folder / "evals.jsonl").write_text(json.dumps(point) + "\n")
    with pytest.raises(UserError, match="evaluation at step 5 has other targets"):
        collect(sweep, ["d"], ["dt"], [0])
    (folder / "evals.jsonl").write_text(json.dumps(point | {"reports": _record()["targets"]}) + "\n")
    (row,) = collect(sweep, ["d"], ["dt"], [0])
    assert row["targets"][0]["mean"] == 50.0


def test_a_table_cites_only_records_that_say_how_they_were_made(tmp_path):
    from dt_primal.files.records import read_record

    (tmp_path / "eval.json").write_text(json.dumps(_record(config={})))
    assert read_record(tmp_path / "eval.json")["step"] == 10
    with pytest.raises(UserError, match="does not say how it was made"):
        read_record(tmp_path / "eval.json", made=True)
