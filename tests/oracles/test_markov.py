import math
import time

import pytest
import torch

import pyro_autospec.oracles.markov as markov_module
from pyro_autospec.oracles import ExactOracle
from pyro_autospec.oracles.hmm import HMMOracle
from pyro_autospec.oracles.markov import MarkovChainOracle, nearest_pins, nearest_pins_at
from tests.catalogue.oracle_reference import (
    assert_chain_matches_rows,
    assert_same_marginals,
    random_chains,
    random_queries,
    tabular_reference,
)
from tests.catalogue.oracles import random_hmm
from tests.catalogue.references import chain_log_prob


@pytest.mark.parametrize("n,q,zeros", [(1, 3, False), (2, 2, False), (6, 3, True), (7, 2, False)])
def test_matches_brute_force(n, q, zeros):
    gen = torch.Generator().manual_seed(n + 7 * q)
    initial = torch.rand(q, generator=gen, dtype=torch.float64)
    transition = torch.rand(q, q, generator=gen, dtype=torch.float64)
    if zeros:
        transition[0, 1] = 0.0
        transition[2, 2] = 0.0
        initial[1] = 0.0
    oracle = MarkovChainOracle(initial, transition, n)
    reference = tabular_reference(chain_log_prob(initial, transition), n, q)
    values, mask, targets = random_queries(n, q, 300, seed=n)
    compared = assert_same_marginals(oracle, reference, values, mask, targets)
    assert compared > 100


def test_nearly_deterministic_chain_is_accurate():
    transition = torch.tensor([[1 - 1e-12, 1e-12], [1e-12, 1 - 1e-12]], dtype=torch.float64)
    initial = torch.tensor([0.5, 0.5], dtype=torch.float64)
    oracle = MarkovChainOracle(initial, transition, 6)
    reference = tabular_reference(chain_log_prob(initial, transition), 6, 2)
    values, mask, targets = random_queries(6, 2, 100, seed=0)
    assert_same_marginals(oracle, reference, values, mask, targets)


def test_nearest_pins():
    mask = torch.tensor([[False, True, False, False, True, False], [False] * 6])
    left, right = nearest_pins(mask)
    assert left.tolist() == [[-1, 1, 1, 1, 4, 4], [-1] * 6]
    assert right.tolist() == [[1, 1, 4, 4, 4, 6], [6] * 6]
    targets = torch.tensor([[0, 5, 2, 1], [3, 3, 0, 5]])
    left_at, right_at = nearest_pins_at(mask, targets)
    assert torch.equal(left_at, left.gather(1, targets))
    assert torch.equal(right_at, right.gather(1, targets))
    gen = torch.Generator().manual_seed(0)
    # scan (n <= 256), 64-bit words (n % 8 == 0) and running count (n % 8 != 0) paths
    # (two levels of words: n = 1000 has 125 words, a last group of 5; n = 4096 has 64 groups)
    for n, density in [
        (40, 0.2),
        (1000, 0.01),
        (1000, 0.0),
        (1000, 0.3),
        (1001, 0.01),
        (4096, 0.0005),
        (4096, 0.02),
    ]:
        mask = torch.rand(50, n, generator=gen) < density
        mask[1] = True
        mask[2, :8] = True  # pins only in the first word, or only in the last one
        mask[3, -8:] = True
        targets = torch.randint(0, n, (50, 9), generator=gen)
        left, right = nearest_pins(mask)
        left_at, right_at = nearest_pins_at(mask, targets)
        assert torch.equal(left_at, left.gather(1, targets))
        assert torch.equal(right_at, right.gather(1, targets))
        # both searches directly: large calls take the words, small ones the running count
        searches = [markov_module._nearest_pins_by_count]
        if n % 8 == 0:
            searches.append(markov_module._nearest_pins_by_words)
        for search in searches:
            left_at, right_at = search(mask, targets)
            assert torch.equal(left_at, left.gather(1, targets))
            assert torch.equal(right_at, right.gather(1, targets))


