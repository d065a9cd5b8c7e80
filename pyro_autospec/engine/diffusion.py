"""Exact parallel simulation of Euler-Maruyama chains by autospeculation.

The target is the law of the Euler-Maruyama chain of ``dX = b(t, X) dt + s dB`` on a grid
``t_0 < t_1 < ... < t_N`` (``h_k = t_{k+1} - t_k``)::

    X_{k+1} = X_k + b(t_k, X_k) h_k + s sqrt(h_k) xi_k,    xi_k ~ N(0, I_d).

Sequentially that is ``N`` rounds: every step needs the drift at the state the previous step
produced. Here the coordinates of autospeculation are the ``N`` increments, in time order
(ALGORITHM.md sections 2 and 4):

* A block of steps ``[a, b)`` with known state ``X_a`` and drift row ``b_a = b(t_a, X_a)`` has
  target ``mu_S``, the chain's law of the block's increments, and draft ``nu_S``: every
  increment drawn with the frozen drift ``b_a`` (independent Gaussians, no oracle call).
* ONE round verifies a draft: the drifts ``b_k`` along the drafted path for ``a < k < b``, plus
  a prefetch row ``b(t_b, X_b)`` that becomes the next block's frozen drift. The log ratio is
  ``log dmu_S/dnu_S = sum_k [<b_k - b_a, dX_k> - (|b_k|^2 - |b_a|^2) h_k / 2] / s^2``.
* A rejected draft is followed by exact tries ``y ~ mu_S`` (left half, then right half,
  recursively), run as parallel threads and accepted with probability
  ``max(0, 1 - nu_S(y) / mu_S(y))`` by the smallest accepted index. The output is EXACTLY the
  sequential chain's law; parallelism only changes the number of rounds.

For stochastic localization (:func:`sample_diffusion`) the drift is the denoiser
``f(t, x) = E[Y | t Y + B_t = x]``, ``X_0 = 0``, ``s = 1`` and the sample is ``X_T / T``.

Two baselines run on the same :class:`~pyro_autospec.engine.scheduler.Scheduler`, so that rounds
and rows are counted the same way: ``method="sequential"`` (one row per round, the reference)
and ``method="picard"`` (ParaDiGMS-style sliding-window fixed-point iteration; approximate, it
reports its error against the sequential path driven by the same noise).

This module does not import Pyro.

References
----------
1. N. Anari, C. Baronio, CJ Chen, A. Haqi, F. Koehler, A. Li, T.-D. Vuong. "Parallel Sampling
   via Autospeculation." arXiv:2511.07869 (STOC 2026).
2. J. Benton, V. De Bortoli, A. Doucet, G. Deligiannidis. "Nearly d-linear convergence bounds
   for diffusion models via stochastic localization." ICLR 2024.
3. A. Shih, S. Belkhale, S. Ermon, D. Sadigh, N. Anari. "Parallel Sampling of Diffusion
   Models." NeurIPS 2023 (ParaDiGMS).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from pyro_autospec.engine.diffusion_schedule import check_times, diffusion_times
from pyro_autospec.engine.errors import OracleError
from pyro_autospec.engine.random import make_rng
from pyro_autospec.engine.rejection import accept_draft, accept_residual
from pyro_autospec.engine.scheduler import Call, FirstAccepted, Scheduler

__all__ = [
    "DiffusionResult",
    "diffusion_times",
    "euler_maruyama_log_prob",
    "sample_diffusion",
    "sample_sde",
]

METHODS = ("autospec", "sequential", "picard")
Drift = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class DiffusionResult:
    """Euler-Maruyama samples and what they cost.

    Attributes
    ----------
    samples : Tensor[N, d]
        The draws: ``X_T / T`` for :func:`sample_diffusion`, ``X_T`` for :func:`sample_sde`.
    paths : Tensor[N, num_steps + 1, d] or None
        The whole chains ``X_{t_0}, ..., X_{t_N}`` when ``return_paths=True``.
    log_prob : DoubleTensor[N]
        Log density of each path's increments under the discretized chain: the sum of the
        Gaussian transition log densities ``log N(X_{k+1}; X_k + b(t_k, X_k) h_k, s^2 h_k I)``.
    rounds : int
        Batched oracle calls of the whole run (latency on parallel hardware).
    sample_rounds : LongTensor[N]
        Rounds in which draw ``k`` had a query in flight: its own latency in rounds.
    oracle_rows : int
        ``(t, x)`` rows queried by the whole run, cancelled work included.
    method : str
        ``"autospec"``, ``"sequential"`` or ``"picard"``.
    wall_time : float
        Seconds the sampling took (for picard, without the error computation).
    times : DoubleTensor[num_steps + 1]
        The time grid.
    error : DoubleTensor[N] or None
        Picard only: Euclidean distance between each sample and the sample the sequential
        chain gives with the same noise (``None`` for the exact methods).
    """

    samples: torch.Tensor
    paths: torch.Tensor | None
    log_prob: torch.Tensor
    rounds: int
    sample_rounds: torch.Tensor
    oracle_rows: int
    method: str
    wall_time: float
    times: torch.Tensor
    error: torch.Tensor | None = None

    @property
    def num_samples(self) -> int:
        """``N``, the number of draws."""
        return int(self.samples.shape[0])

    @property
    def num_steps(self) -> int:
        """The number of Euler-Maruyama steps."""
        return int(self.times.shape[0]) - 1

    def __repr__(self) -> str:
        mean_rounds = self.sample_rounds.double().mean().item() if self.num_samples else 0.0
        text = (
            f"DiffusionResult(method={self.method!r}, num_samples={self.num_samples}, "
            f"num_steps={self.num_steps}, rounds={self.rounds}, "
            f"mean sample_rounds={mean_rounds:.1f}, oracle_rows={self.oracle_rows}, "
            f"wall_time={self.wall_time:.3f}s"
        )
        if self.error is not None:
            text += f", max error={self.error.max().item():.3g}"
        return text + ")"


# ---------------------------------------------------------------------------------- oracle calls
def _check_drift_output(
    out, t: torch.Tensor, x: torch.Tensor, dim: int, name: str, offset: int = 0
) -> None:
    """Raise :class:`OracleError` unless ``out`` is a finite Tensor[B, d]."""
    rows = t.shape[0]
    if not isinstance(out, torch.Tensor):
        raise OracleError(
            f"{name} returned {type(out).__name__}; it must return a Tensor[B, d] "
            f"for t: Tensor[B], x: Tensor[B, d]"
        )
    if out.shape != (rows, dim):
        raise OracleError(
            f"{name} returned shape {tuple(out.shape)} for {rows} rows of dimension "
            f"d = {dim}; it must map t: Tensor[B], x: Tensor[B, d] to Tensor[B, d]. "
            f"Check that it is batched over rows and that its `dim` matches x0 / the target"
        )
    finite = torch.isfinite(out.detach()).all(dim=1)
    if not bool(finite.all()):
        i = int(torch.nonzero(~finite)[0, 0])
        raise OracleError(
            f"{name} returned NaN or inf in row {offset + i} of a call "
            f"(t = {float(t[i]):.6g}, |x| = {float(x[i].double().norm()):.6g}); the exact sampler "
            f"cannot continue. Compute it in log space (logsumexp) / float64, or check the "
            f"{name} at this time and state"
        )


class _Evaluator:
    """Batched, validated drift evaluation: float64 NumPy in, float64 NumPy out."""

    def __init__(self, drift: Drift, dim: int, device, dtype, max_rows_per_call: int | None, name):
        self.drift = drift
        self.dim = dim
        self.device = device
        self.dtype = dtype
        self.max_rows_per_call = max_rows_per_call
        self.name = name

    def __call__(self, t: np.ndarray, x: np.ndarray) -> np.ndarray:
        rows = t.shape[0]
        chunk = self.max_rows_per_call or max(rows, 1)
        outputs = [self._call(t[i : i + chunk], x[i : i + chunk], i) for i in range(0, rows, chunk)]
        return outputs[0] if len(outputs) == 1 else np.concatenate(outputs)

    def _call(self, t: np.ndarray, x: np.ndarray, offset: int) -> np.ndarray:
        tt = torch.from_numpy(t).to(device=self.device, dtype=self.dtype)
        xx = torch.from_numpy(x).to(device=self.device, dtype=self.dtype)
        with torch.no_grad():
            out = self.drift(tt, xx)
        _check_drift_output(out, tt, xx, self.dim, self.name, offset)
        return out.detach().to("cpu", torch.float64).numpy()

    def dispatch(self, payloads: list) -> list:
        """``Scheduler`` dispatch: concatenate every ``(t, x)`` payload into one call."""
        sizes = [p[0].shape[0] for p in payloads]
        t = np.concatenate([p[0] for p in payloads])
        x = np.concatenate([p[1] for p in payloads])
        out = self(t, x)
        return np.split(out, np.cumsum(sizes)[:-1])


# ---------------------------------------------------------------------------------- the chain
class _Chain:
    """The discretized chain and the sampler's settings (shared by every generator)."""

    def __init__(
        self, times: np.ndarray, scale: float, dim: int, rng: np.random.Generator, rho, max_block
    ):
        self.times = times
        self.num_steps = times.shape[0] - 1
        self.h = np.diff(times)
        self.noise_sd = scale * np.sqrt(self.h)
        self.var = scale * scale
        self.dim = dim
        self.rng = rng
        self.rho = rho
        if rho == "adaptive":
            self.thread_growth = _adaptive_rho
        elif callable(rho):
            self.thread_growth = _checked_rho(rho)
        else:
            self.thread_growth = lambda size, log_ratio: rho
        self.max_block = max_block
        self.h_column = self.h[:, None]
        self.noise_column = self.noise_sd[:, None]
        self.precision_column = 1.0 / (self.var * self.h)[:, None]
        # cumulative log normalising constants: sum_{k<j} -d/2 log(2 pi s^2 h_k)
        log_norm = -0.5 * dim * np.log(2 * math.pi * self.var * self.h)
        self.log_norm_cumulative = np.concatenate([[0.0], np.cumsum(log_norm)]).tolist()

    def log_density(self, increments: np.ndarray, drift: np.ndarray, a: int, b: int) -> float:
        """``sum_{k=a}^{b-1} log N(dX_k; drift_k h_k, s^2 h_k I)``; drift [d] or [b-a, d]."""
        resid = increments - drift * self.h_column[a:b]
        quadratic = float((resid * resid * self.precision_column[a:b]).sum())
        return self.log_norm_cumulative[b] - self.log_norm_cumulative[a] - 0.5 * quadratic

    def draw(self, drift: np.ndarray, a: int, b: int) -> np.ndarray:
        """Increments of steps ``a..b-1`` with the frozen drift: Tensor[b - a, d] (float64)."""
        z = self.rng.standard_normal((b - a, self.dim))
        return drift * self.h_column[a:b] + self.noise_column[a:b] * z


