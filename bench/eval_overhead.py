"""Where an evaluation step's time goes: the batched rollout (``dt_primal.evaluation.rollout``) split into
the model's forward pass, the environments' stepping (with the worker processes' pipes) and the rest
(acting's bookkeeping, the rollout loop, host-device transfers), per environment step, against stepping
the same environments alone with fixed actions; the start-up (starting the worker processes, making and resetting
the environments, closing them) is timed apart, once per rollout, and so are the forward pass's first steps (while the
context fills, up to its first full one: on CUDA the kernels' first use) beyond later steps' time and the capture.

  python -m bench.eval_overhead                              # CPU: 64 and 256 episodes, 1 and 2 workers
  python -m bench.eval_overhead --device cuda --episodes 60 600 1800 --workers 0 --json evaluation.json  # a GPU's
  python -m bench.eval_overhead --quick                      # smoke check, < 1 min

``--workers 0``: as many worker processes as an evaluation of that many episodes starts
(``dt_primal.evaluation.rollout.default_env_workers``). ``--pipeline``: each rollout pipelined (two halves of its
episodes, one stepping while the other acts, as evaluations with workers run), in turn (as evaluations beside
training run), or both. ``--json``: the measurements, and the seconds of an evaluation fitted over the episode
counts, per step of its episodes: ``step_s`` + ``env_step_s`` × episodes, and ``start_s`` once (the start-up and the
forward pass's first steps), as evaluations run ("evaluation", what ``python -m commands.sweep --time-budget`` reads in
a throughput file: on CUDA with the first ``--forward``) and as evaluations beside training run, acting eagerly and
stepping in turn ("evaluation_in_turn", where measured apart: what it reads for those).

Hopper-v5 with ``terminate_when_unhealthy=False``: every episode runs ``--steps`` steps, so every step has
the same width. The model: an untrained Primal.+DT at the paper's size (3 members), acting in fp32 on a CPU,
bf16 on CUDA. The forward pass is timed with the device synchronised; the rest is the rollout's total less
forward and stepping.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import time

import bench.common as common  # sets OMP_WAIT_POLICY before torch loads

import numpy as np
import torch

from dt_primal.cli import command_parser
from dt_primal.config import make_config
from dt_primal.evaluation.policy import Policy
from dt_primal.evaluation.rollout import default_env_workers, rollout
from dt_primal.model.transformer import DecisionTransformer
from envs import TASKS, Episodes


def envs_alone(task, n: int, workers: int, steps: int) -> tuple[float, float]:
    """Seconds of ``steps`` steps of ``n`` environments with fixed actions, and of as many round trips to their
    workers that step none of them (what the pipes and the worker loop cost)."""
    env = Episodes(task, n, workers)
    env.reset(list(range(n)))
    actions = np.zeros((n, *env.action_shape), np.float32)
    seconds = []
    for alive in (np.ones(n, bool), np.zeros(n, bool)):
        t0 = time.perf_counter()
        for _ in range(steps):
            env.step(actions, alive)
        seconds.append(time.perf_counter() - t0)
    env.close()
    return seconds[0], seconds[1]


def in_rollout(
    task, n: int, workers: int, steps: int, device: str, members: int, capture: bool = True, pipeline: bool = False
) -> dict:
    """The rollout of ``n`` episodes (over ``members`` members) split into forward, stepping (sending the actions to
    the environments and waiting for their step) and the rest, with the start-up and the forward pass's first steps'
    excess (``first_forward``: its calls up to the first with a full context, less as many later calls and the
    capture) apart; ``capture``: the policy's forward pass replayed as a CUDA graph (on CUDA: ``Policy``'s
    ``capture``); ``pipeline``: ``rollout``'s. Timed through the rollout's and the policy's ``phase`` hooks."""
    cfg = make_config("paper", model="primal", s=64, max_ep_len=steps)
    model = DecisionTransformer(cfg.model_config(11, 3), members=members).to(device).eval()
    seconds = {"forward": 0.0, "capture": 0.0, "stepping": 0.0, "start": 0.0, "first": 0.0}
    calls = {"first": 0, "later": 0}
    halves = 2 if pipeline and n // members > 1 else 1  # as rollout splits its episodes
    filling = cfg.context * halves  # each half's forward pass fills its context in its first K calls

    @contextlib.contextmanager
    def phase(name: str):
        t0 = time.perf_counter()
        yield
        if name in ("forward", "capture") and device.startswith("cuda"):
            torch.cuda.synchronize()
        took = time.perf_counter() - t0
        seconds[name] += took
        if name == "forward":
            first = calls["first"] + calls["later"] < filling
            calls["first" if first else "later"] += 1
            seconds["first"] += took if first else 0.0

    precision = "bf16" if device.startswith("cuda") else "fp32"
    policy = Policy(model, np.zeros(11), np.ones(11), 1000.0, cfg.context, precision, capture, phase=phase)
    t0 = time.perf_counter()
    rollout(policy, task, [3600.0], n // members, env_workers=workers, pipeline=pipeline, phase=phase)
    total = time.perf_counter() - t0
    later = (seconds["forward"] - seconds["first"]) / max(1, calls["later"])
    first = max(0.0, seconds.pop("first") - calls["first"] * later - seconds["capture"])
    return {"total": total, **seconds, "first_forward": first}


def product_setting(record: dict, device: str) -> bool:
    """Whether ``record`` ran as an evaluation of its episodes does: the workers it starts, pipelined with several."""
    workers = default_env_workers(device, record["episodes"])
    return record["workers"] == workers and record.get("pipeline", False) == (workers > 1)


# steps of an evaluation per capture of its forward pass at a new width (``CapturedForward``): a rollout's one
# capture counts as if it ran this many steps, whatever its --steps, so that fits of shorter rollouts compare
CAPTURE_EVERY = 200


def fit(records: list[dict]) -> dict:
    """An evaluation's seconds per step of its episodes, ``step_s + env_step_s × episodes``: least squares
    over ``records`` (the workers an evaluation starts; their capturing as one per ``CAPTURE_EVERY`` steps);
    through the origin with one episode count. ``start_s``: the longest of their start-ups with their forward
    pass's first steps' excess, once per evaluation (none in records made before those were timed apart, whose
    per-step seconds hold them)."""
    x = np.array([r["episodes"] for r in records], float)
    apart = lambda r: r.get("start_s", 0.0) + r.get("first_forward_s", 0.0)
    once = lambda r: r.get("capture_s", 0.0) + apart(r)
    y = np.array([(r["total_s"] - once(r)) / r["steps"] + r.get("capture_s", 0.0) / CAPTURE_EVERY for r in records])
    start = {"start_s": max(apart(r) for r in records)}
    if len(set(x)) > 1:
        b, a = np.polyfit(x, y, 1)
        if a >= 0 and b > 0:
            return {"step_s": float(a), "env_step_s": float(b)} | start
    return {"step_s": 0.0, "env_step_s": float(x @ y / (x @ x))} | start


def fits(records: list[dict], device: str) -> dict:
    """The fits the sweep's budget reads: "evaluation", of the records that ran as evaluations do (the first
    record's forward pass, the workers they start, pipelined with several), and "evaluation_in_turn", of those that
    ran as evaluations beside training do (the workers they start, in turn, the eager forward pass where measured),
    where it differs."""
    forward = records[0]["forward"]
    product = [r for r in records if r["forward"] == forward and product_setting(r, device)]
    fitted = {"evaluation": fit(product or records) | {"pipelined": any(r["pipeline"] for r in product)}}
    beside = [r for r in records if r["workers"] == default_env_workers(device, r["episodes"]) and not r["pipeline"]]
    in_turn = [r for r in beside if r["forward"] == "eager"] or [r for r in beside if r["forward"] == forward]
    if in_turn and in_turn != (product or records):
        fitted["evaluation_in_turn"] = fit(in_turn)
    return fitted


def measure(args) -> list[dict]:
    """Every episode count with every worker count: the rollout split up, and the environments alone."""
    task = common.task_with(TASKS["hopper"], terminate_when_unhealthy=False, max_episode_steps=args.steps)
    in_rollout(task, args.members, 1, 25, args.device, args.members)  # untimed: the device's first use
    records = []
    forwards = args.forward if args.device.startswith("cuda") else ["eager"]  # a CPU's is eager
    for n in args.episodes:
        for w in args.workers:
            w = w or default_env_workers(args.device, n)
            alone, pipes = envs_alone(task, n, w, args.steps)
            for forward, pipelined in itertools.product(forwards, args.pipeline):
                pipeline = pipelined == "pipelined"
                r = in_rollout(task, n, w, args.steps, args.device, args.members, forward == "captured", pipeline)
                records.append(
                    dict(episodes=n, workers=w, steps=args.steps, members=args.members, forward=forward)
                    | {"pipeline": pipeline, "alone_s": alone, "pipes_s": pipes}
                    | {f"{k}_s": v for k, v in r.items()}
                )
                print(json.dumps(records[-1]), f"(load {common.load_avg():.2f})", flush=True)
    return records


def main() -> None:
    p = command_parser(__doc__)
    p.add_argument("--device", default="cpu")
    p.add_argument("--episodes", type=int, nargs="+", default=[64, 256], help="episodes at once (all members)")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="0: as many as an evaluation starts")
    p.add_argument("--members", type=int, default=3)
    p.add_argument("--steps", type=int, default=200, help="steps of every episode")
    p.add_argument(
        "--forward",
        nargs="+",
        choices=["captured", "eager"],
        default=["captured"],
        help="on CUDA, the policy's forward pass replayed as a CUDA graph (as evaluations run it), eager, or both",
    )
    p.add_argument(
        "--pipeline",
        nargs="+",
        choices=["pipelined", "in-turn"],
        default=["pipelined", "in-turn"],
        help="the episodes in two halves, one stepping while the other acts (evaluations do it with workers), or all "
        "acting and then all stepping",
    )
    common.add_json_options(p, "the measurements and their fit")
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    if args.quick:
        args.episodes, args.workers, args.steps = [12], [1], 40
    if args.from_json:
        doc = json.loads(args.from_json.read_text())
    else:
        records = measure(args)
        doc = {"records": records, **fits(records, args.device), "device": args.device, "info": common.run_info()}
        if args.json:
            args.json.write_text(json.dumps(doc, indent=1))
    section(doc, args.quick)


