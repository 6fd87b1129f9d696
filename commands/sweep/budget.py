"""A sweep's time budget (``--time-budget``): which groups to start so that they finish, final evaluation
included, before the budget ends.

The training step's throughput (member-updates/s by number of members, and the seconds of its warm-up:
capture, compilation) is measured on this device in the sweep's first seconds, or read from a file of
such measurements (``bench/ensemble_speed.py --json``). Groups run all at once, each in its own
process; processes share a GPU (or the cores) by turns, so their times add up:

    start-up + slowest warm-up + Σ_groups work,  work = member-updates / rate(its members) + evaluation

where rate() interpolates the measured member-updates/s between member counts (flat beyond them) and an
evaluation's time is its start-up ``eval_start_s`` (its worker processes and environments), plus, at most, the episode
limit's steps × ``eval_step_s`` (what a step of the batched rollout costs whatever its width: the forward pass's
launches, the workers' round trip) plus its episodes' environment steps (members × targets × episodes × the episode
limit) over ``eval_steps_per_s``. An intermediate
evaluation beside training on a GPU (``--eval-overlap``, the default) counts, of its time (the overlap slowdown × what
it would take alone, acting and stepping in turn as it runs there), what training waits for it at the next one (the
part longer than the updates between them) and the updates training loses while it runs beside them
(the overlap training loss of the part they overlap; both in ``MEASURED``). A group
whose datasets another process is still building starts once they are built (``--building``,
``--build-wait``): the others have the device meanwhile, so Σ_groups work becomes the longest of
w + Σ_{groups waiting w or longer} work over the waits w (0 included).
(dataset, model) pairs are taken in priority order (both models of a dataset, then the next dataset), and again
gathered by group (a group's pairs one after another), keeping the order whose groups hold more runs; a pair
with which the groups would not fit is left out, with the estimate that ruled it out, and later (smaller)
ones are still tried; of two choices with as many runs, the one estimated to end sooner is kept.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dt_primal.errors import UserError

START_S = 30.0  # a group's process start, imports, dataset load and model build
MEASURED = Path(__file__).resolve().parents[2] / "results" / "sweep-budget.json"  # figures it has not measured itself
UNITS = {"": 1, "s": 1, "m": 60, "min": 60, "h": 3600}


@functools.cache
def measured(name: str) -> float:
    """The figure ``name`` of ``MEASURED`` (its source is written beside it there)."""
    try:
        return float(json.loads(MEASURED.read_text())[name]["value"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{MEASURED} lacks a readable {name!r} ({exc}): restore it from the repository.") from None


def parse_duration(text: str, option: str = "--time-budget", zero: bool = False) -> float:
    """Seconds of '90', '90s', '11m', '1.5h' (positive, or also 0 with ``zero``); a UserError otherwise."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*(s|m|min|h)?\s*", str(text))
    if not m or (float(m.group(1)) == 0 and not zero):
        kind = "a duration" if zero else "a positive duration"
        raise UserError(f"{option} must be {kind} such as 600, 90s, 11m or 1.5h (got {text!r}).")
    return float(m.group(1)) * UNITS[m.group(2) or ""]


@dataclass(frozen=True)
class Setting:
    """What the training step's speed depends on: the model, its size, how the step runs and its precision."""

    model: str
    d_model: int
    n_head: int
    mode: str  # eager | captured | compiled | compiled+captured
    precision: str

    def label(self) -> str:
        return f"{self.model} d_model {self.d_model}, {self.n_head} heads, {self.mode}, {self.precision}"


