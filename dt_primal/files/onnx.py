"""Exported policies (``.onnx``): loaded from their bytes (no external weight files), standard operators only,
metadata checked against the graph's inputs. The format's keys live here, shared by the writer
(``dt_primal.export``) and the reader (``dt_primal.evaluation.onnx_policy``)."""

from __future__ import annotations

import json

import numpy as np

from dt_primal.errors import UserError
from dt_primal.files.reading import acts_finite, is_count, is_number, read_bytes

MAX_ONNX = 2**31  # an exported policy: its weights (the paper's model: a few MB) and graph in one file
ONNX_FORMAT = "dt-primal policy 1"
ONNX_META = ("format", "state_mean", "state_std", "reward_scale", "context", "max_ep_len", "action_bounds")
ONNX_META += ("model_config", "config", "task", "step", "dataset")


def metadata_props(values: dict) -> dict[str, str]:
    """An exported policy's metadata as the file stores it: ``values`` of every key of ``ONNX_META`` but the
    format, each as JSON, and the format; the one list of them for the writer (``dt_primal.export``) and the
    reader (``check_onnx_policy``)."""
    if set(values) != set(ONNX_META) - {"format"}:
        raise ValueError(f"an exported policy's metadata has exactly the keys {', '.join(ONNX_META[1:])}")
    return {k: json.dumps(v) for k, v in {"format": ONNX_FORMAT, **values}.items()}


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
    """Whether what the policy computes from its metadata stays finite in float32 (``acts_finite``), its action
    bounds too."""
    with np.errstate(all="ignore"):
        bounds = np.asarray(meta["action_bounds"], np.float64).astype(np.float32)
    return acts_finite(meta["state_mean"], meta["state_std"], meta["reward_scale"]) and bool(np.isfinite(bounds).all())


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
