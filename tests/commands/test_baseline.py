"""The DT baselines: the dt-paper preset, the sweep's tables of both DT baselines, and the adapter
that lets dt-primal's evaluation run d3rlpy's Decision Transformer (experiments/d3rlpy_crosscheck.py).

The three d3rlpy tests need d3rlpy 2.8.1 beside the project's packages (experiments/crosscheck-requirements.txt):
CI installs only requirements.txt and skips them, so they are run by hand, in that environment
(experiments/README.md gives the command). The adapter's own logic is tested without d3rlpy, on a
stand-in model."""

import dataclasses
import json

import numpy as np
import pytest
import torch
from conftest import run, tiny_run

from commands.sweep.grid import run_dir
from commands.sweep.results import DT_MATCHED, DT_PAPER, collect, label_of
from commands.sweep.tables import gap_rows, write_tables
from dt_primal.config import PRESETS, Config, make_config
from dt_primal.evaluation.policy import Policy
from dt_primal.evaluation.rollout import rollout
from envs import TASKS
from experiments.d3rlpy_crosscheck import D3rlpyMember, D3rlpyPolicies

try:
    import d3rlpy  # noqa: F401

    HAVE_D3RLPY = True
except Exception:  # not installed (CI), or installed against other packages
    HAVE_D3RLPY = False
needs_d3rlpy = pytest.mark.skipif(
    not HAVE_D3RLPY,
    reason="d3rlpy is not importable here: run these by hand in the cross-check's environment "
    "(experiments/README.md); CI skips them",
)


# ------------------------------------------------------------------------------ the preset


def test_dt_paper_preset_is_the_dt_papers_settings_and_flags_override_it():
    cfg, paper = make_config("dt-paper"), Config()
    assert (cfg.model, cfg.d_model, cfg.n_head, cfg.lr) == ("dt", 128, 1, 1e-4)  # docs/method.md, "Hyper-parameters"
    same = (
        "n_layer",
        "context",
        "batch_size",
        "steps",
        "warmup_steps",
        "weight_decay",
        "grad_clip",
        "dropout",
        "reward_scale",
        "max_ep_len",
        "eval_episodes",
        "precision",
    )  # "same K, batch and step count"
    assert {k: getattr(cfg, k) for k in same} == {k: getattr(paper, k) for k in same}
    assert (cfg.n_layer, cfg.context, cfg.batch_size, cfg.steps) == (3, 20, 64, 100_000)
    assert set(PRESETS["dt-paper"]) == {"model", "d_model", "n_head", "lr"}
    reduced = make_config("dt-paper", precision="bf16", steps=2500, warmup_steps=250, lr=3e-4)  # the command line wins
    assert (reduced.precision, reduced.steps, reduced.warmup_steps, reduced.lr, reduced.n_head) == (
        "bf16",
        2500,
        250,
        3e-4,
        1,
    )


def test_embed_init_chooses_how_the_input_embeddings_and_the_action_head_start():
    """torch (default): PyTorch's uniform init, bound 1/sqrt(fan_in), as the DT paper's code and d3rlpy;
    gpt2: N(0, 0.02) with zero bias, as every other layer. The blocks start alike either way."""
    from dt_primal.model.transformer import DecisionTransformer

    nets = {}
    for init in ("torch", "gpt2"):
        torch.manual_seed(0)
        nets[init] = DecisionTransformer(Config(embed_init=init, d_model=64, n_head=2).model_config(11, 3))
    with torch.no_grad():
        for name in ("embed_state", "embed_action", "embed_return", "predict_action"):
            default, gpt2 = getattr(nets["torch"], name), getattr(nets["gpt2"], name)
            # uniform in ±1/sqrt(fan_in): std 1/sqrt(3 fan_in), at least 0.07 for these fan-ins (1 to 64)
            assert default.weight.abs().max() <= default.weight.shape[-1] ** -0.5 and default.weight.std() > 0.05
            assert abs(float(gpt2.weight.std()) - 0.02) < 0.006 and not gpt2.bias.any()
        for net in nets.values():
            assert abs(float(net.blocks[0].mlp[0].weight.std()) - 0.02) < 0.002
    from dt_primal.errors import UserError

    with pytest.raises(UserError, match="--embed-init"):
        Config(embed_init="xavier").validate()


