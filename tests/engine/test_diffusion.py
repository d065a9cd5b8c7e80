"""Exactness and plumbing of the diffusion engine (sample_diffusion / sample_sde).

Statistical tests use scipy p-values with a failure threshold of 2e-5 and fixed seeds, and
moment tests use 5 standard errors (STYLE.md tiers 1 to 3).
"""

from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats

from pyro_autospec.engine import Schedule
from pyro_autospec.engine.diffusion import (
    DiffusionResult,
    euler_maruyama_log_prob,
    sample_diffusion,
    sample_sde,
)
from pyro_autospec.engine.diffusion_schedule import diffusion_times
from pyro_autospec.engine.errors import OracleError
from pyro_autospec.oracles.denoisers import (
    FiniteSupportDenoiser,
    GaussianDenoiser,
    GaussianMixtureDenoiser,
)
from tests.stats import P_THRESHOLD

ALPHA = 2e-5
K_SIGMA = 5.0
ROOT = Path(__file__).resolve().parents[2]

MEAN = torch.tensor([1.0, -2.0], dtype=torch.float64)
COV = torch.tensor([[4.0, 1.5], [1.5, 1.0]], dtype=torch.float64)
FINE = diffusion_times(16, delta=0.05)
COARSE = torch.tensor([0.0, 0.5, 2.0, 6.0, 20.0], dtype=torch.float64)


