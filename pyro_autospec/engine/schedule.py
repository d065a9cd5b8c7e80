"""How autospeculation tiles a draw into blocks and draws residual tries: the adaptive schedule.

Both engines call these functions, so they follow the same schedule and give the same draws.

**Blocks chosen from the past.** With ``blocks="adaptive"`` every draw keeps a *window* ``w``
and samples its top-level blocks ``(a, a + w]`` one after the other, like a congestion window:
after a block whose draft was accepted the window grows (``w <- min(2 w, max_block)``); after a
block whose draft was rejected (it needed a residual race) it shrinks
(``w <- max(w // 2, min_block)``). The choice of the next block reads only the draw's own past
(which blocks were accepted), never the randomness of the block it is about to draw, so the
output is exactly the chain rule's law (:doc:`/algorithm`, "Adaptive schedules"). It depends on
the seed, the oracle and these knobs only, not on the batch, caps, device or thread count.
A window sampled token by token (speculative decoding's rule: keep the longest accepted
prefix, redraw the first rejected token from the residual) is followed by one of
``ceil(2 (T + 1) / (M + 1))``, ``T`` the coordinates the draw's token windows kept so far and
``M`` how many of them stopped at a rejected token: twice the draw's mean run per rejection.
That is an estimate of ``1 / (1 - p)`` for a per-token acceptance rate ``p`` that the past
alone decides, so it is exact too, and unlike the last window's count it is not capped by the
last window's size. ``blocks="fixed"`` keeps the balanced tiling of :func:`leaf_starts`
(every block about ``max_block`` coordinates).

**A cap on how deep residual races recurse.** A residual try draws ``y ~ mu_S`` exactly. Up to
``race_depth`` nested races it does so recursively (left half, then right half, each drafted
and verified: few rounds); deeper, it draws ``y`` by the chain rule, one coordinate per round.
On an oracle whose drafts keep failing at every scale (an imperfect learned network, whose
conditionals are not the marginals of one joint) recursive tries nest races inside races, and
the batches of parallel tries multiply the work at each level; sequential tries bound it. Both
are exact samplers of ``mu_S``, so the cap changes rounds and rows, not the law.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["BlockPolicy", "adaptive_rho", "leaf_starts", "token_only"]

BLOCK_MODES = ("adaptive", "fixed")


@dataclass(frozen=True)
class BlockPolicy:
    """The knobs of the adaptive schedule.

    Parameters
    ----------
    max_block : int
        Largest block that is speculated.
    blocks : {"adaptive", "fixed"}
        Per-draw windows chosen from the draw's past, or the fixed balanced tiling.
    min_block : int
        Smallest adaptive window.
    first_block : int
        Window of a draw's first block (clamped into ``[min_block, max_block]``).
    race_depth : int or None
        Races nested deeper than this draw their tries by the chain rule (``None``: never).
    token_below : int or None
        Windows below this size are sampled token by token (speculative decoding's rule:
        the longest accepted prefix, then one token from the residual) instead of as blocks
        with residual races; ``None``: every window, ``0``: none.

    Examples
    --------
    >>> policy = BlockPolicy(max_block=32, min_block=4, first_block=16)
    >>> BlockPolicy(max_block=8, race_depth=1).try_parts(
    ...     torch.tensor([1, 2]), torch.tensor([8, 8])).tolist()
    [2, 8]
    >>> window, token = policy.next_block(
    ...     torch.tensor([16, 16, 8]), torch.tensor([False, False, True]),
    ...     torch.tensor([True, False, False]),
    ...     tokens=torch.tensor([0, 0, 40]), misses=torch.tensor([0, 0, 4]))
    >>> window.tolist(), token.tolist()
    ([32, 8, 17], [False, False, True])
    """

    max_block: int
    blocks: str = "adaptive"
    min_block: int = 2
    first_block: int | None = None
    race_depth: int | None = None
    token_below: int | None = 0

    def __post_init__(self) -> None:
        if self.blocks not in BLOCK_MODES:
            raise ValueError(f"blocks must be one of {BLOCK_MODES}; got {self.blocks!r}")
        if int(self.max_block) < 1:
            raise ValueError(f"max_block must be >= 1; got {self.max_block}")
        if not 1 <= int(self.min_block):
            raise ValueError(f"min_block must be >= 1; got {self.min_block}")
        if self.token_below is not None and int(self.token_below) < 0:
            raise ValueError(f"token_below must be >= 0 or None; got {self.token_below}")
        if self.race_depth is not None and int(self.race_depth) < 0:
            raise ValueError(f"race_depth must be >= 0 or None; got {self.race_depth}")

    @property
    def adaptive(self) -> bool:
        return self.blocks == "adaptive"

    @property
    def low(self) -> int:
        return min(int(self.min_block), int(self.max_block))

    def start_window(self) -> int:
        """The window of a draw's first block."""
        first = self.max_block if self.first_block is None else self.first_block
        return max(self.low, min(int(first), int(self.max_block)))

    @property
    def below(self) -> int:
        """Windows below this size are sampled token by token."""
        return int(self.max_block) + 1 if self.token_below is None else int(self.token_below)

    def start_token(self) -> bool:
        """Whether a draw's first block is sampled token by token."""
        return self.start_window() < self.below

    def next_block(
        self,
        window: torch.Tensor,
        token: torch.Tensor,
        full: torch.Tensor,
        tokens: torch.Tensor,
        misses: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Window and mode of a draw's next block, from its past (all Tensor[K]).

        ``window``: the last window; ``token``: whether it was sampled token by token;
        ``full``: whether all of it was kept (its draft accepted, or every token passed);
        ``tokens`` and ``misses``: how many coordinates the draw's token windows have kept so
        far and how many of them stopped at a rejected token, this window included.

        A block whose draft was accepted grows the window, a raced one halves it. A token
        window is followed by one of ``ceil(2 (tokens + 1) / (misses + 1))``: twice the
        draw's mean run of coordinates per rejected token (``1 / (1 - p)`` for a per-token
        acceptance rate ``p``), so that a round keeps about half its window whatever the
        oracle. Token mode starts when the window falls below ``token_below`` and ends when a
        full window of at least that size passes.
        """
        grown = torch.clamp(window * 2, max=int(self.max_block))
        partial = torch.clamp(window // 2, min=self.low)
        new = torch.where(
            token, self.token_window(tokens, misses), torch.where(full, grown, partial)
        )
        below = self.below
        stay = ~(full & (window >= below))
        return new, torch.where(token, stay, ~full & (new < below))

    def token_window(self, tokens, misses):
        """The window after token windows that kept ``tokens`` coordinates with ``misses``
        rejected tokens: ``ceil(2 (tokens + 1) / (misses + 1))`` in ``[min_block, max_block]``
        (integer Tensors or NumPy arrays of one shape).

        Examples
        --------
        >>> import numpy as np
        >>> BlockPolicy(max_block=32).token_window(np.array([40, 0, 99]), np.array([4, 0, 0]))
        array([17,  2, 32])
        """
        run = (2 * (tokens + 1) + misses) // (misses + 1)
        return run.clip(self.low, int(self.max_block))

    def prefetch(
        self,
        window: torch.Tensor,
        token: torch.Tensor,
        tokens: torch.Tensor,
        misses: torch.Tensor,
    ) -> torch.Tensor:
        """Coordinates of the draft row prefetched after a block of window ``window``: the
        window that follows if the whole block is kept (a shrunk window reads a prefix of it).
        ``token``, ``tokens`` and ``misses`` are the block's mode and the draw's token counts
        before it, as for :meth:`next_block`."""
        token = token.bool()
        full = torch.ones_like(token)
        return self.next_block(window, token, full, tokens + token.long() * window, misses)[0]

    def try_parts(self, depth: torch.Tensor, size: torch.Tensor) -> torch.Tensor:
        """Parts a residual try at nesting ``depth`` splits its block of ``size`` into: 2
        (recursive halves), or ``size`` (the chain rule) below ``race_depth``."""
        if self.race_depth is None:
            return torch.full_like(size, 2)
        return torch.where(depth <= int(self.race_depth), torch.full_like(size, 2), size)


def token_only(policy: BlockPolicy) -> bool:
    """Whether every window of ``policy`` is sampled token by token (adaptive windows, never
    the block rule): then no window races, and a draw is speculative decoding whose windows
    the policy chooses (:class:`~pyro_autospec.engine.host_plane.TokenSampler` runs it)."""
    return policy.adaptive and policy.below > int(policy.max_block)


def leaf_starts(n: int, max_block: int) -> list[int]:
    """Boundaries ``0 = L_0 < ... < L_m = n`` of the fixed top-level blocks.

    A block larger than ``max_block`` is cut between its ``k = ceil(size / max_block)`` leaves,
    half of them on each side, recursively, so every leaf has ``floor`` or ``ceil`` of
    ``n / k`` coordinates (about ``max_block``). Any cut keeps the output exact: it is the
    chain rule.

    Examples
    --------
    >>> leaf_starts(10, 4)
    [0, 3, 6, 10]
    """
    out = [0]

    def cut(a: int, b: int) -> None:
        size = b - a
        if size <= max_block:
            out.append(b)
            return
        k = -(-size // max_block)
        mid = a + size * (k // 2) // k
        cut(a, mid)
        cut(mid, b)

    cut(0, n)
    return out


def adaptive_rho(size: torch.Tensor | None, log_ratio: torch.Tensor) -> torch.Tensor:
    """Thread growth after drafts with log ratios ``log_ratio`` were rejected (``rho="adaptive"``:
    race batches sized from what the rejection tells).

    ``1 - exp(log_ratio)`` is the probability with which a draft was rejected: a one-sample
    guess of ``TV(mu_S, nu_S)``, and residual tries succeed with probability about TV. The
    first batch then holds about ``1 / TV`` tries (between 1 and 4). Exact for any value.

    Examples
    --------
    >>> adaptive_rho(None, torch.tensor([-0.01, -3.0], dtype=torch.float64)).tolist()
    [4.0, 1.0]
    """
    reject = torch.where(log_ratio < 0, -torch.expm1(log_ratio.clamp(max=0)), 1.0)
    return (1.0 / reject.clamp(min=1e-12) - 1.0).clamp(1.0, 4.0)