def _adaptive_rho(size: int, log_ratio: float) -> float:
    """Thread growth after a draft with log ratio ``log_ratio`` was rejected.

    ``1 - exp(log_ratio)`` is the probability with which this draft was rejected: a one-sample
    guess of ``TV(mu_S, nu_S)``, and residual tries succeed with probability about TV. The
    first batch then holds about ``1 / TV`` tries (at most 4), so a small-TV block does not
    pay one batch of rounds per doubling. Exact for any value (index-ordered acceptance).
    """
    reject = -math.expm1(log_ratio) if log_ratio < 0 else 1.0
    return min(4.0, max(1.0, 1.0 / max(reject, 1e-12) - 1.0))


def _checked_rho(rho: Callable[[int, float], float]) -> Callable[[int, float], float]:
    def growth(size: int, log_ratio: float) -> float:
        value = float(rho(size, log_ratio))
        if not (value > 0 and math.isfinite(value)):
            raise ValueError(f"rho({size}, {log_ratio}) returned {value}; it must be positive")
        return value

    return growth


# Every node returns (increments [n, d], states X_{a+1..b} [n, d], log mu_S, next drift row or
# None): the next row is the drift at X_b when a verification prefetched it.


def _node(chain: _Chain, sample: int, a: int, b: int, x_a: np.ndarray, f_a) -> Generator:
    """Exact draw of the increments of steps ``[a, b)`` given ``X_a`` (and maybe ``f_a``)."""
    if f_a is None:
        (f_a,) = yield Call((chain.times[a : a + 1], x_a[None]), 1, sample)
    n = b - a
    if n == 1:  # leaf: the target itself is the frozen-drift Gaussian
        inc = chain.draw(f_a, a, b)
        return inc, x_a + inc, chain.log_density(inc, f_a, a, b), None
    if chain.max_block is not None and n > chain.max_block:
        return (yield from _split(chain, sample, a, b, x_a, f_a))
    incs = chain.draw(f_a, a, b)
    states = x_a + np.cumsum(incs, axis=0)  # X_{a+1}, ..., X_b
    prefetch = b < chain.num_steps  # the drift at X_b seeds the next block's draft
    stop = n if prefetch else n - 1
    rows = yield Call((chain.times[a + 1 : a + 1 + stop], states[:stop]), stop, sample)
    f_k = rows[: n - 1]  # drifts at X_{a+1}, ..., X_{b-1}
    next_row = rows[n - 1] if prefetch else None
    h = chain.h[a + 1 : b]
    log_ratio = (
        float(((f_k - f_a) * incs[1:]).sum())
        - 0.5 * float((((f_k * f_k).sum(1) - f_a @ f_a) * h).sum())
    ) / chain.var
    if accept_draft(log_ratio, chain.rng):
        drifts = np.concatenate([f_a[None], f_k])
        return incs, states, chain.log_density(incs, drifts, a, b), next_row

    def make_thread(index: int) -> Generator:
        return _residual_try(chain, sample, a, b, x_a, f_a)

    return (yield FirstAccepted(make_thread, chain.thread_growth(n, log_ratio)))


