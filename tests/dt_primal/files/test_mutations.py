"""Random corruptions of valid files a user may be given: each one loads, or is refused with a message (a
UserError, which the commands print with status 2); never another exception, a hang, or much memory.

Run as a script (one kind, in a fresh process, so that its peak memory is its own):
  python tests/dt_primal/files/test_mutations.py KIND COUNT SEED FOLDER   ->  one JSON line of counts
"""

import copy
import io
import json
import os
import pickle
import resource
import shutil
import signal
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[3]
KINDS = ("checkpoint", "views", "hdf5", "pickle", "minari", "arrow", "archive", "headers", "records", "video", "onnx")
STRUCTURE_ONLY = ("video",)  # kinds whose corruption is what lies at a name, not a file's bytes
COUNT = 200  # corruptions per kind, half of them byte-level, half structure-level
MAX_GROWTH_MB = 300  # resident memory a corrupted file may add at most over reading valid ones


# --- corruptions ---

ODD_VALUES = [
    None,
    "x",
    -1,
    0,
    2**70,
    float("nan"),
    float("inf"),
    [],
    {},
    [[[[1]]]],
    True,
    b"\x00",
    (1, "a"),
    "a" * 10_000,
    [1.5] * 50,
    {"observations": 1},
]


def byte_level(blob: bytes, rng: np.random.Generator) -> bytes:
    """``blob`` with one of: bytes flipped, a truncation, random bytes inserted, a range overwritten."""
    b = bytearray(blob)
    at = int(rng.integers(0, max(len(b), 1)))
    choice = int(rng.integers(4))
    if choice == 0:
        for i in rng.integers(0, len(b), int(rng.integers(1, 20))):
            b[i] ^= 1 << int(rng.integers(8))
    elif choice == 1:
        del b[at:]
    elif choice == 2:
        b[at:at] = rng.integers(0, 256, int(rng.integers(1, 64)), dtype=np.uint8).tobytes()
    else:
        n = int(rng.integers(1, 256))
        b[at : at + n] = bytes([int(rng.integers(256))]) * min(n, len(b) - at)
    return bytes(b)


def mutate_tree(value, rng: np.random.Generator):
    """A copy of nested dicts/lists ``value`` with one element replaced by an odd value, or a key removed."""
    value = copy.deepcopy(value)
    parents = []

    def walk(v):
        if isinstance(v, dict):
            parents.extend((v, k) for k in v)
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            parents.extend((v, i) for i in range(len(v)))
            for x in v:
                walk(x)

    walk(value)
    if not parents:
        return ODD_VALUES[int(rng.integers(len(ODD_VALUES)))]
    parent, key = parents[int(rng.integers(len(parents)))]
    if isinstance(parent, dict) and rng.random() < 0.2:
        del parent[key]
    else:
        parent[key] = _odd(parent[key], rng)
    return value


def _odd(old, rng):
    import torch

    if isinstance(old, (torch.Tensor, np.ndarray)) and rng.random() < 0.5:
        arr = old.numpy() if isinstance(old, torch.Tensor) else old
        shape = list(arr.shape) or [1]
        shape[int(rng.integers(len(shape)))] += int(rng.choice([-1, 1, 7]))
        new = np.full([max(n, 0) for n in shape], rng.choice([0.0, np.nan, 1e30]), np.float32)
        return torch.from_numpy(new) if isinstance(old, torch.Tensor) else new
    return copy.deepcopy(ODD_VALUES[int(rng.integers(len(ODD_VALUES)))])


# --- each kind: its valid file, its structure-level corruption, its reader ---


