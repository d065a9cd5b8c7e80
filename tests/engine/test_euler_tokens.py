"""The step-by-step rule for Euler-Maruyama chains (``rule="token"``, the default).

Statistical tests use scipy p-values with a failure threshold of 2e-5 and fixed seeds.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from pyro_autospec.engine import Schedule, keys
from pyro_autospec.engine.diffusion import (
    euler_maruyama_log_prob,
    sample_diffusion,
    sample_sde,
)
from pyro_autospec.engine.euler import Chain
from pyro_autospec.engine.euler_tokens import (
    HostChain,
    draft_windows,
    row_mask,
    verify_windows,
)
from pyro_autospec.oracles.denoisers import FiniteSupportDenoiser

ALPHA = 2e-5


def one_step_verdicts(frozen, target, h=0.5, scale=1.0, num=20000, seed=0):
    """Many one-step windows whose drift at the start was not known: the draft uses
    ``frozen``, the chain's step ``target``."""
    times = torch.tensor([0.0, h], dtype=torch.float64)
    chain = HostChain.of(Chain(times, scale, len(frozen), torch.device("cpu")))
    draw_keys = keys.draw_keys(seed, torch.arange(num)).numpy()
    windows = np.tile(np.array([[0, 1]]), (num, 1))  # step 0, one step
    x = np.zeros((num, len(frozen)))
    frozen = np.broadcast_to(np.asarray(frozen, dtype=np.float64), x.shape).copy()
    draft = draft_windows(chain, draw_keys, windows, x, frozen)
    mask = row_mask(chain, windows, np.zeros(num, dtype=bool))
    assert mask[:, 0].all() and not mask[:, 1].any()  # the start's drift only: the end is N
    drifts = np.zeros(draft.states.shape)
    drifts[:, 0] = target
    return chain, verify_windows(chain, draft, drifts)


@pytest.mark.parametrize(
    "frozen, target",
    [([1.5, -0.5], [0.0, 0.3]), ([6.0, 6.0], [-2.0, 1.0]), ([0.05, 0.0], [0.0, 0.0])],
    ids=["moderate", "bad-draft", "close"],
)
def test_a_step_has_the_chains_law_whatever_the_draft(frozen, target):
    """Kept or reflected, a step is N(b h, s^2 h I) exactly, and it is redrawn with
    probability TV(p, q) (bad drafts included: almost every step reflected)."""
    h, scale = 0.5, 0.8
    chain, verdict = one_step_verdicts(frozen, target, h, scale)
    steps = verdict.increments[:, 0]
    mean, sd = np.asarray(target) * h, scale * math.sqrt(h)
    gap = np.asarray(frozen) - np.asarray(target)
    e = gap / np.linalg.norm(gap)
    for v in (np.eye(2)[0], np.eye(2)[1], e, np.array([-e[1], e[0]])):
        p = stats.kstest(steps @ v, "norm", args=(mean @ v, sd)).pvalue
        assert p > ALPHA, (v, p)
    tv = 2 * stats.norm.cdf(np.linalg.norm(gap) * h / (2 * sd)) - 1
    missed = int(verdict.missed.sum())
    assert stats.binomtest(missed, steps.shape[0], tv).pvalue > ALPHA
    assert (verdict.count == 1).all()
    log_density = stats.multivariate_normal(mean, sd**2 * np.eye(2)).logpdf(steps)
    np.testing.assert_allclose(verdict.log_density, log_density, rtol=1e-10)


def test_time_varying_drift_exact_law():
    """A drift that oscillates within every window (frozen drafts fail often): the chain is
    Gaussian with a known mean and variance."""
    times = torch.linspace(0.0, 2.0, 41, dtype=torch.float64)
    scale = 0.7

    def drift(t, x):
        return (6.0 * torch.cos(25.0 * t))[:, None].expand_as(x).clone()

    x0 = np.array([0.3])
    result = sample_sde(drift, times, torch.from_numpy(x0), 4000, scale=scale, seed=4)
    grid = times.numpy()
    mean = x0[0] + float((6.0 * np.cos(25.0 * grid[:-1]) * np.diff(grid)).sum())
    p = stats.kstest(result.samples[:, 0].numpy(), "norm", args=(mean, scale * math.sqrt(2.0)))
    assert p.pvalue > ALPHA
    assert result.oracle_rows > 4000 * 40  # windows failed and were redrawn


