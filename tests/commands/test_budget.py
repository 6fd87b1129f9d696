"""The sweep's time budget: durations, the throughput it reads, its estimate and which groups it starts."""

import dataclasses
import json

import pytest
from conftest import SWEEP_RUN, hopper_file, run

from commands.sweep.budget import START_S, Group, Setting, Throughput, choose, estimate, load_throughput, parse_duration
from commands.sweep.grid import group_dir, run_dir
from dt_primal.errors import UserError

PRIMAL = Setting("primal", 256, 4, "captured", "bf16")


def throughput(eval_rate=1000.0) -> Throughput:
    t = Throughput(eval_steps_per_s=eval_rate)
    t.add(dict(vars(PRIMAL), members=1, member_updates_per_s=100.0, warmup_s=5.0))
    t.add(dict(vars(PRIMAL), members=9, member_updates_per_s=500.0, warmup_s=4.0))
    return t


@pytest.mark.parametrize("text, seconds", [("90", 90), ("90s", 90), ("11m", 660), ("1.5h", 5400), (" 2 min", 120)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["0", "-5m", "eleven", "5d", ""])
def test_a_duration_that_is_not_one_is_refused(text):
    with pytest.raises(UserError, match="--time-budget must be a positive duration"):
        parse_duration(text)


def test_the_rate_interpolates_between_measured_counts_and_is_flat_beyond_them():
    t = throughput()
    assert [t.rate(PRIMAL, m) for m in (1, 5, 9, 18)] == [100.0, 300.0, 500.0, 500.0]
    assert t.warmups[PRIMAL] == 5.0  # the longest warm-up measured
    dt = Setting("dt", 256, 4, "captured", "bf16")
    assert t.find(dt) == PRIMAL  # DT's step is timed by Primal.+DT's of the same size
    assert t.find(Setting("dt", 128, 1, "captured", "bf16")) is None


def test_the_estimate_adds_the_groups_training_and_evaluations():
    a = Group(["a"], "primal", [0, 1, 2], PRIMAL, steps=1000, eval_steps=6000)
    b = Group(["b", "c"], "dt", [0], Setting("dt", 256, 4, "captured", "bf16"), steps=500, eval_steps=2000)
    # a: 3 members at 200 member-updates/s; b: 2 members at 150; evaluations at 1000 steps/s
    assert estimate([a, b], throughput()) == pytest.approx(START_S + 5 + 3000 / 200 + 1000 / 150 + 8)
    assert estimate([], throughput()) == 0
    latency = throughput()
    latency.eval_step_s = 0.01  # and every step of the batched rollout costs 10 ms, whatever its width
    a.limit = b.limit = 100  # a's 3 evaluations and b's 1 of at most 100 rollout steps each
    a.evaluations, b.evaluations = 3, 1
    assert estimate([a, b], latency) == pytest.approx(estimate([a, b], throughput()) + 4)
    started = dataclasses.replace(latency, eval_start_s=2.0)  # each evaluation training waits for starts in 2 s
    assert estimate([a, b], started) == pytest.approx(estimate([a, b], latency) + 8)
    before = estimate([a, b], latency)  # a's work: 15 + 6 + 3 s, b's: 6.67 + 2 + 1 s
    a.wait_s = 100.0  # a's dataset is still being built: b has the device meanwhile, then a
    assert estimate([a, b], latency) == pytest.approx(before - (24 + 9 + 2 / 3) + 100 + 24)
    a.wait_s, b.wait_s = 0.0, 20.0  # b waits less than a takes: the device is never idle
    assert estimate([a, b], latency) == pytest.approx(before)


def test_an_evaluation_beside_training_counts_what_training_waits_for_it_and_loses_beside_it():
    """Per evaluation beside training: its time (the overlap slowdown × its time alone) less the time of the updates
    between two of them, and the overlap training loss of the time they overlap (both measured figures)."""
    from commands.sweep.budget import measured

    slowdown, loss = measured("overlap_slowdown"), measured("overlap_training_loss")

    a = Group(["a"], "primal", [0, 1, 2], PRIMAL, steps=1000, eval_steps=6000)
    alone = estimate([a], throughput())
    a.overlapped, a.overlapped_steps, a.limit, a.overlapped_every = 9, 3000, 100, 100  # 100 updates: 1.5 s
    slow = throughput()
    slow.eval_step_s = 0.01  # one evaluation alone: 3 s of environment steps + 1 s of rollout steps
    beside = slowdown * 4
    assert beside > 1.5  # longer than the updates between two: training waits, and loses beside it
    cost = 9 * (beside - 1.5 + loss * 1.5)
    assert estimate([a], slow) - estimate([dataclasses.replace(a, overlapped=0)], slow) == pytest.approx(cost)
    a.overlapped_every = 1000  # 15 s of updates between two: longer than the evaluation (3 s alone) beside them
    assert estimate([a], throughput()) == pytest.approx(alone + 9 * loss * slowdown * 3)
    a.overlapped_every, piped = 100, dataclasses.replace(slow, eval_step_s=0.0, eval_steps_per_s=1e6)
    assert estimate([a], piped) < estimate([a], slow)  # the final evaluation, pipelined, is faster ...
    piped.in_turn = (slow.eval_step_s, slow.eval_steps_per_s, 0.0)  # ... but one beside training acts and steps in turn
    assert estimate([a], piped) - estimate([dataclasses.replace(a, overlapped=0)], piped) == pytest.approx(cost)
    piped.in_turn = (slow.eval_step_s, slow.eval_steps_per_s, 0.5)  # a start-up of 0.5 s: each one takes it longer
    more = 9 * (beside + 0.5 - 1.5 + loss * 1.5)
    assert estimate([a], piped) - estimate([dataclasses.replace(a, overlapped=0)], piped) == pytest.approx(more)


def test_a_group_whose_dataset_is_being_built_is_planned_to_start_after_the_build(monkeypatch, tmp_path):
    """--building with --build-wait: the wait counts against the groups that need the dataset only; a built
    dataset's group fits, and trains during the wait."""
    from commands.sweep import command

    def groups(datasets, models, seeds, extra, out, recorded):  # 1 member, 1000 updates at 100/s: 10 s
        return [Group([d], models[0], seeds, PRIMAL, steps=1000, eval_steps=0) for d in datasets]

    monkeypatch.setattr(command, "budget_groups", groups)
    monkeypatch.setattr(command, "is_built", lambda d: d == "dt-primal/built")
    monkeypatch.setattr(command, "load_throughput", lambda path: throughput())
    argv = ["--datasets", "x", "--models", "primal", "--seeds", "0", "--out", str(tmp_path)]
    argv += ["--throughput", "t.json", "--building", "dt-primal/building", "--build-wait", "100s"]
    args = command.parser().parse_args(argv)
    priority = ["dt-primal/building", "dt-primal/built"]
    assert command.budgeted_groups(priority, args, [], START_S + 5 + 10 + 99) == [(["dt-primal/built"], "primal")]
    both = command.budgeted_groups(priority, args, [], START_S + 5 + 100 + 10)  # the built one trains meanwhile
    assert both == [(["dt-primal/building"], "primal"), (["dt-primal/built"], "primal")]
    args.build_wait = "soon"
    with pytest.raises(UserError, match="--build-wait must be a duration"):
        command.budgeted_groups(priority, args, [], 1000)


def test_an_unbuilt_dataset_is_named_as_left_out_only_while_it_has_a_run_left(monkeypatch, tmp_path, capsys):
    from commands.sweep import command

    monkeypatch.setattr(command, "budget_groups", lambda datasets, *rest: [])  # no run left to train
    monkeypatch.setattr(command, "is_built", lambda d: False)
    monkeypatch.setattr(command, "all_finished", lambda d, models, seeds, out, recorded: d == "dt-primal/done")
    monkeypatch.setattr(command, "load_throughput", lambda path: throughput())
    argv = ["--datasets", "x", "--models", "primal", "--seeds", "0", "--out", str(tmp_path), "--throughput", "t.json"]
    args = command.parser().parse_args(argv)
    assert command.budgeted_groups(["dt-primal/done", "dt-primal/todo"], args, [], 60) == []
    out = capsys.readouterr().out
    assert "left out: dt-primal/todo (not built yet" in out and "dt-primal/done" not in out


def test_pairs_are_taken_in_priority_order_and_smaller_ones_still_tried_after_one_that_does_not_fit():
    steps = {"first": 1000, "huge": 10**7, "second": 1000, "other-size": 10}

    def plan(pairs):
        size = lambda d: 128 if d == "other-size" else 256
        return [
            Group([d], m, [0, 1, 2], Setting(m, size(d), 4, "captured", "bf16"), steps[d], eval_steps=0)
            for d, m in pairs
        ]

    priority = [("first", "dt"), ("huge", "primal"), ("other-size", "dt"), ("second", "primal")]
    groups, left = choose(priority, plan, throughput(), budget_s=START_S + 5 + 2 * 3000 / 200)
    assert [(g.datasets, g.model) for g in groups] == [(["first"], "dt"), (["second"], "primal")]
    assert [pair for pair, _ in left] == [("huge", "primal"), ("other-size", "dt")]
    assert "would need about" in left[0][1] and "no throughput measured for dt d_model 128" in left[1][1]
    nothing, left = choose(priority, plan, throughput(), budget_s=START_S)
    assert nothing == [] and len(left) == 4


def test_a_group_filled_before_the_next_wins_where_it_trains_more_runs_in_the_budget():
    """Members of one group train faster than as members of two: the pairs gathered by group give 9 runs where
    the priority's order, which starts a second group early, gives 6."""

    def plan(pairs):  # a dataset's task is its first letter, a group a task's datasets
        tasks = dict.fromkeys(d[0] for d, _ in pairs)
        return [
            Group([d for d, _ in pairs if d[0] == t], "primal", [0, 1, 2], PRIMAL, 1000, eval_steps=0) for t in tasks
        ]

    priority = [("a1", "primal"), ("b1", "primal"), ("a2", "primal"), ("a3", "primal")]
    groups, left = choose(priority, plan, throughput(), budget_s=START_S + 5 + 30)
    assert [g.datasets for g in groups] == [["a1", "a2", "a3"]]
    assert [pair for pair, _ in left] == [("b1", "primal")]
    # 6 runs either way: the one group of 6 (17 s) ends before the two of 3 (30 s) that the priority's order takes
    tie, _ = choose(priority[:3], plan, throughput(), budget_s=START_S + 5 + 30)
    assert [g.datasets for g in tie] == [["a1", "a2"]]
    same, _ = choose(priority[:2], plan, throughput(), budget_s=START_S + 5 + 30)  # the same groups either way
    assert [g.datasets for g in same] == [["a1"], ["b1"]]


@pytest.mark.parametrize(
    "content",
    [
        "not json",
        '{"records": [{"model": "primal"}]}',
        '{"records": [{"model": "primal", "d_model": 256, "n_head": 4, "mode": "captured", "precision": "bf16", '
        '"members": 1, "member_updates_per_s": -3, "warmup_s": 1}]}',
        '{"records": [], "eval_steps_per_s": "fast"}',
        '{"records": [], "evaluation": {"step_s": 0.003, "env_step_s": 0}}',
        '{"records": [], "evaluation": {"step_s": -1, "env_step_s": 1e-5}}',
        '{"records": [], "evaluation": {"env_step_s": 1e-5}}',
        '{"records": [], "evaluation_in_turn": {"step_s": 0.003, "env_step_s": 0}}',
        '{"records": [], "evaluation_in_turn": {"step_s": 11, "env_step_s": 1e-5}}',
        '{"records": [], "evaluation": {"step_s": 0.003, "env_step_s": 1e-5, "start_s": -2}}',
        '{"records": [], "evaluation_in_turn": {"step_s": 0.003, "env_step_s": 1e-5, "start_s": 1e9}}',
    ],
)
def test_a_throughput_file_that_is_not_one_is_refused_by_name(tmp_path, content):
    path = tmp_path / "throughput.json"
    path.write_text(content)
    with pytest.raises(UserError, match="throughput.json") as refused:
        load_throughput(path)
    assert "run record" not in str(refused.value)  # named as what it is


def test_a_throughput_file_carries_the_evaluations_cost_per_step_and_per_environment_step(tmp_path):
    """As bench/eval_overhead.py --json fits it (its start-up too, where timed apart); a file without it keeps its
    rate alone."""
    path = tmp_path / "throughput.json"
    throughput().save(path, {})
    assert load_throughput(path).eval_step_s == 0 and load_throughput(path).eval_steps_per_s == 1000
    doc = json.loads(path.read_text()) | {"evaluation": {"step_s": 0.004, "env_step_s": 2e-5}}
    path.write_text(json.dumps(doc))
    t = load_throughput(path)
    assert t.eval_step_s == 0.004 and t.eval_steps_per_s == pytest.approx(50_000) and t.in_turn is None
    assert t.eval_start_s == 0 and t.rate(PRIMAL, 9) == 500.0
    in_turn = {"step_s": 0.01, "env_step_s": 4e-5, "start_s": 2.5}
    path.write_text(json.dumps(doc | {"evaluation_in_turn": in_turn}))
    t = load_throughput(path)
    assert t.in_turn == pytest.approx((0.01, 25_000, 2.5))
    t.eval_start_s = 1.5
    t.save(path, {})
    again = load_throughput(path)  # kept where the sweep saves it
    assert again.in_turn == pytest.approx((0.01, 25_000, 2.5)) and again.eval_start_s == 1.5


def test_a_budgeted_sweep_starts_what_fits_names_what_does_not_and_skips_committed_runs(tmp_path):
    """One (dataset, model) pair fits the budget, the second does not; a third dataset's runs are already
    recorded in --recorded and are not trained again."""
    data = hopper_file(tmp_path)
    done = tmp_path / "other.hdf5"
    done.write_bytes(data.read_bytes())
    recorded = tmp_path / "results"
    for model in ("dt", "primal"):
        for seed in (0, 1):
            folder = run_dir(recorded, str(done), model, seed)
            folder.mkdir(parents=True)
            (folder / "eval.json").write_text("{}")
    # each pair: 2 seeds x 2 targets x (2 + 1) episodes x 1000 steps = 12000 evaluation steps, 60 s at 200/s;
    # training is instant at 1e6 member-updates/s: one pair needs START_S + 60 s, two START_S + 120 s
    records = [
        dict(model="primal", d_model=32, n_head=2, mode="eager", precision="fp32", members=1)
        | dict(member_updates_per_s=1e6, warmup_s=0.0)
    ]
    measured = tmp_path / "throughput.json"
    measured.write_text(json.dumps({"records": records, "eval_steps_per_s": 200}))
    out = tmp_path / "sweep"
    sweep = ["-m", "commands.sweep", "--datasets", done, data, "--models", "dt", "primal", "--seeds", "0", "1"]
    sweep += ["--out", out, "--recorded", recorded, "--time-budget", "2.5m", "--throughput", measured]
    res = run(*sweep, "--", *SWEEP_RUN, timeout=400)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"starting {data} (dt): 2 members, seeds [0, 1]" in res.stdout
    assert f"left out: {data} (primal): with it the groups would need about 2.5 min of 2.5" in res.stdout
    assert all((run_dir(out, str(data), "dt", s) / "eval.json").exists() for s in (0, 1))
    assert not group_dir(out, str(data), "primal").exists()
    assert not group_dir(out, str(done), "dt").exists()  # recorded: nothing to train


def test_the_budgets_measured_figures_come_from_their_file_and_a_damaged_one_is_a_message(tmp_path, monkeypatch):
    import json

    from commands.sweep import budget
    from dt_primal.errors import UserError

    figures = json.loads(budget.MEASURED.read_text())
    assert budget.measured("overlap_training_loss") == figures["overlap_training_loss"]["value"]
    assert all(figures[k]["source"] for k in ("eval_steps_per_s", "overlap_slowdown", "overlap_training_loss"))
    (tmp_path / "figures.json").write_text('{"overlap_slowdown": {}}')
    monkeypatch.setattr(budget, "MEASURED", tmp_path / "figures.json")
    budget.measured.cache_clear()
    try:
        with pytest.raises(UserError, match="lacks a readable 'overlap_slowdown'"):
            budget.measured("overlap_slowdown")
    finally:
        budget.measured.cache_clear()
