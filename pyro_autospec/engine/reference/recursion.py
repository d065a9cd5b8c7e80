"""The reference recursion: autospeculation written as plain generators, one per draw and try.

It is the specification of the recursion, and the one engine of the block rule (residual
races), whatever ``engine`` a sampler is given. A node samples the block ``(a, b]`` of draw
``s`` given its prefix (the *frame*) and returns ``(frame, log mu_S, next_row)``:

* without a draft row, it asks for one (one round);
* a one-position block is drawn from its row;
* otherwise it drafts the block from the row, verifies it in one round (the target's chain
  rule plus the prefetch of the next block's row) and accepts with ``min(1, mu_S / nu_S)``;
* after a rejection it races exact tries ``y ~ mu_S`` (left half, then right half) with
  :class:`~pyro_autospec.engine.reference.scheduler.FirstAccepted`, each accepted with
  ``max(0, 1 - nu_S(y) / mu_S(y))``; the smallest accepted index wins.

A draw samples its top-level leaves one after the other. Keys are derived from (draw, leaf,
try, half), as the host control plane derives its own (draw, window), so a window of the token
rule reads the same numbers in both engines. What a frame is and
how a block is drafted and verified is the business of a *reference problem*
(:mod:`~pyro_autospec.engine.reference.discrete`, :mod:`~pyro_autospec.engine.reference.euler`).
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from pyro_autospec.engine import keys
from pyro_autospec.engine.reference.scheduler import Call, FirstAccepted
from pyro_autospec.engine.rejection import accept_draft, accept_residual
from pyro_autospec.engine.schedule import BlockPolicy, token_only

__all__ = ["DrawContext", "Span", "draft_accepted", "draw", "node", "try_accepted"]


def _float64(value: float) -> torch.Tensor:
    """A log ratio or uniform as a float64 tensor (``torch.tensor`` of a Python float would
    round it to the default dtype, float32)."""
    return torch.tensor(value, dtype=torch.float64)


def draft_accepted(log_ratio: float, key: int, counter: int = 0) -> bool:
    """:func:`~pyro_autospec.engine.rejection.accept_draft` of one float64 log ratio, with the
    uniform ``counter`` of ``key``'s acceptance stream."""
    u = _float64(keys.int_uniform(key, keys.Tag.ACCEPT, counter))
    return bool(accept_draft(_float64(log_ratio), u))


def try_accepted(log_ratio: float, key: int) -> bool:
    """:func:`~pyro_autospec.engine.rejection.accept_residual` of one float64 log ratio, with
    the first uniform of ``key``'s acceptance stream."""
    u = _float64(keys.int_uniform(key, keys.Tag.ACCEPT, 0))
    return bool(accept_residual(_float64(log_ratio), u))


@dataclass(frozen=True)
class DrawContext:
    """What every node of one draw shares: its problem, its index and its schedule.

    ``restart``: every window of the draw is sampled token by token, so the rows after a
    rejected token draft the next window (:func:`~pyro_autospec.engine.schedule.token_only`).
    """

    problem: Any
    s: int
    policy: BlockPolicy | None = None
    restart: bool = False


class Span(NamedTuple):
    """A node's block ``(a, b]`` and the end ``nxt`` of the block after it (``nxt == b``:
    none), whose draft row the node's verification prefetches."""

    a: int
    b: int
    nxt: int


