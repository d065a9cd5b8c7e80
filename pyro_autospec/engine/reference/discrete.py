"""The reference engine on ``[q]^n``: blocks of coordinates, and the token-level baselines.

Frames are NumPy assignments ``int64[n]`` (copied whenever they change); rows are float64
NumPy arrays. Every random number comes from the same keys as in the fast engine
(:mod:`pyro_autospec.engine.host_plane`), read one
block or token at a time, so both engines give the same draws.
"""

from __future__ import annotations

import math
from collections.abc import Generator
from dataclasses import dataclass, field

import numpy as np
import torch

from pyro_autospec.engine import keys
from pyro_autospec.engine.host_plane import STALE_LOG_FLOOR, agr24_window
from pyro_autospec.engine.reference.recursion import draft_accepted
from pyro_autospec.engine.reference.scheduler import Call
from pyro_autospec.engine.rows import Answer, OracleRows
from pyro_autospec.engine.schedule import adaptive_rho

__all__ = ["Query", "ReferenceDiscrete", "token_draw"]


@dataclass
class Query:
    """Rows of one draw's assignment: targeted rows ``(cut, width)`` and at most one chain."""

    sample: int
    values: np.ndarray
    rows: list[tuple[int, int]] = field(default_factory=list)
    chain: tuple[int, int] | None = None


@dataclass
class QueryAnswer:
    rows: list[Answer]
    chain: Answer | None


def _gumbel(key: int, tag: int, counter) -> np.ndarray:
    """Keyed Gumbel noise (:func:`~pyro_autospec.engine.keys.host_gumbel`) at ``counter``."""
    counter = np.asarray(counter)
    if counter.size > 16:
        return keys.host_gumbel(np.int64(key), tag, counter)
    # a few entries: the same uniforms from Python integers, then the same NumPy logs
    u = [keys.int_uniform(key, tag, c) for c in counter.ravel().tolist()]
    return -np.log(-np.log(np.array(u, dtype=np.float64).reshape(counter.shape)))


def _prefetched(answer: QueryAnswer, s: int, b: int) -> np.ndarray:
    """The prefetched draft row of draw ``s`` after position ``b`` (float64 [width, q]),
    raising if it is bad."""
    (pre,) = answer.rows
    what = (
        f"prefetched draft row of draw {s} conditioned on its first {b} coordinates "
        "(target {target})"
    )
    OracleRows.raise_bad(pre, pre.bad, what)
    return pre.log_probs[0]


def _check(answer: Answer, index: int, what: str) -> np.ndarray:
    """Row ``index`` of ``answer`` (float64 [q]), raising if it is bad."""
    if answer.bad[0, index]:
        error = np.zeros_like(answer.bad[:1])  # only row ``index`` (the message reads its mass)
        error[:, index] = True
        OracleRows.raise_bad(answer.part(slice(0, 1)), error, what)
    return answer.log_probs[0, index]


