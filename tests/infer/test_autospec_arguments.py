"""Argument checks of AutoSpec that are easy to get wrong."""

import pyro
import pyro.distributions as dist
import pytest

from pyro_autospec import AutoSpec


def model():
    pyro.sample("z", dist.Bernoulli(0.5))


def test_warmup_only_with_imh_or_continuous_sites():
    """A discrete model's exact draws need no warm-up: the run says so (the model's kind is
    known only then; models with continuous sites use warmup_steps for NUTS)."""
    with pytest.raises(ValueError, match="warmup_steps applies to models with continuous"):
        AutoSpec(model, num_samples=10, warmup_steps=5, disable_progbar=True).run()
    AutoSpec(model, num_samples=10, warmup_steps=5, correction="imh")


def test_bad_device_and_schedule_knob():
    with pytest.raises(ValueError, match="device must name a torch device"):
        AutoSpec(model, num_samples=2, device="gpu please")
    with pytest.raises(TypeError, match="schedule knobs"):
        AutoSpec(model, num_samples=2, devcie="cpu")


def test_method_list_is_consistent():
    with pytest.raises(ValueError, match="speculative"):
        AutoSpec(model, num_samples=10, method="gibbs")


@pytest.mark.parametrize("bad", [-1, 0, 2.5, True])
def test_get_samples_num_samples_is_checked(bad):
    def coin():
        pyro.sample("x", dist.Bernoulli(0.3))

    fit = AutoSpec(coin, num_samples=10, seed=0, disable_progbar=True).run()
    with pytest.raises(ValueError, match="positive int"):
        fit.get_samples(num_samples=bad)
    assert fit.get_samples(num_samples=3)["x"].shape == (3,)
