import math
import time

import pytest
import torch

from pyro_autospec.oracles.hmm import HMMOracle, PairwiseChainOracle
from pyro_autospec.oracles.markov import MarkovChainOracle
from tests.catalogue.oracle_reference import (
    assert_chain_matches_rows,
    assert_same_marginals,
    random_chains,
    random_queries,
    tabular_reference,
)
from tests.catalogue.oracles import random_hmm
from tests.catalogue.references import hmm_log_prob, pairwise_chain_log_prob


@pytest.mark.parametrize(
    "n,q,zeros,scale",
    [
        (1, 3, False, 2.0),
        (2, 2, False, 2.0),
        (5, 3, True, 2.0),
        (7, 2, False, 2.0),
        (8, 2, False, 300.0),
    ],
)
def test_matches_brute_force(n, q, zeros, scale):
    initial, transition, emissions = random_hmm(n, q, seed=n + q, zeros=zeros, scale=scale)
    oracle = HMMOracle(initial, transition, emissions)
    reference = tabular_reference(hmm_log_prob(initial, transition, emissions), n, q)
    values, mask, targets = random_queries(n, q, 300, seed=n)
    compared = assert_same_marginals(oracle, reference, values, mask, targets)
    assert compared > 100


def test_sparse_table_covers_every_range():
    # n = 13 edges is not a power of two; every (left pin, site, right pin) triple is checked
    n, q = 13, 3
    initial, transition, emissions = random_hmm(n, q, seed=5)
    oracle = HMMOracle(initial, transition, emissions)
    chain = MarkovChainOracle(initial, transition, n)
    flat = HMMOracle(initial, transition, torch.zeros(n, q))
    values_list, mask_list = [], []
    for left in range(-1, n):
        for right in range(left + 2, n + 1):
            mask = torch.zeros(n, dtype=torch.bool)
            if left >= 0:
                mask[left] = True
            if right < n:
                mask[right] = True
            mask_list.append(mask)
            values_list.append(torch.randint(0, q, (n,)))
    values, mask = torch.stack(values_list), torch.stack(mask_list)
    # with flat emissions the HMM is the Markov chain
    torch.testing.assert_close(flat.log_marginals(values, mask), chain.log_marginals(values, mask))
    # the full and the targeted paths agree
    targets = torch.arange(n).expand(len(values_list), n)
    torch.testing.assert_close(
        oracle.log_marginals(values, mask), oracle.log_marginals_at(values, mask, targets)
    )


def test_batch_of_one_and_point_masses():
    emissions = torch.tensor([[0.0, -2.0], [-2.0, 0.0], [0.0, -2.0]])
    oracle = HMMOracle([0.5, 0.5], [[0.8, 0.2], [0.2, 0.8]], emissions)
    values = torch.tensor([[0, -3, 1]])
    mask = torch.tensor([[True, False, True]])
    out = oracle.log_marginals(values, mask)
    assert out.shape == (1, 3, 2)
    assert out[0, 0].tolist() == [0.0, -math.inf]
    expected = torch.tensor([0.8 * 0.2 * math.exp(-2), 0.2 * 0.8], dtype=torch.float64)
    torch.testing.assert_close(out[0, 1].exp(), expected / expected.sum())


def test_long_hmm_is_fast_and_normalised():
    n, q = 4096, 4
    initial, transition, emissions = random_hmm(n, q, seed=0, scale=5.0)
    oracle = HMMOracle(initial, transition, emissions)
    gen = torch.Generator().manual_seed(1)
    values = torch.randint(0, q, (500, n), generator=gen)
    mask = torch.rand(500, n, generator=gen) < torch.rand(500, 1, generator=gen) * 0.1
    targets = torch.randint(0, n, (500, 32), generator=gen)
    start = time.perf_counter()
    out = oracle.log_marginals_at(values, mask, targets)
    elapsed = time.perf_counter() - start
    torch.testing.assert_close(out.exp().sum(-1), torch.ones(500, 32, dtype=torch.float64))
    assert elapsed < 10.0
    full = oracle.log_marginals(values[:10], mask[:10])
    torch.testing.assert_close(full.gather(1, targets[:10, :, None].expand(-1, -1, q)), out[:10])


