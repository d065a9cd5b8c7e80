"""summary() and diagnostics() with 1 to 3 draws per chain: statistics that need more draws
are reported as unavailable (NaN, with the reason), never a bare AssertionError from Pyro."""

import math

import pyro
import pyro.distributions as dist
import pytest
import torch

from pyro_autospec.guides import AnyOrderGuide
from pyro_autospec.infer import AutoSpec

DATA = torch.tensor([0.4, -1.1])


def model(y):
    g = pyro.sample("g", dist.Categorical(torch.tensor([0.2, 0.3, 0.5])))
    with pyro.plate("data", 2):
        z = pyro.sample("z", dist.Bernoulli(0.5))
        pyro.sample("y", dist.Normal(z + g.float(), 1.0), obs=y)


@pytest.mark.parametrize("num_samples", [1, 2, 3])
@pytest.mark.parametrize("num_chains", [1, 2])
def test_summary_and_diagnostics_for_few_draws(num_samples, num_chains, capsys):
    fit = AutoSpec(
        model, num_samples=num_samples, num_chains=num_chains, seed=0, disable_progbar=True
    ).run(DATA)
    diag = fit.diagnostics()
    assert math.isnan(float(diag["g"]["n_eff"])) and math.isnan(float(diag["g"]["r_hat"]))
    assert diag["z"]["r_hat"].shape == (2,)
    assert "at least 4 draws per chain" in diag["unavailable"]["r_hat"]
    fit.summary()
    out = capsys.readouterr().out
    assert "g" in out and "z[1]" in out and "nan" in out
    assert "need at least 4 draws per chain" in out
    idata = fit.to_inference_data()
    assert idata.posterior["z"].shape == (num_chains, num_samples, 2)


def test_four_draws_give_numbers():
    fit = AutoSpec(model, num_samples=4, num_chains=2, seed=0, disable_progbar=True).run(DATA)
    diag = fit.diagnostics()
    assert "unavailable" not in diag
    assert diag["z"]["n_eff"].shape == (2,)


def test_guide_run_with_three_draws_reports_khat_unavailable(capsys):
    torch.manual_seed(0)
    guide = AnyOrderGuide(model, (DATA,), hidden_dim=8)
    fit = AutoSpec(
        model, num_samples=3, guide=guide, correction="importance", seed=0, disable_progbar=True
    )
    fit.run(DATA)
    diag = fit.diagnostics()
    assert math.isnan(diag["khat"]["all"])
    fit.summary()
    assert "unavailable: fewer than 5 draws" in capsys.readouterr().out