@dataclass
class Throughput:
    """Measured member-updates/s by member count, and warm-up seconds, per ``Setting``."""

    rates: dict[Setting, dict[int, float]] = field(default_factory=dict)
    warmups: dict[Setting, float] = field(default_factory=dict)
    eval_steps_per_s: float = field(default_factory=lambda: measured("eval_steps_per_s"))
    eval_step_s: float = 0.0  # seconds of every step of an evaluation, whatever its width
    eval_start_s: float = 0.0  # seconds of an evaluation's start-up: its worker processes and environments
    # the same three of an evaluation acting and stepping in turn (as beside training), where measured apart from the
    # pipelined one (evaluations with worker processes): (step_s, env steps/s, start_s); None: those above
    in_turn: tuple[float, float, float] | None = None

    def add(self, record: dict) -> None:
        """One measurement: a record of ``dt_primal.training.throughput.time_updates`` with its setting's fields."""
        s = Setting(record["model"], record["d_model"], record["n_head"], record["mode"], record["precision"])
        self.rates.setdefault(s, {})[int(record["members"])] = float(record["member_updates_per_s"])
        self.warmups[s] = max(self.warmups.get(s, 0.0), float(record["warmup_s"]))

    def find(self, s: Setting) -> Setting | None:
        """``s`` if measured, else the same setting of Primal.+DT (which the benchmark measures: DT's step,
        without the KSVD branch, is no slower), else None."""
        for key in (s, Setting("primal", s.d_model, s.n_head, s.mode, s.precision)):
            if key in self.rates:
                return key
        return None

    def rate(self, s: Setting, members: int) -> float:
        """member-updates/s of ``members`` members: linear between the measured counts, flat beyond them."""
        pts = sorted(self.rates[s].items())
        if members <= pts[0][0]:
            return pts[0][1]
        for (m0, r0), (m1, r1) in zip(pts, pts[1:]):
            if members <= m1:
                return r0 + (r1 - r0) * (members - m0) / (m1 - m0)
        return pts[-1][1]

    def records(self) -> list[dict]:
        return [
            dict(vars(s), members=m, member_updates_per_s=r, warmup_s=self.warmups[s])
            for s, pts in self.rates.items()
            for m, r in sorted(pts.items())
        ]

    def save(self, path: Path, about: dict) -> None:
        from dt_primal.files.writing import write_file

        fit = lambda step_s, steps_per_s, start_s: {"step_s": step_s, "env_step_s": 1 / steps_per_s, "start_s": start_s}
        evaluation = fit(self.eval_step_s, self.eval_steps_per_s, self.eval_start_s)
        doc = {"records": self.records(), "eval_steps_per_s": self.eval_steps_per_s, "evaluation": evaluation, **about}
        if self.in_turn:
            doc["evaluation_in_turn"] = fit(*self.in_turn)
        write_file(path, json.dumps(doc, indent=1), "The throughput file")


def load_throughput(path: Path) -> Throughput:
    """A file of measurements: ``{"records": [...], "eval_steps_per_s": ..., "evaluation": {"step_s": ...,
    "env_step_s": ..., "start_s": ...}}`` (this module's, ``bench/ensemble_speed.py --json``'s, with
    ``bench/eval_overhead.py --json``'s "evaluation", which wins over "eval_steps_per_s", and its
    "evaluation_in_turn", the same acting and stepping in turn); a UserError naming what is wrong with it."""
    from dt_primal.files.reading import read_json

    try:
        doc = read_json(path, "The throughput file", "Measure again (bench/ensemble_speed.py --json).")
        t = Throughput(eval_steps_per_s=float(doc.get("eval_steps_per_s", measured("eval_steps_per_s"))))
        if "evaluation" in doc:
            t.eval_step_s, t.eval_steps_per_s, t.eval_start_s = read_fit(doc["evaluation"])
        if "evaluation_in_turn" in doc:
            t.in_turn = read_fit(doc["evaluation_in_turn"])
        for r in doc["records"]:
            t.add(r)
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError, ZeroDivisionError) as exc:
        raise UserError(f"{path} is not a file of throughput measurements ({type(exc).__name__}: {exc}).") from None
    bad = [r for pts in t.rates.values() for r in pts.values() if not 0 < r < 1e9]
    fits = [(t.eval_step_s, t.eval_steps_per_s, t.eval_start_s), *([t.in_turn] if t.in_turn else [])]
    if bad or not all(0 < r < 1e9 for _, r, _ in fits) or not all(0 <= w < 1e5 for w in t.warmups.values()):
        raise UserError(f"{path}: rates and warm-ups must be positive, finite numbers.")
    if not all(0 <= s < 10 and 0 <= start < 600 for s, _, start in fits):
        raise UserError(
            f"{path}: an evaluation's seconds per step must be a number from 0 to 10, its start-up's from 0 to 600."
        )
    return t