def node(
    context: DrawContext,
    key: int,
    frame,
    span: Span,
    row,
    depth: int = 0,
    token: bool = False,
    stale: bool = False,
) -> Generator:
    """Sample the positions ``(a, b]`` of ``span`` exactly given ``frame``; ``(b, nxt]`` follows.

    Returns ``(frame, log mu_S, next_row, raced)``; ``depth`` counts the races around the node
    (a residual try at depth ``d`` uses ``policy.try_parts``: halves or the chain rule). A
    ``token`` window keeps its longest accepted prefix and one redrawn token instead, and
    returns ``(kept, whole)`` in place of ``raced``: how many coordinates it kept, and whether
    every token passed.
    """
    problem, s, policy = context.problem, context.s, context.policy
    a, b, nxt = span
    if row is None:
        row = yield Call(problem.row_request(s, frame, a, b), rows=1, sample=s)
        row = problem.row_answer(s, a, row)
    if b - a == 1 and not stale:
        frame, log_mu = problem.leaf(s, key, frame, a, row)
        return frame, log_mu, None, (1, True) if token else False
    drafted, log_nu = problem.draft(s, key, frame, a, b, row)
    first = 0 if stale else 1
    rows = (b - a - first) + (1 if nxt > b else 0)
    request = problem.verify_request(s, drafted, a, b, nxt, first)
    answer = yield Call(request, rows=rows, sample=s)
    if token:
        frame, kept, log_mu, whole, after = problem.tokens(
            s, key, drafted, span, row, answer, stale, context.restart
        )
        return frame, log_mu, after, (kept, whole)
    log_ratio, log_mu, next_row = problem.verify(s, drafted, a, b, nxt, row, log_nu, answer)
    if draft_accepted(log_ratio, key):
        return drafted, log_mu, next_row, False
    parts = 2
    if policy is not None:
        parts = int(policy.try_parts(torch.tensor([depth + 1]), torch.tensor([b - a]))[0])
    bounds = [a + (b - a) * j // parts for j in range(parts + 1)]

    def attempt(index: int) -> Generator:
        # try ``index``: the parts (bounds[j], bounds[j + 1]] one after the other, the first
        # from the node's own draft row (same prefix), the last followed by the node's nxt
        try_key = keys.int_child(key, keys.Tag.THREAD, index)
        y, log_mu_y, part_row = frame, 0.0, row
        for j in range(parts):
            part_key = keys.int_child(try_key, keys.Tag.CHILD, j)
            after = bounds[j + 2] if j + 2 <= parts else nxt
            part = Span(bounds[j], bounds[j + 1], after)
            y, log_mu_j, part_row, _ = yield from node(
                context, part_key, y, part, part_row, depth + 1
            )
            log_mu_y += log_mu_j
        if not log_mu_y > -float("inf"):
            raise AssertionError("an exact try returned a value of probability zero")
        log_nu_y = problem.try_log_nu(s, y, a, b, row)
        accepted = try_accepted(log_mu_y - log_nu_y, try_key)
        return accepted, (y, log_mu_y, part_row)

    won = yield FirstAccepted(attempt, problem.race_rho(b - a, log_ratio))
    return (*won, True)


def draw(problem, s: int, draw_key: int, leaves: list[int], policy=None) -> Generator:
    """One whole draw: its top-level blocks in order.

    With an adaptive ``policy`` (:class:`~pyro_autospec.engine.schedule.BlockPolicy`) each
    block's window follows from whether the previous block's draft was accepted; otherwise the
    blocks are the fixed leaves ``(L_j, L_{j+1}]``.
    """
    frame, log_prob, row = problem.initial_frame(s), 0.0, None
    n = leaves[-1]
    if policy is not None and policy.adaptive:
        a, window, token = 0, policy.start_window(), policy.start_token()
        tokens = misses = 0  # coordinates kept by token windows, and their rejected tokens
        # every window token by token: the rows after a rejected token draft the next window
        # (stale rows, at most the window's width), as on the host control plane
        context = DrawContext(problem, s, policy, restart=token_only(policy))
        width = min(int(policy.max_block), n)
        stale = None  # how many coordinates the stale rows cover, when the row is stale
        while a < n:
            b = min(a + (window if stale is None else min(window, stale)), n)
            after = policy.prefetch(*map(torch.tensor, (window, token, tokens, misses)))
            nxt = min(b + int(after), n)
            key = keys.int_child(draw_key, keys.Tag.LEAF, a)
            frame, log_mu, row, outcome = yield from node(
                context, key, frame, Span(a, b, nxt), row, token=token, stale=stale is not None
            )
            log_prob += log_mu
            kept, full = outcome if token else (b - a, not outcome)
            if token:
                tokens, misses = tokens + kept, misses + (not full)
            w, t = policy.next_block(*map(torch.tensor, (window, token, full, tokens, misses)))
            window, token, a = int(w), bool(t), a + kept
            stale = None
            if token and not full and row is not None and a < n:
                row = row[:width]
                stale = len(row)
        return frame, log_prob
    m = len(leaves) - 1
    context = DrawContext(problem, s, policy)
    for j in range(m):
        a, b, nxt = leaves[j], leaves[j + 1], leaves[min(j + 2, m)]
        key = keys.int_child(draw_key, keys.Tag.LEAF, a)
        frame, log_mu, row, _ = yield from node(context, key, frame, Span(a, b, nxt), row)
        log_prob += log_mu
    return frame, log_prob
