"""Tier 0: the exact law of one speculative rejection step, enumerated (no sampling).

The acceptance functions are threshold rules in the uniform ``u``; their acceptance
probabilities are read off the code itself by asking it at uniforms just inside and just
outside the threshold, then the output law of draft-accept-or-residual is summed over every
branch and compared with the target at 1e-12.
"""

import math

import numpy as np
import pytest
import torch

from pyro_autospec.engine.rejection import accept_draft, accept_residual


def ask(rule, log_ratio: float, u: float) -> bool:
    return bool(
        rule(torch.tensor(log_ratio, dtype=torch.float64), torch.tensor(u, dtype=torch.float64))
    )


def acceptance_probability(rule, log_ratio):
    """P(u ~ U(0,1) accepted) for a rule whose acceptance set is an interval ending at 0 or 1."""
    low, high = ask(rule, log_ratio, 1e-300), ask(rule, log_ratio, 1.0 - 1e-16)
    if low and high:
        return 1.0
    if not low and not high:
        return 0.0
    lo, hi = 0.0, 1.0  # bisection on the boundary; ``low`` tells which side accepts
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if ask(rule, log_ratio, mid) == low:
            lo = mid
        else:
            hi = mid
    boundary = 0.5 * (lo + hi)
    return boundary if low else 1.0 - boundary


def one_step_law(mu, nu):
    with np.errstate(divide="ignore"):
        log_ratio = np.log(mu) - np.log(nu)
    p_acc = np.array(
        [acceptance_probability(accept_draft, l) if n > 0 else 0.0 for l, n in zip(log_ratio, nu)]
    )
    p_res = np.array(
        [
            acceptance_probability(accept_residual, l) if m > 0 else 0.0
            for l, m in zip(log_ratio, mu)
        ]
    )
    accepted = nu * p_acc
    rejected = 1.0 - accepted.sum()
    residual = mu * p_res
    if rejected <= 1e-15:
        return accepted
    return accepted + rejected * residual / residual.sum()


@pytest.mark.parametrize("seed", range(20))
def test_one_step_law_is_target(seed):
    rng = np.random.default_rng(seed)
    q = int(rng.integers(2, 7))
    mu = rng.dirichlet(np.full(q, 0.5))
    nu = rng.dirichlet(np.full(q, 0.5))
    if seed % 3 == 0:  # zeros in either: disjoint-ish supports
        mu[0], nu[-1] = 0.0, 0.0
        mu, nu = mu / mu.sum(), nu / nu.sum()
    law = one_step_law(mu, nu)
    np.testing.assert_allclose(law, mu, atol=1e-12)


def test_terrible_draft():
    mu = np.array([1 - 1e-9, 1e-9, 0.0])
    nu = np.array([1e-9, 0.0, 1 - 1e-9])
    np.testing.assert_allclose(one_step_law(mu, nu), mu, atol=1e-12)


@pytest.mark.parametrize("u", [1e-300, 0.5, 1.0 - 1e-16])
def test_edge_ratios(u):
    assert ask(accept_draft, 0.0, u) and ask(accept_draft, 3.0, u)
    assert not ask(accept_draft, -math.inf, u) and not ask(accept_draft, math.nan, u)
    assert ask(accept_residual, math.inf, u)
    assert not ask(accept_residual, 0.0, u) and not ask(accept_residual, -2.0, u)
    assert not ask(accept_residual, math.nan, u)


def test_tiny_log_ratio_keeps_its_probability():
    # tiny positive log ratio: acceptance probability ~ l, not rounded to zero
    assert acceptance_probability(accept_residual, 1e-12) == pytest.approx(1e-12, rel=1e-3)