@pytest.mark.parametrize(
    "emissions,message",
    [
        (torch.zeros(4, 3), "shape \\[n, q\\]"),
        (torch.zeros(4), "shape \\[n, q\\]"),
        (torch.full((4, 2), float("nan")), "NaN"),
        (torch.full((4, 2), -math.inf), "impossible"),
    ],
)
def test_constructor_errors(emissions, message):
    with pytest.raises(ValueError, match=message):
        HMMOracle([0.5, 0.5], [[0.9, 0.1], [0.1, 0.9]], emissions)


def test_impossible_observations_rejected():
    emissions = torch.tensor([[0.0, -math.inf], [-math.inf, 0.0]])
    with pytest.raises(ValueError, match="impossible"):
        HMMOracle([0.5, 0.5], [[1.0, 0.0], [0.0, 1.0]], emissions)


@pytest.mark.parametrize(
    "n,q,zeros,length", [(1, 2, False, 2), (5, 3, True, 4), (304, 3, True, 20), (301, 2, False, 20)]
)
def test_chain_queries_match_rows(n, q, zeros, length):
    oracle = HMMOracle(*random_hmm(n, q, seed=n, zeros=zeros))
    values, mask, chain = random_chains(n, q, 50, length, seed=n)
    compared = assert_chain_matches_rows(oracle, values, mask, chain)
    assert compared > 50 * min(length, n) // 4


# ------------------------------------------------------------------------ PairwiseChainOracle
def random_potentials(n, q, seed, zeros=False, scale=2.0):
    gen = torch.Generator().manual_seed(seed)
    unary = torch.randn(n, q, generator=gen, dtype=torch.float64) * scale
    pairwise = torch.randn(n - 1, q, q, generator=gen, dtype=torch.float64) * scale
    if zeros:
        unary[n // 2, 0] = -math.inf
        pairwise[0, 1, :2] = -math.inf
    return unary, pairwise


@pytest.mark.parametrize(
    "n,q,zeros,scale",
    [
        (1, 3, False, 2.0),
        (2, 2, True, 2.0),
        (6, 3, True, 2.0),
        (7, 2, False, 2.0),
        (8, 2, False, 300.0),
    ],
)
def test_pairwise_chain_matches_brute_force(n, q, zeros, scale):
    unary, pairwise = random_potentials(n, q, seed=n + q, zeros=zeros, scale=scale)
    oracle = PairwiseChainOracle(unary, pairwise)
    reference = tabular_reference(pairwise_chain_log_prob(unary, pairwise), n, q)
    values, mask, targets = random_queries(n, q, 300, seed=n)
    assert assert_same_marginals(oracle, reference, values, mask, targets) > 100
    values, mask, chain = random_chains(n, q, 100, min(n, 4), seed=n)
    assert assert_chain_matches_rows(oracle, values, mask, chain, reference=reference) > 30


@pytest.mark.parametrize(
    "unary,pairwise,message",
    [
        (torch.zeros(3, 2), torch.zeros(3, 2, 2), "shape \\[n - 1, q, q\\]"),
        (torch.zeros(3), torch.zeros(2, 2, 2), "shape \\[n, q\\]"),
        (torch.full((3, 2), math.nan), torch.zeros(2, 2, 2), "NaN"),
        (torch.full((3, 2), -math.inf), torch.zeros(2, 2, 2), "weight 0"),
    ],
)
def test_pairwise_chain_constructor_errors(unary, pairwise, message):
    with pytest.raises(ValueError, match=message):
        PairwiseChainOracle(unary, pairwise)