def _split(chain: _Chain, sample: int, a: int, b: int, x_a: np.ndarray, f_a) -> Generator:
    """Exact draw of ``[a, b)`` as the left half, then the right half given the left."""
    m = (a + b) // 2
    left = yield from _node(chain, sample, a, m, x_a, f_a)
    right = yield from _node(chain, sample, m, b, left[1][-1], left[3])
    return (
        np.concatenate([left[0], right[0]]),
        np.concatenate([left[1], right[1]]),
        left[2] + right[2],
        right[3],
    )


def _residual_try(chain: _Chain, sample: int, a: int, b: int, x_a: np.ndarray, f_a) -> Generator:
    """One thread of the residual step: ``y ~ mu_S``, accepted w.p. ``max(0, 1 - nu/mu)``."""
    result = yield from _split(chain, sample, a, b, x_a, f_a)
    log_nu = chain.log_density(result[0], f_a, a, b)
    return accept_residual(result[2] - log_nu, chain.rng), result


def _autospec_root(chain: _Chain, sample: int, x0: np.ndarray) -> Generator:
    _, states, log_mu, _ = yield from _node(chain, sample, 0, chain.num_steps, x0, None)
    return states, log_mu


def _sequential_root(chain: _Chain, sample: int, x0: np.ndarray) -> Generator:
    states = np.empty((chain.num_steps, chain.dim))
    x, log_mu = x0, 0.0
    for k in range(chain.num_steps):
        (f,) = yield Call((chain.times[k : k + 1], x[None]), 1, sample)
        inc = chain.draw(f, k, k + 1)
        log_mu += chain.log_density(inc, f, k, k + 1)
        x = x + inc[0]
        states[k] = x
    return states, log_mu


