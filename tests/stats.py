"""Goodness-of-fit helpers shared by the statistical tests (scipy p-values, never Pyro's gof)."""

from __future__ import annotations

import numpy as np
import scipy.stats
import torch

P_THRESHOLD = 2e-5
MIN_EXPECTED = 30.0


def state_index(samples: torch.Tensor, q: int) -> np.ndarray:
    """Row-major index of each joint state: int64[N]."""
    n = samples.shape[1]
    weights = q ** np.arange(n - 1, -1, -1, dtype=np.int64)
    return samples.cpu().numpy().astype(np.int64) @ weights


def chisquare_pvalue(observed: np.ndarray, probs: np.ndarray) -> float:
    """Chi-square p-value of counts against probabilities, merging thin bins.

    States of probability zero must not be observed (raises AssertionError otherwise). Bins are
    sorted by expected count and grouped, smallest first, until every group expects at least 30
    counts; the test raises rather than passes when fewer than two groups are left.
    """
    observed = np.asarray(observed, dtype=np.float64)
    probs = np.asarray(probs, dtype=np.float64)
    probs = probs / probs.sum()
    total = observed.sum()
    assert observed[probs == 0].sum() == 0, "a state of probability zero was sampled"
    keep = probs > 0
    observed, expected = observed[keep], probs[keep] * total
    order = np.argsort(expected)
    expected, observed = expected[order], observed[order]
    # Group the sorted bins, smallest first, so that every group expects >= 30 counts.
    groups_e, groups_o, acc_e, acc_o = [], [], 0.0, 0.0
    for e, o in zip(expected, observed):
        acc_e, acc_o = acc_e + e, acc_o + o
        if acc_e >= MIN_EXPECTED:
            groups_e.append(acc_e)
            groups_o.append(acc_o)
            acc_e, acc_o = 0.0, 0.0
    if acc_e > 0 and groups_e:
        groups_e[-1] += acc_e
        groups_o[-1] += acc_o
    if len(groups_e) < 2:
        raise ValueError("too few samples for a chi-square test with >= 30 expected counts per bin")
    merged_o, merged_e = np.array(groups_o), np.array(groups_e)
    return float(scipy.stats.chisquare(merged_o, merged_e).pvalue)


def assert_samples_match(samples: torch.Tensor, log_probs: torch.Tensor, q: int) -> float:
    """Chi-square test of joint-state samples against an exact joint ``log_probs`` [q]*n."""
    probs = log_probs.exp().flatten().cpu().numpy()
    counts = np.bincount(state_index(samples, q), minlength=probs.size)
    p = chisquare_pvalue(counts, probs)
    assert p > P_THRESHOLD, f"chi-square p-value {p:.3g} below {P_THRESHOLD}"
    return p