def test_batch_of_one_and_point_masses():
    oracle = MarkovChainOracle([0.5, 0.5], [[0.9, 0.1], [0.2, 0.8]], n=3)
    values = torch.tensor([[1, 99, 0]])
    mask = torch.tensor([[True, False, True]])
    out = oracle.log_marginals(values, mask)
    assert out.shape == (1, 3, 2)
    assert out[0, 0].tolist() == [-math.inf, 0.0] and out[0, 2].tolist() == [0.0, -math.inf]
    # P(x1 | x0=1, x2=0) ∝ T[1, v] T[v, 0]
    expected = torch.tensor([0.2 * 0.9, 0.8 * 0.2], dtype=torch.float64)
    torch.testing.assert_close(out[0, 1].exp(), expected / expected.sum())
    at = oracle.log_marginals_at(values, mask, torch.tensor([[1]]))
    torch.testing.assert_close(at[0, 0], out[0, 1])


def test_long_chain_is_fast_and_normalised():
    n, q = 4096, 3
    gen = torch.Generator().manual_seed(1)
    oracle = MarkovChainOracle(
        torch.rand(q, generator=gen), torch.rand(q, q, generator=gen) + 0.1, n
    )
    values = torch.randint(0, q, (1000, n), generator=gen)
    mask = torch.rand(1000, n, generator=gen) < torch.rand(1000, 1, generator=gen)
    targets = torch.randint(0, n, (1000, 32), generator=gen)
    start = time.perf_counter()
    out = oracle.log_marginals_at(values, mask, targets)
    elapsed = time.perf_counter() - start
    assert out.shape == (1000, 32, q)
    torch.testing.assert_close(out.exp().sum(-1), torch.ones(1000, 32, dtype=torch.float64))
    assert elapsed < 10.0  # generous: a guard against an accidental O(B n q) loop
    full = oracle.log_marginals(values[:20], mask[:20])
    torch.testing.assert_close(full.gather(1, targets[:20, :, None].expand(-1, -1, q)), out[:20])


def test_stationary_marginals_without_pins():
    oracle = MarkovChainOracle([1.0, 0.0], [[0.5, 0.5], [0.25, 0.75]], n=200)
    out = oracle.log_marginals(
        torch.zeros(1, 200, dtype=torch.long), torch.zeros(1, 200, dtype=torch.bool)
    )
    torch.testing.assert_close(out[0, -1].exp(), torch.tensor([1 / 3, 2 / 3], dtype=torch.float64))


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(initial=[0.5, 0.5], transition=[[1.0, 0.0]], n=3), "transition must have shape"),
        (
            dict(initial=[[0.5, 0.5]], transition=[[1.0, 0.0], [0, 1]], n=3),
            "initial must be a vector",
        ),
        (dict(initial=[0.5, -0.5], transition=[[1.0, 0.0], [0, 1]], n=3), "initial must hold"),
        (
            dict(initial=[0.5, 0.5], transition=[[1.0, 0.0], [0, 0]], n=3),
            "rows \\[1\\] have zero mass",
        ),
        (dict(initial=[0.5, 0.5], transition=[[1.0, -1], [0, 1]], n=3), "non-negative"),
        (
            dict(initial=[0.5, 0.5], transition=[[1.0, 0.0], [0, 1]], n=0),
            "n must be a positive int",
        ),
    ],
)
def test_constructor_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MarkovChainOracle(**kwargs)


def random_chain_oracle(n, q, seed):
    gen = torch.Generator().manual_seed(seed)
    initial = torch.rand(q, generator=gen, dtype=torch.float64)
    transition = torch.rand(q, q, generator=gen, dtype=torch.float64)
    transition[0, 1] = 0.0  # impossible prefixes
    return MarkovChainOracle(initial, transition, n)


# n = 200: scan; 304: 64-bit words; 301: running count. Chains up to ~sqrt(n). The chain's
# own pins come from comparing every pair (short chains) or from sorting each chain.
@pytest.mark.parametrize("pairwise", [True, False], ids=["pairwise", "sorted"])
@pytest.mark.parametrize(
    "n,q,length", [(1, 2, 3), (7, 3, 5), (200, 3, 15), (304, 3, 20), (301, 2, 20)]
)
def test_chain_queries_match_rows(n, q, length, pairwise, monkeypatch):
    monkeypatch.setattr(markov_module, "_PAIRWISE_ELEMENTS", 2**62 if pairwise else -1)
    oracle = random_chain_oracle(n, q, seed=n)
    values, mask, chain = random_chains(n, q, 60, length, seed=n)
    compared = assert_chain_matches_rows(oracle, values, mask, chain)
    assert compared > 60 * min(length, n) // 4
    # the generic default (rows) gives the same answers
    generic = ExactOracle._log_marginals_chain(oracle, values, mask, chain)
    native = oracle.log_marginals_chain(values, mask, chain)
    possible = ~torch.isnan(generic).any(-1)
    torch.testing.assert_close(native[possible], generic[possible], atol=1e-12, rtol=0)


