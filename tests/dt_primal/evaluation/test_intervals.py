"""Seed-averaged reports with bootstrap intervals, against ``rliable``'s numbers on the same scores."""

import numpy as np
import pytest
from conftest import run

from dt_primal.evaluation import intervals as iv

# the high target's last-checkpoint scores of results/table4-cpu (9 datasets x 3 seeds), DT and Primal.+DT
DT = [
    [44.900497, 43.815854, 44.915656],
    [36.90338, 36.696077, 37.665072],
    [45.671701, 20.955285, 41.716016],
    [50.530569, 56.87974, 71.279285],
    [29.459141, 25.43993, 33.338737],
    [71.816583, 42.075098, 101.342214],
    [49.11169, 47.492498, 62.975821],
    [46.105061, 44.736053, 41.819541],
    [50.508485, 61.854992, 21.299125],
]
PRIMAL = [
    [44.851425, 44.829434, 45.540678],
    [36.720244, 36.990515, 36.691009],
    [36.387951, 44.264452, 27.483503],
    [61.598829, 51.388924, 65.851744],
    [33.377168, 31.669409, 39.744137],
    [101.434527, 44.637692, 52.644477],
    [61.040775, 63.617326, 62.170628],
    [18.071881, 48.041315, 36.20712],
    [60.243982, 63.657675, 65.036357],
]
# rliable 1.2.0 (arch 7.2.0, pandas 2.3.3) on the arrays above, transposed to (runs, datasets):
# rly.get_interval_estimates({m: x}, lambda x: [aggregate_iqm(x), aggregate_mean(x), aggregate_median(x),
# aggregate_optimality_gap(x, 100)], reps=50000) and, for P(Primal.+DT > DT), probability_of_improvement
RLIABLE = {
    "dt": {
        "IQM": (44.5311, 42.1789, 47.8207),
        "mean": (46.7150, 42.4655, 50.8570),
        "median": (44.5440, 42.7917, 45.6717),
        "optimality gap": (53.3347, 49.2467, 57.5452),
    },
    "primal": {
        "IQM": (47.2819, 44.8869, 49.8514),
        "mean": (48.6738, 45.2328, 52.5591),
        "median": (45.0738, 44.6377, 48.0413),
        "optimality gap": (51.3793, 47.5739, 54.7675),
    },
}
RLIABLE_POI = (0.592593, 0.432099, 0.740741)


@pytest.mark.parametrize("model, scores", [("dt", DT), ("primal", PRIMAL)])
def test_aggregates_agree_with_rliable(model, scores):
    got = iv.aggregates([np.array(s) for s in scores])
    for name, (value, low, high) in RLIABLE[model].items():
        assert got[name].value == pytest.approx(value, abs=1e-3), name
        # a different random stream: the bounds agree to the Monte-Carlo noise of the resampling
        assert got[name].low == pytest.approx(low, abs=0.4) and got[name].high == pytest.approx(high, abs=0.4), name


def test_probability_of_improvement_agrees_with_rliable():
    got = iv.probability_of_improvement([np.array(s) for s in PRIMAL], [np.array(s) for s in DT])
    assert got.value == pytest.approx(RLIABLE_POI[0], abs=1e-6)
    assert got.low == pytest.approx(RLIABLE_POI[1], abs=0.02) and got.high == pytest.approx(RLIABLE_POI[2], abs=0.02)
    assert got.text(2) == "0.59 [0.43, 0.74]"


def test_the_bootstrap_is_seeded_and_one_seed_has_no_interval():
    a, b = iv.interval([40.0, 45.0, 47.0]), iv.interval([40.0, 45.0, 47.0])
    assert a == b and a.low < a.value < a.high
    assert iv.interval([40.0]) == iv.Estimate(40.0) and iv.Estimate(40.0).text() == "40.0"
    assert iv.aggregates([[40.0], [50.0, 60.0]])["IQM"].low is None


def test_a_performance_profile_weighs_datasets_alike():
    profile = iv.performance_profile([[10.0, 30.0], [50.0, 50.0, 50.0, 50.0]], [0.0, 20.0, 40.0, 60.0])
    assert profile.tolist() == [1.0, 0.75, 0.5, 0.0]


def test_reading_intervals_loads_no_torch():

    code = "import sys, dt_primal.evaluation.intervals; sys.exit('torch' in sys.modules)"
    assert run("-c", code).returncode == 0
