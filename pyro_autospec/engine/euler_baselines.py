"""The diffusion baselines on the host control plane: sequential Euler steps and Picard iteration.

Both run where autospeculation's token rule runs (:mod:`pyro_autospec.engine.euler_tokens`):
the draws' states live on the host in NumPy float64 arrays, and a round uploads its states
once, calls the drift once and copies the answers back once. So a comparison of rounds, rows
and wall time between the methods compares the methods, not two ways of bookkeeping.

* :func:`sequential` is the chain itself, one step per round. With every draw in flight and no
  cap on rows it runs the draws in lockstep (:class:`Lockstep`: step ``k`` of every draw in
  round ``k``, the keyed noise of many steps drawn at once); otherwise it is the token rule with
  windows of one step (:class:`~pyro_autospec.engine.euler_tokens.EulerTokens` with
  ``max_block=1``: each window's drift is known, so every step passes), which brings
  continuous batching and the cap on rows per round. Both read step ``k``'s noise
  ``normal(child(draw, LEAF, k), DRAFT, c)``, so both give the same draws, and the same as
  autospeculation's token rule with ``max_block=1``.
* :func:`picard` is ParaDiGMS-style sliding-window Picard iteration (APPROXIMATE), and
  :func:`follow_noise` the sequential chain driven by given noise (how far Picard's paths are
  from it).

This module does not import Pyro.
"""

from __future__ import annotations

import numpy as np
import torch

from pyro_autospec.engine import keys
from pyro_autospec.engine.errors import OracleError
from pyro_autospec.engine.euler import Chain, DriftEvaluator, EulerOutput
from pyro_autospec.engine.euler_tokens import (
    EulerTokens,
    HostChain,
    euler_step,
    host_drift,
    host_float64,
    host_output,
)
from pyro_autospec.engine.modes import engine_mode
from pyro_autospec.engine.stepping import run_rounds

__all__ = ["Lockstep", "follow_noise", "picard", "sequential"]


@engine_mode()
def sequential(
    chain: Chain,
    evaluate: DriftEvaluator,
    x0: torch.Tensor,
    draw_keys: torch.Tensor,
    knobs: dict,
    return_paths: bool,
    progress: bool,
) -> EulerOutput:
    """The reference chain, one step per round.

    Step ``k`` of draw ``s`` uses the noise of the one-step window starting at ``k``
    (``normal(child(draw, LEAF, k), DRAFT, c)``).

    Parameters
    ----------
    chain : Chain
    evaluate : DriftEvaluator
    x0 : Tensor[D, d]
        Start states.
    draw_keys : LongTensor[D]
    knobs : dict
        ``max_concurrent_draws`` (continuous batching) and ``max_rows_per_round`` (draws
        beyond it wait, oldest first), each ``None`` for no limit.
    return_paths : bool
    progress : bool

    Returns
    -------
    EulerOutput
        On the host, in float64.

    Examples
    --------
    >>> import torch
    >>> from pyro_autospec.engine import keys
    >>> from pyro_autospec.engine.euler import Chain, DriftEvaluator
    >>> cpu = torch.device("cpu")
    >>> chain = Chain(torch.linspace(0.0, 1.0, 33), 1.0, 1, cpu)
    >>> drift = DriftEvaluator(lambda t, x: -x, 1, cpu, torch.float64, None, "drift")
    >>> draws = keys.draw_keys(0, torch.arange(4))
    >>> knobs = {"max_concurrent_draws": None, "max_rows_per_round": None}
    >>> out = sequential(chain, drift, torch.zeros(4, 1), draws, knobs, False, False)
    >>> out.rounds, out.oracle_rows
    (32, 128)
    """
    num = x0.shape[0]
    lanes = min(int(knobs.get("max_concurrent_draws") or num), num)
    cap = knobs.get("max_rows_per_round")
    if lanes == num and (cap is None or cap >= num):
        stepper = Lockstep(HostChain.of(chain), evaluate, host_float64(x0), draw_keys, return_paths)
        steps = chain.num_steps
        run_rounds(stepper, total=steps, progress=progress, desc="sequential", unit="step")
        return host_output(stepper)
    one_step = {
        "max_block": 1,
        "min_block": 1,
        "max_rows_per_round": cap,
        "max_concurrent_draws": lanes,
    }
    tokens = EulerTokens(chain, evaluate, x0, draw_keys, one_step, return_paths)
    return tokens.run(progress, desc="sequential")


