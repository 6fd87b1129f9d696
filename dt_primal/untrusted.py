"""What a file a user is given may hold, checked before anything is built from it.

Researchers exchange checkpoints and datasets, so every reader of one treats it as hostile: nothing
in it may choose code to run, a module to import, another file to read, or how much memory to
allocate. Each kind of file, and what is admitted from it:

- checkpoint (``last.pt``), ``load_torch``: a zip archive as ``torch.save`` writes it, uncompressed entries
  whose sizes add up to the file's; in it tensors, lists, dicts, numbers, strings and NumPy arrays,
  scalars and dtypes (``ADMITTED_GLOBALS``), each array no larger than its bytes in the file.
- decision-transformer pickle, ``load_pickle``: the same plain data, NumPy's rebuilders bounded the same way.
- HDF5 (a D4RL file, a Minari ``main_data.hdf5``), ``open_hdf5``: groups and datasets stored inside the
  file (no external files, external links or virtual datasets), each declaring no more than its stored
  bytes can hold (``MAX_RATIO``), all of them together fitting in memory.
- Minari dataset folder, ``open_minari``: no links; a ``metadata.json`` whose spaces are flat
  Boxes of checked size, whose counts fit in memory and whose environment spec ``envs.check_spec``
  admits (a registered id without ``module:``, the entry point Gymnasium registers for it, no
  wrappers, numeric constructor options only); checked before anything reads its data. Its episodes
  are read by dt-primal: ``dt_primal.minari_hdf5`` (HDF5, each array checked against the spaces and steps)
  and ``dt_primal.arrow_episodes`` (Arrow, each file checked against itself).
- run records (``eval.json``, ``evals.jsonl``), ``dt_primal.records``: JSON objects of at most
  ``MAX_RECORD`` bytes (``read_json``) whose step is a count and whose reports hold numbers where numbers belong.
- records archive (``.tgz``), ``commands.sweep.records``: run records under relative ``seed_N`` paths,
  regular files of at most ``MAX_RECORD`` bytes.
- ONNX policies (``check_onnx_policy``): loaded from their bytes (no external weight files), standard
  operators only, metadata checked against the graph's inputs.

A file that breaks a rule is a ``UserError`` that names the rule; nothing named in it was called.
"""

from __future__ import annotations

import _codecs
import contextlib
import dataclasses
import errno
import json
import math
import os
import pickle
import re
import stat
import zipfile
from pathlib import Path

import numpy as np

from dt_primal.errors import UserError

# deflate, the strongest compression HDF5 applies without plugins, cannot shrink data more than 1032:1
MAX_RATIO = 1100
MAX_RECORD = 16 * 2**20  # a run record (eval.json, evals.jsonl, dataset.json) is a few kB
ADMITTED_IN_WORDS = "lists, dicts, numbers, strings, tensors and NumPy arrays"


def check_fits_memory(nbytes: int, path, what: str) -> None:
    """Refuse a file that declares ``nbytes`` of ``what``, more than half this machine's free memory (the
    data is converted once after it is read)."""
    from dt_primal.machine import available_bytes

    free = available_bytes("cpu")[0]
    if free and nbytes > free // 2:
        raise UserError(
            f"{path} declares {what} of {nbytes / 2**30:.1f} GiB, more than this machine can hold while "
            f"converting it ({free / 2**30:.1f} GiB free); it was not read. Use a machine with more "
            f"memory, or check that the file is the one you meant."
        )