def started(fitted: dict) -> str:
    """A fit's start-up, as the section words it ("" where its records did not time it apart)."""
    return f", after a start-up of {fitted['start_s']:.2f} s" if fitted.get("start_s") else ""


def section(doc: dict, quick: bool) -> None:
    """The measurements as the section of docs/benchmarks.md for their device (their GPU's name on CUDA)."""
    rows = []
    for r in doc["records"]:
        per = lambda s, r=r: f"{1e6 * s / (r['episodes'] * r['steps']):.1f}"
        first = r.get("first_forward_s", 0.0)
        stepped = r["total_s"] - r.get("start_s", 0.0) - first  # the rollout but its start-up and first steps
        rest = stepped - (r["forward_s"] - first) - r["stepping_s"]
        capture = f"{r['capture_s']:.2f}" if r.get("forward") == "captured" and "capture_s" in r else "–"
        start = f"{r['start_s']:.2f}" if "start_s" in r else "–"
        rows.append(
            [r["episodes"], r["workers"], r.get("forward", "eager"), "pipelined" if r.get("pipeline") else "in turn"]
            + [per(stepped), start, f"{first:.2f}" if "first_forward_s" in r else "–", per(r["forward_s"] - first)]
            + [capture]
            + [per(r["stepping_s"]), per(rest)]
            + [per(r["alone_s"]), per(r["pipes_s"]) if "pipes_s" in r else "–"]
            + [f"{r['stepping_s'] / r['alone_s']:.2f}", f"{rest / stepped:.0%}"]
        )
    header = [
        "episodes",
        "workers",
        "forward pass",
        "acting and stepping",
        "rollout µs per env-step",
        "start-up: s per rollout",
        "forward's first steps: s per rollout",
        "forward",
        "of it capturing: s per rollout",
        "stepping",
        "the rest (acting, loop, transfers)",
        "envs alone",
        "of it the workers' round trip",
        "stepping ÷ alone",
        "the rest's share",
    ]
    r0, fitted, in_turn = doc["records"][0], doc["evaluation"], doc.get("evaluation_in_turn")
    how = "pipelined" if fitted.get("pipelined") else "acting and stepping in turn"
    body = "\n".join(
        [
            f"`--device {doc['device']}`, {r0['members']} members of an untrained Primal.+DT at the paper's size, "
            f"Hopper-v5 episodes of {r0['steps']} steps (never terminated early); every time per environment step "
            "(total over episodes × steps) but the start-up's (starting the worker processes, making and resetting the "
            "environments, closing them) and the forward pass's first steps' (its calls while the context fills, up to "
            "its first full one, less as many later calls and its capture): once per rollout, timed apart where their "
            "columns show them.",
            "",
            common.md_table(header, rows),
            "",
            "Stepping: sending the actions to the environments and waiting for their step. The workers' round trip: "
            "as many steps of the environments alone that step none of them (the pipes, pickling, the workers' loop)."
            + (
                " Pipelined, the episodes run in two halves, each with that many workers, and one half's environments "
                "step while the other half's actions are computed, so part of the stepping and the rest overlap."
                if any(r.get("pipeline") for r in doc["records"])
                else ""
            ),
            "",
            f"Fitted, with the workers an evaluation starts, {how}, and the {r0.get('forward', 'eager')} forward "
            "pass: each step of an evaluation of N episodes takes "
            f"{1e3 * fitted['step_s']:.2f} ms + N × {1e6 * fitted['env_step_s']:.1f} µs{started(fitted)}"
            + (
                f"; acting and stepping in turn (as beside training), {1e3 * in_turn['step_s']:.2f} ms + "
                f"N × {1e6 * in_turn['env_step_s']:.1f} µs{started(in_turn)}."
                if in_turn
                else "."
            ),
            *(["", doc["note"]] if doc.get("note") else []),
        ]
    )
    common.write_measured_section("eval_overhead", "Evaluation: where a step's time goes", body, quick, doc)


if __name__ == "__main__":
    main()