def _picard_root(
    chain: _Chain, sample: int, x0: np.ndarray, noise: np.ndarray, window: int, tolerance: float
) -> Generator:
    """ParaDiGMS-style sliding-window Picard iteration with pre-drawn noise ``[N, d]``."""
    n, d = chain.num_steps, chain.dim
    path = np.empty((n + 1, d))
    path[0] = x0
    path[1:] = x0 + np.cumsum(noise, axis=0)  # initial guess: zero drift
    h = chain.h
    begin, end = 0, min(n, window)
    while begin < n:
        drifts = yield Call((chain.times[begin:end], path[begin:end]), end - begin, sample)
        new = path[begin] + np.cumsum(drifts * h[begin:end, None] + noise[begin:end], axis=0)
        error = np.sum((new - path[begin + 1 : end + 1]) ** 2, axis=1) / (
            d * chain.var * h[begin:end]
        )
        path[begin + 1 : end + 1] = new
        bad = np.flatnonzero(error > tolerance * tolerance)
        converged = int(bad[0]) if bad.size else end - begin
        new_begin = min(begin + converged + 1, end)
        new_end = min(n, new_begin + window)
        if new_end > end:  # extend the window with the last drift frozen
            extra = drifts[-1] * h[end:new_end, None] + noise[end:new_end]
            path[end + 1 : new_end + 1] = path[end] + np.cumsum(extra, axis=0)
        begin, end = new_begin, new_end
    return path[1:], 0.0  # log_prob is computed afterwards on the final path


# ---------------------------------------------------------------------------------- helpers
def _oracle_placement(drift, device, dtype, like: torch.Tensor | None):
    """Device and dtype of oracle inputs: explicit, else the oracle's, else ``like``'s."""
    params = None
    if isinstance(drift, torch.nn.Module):
        params = next(iter(drift.parameters()), None)
    if device is None:
        device = getattr(drift, "device", None)
        if device is None and params is not None:
            device = params.device
        if device is None and like is not None:
            device = like.device
    if dtype is None:
        dtype = getattr(drift, "dtype", None)
        if not isinstance(dtype, torch.dtype) and params is not None:
            dtype = params.dtype
        if not isinstance(dtype, torch.dtype) and like is not None and like.is_floating_point():
            dtype = like.dtype
        if not isinstance(dtype, torch.dtype):
            dtype = torch.get_default_dtype()
    return torch.device(device if device is not None else "cpu"), dtype


def _float64_on(device: torch.device) -> torch.device:
    return torch.device("cpu") if device.type == "mps" else device


def _check_common(num_samples, method, rho, max_block, window, tolerance, scale) -> None:
    if (
        not isinstance(num_samples, (int, np.integer))
        or isinstance(num_samples, bool)
        or num_samples < 1
    ):
        raise ValueError(f"num_samples must be a positive int, got {num_samples!r}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if not (
        rho == "adaptive"
        or callable(rho)
        or (isinstance(rho, (int, float)) and rho > 0 and math.isfinite(rho))
    ):
        raise ValueError(
            f"rho must be a positive float (thread batch growth 1 + rho), 'adaptive' or a "
            f"callable rho(block_size, log_ratio) -> float; got {rho!r}"
        )
    if max_block is not None and (not isinstance(max_block, (int, np.integer)) or max_block < 1):
        raise ValueError(f"max_block must be a positive int or None, got {max_block!r}")
    if not isinstance(window, (int, np.integer)) or window < 1:
        raise ValueError(f"window must be a positive int (picard window of steps), got {window!r}")
    if not (tolerance >= 0 and math.isfinite(tolerance)):
        raise ValueError(f"tolerance must be a non-negative float, got {tolerance!r}")
    if not (isinstance(scale, (int, float)) and scale > 0 and math.isfinite(scale)):
        raise ValueError(
            f"scale must be a positive float (noise level s of dX = b dt + s dB), got {scale!r}"
        )