def _not_regular(path, what: str, mode: int) -> UserError:
    """The error for ``path`` that is not a regular file, naming what it is."""
    kinds = [(stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket")]
    kind = next((name for test, name in kinds if test(mode)), "a device")
    return UserError(f"{what} {path} is {kind}, not a regular file; give the file itself.")


def _too_long(path, what: str) -> UserError:
    return UserError(f"{what} {str(path)[:80]}... has a name too long for the file system; shorten it.")


def _unreadable(path, what: str, exc: OSError) -> UserError:
    if isinstance(exc, FileNotFoundError):
        return UserError(f"{what} {path} does not exist.")
    if exc.errno == errno.ENAMETOOLONG:
        return _too_long(path, what)
    return UserError(f"{what} {path} cannot be read ({exc.strerror or exc}).")


def regular_file(path, what: str) -> int:
    """The size of ``path``, a regular, non-empty file; a UserError for a folder, a FIFO, a device or an
    empty file (a FIFO would make the reader wait forever)."""
    try:
        info = os.stat(path)
    except OSError as exc:
        raise _unreadable(path, what, exc) from None
    if not stat.S_ISREG(info.st_mode):
        raise _not_regular(path, what, info.st_mode)
    if info.st_size == 0:
        raise UserError(f"{what} {path} is empty (0 bytes): it was not written completely. Use another copy.")
    return info.st_size


def read_bytes(path, what: str, limit: int) -> bytes:
    """The bytes of ``path``, a file a user gave: opened without waiting (a FIFO cannot block), checked on the
    open file (a regular file, of at most ``limit`` bytes, so that nothing swapped in after a check is read),
    read to at most ``limit`` bytes and closed. A UserError naming ``what`` otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise _unreadable(path, what, exc) from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise _not_regular(path, what, info.st_mode)
    with os.fdopen(fd, "rb") as f:
        data = f.read(limit + 1) if info.st_size <= limit else b""
    if info.st_size > limit or len(data) > limit:
        raise UserError(f"{what} {path} is larger than {limit:,} bytes, more than such a file holds; it was not read.")
    return data


def check_target(path, what: str) -> Path:
    """``path`` as ``write_file`` will write it, checked before any work that ends in writing it."""
    path = Path(path)
    try:
        folder, parent = path.is_dir() and not path.is_symlink(), path.parent.is_dir()
    except OSError as exc:
        raise _unreadable(path, what, exc) from None
    if folder:
        raise UserError(f"{what} {path} is a folder; give the name of a file to write.")
    if not parent:
        raise UserError(f"{what} {path} cannot be written: the folder {path.parent} does not exist. Create it first.")
    if len(path.name.encode()) > os.pathconf(path.parent, "PC_NAME_MAX"):
        raise _too_long(path, what)
    return path


def write_file(path, data: bytes | str, what: str) -> None:
    """``data`` into ``path``, a file a user named: written to a new file beside it, then renamed over it, so
    that a link, a FIFO or a device at ``path`` is replaced, never written through or waited on; a folder at
    ``path``, a missing folder or a name too long for the file system is a UserError naming ``what``."""
    path = check_target(path, what)
    tmp = path.with_name(f".{path.name[:200]}.{os.getpid()}.tmp")
    try:
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        if exc.errno != errno.ENAMETOOLONG:
            raise
        raise _too_long(path, what) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def not_admitted(path, name: str) -> UserError:
    """The error for a file that names ``name``, which is not admitted."""
    return UserError(
        f"{path} was refused: reading it would call {name}, and dt-primal reads only {ADMITTED_IN_WORDS} from a "
        f"file, because unpickling anything else can run code on this machine (nothing in the file was "
        f"run). Do not use the file unless you know where it came from; ask for one written by train.py, "
        f"or for a dataset as an .hdf5 file."
    )


# --- pickles (a checkpoint's data.pkl, a decision-transformer dataset) ---


class _ArrayName:
    """What a pickle gets for ``numpy.ndarray``: only a marker for ``_reconstruct``; calling it (an array
    of uninitialised memory of a size the file chooses) is refused."""

    def __new__(cls, *args, **kwargs):
        raise UserError(
            "it calls numpy.ndarray directly (an array of uninitialised memory of a size the file "
            "chooses), which NumPy's own pickles never do"
        )


class _Array:
    """An array as NumPy pickles it, made empty by ``_reconstruct`` and filled by ``__setstate__``, which
    checks that the file holds every byte of the shape it declares before NumPy allocates it."""

    def __init__(self, subtype=None, shape=(0,), dtype=b"b"):
        if subtype is not _ArrayName or tuple(shape) != (0,):
            raise UserError(
                f"it rebuilds an array with the shape {str(shape)[:80]}, where NumPy's own pickles "
                f"start from an empty array"
            )
        self.array = None

    def __setstate__(self, state):
        version, shape, dtype, fortran, raw = state if len(state) == 5 else (1, *state)
        if not (
            isinstance(dtype, np.dtype)
            and isinstance(shape, tuple)
            and all(isinstance(n, int) and 0 <= n < 2**40 for n in shape)
        ):
            raise UserError(f"an array in it declares the shape {str(shape)[:80]} and dtype {str(dtype)[:80]}")
        count = math.prod(shape)
        held = len(raw) if dtype.hasobject else len(raw) // max(dtype.itemsize, 1)
        if not isinstance(raw, (bytes, bytearray, list)) or held != count:
            raise UserError(f"an array in it declares {count} values of {dtype} but holds {held}")
        self.array = np._core.multiarray._reconstruct(np.ndarray, (0,), b"b")
        self.array.__setstate__((version, shape, dtype, fortran, raw))


def _unwrap(value):
    """``value`` with every ``_Array`` replaced by its array, in dicts, lists and tuples."""
    if isinstance(value, _Array):
        if value.array is None:
            raise UserError("an array in it is never filled")
        return value.array
    if isinstance(value, dict):
        return {k: _unwrap(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_unwrap(v) for v in value)
    return value


_NUMPY = {
    "numpy.ndarray": _ArrayName,
    "numpy.dtype": np.dtype,
    "numpy._core.multiarray._reconstruct": _Array,
    "numpy._core.multiarray.scalar": np._core.multiarray.scalar,
    "numpy._core.numeric._frombuffer": np._core.numeric._frombuffer,
}
# what a pickle may name: NumPy's rebuilders (bounded) under their NumPy 2 and NumPy 1 module names, and the bytes
# decoder of pickle protocol 2 (the protocol torch.save writes)
ADMITTED_GLOBALS = {
    **_NUMPY,
    **{k.replace("numpy._core", "numpy.core"): v for k, v in _NUMPY.items()},
    "_codecs.encode": _codecs.encode,
}
# the classes of NumPy's dtypes of numbers, booleans and text, which torch.load checks as it rebuilds a dtype
NUMPY_DTYPES = sorted({type(np.dtype(code)) for code in "?bBhHiIlLqQefdgFDGSU"}, key=str)


class _PlainUnpickler(pickle.Unpickler):
    def __init__(self, file, path):
        super().__init__(file)
        self.path = path

    def find_class(self, module: str, name: str):
        try:
            return ADMITTED_GLOBALS[f"{module}.{name}"]
        except KeyError:
            raise not_admitted(self.path, f"{module}.{name}") from None


def _unpickling_error(path, exc: Exception) -> UserError | None:
    """The UserError for a pickle that names or rebuilds something not admitted (``exc`` raised by either
    unpickler); None for other failures."""
    if isinstance(exc, UserError):
        return (
            exc
            if str(path) in str(exc)
            else UserError(
                f"{path} was refused: {exc}. dt-primal reads only {ADMITTED_IN_WORDS} as NumPy and torch.save write "
                f"them; use a file written by train.py, or a dataset as an .hdf5 file."
            )
        )
    named = re.search(r"GLOBAL ([\w.]+)", str(exc))
    if named and isinstance(exc, pickle.UnpicklingError):
        return not_admitted(path, named.group(1))
    return None


def load_pickle(path) -> object:
    """The plain data a pickle file holds; a UserError when it names anything not admitted, or is not a
    pickle of plain data."""
    regular_file(path, "The dataset file")
    try:
        with open(path, "rb") as f:
            return _unwrap(_PlainUnpickler(f, path).load())
    except Exception as exc:
        raise (
            _unpickling_error(path, exc)
            or UserError(
                f"Cannot unpickle {path} ({type(exc).__name__}: {str(exc)[:200]}); the file may be truncated or not a "
                f"pickle."
            )
        ) from None


# --- checkpoints ---


def _check_archive(path, size: int) -> None:
    """``path`` is a zip archive as ``torch.save`` writes it: its entries stored uncompressed, so that what
    they declare cannot exceed the file (a compressed entry could inflate a small file a thousandfold)."""
    try:
        with zipfile.ZipFile(path) as archive:
            entries = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        raise UserError(
            f"Checkpoint {path} is not a checkpoint archive ({exc}); it is truncated or corrupted, or was "
            f"not written by train.py. Use an earlier copy or retrain."
        ) from None
    packed = [e.filename for e in entries if e.compress_type != zipfile.ZIP_STORED]
    declared = sum(e.file_size for e in entries)
    if packed or declared > size:
        raise UserError(
            f"Checkpoint {path} was refused: its entries declare {declared} bytes in a file of {size}"
            f"{' and ' + packed[0] + ' is compressed' if packed else ''}, which torch.save never writes "
            f"(a small file must not make the reader allocate much more than its size). Use a checkpoint "
            f"written by train.py."
        )


def load_torch(path) -> object:
    """``torch.load`` of the tensors and plain data a checkpoint holds, on the CPU, after checking the archive;
    a UserError when it names anything not admitted. Other failures raise as ``torch.load``'s do."""
    import torch

    _check_archive(path, regular_file(path, "Checkpoint"))
    admitted = [(f, name) for name, f in ADMITTED_GLOBALS.items()] + [(_Array, "dt_primal.untrusted._Array")]
    try:
        with torch.serialization.safe_globals(admitted + NUMPY_DTYPES):
            return _unwrap(torch.load(path, map_location="cpu", weights_only=True))
    except Exception as exc:
        refusal = _unpickling_error(path, exc)
        if refusal is not None:
            raise refusal from None
        raise


# --- HDF5 ---


def _refuse_links_out(links: list[tuple[bytes, int]], path) -> None:
    """Refuse a file with a link that is neither hard nor soft (an external link, or a user-defined one), before
    any object is opened: a soft link may lead through one."""
    from h5py import h5l

    out = next((name for name, kind in links if kind not in (h5l.TYPE_HARD, h5l.TYPE_SOFT)), None)
    if out is not None:
        raise UserError(
            f"{path} was refused: '{out.decode(errors='replace')}' links to another file, and dt-primal reads no "
            f"file but the one given. Copy the data into the file (h5repack) and try again."
        )


def _check_hdf5_object(f, name: bytes, path) -> int:
    """The bytes the dataset at link ``name`` of the open file ``f`` declares (0 for a group), after checking
    that it is stored in the file and declares no more than its stored bytes can hold. h5py's low-level calls:
    its high-level ones cost about 0.2 ms an object, seconds for a Minari file of thousands of episodes."""
    from h5py import h5d, h5o

    try:
        node = h5o.open(f.id, name)
    except KeyError:  # a soft link to nothing
        return 0
    if not isinstance(node, h5d.DatasetID):
        return 0
    shown, plist = name.decode(errors="replace"), node.get_create_plist()
    if plist.get_external_count() or plist.get_layout() == h5d.VIRTUAL:
        raise UserError(
            f"{path} was refused: '{shown}' keeps its data in other files, and dt-primal reads no file but "
            f"the one given. Copy the data into the file (h5repack) and try again."
        )
    declared = int(np.prod(node.shape, dtype=np.int64)) * node.dtype.itemsize if node.shape else node.dtype.itemsize
    stored = node.get_storage_size()
    if declared > 4096 and declared > MAX_RATIO * max(stored, 1):
        raise UserError(
            f"{path} was refused: '{shown}' declares {node.shape} values ({declared} bytes) but stores "
            f"{stored} bytes, more than any compression can restore; the file is damaged or crafted."
        )
    return declared


@contextlib.contextmanager
def open_hdf5(path):
    """The HDF5 file ``path``, open for reading, every object of it checked (``_refuse_links_out``,
    ``_check_hdf5_object``), and all datasets together small enough for this machine's memory."""
    import h5py

    regular_file(path, "The dataset file")
    with h5py.File(path, "r") as f:
        links: list[tuple[bytes, int]] = []  # every link and its type (h5py reuses the info it passes), none followed
        f.id.links.visit(lambda name, info: links.append((name, info.type)), info=True)
        _refuse_links_out(links, path)
        declared = sum(_check_hdf5_object(f, name, path) for name, _ in links)
        check_fits_memory(declared, path, "arrays")
        yield f


# --- Minari ---

SPACE_DTYPES = {"float32", "float64", "float16", "int8", "int16", "int32", "int64", "uint8"}


def _check_box(serialized, what: str, where: str) -> None:
    try:
        space = json.loads(serialized)
        shape = tuple(space["shape"])
        ok = (
            space["type"] == "Box"
            and space["dtype"] in SPACE_DTYPES
            and len(shape) == 1
            and all(isinstance(n, int) and 0 < n <= 100_000 for n in shape)
        )
    except (TypeError, ValueError, KeyError):
        ok = False
    if not ok:
        raise UserError(
            f"{where}'s {what} is not a flat Box space of at most 100000 numbers (found "
            f"{str(serialized)[:120]}); only flat observation and action spaces are supported."
        )


def check_minari_metadata(meta: object, where: str) -> None:
    """A Minari dataset's ``metadata.json`` (parsed), checked before Minari reads it: Minari makes the
    environment of a dataset whose spaces are missing, and allocates from the counts it declares."""
    from envs import check_spec

    if not isinstance(meta, dict):
        raise UserError(f"{where}'s metadata.json is not a JSON object; the dataset is damaged.")
    for key in ("observation_space", "action_space"):
        if key not in meta:
            raise UserError(
                f"{where}'s metadata.json lacks its {key}, which Minari then recovers by making the "
                f"environment its env_spec names; a file may not make an environment. Every dataset "
                f"Minari writes records it: ask for a complete copy."
            )
        _check_box(meta[key], key, where)
    if meta.get("data_format") not in ("hdf5", "arrow"):
        raise UserError(
            f"{where}'s metadata.json gives the data format {str(meta.get('data_format'))[:40]!r}; Minari "
            f"writes hdf5 or arrow."
        )
    episodes, steps = (meta.get(k) for k in ("total_episodes", "total_steps"))
    if not all(is_count(n) for n in (episodes, steps)) or episodes > steps:
        raise UserError(
            f"{where}'s metadata.json declares {str(episodes)[:40]} episodes and {str(steps)[:40]} steps; "
            f"they must be counts, with no more episodes than steps."
        )
    check_fits_memory(episodes * 8, where, "an index of its episodes")  # Minari allocates it from the count
    if meta.get("env_spec") is not None:
        try:
            meta["env_spec"] = _current_env_spec(meta["env_spec"])
            check_spec(meta["env_spec"])
        except (ValueError, TypeError, KeyError) as exc:
            raise UserError(f"{where}'s metadata.json: {exc}") from None


def _current_env_spec(text: str) -> str:
    """A Minari env_spec without the fields of older Gymnasium versions that this one's EnvSpec no longer takes
    (Gymnasium 1.0 wrote ``apply_api_compatibility`` and ``autoreset``; Minari drops them when it reads a
    dataset, and so does this): dropping a field can add no code to run."""
    from gymnasium.envs.registration import EnvSpec

    spec = json.loads(text)
    if not isinstance(spec, dict):
        raise ValueError("its env_spec is not a JSON object")
    known = {f.name for f in dataclasses.fields(EnvSpec) if f.init}
    return json.dumps({k: v for k, v in spec.items() if k in known})


def minari_spaces(meta: dict) -> tuple[list[int], list[np.dtype]]:
    """The numbers per step and the dtypes of the observation and action spaces of a Minari ``metadata.json``
    checked by ``check_minari_metadata``."""
    spaces = [json.loads(meta[key]) for key in ("observation_space", "action_space")]
    return [math.prod(s["shape"]) for s in spaces], [np.dtype(s["dtype"]) for s in spaces]


def check_steps_add_up(total: int, meta: dict, where: str) -> None:
    """The ``total`` steps of a Minari dataset's episodes, as read, are the steps its ``metadata.json`` declares."""
    if total != meta["total_steps"]:
        raise UserError(
            f"{where}'s episodes hold {total} steps, its metadata.json declares {meta['total_steps']}. The "
            f"dataset is damaged: download or make it again."
        )


@contextlib.contextmanager
def open_minari(dataset_id: str):
    """The local Minari dataset ``dataset_id``, its files checked: ``(metadata, hdf5)``, its metadata checked
    (``check_minari_metadata``), no links out of its folder, and its HDF5 file checked by ``open_hdf5``, then open
    (``hdf5`` None for the Arrow format: its files fit in memory, and ``dt_primal.arrow_episodes`` reads and
    checks their episodes)."""
    from minari.storage.datasets_root_dir import get_dataset_path

    data = get_dataset_path(dataset_id) / "data"
    where = f"The Minari dataset {dataset_id}"
    links = [p for p in (data, *data.rglob("*")) if p.is_symlink()]
    if links:
        raise UserError(
            f"{where} was refused: {links[0]} is a link, and dt-primal reads no file outside a dataset's "
            f"folder. Copy the dataset without links."
        )
    meta = read_json(data / "metadata.json", f"{where}'s metadata", "The dataset is damaged.")
    check_minari_metadata(meta, where)
    if meta["data_format"] == "hdf5":
        import h5py

        with open_hdf5(data / "main_data.hdf5"):
            pass
        # opened again for reading: closing it freed what the check cached (about 30 KB an episode)
        with h5py.File(data / "main_data.hdf5", "r") as f:
            yield meta, f
        return
    try:
        import pyarrow  # noqa: F401 (Minari reads Arrow datasets with it)
    except ImportError:
        raise UserError(
            f"{where} is stored in the Arrow format, which dt-primal reads with pyarrow, and pyarrow is not "
            f'installed: pip install "dt-primal[arrow]" (or pip install pyarrow), then run the command again.'
        ) from None
    check_fits_memory(sum(p.stat().st_size for p in data.rglob("*") if p.is_file()), where, "Arrow files")
    yield meta, None


def check_minari_folder(dataset_id: str) -> dict:
    """The metadata of the local Minari dataset ``dataset_id``, its files checked as ``open_minari`` checks them
    (before Minari reads anything of it)."""
    with open_minari(dataset_id) as (meta, _):
        return meta


# --- run records ---


def is_count(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def read_json(path, what: str, remedy: str, limit: int = MAX_RECORD) -> object:
    """The JSON value of the regular file ``path``, of at most ``limit`` bytes (``read_bytes``); ``what`` names
    the file in the messages ("The run record"), ``remedy`` says what to do with one that is not JSON."""
    data = read_bytes(path, what, limit)
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise UserError(f"{what} {path} is not JSON ({str(exc)[:100]}); it is damaged. {remedy}") from None


MAX_ONNX = 2**31  # an exported policy: its weights (the paper's model: a few MB) and graph in one file
ONNX_FORMAT = "dt-primal policy 1"  # dt_primal.export.FORMAT
ONNX_META = ("format", "state_mean", "state_std", "reward_scale", "context", "max_ep_len", "action_bounds")
ONNX_META += ("model_config", "config", "task", "step", "dataset")


def _onnx_meta(meta: dict, path) -> dict:
    """The metadata of an exported policy, parsed and checked: numbers where numbers belong."""
    try:
        values = {k: json.loads(meta[k]) for k in ONNX_META}
    except (KeyError, TypeError, ValueError, RecursionError) as exc:
        raise UserError(
            f"{path} is not a policy exported by python -m dt_primal.cli.export (metadata: {exc})."
        ) from None
    if values["format"] != ONNX_FORMAT:
        raise UserError(f"{path} is in format {str(values['format'])[:40]!r}, not {ONNX_FORMAT!r}: export it again.")
    mean, std = (
        np.asarray(values[k], dtype=float) if _numbers(values[k]) else None for k in ("state_mean", "state_std")
    )
    bounds = values["action_bounds"]
    ok = (
        mean is not None
        and std is not None
        and mean.ndim == 1
        and mean.shape == std.shape
        and 0 < len(mean) <= 100_000
        and bool(np.all(std > 0))
        and is_number(values["reward_scale"])
        and values["reward_scale"] > 0
        and is_count(values["context"])
        and 1 <= values["context"] <= 100_000
        and is_count(values["max_ep_len"])
        and 1 <= values["max_ep_len"] <= 10_000_000
        and isinstance(bounds, list)
        and len(bounds) == 2
        and all(_numbers(b) for b in bounds)
        and 0 < len(bounds[0]) == len(bounds[1]) <= 100_000
        and isinstance(values["config"], dict)
        and isinstance(values["task"], dict)
    )
    if not ok or not _float32_ok(values):
        raise UserError(
            f"{path}: the policy's metadata (normalisation, reward scale, context, bounds) is damaged: not "
            f"positive, or not finite in float32, the precision the policy acts in."
        )
    return values


def _numbers(x) -> bool:
    return isinstance(x, list) and all(is_number(v) for v in x)


def _float32_ok(meta: dict) -> bool:
    """Whether what the policy computes from its metadata stays finite in float32, the precision it acts in:
    the normalisation (obs − mean) / std and the returns-to-go divided by the reward scale."""
    with np.errstate(all="ignore"):
        mean, std = (np.asarray(meta[k], np.float64).astype(np.float32) for k in ("state_mean", "state_std"))
        scale = np.float32(meta["reward_scale"])
        bounds = np.asarray(meta["action_bounds"], np.float64).astype(np.float32)
        inverse = np.float32(1) / std
        return bool(
            np.isfinite(mean).all()
            and (std > 0).all()
            and np.isfinite(inverse).all()
            and np.isfinite(mean * inverse).all()
            and scale > 0
            and np.isfinite(np.float32(1) / scale)
            and np.isfinite(bounds).all()
        )


def _external_tensors(data: bytes, path) -> list[str]:
    """The names of the tensors of the ONNX model ``data`` whose values would be read from other files
    (external data), in the graph, its subgraphs and its functions; a UserError when it is not ONNX."""
    import onnx

    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception as exc:  # protobuf's DecodeError
        raise UserError(f"{path} is not an ONNX model ({type(exc).__name__}).") from None

    def nodes(graph):
        for node in graph.node:
            yield node
            for a in node.attribute:
                for g in [a.g] * a.HasField("g") + list(a.graphs):
                    yield from nodes(g)

    def tensors(graph):
        yield from graph.initializer
        for sparse in graph.sparse_initializer:
            yield from (sparse.values, sparse.indices)
        for node in nodes(graph):
            for a in node.attribute:
                yield from [a.t] * a.HasField("t") + list(a.tensors)
                for sparse in [a.sparse_tensor] * a.HasField("sparse_tensor") + list(a.sparse_tensors):
                    yield from (sparse.values, sparse.indices)

    graphs = [model.graph] + [onnx.GraphProto(node=f.node) for f in model.functions]
    external = onnx.TensorProto.EXTERNAL
    return [t.name for g in graphs for t in tensors(g) if t.data_location == external or len(t.external_data)]


def check_onnx_policy(path):
    """(an onnxruntime CPU session, the checked metadata) of the exported policy at ``path``: a regular file of
    at most MAX_ONNX bytes, loaded from its bytes (a graph that names external weight files cannot load),
    run by onnxruntime's standard operators only, with the inputs the export writes and metadata that
    agrees with them, finite in float32. A policy is one file: a tensor stored as external data is refused
    before onnxruntime sees the graph (it would read that file, relative to the working folder)."""
    try:
        import onnx  # noqa: F401 (checks the graph before onnxruntime loads it)
        import onnxruntime as ort
    except ImportError as exc:
        raise UserError(
            f"An .onnx policy is read with onnx and run on onnxruntime ({exc.name} is missing): "
            f'pip install onnx onnxruntime (or pip install "dt-primal[onnx]").'
        ) from None
    data = read_bytes(path, "The ONNX policy", MAX_ONNX)
    external = _external_tensors(data, path)
    if external:
        raise UserError(
            f"{path} stores {len(external)} of its tensors ({', '.join(external[:3])[:120]}) as external data, "
            f"in other files; an exported policy is one file, and those files were not read. Export it again "
            f"with python -m dt_primal.cli.export."
        )
    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # not ONNX, external data, an operator onnxruntime lacks
        raise UserError(
            f"{path} is not a policy onnxruntime can load ({type(exc).__name__}: {str(exc)[:200]})."
        ) from None
    meta = _onnx_meta(session.get_modelmeta().custom_metadata_map, path)
    shapes = {i.name: i.shape for i in session.get_inputs()}
    expect = {"states": len(meta["state_mean"]), "actions": len(meta["action_bounds"][0]), "returns_to_go": 1}
    if (
        set(shapes) != {"states", "actions", "returns_to_go", "timesteps"}
        or any(len(shapes[k]) != 3 or shapes[k][2] != n for k, n in expect.items())
        or [o.name for o in session.get_outputs()] != ["action"]
    ):
        raise UserError(f"{path}: its graph's inputs {shapes} are not those of an exported policy.")
    return session, meta