def test_train_py_offers_the_dt_paper_preset():
    res = run("train.py", "--help", timeout=60)
    assert res.returncode == 0 and "dt-paper" in res.stdout and "1 head, lr 1e-4" in " ".join(res.stdout.split())


# ------------------------------------------------------------------------------ the tables


DT_PAPER_CONFIG = {"model": "dt", "d_model": 128, "n_head": 1, "lr": 1e-4, "precision": "bf16"}  # as --preset dt-paper


def fake_run(out, dataset, model, seed, final, curve, config=None):
    """A finished run as the sweep leaves it: evals.jsonl (5-episode points every 100 steps) and eval.json (final;
    with the settings of ``config`` where given)."""
    rd = run_dir(out, dataset, model, seed)
    rd.mkdir(parents=True)
    (rd / "evals.jsonl").write_text(
        "".join(
            json.dumps(
                {
                    "step": 100 * (i + 1),
                    "reports": [
                        {"target": 3600.0, "normalized_mean": a, "episodes": 5},
                        {"target": 1800.0, "normalized_mean": b, "episodes": 5},
                    ],
                }
            )
            + "\n"
            for i, (a, b) in enumerate(curve)
        )
    )
    (rd / "eval.json").write_text(
        json.dumps(
            {
                "step": 100 * (len(curve) + 1),
                "targets": [
                    {"target": 3600.0, "normalized_mean": final[0], "episodes": 100},
                    {"target": 1800.0, "normalized_mean": final[1], "episodes": 100},
                ],
                "config": {"eval_every": 100, **(config or {})},
            }
        )
    )


def test_tables_tell_the_two_dt_baselines_apart_and_give_the_last_three_evaluations(tmp_path):
    d = "dt-primal/hopper/medium-replay-v0"
    main, base = tmp_path / "table4", tmp_path / "dt-paper"
    for s in range(3):
        fake_run(main, d, "dt", s, (50 + s, 40), [(10, 10), (20, 20), (30, 30)])
        fake_run(main, d, "primal", s, (60 + 2 * s, 41), [(10, 10), (20, 20), (60, 30)])
        fake_run(
            base,
            d,
            "dt",
            s,
            (70 + s, 42),
            [(0, 0), (10, 10), (40, 40)],
            config=DT_PAPER_CONFIG,
        )
    rows = collect(main, [d], ["dt", "primal"], [0, 1, 2])
    # the baseline folder's runs are recognised from the settings their records hold, whatever label they are given
    rows += collect(base, [d], ["dt"], [0, 1, 2], label=DT_MATCHED, name="dt (dt-paper)")
    assert [r["label"] for r in rows] == [DT_MATCHED, "Primal.+DT", DT_PAPER]
    assert rows[2]["settings"] == {"d_model": 128, "n_head": 1, "lr": 1e-4, "precision": "bf16", "top_percent": 100.0}
    hi = rows[0]["targets"][0]
    assert hi["mean"] == pytest.approx(51) and hi["last3"]["steps"] == [200, 300, 400]
    assert hi["last3"]["seeds"] == pytest.approx([(20 + 30 + 50 + s) / 3 for s in range(3)])
    md = write_tables(rows, tmp_path)
    assert "| dt | DT (matched settings) |" in md and "| dt (dt-paper) | DT (DT paper's settings) |" in md
    assert "mean of last 3 evaluations" in md and "d_model 128, 1 head, lr 1e-4" in md
    assert "Primal.+DT − DT (DT paper's settings)" in md and "Primal.+DT − DT (matched settings)" in md
    gap = gap_rows(rows, "Primal.+DT", DT_MATCHED)[0]["last"]
    se = np.sqrt(np.var([60, 62, 64], ddof=1) / 3 + np.var([50, 51, 52], ddof=1) / 3)
    assert gap["gap"] == pytest.approx(11) and gap["se"] == pytest.approx(se) and gap["z"] == pytest.approx(11 / se)
    assert (tmp_path / "results.csv").read_text().count(DT_PAPER) == 2  # one line per target


