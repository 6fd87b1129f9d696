"""The return-conditioning sweep (commands/conditioning.py) on tiny runs: its records, its summary numbers, its
plot, evaluate.py's options inside it, and the target lists it refuses."""

import json

import numpy as np
import pytest
from conftest import assert_refused, exit_of, make_episodes, small_config, write_minari

from commands import conditioning
from datasets.loaders import load_dataset
from dt_primal.training.loop import train

DATASET = "tests/hopper/conditioning-v0"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two seeds of a tiny DT and one of BC on a tiny Minari dataset: their checkpoints, the dataset, and the
    Minari home that holds it (each test sets it)."""
    home, root = tmp_path_factory.mktemp("minari"), tmp_path_factory.mktemp("conditioning")
    made = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MINARI_DATASETS_PATH", str(home))
        write_minari(DATASET, make_episodes(lengths=(40, 25, 30), seed=3))
        data = load_dataset(DATASET)
        for model, seeds in (("dt", [0, 1]), ("bc", [0])):
            cfg = small_config(dataset=DATASET, model=model, steps=2, context=4, max_ep_len=30, out=str(root / model))
            train(cfg, data, seeds=seeds)
            made += sorted((root / model).rglob("last.pt"))
    return made, data, home


def test_the_sweep_records_each_checkpoints_curve_and_each_models_summary(runs, tmp_path, monkeypatch):
    checkpoints, data, home = runs
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(home))
    out = tmp_path / "cond"
    argv = [*map(str, checkpoints), "--dataset", DATASET, "--points", "3", "--episodes", "2", "--out", str(out)]
    conditioning.main([*argv, "--precision", "fp32"])
    record = json.loads((out / "conditioning.json").read_text())
    best = float(data.episode_returns().max())
    assert record["data"]["best_return"] == pytest.approx(best)
    assert record["data"]["median_return"] == pytest.approx(float(np.median(data.episode_returns())))
    runs_by_model = {m: [r for r in record["runs"] if r["model"] == m] for m in ("dt", "bc")}
    assert [len(v) for v in runs_by_model.values()] == [2, 1]
    for run in runs_by_model["dt"]:
        assert [p["target"] for p in run["points"]] == pytest.approx([0.0, 0.75 * best, 1.5 * best], abs=0.1)
        asked = [p["target_normalized"] for p in run["points"]]
        got = [p["normalized"]["mean"] for p in run["points"]]
        best_norm = record["data"]["best_normalized"]
        inside = [abs(g - a) for a, g in zip(asked, got) if a <= best_norm]
        assert run["summary"]["tracking_gap"] == pytest.approx(np.mean(inside))
        assert run["summary"]["beyond_best"] == pytest.approx(max(got) - best_norm)
    [bc] = runs_by_model["bc"]
    assert [p["target"] for p in bc["points"]] == [None] and "summary" not in bc  # evaluated once, no target
    dt_model = next(m for m in record["models"] if m["model"] == "dt")
    gaps = [r["summary"]["tracking_gap"] for r in runs_by_model["dt"]]
    assert dt_model["summary"]["tracking_gap"]["mean"] == pytest.approx(np.mean(gaps))
    evaluation = json.loads((out / "evaluation.json").read_text())
    assert {c["precision"] for c in evaluation["checkpoints"]} == {"fp32"}  # evaluate.py's option, passed on
    assert (out / "conditioning.png").stat().st_size > 0


@pytest.mark.parametrize(
    "options, phrase",
    [
        (["--targets", "nan", "100"], "--targets must be finite returns"),
        (["--targets", *map(str, range(101))], "a sweep takes at most 100"),
        (["--points", "1"], "--points must be between 2 and 100"),
        ([], "No dataset to set the sweep from"),
    ],
)
def test_an_unusable_target_list_is_refused(runs, tmp_path, capsys, monkeypatch, options, phrase):
    checkpoints, _, home = runs
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(home))
    dataset = ["--dataset", DATASET] if "--points" in options else []
    argv = [str(checkpoints[-1]), "--out", str(tmp_path / "c"), *dataset, *options]
    assert_refused(*exit_of(lambda: conditioning.main(argv), capsys), phrase)
    assert not (tmp_path / "c" / "conditioning.json").exists()


def test_targets_all_past_the_datas_best_leave_the_tracking_gap_undefined(runs, tmp_path, monkeypatch):
    checkpoints, data, home = runs
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(home))
    out = tmp_path / "past"
    argv = [*map(str, checkpoints[:2]), "--dataset", DATASET, "--targets", "1e6", "2e6", "--episodes", "1"]
    conditioning.main([*argv, "--out", str(out)])
    record = json.loads((out / "conditioning.json").read_text())
    assert [r["summary"]["tracking_gap"] for r in record["runs"]] == [None, None]
    [dt] = record["models"]
    assert dt["summary"]["tracking_gap"] is None and np.isfinite(dt["summary"]["beyond_best"]["mean"])


def test_the_results_table_names_a_curve_swept_without_a_dataset_and_refuses_a_broken_record(
    runs, tmp_path, monkeypatch
):
    """A sweep given ``--targets`` and no dataset has no best or median episode to mark: its rows are named by the
    task. A record that is not one is refused with a message, not a traceback."""
    from commands import tables
    from dt_primal.errors import UserError

    checkpoints, _, home = runs
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(home))
    folder = tmp_path / "results" / "conditioning" / "no-dataset"
    conditioning.main([*map(str, checkpoints[:2]), "--targets", "0", "50", "--episodes", "1", "--out", str(folder)])
    monkeypatch.setattr(tables, "ROOT", tmp_path)
    rows = [line for line in tables.conditioning().splitlines() if line.startswith("| Hopper")]
    assert len(rows) == 1 and "(best episode" not in rows[0]
    (folder / "conditioning.json").write_text(json.dumps({"task": "Hopper-v5", "data": None, "models": [{}]}))
    with pytest.raises(UserError, match="is not a conditioning record"):
        tables.conditioning()
