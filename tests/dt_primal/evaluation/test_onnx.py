"""A policy exported to ONNX acts as its checkpoint does, on onnxruntime and NumPy, where torch cannot be imported."""

import json

import numpy as np
import pytest
from conftest import run, tiny_run

from dt_primal.errors import UserError
from dt_primal.evaluation.policy import policy_from_checkpoints
from dt_primal.evaluation.rollout import rollout
from dt_primal.files.checkpoint import load_checkpoint
from envs import TASKS

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

TARGETS = [3600.0, 1800.0, 900.0]

pytestmark = pytest.mark.xdist_group("onnx")  # one test process runs them all: each model is exported once

# a process in which torch cannot be imported: the ONNX policy of argv[1] replays the observations, rewards and
# live flags of argv[2] (one environment per target) and writes its actions to argv[3]
ACT_WITHOUT_TORCH = """
import sys
sys.modules["torch"] = None  # import torch fails
import numpy as np
import dt_primal
steps = np.load(sys.argv[2])
policy = dt_primal.load_policy(sys.argv[1])
policy.reset(steps["targets"])
actions = [policy.act(steps["obs"][0], live=steps["live"][0])]
actions += [policy.act(o, reward=r, live=lv) for o, r, lv in zip(steps["obs"][1:], steps["rewards"], steps["live"][1:])]
assert "torch" not in {m for m, v in sys.modules.items() if v is not None}
np.save(sys.argv[3], np.stack(actions))
"""


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """``exports(model)``: a ``tiny_run`` of a tiny model (context 4), and its ONNX export; each model trained and
    exported once for the module."""
    from dt_primal.export import export

    made = {}

    def make(model: str):
        if model not in made:
            folder = tiny_run(tmp_path_factory.mktemp(model), model=model, context=4, max_ep_len=60)
            made[model] = folder / "last.pt", export(folder / "last.pt", folder.parent / "policy.onnx")
        return made[model]

    return make


@pytest.mark.parametrize("model", ["dt", "primal", "bc"])
def test_the_onnx_policy_acts_as_the_checkpoint_without_torch(exports, model, tmp_path):
    checkpoint, onnx_file = exports(model)
    policy = policy_from_checkpoints([load_checkpoint(checkpoint)])
    seen, act = [], policy.act

    def record(obs, reward, live):
        action = act(obs, reward, live)
        seen.append((obs.copy(), np.array(reward), live.copy(), action))
        return action

    policy.act = record
    rollout(policy, TASKS["hopper"], TARGETS, 1, seeds=[100_000])  # one environment per target, one episode each
    live = np.stack([lv.reshape(-1) for _, _, lv, _ in seen])
    assert len(seen) > policy.context  # an episode longer than the context
    np.savez(
        tmp_path / "steps.npz",
        obs=np.stack([o.reshape(len(TARGETS), -1) for o, _, _, _ in seen]),
        rewards=np.stack([np.broadcast_to(r, (1, len(TARGETS))).reshape(-1) for _, r, _, _ in seen[1:]]),
        live=live,
        targets=np.array(TARGETS),
    )
    res = run("-c", ACT_WITHOUT_TORCH, str(onnx_file), str(tmp_path / "steps.npz"), str(tmp_path / "a.npy"))
    assert res.returncode == 0, res.stderr
    got = np.load(tmp_path / "a.npy")
    want = np.stack([a.reshape(len(TARGETS), -1) for _, _, _, a in seen])
    np.testing.assert_allclose(got[live], want[live], atol=1e-4)
    assert not got[~live].any()


def test_evaluate_scores_the_onnx_policy_as_its_checkpoint(exports, tmp_path):
    checkpoint, onnx_file = exports("primal")  # evaluate.py reads every export alike
    scores = []
    for path in (checkpoint, onnx_file):
        out = tmp_path / f"{path.suffix[1:]}.json"
        cmd = ["evaluate.py", str(path), "--episodes", "2", "--out", str(out), "--device", "cpu"]
        res = run(*cmd, *["--precision", "fp32"] * (path.suffix == ".pt"))
        assert res.returncode == 0, res.stderr
        scores.append([t["return_mean"] for t in json.loads(out.read_text())["checkpoints"][0]["targets"]])
    np.testing.assert_allclose(scores[0], scores[1], rtol=1e-4)


def test_a_file_that_is_not_an_exported_policy_is_refused(exports, tmp_path):
    import onnx

    from dt_primal import load_policy

    (tmp_path / "junk.onnx").write_bytes(b"not a graph")
    with pytest.raises(UserError, match="not an ONNX model|not a policy onnxruntime can load"):
        load_policy(tmp_path / "junk.onnx")
    model = onnx.load(str(exports("primal")[1]))
    for prop in model.metadata_props:
        if prop.key == "state_std":
            prop.value = json.dumps([0.0] * len(json.loads(prop.value)))  # a zero std: every state infinite
    onnx.save(model, str(tmp_path / "bad.onnx"))
    with pytest.raises(UserError, match="metadata .* is damaged"):
        load_policy(tmp_path / "bad.onnx")


