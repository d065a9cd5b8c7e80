"""The engine's log-space algebra against torch's."""

import pytest
import torch

from pyro_autospec.engine.logspace import logsumexp, sum_last


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