def _sequential_with_noise(
    evaluate: _Evaluator, times: np.ndarray, x0: np.ndarray, noise: np.ndarray
) -> np.ndarray:
    """The sequential chain driven by given noise [M, N, d], batched over M: paths [M, N + 1, d]."""
    m, n, d = noise.shape
    paths = np.empty((m, n + 1, d))
    paths[:, 0] = x0
    h = np.diff(times)
    for k in range(n):
        f = evaluate(np.full(m, times[k]), paths[:, k])
        paths[:, k + 1] = paths[:, k] + f * h[k] + noise[:, k]
    return paths


# ---------------------------------------------------------------------------------- public API
def sample_sde(
    drift: Drift,
    times,
    x0,
    num_samples: int,
    *,
    scale: float = 1.0,
    method: str = "autospec",
    seed: int | None | np.random.Generator | torch.Generator = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    return_paths: bool = False,
    progress: bool = False,
    rho: float = 1.0,
    max_block: int | None = None,
    max_rows_per_round: int | None = None,
    max_rows_per_call: int | None = None,
    window: int = 16,
    tolerance: float = 0.1,
) -> DiffusionResult:
    r"""Euler-Maruyama paths of ``dX = b(t, X) dt + scale dB``, exactly in law, in few rounds.

    Parameters
    ----------
    drift : callable
        ``b(t: Tensor[B], x: Tensor[B, d]) -> Tensor[B, d]``, batched over rows. One call is
        one round and counts ``B`` rows. An optional attribute ``dim`` is checked against ``x0``.
    times : Tensor[N + 1]
        Strictly increasing grid ``t_0 < ... < t_N``.
    x0 : Tensor[d] or Tensor[num_samples, d]
        Initial state(s).
    num_samples : int
        Number of independent paths.
    scale : float
        Noise level ``s``: the step variance is ``s^2 h_k``.
    method : {"autospec", "sequential", "picard"}
        ``"autospec"``: the exact parallel sampler (default). ``"sequential"``: the reference
        chain, one step per round. ``"picard"``: ParaDiGMS-style sliding-window fixed-point
        iteration with pre-drawn noise; APPROXIMATE, see ``error`` in the result.
    seed : int, numpy.random.Generator or torch.Generator, optional
        Source of all randomness (float64 NumPy draws); the same seed gives the same output.
    device, dtype : optional
        Where and in which dtype the drift is called. Default: the drift's own ``device`` /
        ``dtype`` attributes (or its parameters for an ``nn.Module``), else those of ``x0``,
        else CPU and the default dtype. The chain itself is kept in float64.
    return_paths : bool
        Also return the whole paths ``[num_samples, N + 1, d]``.
    progress : bool
        Show a progress bar over finished samples.
    rho : float, "adaptive" or callable
        Residual threads are launched in batches of indices
        ``ceil((1 + rho)^r) <= i < ceil((1 + rho)^(r + 1))``. Larger ``rho`` means fewer rounds
        and more rows; it never changes the output law. ``"adaptive"`` sets it per rejected
        draft from the draft's log ratio ``l``: ``clip(1 / (1 - exp(l)) - 1, 1, 4)`` (about
        ``1 / TV`` tries at once: shorter tails of rounds, 2 to 3 times the rows). A callable
        ``rho(block_size, log_ratio) -> float`` is also accepted. Default 1.
    max_block : int, optional
        Blocks with more steps than this are split without drafting (saves the verification
        of drafts that would almost surely be rejected). Exact for any value.
    max_rows_per_round : int, optional
        Cap on the rows of one round (calls beyond wait for the next round). Exact for any value.
    max_rows_per_call : int, optional
        Cut each round into oracle calls of at most this many rows (memory); still one round.
    window, tolerance :
        Picard only: the window of steps updated per iteration, and the tolerance: a step is
        converged when ``|X_new - X_old|^2 / (d s^2 h_k) <= tolerance^2`` (as in ParaDiGMS).

    Returns
    -------
    DiffusionResult
        ``samples`` Tensor[num_samples, d] (the final states ``X_{t_N}``), ``paths``,
        ``log_prob``, ``rounds``, ``sample_rounds``, ``oracle_rows``, ...

    Raises
    ------
    ValueError
        For a grid that is not strictly increasing, a shape or dimension mismatch, or a bad option.
    OracleError
        If the drift returns NaN/inf or a wrongly shaped tensor.

    Notes
    -----
    Autospeculation on the increments (module docstring): a block ``[a, b)`` is drafted with
    the drift frozen at its start and verified in ONE round with the log ratio

    ``log dmu_S/dnu_S = sum_{a<k<b} [<b_k - b_a, dX_k> - (|b_k|^2 - |b_a|^2) h_k / 2] / s^2``.

    On rejection, exact tries (left half, then right half) race as threads and the smallest
    accepted index wins (ALGORITHM.md section 4). ``log_prob`` is the chain's log density of
    the returned increments; for ``"picard"`` it is computed on the returned path with an
    extra, uncounted, oracle pass.

    Examples
    --------
    >>> import torch
    >>> times = torch.linspace(0.0, 1.0, 33)
    >>> result = sample_sde(lambda t, x: -x, times, torch.zeros(2), 100, seed=0)
    >>> result.samples.shape, result.method
    (torch.Size([100, 2]), 'autospec')
    >>> bool(result.sample_rounds.double().median() < 32)
    True
    """
    _check_common(num_samples, method, rho, max_block, window, tolerance, scale)
    grid = check_times(times)
    like = x0 if isinstance(x0, torch.Tensor) else None
    x0_array = (
        x0.detach().to("cpu", torch.float64).numpy()
        if isinstance(x0, torch.Tensor)
        else np.asarray(x0, dtype=np.float64)
    )
    if x0_array.ndim not in (1, 2) or (x0_array.ndim == 2 and x0_array.shape[0] != num_samples):
        raise ValueError(
            f"x0 must have shape [d] or [num_samples, d] = [{num_samples}, d], "
            f"got {tuple(x0_array.shape)}"
        )
    if not np.isfinite(x0_array).all():
        raise ValueError("x0 contains NaN or inf")
    dim = int(x0_array.shape[-1])
    drift_dim = getattr(drift, "dim", None)
    if drift_dim is not None and drift_dim != dim:
        raise ValueError(
            f"dimension mismatch: the drift has dim = {drift_dim} but x0 has d = {dim}; "
            f"pass x0 of shape [{drift_dim}] (or a drift for d = {dim})"
        )
    device, dtype = _oracle_placement(drift, device, dtype, like)
    return _run(
        drift,
        grid,
        x0_array,
        num_samples,
        dim,
        scale=scale,
        method=method,
        seed=seed,
        device=device,
        dtype=dtype,
        return_paths=return_paths,
        progress=progress,
        rho=rho,
        max_block=max_block,
        max_rows_per_round=max_rows_per_round,
        max_rows_per_call=max_rows_per_call,
        window=window,
        tolerance=tolerance,
        name="drift",
        divide_by_time=False,
    )