@pytest.fixture(autouse=True, scope="module")
def single_thread_torch():
    """Tiny oracle calls: intra-op threads only add synchronisation on a busy 2-core runner."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ---------------------------------------------------------------------------------- exact laws
def linear_chain_moments(times, step_matrix, step_offset, x0, scale=1.0):
    """Exact mean and covariance of every state of X_{k+1} = M_k X_k + c_k + s sqrt(h) xi."""
    times = np.asarray(times, dtype=np.float64)
    d = x0.shape[0]
    mean, cov = x0.astype(np.float64), np.zeros((d, d))
    means, covs = [mean], [cov]
    for k in range(times.shape[0] - 1):
        h = times[k + 1] - times[k]
        M, c = step_matrix(times[k], h), step_offset(times[k], h)
        mean = M @ mean + c
        cov = M @ cov @ M.T + scale**2 * h * np.eye(d)
        means.append(mean)
        covs.append(cov)
    return np.array(means), np.array(covs)


def gaussian_sl_moments(times, mean, cov):
    """Exact moments of the Euler chain of stochastic localization for Y ~ N(mean, cov)."""
    m, C = mean.numpy(), cov.numpy()
    d = m.shape[0]

    def gain(t):
        return C @ np.linalg.inv(t * C + np.eye(d))

    return linear_chain_moments(
        times,
        lambda t, h: np.eye(d) + h * gain(t),
        lambda t, h: h * (m - t * gain(t) @ m),
        np.zeros(d),
    )


def assert_gaussian_law(x: np.ndarray, mean: np.ndarray, cov: np.ndarray) -> None:
    """KS per coordinate (p > ALPHA) and mean / covariance within 5 standard errors."""
    n, d = x.shape
    for i in range(d):
        p = stats.kstest(x[:, i], "norm", args=(mean[i], math.sqrt(cov[i, i]))).pvalue
        assert p > ALPHA, f"KS coordinate {i}: p = {p:.2e}"
    se_mean = np.sqrt(np.diag(cov) / n)
    assert np.all(np.abs(x.mean(0) - mean) < K_SIGMA * se_mean), (x.mean(0), mean)
    sample_cov = np.cov(x.T)
    # Var of a Gaussian sample covariance entry: (S_ii S_jj + S_ij^2) / n
    se_cov = np.sqrt((np.outer(np.diag(cov), np.diag(cov)) + cov**2) / n)
    assert np.all(np.abs(sample_cov - cov) < K_SIGMA * se_cov), (sample_cov, cov)


def assert_same_law(x: np.ndarray, y: np.ndarray, projections=None) -> None:
    """Two-sample KS per coordinate and along extra projections (p > ALPHA each)."""
    d = x.shape[1]
    directions = [np.eye(d)[i] for i in range(d)] + list(projections or [])
    for v in directions:
        p = stats.ks_2samp(x @ v, y @ v).pvalue
        assert p > ALPHA, f"two-sample KS along {v}: p = {p:.2e}"


# ---------------------------------------------------------------------------------- tier 3
@pytest.mark.parametrize("times", [FINE, COARSE], ids=["fine", "coarse"])
def test_gaussian_target_exact_moments(times):
    oracle = GaussianDenoiser(MEAN, COV)
    result = sample_diffusion(oracle, 2000, times=times, seed=11, return_paths=True)
    means, covs = gaussian_sl_moments(times, MEAN, COV)
    paths = result.paths.numpy()
    for k in (len(times) // 2, len(times) - 1):  # a middle state and the final one
        assert_gaussian_law(paths[:, k], means[k], covs[k])
    horizon = times[-1].item()
    assert_gaussian_law(result.samples.numpy() * horizon, means[-1], covs[-1])


def test_gaussian_target_exact_with_other_schedules():
    """Exactness does not depend on the rule, rho, the windows or the per-round cap (coarse
    grid: few, long steps, where frozen-drift drafts fail most)."""
    oracle = GaussianDenoiser(MEAN, COV)
    means, covs = gaussian_sl_moments(COARSE, MEAN, COV)
    for options in (
        {"rule": "block"},
        {"rule": "block", "rho": "adaptive"},
        {"rule": "block", "rho": 0.3, "max_block": 2},
        {"rule": "block", "rho": lambda size, log_ratio: 3.0, "max_rows_per_round": 64},
        {"max_block": 2, "min_block": 1},
        {"max_block": 3, "max_rows_per_round": 5, "max_concurrent_draws": 100},
    ):
        result = sample_diffusion(oracle, 1500, times=COARSE, seed=5, schedule=options)
        assert_gaussian_law(result.samples.numpy() * COARSE[-1].item(), means[-1], covs[-1])


def test_sample_sde_linear_drift_with_scale_exact_moments():
    """A linear SDE with scale != 1: checks the 1 / s^2 of the log ratio by exact moments."""
    A = np.array([[-3.0, 2.0], [-2.0, -1.0]])
    c = np.array([1.0, -0.5])
    scale = 0.5
    At = torch.from_numpy(A)

    def drift(t, x):
        return x @ At.T.to(x) + torch.from_numpy(c).to(x) * torch.cos(t)[:, None]

    times = torch.linspace(0.0, 2.0, 13, dtype=torch.float64)
    x0 = np.array([1.5, -1.0])
    means, covs = linear_chain_moments(
        times, lambda t, h: np.eye(2) + h * A, lambda t, h: h * c * math.cos(t), x0, scale
    )
    result = sample_sde(drift, times, torch.from_numpy(x0), 2000, scale=scale, seed=2)
    assert_gaussian_law(result.samples.numpy(), means[-1], covs[-1])


# ---------------------------------------------------------------------------------- tier 1
def test_mixture_target_autospec_matches_sequential():
    oracle = GaussianMixtureDenoiser(
        torch.tensor([0.5, 0.3, 0.2]),
        torch.tensor([[-2.0, 0.0], [2.0, 1.0], [0.0, 3.0]]),
        torch.stack(
            [0.3 * torch.eye(2), torch.tensor([[0.5, 0.3], [0.3, 0.4]]), 0.1 * torch.eye(2)]
        ),
    )
    kwargs = {"num_steps": 16, "delta": 0.05}
    fast = sample_diffusion(oracle, 1500, seed=3, **kwargs)
    slow = sample_diffusion(oracle, 1500, seed=4, method="sequential", **kwargs)
    assert_same_law(fast.samples.numpy(), slow.samples.numpy(), [np.array([1.0, 1.0]) / 2**0.5])


def test_finite_support_autospec_matches_sequential():
    angles = torch.arange(6, dtype=torch.float64) * (2 * math.pi / 6)
    points = torch.stack([torch.cos(angles), torch.sin(angles)], -1)
    oracle = FiniteSupportDenoiser(points, torch.tensor([1.0, 2.0, 1.0, 3.0, 1.0, 2.0]))
    kwargs = {"num_steps": 24, "delta": 0.02}
    fast = sample_diffusion(oracle, 1500, seed=6, **kwargs)
    slow = sample_diffusion(oracle, 1500, seed=7, method="sequential", **kwargs)
    x, y = fast.samples.numpy(), slow.samples.numpy()
    assert_same_law(x, y, [np.array([1.0, 1.0]) / 2**0.5])
    # chi-square on the nearest support point (>= 30 expected per cell)
    nearest_x = np.argmin(((x[:, None] - points.numpy()) ** 2).sum(-1), 1)
    nearest_y = np.argmin(((y[:, None] - points.numpy()) ** 2).sum(-1), 1)
    table = np.stack([np.bincount(nearest_x, minlength=6), np.bincount(nearest_y, minlength=6)])
    assert stats.contingency.expected_freq(table).min() >= 30
    assert stats.chi2_contingency(table).pvalue > ALPHA


def test_sample_sde_nonlinear_drift_matches_sequential():
    def drift(t, x):
        return (
            2.0 * torch.sin(3.0 * x)
            - x**3
            + 0.5 * torch.roll(x, 1, dims=1) * torch.cos(4 * t)[:, None]
        )

    times = torch.linspace(0.0, 1.5, 13, dtype=torch.float64)
    x0 = torch.tensor([0.5, -1.0], dtype=torch.float64)
    fast = sample_sde(drift, times, x0, 1500, scale=0.8, seed=8, return_paths=True)
    slow = sample_sde(
        drift, times, x0, 1500, scale=0.8, seed=9, method="sequential", return_paths=True
    )
    assert_same_law(fast.samples.numpy(), slow.samples.numpy(), [np.array([1.0, -1.0]) / 2**0.5])
    assert_same_law(fast.paths[:, 5].numpy(), slow.paths[:, 5].numpy())


# ---------------------------------------------------------------------------------- bookkeeping
@pytest.mark.parametrize("method", ["autospec", "sequential", "picard"])
def test_log_prob_is_the_chain_density_of_the_returned_path(method):
    oracle = FiniteSupportDenoiser.unit_sphere(5, 3, seed=1)
    result = sample_diffusion(oracle, 20, num_steps=24, method=method, seed=0, return_paths=True)
    direct = euler_maruyama_log_prob(oracle, result.times, result.paths)
    assert result.log_prob.dtype == torch.float64
    torch.testing.assert_close(result.log_prob, direct, rtol=1e-9, atol=1e-7)
    assert torch.allclose(result.samples, result.paths[:, -1] / result.times[-1])
    assert result.paths.shape == (20, 25, 3)


def test_sequential_counts_and_result_fields():
    oracle = GaussianDenoiser(MEAN, COV)
    result = sample_diffusion(oracle, 7, times=FINE, method="sequential", seed=0)
    assert isinstance(result, DiffusionResult)
    assert result.rounds == 16 and result.oracle_rows == 7 * 16
    assert result.sample_rounds.tolist() == [16] * 7
    assert result.sample_rounds.dtype == torch.long
    assert result.paths is None and result.error is None
    assert result.num_steps == 16 and result.num_samples == 7
    assert "sequential" in repr(result)


def test_sequential_all_draws_at_once_equals_the_batched_loop(capsys):
    # With every draw in flight and no row cap, the chain runs all draws in lockstep and draws
    # the noise of many steps at once; capping draws or rows takes the token rule with windows
    # of one step. Both read the same keyed noise with the same arithmetic: the same bits.
    oracle = GaussianDenoiser(MEAN, COV)
    base = sample_diffusion(
        oracle, 7, times=FINE, method="sequential", seed=3, return_paths=True, progress=True
    )
    assert "sequential" in capsys.readouterr().err  # the bar counts steps
    for knobs in ({"max_concurrent_draws": 3}, {"max_rows_per_round": 5}):
        other = sample_diffusion(
            oracle, 7, times=FINE, method="sequential", seed=3, return_paths=True, schedule=knobs
        )
        assert torch.equal(other.samples, base.samples)
        assert torch.equal(other.paths, base.paths)
        assert torch.equal(other.log_prob, base.log_prob)
        assert other.oracle_rows == base.oracle_rows == 7 * 16
    assert base.rounds == 16 and base.sample_rounds.tolist() == [16] * 7


def test_autospec_counts_are_consistent():
    oracle = FiniteSupportDenoiser.unit_sphere(8, 2, seed=0)
    result = sample_diffusion(oracle, 16, num_steps=64, seed=1)
    assert result.rounds >= int(result.sample_rounds.max())
    assert result.oracle_rows >= 16 * 2  # at least the first row and one verification
    assert result.sample_rounds.min() >= 2


def test_same_seed_same_output():
    oracle = FiniteSupportDenoiser.unit_sphere(6, 2, seed=0)
    for method in ("autospec", "sequential", "picard"):
        a = sample_diffusion(oracle, 10, num_steps=32, seed=123, method=method)
        b = sample_diffusion(oracle, 10, num_steps=32, seed=123, method=method)
        c = sample_diffusion(oracle, 10, num_steps=32, seed=124, method=method)
        assert torch.equal(a.samples, b.samples) and torch.equal(a.log_prob, b.log_prob)
        assert a.rounds == b.rounds and a.oracle_rows == b.oracle_rows
        assert not torch.equal(a.samples, c.samples)
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    a = sample_diffusion(oracle, 10, num_steps=32, seed=g1)
    b = sample_diffusion(oracle, 10, num_steps=32, seed=g2)
    assert torch.equal(a.samples, b.samples)


def test_picard_reports_error_and_converges_to_sequential_path():
    oracle = FiniteSupportDenoiser.unit_sphere(6, 2, seed=0)
    loose = sample_diffusion(
        oracle, 8, num_steps=64, method="picard", seed=1, schedule=Schedule(tolerance=0.1)
    )
    exact = sample_diffusion(
        oracle, 8, num_steps=64, method="picard", seed=1, schedule=Schedule(tolerance=0.0)
    )
    assert loose.error is not None and loose.error.shape == (8,)
    assert float(exact.error.max()) < 1e-9  # tolerance 0: the sequential path, same noise
    assert "max error" in repr(loose)


def test_float32_oracle_and_dtype_following():
    oracle = FiniteSupportDenoiser.unit_sphere(6, 2, seed=0, dtype=torch.float32)
    result = sample_diffusion(oracle, 5, num_steps=16, seed=0, return_paths=True)
    assert result.samples.dtype == torch.float32 and result.paths.dtype == torch.float32
    assert result.log_prob.dtype == torch.float64
    assert result.samples.device == oracle.device


def test_x0_per_sample_and_max_rows_per_call():
    x0 = torch.arange(8, dtype=torch.float64).reshape(4, 2)
    times = torch.linspace(0, 1, 9, dtype=torch.float64)
    result = sample_sde(
        lambda t, x: -x,
        times,
        x0,
        4,
        seed=0,
        return_paths=True,
        schedule=Schedule(max_rows_per_call=3),
    )
    assert torch.equal(result.paths[:, 0], x0)


def test_engine_does_not_import_pyro():
    for rel in (
        "pyro_autospec/engine/diffusion.py",
        "pyro_autospec/engine/diffusion_schedule.py",
        "pyro_autospec/oracles/denoisers.py",
    ):
        tree = ast.parse((ROOT / rel).read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert not any(n == "pyro" or n.startswith("pyro.") for n in names), (rel, names)


# ---------------------------------------------------------------------------------- schedule
def test_default_schedule_is_uniform_then_geometric():
    times = diffusion_times(64, delta=1e-3).numpy()
    assert times.shape == (65,) and times[0] == 0.0 and times[-1] == pytest.approx(1000.0)
    steps = np.diff(times)
    assert (steps > 0).all()
    uniform = times <= 1.0 + 1e-12
    k = int(uniform.sum()) - 1  # number of uniform steps
    np.testing.assert_allclose(steps[:k], steps[0])
    ratios = times[k + 1 :] / times[k:-1]
    np.testing.assert_allclose(ratios, ratios[0], rtol=1e-9)
    assert diffusion_times(10, delta=2.0).numpy() == pytest.approx(np.linspace(0, 0.5, 11))
    assert diffusion_times(64, delta=1e-2, t_switch=2.0).numpy()[-1] == pytest.approx(100.0)


# ---------------------------------------------------------------------------------- errors
class NaNOracle:
    dim = 2

    def __call__(self, t, x):
        out = -x.clone()
        out[t > 0.5] = float("nan")
        return out


class WrongShapeOracle:
    dim = 2

    def __call__(self, t, x):
        return torch.zeros(x.shape[0], 3, dtype=x.dtype)


class NoDimOracle:
    def __call__(self, t, x):
        return x


def test_errors_for_bad_times():
    oracle = GaussianDenoiser(MEAN, COV)
    with pytest.raises(ValueError, match=r"strictly increasing; times\[2\]"):
        sample_diffusion(oracle, 2, times=torch.tensor([0.0, 1.0, 1.0, 2.0]))
    with pytest.raises(ValueError, match="strictly increasing"):
        sample_sde(lambda t, x: x, torch.tensor([0.0, 2.0, 1.0]), torch.zeros(2), 2)
    with pytest.raises(ValueError, match="finite"):
        sample_sde(lambda t, x: x, torch.tensor([0.0, float("nan")]), torch.zeros(2), 2)
    with pytest.raises(ValueError, match="1-D"):
        sample_sde(lambda t, x: x, torch.zeros(2, 2), torch.zeros(2), 2)
    with pytest.raises(ValueError, match=r"times\[0\] must be 0"):
        sample_diffusion(oracle, 2, times=torch.tensor([0.5, 1.0]))
    with pytest.raises(ValueError, match="not both"):
        sample_diffusion(oracle, 2, times=FINE, num_steps=10)
    with pytest.raises(ValueError, match="num_steps"):
        sample_diffusion(oracle, 2, num_steps=0)
    with pytest.raises(ValueError, match="delta"):
        sample_diffusion(oracle, 2, delta=-1.0)


@pytest.mark.parametrize("method", ["autospec", "sequential", "picard"])
def test_errors_for_bad_oracle_outputs(method):
    times = torch.linspace(0, 1, 9)
    with pytest.raises(OracleError, match=r"NaN or inf in row \d+ .*t = "):
        sample_sde(NaNOracle(), times, torch.zeros(2), 3, method=method, seed=0)
    with pytest.raises(OracleError, match=r"shape \(\d+, 3\).*Tensor\[B, d\]"):
        sample_sde(WrongShapeOracle(), times, torch.zeros(2), 3, method=method, seed=0)
    with pytest.raises(OracleError, match="returned list"):
        sample_sde(lambda t, x: [0.0], times, torch.zeros(2), 3, method=method, seed=0)


def _steep(t, x):
    return -x * torch.exp(x * x / 2)  # overflows beyond |x| of about 37.7 in float64


@pytest.mark.parametrize("engine", ["fast", "reference"])
def test_a_drift_not_finite_only_at_drafted_states_the_chain_never_visits(engine):
    """An outside test: autospeculation drafts a window with the drift frozen, and a steep
    drift overflowed at drafted states far past a rejection, which the chain never visits:
    the run raised where sequential sampling ran. Only the drifts at states the chain reaches
    are checked now, and the draws follow the sequential chain's law (KS test); a drift that
    is NaN where the chain goes still raises."""
    times = torch.linspace(0.0, 1.0, 101, dtype=torch.float64)
    x0 = torch.full((1, 1), 2.7, dtype=torch.float64)
    kw = {"dtype": torch.float64, "engine": engine}
    fast = sample_sde(_steep, times, x0.expand(3000, 1), 3000, seed=1, **kw)
    sequential = sample_sde(_steep, times, x0.expand(3000, 1), 3000, method="sequential", seed=2)
    p = stats.ks_2samp(fast.samples[:, 0].numpy(), sequential.samples[:, 0].numpy()).pvalue
    assert p > P_THRESHOLD, p
    if engine == "reference":
        same = sample_sde(_steep, times, x0.expand(3000, 1), 3000, seed=1, dtype=torch.float64)
        assert torch.equal(same.samples, fast.samples)
    with pytest.raises(OracleError, match=r"NaN or inf in row \d+ .*a state the chain reached"):
        sample_sde(NaNOracle(), times, torch.zeros(2), 3, seed=0, engine=engine)


def test_errors_for_dimension_mismatch_and_options():
    times = torch.linspace(0, 1, 5)
    with pytest.raises(
        ValueError, match="dimension mismatch: the drift has dim = 2 but x0 has d = 3"
    ):
        sample_sde(NaNOracle(), times, torch.zeros(3), 2)
    with pytest.raises(ValueError, match="integer attribute `dim`"):
        sample_diffusion(NoDimOracle(), 2, num_steps=4)
    with pytest.raises(ValueError, match="x0 must have shape"):
        sample_sde(lambda t, x: x, times, torch.zeros(3, 2), 2)
    with pytest.raises(ValueError, match="dimension d = 0"):  # was an internal IndexError
        sample_sde(lambda t, x: -x, times, torch.zeros(0), 2)
    with pytest.raises(ValueError, match="num_samples"):
        sample_sde(lambda t, x: x, times, torch.zeros(2), 0)
    with pytest.raises(ValueError, match="method must be one of"):
        sample_sde(lambda t, x: x, times, torch.zeros(2), 2, method="magic")
    with pytest.raises(ValueError, match="rho must be"):
        sample_sde(
            lambda t, x: x, times, torch.zeros(2), 2, schedule=Schedule(rule="block", rho=-1.0)
        )
    with pytest.raises(ValueError, match="rho sets the residual races of rule='block'"):
        sample_sde(lambda t, x: x, times, torch.zeros(2), 2, schedule=Schedule(rho=2.0))
    with pytest.raises(ValueError, match="min_block sets the token rule"):
        sample_sde(
            lambda t, x: x, times, torch.zeros(2), 2, schedule=Schedule(rule="block", min_block=2)
        )
    with pytest.raises(ValueError, match="rule must be 'token'"):
        sample_sde(lambda t, x: x, times, torch.zeros(2), 2, schedule=Schedule(rule="tokens"))
    with pytest.raises(ValueError, match="min_block must be a positive int"):
        sample_sde(lambda t, x: x, times, torch.zeros(2), 2, schedule=Schedule(min_block=0))
    with pytest.raises(ValueError, match=r"min_block=9 is larger than max_block=4; pass"):
        sample_sde(
            lambda t, x: x, times, torch.zeros(2), 2, schedule=Schedule(min_block=9, max_block=4)
        )
    with pytest.raises(ValueError, match="tolerance must be a non-negative float"):
        sample_sde(
            lambda t, x: x,
            times,
            torch.zeros(2),
            2,
            method="picard",
            schedule=Schedule(tolerance="0.1"),
        )
    for name in ("max_rows_per_round", "max_concurrent_draws", "max_rows_per_call"):
        with pytest.raises(ValueError, match=f"{name} must be a positive int"):
            sample_sde(lambda t, x: x, times, torch.zeros(2), 2, schedule={name: True})
    # NumPy's float32 numbers are numbers
    assert sample_sde(lambda t, x: -x, times, torch.zeros(2), 2, scale=np.float32(2.0)).rounds
    gaussian = GaussianDenoiser(MEAN, COV)
    assert sample_diffusion(gaussian, 2, num_steps=8, delta=np.float32(0.05)).rounds
    for rule in ("token", "block"):
        with pytest.raises(ValueError, match="max_block"):
            sample_sde(
                lambda t, x: x, times, torch.zeros(2), 2, schedule=Schedule(rule=rule, max_block=0)
            )
    with pytest.raises(ValueError, match="scale"):
        sample_sde(lambda t, x: x, times, torch.zeros(2), 2, scale=0.0)
    with pytest.raises(ValueError, match="paths must have shape"):
        euler_maruyama_log_prob(lambda t, x: x, times, torch.zeros(3, 4, 2))
