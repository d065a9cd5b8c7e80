"""The exact denoisers against direct formulas, quadrature and the tower property."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import integrate, stats

from pyro_autospec.engine.protocols import MeanOracle
from pyro_autospec.oracles.denoisers import (
    FiniteSupportDenoiser,
    GaussianDenoiser,
    GaussianMixtureDenoiser,
)

ALPHA = 2e-5


def random_spd(d: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(d, d, generator=g, dtype=torch.float64)
    return a @ a.T / d + 0.1 * torch.eye(d, dtype=torch.float64)


def test_protocol_and_attributes():
    oracle = GaussianDenoiser(torch.zeros(3), torch.eye(3))
    for o in (
        oracle,
        GaussianMixtureDenoiser(torch.ones(2), torch.zeros(2, 3), torch.eye(3).expand(2, 3, 3)),
        FiniteSupportDenoiser(torch.eye(3)),
    ):
        assert isinstance(o, MeanOracle)
        assert o.dim == 3 and o.dtype == torch.float64 and o.device.type == "cpu"
        assert o.to(dtype=torch.float32)(torch.ones(4), torch.ones(4, 3)).dtype == torch.float32


def test_gaussian_matches_direct_solve():
    d = 4
    mean = torch.linspace(-1, 2, d, dtype=torch.float64)
    cov = random_spd(d, 0)
    oracle = GaussianDenoiser(mean, cov)
    g = torch.Generator().manual_seed(1)
    t = torch.rand(50, generator=g, dtype=torch.float64) * 10
    t[0] = 0.0
    x = torch.randn(50, d, generator=g, dtype=torch.float64) * 3
    direct = torch.stack(
        [
            mean + cov @ torch.linalg.solve(ti * cov + torch.eye(d), xi - ti * mean)
            for ti, xi in zip(t, x, strict=True)
        ]
    )
    torch.testing.assert_close(oracle(t, x), direct, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(oracle(t[:1], 0 * x[:1])[0], mean)  # X_0 = 0: E[Y]


def test_singular_gaussian_is_finite_and_matches_limit():
    mean = torch.tensor([1.0, 0.0], dtype=torch.float64)
    cov = torch.tensor([[1.0, 1.0], [1.0, 1.0]], dtype=torch.float64)  # rank one
    t = torch.tensor([0.0, 0.5, 4.0], dtype=torch.float64)
    x = torch.tensor([[0.3, -2.0], [1.0, 1.0], [5.0, -1.0]], dtype=torch.float64)
    exact = GaussianDenoiser(mean, cov)(t, x)
    nearly = GaussianDenoiser(mean, cov + 1e-9 * torch.eye(2))(t, x)
    assert torch.isfinite(exact).all()
    torch.testing.assert_close(exact, nearly, rtol=1e-6, atol=1e-6)
    # the posterior mean stays on the support line m + span(1, 1)
    offset = exact - mean
    torch.testing.assert_close(offset[:, 0], offset[:, 1])


def test_mixture_one_dimensional_quadrature():
    weights = torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64)
    means = torch.tensor([[-2.0], [0.5], [3.0]], dtype=torch.float64)
    sds = torch.tensor([0.3, 1.0, 0.5], dtype=torch.float64)
    oracle = GaussianMixtureDenoiser(weights, means, (sds**2)[:, None, None])

    def prior(y):
        return sum(
            float(w) * stats.norm.pdf(y, float(m), float(s))
            for w, m, s in zip(weights, means[:, 0], sds, strict=True)
        )

    for t, x in [(0.0, 0.0), (0.3, -1.0), (2.0, 4.0), (10.0, 25.0)]:

        def lik(y, t=t, x=x):
            return math.exp(x * y - t * y * y / 2)

        num = integrate.quad(
            lambda y: y * prior(y) * lik(y), -15, 15, points=[-2, 0.5, 3], limit=200
        )[0]
        den = integrate.quad(lambda y: prior(y) * lik(y), -15, 15, points=[-2, 0.5, 3], limit=200)[
            0
        ]
        value = oracle(
            torch.tensor([t], dtype=torch.float64), torch.tensor([[x]], dtype=torch.float64)
        )
        assert value.item() == pytest.approx(num / den, rel=1e-7, abs=1e-8)


def test_single_component_mixture_equals_gaussian_and_finite_support_limit():
    d = 3
    mean, cov = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64), random_spd(d, 3)
    g = torch.Generator().manual_seed(2)
    t = torch.rand(20, generator=g, dtype=torch.float64) * 5
    x = torch.randn(20, d, generator=g, dtype=torch.float64) * 2
    mixture = GaussianMixtureDenoiser(torch.ones(1), mean[None], cov[None])
    torch.testing.assert_close(mixture(t, x), GaussianDenoiser(mean, cov)(t, x))
    points = torch.randn(5, d, generator=g, dtype=torch.float64)
    weights = torch.tensor([1.0, 2.0, 3.0, 1.0, 0.5], dtype=torch.float64)
    tiny = GaussianMixtureDenoiser(weights, points, 1e-12 * torch.eye(d).expand(5, d, d))
    finite = FiniteSupportDenoiser(points, weights)
    torch.testing.assert_close(finite(t, x), tiny(t, x), rtol=1e-8, atol=1e-8)


def test_finite_support_brute_force_and_extremes():
    points = torch.tensor([[1.0, 0.0], [0.0, 2.0], [-1.0, -1.0]], dtype=torch.float64)
    weights = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
    oracle = FiniteSupportDenoiser(points, weights)
    t, x = torch.tensor([1.5], dtype=torch.float64), torch.tensor([[0.3, 1.2]], dtype=torch.float64)
    w = weights * torch.exp(points @ x[0] - t * (points**2).sum(-1) / 2)
    torch.testing.assert_close(oracle(t, x)[0], (w[:, None] * points).sum(0) / w.sum())
    far = oracle(
        torch.tensor([1e4], dtype=torch.float64), torch.tensor([[1e4, 0.0]], dtype=torch.float64)
    )
    assert torch.isfinite(far).all()
    torch.testing.assert_close(far[0], points[0])
    assert torch.isfinite(
        oracle(torch.zeros(1, dtype=torch.float64), torch.full((1, 2), 1e6))
    ).all()


@pytest.mark.parametrize("kind", ["mixture", "finite"])
def test_tower_property(kind):
    """E[f(t, X_t) g(X_t)] = E[Y g(X_t)] for X_t = t Y + B_t (tier 3, 5 standard errors)."""
    if kind == "mixture":
        oracle = GaussianMixtureDenoiser(
            torch.tensor([0.3, 0.7]),
            torch.tensor([[-1.0, 1.0, 0.0], [2.0, 0.0, -1.0]]),
            torch.stack([random_spd(3, 4), random_spd(3, 5)]),
        )
    else:
        oracle = FiniteSupportDenoiser.unit_sphere(7, 3, seed=1)
    n, t = 200_000, 0.7
    y = oracle.sample(n, seed=0)
    x = t * y + math.sqrt(t) * torch.from_numpy(np.random.default_rng(1).standard_normal((n, 3)))
    f = oracle(torch.full((n,), t, dtype=torch.float64), x)
    for g in (x[:, :1], torch.tanh(x[:, 1:2])):
        diff = (f - y) * g  # mean zero
        se = diff.std(0) / math.sqrt(n)
        assert (diff.mean(0).abs() < 5 * se).all(), (diff.mean(0), se)


def test_sample_frequencies():
    weights = torch.tensor([0.1, 0.2, 0.3, 0.4])
    oracle = FiniteSupportDenoiser(torch.arange(4.0)[:, None], weights)
    draws = oracle.sample(4000, seed=0)[:, 0].long()
    counts = np.bincount(draws.numpy(), minlength=4)
    assert stats.chisquare(counts, 4000 * weights.numpy()).pvalue > ALPHA
    gaussian = GaussianDenoiser(torch.tensor([1.0, -1.0]), torch.tensor([[2.0, 0.5], [0.5, 1.0]]))
    z = gaussian.sample(4000, seed=1).numpy()
    assert stats.kstest(z[:, 0], "norm", args=(1.0, math.sqrt(2.0))).pvalue > ALPHA


def test_errors():
    with pytest.raises(ValueError, match=r"cov must have shape \[d, d\]"):
        GaussianDenoiser(torch.zeros(2), torch.eye(3))
    with pytest.raises(ValueError, match="symmetric"):
        GaussianDenoiser(torch.zeros(2), torch.tensor([[1.0, 0.5], [0.0, 1.0]]))
    with pytest.raises(ValueError, match="positive semi-definite"):
        GaussianDenoiser(torch.zeros(2), torch.tensor([[1.0, 0.0], [0.0, -1.0]]))
    with pytest.raises(ValueError, match="NaN or inf"):
        GaussianDenoiser(torch.tensor([float("nan"), 0.0]), torch.eye(2))
    with pytest.raises(ValueError, match=r"covs must have shape \[K, d, d\]"):
        GaussianMixtureDenoiser(torch.ones(2), torch.zeros(2, 3), torch.eye(3))
    with pytest.raises(ValueError, match="non-negative"):
        FiniteSupportDenoiser(torch.eye(2), torch.tensor([1.0, -1.0]))
    with pytest.raises(ValueError, match=r"weights must have shape \(2,\)"):
        FiniteSupportDenoiser(torch.eye(2), torch.ones(3))
    oracle = FiniteSupportDenoiser(torch.eye(2))
    with pytest.raises(ValueError, match=r"x must have shape \[B, 2\]"):
        oracle(torch.zeros(3), torch.zeros(3, 5))
    with pytest.raises(ValueError, match=r"t must have shape \[B\]"):
        oracle(torch.zeros(4), torch.zeros(3, 2))
