"""The documents and the committed records: docs/results.md is what the records give, every record says how
it was made, no tracked file names a path of the machine it was written on or cites a file the repository
does not hold, and no documented command writes into the committed results/."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from commands import tables
from dt_primal.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
TEXT = (".py", ".md", ".txt", ".json", ".jsonl", ".csv", ".toml", ".cfg", ".yaml", ".yml", ".sh", "")
# committed Table 4 records of one dataset, both models (a legacy table: its records never move again)
HOPPER_M = ROOT / "results/legacy/table4-cpu-gelu/dt-primal_hopper_medium-v0"


def tracked() -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode:
        pytest.skip("not a git checkout")
    return [ROOT / f for f in out.stdout.splitlines() if Path(f).suffix in TEXT and (ROOT / f).is_file()]


def lines_matching(pattern: re.Pattern, files) -> list[str]:
    return [
        f"{f.relative_to(ROOT)}:{i}: {line.strip()[:120]}"
        for f in files
        for i, line in enumerate(f.read_text(errors="replace").splitlines(), 1)
        if pattern.search(line)
    ]


def test_results_page_is_what_the_records_give():
    assert tables.render(tables.DOC.read_text()) == tables.DOC.read_text(), (
        "docs/results.md is out of date: run python -m commands.tables"
    )


def test_a_missing_table4_row_is_named_missing(tmp_path, monkeypatch):
    """A Table 4 folder with one dataset's records names the other rows missing and averages only what it has."""
    src = HOPPER_M
    for model in ("dt", "primal"):
        for seed in range(3):
            run = tmp_path / "dt-primal_hopper_medium-v0" / model / f"seed_{seed}"
            run.mkdir(parents=True)
            for name in ("eval.json", "evals.jsonl"):
                (run / name).write_text((src / model / f"seed_{seed}" / name).read_text())
    monkeypatch.setattr(tables, "ROOT", tmp_path)
    md = tables.table4(tmp_path)
    assert "average of 1 dataset**" in md
    assert "Missing (no record): halfcheetah/medium-expert-v2 DT (matched settings)" in md
    assert md.count("| missing | missing |") == 16


def test_moving_a_table4_to_legacy_is_one_step(tmp_path, monkeypatch):
    """Records moved under results/legacy/table4-cpu-* (reduced protocol) or table4-full-* (full) show as a marked
    legacy section below that protocol's current table, with the rows the folder holds and no others."""
    for legacy in ("table4-cpu-old", "table4-full-old"):
        shutil.copytree(
            HOPPER_M,
            tmp_path / "results/legacy" / legacy / "dt-primal_hopper_medium-v0",
            ignore=shutil.ignore_patterns("events.out.tfevents.*"),
        )
    monkeypatch.setattr(tables, "ROOT", tmp_path)
    for current, legacy, md in (
        ("results/table4-cpu", "table4-cpu-old", tables.table4_sections()),
        ("results/table4", "table4-full-old", tables.SECTIONS["table4-full"]()),
    ):
        now, before = md.split(f"### Legacy: `results/legacy/{legacy}`")
        assert now.startswith(f"No records in `{current}` yet: all 18 rows are missing.")
        assert "| hopper/medium (3600 / 1800) | Primal.+DT | 3 |" in before
        assert "missing" not in before and "All 2 rows are present." in before
        assert "### Legacy" not in before


def test_a_comparison_whose_folder_lost_its_records_is_refused(tmp_path, monkeypatch):
    """A comparison part naming a folder that holds none of its datasets (records moved to results/legacy/) stops
    the tables with the folder named, instead of rendering an empty side."""
    shutil.copytree(HOPPER_M, tmp_path / "results/kept/dt-primal_hopper_medium-v0")
    (tmp_path / "results/moved").mkdir()
    monkeypatch.setattr(tables, "ROOT", tmp_path)
    parts = [("results/kept", ["dt"], "kept", "dt"), ("results/moved", ["dt"], "moved", "dt")]
    assert "| hopper/medium | kept | 3 |" in tables.compare(parts[:1], ["dt-primal/hopper/medium-v0"], "kept", "kept")
    with pytest.raises(UserError, match="results/moved holds no records of dt on dt-primal/hopper/medium-v0"):
        tables.compare(parts, ["dt-primal/hopper/medium-v0"], "kept", "moved")


def test_every_record_says_how_it_was_made():
    for path in (ROOT / "results").rglob("eval.json"):
        record = json.loads(path.read_text())
        assert {"config", "provenance"} <= record.keys(), path
        assert {"commit", "device", "versions", "date"} <= record["provenance"].keys(), path
        assert not Path(record["checkpoint"]).is_absolute(), path


def test_no_machine_paths_in_tracked_files():
    machine = re.compile("|".join("/" + d + "/" for d in ("work", "root", "home", "tmp")))
    assert lines_matching(machine, tracked()) == []


def test_no_tracked_file_cites_a_spec_the_repository_lacks():
    assert lines_matching(re.compile("SP" + "EC"), tracked()) == []


def test_no_documented_command_writes_into_results():
    writes = re.compile(r"--(out|report-dir)[ =]+results/")
    docs = [f for f in tracked() if f.suffix in (".md", ".py")]
    assert lines_matching(writes, docs) == []


def anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_links_between_documents_resolve():
    """Every relative link in a tracked Markdown file names a file that exists, and a heading there."""
    broken = []
    for md in (f for f in tracked() if f.suffix == ".md"):
        for target in re.findall(r"\]\(([^)\s]+)\)", md.read_text()):
            if "://" in target or target.startswith("#"):
                continue
            path, _, frag = target.partition("#")
            dest = (md.parent / path).resolve()
            if not dest.exists():
                broken.append(f"{md.relative_to(ROOT)}: {target}")
            elif frag and dest.suffix == ".md":
                heads = [anchor(h) for h in re.findall(r"^#+ (.*)$", dest.read_text(), re.M)]
                if frag not in heads:
                    broken.append(f"{md.relative_to(ROOT)}: {target}")
    assert broken == []


def test_the_yardstick_on_earlier_versions_sets_them_beside_the_dt_rows_made_on_them():
    """Rows Table 4 no longer uses keep their yardstick verdict: BC on that version beside DT's legacy full-protocol
    rows of the same version, and only the rows asked for."""
    earlier = tables.earlier_versions()
    assert "dt-primal/walker2d/medium-replay-v0" in earlier and not set(earlier) & set(tables.TABLE4)
    md = tables.yardstick(["dt-primal/walker2d/medium-replay-v0"])
    (row,) = [line for line in md.splitlines() if line.startswith("| walker2d/medium-replay |")]
    assert row.count("| – |") == 0 and "training (10 %BC in range, DT short)" in row
    assert "hopper" not in md.split("\n\n")[0]


def test_two_versions_of_one_row_keep_their_own_numbers():
    """hopper medium-replay's v0 and v1 side by side: each row has its own yardstick, and only v0, on which the
    full protocol ran, has DT's numbers."""
    md = tables.yardstick(["dt-primal/hopper/medium-replay-v0", "dt-primal/hopper/medium-replay-v1"])
    v0, v1 = [line.split(" | ") for line in md.splitlines() if line.startswith("| hopper/medium-replay")]
    assert v0[0] == "| hopper/medium-replay" and v1[0] == "| hopper/medium-replay-v1"
    assert v0[3] != v1[3] and v0[6] != "–" and v1[6] == "–"