@pytest.mark.parametrize(
    "key, value",
    [("model_config", {}), ("model_config", {"context": [4]}), ("config", {"seed": 0}), ("task", {}), ("step", -1)],
)
def test_evaluate_refuses_an_export_whose_run_record_is_damaged(exports, tmp_path, key, value):
    """What evaluate.py reads of an export beside acting (its run's config, architecture, task, step) is checked
    as a checkpoint's is: a message and status 2, never a traceback."""
    import onnx

    model = onnx.load(str(exports("dt")[1]))
    for prop in model.metadata_props:
        if prop.key == key:
            prop.value = json.dumps(value)
    onnx.save(model, str(tmp_path / "bad.onnx"))
    res = run("evaluate.py", str(tmp_path / "bad.onnx"), "--episodes", "1", "--out", str(tmp_path / "e.json"))
    assert res.returncode == 2 and "run record in its metadata is damaged" in res.stderr, res.stderr


def rewritten(exported, tmp_path, change):
    """A copy of an exported policy after ``change(model)`` (an onnx ModelProto), saved as one file."""
    import onnx

    model = onnx.load(str(exported))
    change(model)
    onnx.save(model, str(tmp_path / "changed.onnx"))
    return tmp_path / "changed.onnx"


def test_a_policy_that_names_external_data_is_refused_before_anything_reads_it(exports, tmp_path, monkeypatch):
    """An initializer stored as external data at a relative location would be read from the working folder,
    and its bytes could come back as actions: the file is refused, whatever that file holds."""
    import onnx
    from onnx.external_data_helper import set_external_data

    from dt_primal import load_policy

    def external(model):
        tensor = max(model.graph.initializer, key=lambda t: len(t.raw_data))
        secret = b"\x01" * len(tensor.raw_data)
        (tmp_path / "secret.bin").write_bytes(secret)
        set_external_data(tensor, "secret.bin", offset=0, length=len(secret))
        tensor.data_location = onnx.TensorProto.EXTERNAL
        tensor.ClearField("raw_data")

    path = rewritten(exports("dt")[1], tmp_path, external)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match="external data"):
        load_policy(path)


@pytest.mark.parametrize(
    "key, value", [("state_std", 1e-300), ("state_mean", 1e300), ("reward_scale", 1e-300), ("state_std", 1e-40)]
)
def test_metadata_is_checked_in_the_precision_the_policy_acts_in(exports, tmp_path, key, value):
    """Values that pass in float64 but make every action inf or NaN in float32 (a std of 1e-300 is 0 there)."""
    from dt_primal import load_policy

    def change(model):
        for prop in model.metadata_props:
            if prop.key == key:
                old = json.loads(prop.value)
                prop.value = json.dumps([value] * len(old) if isinstance(old, list) else value)

    with pytest.raises(UserError, match="not finite in float32"):
        load_policy(rewritten(exports("dt")[1], tmp_path, change))


@pytest.mark.parametrize("op", ["Concat", "Div"])
def test_a_graph_that_fails_or_gives_non_finite_actions_is_a_message(exports, tmp_path, op):
    """A graph that loads but acts wrongly (actions of another shape, or inf) is a message and status 2."""
    from onnx import helper

    def change(model):
        last = next(n for n in model.graph.node if "action" in n.output)
        last.output[list(last.output).index("action")] = "raw"
        zero = helper.make_tensor("zero", 1, [1], [0.0])  # float32
        model.graph.initializer.append(zero)
        inputs = ["raw", "raw"] if op == "Concat" else ["raw", "zero"]
        model.graph.node.append(helper.make_node(op, inputs, ["action"], **({"axis": -1} if op == "Concat" else {})))

    path = rewritten(exports("dt")[1], tmp_path, change)
    res = run("evaluate.py", str(path), "--episodes", "1", "--out", str(tmp_path / "e.json"))
    assert res.returncode == 2 and "Traceback" not in res.stderr and "Export it again" in res.stderr, res.stderr


def test_export_writes_beside_its_target_and_renames_never_through_a_link(exports, tmp_path, capsys):
    """The export is written to a new file and renamed: a link at the target is replaced (the file it points to
    is untouched), a FIFO does not block it; a folder, a missing folder or a name too long is status 2 at once."""
    import os

    from dt_primal.cli.export import main

    def status(out) -> int:
        try:
            main([str(exports("dt")[0]), str(out)])
        except SystemExit as exc:
            return exc.code
        return 0

    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    (tmp_path / "link.onnx").symlink_to(victim)
    os.mkfifo(tmp_path / "fifo.onnx")
    (tmp_path / "folder.onnx").mkdir()
    assert status(tmp_path / "link.onnx") == 0 and victim.read_text() == "keep"
    assert not (tmp_path / "link.onnx").is_symlink() and (tmp_path / "link.onnx").stat().st_size > 1000
    assert status(tmp_path / "fifo.onnx") == 0 and (tmp_path / "fifo.onnx").is_file()
    for out, says in [
        (tmp_path / "folder.onnx", "is a folder"),
        (tmp_path / "missing" / "p.onnx", "does not exist"),
        (tmp_path / ("p" * 300 + ".onnx"), "too long"),
    ]:
        assert status(out) == 2 and says in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo.onnx", "folder.onnx", "link.onnx", "victim.txt"]