def structured(kind: str, path: Path, rng: np.random.Generator) -> None:
    """Rewrite the valid file ``path`` of ``kind`` with one structure-level corruption."""
    import torch

    if kind == "checkpoint":
        torch.save(mutate_tree(torch.load(path, weights_only=True), rng), path)
    elif kind == "pickle":
        path.write_bytes(pickle.dumps(mutate_tree(pickle.loads(path.read_bytes()), rng)))
    elif kind == "hdf5":
        _mutate_hdf5(path, rng)
    elif kind == "arrow":
        _mutate_arrow(path, rng)
    elif kind == "minari":
        meta = path / "metadata.json"
        record = json.loads(meta.read_text())
        for key in ("observation_space", "action_space", "env_spec"):
            record[key] = json.loads(record[key])
        record = mutate_tree(record, rng)
        if isinstance(record, dict):
            for key in ("observation_space", "action_space", "env_spec"):
                if key in record and rng.random() < 0.9:
                    record[key] = json.dumps(record[key], default=str)
        meta.write_text(json.dumps(record, default=str))
    elif kind == "archive":
        _mutate_archive(path, rng)
    elif kind == "onnx":
        _mutate_onnx(path, rng)
    elif kind == "views":
        torch.save(_mutate_views(torch.load(path, weights_only=True), rng), path)
    elif kind == "headers":
        _mutate_headers(path, rng)
    elif kind == "records":
        _mutate_records(path, rng)
    elif kind == "video":
        _plant_at_clip(path, rng)


def _tensors(tree, found=None) -> list:
    """(container, key) of every tensor in nested dicts and lists."""
    import torch

    found = [] if found is None else found
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, list) else []
    for k, v in items:
        if isinstance(v, torch.Tensor):
            found.append((tree, k))
        else:
            _tensors(v, found)
    return found


def _mutate_views(ckpt, rng: np.random.Generator):
    """One tensor replaced by a view that lies about its size or its layout: one row expanded to millions (stride
    0), overlapping strides, a slice of a larger storage, or a transpose."""
    import torch

    parent, key = _tensors(ckpt)[int(rng.integers(len(_tensors(ckpt))))]
    t = parent[key].reshape(-1)[:1].float() if parent[key].numel() else torch.zeros(1)
    choice = int(rng.integers(4))
    if choice == 0:
        view = t.expand(int(rng.choice([10**6, 2 * 10**7, 10**9])), *([] if parent[key].dim() < 2 else [1]))
    elif choice == 1:
        view = torch.as_strided(torch.zeros(1024), (int(rng.integers(2, 1000)), 8), (1, 1))  # rows overlap
    elif choice == 2:
        view = torch.zeros(4096)[int(rng.integers(1, 100)) :: int(rng.integers(1, 5))]
    else:
        view = torch.zeros(8, 16).t()
    parent[key] = view
    return ckpt


def _mutate_headers(path: Path, rng: np.random.Generator) -> None:
    """The archive rewritten with one hostile header: a pax header of up to 8 MiB, a long name, a record twice
    with other bytes, a member of many MiB of zeros (skipped or declared as a record), a GNU sparse or long-link
    type, in gzip, bzip2 or xz."""
    with tarfile.open(path) as tar:
        entries = [(m, tar.extractfile(m).read() if m.isreg() else b"") for m in tar.getmembers()]
    m, data = entries[int(rng.integers(len(entries)))]
    choice = int(rng.integers(6))
    if choice == 0:
        m.pax_headers = {"comment": "x" * int(rng.integers(1, 8 * 2**20))}
    elif choice == 1:
        m.name = "a/" * int(rng.integers(100, 2000)) + "seed_0/eval.json"
    elif choice == 2:
        entries.append((copy.copy(m), data + b" "))
    elif choice == 3:
        big = tarfile.TarInfo(rng.choice(["d/dt/seed_0/model.bin", m.name]))
        big.size = int(rng.integers(2**20, 12 * 2**20))
        entries.insert(0, (big, bytes(big.size)))
    elif choice == 4:
        m.type = rng.choice([tarfile.GNUTYPE_SPARSE, tarfile.GNUTYPE_LONGNAME, tarfile.CONTTYPE, b"X"])
    else:
        m.size = len(data)
    mode = rng.choice(["w:gz", "w:bz2", "w:xz"])
    with tarfile.open(path, mode, format=tarfile.PAX_FORMAT) as tar:
        for e, d in entries:
            e.size = len(d) if e.isreg() else 0
            tar.addfile(e, io.BytesIO(d) if e.isreg() else None)


