"""Euler-Maruyama chains as tensor programs: the parts every diffusion sampler shares.

The target is the law of the chain of ``dX = b(t, X) dt + s dB`` on ``t_0 < ... < t_N``
(``h_k = t_{k+1} - t_k``)::

    X_{k+1} = X_k + b(t_k, X_k) h_k + s sqrt(h_k) xi_k,    xi_k ~ N(0, I_d).

This module holds:

* :class:`DriftEvaluator`, the checked drift (or mean oracle) that every engine calls, and
  :func:`check_log_ratio`, the check of a verification's log ratio;
* :class:`Chain`, the grid and its keyed noise: the increments of step ``k`` of a draw are a
  pure function of the draw's key, so every sampler and both engines read the same noise;
* :class:`EulerOutput`, what every Euler sampler returns.

Autospeculation's token rule lives in :mod:`pyro_autospec.engine.euler_tokens`, the
``"sequential"`` and ``"picard"`` baselines on the same host control plane in
:mod:`pyro_autospec.engine.euler_baselines`, and the block rule with residual races in
:mod:`pyro_autospec.engine.reference.euler` (:doc:`/diffusion`). This module does not import
Pyro.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch

from pyro_autospec.engine import keys
from pyro_autospec.engine.errors import OracleError
from pyro_autospec.engine.modes import calling, foreign_inputs, ordinary

__all__ = [
    "Chain",
    "DriftEvaluator",
    "EulerOutput",
    "check_drift_output",
    "check_finite_rows",
    "check_log_ratio",
    "raise_not_finite",
    "paths_from_increments",
]


def check_drift_output(
    out,
    t: torch.Tensor,
    x: torch.Tensor,
    dim: int,
    name: str,
    offset: int = 0,
    finite: bool = True,
) -> None:
    """Raise :class:`OracleError` unless ``out`` is a finite floating Tensor[B, d].

    The checks of a discrete oracle's rows, for a drift (or a mean oracle): the type, a
    floating dtype (an integer or bool output is refused, never cast: its values were
    truncated before the engine saw them), the shape, and finite entries (the first bad row is
    named, ``offset`` being the call's first row within its round; with ``finite=False`` the
    caller checks the rows it uses, by :func:`raise_not_finite`).
    """
    rows = t.shape[0]
    if not isinstance(out, torch.Tensor):
        raise OracleError(
            f"{name} returned {type(out).__name__}; it must return a Tensor[B, d] "
            f"for t: Tensor[B], x: Tensor[B, d]"
        )
    if not out.dtype.is_floating_point:
        if out.dtype.is_complex:
            why = (
                "a complex drift has no place in a real diffusion, and the engine does not "
                f"drop its imaginary part. Return the real part (out.real) from the {name}"
            )
        elif out.dtype == torch.bool:
            why = (
                "a bool drift is a comparison, not a drift, and the engine does not cast it. "
                f"Return the drift's values, not a test on them, from the {name}"
            )
        else:
            why = (
                "an integer drift has lost its fractional part, and the engine does not cast "
                f"it. Remove the integer cast (or rounding) from the {name}"
            )
        raise OracleError(
            f"{name} returned a tensor of dtype {out.dtype}; it must return floating point "
            f"values (the dtype of its input x, {x.dtype}): {why}"
        )
    if out.device != x.device:
        raise OracleError(
            f"{name} returned a tensor on {out.device}; it must answer on the device of its "
            f"input x ({x.device}): compute it there, or pass device= where the {name} runs"
        )
    if out.shape != (rows, dim):
        raise OracleError(
            f"{name} returned shape {tuple(out.shape)} for {rows} rows of dimension "
            f"d = {dim}; it must map t: Tensor[B], x: Tensor[B, d] to Tensor[B, d]. "
            f"Check that it is batched over rows and that its `dim` matches x0 / the target"
        )
    if finite:
        check_finite_rows(out.detach(), t, x, name, offset)


def check_finite_rows(
    out: torch.Tensor,
    t: torch.Tensor,
    x: torch.Tensor,
    name: str,
    offset: int = 0,
    beyond: torch.Tensor | None = None,
    dtype: torch.dtype | None = None,
) -> None:
    """Raise for the first row of ``out`` [B, d] that is not finite (one host read): with
    :func:`raise_beyond_dtype` where ``beyond`` marks it (its state is inf in ``dtype``),
    else with :func:`raise_not_finite` (a state the sampler asked about)."""
    rows_finite = torch.isfinite(out).all(dim=1)
    if bool(rows_finite.all()):
        return
    i = int(torch.nonzero(~rows_finite)[0, 0])
    if beyond is not None and bool(beyond[i]):
        raise_beyond_dtype(name, dtype, float(t[i]), float(x[i].abs().max()))
    raise_not_finite(
        name, f"row {offset + i} of a call", float(t[i]), x[i].double().norm(), reached=False
    )


def raise_not_finite(name: str, where: str, t: float, norm: float, reached: bool = True) -> None:
    """Raise the :class:`OracleError` of a drift that returned NaN or inf at time ``t`` and a
    state of norm ``norm`` (``where``: which row; ``reached``: a state the chain reached, or
    one the sampler asked about, which may be a draft)."""
    state = (
        "a state the chain reached"
        if reached
        else "a state the sampler asked about (every state for method='sequential'; a "
        "drafted one too for rule='block', which needs every row finite, while rule='token', "
        "the default, raises only at states the chain reaches)"
    )
    raise OracleError(
        f"{name} returned NaN or inf in {where} (t = {t:.6g}, |x| = {float(norm):.6g}), "
        f"{state}; the exact sampler cannot continue. Compute it in log space (logsumexp) / "
        f"float64, or check the {name} at this time and state"
    )


def raise_beyond_dtype(name: str, dtype: torch.dtype, t: float, largest: float) -> None:
    """Raise the :class:`OracleError` of a state the chain reached (or, with ``finite``
    rows, one asked about) that does not fit the dtype the drift is called in: it would see
    ``inf`` there."""
    wider = "torch.float64" if dtype == torch.float32 else "torch.float32 or torch.float64"
    raise OracleError(
        f"the chain reached a state beyond what the {name}'s dtype holds (t = {t:.6g}, "
        f"largest |x_i| = {largest:.6g}; {dtype} holds at most {torch.finfo(dtype).max:.6g}): "
        f"the {name} would be called with inf there. Pass dtype={wider}, or rescale the "
        f"problem"
    )


def check_log_ratio(log_ratio, log_mu, name: str) -> None:
    """Raise :class:`OracleError` unless a verification stayed finite (tensors or arrays): a
    finite drift too large for float64's squares (``|b|^2 h`` beyond ``1e308``) makes it NaN,
    and a block rejected for a NaN would race residual tries for ever."""
    if isinstance(log_ratio, np.ndarray) and isinstance(log_mu, np.ndarray):  # host arrays
        finite = bool(np.isfinite(log_ratio).all() and np.isfinite(log_mu).all())
    else:
        ratio = torch.as_tensor(log_ratio, dtype=torch.float64)
        mu = torch.as_tensor(log_mu, dtype=torch.float64)
        finite = bool(torch.isfinite(ratio).all() & torch.isfinite(mu).all())  # one host read
    if not finite:
        raise OracleError(
            f"the values of the {name} are too large for the chain's float64 arithmetic (a "
            f"square |b|^2 h overflowed, so a log density ratio is not a number): check its "
            f"scale"
        )


class DriftEvaluator:
    """Batched, validated drift calls: float64 tensors in and out, one round per call.

    Parameters
    ----------
    drift : callable
        ``b(t: Tensor[B], x: Tensor[B, d]) -> Tensor[B, d]``.
    dim : int
    device, dtype : torch.device, torch.dtype
        Where and in which dtype the drift is called.
    max_rows_per_call : int or None
        Cut a round into calls of at most this many rows (memory); still one round.
    name : str
        ``"oracle"`` or ``"drift"``, for messages.
    finite : bool
        Refuse NaN or inf in any row (``False``: the sampler checks the rows it uses).
    """

    def __init__(
        self, drift, dim: int, device, dtype, max_rows_per_call, name: str, finite: bool = True
    ):
        #: Refuse NaN or inf in any row (else the sampler checks the rows of states its
        #: chain reaches: autospeculation asks the drift at drafted states that a rejection
        #: may leave unvisited)
        self.finite = finite
        self.drift = drift
        self.dim = dim
        self.device = device
        self.dtype = dtype
        self.max_rows_per_call = max_rows_per_call
        self.name = name
        self.wide = torch.float32 if device.type == "mps" else torch.float64
        self.seconds = 0.0  # host seconds inside the drift
        # out of the engine's inference mode unless safe, in the grad mode of the sampler's
        # caller (a drift may differentiate a potential: -grad U(x))
        self._call_mode = calling(drift, torch.is_grad_enabled())
        # and with grad enabled, on ordinary copies: autograd may save them (a network's input)
        self._ordinary = foreign_inputs(drift, torch.is_grad_enabled())

    def __call__(self, t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        rows = t.shape[0]
        chunk = self.max_rows_per_call or max(rows, 1)
        pieces = []
        for i in range(0, rows, chunk):
            tt = t[i : i + chunk].to(device=self.device, dtype=self.dtype)
            xx = x[i : i + chunk].to(device=self.device, dtype=self.dtype)
            beyond = self._beyond_dtype(x[i : i + chunk], xx)
            if self._ordinary:
                tt, xx = ordinary(tt), ordinary(xx)
            start = time.perf_counter()
            with self._call_mode():
                out = self.drift(tt, xx)
            self.seconds += time.perf_counter() - start
            check_drift_output(out, tt, xx, self.dim, self.name, i, finite=False)
            # a copy: a drift may answer in a buffer of its own that its next call overwrites
            out = out.detach().to(self.wide, copy=True)
            if beyond is not None:  # rows the drift saw as inf: unusable, whatever it answered
                out = torch.where(beyond.unsqueeze(1), math.nan, out)
            if self.finite:
                check_finite_rows(out, tt, x[i : i + chunk], self.name, i, beyond, self.dtype)
            pieces.append(out)
        if not pieces:
            return torch.zeros(0, self.dim, dtype=self.wide, device=self.device)
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces)

    def _beyond_dtype(self, wide: torch.Tensor, narrow: torch.Tensor) -> torch.Tensor | None:
        """Which rows' finite states are inf in the drift's dtype (``None`` where the dtype
        holds every float64; no host read): their rows are made NaN, so that a sampler that
        uses one raises, with :meth:`beyond_dtype_error`'s words."""
        if torch.finfo(self.dtype).max >= torch.finfo(wide.dtype).max:
            return None
        return torch.isfinite(wide).all(1).to(narrow.device) & ~torch.isfinite(narrow).all(1)

    def beyond_dtype_error(self, t: float, state: np.ndarray) -> None:
        """Raise :func:`raise_beyond_dtype` if ``state`` (float64) does not fit the drift's
        dtype: why its row is not finite."""
        largest = float(np.abs(state).max()) if state.size else 0.0
        if largest > torch.finfo(self.dtype).max:
            raise_beyond_dtype(self.name, self.dtype, t, largest)