class Lockstep:
    """:func:`sequential` when every draw is in flight from the start and no cap splits a round:
    all draws take step ``k`` in round ``k``. A
    :class:`~pyro_autospec.engine.stepping.RoundStepper` over steps.

    The arithmetic of a step is :func:`~pyro_autospec.engine.euler_tokens.draft_windows` and
    :func:`~pyro_autospec.engine.euler_tokens.verify_windows` with windows of one step (the
    increment ``b h + s sqrt(h) z`` and its log density), so the draws are the token rule's with
    ``max_block=1``; the noise of many steps is drawn at once.
    """

    def __init__(
        self,
        chain: HostChain,
        evaluate: DriftEvaluator,
        x0: np.ndarray,
        draw_keys: torch.Tensor,
        return_paths: bool,
    ):
        num, d = x0.shape
        n = chain.num_steps
        self.chain, self.evaluate, self.num = chain, evaluate, num
        self.keys = draw_keys.detach().cpu().numpy()
        self.x0, self.final = x0, x0.copy()  # the states, final once done
        self.log_prob = np.zeros(num)
        self.increments = np.zeros((num, n, d)) if return_paths else None
        self.sample_rounds = np.full(num, n, dtype=np.int64)
        self.window = max(1, min(n, keys.NOISE_ENTRIES // max(1, num * d)))
        self.z = np.zeros((num, 0, d))
        self.finished = self.rounds = self.oracle_rows = 0

    def start(self) -> None:
        pass

    @property
    def done(self) -> bool:
        return self.finished >= self.chain.num_steps

    def step(self) -> None:
        chain, k, num = self.chain, self.finished, self.num
        if k % self.window == 0:  # the noise of steps k .. k + window - 1 of every draw
            ks = np.arange(k, min(chain.num_steps, k + self.window))
            step_keys = keys.host_child(self.keys[:, None], keys.Tag.LEAF, ks)  # [num, W]
            z = keys.host_normal(step_keys[..., None], keys.Tag.DRAFT, np.arange(chain.dim))
            self.z = z.reshape(num, ks.size, chain.dim)
        f = host_drift(self.evaluate, np.full(num, chain.times[k]), self.final.copy())
        increment, term = euler_step(chain, k, f, self.z[:, k % self.window], self.evaluate.name)
        self.log_prob += term
        if self.increments is not None:
            self.increments[:, k] = increment
        self.final += increment
        self.finished += 1
        self.rounds += 1
        self.oracle_rows += num


@engine_mode()
def picard(
    chain: Chain,
    evaluate: DriftEvaluator,
    x0: torch.Tensor,
    draw_keys: torch.Tensor,
    knobs: dict,
    progress: bool,
) -> EulerOutput:
    """ParaDiGMS-style sliding-window Picard iteration. APPROXIMATE: stops at a tolerance.

    Each draw has fixed noise ``s sqrt(h_k) normal(draw, NOISE, k d + c)``; a round evaluates
    the drift on the current guess of the window ``[begin, end)``, rebuilds the window's path
    by a cumulative sum, keeps the converged prefix (``|X_new - X_old|^2 / (d s^2 h_k) <=
    tolerance^2``) and slides.

    Parameters
    ----------
    chain, evaluate, x0, draw_keys
        As for :func:`sequential`.
    knobs : dict
        The method's validated ``window``, ``tolerance``, ``max_concurrent_draws`` and
        ``max_rows_per_round``.
    progress : bool

    Returns
    -------
    EulerOutput
        With the whole paths and the fixed noise; ``log_prob`` None.
    """
    stepper = _Picard(HostChain.of(chain), evaluate, host_float64(x0), draw_keys, knobs)
    run_rounds(stepper, total=stepper.num, progress=progress, desc="picard")
    out = torch.from_numpy(stepper.out)
    return EulerOutput(
        out[:, -1],
        out,
        None,
        stepper.rounds,
        stepper.oracle_rows,
        torch.from_numpy(stepper.sample_rounds),
        noise=torch.from_numpy(stepper.noise),
    )


class _Picard:
    """:func:`picard` as a :class:`~pyro_autospec.engine.stepping.RoundStepper` over draws."""

    def __init__(self, chain: HostChain, evaluate, x0: np.ndarray, draw_keys, knobs: dict):
        num, d = x0.shape
        n = chain.num_steps
        lanes = min(int(knobs["max_concurrent_draws"] or num), num)
        self.chain, self.evaluate, self.x0, self.num = chain, evaluate, x0, num
        self.w, self.tolerance = int(knobs["window"]), knobs["tolerance"]
        self.cap = knobs["max_rows_per_round"]
        counter = np.arange(n)[:, None] * d + np.arange(d)  # [n, d]
        draws = draw_keys.detach().cpu().numpy()
        z = keys.host_normal(draws[:, None, None], keys.Tag.NOISE, counter)
        self.noise = chain.sd[None, :, None] * z.reshape(num, n, d)
        self.out = np.zeros((num, n + 1, d))
        self.draw = np.full(lanes, -1, dtype=np.int64)
        self.path = np.zeros((lanes, n + 1, d))
        self.begin = np.zeros(lanes, dtype=np.int64)
        self.end = np.zeros(lanes, dtype=np.int64)
        self.sample_rounds = np.zeros(num, dtype=np.int64)
        self.started = self.finished = self.rounds = self.oracle_rows = 0
        self.jj = np.arange(self.w)

    @property
    def done(self) -> bool:
        return self.finished >= self.num

    def start(self) -> None:
        """Free lanes take the next draws, with the zero-drift guess of their path."""
        n, draw = self.chain.num_steps, self.draw
        free = np.flatnonzero(draw < 0)[: self.num - self.started]
        if free.size:
            new = np.arange(self.started, self.started + free.size)
            draw[free] = new
            self.started += free.size
            start = self.x0[new]
            self.path[free, 0] = start
            self.path[free, 1:] = start[:, None] + np.cumsum(self.noise[new], 1)
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
        n, d = chain.num_steps, path.shape[-1]
        active = np.flatnonzero(draw >= 0)
        if self.cap is not None:
            active = active[np.argsort(draw[active], kind="stable")][: max(1, self.cap // w)]
        lo, hi = self.begin[active], self.end[active]
        size = hi - lo
        valid = jj[None, :] < size[:, None]
        step = np.minimum(lo[:, None] + jj, n - 1)  # [A, w]
        self.rounds += 1
        self.oracle_rows += int(size.sum())
        self.sample_rounds[draw[active]] += 1
        lane_grid = np.broadcast_to(active[:, None], step.shape)
        f = np.zeros((active.size, w, d))
        states = path[lane_grid[valid], step[valid]]  # a fresh array
        try:
            f[valid] = host_drift(self.evaluate, chain.times[step[valid]], states)
        except OracleError as error:  # the iterates' size, read only when the drift failed
            largest = np.abs(states[np.isfinite(states)]).max(initial=0.0)
            if np.isfinite(states).all() and largest <= 1e100:
                raise  # the drift's own error, at states the chain could reach
            raise OracleError(
                f"Picard iteration diverged: its iterates reached |x| = {largest:.3g}, where the "
                f"drift overflows. Picard is an approximate baseline whose iterates need not stay "
                f"near the chain (a stiff drift, or a long window with a large step); the "
                f"exact methods 'autospec' and 'sequential' do not iterate. Try a smaller "
                f"window or more steps. (The drift's own error: {str(error)[:120]})"
            ) from error
        z = noise[draw[active][:, None], step]
        incr = np.where(valid[..., None], f * chain.h[step][..., None] + z, 0.0)
        new = path[active, lo][:, None] + np.cumsum(incr, 1)  # X_{lo+1..lo+w}
        old = path[lane_grid, np.minimum(step + 1, n)]
        err = ((new - old) ** 2).sum(-1) / (d * chain.var * chain.h[step])
        path[lane_grid[valid], (step + 1)[valid]] = new[valid]
        bad = valid & (err > self.tolerance * self.tolerance)
        converged = np.where(bad.any(1), np.argmax(bad, 1), size)
        new_begin = np.minimum(lo + converged + 1, hi)
        new_end = np.minimum(new_begin + w, n)
        grow = new_end > hi  # extend the window with the last drift frozen
        if grow.any():
            g = active[grow]
            last = f[grow, size[grow] - 1]
            ext = jj[None, :] < (new_end[grow] - hi[grow])[:, None]
            est = np.minimum(hi[grow][:, None] + jj, n - 1)
            zz = noise[draw[g][:, None], est]
            extra = np.where(ext[..., None], last[:, None] * chain.h[est][..., None] + zz, 0.0)
            filled = path[g, hi[grow]][:, None] + np.cumsum(extra, 1)
            g_grid = np.broadcast_to(g[:, None], est.shape)
            path[g_grid[ext], (est + 1)[ext]] = filled[ext]
        self.begin[active], self.end[active] = new_begin, new_end
        done = active[new_begin >= n]
        self.out[draw[done]] = path[done]
        draw[done] = -1
        self.finished += done.size
        self.start()


def follow_noise(
    chain: Chain, evaluate: DriftEvaluator, x0: torch.Tensor, noise: torch.Tensor
) -> torch.Tensor:
    """Final states of the sequential chain driven by given noise: Tensor[M, d].

    ``x0`` Tensor[M, d], ``noise`` Tensor[M, N, d] (each step's ``s sqrt(h_k) xi_k``, as
    :func:`picard` returns it). One drift call per step, on the host plane.
    """
    host = HostChain.of(chain)
    x, noise = host_float64(x0), host_float64(noise)
    for k in range(host.num_steps):
        f = host_drift(evaluate, np.full(x.shape[0], host.times[k]), x.copy())
        x = x + f * host.h[k] + noise[:, k]
    return torch.from_numpy(x)
