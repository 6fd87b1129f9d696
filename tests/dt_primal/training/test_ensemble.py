"""Seeds and datasets trained as one ensemble: each member is the run of its (dataset, seed) alone;
resumption is exact and an interruption loses nothing; the step's operations do not grow with the
members; the CUDA code path (the captured step)."""

import copy
import dataclasses
import json

import numpy as np
import pytest
import torch
from conftest import SMALL, TINY, hopper_file, make_episodes, needs_cuda, run
from torch.utils._python_dispatch import TorchDispatchMode

from datasets.loaders import load_dataset
from datasets.synthetic import write_d4rl
from dt_primal import data as data_module
from dt_primal.config import Config
from dt_primal.evaluation.acting import Acting
from dt_primal.evaluation.policy import Policy
from dt_primal.evaluation.rollout import Recorder, rollout
from dt_primal.files import checkpoint
from dt_primal.model.members import member_state, stack_members
from dt_primal.model.transformer import DecisionTransformer, dt_loss
from dt_primal.training.loop import train
from dt_primal.training.step import TrainStep
from envs import TASKS

pytestmark = pytest.mark.usefixtures("one_thread")  # in-process runs: one thread, as the subprocesses

CFG = Config(**SMALL, steps=12, checkpoint_every=1000)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return load_dataset(str(hopper_file(tmp_path_factory.mktemp("ens"))))


@pytest.fixture(scope="module")
def other(tmp_path_factory):
    """A second Hopper dataset, other episodes and statistics."""
    path = tmp_path_factory.mktemp("ens2") / "hopper_other.hdf5"
    write_d4rl(path, make_episodes(lengths=(30, 70, 45), seed=8))
    return load_dataset(str(path))


def weights(path):
    return torch.load(path, weights_only=True)["model"]


def assert_same(a, b, atol=1e-6):
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=atol, msg=k)


def assert_members_same(a, b, seeds=(0, 1), atol=0.0):
    """The members ``seeds`` of the ensembles in the folders ``a`` and ``b`` have the same weights."""
    for s in seeds:
        assert_same(weights(a / f"seed_{s}" / "last.pt"), weights(b / f"seed_{s}" / "last.pt"), atol=atol)


def test_the_step_is_adamw_with_warm_up_and_clipping_as_written_out(data):
    """TrainStep against the update written out with PyTorch's own AdamW, LambdaLR and clip_grad_norm_."""
    cfg = dataclasses.replace(CFG, dropout=0.0, warmup_steps=4)
    torch.manual_seed(0)
    model = DecisionTransformer(cfg.model_config(data.obs_dim, data.act_dim))
    reference = copy.deepcopy(model)
    sampler = data_module.WindowSampler(data, cfg.context, cfg.reward_scale, *data.state_stats())
    step = TrainStep(cfg, model, sampler, [torch.Generator().manual_seed(0)], torch.device("cpu"))
    gen = torch.Generator().manual_seed(0)
    opt = torch.optim.AdamW(reference.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / cfg.warmup_steps))
    for _ in range(7):
        step()
        batch = {k: v.unsqueeze(0) for k, v in sampler.sample(cfg.batch_size, gen).items()}  # one member
        loss, _, _ = dt_loss(reference, batch, cfg.eta)
        opt.zero_grad()
        loss.sum().backward()
        assert torch.nn.utils.clip_grad_norm_(reference.parameters(), cfg.grad_clip) > cfg.grad_clip  # it clips
        opt.step()
        sched.step()
    assert int(step.step) == 7 and float(step.lr) == pytest.approx(cfg.lr)
    assert_same(member_state(step.model, 0), member_state(reference, 0), atol=1e-6)


