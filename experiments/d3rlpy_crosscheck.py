"""Cross-check dt-primal's Decision Transformer against d3rlpy's on the same data: d3rlpy's
``DecisionTransformer`` trains on a suite dataset with dt-primal's settings (where d3rlpy allows
them) and is evaluated by dt-primal's own batched evaluation (``dt_primal.evaluation.rollout``:
the same targets, episodes, environment seeds and normalisation), so that only the learner differs.

  # d3rlpy DT, DT-paper settings, the reduced CPU protocol of docs/results.md, 3 seeds
  ~/.venvs/d3rlpy/bin/python experiments/d3rlpy_crosscheck.py train --dataset dt-primal/hopper/medium-replay-v0 \\
      --seeds 0 1 2 --out runs/d3rlpy-crosscheck-cpu --preset dt-paper --steps 2500 --warmup-steps 250 \\
      --eval-every 500 --eval-episodes-during 5 --eval-episodes 100
  # compare with dt-primal's DT (a sweep folder) per dataset; writes OUT/crosscheck.{md,json}
  python experiments/d3rlpy_crosscheck.py report --d3rlpy runs/d3rlpy-crosscheck-cpu --dt-primal runs/dt-paper-cpu \\
      --datasets dt-primal/hopper/medium-replay-v0 ...

``train`` needs d3rlpy 2.8.1 next to the project's own packages: see experiments/crosscheck-requirements.txt
(a venv over the system site-packages, d3rlpy installed without its dependencies, because d3rlpy pins
gymnasium 1.0.0 while the evaluation must use the project's gymnasium 1.4 / mujoco 4.0 environments;
d3rlpy's training code does not touch gymnasium). ``report`` needs only the project's packages.

The policy adapter. d3rlpy's ``StatefulTransformerWrapper`` runs one episode at a time, but its
model, ``impl.modules.transformer`` (``ContinuousDecisionTransformer``), takes a batch (B, K, ...).
``D3rlpyMember`` feeds it every live episode at once exactly as d3rlpy's own ``predict`` prepares one
episode (``TorchTransformerInput.from_numpy``): the last K steps, left-padded with zeros to K with an
attention mask, observations through d3rlpy's observation scaler, returns-to-go through its reward
scaler, timesteps counted from 1 as its trajectory slicer and wrapper count them, padding timestep 0;
the action is the model's output at the newest step (its eval mode drops the newest action token).
The evaluation passes raw observations and raw returns-to-go (state mean 0, std 1, reward scale 1), so
d3rlpy's own preprocessing is the only one. ``D3rlpyPolicies`` gives several trained algos the
interface ``rollout`` takes of dt-primal's model. tests/commands/test_baseline.py checks the adapter against
d3rlpy's ``predict`` and its stateful wrapper.

Where d3rlpy's DT differs from dt-primal's at the same settings (printed by ``train`` too):
  - position encoding: a learned table over timesteps 1..1000 (``SIMPLE``, 1001 rows; padding 0)
    where dt-primal's counts from 0 (1000 rows): the same encoding, shifted by one;
  - loss: squared error summed over the action dimensions and averaged over all B·K window steps,
    padding included (masked to 0); dt-primal averages over valid steps and action dimensions, so
    d3rlpy's gradient is act_dim × (valid fraction) larger before the 0.25 norm clip;
  - windows: d3rlpy draws a window's *last* step uniformly over all transitions and left-pads the
    windows that reach before the episode's start; dt-primal draws the *first* step uniformly and
    right-pads the windows that run past the episode's end. d3rlpy never ends a window at the last
    step of an episode that timed out (its transition count leaves that step out), so that step's
    action is never learnt;
  - layer norms of the blocks use eps 3e-3 (dt-primal 1e-5); the observation scaler divides by
    std + 1e-3 (dt-primal: std + 1e-6);
  - precision: d3rlpy has no mixed precision, so it trains and is evaluated in fp32 (dt-primal's
    reduced protocol uses bf16 autocast);
  - the same where d3rlpy allows it: 3 layers, d_model, heads, K, batch 64, AdamW (lr, weight
    decay 1e-4), linear warm-up (d3rlpy's ``WarmupSchedulerFactory``: lr·min((t+1)/W, 1), the same
    formula) then constant, gradient-norm clip 0.25, dropout 0.1 (embedding, attention, residual),
    the MLP activation (``--activation``, dt-primal's option: ReLU by default, as d3rlpy's), the
    initialisation (the blocks and the timestep table N(0, 0.02); the state, return and action
    embeddings and the action head PyTorch's default: dt-primal's ``--embed-init torch
    --timestep-init gpt2``; its default timestep table, N(0, 1) as both papers' code, is not d3rlpy's),
    tanh action head, return-to-go scale 1/1000, 100 final episodes per target, the same environment seeds.
  ``report`` names the MLP activation and the timestep table's initialisation where the two sides'
  records differ in them (dt-primal's records written before these options trained with GELU and a
  N(0, 0.02) table).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as bench/common.py: read once, when torch's OpenMP loads

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from dt_primal.cli import command_parser, subcommand  # noqa: E402

MODEL = "d3rlpy-dt"  # the "model" folder name of d3rlpy's runs: OUT/<dataset slug>/d3rlpy-dt/seed_N
D3RLPY_LABEL = "d3rlpy DT (DT paper's settings, fp32)"


# ------------------------------------------------------------------------------ the policy adapter


class D3rlpyMember:
    """One trained d3rlpy DT as the callable ``rollout`` takes of an ensemble member:
    ``(states, actions, returns_to_go, timesteps, last_only=True) -> (actions (B, 1, act_dim), [])``.

    ``states`` are raw observations (B, L, obs_dim), ``returns_to_go`` raw returns (B, L, 1),
    ``timesteps`` (B, L) counted from 0 (dt-primal's convention), L >= 1. ``transformer`` is d3rlpy's
    ``ContinuousDecisionTransformer`` (or anything with its signature); the scalers are d3rlpy's
    (``transform`` on torch tensors) or None."""

    def __init__(
        self,
        transformer: torch.nn.Module,
        context: int,
        max_timestep: int,
        observation_scaler=None,
        reward_scaler=None,
        action_scaler=None,
    ):
        self.transformer, self.context, self.max_timestep = transformer, context, max_timestep
        self.observation_scaler, self.reward_scaler, self.action_scaler = (
            observation_scaler,
            reward_scaler,
            action_scaler,
        )

    @classmethod
    def from_algo(cls, algo) -> D3rlpyMember:
        cfg = algo.config
        return cls(
            algo.impl.modules.transformer,
            cfg.context_size,
            cfg.max_timestep,
            cfg.observation_scaler,
            cfg.reward_scaler,
            cfg.action_scaler,
        )

    def inputs(self, states, actions, returns_to_go, timesteps):
        """The model's inputs as d3rlpy's ``TorchTransformerInput.from_numpy`` builds them, for a batch:
        (observations, actions, returns_to_go, timesteps, masks), each with K = ``context`` steps."""
        K = self.context
        states, actions, returns_to_go, timesteps = (x[:, -K:] for x in (states, actions, returns_to_go, timesteps))
        B, L = timesteps.shape
        pad = K - L

        def left_pad(x):
            return torch.cat([x.new_zeros((B, pad, *x.shape[2:])), x], 1) if pad else x

        masks = left_pad(torch.ones(B, L, dtype=torch.float32, device=states.device))
        t = (timesteps.long() + 1).clamp(max=self.max_timestep)  # d3rlpy counts steps from 1; padding is 0
        obs, act, rtg, t = (left_pad(x) for x in (states.float(), actions.float(), returns_to_go.float(), t))
        if self.observation_scaler is not None:
            obs = self.observation_scaler.transform(obs)
        if self.action_scaler is not None:
            act = self.action_scaler.transform(act)
        if self.reward_scaler is not None:
            rtg = self.reward_scaler.transform(rtg)
        return obs, act, rtg, t, masks

    def __call__(self, states, actions, returns_to_go, timesteps, valid=None, last_only: bool = True):
        if not last_only or valid is not None:
            raise ValueError("a d3rlpy policy only predicts the newest action of unpadded windows (last_only=True)")
        obs, act, rtg, t, masks = self.inputs(states, actions, returns_to_go, timesteps)
        with torch.autocast(obs.device.type, enabled=False):  # d3rlpy has no mixed precision: fp32 always
            pred = self.transformer(obs, act, rtg, t, 1 - masks)[:, -1:]
        if self.action_scaler is not None:
            pred = self.action_scaler.reverse_transform(pred)
        return pred, []


class D3rlpyPolicies:
    """Trained d3rlpy DTs (one per seed) with the interface ``Policy`` takes of a member-batched
    ``DecisionTransformer``: ``members``, ``config.act_dim``, ``device``, ``max_ep_len``,
    ``training``, ``train(mode)`` and a call on (M, B, K, ...) inputs with ``last_only``, which runs
    each d3rlpy model on its member's windows."""

    device = torch.device("cpu")

    def __init__(self, policies: list[D3rlpyMember], act_dim: int, max_ep_len: int = 1000):
        self.policies, self.members, self.max_ep_len = policies, len(policies), max_ep_len
        self.config = SimpleNamespace(act_dim=act_dim)
        self.train(False)

    @classmethod
    def from_algos(cls, algos, max_ep_len: int = 1000) -> D3rlpyPolicies:
        return cls([D3rlpyMember.from_algo(a) for a in algos], algos[0].impl.action_size, max_ep_len)

    def train(self, mode: bool = True) -> D3rlpyPolicies:
        for p in self.policies:
            p.transformer.train(mode)
        self.training = mode
        return self

    def __call__(self, states, actions, returns_to_go, timesteps, valid=None, last_only: bool = True):
        preds = [
            p(*(x[m] for x in (states, actions, returns_to_go, timesteps)), valid, last_only)[0]
            for m, p in enumerate(self.policies)
        ]
        return torch.stack(preds), []


# ------------------------------------------------------------------------------ d3rlpy's learner


def settings_from_args(args: argparse.Namespace):
    """dt-primal's Config for the run: the preset, then the options given (as train.py does)."""
    from dt_primal.config import make_config, overrides

    given = {k: v for k, v in overrides(args).items() if k != "out"}  # --out is where the runs go, not a setting
    return make_config(args.preset, **given)


def differences(
    precision: str, activations: tuple[str, str] = ("relu", "relu"), timestep_init: str = "gpt2"
) -> list[str]:
    """Where d3rlpy's DT departs from dt-primal's trained in ``precision`` (the module docstring says
    why); ``activations``: the MLP activation of d3rlpy's runs and of dt-primal's; ``timestep_init``:
    dt-primal's timestep table (d3rlpy's is always N(0, 0.02), dt-primal's ``gpt2``)."""
    notes = [
        "position encoding: d3rlpy's learned table over timesteps 1..1000 (dt-primal: 0..999)",
        "loss: d3rlpy sums the squared error over action dimensions and averages over all window steps, "
        "padding included (dt-primal: mean over valid steps and dimensions)",
        "windows: d3rlpy draws the last step uniformly and left-pads (dt-primal: the first step, right-pads); "
        "d3rlpy never learns the last action of an episode that timed out",
        "layer norm eps 3e-3 in d3rlpy's blocks (dt-primal 1e-5); observation std + 1e-3 (dt-primal + 1e-6)",
    ]
    if precision != "fp32":
        notes.append(f"precision: d3rlpy trains and is evaluated in fp32 (dt-primal: {precision})")
    if activations[0] != activations[1]:
        notes.append(f"MLP activation: d3rlpy {activations[0]}, dt-primal {activations[1]}")
    if timestep_init != "gpt2":
        notes.append(
            "timestep table's initialisation: d3rlpy N(0, 0.02), dt-primal N(0, 1) (`--timestep-init "
            f"{timestep_init}`; `--timestep-init gpt2` is d3rlpy's)"
        )
    return notes


def build_algo(cfg, device: str = "cpu:0"):
    """d3rlpy's DecisionTransformer at dt-primal's settings ``cfg`` (as d3rlpy's own DT reproduction
    script builds it: a one-layer state encoder, standard observation scaler, reward scale)."""
    import d3rlpy

    config = d3rlpy.algos.DecisionTransformerConfig(
        batch_size=cfg.batch_size,
        context_size=cfg.context,
        max_timestep=cfg.max_ep_len,
        learning_rate=cfg.lr,
        encoder_factory=d3rlpy.models.VectorEncoderFactory([cfg.d_model], exclude_last_activation=True),
        optim_factory=d3rlpy.optimizers.AdamWFactory(
            weight_decay=cfg.weight_decay,
            clip_grad_norm=cfg.grad_clip,
            lr_scheduler_factory=d3rlpy.optimizers.WarmupSchedulerFactory(max(1, cfg.warmup_steps)),
        ),
        num_heads=cfg.n_head,
        num_layers=cfg.n_layer,
        attn_dropout=cfg.dropout,
        resid_dropout=cfg.dropout,
        embed_dropout=cfg.dropout,
        activation_type=cfg.activation,
        position_encoding_type=d3rlpy.PositionEncodingType.SIMPLE,
        observation_scaler=d3rlpy.preprocessing.StandardObservationScaler(),
        reward_scaler=d3rlpy.preprocessing.MultiplyRewardScaler(1.0 / cfg.reward_scale),
    )
    return config.create(device=device)


def to_replay_buffer(data):
    """dt-primal's ``Trajectories`` as a d3rlpy dataset: the same episodes, ends marked as terminals
    (terminated episodes) or timeouts (the others)."""
    import d3rlpy

    ends = data.starts + data.lengths - 1
    terminals, timeouts = np.zeros(len(data.rewards), np.float32), np.zeros(len(data.rewards), np.float32)
    terminals[ends[data.terminals]] = 1.0
    timeouts[ends[~data.terminals]] = 1.0
    return d3rlpy.dataset.MDPDataset(
        observations=data.observations,
        actions=data.actions,
        rewards=data.rewards.reshape(-1, 1),
        terminals=terminals,
        timeouts=timeouts,
        action_space=d3rlpy.ActionSpace.CONTINUOUS,
    )


def prepare(algo, dataset) -> None:
    """What ``DecisionTransformer.fit`` does before its loop: fit the scalers, build the networks."""
    from d3rlpy.algos.utility import build_scalers_with_trajectory_slicer

    build_scalers_with_trajectory_slicer(algo, dataset)
    algo.build_with_dataset(dataset)


def evaluate(algos, task, targets, episodes: int, cfg, seeds: list[int]) -> list[list[dict]]:
    """dt-primal's batched evaluation of d3rlpy policies: raw observations and returns go in, d3rlpy's
    scalers do the rest; member m's environments are seeded as dt-primal's member of seed ``seeds[m]``."""
    from dt_primal.evaluation.policy import Policy
    from dt_primal.evaluation.rollout import evaluation_seeds, rollout

    obs_dim = algos[0].impl.observation_shape[0]
    policy = Policy(
        D3rlpyPolicies.from_algos(algos, cfg.max_ep_len),
        np.zeros(obs_dim, np.float32),
        np.ones(obs_dim, np.float32),
        1.0,
        cfg.context,
    )
    return rollout(policy, task, targets, episodes, seeds=evaluation_seeds(seeds))


def train_seed(cfg, data, task, targets, seed: int, run: Path, log_every: int = 100) -> dict:
    """Train one seed with d3rlpy's own sampler and update (the body of its ``fit`` loop), evaluating
    as dt-primal does; writes ``run``/evals.jsonl, model.d3 and eval.json (dt-primal's formats)."""
    import d3rlpy

    from dt_primal.provenance import provenance

    run.mkdir(parents=True, exist_ok=True)
    model_file = run / "model.d3"
    if model_file.exists():  # trained, the final evaluation was interrupted
        algo = d3rlpy.load_learnable(str(model_file), device="cpu:0")
        print(f"seed {seed}: loaded {model_file}", flush=True)
    else:
        d3rlpy.seed(seed)
        dataset = to_replay_buffer(data)
        algo = build_algo(cfg)
        prepare(algo, dataset)
        curve = run / "evals.jsonl"
        curve.write_text("")
        t0, t_log = time.perf_counter(), time.perf_counter()
        losses = []
        for step in range(1, cfg.steps + 1):
            batch = dataset.sample_trajectory_batch(cfg.batch_size, length=cfg.context)
            losses.append(algo.update(batch)["loss"])
            if step % log_every == 0:
                now = time.perf_counter()
                print(
                    f"seed {seed} step {step}: loss {np.mean(losses):.4f}, {log_every / (now - t_log):.1f} updates/s",
                    flush=True,
                )
                losses, t_log = [], now
            if step % cfg.eval_every == 0 and step < cfg.steps:
                reports = evaluate([algo], task, targets, cfg.eval_episodes_during, cfg, [seed])[0]
                with curve.open("a") as f:
                    f.write(
                        json.dumps(
                            {
                                "step": step,
                                "reports": [
                                    {k: v for k, v in r.items() if k not in ("returns", "lengths")} for r in reports
                                ],
                            }
                        )
                        + "\n"
                    )
                print(
                    f"seed {seed} step {step}: "
                    + ", ".join(f"target {r['target']:g} -> {r['normalized_mean']:.1f}" for r in reports),
                    flush=True,
                )
                t_log = time.perf_counter()
        print(f"seed {seed}: trained {cfg.steps} steps in {time.perf_counter() - t0:.0f} s", flush=True)
        algo.save(str(model_file))
    t0 = time.perf_counter()
    reports = evaluate([algo], task, targets, cfg.eval_episodes, cfg, [seed])[0]
    made = provenance("cpu")
    made["versions"]["d3rlpy"] = d3rlpy.__version__
    result = {
        "checkpoint": str(model_file),
        "step": cfg.steps,
        "task": task.gym_id,
        "dataset": cfg.dataset,
        "model": MODEL,
        "seed": seed,
        "eval_seconds": time.perf_counter() - t0,
        "targets": reports,
        "d3rlpy": d3rlpy.__version__,
        "activation": cfg.activation,
        "precision": "fp32",
        "settings": {
            k: getattr(cfg, k)
            for k in (
                "n_layer",
                "d_model",
                "n_head",
                "context",
                "dropout",
                "lr",
                "weight_decay",
                "warmup_steps",
                "grad_clip",
                "batch_size",
                "reward_scale",
                "steps",
            )
        },
        # the settings as dt-primal's records state them: d3rlpy trains in fp32, its timestep table N(0, 0.02)
        "config": dataclasses.asdict(dataclasses.replace(cfg, seed=seed, precision="fp32", timestep_init="gpt2")),
        "provenance": made,
    }
    (run / "eval.json").write_text(json.dumps(result, indent=1))
    print(
        f"seed {seed}: "
        + ", ".join(
            f"target {r['target']:g}: normalised {r['normalized_mean']:.1f} ± {r['normalized_std']:.1f}"
            for r in reports
        ),
        flush=True,
    )
    return result


def cmd_train(args: argparse.Namespace) -> None:
    from commands.sweep.grid import run_dir
    from datasets.loaders import load_dataset

    cfg = settings_from_args(args)
    if cfg.model != "dt":
        sys.exit(f"error: the cross-check trains d3rlpy's DT, but the settings say --model {cfg.model}")
    torch.set_num_threads(args.threads)
    data = load_dataset(cfg.dataset, cfg.env, cfg.download, ref_scores=cfg.ref_scores)
    task = data.task
    cfg = cfg.resolved(task)
    targets = cfg.targets or list(task.targets)
    print(
        f"d3rlpy DT on {cfg.dataset}: d_model {cfg.d_model}, {cfg.n_head} heads, {cfg.n_layer} layers, K "
        f"{cfg.context}, "
        f"lr {cfg.lr:g}, warm-up {cfg.warmup_steps}, {cfg.steps} steps, batch {cfg.batch_size}, activation "
        f"{cfg.activation}, {args.threads} threads",
        flush=True,
    )
    for note in differences(cfg.precision):
        print(f"  differs: {note}", flush=True)
    for seed in args.seeds:
        run = run_dir(args.out, cfg.dataset, MODEL, seed)
        if (run / "eval.json").exists():
            print(f"seed {seed}: {run}/eval.json exists, skipped", flush=True)
            continue
        train_seed(cfg, data, task, targets, seed, run)


# ------------------------------------------------------------------------------ the comparison


def recorded_model(rows: list[dict]) -> dict:
    """The MLP activation and timestep table of dt-primal's runs in ``rows``, from their eval.json's config;
    where none is recorded, those every run before the options had: GELU and a N(0, 0.02) table."""
    from dt_primal.config import ADDED_LATER as before

    for r in rows:
        for seed in r["finished_seeds"]:
            cfg = json.loads((Path(r["dir"]) / f"seed_{seed}" / "eval.json").read_text()).get("config")
            if cfg:
                return {k: cfg.get(k, v) for k, v in before.items()}
    return before


def cmd_report(args: argparse.Namespace) -> None:
    from commands.sweep.results import DT_PAPER, collect
    from commands.sweep.tables import gap_rows, gap_table, write_tables

    datasets = args.datasets
    ours = collect(args.dt_primal, datasets, ["dt"], args.seeds, label=DT_PAPER)
    theirs = collect(args.d3rlpy, datasets, [MODEL], args.seeds, label=D3RLPY_LABEL)
    rows = [r for d in datasets for r in ours + theirs if r["dataset"] == d]
    if not rows:
        sys.exit("no finished run to compare yet")
    out = args.out or args.d3rlpy
    out.mkdir(parents=True, exist_ok=True)
    table = write_tables(rows, out, name="crosscheck")
    gaps = gap_rows(rows, DT_PAPER, D3RLPY_LABEL)
    evals = [json.loads(p.read_text()) for p in sorted(args.d3rlpy.glob(f"*/{MODEL}/seed_*/eval.json"))]
    model = recorded_model(ours)
    activations = (evals[0].get("activation", "gelu") if evals else "gelu", model["activation"])
    known = [r["settings"]["precision"] for r in ours if r["settings"]]
    precision = known[0] if known else "unknown (no checkpoint or train.log of dt-primal's runs)"
    md = (
        table + f"\n- **{D3RLPY_LABEL}**: d3rlpy {evals[0].get('d3rlpy', '') if evals else ''}'s "
        f"`DecisionTransformer` at the same settings, evaluated by dt-primal's evaluation "
        f"(`experiments/d3rlpy_crosscheck.py`). Where it differs:\n"
        + "".join(f"  - {n}\n" for n in differences(precision, activations, model["timestep_init"]))
        + "\ndt-primal DT − d3rlpy DT:\n\n"
        + gap_table(gaps, "dt-primal DT", "d3rlpy DT")
    )
    (out / "crosscheck.md").write_text(md)
    (out / "crosscheck.json").write_text(json.dumps({"rows": rows, "gaps": gaps}, indent=1))
    print(md)
    print(f"wrote {out}/crosscheck.md, crosscheck.json, crosscheck.csv")


def main(argv: list[str] | None = None) -> None:
    p = command_parser(__doc__, prog="experiments/d3rlpy_crosscheck.py")
    sub = p.add_subparsers(dest="cmd", required=True)
    t = subcommand(sub, "train", "train d3rlpy's DT per seed and evaluate it with dt-primal's evaluation")
    from dt_primal.config import PRESETS, add_config_args

    t.add_argument("--preset", choices=list(PRESETS), default="dt-paper", help="dt-primal's preset (default dt-paper)")
    t.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    t.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    add_config_args(
        t,
        only=(
            "dataset",
            "env",
            "download",
            "model",
            "n_layer",
            "d_model",
            "n_head",
            "context",
            "dropout",
            "activation",
            "max_ep_len",
            "steps",
            "batch_size",
            "lr",
            "weight_decay",
            "warmup_steps",
            "grad_clip",
            "precision",
            "reward_scale",
            "targets",
            "eval_every",
            "eval_episodes_during",
            "eval_episodes",
        ),
    )
    t.add_argument(
        "--out",
        type=Path,
        default=Path("runs/d3rlpy-crosscheck"),
        help="runs go to OUT/<dataset slug>/d3rlpy-dt/seed_N, as the sweep lays out its runs",
    )
    r = subcommand(sub, "report", "per dataset: both implementations' scores, and the gap in standard errors")
    r.add_argument("--d3rlpy", type=Path, required=True, help="the train command's --out")
    r.add_argument(
        "--dt-primal",
        type=Path,
        required=True,
        help="a sweep folder with dt-primal's DT runs (--models dt -- --preset dt-paper ...)",
    )
    r.add_argument("--datasets", nargs="+", required=True)
    r.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    r.add_argument(
        "--out", type=Path, default=None, help="where crosscheck.{md,json,csv} go (default: the --d3rlpy folder)"
    )
    args = p.parse_args(argv)
    if args.cmd == "train":
        cmd_train(args)
    else:
        cmd_report(args)


if __name__ == "__main__":
    main()
