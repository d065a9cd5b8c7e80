"""The reference engine for Euler-Maruyama chains: blocks of steps, and the baselines.

A frame is the whole path ``X_{t_0}, ..., X_{t_N}`` (float64, copied whenever it changes).
Noise comes from the same keys as the fast engine (:mod:`pyro_autospec.engine.euler`), read
one block at a time, so both engines give the same draws.
"""

from __future__ import annotations

import math
from collections.abc import Generator

import numpy as np
import torch

from pyro_autospec.engine import keys
from pyro_autospec.engine.euler import Chain, DriftEvaluator, check_log_ratio
from pyro_autospec.engine.euler_tokens import (
    HostChain,
    draft_windows,
    euler_step,
    host_float64,
    row_mask,
    verify_windows,
)
from pyro_autospec.engine.reference.scheduler import Call
from pyro_autospec.engine.schedule import BlockPolicy, adaptive_rho

__all__ = ["ReferenceEuler", "sequential_draw", "picard_draw", "steps_draw"]


class ReferenceEuler:
    """Reference problem for :func:`~pyro_autospec.engine.reference.recursion.node`.

    A request's payload is ``(t [B], x [B, d])``; its answer the drifts ``[B, d]``.
    """

    def __init__(self, chain: Chain, evaluate: DriftEvaluator, x0: torch.Tensor, rho):
        self.chain = chain
        self.evaluate = evaluate
        self.x0 = x0.to(device=chain.device, dtype=chain.wide)
        self.rho = rho

    def dispatch(self, payloads: list) -> list:
        sizes = [p[0].shape[0] for p in payloads]
        out = self.evaluate(
            torch.cat([p[0] for p in payloads]), torch.cat([p[1] for p in payloads])
        )
        return list(torch.split(out, sizes))

    def _noise(self, key: int, a: int, b: int, drift: torch.Tensor) -> torch.Tensor:
        """Frozen-drift increments of steps ``a..b-1``: [b - a, d]."""
        device = self.chain.device
        key_t = torch.tensor([key], dtype=torch.long, device=device)
        a_t = torch.tensor([a], dtype=torch.long, device=device)
        return self.chain.increments(key_t, drift.unsqueeze(0), a_t, b - a)[0]

    def _log_density(self, inc: torch.Tensor, drift: torch.Tensor, a: int, b: int) -> float:
        """``sum_k log N(dX_k; drift_k h_k, s^2 h_k I)``; ``drift`` [d] or [b - a, d]."""
        chain = self.chain
        h = chain.h[a:b]
        resid = inc - drift * h.unsqueeze(1)
        quad = float(((resid * resid).sum(1) / h).sum())
        return float(chain.log_norm[b] - chain.log_norm[a]) - 0.5 * quad / chain.var

    def initial_frame(self, s: int) -> torch.Tensor:
        path = torch.zeros(
            self.chain.num_steps + 1,
            self.chain.dim,
            dtype=self.chain.wide,
            device=self.chain.device,
        )
        path[0] = self.x0[s]
        return path

    def row_request(self, s, frame, a, b):
        return self.chain.times[a : a + 1], frame[a : a + 1]

    def row_answer(self, s, a, answer):
        return answer[0]

    def leaf(self, s, key, frame, a, row):
        inc = self._noise(key, a, a + 1, row)
        frame = frame.clone()
        frame[a + 1] = frame[a] + inc[0]
        return frame, self._log_density(inc, row, a, a + 1)

    def draft(self, s, key, frame, a, b, row):
        inc = self._noise(key, a, b, row)
        drafted = frame.clone()
        drafted[a + 1 : b + 1] = frame[a] + inc.cumsum(0)
        return drafted, self._log_density(inc, row, a, b)

    def verify_request(self, s, drafted, a, b, nxt, first: int = 1):
        stop = b + 1 if nxt > b else b  # the drift at X_b seeds the next block's draft
        return self.chain.times[a + 1 : stop], drafted[a + 1 : stop]

    def verify(self, s, drafted, a, b, nxt, row, log_nu, answer):
        chain = self.chain
        inc = drafted[a + 1 : b + 1] - drafted[a:b]
        f_k = answer[: b - a - 1]  # drifts at X_{a+1}, ..., X_{b-1}
        h = chain.h[a + 1 : b]
        log_ratio = (
            float(((f_k - row) * inc[1:]).sum())
            - 0.5 * float((((f_k * f_k).sum(1) - row @ row) * h).sum())
        ) / chain.var
        drifts = torch.cat([row.unsqueeze(0), f_k])
        next_row = answer[b - a - 1] if nxt > b else None
        log_mu = self._log_density(inc, drifts, a, b)
        check_log_ratio(log_ratio, log_mu, self.evaluate.name)
        return log_ratio, log_mu, next_row

    def try_log_nu(self, s, y, a, b, row):
        return self._log_density(y[a + 1 : b + 1] - y[a:b], row, a, b)

    def race_rho(self, size: int, log_ratio: float) -> float:
        if self.rho == "adaptive":
            return float(adaptive_rho(None, torch.tensor([log_ratio], dtype=torch.float64)))
        if callable(self.rho):
            value = float(self.rho(size, log_ratio))
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"rho({size}, {log_ratio}) returned {value}; it must be positive")
            return value
        return float(self.rho)