def sample_diffusion(
    oracle,
    num_samples: int,
    *,
    times=None,
    num_steps: int | None = None,
    delta: float | None = None,
    method: str = "autospec",
    seed: int | None | np.random.Generator | torch.Generator = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    return_paths: bool = False,
    progress: bool = False,
    rho: float = 1.0,
    max_block: int | None = None,
    max_rows_per_round: int | None = None,
    max_rows_per_call: int | None = None,
    window: int = 16,
    tolerance: float = 0.1,
    **schedule: Any,
) -> DiffusionResult:
    r"""Sample ``mu`` through stochastic localization with a conditional-mean oracle.

    Simulates the Euler-Maruyama chain of ``dX_t = f(t, X_t) dt + dB_t``, ``X_0 = 0``, with
    ``f(t, x) = E[Y | t Y + B_t = x]`` and ``Y ~ mu``, on ``0 = t_0 < ... < t_N = T``, and
    returns ``X_T / T``, which approximates ``mu * N(0, I / T)``. With ``method="autospec"``
    the output is distributed EXACTLY as the sequential chain with the same oracle and times.

    Parameters
    ----------
    oracle : MeanOracle
        ``dim`` = d and ``oracle(t: Tensor[B], x: Tensor[B, d]) -> Tensor[B, d]``.
    num_samples : int
        Number of draws.
    times : Tensor[N + 1], optional
        Any strictly increasing grid starting at 0. Default: :func:`diffusion_times`
        (uniform steps up to ``t = 1``, then geometric up to ``T = 1 / delta``, after BDDD23).
    num_steps : int, optional
        ``N`` for the default grid (256 if not given).
    delta : float, optional
        Final noise variance of the default grid, ``T = 1 / delta`` (1e-3 if not given).
    **schedule
        Further options of :func:`diffusion_times` (``t_switch``).
    method, seed, device, dtype, return_paths, progress, rho, max_block, max_rows_per_round,
    max_rows_per_call, window, tolerance :
        As in :func:`sample_sde` (``scale = 1``).

    Returns
    -------
    DiffusionResult
        ``samples`` Tensor[num_samples, d] = ``X_T / T``; ``paths`` (unscaled ``X_t``) when
        ``return_paths``; ``log_prob``, ``rounds``, ``sample_rounds``, ``oracle_rows``,
        ``times``; ``error`` for picard.

    Raises
    ------
    ValueError
        Bad grid (not increasing, not starting at 0, grid and schedule options both given),
        an oracle without an integer ``dim``, or a bad option.
    OracleError
        NaN/inf or wrongly shaped oracle outputs.

    Notes
    -----
    See :func:`sample_sde` for the algorithm and ALGORITHM.md sections 2, 4 and 8. For a
    target with bounded support, ``f(t, X_t)`` is a martingale whose total quadratic variation
    is at most ``tr Cov(Y)``: drafts with a frozen drift are then rarely rejected outside a
    few blocks, which is where the ``O~(sqrt N)`` rounds come from.

    Examples
    --------
    >>> import torch
    >>> from pyro_autospec.oracles.denoisers import FiniteSupportDenoiser
    >>> oracle = FiniteSupportDenoiser(torch.tensor([[1.0, 0.0], [-1.0, 0.0]]))
    >>> result = sample_diffusion(oracle, 50, num_steps=64, seed=0)
    >>> result.samples.shape
    torch.Size([50, 2])
    >>> bool((result.samples[:, 0].abs() - 1).abs().max() < 0.5)
    True
    """
    dim = getattr(oracle, "dim", None)
    if not isinstance(dim, (int, np.integer)) or isinstance(dim, bool) or dim < 1:
        raise ValueError(
            f"oracle must have an integer attribute `dim` (d >= 1, the MeanOracle protocol), "
            f"got {dim!r}"
        )
    if times is None:
        grid = check_times(
            diffusion_times(
                256 if num_steps is None else num_steps,
                1e-3 if delta is None else delta,
                **schedule,
            )
        )
    else:
        if num_steps is not None or delta is not None or schedule:
            raise ValueError(
                "pass either `times` or the default grid's options (num_steps, delta, "
                "t_switch), not both"
            )
        grid = check_times(times)
        if grid[0] != 0.0:
            raise ValueError(
                f"times[0] must be 0 for stochastic localization (X_0 = 0 at t = 0), "
                f"got {grid[0]:.6g}; "
                f"use sample_sde for chains starting elsewhere"
            )
    _check_common(num_samples, method, rho, max_block, window, tolerance, 1.0)
    device, dtype = _oracle_placement(oracle, device, dtype, None)
    return _run(
        oracle,
        grid,
        np.zeros(int(dim)),
        num_samples,
        int(dim),
        scale=1.0,
        method=method,
        seed=seed,
        device=device,
        dtype=dtype,
        return_paths=return_paths,
        progress=progress,
        rho=rho,
        max_block=max_block,
        max_rows_per_round=max_rows_per_round,
        max_rows_per_call=max_rows_per_call,
        window=window,
        tolerance=tolerance,
        name="oracle",
        divide_by_time=True,
    )


