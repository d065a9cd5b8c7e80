"""SBC, and a guide trained by simulation on a conjugate model (moments and calibration).

Tolerances (k = 5 standard errors). The guide's posterior mean is a regression on ``D`` data
features fitted from ``M`` simulations, so its error has standard error about
``sd_post * sqrt(D / M)``; the draws add ``sd_post / sqrt(n)``. Its variance is compared with
relative standard error ``sqrt(2 / n + 2 D / M)``. The reference is the exact discretized
chain with the exact denoiser (posterior variance plus about ``delta``).
"""

from __future__ import annotations

import math

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch

from pyro_autospec.diagnostics.sbc import plot_sbc_ranks, rank_uniformity_pvalue, sbc
from pyro_autospec.guides.diffusion import DiffusionGuide
from pyro_autospec.infer.continuous import sample_continuous

P_THRESHOLD = 2e-5
K_SIGMA = 5.0
OBS_SD = 0.5
NUM_SIMULATIONS = 4000
DATA = torch.tensor([[0.3, -1.0, 0.4], [0.8, -0.6, 0.1], [0.1, -1.2, 0.7], [0.5, -0.9, 0.2]])


def model(y):
    loc = pyro.sample("loc", dist.Normal(torch.zeros(2), 1.0).to_event(1))
    scale = pyro.sample("scale", dist.LogNormal(0.0, 1.0))
    with pyro.plate("data", y.shape[0]):
        pyro.sample("y_loc", dist.Normal(loc, OBS_SD).to_event(1), obs=y[:, :2])
        pyro.sample("y_log", dist.Normal(scale.log(), OBS_SD), obs=y[:, 2])


@pytest.fixture(scope="module")
def trained():
    torch.set_num_threads(1)
    guide = DiffusionGuide(model, (DATA,), hidden_dim=32, num_steps=64, delta=1e-3)
    guide.fit_simulation(
        NUM_SIMULATIONS, num_iterations=2000, lr=1e-2, seed=0, disable_progbar=True
    )
    return guide


def test_trained_guide_posterior_moments(trained):
    num = 1000
    out = sample_continuous(trained, num, DATA, method="sequential", seed=0, log_joint=False)
    x = out.unconstrained.double().numpy()  # (loc, log scale)
    precision = 1.0 + DATA.shape[0] / OBS_SD**2
    mean = DATA.double().sum(0).numpy() / OBS_SD**2 / precision
    var = 1.0 / precision + 1e-3  # + delta: X_T / T adds N(0, 1 / T)
    features = trained.layout.data_dim
    se_mean = math.sqrt(var / num + var * features / NUM_SIMULATIONS)
    assert np.all(np.abs(x.mean(0) - mean) < K_SIGMA * se_mean), (x.mean(0), mean, se_mean)
    rel = math.sqrt(2 / num + 2 * features / NUM_SIMULATIONS)
    assert np.all(np.abs(x.var(0) / var - 1) < K_SIGMA * rel), (x.var(0), var, rel)


def test_trained_guide_passes_sbc(trained):
    result = sbc(model, trained, 300, num_posterior_samples=49, seed=1, disable_progbar=True)
    assert result.ranks["loc"].shape == (300, 2) and result.ranks["scale"].shape == (300,)
    assert int(result.ranks["loc"].max()) <= 49 and int(result.ranks["loc"].min()) >= 0
    assert result.pvalue > P_THRESHOLD, result
    axes = result.plot()
    assert len(axes) == 3


def test_sbc_detects_an_overconfident_guide():
    guide = DiffusionGuide(model, (DATA,), hidden_dim=8, num_steps=32)
    # untrained: the prior's Gaussian (calibrated); shrink it to half the prior's sd
    guide.latent_scale.fill_(0.5)
    result = sbc(model, guide, 300, num_posterior_samples=49, seed=0, disable_progbar=True)
    assert result.pvalue < 1e-6
    assert not result.passed()


def test_rank_uniformity_pvalue_and_thin_bins():
    rng = np.random.default_rng(0)
    assert rank_uniformity_pvalue(rng.integers(0, 50, 600), 49, 10) > P_THRESHOLD
    assert rank_uniformity_pvalue(np.zeros(600, dtype=int), 49, 10) < 1e-10
    assert math.isnan(rank_uniformity_pvalue(rng.integers(0, 50, 20), 49, 10))


def test_plot_accepts_axes():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    guide = DiffusionGuide(model, (DATA,), hidden_dim=8, num_steps=16)
    result = sbc(model, guide, 40, num_posterior_samples=9, seed=0, disable_progbar=True)
    _, axes = plt.subplots(1, 3)
    assert len(plot_sbc_ranks(result, axes=axes)) == 3
    plt.close("all")


def test_a_guide_of_discrete_sites_is_told_what_checks_it():
    """An outside test: an AnyOrderGuide got an error about the model's continuous sites."""

    class DiscreteGuide:
        num_coords, num_values = 3, 2

    with pytest.raises(TypeError, match="sbc calibrates a DiffusionGuide.*got DiscreteGuide"):
        sbc(lambda: None, DiscreteGuide(), 4)
