"""Stepping the evaluation environments: dt-primal's ``envs.Episodes`` (in-process, or one worker process
per core) against Gymnasium's AsyncVectorEnv and envpool, and whether envpool's ``-v5`` tasks are
Gymnasium's ``-v5`` tasks.

  python bench/env_stepping.py                          # without envpool: the Gymnasium-based rows only
  ~/.venvs/envpool/bin/python bench/env_stepping.py    # the full comparison, envpool included
  python bench/env_stepping.py --quick                  # smoke check, < 1 min

envpool is not a dependency of dt-primal. For this benchmark, install it into a separate virtual
environment that sees the system packages:

  python -m venv --system-site-packages ~/.venvs/envpool
  ~/.venvs/envpool/bin/pip install envpool==1.2.5

Equivalence (needs envpool). For Hopper-v5, HalfCheetah-v5 and Walker2d-v5, one Gymnasium env and one
envpool env start from the same state (``reset_noise_scale=0`` on both sides: the model's initial
pose at rest) and get the same actions (zeros, and uniform in the action bounds from fixed numpy
seeds). Compared step by step over a whole episode (at most 1000 steps): observations, rewards,
terminated/truncated flags, episode lengths. Three views:

* open loop: each side runs on its own. Differences of one rounding error grow exponentially in the
  chaotic runs (HalfCheetah under random actions), so the same is measured for Gymnasium against
  itself from a start nudged by 1e-12, and against itself with MuJoCo's constraint solver stopped at
  a tighter tolerance (1e-10 instead of the models' 1e-8), as references for that growth;
* one step from the same state: before every step the Gymnasium env is set to the envpool env's
  state (its observation with the x position from ``info``; envpool's observation clipping of the
  velocities is widened for this, and the comparison clips them as Gymnasium does), so every step
  of the episode is compared from one shared state, without the chaotic growth;
* reset noise: 1000 starts of each side with the default noise, their offsets from the noiseless
  start compared by a two-sample Kolmogorov-Smirnov test (positions and velocities apart), since the
  two random generators cannot be made to draw the same numbers.

"The same" means |a - b| <= 1e-6 * max(1, |a|) for observations and rewards, and equal flags.

Timing. N environments of Hopper-v5 with ``terminate_when_unhealthy=False`` (every environment runs
all S steps; envpool has the same option) and uniform random actions, stepped S steps; env-steps/s
of the stepping alone (actions drawn beforehand, reset before each repeat and not timed), median of
``--repeats`` rounds in which every stepper runs once in turn (so that all see the same load from
other jobs); the time to create the environments and reset them once is given apart.
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import statistics
import sys
import time
from pathlib import Path

import common  # sets OMP_WAIT_POLICY before torch loads
import gymnasium as gym
import numpy as np

from envs import TASKS, Episodes

try:
    import envpool

    ENVPOOL_ERROR = None
except Exception as exc:  # noqa: BLE001 -- any import failure means the envpool rows are left out
    envpool, ENVPOOL_ERROR = None, f"{type(exc).__name__}: {exc}"

INSTALL = "python -m venv --system-site-packages ~/.venvs/envpool && ~/.venvs/envpool/bin/pip install envpool==1.2.5"
RTOL = 1e-6
NUDGE = 1e-12
TIGHT = 1e-10  # a tighter tolerance for MuJoCo's constraint solver than the models' 1e-8
GYM_IDS = ("Hopper-v5", "HalfCheetah-v5", "Walker2d-v5")
CAN_FALL = ("Hopper-v5", "Walker2d-v5")  # the tasks with terminate_when_unhealthy


# --------------------------------------------------------------------------- equivalence


def gym_env(gym_id: str, tolerance: float | None = None, **kwargs) -> gym.Env:
    """A Gymnasium env with the noiseless start; ``tolerance``: its MuJoCo solver's (default: the model's, 1e-8)."""
    env = gym.make(gym_id, reset_noise_scale=0.0, **kwargs)
    if tolerance is not None:
        env.unwrapped.model.opt.tolerance = tolerance
    return env


def envpool_env(gym_id: str, num_envs: int = 1, **kwargs):
    return envpool.make_gymnasium(gym_id, num_envs=num_envs, batch_size=num_envs, **kwargs)


def run_gym(gym_id: str, actions: np.ndarray, nudge: float = 0.0, tolerance: float | None = None, **kwargs) -> dict:
    """One Gymnasium episode from the noiseless start (its first observed coordinate moved by ``nudge``)."""
    env = gym_env(gym_id, tolerance, **kwargs)
    env.reset(seed=0)
    if nudge:
        u = env.unwrapped
        qpos = u.data.qpos.copy()
        qpos[1] += nudge
        u.set_state(qpos, u.data.qvel.copy())
    out = {"obs": [], "reward": [], "term": [], "trunc": []}
    for a in actions:
        obs, reward, term, trunc, _ = env.step(a)
        for k, v in zip(out, (obs, reward, term, trunc)):
            out[k].append(v)
        if term or trunc:
            break
    env.close()
    return {k: np.array(v) for k, v in out.items()}


def run_envpool(gym_id: str, actions: np.ndarray, **kwargs) -> dict:
    env = envpool_env(gym_id, reset_noise_scale=0.0, **kwargs)
    env.reset()
    out = {"obs": [], "reward": [], "term": [], "trunc": []}
    for a in actions:
        obs, reward, term, trunc, _ = env.step(a[None].astype(np.float64))
        for k, v in zip(out, (obs[0], reward[0], term[0], trunc[0])):
            out[k].append(v)
        if term[0] or trunc[0]:
            break
    env.close()
    return {k: np.array(v) for k, v in out.items()}


def within(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per step: do ``a`` and ``b`` agree to RTOL (relative, absolute below 1)?"""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    ok = np.abs(a - b) <= RTOL * np.maximum(1.0, np.abs(a))
    return ok.reshape(len(ok), -1).all(axis=1)


