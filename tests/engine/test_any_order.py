"""Exactness of sample_any_order on strongly dependent tabular targets (chi-square, tier 2)."""

import numpy as np
import pytest
import torch

from pyro_autospec.engine import Schedule, sample_any_order
from pyro_autospec.oracles.tabular import TabularOracle
from tests.catalogue.targets import TARGETS, pairs_equal_target, potts_target
from tests.stats import assert_samples_match, state_index

SCHEDULES = {
    "default": {},
    "small_rho": {"rho": 0.05},
    "large_rho": {"rho": 4.0},
    "tiny_blocks": {"max_block": 2},
    # a cap far below a round's demand (4000 draws ask for thousands of rows per round); tighter
    # caps give the same draws (tests/engine/test_engines_agree.py), only more rounds
    "tight_cap": {"max_rows_per_round": 300, "rho": 2.0},
    # the block rule on whole blocks: deep recursion, races nested inside threads
    "whole_blocks": {"max_block": 64, "token_below": 0, "race_depth": None},
    "whole_blocks_tiny_rho": {"max_block": 64, "rho": 1e-9, "token_below": 0, "race_depth": None},
    # the block rule with adaptive windows; tries by the chain rule below the first race
    "adaptive_blocks": {"token_below": 0},
    "chain_rule_tries": {"max_block": 64, "token_below": 0, "race_depth": 0},
    # token windows below 4, the block rule at 4 and above; small first window
    "hybrid": {"max_block": 6, "token_below": 4, "first_block": 2},
    "fixed_tiling_blocks": {"blocks": "fixed", "token_below": 0, "race_depth": None},
    # races sized from each rejection (about 1 / TV tries at once), nested races included
    "adaptive_races": {"max_block": 64, "token_below": 0, "race_depth": None, "rho": "adaptive"},
}
# Every target with the default schedule; every other schedule on a target that stresses it.
CASES = [(target, "default") for target in sorted(TARGETS)] + [
    ("pairs_equal", "small_rho"),
    ("near_deterministic", "large_rho"),
    ("potts", "tiny_blocks"),
    ("pairs_equal", "tight_cap"),
    ("near_deterministic", "tight_cap"),
    ("pairs_equal", "whole_blocks"),
    ("potts", "whole_blocks"),
    ("near_deterministic", "whole_blocks"),
    ("potts", "whole_blocks_tiny_rho"),
    ("pairs_equal", "adaptive_blocks"),
    ("near_deterministic", "chain_rule_tries"),
    ("potts", "chain_rule_tries"),
    ("potts", "hybrid"),
    ("pairs_equal", "hybrid"),
    ("near_deterministic", "fixed_tiling_blocks"),
    ("potts", "adaptive_races"),
    ("near_deterministic", "adaptive_races"),
]


@pytest.mark.parametrize("target, schedule", CASES)
def test_random_order_exact(target, schedule):
    table = TARGETS[target]()
    oracle = TabularOracle(logits=table)
    result = sample_any_order(oracle, 4000, seed=11, schedule=SCHEDULES[schedule])
    assert_samples_match(result.samples, oracle.log_probs, oracle.num_values)
    # log_prob is the oracle's chain rule: for an exact oracle, the joint log probability.
    idx = torch.from_numpy(state_index(result.samples, oracle.num_values))
    torch.testing.assert_close(result.log_prob, oracle.log_probs.flatten()[idx], rtol=0, atol=1e-9)


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_fixed_order_exact(target):
    table = TARGETS[target]()
    oracle = TabularOracle(logits=table)
    n = oracle.num_coords
    order = list(range(n))[::-1]
    result = sample_any_order(oracle, 4000, seed=3, order=order, schedule=Schedule(max_block=n))
    assert (result.orders == torch.tensor(order)).all()
    assert_samples_match(result.samples, oracle.log_probs, oracle.num_values)


def test_sequential_exact_and_counts():
    oracle = TabularOracle(logits=potts_target())
    result = sample_any_order(oracle, 3000, method="sequential", seed=5)
    assert_samples_match(result.samples, oracle.log_probs, oracle.num_values)
    n = oracle.num_coords
    assert result.rounds == n
    assert (result.sample_rounds == n).all()
    assert result.oracle_rows == 3000 * n


class ShuffledOracle:
    """A third-party oracle written against the protocol only (full rows, no targets, float32)."""

    def __init__(self, table):
        self.inner = TabularOracle(logits=table)
        self.num_coords = self.inner.num_coords
        self.num_values = self.inner.num_values

    def log_marginals(self, values, mask):
        # Garbage at unpinned positions must not matter.
        values = torch.where(mask, values, torch.randint_like(values, self.num_values))
        return self.inner.log_marginals(values, mask).float()


