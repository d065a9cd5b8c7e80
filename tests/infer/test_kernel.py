"""AutoSpecKernel inside pyro.infer.MCMC, and az.from_pyro on it."""

import arviz as az
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC

from pyro_autospec.infer import AutoSpecKernel

DATA = torch.tensor([0.3, 1.8, 2.4])


def model(y):
    g = pyro.sample("g", dist.Categorical(torch.tensor([0.3, 0.3, 0.4])))
    with pyro.plate("data", len(y)):
        z = pyro.sample("z", dist.Bernoulli(0.5))
        pyro.sample("y", dist.Normal(z + g.float(), 0.8), obs=y)


def test_mcmc_driver_and_from_pyro():
    kernel = AutoSpecKernel(model, seed=0, draws_per_run=16)
    mcmc = MCMC(kernel, num_samples=30, warmup_steps=0, num_chains=1, disable_progbar=True)
    mcmc.run(DATA)
    samples = mcmc.get_samples()
    assert samples["g"].shape == (30,) and samples["z"].shape == (30, 3)
    assert samples["g"].is_floating_point()  # MCMC stores one float vector per draw
    assert set(samples["g"].tolist()) <= {0.0, 1.0, 2.0}
    diag = mcmc.diagnostics()
    assert diag["divergences"] == {"chain 0": []}
    assert diag["rounds"]["chain 0"] > 0
    mcmc.summary()
    idata = az.from_pyro(mcmc)
    assert idata.posterior["z"].shape == (1, 30, 3)
    assert not idata.sample_stats["diverging"].values.any()


@pytest.mark.filterwarnings("ignore:num_chains=2 is more than available_cpu")
def test_two_chains_differ():
    kernel = AutoSpecKernel(model, seed=1, draws_per_run=8)
    mcmc = MCMC(kernel, num_samples=20, warmup_steps=2, num_chains=2, disable_progbar=True)
    mcmc.run(DATA)
    grouped = mcmc.get_samples(group_by_chain=True)
    assert grouped["z"].shape == (2, 20, 3)
    assert not torch.equal(grouped["z"][0], grouped["z"][1])