def test_the_last_three_evaluations_are_left_out_where_a_seed_lost_one(tmp_path):
    """A seed whose curve lacks one of its last evaluations (one beside training, lost to a kill) leaves its row
    without a mean of the last three, rather than one over other steps than its other seeds'."""
    d = "dt-primal/hopper/medium-replay-v2"
    for s in range(3):
        fake_run(tmp_path, d, "dt", s, (50 + s, 40), [(10, 10), (20, 20), (30, 30)])
    assert collect(tmp_path, [d], ["dt"], [0, 1, 2])[0]["targets"][0]["last3"]["steps"] == [200, 300, 400]
    curve = run_dir(tmp_path, d, "dt", 2) / "evals.jsonl"
    curve.write_text("".join(line + "\n" for line in curve.read_text().splitlines() if '"step": 300' not in line))
    row = collect(tmp_path, [d], ["dt"], [0, 1, 2])[0]
    assert row["targets"][0]["mean"] == pytest.approx(51) and "last3" not in row["targets"][0]
    assert "last3" not in collect(tmp_path, [d], ["dt"], [2])[0]["targets"][1]  # 100, 200 and 400: not the last three


def test_a_dt_is_labelled_by_the_settings_it_trained_with():
    assert label_of("dt", {"d_model": 128, "n_head": 1, "lr": 1e-4}, None) == DT_PAPER
    assert label_of("dt", {"d_model": 128, "n_head": 4, "lr": 1e-3}, DT_PAPER) == DT_MATCHED  # the quick preset's DT
    assert label_of("dt", None, None) == DT_MATCHED and label_of("dt", None, DT_PAPER) == DT_PAPER
    assert label_of("primal", None, None) == "Primal.+DT"


# ------------------------------------------------------------------------------ the adapter, without d3rlpy


