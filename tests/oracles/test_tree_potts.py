import math

import pytest
import torch

from pyro_autospec.oracles.tree_potts import TreePottsOracle
from tests.catalogue.oracle_reference import (
    Wrapper,
    assert_chain_matches_rows,
    assert_same_marginals,
    random_chains,
    random_queries,
    tabular_reference,
)
from tests.catalogue.oracles import random_forest
from tests.catalogue.references import potts_log_prob

FORESTS = {
    "single_node": (1, []),
    "path": (5, [(0, 1), (1, 2), (2, 3), (3, 4)]),
    "star": (5, [(2, 0), (2, 1), (2, 3), (2, 4)]),
    "tree": (7, [(0, 1), (0, 2), (1, 3), (1, 4), (4, 5), (2, 6)]),
    "forest": (6, [(3, 1), (1, 0), (4, 5)]),
}


@pytest.mark.parametrize("name", sorted(FORESTS))
@pytest.mark.parametrize("q,kind", [(2, "potts"), (3, "potts"), (3, "table"), (3, "coloring")])
def test_matches_brute_force(name, q, kind):
    n, edges = FORESTS[name]
    m = len(edges)
    gen = torch.Generator().manual_seed(n * 10 + q)
    fields = torch.randn(n, q, generator=gen, dtype=torch.float64)
    if kind == "potts":
        couplings = torch.randn(m, generator=gen, dtype=torch.float64) * 1.5
        table = couplings[:, None, None] * torch.eye(q, dtype=torch.float64)
    elif kind == "table":
        couplings = torch.randn(m, q, q, generator=gen, dtype=torch.float64)
        table = couplings
    else:  # proper colourings with random preferences: -inf on the diagonal
        couplings = torch.randn(m, q, q, generator=gen, dtype=torch.float64)
        couplings[:, torch.arange(q), torch.arange(q)] = -math.inf
        fields[0, 1] = -math.inf
        table = couplings
    oracle = TreePottsOracle(edges, couplings, fields, num_values=q)
    reference = tabular_reference(potts_log_prob(edges, table, fields), n, q)
    values, mask, targets = random_queries(n, q, 150, seed=n + q)
    compared = assert_same_marginals(oracle, reference, values, mask, targets)
    assert compared > 30


def test_ising_convention():
    edges = [(0, 1), (1, 2), (1, 3)]
    coupling = torch.tensor([0.5, -0.3, 0.8], dtype=torch.float64)
    field = torch.tensor([0.1, -0.2, 0.0, 0.4], dtype=torch.float64)
    oracle = TreePottsOracle.ising(edges, coupling, field)

    def log_prob(x):
        s = [2 * v - 1 for v in x]
        total = sum(float(field[i]) * s[i] for i in range(4))
        return total + sum(float(coupling[k]) * s[u] * s[v] for k, (u, v) in enumerate(edges))

    reference = tabular_reference(log_prob, 4, 2)
    values, mask, targets = random_queries(4, 2, 100, seed=0)
    assert_same_marginals(oracle, reference, values, mask, targets)


def test_batch_of_one_and_deep_tree():
    oracle = TreePottsOracle([(0, 1)], 2.0, torch.zeros(2, 2), num_values=2)
    out = oracle.log_marginals(torch.tensor([[1, -1]]), torch.tensor([[True, False]]))
    assert out.shape == (1, 2, 2)
    assert out[0, 0].tolist() == [-math.inf, 0.0]
    torch.testing.assert_close(
        out[0, 1].exp(), torch.tensor([1, math.e**2]).double() / (1 + math.e**2)
    )
    # a path of 300 nodes against the Markov chain it is
    from pyro_autospec.oracles.markov import MarkovChainOracle

    n = 300
    path = TreePottsOracle([(i, i + 1) for i in range(n - 1)], 1.0, torch.zeros(n, 2), 2)
    chain = MarkovChainOracle([0.5, 0.5], [[math.e, 1.0], [1.0, math.e]], n)
    gen = torch.Generator().manual_seed(0)
    values = torch.randint(0, 2, (20, n), generator=gen)
    mask = torch.rand(20, n, generator=gen) < 0.05
    torch.testing.assert_close(path.log_marginals(values, mask), chain.log_marginals(values, mask))


@pytest.mark.parametrize(
    "args,message",
    [
        (([(0, 1), (1, 2), (2, 0)], 1.0, torch.zeros(3, 2), 2), "closes a cycle"),
        (([(0, 1)], 1.0, torch.zeros(2, 3), 2), "fields must have shape"),
        (([(0, 1)], 1.0, torch.zeros(2, 2), 1), "num_values must be an int >= 2"),
        (([(0, 1)], torch.zeros(2), torch.zeros(2, 2), 2), "couplings must be a number"),
        (([(0, 1)], float("-inf"), torch.zeros(2, 2), 2), "couplings must be finite"),
        (([(0, 5)], 1.0, torch.zeros(2, 2), 2), "node indices"),
        (([0, 1], 1.0, torch.zeros(2, 2), 2), "shape \\[m, 2\\]"),
    ],
)
def test_constructor_errors(args, message):
    with pytest.raises(ValueError, match=message):
        TreePottsOracle(*args)


