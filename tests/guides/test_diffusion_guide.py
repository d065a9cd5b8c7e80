"""DiffusionGuide: exact law through the guide machinery, save/load, protocol and errors."""

from __future__ import annotations

import math

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import scipy.stats as stats
import torch

from pyro_autospec.engine.protocols import MeanOracle
from pyro_autospec.guides.diffusion import DiffusionGuide
from pyro_autospec.infer.continuous import sample_continuous
from pyro_autospec.model import AutoSpecModelError, UnsupportedSiteError
from pyro_autospec.oracles.denoisers import GaussianDenoiser
from tests.catalogue.models import conjugate_model, exact_posterior

P_THRESHOLD = 2e-5
K_SIGMA = 5.0


def chain_moments(times: np.ndarray, mean: np.ndarray, cov: np.ndarray):
    """Exact mean and covariance of X_T / T of the Euler chain with the Gaussian denoiser."""
    d = mean.shape[0]
    m, c = np.zeros(d), np.zeros((d, d))
    for k in range(times.shape[0] - 1):
        t, h = times[k], times[k + 1] - times[k]
        gain = cov @ np.linalg.inv(t * cov + np.eye(d))
        step = np.eye(d) + h * gain
        m = step @ m + h * (mean - t * gain @ mean)
        c = step @ c @ step.T + h * np.eye(d)
    horizon = times[-1]
    return m / horizon, c / horizon**2


@pytest.fixture(scope="module")
def data():
    return torch.tensor([[0.3, -1.0, 0.4], [0.8, -0.6, 0.1], [0.1, -1.2, 0.7], [0.5, -0.9, 0.2]])


@pytest.mark.parametrize("method", ["autospec", "sequential"])
def test_exact_denoiser_through_guide_matches_chain_law(data, method):
    guide = DiffusionGuide(conjugate_model, (data,), hidden_dim=8, num_steps=32, delta=1e-2)
    mean, cov = exact_posterior(data)
    oracle = GaussianDenoiser(mean, cov)
    num = 1500
    out = sample_continuous(guide, num, data, oracle=oracle, method=method, seed=1)
    assert out.samples["loc"].shape == (num, 2) and out.samples["scale"].shape == (num,)
    assert bool((out.samples["scale"] > 0).all())
    # constrained draws mapped back by hand: (loc, log scale) is the chain's state X_T / T
    x = torch.cat([out.samples["loc"], out.samples["scale"].log()[:, None]], 1).double().numpy()
    m, c = chain_moments(guide.times.numpy(), mean.numpy(), cov.numpy())
    for i in range(3):
        p = stats.kstest(x[:, i], "norm", args=(m[i], math.sqrt(c[i, i]))).pvalue
        assert p > P_THRESHOLD, (i, p)
    se = np.sqrt(np.diag(c) / num)
    assert np.all(np.abs(x.mean(0) - m) < K_SIGMA * se)
    se_cov = np.sqrt((np.outer(np.diag(c), np.diag(c)) + c**2) / num)
    assert np.all(np.abs(np.cov(x.T) - c) < K_SIGMA * se_cov)
    assert out.sample_rounds.shape == (num,) and out.oracle_rows >= num
    if method == "sequential":
        assert bool((out.sample_rounds == 32).all())
    assert out.lp.shape == (num,) and torch.isfinite(out.lp).all()
    assert out.pointwise["y_loc"].shape == (num, 4) and out.pointwise["y_log"].shape == (num, 4)


def test_oracle_protocol_shapes_and_untrained_gaussian(data):
    guide = DiffusionGuide(conjugate_model, (data,), hidden_dim=8, num_steps=16)
    oracle = guide.oracle(data)
    assert isinstance(oracle, MeanOracle) and oracle.dim == 3 == guide.dim
    t = torch.tensor([0.0, 0.5, 100.0])
    out = oracle(t, torch.zeros(3, 3))
    assert out.shape == (3, 3) and torch.isfinite(out).all()
    # untrained: the exact denoiser of N(latent_loc, diag latent_scale^2) = N(0, I) here
    x = torch.randn(3, 3)
    torch.testing.assert_close(oracle(t, x), x / (1 + t[:, None]))
    assert guide.times.shape == (17,)