def compare(a: dict, b: dict) -> dict:
    """Open-loop comparison of two episodes: max differences over their common steps, how many
    steps agree from the start, the first step whose flags differ."""
    n = min(len(a["reward"]), len(b["reward"]))
    ok = within(a["obs"][:n], b["obs"][:n]) & within(a["reward"][:n], b["reward"][:n])
    flags = (a["term"][:n] != b["term"][:n]) | (a["trunc"][:n] != b["trunc"][:n])
    if len(a["reward"]) != len(b["reward"]) and not flags.any():
        flags = np.append(flags, True)  # one ended at step n, the other did not
    return {
        "lengths": (len(a["reward"]), len(b["reward"])),
        "obs": float(np.abs(a["obs"][:n] - b["obs"][:n]).max()),
        "reward": float(np.abs(a["reward"][:n] - b["reward"][:n]).max()),
        "agree": int(n if ok.all() else np.argmin(ok)),
        "flags": int(np.argmax(flags)) + 1 if flags.any() else None,
    }


def same_state_steps(gym_id: str, actions: np.ndarray, tolerance: float | None = None, **kwargs) -> dict:
    """Every step of an envpool episode redone by Gymnasium from envpool's state: the largest
    differences of the step's observation and reward, the steps outside RTOL, the steps not equal
    to 1e-9, and the steps whose flags differ."""
    clip = gym_id in CAN_FALL  # Hopper and Walker2d observe their velocities clipped to [-10, 10]
    wide = {"velocity_min": -1e9, "velocity_max": 1e9} if clip else {}
    env = gym_env(gym_id, tolerance, **kwargs)
    env.reset(seed=0)
    u = env.unwrapped
    nq = u.model.nq
    pool = envpool_env(gym_id, reset_noise_scale=0.0, **wide, **kwargs)
    obs, info = pool.reset()
    worst_obs = worst_reward = 0.0
    flag_steps, bad, inexact = 0, 0, 0
    for t, a in enumerate(actions):  # noqa: B007 (t: the steps taken, after the loop)
        u.set_state(np.concatenate([info["x_position"][:1], obs[0, : nq - 1]]), obs[0, nq - 1 :])
        g_obs, g_reward, g_term, g_trunc, _ = env.step(a)
        obs, reward, term, trunc, info = pool.step(a[None].astype(np.float64))
        seen = obs[0].copy()
        if clip:
            seen[nq - 1 :] = np.clip(seen[nq - 1 :], -10.0, 10.0)
        worst_obs = max(worst_obs, float(np.abs(g_obs - seen).max()))
        worst_reward = max(worst_reward, abs(g_reward - float(reward[0])))
        bad += not (within(g_obs[None], seen[None])[0] and within([g_reward], [reward[0]])[0])
        inexact += float(np.abs(g_obs - seen).max()) > 1e-9
        flag_steps += (g_term != term[0]) or (g_trunc != trunc[0])
        if term[0] or trunc[0]:
            break
    env.close()
    pool.close()
    return {
        "steps": t + 1,
        "obs": worst_obs,
        "reward": worst_reward,
        "bad": bad,
        "inexact": inexact,
        "flags": flag_steps,
    }


