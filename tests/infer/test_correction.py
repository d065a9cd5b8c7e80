"""The correction's resampling and IMH read keyed uniforms (the engine's generator).

Statistical tests use scipy p-values with a failure threshold of 2e-5 and fixed seeds.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy import stats

from pyro_autospec.infer.correction import importance_resample, independent_metropolis_hastings

ALPHA = 2e-5


def test_resampling_frequencies_follow_the_weights():
    log_weight = torch.log(torch.tensor([0.0, 1.0, 2.0, 3.0, 0.0, 4.0, 0.0]))
    index, _ = importance_resample(log_weight, 20000, seed=3, smooth=False)
    counts = np.bincount(index.numpy(), minlength=7)
    assert counts[[0, 4, 6]].sum() == 0  # zero weight, never drawn (the last one included)
    probs = np.array([1.0, 2.0, 3.0, 4.0]) / 10
    assert stats.chisquare(counts[[1, 2, 3, 5]], 20000 * probs).pvalue > ALPHA


def test_same_seed_same_indices_and_generators_are_drawn_from():
    log_weight = torch.randn(50, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    a, _ = importance_resample(log_weight, 30, seed=11)
    b, _ = importance_resample(log_weight, 30, seed=11)
    c, _ = importance_resample(log_weight, 30, seed=12)
    assert torch.equal(a, b) and not torch.equal(a, c)
    g1, g2 = torch.Generator().manual_seed(4), torch.Generator().manual_seed(4)
    assert torch.equal(
        importance_resample(log_weight, 30, seed=g1)[0],
        importance_resample(log_weight, 30, seed=g2)[0],
    )
    first = independent_metropolis_hastings(log_weight, seed=np.random.default_rng(1))
    again = independent_metropolis_hastings(log_weight, seed=np.random.default_rng(1))
    assert all(torch.equal(x, y) for x, y in zip(first, again))


def test_imh_accepts_with_the_metropolis_hastings_probability():
    """A step from weight w to w' moves with probability min(1, w' / w): over many two-step
    chains the acceptance count is binomial."""
    moves = 0
    trials = 4000
    for seed in range(trials):
        _, accepted, prob = independent_metropolis_hastings(
            torch.tensor([0.0, np.log(0.3)], dtype=torch.float64), seed=seed
        )
        assert abs(float(prob[1]) - 0.3) < 1e-12
        moves += int(accepted[1])
    assert stats.binomtest(moves, trials, 0.3).pvalue > ALPHA