class Recorder(torch.nn.Module):
    """Stands in for d3rlpy's ContinuousDecisionTransformer: records its inputs, answers with an
    action that depends on the newest step's scaled return and timestep."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def forward(self, x, action, return_to_go, timesteps, attention_mask):
        self.calls.append((x, action, return_to_go, timesteps, attention_mask))
        B, K = timesteps.shape
        out = torch.zeros(B, K, 3)
        out[:, -1, 0] = torch.tanh(return_to_go[:, -1, 0])
        out[:, -1, 1] = timesteps[:, -1] / 1000
        return out


class Scale:
    def __init__(self, factor, shift=0.0):
        self.factor, self.shift = factor, shift

    def transform(self, x):
        return (x - self.shift) * self.factor


def test_adapter_pads_scales_and_counts_timesteps_as_d3rlpy_predict_does():
    net = Recorder()
    member = D3rlpyMember(net, context=4, max_timestep=6, observation_scaler=Scale(0.5, 1.0), reward_scaler=Scale(1e-3))
    B = 2
    for L, t0 in ((1, 0), (3, 2), (6, 3)):  # shorter than K (left-padded), and longer (the last K steps)
        states = torch.randn(B, L, 11)
        actions = torch.rand(B, L, 3)
        rtg = torch.full((B, L, 1), 3600.0)
        ts = torch.arange(t0, t0 + L).repeat(B, 1)
        pred, extra = member(states, actions, rtg, ts, last_only=True)
        assert pred.shape == (B, 1, 3) and extra == []
        x, act, r, t, mask = net.calls[-1]
        n = min(L, 4)
        assert x.shape == (B, 4, 11) and t.dtype == torch.long
        assert torch.equal(
            mask, torch.tensor([[1.0] * (4 - n) + [0.0] * n] * B)
        )  # 1 = padding, as d3rlpy passes 1 - masks
        assert torch.allclose(x[:, 4 - n :], (states[:, -n:] - 1.0) * 0.5)
        assert torch.allclose(x[:, : 4 - n], torch.full_like(x[:, : 4 - n], -0.5))  # padded raw zeros, then scaled
        assert torch.equal(act[:, 4 - n :], actions[:, -n:]) and not act[:, : 4 - n].any()
        assert torch.allclose(r[:, 4 - n :], rtg[:, -n:] * 1e-3) and not r[:, : 4 - n].any()
        expect_t = (ts[:, -n:] + 1).clamp(max=6)  # counted from 1, at most max_timestep; padding 0
        assert torch.equal(t[:, 4 - n :], expect_t) and not t[:, : 4 - n].any()
        assert torch.allclose(pred[:, 0, 0], torch.tanh(torch.tensor(3.6)))
    with pytest.raises(ValueError):
        member(states, actions, rtg, ts, last_only=False)


def test_policies_run_in_dt_primals_batched_evaluation():
    nets = [Recorder(), Recorder()]
    policies = D3rlpyPolicies([D3rlpyMember(n, context=3, max_timestep=1000) for n in nets], act_dim=3, max_ep_len=4)
    policies.train(True)
    assert all(n.training for n in nets)
    reports = rollout(
        Policy(policies, np.zeros(11), np.ones(11), 1.0, 3), TASKS["hopper"], [3600.0, 1800.0], 2, seeds=[5, 6]
    )
    assert len(reports) == 2 and [r["episodes"] for r in reports[0]] == [2, 2]
    assert policies.training and all(n.training for n in nets)  # the evaluation restores the mode
    # every member saw its live episodes at once, the newest step's raw return as the conditioning
    assert all(len(n.calls) == 4 for n in nets) and nets[0].calls[0][2].shape == (4, 3, 1)
    assert set(nets[0].calls[0][2][:, -1, 0].tolist()) == {3600.0, 1800.0}


# ------------------------------------------------------------------------------ the adapter, with d3rlpy


@pytest.fixture(scope="module")
def tiny_algo():
    """d3rlpy's DT trained 3 steps on Hopper-shaped random data, with dt-primal's settings (tiny)."""
    from conftest import make_episodes

    from dt_primal.data import Trajectories
    from experiments.d3rlpy_crosscheck import build_algo, prepare, to_replay_buffer

    rng = np.random.default_rng(0)
    eps = make_episodes(lengths=(30, 12, 40, 25), seed=1)
    for ep in eps:
        ep["rewards"] = rng.uniform(0, 3, len(ep["rewards"])).astype(np.float32)
        ep["terminals"] = ep.pop("terminations")
    data = Trajectories.from_episodes(eps, env="Hopper-v5", source="tiny")
    cfg = dataclasses.replace(
        make_config("dt-paper"), d_model=16, n_layer=2, context=4, batch_size=8, warmup_steps=2, max_ep_len=1000
    )
    d3rlpy.seed(0)
    dataset = to_replay_buffer(data)
    # the same episodes; d3rlpy never ends a window at the last step of an episode that timed out
    assert dataset.size() == 4 and dataset.transition_count == int(data.lengths.sum()) - int((~data.terminals).sum())
    algo = build_algo(dataclasses.replace(cfg, activation="gelu"))
    prepare(algo, dataset)
    for _ in range(3):
        algo.update(dataset.sample_trajectory_batch(cfg.batch_size, length=cfg.context))
    return algo, cfg


@needs_d3rlpy
def test_adapter_gives_d3rlpys_own_predict_for_a_batch_of_histories(tiny_algo):
    from d3rlpy.algos import TransformerInput

    algo, cfg = tiny_algo
    member = D3rlpyMember.from_algo(algo)
    member.transformer.eval()
    rng = np.random.default_rng(0)
    B = 3
    for L, t0 in ((1, 0), (3, 10), (4, 0), (9, 990)):  # below, at and above K = 4; timesteps past max_timestep
        obs = (rng.normal(size=(B, L, 11)) * 3).astype(np.float32)
        act = rng.uniform(-1, 1, size=(B, L, 3)).astype(np.float32)
        act[:, -1] = 0  # the newest action is not known yet
        rtg = rng.uniform(0, 3600, size=(B, L, 1)).astype(np.float32)
        ts = np.arange(t0, t0 + L)[None].repeat(B, 0)
        with torch.no_grad():
            ours = member(*map(torch.as_tensor, (obs, act, rtg, ts)))[0][:, 0].numpy()
        theirs = np.stack(
            [
                algo.predict(
                    TransformerInput(
                        observations=obs[b],
                        actions=act[b],
                        rewards=np.zeros((L, 1), np.float32),
                        returns_to_go=rtg[b],
                        timesteps=np.minimum(ts[b] + 1, cfg.max_ep_len),
                    )
                )
                for b in range(B)
            ]
        )
        np.testing.assert_allclose(ours, theirs, atol=1e-6)


@needs_d3rlpy
def test_the_crosscheck_record_says_how_it_was_made(tmp_path):
    """A d3rlpy run's eval.json carries the config as dt-primal's records state it (fp32, d3rlpy's N(0, 0.02)
    timestep table) and the provenance block, with d3rlpy's version."""
    from conftest import hopper_file

    from experiments.d3rlpy_crosscheck import main

    data = str(hopper_file(tmp_path))
    main(
        [
            "train",
            "--dataset",
            data,
            "--env",
            "hopper",
            "--seeds",
            "0",
            "--d-model",
            "16",
            "--n-layer",
            "1",
            "--context",
            "4",
            "--steps",
            "2",
            "--warmup-steps",
            "1",
            "--eval-every",
            "100",
            "--eval-episodes",
            "1",
            "--out",
            str(tmp_path / "cc"),
        ]
    )
    record = json.loads(next((tmp_path / "cc").rglob("seed_0/eval.json")).read_text())
    assert (record["config"]["precision"], record["config"]["timestep_init"], record["config"]["d_model"]) == (
        "fp32",
        "gpt2",
        16,
    )
    assert record["provenance"]["versions"]["d3rlpy"] == record["d3rlpy"] and record["provenance"]["date"]