def ks_statistic(x: np.ndarray, y: np.ndarray) -> float:
    """Two-sample Kolmogorov-Smirnov statistic: the largest gap between the empirical CDFs."""
    grid = np.sort(np.concatenate([x, y]))
    cdf = lambda s: np.searchsorted(np.sort(s), grid, side="right") / len(s)  # noqa: E731
    return float(np.abs(cdf(x) - cdf(y)).max())


def reset_noise(gym_id: str, starts: int) -> dict:
    """Offsets of ``starts`` default-noise starts from the noiseless one, positions and velocities
    apart, on both sides; KS statistics against the 1% critical value."""
    env = gym.make(gym_id)
    nq = env.unwrapped.model.nq
    base = gym_env(gym_id).reset(seed=0)[0]
    g = np.stack([env.reset(seed=s)[0] for s in range(starts)]) - base
    env.close()
    pool = envpool_env(gym_id, num_envs=starts, seed=0)
    e = pool.reset()[0] - base
    pool.close()
    out = {}
    for part, cols in (("positions", slice(0, nq - 1)), ("velocities", slice(nq - 1, None))):
        x, y = g[:, cols].ravel(), e[:, cols].ravel()
        critical = 1.628 * np.sqrt((len(x) + len(y)) / (len(x) * len(y)))  # two-sample KS, alpha = 0.01
        out[part] = {
            "gym_std": float(x.std()),
            "pool_std": float(y.std()),
            "gym_max": float(np.abs(x).max()),
            "pool_max": float(np.abs(y).max()),
            "ks": ks_statistic(x, y),
            "critical": float(critical),
        }
    return out


def model_files_match(gym_id: str) -> str:
    """Are the two sides' MuJoCo model files the same (XML comments and blank lines aside)? envpool's
    library loads ``<name>_envpool.xml`` from its asset package."""

    def lines(path: Path) -> list[str]:
        text = re.sub(r"<!--.*?-->", "", path.read_text(), flags=re.S)
        return [line.strip() for line in text.splitlines() if line.strip()]

    env = gym.make(gym_id)
    ours = Path(env.unwrapped.fullpath)
    env.close()
    cfg = envpool.make_spec(gym_id).config
    theirs = Path(cfg.base_path) / "mujoco" / "assets_gym" / cfg.xml_file.replace(".xml", "_envpool.xml")
    if not theirs.exists():
        return f"envpool's {theirs.name} not found"
    return "identical" if lines(ours) == lines(theirs) else f"**differ** ({ours.name} / {theirs.name})"


def policies(gym_id: str, quick: bool) -> list[tuple[str, np.ndarray, dict]]:
    """(label, actions, make kwargs) of the compared episodes."""
    steps = 200 if quick else 1000
    space = gym.make(gym_id).action_space

    def uniform(seed: int) -> np.ndarray:
        return np.random.default_rng(seed).uniform(space.low, space.high, (steps, *space.shape)).astype(space.dtype)

    runs = [("zeros", np.zeros((steps, *space.shape), space.dtype), {})]
    runs += [(f"uniform, seed {s}", uniform(s), {}) for s in ((0,) if quick else (0, 1, 2))]
    if gym_id in CAN_FALL:
        runs.append(
            ("uniform, seed 0, terminate_when_unhealthy=False", uniform(0), {"terminate_when_unhealthy": False})
        )
    return runs


