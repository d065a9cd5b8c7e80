"""Reading a model forward: simulations, its factor sites, the log joint with per-draw data."""

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine

from pyro_autospec.model import discover_sites, log_joint
from pyro_autospec.model.simulation import factor_sites, joint_log_prob, simulate_discrete
from pyro_autospec.model.tracing import DRAWS_PLATE, simulate_trace
from tests.catalogue.guide_models import generative_pairs, ising_cycle

CYCLE_DATA = torch.tensor([0.4, -1.0, 0.3, 1.2, -0.2, 0.8])


def test_joint_log_prob_with_per_draw_data():
    layout = discover_sites(ising_cycle, (CYCLE_DATA,))
    coords = torch.randint(0, 2, (5, 6))
    data = torch.randn(5, 6)
    batched = joint_log_prob(ising_cycle, (CYCLE_DATA,), {}, layout, coords, {"y": data})
    for k in range(5):
        alone = log_joint(
            ising_cycle, (data[k],), {}, layout, layout.from_coords(coords[k : k + 1])
        )
        assert torch.allclose(batched[k], alone[0], atol=1e-4)
    with pytest.raises(ValueError, match="not observed"):
        joint_log_prob(ising_cycle, (CYCLE_DATA,), {}, layout, coords, {"z": data})


def test_simulation_and_factor_sites():
    data = torch.zeros(5)
    layout = discover_sites(generative_pairs, (data,))
    coords, observed = simulate_discrete(generative_pairs, (data,), {}, layout, 4000, seed=0)
    assert coords.shape == (4000, 5) and observed["y"].shape == (4000, 5)
    # z1 follows z0 with probability 0.85; y is centred on 2 z - 1.
    agree = (coords[:, 1] == coords[:, 0]).double().mean()
    assert abs(float(agree) - 0.85) < 5 * (0.85 * 0.15 / 4000) ** 0.5
    residual = observed["y"] - (2.0 * coords - 1.0)
    assert abs(float(residual.std()) - 0.7) < 0.02
    again, _ = simulate_discrete(generative_pairs, (data,), {}, layout, 4000, seed=0)
    assert torch.equal(coords, again)
    assert factor_sites(generative_pairs, (data,)) == []
    assert factor_sites(ising_cycle, (CYCLE_DATA,)) == ["coupling"]


def _plated(y):
    z = pyro.sample("z", dist.Bernoulli(0.5))
    with pyro.plate("data", 3, subsample_size=3):
        pyro.sample("y", dist.Normal(10.0 * z, 0.1), obs=y)


def test_simulate_trace_samples_observed_sites_over_a_plate_of_draws():
    data = torch.full((3,), -100.0)
    with poutine.trace() as outer:
        torch.manual_seed(0)
        trace = simulate_trace(_plated, (data,), None, 7, max_plate_nesting=1)
    assert not outer.trace.nodes  # traced inside poutine.block: nothing leaks out
    assert DRAWS_PLATE in {f.name for f in trace.nodes["z"]["cond_indep_stack"]}
    assert "data" not in trace.nodes  # the plate's subsample site is pruned
    z, y = trace.nodes["z"]["value"], trace.nodes["y"]["value"]
    assert z.shape == (7, 1) and y.shape == (7, 3)
    assert (y - 10.0 * z).abs().max() < 1.0  # y simulated from z, the data in args ignored
    torch.manual_seed(0)
    again = simulate_trace(_plated, (data,), {}, 7, max_plate_nesting=1)
    assert torch.equal(again.nodes["y"]["value"], y)  # the caller's RNG decides the draws
