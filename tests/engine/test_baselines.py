"""The baselines are exact too, and AGR24 equals the sequential Gumbel-max sampler path by path."""

import pytest
import torch

from pyro_autospec.engine import sample_any_order
from pyro_autospec.oracles.markov import MarkovChainOracle
from pyro_autospec.oracles.tabular import TabularOracle
from tests.engine.test_any_order import TARGETS
from tests.stats import assert_samples_match, state_index


@pytest.mark.parametrize("method", ["speculative", "agr24"])
@pytest.mark.parametrize("target", ["pairs_equal", "near_deterministic", "potts"])
def test_baseline_exact(method, target):
    oracle = TabularOracle(TARGETS[target](), log=True)
    result = sample_any_order(oracle, 4000, seed=21, method=method)
    assert_samples_match(result.samples, oracle.log_probs, oracle.num_values)
    idx = torch.from_numpy(state_index(result.samples, oracle.num_values))
    torch.testing.assert_close(result.log_prob, oracle.log_probs.flatten()[idx], rtol=0, atol=1e-9)


@pytest.mark.parametrize("window", [1, 3, 16])
def test_speculative_windows_exact(window):
    oracle = TabularOracle(TARGETS["pairs_equal"](), log=True)
    result = sample_any_order(oracle, 4000, seed=5, method="speculative", window=window)
    assert_samples_match(result.samples, oracle.log_probs, oracle.num_values)


@pytest.mark.parametrize("window_scale", [0.5, 1.0, 4.0])
def test_agr24_equals_sequential_gumbel_max_path_by_path(window_scale):
    stay = torch.tensor([[0.8, 0.15, 0.05], [0.1, 0.8, 0.1], [0.3, 0.3, 0.4]])
    chain = MarkovChainOracle(torch.tensor([0.2, 0.5, 0.3]), stay, 300)
    fast = sample_any_order(chain, 6, seed=9, method="agr24", window_scale=window_scale)
    slow = sample_any_order(chain, 6, seed=9, method="gumbel_sequential")
    assert torch.equal(fast.orders, slow.orders)
    assert torch.equal(fast.samples, slow.samples)
    torch.testing.assert_close(fast.log_prob, slow.log_prob)
    assert fast.sample_rounds.double().mean() < slow.sample_rounds.double().mean()
    assert (slow.sample_rounds == 300).all()


def test_gumbel_sequential_exact():
    oracle = TabularOracle(TARGETS["potts"](), log=True)
    result = sample_any_order(oracle, 4000, seed=4, method="gumbel_sequential")
    assert_samples_match(result.samples, oracle.log_probs, oracle.num_values)


@pytest.mark.parametrize("method", ["sequential", "gumbel_sequential"])
def test_sequential_all_draws_at_once_equals_the_batched_loop(method, capsys):
    # With every draw in flight and no row cap, the sequential methods run all draws in
    # lockstep; a draw or row cap takes the general loop. Same rows, noise and arithmetic.
    stay = torch.tensor([[0.8, 0.15, 0.05], [0.1, 0.8, 0.1], [0.3, 0.3, 0.4]])
    chain = MarkovChainOracle(torch.tensor([0.2, 0.5, 0.3]), stay, 40)
    base = sample_any_order(chain, 7, seed=2, method=method, progress=True)
    assert method in capsys.readouterr().err
    assert base.rounds == 40 and base.oracle_rows == 7 * 40
    assert base.sample_rounds.tolist() == [40] * 7
    for knobs in ({"max_concurrent_draws": 3}, {"max_rows_per_round": 5}):
        other = sample_any_order(chain, 7, seed=2, method=method, **knobs)
        assert torch.equal(other.samples, base.samples)
        assert torch.equal(other.log_prob, base.log_prob)
        assert other.oracle_rows == base.oracle_rows
