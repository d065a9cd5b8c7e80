"""Brute force for the handler tests: enumerate a joint written by hand, test draws against it.

Nothing here uses pyro_autospec: the exact law is a hand-written log joint summed over every
assignment, and draws are compared by a chi-square test (scipy p-values, threshold 2e-5, thin
bins pooled so that every bin expects at least 30 draws; see ``tests/stats.py``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import numpy as np
import torch

from tests.stats import P_THRESHOLD, chisquare_pvalue


def enumerate_joint(
    sizes: Sequence[int], log_joint: Callable[[tuple], float]
) -> tuple[list[tuple], np.ndarray]:
    """Every assignment of coordinates with the given support sizes, and its probability."""
    states = list(itertools.product(*[range(k) for k in sizes]))
    logs = np.array([float(log_joint(s)) for s in states], dtype=np.float64)
    logs -= logs.max()
    probs = np.exp(logs)
    return states, probs / probs.sum()


def flatten_draws(samples: dict, names: Sequence[str]) -> np.ndarray:
    """Draws as int64[N, n]: each named site's values flattened in C order, sites in order."""
    parts = []
    for name in names:
        value = samples[name]
        parts.append(value.reshape(value.shape[0], -1).round().long().cpu().numpy())
    return np.concatenate(parts, axis=1)


def assert_draws_follow(draws: np.ndarray, states: list[tuple], probs: np.ndarray) -> float:
    """Chi-square test of draws int64[N, n] against the law ``probs`` over ``states``."""
    index = {s: i for i, s in enumerate(states)}
    counts = np.zeros(len(states))
    for row in draws:
        key = tuple(int(v) for v in row)
        assert key in index, f"a draw {key} is not a state of the model"
        counts[index[key]] += 1
    p = chisquare_pvalue(counts, probs)
    assert p > P_THRESHOLD, f"chi-square p-value {p:.3g} below {P_THRESHOLD}"
    return p


def marginal_means(states: list[tuple], probs: np.ndarray) -> np.ndarray:
    """Exact mean of every coordinate."""
    return (np.array(states, dtype=np.float64) * probs[:, None]).sum(0)


def lp(distribution, value) -> float:
    """``distribution.log_prob(value)`` as a Python float (value converted to a tensor)."""
    return float(distribution.log_prob(torch.as_tensor(value)).sum())