def test_any_protocol_oracle_exact():
    oracle = ShuffledOracle(pairs_equal_target(seed=4))
    result = sample_any_order(oracle, 4000, seed=2)
    assert_samples_match(result.samples, oracle.inner.log_probs, oracle.num_values)


def test_same_seed_same_output():
    oracle = TabularOracle(logits=potts_target())
    a = sample_any_order(oracle, 200, seed=7)
    b = sample_any_order(oracle, 200, seed=7)
    c = sample_any_order(oracle, 200, seed=8)
    assert torch.equal(a.samples, b.samples) and torch.equal(a.orders, b.orders)
    assert a.rounds == b.rounds and a.oracle_rows == b.oracle_rows
    assert torch.equal(a.log_prob, b.log_prob)
    assert not torch.equal(a.samples, c.samples)
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    assert torch.equal(
        sample_any_order(oracle, 50, seed=g1).samples, sample_any_order(oracle, 50, seed=g2).samples
    )


def test_result_fields():
    oracle = TabularOracle(logits=potts_target())
    result = sample_any_order(oracle, 40, seed=0)
    n = oracle.num_coords
    assert result.samples.shape == (40, n) and result.samples.dtype == torch.int64
    assert result.log_prob.dtype == torch.float64 and result.log_prob.shape == (40,)
    assert result.orders.shape == (40, n)
    assert (result.orders.sort(1).values == torch.arange(n)).all()
    assert result.sample_rounds.shape == (40,) and result.sample_rounds.dtype == torch.int64
    assert 0 < result.sample_rounds.max() <= result.rounds
    assert result.oracle_rows >= 40
    assert "autospec" in repr(result)


def test_rounds_fewer_than_sequential_on_long_chain():
    from pyro_autospec.oracles import MarkovChainOracle

    chain = MarkovChainOracle(
        torch.tensor([0.5, 0.5]), torch.tensor([[0.73, 0.27], [0.27, 0.73]]), 256
    )
    result = sample_any_order(chain, 4, seed=0)
    assert result.sample_rounds.double().mean() < 256 / 2


def test_markov_chain_autospec_matches_sequential():
    """Tier 1: a statistic of a long chain, autospec against the sequential reference."""
    from pyro_autospec.oracles import MarkovChainOracle

    n = 40
    chain = MarkovChainOracle(torch.tensor([0.7, 0.3]), torch.tensor([[0.9, 0.1], [0.3, 0.7]]), n)
    fast = sample_any_order(chain, 2000, seed=1)
    slow = sample_any_order(chain, 2000, seed=2, method="sequential")
    # number of ones, binned: two-sample chi-square (contingency table)
    import scipy.stats

    bins = np.array([0, 8, 10, 12, 14, 16, 18, 20, 41])
    a = np.histogram(fast.samples.sum(1).numpy(), bins)[0]
    b = np.histogram(slow.samples.sum(1).numpy(), bins)[0]
    table = np.stack([a, b])
    table = table[:, table.sum(0) > 0]
    assert scipy.stats.chi2_contingency(table).pvalue > 2e-5


@pytest.mark.parametrize("n", [5, 64, 256, 512, 1000, 2048, 4096])
def test_unspeculated_blocks_are_cut_into_leaves_near_max_block(n):
    """Blocks above max_block are cut into leaves of floor or ceil(n / k) coordinates, k =
    ceil(n / max_block): as many leaves as needed, not up to twice that (halving would give
    leaves of 16 at n = 512 where max_block = 23)."""
    from pyro_autospec.engine import default_schedule
    from pyro_autospec.engine.schedule import leaf_starts

    max_block = 2 if n == 5 else default_schedule(n)["max_block"]
    bounds = leaf_starts(n, max_block)
    sizes = [b - a for a, b in zip(bounds[:-1], bounds[1:])]
    k = -(-n // max_block)
    assert bounds[0] == 0 and bounds[-1] == n and len(sizes) == k
    assert set(sizes) <= {n // k, -(-n // k)}


@pytest.mark.parametrize("knob", ["max_elements", "max_rows_per_round", "max_concurrent_draws"])
def test_a_zero_budget_is_refused(knob):
    oracle = TabularOracle(logits=TARGETS["pairs_equal"]())
    with pytest.raises(ValueError, match=f"{knob} must be .* or None; got 0"):
        sample_any_order(oracle, 4, seed=0, schedule={knob: 0})
    if knob == "max_elements":  # a float budget runs, as it did
        sample_any_order(oracle, 4, seed=0, schedule=Schedule(max_elements=1e6))
