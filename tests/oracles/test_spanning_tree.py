import math

import pytest
import torch

from pyro_autospec.oracles.spanning_tree import SpanningTreeOracle
from tests.catalogue.oracle_reference import (
    assert_chain_matches_rows,
    assert_same_marginals,
    exact_samples,
    random_chains,
    random_queries,
    tabular_reference,
)
from tests.catalogue.references import spanning_tree_log_prob

GRAPHS = {
    "triangle": (3, [(0, 1), (1, 2), (0, 2)]),
    "square_with_diagonal": (4, [(0, 1), (1, 2), (2, 3), (3, 0), (0, 2)]),
    "k4": (4, [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]),
    "multigraph_with_bridge": (5, [(0, 1), (0, 1), (1, 2), (2, 3), (3, 1), (3, 4), (2, 4)]),
    "path": (3, [(0, 1), (1, 2)]),
}


@pytest.mark.parametrize("name", sorted(GRAPHS))
@pytest.mark.parametrize("weighted", [False, True])
def test_matches_brute_force(name, weighted):
    num_nodes, edges = GRAPHS[name]
    m = len(edges)
    gen = torch.Generator().manual_seed(m)
    weights = (torch.rand(m, generator=gen, dtype=torch.float64) * 3 + 0.2).tolist()
    if not weighted:
        weights = [1.0] * m
    oracle = SpanningTreeOracle(num_nodes, edges, weights if weighted else None)
    reference = tabular_reference(spanning_tree_log_prob(num_nodes, edges, weights), m, 2)
    values, mask, targets = random_queries(m, 2, 200, seed=m)
    compared = assert_same_marginals(oracle, reference, values, mask, targets)
    assert compared > 20


def test_edge_marginal_is_weight_times_effective_resistance():
    # a 4-cycle: every edge has effective resistance 3/4
    oracle = SpanningTreeOracle(4, [(0, 1), (1, 2), (2, 3), (3, 0)])
    diag = oracle.kernel.diagonal()
    torch.testing.assert_close(diag, torch.full((4,), 0.75, dtype=torch.float64))


def test_batch_of_one_contract_and_delete():
    oracle = SpanningTreeOracle(3, [(0, 1), (1, 2), (0, 2)])
    values = torch.tensor([[0, 7, 7]])
    mask = torch.tensor([[True, False, False]])  # edge (0, 1) deleted: the rest are bridges
    out = oracle.log_marginals(values, mask)
    assert out.shape == (1, 3, 2)
    assert out[0, 1].tolist() == [-math.inf, 0.0] and out[0, 2].tolist() == [-math.inf, 0.0]
    values = torch.tensor([[1, 1, 7]])
    mask = torch.tensor([[True, True, False]])  # a tree is complete: the last edge is out
    assert oracle.log_marginals_at(values, mask, torch.tensor([[2]]))[0, 0].tolist() == [
        0.0,
        -math.inf,
    ]


@pytest.mark.parametrize(
    "args,message",
    [
        ((1, [(0, 0)]), "num_nodes must be an int >= 2"),
        ((3, [(0, 1)]), "not connected"),
        ((3, [(0, 1), (1, 1), (1, 2)]), "self-loops"),
        ((3, [(0, 1), (1, 3)]), "node indices in \\[0, num_nodes\\)"),
        ((3, [0, 1, 2]), "shape \\[m, 2\\]"),
        ((3, [(0, 1), (1, 2)], [1.0, 0.0]), "weights must be positive"),
        ((3, [(0, 1), (1, 2)], [1.0]), "weights must have shape"),
    ],
)
def test_constructor_errors(args, message):
    with pytest.raises(ValueError, match=message):
        SpanningTreeOracle(*args)


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_chain_queries_match_rows(name):
    num_nodes, edges = GRAPHS[name]
    m = len(edges)
    oracle = SpanningTreeOracle(num_nodes, edges)
    reference = tabular_reference(spanning_tree_log_prob(num_nodes, edges, [1.0] * m), m, 2)
    values, mask, chain = random_chains(m, 2, 100, m, seed=m)
    compared = assert_chain_matches_rows(oracle, values, mask, chain, reference=reference)
    assert compared > 20


def test_chain_queries_on_a_grid():
    # a 6 x 6 grid (60 edges): pins taken from exact spanning trees, so every row is possible
    side = 6
    edges = [(r * side + c, r * side + c + 1) for r in range(side) for c in range(side - 1)]
    edges += [(r * side + c, (r + 1) * side + c) for r in range(side - 1) for c in range(side)]
    oracle = SpanningTreeOracle(side * side, edges)
    trees = exact_samples(oracle, 30, seed=0)
    assert (trees.sum(1) == side * side - 1).all()
    values, mask, chain = random_chains(len(edges), 2, 30, 12, seed=1, values=trees)
    assert assert_chain_matches_rows(oracle, values, mask, chain) == 30 * 12