def test_the_compiled_update_trains_as_the_eager_step(data):
    """--compile --optimizer compiled --attention-kernel math (the gather and loss compiled, the clipping, AdamW
    and bookkeeping compiled as one function, attention written out) gives the eager step's weights, losses and
    optimizer state, for every member; outside its compiled regions only the members' draws run."""
    from torch._dynamo.utils import counters

    cfg = dataclasses.replace(CFG, dropout=0.0, warmup_steps=3)
    fast = dataclasses.replace(cfg, compile=True, optimizer="compiled", attention_kernel="math")
    steps = []
    for c in (cfg, fast):
        torch.manual_seed(0)
        model = DecisionTransformer(c.model_config(data.obs_dim, data.act_dim), members=2)
        sampler = data_module.WindowSampler(data, c.context, c.reward_scale, *data.state_stats())
        gens = [torch.Generator().manual_seed(s) for s in (0, 1)]
        steps.append(TrainStep(c, model, sampler, gens, torch.device("cpu")))
    counters.clear()
    for _ in range(5):
        for step in steps:
            step()
    assert counters["stats"]["unique_graphs"] >= 2  # the loss and the optimizer each ran compiled
    eager, compiled = steps
    for i in (0, 1):
        assert_same(member_state(eager.model, i), member_state(compiled.model, i), atol=1e-5)
        a, b = eager.member_optimizer_state(i), compiled.member_optimizer_state(i)
        assert a["step"] == b["step"] == 5
        for k in ("exp_avg", "exp_avg_sq"):
            assert_same(a[k], b[k], atol=1e-6)
    torch.testing.assert_close(eager.sums, compiled.sums, rtol=1e-5, atol=1e-6)
    from bench.step_kernels import outside_compiled  # what bench/step_kernels.py reports

    with torch.profiler.profile() as prof:
        compiled()
    outside = outside_compiled(prof.events())
    assert outside["aten::randint"] == 2 and sum(outside.values()) <= 4, outside  # the draws, their stack, the seed


@pytest.mark.parametrize("model", ["primal", "dt", "bc"])
def test_each_member_ends_with_the_weights_of_its_seed_trained_alone(data, tmp_path, model):
    cfg = dataclasses.replace(CFG, model=model, dropout=0.0)
    train(dataclasses.replace(cfg, out=str(tmp_path / "ens")), data, seeds=[4, 0, 7])
    for seed in (4, 0, 7):
        train(dataclasses.replace(cfg, seed=seed, out=str(tmp_path / f"alone{seed}")), data)
        assert_same(
            weights(tmp_path / "ens" / f"seed_{seed}" / "last.pt"), weights(tmp_path / f"alone{seed}" / "last.pt")
        )
    seeds = [
        torch.load(tmp_path / "ens" / f"seed_{s}" / "last.pt", weights_only=True)["config"]["seed"] for s in (4, 0, 7)
    ]
    assert seeds == [4, 0, 7]


def test_members_draw_the_batches_of_their_seeds_alone(data, tmp_path, monkeypatch):
    drawn = []
    windows = data_module.WindowSampler.windows

    def recorded(self, start):  # every member's windows of one update: (members, B, K, obs_dim)
        batch = windows(self, start)
        drawn.append(batch["states"])
        return batch

    monkeypatch.setattr(data_module.WindowSampler, "windows", recorded)
    cfg = dataclasses.replace(CFG, steps=5)  # dropout 0.1: only the batches must agree
    train(dataclasses.replace(cfg, out=str(tmp_path / "ens")), data, seeds=[1, 2])
    ensemble = drawn[:]
    assert len(ensemble) == 5 and ensemble[0].shape[0] == 2  # one gather per update for both members
    for i, seed in enumerate((1, 2)):
        drawn.clear()
        train(dataclasses.replace(cfg, seed=seed, out=str(tmp_path / f"alone{seed}")), data)
        assert len(drawn) == 5
        for a, b in zip(ensemble, drawn):
            torch.testing.assert_close(a[i], b[0], rtol=0, atol=0)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
def test_resuming_an_ensemble_gives_the_weights_of_an_uninterrupted_one(data, tmp_path, device):
    """With dropout, so every generator is restored: the process's and each member's batch generator, which
    lives on the training device."""
    cfg = dataclasses.replace(CFG, steps=16, checkpoint_every=5, device=device)
    train(dataclasses.replace(cfg, out=str(tmp_path / "straight")), data, seeds=[0, 1])
    train(dataclasses.replace(cfg, out=str(tmp_path / "split"), steps=7), data, seeds=[0, 1])
    train(dataclasses.replace(cfg, out=str(tmp_path / "split")), data, resume=True, seeds=[0, 1])
    assert_members_same(tmp_path / "straight", tmp_path / "split", atol=1e-5 if device == "cuda" else 0.0)