def sequential_draw(problem: ReferenceEuler, s: int, draw_key: int) -> Generator:
    """The chain one step per round; step ``k`` uses the key of the one-step block at ``k``.

    In the host plane's arithmetic (:func:`~pyro_autospec.engine.euler_baselines.sequential`):
    the same increments ``f h + sd z`` and step densities, so both engines give the same bits
    on any time grid.
    """
    chain = problem.chain
    host = HostChain.of(chain)
    x0 = host_float64(problem.x0[s])
    x, increments, log_mu = x0, np.zeros((host.num_steps, host.dim)), 0.0
    for k in range(host.num_steps):
        state = torch.from_numpy(x[None].copy()).to(chain.device)
        (f,) = yield Call((chain.times[k : k + 1], state), 1, s)
        key = np.int64(keys.int_child(draw_key, keys.Tag.LEAF, k))
        z = keys.host_normal(key, keys.Tag.DRAFT, np.arange(host.dim))
        name = problem.evaluate.name
        increments[k], log_density = euler_step(host, k, host_float64(f).reshape(-1), z, name)
        log_mu += log_density
        x = x + increments[k]
    path = np.concatenate([x0[None], x0[None] + np.cumsum(increments, 0)])
    path[-1] = x
    return torch.from_numpy(path).to(device=chain.device, dtype=chain.wide), float(log_mu)


def steps_draw(problem: ReferenceEuler, s: int, draw_key: int, policy: BlockPolicy) -> Generator:
    """Autospeculation step by step (:mod:`pyro_autospec.engine.euler_tokens`) for one draw:
    ask the start's drift, then a window per round until the chain's end."""
    chain = HostChain.of(problem.chain)
    n, d = chain.num_steps, chain.dim
    x0 = host_float64(problem.x0[s])
    draw_keys = np.array([draw_key], dtype=np.int64)
    (f,) = yield Call((problem.chain.times[0:1], problem.x0[s : s + 1]), 1, s)
    x, frozen, known = x0[None], host_float64(f)[None], True
    k, window, tokens, misses, log_mu = 0, policy.start_window(), 0, 0, 0.0
    increments = np.zeros((n, d))
    while k < n:
        windows = np.array([[k, min(window, n - k)]])
        draft = draft_windows(chain, draw_keys, windows, x, frozen)
        mask = row_mask(chain, windows, np.array([known]))[0]
        drifts = np.zeros(draft.states.shape)
        if known:
            drifts[0, 0] = frozen[0]
        if mask.any():
            at = np.flatnonzero(mask)
            payload = (
                torch.from_numpy(chain.times[k + at]).to(problem.chain.device),
                torch.from_numpy(draft.states[0, at]).to(problem.chain.device),
            )
            answer = yield Call(payload, int(at.size), s)
            drifts[0, at] = host_float64(answer)
        verdict = verify_windows(
            chain, draft, drifts, problem.evaluate.name, problem.evaluate.beyond_dtype_error
        )
        count = int(verdict.count[0])
        increments[k : k + count] = verdict.increments[0, :count]
        log_mu += float(verdict.log_density[0])
        x, frozen, known = verdict.state, verdict.drift, not bool(verdict.missed[0])
        k += count
        tokens += count
        misses += int(verdict.missed[0])
        window = int(policy.token_window(np.array([tokens]), np.array([misses]))[0])
    path = np.concatenate([x0[None], x0[None] + np.cumsum(increments, 0)])
    path[-1] = x[0]
    return torch.from_numpy(path).to(device=problem.chain.device, dtype=problem.chain.wide), log_mu


def picard_draw(
    problem: ReferenceEuler, s: int, draw_key: int, window: int, tolerance: float
) -> Generator:
    """ParaDiGMS-style sliding-window Picard iteration with the draw's fixed noise."""
    chain = problem.chain
    n, d = chain.num_steps, chain.dim
    counter = torch.arange(n, device=chain.device).unsqueeze(1) * d
    counter = counter + torch.arange(d, device=chain.device)
    noise = chain.noise_sd.unsqueeze(1) * keys.normal(
        torch.tensor(draw_key, device=chain.device), keys.Tag.NOISE, counter
    ).to(chain.wide)
    path = problem.initial_frame(s)
    path[1:] = path[0] + noise.cumsum(0)  # initial guess: zero drift
    h = chain.h
    begin, end = 0, min(n, window)
    while begin < n:
        drifts = yield Call((chain.times[begin:end], path[begin:end]), end - begin, s)
        new = path[begin] + (drifts * h[begin:end, None] + noise[begin:end]).cumsum(0)
        error = ((new - path[begin + 1 : end + 1]) ** 2).sum(1) / (d * chain.var * h[begin:end])
        path[begin + 1 : end + 1] = new
        bad = torch.nonzero(error > tolerance * tolerance).flatten()
        converged = int(bad[0]) if bad.numel() else end - begin
        new_begin = min(begin + converged + 1, end)
        new_end = min(n, new_begin + window)
        if new_end > end:  # extend the window with the last drift frozen
            extra = drifts[-1] * h[end:new_end, None] + noise[end:new_end]
            path[end + 1 : new_end + 1] = path[end] + extra.cumsum(0)
        begin, end = new_begin, new_end
    return path, noise