@needs_d3rlpy
def test_batched_evaluation_reproduces_d3rlpys_stateful_wrapper(tiny_algo):
    algo, cfg = tiny_algo
    task, steps, targets, seeds = TASKS["hopper"], 15, [3600.0, 1800.0], [7]
    policies = D3rlpyPolicies.from_algos([algo], max_ep_len=steps)
    ours = rollout(Policy(policies, np.zeros(11), np.ones(11), 1.0, cfg.context), task, targets, 2, seeds=seeds)[0]
    for i, target in enumerate(targets):
        wrapper = algo.as_stateful_wrapper(target_return=target)
        for j in range(2):
            env = task.make()
            obs, _ = env.reset(seed=seeds[0] + i * 2 + j)  # rollout seeds episode k of a member with seed + k
            ret, reward, n = 0.0, 0.0, 0
            wrapper.reset()
            for _ in range(steps):
                action = wrapper.predict(obs.astype(np.float32), reward)
                obs, reward, term, trunc, _ = env.step(action)
                ret += reward
                n += 1
                if term or trunc:
                    break
            env.close()
            assert ours[i]["lengths"][j] == n
            assert ours[i]["returns"][j] == pytest.approx(ret, abs=1e-3)


def test_crosscheck_report_compares_both_implementations_per_dataset(tmp_path):
    from experiments.d3rlpy_crosscheck import MODEL, main

    d = "dt-primal/hopper/medium-replay-v0"
    ours, theirs = tmp_path / "dt-paper", tmp_path / "d3rlpy"
    for s in range(3):
        fake_run(
            ours,
            d,
            "dt",
            s,
            (10 + s, 12),
            [(1, 1), (5, 5), (9, 9)],
            config=DT_PAPER_CONFIG,
        )
        fake_run(theirs, d, MODEL, s, (30 + 2 * s, 25), [(1, 1), (10, 10), (20, 20)])
    main(["report", "--d3rlpy", str(theirs), "--dt-primal", str(ours), "--datasets", d])
    md = (theirs / "crosscheck.md").read_text()
    assert "| dt | DT (DT paper's settings) |" in md and "| d3rlpy-dt | d3rlpy DT" in md
    assert "precision: d3rlpy trains and is evaluated in fp32 (dt-primal: bf16)" in md
    se = np.sqrt(np.var([10, 11, 12], ddof=1) / 3 + np.var([30, 32, 34], ddof=1) / 3)
    assert f"| hopper/medium-replay | 3600 | -21.0 (SE {se:.1f}, {-21 / se:+.1f} SE) |" in md
    assert json.loads((theirs / "crosscheck.json").read_text())["gaps"][0]["last"]["n_b"] == 3
    assert "MLP activation" not in md and "timestep table" not in md  # neither side records them: GELU, N(0, 0.02)