def equivalence(quick: bool) -> tuple[list[list], list[list], dict, dict]:
    """Rows of the episode table and of the reset-noise table, per task (verdict, model files), and
    totals over all episodes of the same-state check."""
    rows, noise_rows, verdicts = [], [], {}
    totals = {"steps": 0, "inexact": 0, "obs": 0.0, "obs_tight": 0.0, "chaotic": 0}
    for gym_id in GYM_IDS:
        model = model_files_match(gym_id)
        task_ok = model == "identical"
        for label, actions, kwargs in policies(gym_id, quick):
            g, e = run_gym(gym_id, actions, **kwargs), run_envpool(gym_id, actions, **kwargs)
            open_loop = compare(g, e)
            nudged = compare(g, run_gym(gym_id, actions, nudge=NUDGE, **kwargs))
            tight = compare(g, run_gym(gym_id, actions, tolerance=TIGHT, **kwargs))
            step = same_state_steps(gym_id, actions, **kwargs)
            step_tight = same_state_steps(gym_id, actions, tolerance=TIGHT, **kwargs)
            totals["steps"] += step["steps"]
            totals["inexact"] += step["inexact"]
            totals["obs"] = max(totals["obs"], step["obs"])
            totals["obs_tight"] = max(totals["obs_tight"], step_tight["obs"])
            totals["chaotic"] += open_loop["agree"] < min(open_loop["lengths"])
            # Same task: every step from a shared state agrees (observation, reward, flags), and the
            # open-loop runs agree for as long as Gymnasium agrees with itself from a start 1e-12 away
            # or with its solver run to a tighter tolerance (what rounding and the solver's stopping
            # point alone do to these trajectories).
            ok = (
                step["bad"] == 0
                and step["flags"] == 0
                and open_loop["agree"] >= min(nudged["agree"], tight["agree"], *open_loop["lengths"])
            )
            task_ok &= ok
            n = min(open_loop["lengths"])
            rows.append(
                [
                    gym_id,
                    label,
                    "{} / {}".format(*open_loop["lengths"]),
                    open_loop["flags"] or "never",
                    f"{open_loop['obs']:.1e}",
                    f"{open_loop['reward']:.1e}",
                    f"{open_loop['agree']} of {n}",
                    nudged["agree"],
                    tight["agree"],
                    f"{step['obs']:.1e}",
                    f"{step['reward']:.1e}",
                    f"{step['inexact']} / {step['bad']} / {step['flags']} of {step['steps']}",
                    f"{step_tight['obs']:.1e}",
                    "same" if ok else "**differ**",
                ]
            )
            print(" | ".join(str(c) for c in rows[-1]), flush=True)
        noise = reset_noise(gym_id, 200 if quick else 1000)
        for part, r in noise.items():
            ok = r["ks"] <= r["critical"]
            task_ok &= ok
            noise_rows.append(
                [
                    gym_id,
                    part,
                    f"{r['gym_std']:.2e} / {r['pool_std']:.2e}",
                    f"{r['gym_max']:.2e} / {r['pool_max']:.2e}",
                    f"{r['ks']:.4f} ({r['critical']:.4f})",
                    "same" if ok else "**differ**",
                ]
            )
        verdicts[gym_id] = (task_ok, model)
    return rows, noise_rows, verdicts, totals


# -------------------------------------------------------------------------------- timing


def timed_steps(step, steps: int):
    """Wall and CPU seconds (this process, all threads) of ``steps`` calls ``step(t)``; each returns the
    terminated and truncated flags, and no environment may end (all run every step)."""
    t0, c0 = time.perf_counter(), time.process_time()
    for t in range(steps):
        term, trunc = step(t)
        assert not (term | trunc).any(), "an environment ended: the timing assumes all run every step"
    return time.perf_counter() - t0, time.process_time() - c0


def episodes_stepper(task, n: int, workers: int, actions: np.ndarray):
    """(seconds to create and reset, run(steps), close) for ``Episodes(task, n, workers)``."""
    t0 = time.perf_counter()
    env = Episodes(task, n, workers)
    seeds, alive = list(range(n)), np.ones(n, bool)
    env.reset(seeds)
    start = time.perf_counter() - t0

    def run(steps):
        env.reset(seeds)
        return timed_steps(lambda t: env.step(actions[t], alive)[2:], steps)

    return start, run, env.close