def test_an_ensemble_killed_between_its_members_checkpoints_loses_nothing(data, tmp_path, monkeypatch):
    cfg = dataclasses.replace(CFG, steps=16, checkpoint_every=5)
    train(dataclasses.replace(cfg, out=str(tmp_path / "straight")), data, seeds=[0, 1])
    renames = 0
    replace = checkpoint.os.replace

    def killed_while_renaming_at_step_10(
        src, dst
    ):  # kill at step 10: seed_0's last.pt is new, seed_1's still the one of step 5
        nonlocal renames
        if str(dst).endswith("last.pt"):
            renames += 1
            if renames == 4:
                raise SystemExit("killed")
        replace(src, dst)

    monkeypatch.setattr(checkpoint.os, "replace", killed_while_renaming_at_step_10)
    with pytest.raises(SystemExit):
        train(dataclasses.replace(cfg, out=str(tmp_path / "run")), data, seeds=[0, 1])
    monkeypatch.undo()
    steps = [torch.load(tmp_path / "run" / f"seed_{s}" / "last.pt", weights_only=True)["step"] for s in (0, 1)]
    assert steps == [10, 5]
    train(dataclasses.replace(cfg, out=str(tmp_path / "run")), data, resume=True, seeds=[0, 1])
    assert_members_same(tmp_path / "straight", tmp_path / "run")
    assert not any((tmp_path / "run" / f"seed_{s}" / "prev.pt").exists() for s in (0, 1))


def test_several_datasets_on_the_command_line_train_resume_and_report_per_dataset(data, other, tmp_path):
    out, both = tmp_path / "run", [data.source, other.source]
    common = [
        "train.py",
        "--dataset",
        *both,
        *TINY,
        "--seeds",
        "0",
        "1",
        "--warmup-steps",
        "2",
        "--eval-every",
        "1000",
        "--eval-episodes",
        "1",
        "--out",
        str(out),
    ]
    res = run(*common, "--steps", "3")
    assert res.returncode == 0, res.stderr
    assert f"primal {data.source}, {other.source} seeds 0 1:" in res.stderr  # the progress bar names the ensemble
    res = run(*common, "--steps", "5", "--resume")
    assert res.returncode == 0 and f"resumed from {out} at step 3" in res.stdout, res.stderr
    for source in both:
        folder = out / source.replace("/", "_").removesuffix(".hdf5") / "primal"
        assert json.loads((folder / "report.json").read_text())["across_checkpoints"][0]["checkpoints"] == 2
        for s in (0, 1):
            result = json.loads((folder / f"seed_{s}" / "eval.json").read_text())
            assert (result["dataset"], result["seed"], result["step"]) == (source, s, 5)


@pytest.mark.parametrize("given", [None, 16])
def test_an_ensemble_of_datasets_whose_paper_s_differ_resumes(tmp_path, given):
    """DT members of halfcheetah medium (the paper's s 64) and medium-replay (32) train as one model; resumed,
    each keeps the s its dataset resolved to instead of taking the first member's, or the --s the run was started
    with, without being given it again."""
    files = []
    for k, name in enumerate(("halfcheetah_medium.hdf5", "halfcheetah_medium_replay.hdf5")):
        files.append(str(tmp_path / name))
        write_d4rl(tmp_path / name, make_episodes(lengths=(20, 30), obs_dim=17, act_dim=6, seed=k))
    out = tmp_path / "run"
    options = ["--model", "dt", "--d-model", "32", "--n-head", "2", "--n-layer", "2", "--device", "cpu"]
    options += ["--precision", "fp32", "--seeds", "0", "--warmup-steps", "2", "--eval-every", "1000"]
    common = ["train.py", "--dataset", *files, *options, "--eval-episodes", "1", "--out", str(out)]
    res = run(*common, "--steps", "2", *(["--s", str(given)] if given else []))
    assert res.returncode == 0, res.stderr
    res = run(*common, "--steps", "3", "--resume")
    assert res.returncode == 0 and f"resumed from {out} at step 2" in res.stdout, res.stderr
    for source, s in zip(files, (given or 64, given or 32)):
        folder = out / source.replace("/", "_").removesuffix(".hdf5") / "dt" / "seed_0"
        assert json.loads((folder / "eval.json").read_text())["config"]["s"] == s


