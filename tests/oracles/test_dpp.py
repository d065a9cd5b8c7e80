import math

import pytest
import torch

from pyro_autospec.oracles.dpp import DPPOracle
from tests.oracles._oracle_reference import (
    assert_same_marginals,
    random_queries,
    tabular_reference,
)


def dpp_log_prob(kernel):
    n = kernel.shape[0]

    def log_prob(x):
        # P(X = A) = |det(K - diag(1 - x))|
        d = torch.tensor([0.0 if v else 1.0 for v in x], dtype=torch.float64)
        p = abs(float(torch.linalg.det(kernel - torch.diag(d))))
        return math.log(p) if p > 1e-14 else -math.inf

    assert len(range(n)) == n
    return log_prob


def random_kernel(n, seed, projection_rank=None):
    gen = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=torch.float64))
    if projection_rank is None:
        eig = torch.rand(n, generator=gen, dtype=torch.float64)
    else:
        eig = (torch.arange(n) < projection_rank).double()
    return (q * eig) @ q.T


@pytest.mark.parametrize("n,rank", [(1, None), (4, None), (6, None), (6, 3)])
def test_matches_brute_force(n, rank):
    kernel = random_kernel(n, seed=n, projection_rank=rank)
    oracle = DPPOracle(kernel=kernel)
    reference = tabular_reference(dpp_log_prob(oracle.kernel), n, 2)
    values, mask, targets = random_queries(n, 2, 200, seed=n)
    compared = assert_same_marginals(
        oracle, reference, values, mask, targets, exact_zeros=rank is None
    )
    assert compared > 50


def test_l_ensemble_matches_brute_force():
    gen = torch.Generator().manual_seed(3)
    features = torch.randn(5, 3, generator=gen, dtype=torch.float64)
    ell = features @ features.T + 0.1 * torch.eye(5, dtype=torch.float64)
    oracle = DPPOracle(L=ell)

    def log_prob(x):
        idx = [i for i, v in enumerate(x) if v]
        det = torch.linalg.det(ell[idx][:, idx]) if idx else torch.tensor(1.0)
        return math.log(float(det)) - math.log(float(torch.linalg.det(torch.eye(5) + ell)))

    reference = tabular_reference(log_prob, 5, 2)
    values, mask, targets = random_queries(5, 2, 200, seed=1)
    assert_same_marginals(oracle, reference, values, mask, targets)


def test_sequential_schur_updates_agree():
    # the closed form equals the chain of rank-one Schur updates of ALGORITHM.md section 8
    kernel = random_kernel(6, seed=11)
    oracle = DPPOracle(kernel=kernel)
    values = torch.tensor([[1, 0, 0, 1, 0, 0]])
    mask = torch.tensor([[True, True, False, True, False, False]])
    k = oracle.kernel.clone()
    for i in [0, 1, 3]:
        if values[0, i] == 1:
            k = k - torch.outer(k[:, i], k[i, :]) / k[i, i]
        else:
            k = k + torch.outer(k[:, i], k[i, :]) / (1 - k[i, i])
    out = oracle.log_marginals(values, mask)[0]
    for i in [2, 4, 5]:
        torch.testing.assert_close(out[i, 1].exp(), k[i, i])


def test_batch_of_one_and_point_masses():
    oracle = DPPOracle(L=torch.tensor([[1.0, 0.5], [0.5, 1.0]]))
    values = torch.tensor([[1, 5]])
    mask = torch.tensor([[True, False]])
    out = oracle.log_marginals(values, mask)
    assert out.shape == (1, 2, 2)
    assert out[0, 0].tolist() == [-math.inf, 0.0]
    # P(1 in | 0 in) = det(L_{01}) / (det(L_{01}) + det(L_0)) = 0.75 / 1.75
    torch.testing.assert_close(out[0, 1, 1].exp(), torch.tensor(0.75 / 1.75, dtype=torch.float64))
    at = oracle.log_marginals_at(values, mask, torch.tensor([[1, 0]]))
    torch.testing.assert_close(at[0], out[0, [1, 0]])


def test_projection_dpp_has_fixed_size():
    kernel = random_kernel(5, seed=2, projection_rank=2)
    oracle = DPPOracle(kernel=kernel)
    values = torch.tensor([[1, 1, 0, 0, 0]])
    mask = torch.tensor([[True, True, False, False, False]])
    out = oracle.log_marginals(values, mask)[0, 2:].exp()
    torch.testing.assert_close(out[:, 1], torch.zeros(3, dtype=torch.float64), atol=1e-12, rtol=0)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(), "exactly one of kernel"),
        (dict(kernel=torch.eye(2), L=torch.eye(2)), "exactly one of kernel"),
        (dict(kernel=torch.ones(2, 3)), "square"),
        (dict(kernel=torch.tensor([[0.5, 0.1], [0.0, 0.5]])), "symmetric"),
        (dict(kernel=2 * torch.eye(2)), "eigenvalues in \\[0, 1\\]"),
        (dict(L=-torch.eye(2)), "positive semi-definite"),
    ],
)
def test_constructor_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DPPOracle(**kwargs)
