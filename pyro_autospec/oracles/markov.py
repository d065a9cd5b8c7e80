"""The exact oracle of a homogeneous Markov chain on ``[q]^n``."""

from __future__ import annotations

import sys
from typing import Any

import torch

from pyro_autospec.engine.logspace import log_matmul, log_normalize

from ._util import as_float64, point_mass
from .exact import ChainThen, ExactOracle

__all__ = [
    "MarkovChainOracle",
    "after_chain_pins",
    "chain_nearest_pins",
    "nearest_pins",
    "nearest_pins_at",
]


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
    For long rows and few targets (``n > 256`` and ``8 k < n``) in large calls (more than
    ``2^19`` mask entries) nothing of size ``[B, n]`` is allocated when ``n`` is a multiple of
    8 (on a little-endian machine): the mask is read
    as 64-bit words of 8 flags, and words as groups of 8, so that only a running count of the
    non-empty groups (``n / 64`` int32 per row) is formed and binary-searched; the nearest
    flag inside a group or a word comes from the exponent of a float. ``O(n / 8 + k log n)``
    per row, most of it one reading of the mask. Otherwise a running count of pins
    (``O(n + k log n)``) or a scan of the whole row.
    """
    n, k = mask.shape[1], targets.shape[1]
    if n <= 256 or 8 * k >= n:  # a scan of the whole row is cheaper
        left, right = nearest_pins(mask)
        return left.gather(1, targets), right.gather(1, targets)
    # The word search has a fixed cost of some fifty small operations; below about half a
    # million mask entries the running count's one allocation is cheaper.
    if mask.shape[0] * n > 2**19 and n % 8 == 0 and sys.byteorder == "little":
        return _nearest_pins_by_words(mask, targets)
    return _nearest_pins_by_count(mask, targets)


def _nearest_pins_by_count(
    mask: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`nearest_pins_at` by a binary search in the running count of pins (``[B, n]``,
    int16 when ``n < 2^15``: the narrower, the faster the count on a CPU): any ``n``."""
    dtype = torch.int16 if mask.shape[1] < 2**15 else torch.int32
    count = mask.cumsum(dim=1, dtype=dtype)  # pins at or before i
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
    """:func:`nearest_pins_at` for ``n`` a multiple of 8 on a little-endian machine.

    Two levels of 64-bit words: ``words`` holds 8 flags each (a view of the mask, no copy),
    ``groups`` the 8 flags "word is non-empty" of 8 consecutive words. Only the groups get a
    running count (``n / 64`` int32 per row), binary-searched for the nearest non-empty group;
    inside a group or a word the nearest flag comes from :func:`_top_byte`.
    """
    batch, n = mask.shape
    num_words = n // 8
    num_groups = (num_words + 7) // 8
    words = mask.contiguous().view(torch.uint8).view(torch.int64)  # [B, n / 8], byte i = flag
    nonempty = torch.zeros(batch, 8 * num_groups, dtype=torch.bool, device=mask.device)
    nonempty[:, :num_words] = words != 0
    groups = nonempty.view(torch.uint8).view(torch.int64)  # [B, groups], byte i = word 8 g + i
    count = (groups != 0).to(torch.int32).cumsum(dim=1, dtype=torch.int32)  # non-empty groups
    low_bytes, high_bytes = _byte_masks(mask.device)
    word, offset = targets >> 3, targets & 7
    group, slot = word >> 3, word & 7  # the target's word is byte `slot` of `group`
    own = words.gather(1, word)
    own_group = groups.gather(1, group)
    # left: in the target's word; else the last non-empty word before it in its group; else
    # the last word of the last non-empty group before it
    earlier = own_group & torch.where(slot > 0, low_bytes[(slot - 1).clamp(min=0)], 0)
    rank = torch.where(group > 0, count.gather(1, (group - 1).clamp(min=0)), 0)
    previous = torch.searchsorted(count, rank.clamp(min=1))  # first group with count >= rank
    found = groups.gather(1, previous.clamp(max=num_groups - 1))
    left_word = torch.where(rank > 0, 8 * previous + _top_byte(found), -1)
    left_word = torch.where(earlier != 0, 8 * group + _top_byte(earlier), left_word)
    found = words.gather(1, left_word.clamp(min=0))
    left = torch.where(left_word >= 0, 8 * left_word + _top_byte(found), -1)
    below = own & low_bytes[offset]  # flags at or before the target in its word
    left = torch.where(below != 0, 8 * word + _top_byte(below), left)
    # right: the mirror image, with the lowest byte (x & -x isolates the lowest set bit)
    later = own_group & torch.where(slot < 7, high_bytes[(slot + 1).clamp(max=7)], 0)
    following = torch.searchsorted(count, count.gather(1, group) + 1)  # the next group
    found = groups.gather(1, following.clamp(max=num_groups - 1))
    right_word = torch.where(
        following < num_groups, 8 * following + _top_byte(found & -found), num_words
    )
    right_word = torch.where(later != 0, 8 * group + _top_byte(later & -later), right_word)
    found = words.gather(1, right_word.clamp(max=num_words - 1))
    right = torch.where(right_word < num_words, 8 * right_word + _top_byte(found & -found), n)
    above = own & high_bytes[offset]  # at or after
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
    Sort each chain by coordinate and write ``t[p]`` for the step at which the ``p``-th
    smallest coordinate is pinned. The chain pin left of the ``p``-th coordinate, among those
    pinned before it, is the previous smaller element of ``t`` at ``p`` (the nearest
    ``p' < p`` with ``t[p'] < t[p]``), and the one right of it the next smaller element.
    Both come from a table of running minima over windows of ``2^k`` and a descent over
    ``k``: ``O(L log L)`` per chain in ``O(log L)`` batched steps. Short chains compare every
    pair of chain coordinates instead (``O(L^2)`` per chain in a few batched steps), which is
    cheaper while ``C L^2`` is small.
    """
    num_chains, length = chain.shape
    if num_chains == 0 or length == 0:
        return left, right, torch.zeros_like(chain, dtype=torch.bool)
    if num_chains * length * length <= _PAIRWISE_ELEMENTS:
        chain_left, chain_right, repeated = _chain_pins_pairwise(chain, n)
    else:
        chain_left, chain_right, repeated = _chain_pins_sorted(chain, n)
    left = torch.where(repeated, chain, torch.maximum(left, chain_left))
    right = torch.where(repeated, chain, torch.minimum(right, chain_right))
    return left, right, repeated


# Below this many pairs (C L^2) the pairwise comparison's few passes cost less than the
# O(log L) steps of the sorted search (about even near 2^16 on a CPU).
_PAIRWISE_ELEMENTS = 2**15


def _chain_pins_pairwise(
    chain: torch.Tensor, n: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The chain's own pins of :func:`chain_nearest_pins` by comparing every pair:
    ``chain_left``, ``chain_right`` (``-1`` / ``n`` if none) and ``repeated``, each [C, L]."""
    length = chain.shape[1]
    earlier = torch.ones(length, length, dtype=torch.bool, device=chain.device).tril(-1)
    small = chain.to(torch.int32) if n < 2**31 else chain  # half the memory traffic
    mine, other = small.unsqueeze(2), small.unsqueeze(1)  # [C, L (j), 1], [C, 1, L (j' < j)]
    chain_left = torch.where(earlier & (other < mine), other, -1).amax(2)
    chain_right = torch.where(earlier & (other > mine), other, n).amin(2)
    repeated = (earlier & (other == mine)).any(2)
    return chain_left.long(), chain_right.long(), repeated


