"""The reference recursion: autospeculation written as plain generators, one per draw and try.

This is the slow, obviously correct twin of :class:`~pyro_autospec.engine.recursion.Recursion`.
A node samples the block ``(a, b]`` of draw ``s`` given its prefix (the *frame*) and returns
``(frame, log mu_S, next_row)``:

* without a draft row, it asks for one (one round);
* a one-position block is drawn from its row;
* otherwise it drafts the block from the row, verifies it in one round (the target's chain
  rule plus the prefetch of the next block's row) and accepts with ``min(1, mu_S / nu_S)``;
* after a rejection it races exact tries ``y ~ mu_S`` (left half, then right half) with
  :class:`~pyro_autospec.engine.reference.scheduler.FirstAccepted`, each accepted with
  ``max(0, 1 - nu_S(y) / mu_S(y))``; the smallest accepted index wins.

A draw samples its top-level leaves one after the other. Keys are derived exactly as in the
fast engine (draw, leaf, try, half), so the two engines give the same draws. What a frame is and
how a block is drafted and verified is the business of a *reference problem*
(:mod:`~pyro_autospec.engine.reference.discrete`, :mod:`~pyro_autospec.engine.reference.euler`).
"""

from __future__ import annotations

from collections.abc import Generator

import torch

from pyro_autospec.engine import keys
from pyro_autospec.engine.reference.scheduler import Call, FirstAccepted
from pyro_autospec.engine.rejection import accept_draft, accept_residual

__all__ = ["node", "draw"]


def _uniform(key: int, tag: int, counter: int = 0) -> torch.Tensor:
    return keys.uniform(torch.tensor(key, dtype=torch.long), tag, counter)


def _child(key: int, tag: int, index: int) -> int:
    return int(keys.child(torch.tensor(key, dtype=torch.long), tag, index))


def node(problem, s: int, key: int, frame, a: int, b: int, nxt: int, row) -> Generator:
    """Sample positions ``(a, b]`` of draw ``s`` exactly given ``frame``; ``(b, nxt]`` follows."""
    if row is None:
        row = yield Call(problem.row_request(s, frame, a, b), rows=1, sample=s)
        row = problem.row_answer(s, a, row)
    if b - a == 1:
        frame, log_mu = problem.leaf(s, key, frame, a, row)
        return frame, log_mu, None
    drafted, log_nu = problem.draft(s, key, frame, a, b, row)
    rows = (b - a - 1) + (1 if nxt > b else 0)
    answer = yield Call(problem.verify_request(s, drafted, a, b, nxt), rows=rows, sample=s)
    log_ratio, log_mu, next_row = problem.verify(s, drafted, a, b, nxt, row, log_nu, answer)
    if bool(accept_draft(torch.tensor(log_ratio), _uniform(key, keys.Tag.ACCEPT))):
        return drafted, log_mu, next_row
    mid = (a + b) // 2

    def attempt(index: int) -> Generator:
        try_key = _child(key, keys.Tag.THREAD, index)
        left_key = _child(try_key, keys.Tag.CHILD, 0)
        right_key = _child(try_key, keys.Tag.CHILD, 1)
        left = yield from node(problem, s, left_key, frame, a, mid, b, row)
        right = yield from node(problem, s, right_key, left[0], mid, b, nxt, left[2])
        y, log_mu_y = right[0], left[1] + right[1]
        if not log_mu_y > -float("inf"):
            raise AssertionError("an exact try returned a value of probability zero")
        log_nu_y = problem.try_log_nu(s, y, a, b, row)
        u = _uniform(try_key, keys.Tag.ACCEPT)
        accepted = bool(accept_residual(torch.tensor(log_mu_y - log_nu_y), u))
        return accepted, (y, log_mu_y, right[2])

    return (yield FirstAccepted(attempt, problem.race_rho(b - a, log_ratio)))


def draw(problem, s: int, draw_key: int, leaves: list[int]) -> Generator:
    """One whole draw: its top-level leaves ``(L_j, L_{j+1}]`` in order."""
    frame, log_prob, row = problem.initial_frame(s), 0.0, None
    m = len(leaves) - 1
    for j in range(m):
        a, b, nxt = leaves[j], leaves[j + 1], leaves[min(j + 2, m)]
        key = _child(draw_key, keys.Tag.LEAF, a)
        frame, log_mu, row = yield from node(problem, s, key, frame, a, b, nxt, row)
        log_prob += log_mu
    return frame, log_prob
