"""EulerMaruyamaPath: exact log_prob, sampling through the parallel sampler, Pyro use."""

from __future__ import annotations

import math

import pyro
import pytest
import torch
from scipy import stats

from pyro_autospec.distributions import EulerMaruyamaPath
from pyro_autospec.engine.errors import OracleError

ALPHA = 2e-5
TIMES = torch.tensor([0.0, 0.1, 0.25, 0.5, 0.6, 1.0], dtype=torch.float64)


@pytest.fixture(autouse=True, scope="module")
def single_thread_torch():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class LinearDrift(torch.nn.Module):
    """b(t, x) = A x + t c, with learnable A and c."""

    dim = 2

    def __init__(self):
        super().__init__()
        self.A = torch.nn.Parameter(torch.tensor([[-1.0, 0.5], [0.2, -2.0]], dtype=torch.float64))
        self.c = torch.nn.Parameter(torch.tensor([0.3, -0.7], dtype=torch.float64))

    def forward(self, t, x):
        return x @ self.A.T + t[:, None] * self.c


def direct_log_prob(drift, times, path, scale):
    """One transition at a time with torch.distributions.Normal."""
    total = torch.zeros((), dtype=torch.float64)
    for k in range(len(times) - 1):
        h = times[k + 1] - times[k]
        x = path[k][None]
        mean = path[k] + drift(times[k : k + 1], x)[0] * h
        total = (
            total + torch.distributions.Normal(mean, scale * h.sqrt()).log_prob(path[k + 1]).sum()
        )
    return total


def test_log_prob_matches_direct_computation_and_gradients():
    drift = LinearDrift()
    x0 = torch.tensor([0.5, -0.5], dtype=torch.float64)
    dist = EulerMaruyamaPath(drift, TIMES, x0, scale=0.7)
    g = torch.Generator().manual_seed(0)
    paths = torch.cat(
        [x0.expand(4, 1, 2), torch.randn(4, 5, 2, generator=g, dtype=torch.float64)], 1
    )
    log_prob = dist.log_prob(paths)
    direct = torch.stack([direct_log_prob(drift, TIMES, p, 0.7) for p in paths])
    assert log_prob.shape == (4,) and log_prob.dtype == torch.float64
    torch.testing.assert_close(log_prob, direct, rtol=1e-12, atol=1e-10)
    (grad,) = torch.autograd.grad(log_prob.sum(), drift.A)
    (grad_direct,) = torch.autograd.grad(direct.sum(), drift.A)
    torch.testing.assert_close(grad, grad_direct)


def test_sample_shapes_start_and_reproducibility():
    x0 = torch.tensor([[0.0, 1.0], [2.0, -1.0], [1.0, 1.0]], dtype=torch.float64)
    dist = EulerMaruyamaPath(LinearDrift(), TIMES, x0)
    assert dist.batch_shape == (3,) and dist.event_shape == (6, 2)
    pyro.set_rng_seed(1)
    paths = dist.sample((4,))
    assert paths.shape == (4, 3, 6, 2)
    assert torch.equal(paths[..., 0, :], x0.expand(4, 3, 2))
    assert dist.last_result is not None and dist.last_result.num_samples == 12
    pyro.set_rng_seed(1)
    assert torch.equal(dist.sample((4,)), paths)
    assert dist.log_prob(paths).shape == (4, 3)
    assert dist.expand((5, 3)).sample().shape == (5, 3, 6, 2)
    assert dist.sample((0,)).shape == (0, 3, 6, 2)


def test_sample_law_matches_sequential_chain():
    drift = LinearDrift()
    with torch.no_grad():
        drift.A.mul_(3.0)
    x0 = torch.tensor([1.0, -1.0], dtype=torch.float64)
    times = torch.linspace(0, 1, 11, dtype=torch.float64)
    pyro.set_rng_seed(2)
    fast = EulerMaruyamaPath(drift, times, x0, scale=0.5).sample((1500,))[:, -1]
    slow = EulerMaruyamaPath(drift, times, x0, scale=0.5, method="sequential").sample((1500,))[
        :, -1
    ]
    for i in range(2):
        assert stats.ks_2samp(fast[:, i].detach(), slow[:, i].detach()).pvalue > ALPHA


def test_inside_a_pyro_model():
    drift = LinearDrift()
    x0 = torch.zeros(2, dtype=torch.float64)
    pyro.set_rng_seed(3)
    observed = EulerMaruyamaPath(drift, TIMES, x0).sample()

    def model(path=None):
        return pyro.sample("path", EulerMaruyamaPath(drift, TIMES, x0), obs=path)

    trace = pyro.poutine.trace(model).get_trace(observed)
    expected = direct_log_prob(drift, TIMES, observed, 1.0)
    assert trace.log_prob_sum().item() == pytest.approx(expected.item(), rel=1e-10)
    sampled = pyro.poutine.trace(model).get_trace()
    assert sampled.nodes["path"]["value"].shape == (6, 2)
    assert math.isfinite(sampled.log_prob_sum().item())


def test_errors():
    drift = LinearDrift()
    with pytest.raises(ValueError, match="strictly increasing"):
        EulerMaruyamaPath(drift, torch.tensor([0.0, 1.0, 0.5]), torch.zeros(2))
    with pytest.raises(ValueError, match="dimension mismatch"):
        EulerMaruyamaPath(drift, TIMES, torch.zeros(3))
    with pytest.raises(ValueError, match="callable"):
        EulerMaruyamaPath(3.0, TIMES, torch.zeros(2))
    with pytest.raises(ValueError, match="scale"):
        EulerMaruyamaPath(drift, TIMES, torch.zeros(2), scale=-1.0)
    dist = EulerMaruyamaPath(drift, TIMES, torch.zeros(2, dtype=torch.float64), validate_args=True)
    with pytest.raises(ValueError, match="must equal x0"):
        dist.log_prob(torch.ones(6, 2, dtype=torch.float64))
    bad = EulerMaruyamaPath(lambda t, x: x * float("nan"), TIMES, torch.zeros(2))
    with pytest.raises(OracleError, match="NaN"):
        bad.log_prob(torch.zeros(6, 2))
    with pytest.raises(OracleError, match="NaN"):
        bad.sample()
