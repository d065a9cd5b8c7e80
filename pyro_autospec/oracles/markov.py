"""The exact oracle of a homogeneous Markov chain on ``[q]^n``."""

from __future__ import annotations

import sys
from typing import Any

import torch

from ._util import ExactOracle, as_float64, log_matmul, log_normalize, point_mass

__all__ = ["MarkovChainOracle", "chain_nearest_pins", "nearest_pins", "nearest_pins_at"]

# Largest number of (chain coordinate, earlier chain coordinate) pairs compared at once.
_MAX_PAIRS = 1 << 22


def nearest_pins(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Nearest pinned coordinate at or before, and at or after, every coordinate.

    Parameters
    ----------
    mask : BoolTensor[B, n]

    Returns
    -------
    left, right : LongTensor[B, n]
        ``left[b, i] = max{j <= i : mask[b, j]}`` (``-1`` if none) and
        ``right[b, i] = min{j >= i : mask[b, j]}`` (``n`` if none). For an unpinned ``i`` these
        are the nearest pins strictly left and right of ``i``.
    """
    n = mask.shape[1]
    index = torch.arange(n, device=mask.device)
    left = torch.where(mask, index, -1).cummax(dim=1).values
    flipped = torch.where(mask, n - 1 - index, -1).flip(1).cummax(dim=1).values.flip(1)
    right = torch.where(flipped >= 0, n - 1 - flipped, n)
    return left, right


def nearest_pins_at(mask: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`nearest_pins` at the coordinates ``targets`` only.

    Parameters
    ----------
    mask : BoolTensor[B, n]
    targets : LongTensor[B, k]

    Returns
    -------
    left, right : LongTensor[B, k]
        ``nearest_pins(mask)[0].gather(1, targets)`` and likewise for ``right``.

    Notes
    -----
    For long rows and few targets (``n > 256`` and ``8 k < n``) nothing of size ``[B, n]``
    is allocated: the mask is read as 64-bit words of 8 flags (when ``n`` is a multiple of 8
    on a little-endian machine), a running count of the non-empty words (``n / 8`` int32 per
    row) is binary-searched for the nearest non-empty word on each side of a target, and the
    flag inside a word comes from the exponent of a float (``O(n / 8 + k log n)`` per row).
    Otherwise a running count of pins or a scan of the whole row.
    """
    n, k = mask.shape[1], targets.shape[1]
    if n <= 256 or 8 * k >= n:  # a scan of the whole row is cheaper
        left, right = nearest_pins(mask)
        return left.gather(1, targets), right.gather(1, targets)
    if n % 8 == 0 and sys.byteorder == "little":
        return _nearest_pins_by_words(mask, targets)
    count = mask.to(torch.int32).cumsum(dim=1, dtype=torch.int32)  # pins at or before i
    rank = count.gather(1, targets)  # rank of the nearest pin at or before the target
    pinned = mask.gather(1, targets)
    left = torch.searchsorted(count, rank.clamp(min=1))  # first index with count >= rank
    left = torch.where(rank > 0, left, -1)
    right = torch.searchsorted(count, rank + 1)  # the next pin (n if none)
    right = torch.where(pinned, targets, right)
    return left.long(), right.long()


def _byte_masks(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Int64 masks keeping the bytes ``<= o`` (first) and ``>= o`` (second), ``o < 8``."""
    low = [(1 << (8 * (o + 1))) - 1 if o < 7 else -1 for o in range(8)]
    high = [-(1 << (8 * o)) for o in range(8)]
    return (
        torch.tensor(low, dtype=torch.int64, device=device),
        torch.tensor(high, dtype=torch.int64, device=device),
    )


def _top_byte(words: torch.Tensor) -> torch.Tensor:
    """Index of the highest non-zero byte of positive int64 ``words`` whose bytes are 0 or 1.

    The float conversion may round, but never up to the next power of two: the bytes below
    the top one add less than ``2^-7`` of it. So the exponent is exact.
    """
    return (torch.frexp(words.double()).exponent.long() - 1) >> 3


def _nearest_pins_by_words(
    mask: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`nearest_pins_at` for ``n`` a multiple of 8 on a little-endian machine."""
    n = mask.shape[1]
    num_words = n // 8
    words = mask.contiguous().view(torch.uint8).view(torch.int64)  # [B, n / 8], byte i = flag
    count = (words != 0).to(torch.int32).cumsum(dim=1, dtype=torch.int32)  # non-empty words
    low_bytes, high_bytes = _byte_masks(mask.device)
    word = targets >> 3
    offset = targets & 7
    own = words.gather(1, word)
    below = own & low_bytes[offset]  # flags at or before the target in its word
    above = own & high_bytes[offset]  # at or after
    # left: the last non-empty word before the target's word
    rank = torch.where(word > 0, count.gather(1, (word - 1).clamp(min=0)), 0)
    previous = torch.searchsorted(count, rank.clamp(min=1))  # first word with count >= rank
    found = words.gather(1, previous.clamp(max=num_words - 1))
    left = torch.where(rank > 0, 8 * previous + _top_byte(found), -1)
    left = torch.where(below != 0, 8 * word + _top_byte(below), left)
    # right: the first non-empty word after the target's word
    following = torch.searchsorted(count, count.gather(1, word) + 1)
    found = words.gather(1, following.clamp(max=num_words - 1))
    right = torch.where(following < num_words, 8 * following + _top_byte(found & -found), n)
    right = torch.where(above != 0, 8 * word + _top_byte(above & -above), right)
    return left, right


def chain_nearest_pins(
    chain: torch.Tensor, left: torch.Tensor, right: torch.Tensor, n: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Nearest pins of chain coordinates once the chain coordinates before them are pinned.

    Parameters
    ----------
    chain : LongTensor[C, L]
    left, right : LongTensor[C, L]
        The nearest pins of ``chain`` in the prefix (:func:`nearest_pins_at`).
    n : int
        The number of coordinates.

    Returns
    -------
    left, right : LongTensor[C, L]
        The nearest pins of ``chain[c, j]`` among the prefix and ``chain[c, :j]``.
    repeated : BoolTensor[C, L]
        Whether ``chain[c, j]`` is in ``chain[c, :j]`` (then ``left = right = chain[c, j]``).

    Notes
    -----
    One pairwise comparison inside each chain, ``O(L^2)`` per chain (``L`` is about
    ``sqrt(n)``), in chunks of at most ``2^22`` pairs.
    """
    num_chains, length = chain.shape
    if num_chains == 0 or length == 0:
        return left, right, torch.zeros_like(chain, dtype=torch.bool)
    earlier = torch.ones(length, length, dtype=torch.bool, device=chain.device).tril(-1)
    step = max(1, _MAX_PAIRS // max(1, length * length))
    lefts, rights, repeats = [], [], []
    for s in range(0, num_chains, step):
        coords = chain[s : s + step]
        before = coords.unsqueeze(1)  # [c, 1, i]: chain[c, i]
        target = coords.unsqueeze(2)  # [c, j, 1]
        lefts.append(torch.where(earlier & (before < target), before, -1).amax(-1))
        rights.append(torch.where(earlier & (before > target), before, n).amin(-1))
        repeats.append((earlier & (before == target)).any(-1))
    repeated = torch.cat(repeats)
    left = torch.where(repeated, chain, torch.maximum(left, torch.cat(lefts)))
    right = torch.where(repeated, chain, torch.minimum(right, torch.cat(rights)))
    return left, right, repeated


class SeparatorOracle(ExactOracle):
    """Oracles whose pins are separators: a row needs only the nearest pins of each target.

    Subclasses implement ``_combine(values, sites, left, right, pinned)``: the log marginals
    [B, k, q] of ``sites`` [B, k] given their nearest pins ``left`` / ``right`` [B, k] (read
    at ``values`` [B, n]), with a point mass where ``pinned`` [B, k].

    Chain queries are native: the nearest pins of the chain coordinates in the prefix come
    once per chain (:func:`nearest_pins_at` with ``L`` targets), the chain coordinates before
    each one add pins (:func:`chain_nearest_pins`, ``O(L^2)``), and the rows are then
    combined like any rows. ``O(n / 8 + L log n + L^2)`` per chain beyond the combine, instead
    of ``L`` rows of ``O(n / 8)`` each plus ``L`` copies of the values and mask.
    """

    def _log_marginals(self, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        left, right = nearest_pins(mask)
        batch, n = values.shape
        sites = torch.arange(n, device=values.device).expand(batch, n)
        return self._combine(values, sites, left, right, mask)

    def _log_marginals_at(
        self, values: torch.Tensor, mask: torch.Tensor, targets: torch.Tensor
    ) -> torch.Tensor:
        left, right = nearest_pins_at(mask, targets)
        return self._combine(values, targets, left, right, mask.gather(1, targets))

    def _log_marginals_chain(
        self, values: torch.Tensor, mask: torch.Tensor, chain: torch.Tensor
    ) -> torch.Tensor:
        left, right = nearest_pins_at(mask, chain)
        left, right, repeated = chain_nearest_pins(chain, left, right, self.num_coords)
        return self._combine(values, chain, left, right, mask.gather(1, chain) | repeated)

    def _combine(
        self,
        values: torch.Tensor,
        sites: torch.Tensor,
        left: torch.Tensor,
        right: torch.Tensor,
        pinned: torch.Tensor,
    ) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError


class MarkovChainOracle(SeparatorOracle):
    """Exact conditional marginals of a homogeneous Markov chain ``x_0 -> x_1 -> ... -> x_{n-1}``.

    Parameters
    ----------
    initial : Tensor or array [q]
        Law of ``x_0`` (probabilities, normalised here).
    transition : Tensor or array [q, q]
        ``transition[u, v] = P(x_{i+1} = v | x_i = u)``; rows are normalised here. Zeros
        (forbidden transitions) are allowed; every row needs positive mass.
    n : int
        Length of the chain (number of coordinates).
    device : str or torch.device, optional
        Where to keep the parameters.

    Attributes
    ----------
    num_coords : int
        ``n``.
    num_values : int
        ``q``.
    log_powers : DoubleTensor[n, q, q]
        ``log T^k`` for ``k = 0, ..., n - 1``.
    log_prior_marginals : DoubleTensor[n, q]
        ``log P(x_i = v)`` with nothing pinned (``initial @ T^i``).

    Notes
    -----
    Pinned sites are separators. For an unpinned ``i`` with nearest pins ``l < i < r``,

    ``P(x_i = v | pins) ∝ T^{i-l}[x_l, v] * T^{r-i}[v, x_r]``,

    where the left factor is ``P(x_i = v)`` when no pin lies left of ``i`` and the right factor
    is 1 when no pin lies right of it. The nearest pins of all coordinates come from one
    ``cummax`` per direction (for ``k`` targets: a running count of pins and a binary search),
    and each row then costs ``O(n q)`` (``O(k q)`` for ``k`` targets) gathers from the
    precomputed powers (memory ``n q^2``). Powers are computed exactly in log space
    (``logsumexp`` products) by doubling, so tiny transition probabilities stay exact. Pinned
    coordinates get a point mass; rows conditioned on an impossible assignment are NaN.

    Examples
    --------
    >>> import torch
    >>> oracle = MarkovChainOracle([0.5, 0.5], [[0.9, 0.1], [0.2, 0.8]], n=5)
    >>> values = torch.tensor([[0, 0, 0, 0, 1]])
    >>> mask = torch.tensor([[True, False, False, False, True]])
    >>> probs = oracle.log_marginals(values, mask).exp()  # [1, 5, 2]
    >>> probs[0, 2].round(decimals=4)  # P(x_2 | x_0 = 0, x_4 = 1)
    tensor([0.5570, 0.4430], dtype=torch.float64)
    >>> targets = torch.tensor([[2]])
    >>> oracle.log_marginals_at(values, mask, targets).shape
    torch.Size([1, 1, 2])
    """

    def __init__(
        self,
        initial: Any,
        transition: Any,
        n: int,
        device: str | torch.device | None = None,
    ) -> None:
        init = as_float64(initial, "initial", device)
        trans = as_float64(transition, "transition", device)
        check_chain_parameters(init, trans)
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"n must be a positive int (the chain length); got {n!r}")
        self.num_coords = n
        self.num_values = q = init.shape[0]
        self.log_initial = (init / init.sum()).log()
        self.log_transition = (trans / trans.sum(1, keepdim=True)).log()
        # log T^k for k < n, by doubling: powers[2^j + k] = powers[k] @ T^(2^j)
        eye = torch.full((q, q), float("-inf"), dtype=torch.float64, device=init.device)
        eye.diagonal().fill_(0.0)
        powers = eye.unsqueeze(0)
        while powers.shape[0] < n:
            step = log_matmul(powers[-1], self.log_transition)  # T^(2^j)
            powers = torch.cat([powers, log_matmul(powers, step.unsqueeze(0))], 0)
        self.log_powers = powers[:n].contiguous()
        self.log_prior_marginals = log_matmul(self.log_initial.unsqueeze(0), self.log_powers)[
            :, 0
        ].contiguous()

    def _combine(
        self,
        values: torch.Tensor,
        sites: torch.Tensor,
        left: torch.Tensor,
        right: torch.Tensor,
        pinned: torch.Tensor,
    ) -> torch.Tensor:
        """Log marginals [B, k, q] of ``sites`` [B, k] with nearest pins ``left``/``right``."""
        n = self.num_coords
        has_left = left >= 0
        has_right = right < n
        q = self.num_values
        x_left = values.gather(1, left.clamp(min=0)).clamp(0, q - 1)  # junk where no pin
        x_right = values.gather(1, right.clamp(max=n - 1)).clamp(0, q - 1)
        d_left = torch.where(has_left, sites - left, 0)
        d_right = torch.where(has_right, right - sites, 0)
        # left factor: T^{i-l}[x_l, :] or the prior marginal of x_i
        forward = self.log_powers[d_left, x_left]  # [B, k, q]
        forward = torch.where(has_left.unsqueeze(-1), forward, self.log_prior_marginals[sites])
        # right factor: T^{r-i}[:, x_r] or 1
        backward = self.log_powers[d_right, :, x_right]  # [B, k, q]
        backward = torch.where(has_right.unsqueeze(-1), backward, 0.0)
        out = log_normalize(forward + backward)
        return point_mass(out, pinned, values.gather(1, sites))


def check_chain_parameters(initial: torch.Tensor, transition: torch.Tensor) -> None:
    """Validate the ``initial`` [q] and ``transition`` [q, q] probabilities of a chain."""
    if initial.dim() != 1 or initial.shape[0] < 1:
        raise ValueError(
            f"initial must be a vector of q probabilities; got shape {tuple(initial.shape)}"
        )
    q = initial.shape[0]
    if transition.shape != (q, q):
        raise ValueError(
            f"transition must have shape [q, q] = [{q}, {q}] to match initial; "
            f"got {tuple(transition.shape)}"
        )
    if (initial < 0).any() or initial.sum() <= 0:
        raise ValueError("initial must hold non-negative probabilities with a positive sum")
    if (transition < 0).any():
        raise ValueError(
            "transition must hold non-negative probabilities (pass probabilities, not logs)"
        )
    empty = (transition.sum(1) <= 0).nonzero().flatten().tolist()
    if empty:
        raise ValueError(
            f"transition rows {empty} have zero mass; every state needs at least one allowed "
            f"successor"
        )