def async_stepper(task, n: int, actions: np.ndarray):
    t0 = time.perf_counter()
    env = gym.vector.AsyncVectorEnv(
        [lambda: task.make() for _ in range(n)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )
    env.reset(seed=0)
    start = time.perf_counter() - t0

    def run(steps):
        env.reset(seed=0)
        return timed_steps(lambda t: env.step(actions[t])[2:4], steps)

    return start, run, env.close


def envpool_stepper(n: int, threads: int, actions: np.ndarray):
    t0 = time.perf_counter()
    env = envpool.make_gymnasium(
        "Hopper-v5", num_envs=n, batch_size=n, num_threads=threads, seed=0, terminate_when_unhealthy=False
    )
    env.reset()
    start = time.perf_counter() - t0
    actions = actions.astype(np.float64)

    def run(steps):
        env.reset()
        return timed_steps(lambda t: env.step(actions[t])[2:4], steps)  # all envs at once: a synchronous step

    return start, run, env.close


def timing(args) -> list[list]:
    """For each N: every stepper created (the forking ones first, before any envpool thread exists),
    one untimed warm-up run each, then ``repeats`` rounds that run each stepper once in turn, so that
    all of them see the same load from other jobs."""
    cores = os.cpu_count() or 1
    task = common.task_with(TASKS["hopper"], terminate_when_unhealthy=False)
    probe = task.make()
    space = probe.action_space
    probe.close()
    rows = []
    # Largest N first: AsyncVectorEnv's hundreds of runnable processes (small N only) would raise the load
    # average read before the next N.
    for n in sorted(args.envs, reverse=True):
        actions = (
            np.random.default_rng(0).uniform(space.low, space.high, (args.steps, n, *space.shape)).astype(space.dtype)
        )
        load = common.load_avg()
        makers = [
            (
                "`Episodes`, workers=1 (in-process; the CPU default)",
                True,
                lambda n=n, actions=actions: episodes_stepper(task, n, 1, actions),
            ),
            (
                f"`Episodes`, workers={cores} (one process per core)",
                False,
                lambda n=n, actions=actions: episodes_stepper(task, n, cores, actions),
            ),
        ]
        if n <= args.async_max:
            makers.append(
                (
                    "`gym.vector.AsyncVectorEnv` (one process per env)",
                    False,
                    lambda n=n, actions=actions: async_stepper(task, n, actions),
                )
            )
        if envpool is not None:
            makers += [
                (
                    f"envpool, num_threads={cores}",
                    True,
                    lambda n=n, actions=actions: envpool_stepper(n, cores, actions),
                ),
                ("envpool, num_threads=1", True, lambda n=n, actions=actions: envpool_stepper(n, 1, actions)),
            ]
        steppers = [(label, own, *make()) for label, own, make in makers]
        starts = [(label, own, start) for label, own, start, _, _ in steppers]
        try:
            for *_, run, _ in steppers:
                run(min(args.steps, 20))  # warm-up
            runs = {label: [] for label, *_ in steppers}
            for _ in range(args.repeats):
                for label, _, _, run, _ in steppers:
                    runs[label].append(run(args.steps))
        finally:
            for *_, close in steppers:
                close()
            del steppers, makers
            gc.collect()  # deleted envpools end their threads, before the next N's workers fork
        base = None
        for label, own, start in starts:
            walls = [w for w, _ in runs[label]]
            rate = n * args.steps / statistics.median(walls)
            base = base or rate  # the in-process Episodes row comes first
            # CPU time of this process (all its threads): the whole work only where no other process steps
            cpu = f"{statistics.median(c for _, c in runs[label]) / (n * args.steps) * 1e6:.0f} µs" if own else "–"
            rows.append(
                [
                    label,
                    n,
                    f"{start:.2f} s",
                    f"{statistics.median(walls):.2f} s ({', '.join(f'{w:.2f}' for w in walls)})",
                    f"**{rate:,.0f}**",
                    f"{rate / base:.2f}×",
                    cpu,
                    f"{load:.2f}",
                ]
            )
            print(" | ".join(str(c) for c in rows[-1]), flush=True)
    return rows


# -------------------------------------------------------------------------------- report


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    p.add_argument(
        "--envs", type=int, nargs="+", default=[200, 600], help="numbers of environments timed (default 200 600)"
    )
    p.add_argument("--steps", type=int, default=200, help="steps timed per repeat (default 200)")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats per row, median reported (default 5)")
    p.add_argument(
        "--async-max", type=int, default=200, help="time AsyncVectorEnv only up to this many envs (default 200)"
    )
    p.add_argument("--skip-equivalence", action="store_true", help="timing only")
    p.add_argument("--quick", action="store_true", help="smoke check: 20 envs, 20 steps, 1 repeat, 200-step episodes")
    args = p.parse_args()
    if args.quick:
        args.envs, args.steps, args.repeats, args.async_max = [20], 20, 1, 20
    time_rows = timing(args)
    eq = None if envpool is None or args.skip_equivalence else equivalence(args.quick)
    write(args, time_rows, eq)


def write(args, time_rows: list[list], eq) -> None:
    import mujoco

    info = common.run_info()
    if sys.prefix != sys.base_prefix:  # name the interpreter of a virtual environment (e.g. the envpool one)
        info["command"] = info["command"].replace("python ", f"{Path(sys.prefix) / 'bin' / 'python'} ", 1)
    cores = info["cores"]
    versions = (
        f"envpool {envpool.__version__} (its MuJoCo is compiled into the wheel's library; Gymnasium steps "
        f"the `mujoco` package, {mujoco.__version__})"
        if envpool is not None
        else f"envpool not installed (`import envpool`: {ENVPOOL_ERROR}); mujoco {mujoco.__version__}"
    )
    parts = [
        f"{versions}. **This machine has {cores} CPU cores**: every parallel row below shares those "
        f"{cores} cores, so it shows what workers, processes or threads buy on {cores} cores, not on a "
        f"larger machine."
    ]
    if envpool is None:
        parts += [
            "",
            f"**envpool is not installed**, so its rows and the equivalence check are left out. To run "
            f"them, install it apart from dt-primal's environment: `{INSTALL}`, then "
            f"`~/.venvs/envpool/bin/python bench/env_stepping.py`.",
        ]
    if eq is not None:
        rows, noise_rows, verdicts, totals = eq
        steps = 200 if args.quick else 1000
        parts += [
            "",
            "### Are envpool's -v5 tasks Gymnasium's -v5 tasks?",
            "",
            f"Same start (`reset_noise_scale=0` on both sides), same actions, episodes of at most {steps} steps. "
            f"**Open loop**: each side runs on its own; max |Δ| over the steps both ran, the number of steps "
            f"from the start on which observations and rewards agree to {RTOL:g} (relative, absolute below 1), "
            f"the first step whose terminated/truncated flags differ. For scale, the steps on which Gymnasium "
            f"agrees with itself (same measure) **from a start nudged {NUDGE:g}**, and **with MuJoCo's "
            f"constraint solver stopped at tolerance {TIGHT:g}** instead of the models' 1e-8: what rounding "
            f"errors and the solver's stopping point alone grow to in these trajectories. "
            f"**From the same state**: before each step the Gymnasium env is set to the envpool env's state, "
            f"so every step of the episode is compared from one shared state: max |Δobs|, max |Δreward|, "
            f"steps whose observation differs by more than 1e-9 / steps outside {RTOL:g} / steps whose flags "
            f"differ; and max |Δobs| once more with Gymnasium's solver at tolerance {TIGHT:g}. envpool returns "
            f'its rewards as float32 (about 1e-7 of a reward of 1-4). Verdict "same": every step from a '
            f"shared state within {RTOL:g} with the same flags, and the open-loop runs agreeing at least as "
            f"long as one of the two Gymnasium references.",
            "",
            common.md_table(
                [
                    "task",
                    "actions",
                    "length Gymnasium / envpool",
                    "flags first differ",
                    "open loop: max abs Δobs",
                    "max abs Δreward",
                    "steps agreeing",
                    f"Gymnasium vs itself nudged {NUDGE:g}: steps agreeing",
                    f"Gymnasium vs itself, solver tolerance {TIGHT:g}: steps agreeing",
                    "same state: max abs Δobs",
                    "max abs Δreward",
                    "steps > 1e-9 / off / flags off",
                    f"same state, Gymnasium at tolerance {TIGHT:g}: max abs Δobs",
                    "verdict",
                ],
                rows,
            ),
            "",
            "Reset noise with the default `reset_noise_scale` (the generators differ, so the distributions are "
            "compared): offsets of each side's first observations from the noiseless start over "
            f"{200 if args.quick else 1000} starts; KS: two-sample Kolmogorov-Smirnov statistic (critical value at "
            f"1%).",
            "",
            common.md_table(
                [
                    "task",
                    "part",
                    "std Gymnasium / envpool",
                    "max abs Gymnasium / envpool",
                    "KS (1% critical)",
                    "verdict",
                ],
                noise_rows,
            ),
            "",
            "MuJoCo model files (XML, comments aside): "
            + "; ".join(f"{k} {m}" for k, (_, m) in verdicts.items())
            + ".",
            "",
            "**"
            + ("envpool runs the same tasks" if all(ok for ok, _ in verdicts.values()) else "envpool's tasks differ")
            + "**: "
            + "; ".join(f"{k} {'the same' if ok else 'different'}" for k, (ok, _) in verdicts.items())
            + ".",
        ]
        if all(ok for ok, _ in verdicts.values()):
            solver = (
                f"on those steps MuJoCo's constraint solver stops at a slightly different point on the two "
                f"sides (envpool steps its own compiled-in MuJoCo, Gymnasium the `mujoco` package): with "
                f"Gymnasium's solver at tolerance {TIGHT:g} the largest difference is {totals['obs_tight']:.1e}"
                if totals["obs_tight"] <= 1e-9
                else f"with Gymnasium's solver at tolerance {TIGHT:g} the largest is still {totals['obs_tight']:.1e}"
            )
            parts += [
                "",
                f"What does differ. (1) Of the {totals['steps']:,} steps redone from a shared state, "
                f"{totals['inexact']:,} differ by more than 1e-9, by at most {totals['obs']:.1e}; {solver}. "
                f"(2) In {totals['chaotic']} of the "
                f"open-loop episodes such differences (or rounding) grow until the trajectories part, no sooner than "
                f"Gymnasium's own do when only their start moves by 1e-12 or their solver's tolerance changes: a "
                f"long episode is the same task but not the same trajectory to the last digit. (3) Rewards come back "
                f"as float32. (4) The reset noise has the same distribution, but envpool draws it with its own "
                f"generator: Gymnasium's `reset(seed=s)` and envpool's `seed` give different starts, so the same "
                f"evaluation seeds would give other episodes than `envs.Episodes` does.",
            ]
    parts += [
        "",
        "### Env-steps per second",
        "",
        f"Hopper-v5 with `terminate_when_unhealthy=False` (all environments run every step), uniform random "
        f"actions drawn beforehand, {args.steps} steps timed per repeat (median of {args.repeats}, all repeats "
        f"in brackets) after an untimed reset; start: creating the environments and their first reset. "
        f"`Episodes(task, N, workers)` is what `dt_primal.evaluation.rollout` steps; AsyncVectorEnv starts one "
        f"process per environment (timed up to {args.async_max}); envpool with `batch_size=num_envs` "
        f"(a synchronous step of all environments). For each N all steppers are created first, then each "
        f"runs once in turn per round, so that all see the same load from other jobs. "
        f"CPU per env-step: CPU time of the process (all its "
        f"threads) per env-step, for the steppers that step in this process only; other jobs on the machine "
        f"disturb it much less than the wall time. Load: 1-min load average before the N's steppers were created.",
        "",
        common.md_table(
            [
                "stepper",
                "N envs",
                "start",
                f"{args.steps} steps",
                "env-steps/s",
                "× in-process Episodes",
                "CPU per env-step",
                "load",
            ],
            time_rows,
        ),
    ]
    common.write_section(
        "env_stepping",
        "Environment stepping: Episodes, AsyncVectorEnv, envpool",
        "\n".join(parts),
        args.quick,
        info=info,
    )


if __name__ == "__main__":
    main()
