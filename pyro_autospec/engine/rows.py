"""Asking a :class:`~pyro_autospec.engine.protocols.MarginalOracle` for rows, in batches, checked.

The samplers ask for two kinds of conditionings of a draw's partial sample, always along the
draw's visiting order ``sigma``:

* a **targeted row** conditions on ``sigma[:cut]`` and needs the marginals of the positions
  ``start .. start + width - 1`` (a block's draft row, or the prefetch of the next block's);
* a **chain** conditions on ``sigma[:cut]`` and needs, for ``j < length``, the marginal of
  position ``cut + j`` given ``sigma[:cut + j]``: the verification of a drafted block, one
  values vector, one order, a range of cuts.

:class:`OracleRows` answers every request of a round with as few oracle calls as the memory
budget allows (still one round). Chains go to ``log_marginals_chain`` when the oracle has it,
else they are expanded into targeted rows. Every returned row is checked and normalised in
float64; a row that is NaN, ``+inf``, massless or far from summing to one is flagged ``bad``
(an error only if its conditioning is possible, which the sampler decides, see
:meth:`OracleRows.raise_bad`).

The dense ``[rows, n]`` inputs of the protocol are fresh tensors in every call: an oracle may
keep what it was given (a cache keyed on its last inputs), and a buffer written again in the
next call would silently change what it kept.

Memory is bounded by the draws in flight: a draw's order (and the ranks of its coordinates) is
computed into a *lane* when the draw starts (:meth:`OracleRows.start`) and the lane is freed
when it finishes (:meth:`OracleRows.finish`). Orders are a function of the draw's key
(:class:`VisitOrders`), so they are never stored for the whole run.
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from dataclasses import dataclass

import numpy as np
import torch

from pyro_autospec.engine import keys
from pyro_autospec.engine.errors import OracleError
from pyro_autospec.engine.memory import check_output_size
from pyro_autospec.engine.modes import (
    BorrowedInputsCheck,
    calling,
    foreign_inputs,
    ordinary,
    tensor_mode,
)
from pyro_autospec.engine.protocols import Capabilities

__all__ = ["OracleRows", "Answer", "VisitOrders", "draw_orders"]


def take(matrix: torch.Tensor, row: torch.Tensor, col: torch.Tensor) -> torch.Tensor:
    """``matrix[row[k], col[k, ...]]`` of a contiguous ``matrix`` [R, m]: the shape of ``col``
    ([K] or [K, W]; ``row`` [K]).

    By flat indices into the matrix: ``torch.take`` for small requests (the fewest calls), one
    ``index_select`` for large ones (faster per entry on a CPU). Both are two to three times
    faster on a CPU than indexing with two index tensors.

    Examples
    --------
    >>> m = torch.arange(12).view(3, 4)
    >>> take(m, torch.tensor([2, 0]), torch.tensor([[1, 3], [0, 0]]))
    tensor([[ 9, 11],
            [ 0,  0]])
    """
    flat = torch.add(col, row if col.dim() == 1 else row.unsqueeze(1), alpha=matrix.shape[1])
    if flat.numel() <= _TAKE_LIMIT:
        return torch.take(matrix, flat)
    return matrix.view(-1).index_select(0, flat.view(-1)).view(col.shape)


#: Largest request answered by ``torch.take`` (measured on a CPU: beyond it ``index_select``
#: is faster).
_TAKE_LIMIT = 4096


def ragged(size: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The flat layout of ``K`` segments of lengths ``size`` [K], one after the other.

    Returns
    -------
    segment, position : LongTensor[T]
        For each of the ``T = size.sum()`` entries, its segment and its index in it.
    start : LongTensor[K]
        Index of each segment's first entry (``start + size - 1`` is its last).

    Examples
    --------
    >>> ragged(torch.tensor([2, 0, 3]))
    (tensor([0, 0, 2, 2, 2]), tensor([0, 1, 0, 1, 2]), tensor([0, 2, 2]))
    """
    start = torch.cumsum(size, 0) - size
    segment = torch.repeat_interleave(size)
    position = torch.arange(segment.numel(), device=size.device) - start[segment]
    return segment, position, start


def draw_orders(order: torch.Tensor | None, draw_keys: torch.Tensor, n: int) -> torch.Tensor:
    """Visiting orders LongTensor[D, n]: keyed uniform permutations, or a fixed one tiled.

    Draw ``s``'s random order sorts the coordinates by ``bits(stream(draw_key, ORDER), i)``,
    so it depends on the seed and the draw's number only.
    """
    device = draw_keys.device
    if order is None:
        scores = keys.bits(
            keys.stream(draw_keys, keys.Tag.ORDER).unsqueeze(1),
            torch.arange(n, device=device).unsqueeze(0),
        )
        return torch.argsort(scores, dim=1, stable=True)
    return order.to(device).expand(draw_keys.numel(), n).clone()


