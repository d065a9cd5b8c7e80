"""Every refusal names the site (or plate), the cause and the way out."""

import pyro
import pyro.distributions as dist
import pytest
import torch

import pyro_autospec.model.enum as enum_module
from pyro_autospec.infer import (
    AutoSpec,
    AutoSpecModelError,
    IntractableEnumerationError,
    SubsamplingError,
    UnsupportedSiteError,
)
from pyro_autospec.model.enum import EnumOracle


def run(model, *args, **kwargs):
    return AutoSpec(model, num_samples=2, disable_progbar=True, **kwargs).run(*args)


def test_subsampled_plate_is_not_blamed_on_pyro_factor():
    def model(y):
        z = pyro.sample("z", dist.Bernoulli(0.5))
        with pyro.plate("data", 10, subsample_size=4) as i:
            pyro.factor("f", 0.1 * z * y[i])

    with pytest.raises(SubsamplingError, match=r"Plate 'data'.*subsample=torch.arange") as info:
        run(model, torch.ones(10))
    assert "factor" not in str(info.value)


def test_sequential_subsampled_plate():
    def model(y):
        z = pyro.sample("z", dist.Bernoulli(0.5))
        for i in pyro.plate("sequences", 6, subsample_size=2):
            pyro.sample(f"y_{i}", dist.Normal(z, 1.0), obs=y[i])

    with pytest.raises(SubsamplingError, match="Plate 'sequences' draws a random subsample"):
        run(model, torch.zeros(6))


def test_non_tree_plates_get_plate_advice():
    def model():
        a, b = pyro.plate("a", 2, dim=-1), pyro.plate("b", 3, dim=-2)
        with a:
            x = pyro.sample("x", dist.Bernoulli(0.5))
        with b:
            y = pyro.sample("y", dist.Bernoulli(0.5))
        with a, b:
            pyro.factor("f", (x == y).float())

    with pytest.raises(IntractableEnumerationError) as info:
        run(model)
    text = str(info.value)
    assert "plates that nest as a tree" in text
    assert "plate 'a' (sites ['x'])" in text and "plate 'b' (sites ['y'])" in text
    assert "control flow" not in text
    assert "AnyOrderGuide" in text and "later release" not in text


def test_intractable_treewidth(monkeypatch):
    def dense():
        sites = [pyro.sample(f"s_{i}", dist.Bernoulli(0.5)) for i in range(6)]
        pyro.factor("all", 0.1 * sum(sites))  # one factor over every site

    monkeypatch.setattr(enum_module, "_MAX_STEP_ENTRIES_PER_ROW", 2**4)
    with pytest.raises(IntractableEnumerationError, match=r"treewidth.*AnyOrderGuide"):
        EnumOracle(dense)


def test_continuous_site_for_enum_oracle():
    def model():
        pyro.sample("z", dist.Bernoulli(0.5))
        pyro.sample("scale", dist.LogNormal(0.0, 1.0))

    with pytest.raises(UnsupportedSiteError, match=r"Site 'scale' is a continuous.*AutoSpec"):
        EnumOracle(model)


def test_only_continuous_sites_without_guide():
    def model():
        pyro.sample("x", dist.Normal(0.0, 1.0))

    with pytest.raises(AutoSpecModelError, match=r"\['x'\] are all continuous.*NUTS"):
        run(model)


def test_diffusion_method_for_discrete_sites():
    def model():
        pyro.sample("z", dist.Bernoulli(0.5))

    with pytest.raises(ValueError, match="method='picard' is for diffusion guides"):
        run(model, method="picard")


def test_value_dependent_control_flow_names_the_site():
    def model():
        z = pyro.sample("z", dist.Bernoulli(0.5))
        w = pyro.sample("w", dist.Bernoulli(0.5))
        loc = z if w.item() == 1 else -z
        pyro.sample("x", dist.Normal(loc, 1.0), obs=torch.tensor(0.0))

    with pytest.raises(AutoSpecModelError, match=r"after site 'w'.*Python control flow"):
        run(model)


def test_observation_outside_the_support_says_so():
    """Pyro puts the real message on the line after its header: it must survive."""

    def model(counts):
        n = pyro.sample("n", dist.Binomial(6, 0.4))
        with pyro.plate("obs_plate", len(counts)):
            pyro.sample("c", dist.Binomial(n, 0.5), obs=counts)

    with pytest.raises(AutoSpecModelError, match=r"within the support\. An observed value"):
        run(model, torch.tensor([2.0, 3.0, 4.0]))


def test_vectorized_markov_is_refused_with_the_fix():
    from pyro.contrib.funsor import vectorized_markov
    from pyro.ops.indexing import Vindex

    y = torch.tensor([0.5, 1.5, -0.2, 0.9])
    stay = torch.tensor([[0.7, 0.3], [0.4, 0.6]])

    def model(y):
        prev = None
        for t in vectorized_markov(name="time", size=len(y), dim=-1):
            probs = torch.tensor([0.5, 0.5]) if prev is None else Vindex(stay)[prev]
            prev = pyro.sample(f"x_{t}", dist.Categorical(probs))
            pyro.sample(f"y_{t}", dist.Normal(prev.float(), 0.5), obs=Vindex(y)[t])

    with pytest.raises(UnsupportedSiteError, match=r"vectorized_markov.*pyro\.markov"):
        run(model, y)
