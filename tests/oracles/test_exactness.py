"""Exactness of the full sampler on every structured oracle: one chi-square test each.

Each test draws joint states with ``sample_any_order(..., order="random")`` and compares
their histogram with the exact joint by enumeration (``tests.stats``: bins merged to >= 30
expected counts, failure rate 2e-5, fixed seeds, raising when bins are too thin).
"""

import math

import torch

from pyro_autospec.engine import sample_any_order
from pyro_autospec.oracles import (
    CurieWeissOracle,
    DPPOracle,
    HMMOracle,
    MarkovChainOracle,
    SpanningTreeOracle,
    TabularOracle,
    TreePottsOracle,
)
from tests.catalogue.oracle_reference import enumerate_joint
from tests.catalogue.oracles import random_hmm, random_kernel
from tests.catalogue.references import (
    chain_log_prob,
    curie_weiss_log_prob,
    dpp_log_prob,
    hmm_log_prob,
    potts_log_prob,
    spanning_tree_log_prob,
)
from tests.stats import assert_samples_match

NUM_SAMPLES = 2000


def check(oracle, log_prob, seed: int) -> None:
    n, q = oracle.num_coords, oracle.num_values
    joint = enumerate_joint(log_prob, n, q)
    joint = joint - torch.logsumexp(joint.flatten(), 0)
    result = sample_any_order(oracle, NUM_SAMPLES, seed=seed, order="random")
    assert result.samples.shape == (NUM_SAMPLES, n)
    assert_samples_match(result.samples, joint, q)


def test_tabular():
    gen = torch.Generator().manual_seed(0)
    table = torch.randn(3, 3, 3, 3, generator=gen, dtype=torch.float64)
    table[0, 1] = -math.inf
    check(TabularOracle(logits=table), lambda x: float(table[x]), seed=1)


def test_markov_chain():
    initial = torch.tensor([0.6, 0.4], dtype=torch.float64)
    transition = torch.tensor([[0.85, 0.15], [0.3, 0.7]], dtype=torch.float64)
    check(MarkovChainOracle(initial, transition, 6), chain_log_prob(initial, transition), seed=2)


def test_hmm():
    initial, transition, emissions = random_hmm(5, 2, seed=3, scale=1.0)
    oracle = HMMOracle(initial, transition, emissions)
    check(oracle, hmm_log_prob(initial, transition, emissions), seed=3)


def test_tree_potts():
    edges = [(0, 1), (0, 2), (2, 3), (2, 4), (4, 5)]
    gen = torch.Generator().manual_seed(4)
    fields = torch.randn(6, 2, generator=gen, dtype=torch.float64) * 0.5
    couplings = torch.tensor([0.8, -0.5, 1.0, 0.3, 0.6], dtype=torch.float64)
    table = couplings[:, None, None] * torch.eye(2, dtype=torch.float64)
    oracle = TreePottsOracle(edges, couplings, fields, num_values=2)
    check(oracle, potts_log_prob(edges, table, fields), seed=4)


def test_dpp():
    kernel = random_kernel(5, seed=5)
    oracle = DPPOracle(kernel=kernel)
    check(oracle, dpp_log_prob(oracle.kernel), seed=5)


def test_spanning_tree():
    edges = [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]
    weights = [1.0, 2.0, 0.5, 1.5, 1.0, 3.0]
    oracle = SpanningTreeOracle(4, edges, weights)
    check(oracle, spanning_tree_log_prob(4, edges, weights), seed=6)


def test_curie_weiss():
    check(CurieWeissOracle(6, beta=1.3, h=0.15), curie_weiss_log_prob(6, 1.3, 0.15), seed=7)
