"""AutoSpec(model, guide=DiffusionGuide(...)): the MCMC-like API on continuous latent sites."""

import pytest
import torch

from pyro_autospec import AutoSpec
from pyro_autospec.guides import DiffusionGuide
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