class Chain:
    """The time grid and noise of the discretised chain, as float64 tensors on one device."""

    def __init__(self, times: torch.Tensor, scale: float, dim: int, device: torch.device):
        wide = torch.float32 if device.type == "mps" else torch.float64
        self.times = times.to(device=device, dtype=wide)
        self.num_steps = int(times.shape[0]) - 1
        self.h = self.times.diff()
        self.noise_sd = scale * self.h.sqrt()
        self.var = float(scale) ** 2
        self.dim = dim
        self.device = device
        self.wide = wide
        self._dims = torch.arange(dim, device=device)
        log_norm = -0.5 * dim * torch.log(2 * math.pi * self.var * self.h)
        self.log_norm = torch.cat([torch.zeros(1, dtype=wide, device=device), log_norm.cumsum(0)])

    def noise(
        self, key: torch.Tensor, drift: torch.Tensor, step: torch.Tensor, j: torch.Tensor
    ) -> torch.Tensor:
        """Frozen-drift increments of steps ``step``: Tensor[*S, d].

        Step ``step[i]`` is the ``j[i]``-th of a block with key ``key[i]`` and frozen drift
        ``drift[i]``; its noise is ``normal(key, DRAFT, j d + c)`` for ``c < d``, so it depends
        on the block and the step only. ``key``, ``step`` and ``j`` are LongTensors and
        ``drift`` [..., d]; all broadcast to the shape ``S``.
        """
        z = self.standard_noise(key, j)
        return drift * self.h[step].unsqueeze(-1) + self.noise_sd[step].unsqueeze(-1) * z

    def standard_noise(self, key: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        """The standard normal noise of :meth:`noise`: Tensor[*S, d] (``key``, ``j`` [*S])."""
        counter = j.unsqueeze(-1) * self.dim + self._dims
        return keys.normal(key.unsqueeze(-1), keys.Tag.DRAFT, counter).to(self.wide)

    def increments(self, key: torch.Tensor, drift: torch.Tensor, a: torch.Tensor, width: int):
        """Frozen-drift increments of steps ``a + j`` (``j < width``): [K, width, d].

        ``key`` LongTensor[K] (a block's key), ``drift`` [K, d] (the frozen drift),
        ``a`` LongTensor[K]: :meth:`noise` of each block's first ``width`` steps.
        """
        j = torch.arange(width, device=self.device)
        step = (a.unsqueeze(1) + j).clamp(max=self.num_steps - 1)  # [K, W]
        return self.noise(key.unsqueeze(1), drift.unsqueeze(1), step, j)


@dataclass
class EulerOutput:
    """What every Euler sampler returns (the fast ones, the reference, each method).

    Attributes
    ----------
    final : Tensor[N, d]
        The last state of each path.
    paths : Tensor[N, steps + 1, d] or None
        Whole paths (when asked for, and always for ``"picard"``).
    log_prob : Tensor[N] or None
        Each path's log density under the chain (``None`` for ``"picard"``, computed after).
    rounds, oracle_rows : int
        Rounds of the run and drift rows evaluated.
    sample_rounds : LongTensor[N]
        Rounds each draw took part in.
    noise : Tensor[N, steps, d] or None
        ``"picard"``'s fixed noise.
    """

    final: torch.Tensor
    paths: torch.Tensor | None
    log_prob: torch.Tensor | None
    rounds: int
    oracle_rows: int
    sample_rounds: torch.Tensor
    noise: torch.Tensor | None = None


def paths_from_increments(x0: torch.Tensor, increments: torch.Tensor, final: torch.Tensor):
    """Paths ``[N, steps + 1, d]`` from the start ``x0`` [N, d] and the increments
    ``[N, steps, d]``, ending exactly at ``final`` (the sampler's own sum)."""
    paths = torch.cat([x0.unsqueeze(1), x0.unsqueeze(1) + increments.cumsum(1)], 1)
    paths[:, -1] = final
    return paths
