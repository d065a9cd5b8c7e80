"""The ArviZ log likelihood with the discrete sites summed out per observation (issue 32):
``az.loo`` on it equals ``az.loo`` on a brute-force marginal, ``logsumexp_k``."""

import logging

import arviz as az
import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.ops.indexing import Vindex
from scipy.special import logsumexp
from scipy.stats import norm

from pyro_autospec.infer import AutoSpec

DATA = torch.tensor([-2.1, -1.7, -2.4, -1.9, 0.1, 2.2, 1.8, 2.5, 2.0, 1.6, -2.2, 2.3])


def mixture(data):
    weights = pyro.sample("weights", dist.Dirichlet(torch.ones(2)))
    locs = pyro.sample("locs", dist.Normal(0.0, 3.0).expand([2]).to_event(1))
    with pyro.plate("data", len(data)):
        z = pyro.sample("z", dist.Categorical(weights))
        pyro.sample("obs", dist.Normal(Vindex(locs)[..., z], 0.7), obs=data)


@pytest.fixture(scope="module")
def fit():
    return AutoSpec(mixture, num_samples=60, warmup_steps=60, seed=2, disable_progbar=True).run(
        DATA
    )


def brute_force(samples):
    """``log sum_k w_k N(y_i; mu_k, 0.7)`` for every draw, by hand: [chain, draw, N]."""
    w = samples["weights"].double().numpy()[..., None, :]  # [C, S, 1, K]
    mu = samples["locs"].double().numpy()[..., None, :]
    y = DATA.double().numpy()[:, None]  # [N, 1]
    return logsumexp(np.log(w) + norm.logpdf(y, mu, 0.7), axis=-1)


def test_marginal_log_likelihood_is_the_default_and_equals_brute_force(fit):
    idata = fit.to_inference_data()
    assert idata.log_likelihood.attrs["log_likelihood_form"] == "marginal"
    marginal = idata.log_likelihood["obs"].values
    exact = brute_force(fit.get_samples(group_by_chain=True))
    np.testing.assert_allclose(marginal, exact, atol=1e-4)
    by_hand = az.from_dict(
        posterior={"locs": fit.get_samples(group_by_chain=True)["locs"].numpy()},
        log_likelihood={"obs": exact},
    )
    loo, reference = az.loo(idata), az.loo(by_hand)
    assert abs(loo.elpd_loo - reference.elpd_loo) < 1e-3
    assert abs(loo.p_loo - reference.p_loo) < 1e-3
    assert loo.p_loo < 6  # weights and locs: about 3 parameters


def test_conditional_form_on_request(fit):
    idata = fit.to_inference_data(log_likelihood="conditional")
    assert idata.log_likelihood.attrs["log_likelihood_form"] == "conditional"
    samples = fit.get_samples(group_by_chain=True)
    chosen = samples["locs"].double().gather(-1, samples["z"])
    direct = dist.Normal(chosen, 0.7).log_prob(DATA.double())
    np.testing.assert_allclose(idata.log_likelihood["obs"].values, direct.numpy(), atol=1e-5)
    assert not np.allclose(idata.log_likelihood["obs"].values, brute_force(samples), atol=1e-2)


def shared_switch(y):
    switch = pyro.sample("switch", dist.Bernoulli(0.5))
    with pyro.plate("data", len(y)):
        pyro.sample("y", dist.Normal(2.0 * switch, 1.0), obs=y)


def test_marginal_refused_with_the_reason_and_auto_says_which_form(caplog):
    fit = AutoSpec(shared_switch, num_samples=4, seed=0, disable_progbar=True).run(DATA[:3])
    with pytest.raises(ValueError, match=r"'switch' is shared by several elements of .*'y'"):
        fit.to_inference_data(log_likelihood="marginal")
    with caplog.at_level(logging.INFO, logger="pyro_autospec"):
        idata = fit.to_inference_data()
    assert "conditional on each draw's sampled discrete" in caplog.text
    assert idata.log_likelihood.attrs["log_likelihood_form"] == "conditional"
    assert "'switch' is shared" in idata.log_likelihood.attrs["log_likelihood_reason"]
    asked = fit.to_inference_data(log_likelihood="conditional")
    assert "log_likelihood_reason" not in asked.log_likelihood.attrs  # asked for, no reason
    with pytest.raises(ValueError, match="log_likelihood must be"):
        fit.to_inference_data(log_likelihood="pointwise")


def test_discrete_only_marginal_sums_the_local_sites_out():
    def local(y):
        with pyro.plate("data", len(y)):
            z = pyro.sample("z", dist.Bernoulli(0.3))
            pyro.sample("y", dist.Normal(2.0 * z, 1.0), obs=y)

    fit = AutoSpec(local, num_samples=5, num_chains=2, seed=0, disable_progbar=True)
    idata = fit.run(DATA[:4]).to_inference_data()
    y = DATA[:4].double().numpy()
    exact = np.logaddexp(np.log(0.7) + norm.logpdf(y, 0, 1), np.log(0.3) + norm.logpdf(y, 2, 1))
    np.testing.assert_allclose(
        idata.log_likelihood["y"].values, np.broadcast_to(exact, (2, 5, 4)), atol=1e-5
    )


MASK = torch.tensor([True, False, True, False])


def masked_by_handler(y):
    with pyro.plate("data", len(y)):
        z = pyro.sample("z", dist.Bernoulli(0.3))
        with pyro.poutine.mask(mask=MASK):
            pyro.sample("y", dist.Normal(2.0 * z, 1.0), obs=y)


def masked_by_distribution(y):
    with pyro.plate("data", len(y)):
        z = pyro.sample("z", dist.Bernoulli(0.3))
        pyro.sample("y", dist.Normal(2.0 * z, 1.0).mask(MASK), obs=y)


@pytest.mark.parametrize("model", [masked_by_handler, masked_by_distribution])
def test_masked_elements_are_exactly_zero_in_the_marginal_log_likelihood(model):
    """A masked element is 0 in Pyro's masked log densities; summing ``z_i`` out of it gave
    ``log sum_z p(z_i)`` in float32's rounding (about -2e-8) instead."""
    fit = AutoSpec(model, num_samples=3, seed=0, disable_progbar=True).run(DATA[:4])
    marginal = fit.to_inference_data().log_likelihood["y"].values
    conditional = fit.to_inference_data(log_likelihood="conditional").log_likelihood["y"].values
    for values in (marginal, conditional):
        assert np.all(values[..., ~MASK.numpy()] == 0.0)
    y = DATA[:4].double().numpy()
    exact = np.logaddexp(np.log(0.7) + norm.logpdf(y, 0, 1), np.log(0.3) + norm.logpdf(y, 2, 1))
    np.testing.assert_allclose(marginal[..., MASK.numpy()], np.broadcast_to(exact[::2], (1, 3, 2)))