def _chain_pins_sorted(
    chain: torch.Tensor, n: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The chain's own pins of :func:`chain_nearest_pins` by sorting each chain (see there)."""
    num_chains, length = chain.shape
    device = chain.device
    coords, perm = chain.sort(dim=1, stable=True)  # equal coordinates keep their chain order
    steps = perm  # t[p]: the step that pins the p-th smallest coordinate
    # a repeat is a coordinate equal to the one before it in sorted order
    repeat_sorted = torch.zeros_like(coords, dtype=torch.bool)
    repeat_sorted[:, 1:] = coords[:, 1:] == coords[:, :-1]
    # repeats never pin anything new: give them the latest step so they are never chosen
    t = torch.where(repeat_sorted, length, steps)
    previous, following = _nearest_smaller(t)  # [C, L] sorted positions, -1 / L if none
    chain_left = torch.where(previous >= 0, coords.gather(1, previous.clamp(min=0)), -1)
    chain_right = torch.where(
        following < length, coords.gather(1, following.clamp(max=length - 1)), n
    )
    # back to chain order
    inverse = torch.empty_like(perm)
    inverse.scatter_(1, perm, torch.arange(length, device=device).expand(num_chains, length))
    repeated = repeat_sorted.gather(1, inverse)
    return chain_left.gather(1, inverse), chain_right.gather(1, inverse), repeated


def after_chain_pins(
    chain: torch.Tensor, then: torch.Tensor, left: torch.Tensor, right: torch.Tensor, n: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Nearest pins of the coordinates ``then`` once the whole chain is pinned.

    Parameters
    ----------
    chain : LongTensor[C, L]
    then : LongTensor[C, T]
    left, right : LongTensor[C, T]
        The nearest pins of ``then`` in the prefix (:func:`nearest_pins_at`).
    n : int
        The number of coordinates.

    Returns
    -------
    left, right : LongTensor[C, T]
        The nearest pins of ``then[c, k]`` among the prefix and all of ``chain[c]``.
    on_chain : BoolTensor[C, T]
        Whether ``then[c, k]`` is in ``chain[c]`` (then ``left = right = then[c, k]``).

    Notes
    -----
    One sort of each chain and a binary search per target: ``O((L + T) log L)`` per chain.

    Examples
    --------
    >>> import torch
    >>> chain, then = torch.tensor([[5, 2]]), torch.tensor([[3, 5, 8]])
    >>> left, right = torch.zeros(1, 3, dtype=torch.long), torch.full((1, 3), 9)  # pins 0, 9
    >>> after_chain_pins(chain, then, left, right, n=10)
    (tensor([[2, 5, 5]]), tensor([[5, 5, 9]]), tensor([[False,  True, False]]))
    """
    length = chain.shape[1]
    if length == 0:
        return left, right, torch.zeros_like(then, dtype=torch.bool)
    ordered = chain.sort(dim=1).values.contiguous()
    slot = torch.searchsorted(ordered, then.contiguous())  # first chain coordinate >= target
    at = ordered.gather(1, slot.clamp(max=length - 1))
    on_chain = (slot < length) & (at == then)
    below = torch.where(slot > 0, ordered.gather(1, (slot - 1).clamp(min=0)), -1)
    above = torch.where(slot < length, at, n)
    left = torch.where(on_chain, then, torch.maximum(left, below))
    right = torch.where(on_chain, then, torch.minimum(right, above))
    return left, right, on_chain


def _nearest_smaller(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For every ``p``, the nearest ``p' < p`` and the nearest ``p' > p`` with
    ``t[p'] < t[p]``: two LongTensors of the shape of ``t`` [C, L], ``-1`` and ``L`` if none.

    Both directions are one search over ``[t; flip(t)]`` ([2 C, L]): the right-hand search is
    the left-hand one of the reversed rows, so the ``O(log L)`` steps are not paid twice.
    """
    num_chains, length = t.shape
    both = torch.cat([t, t.flip(1)], 0)
    # minima[k][:, p] = min(both[p - 2^k + 1 .. p]) (windows cut at 0)
    minima = [both]
    width = 1
    while 2 * width <= length:
        last = minima[-1]
        shifted = torch.cat([last[:, :1].expand(-1, width), last[:, :-width]], 1)
        minima.append(torch.minimum(last, shifted))
        width *= 2
    position = torch.arange(length, device=t.device).expand(2 * num_chains, length)
    current = position - 1  # the search starts just left of p
    for k in range(len(minima) - 1, -1, -1):
        size = 1 << k
        start = current - size + 1
        window = minima[k].gather(1, current.clamp(min=0))
        # no smaller value in (start .. current]: jump over the window
        jump = (start >= 0) & (window >= both)
        current = torch.where(jump, current - size, current)
    # current is now -1 or the nearest position whose value may be smaller
    found = (current >= 0) & (both.gather(1, current.clamp(min=0)) < both)
    nearest = torch.where(found, current, -1)
    previous, mirrored = nearest[:num_chains], nearest[num_chains:]
    following = torch.where(mirrored >= 0, length - 1 - mirrored, length).flip(1)
    return previous, following


class SeparatorOracle(ChainThen, ExactOracle):
    """Oracles whose pins are separators: a row needs only the nearest pins of each target.

    Subclasses implement ``_combine(values, sites, left, right, pinned)``: the log marginals
    [B, k, q] of ``sites`` [B, k] given their nearest pins ``left`` / ``right`` [B, k] (read
    at ``values`` [B, n]), with a point mass where ``pinned`` [B, k].

    Chain queries are native: the nearest pins of the chain coordinates in the prefix come
    once per chain (:func:`nearest_pins_at` with ``L`` targets), the chain coordinates before
    each one add pins (:func:`chain_nearest_pins`, ``O(L log L)`` or ``O(L^2)`` for short
    chains), and the rows are then combined like any rows. ``O(n / 8 + L log n + L^2)`` per
    chain beyond the combine, instead of ``L`` rows of ``O(n / 8)`` each plus ``L`` copies of
    the values and mask. The row after a chain (:meth:`log_marginals_chain_then`) shares the
    chain's search for pins in the prefix and finds the chain's own by a binary search in the
    sorted chain (:func:`after_chain_pins`), so it costs no dense input and no search of its
    own.
    """

    consistent_queries = True  # its query methods (the conformance tests check them)

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

    def _log_marginals_chain_then(
        self, values: torch.Tensor, mask: torch.Tensor, chain: torch.Tensor, then: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n, length = self.num_coords, chain.shape[1]
        sites = torch.cat([chain, then], 1)
        left, right = nearest_pins_at(mask, sites)  # one search for the chain and the row after
        chain_left, chain_right, repeated = chain_nearest_pins(
            chain, left[:, :length], right[:, :length], n
        )
        then_left, then_right, on_chain = after_chain_pins(
            chain, then, left[:, length:], right[:, length:], n
        )
        pinned = mask.gather(1, sites) | torch.cat([repeated, on_chain], 1)
        out = self._combine(
            values,
            sites,
            torch.cat([chain_left, then_left], 1),
            torch.cat([chain_right, then_right], 1),
            pinned,
        )
        return out[:, :length], out[:, length:]

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
    ``cummax`` per direction (for ``k`` targets: a binary search over words of the mask, see
    :func:`nearest_pins_at`), and each row then costs ``O(n q)`` (``O(k q)`` for ``k``
    targets) gathers from the precomputed powers (memory ``n q^2``). Powers are computed
    exactly in log space (``logsumexp`` products) by doubling, so tiny transition
    probabilities stay exact. Pinned coordinates get a point mass; rows conditioned on an
    impossible assignment are NaN.

    Chain queries (:meth:`log_marginals_chain`) are native: the prefix's nearest pins of the
    ``L`` chain coordinates come from one search per chain, the chain coordinates pinned
    before each one from a sort of the chain or, for short chains, a comparison of every pair
    of its coordinates (:func:`chain_nearest_pins`), then the rows are combined as above:
    ``O(n / 8 + L log n + L^2 + L q)`` per chain, against ``L`` rows of ``O(n / 8 + q)`` (see
    :doc:`/oracles`).

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