def _run(
    drift,
    grid,
    x0,
    num_samples,
    dim,
    *,
    scale,
    method,
    seed,
    device,
    dtype,
    return_paths,
    progress,
    rho,
    max_block,
    max_rows_per_round,
    max_rows_per_call,
    window,
    tolerance,
    name,
    divide_by_time,
) -> DiffusionResult:
    rng = make_rng(seed)
    evaluate = _Evaluator(drift, dim, device, dtype, max_rows_per_call, name)
    chain = _Chain(
        grid,
        float(scale),
        dim,
        rng,
        rho if isinstance(rho, str) or callable(rho) else float(rho),
        max_block,
    )
    starts = np.broadcast_to(x0, (num_samples, dim)).astype(np.float64)
    scheduler = Scheduler(
        evaluate.dispatch, max_rows_per_round=max_rows_per_round, progress=progress, desc=method
    )
    start_time = time.perf_counter()
    noise = None
    if method == "autospec":
        roots = [_autospec_root(chain, k, starts[k]) for k in range(num_samples)]
    elif method == "sequential":
        roots = [_sequential_root(chain, k, starts[k]) for k in range(num_samples)]
    else:
        noise = chain.noise_sd[None, :, None] * rng.standard_normal(
            (num_samples, chain.num_steps, dim)
        )
        roots = [
            _picard_root(chain, k, starts[k], noise[k], int(window), float(tolerance))
            for k in range(num_samples)
        ]
    results = scheduler.run(roots)
    wall_time = time.perf_counter() - start_time
    paths = np.empty((num_samples, chain.num_steps + 1, dim))
    paths[:, 0] = starts
    for k, (states, _) in enumerate(results):
        paths[k, 1:] = states
    error = None
    if method == "picard":
        with torch.no_grad():
            log_prob = euler_maruyama_log_prob(
                drift,
                grid,
                torch.from_numpy(paths),
                scale=float(scale),
                device=device,
                dtype=dtype,
                max_rows_per_call=max_rows_per_call or 65536,
            ).numpy()
        reference = _sequential_with_noise(evaluate, grid, starts, noise)
        error = np.linalg.norm(paths[:, -1] - reference[:, -1], axis=-1)
    else:
        log_prob = np.array([lp for _, lp in results], dtype=np.float64)
    final = paths[:, -1] / grid[-1] if divide_by_time else paths[:, -1]
    if error is not None and divide_by_time:
        error = error / grid[-1]
    stats_device = _float64_on(device)
    return DiffusionResult(
        samples=torch.from_numpy(final).to(device=device, dtype=dtype),
        paths=torch.from_numpy(paths).to(device=device, dtype=dtype) if return_paths else None,
        log_prob=torch.from_numpy(log_prob).to(stats_device),
        rounds=scheduler.stats.rounds,
        sample_rounds=torch.tensor(scheduler.stats.sample_rounds[:num_samples], dtype=torch.long),
        oracle_rows=scheduler.stats.rows,
        method=method,
        wall_time=wall_time,
        times=torch.from_numpy(grid).to(stats_device),
        error=None if error is None else torch.from_numpy(error).to(stats_device),
    )


