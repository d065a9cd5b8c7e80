"""Euler-Maruyama chains as tensor programs: the diffusion problem of the fast engine.

The target is the law of the chain of ``dX = b(t, X) dt + s dB`` on ``t_0 < ... < t_N``
(``h_k = t_{k+1} - t_k``)::

    X_{k+1} = X_k + b(t_k, X_k) h_k + s sqrt(h_k) xi_k,    xi_k ~ N(0, I_d).

The positions of autospeculation are the ``N`` steps, in time order (:doc:`/diffusion`):

* the *draft row* of a block ``[a, b)`` is the drift ``b_a = b(t_a, X_a)`` at its start;
* the *draft* draws every increment with that frozen drift (keyed normal noise, no oracle
  call); it is regenerated from its key when the verification is sent, so nothing is stored;
* the *verification* is one round: the drifts ``b_k`` at the drafted states for ``a < k < b``,
  plus the prefetch ``b(t_b, X_b)`` (the next block's draft row), and
  ``log dmu_S/dnu_S = sum_{a<k<b} [<b_k - b_a, dX_k> - (|b_k|^2 - |b_a|^2) h_k / 2] / s^2``;
* a residual try's ``log nu`` (the frozen-drift density of its increments) needs only
  ``sum_k |dX_k|^2 / h_k``, ``X_b - X_a`` and ``b_a``, which a frame carries.

A frame is the current state ``X`` of a sequence, its start state and the running
``sum |dX_k|^2 / h_k``; with ``return_paths`` it also keeps the increments of its steps.

This module also holds the drift evaluator shared by both engines and the fast
``"sequential"`` and ``"picard"`` samplers. It does not import Pyro.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from pyro_autospec.engine import keys
from pyro_autospec.engine.errors import OracleError
from pyro_autospec.engine.modes import calling, engine_mode
from pyro_autospec.engine.schedule import adaptive_rho
from pyro_autospec.engine.stepping import run_rounds
from pyro_autospec.engine.tables import Table, ragged, segment_cumsum, segment_sum

__all__ = [
    "Chain",
    "DriftEvaluator",
    "EulerBlocks",
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
    ratio, mu = torch.as_tensor(log_ratio), torch.as_tensor(log_mu)
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


class EulerBlocks:
    """The diffusion problem for :class:`~pyro_autospec.engine.recursion.Recursion`.

    Parameters
    ----------
    chain : Chain
    evaluate : DriftEvaluator
    x0 : Tensor[N, d]
        Start state of every draw (float64).
    rho : float, "adaptive" or callable
        Batch growth of residual tries (a callable ``rho(size, log_ratio)`` is called once per
        rejected block).
    return_paths : bool
        Keep the increments of every draw (``paths``).
    """

    def __init__(
        self, chain: Chain, evaluate: DriftEvaluator, x0: torch.Tensor, rho, return_paths: bool
    ):
        self.chain = chain
        self.evaluate = evaluate
        self.device = chain.device
        self.num_positions = chain.num_steps
        self.d = chain.dim
        self.x0 = x0.to(device=self.device, dtype=chain.wide)
        self.rho = rho
        self.return_paths = return_paths
        num = x0.shape[0]
        wide = chain.wide
        self.final = torch.zeros(num, self.d, dtype=wide, device=self.device)
        self.paths = (
            torch.zeros(num, chain.num_steps, self.d, dtype=wide, device=self.device)
            if return_paths
            else None
        )
        self.slots = Table({"f": ((self.d,), wide, 0.0)}, self.device, capacity=256)
        self._x = self._start = torch.zeros(0, self.d, dtype=wide, device=self.device)
        self._q = torch.zeros(0, dtype=wide, device=self.device)
        self._verified = None
        self.pool = _PathPool(self.d, wide, self.device) if return_paths else None

    def bind(self, recursion) -> None:
        self.rec = recursion

    # --------------------------------------------------------------------------- frames
    def _frames(self):
        capacity = self.rec.seqs.capacity
        if self._x.shape[0] < capacity:

            def grow(t, shape):
                new = torch.zeros((capacity, *shape), dtype=t.dtype, device=self.device)
                new[: t.shape[0]] = t
                return new

            self._x = grow(self._x, (self.d,))
            self._start = grow(self._start, (self.d,))
            self._q = grow(self._q, ())
            if self.pool is not None:
                self.pool.reserve(capacity)
        return self._x, self._start, self._q

    def init_frames(self, seqs: torch.Tensor, draws: torch.Tensor) -> None:
        x, start, q = self._frames()
        x[seqs] = self.x0[draws]
        start[seqs] = self.x0[draws]
        q[seqs] = 0.0
        if self.pool is not None:
            self.pool.alloc(seqs, torch.zeros_like(seqs), torch.full_like(seqs, self.num_positions))

    def spawn(self, threads, parents, lo, hi) -> None:
        x, start, q = self._frames()
        x[threads] = x[parents]
        start[threads] = x[parents]
        q[threads] = 0.0
        if self.pool is not None:
            self.pool.alloc(threads, lo, hi)

    def commit(self, winners: torch.Tensor, seqs: torch.Tensor) -> None:
        x, start, q = self._frames()
        x[seqs] = x[winners]
        q[seqs] += q[winners]
        if self.pool is not None:
            self.pool.copy(winners, seqs)

    def free_frames(self, seqs: torch.Tensor) -> None:
        if self.pool is not None:
            self.pool.free(seqs)

    def free_rows(self, slots: torch.Tensor) -> None:
        self.slots.free(slots)

    def finish(self, roots: torch.Tensor, draws: torch.Tensor) -> None:
        self.final[draws] = self._frames()[0][roots]
        if self.pool is not None:
            self.paths[draws] = self.pool.read(roots, self.num_positions)

    def race_rho(self, view, pick: torch.Tensor, log_ratio: torch.Tensor, rho) -> torch.Tensor:
        if self.rho == "adaptive":
            return adaptive_rho(None, log_ratio).to(torch.float64)
        if callable(self.rho):
            size = (view.b - view.a)[pick].tolist()
            values = []
            for s, lr in zip(size, log_ratio.tolist()):
                value = float(self.rho(s, lr))
                if not (value > 0 and math.isfinite(value)):
                    raise ValueError(f"rho({s}, {lr}) returned {value}; it must be positive")
                values.append(value)
            return torch.tensor(values, dtype=torch.float64, device=self.device)
        return torch.full((pick.numel(),), float(self.rho), dtype=torch.float64, device=self.device)

    # ---------------------------------------------------------------------------- blocks
    def draft(self, nodes: torch.Tensor) -> None:
        pass  # drafts are regenerated from their keys when verified

    def _write(self, seq: torch.Tensor, step: torch.Tensor, inc: torch.Tensor) -> None:
        """Store increments ``inc`` [T, d] of steps ``step`` [T] in the sequences' paths."""
        if self.pool is not None:
            self.pool.write(seq, step, inc)

    def leaf(self, view) -> torch.Tensor:
        chain = self.chain
        a = view.a
        f = self.slots["f"][view.row]
        inc = chain.noise(view.key, f, a, torch.zeros_like(a))  # [K, d]
        x, _, q = self._frames()
        x[view.seq] += inc
        h = chain.h[a]
        q[view.seq] += (inc**2).sum(1) / h
        self._write(view.seq, a, inc)
        resid = inc - f * h.unsqueeze(1)
        return (chain.log_norm[a + 1] - chain.log_norm[a]) - 0.5 * (resid**2).sum(1) / (
            chain.var * h
        )

    def accepted(self, view, pick: torch.Tensor) -> None:
        if pick.numel() == 0:
            return
        end, q_block, inc, block, step = self._verified
        x, _, q = self._frames()
        seq = view.seq[pick]
        x[seq] = end[pick]
        q[seq] += q_block[pick]
        if self.pool is not None:
            keep = torch.zeros(len(view), dtype=torch.bool, device=self.device)
            keep[pick] = True
            mine = torch.nonzero(keep[block]).flatten()
            self._write(view.seq[block[mine]], step[mine], inc[mine])

    def try_log_nu(self, threads: torch.Tensor, owners) -> torch.Tensor:
        chain = self.chain
        a, b = owners.a, owners.b
        f = self.slots["f"][owners.row]
        x, start, q = self._frames()
        span = chain.times[b] - chain.times[a]
        quad = q[threads] - 2 * (f * (x[threads] - start[threads])).sum(1) + (f * f).sum(1) * span
        return (chain.log_norm[b] - chain.log_norm[a]) - 0.5 * quad / chain.var

    # ---------------------------------------------------------------------------- queries
    def answer(self, row_view, verify_view):
        """One round: drift rows of ``row_view``'s nodes, verification of ``verify_view``'s
        (drafts regenerated from their keys); returns as
        :meth:`~pyro_autospec.engine.discrete.DiscreteBlocks.answer`.

        The steps of the blocks being verified are laid out flat (:func:`ragged`), not padded
        to the largest block: a round costs its rows, however unequal its blocks.
        """
        chain = self.chain
        x, _, _ = self._frames()
        wide = chain.wide
        vv = verify_view
        nv = len(vv)
        a, b = vv.a, vv.b
        size = b - a
        has_next = vv.nxt > b
        block, j, first = ragged(size)  # step a + j of block `block`, for j < size
        last = first + size - 1
        longest = int(size.max()) if nv else 0
        step = a[block] + j
        f_a = self.slots["f"][vv.row]  # [nv, d] the frozen drift of each block
        f_block = f_a[block]
        inc = chain.noise(vv.key[block], f_block, step, j)  # [T, d]
        states = x[vv.seq][block] + segment_cumsum(inc, j, longest)  # X_{a+1+j}
        # rows: draft rows, then the states X_{a+1..b-1} and the prefetch X_b
        asked = j < (size - 1 + has_next.long())[block]
        t = torch.cat([chain.times[row_view.a], chain.times[step[asked] + 1]])
        xs = torch.cat([x[row_view.seq], states[asked]])
        out = self.evaluate(t, xs)
        nr = len(row_view)
        row_slots = self.slots.alloc(nr)
        self.slots["f"][row_slots] = out[:nr]
        empty = torch.zeros(0, dtype=wide, device=self.device)
        next_rows = torch.full((nv,), -1, dtype=torch.long, device=self.device)
        if nv == 0:
            self._verified = None
            return row_slots, empty, empty, next_rows, None
        drifts = torch.zeros(inc.shape, dtype=wide, device=self.device)
        drifts[asked] = out[nr:]  # drifts[k] is b at X_{a+1+j}: the drift of the next step
        f_k = torch.where((j == 0).unsqueeze(1), f_block, drifts.roll(1, 0))  # of step a + j
        h = chain.h[step]
        cross = ((f_k - f_block) * inc).sum(-1)
        sq = ((f_k * f_k).sum(-1) - (f_a * f_a).sum(-1)[block]) * h
        resid = inc - f_k * h.unsqueeze(-1)
        terms = torch.stack(
            [
                torch.where(j >= 1, cross - 0.5 * sq, 0.0),  # log dmu/dnu of the step
                (resid**2).sum(-1) / h,  # its quadratic form under the target
                (inc**2).sum(-1) / h,  # and the frame's running sum
            ],
            1,
        )
        sums = segment_sum(terms, size, j)  # [nv, 3]: per block
        log_ratio = sums[:, 0] / chain.var
        log_mu = (chain.log_norm[b] - chain.log_norm[a]) - 0.5 * sums[:, 1] / chain.var
        check_log_ratio(log_ratio, log_mu, self.evaluate.name)
        if bool(has_next.any()):
            slots = self.slots.alloc(int(has_next.sum()))
            self.slots["f"][slots] = drifts[last[has_next]]
            next_rows[has_next] = slots
        self._verified = (states[last], sums[:, 2], inc, block, step)
        return row_slots, log_ratio.double(), log_mu.double(), next_rows, None