class ReferenceDiscrete:
    """Reference problem on ``[q]^n`` for :func:`~pyro_autospec.engine.reference.recursion.node`.

    Parameters
    ----------
    rows : OracleRows
    rho : float or "adaptive"
        Batch growth of residual tries (``"adaptive"``: from each rejected draft's log ratio).
    """

    def __init__(self, rows: OracleRows, rho: float | str):
        self.rows = rows
        self.orders: dict[int, np.ndarray] = {}  # the visiting order of each draw in flight
        self.n, self.q = rows.n, rows.q
        self.rho = rho

    def start(self, s: int) -> None:
        """Draw ``s`` starts: its order is computed (from its key) and held while it runs."""
        draw = torch.tensor([s], device=self.rows.device)
        self.rows.start(draw)
        self.orders[s] = self.rows.orders_of(draw)[0].cpu().numpy()

    def finish(self, s: int) -> None:
        """Draw ``s`` finished: its order is let go."""
        self.rows.finish(torch.tensor([s], device=self.rows.device))
        del self.orders[s]

    # ------------------------------------------------------------------------- dispatch
    def dispatch(self, payloads: list[Query]) -> list[QueryAnswer]:
        """Answer every query of a round with one batched :meth:`OracleRows.ask`."""
        device = self.rows.device
        values = torch.from_numpy(np.stack([p.values for p in payloads])).to(device)
        row_spec = [(i, p.sample, c, w) for i, p in enumerate(payloads) for c, w in p.rows]
        chain_spec = [(i, p.sample, *p.chain) for i, p in enumerate(payloads) if p.chain]

        def columns(spec, width):
            cols = list(zip(*spec)) if spec else [()] * width
            return [torch.tensor(c, dtype=torch.long, device=device) for c in cols]

        rows = chains = None
        if row_spec:
            frame, draw, cut, width = columns(row_spec, 4)
            rows = (frame, draw, cut, cut, width)
        if chain_spec:
            chains = tuple(columns(chain_spec, 4))
        row_answer, chain_answer = map(_host, self.rows.ask(values, rows, chains))
        answers, r, c = [], 0, 0
        for p in payloads:
            mine = []
            for _ in p.rows:
                mine.append(row_answer.part(slice(r, r + 1)))
                r += 1
            chain = None
            if p.chain:
                chain = chain_answer.part(slice(c, c + 1))
                c += 1
            answers.append(QueryAnswer(mine, chain))
        return answers

    # --------------------------------------------------------------------------- frames
    def initial_frame(self, s: int) -> np.ndarray:
        return np.zeros(self.n, dtype=np.int64)

    def row_request(self, s: int, frame: np.ndarray, a: int, b: int) -> Query:
        return Query(s, frame, rows=[(a, b - a)])

    def row_answer(self, s: int, a: int, answer: QueryAnswer) -> np.ndarray:
        (row,) = answer.rows
        what = f"draft row of draw {s} conditioned on its first {a} coordinates (target {{target}})"
        OracleRows.raise_bad(row, row.bad, what)
        return row.log_probs[0]

    def leaf(self, s: int, key: int, frame, a: int, row: np.ndarray):
        x = int(np.argmax(row[0] + _gumbel(key, keys.Tag.DRAFT, np.arange(self.q))))
        frame = frame.copy()
        frame[self.orders[s][a]] = x
        return frame, float(row[0, x])

    def draft(self, s: int, key: int, frame, a: int, b: int, row: np.ndarray):
        k, q = b - a, self.q
        counter = np.arange(k)[:, None] * q + np.arange(q)[None, :]
        x = np.argmax(row[:k] + _gumbel(key, keys.Tag.DRAFT, counter), axis=1)
        drafted = frame.copy()
        drafted[self.orders[s][a:b]] = x
        return drafted, float(row[np.arange(k), x].sum())

    def verify_request(self, s: int, drafted, a: int, b: int, nxt: int, first: int = 1) -> Query:
        """The chain of positions ``a + first .. b - 1`` and the prefetch of ``(b, nxt]``
        (``first = 0``: a window drafted from stale rows verifies its first token too)."""
        rows = [(b, nxt - b)] if nxt > b else []
        return Query(s, drafted, rows=rows, chain=(a + first, b - a - first))

    def verify(self, s, drafted, a, b, nxt, row, log_nu, answer: QueryAnswer):
        x = drafted[self.orders[s][a:b]]
        log_mu = float(row[0, x[0]])
        for j in range(1, b - a):
            if log_mu == -math.inf:  # later rows condition on an impossible prefix
                break
            what = f"verification row of draw {s} conditioned on its first {a + j} coordinates"
            log_mu += float(_check(answer.chain, j - 1, what)[x[j]])
        log_ratio = log_mu - log_nu if log_mu > -math.inf else -math.inf
        next_row = _prefetched(answer, s, b) if nxt > b and log_mu > -math.inf else None
        return log_ratio, log_mu, next_row

    def tokens(self, s, key: int, drafted, span, row, answer, stale, restart):
        """Token-level acceptance of the drafted window ``(a, b]`` of ``span = (a, b, nxt)``:
        the longest accepted prefix, then one token from the residual.

        ``stale``: the window was drafted from stale rows, so its first token is verified too
        (its target row is the first of the chain). Returns ``(frame, kept, log mu, whole,
        rows)``: ``whole`` says every token passed; ``rows`` is then the prefetched draft row
        (or ``None``), and after a rejected token, with ``restart``, the stale draft rows of
        what follows it (:meth:`stale_rows`, or ``None``).
        """
        a, b, nxt = span
        x = drafted[self.orders[s][a:b]]
        first = 0 if stale else 1
        log_mu = 0.0 if stale else float(row[0, x[0]])
        frame = drafted.copy()
        v = np.arange(self.q)
        for j in range(first, b - a):
            what = f"verification row of draw {s} conditioned on its first {a + j} coordinates"
            target = _check(answer.chain, j - first, what)
            if draft_accepted(float(target[x[j]] - row[j, x[j]]), key, j):
                log_mu += float(target[x[j]])
                continue
            residual = np.clip(np.exp(target) - np.exp(row[j]), 0.0, None)
            with np.errstate(divide="ignore"):
                log_residual = np.log(residual / residual.sum())
            y = int(np.argmax(log_residual + _gumbel(key, keys.Tag.RESAMPLE, v)))
            frame[self.orders[s][a + j]] = y
            rows = None
            if restart:  # target log probabilities of the drafted tokens j, j + 1, ...
                later = answer.chain.log_probs[0, j - first + 1 : b - a - first]
                drafted_lp = [float(target[x[j]])] + [
                    float(later[i, x[j + 1 + i]]) for i in range(len(later))
                ]
                rows = self.stale_rows(answer, j - first + 1, b - a - j - 1, nxt - b, drafted_lp)
            return frame, j + 1, log_mu + float(target[y]), False, rows
        next_row = _prefetched(answer, s, b) if nxt > b else None
        return frame, b - a, log_mu, True, next_row

    @staticmethod
    def stale_rows(answer: QueryAnswer, start: int, count: int, prefetched: int, drafted_lp):
        """The draft rows of the window after a rejected token: the chain's rows ``start ..
        start + count - 1`` (the later tokens, conditioned on the drafted prefix) up to the
        first unusable one, then, if all were usable, the prefetched row's first ``prefetched``
        coordinates up to its first bad one. ``None`` when no row is usable.

        ``drafted_lp[i]``: the target log probability of the rejected token (``i = 0``) and of
        the drafted tokens after it; a row is unusable when bad or conditioned on a token at or
        below :data:`~pyro_autospec.engine.host_plane.STALE_LOG_FLOOR`."""
        chain = answer.chain
        parts = []
        good = 0
        while (
            good < count
            and drafted_lp[good] > STALE_LOG_FLOOR
            and not bool(chain.bad[0, start + good])
        ):
            good += 1
        if good:
            parts.append(chain.log_probs[0, start : start + good])
        if good == count and drafted_lp[count] > STALE_LOG_FLOOR and prefetched > 0:
            pre = answer.rows[0]
            usable = 0
            while usable < prefetched and not bool(pre.bad[0, usable]):
                usable += 1
            if usable:
                parts.append(pre.log_probs[0, :usable])
        return np.concatenate(parts) if parts else None

    def try_log_nu(self, s: int, y, a: int, b: int, row: np.ndarray) -> float:
        return float(row[np.arange(b - a), y[self.orders[s][a:b]]].sum())

    def race_rho(self, size: int, log_ratio: float) -> float:
        if self.rho == "adaptive":
            return float(adaptive_rho(None, torch.tensor([log_ratio], dtype=torch.float64))[0])
        return self.rho