def test_save_load_identical_outputs(data, tmp_path):
    guide = DiffusionGuide(conjugate_model, (data,), hidden_dim=8, num_steps=16)
    guide.fit_simulation(128, num_iterations=10, batch_size=32, seed=0, disable_progbar=True)
    path = tmp_path / "guide.pt"
    guide.save(str(path))
    loaded = DiffusionGuide.load(str(path), conjugate_model, (data,))
    t, x = torch.rand(5) * 10, torch.randn(5, 3)
    assert torch.equal(guide.oracle(data)(t, x), loaded.oracle(data)(t, x))
    first = sample_continuous(guide, 20, data, seed=3)
    second = sample_continuous(loaded, 20, data, seed=3)
    for name in first.samples:
        assert torch.equal(first.samples[name], second.samples[name])
    assert loaded.loss_history == guide.loss_history
    # plain state_dict round trip
    fresh = DiffusionGuide(conjugate_model, (data,), hidden_dim=8, num_steps=16)
    fresh.load_state_dict(guide.state_dict())
    assert torch.equal(fresh.oracle(data)(t, x), guide.oracle(data)(t, x))


def test_fit_to_samples_moves_towards_the_samples(data):
    guide = DiffusionGuide(conjugate_model, (data,), hidden_dim=16, num_steps=16)
    draws = {
        "loc": torch.full((256, 2), 2.0) + 0.1 * torch.randn(256, 2),
        "scale": torch.full((256,), 3.0),
    }
    losses = guide.fit_to_samples(draws, data, num_iterations=200, seed=0, disable_progbar=True)
    assert len(losses) == 200 and guide.loss_history == losses
    out = sample_continuous(guide, 50, data, method="sequential", seed=0, log_joint=False)
    assert abs(out.samples["loc"].mean().item() - 2.0) < 0.2


def test_errors(data):
    def mixed(y):
        z = pyro.sample("z", dist.Bernoulli(0.5))
        loc = pyro.sample("loc", dist.Normal(0.0, 1.0))
        pyro.sample("y", dist.Normal(loc + z, 1.0), obs=y)

    with pytest.raises(UnsupportedSiteError, match="continuous latent sites.*AND discrete"):
        DiffusionGuide(mixed, (torch.tensor(0.0),))

    def discrete_only(y):
        z = pyro.sample("z", dist.Bernoulli(0.5))
        pyro.sample("y", dist.Normal(z, 1.0), obs=y)

    with pytest.raises(UnsupportedSiteError, match="no continuous latent sites"):
        DiffusionGuide(discrete_only, (torch.tensor(0.0),))
    guide = DiffusionGuide(conjugate_model, (data,), hidden_dim=8, num_steps=16)
    with pytest.raises(AutoSpecModelError, match="same shapes"):
        sample_continuous(guide, 5, torch.zeros(7, 3))
    with pytest.raises(TypeError, match="model_kwargs"):
        sample_continuous(guide, 5, data, nonsense=1)
    with pytest.warns(FutureWarning, match=r"pass schedule=Schedule\(rule='block'\)") as caught:
        keywords = sample_continuous(guide, 5, data, seed=0, rule="block", log_joint=False)
    assert {w.filename for w in caught if "schedule knobs" in str(w.message)} == {__file__}
    typed = sample_continuous(guide, 5, data, seed=0, schedule={"rule": "block"}, log_joint=False)
    assert torch.equal(keywords.diffusion.samples, typed.diffusion.samples)
    with pytest.raises(ValueError, match="weighting"):
        guide.fit(torch.zeros(4, 3), torch.zeros(4, 12), weighting="bad")
    with pytest.raises(ValueError, match="expected y"):
        guide.fit(torch.zeros(4, 2), torch.zeros(4, 12))
    with pytest.raises(ValueError, match="dim"):
        sample_continuous(guide, 5, data, oracle=GaussianDenoiser(torch.zeros(2), torch.eye(2)))