class VisitOrders:
    """The visiting orders of a run's draws, computed when asked, never all stored at once.

    Parameters
    ----------
    order : LongTensor[n] or None
        A fixed permutation used by every draw, or ``None`` for keyed uniform orders
        (:func:`draw_orders`).
    draw_keys : LongTensor[D]
        Keys of the draws (:func:`pyro_autospec.engine.keys.draw_keys`).
    n : int
    table : LongTensor[D, n], optional
        Explicit orders instead (then ``order`` and ``draw_keys`` are ignored).

    Examples
    --------
    >>> import torch
    >>> from pyro_autospec.engine import keys
    >>> source = VisitOrders(None, keys.draw_keys(keys.seed_key(0), torch.arange(3)), 5)
    >>> source.of(torch.tensor([2])).equal(source.materialize()[2:])
    True
    """

    #: Draws whose orders are computed at once by :meth:`materialize`.
    CHUNK = 4096

    def __init__(
        self,
        order: torch.Tensor | None,
        draw_keys: torch.Tensor,
        n: int,
        table: torch.Tensor | None = None,
    ):
        self.order = order
        self.draw_keys = draw_keys
        self.n = int(n)
        self.table = table

    @classmethod
    def from_table(cls, table: torch.Tensor) -> VisitOrders:
        """Explicit orders LongTensor[D, n]."""
        table = table.long()
        empty = torch.zeros(table.shape[0], dtype=torch.long, device=table.device)
        return cls(None, empty, table.shape[1], table=table)

    def __len__(self) -> int:
        return int(self.draw_keys.numel() if self.table is None else self.table.shape[0])

    def of(self, draws: torch.Tensor) -> torch.Tensor:
        """The orders LongTensor[K, n] of the draws ``draws`` (LongTensor[K], local numbers)."""
        if self.table is not None:
            return self.table.index_select(0, draws.to(self.table.device))
        return draw_orders(self.order, self.draw_keys[draws.to(self.draw_keys.device)], self.n)

    def to(self, device) -> VisitOrders:
        """The same orders, computed on ``device``."""
        device = torch.device(device)
        if self.table is not None:
            return VisitOrders.from_table(self.table.to(device))
        order = None if self.order is None else self.order.to(device)
        return VisitOrders(order, self.draw_keys.to(device), self.n)

    def materialize(self) -> torch.Tensor:
        """Every draw's order: LongTensor[D, n], filled a chunk of draws at a time.

        Raises
        ------
        MemoryError
            If ``D * n`` int64 entries cannot fit in this machine's memory.
        """
        total = len(self)
        check_output_size(total, self.n, what="result.orders")
        device = self.draw_keys.device if self.table is None else self.table.device
        out = torch.empty(total, self.n, dtype=torch.long, device=device)
        for lo in range(0, total, self.CHUNK):
            hi = min(total, lo + self.CHUNK)
            out[lo:hi] = self.of(torch.arange(lo, hi, device=device))
        return out


@dataclass
class Answer:
    """Checked rows: ``log_probs`` DoubleTensor[R, W, q] (normalised), ``bad`` BoolTensor[R, W]
    and ``log_mass`` DoubleTensor[R, W] (the oracle's own total, for messages); or the same as
    NumPy arrays (the host control plane's). Entries past a request's width are padding
    (``bad`` False)."""

    log_probs: torch.Tensor
    bad: torch.Tensor
    log_mass: torch.Tensor

    def part(self, index) -> Answer:
        """The requests ``index`` (a slice or an index tensor) of this answer."""
        return Answer(self.log_probs[index], self.bad[index], self.log_mass[index])


def then_pair(result) -> tuple:
    """``log_marginals_chain_then``'s answer as the pair ``(out, after)`` it must be.

    Raises
    ------
    OracleError
        For anything else (a single tensor unpacked would split along its first dimension).
    """
    if isinstance(result, (tuple, list)) and len(result) == 2:
        return tuple(result)
    got = type(result).__name__
    if isinstance(result, (tuple, list)):
        got += f" of {len(result)} items"
    elif isinstance(result, torch.Tensor):
        got += f" of shape {tuple(result.shape)}"
    raise OracleError(
        f"oracle.log_marginals_chain_then must return a pair (out, after): out Tensor[C, L, q] "
        f"for the chain and after Tensor[C, T, q] for the rows after it; got {got}"
    )


@functools.cache
def _tolerance(dtype: torch.dtype) -> float:
    """How far ``logsumexp`` of a row may stray from 0.

    The engine renormalises every row in float64 (the law is the normalised oracle's), so the
    check only catches rows that are not log probabilities at all (logits, a wrong axis). An
    oracle may compute in float32 and return float64: the floor of ``1e-5`` admits that
    rounding, ``1000 eps`` of the output's own precision admits a narrower output.
    """
    eps = torch.finfo(dtype).eps if dtype.is_floating_point else 0.0
    return float(min(0.05, max(1e-5, 1000.0 * eps)))


