import math

import pytest
import torch

from pyro_autospec.oracles.curie_weiss import CurieWeissOracle
from tests.catalogue.oracle_reference import (
    assert_chain_matches_rows,
    assert_same_marginals,
    enumerate_joint,
    random_chains,
    random_queries,
    tabular_reference,
)
from tests.catalogue.references import curie_weiss_log_prob


@pytest.mark.parametrize("n,beta,h", [(1, 0.7, 0.3), (4, 1.5, 0.0), (7, 0.5, -0.4), (8, -2.0, 0.2)])
def test_matches_brute_force(n, beta, h):
    oracle = CurieWeissOracle(n, beta, h)
    reference = tabular_reference(curie_weiss_log_prob(n, beta, h), n, 2)
    values, mask, targets = random_queries(n, 2, 200, seed=n)
    compared = assert_same_marginals(oracle, reference, values, mask, targets)
    assert compared == 200


def test_log_prob_is_the_normalised_joint():
    oracle = CurieWeissOracle(5, 1.2, 0.3)
    table = enumerate_joint(curie_weiss_log_prob(5, 1.2, 0.3), 5, 2)
    table = table - torch.logsumexp(table.flatten(), 0)
    states = torch.tensor([[int(b) for b in f"{s:05b}"] for s in range(32)])
    torch.testing.assert_close(oracle.log_prob(states), table.flatten())


def test_batch_of_one_and_large_n():
    oracle = CurieWeissOracle(3, beta=1.0)
    out = oracle.log_marginals(torch.tensor([[1, 9, 9]]), torch.tensor([[True, False, False]]))
    assert out.shape == (1, 3, 2)
    assert out[0, 0].tolist() == [-math.inf, 0.0]
    big = CurieWeissOracle(4096, beta=1.1, h=0.01)
    gen = torch.Generator().manual_seed(0)
    values = torch.randint(0, 2, (200, 4096), generator=gen)
    mask = torch.rand(200, 4096, generator=gen) < torch.rand(200, 1, generator=gen)
    targets = torch.randint(0, 4096, (200, 5), generator=gen)
    at = big.log_marginals_at(values, mask, targets)
    torch.testing.assert_close(at.exp().sum(-1), torch.ones(200, 5, dtype=torch.float64))
    full = big.log_marginals(values[:5], mask[:5])
    torch.testing.assert_close(full.gather(1, targets[:5, :, None].expand(-1, -1, 2)), at[:5])


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(n=0, beta=1.0), "n must be a positive int"),
        (dict(n=3, beta=float("nan")), "beta contains NaN"),
        (dict(n=3, beta=[1.0, 2.0]), "beta must be a real number"),
        (dict(n=3, beta=1.0, h=float("inf")), "h contains \\+inf"),
    ],
)
def test_constructor_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CurieWeissOracle(**kwargs)


@pytest.mark.parametrize(
    "n,beta,h,length", [(1, 0.7, 0.3, 2), (6, 1.5, 0.0, 6), (300, 1.0, -0.2, 17)]
)
def test_chain_queries_match_rows(n, beta, h, length):
    oracle = CurieWeissOracle(n, beta, h)
    values, mask, chain = random_chains(n, 2, 40, length, seed=n)
    compared = assert_chain_matches_rows(oracle, values, mask, chain)
    assert compared == 40 * length
