"""The shared machinery of the exact oracles: chain queries' validation and generic parts."""

import pytest
import torch

from pyro_autospec.oracles import (
    CurieWeissOracle,
    DPPOracle,
    HMMOracle,
    MarkovChainOracle,
    SpanningTreeOracle,
    TabularOracle,
    TreePottsOracle,
)
from pyro_autospec.oracles._util import ExactOracle, chain_repeats, logsumexp, sum_last
from pyro_autospec.oracles.base import has_chain_marginals


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


@pytest.mark.parametrize("q", [0, 1, 2, 3, 4, 5, 33])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sum_last_and_logsumexp_match_torch(q, dtype):
    # the fast path (slices added for q <= 4 on a CPU) against torch's sum and logsumexp, with
    # the special values the engine's row check relies on: a NaN entry gives NaN, a +inf entry
    # +inf, a row of -inf gives -inf
    x = torch.randn(40, 5, q, generator=torch.Generator().manual_seed(q)).to(dtype)
    if q:
        x[0, 0] = -torch.inf
        x[1, 1, 0] = torch.nan
        x[2, 2, 0] = torch.inf
        x[3, 3, -1] = -torch.inf
    tol = {"rtol": 1e-12, "atol": 1e-12} if dtype == torch.float64 else {}
    assert sum_last(x).shape == x.shape[:-1]
    torch.testing.assert_close(sum_last(x), x.sum(-1), equal_nan=True, **tol)
    if q == 0:  # rows have q >= 1 values; an empty row has no maximum to shift by
        return
    torch.testing.assert_close(logsumexp(x), torch.logsumexp(x, -1), equal_nan=True, **tol)
    torch.testing.assert_close(
        logsumexp(x, dim=1, keepdim=True),
        torch.logsumexp(x, 1, keepdim=True),
        equal_nan=True,
        **tol,
    )
    assert logsumexp(x)[0, 0] == -torch.inf
    assert logsumexp(x)[1, 1].isnan()
    assert logsumexp(x)[2, 2] == torch.inf