def euler_maruyama_log_prob(
    drift: Drift,
    times,
    paths: torch.Tensor,
    *,
    scale: float = 1.0,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    max_rows_per_call: int | None = 65536,
) -> torch.Tensor:
    r"""Log density of Euler-Maruyama paths: the sum of their Gaussian transition densities.

    Differentiable with respect to ``paths`` and to any parameters of ``drift`` (it is the
    ``log_prob`` of :class:`~pyro_autospec.distributions.EulerMaruyamaPath`).

    Parameters
    ----------
    drift : callable
        ``b(t: Tensor[B], x: Tensor[B, d]) -> Tensor[B, d]``.
    times : Tensor[N + 1]
        Strictly increasing grid.
    paths : Tensor[..., N + 1, d]
        States ``X_{t_0}, ..., X_{t_N}``; the first is taken as given (not scored).
    scale : float
        Noise level ``s``.
    device, dtype : optional
        Where and in which dtype the drift is called (default as in :func:`sample_sde`).
    max_rows_per_call : int, optional
        Rows per drift call (memory).

    Returns
    -------
    Tensor[...]
        ``sum_k log N(X_{k+1}; X_k + b(t_k, X_k) h_k, s^2 h_k I)``, in float64 (float32 on
        devices without float64), on the device of ``paths``.

    Raises
    ------
    ValueError
        Bad grid or shapes, or a drift ``dim`` that differs from ``d``.
    OracleError
        NaN/inf or wrongly shaped drift outputs.

    Examples
    --------
    >>> import torch
    >>> times = torch.tensor([0.0, 1.0])
    >>> paths = torch.tensor([[[0.0], [0.0]]])
    >>> euler_maruyama_log_prob(lambda t, x: torch.zeros_like(x), times, paths)  # log N(0; 0, 1)
    tensor([-0.9189], dtype=torch.float64)
    """
    grid = check_times(times)
    if not isinstance(paths, torch.Tensor):
        paths = torch.as_tensor(paths, dtype=torch.float64)
    if paths.dim() < 2 or paths.shape[-2] != grid.shape[0]:
        raise ValueError(
            f"paths must have shape [..., N + 1, d] with N + 1 = {grid.shape[0]} (len(times)), "
            f"got {tuple(paths.shape)}"
        )
    if not (isinstance(scale, (int, float)) and scale > 0 and math.isfinite(scale)):
        raise ValueError(f"scale must be a positive float, got {scale!r}")
    dim = int(paths.shape[-1])
    drift_dim = getattr(drift, "dim", None)
    if drift_dim is not None and drift_dim != dim:
        raise ValueError(
            f"dimension mismatch: the drift has dim = {drift_dim} but paths have d = {dim}"
        )
    call_device, call_dtype = _oracle_placement(drift, device, dtype, paths)
    out_device = paths.device
    wide = torch.float32 if out_device.type == "mps" else torch.float64
    batch_shape = paths.shape[:-2]
    num_steps = grid.shape[0] - 1
    flat = paths.reshape(-1, num_steps + 1, dim)
    rows = flat.shape[0] * num_steps
    t = torch.as_tensor(grid[:-1], device=call_device, dtype=call_dtype).repeat(flat.shape[0])
    x = flat[:, :-1].reshape(rows, dim).to(device=call_device, dtype=call_dtype)
    chunk = max_rows_per_call or max(rows, 1)
    pieces = []
    for i in range(0, rows, chunk):
        out = drift(t[i : i + chunk], x[i : i + chunk])
        _check_drift_output(out, t[i : i + chunk], x[i : i + chunk], dim, "drift", i)
        pieces.append(out.to(device=out_device, dtype=wide))
    drifts = torch.cat(pieces) if pieces else torch.zeros(0, dim, device=out_device, dtype=wide)
    drifts = drifts.reshape(flat.shape[0], num_steps, dim)
    h = torch.as_tensor(np.diff(grid), device=out_device, dtype=wide)
    increments = flat.to(wide).diff(dim=1)
    resid = increments - drifts * h[:, None]
    var = float(scale) ** 2
    log_norm = float(-0.5 * dim * np.log(2 * math.pi * var * np.diff(grid)).sum())
    log_prob = -0.5 * (resid * resid / h[:, None]).sum((-1, -2)) / var + log_norm
    return log_prob.reshape(batch_shape)
