"""The guard over the model's runs under enumeration: it limits the combinations of enumerated
values one tensor spans, not the model's own dims (plates, event dims, data)."""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import pytest
import torch

import pyro_autospec.model.enum as enum_module
from pyro_autospec import AutoSpec
from pyro_autospec.model.errors import IntractableEnumerationError
from pyro_autospec.model.tracing import EntriesGuard, TensorTooLarge


def test_operands_that_would_span_too_many_combinations_are_refused_before_the_call():
    a, b = torch.zeros(40, 1, 1, 3), torch.zeros(1, 50, 1, 3)
    for call in (
        lambda: a + b,
        lambda: torch.add(input=a, other=b),  # keywords
        lambda: torch.where(a > 0, a, b),  # three operands
        lambda: torch.einsum("...,...->...", a, b),
    ):
        guard = EntriesGuard(limit=1000, plate_dims=2)
        with pytest.raises(TensorTooLarge), guard:
            call()
        assert guard.refused == (40, 50, 1, 3)


def test_the_models_own_dims_are_not_limited():
    """Plates, event dims and large tensors the enumeration does not reach pass whatever their
    size; so does a matrix product whose operands do not broadcast into a large shape."""
    with EntriesGuard(limit=1000, plate_dims=2):
        assert (torch.zeros(4, 1, 1000, 20) * torch.ones(1, 1, 1000, 20)).shape[0] == 4
        assert (torch.ones(300, 300) @ torch.ones(300)).shape == (300,)
        assert torch.ones(1, 5000, 5000).sum() == 25_000_000


@pytest.fixture
def small_limit(monkeypatch):
    monkeypatch.setattr(enum_module, "_MAX_STEP_ENTRIES_PER_ROW", 1024)


def test_a_model_with_a_large_plate_and_event_dims_runs_under_a_small_limit(small_limit):
    """A global site of 4 values over 500 observations of 20 dims each spans 4 combinations
    in a tensor of 40,000 entries: sampled, not refused (an earlier guard counted entries)."""

    locs = torch.tensor([-1.0, 0.0, 1.0, 2.0])

    def model(y):
        z = pyro.sample("z", dist.Categorical(torch.ones(4) / 4))
        with pyro.plate("data", y.shape[0]):
            pyro.sample("y", dist.Normal(locs[z].unsqueeze(-1), torch.ones(20)).to_event(1), obs=y)

    fit = AutoSpec(model, num_samples=4, seed=0, disable_progbar=True)
    fit.run(torch.ones(500, 20))
    assert (fit.get_samples()["z"] == 2).all()  # the data sit at loc 1


def test_a_term_over_coupled_sites_is_refused_under_a_small_limit(small_limit):
    def model(y):
        zs = [pyro.sample(f"z{i}", dist.Bernoulli(0.5)) for i in range(12)]
        pyro.sample("y", dist.Normal(sum(zs), 1.0), obs=y)

    with pytest.raises(
        IntractableEnumerationError, match=r"spans 2\.05e\+03 combinations.*the limit is 2\^10\)"
    ):
        AutoSpec(model, num_samples=2, seed=0, disable_progbar=True).run(torch.tensor(3.0))
