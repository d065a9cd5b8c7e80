"""The baselines a reader will ask about, on the same scheduler with the same counting.

* :func:`speculative` -- token-level self-speculation (speculative decoding without a draft
  model): draft the next ``k`` coordinates from the marginals given the prefix, verify them in
  one round, accept token by token with ``min(1, mu / nu)``, resample the first rejected one from
  ``(mu - nu)_+``. Exact.
* :func:`agr24` -- the Gumbel-window parallel sampler reconstructed from Anari, Gao and
  Rubinstein (STOC 2024) [2]_ (ALGORITHM.md section 7): fixed Gumbel noise per position, a
  window drafted by Gumbel-max from the marginals given the prefix, every drafted coordinate
  recomputed given the drafted ones before it, keep the longest agreeing prefix plus the first
  recomputed coordinate. Its output equals the sequential Gumbel-max sampler
  (:func:`gumbel_sequential`) path by path for the same noise. Exact.

Both are generators for :class:`~pyro_autospec.engine.scheduler.Scheduler`, like the
autospeculation nodes in :mod:`pyro_autospec.engine.any_order`.

References
----------
.. [2] N. Anari, R. Gao, A. Rubinstein. Parallel Sampling via Counting. STOC 2024,
   arXiv:2408.09442.
"""

from __future__ import annotations

import math
from collections.abc import Generator

import numpy as np

from pyro_autospec.engine.rejection import accept_draft

__all__ = ["speculative", "agr24", "gumbel_sequential", "agr24_window"]


def _what(s: int, cut: int) -> str:
    return f"row for sample {s} conditioned on its first {cut} coordinates"


def _window_request(s: int, drafted: np.ndarray, t: int, k: int, nxt: int):
    """Verification of drafted positions ``t..t+k-1``: rows conditioned on each drafted prefix
    (one target each), plus a prefetch of the next ``nxt`` positions' marginals given all ``k``.
    ``None`` when there is nothing to ask (a last window of one coordinate)."""
    from pyro_autospec.engine.any_order import _request

    cuts = np.arange(t + 1, t + k + (1 if nxt > 0 else 0))
    if len(cuts) == 0:
        return None
    stops = cuts + 1
    if nxt > 0:
        stops[-1] = t + k + nxt
    return _request(s, drafted, cuts, cuts, stops)


def speculative(ctx, s: int, n: int, window: int = 8) -> Generator:
    """Token-level self-speculation for sample ``s``: returns ``(values int64[n], log_prob)``."""
    from pyro_autospec.engine.any_order import _request

    order = ctx.orders[s]
    values = np.zeros(n, dtype=np.int64)
    log_prob, t, row = 0.0, 0, None  # row: draft row at cut t, targets [t, t + k)
    while t < n:
        k = min(window, n - t)
        if row is None or len(row) < k:
            answer = yield _request(s, values, [t], [t], [t + k])
            row = answer.check(0, _what(s, t))
        draft_rows = row[:k]
        x = ctx.draw(draft_rows)
        drafted = values.copy()
        drafted[order[t : t + k]] = x
        nxt = min(window, n - t - k)
        request = _window_request(s, drafted, t, k, nxt)
        if request is None:  # the last coordinate, drawn from its exact row: nothing to verify
            values = drafted
            log_prob += float(draft_rows[0, x[0]])
            break
        answer = yield request
        cuts = request.payload.cuts
        # Token t is always accepted (its target and draft rows coincide).
        accepted = 1
        log_prob += float(draft_rows[0, x[0]])
        rejected_row = None
        for j in range(1, k):
            target = answer.check(j - 1, _what(s, t + j))[0]
            if accept_draft(float(target[x[j]] - draft_rows[j, x[j]]), ctx.rng):
                accepted += 1
                log_prob += float(target[x[j]])
            else:
                rejected_row = (j, target)
                break
        values = drafted
        if rejected_row is None:
            t += k
            row = answer.check(len(cuts) - 1, _what(s, t)) if nxt > 0 else None
            continue
        j, target = rejected_row
        # Resample position t + j from the residual (mu - nu)_+, in float64.
        residual = np.clip(np.exp(target) - np.exp(draft_rows[j]), 0.0, None)
        with np.errstate(divide="ignore"):
            log_residual = np.log(residual / residual.sum())
        y = int(ctx.draw(log_residual[None, :])[0])
        values[order[t + j]] = y
        log_prob += float(target[y])
        t += j + 1
        row = None
    return values, log_prob


def agr24_window(t: int, q: int, scale: float = 1.0) -> int:
    """Window after ``t`` fixed coordinates: ``ceil(scale * (t / log q)^(1/3))``, at least 1."""
    return max(1, math.ceil(scale * (t / max(math.log(q), 1e-12)) ** (1.0 / 3.0)))


def _gumbel(ctx, s: int, n: int) -> np.ndarray:
    """The fixed Gumbel noise of sample ``s``: float64[n, q], one row per position."""
    return ctx.gumbels[s]


def agr24(ctx, s: int, n: int, window_scale: float = 1.0) -> Generator:
    """The AGR24 Gumbel-window sampler for sample ``s``: returns ``(values, log_prob)``."""
    from pyro_autospec.engine.any_order import _request

    order = ctx.orders[s]
    gumbel = _gumbel(ctx, s, n)
    values = np.zeros(n, dtype=np.int64)
    log_prob, t, row = 0.0, 0, None
    while t < n:
        w = min(agr24_window(t, ctx.q, window_scale), n - t)
        if row is None or len(row) < w:
            answer = yield _request(s, values, [t], [t], [t + w])
            row = answer.check(0, _what(s, t))
        draft_rows = row[:w]
        x = np.argmax(draft_rows + gumbel[t : t + w], axis=1)
        drafted = values.copy()
        drafted[order[t : t + w]] = x
        nxt = min(agr24_window(t + w, ctx.q, window_scale), n - t - w)
        request = _window_request(s, drafted, t, w, nxt)
        if request is None:  # the last coordinate, drawn from its exact row: nothing to verify
            values = drafted
            log_prob += float(draft_rows[0, x[0]])
            break
        answer = yield request
        cuts = request.payload.cuts
        log_prob += float(draft_rows[0, x[0]])
        agreed = 1  # position t is drawn from its exact row
        for j in range(1, w):
            target = answer.check(j - 1, _what(s, t + j))[0]
            y = int(np.argmax(target + gumbel[t + j]))
            log_prob += float(target[y])
            if y != x[j]:
                drafted[order[t + j]] = y  # the first recomputed coordinate is exact
                agreed = j + 1
                break
            agreed = j + 1
        else:
            values = drafted
            t += w
            row = answer.check(len(cuts) - 1, _what(s, t)) if nxt > 0 else None
            continue
        values = drafted
        t += agreed
        row = None
    return values, log_prob


def gumbel_sequential(ctx, s: int, n: int) -> Generator:
    """The sequential Gumbel-max sampler with the noise AGR24 uses: its path-by-path reference."""
    from pyro_autospec.engine.any_order import _request

    order = ctx.orders[s]
    gumbel = _gumbel(ctx, s, n)
    values = np.zeros(n, dtype=np.int64)
    log_prob = 0.0
    for j in range(n):
        answer = yield _request(s, values, [j], [j], [j + 1])
        row = answer.check(0, _what(s, j))[0]
        x = int(np.argmax(row + gumbel[j]))
        values = values.copy()
        values[order[j]] = x
        log_prob += float(row[x])
    return values, log_prob