def _mutate_records(sweep: Path, rng: np.random.Generator) -> None:
    """One record of the sweep folder rewritten: a value replaced by an odd one (huge ints, NaN, 1e308, other
    targets), a line of a curve changed, or a seed folder made a link out of the sweep."""
    run = sweep / "hopper" / "dt" / f"seed_{int(rng.integers(3))}"
    choice = int(rng.integers(4))
    if choice == 0:
        record = json.loads((run / "eval.json").read_text())
        (run / "eval.json").write_text(json.dumps(mutate_tree(record, rng), default=str))
    elif choice == 1:
        record = json.loads((run / "eval.json").read_text())
        report = record["targets"][int(rng.integers(len(record["targets"])))]
        odd = [10**400, 1e308, -1e308, 2**63, 0.5, None, 7200.0]
        report[str(rng.choice(["target", "normalized_mean", "return_mean", "episodes"]))] = odd[int(rng.integers(7))]
        (run / "eval.json").write_text(json.dumps(record))
    elif choice == 2:
        lines = (run / "evals.jsonl").read_text().splitlines()
        i = int(rng.integers(len(lines)))
        lines[i] = json.dumps(mutate_tree(json.loads(lines[i]), rng), default=str)
        (run / "evals.jsonl").write_text("\n".join(lines) + "\n")
    else:
        outside = sweep.parent / f"outside{int(rng.integers(10**6))}"
        shutil.copytree(run, outside)
        shutil.rmtree(run)
        run.symlink_to(outside)


def _plant_at_clip(folder: Path, rng: np.random.Generator) -> None:
    """Something at the name of the clip or strip ``_write_clip`` writes in ``folder``: a file, a link to another
    file (which must stay as it was), a link to nothing, a FIFO, a folder, or a name longer than a file system
    takes."""
    outside, clip = folder / "outside.txt", folder / "clip"
    outside.write_text("keep")
    for written in folder.glob("clip.*"):  # the valid folder's, from the warm-up
        written.unlink()
    name = folder / f"clip{rng.choice(['.mp4', '.png'])}"
    choice = int(rng.integers(7))
    if choice == 0:
        name.write_bytes(b"old")
    elif choice == 1:
        name.symlink_to(outside)
    elif choice == 2:
        name.symlink_to(clip.parent / "nowhere")
    elif choice == 3:
        os.mkfifo(name)
    elif choice == 4:
        name.mkdir()
    elif choice == 5:
        (folder / "long").write_text(clip.name + "x" * 300)  # the name the writer is given


def _mutate_onnx(path: Path, rng: np.random.Generator) -> None:
    """One of: a metadata value replaced (parsed, mutated, written back), an initializer's values or dims
    changed or stored as external data, a node removed or given another operator."""
    import onnx

    model = onnx.load(str(path))
    choice = int(rng.integers(4))
    if choice == 0:
        meta = {p.key: json.loads(p.value) for p in model.metadata_props}
        meta = mutate_tree(meta, rng)
        del model.metadata_props[:]
        if isinstance(meta, dict):
            onnx.helper.set_model_props(model, {str(k): json.dumps(v, default=str) for k, v in meta.items()})
    elif choice == 1:
        tensor = model.graph.initializer[int(rng.integers(len(model.graph.initializer)))]
        if rng.random() < 0.5:
            tensor.dims[:] = [int(d) + int(rng.choice([-1, 1, 1000])) for d in tensor.dims] or [7]
        else:
            tensor.data_location = onnx.TensorProto.EXTERNAL
            tensor.external_data.add(key="location", value=str(rng.choice(["secret.bin", "/etc/passwd", "../x"])))
    elif choice == 2:
        del model.graph.node[int(rng.integers(len(model.graph.node)))]
    else:
        node = model.graph.node[int(rng.integers(len(model.graph.node)))]
        node.op_type = str(rng.choice(["Div", "Reshape", "Concat", "NoSuchOp", "Loop"]))
    path.write_bytes(model.SerializeToString())