def test_seeds_on_the_command_line_then_evaluate_and_resume_rules(data, tmp_path):
    out = tmp_path / "run"
    res = run(
        "train.py",
        "--dataset",
        data.source,
        *TINY,
        "--seeds",
        "3",
        "5",
        "--steps",
        "6",
        "--warmup-steps",
        "2",
        "--eval-every",
        "3",
        "--eval-episodes-during",
        "1",
        "--eval-episodes",
        "2",
        "--out",
        str(out),
    )
    assert res.returncode == 0, res.stderr
    for s in (3, 5):
        result = json.loads((out / f"seed_{s}" / "eval.json").read_text())
        assert result["seed"] == s and result["step"] == 6 and result["ensemble"] == [3, 5]
        assert result["checkpoint"] == f"seed_{s}/last.pt"  # relative to --out, where report.md lists it
        assert [json.loads(line)["step"] for line in (out / f"seed_{s}" / "evals.jsonl").read_text().splitlines()] == [
            3
        ]
        assert f"seed {s} target 3600" in res.stdout
    assert (out / "report.md").exists() and "primal seeds 3 5:" in res.stderr  # the progress bar's name
    res = run(
        "evaluate.py",
        *(str(out / f"seed_{s}" / "last.pt") for s in (3, 5)),
        "--episodes",
        "2",
        "--out",
        str(tmp_path / "ev.json"),
    )
    assert res.returncode == 0, res.stderr
    report = json.loads((tmp_path / "ev.json").read_text())
    for s, ckpt in zip((3, 5), report["checkpoints"]):  # the same episodes as the run's own final evaluation
        assert ckpt["seed"] == s
        assert ckpt["targets"] == json.loads((out / f"seed_{s}" / "eval.json").read_text())["targets"]
    res = run("train.py", "--out", str(out), "--seeds", "3", "5", "--resume", "--lr", "0.01", "--steps", "8")
    assert res.returncode == 2 and "--resume cannot change --lr 0.01 (the run has 0.001)" in res.stderr, res.stderr
    res = run("train.py", "--out", str(out), "--resume")
    assert res.returncode == 2 and "resume them with --seeds 3 5" in res.stderr, res.stderr


def test_members_of_several_datasets_end_as_their_runs_alone(data, other, tmp_path):
    """One ensemble over two datasets of one task: each (dataset, seed) member trains on its own data,
    with its own statistics, into OUT/DATASET/MODEL/seed_N, as that run alone; and evaluates as it."""
    cfg = dataclasses.replace(CFG, dropout=0.0, steps=6, eval_episodes=2)
    both = {"a.hdf5": data, "b.hdf5": other}
    results = train(dataclasses.replace(cfg, out=str(tmp_path / "ens")), both, seeds=[0, 1])
    assert [(r["dataset"], r["seed"]) for r in results] == [
        (data.source, 0),
        (data.source, 1),
        (other.source, 0),
        (other.source, 1),
    ]
    for spec, d in both.items():
        for seed in (0, 1):
            alone = train(dataclasses.replace(cfg, dataset=spec, seed=seed, out=str(tmp_path / f"{spec}{seed}")), d)[0]
            member = tmp_path / "ens" / spec.removesuffix(".hdf5") / "primal" / f"seed_{seed}"
            saved = torch.load(member / "last.pt", weights_only=False)
            assert_same(saved["model"], weights(tmp_path / f"{spec}{seed}" / "last.pt"), atol=1e-4)
            np.testing.assert_allclose(saved["state_mean"], d.state_stats()[0])
            assert saved["config"]["dataset"] == spec and saved["config"]["seed"] == seed
            mine = json.loads((member / "eval.json").read_text())
            for ra, rb in zip(mine["targets"], alone["targets"]):
                assert ra["lengths"] == rb["lengths"]
                np.testing.assert_allclose(ra["returns"], rb["returns"], rtol=1e-3)


