"""Euler-Maruyama chains as tensor programs: the parts every diffusion sampler shares.

The target is the law of the chain of ``dX = b(t, X) dt + s dB`` on ``t_0 < ... < t_N``
(``h_k = t_{k+1} - t_k``)::

    X_{k+1} = X_k + b(t_k, X_k) h_k + s sqrt(h_k) xi_k,    xi_k ~ N(0, I_d).

This module holds:

* :class:`DriftEvaluator`, the checked drift (or mean oracle) that every engine calls, and
  :func:`check_log_ratio`, the check of a verification's log ratio;
* :class:`Chain`, the grid and its keyed noise: the increments of step ``k`` of a draw are a
  pure function of the draw's key, so every sampler and both engines read the same noise;
* the fast ``"sequential"`` and ``"picard"`` samplers, and :class:`EulerOutput`, what every
  Euler sampler returns.

Autospeculation's token rule lives in :mod:`pyro_autospec.engine.euler_tokens`; the block rule
with residual races in :mod:`pyro_autospec.engine.reference.euler` (:doc:`/diffusion`). This
module does not import Pyro.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from pyro_autospec.engine import keys
from pyro_autospec.engine.errors import OracleError
from pyro_autospec.engine.modes import calling, engine_mode
from pyro_autospec.engine.stepping import run_rounds

__all__ = [
    "Chain",
    "DriftEvaluator",
    "check_drift_output",
    "picard",
    "sequential",
]


def check_drift_output(
    out, t: torch.Tensor, x: torch.Tensor, dim: int, name: str, offset: int = 0
) -> None:
    """Raise :class:`OracleError` unless ``out`` is a finite floating Tensor[B, d].

    The checks of a discrete oracle's rows, for a drift (or a mean oracle): the type, a
    floating dtype (an integer or bool output is refused, never cast: its values were
    truncated before the engine saw them), the shape, and finite entries (the first bad row is
    named, ``offset`` being the call's first row within its round).
    """
    rows = t.shape[0]
    if not isinstance(out, torch.Tensor):
        raise OracleError(
            f"{name} returned {type(out).__name__}; it must return a Tensor[B, d] "
            f"for t: Tensor[B], x: Tensor[B, d]"
        )
    if not out.dtype.is_floating_point:
        raise OracleError(
            f"{name} returned a tensor of dtype {out.dtype}; it must return floating point "
            f"values (the dtype of its input x, {x.dtype}): an integer drift has lost its "
            f"fractional part, and the engine does not cast it. Remove the integer cast (or "
            f"rounding) from the {name}"
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


def check_log_ratio(log_ratio, log_mu, name: str) -> None:
    """Raise :class:`OracleError` unless a verification stayed finite (tensors or arrays): a
    finite drift too large for float64's squares (``|b|^2 h`` beyond ``1e308``) makes it NaN,
    and a block rejected for a NaN would race residual tries for ever."""
    ratio = torch.as_tensor(log_ratio, dtype=torch.float64)
    mu = torch.as_tensor(log_mu, dtype=torch.float64)
    if not bool(torch.isfinite(ratio).all() & torch.isfinite(mu).all()):  # one host read
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
    """

    def __init__(self, drift, dim: int, device, dtype, max_rows_per_call, name: str):
        self.drift = drift
        self.dim = dim
        self.device = device
        self.dtype = dtype
        self.max_rows_per_call = max_rows_per_call
        self.name = name
        self.wide = torch.float32 if device.type == "mps" else torch.float64
        self.seconds = 0.0  # host seconds inside the drift
        self._call_mode = calling(drift)  # out of the engine's inference mode, unless safe

    def __call__(self, t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        rows = t.shape[0]
        chunk = self.max_rows_per_call or max(rows, 1)
        pieces = []
        for i in range(0, rows, chunk):
            tt = t[i : i + chunk].to(device=self.device, dtype=self.dtype)
            xx = x[i : i + chunk].to(device=self.device, dtype=self.dtype)
            start = time.perf_counter()
            with self._call_mode():
                out = self.drift(tt, xx)
            self.seconds += time.perf_counter() - start
            check_drift_output(out, tt, xx, self.dim, self.name, i)
            pieces.append(out.detach().to(self.wide))
        if not pieces:
            return torch.zeros(0, self.dim, dtype=self.wide, device=self.device)
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces)


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


# ---------------------------------------------------------------------------------- baselines
def _step_key(draw_keys: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    return keys.child(draw_keys, keys.Tag.LEAF, step)


@engine_mode()
def sequential(
    chain: Chain,
    evaluate: DriftEvaluator,
    x0: torch.Tensor,
    draw_keys,
    return_paths: bool,
    max_concurrent: int | None,
    max_rows_per_round: int | None,
    progress: bool,
):
    """The reference chain, one step per round, every draw in flight advancing together.

    Step ``k`` of draw ``s`` uses the noise of the one-step block starting at ``k``
    (``normal(child(draw, LEAF, k), DRAFT, c)``).

    Returns
    -------
    EulerOutput
    """
    num = x0.shape[0]
    lanes = min(int(max_concurrent or num), num)
    cap = max_rows_per_round
    if 0 < lanes == num and (cap is None or cap >= num):
        stepper = _Lockstep(chain, evaluate, x0, draw_keys, return_paths)
        total, unit = chain.num_steps, "step"
    else:
        stepper = _Sequential(chain, evaluate, x0, draw_keys, return_paths, lanes, cap)
        total, unit = num, "draw"
    run_rounds(stepper, total=total, progress=progress, desc="sequential", unit=unit)
    final, increments, log_prob = stepper.output()
    x0 = x0.to(device=chain.device, dtype=chain.wide)
    paths = None if increments is None else paths_from_increments(x0, increments, final)
    return EulerOutput(
        final, paths, log_prob, stepper.rounds, stepper.oracle_rows, stepper.sample_rounds
    )


class _Sequential:
    """:func:`sequential` with continuous batching or a cap on rows per round: a
    :class:`~pyro_autospec.engine.stepping.RoundStepper` over draws."""

    def __init__(self, chain, evaluate, x0, draw_keys, return_paths, lanes, cap):
        num, d = x0.shape
        n, dev, wide = chain.num_steps, chain.device, chain.wide
        self.chain, self.evaluate, self.x0, self.draw_keys = chain, evaluate, x0, draw_keys
        self.num, self.cap = num, cap
        self.draw = torch.full((lanes,), -1, dtype=torch.long, device=dev)
        self.k = torch.zeros(lanes, dtype=torch.long, device=dev)
        self.x = torch.zeros(lanes, d, dtype=wide, device=dev)
        self.log_mu = torch.zeros(lanes, dtype=wide, device=dev)
        self.final = torch.zeros(num, d, dtype=wide, device=dev)
        self.log_prob = torch.zeros(num, dtype=wide, device=dev)
        self.paths = torch.zeros(num, n, d, dtype=wide, device=dev) if return_paths else None
        self.sample_rounds = torch.zeros(num, dtype=torch.long, device=dev)
        self.started = self.finished = self.rounds = self.oracle_rows = 0

    @property
    def done(self) -> bool:
        return self.finished >= self.num

    def start(self) -> None:
        """Free lanes take the next draws."""
        draw, dev = self.draw, self.chain.device
        free = torch.nonzero(draw < 0).flatten()[: self.num - self.started]
        if free.numel():
            draw[free] = torch.arange(self.started, self.started + free.numel(), device=dev)
            self.started += free.numel()
            self.k[free], self.x[free] = 0, self.x0[draw[free]].to(self.chain.wide)
            self.log_mu[free] = 0.0

    def step(self) -> None:
        chain, draw, k, x = self.chain, self.draw, self.k, self.x
        active = torch.nonzero(draw >= 0).flatten()
        if self.cap is not None:
            active = active[torch.argsort(draw[active])][: max(1, self.cap)]
        self.rounds += 1
        self.oracle_rows += active.numel()
        self.sample_rounds[draw[active]] += 1
        ka = k[active]
        f = self.evaluate(chain.times[ka], x[active])
        inc = chain.noise(_step_key(self.draw_keys[draw[active]], ka), f, ka, torch.zeros_like(ka))
        h = chain.h[ka]
        resid = inc - f * h.unsqueeze(1)
        self.log_mu[active] += (chain.log_norm[k[active] + 1] - chain.log_norm[k[active]]) - 0.5 * (
            resid**2
        ).sum(1) / (chain.var * h)
        if self.paths is not None:
            self.paths[draw[active], k[active]] = inc
        x[active] += inc
        k[active] += 1
        done = active[k[active] >= chain.num_steps]
        self.final[draw[done]] = x[done]
        self.log_prob[draw[done]] = self.log_mu[done]
        draw[done] = -1
        self.finished += done.numel()
        self.start()

    def output(self):
        """Final states, increments (or None) and log densities."""
        return self.final, self.paths, self.log_prob


class _Lockstep:
    """:func:`sequential` when every draw is in flight from the start and no cap splits a
    round: all draws take step ``k`` in round ``k``, and the keyed noise of many steps is
    drawn at once. The same arithmetic as the general loop, so the same draws. A
    :class:`~pyro_autospec.engine.stepping.RoundStepper` over steps."""

    def __init__(self, chain, evaluate, x0, draw_keys, return_paths):
        num, d = x0.shape
        n, dev, wide = chain.num_steps, chain.device, chain.wide
        self.chain, self.evaluate, self.draw_keys, self.num = chain, evaluate, draw_keys, num
        self.x = x0.to(device=dev, dtype=wide).clone()
        self.log_mu = torch.zeros(num, dtype=wide, device=dev)
        self.paths = torch.zeros(num, n, d, dtype=wide, device=dev) if return_paths else None
        self.step_log_norm = chain.log_norm.diff()  # log_norm[k + 1] - log_norm[k]
        self.window = max(1, min(n, keys.NOISE_ENTRIES // max(1, num * d)))
        self.finished = self.rounds = self.oracle_rows = 0
        self.sample_rounds = torch.full((num,), n, dtype=torch.long, device=dev)

    def start(self) -> None:
        pass

    @property
    def done(self) -> bool:
        return self.finished >= self.chain.num_steps

    def step(self) -> None:
        chain, k, num, dev = self.chain, self.finished, self.num, self.chain.device
        if k % self.window == 0:  # the noise of steps k .. k + window - 1 of every draw
            ks = torch.arange(k, min(chain.num_steps, k + self.window), device=dev)
            step_keys = _step_key(self.draw_keys.unsqueeze(1), ks)  # [num, W]
            self.z = chain.standard_noise(step_keys, torch.zeros_like(step_keys))  # [num, W, d]
        # the drift may write to its input
        f = self.evaluate(chain.times[k].repeat(num), self.x.clone())
        h = chain.h[k]
        inc = f * h + chain.noise_sd[k] * self.z[:, k % self.window]
        resid = inc - f * h
        self.log_mu += self.step_log_norm[k] - 0.5 * (resid**2).sum(1) / (chain.var * h)
        if self.paths is not None:
            self.paths[:, k] = inc
        self.x += inc
        self.finished += 1
        self.rounds += 1
        self.oracle_rows += num

    def output(self):
        """Final states, increments (or None) and log densities."""
        return self.x, self.paths, self.log_mu


@engine_mode()
def picard(
    chain: Chain,
    evaluate: DriftEvaluator,
    x0: torch.Tensor,
    draw_keys,
    knobs: dict,
    progress: bool,
):
    """ParaDiGMS-style sliding-window Picard iteration, every draw in flight together.

    Each draw has fixed noise ``s sqrt(h_k) normal(draw, NOISE, k d + c)``; a round evaluates
    the drift on the current guess of the window ``[begin, end)``, rebuilds the window's path
    by a cumulative sum, keeps the converged prefix (``|X_new - X_old|^2 / (d s^2 h_k) <=
    tolerance^2``) and slides. APPROXIMATE: stops at the tolerance. ``knobs``: the method's
    validated ``window``, ``tolerance``, ``max_concurrent_draws`` and ``max_rows_per_round``.

    Returns
    -------
    EulerOutput
        With the whole paths and the fixed noise; ``log_prob`` None.
    """
    window, tolerance = knobs["window"], knobs["tolerance"]
    concurrent = knobs["max_concurrent_draws"]
    stepper = _Picard(chain, evaluate, x0, draw_keys, window, tolerance, concurrent)
    stepper.cap = knobs["max_rows_per_round"]
    run_rounds(stepper, total=x0.shape[0], progress=progress, desc="picard")
    out = stepper.out
    return EulerOutput(
        out[:, -1],
        out,
        None,
        stepper.rounds,
        stepper.oracle_rows,
        stepper.sample_rounds,
        noise=stepper.noise,
    )


class _Picard:
    """:func:`picard` as a :class:`~pyro_autospec.engine.stepping.RoundStepper` over draws."""

    def __init__(self, chain, evaluate, x0, draw_keys, window, tolerance, max_concurrent):
        num, d = x0.shape
        n, dev, wide = chain.num_steps, chain.device, chain.wide
        lanes = min(int(max_concurrent or num), num)
        self.chain, self.evaluate, self.x0, self.num = chain, evaluate, x0, num
        self.w, self.tolerance, self.cap = int(window), tolerance, None
        steps = torch.arange(n, device=dev)
        counter = steps.view(1, n, 1) * d + torch.arange(d, device=dev)
        self.noise = chain.noise_sd.view(1, n, 1) * keys.normal(
            draw_keys.view(-1, 1, 1), keys.Tag.NOISE, counter
        ).to(wide)
        self.out = torch.zeros(num, n + 1, d, dtype=wide, device=dev)
        self.draw = torch.full((lanes,), -1, dtype=torch.long, device=dev)
        self.path = torch.zeros(lanes, n + 1, d, dtype=wide, device=dev)
        self.begin = torch.zeros(lanes, dtype=torch.long, device=dev)
        self.end = torch.zeros(lanes, dtype=torch.long, device=dev)
        self.sample_rounds = torch.zeros(num, dtype=torch.long, device=dev)
        self.started = self.finished = self.rounds = self.oracle_rows = 0
        self.jj = torch.arange(self.w, device=dev)

    @property
    def done(self) -> bool:
        return self.finished >= self.num

    def start(self) -> None:
        """Free lanes take the next draws, with the zero-drift guess of their path."""
        n, dev, draw = self.chain.num_steps, self.chain.device, self.draw
        free = torch.nonzero(draw < 0).flatten()[: self.num - self.started]
        if free.numel():
            new = torch.arange(self.started, self.started + free.numel(), device=dev)
            draw[free] = new
            self.started += free.numel()
            start = self.x0[new].to(self.chain.wide)
            self.path[free, 0] = start
            self.path[free, 1:] = start.unsqueeze(1) + self.noise[new].cumsum(1)
            self.begin[free] = 0
            self.end[free] = min(n, self.w)

    def step(self) -> None:
        chain, draw, path, noise, jj, w = (
            self.chain,
            self.draw,
            self.path,
            self.noise,
            self.jj,
            self.w,
        )
        n, d, dev, wide = chain.num_steps, path.shape[-1], chain.device, chain.wide
        active = torch.nonzero(draw >= 0).flatten()
        if self.cap is not None:
            active = active[torch.argsort(draw[active])][: max(1, self.cap // w)]
        lo, hi = self.begin[active], self.end[active]
        size = hi - lo
        valid = jj.unsqueeze(0) < size.unsqueeze(1)
        step = (lo.unsqueeze(1) + jj).clamp(max=n - 1)  # [A, w]
        self.rounds += 1
        self.oracle_rows += int(size.sum())
        self.sample_rounds[draw[active]] += 1
        lane_grid = active.unsqueeze(1).expand_as(step)
        f = torch.zeros(active.numel(), w, d, dtype=wide, device=dev)
        f[valid] = self.evaluate(chain.times[step[valid]], path[lane_grid[valid], step[valid]])
        z = noise[draw[active].unsqueeze(1), step]
        incr = torch.where(valid.unsqueeze(-1), f * chain.h[step].unsqueeze(-1) + z, 0.0)
        new = path[active, lo].unsqueeze(1) + incr.cumsum(1)  # X_{lo+1..lo+w}
        old = path[lane_grid, (step + 1).clamp(max=n)]
        err = ((new - old) ** 2).sum(-1) / (d * chain.var * chain.h[step])
        path[lane_grid[valid], (step + 1)[valid]] = new[valid]
        bad = valid & (err > self.tolerance * self.tolerance)
        converged = torch.where(bad.any(1), torch.argmax(bad.long(), 1), size)
        new_begin = torch.minimum(lo + converged + 1, hi)
        new_end = torch.clamp(new_begin + w, max=n)
        # extend the window with the last drift frozen
        grow = new_end > hi
        if bool(grow.any()):
            g = active[grow]
            last = f[grow, (size[grow] - 1)]
            ext = jj.unsqueeze(0) < (new_end[grow] - hi[grow]).unsqueeze(1)
            est = (hi[grow].unsqueeze(1) + jj).clamp(max=n - 1)
            zz = noise[draw[g].unsqueeze(1), est]
            extra = torch.where(
                ext.unsqueeze(-1), last.unsqueeze(1) * chain.h[est].unsqueeze(-1) + zz, 0.0
            )
            filled = path[g, hi[grow]].unsqueeze(1) + extra.cumsum(1)
            g_grid = g.unsqueeze(1).expand_as(est)
            path[g_grid[ext], (est + 1)[ext]] = filled[ext]
        self.begin[active], self.end[active] = new_begin, new_end
        done = active[new_begin >= n]
        self.out[draw[done]] = path[done]
        draw[done] = -1
        self.finished += done.numel()
        self.start()
