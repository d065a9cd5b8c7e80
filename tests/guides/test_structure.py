"""What a guide reads from the model: the pairwise expansion, its edges, other data sets."""

import pytest
import torch

from pyro_autospec.guides.structure import probe_potentials, probe_structure
from pyro_autospec.model import discover_sites, enumerate_posterior, log_joint
from tests.catalogue.guide_models import ising_cycle, mixed_sites, potts_triangle

CYCLE_DATA = torch.tensor([0.4, -1.0, 0.3, 1.2, -0.2, 0.8])
POTTS_DATA = torch.tensor([0.2, 1.7, 0.9])


def _expansion_error(model, args):
    layout = discover_sites(model, args)
    structure = probe_structure(model, args, {}, layout)
    states, _ = enumerate_posterior(model, args, layout=layout)
    exact = log_joint(model, args, {}, layout, layout.from_coords(states))
    return structure, float((structure.log_prob(states) - exact).abs().max())


def test_pairwise_models_are_expanded_exactly():
    structure, error = _expansion_error(ising_cycle, (CYCLE_DATA,))
    assert error < 1e-4
    ring = sorted(tuple(sorted((i, (i + 1) % 6))) for i in range(6))
    assert sorted(map(tuple, structure.edges.tolist())) == ring
    # Centred: every pairwise potential has zero row and column means (spin gauge).
    assert torch.allclose(
        structure.pairwise.mean(-1), torch.zeros(6, 2, dtype=torch.float64), atol=1e-6
    )
    assert torch.allclose(
        structure.pairwise.mean(-2), torch.zeros(6, 2, dtype=torch.float64), atol=1e-6
    )


def test_mixed_supports_and_three_values():
    structure, error = _expansion_error(potts_triangle, (POTTS_DATA,))
    assert error < 1e-4
    assert sorted(map(tuple, structure.edges.tolist())) == [(0, 1), (0, 2), (0, 3), (1, 2)]
    # The Bernoulli site has no value 2: -inf there, and no pairwise mass on it.
    assert structure.unary[3, 2] == -float("inf")
    assert torch.isfinite(structure.unary[:3]).all()
    edge = structure.edges.tolist().index([0, 3])
    assert bool((structure.pairwise[edge, :, 2] == 0).all())


def test_independent_sites_have_no_edges():
    layout = discover_sites(mixed_sites)
    structure = probe_structure(mixed_sites, (), {}, layout)
    assert structure.num_edges == 0


def test_known_edges_skip_the_search_and_bad_edges_are_refused():
    layout = discover_sites(ising_cycle, (CYCLE_DATA,))
    full = probe_structure(ising_cycle, (CYCLE_DATA,), {}, layout)
    given = probe_structure(ising_cycle, (CYCLE_DATA,), {}, layout, edges=full.edges.flip(1))
    assert torch.equal(given.edges, full.edges)
    assert torch.allclose(given.pairwise, full.pairwise) and torch.allclose(given.unary, full.unary)
    with pytest.raises(ValueError, match="max_probes"):
        probe_structure(ising_cycle, (CYCLE_DATA,), {}, layout, max_probes=10)
    for bad, match in (([[0, 0]], "different"), ([[0, 9]], "index"), ([0, 1], "LongTensor")):
        with pytest.raises(ValueError, match=match):
            probe_structure(ising_cycle, (CYCLE_DATA,), {}, layout, edges=torch.tensor(bad))


def test_potentials_of_other_data_sets_equal_a_fresh_probe():
    layout = discover_sites(ising_cycle, (CYCLE_DATA,))
    structure = probe_structure(ising_cycle, (CYCLE_DATA,), {}, layout)
    others = torch.stack([-CYCLE_DATA, CYCLE_DATA.flip(0), torch.zeros(6)])
    unary, pairwise = probe_potentials(
        ising_cycle, (CYCLE_DATA,), {}, layout, structure, {"y": others}
    )
    assert unary.shape == (3, 6, 2) and pairwise.shape == (3, 6, 2, 2)
    for k in range(3):
        fresh = probe_structure(ising_cycle, (others[k],), {}, layout, edges=structure.edges)
        assert torch.allclose(unary[k], fresh.unary, atol=1e-5)
        assert torch.allclose(pairwise[k], fresh.pairwise, atol=1e-5)
    own_unary, _ = probe_potentials(ising_cycle, (CYCLE_DATA,), {}, layout, structure)
    assert torch.allclose(own_unary[0], structure.unary, atol=1e-6)