def test_datasets_whose_models_differ_are_refused_as_one_ensemble(data, tmp_path):
    from dt_primal.errors import UserError

    cfg = dataclasses.replace(CFG, s=None)  # the KSVD rank then comes from each dataset's name
    with pytest.raises(UserError, match="cannot train as one ensemble.*separate runs"):
        train(
            dataclasses.replace(cfg, out=str(tmp_path / "x")),
            {"dt-primal/halfcheetah/medium-v0": data, "dt-primal/halfcheetah/medium-replay-v0": data},
            seeds=[0],
        )


def test_operations_per_update_do_not_grow_with_the_members(data):
    """Members are a tensor dimension: an update of 4 members runs as many operations as one of a
    single member (a member's own batch draw aside), where a loop over members ran 4x as many."""
    import collections

    from bench.ensemble_speed import OpCounter  # what bench/ensemble_speed.py --count-ops counts

    def ops(members: int) -> collections.Counter:
        torch.manual_seed(0)
        model = DecisionTransformer(CFG.model_config(data.obs_dim, data.act_dim), members=members)
        sampler = data_module.WindowSampler(data, CFG.context, CFG.reward_scale, *data.state_stats())
        step = TrainStep(
            CFG, model, sampler, [torch.Generator().manual_seed(s) for s in range(members)], torch.device("cpu")
        )
        step()
        with OpCounter() as counter:
            step()
        return counter.ops

    one, four = ops(1), ops(4)
    assert four["randint"] - one["randint"] == 3  # each member draws its own batch from its own generator
    assert sum(four.values()) <= 1.02 * sum(one.values())  # and every other operation runs once for all members
    assert four["bmm"] + four["baddbmm"] == one["bmm"] + one["baddbmm"]


def two_member_policy() -> Policy:
    torch.manual_seed(0)
    cfg = dataclasses.replace(CFG, dropout=0.0)
    model = stack_members(
        lambda n: DecisionTransformer(cfg.model_config(11, 3), members=n),
        [member_state(DecisionTransformer(cfg.model_config(11, 3)), 0) for _ in range(2)],
    )
    return Policy(model, np.zeros(11), np.ones(11), 1000.0, cfg.context)


@pytest.mark.parametrize("pipeline", [False, True])
def test_environment_workers_give_the_episodes_of_in_process_stepping(pipeline):
    policy, args = two_member_policy(), (TASKS["hopper"], [3600.0, 1800.0], 3)
    one, three = (rollout(policy, *args, seeds=[5, 9], env_workers=w, pipeline=pipeline) for w in (1, 3))
    assert one == three
    assert one[0][0]["episodes"] == 3 and one[0] != one[1]  # members differ


def test_the_pipelined_evaluation_gives_each_half_the_episodes_it_gives_alone():
    """Workers step one half (here: one target's episodes) while the other half's actions are computed: each half's
    episodes are those it has evaluated alone, with the same seeds and widths; against the whole evaluation acted on
    at once they differ only by the rounding of forward passes of another width."""
    policy, hopper = two_member_policy(), TASKS["hopper"]
    piped = rollout(policy, hopper, [3600.0, 1800.0], 3, seeds=[5, 9], env_workers=2)
    alone = [(3600.0, [5, 9]), (1800.0, [8, 12])]  # the second half's episodes: seeds 3, 4 and 5 after the first's
    high, low = (rollout(policy, hopper, [target], 3, seeds=seeds, env_workers=1) for target, seeds in alone)
    assert piped == [[h[0], lo[0]] for h, lo in zip(high, low)]
    at_once = rollout(policy, hopper, [3600.0, 1800.0], 3, seeds=[5, 9], env_workers=2, pipeline=False)
    for a, b in zip(sum(piped, []), sum(at_once, [])):
        assert a["lengths"] == b["lengths"] and np.allclose(a["returns"], b["returns"], rtol=1e-4)


