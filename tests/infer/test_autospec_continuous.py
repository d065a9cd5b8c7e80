"""AutoSpec(model, guide=DiffusionGuide(...)): the MCMC-like API on continuous latent sites."""

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine

from pyro_autospec import AutoSpec
from pyro_autospec.guides import DiffusionGuide
from pyro_autospec.model.errors import AutoSpecModelError
from tests.catalogue.models import conjugate_model


@pytest.fixture(scope="module")
def data():
    return torch.tensor([[0.3, -1.0, 0.4], [0.8, -0.6, 0.1], [0.1, -1.2, 0.7]])


@pytest.fixture(scope="module")
def autospec(data):
    guide = DiffusionGuide(conjugate_model, (data,), num_steps=64)
    return AutoSpec(
        conjugate_model, num_samples=40, num_chains=2, guide=guide, seed=0, disable_progbar=True
    ).run(data)


def test_samples_shapes_and_extra_fields(autospec):
    samples = autospec.get_samples()
    assert samples["loc"].shape == (80, 2) and samples["scale"].shape == (80,)
    assert (samples["scale"] > 0).all()  # mapped back through biject_to
    grouped = autospec.get_samples(group_by_chain=True)
    assert grouped["loc"].shape == (2, 40, 2)
    extra = autospec.get_extra_fields(group_by_chain=True)
    assert extra["sample_rounds"].shape == (2, 40) and (extra["sample_rounds"] >= 1).all()
    assert torch.isfinite(extra["lp"]).all()


def test_transforms_map_each_site_to_the_unconstrained_space(autospec):
    """As ``pyro.infer.MCMC.transforms``: ``biject_to(support).inv`` of every site."""
    samples = autospec.get_samples()
    transforms = autospec.transforms
    assert set(transforms) == {"loc", "scale"}
    scale = transforms["scale"](samples["scale"])
    torch.testing.assert_close(scale, samples["scale"].log())  # positive support
    assert torch.equal(transforms["loc"](samples["loc"]), samples["loc"])  # real support


def test_summary_diagnostics_and_arviz(autospec, capsys):
    autospec.summary()
    out = capsys.readouterr().out
    assert "loc[0]" in out and "scale" in out and "per draw" in out
    diag = autospec.diagnostics()
    assert "divergences" in diag and "loc" in diag
    idata = autospec.to_inference_data()
    assert set(idata.posterior.data_vars) == {"loc", "scale"}
    assert "sample_rounds" in idata.sample_stats and "y_loc" in idata.log_likelihood


def test_corrections_need_a_density(data):
    guide = DiffusionGuide(conjugate_model, (data,), num_steps=16)
    with pytest.raises(ValueError, match="no tractable density"):
        AutoSpec(conjugate_model, num_samples=4, guide=guide, correction="importance").run(data)


def test_the_model_given_is_the_one_scored_and_checked(data):
    """``AutoSpec(model, guide=g)`` with ``g`` built from another model: lp is the given
    model's, with a warning, and a model whose sites differ from the guide's is refused. The
    guide's own model was scored and checked instead, silently (outside review)."""

    def sharper(y):  # the same sites, another prior and likelihood
        loc = pyro.sample("loc", dist.Normal(torch.full((2,), 3.0), 0.1).to_event(1))
        scale = pyro.sample("scale", dist.LogNormal(1.0, 0.2))
        with pyro.plate("data", y.shape[0]):
            pyro.sample("y_loc", dist.Normal(loc, 0.1).to_event(1), obs=y[:, :2])
            pyro.sample("y_log", dist.Normal(scale.log(), 0.1), obs=y[:, 2])

    def renamed(y):
        mu = pyro.sample("mu", dist.Normal(torch.zeros(2), 1.0).to_event(1))
        scale = pyro.sample("scale", dist.LogNormal(0.0, 1.0))
        with pyro.plate("data", y.shape[0]):
            pyro.sample("y_loc", dist.Normal(mu, 0.5).to_event(1), obs=y[:, :2])
            pyro.sample("y_log", dist.Normal(scale.log(), 0.5), obs=y[:, 2])

    guide = DiffusionGuide(conjugate_model, (data,), num_steps=16)
    with pytest.warns(UserWarning, match="built from another model"):
        fit = AutoSpec(sharper, num_samples=5, guide=guide, seed=0, disable_progbar=True)
        fit.run(data)
    samples, lp = fit.get_samples(), fit.get_extra_fields()["lp"]
    for i in range(5):
        values = {name: samples[name][i] for name in ("loc", "scale")}
        trace = poutine.trace(poutine.condition(sharper, data=values)).get_trace(data)
        assert lp[i].item() == pytest.approx(trace.log_prob_sum().item(), rel=1e-5)
    with pytest.raises(AutoSpecModelError, match="build the guide from this model"):
        AutoSpec(renamed, num_samples=5, guide=guide, seed=0, disable_progbar=True).run(data)