def test_stiff_linear_drift_exact_law():
    """dX = -a X dt + s dB on a coarse grid (h a = 1.2: the frozen drift is far off after one
    step): Euler's X_{k+1} = (1 - a h) X_k + s sqrt(h) xi, moments by recursion."""
    a, scale = 6.0, 1.0
    times = torch.linspace(0.0, 2.0, 11, dtype=torch.float64)
    result = sample_sde(lambda t, x: -a * x, times, torch.tensor([2.0]), 4000, scale=scale, seed=5)
    mean, var = 2.0, 0.0
    for h in np.diff(times.numpy()):
        mean, var = (1 - a * h) * mean, (1 - a * h) ** 2 * var + scale**2 * h
    p = stats.kstest(result.samples[:, 0].numpy(), "norm", args=(mean, math.sqrt(var))).pvalue
    assert p > ALPHA


def test_a_constant_drift_passes_every_window_whole():
    """The frozen drift is the chain's drift: every step passes, every state is asked once."""
    times = torch.linspace(0.0, 1.0, 101, dtype=torch.float64)
    result = sample_sde(
        lambda t, x: torch.full_like(x, 0.5),
        times,
        torch.zeros(2, dtype=torch.float64),
        6,
        seed=1,
        return_paths=True,
    )
    assert result.oracle_rows == 6 * 100  # X_0 .. X_99, once each
    # the first round asks X_0's drift, then windows of 20 (= max(8, 2 sqrt 100)) steps
    assert result.sample_rounds.tolist() == [1 + 5] * 6
    direct = euler_maruyama_log_prob(lambda t, x: torch.full_like(x, 0.5), times, result.paths)
    torch.testing.assert_close(result.log_prob, direct, rtol=1e-10, atol=1e-8)


def test_max_block_one_is_the_sequential_chain():
    oracle = FiniteSupportDenoiser.unit_sphere(5, 3, seed=2)
    one = sample_diffusion(
        oracle, 7, num_steps=32, seed=3, schedule=Schedule(max_block=1, min_block=1)
    )
    seq = sample_diffusion(oracle, 7, num_steps=32, seed=3, method="sequential")
    assert torch.equal(one.samples, seq.samples)
    assert torch.equal(one.log_prob, seq.log_prob)  # the same arithmetic, on the same plane
    assert one.rounds == seq.rounds == 32 and one.oracle_rows == seq.oracle_rows


def test_same_draws_whatever_the_batch_and_the_caps():
    """16 draws at once, 8 + 8 by continuous batching, or rounds cut by a row cap: the same
    bits; the recorded schedule, passed back, gives them again."""
    oracle = FiniteSupportDenoiser.unit_sphere(8, 2, seed=0)
    base = sample_diffusion(oracle, 16, num_steps=64, seed=9, return_paths=True)
    for knobs in ({"max_concurrent_draws": 8}, {"max_rows_per_round": 40}):
        other = sample_diffusion(
            oracle, 16, num_steps=64, seed=9, return_paths=True, schedule=knobs
        )
        assert torch.equal(other.samples, base.samples)
        assert torch.equal(other.log_prob, base.log_prob)
        assert torch.equal(other.paths, base.paths)
        assert other.oracle_rows == base.oracle_rows
    assert base.schedule["rule"] == "token" and base.schedule["max_block"] == 16
    again = sample_diffusion(oracle, 16, num_steps=64, seed=9, schedule=base.schedule)
    assert torch.equal(again.samples, base.samples)


def test_counts_and_progress(capsys):
    oracle = FiniteSupportDenoiser.unit_sphere(8, 2, seed=0)
    result = sample_diffusion(oracle, 10, num_steps=128, seed=1, progress=True)
    assert "autospec" in capsys.readouterr().err
    assert result.rounds >= int(result.sample_rounds.max())
    assert result.sample_rounds.min() >= 1 + 128 // 23  # the first row, then windows <= 23
    assert 10 * 128 <= result.oracle_rows <= 10 * 128 * 3
    assert result.rounds < 128  # against 128 sequentially