def _host(answer: Answer | None) -> Answer | None:
    """The answer as NumPy arrays (read entry by entry on the host)."""
    if answer is None:
        return None
    return Answer(*(t.cpu().numpy() for t in (answer.log_probs, answer.bad, answer.log_mass)))


# ------------------------------------------------------------------------- token methods
def token_draw(
    problem: ReferenceDiscrete, method: str, s: int, draw_key: int, knobs: dict
) -> Generator:
    """One draw of a token-level method: returns ``(values int64[n], log_prob)``."""
    n, q, order = problem.n, problem.q, problem.orders[s]
    values = np.zeros(n, dtype=np.int64)
    v = np.arange(q)

    def size(t: int) -> int:
        if method in ("sequential", "gumbel_sequential"):
            return min(1, n - t)
        if method == "speculative":
            return min(int(knobs["window"]), n - t)
        return min(int(agr24_window(np.array([t]), q, knobs["window_scale"])[0]), n - t)

    def fixed_noise(pos: int) -> np.ndarray:
        return _gumbel(draw_key, keys.Tag.NOISE, pos * q + v)

    log_prob, t, row = 0.0, 0, None
    while t < n:
        k = size(t)
        what = f"row of draw {s} conditioned on its first {t} coordinates (target {{target}})"
        if row is None:
            answer = yield Call(Query(s, values, rows=[(t, k)]), rows=1, sample=s)
            OracleRows.raise_bad(answer.rows[0], answer.rows[0].bad, what)
            row = answer.rows[0].log_probs[0]
        window_key = keys.int_child(draw_key, keys.Tag.LEAF, t)
        if method in ("gumbel_sequential", "agr24"):
            x = np.array([int(np.argmax(row[j] + fixed_noise(t + j))) for j in range(k)])
        else:
            counter = np.arange(k)[:, None] * q + v[None, :]
            x = np.argmax(row[:k] + _gumbel(window_key, keys.Tag.DRAFT, counter), axis=1)
        drafted = values.copy()
        drafted[order[t : t + k]] = x
        nxt = size(t + k)
        if method in ("sequential", "gumbel_sequential") or (k == 1 and nxt == 0):
            values = drafted  # drawn from the exact row: nothing to verify
            log_prob += float(row[0, x[0]])
            t, row = t + 1, None
            continue
        rows = [(t + k, nxt)] if nxt > 0 else []
        chain = (t + 1, k - 1) if k > 1 else None
        answer = yield Call(
            Query(s, drafted, rows=rows, chain=chain), rows=k - 1 + len(rows), sample=s
        )
        log_prob += float(row[0, x[0]])
        stop = k  # first rejected (or disagreeing) token, k when all pass
        recomputed = None
        for j in range(1, k):
            what_j = f"verification row of draw {s} conditioned on its first {t + j} coordinates"
            target = _check(answer.chain, j - 1, what_j)
            if method == "speculative":
                ok = draft_accepted(float(target[x[j]] - row[j, x[j]]), window_key, j)
            else:
                recomputed = int(np.argmax(target + fixed_noise(t + j)))
                ok = recomputed == x[j]
            if not ok:
                stop = j
                break
            log_prob += float(target[x[j]])
        values = drafted
        if stop == k:
            t += k
            row = None
            if nxt > 0:
                pre = answer.rows[0]
                OracleRows.raise_bad(pre, pre.bad, what.replace(f" {t - k} ", f" {t} "))
                row = pre.log_probs[0]
            continue
        if method == "speculative":  # resample from the residual (mu - nu)_+, in float64
            residual = np.clip(np.exp(target) - np.exp(row[stop]), 0.0, None)
            with np.errstate(divide="ignore"):
                log_residual = np.log(residual / residual.sum())
            y = int(np.argmax(log_residual + _gumbel(window_key, keys.Tag.RESAMPLE, v)))
        else:
            y = recomputed
        values[order[t + stop]] = y
        log_prob += float(target[y])
        t += stop + 1
        row = None
    return values, log_prob
