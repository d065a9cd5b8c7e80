"""Asking a :class:`~pyro_autospec.oracles.base.MarginalOracle` for rows, in batches, checked.

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

The dense ``[rows, n]`` inputs of the protocol are built in buffers reused from call to call:
on a CPU a fresh allocation of that size costs more than filling it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from pyro_autospec.engine.errors import OracleError
from pyro_autospec.engine.modes import calling
from pyro_autospec.engine.tables import ragged, take
from pyro_autospec.oracles._util import logsumexp
from pyro_autospec.oracles.base import (
    has_chain_marginals,
    has_chain_then,
    has_targeted_marginals,
    oracle_num_draws,
)

__all__ = ["OracleRows", "Answer"]


@dataclass
class Answer:
    """Checked rows: ``log_probs`` DoubleTensor[R, W, q] (normalised), ``bad`` BoolTensor[R, W]
    and ``log_mass`` DoubleTensor[R, W] (the oracle's own total, for messages). Entries past a
    request's width are padding (``bad`` False)."""

    log_probs: torch.Tensor
    bad: torch.Tensor
    log_mass: torch.Tensor

    def part(self, index) -> Answer:
        """The requests ``index`` (a slice or an index tensor) of this answer."""
        return Answer(self.log_probs[index], self.bad[index], self.log_mass[index])


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
    orders : LongTensor[D, n]
        ``orders[s, j]``: the coordinate visited ``j``-th by draw ``s``.
    device : torch.device
        Where queries are built (the oracle's device).
    max_elements : int
        Largest number of entries (inputs ``n`` plus outputs ``width * q`` per row) of one
        oracle call; larger rounds are cut into several calls (one round all the same).
    draw_ids : LongTensor[D], optional
        Global numbers of the draws (what a family oracle receives as ``draws``); default
        ``0 .. D - 1``.
    """

    def __init__(
        self,
        oracle,
        orders: torch.Tensor,
        device: torch.device,
        max_elements: int,
        draw_ids: torch.Tensor | None = None,
    ):
        self.oracle = oracle
        self.device = device
        self.orders = orders.to(device).contiguous()
        self.n = int(oracle.num_coords)
        self.q = int(oracle.num_values)
        rank_dtype = torch.int16 if self.n < 2**15 else torch.int32
        ranks = torch.empty_like(self.orders)
        ranks.scatter_(1, self.orders, torch.arange(self.n, device=device).expand_as(self.orders))
        self.ranks = ranks.to(rank_dtype)
        self.max_elements = int(max_elements)
        self.targeted = has_targeted_marginals(oracle)
        self.native_chains = has_chain_marginals(oracle)
        self.native_then = has_chain_then(oracle)
        self.family = oracle_num_draws(oracle) is not None
        self.draw_ids = (
            torch.arange(self.orders.shape[0], device=device)
            if draw_ids is None
            else draw_ids.to(device)
        )
        self.calls = 0
        #: Host seconds spent building the protocol's dense inputs, inside the oracle's
        #: methods, and checking its answers (for benchmarks; without GPU synchronisation).
        self.seconds = {"inputs": 0.0, "oracle": 0.0}
        # The engine runs in inference mode; an oracle that is not inference-safe runs out of
        # it, in the grad mode of the caller of the sampler (an oracle may differentiate
        # internally, e.g. the compiled EnumOracle).
        self.grad_enabled = torch.is_grad_enabled()
        self._call_mode = calling(oracle, self.grad_enabled)
        self._buffers: dict[tuple, torch.Tensor] = {}
        self._lanes = torch.zeros(0, dtype=torch.long, device=device)  # see next_rows
        self._all_valid = torch.ones(1, 1, dtype=torch.bool, device=device)

    # ------------------------------------------------------------------------ buffers
    def coords(self, draw: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Coordinates ``orders[draw[k], pos[k, ...]]``: LongTensor of the shape of ``pos``
        [K] or [K, W] (``draw`` [K]), by one flat gather (:func:`take`)."""
        return take(self.orders, draw, pos)

    def _buffer(self, name: str, rows: int, dtype: torch.dtype) -> torch.Tensor:
        key = (name, dtype)
        buf = self._buffers.get(key)
        if buf is None or buf.shape[0] < rows:
            buf = torch.empty(
                max(rows, 2 * (0 if buf is None else buf.shape[0])),
                self.n,
                dtype=dtype,
                device=self.device,
            )
            self._buffers[key] = buf
        return buf[:rows]

    def _inputs(
        self, values: torch.Tensor, frame: torch.Tensor, draw: torch.Tensor, cut: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Dense ``values`` LongTensor[R, n] and ``mask`` BoolTensor[R, n] of ``R`` rows."""
        start = time.perf_counter()
        rows = frame.numel()
        out = self._buffer("values", rows, torch.long)
        if values.dtype == torch.long:
            torch.index_select(values, 0, frame, out=out)
        else:
            out.copy_(torch.index_select(values, 0, frame))
        mask = self._buffer("mask", rows, torch.bool)
        ranks = torch.index_select(self.ranks, 0, draw)
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
                merged = tuple(torch.cat([r, e]) for r, e in zip(rows, expanded))
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
            ci = attached.nonzero().flatten()
            parts.append((row_of[ci], then_answer.part(ci)))
        asked = torch.ones(frame.numel(), dtype=torch.bool, device=self.device)
        asked[row_of[attached]] = False
        ri = asked.nonzero().flatten()
        if ri.numel():
            parts.append((ri, self._targeted(values, *(x[ri] for x in rows))))
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
        ask this each step. The inputs are copied into reused buffers first, so an oracle that
        writes into its inputs cannot change the caller's.

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
            vals = self._buffer("values", hi - lo, torch.long)
            vals.copy_(values[lo:hi])
            pinned = self._buffer("mask", hi - lo, torch.bool)
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

    def _call_at(self, vals, mask, targets, draw, valid) -> Answer:
        """One call for the marginals of ``targets`` [R, W] given ``vals``, ``mask`` [R, n] of
        draws ``draw`` [R]; ``valid`` [R, W] (broadcast) marks the entries that are asked."""
        max_width = targets.shape[1]
        extra = {"draws": self.draw_ids[draw]} if self.family else {}
        start = time.perf_counter()
        if self.targeted:
            with self._call_mode():
                out = self.oracle.log_marginals_at(vals, mask, targets, **extra)
            self.seconds["oracle"] += time.perf_counter() - start
            self._check_output(out, (vals.shape[0], max_width, self.q), "log_marginals_at")
        else:
            with self._call_mode():
                out = self.oracle.log_marginals(vals, mask, **extra)
            self.seconds["oracle"] += time.perf_counter() - start
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
            tw = None if then_width is None else then_width[idx]
            answers = self._chain_group(values, frame[idx], draw[idx], cut[idx], length[idx], tw)
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
            f, d, c, ln = frame[lo:hi], draw[lo:hi], cut[lo:hi], length[lo:hi]
            vals, mask = self._inputs(values, f, d, c)
            steps = offsets[:max_length].unsqueeze(0)
            pos = c.unsqueeze(1) + torch.minimum(steps, (ln - 1).unsqueeze(1))
            chain = self.coords(d, pos)
            extra = {"draws": self.draw_ids[d]} if self.family else {}
            start = time.perf_counter()
            if then_width is None:
                with self._call_mode():
                    out = self.oracle.log_marginals_chain(vals, mask, chain, **extra)
            else:
                # the row after the chain reads on from its end; without one, a dummy: the
                # chain's last coordinate (pinned by the chain: a point mass)
                tw = then_width[lo:hi]
                reach = torch.minimum(offsets[:max_then].unsqueeze(0), (tw - 1).unsqueeze(1))
                pos = torch.where(tw > 0, c + ln, c + ln - 1).unsqueeze(1)
                then = self.coords(d, pos + reach.clamp(min=0))
                with self._call_mode():
                    out, after = self.oracle.log_marginals_chain_then(
                        vals, mask, chain, then, **extra
                    )
                self._check_output(after, (f.numel(), max_then, self.q), "log_marginals_chain_then")
                then_pieces.append(_checked(after, offsets[:max_then] < tw.unsqueeze(1)))
            self.seconds["oracle"] += time.perf_counter() - start
            self._check_output(out, (f.numel(), max_length, self.q), "log_marginals_chain")
            pieces.append(_checked(out, offsets[:max_length] < ln.unsqueeze(1)))
        return _cat(pieces), (_cat(then_pieces) if then_pieces else None)

    def _check_output(self, out, expected: tuple, name: str) -> None:
        if not isinstance(out, torch.Tensor):
            raise OracleError(f"oracle.{name} must return a torch.Tensor, got {type(out).__name__}")
        if tuple(out.shape) != expected:
            what = "num_coords" if name == "log_marginals" else "targets"
            raise OracleError(
                f"oracle.{name} returned shape {tuple(out.shape)} for {expected[0]} rows; "
                f"expected {expected} = (rows, {what}, num_values). Check the oracle's "
                "num_coords and num_values attributes."
            )
        if not out.dtype.is_floating_point:
            raise OracleError(
                f"oracle.{name} must return floating point log probabilities, got {out.dtype}"
            )
        if out.device != self.device and out.device.type != self.device.type:
            raise OracleError(
                f"oracle.{name} returned a tensor on {out.device}, but its inputs are on "
                f"{self.device}: return the output on the inputs' device (values.device), or "
                f"pass device= to the sampler to run where the oracle computes"
            )

    @staticmethod
    def raise_bad(answer: Answer, error: torch.Tensor, what: str) -> None:
        """Raise :class:`OracleError` for the first True entry of ``error`` (BoolTensor[R, W]).

        ``what`` describes the rows, e.g. ``"row {row} of the verification"``.
        """
        if not bool(error.any()):
            return
        r, k = (int(i) for i in torch.nonzero(error)[0])
        mass = float(answer.log_mass[r, k])
        if mass != mass:
            problem = "contains NaN"
        elif mass == -float("inf"):
            problem = "gives zero mass to every value"
        elif mass == float("inf"):
            problem = "contains +inf"
        else:
            problem = (
                f"sums to {torch.tensor(mass, dtype=torch.float64).exp().item():.12g} instead "
                f"of 1 (the log of its sum is {mass:.3g})"
            )
        raise OracleError(
            f"The oracle's {what.format(row=r, target=k)} {problem}, although it is conditioned "
            "on an assignment of positive probability. The oracle must return log probabilities "
            "normalised over the values of each coordinate (use torch.log_softmax on logits; "
            "-inf only for impossible values)."
        )


#: What one more oracle call costs, in padded entries (a call has a fixed cost of some tens of
#: small tensor operations, about what a few thousand entries of work cost on a CPU).
CALL_COST = 4096


def width_groups(width: torch.Tensor) -> list[torch.Tensor]:
    """Split requests of widths ``width`` into groups, each asked in one call padded to its
    widest, minimising ``sum over groups (CALL_COST + count * widest)``.

    Requests are first binned by powers of two (widths 1, 2, 3-4, 5-8, ...), then adjacent
    bins are merged by dynamic programming over the bins (at most ~20 of them).

    Returns
    -------
    list of LongTensor
        Indices of the requests of each group.
    """
    if width.numel() * int(width.max()) <= CALL_COST:  # any split costs more than one call
        return [torch.arange(width.numel(), device=width.device)]
    bins = torch.ceil(torch.log2(width.double())).long()
    labels, counts = torch.unique(bins, return_counts=True)
    if labels.numel() == 1:
        return [torch.arange(width.numel(), device=width.device)]
    widest = [int(2**label) for label in labels.tolist()]  # bound on a bin's widest request
    counts = counts.tolist()
    m = len(widest)
    best = [0.0] + [float("inf")] * m
    cut = [0] * (m + 1)
    for end in range(1, m + 1):  # best[end]: bins [0, end) grouped; the last group [s, end)
        for s in range(end):
            cost = best[s] + CALL_COST + sum(counts[s:end]) * widest[end - 1]
            if cost < best[end]:
                best[end], cut[end] = cost, s
    bounds, end = [], m
    while end > 0:
        bounds.append((cut[end], end))
        end = cut[end]
    groups = []
    for s, e in reversed(bounds):
        member = (bins >= labels[s]) & (bins <= labels[e - 1])
        groups.append(torch.nonzero(member).flatten())
    return groups


def _scatter_groups(groups, widths: tuple[torch.Tensor, ...], q: int, ask) -> list[Answer]:
    """Ask every group (``ask(idx)``: one Answer per entry of ``widths``) and place the
    answers back in request order, each padded to the widest of its ``widths``."""
    answers = [ask(idx) for idx in groups]
    return [
        _assemble([(idx, answer[k]) for idx, answer in zip(groups, answers)], width, q)
        for k, width in enumerate(widths)
    ]


def _assemble(parts: list[tuple[torch.Tensor, Answer]], width: torch.Tensor, q: int) -> Answer:
    """Answers of parts of the requests (``(indices, Answer)`` pairs) in request order, padded
    to the widest of ``width`` [R] (padding: ``bad`` False)."""
    total, max_width = width.numel(), int(width.max())
    device = width.device
    log_probs = torch.zeros(total, max_width, q, dtype=torch.float64, device=device)
    bad = torch.zeros(total, max_width, dtype=torch.bool, device=device)
    log_mass = torch.zeros(total, max_width, dtype=torch.float64, device=device)
    for index, part in parts:
        w = part.log_probs.shape[1]
        log_probs[index, :w] = part.log_probs
        bad[index, :w] = part.bad
        log_mass[index, :w] = part.log_mass
    return Answer(log_probs, bad, log_mass)


def _checked(out: torch.Tensor, valid: torch.Tensor) -> Answer:
    tol = _tolerance(out.dtype)
    out = out.detach().to(torch.float64)
    # logsumexp is NaN if an entry is NaN, +inf if one is +inf (and none is NaN), -inf if
    # every entry is -inf: one comparison flags a NaN, +inf, massless or unnormalised row.
    # (torch's on a GPU: fewer kernels; on a CPU its sum over the few values is slow.)
    log_mass = logsumexp(out) if out.device.type == "cpu" else torch.logsumexp(out, dim=-1)
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


def _regroup(flat: Answer, c: torch.Tensor, offset: torch.Tensor, num: int, width: int) -> Answer:
    """Width-1 rows ``flat`` of chain ``c`` at ``offset`` into ``[num, width, q]``."""
    q = flat.log_probs.shape[-1]
    lp = torch.zeros(num, width, q, dtype=torch.float64, device=flat.log_probs.device)
    bad = torch.zeros(num, width, dtype=torch.bool, device=lp.device)
    mass = torch.zeros(num, width, dtype=torch.float64, device=lp.device)
    lp[c, offset] = flat.log_probs[:, 0]
    bad[c, offset] = flat.bad[:, 0]
    mass[c, offset] = flat.log_mass[:, 0]
    return Answer(lp, bad, mass)
