"""The guide bodies: belief propagation is exact on trees, ball queries equal full queries,
the binary fast path equals the general one, a chain query equals its rows."""

import pytest
import torch

from pyro_autospec.guides import AnyOrderGuide
from pyro_autospec.model import enumerate_posterior
from tests.catalogue.guide_models import ising_chain, ising_cycle, potts_triangle

CHAIN_DATA = torch.tensor([1.0, 0.5, -0.3, -1.0, 0.2, 0.8, -0.6])
CYCLE_DATA = torch.tensor([0.4, -1.0, 0.3, 1.2, -0.2, 0.8])
POTTS_DATA = torch.tensor([0.2, 1.7, 0.9])


def _perturb(guide, scale=0.5, seed=0):
    """Random weights everywhere, the zero-initialised output layer included."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in guide.parameters():
            param.copy_(torch.randn(param.shape, generator=gen) * scale)
    return guide


def _exact_conditionals(states, log_post, values, mask):
    """p(x_i = v | x_S) by summing the enumerated posterior: [B, n, q]."""
    q = int(states.max()) + 1
    out = torch.zeros(values.shape + (q,), dtype=torch.float64)
    for b in range(values.shape[0]):
        agree = (states[:, mask[b]] == values[b, mask[b]]).all(-1)
        p = log_post.exp() * agree
        for v in range(q):
            out[b, :, v] = (p[:, None] * (states == v)).sum(0)
        out[b] /= out[b].sum(-1, keepdim=True)
    return out


def test_untrained_graph_guide_is_exact_on_a_chain():
    # Belief propagation is exact on a tree once it has run as many sweeps as the diameter.
    guide = AnyOrderGuide(ising_chain, (CHAIN_DATA,), bp_iterations=7)
    states, log_post = enumerate_posterior(ising_chain, (CHAIN_DATA,))
    gen = torch.Generator().manual_seed(1)
    values = torch.randint(0, 2, (40, 7), generator=gen)
    mask = torch.rand(40, 7, generator=gen) < 0.4
    exact = _exact_conditionals(states, log_post, values, mask)
    rows = guide.log_marginals(values, mask).double().exp()
    free = ~mask  # rows of pinned coordinates are ignored by the engine
    assert float((rows - exact)[free].abs().max()) < 1e-5


def test_belief_propagation_is_not_exact_on_a_loop():
    # The ring is the case the learned correction exists for.
    guide = AnyOrderGuide(ising_cycle, (CYCLE_DATA,), bp_iterations=10)
    states, log_post = enumerate_posterior(ising_cycle, (CYCLE_DATA,))
    empty = torch.zeros(1, 6, dtype=torch.long)
    exact = _exact_conditionals(states, log_post, empty, empty.bool())
    rows = guide.log_marginals(empty, empty.bool()).double().exp()
    assert float((rows - exact).abs().max()) > 0.01


@pytest.mark.parametrize("num_layers", [0, 1, 2])
@pytest.mark.parametrize("model,data", [(ising_cycle, CYCLE_DATA), (potts_triangle, POTTS_DATA)])
def test_ball_queries_equal_full_queries(model, data, num_layers):
    guide = _perturb(AnyOrderGuide(model, (data,), num_layers=num_layers, bp_iterations=1))
    n, q = guide.num_coords, guide.num_values
    gen = torch.Generator().manual_seed(2)
    values = torch.randint(0, 2, (30, n), generator=gen)
    mask = torch.rand(30, n, generator=gen) < 0.4
    targets = torch.randint(0, n, (30, 2), generator=gen)
    guide.net.ball_queries = "always"  # the balls cover most of this small graph
    at = guide.log_marginals_at(values, mask, targets)
    full = guide.log_marginals(values, mask).gather(1, targets.unsqueeze(-1).expand(-1, -1, q))
    torch.testing.assert_close(at, full, atol=1e-5, rtol=1e-5)


def test_binary_fast_path_equals_the_general_path():
    guide = _perturb(AnyOrderGuide(ising_cycle, (CYCLE_DATA,), num_layers=1), scale=0.3)
    gen = torch.Generator().manual_seed(3)
    values = torch.randint(0, 2, (50, 6), generator=gen)
    mask = torch.rand(50, 6, generator=gen) < 0.5
    fast = guide.log_marginals(values, mask)
    guide.net.binary_fast_path = False
    general = guide.log_marginals(values, mask)
    torch.testing.assert_close(fast, general, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("architecture", ["graph", "mlp", "transformer"])
def test_chain_query_equals_its_rows(architecture):
    guide = _perturb(AnyOrderGuide(potts_triangle, (POTTS_DATA,), architecture=architecture))
    gen = torch.Generator().manual_seed(4)
    c, n, length = 12, 4, 3
    values = torch.randint(0, 3, (c, n), generator=gen)
    values[:, 3] = values[:, 3] % 2
    orders = torch.rand(c, n, generator=gen).argsort(-1)
    mask = torch.zeros(c, n, dtype=torch.bool)
    mask[torch.arange(c), orders[:, 0]] = True
    chain = orders[:, 1 : 1 + length].clone()
    chain[:6, -1] = chain[:6, -2]  # padded chains repeat their last coordinate
    out = guide.log_marginals_chain(values, mask, chain)
    assert out.shape == (c, length, 3)
    for j in range(length):
        pinned = mask.clone()
        pinned[torch.arange(c)[:, None], chain[:, :j]] = True
        row = guide.log_marginals_at(values, pinned, chain[:, j : j + 1])[:, 0]
        real = slice(None) if j < length - 1 else slice(6, None)  # padding rows are ignored
        torch.testing.assert_close(out[real, j], row[real], atol=1e-5, rtol=1e-5)