@pytest.mark.parametrize("n,q,length", [(7, 3, 5), (200, 3, 15), (304, 3, 20), (301, 2, 20)])
@pytest.mark.parametrize("family", ["markov", "hmm"])
def test_chain_then_row_matches_rows(n, q, length, family):
    # the row after the whole chain: its nearest pins among the prefix and every chain coordinate
    if family == "markov":
        oracle = random_chain_oracle(n, q, seed=n)
    else:
        oracle = HMMOracle(*random_hmm(n, q, seed=n, zeros=True))
    values, mask, chain = random_chains(n, q, 60, length, seed=n + 1)
    gen = torch.Generator().manual_seed(n)
    then = torch.randint(0, n, (60, 6), generator=gen)
    then[:, -1] = chain[:, 0]  # pinned by the chain: a point mass
    out, after = oracle.log_marginals_chain_then(values, mask, chain, then)
    chain_rows = oracle.log_marginals_chain(values, mask, chain)
    torch.testing.assert_close(out, chain_rows, equal_nan=True, atol=0, rtol=0)
    pinned = mask.clone().scatter_(1, chain, True)
    expected = oracle.log_marginals_at(values, pinned, then)
    possible = ~torch.isnan(expected).any(-1).any(-1)
    assert int(possible.sum()) > 20
    torch.testing.assert_close(after[possible], expected[possible], atol=1e-12, rtol=0)
    first = values.gather(1, chain[:, :1])[:, 0]
    assert torch.equal(after[:, -1].exp(), torch.nn.functional.one_hot(first, q).double())
    # an empty chain: the row after it is a plain row
    _, alone = oracle.log_marginals_chain_then(values, mask, chain[:, :0], then)
    torch.testing.assert_close(alone, oracle.log_marginals_at(values, mask, then), equal_nan=True)


@pytest.mark.parametrize("length", [1, 2, 7, 40])
def test_chain_pins_pairwise_equals_sorted(length):
    gen = torch.Generator().manual_seed(length)
    chain = torch.randint(0, 3 * length, (200, length), generator=gen)  # with repeats
    pairwise = markov_module._chain_pins_pairwise(chain, 3 * length)
    by_sort = markov_module._chain_pins_sorted(chain, 3 * length)
    repeated = pairwise[2]
    assert torch.equal(repeated, by_sort[2])
    if length > 4:
        assert repeated.any() and (~repeated).any()
    for mine, theirs in zip(pairwise[:2], by_sort[:2]):  # read only where not repeated
        assert torch.equal(mine[~repeated], theirs[~repeated])


def test_chain_query_by_hand():
    oracle = MarkovChainOracle([0.5, 0.5], [[0.9, 0.1], [0.2, 0.8]], n=5)
    values = torch.tensor([[0, 1, 1, 0, 7]])  # x_4 is neither pinned nor on the chain
    mask = torch.tensor([[True, False, False, False, False]])
    chain = torch.tensor([[3, 1, 2, 2]])
    out = oracle.log_marginals_chain(values, mask, chain).exp()[0]
    t = torch.tensor([[0.9, 0.1], [0.2, 0.8]], dtype=torch.float64)
    t3 = torch.linalg.matrix_power(t, 3)
    torch.testing.assert_close(out[0], t3[0])  # x_3 | x_0 = 0
    row1 = t[0] * (t @ t)[:, 0]  # x_1 | x_0 = 0, x_3 = 0
    torch.testing.assert_close(out[1], row1 / row1.sum())
    row2 = t[1] * t[:, 0]  # x_2 | x_1 = 1, x_3 = 0
    torch.testing.assert_close(out[2], row2 / row2.sum())
    assert out[3].tolist() == [0.0, 1.0]  # padding: x_2 is pinned at 1