def test_a_pipelined_evaluation_that_fails_runs_again_in_turn(monkeypatch):
    """A CUDA error of the second half's forward pass, say: a warning, and the episodes of the evaluation in turn."""
    policy, hopper = two_member_policy(), TASKS["hopper"]
    in_turn = rollout(policy, hopper, [3600.0, 1800.0], 2, seeds=[5, 9], env_workers=2, pipeline=False)

    def broken_twin(self):
        twin = Acting.twin(self)
        twin.act = lambda *args, **kwargs: (_ for _ in ()).throw(RuntimeError("CUDA error: an illegal memory access"))
        return twin

    monkeypatch.setattr(Policy, "twin", broken_twin)
    with pytest.warns(RuntimeWarning, match="the pipelined evaluation failed .*CUDA error.* in turn"):
        again = rollout(policy, hopper, [3600.0, 1800.0], 2, seeds=[5, 9], env_workers=2)
    assert again == in_turn


def test_the_pipelined_evaluation_records_the_actions_it_took():
    """A recorder's episodes, replayed with their seeds and actions, return what the pipelined evaluation reported."""
    policy, hopper = two_member_policy(), TASKS["hopper"]
    recorder = Recorder(2)
    reports = rollout(policy, hopper, [3600.0, 1800.0], 3, seeds=[5, 9], recorder=recorder, pipeline=True)
    recorded = recorder.recorded()
    assert len(recorded) == 2 * 2 * 2
    for episode in recorded:
        env = hopper.make()
        env.reset(seed=episode["seed"])
        total = sum(env.step(a)[1] for a in episode["actions"])
        target = [3600.0, 1800.0].index(episode["target"])
        assert np.isclose(total, reports[episode["member"]][target]["returns"][episode["episode"]])


class HostSyncs(TorchDispatchMode):
    """Records the operators that would make the host wait for a GPU: reading a value back
    (``.item()``, ``bool()``, ``int()``) or an output whose shape depends on the data."""

    SYNCING = {
        torch.ops.aten._local_scalar_dense.default,
        torch.ops.aten.nonzero.default,
        torch.ops.aten.masked_select.default,
        torch.ops.aten._unique2.default,
    }

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in self.SYNCING:
            self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


def test_the_step_is_capturable_no_host_sync_and_no_python_state_change(data):
    """What a CUDA graph needs of the step, checked on the CPU: its update never reads a value back
    to the host, and changes no Python-side state (only tensors), so a replay is a real step."""
    cfg = dataclasses.replace(CFG, dropout=0.1)
    torch.manual_seed(0)
    model = DecisionTransformer(cfg.model_config(data.obs_dim, data.act_dim), members=2)
    sampler = data_module.WindowSampler(data, cfg.context, cfg.reward_scale, *data.state_stats())
    step = TrainStep(cfg, model, sampler, [torch.Generator().manual_seed(s) for s in (0, 1)], torch.device("cpu"))
    step()  # the optimizer's state exists from here on, as before a capture

    def python_state():
        return {
            k: (id(v), v if isinstance(v, (int, float, bool, str, type(None))) else None) for k, v in vars(step).items()
        }

    def captured_state():  # all but the call counter, which is kept outside the captured update
        return {k: v for k, v in python_state().items() if k != "calls"}

    before, steps = captured_state(), int(step.step)
    with HostSyncs() as syncs:
        step()
    assert syncs.seen == []
    assert captured_state() == before and int(step.step) == steps + 1


@needs_cuda
def test_the_captured_step_trains_as_the_eager_step_on_cuda(data, tmp_path):
    cfg = dataclasses.replace(CFG, dropout=0.0, steps=12, device="cuda")
    train(dataclasses.replace(cfg, out=str(tmp_path / "graph")), data, seeds=[0, 1, 2])
    train(dataclasses.replace(cfg, out=str(tmp_path / "eager"), cuda_graph=False), data, seeds=[0, 1, 2])
    train(dataclasses.replace(cfg, seed=1, out=str(tmp_path / "alone")), data)
    assert_members_same(tmp_path / "graph", tmp_path / "eager", seeds=(0, 1, 2), atol=1e-5)
    assert_same(weights(tmp_path / "graph" / "seed_1" / "last.pt"), weights(tmp_path / "alone" / "last.pt"), atol=1e-5)