def _mutate_arrow(data: Path, rng: np.random.Generator) -> None:
    """In the Arrow dataset folder ``data``, one of: a length of the first episode's batch or columns (or a
    compressed buffer's declared size) replaced, its batch cut or repeated, a column cast, dropped or renamed,
    its episode metadata.json mutated."""
    import pyarrow as pa

    path = data / "0" / "part-0.arrow"
    batch = pa.ipc.open_file(path).get_batch(0)
    choice, rows = int(rng.integers(5)), batch.num_rows
    if choice == 4:
        meta = data / "0" / "metadata.json"
        meta.write_text(json.dumps(mutate_tree(json.loads(meta.read_text()), rng), default=str))
        return
    batches, compression = [batch], str(rng.choice(["zstd", "lz4"])) if choice == 0 else None
    if choice == 1:
        cut = int(rng.integers(1, rows))
        batches = [batch.slice(0, cut), batch.slice(cut)] if rng.random() < 0.5 else [batch, batch]
    elif choice == 2:
        column = int(rng.integers(batch.num_columns))
        names = [n if i != column else "infos" for i, n in enumerate(batch.schema.names)]
        changed = [
            batch.drop_columns([batch.schema.names[column]]),
            batch.rename_columns(names),
            batch.set_column(column, "x", pa.array(np.zeros(rows, np.float32))),
        ]
        batches = [changed[int(rng.integers(3))]]
    with pa.ipc.new_file(path, batches[0].schema, options=pa.ipc.IpcWriteOptions(compression=compression)) as w:
        for b in batches:
            w.write_batch(b)
    if choice in (0, 3):  # a size in the message replaced: rows, a list's values, a buffer's bytes
        blob = path.read_bytes()
        old = int(rng.choice([rows, rows * 11, rows * 3, rows * 88, rows * 12, rows * 8]))
        new = int(rng.choice([0, old + 1, old * 40_000, 2**40, 2**62, -1]))
        path.write_bytes(blob.replace(old.to_bytes(8, "little"), new.to_bytes(8, "little", signed=True)))


def _mutate_hdf5(path: Path, rng: np.random.Generator) -> None:
    import h5py

    with h5py.File(path, "a") as f:
        key = sorted(f)[int(rng.integers(len(f)))]
        n = len(f[key])
        del f[key]
        choice = int(rng.integers(5))
        if choice == 0:
            f[key] = np.zeros((n + int(rng.integers(-3, 4)), 2), np.float32)
        elif choice == 1:
            f[key] = np.array(["text"] * n, dtype="S4")
        elif choice == 2:
            f.create_group(key)
        elif choice == 3:
            f.create_dataset(
                key, (int(rng.integers(10**6, 10**9)), 11), np.float32, chunks=(100, 11), compression="gzip"
            )
        else:
            f[key] = np.full(n, rng.choice([np.nan, 1e39, 2.0]), np.float64)


def _mutate_archive(path: Path, rng: np.random.Generator) -> None:
    with tarfile.open(path) as tar:
        entries = [(m, tar.extractfile(m).read() if m.isreg() else b"") for m in tar.getmembers()]
    index = int(rng.integers(len(entries)))
    m, data = entries[index]
    choice = int(rng.integers(4))
    if choice == 0:
        m.name = rng.choice(
            [
                "../x/seed_0/eval.json",
                "/abs/seed_0/eval.json",
                m.name + "/seed_1/eval.json",
                "a/" * 50 + "seed_0/eval.json",
            ]
        )
    elif choice == 1:
        m.type, m.linkname = tarfile.SYMTYPE, "/etc/passwd"
    elif choice == 2:
        data = json.dumps(mutate_tree(json.loads(data or b"{}"), rng), default=str).encode()
    else:
        m.type = tarfile.DIRTYPE
    m.size = len(data) if m.isreg() else 0
    entries[index] = (m, data)
    with tarfile.open(path, "w:gz") as tar:
        for e, d in entries:
            tar.addfile(e, io.BytesIO(d) if e.isreg() else None)


