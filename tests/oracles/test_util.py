"""The shared machinery of the exact oracles: chain queries' validation and generic parts."""

import pytest
import torch

from pyro_autospec import sample_any_order
from pyro_autospec.engine.protocols import has_chain_marginals
from pyro_autospec.oracles import (
    CurieWeissOracle,
    DPPOracle,
    ExactOracle,
    HMMOracle,
    MarkovChainOracle,
    SpanningTreeOracle,
    TabularOracle,
    TreePottsOracle,
)
from pyro_autospec.oracles._util import chain_repeats
from tests.stats import assert_samples_match


def small_oracles():
    return [
        TabularOracle(probs=torch.rand(2, 2, 2)),
        MarkovChainOracle([0.5, 0.5], [[0.9, 0.1], [0.1, 0.9]], 3),
        HMMOracle([0.5, 0.5], [[0.9, 0.1], [0.1, 0.9]], torch.zeros(3, 2)),
        TreePottsOracle([(0, 1), (1, 2)], 1.0, torch.zeros(3, 2), 2),
        DPPOracle(L=torch.eye(3)),
        SpanningTreeOracle(3, [(0, 1), (1, 2), (0, 2)]),
        CurieWeissOracle(3, 1.0),
    ]


def test_chain_repeats():
    gen = torch.Generator().manual_seed(0)
    chain = torch.randint(0, 6, (200, 7), generator=gen)
    expected = torch.zeros_like(chain, dtype=torch.bool)
    for j in range(1, 7):
        expected[:, j] = (chain[:, :j] == chain[:, j : j + 1]).any(1)
    assert torch.equal(chain_repeats(chain), expected)
    assert chain_repeats(chain[:, :1]).tolist() == [[False]] * 200
    assert chain_repeats(torch.zeros(0, 3, dtype=torch.long)).shape == (0, 3)


@pytest.mark.parametrize("oracle", small_oracles(), ids=lambda o: type(o).__name__)
def test_every_exact_oracle_answers_chain_queries(oracle):
    assert has_chain_marginals(oracle)
    q = oracle.num_values
    values = torch.tensor([[1, 0, 0], [0, 1, 1]])
    mask = torch.tensor([[True, False, False], [False, False, False]])
    # a chain of length 1 is one row of log_marginals_at
    chain = torch.tensor([[2], [0]])
    out = oracle.log_marginals_chain(values, mask, chain)
    assert out.shape == (2, 1, q) and out.dtype == torch.float64
    torch.testing.assert_close(out, oracle.log_marginals_at(values, mask, chain))
    # padding repeats the last coordinate: point masses, and the native answer is the
    # generic one (rows)
    chain = torch.tensor([[2, 1, 1], [0, 2, 2]])
    out = oracle.log_marginals_chain(values, mask, chain)
    assert out[0, 2].exp().tolist() == [1.0, 0.0] and out[1, 2].exp().tolist() == [0.0, 1.0]
    generic = ExactOracle._log_marginals_chain(oracle, values, mask, chain)
    torch.testing.assert_close(out, generic, atol=1e-12, rtol=0)
    # empty queries, a long integer chain of another dtype, and another device object
    assert oracle.log_marginals_chain(values, mask, chain[:, :0]).shape == (2, 0, q)
    assert oracle.log_marginals_chain(values[:0], mask[:0], chain[:0]).shape == (0, 3, q)
    torch.testing.assert_close(oracle.to("cpu").log_marginals_chain(values, mask, chain.int()), out)


def test_chain_query_errors():
    oracle = MarkovChainOracle([0.5, 0.5], [[0.9, 0.1], [0.1, 0.9]], 3)
    values = torch.zeros(2, 3, dtype=torch.long)
    mask = torch.zeros(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"chain must be a LongTensor of shape \[2, L\]"):
        oracle.log_marginals_chain(values, mask, torch.zeros(3, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="chain must be a LongTensor"):
        oracle.log_marginals_chain(values, mask, torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="chain must hold integer"):
        oracle.log_marginals_chain(values, mask, torch.zeros(2, 1))
    with pytest.raises(ValueError, match=r"chain must hold coordinate indices in \[0, 3\)"):
        oracle.log_marginals_chain(values, mask, torch.tensor([[0], [3]]))
    with pytest.raises(ValueError, match="values must have shape"):
        oracle.log_marginals_chain(values[:, :2], mask[:, :2], torch.zeros(2, 1, dtype=torch.long))


class _Float32Table(ExactOracle):
    """A user's subclass of ExactOracle answering its rows in float32."""

    def __init__(self, table: TabularOracle):
        self.table, self.num_coords, self.num_values = table, table.num_coords, table.num_values

    def _log_marginals_at(self, values, mask, targets):
        return self.table.log_marginals_at(values, mask, targets).float()


def test_a_subclass_answering_in_float32_gets_generic_chain_queries_in_float32():
    """An outside test: the generic chain queries wrote the subclass's float32 rows into a
    float64 table, a raw index_put error under the default autospec (sequential ran). The
    chain is now in the rows' dtype (point masses are exact in it), and the draws are exact."""
    probs = torch.tensor([0.30, 0.05, 0.10, 0.15, 0.02, 0.08, 0.12, 0.18]).reshape(2, 2, 2)
    oracle = _Float32Table(TabularOracle(probs=probs))
    values, mask = torch.tensor([[1, 0, 0]]), torch.tensor([[True, False, False]])
    chain = oracle.log_marginals_chain(values, mask, torch.tensor([[1, 2]]))
    assert chain.dtype == torch.float32
    rows = oracle.table.log_marginals_chain(values, mask, torch.tensor([[1, 2]]))
    torch.testing.assert_close(chain.double(), rows, atol=1e-6, rtol=0)
    result = sample_any_order(oracle, 6000, seed=0)
    assert_samples_match(result.samples, probs.double().log(), 2)
