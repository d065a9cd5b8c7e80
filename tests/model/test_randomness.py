"""Random numbers a model draws while it is evaluated on given values: what is allowed, and
what the draws' evaluation does with it (the refusals: tests/infer/test_teaching_refusals.py)."""

import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine
from torch.distributions import constraints

from pyro_autospec import AutoSpec
from pyro_autospec.model import SharedNumbersWarning
from pyro_autospec.model.log_joint import evaluate


def test_noise_the_draws_of_a_batch_share_is_drawn_again_for_every_draw():
    """``torch.randn(())`` is one number for a whole batch of draws: every draw's
    ``pyro.deterministic`` value got the same noise. Such sites are evaluated one draw at a
    time, with a warning; noise drawn with the sites' shape keeps the batch, and silence."""

    def shared(y):
        z = pyro.sample("z", dist.Bernoulli(0.3))
        pyro.deterministic("pred", z + torch.randn(()))
        pyro.deterministic("twice", 2 * z)
        pyro.sample("y", dist.Normal(2.0 * z, 1.0), obs=y)

    def own(y):
        z = pyro.sample("z", dist.Bernoulli(0.3))
        pyro.deterministic("pred", z + torch.randn(z.shape))
        pyro.sample("y", dist.Normal(2.0 * z, 1.0), obs=y)

    y = torch.tensor(1.0)
    with pytest.warns(SharedNumbersWarning, match=r"\['pred'\] read random numbers"):
        fit = AutoSpec(shared, 300, seed=0, disable_progbar=True).run(y)
    samples = fit.get_samples()
    assert (samples["pred"] - samples["z"]).unique().numel() == 300
    assert torch.equal(samples["twice"], 2 * samples["z"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        samples = AutoSpec(own, 300, seed=0, disable_progbar=True).run(y).get_samples()
    assert (samples["pred"] - samples["z"]).unique().numel() == 300


def test_shared_noise_is_found_where_the_first_draw_hides_it():
    """An outside review: ``z * torch.randn(())`` is 0 for a first draw with ``z = 0``, and
    the probe looked at the first draw only; it now probes the draws the mixing check picks."""

    def model():
        z = pyro.sample("z", dist.Bernoulli(0.5))
        pyro.deterministic("pred", z * torch.randn(()))

    values = {"z": torch.tensor([0.0, 1.0, 1.0, 1.0])}
    with pytest.warns(SharedNumbersWarning):
        out = evaluate(model, (), {}, values, {"z": ((), ())}, 0, deterministic_shapes={"pred": ()})
    assert out.deterministic["pred"][1:].unique().numel() == 3


def test_sites_that_read_one_another_stay_consistent_and_own_noise_passes():
    """An outside review: ``y_rep`` reads ``mu_rep`` (shared noise) and adds noise of each
    draw's own; re-drawing ``mu_rep`` alone made ``y_rep - mu_rep`` of variance 2, not 1. All
    deterministic sites are evaluated again together. A coin of each draw's own
    (``torch.randint(0, 2, z.shape)``) is not taken for a shared one."""

    def model(y):
        z = pyro.sample("z", dist.Bernoulli(0.5))
        pyro.sample("y", dist.Normal(z, 1.0), obs=y)
        mu_rep = pyro.deterministic("mu_rep", z + torch.randn(()))
        pyro.deterministic("y_rep", mu_rep + torch.randn(z.shape))

    def coin(y):
        z = pyro.sample("z", dist.Bernoulli(0.5))
        pyro.sample("y", dist.Normal(z, 1.0), obs=y)
        pyro.deterministic("flip", z + torch.randint(0, 2, z.shape))

    torch.manual_seed(0)
    with pytest.warns(SharedNumbersWarning, match="mu_rep"):
        samples = AutoSpec(model, 2000, seed=0, disable_progbar=True).run(torch.tensor(0.5))
    samples = samples.get_samples()
    assert 0.85 < float((samples["y_rep"] - samples["mu_rep"]).var()) < 1.15
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        AutoSpec(coin, 2000, seed=0, disable_progbar=True).run(torch.tensor(0.5))


def test_a_deterministic_sites_noise_is_drawn_for_every_draw():
    """An outside test: the draws' evaluation scores each distinct assignment once, since the
    model is deterministic given it; a posterior predictive whose noise sits in a
    ``pyro.deterministic`` site (allowed: no scored site reads it) got one noise value per
    distinct assignment, shared by every draw of it. Such a model is evaluated draw by draw."""

    def model(y):
        with pyro.plate("d", 3):
            z = pyro.sample("z", dist.Bernoulli(0.5))
            mu = 2.0 * z
            pyro.sample("y", dist.Normal(mu, 1.0), obs=y)
            pyro.deterministic("y_rep", dist.Normal(mu, 1.0).sample())

    fit = AutoSpec(model, 2000, seed=0, disable_progbar=True).run(torch.tensor([0.0, 2.0, 1.0]))
    samples = fit.get_samples()
    assert samples["z"].unique(dim=0).shape[0] <= 8  # few assignments, many draws
    assert samples["y_rep"].unique(dim=0).shape[0] == 2000  # noise of its own in every draw
    noise = samples["y_rep"] - 2.0 * samples["z"]
    assert torch.allclose(noise.std(0), torch.ones(3), atol=0.1)


def test_an_initial_value_hidden_with_the_param_statement_is_allowed():
    """An outside test: ``pyro.param(name, torch.rand(...))`` inside
    ``poutine.block(hide_types=["param"])`` hid the param statement from the watch, which then
    blamed the next sample site for the number drawn. Every statement reaches Pyro's default
    behaviour, hidden or not, and the watch reads them there."""

    def model(y):
        with poutine.block(hide_types=["param"]):
            probs = pyro.param("probs_blocked", torch.rand(2), constraint=constraints.simplex)
        z = pyro.sample("z", dist.Categorical(probs))
        pyro.sample("y", dist.Normal(z.double(), 1.0), obs=y)

    pyro.clear_param_store()
    pyro.param("probs_blocked", torch.tensor([0.25, 0.75]), constraint=constraints.simplex)
    try:
        y = torch.tensor(0.4, dtype=torch.float64)
        values = {"z": torch.tensor([0, 1, 1])}
        joint = evaluate(model, (y,), {}, values, {"z": ((), ())}, 0)
        assert joint.random  # the initial value was drawn, and is harmless
        want = torch.tensor([0.25, 0.75, 0.75]).log().double()
        want += dist.Normal(values["z"].double(), 1.0).log_prob(y)
        torch.testing.assert_close(joint.total, want)
    finally:
        pyro.clear_param_store()