def test_crosscheck_report_names_the_mlp_activation_and_timestep_table_where_the_records_differ(tmp_path):
    from experiments.d3rlpy_crosscheck import MODEL, main

    d = "dt-primal/hopper/medium-replay-v0"
    ours, theirs = tmp_path / "dt-paper", tmp_path / "d3rlpy"
    for s in range(3):
        fake_run(ours, d, "dt", s, (10, 12), [(1, 1)])
        fake_run(theirs, d, MODEL, s, (30, 25), [(1, 1)])
        for out, record in (
            (ours, {"config": {"activation": "relu", "timestep_init": "torch"}}),
            (theirs, {"activation": "gelu"}),
        ):
            path = run_dir(out, d, "dt" if out == ours else MODEL, s) / "eval.json"
            path.write_text(json.dumps({**json.loads(path.read_text()), **record}))
    main(["report", "--d3rlpy", str(theirs), "--dt-primal", str(ours), "--datasets", d, "--out", str(tmp_path / "cc")])
    md = (tmp_path / "cc" / "crosscheck.md").read_text()
    assert "MLP activation: d3rlpy gelu, dt-primal relu" in md
    assert "timestep table's initialisation: d3rlpy N(0, 0.02), dt-primal N(0, 1)" in md
    assert not (theirs / "crosscheck.md").exists()


def test_timestep_table_starts_at_n01_as_both_papers_code_and_older_checkpoints_keep_their_gpt2_table(tmp_path):
    """--timestep-init torch (default): nn.Embedding's N(0, 1), as both papers' code; gpt2: N(0, 0.02), as d3rlpy
    and dt-primal before the field. A checkpoint written before it (format 2 without the field) reads, and
    resumes, as gpt2; every other layer starts alike either way."""
    from dt_primal.errors import UserError
    from dt_primal.files.checkpoint import load_checkpoint
    from dt_primal.model.transformer import DecisionTransformer

    assert Config().timestep_init == make_config("dt-paper").timestep_init == "torch"
    nets = {}
    for init in ("torch", "gpt2"):
        torch.manual_seed(0)
        nets[init] = DecisionTransformer(Config(timestep_init=init, d_model=64, n_head=2).model_config(11, 3))
    assert abs(float(nets["torch"].embed_timestep.weight.detach().std()) - 1) < 0.01
    assert abs(float(nets["gpt2"].embed_timestep.weight.detach().std()) - 0.02) < 0.001
    for name in ("embed_state", "blocks.0.mlp.0", "predict_action"):
        torch.testing.assert_close(nets["torch"].get_submodule(name).weight, nets["gpt2"].get_submodule(name).weight)
    with pytest.raises(UserError, match="--timestep-init"):
        Config(timestep_init="zeros").validate()
    run = tiny_run(tmp_path)
    ckpt = torch.load(run / "last.pt", weights_only=True)
    assert ckpt["config"]["timestep_init"] == ckpt["model_config"]["timestep_init"] == "torch"
    for part in ("config", "model_config"):
        del ckpt[part]["timestep_init"]
    torch.save(ckpt, tmp_path / "before.pt")
    old = load_checkpoint(tmp_path / "before.pt", resume=True)
    assert old["config"]["timestep_init"] == old["model_config"]["timestep_init"] == "gpt2"


def test_mlp_activation_is_relu_by_default_gelu_on_request_and_old_checkpoints_keep_gelu(tmp_path):
    """Both papers' code build every block's MLP with ReLU; --activation gelu gives GPT-2's. A checkpoint
    written before the field existed was trained with GELU and loads as such."""
    from dt_primal.errors import UserError
    from dt_primal.files.checkpoint import load_checkpoint, model_from_checkpoint
    from dt_primal.model.transformer import DecisionTransformer

    assert Config().activation == "relu" and make_config("dt-paper").activation == "relu"
    relu = DecisionTransformer(Config(d_model=32, n_head=2).model_config(11, 3))
    gelu = DecisionTransformer(Config(d_model=32, n_head=2, activation="gelu").model_config(11, 3))
    assert isinstance(relu.blocks[0].mlp[1], torch.nn.ReLU) and isinstance(gelu.blocks[0].mlp[1], torch.nn.GELU)
    with pytest.raises(UserError, match="--activation"):
        Config(activation="tanh").validate()
    ckpt = torch.load(tiny_run(tmp_path, activation="gelu") / "last.pt", weights_only=True)
    assert ckpt["config"]["activation"] == ckpt["model_config"]["activation"] == "gelu"
    old = {k: v for k, v in ckpt.items() if k not in ("format", "model_config")}  # format 1, before the field existed
    del old["config"]["activation"]
    torch.save({**old, "obs_dim": 11, "act_dim": 3}, tmp_path / "old.pt")
    model = model_from_checkpoint(load_checkpoint(tmp_path / "old.pt"))
    assert model.config.activation == "gelu" and isinstance(model.blocks[0].mlp[1], torch.nn.GELU)