# random forests (nodes, values, -inf entries, forest) and a chain length / number of targets
RANDOM_CASES = [
    (1, 2, False, False, 2),
    (7, 3, True, True, 5),
    (300, 2, False, False, 40),
    (300, 3, True, True, 17),
    (120, 3, False, True, 30),
    (40, 10, False, True, 9),
]


@pytest.mark.parametrize("n,q,hard,forest,length", RANDOM_CASES)
def test_chain_queries_match_rows(n, q, hard, forest, length):
    oracle = random_forest(n, seed=n + q, q=q, hard=hard, forest=forest)
    values, mask, chain = random_chains(n, q, 40, length, seed=n)
    compared = assert_chain_matches_rows(oracle, values, mask, chain, reference=FullPass(oracle))
    assert compared > 40 * min(length, n) // 4


class FullPass(Wrapper):
    """Targeted rows read from belief propagation over the whole forest (``log_marginals``),
    which is NaN on every row conditioned on an impossible assignment."""

    def log_marginals_at(self, values, mask, targets):
        full = self.oracle.log_marginals(values, mask)
        return full.gather(1, targets.unsqueeze(-1).expand(-1, -1, self.num_values))


@pytest.mark.parametrize("n,q,hard,forest,num_targets", RANDOM_CASES)
def test_targeted_rows_match_belief_propagation(n, q, hard, forest, num_targets):
    # targeted rows pass downward over the targets and their ancestors only; every row
    # conditioned on a possible assignment must agree with the pass over the whole forest
    oracle = random_forest(n, seed=2 * n + q, q=q, hard=hard, forest=forest)
    gen = torch.Generator().manual_seed(n)
    values, mask, _ = random_queries(n, q, 60, seed=n, pin_probability=0.1)
    targets = torch.randint(0, n, (60, num_targets), generator=gen)
    compared = assert_same_marginals(oracle, FullPass(oracle), values, mask, targets)
    assert compared > 15


@pytest.mark.parametrize("n,q,hard,forest,length", RANDOM_CASES)
def test_chain_then_row_matches_belief_propagation(n, q, hard, forest, length):
    # the row after the chain pins the prefix and the whole chain; its targets may be pinned
    # (point masses) or repeat
    oracle = random_forest(n, seed=3 * n + q, q=q, hard=hard, forest=forest)
    values, mask, chain = random_chains(n, q, 40, length, seed=n + 1)
    gen = torch.Generator().manual_seed(n)
    then = torch.randint(0, n, (40, 7), generator=gen)
    then[:, -1] = chain[:, 0]  # pinned by the chain
    out, after = oracle.log_marginals_chain_then(values, mask, chain, then)
    torch.testing.assert_close(out, oracle.log_marginals_chain(values, mask, chain), equal_nan=True)
    pinned = mask.clone()
    pinned.scatter_(1, chain, True)
    expected = FullPass(oracle).log_marginals_at(values, pinned, then)
    possible = ~torch.isnan(expected).any(-1).any(-1)
    assert int(possible.sum()) > 10
    torch.testing.assert_close(after[possible].exp(), expected[possible].exp(), atol=1e-9, rtol=0)
    assert torch.equal(after[possible] == -math.inf, expected[possible] == -math.inf)
    assert torch.equal(after[:, -1:].exp(), point_masses(values.gather(1, chain[:, :1]), q))


def point_masses(values, q):
    """Probabilities [B, 1, q]: a point mass at ``values`` [B, 1]."""
    return torch.nn.functional.one_hot(values, q).double()


@pytest.mark.parametrize("name", ["path", "star"])
def test_chain_queries_on_deep_and_wide_trees(name):
    n = 120
    if name == "path":  # depth n - 1: the walks to the root are long
        edges = [(i, i + 1) for i in range(n - 1)]
    else:  # one level of n - 1 leaves
        edges = [(0, i) for i in range(1, n)]
    gen = torch.Generator().manual_seed(5)
    fields = torch.randn(n, 3, generator=gen, dtype=torch.float64)
    oracle = TreePottsOracle(edges, 0.7, fields, num_values=3)
    values, mask, chain = random_chains(n, 3, 30, 12, seed=6, pin_probability=0.1)
    assert assert_chain_matches_rows(oracle, values, mask, chain) > 30 * 3


def test_one_targeted_row_with_nothing_pinned():
    """A single row (one draw sampled sequentially) once indexed past the only version."""
    n = 64
    edges = torch.tensor([[i, i + 1] for i in range(n - 1)])
    oracle = TreePottsOracle(
        edges,
        torch.full((n - 1,), 0.7, dtype=torch.float64),
        torch.zeros(n, 2, dtype=torch.float64),
        num_values=2,
    )
    values = torch.zeros(2, n, dtype=torch.long)
    mask = torch.zeros(2, n, dtype=torch.bool)
    one = oracle.log_marginals_at(values[:1], mask[:1], torch.tensor([[0]]))
    two = oracle.log_marginals_at(values, mask, torch.tensor([[0], [0]]))
    torch.testing.assert_close(one[0], two[0], rtol=0, atol=1e-12)
    torch.testing.assert_close(one.exp().sum(-1), torch.ones(1, 1, dtype=torch.float64))
