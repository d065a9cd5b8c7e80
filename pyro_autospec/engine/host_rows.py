"""The oracle's rows for a host control plane: requests and answers as NumPy arrays.

:class:`HostRows` answers the requests of a round of the host control plane
(:class:`~pyro_autospec.engine.host_plane.TokenSampler`), which keeps every draw's state on the
host. The requests are the same as :class:`~pyro_autospec.engine.rows.OracleRows`'s (targeted
rows and chains along the draws' orders, see there); what differs is where the bookkeeping
runs. Per oracle call the data plane is:

1. the dense inputs built on the host (values, mask, the coordinates asked), uploaded to the
   oracle's device (nothing to copy on a CPU: the oracle reads the host's arrays), each made
   in the tensor mode the oracle needs (:attr:`~pyro_autospec.engine.rows.OracleRows.
   tensor_mode`), so that no call converts them again;
2. the oracle's batched call;
3. one copy of its output back to the host.

Grouping requests by width, splitting calls to the memory budget, checking every row (NaN,
``+inf``, no mass, far from summing to one) and normalising it in float64 all run on the host,
with :func:`~pyro_autospec.engine.rows.normalise_rows`, the function the tensor path uses on a
CPU: both engines read the same bits on one machine.

The visiting orders of the draws in flight, and the ranks of their coordinates, live here on
the host (:meth:`HostRows.start`), computed from the draws' keys as
:class:`~pyro_autospec.engine.rows.VisitOrders` does.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import numpy as np
import torch

from pyro_autospec.engine.rows import (
    Answer,
    OracleRows,
    _regroup,
    _tolerance,
    host_width_groups,
    normalise_rows,
    place_answers,
    then_pair,
)

__all__ = ["FreshInputs", "HostRows"]


class FreshInputs:
    """The inputs of one call of an oracle that does not borrow them: new tensors each call,
    over memory used again only where nothing is left of the last call's tensors.

    Such an oracle may keep its inputs (a cache of its last call) or write into them, so every
    call must get inputs that nothing else holds or writes. New arrays for every call cost an
    allocation, whose pages glibc may fault in again each time; most oracles keep nothing. So
    the tensors are new objects every call (nothing an oracle hangs on a tensor object, nor a
    weak reference to one, can meet the next call), made over the last call's buffers when no
    tensor or storage made over them is left: a tensor made by ``torch.from_numpy`` holds its
    array until its storage dies, so the array's reference count says whether anything still
    reads it (a reference to a tensor, a view, a NumPy array of one, its storage, an autograd
    graph that saved it). Else new buffers are made, and the old ones are never written
    again. An oracle that moves its inputs' memory (``share_memory_()``, pickling for another
    process) lets go of the buffer, which may then be filled again: what it moved is a copy.

    Parameters
    ----------
    make : callable
        Makes the oracle's tensors of NumPy arrays (``make(*arrays) -> tuple``, in the
        engine's tensor mode); a tensor that shares an array's memory holds a reference to it.

    Examples
    --------
    >>> import numpy as np
    >>> inputs = FreshInputs(lambda *arrays: tuple(map(torch.from_numpy, arrays)))
    >>> values = np.arange(6).reshape(2, 3)
    >>> first = inputs.fill(values)[0].data_ptr()  # read and let go
    >>> inputs.fill(values + 1)[0].data_ptr() == first  # a new tensor, the same memory
    True
    >>> kept, = inputs.fill(values)  # held from here on
    >>> again, = inputs.fill(values + 1)  # so new memory
    >>> kept.tolist(), again.tolist()
    ([[0, 1, 2], [3, 4, 5]], [[1, 2, 3], [4, 5, 6]])
    """

    def __init__(self, make: Callable[..., tuple[torch.Tensor, ...]]):
        self.make = make
        self.buffers: tuple[np.ndarray, ...] = ()
        self.counts: list[int] = []

    def _counts(self) -> list[int]:
        # the references to each buffer as this method sees them (compared only with its own)
        return [sys.getrefcount(buffer) for buffer in self.buffers]

    def _unheld(self, specs: tuple[tuple[tuple[int, ...], np.dtype], ...]) -> bool:
        # counted first: a loop variable below would be one more reference
        if self._counts() != self.counts or len(specs) != len(self.buffers):
            return False
        return all(
            b.shape == tuple(shape) and b.dtype == dtype
            for (shape, dtype), b in zip(specs, self.buffers)
        )

    def take(self, *specs: tuple[tuple[int, ...], np.dtype]) -> tuple[np.ndarray, ...]:
        """Buffers of these ``(shape, dtype)`` that nothing else holds or reads, for the caller
        to write whole before :meth:`tensors`."""
        if not self._unheld(specs):
            self.buffers = tuple(np.empty(shape, dtype=dtype) for shape, dtype in specs)
            self.counts = self._counts()  # before any tensor is made over them
        return self.buffers

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """New tensors over the buffers, for one call."""
        return self.make(*self.buffers)

    def fill(self, *arrays: np.ndarray) -> tuple[torch.Tensor, ...]:
        """New tensors holding copies of ``arrays`` (any shapes and dtypes; the same ones from
        call to call keep the buffers), that nothing else holds or writes."""
        buffers = self.take(*((array.shape, array.dtype) for array in arrays))
        for buffer, array in zip(buffers, arrays):
            np.copyto(buffer, array)
        return self.tensors()


def _placed(parts: list[tuple[np.ndarray, Answer]], total: int, width: int, q: int) -> Answer:
    """Answers of parts of ``total`` requests (``(indices, Answer)`` pairs) in request order,
    padded to ``width`` (:func:`~pyro_autospec.engine.rows.place_answers`; one part that
    answers every request in order is returned as it is)."""
    if len(parts) == 1 and parts[0][1].log_probs.shape[1] == width:
        index, answer = parts[0]
        if index.size == total and (index == np.arange(total)).all():
            return answer
    return place_answers(parts, total, width, q)


class HostRows:
    """Batched, checked oracle queries whose requests and answers are host arrays.

    Parameters
    ----------
    rows : OracleRows
        The oracle, its capabilities, the memory budget (``max_elements``), the draws' global
        numbers and the timing counters; its own lanes are not used.
    lanes : int
        How many draws may be in flight at once.

    Attributes
    ----------
    orders : int64 ndarray [lanes, n]
        ``orders[lane, j]``: the coordinate visited ``j``-th by the draw in ``lane``.
    ranks : int16 or int32 ndarray [lanes, n]
        ``ranks[lane, i]``: when the draw in ``lane`` visits coordinate ``i``.
    draw_in : int64 ndarray [lanes]
        The draw in each lane (local number), ``-1`` for a free lane.
    """

    #: Whether the oracle reads the host's arrays in place on a CPU (the tests turn it off to
    #: run the upload path of other devices on a CPU).
    zero_copy = True
    #: Rows per run of one lane from which a call's inputs are filled run by run.
    RUN = 8
    #: Row counts of calls whose input buffers are kept for the next call of that size, and
    #: the bytes they may hold together (a call's own buffers are kept whatever their size).
    POOLS = 8
    POOL_BYTES = 2**26

    def __init__(self, rows: OracleRows, lanes: int):
        self.rows = rows
        self.oracle = rows.oracle
        self.n = n = rows.n
        self.q = rows.q
        self.device = rows.device
        self.on_cpu = self.device.type == "cpu" and self.zero_copy
        self.source = rows.source.to("cpu")
        self.orders = np.zeros((lanes, n), dtype=np.int64)
        self.ranks = np.zeros((lanes, n), dtype=np.int16 if n < 2**15 else np.int32)
        self.draw_in = np.full(lanes, -1, dtype=np.int64)
        self._positions = np.arange(n, dtype=self.ranks.dtype)
        self.draw_ids = rows.draw_ids.cpu().numpy()
        self._pools: dict[int, FreshInputs] = {}

    def start(self, lanes: np.ndarray, draws: np.ndarray) -> None:
        """The draws ``draws`` (local numbers) start in ``lanes``: compute their orders."""
        draws = np.asarray(draws, dtype=np.int64)
        order = self.source.of(torch.from_numpy(draws)).numpy()
        self.orders[lanes] = order
        self.ranks[lanes[:, None], order] = self._positions
        self.draw_in[lanes] = draws

    def finish(self, lanes: np.ndarray) -> None:
        """The draws in ``lanes`` finished: the lanes are free."""
        self.draw_in[lanes] = -1

    # ------------------------------------------------------------------------ the calls
    def _buffer(self, rows: int, dtype) -> np.ndarray:
        """A fresh ``[rows, n]`` array for one call's inputs: an oracle may keep its inputs
        (a cache of its last call), so they are never written again."""
        return np.empty((rows, self.n), dtype=dtype)

    def _fresh(self, rows: int) -> FreshInputs:
        """The buffers of calls of ``rows`` rows on a CPU (:class:`FreshInputs`), kept for the
        :attr:`POOLS` row counts last asked, within :attr:`POOL_BYTES`."""
        fresh = self._pools.pop(rows, None)
        if fresh is None:  # a new size: the sizes least recently asked make room (the pools'
            # bytes change only here, a pool's buffers keeping their size)
            kept = sum(b.nbytes for pool in self._pools.values() for b in pool.buffers)
            while self._pools and (len(self._pools) >= self.POOLS or kept > self.POOL_BYTES):
                oldest = self._pools.pop(next(iter(self._pools)))
                kept -= sum(b.nbytes for b in oldest.buffers)
            fresh = FreshInputs(self._up_all)
        self._pools[rows] = fresh  # the last asked, last
        return fresh

    def _up_all(self, *arrays: np.ndarray) -> tuple[torch.Tensor, ...]:
        """``arrays`` (fresh: nothing else writes them) as the oracle gets them, on its
        device, in one switch of the tensor mode."""
        with self.rows.tensor_mode():
            tensors = tuple(torch.from_numpy(array) for array in arrays)
            return tensors if self.on_cpu else tuple(t.to(self.device) for t in tensors)

    def _up(self, array: np.ndarray) -> torch.Tensor:
        """:meth:`_up_all` of one array."""
        return self._up_all(array)[0]

    def _inputs(self, frames, lane, cut) -> tuple[torch.Tensor, torch.Tensor]:
        """Dense ``values`` LongTensor[R, n] and ``mask`` BoolTensor[R, n] on the device."""
        start = time.perf_counter()
        if self.on_cpu:  # the oracle reads these: buffers that nothing else holds
            fresh = self._fresh(lane.size)
            values, mask = fresh.take(((lane.size, self.n), np.int64), ((lane.size, self.n), bool))
        else:
            mask = self._buffer(lane.size, bool)
        cut = cut.astype(self.ranks.dtype)  # a mixed-type comparison casts every rank first
        steps = np.diff(lane)
        # consecutive lanes (every draw in step, or a chunk of them) are read as a slice, not
        # gathered; runs of rows of one lane (a chain asked row by row) broadcast that lane's
        # arrays into the run instead of gathering a copy per row
        consecutive = lane.size > 0 and lane[-1] - lane[0] == lane.size - 1 and (steps == 1).all()
        rows = slice(int(lane[0]), int(lane[-1]) + 1) if consecutive else lane
        ends = np.flatnonzero(steps) + 1
        runs = not consecutive and lane.size >= self.RUN * (ends.size + 1)
        bounds = list(zip([0, *ends.tolist()], [*ends.tolist(), lane.size])) if runs else []
        if runs:
            for a, b in bounds:
                np.less(self.ranks[lane[a]], cut[a:b, None], out=mask[a:b])
        else:
            np.less(self.ranks[rows], cut[:, None], out=mask)
        if self.on_cpu:
            if runs:
                for a, b in bounds:
                    values[a:b] = frames[lane[a]]
            else:
                torch.from_numpy(values).copy_(torch.from_numpy(frames[rows]))
            up = fresh.tensors()
        else:  # upload the narrow values, widen them on the device
            with self.rows.tensor_mode():
                up = torch.from_numpy(frames[rows]).to(self.device).long(), self._up(mask)
        self.rows.seconds["inputs"] += time.perf_counter() - start
        return up

    def _extra(self, draw: np.ndarray) -> dict:
        return {"draws": self._up(self.draw_ids[draw])} if self.rows.family else {}

    @staticmethod
    def to_host(out: torch.Tensor) -> tuple[np.ndarray, float]:
        """One copy of the oracle's output to the host.

        Parameters
        ----------
        out : floating Tensor [R, W, q]
            The oracle's rows, on any device, in any floating dtype.

        Returns
        -------
        host : float32 or float64 ndarray [R, W, q]
            The rows on the host (other dtypes widened to float64), a view where ``out``
            already is one on the CPU.
        tol : float
            How far the log of a row's sum may stray from 0
            (:func:`~pyro_autospec.engine.rows._tolerance` of the output's own dtype).
        """
        tol = _tolerance(out.dtype)
        if out.requires_grad:
            out = out.detach()
        if not out.is_cpu:
            out = out.cpu()
        if out.dtype not in (torch.float32, torch.float64):
            out = out.double()
        return out.numpy(), tol

    def _answer(self, out: torch.Tensor, valid: np.ndarray) -> Answer:
        """One copy of the oracle's output to the host, checked and normalised there."""
        host, tol = self.to_host(out)
        return normalise_rows(host, valid, tol)

    def _targeted_call(self, frames, lane, draw, cut, start, width, max_width) -> Answer:
        valid = np.arange(max_width)[None, :] < width[:, None]
        out = self.targeted_call_out(frames, lane, draw, cut, start, width, max_width)
        return self._answer(out, valid)

    def targeted_call_out(self, frames, lane, draw, cut, start, width, max_width) -> torch.Tensor:
        """The oracle's rows of one call as it returned them ([R, max_width, q]; see
        :meth:`ask` for the arguments), from fresh inputs."""
        values, mask = self._inputs(frames, lane, cut)
        offsets = np.arange(max_width)
        pos = start[:, None] + np.minimum(offsets[None, :], width[:, None] - 1)
        targets = self._up(self.orders[lane[:, None], pos])
        return self.targeted_out(values, mask, targets, self._extra(draw))

    def _targeted_rows(self, values, mask, targets, valid, extra: dict) -> Answer:
        """One call for the rows of ``targets`` (LongTensor[R, W]) given ``values`` and
        ``mask`` ([R, n], on the oracle's device), checked and normalised on the host
        (``valid`` bool ndarray [R, W], broadcast: the entries asked); ``extra`` the
        keywords of a family's draws (:meth:`_extra`)."""
        return self._answer(self.targeted_out(values, mask, targets, extra), valid)

    def targeted_out(self, values, mask, targets, extra: dict) -> torch.Tensor:
        """The oracle's rows of ``targets`` as it returned them ([R, W, q], shape checked;
        not yet normalised): :meth:`_targeted_rows` before the check of their values."""
        rows, max_width, check = values.shape[0], targets.shape[1], self.rows._check_output
        if self.rows.targeted:
            out = self.rows.invoke_made("log_marginals_at", values, mask, targets, **extra)
            check(out, (rows, max_width, self.q), "log_marginals_at")
            return out
        out = self.rows.invoke_made("log_marginals", values, mask, **extra)
        check(out, (rows, self.n, self.q), "log_marginals")
        return out.gather(1, targets.unsqueeze(-1).expand(-1, -1, self.q))

    def _chain_call(self, frames, lane, draw, cut, length, then_width) -> tuple:
        """One call for chains (and the rows after them where ``then_width`` is not None)."""
        max_length = int(length.max())
        max_then = 0 if then_width is None else int(then_width.max())
        values, mask = self._inputs(frames, lane, cut)
        steps = np.arange(max(max_length, max_then))
        pos = cut[:, None] + np.minimum(steps[None, :max_length], length[:, None] - 1)
        chain = self._up(self.orders[lane[:, None], pos])
        valid = steps[None, :max_length] < length[:, None]
        rows, check = lane.size, self.rows._check_output
        if max_then == 0:
            out = self.rows.invoke_made(
                "log_marginals_chain", values, mask, chain, **self._extra(draw)
            )
            check(out, (rows, max_length, self.q), "log_marginals_chain")
            return self._answer(out, valid), None
        # the row after the chain reads on from its end; without one, a dummy: the chain's
        # last coordinate (pinned by the chain: a point mass)
        reach = np.maximum(np.minimum(steps[None, :max_then], then_width[:, None] - 1), 0)
        first = np.where(then_width > 0, cut + length, cut + length - 1)
        then = self._up(self.orders[lane[:, None], first[:, None] + reach])
        out, after = then_pair(
            self.rows.invoke_made(
                "log_marginals_chain_then", values, mask, chain, then, **self._extra(draw)
            )
        )
        check(after, (rows, max_then, self.q), "log_marginals_chain_then")
        check(out, (rows, max_length, self.q), "log_marginals_chain")
        then_valid = steps[None, :max_then] < then_width[:, None]
        return self._answer(out, valid), self._answer(after, then_valid)

    def _per_call(self, outputs: int) -> int:
        return self.rows._rows_per_call(outputs)

    # ------------------------------------------------------------------------ requests
    def _targeted(self, frames, lane, draw, cut, start, width) -> Answer:
        """Targeted rows ``[R, max width, q]``, width groups each in as few calls as fit."""
        parts = []
        for group in host_width_groups(width):
            g_width = width[group]
            max_width = int(g_width.max())
            step = self._per_call(max_width if self.rows.targeted else self.n)
            for lo in range(0, group.size, step):
                idx = group[lo : lo + step]
                answer = self._targeted_call(
                    frames, lane[idx], draw[idx], cut[idx], start[idx], width[idx], max_width
                )
                parts.append((idx, answer))
        return _placed(parts, width.size, int(width.max()), self.q)

    def _chains(self, frames, lane, draw, cut, length, then_width):
        """Native chains ``[C, max length, q]`` and the rows after them (``[C, max then, q]``,
        ``None`` if no chain has one)."""
        if then_width is not None and not (then_width > 0).any():
            then_width = None
        parts, then_parts = [], []
        for group in host_width_groups(length):
            group_then = None if then_width is None else then_width[group]
            outputs = int(length[group].max()) + (
                0 if group_then is None else int(group_then.max())
            )
            step = self._per_call(outputs)
            for lo in range(0, group.size, step):
                idx = group[lo : lo + step]
                then = None if then_width is None else then_width[idx]
                chain, after = self._chain_call(
                    frames, lane[idx], draw[idx], cut[idx], length[idx], then
                )
                parts.append((idx, chain))
                if after is not None:
                    then_parts.append((idx, after))
        chain = _placed(parts, length.size, int(length.max()), self.q)
        if then_width is None:
            return chain, None
        return chain, _placed(then_parts, length.size, int(then_width.max()), self.q)

    def ask(self, frames: np.ndarray, rows=None, chains=None) -> tuple:
        """Answer the targeted rows and chains of one round.

        Parameters
        ----------
        frames : integer ndarray [L, n]
            The partial samples of the lanes, in coordinate indexing (unpinned entries are
            ignored).
        rows : (lane, draw, cut, start, width), each int64 ndarray [R], optional
            Targeted rows: conditioning on ``order[lane, :cut]`` of ``frames[lane]``, the
            marginals of positions ``start .. start + width - 1``; ``draw`` is the lane's draw
            (local number).
        chains : (lane, draw, cut, length, then_width), each int64 ndarray [C], optional
            Chains: for ``j < length``, the marginal of position ``cut + j`` given
            ``order[lane, :cut + j]``; and, where ``then_width > 0`` (only for an oracle with
            ``log_marginals_chain_then``), the ``then_width`` positions after the chain,
            conditioned on the whole chain.

        Returns
        -------
        row_answer, chain_answer, then_answer : Answer (host arrays) or None
            ``[R, max width, q]``, ``[C, max length, q]`` and ``[C, max then_width, q]``.
        """
        self.rows.calls += 1
        has_rows = rows is not None and rows[0].size > 0
        has_chains = chains is not None and chains[0].size > 0
        for request in (rows if has_rows else None, chains if has_chains else None):
            if request is not None and not (self.draw_in[request[0]] == request[1]).all():
                raise RuntimeError("internal error: a request for a draw that is not in flight")
        row_answer = chain_answer = then_answer = None
        if has_chains and not self.rows.native_chains:
            lane, draw, cut, length, then_width = chains
            if (then_width > 0).any():
                raise RuntimeError("internal error: rows after chains need chain_then")
            # each chain as width-1 rows, asked with the targeted rows
            chain = np.repeat(np.arange(length.size), length)
            offset = np.arange(chain.size) - np.repeat(np.cumsum(length) - length, length)
            step = cut[chain] + offset
            expanded = (lane[chain], draw[chain], step, step, np.ones_like(step))
            if has_rows:
                merged = tuple(np.concatenate([r, e]) for r, e in zip(rows, expanded))
            else:
                merged = expanded
            answer = self._targeted(frames, *merged)
            split = rows[0].size if has_rows else 0
            if has_rows:
                row_answer = answer.part(slice(0, split))
            flat = answer.part(slice(split, None))
            chain_answer = _regroup(flat, chain, offset, length.size, int(length.max()))
            return row_answer, chain_answer, None
        if has_rows:
            row_answer = self._targeted(frames, *rows)
        if has_chains:
            chain_answer, then_answer = self._chains(frames, *chains)
        return row_answer, chain_answer, then_answer