def read(kind: str, path: Path, scratch: Path) -> None:
    """Read ``path`` as the commands do."""
    from commands.sweep import records
    from datasets.loaders import load_dataset
    from dt_primal.files import checkpoint

    if kind == "checkpoint":
        ckpt = checkpoint.load_checkpoint(path)
        checkpoint.model_from_checkpoint(ckpt)
        checkpoint.load_checkpoint(path, resume=True)
    elif kind in ("hdf5", "pickle"):
        load_dataset(str(path), env="hopper")
    elif kind in ("minari", "arrow"):
        load_dataset(path.parent.relative_to(os.environ["MINARI_DATASETS_PATH"]).as_posix())
    elif kind == "archive":
        shutil.rmtree(scratch, ignore_errors=True)
        records.into_folder(records.from_archive(path), scratch)
    elif kind == "onnx":
        from dt_primal import load_policy

        policy = load_policy(path)
        policy.reset([3600.0, 1800.0])
        for _ in range(3):
            policy.act(np.ones((2, len(policy.state_mean)), np.float32), reward=np.ones(2))
    elif kind == "views":
        from dt_primal import load_policy

        read("checkpoint", path, scratch)
        load_policy(path).reset([3600.0])
    elif kind == "headers":
        records.MAX_ARCHIVE = 4 * 2**20  # the budget, scaled to the cases' sizes: the same code path
        read("archive", path, scratch)
    elif kind == "records":
        from commands.sweep.results import collect
        from commands.sweep.tables import write_tables

        rows = collect(path, ["hopper"], ["dt"], [0, 1, 2])
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir()
        write_tables(rows, scratch)
    elif kind == "video":
        _write_clip(path)


def _write_clip(folder: Path) -> None:
    """A clip and its strip of four blank frames, as ``evaluate.py --video`` writes each, at the name the case
    planted something at; a file outside the folder, linked from there, must stay as it was."""
    from dt_primal.evaluation import video

    long = folder / "long"
    clip = folder / (long.read_text() if long.exists() else "clip")
    try:
        with video._writer(clip) as mp4:
            for _ in range(4):
                mp4.append_data(np.zeros((64, 64, 3), np.uint8))
        video._imwrite(clip, "png", np.zeros((64, 256, 3), np.uint8))
    finally:
        if (folder / "outside.txt").exists() and (folder / "outside.txt").read_text() != "keep":
            raise AssertionError("a file was written through a link")


