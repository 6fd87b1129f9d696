"""The episodes of a Minari dataset stored in the Arrow format, read by dt-primal itself and checked against
the dataset's metadata before any of their data is decoded.

Minari writes each episode ``i`` as ``data/i/part-0.arrow`` (an Arrow IPC file holding one record batch:
``observations``, then ``actions``, ``rewards``, ``terminations`` and ``truncations`` padded by one row, and
optional ``infos``, never read here) beside ``data/i/metadata.json`` (its ``total_steps``). Before a batch
is decoded, its message is read from the file's bytes: one record batch, as many rows as the episode's
metadata says, no nulls, every buffer inside the message's body and declaring (when compressed) no more
bytes than its rows need; after decoding, pyarrow's full validation. An episode's file can therefore
neither be read past its end, nor expand beyond its rows, nor be cut into other episodes.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from dt_primal.errors import UserError
from dt_primal.files.minari import check_steps_add_up, minari_spaces
from dt_primal.files.reading import check_fits_memory, is_count, read_bytes, read_json

COLUMNS = ("observations", "actions", "rewards", "terminations", "truncations")
MAX_FILE = 2**34  # one episode's file: at most 100,000 numbers per step (``minari._check_box``)


class _Table:
    """A FlatBuffers table inside ``buf`` at ``pos``: its fields read by index, every read bounds-checked."""

    def __init__(self, buf: bytes, pos: int):
        self.buf, self.pos = buf, pos
        self.vtable = pos - self._get("<i", pos)
        self.vsize = self._get("<H", self.vtable)

    def _get(self, fmt: str, pos: int):
        if not 0 <= pos <= len(self.buf) - struct.calcsize(fmt):
            raise ValueError("an offset points outside the message")
        return struct.unpack_from(fmt, self.buf, pos)[0]

    def _field(self, i: int) -> int | None:
        slot = 4 + 2 * i
        offset = self._get("<H", self.vtable + slot) if slot + 2 <= self.vsize else 0
        return self.pos + offset if offset else None

    def scalar(self, i: int, fmt: str, default=0):
        at = self._field(i)
        return default if at is None else self._get(fmt, at)

    def table(self, i: int) -> _Table | None:
        at = self._field(i)
        return None if at is None else _Table(self.buf, at + self._get("<I", at))

    def structs(self, i: int, fmt: str) -> list[tuple]:
        """Field ``i``, a vector of structs of the layout ``fmt``."""
        at = self._field(i)
        if at is None:
            return []
        start = at + self._get("<I", at)
        size, count = struct.calcsize(fmt), self._get("<I", start)
        if count * size > len(self.buf) - start - 4:
            raise ValueError("a vector is longer than the message")
        return [struct.unpack_from(fmt, self.buf, start + 4 + k * size) for k in range(count)]


def _bitmap(n: int) -> int:
    return (n + 7) // 8


def _needs(rows: int, dims: tuple[int, int], itemsizes: tuple[int, int]) -> tuple[list, list]:
    """The (length, nulls) of the read columns' nodes and the bytes each of their buffers needs, in the order
    of the Arrow IPC format (a fixed-size list: its validity, its child's validity, the child's values)."""
    nodes, needs = [], []
    for dim, size in zip(dims, itemsizes):
        nodes += [rows, rows * dim]
        needs += [_bitmap(rows), _bitmap(rows * dim), rows * dim * size]
    nodes += [rows] * 3
    needs += [_bitmap(rows), 8 * rows, _bitmap(rows), _bitmap(rows), _bitmap(rows), _bitmap(rows)]
    return nodes, needs


def _check_batch(message, rows: int, dims, itemsizes) -> None:
    """The record batch ``message`` (a pyarrow ``Message``) holds ``rows`` rows of the read columns, without
    nulls, each buffer inside the body and declaring at most what its rows need (rounded up to Arrow's
    64-byte padding) before anything is decompressed."""
    flat = bytes(message.metadata)
    if len(flat) < 4:
        raise ValueError("the record batch message is empty")
    header = _Table(flat, struct.unpack_from("<I", flat)[0]).table(2)  # Message.header: the RecordBatch
    if header is None:
        raise ValueError("the record batch message has no header")
    if header.scalar(0, "<q") != rows:
        raise ValueError(f"it holds {header.scalar(0, '<q')} rows where the episode's metadata says {rows}")
    nodes, needs = _needs(rows, dims, itemsizes)
    found = header.structs(1, "<qq")
    if len(found) < len(nodes) or any(f != (n, 0) for f, n in zip(found, nodes)):
        raise ValueError("its columns' lengths differ from its rows, or hold nulls")
    body, compressed = bytes(message.body or b""), header.table(3) is not None
    buffers = header.structs(2, "<qq")
    if len(buffers) < len(needs):
        raise ValueError("it has fewer buffers than its columns need")
    for (offset, length), need in zip(buffers, needs):
        if offset < 0 or length < 0 or offset + length > len(body):
            raise ValueError("a buffer lies outside the message's body")
        declared = length
        if compressed and length:
            declared = struct.unpack_from("<q", body, offset)[0] if length >= 8 else -2
            declared = length - 8 if declared == -1 else declared
        if not 0 <= declared <= -(-need // 64) * 64:
            raise ValueError(f"a buffer declares {declared} bytes where its rows need {need}")


def _episode(path: Path, rows: int, dims: list[int], types: list[np.dtype]):
    """The columns of the episode file ``path``, of ``rows`` rows of spaces of ``dims`` numbers of ``types``,
    checked (``_check_batch``), then decoded."""
    import pyarrow as pa

    data = pa.py_buffer(read_bytes(path, "The Arrow episode file", MAX_FILE))
    if data[:6].to_pybytes() != b"ARROW1":
        raise ValueError("it is not an Arrow IPC file")
    expected = [pa.list_(pa.from_numpy_dtype(t), d) for t, d in zip(types, dims)]
    expected += [pa.float64(), pa.bool_(), pa.bool_()]
    messages = pa.ipc.MessageReader.open_stream(data[8:])
    schema = pa.ipc.read_schema(messages.read_next_message())
    if schema.names[:5] != list(COLUMNS) or schema.types[:5] != expected:
        raise ValueError(f"its columns are not {', '.join(COLUMNS)} of the dataset's spaces")
    batch = messages.read_next_message()
    if batch.type != "record batch":
        raise ValueError(f"it holds a {batch.type} message where an episode's record batch belongs")
    _check_batch(batch, rows, dims, [t.itemsize for t in types])
    try:
        messages.read_next_message()
        raise ValueError("it holds more than one record batch")
    except StopIteration:  # the end of the stream
        pass
    options = pa.ipc.IpcReadOptions(included_fields=list(range(len(COLUMNS))))
    table = pa.ipc.open_stream(data[8:], options=options).read_next_batch()
    table.validate(full=True)
    columns = [np.asarray(table.column(i).flatten() if i < 2 else table.column(i)) for i in range(len(COLUMNS))]
    return [c.reshape(rows, -1) if i < 2 else c for i, c in enumerate(columns)]


def read_episodes(data: Path, meta: dict, where: str) -> list[dict]:
    """The episodes of the Minari dataset folder ``data`` (its ``metadata.json``, ``meta``, checked by
    ``minari.check_minari_metadata``), as ``dict(observations, actions, rewards, terminals)`` arrays, the
    padding row of the last four cut off, as Minari returns them."""
    import pyarrow as pa

    dims, types = minari_spaces(meta)
    step = sum(d * t.itemsize for d, t in zip(dims, types)) + 10  # and a reward, two flags
    check_fits_memory((meta["total_steps"] + meta["total_episodes"]) * step, where, "episodes")
    episodes, total = [], 0
    for i in range(meta["total_episodes"]):
        folder = data / str(i)
        ep_meta = read_json(folder / "metadata.json", f"{where}'s episode {i} metadata", "")
        steps = ep_meta.get("total_steps") if isinstance(ep_meta, dict) else None
        if not is_count(steps) or steps < 1 or total + steps > meta["total_steps"]:
            raise UserError(
                f"{where}'s episode {i} declares {str(steps)[:40]} steps; the dataset's metadata.json declares "
                f"{meta['total_steps']} steps in all. The dataset is damaged: download or make it again."
            )
        total += steps
        try:
            files = [p for p in folder.iterdir() if p.name != "metadata.json" and p.name[:1] not in "._"]
        except OSError:
            files = []
        if len(files) != 1:
            raise UserError(
                f"{where}'s episode folder {folder} holds {len(files)} data files where Minari writes one. "
                f"The dataset is damaged: download or make it again."
            )
        try:
            obs, actions, rewards, terms, _ = _episode(files[0], steps + 1, dims, types)
        except (ValueError, struct.error, pa.ArrowException, StopIteration) as exc:
            raise UserError(
                f"{where}'s episode file {files[0]} was refused: {str(exc)[:200]}. The dataset is damaged: "
                f"download or make it again."
            ) from None
        episodes.append(dict(observations=obs, actions=actions[:-1], rewards=rewards[:-1], terminals=terms[:-1]))
    check_steps_add_up(total, meta, where)
    return episodes
