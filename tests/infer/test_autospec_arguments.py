"""Argument checks of AutoSpec that are easy to get wrong."""

import pyro
import pyro.distributions as dist
import pytest

from pyro_autospec import AutoSpec


def model():
    pyro.sample("z", dist.Bernoulli(0.5))


@pytest.mark.parametrize("correction", [None, "importance"])
def test_warmup_only_with_imh(correction):
    with pytest.raises(ValueError, match="warmup_steps only applies"):
        AutoSpec(model, num_samples=10, warmup_steps=5, correction=correction)
    AutoSpec(model, num_samples=10, warmup_steps=5, correction="imh")


def test_method_list_is_consistent():
    with pytest.raises(ValueError, match="speculative"):
        AutoSpec(model, num_samples=10, method="gibbs")