def valid_file(kind: str, folder: Path) -> Path:
    """A valid file of ``kind`` in ``folder`` (for minari and arrow: the dataset's data folder)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import make_episodes, tiny_run, write_minari, write_pickle

    from datasets.synthetic import write_d4rl

    eps = make_episodes(lengths=(40, 25), seed=3)
    if kind == "hdf5":
        write_d4rl(folder / "hopper.hdf5", eps)
        return folder / "hopper.hdf5"
    if kind == "pickle":
        write_pickle(folder / "hopper.pkl", eps)
        return folder / "hopper.pkl"
    if kind in ("minari", "arrow"):
        write_minari("mutations/hopper/valid-v0", eps, data_format="arrow" if kind == "arrow" else "hdf5")
        return Path(os.environ["MINARI_DATASETS_PATH"]) / "mutations/hopper/valid-v0" / "data"
    if kind == "video":
        (folder / "clips").mkdir()
        return folder / "clips"
    if kind == "records":
        for seed in range(3):
            run = folder / "sweep" / "hopper" / "dt" / f"seed_{seed}"
            run.mkdir(parents=True)
            score = {"episodes": 2, "normalized_mean": 50.0 + seed, "return_mean": 1600.0}
            reports = [{"target": t, **score} for t in (1.0, 2.0)]
            config = {"d_model": 128, "n_head": 1, "lr": 1e-4, "precision": "fp32", "top_percent": 100.0}
            (run / "eval.json").write_text(json.dumps({"step": 30, "targets": reports, "config": config}))
            points = [{"step": s, "reports": reports} for s in (10, 20)]
            (run / "evals.jsonl").write_text("".join(json.dumps(p) + "\n" for p in points))
        return folder / "sweep"
    if kind in ("checkpoint", "views", "onnx"):
        run = tiny_run(folder)
        if kind == "onnx":
            from dt_primal.export import export

            return export(run / "last.pt", folder / "policy.onnx")
        return run / "last.pt"
    from commands.sweep import records

    (folder / "sweep").mkdir()
    for seed in (0, 1):
        run = folder / "sweep" / "hopper" / "dt" / f"seed_{seed}"
        run.mkdir(parents=True)
        (run / "eval.json").write_text(json.dumps({"step": 5, "targets": [{"target": 1.0, "normalized_mean": 2.0}]}))
        (run / "evals.jsonl").write_text("")
    records.into_archive(records.from_folder(folder / "sweep"), folder / "records.tgz")
    return folder / "records.tgz"


def main(kind: str, count: int, seed: int, folder: Path) -> dict:
    from dt_primal.errors import UserError

    rng = np.random.default_rng(seed)
    valid = valid_file(kind, folder)
    read(kind, valid, folder / "scratch")  # warm: the modules and caches every case uses
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    counts, failures = {"loaded": 0, "refused": 0, "other": 0, "hang": 0}, []

    def alarm(*_):
        raise TimeoutError

    signal.signal(signal.SIGALRM, alarm)
    for i in range(count):
        case = folder / f"case{valid.suffix}"
        if not valid.is_dir():
            case.unlink(missing_ok=True)
        if kind in ("minari", "arrow"):
            shutil.rmtree(valid.parent.parent / "case-v0", ignore_errors=True)
            shutil.copytree(valid.parent, valid.parent.parent / "case-v0")
            case = valid.parent.parent / "case-v0" / "data"
            meta = json.loads((case / "metadata.json").read_text())
            (case / "metadata.json").write_text(json.dumps({**meta, "dataset_id": "mutations/hopper/case-v0"}))
            files = ["metadata.json", "0/metadata.json", "0/part-0.arrow", "1/part-0.arrow"]
            target = case / (files[i % 4] if kind == "arrow" else "metadata.json" if i % 4 == 0 else "main_data.hdf5")
        elif valid.is_dir():  # a folder case (records, video): a fresh copy of the valid one
            shutil.rmtree(folder / "case_dir", ignore_errors=True)
            case = folder / "case_dir"
            shutil.copytree(valid, case, symlinks=True)
            target = case / "hopper" / "dt" / "seed_0" / "eval.json" if kind == "records" else case
        else:
            shutil.copy(valid, case)
            target = case
        if i % 2 == 0 and kind not in STRUCTURE_ONLY:
            target.write_bytes(byte_level(target.read_bytes(), rng))
        else:
            structured(kind, case, rng)
        signal.alarm(30)
        try:
            read(kind, case, folder / "scratch")
            counts["loaded"] += 1
        except UserError:
            counts["refused"] += 1
        except TimeoutError:
            counts["hang"] += 1
        except Exception as exc:  # noqa: BLE001 (what the test counts)
            counts["other"] += 1
            failures.append(f"case {i}: {type(exc).__name__}: {str(exc)[:200]}")
        finally:
            signal.alarm(0)
    growth = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024
    return {"kind": kind, **counts, "peak_growth_mb": round(growth, 1), "failures": failures[:10]}


@pytest.mark.parametrize("kind", KINDS)
def test_corrupted_files_load_or_are_refused_with_a_message(kind, tmp_path):
    from conftest import run  # here: the script's own process has no path to the repository at import

    res = run(__file__, kind, str(COUNT), "0", str(tmp_path), timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    result = json.loads(res.stdout.strip().splitlines()[-1])
    print(json.dumps(result))
    assert result["other"] == 0 and result["hang"] == 0, result
    assert result["refused"] > COUNT // 4, result  # the corruptions reach the checks
    assert result["peak_growth_mb"] < MAX_GROWTH_MB, result


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    kind_, count_, seed_, folder_ = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
    import warnings

    warnings.simplefilter("ignore")
    print(json.dumps(main(kind_, count_, seed_, folder_)))
