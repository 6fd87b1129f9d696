"""Seed-averaged scores with 95 % bootstrap intervals, as Agarwal et al. (NeurIPS 2021, the ``rliable``
library) report few-seed results: per dataset, the mean over seeds with its interval; across
datasets, the interquartile mean (IQM) of all runs, the mean and median of the datasets' means and
the optimality gap, with stratified-bootstrap intervals (each dataset's seeds resampled within it);
the probability of improvement P(X > Y) of one model over another; and performance profiles.

The bootstrap is ``scipy.stats.bootstrap`` (percentile intervals, as ``rliable``'s default), seeded, so
that a page made from the same records is the same page. ``rliable`` itself is not used: its dependency
``arch`` fails on import with pandas 3; ``tests/dt_primal/evaluation/test_intervals.py`` checks these numbers against
``rliable``'s on the same scores. Scores are normalised (0 random, 100 expert); ``scores`` is one array
of seed scores per dataset. Reading records with these functions loads no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

CONFIDENCE = 0.95
RESAMPLES = 20_000
SEED = 0
GAMMA = 100.0  # the optimality gap's threshold: the expert's normalised score


@dataclass(frozen=True)
class Estimate:
    """A point estimate with its bootstrap interval (``low``/``high`` None: fewer than 2 seeds somewhere)."""

    value: float
    low: float | None = None
    high: float | None = None

    def text(self, digits: int = 1) -> str:
        point = f"{self.value:.{digits}f}"
        return point if self.low is None else f"{point} [{self.low:.{digits}f}, {self.high:.{digits}f}]"


def iqm(*scores, axis=-1):
    """Interquartile mean of all runs: the mean of the middle 50 % (25 % trimmed at each end)."""
    return stats.trim_mean(np.concatenate(scores, axis=axis), 0.25, axis=axis)


def mean(*scores, axis=-1):
    """The mean over datasets of each dataset's mean over its runs."""
    return np.mean([np.mean(s, axis=axis) for s in scores], axis=0)


def median(*scores, axis=-1):
    """The median over datasets of each dataset's mean over its runs."""
    return np.median([np.mean(s, axis=axis) for s in scores], axis=0)


def optimality_gap(*scores, axis=-1):
    """How far the runs fall short of the expert on average: mean of max(GAMMA − score, 0)."""
    return np.mean(np.maximum(GAMMA - np.concatenate(scores, axis=axis), 0.0), axis=axis)


AGGREGATES = {"IQM": iqm, "mean": mean, "median": median, "optimality gap": optimality_gap}


def _estimate(statistic, samples: list[np.ndarray]) -> Estimate:
    samples = [np.asarray(s, dtype=float) for s in samples]
    value = float(statistic(*samples, axis=-1))
    if min(len(s) for s in samples) < 2:
        return Estimate(value)
    res = stats.bootstrap(
        samples,
        statistic,
        n_resamples=RESAMPLES,
        confidence_level=CONFIDENCE,
        method="percentile",
        vectorized=True,
        paired=False,
        rng=np.random.default_rng(SEED),
    )
    return Estimate(value, float(res.confidence_interval.low), float(res.confidence_interval.high))


def interval(seed_scores) -> Estimate:
    """One dataset: the mean over seeds and its bootstrap interval over the seeds."""
    return _estimate(lambda s, axis=-1: np.mean(s, axis=axis), [seed_scores])


def aggregates(scores: list) -> dict[str, Estimate]:
    """Across datasets (``AGGREGATES``), each with its stratified-bootstrap interval."""
    return {name: _estimate(f, list(scores)) for name, f in AGGREGATES.items()}


def probability_of_improvement(x: list, y: list) -> Estimate:
    """P(X > Y): for a dataset, the chance that a run of X scores above a run of Y (ties count half),
    averaged over the datasets; the runs of both resampled within each dataset. ``x[i]``, ``y[i]``: the
    seed scores of X and Y on dataset i."""
    n = len(x)

    def statistic(*samples, axis=-1):
        per_dataset = []
        for a, b in zip(samples[:n], samples[n:]):
            a, b = np.expand_dims(a, -1), np.expand_dims(b, -2)
            per_dataset.append(np.mean((a > b) + 0.5 * (a == b), axis=(-2, -1)))
        return np.mean(per_dataset, axis=0)

    return _estimate(statistic, [*x, *y])


def performance_profile(scores: list, taus) -> np.ndarray:
    """The fraction of all runs scoring above each ``tau`` (each dataset weighted alike)."""
    return np.mean([np.mean(np.asarray(s, float)[:, None] > np.asarray(taus)[None], axis=0) for s in scores], axis=0)