class _PathPool:
    """Increments of the steps ``[lo, hi)`` of every live sequence, in one flat buffer.

    Sequences get contiguous segments from a bump allocator; when the buffer is full the live
    segments are packed to its front (amortised O(1) per stored increment).
    """

    def __init__(self, dim: int, dtype: torch.dtype, device: torch.device):
        self.d, self.dtype, self.device = dim, dtype, device
        self.data = torch.zeros(1024, dim, dtype=dtype, device=device)
        self.top = 0
        self.offset = torch.zeros(0, dtype=torch.long, device=device)
        self.lo = torch.zeros(0, dtype=torch.long, device=device)
        self.size = torch.zeros(0, dtype=torch.long, device=device)

    def reserve(self, capacity: int) -> None:
        def grow(t):
            new = torch.zeros(capacity, dtype=t.dtype, device=self.device)
            new[: t.shape[0]] = t
            return new

        self.offset, self.lo, self.size = grow(self.offset), grow(self.lo), grow(self.size)

    def alloc(self, seqs: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> None:
        size = hi - lo
        total = int(size.sum())
        if self.top + total > self.data.shape[0]:
            self._pack(total)
        self.offset[seqs] = self.top + torch.cumsum(size, 0) - size
        self.lo[seqs] = lo
        self.size[seqs] = size
        self.top += total

    def free(self, seqs: torch.Tensor) -> None:
        self.size[seqs] = 0

    def _pack(self, extra: int) -> None:
        live = torch.nonzero(self.size > 0).flatten()
        size = self.size[live]
        total = int(size.sum())
        capacity = max(self.data.shape[0], 2 * (total + extra))
        new = torch.zeros(capacity, self.d, dtype=self.dtype, device=self.device)
        if total:
            segment, j, start = ragged(size)
            new[:total] = self.data[self.offset[live][segment] + j]
            self.offset[live] = start
        self.data, self.top = new, total

    def write(self, seqs: torch.Tensor, step: torch.Tensor, inc: torch.Tensor) -> None:
        """Store ``inc`` [T, d] as the increments of steps ``step`` [T] of ``seqs`` [T]."""
        self.data[self.offset[seqs] + step - self.lo[seqs]] = inc

    def copy(self, winners: torch.Tensor, seqs: torch.Tensor) -> None:
        """Copy the winners' increments into ``seqs`` (same steps)."""
        segment, j, _ = ragged(self.size[winners])
        src = self.offset[winners][segment] + j
        shift = (self.offset[seqs] + self.lo[winners] - self.lo[seqs])[segment]
        self.data[shift + j] = self.data[src]

    def read(self, seqs: torch.Tensor, count: int) -> torch.Tensor:
        index = self.offset[seqs].unsqueeze(1) + torch.arange(count, device=self.device)
        return self.data[index]


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
