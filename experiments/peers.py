"""Training-throughput benchmark of two *peer* Decision Transformer implementations.

Peers
  hf      ``transformers.DecisionTransformerModel`` trained by a plain PyTorch loop
          written here: AdamW (weight decay 1e-4), linear warm-up ``LambdaLR``,
          forward, action MSE over the non-padded steps, backward, grad-norm clip
          0.25, optimizer step, scheduler step (the original DT training step).
  d3rlpy  ``d3rlpy.algos.DecisionTransformer`` (d3rlpy 2.x) configured like d3rlpy's
          own DT reproduction: a one-layer ``VectorEncoderFactory([d_model])`` state
          embedding, AdamW (weight decay 1e-4, clip 0.25, warm-up scheduler),
          ``StandardObservationScaler``, ``MultiplyRewardScaler(0.001)``, SIMPLE
          (per-timestep) position encoding, ReLU MLPs.

What one "update" is (the same definition for both peers)
  1. sample a batch of ``--batch`` length-``--context`` windows from the dataset, and
  2. one full optimisation step on it.
  For d3rlpy both halves are d3rlpy's own code, exactly the body of its ``fit`` loop:
  ``buffer.sample_trajectory_batch(batch, context)`` (pure-Python slicing, including its
  per-sample returns-to-go) then ``algo.update(batch)`` (numpy -> torch conversion,
  scalers, forward, loss, backward, clip, AdamW, LR scheduler, loss ``.item()``).
  ``fit`` itself is not timed because it adds logging, tqdm and checkpoint files.
  For hf the sampler is a vectorised numpy gather written here (the original DT
  ``get_batch`` semantics: episode picked with probability proportional to its length,
  uniform start, left padding, normalised states, returns-to-go / 1000) followed by
  the training step above. The sampling share is reported in ``notes`` for both peers,
  so update-only rates can be derived.

Timing
  ``--warmup`` untimed updates, then ``--updates`` updates each timed with
  ``time.perf_counter``; ``seconds`` is their sum and ``updates_per_s`` is
  ``updates / seconds``; the process CPU time of the same updates is in ``notes``
  (less sensitive than wall clock to other load on the machine). Torch threads are
  left at their default (one per core) unless ``--threads`` is given.
  ``OMP_WAIT_POLICY`` defaults to ``PASSIVE`` (set before torch loads; an explicit
  environment value wins): on a shared 2-core machine OpenMP's default spin-waiting
  makes 2 threads 4-12x slower than 1 thread whenever another busy process holds a
  core. The thread count, ``OMP_WAIT_POLICY`` and the 1-min load average before and
  after go into ``notes``.
  ``--precision bf16`` runs the forward pass and loss under
  ``torch.autocast("cpu", dtype=torch.bfloat16)`` with fp32 master weights (for d3rlpy
  this wraps its ``compute_loss``, since it has no mixed-precision option of its own);
  backward, clipping and the optimizer run outside autocast in both peers.

Output: one JSON line on stdout; everything the libraries print goes to stderr.

Usage (run from the repo root with the peers venv, see experiments/peers-requirements.txt):
  ~/.venvs/peers/bin/python experiments/peers.py --make-hdf5 hopper-synth.hdf5
  ~/.venvs/peers/bin/python experiments/peers.py --peer hf --hdf5 hopper-synth.hdf5 \
      --d-model 256 --heads 4 --layers 3 --precision fp32 --updates 200
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # read once, when torch's OpenMP loads

import h5py  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from datasets.synthetic import hopper_episodes, write_d4rl  # noqa: E402  (numpy and h5py only)

MAX_EP_LEN = 1000
RTG_SCALE = 1000.0  # DT's return scale for the MuJoCo tasks (d3rlpy: reward * 0.001)
WEIGHT_DECAY = 1e-4
GRAD_CLIP = 0.25
WARMUP_STEPS = 10_000


# --------------------------------------------------------------------------- data


@dataclass
class Dataset:
    """Flat D4RL arrays cut after the last episode end (trailing partial episode dropped)."""

    observations: np.ndarray  # (N, obs_dim) float32
    actions: np.ndarray  # (N, act_dim) float32
    rewards: np.ndarray  # (N,) float32
    terminals: np.ndarray  # (N,) bool
    timeouts: np.ndarray  # (N,) bool

    @property
    def episode_ends(self) -> np.ndarray:
        """Exclusive end index of every episode."""
        return np.flatnonzero(self.terminals | self.timeouts) + 1


def load_hdf5(path: str) -> Dataset:
    with h5py.File(path, "r") as f:
        terminals = f["terminals"][:].astype(bool)
        timeouts = f["timeouts"][:].astype(bool)
        ends = np.flatnonzero(terminals | timeouts)
        if ends.size == 0:
            raise SystemExit(f"{path}: no episode ends (terminals/timeouts all false)")
        n = int(ends[-1]) + 1
        return Dataset(
            observations=f["observations"][:n].astype(np.float32),
            actions=f["actions"][:n].astype(np.float32),
            rewards=f["rewards"][:n].astype(np.float32),
            terminals=terminals[:n],
            timeouts=timeouts[:n],
        )


# ------------------------------------------------------------------------- timing


@dataclass
class Peer:
    """What the harness needs from a peer: its batch sampler and its update step."""

    version: str
    params: int
    sample: Callable[[], object]
    update: Callable[[object], float]  # returns the loss (as d3rlpy's update does)
    notes: list[str]


def autocast(precision: str) -> contextlib.AbstractContextManager:
    if precision == "bf16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


@dataclass
class Timing:
    seconds: float  # wall clock of the timed updates
    sampling: float  # wall clock spent in the sampler
    cpu_seconds: float  # process CPU time (all threads) of the timed updates
    loss: float  # loss of the last update


def time_updates(peer: Peer, warmup: int, updates: int) -> Timing:
    """Run ``warmup`` untimed then ``updates`` timed updates."""
    for _ in range(warmup):
        peer.update(peer.sample())
    total = sampling = 0.0
    loss = float("nan")
    cpu0 = time.process_time()
    for _ in range(updates):
        t0 = time.perf_counter()
        batch = peer.sample()
        t1 = time.perf_counter()
        loss = peer.update(batch)
        t2 = time.perf_counter()
        total += t2 - t0
        sampling += t1 - t0
    return Timing(total, sampling, time.process_time() - cpu0, loss)


# ---------------------------------------------------------------- peer: transformers


class WindowSampler:
    """Vectorised DT ``get_batch``: length-weighted episodes, uniform start, left padding."""

    def __init__(self, data: Dataset, context: int, batch: int, seed: int):
        ends = data.episode_ends
        self.starts = np.concatenate([[0], ends[:-1]])
        self.lengths = ends - self.starts
        self.probs = self.lengths / self.lengths.sum()
        self.context, self.batch = context, batch
        self.rng = np.random.default_rng(seed)
        mean = data.observations.mean(0)
        std = data.observations.std(0) + 1e-6
        self.states = (data.observations - mean) / std
        self.actions = data.actions
        # returns-to-go, computed once per episode (reverse cumulative sum)
        self.rtg = np.empty_like(data.rewards)
        for s, e in zip(self.starts, ends):
            self.rtg[s:e] = np.cumsum(data.rewards[s:e][::-1])[::-1]
        self.rtg /= RTG_SCALE

    def __call__(self) -> dict[str, torch.Tensor]:
        ep = self.rng.choice(len(self.lengths), size=self.batch, p=self.probs)
        offset = (self.rng.random(self.batch) * self.lengths[ep]).astype(np.int64)
        valid_len = np.minimum(self.context, self.lengths[ep] - offset)  # (B,)
        pad = self.context - valid_len
        # step j of the window holds episode step offset + j - pad (valid when j >= pad)
        t = offset[:, None] + np.arange(self.context)[None, :] - pad[:, None]
        mask = np.arange(self.context)[None, :] >= pad[:, None]
        t = np.where(mask, t, 0)
        rows = self.starts[ep][:, None] + t
        maskf = mask.astype(np.float32)
        return {
            "states": torch.from_numpy(self.states[rows] * maskf[..., None]),
            "actions": torch.from_numpy(self.actions[rows] * maskf[..., None]),
            "returns_to_go": torch.from_numpy((self.rtg[rows] * maskf)[..., None]),
            "timesteps": torch.from_numpy(np.minimum(t, MAX_EP_LEN - 1)),
            "attention_mask": torch.from_numpy(mask.astype(np.int64)),
        }


def build_hf(args: argparse.Namespace, data: Dataset) -> Peer:
    import transformers
    from transformers import DecisionTransformerConfig, DecisionTransformerModel

    config = DecisionTransformerConfig(
        state_dim=data.observations.shape[1],
        act_dim=data.actions.shape[1],
        hidden_size=args.d_model,
        n_head=args.heads,
        n_layer=args.layers,
        max_ep_len=MAX_EP_LEN,
        activation_function="relu",
        resid_pdrop=args.dropout,
        embd_pdrop=args.dropout,
        attn_pdrop=args.dropout,
        action_tanh=True,
        use_cache=False,  # training: no KV cache
    )
    model = DecisionTransformerModel(config)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=WEIGHT_DECAY)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min((step + 1) / WARMUP_STEPS, 1.0))
    sampler = WindowSampler(data, args.context, args.batch, args.seed)

    def update(batch: dict[str, torch.Tensor]) -> float:
        with autocast(args.precision):
            out = model(
                states=batch["states"],
                actions=batch["actions"],
                returns_to_go=batch["returns_to_go"],
                timesteps=batch["timesteps"],
                attention_mask=batch["attention_mask"],
                return_dict=True,
            )
            keep = batch["attention_mask"].reshape(-1) > 0
            act_dim = batch["actions"].shape[-1]
            pred = out.action_preds.reshape(-1, act_dim)[keep]
            target = batch["actions"].reshape(-1, act_dim)[keep]
            loss = torch.mean((pred.float() - target) ** 2)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        optimizer.step()
        scheduler.step()
        return loss.item()

    params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    pos_table = model.encoder.wpe.weight.numel() + model.encoder.wte.weight.numel()
    unused_heads = sum(p.numel() for m in (model.predict_state, model.predict_return) for p in m.parameters())
    notes = [
        f"attn_implementation={config._attn_implementation}",
        f"params include the GPT-2 wpe/wte tables ({pos_table}; only position 0 is used) "
        f"and the state/return heads ({unused_heads}; unused by the action loss): "
        f"{params - pos_table - unused_heads} params do real work",
        "sampler is this script's vectorised numpy DT get_batch",
    ]
    return Peer(transformers.__version__, params, sampler, update, notes)


# --------------------------------------------------------------------- peer: d3rlpy


def build_d3rlpy(args: argparse.Namespace, data: Dataset) -> Peer:
    import d3rlpy
    from d3rlpy.algos.utility import build_scalers_with_trajectory_slicer

    d3rlpy.seed(args.seed)
    dataset = d3rlpy.dataset.MDPDataset(
        observations=data.observations,
        actions=data.actions,
        rewards=data.rewards,
        terminals=data.terminals.astype(np.float32),
        timeouts=data.timeouts.astype(np.float32),
    )
    config = d3rlpy.algos.DecisionTransformerConfig(
        batch_size=args.batch,
        context_size=args.context,
        max_timestep=MAX_EP_LEN,
        learning_rate=args.lr,
        encoder_factory=d3rlpy.models.VectorEncoderFactory([args.d_model], exclude_last_activation=True),
        optim_factory=d3rlpy.optimizers.AdamWFactory(
            weight_decay=WEIGHT_DECAY,
            clip_grad_norm=GRAD_CLIP,
            lr_scheduler_factory=d3rlpy.optimizers.WarmupSchedulerFactory(WARMUP_STEPS),
        ),
        num_heads=args.heads,
        num_layers=args.layers,
        attn_dropout=args.dropout,
        resid_dropout=args.dropout,
        embed_dropout=args.dropout,
        activation_type="relu",
        position_encoding_type=d3rlpy.PositionEncodingType.SIMPLE,
        observation_scaler=d3rlpy.preprocessing.StandardObservationScaler(),
        reward_scaler=d3rlpy.preprocessing.MultiplyRewardScaler(1.0 / RTG_SCALE),
    )
    algo = config.create(device="cpu:0")
    # the same set-up steps that DecisionTransformer.fit performs before its loop
    build_scalers_with_trajectory_slicer(algo, dataset)
    algo.build_with_dataset(dataset)
    impl = algo.impl
    if args.precision == "bf16":
        fp32_loss = impl.compute_loss

        def bf16_loss(batch: d3rlpy.torch_utility.TorchTrajectoryMiniBatch) -> torch.Tensor:
            with autocast("bf16"):
                return fp32_loss(batch)

        impl.compute_loss = bf16_loss

    def sample() -> d3rlpy.dataset.TrajectoryMiniBatch:
        return dataset.sample_trajectory_batch(args.batch, length=args.context)

    def update(batch: d3rlpy.dataset.TrajectoryMiniBatch) -> float:
        return algo.update(batch)["loss"]

    transformer = impl.modules.transformer
    params = sum(p.numel() for p in transformer.parameters() if p.requires_grad)
    notes = [
        "timed = dataset.sample_trajectory_batch + algo.update (the body of fit's loop)",
        "loss is d3rlpy's: squared error summed over action dims",
        f"state embedding = VectorEncoderFactory([{args.d_model}]) Linear; "
        f"position table {MAX_EP_LEN + 1} timesteps; LayerNorm eps 3e-3; no state/return heads",
    ]
    if args.precision == "bf16":
        notes.append("bf16 via torch.autocast around impl.compute_loss (d3rlpy has no AMP option)")
    return Peer(d3rlpy.__version__, params, sample, update, notes)


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    p.add_argument("--make-hdf5", metavar="PATH", help="write a synthetic Hopper-like file and exit")
    p.add_argument("--peer", choices=("hf", "d3rlpy"))
    p.add_argument("--hdf5", metavar="PATH", help="D4RL-style dataset")
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--heads", type=int, default=1)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--context", type=int, default=20, help="K timesteps (3K tokens)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--warmup", type=int, default=20, help="untimed updates first")
    p.add_argument("--updates", type=int, default=200, help="timed updates")
    p.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if not args.make_hdf5 and not (args.peer and args.hdf5):
        p.error("give --make-hdf5 PATH, or --peer and --hdf5")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.make_hdf5:
        write_d4rl(args.make_hdf5, hopper_episodes(100_000, seed=args.seed))
        print(f"wrote {args.make_hdf5}", file=sys.stderr)
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    load_before = os.getloadavg()[0]
    with contextlib.redirect_stdout(sys.stderr):  # keep stdout for the JSON line
        data = load_hdf5(args.hdf5)
        peer = (build_hf if args.peer == "hf" else build_d3rlpy)(args, data)
        t = time_updates(peer, args.warmup, args.updates)
    notes = peer.notes + [
        f"sampling {t.sampling:.3f}s of {t.seconds:.3f}s (update-only {args.updates / (t.seconds - t.sampling):.2f}/s)",
        f"process CPU {t.cpu_seconds:.1f}s ({args.updates / t.cpu_seconds:.2f} updates per CPU-s)",
        f"last loss {t.loss:.4f}",
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}, "
        f"load avg {load_before:.2f} -> {os.getloadavg()[0]:.2f}",
    ]
    print(
        json.dumps(
            {
                "peer": args.peer,
                "version": peer.version,
                "d_model": args.d_model,
                "heads": args.heads,
                "layers": args.layers,
                "context": args.context,
                "batch": args.batch,
                "precision": args.precision,
                "params": peer.params,
                "updates": args.updates,
                "seconds": round(t.seconds, 4),
                "updates_per_s": round(args.updates / t.seconds, 3),
                "notes": "; ".join(notes),
            }
        )
    )


if __name__ == "__main__":
    main()