def read_fit(fit: dict) -> tuple[float, float, float]:
    """``bench/eval_overhead.py --json``'s fit: (seconds per step, env steps/s, start-up seconds: 0 where not
    timed apart)."""
    return float(fit["step_s"]), 1 / float(fit["env_step_s"]), float(fit.get("start_s", 0.0))


@dataclass
class Group:
    """One ensemble to train: its datasets, model, the seeds left, its setting, steps and evaluation."""

    datasets: list[str]
    model: str
    seeds: list[int]
    setting: Setting
    steps: int
    eval_steps: int  # environment steps of all its evaluations at most
    cfg: object = None  # its first dataset's Config, to measure the setting with
    evaluations: int = 0  # its evaluations that training waits for (the final one, and those in line)
    limit: int = 0  # the episode limit: the most steps of an evaluation's batched rollout
    wait_s: float = 0.0  # seconds its datasets' builds may still take before it can start
    overlapped: int = 0  # its intermediate evaluations overlapping training (on a GPU)
    overlapped_steps: int = 0  # environment steps of one of them at most (members × targets × episodes × limit)
    overlapped_every: int = 0  # updates between two of them

    @property
    def members(self) -> int:
        return len(self.datasets) * len(self.seeds)


def estimate(groups: list[Group], tp: Throughput) -> float:
    """Seconds until the last of ``groups``, started at once, has finished (module docstring)."""
    if not groups:
        return 0.0
    work = [
        g.members * g.steps / tp.rate(tp.find(g.setting), g.members)
        + g.eval_steps / tp.eval_steps_per_s
        + g.evaluations * (g.limit * tp.eval_step_s + tp.eval_start_s)
        + g.overlapped * overlap_cost(g, tp)
        for g in groups
    ]
    warmup = max(tp.warmups[tp.find(g.setting)] for g in groups)
    waits = {0.0, *(g.wait_s for g in groups)}
    busy = max(w + sum(t for g, t in zip(groups, work) if g.wait_s >= w) for w in waits)
    return START_S + warmup + busy


def overlap_cost(g: Group, tp: Throughput) -> float:
    """Seconds one evaluation beside training costs training (acting and stepping in turn): what training waits
    for it at the next evaluation step, and the updates it loses while they run side by side."""
    step_s, steps_per_s, start_s = tp.in_turn or (tp.eval_step_s, tp.eval_steps_per_s, tp.eval_start_s)
    overlapped = measured("overlap_slowdown") * (start_s + g.overlapped_steps / steps_per_s + g.limit * step_s)
    between = g.overlapped_every * g.members / tp.rate(tp.find(g.setting), g.members)
    return max(0.0, overlapped - between) + measured("overlap_training_loss") * min(overlapped, between)


Pair = tuple[str, str]  # (dataset, model)


def choose(
    priority: list[Pair], plan: Callable[[list[Pair]], list[Group]], tp: Throughput, budget_s: float
) -> tuple[list[Group], list[tuple[Pair, str]]]:
    """The groups of (dataset, model) pairs of ``priority`` that fit ``budget_s`` together, and (pair, why) for
    each left out; ``plan(pairs)`` gives the groups that train them. Pairs are taken one by one in two orders,
    each kept where the groups still fit: ``priority``'s, and its pairs gathered by the group that trains them
    (``by_group``: one group filled before the next, as a larger group trains more member-updates a second);
    the order whose groups hold more runs wins, on a tie the one estimated to end sooner (more of the budget
    to spare), then ``priority``'s."""
    takes = [_take(order, plan, tp, budget_s) for order in (priority, by_group(priority, plan))]
    chosen, left = max(takes, key=lambda take: (sum(g.members for g in take[0]), -estimate(take[0], tp)))
    return chosen, sorted(left, key=lambda pl: priority.index(pl[0]))