class OracleRows:
    """Batched, checked oracle queries along the draws' orders.

    Parameters
    ----------
    oracle : MarginalOracle
    orders : VisitOrders or LongTensor[D, n]
        The draws' orders: ``orders[s, j]`` is the coordinate visited ``j``-th by draw ``s``.
    device : torch.device
        Where queries are built (the oracle's device).
    max_elements : int
        Largest number of entries (inputs ``n`` plus outputs ``width * q`` per row) of one
        oracle call; larger rounds are cut into several calls (one round all the same).
    draw_ids : LongTensor[D], optional
        Global numbers of the draws (what a family oracle receives as ``draws``); default
        ``0 .. D - 1``.
    lanes : int, optional
        How many draws may be in flight at once. The samplers then call :meth:`start` and
        :meth:`finish` around each draw, and only the orders of the draws in flight are
        held (``lanes * n`` entries). Default: every draw is in flight from the start (lane
        ``s`` holds draw ``s``; :meth:`start` and :meth:`finish` do nothing).
    capabilities : Capabilities, optional
        What ``oracle`` offers, as the run read it once; read from ``oracle`` if not given.
    """

    def __init__(
        self,
        oracle,
        orders: torch.Tensor,
        device: torch.device,
        max_elements: int,
        draw_ids: torch.Tensor | None = None,
        lanes: int | None = None,
        capabilities: Capabilities | None = None,
    ):
        self.oracle = oracle
        self.device = device
        caps = Capabilities.of(oracle) if capabilities is None else capabilities
        #: What the oracle offers, as the run read it once (:class:`Capabilities`).
        self.capabilities = caps
        if isinstance(orders, torch.Tensor):
            orders = VisitOrders.from_table(orders)
        self.source = orders.to(device)
        self.num_draws = len(self.source)
        self.n = int(oracle.num_coords)
        self.q = int(oracle.num_values)
        self._rank_dtype = torch.int16 if self.n < 2**15 else torch.int32
        self._arange_n = torch.arange(self.n, device=device, dtype=self._rank_dtype)
        self.resident = lanes is None
        capacity = self.num_draws if lanes is None else min(int(lanes), self.num_draws)
        self.capacity = capacity
        #: ``orders[lane, j]``: the coordinate visited ``j``-th by the draw in ``lane``, and
        #: ``ranks[lane, i]``: when it visits coordinate ``i`` (allocated when a first draw
        #: starts: the host control plane keeps its own, see ``HostRows``).
        self.orders: torch.Tensor | None = None
        self.ranks: torch.Tensor | None = None
        #: The lane of each draw in flight (``-1`` for the others), and the draw of each lane.
        self.lane_of = torch.full((self.num_draws,), -1, dtype=torch.long, device=device)
        self.draw_in = torch.full((capacity,), -1, dtype=torch.long, device=device)
        if self.resident:
            everyone = torch.arange(self.num_draws, device=device)
            self._fill(everyone, everyone)
        self.max_elements = int(max_elements)
        self.targeted = caps.targeted
        self.native_chains = caps.chains
        self.native_then = caps.chain_then
        self.family = caps.num_draws is not None
        self.borrows_inputs = caps.borrows_inputs
        self.draw_ids = (
            torch.arange(self.num_draws, device=device) if draw_ids is None else draw_ids.to(device)
        )
        self.calls = 0
        #: Host seconds spent building the protocol's dense inputs, inside the oracle's
        #: methods, and checking its answers (for benchmarks; without GPU synchronisation).
        self.seconds = {"inputs": 0.0, "oracle": 0.0}
        # The engine runs in inference mode; an oracle that is not inference-safe runs out of
        # it, in the grad mode of the caller of the sampler (an oracle may differentiate
        # internally, e.g. the compiled EnumOracle).
        self.grad_enabled = torch.is_grad_enabled()
        self._call_mode = BorrowedInputsCheck(
            calling(oracle, self.grad_enabled, caps.inference_safe),
            checked=caps.borrows_inputs,
        )
        # and with grad enabled, on ordinary tensors: autograd may save them for backward;
        # not for an oracle that borrows its inputs (it only reads them: no copies for it)
        self.ordinary_inputs = foreign_inputs(
            oracle, self.grad_enabled, caps.inference_safe, caps.borrows_inputs
        )
        self.tensor_mode = tensor_mode(self.ordinary_inputs)
        self._lanes = torch.zeros(0, dtype=torch.long, device=device)  # see next_rows
        self._all_valid = torch.ones(1, 1, dtype=torch.bool, device=device)

    # -------------------------------------------------------------------------- lanes
    def _fill(self, lanes: torch.Tensor, draws: torch.Tensor) -> None:
        if self.orders is None:
            shape = (self.capacity, self.n)
            self.orders = torch.zeros(shape, dtype=torch.long, device=self.device)
            self.ranks = torch.zeros(shape, dtype=self._rank_dtype, device=self.device)
        orders = self.source.of(draws)
        ranks = torch.empty(orders.shape, dtype=self._rank_dtype, device=self.device)
        ranks.scatter_(1, orders, self._arange_n.expand_as(orders))
        self.orders.index_copy_(0, lanes, orders)
        self.ranks.index_copy_(0, lanes, ranks)
        self.lane_of[draws] = lanes
        self.draw_in[lanes] = draws

    def start(self, draws: torch.Tensor) -> None:
        """Draws ``draws`` (LongTensor[K], local numbers) start: their orders go into free
        lanes."""
        if self.resident or draws.numel() == 0:
            return
        free = torch.nonzero(self.draw_in < 0).flatten()
        if free.numel() < draws.numel():
            raise RuntimeError(
                f"internal error: {draws.numel()} draws start but only {free.numel()} of "
                f"{self.draw_in.numel()} lanes are free"
            )
        self._fill(free[: draws.numel()], draws)

    def finish(self, draws: torch.Tensor) -> None:
        """Draws ``draws`` finished: their lanes are free for the next draws."""
        if self.resident or draws.numel() == 0:
            return
        self.draw_in[self.lane_of[draws]] = -1
        self.lane_of[draws] = -1

    def orders_of(self, draws: torch.Tensor) -> torch.Tensor:
        """The orders LongTensor[K, n] of draws in flight."""
        return self.orders.index_select(0, self._lane(draws))

    def _lane(self, draw: torch.Tensor) -> torch.Tensor:
        return draw if self.resident else self.lane_of[draw]

    # ------------------------------------------------------------------------ buffers
    def coords(self, draw: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Coordinates ``orders[draw[k], pos[k, ...]]`` of draws in flight: LongTensor of the
        shape of ``pos`` [K] or [K, W] (``draw`` [K]), by one flat gather (:func:`take`)."""
        return take(self.orders, self._lane(draw), pos)

    def _buffer(self, rows: int, dtype: torch.dtype) -> torch.Tensor:
        """A fresh ``[rows, n]`` tensor for one call's inputs: an oracle may keep its inputs
        (a cache of its last call), so they are never written again."""
        return torch.empty(rows, self.n, dtype=dtype, device=self.device)

    def _inputs(
        self, values: torch.Tensor, frame: torch.Tensor, draw: torch.Tensor, cut: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Dense ``values`` LongTensor[R, n] and ``mask`` BoolTensor[R, n] of ``R`` rows."""
        start = time.perf_counter()
        rows = frame.numel()
        out = self._buffer(rows, torch.long)
        if values.dtype == torch.long:
            torch.index_select(values, 0, frame, out=out)
        else:
            out.copy_(torch.index_select(values, 0, frame))
        mask = self._buffer(rows, torch.bool)
        ranks = torch.index_select(self.ranks, 0, self._lane(draw))
        torch.lt(ranks, cut.to(ranks.dtype).unsqueeze(1), out=mask)
        self.seconds["inputs"] += time.perf_counter() - start
        return out, mask

    def _rows_per_call(self, outputs: int) -> int:
        """Rows (or chains) per oracle call within ``max_elements``: each takes ``n`` input
        entries and ``outputs`` rows of ``q`` output entries."""
        return max(1, self.max_elements // (self.n + outputs * self.q))

    # ------------------------------------------------------------------------ queries
    def ask(
        self,
        values: torch.Tensor,
        rows: tuple[torch.Tensor, ...] | None = None,
        chains: tuple[torch.Tensor, ...] | None = None,
    ) -> tuple[Answer | None, Answer | None]:
        """Answer targeted rows and chains of one round.

        Parameters
        ----------
        values : IntTensor[F, n]
            Partial samples (frames), in coordinate indexing; unpinned entries are ignored.
        rows : (frame, draw, cut, start, width), each LongTensor[R], optional
            Targeted rows: conditioning on ``orders[draw, :cut]`` of ``values[frame]``, the
            marginals of positions ``start .. start + width - 1`` of ``orders[draw]``.
        chains : (frame, draw, cut, length), each LongTensor[C], optional
            Chains: for ``j < length``, the marginal of position ``cut + j`` given
            ``orders[draw, :cut + j]``.

        Returns
        -------
        row_answer, chain_answer : Answer or None
            ``[R, max width, q]`` and ``[C, max length, q]``.
        """
        self.calls += 1
        row_answer = chain_answer = None
        if chains is not None and chains[0].numel() and not self.native_chains:
            frame, draw, cut, length = chains
            c, offset, _ = ragged(length)
            step = cut[c] + offset
            expanded = (frame[c], draw[c], step, step, torch.ones_like(step))
            if rows is not None and rows[0].numel():
                merged = tuple(torch.cat([row, more]) for row, more in zip(rows, expanded))
                answer = self._targeted(values, *merged)
                split = rows[0].numel()
                row_answer = answer.part(slice(0, split))
                flat = answer.part(slice(split, None))
            else:
                flat = self._targeted(values, *expanded)
            chain_answer = _regroup(flat, c, offset, frame.numel(), int(length.max()))
            return row_answer, chain_answer
        has_rows = rows is not None and rows[0].numel() > 0
        if has_rows and chains is not None and chains[0].numel() and self.native_then:
            return self._rows_after_chains(values, rows, chains)
        if has_rows:
            row_answer = self._targeted(values, *rows)
        if chains is not None and chains[0].numel():
            chain_answer = self._chains(values, *chains)[0]
        return row_answer, chain_answer

    def _rows_after_chains(self, values, rows, chains) -> tuple[Answer, Answer]:
        """Rows and chains for an oracle with ``log_marginals_chain_then``: a row that is the
        row after a chain (the same frame and order, conditioned on the chain's prefix and the
        whole chain, reading on from there: a verification's prefetched draft row) is asked
        with its chain; the other rows as targeted rows."""
        frame, draw, cut, start, width = rows
        chain_frame, chain_draw, chain_cut, length = chains
        span = self.n + 1
        ends, order = torch.sort(chain_frame * span + chain_cut + length)
        wanted = frame * span + cut
        found = torch.searchsorted(ends, wanted).clamp(max=ends.numel() - 1)
        chain = order[found]
        after = (ends[found] == wanted) & (chain_draw[chain] == draw) & (start == cut)
        # at most one row per chain (a duplicate is asked as a targeted row)
        row_of = torch.full_like(chain_frame, -1)
        hit = after.nonzero().flatten()
        row_of[chain[hit]] = hit
        attached = row_of >= 0
        then_width = torch.where(attached, width[row_of.clamp(min=0)], 0)
        chain_answer, then_answer = self._chains(values, *chains, then_width)
        parts = []
        if then_answer is not None:
            attached_at = attached.nonzero().flatten()
            parts.append((row_of[attached_at], then_answer.part(attached_at)))
        asked = torch.ones(frame.numel(), dtype=torch.bool, device=self.device)
        asked[row_of[attached]] = False
        asked_at = asked.nonzero().flatten()
        if asked_at.numel():
            parts.append((asked_at, self._targeted(values, *(x[asked_at] for x in rows))))
        return _assemble(parts, width, self.q), chain_answer

    def _targeted(self, values, frame, draw, cut, start, width) -> Answer:
        """Targeted rows, in as few calls as padding allows (see :func:`width_groups`)."""
        groups = width_groups(width)
        if len(groups) == 1:
            return self._bucket(values, frame, draw, cut, start, width)
        return _scatter_groups(
            groups,
            (width,),
            self.q,
            lambda idx: (
                self._bucket(values, frame[idx], draw[idx], cut[idx], start[idx], width[idx]),
            ),
        )[0]

    def _bucket(self, values, frame, draw, cut, start, width) -> Answer:
        total = frame.numel()
        max_width = int(width.max())
        step = self._rows_per_call(max_width if self.targeted else self.n)
        pieces = []
        for lo in range(0, total, step):
            hi = min(total, lo + step)
            pieces.append(
                self._targeted_call(
                    values,
                    frame[lo:hi],
                    draw[lo:hi],
                    cut[lo:hi],
                    start[lo:hi],
                    width[lo:hi],
                    max_width,
                )
            )
        return _cat(pieces)

    def next_rows(self, values: torch.Tensor, mask: torch.Tensor, coord: torch.Tensor) -> Answer:
        """Rows of width one from dense inputs the caller keeps: row ``s`` is the marginal of
        coordinate ``coord[s]`` given ``values[s]`` where ``mask[s]``, for draw ``s``.

        The sequential samplers with every draw in step keep their partial samples dense and
        ask this each step. The inputs are copied into fresh tensors first, so an oracle that
        writes into its inputs cannot change the caller's, unless the oracle borrows its inputs
        (:func:`~pyro_autospec.engine.protocols.borrows_inputs`): it then reads views of the
        caller's.

        Parameters
        ----------
        values : LongTensor[D, n]
        mask : BoolTensor[D, n]
        coord : LongTensor[D]

        Returns
        -------
        Answer
            ``[D, 1, q]``, checked and normalised as every other row.
        """
        total = values.shape[0]
        step = self._rows_per_call(1 if self.targeted else self.n)
        if self._lanes.numel() != total:  # the same every step: made once
            self._lanes = torch.arange(total, device=self.device)
        draws, valid = self._lanes, self._all_valid
        pieces = []
        for lo in range(0, total, step):
            hi = min(total, lo + step)
            begin = time.perf_counter()
            if self.borrows_inputs:
                vals, pinned = values[lo:hi], mask[lo:hi]
            else:
                vals = self._buffer(hi - lo, torch.long)
                vals.copy_(values[lo:hi])
                pinned = self._buffer(hi - lo, torch.bool)
                pinned.copy_(mask[lo:hi])
            self.seconds["inputs"] += time.perf_counter() - begin
            pieces.append(
                self._call_at(vals, pinned, coord[lo:hi].unsqueeze(1), draws[lo:hi], valid)
            )
        return _cat(pieces)

    def _targeted_call(self, values, frame, draw, cut, start, width, max_width) -> Answer:
        vals, mask = self._inputs(values, frame, draw, cut)
        offsets = torch.arange(max_width, device=self.device)
        pos = start.unsqueeze(1) + torch.minimum(offsets.unsqueeze(0), (width - 1).unsqueeze(1))
        targets = self.coords(draw, pos)
        return self._call_at(vals, mask, targets, draw, offsets.unsqueeze(0) < width.unsqueeze(1))

    def oracle_inputs(self, *inputs):
        """``inputs`` (tensors, and a dict of keyword tensors last) as the oracle gets them:
        ordinary tensors where it needs them (:func:`~pyro_autospec.engine.modes.
        foreign_inputs`; inference tensors are copied), else unchanged."""
        if not self.ordinary_inputs:
            return inputs
        return tuple(
            {k: ordinary(v) for k, v in x.items()} if isinstance(x, dict) else ordinary(x)
            for x in inputs
        )

    def invoke(self, method: str, *inputs, **extra):
        """The oracle's ``method`` called on ``inputs`` (``values`` and ``mask`` first, then
        the method's other tensors) and the keyword tensors ``extra``, as the engine calls
        every oracle: on ordinary tensors where it needs them (:meth:`oracle_inputs`), then
        as :meth:`invoke_made`."""
        if self.ordinary_inputs:
            *inputs, extra = self.oracle_inputs(*inputs, extra)
        return self.invoke_made(method, *inputs, **extra)

    def invoke_made(self, method: str, *inputs, **extra):
        """:meth:`invoke` on inputs made as the oracle gets them (in :attr:`tensor_mode`, or
        borrowed): in its mode (:func:`~pyro_autospec.engine.modes.calling`), with the check
        of borrowed inputs. Only the time inside the method counts as the oracle's
        (``seconds["oracle"]``): the copies and mode switches around it are the engine's."""
        with self._call_mode(inputs[0], inputs[1]):
            start = time.perf_counter()
            out = getattr(self.oracle, method)(*inputs, **extra)
            self.seconds["oracle"] += time.perf_counter() - start
        return out

    def _call_at(self, vals, mask, targets, draw, valid) -> Answer:
        """One call for the marginals of ``targets`` [R, W] given ``vals``, ``mask`` [R, n] of
        draws ``draw`` [R]; ``valid`` [R, W] (broadcast) marks the entries that are asked."""
        max_width = targets.shape[1]
        extra = {"draws": self.draw_ids[draw]} if self.family else {}
        if self.targeted:
            out = self.invoke("log_marginals_at", vals, mask, targets, **extra)
            self._check_output(out, (vals.shape[0], max_width, self.q), "log_marginals_at")
        else:
            out = self.invoke("log_marginals", vals, mask, **extra)
            self._check_output(out, (vals.shape[0], self.n, self.q), "log_marginals")
            out = out.gather(1, targets.unsqueeze(-1).expand(-1, -1, self.q))
        return _checked(out, valid)

    def _chains(self, values, frame, draw, cut, length, then_width=None):
        """Chains, in as few calls as padding allows (see :func:`width_groups`), and the
        rows after them (``then_width`` [C] targets each, 0 for none; only for an oracle with
        ``log_marginals_chain_then``): ``(chain Answer, then Answer or None)``."""
        if then_width is not None and not bool((then_width > 0).any()):
            then_width = None

        def ask(idx):
            then = None if then_width is None else then_width[idx]
            answers = self._chain_group(values, frame[idx], draw[idx], cut[idx], length[idx], then)
            return answers if then_width is not None else answers[:1]

        groups = width_groups(length)
        if len(groups) == 1:
            answers = ask(groups[0])
        else:
            widths = (length,) if then_width is None else (length, then_width.clamp(min=1))
            answers = _scatter_groups(groups, widths, self.q, ask)
        return answers[0], (answers[1] if then_width is not None else None)

    def _chain_group(self, values, frame, draw, cut, length, then_width=None):
        total = frame.numel()
        max_length = int(length.max())
        max_then = 0 if then_width is None else int(then_width.max())
        if then_width is not None and max_then == 0:  # no row after any chain of the group
            none = torch.zeros(total, 0, self.q, dtype=torch.float64, device=self.device)
            empty = Answer(none, none[..., 0] > 0, none[..., 0])
            return self._chain_group(values, frame, draw, cut, length)[0], empty
        step = self._rows_per_call(max_length + max_then)
        pieces, then_pieces = [], []
        offsets = torch.arange(max(max_length, max_then), device=self.device)
        for lo in range(0, total, step):
            hi = min(total, lo + step)
            part_frame, part_draw = frame[lo:hi], draw[lo:hi]
            part_cut, part_length = cut[lo:hi], length[lo:hi]
            vals, mask = self._inputs(values, part_frame, part_draw, part_cut)
            steps = offsets[:max_length].unsqueeze(0)
            pos = part_cut.unsqueeze(1) + torch.minimum(steps, (part_length - 1).unsqueeze(1))
            chain = self.coords(part_draw, pos)
            extra = {"draws": self.draw_ids[part_draw]} if self.family else {}
            if then_width is None:
                out = self.invoke("log_marginals_chain", vals, mask, chain, **extra)
            else:
                # the row after the chain reads on from its end; without one, a dummy: the
                # chain's last coordinate (pinned by the chain: a point mass)
                part_then = then_width[lo:hi]
                reach = torch.minimum(offsets[:max_then].unsqueeze(0), (part_then - 1).unsqueeze(1))
                pos = torch.where(
                    part_then > 0, part_cut + part_length, part_cut + part_length - 1
                ).unsqueeze(1)
                then = self.coords(part_draw, pos + reach.clamp(min=0))
                out, after = then_pair(
                    self.invoke("log_marginals_chain_then", vals, mask, chain, then, **extra)
                )
                self._check_output(
                    after, (part_frame.numel(), max_then, self.q), "log_marginals_chain_then"
                )
                then_pieces.append(_checked(after, offsets[:max_then] < part_then.unsqueeze(1)))
            self._check_output(out, (part_frame.numel(), max_length, self.q), "log_marginals_chain")
            pieces.append(_checked(out, offsets[:max_length] < part_length.unsqueeze(1)))
        return _cat(pieces), (_cat(then_pieces) if then_pieces else None)

    def _check_output(self, out, expected: tuple, name: str) -> None:
        if not isinstance(out, torch.Tensor):
            raise OracleError(f"oracle.{name} must return a torch.Tensor, got {type(out).__name__}")
        if tuple(out.shape) != expected:
            what, fix = {
                "log_marginals": ("num_coords", "the oracle's num_coords attribute"),
                "log_marginals_at": ("targets", "that it answers targets.shape[1] coordinates"),
                "log_marginals_chain": ("chain length", "that it answers chain.shape[1] steps"),
                "log_marginals_chain_then": (
                    "then length",
                    "that its second output answers then.shape[1] coordinates",
                ),
            }.get(name, ("targets", "the oracle's num_coords attribute"))
            raise OracleError(
                f"oracle.{name} returned shape {tuple(out.shape)} for {expected[0]} rows; "
                f"expected {expected} = (rows, {what}, num_values). Check {fix}, and its "
                "num_values attribute."
            )
        if not out.dtype.is_floating_point:
            raise OracleError(
                f"oracle.{name} must return floating point log probabilities, got {out.dtype}"
            )
        if out.layout != torch.strided:
            raise OracleError(
                f"oracle.{name} returned a tensor of layout {out.layout}; it must return a dense "
                f"tensor (call .to_dense() on it)"
            )
        if out.device != self.device and out.device.type != self.device.type:
            raise OracleError(
                f"oracle.{name} returned a tensor on {out.device}, but its inputs are on "
                f"{self.device}: return the output on the inputs' device (values.device), or "
                f"pass device= to the sampler to run where the oracle computes"
            )

    @staticmethod
    def raise_bad(answer: Answer, error: torch.Tensor, what: str, fields=None) -> None:
        """Raise :class:`OracleError` for the first True entry of ``error`` (BoolTensor[R, W]).

        ``what`` describes the rows, e.g. ``"row {row} of the verification"``: ``{row}`` and
        ``{target}`` are the entry's place in the answer, and ``fields(row, target)`` (a dict,
        optional) gives more names, such as the coordinate and the draw the entry is for.
        """
        if isinstance(error, torch.Tensor):
            if not bool(error.any()):
                return
            error = error.cpu().numpy()
        if not error.any():
            return
        r, k = (int(i) for i in np.argwhere(error)[0])
        mass = float(answer.log_mass[r, k])
        if mass != mass:
            problem = "contains NaN"
        elif mass == -float("inf"):
            problem = "gives zero mass to every value"
        elif mass == float("inf"):
            problem = "contains +inf"
        else:
            total = f"{math.exp(mass):.12g}" if mass < 700 else f"e^{mass:.6g}"
            problem = f"sums to {total} instead of 1 (the log of its sum is {mass:.3g})"
        hint = ""
        if problem.startswith("sums") and abs(mass) < 0.05:
            hint = (
                " A row off by this little was normalised in a lower precision than the dtype "
                "returned (a bfloat16 or float16 network cast up after log_softmax): return "
                "the network's own dtype, or cast its logits up before log_softmax."
            )
        elif problem.startswith("sums") and _probabilities(answer, r, k, mass):
            hint = (
                " Its entries lie in [0, 1] and add up to 1: it holds probabilities, not their "
                "logarithms. Return probs.log(), not log_softmax of them (normalised, but "
                "another law)."
            )
        raise OracleError(
            f"The oracle's {what.format(row=r, target=k, **(fields(r, k) if fields else {}))} "
            f"{problem}, although it is conditioned "
            "on an assignment of positive probability. The oracle must return log probabilities "
            "normalised over the values of each coordinate (use torch.log_softmax on logits; "
            f"-inf only for impossible values).{hint}"
        )


def _probabilities(answer: Answer, r: int, k: int, mass: float) -> bool:
    """Whether the oracle's own row ``(r, k)`` of ``answer`` (its normalised row plus its log
    mass) is a probability vector: entries in ``[0, 1]`` adding up to 1 (to ``1e-3``)."""
    row = answer.log_probs[r, k]
    row = row.cpu().numpy() if isinstance(row, torch.Tensor) else np.asarray(row)
    row = row + mass
    return bool(np.all((row >= 0) & (row <= 1)) and abs(row.sum() - 1) <= 1e-3)


#: What one more oracle call costs, in padded entries (a call has a fixed cost of some tens of
#: small tensor operations, about what a few thousand entries of work cost on a CPU).
CALL_COST = 4096


def host_width_groups(width: np.ndarray) -> list[np.ndarray]:
    """Split requests of widths ``width`` (int ndarray [R]) into groups, each asked in one
    call padded to its widest, minimising ``sum over groups (CALL_COST + count * widest)``.

    Requests are first binned by powers of two (widths 1, 2, 3-4, 5-8, ...), then adjacent
    bins are merged by dynamic programming over the bins (at most ~20 of them).

    Returns
    -------
    list of int64 ndarray
        Indices of the requests of each group.

    Examples
    --------
    >>> [g.tolist() for g in host_width_groups(np.array([1, 2, 1]))]
    [[0, 1, 2]]
    """
    width = np.asarray(width)
    everyone = [np.arange(width.size)]
    if width.size * int(width.max()) <= CALL_COST:  # any split costs more than one call
        return everyone
    bins = np.ceil(np.log2(width.astype(np.float64))).astype(np.int64)
    labels, counts = np.unique(bins, return_counts=True)
    if labels.size == 1:
        return everyone
    widest = [int(2**label) for label in labels.tolist()]  # bound on a bin's widest request
    counts = counts.tolist()
    num_bins = len(widest)
    best = [0.0] + [float("inf")] * num_bins
    cut = [0] * (num_bins + 1)
    for end in range(1, num_bins + 1):  # best[end]: bins [0, end) grouped; last [first, end)
        for first in range(end):
            cost = best[first] + CALL_COST + sum(counts[first:end]) * widest[end - 1]
            if cost < best[end]:
                best[end], cut[end] = cost, first
    bounds, end = [], num_bins
    while end > 0:
        bounds.append((cut[end], end))
        end = cut[end]
    return [
        np.flatnonzero((bins >= labels[first]) & (bins <= labels[last - 1]))
        for first, last in reversed(bounds)
    ]


def width_groups(width: torch.Tensor) -> list[torch.Tensor]:
    """:func:`host_width_groups` of a LongTensor of widths: index tensors on its device."""
    groups = host_width_groups(width.cpu().numpy())
    if len(groups) == 1:
        return [torch.arange(width.numel(), device=width.device)]
    return [torch.from_numpy(g).to(width.device) for g in groups]


def _scatter_groups(groups, widths: tuple[torch.Tensor, ...], q: int, ask) -> list[Answer]:
    """Ask every group (``ask(idx)``: one Answer per entry of ``widths``) and place the
    answers back in request order, each padded to the widest of its ``widths``."""
    answers = [ask(idx) for idx in groups]
    return [
        _assemble([(idx, answer[k]) for idx, answer in zip(groups, answers)], width, q)
        for k, width in enumerate(widths)
    ]


def _empty_answer(like, total: int, width: int, q: int) -> Answer:
    """An all-padding Answer ``[total, width, q]``: tensors on ``like``'s device, or host
    arrays if ``like`` is one."""
    if isinstance(like, torch.Tensor):
        device = like.device

        def zeros(shape, dtype):
            return torch.zeros(shape, dtype=dtype, device=device)

        real, flag = torch.float64, torch.bool
    else:
        zeros, real, flag = np.zeros, np.float64, bool
    rows = (total, width)
    return Answer(zeros((*rows, q), real), zeros(rows, flag), zeros(rows, real))


def place_answers(parts: list[tuple[object, Answer]], total: int, width: int, q: int) -> Answer:
    """Answers of parts of ``total`` requests in request order, each padded (or cut) to
    ``width`` entries (padding: ``bad`` False, probabilities 0).

    ``parts`` are ``(index, Answer)`` pairs: ``index`` (indices, or a boolean mask over the
    requests) says which requests a part answers. Tensors or host arrays, as the parts are.
    """
    out = _empty_answer(parts[0][1].log_probs, total, width, q)
    for index, part in parts:
        kept = min(width, part.log_probs.shape[1])
        out.log_probs[index, :kept] = part.log_probs[:, :kept]
        out.bad[index, :kept] = part.bad[:, :kept]
        out.log_mass[index, :kept] = part.log_mass[:, :kept]
    return out


def _assemble(parts: list[tuple[torch.Tensor, Answer]], width: torch.Tensor, q: int) -> Answer:
    """Answers of parts of the requests (``(indices, Answer)`` pairs) in request order, padded
    to the widest of ``width`` [R] (padding: ``bad`` False)."""
    return place_answers(parts, width.numel(), int(width.max()), q)


def normalise_rows(out: np.ndarray, valid: np.ndarray, tol: float) -> Answer:
    """Check and normalise an oracle's rows on the host: an :class:`Answer` of arrays.

    ``out`` float ndarray [R, W, q] (log probabilities), ``valid`` bool ndarray [R, W]
    (broadcast; the entries asked), ``tol`` how far the log of a row's sum may stray from 0
    (:func:`_tolerance`). The log of each row's sum is ``NaN`` if an entry is NaN, ``+inf``
    if one is ``+inf``, ``-inf`` if every entry is ``-inf``: one comparison flags a NaN,
    ``+inf``, massless or unnormalised row. Rows are renormalised in float64, laid out row
    after row whatever the layout of ``out`` (NumPy sums a contiguous row pairwise, a strided
    one in sequence), so a row's rounding does not depend on how the oracle stored it.
    """
    out = np.ascontiguousarray(out, dtype=np.float64)
    top = out.max(-1, keepdims=True)
    # a NaN, +inf or massless row warns in the arithmetic below and has its top zeroed; rows
    # with a finite top entry need neither (the common case: no errstate to enter)
    guarded = not np.isfinite(top).all()
    with np.errstate(all="ignore") if guarded else contextlib.nullcontext():
        if guarded:
            top[~np.isfinite(top)] = 0.0
        log_mass = np.log(np.exp(out - top).sum(-1)) + top[..., 0]
        bad = ~(np.abs(log_mass) <= tol) & valid
        return Answer(out - log_mass[..., None], bad, log_mass)


def _checked(out: torch.Tensor, valid: torch.Tensor) -> Answer:
    tol = _tolerance(out.dtype)
    out = out.detach().to(torch.float64)
    if out.device.type == "cpu":  # the host plane's arithmetic, so both read the same bits
        answer = normalise_rows(out.numpy(), valid.numpy(), tol)
        parts = (answer.log_probs, answer.bad, answer.log_mass)
        return Answer(*(torch.from_numpy(x) for x in parts))
    # logsumexp is NaN if an entry is NaN, +inf if one is +inf (and none is NaN), -inf if
    # every entry is -inf: one comparison flags a NaN, +inf, massless or unnormalised row.
    log_mass = torch.logsumexp(out, dim=-1)
    bad = ~(log_mass.abs() <= tol) & valid
    return Answer(out - log_mass.unsqueeze(-1), bad, log_mass)


def _cat(pieces: list[Answer]) -> Answer:
    if len(pieces) == 1:
        return pieces[0]
    width = max(p.log_probs.shape[1] for p in pieces)

    def pad(t: torch.Tensor, fill) -> torch.Tensor:
        extra = width - t.shape[1]
        if extra == 0:
            return t
        shape = (t.shape[0], extra, *t.shape[2:])
        return torch.cat([t, torch.full(shape, fill, dtype=t.dtype, device=t.device)], 1)

    return Answer(
        torch.cat([pad(p.log_probs, 0.0) for p in pieces]),
        torch.cat([pad(p.bad, False) for p in pieces]),
        torch.cat([pad(p.log_mass, 0.0) for p in pieces]),
    )


def _regroup(flat: Answer, c, offset, num: int, width: int) -> Answer:
    """Width-1 rows ``flat`` of chain ``c`` at ``offset`` into ``[num, width, q]`` (tensors or
    host arrays, as ``flat``)."""
    out = _empty_answer(flat.log_probs, num, width, flat.log_probs.shape[-1])
    out.log_probs[c, offset] = flat.log_probs[:, 0]
    out.bad[c, offset] = flat.bad[:, 0]
    out.log_mass[c, offset] = flat.log_mass[:, 0]
    return out