def by_group(priority: list[Pair], plan: Callable[[list[Pair]], list[Group]]) -> list[Pair]:
    """``priority``'s pairs ordered by the group ``plan`` trains them in, the groups in the order of their first
    pair (a pair without one, all its runs recorded: last)."""
    groups = plan(priority)
    group = {
        p: next((i for i, g in enumerate(groups) if g.model == p[1] and p[0] in g.datasets), None) for p in priority
    }
    first = {i: min(priority.index(p) for p in priority if group[p] == i) for i in range(len(groups))}
    return sorted(priority, key=lambda p: (first.get(group[p], len(priority)), priority.index(p)))


def _take(
    order: list[Pair], plan: Callable[[list[Pair]], list[Group]], tp: Throughput, budget_s: float
) -> tuple[list[Group], list[tuple[Pair, str]]]:
    """The pairs of ``order`` taken one by one where the groups still fit ``budget_s`` (a later, smaller one is
    still tried after one that does not): their groups, and (pair, why) for each left out."""
    chosen: list[Pair] = []
    left: list[tuple[Pair, str]] = []
    for pair in order:
        groups = plan(chosen + [pair])
        unmeasured = [g.setting.label() for g in groups if tp.find(g.setting) is None]
        if unmeasured:
            left.append((pair, f"no throughput measured for {unmeasured[0]}"))
            continue
        need = estimate(groups, tp)
        if need <= budget_s:
            chosen.append(pair)
        else:
            left.append((pair, f"with it the groups would need about {need / 60:.1f} min of {budget_s / 60:.1f}"))
    return plan(chosen), left


MOST_MEMBERS = 18  # the largest ensemble measured


def measure(groups: list[Group], load: Callable[[str], object], device: str, updates: int = 10) -> Throughput:
    """Each setting of ``groups`` measured on its first group's first dataset (``load(dataset)``) at one
    member and at the members of all its groups (at most MOST_MEMBERS): five untimed updates (the capture,
    the compilation), then ``updates`` timed ones; and the evaluation's environment steps per second,
    from one episode per target of every member of that largest ensemble, fresh (their episodes are
    short: fewer environments at once than a trained model's, so a slower rate)."""
    import time

    from dt_primal.evaluation.policy import Policy
    from dt_primal.evaluation.rollout import rollout
    from dt_primal.training.throughput import fresh_step, time_updates

    tp, rates = Throughput(), []
    for s in dict.fromkeys(g.setting for g in groups):
        mine = [g for g in groups if g.setting == s]
        data, cfg = load(mine[0].datasets[0]), mine[0].cfg
        for m in sorted({1, min(MOST_MEMBERS, sum(g.members for g in mine))}):
            step = fresh_step(cfg, data, range(m), device, capture="captured" in s.mode)
            r = time_updates(step, 5, updates)
            tp.add(dict(vars(s), **r))
            print(
                f"measured {s.label()}, {m} members: {r['member_updates_per_s']:.0f} member-updates/s "
                f"(warm-up {r['warmup_s']:.1f} s)",
                flush=True,
            )
        policy = Policy(step.model, *data.state_stats(), cfg.reward_scale, cfg.context, s.precision)
        t0 = time.perf_counter()
        reports = rollout(policy, data.task, list(data.task.targets or [0.0]), 1)
        rates.append(sum(int(sum(r["lengths"])) for rs in reports for r in rs) / (time.perf_counter() - t0))
        print(f"measured the evaluation: {rates[-1]:.0f} environment steps/s", flush=True)
    tp.eval_steps_per_s = min(rates, default=measured("eval_steps_per_s"))
    return tp
