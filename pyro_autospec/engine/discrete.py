"""Blocks of coordinates of ``[q]^n``: what the vectorised recursion drafts, verifies and stores.

For a block ``(a, b]`` of positions of draw ``s``'s order ``sigma`` and its prefix (the frame of
its sequence):

* the **draft row** holds ``log mu(x_{sigma_j} | x_{sigma[:a]})`` for ``a <= j < b``;
* the **draft** draws every ``x_{sigma_j}`` independently from it by Gumbel-max (noise keyed by
  the block, float64) and writes it into the frame; ``log nu`` is the sum of the drawn entries;
* the **verification** is one chain query: ``log mu(x_{sigma_j} | x_{sigma[:j]})`` for
  ``a < j < b`` (the first coordinate's draft and target rows coincide), plus the prefetch of
  the next block's draft row, conditioned on the whole drafted block;
* a residual try's ``log nu`` reads the owner's draft row at the try's values.

Frames are whole assignments ``[n]`` in the narrowest integer type that holds ``q`` values; a
try copies its owner's frame when it starts (its prefix) and the winner's is copied back.
"""

from __future__ import annotations

import torch

from pyro_autospec.engine import keys
from pyro_autospec.engine.rejection import accept_draft
from pyro_autospec.engine.result import host_output
from pyro_autospec.engine.rows import OracleRows
from pyro_autospec.engine.schedule import adaptive_rho
from pyro_autospec.engine.tables import Table, take

__all__ = ["DiscreteBlocks", "value_dtype"]


def value_dtype(q: int) -> torch.dtype:
    """Narrowest integer type that holds the values ``0 .. q - 1``."""
    if q <= 127:
        return torch.int8
    if q <= 32767:
        return torch.int16
    return torch.int32 if q < 2**31 else torch.long


class DiscreteBlocks:
    """The any-order problem for :class:`~pyro_autospec.engine.recursion.Recursion`.

    Parameters
    ----------
    rows : OracleRows
        Checked oracle access along the draws' orders.
    num_draws : int
    width : int
        Largest block (and so draft row) that is ever speculated.
    """

    def __init__(self, rows: OracleRows, num_draws: int, width: int, adaptive: bool = False):
        self.rows = rows
        self.adaptive = adaptive  # rho="adaptive": races sized from each rejection
        self.device = rows.device
        self.num_positions = rows.n
        self.q = rows.q
        self.width = int(width)
        self.dtype = value_dtype(self.q)
        # the output, on the host: a draw's sample is copied in when it finishes, so the
        # device holds only the draws in flight
        self.samples = host_output((num_draws, rows.n), torch.long)
        self.slots = Table(
            {"data": ((self.width, self.q), torch.float64, 0.0)}, self.device, capacity=256
        )
        self.frames = torch.zeros(0, rows.n, dtype=self.dtype, device=self.device)
        self.log_nu = torch.zeros(0, dtype=torch.float64, device=self.device)
        self._empty_long = torch.zeros(0, dtype=torch.long, device=self.device)
        self._empty_double = torch.zeros(0, dtype=torch.float64, device=self.device)
        self._offsets = torch.arange(max(self.width, 1), device=self.device)
        self._counter = (
            self._offsets.view(-1, 1) * self.q + torch.arange(self.q, device=self.device)
        ).unsqueeze(0)  # [1, W, q]: the draft noise counter of position j, value v

    def bind(self, recursion) -> None:
        self.rec = recursion

    # --------------------------------------------------------------------------- storage
    def _frames(self) -> torch.Tensor:
        capacity = self.rec.seqs.capacity
        if self.frames.shape[0] < capacity:
            grown = torch.zeros(capacity, self.num_positions, dtype=self.dtype, device=self.device)
            grown[: self.frames.shape[0]] = self.frames
            self.frames = grown
        return self.frames

    def _node_log_nu(self) -> torch.Tensor:
        capacity = self.rec.nodes.capacity
        if self.log_nu.shape[0] < capacity:
            grown = torch.zeros(capacity, dtype=torch.float64, device=self.device)
            grown[: self.log_nu.shape[0]] = self.log_nu
            self.log_nu = grown
        return self.log_nu

    def _read(self, seq: torch.Tensor, coords: torch.Tensor) -> torch.Tensor:
        """``frames[seq[k], coords[k, j]]`` as a LongTensor[K, W] (``seq`` [K])."""
        return take(self._frames(), seq, coords).long()

    def _write(self, seq: torch.Tensor, coords: torch.Tensor, x: torch.Tensor) -> None:
        """``frames[seq[k], coords[k]] = x[k]`` (all LongTensor[K])."""
        flat = seq * self.num_positions + coords
        self._frames().view(-1).index_copy_(0, flat, x.to(self.dtype))

    def init_frames(self, seqs: torch.Tensor, draws: torch.Tensor) -> None:
        """Draws ``draws`` start in the root sequences ``seqs``."""
        self.rows.start(draws)
        self._frames()[seqs] = 0

    def spawn(self, threads, parents, lo, hi) -> None:
        frames = self._frames()  # whole-row copies: index_select / index_copy_ beat indexing
        frames.index_copy_(0, threads, frames.index_select(0, parents))

    def commit(self, winners: torch.Tensor, seqs: torch.Tensor) -> None:
        frames = self._frames()
        frames.index_copy_(0, seqs, frames.index_select(0, winners))

    def free_frames(self, seqs: torch.Tensor) -> None:
        pass

    def free_rows(self, slots: torch.Tensor) -> None:
        self.slots.free(slots)

    def finish(self, roots: torch.Tensor, draws: torch.Tensor) -> None:
        """Draws ``draws`` finished in the root sequences ``roots``: their samples go to the
        output and their state is freed."""
        done = self._frames().index_select(0, roots).long()
        self.samples.index_copy_(0, draws.cpu(), done.cpu())
        self.rows.finish(draws)

    def race_rho(self, view, pick: torch.Tensor, log_ratio: torch.Tensor, rho: float):
        """Batch growth of the races of rejected drafts: ``rho``, or with ``rho="adaptive"``
        (:attr:`adaptive`) about ``1 / TV`` tries at once from each draft's log ratio."""
        if self.adaptive:
            return adaptive_rho(None, log_ratio.to(torch.float64))
        return torch.full((pick.numel(),), rho, dtype=torch.float64, device=self.device)

    # ------------------------------------------------------------------------ positions
    def _coords(self, draw: torch.Tensor, start: torch.Tensor, count: int) -> torch.Tensor:
        """Coordinates ``sigma[start + j]`` for ``j < count`` (clamped to the order's end)."""
        pos = (start.unsqueeze(1) + self._offsets[:count]).clamp(max=self.num_positions - 1)
        return self.rows.coords(draw, pos)

    def _block(self, view):
        """``(size, coords [K, W], valid [K, W], row data [K, W, q])`` of blocks."""
        size = view.b - view.a
        width = int(size.max())
        coords = self._coords(view.draw, view.a, width)
        valid = self._offsets[:width].unsqueeze(0) < size.unsqueeze(1)
        data = self.slots["data"][view.row, :width]
        return size, coords, valid, data

    # ----------------------------------------------------------------------------- blocks
    def draft(self, view) -> None:
        """Draw every block's coordinates from its draft row; keep ``log nu``."""
        size, coords, valid, data = self._block(view)
        width = coords.shape[1]
        noise = keys.gumbel(view.key.view(-1, 1, 1), keys.Tag.DRAFT, self._counter[:, :width])
        x = (data + noise).max(dim=-1).indices  # argmax; max's indices are faster on a CPU
        picked = data.gather(2, x.unsqueeze(-1)).squeeze(-1)
        self._node_log_nu()[view.ids] = torch.where(valid, picked, 0.0).sum(1)
        seq = view.seq.unsqueeze(1).expand_as(coords)
        self._write(seq[valid], coords[valid], x[valid])

    def leaf(self, view) -> torch.Tensor:
        """Draw one-coordinate blocks from their row; return their ``log mu``."""
        data = self.slots["data"][view.row, 0]  # [K, q]
        noise = keys.gumbel(view.key.unsqueeze(1), keys.Tag.DRAFT, self._counter[0, 0])
        x = (data + noise).max(dim=-1).indices
        coord = self.rows.coords(view.draw, view.a)
        self._write(view.seq, coord, x)
        return data.gather(1, x.unsqueeze(1)).squeeze(1)

    def accepted(self, view, pick: torch.Tensor) -> None:
        pass  # the draft is already in the frame

    def try_log_nu(self, threads: torch.Tensor, owners) -> torch.Tensor:
        """``log nu`` of each try's values under its owner's draft row."""
        size, coords, valid, data = self._block(owners)
        y = self._read(threads, coords)
        picked = data.gather(2, y.unsqueeze(-1)).squeeze(-1)
        return torch.where(valid, picked, 0.0).sum(1)

    # ---------------------------------------------------------------------------- queries
    def answer(self, row_view, verify_view):
        """One round: draft rows of ``row_view``'s nodes, verification of ``verify_view``'s.

        Returns
        -------
        row_slots : LongTensor[Nr]
        log_ratio, log_mu : DoubleTensor[Nv]
            ``log mu_S - log nu_S`` and ``log mu_S`` of each drafted block.
        next_rows : LongTensor[Nv]
            Slots of the prefetched next draft rows (``-1`` where there is no next block or
            the draft is impossible).
        """
        vr, vv = row_view, verify_view
        has = vv.nxt > vv.b
        pi = torch.nonzero(has).flatten()
        row_frame = torch.cat([vr.seq, vv.seq[pi]])
        row_draw = torch.cat([vr.draw, vv.draw[pi]])
        row_cut = torch.cat([vr.a, vv.b[pi]])
        row_width = torch.cat([vr.b - vr.a, (vv.nxt - vv.b)[pi]])
        requests = (row_frame, row_draw, row_cut, row_cut, row_width)
        nv = len(vv)
        chains = (vv.seq, vv.draw, vv.a + 1, vv.b - vv.a - 1)
        row_answer, chain_answer = self.rows.ask(
            self._frames(),
            requests if row_frame.numel() else None,
            chains if nv else None,
        )
        nr = len(vr)
        row_slots = self._empty_long
        if nr:
            OracleRows.raise_bad(
                row_answer.part(slice(0, nr)),
                row_answer.bad[:nr],
                "draft row {row} (target {target}), conditioned on a prefix of an exact sample,",
            )
            row_slots = self._store(row_answer.log_probs[:nr])
        next_rows = torch.full((nv,), -1, dtype=torch.long, device=self.device)
        if nv == 0:
            return row_slots, self._empty_double, self._empty_double, next_rows, None
        # log mu of the drafted block: first coordinate from the draft row, then the chain
        size, coords, valid, data = self._block(vv)
        x = self._read(vv.seq, coords)  # [K, W]
        first = data[:, 0].gather(1, x[:, :1]).squeeze(1)
        length = chain_answer.log_probs.shape[1]
        steps = chain_answer.log_probs.gather(2, x[:, 1 : 1 + length].unsqueeze(-1)).squeeze(-1)
        in_chain = valid[:, 1 : 1 + length]
        # a row conditions on a possible prefix iff every earlier factor was positive
        factors = torch.where(in_chain & ~torch.isnan(steps), steps, 0.0)
        factors = torch.where(in_chain & torch.isnan(steps), -torch.inf, factors)
        cumulative = first.unsqueeze(1) + torch.cumsum(factors, 1)
        possible = torch.cat([first.unsqueeze(1), cumulative[:, :-1]], 1) > -torch.inf
        OracleRows.raise_bad(
            chain_answer,
            chain_answer.bad & possible & in_chain,
            "verification row {target} of block {row} of the round",
        )
        log_mu = torch.where(possible.all(1), cumulative[:, -1], -torch.inf)
        log_ratio = torch.where(
            log_mu > -torch.inf, log_mu - self._node_log_nu()[vv.ids], -torch.inf
        )
        tokens = None
        token = torch.nonzero(vv.token).flatten()
        if token.numel():
            kept, whole = size.clone(), torch.ones_like(size, dtype=torch.bool)
            kept[token], whole[token], log_mu[token] = self._tokens(
                vv, token, x, data, chain_answer.log_probs, size, first
            )
            tokens = (kept, whole)
        if pi.numel():
            answer = row_answer.part(slice(nr, None))
            alive = log_mu[pi] > -torch.inf
            if tokens is not None:  # a token window's prefetch conditions on all its draft
                alive &= tokens[1][pi]
            OracleRows.raise_bad(
                answer,
                answer.bad & alive.unsqueeze(1),
                "prefetched draft row {row} (target {target}), conditioned on an accepted block,",
            )
            ai = torch.nonzero(alive).flatten()
            next_rows[pi[ai]] = self._store(answer.log_probs[ai])
        return row_slots, log_ratio, log_mu, next_rows, tokens

    def _tokens(self, vv, pick, x, data, chain, size, first):
        """Token-level acceptance of the drafted windows ``pick`` of ``vv``.

        Speculative decoding's rule, in float64: token ``j >= 1`` of the window is kept with
        probability ``min(1, mu_j(x_j) / nu_j(x_j))`` (``mu_j``: the chain row given the prefix
        and the tokens before it; ``nu_j``: the draft row given the prefix) while every token
        before it was kept; the first rejected token is redrawn from ``(mu_j - nu_j)_+``
        (Gumbel noise keyed by the window) and ends the window. Token 0's draft row is its
        target row, so it is always kept.

        Returns
        -------
        kept : LongTensor[P]
            Coordinates the window keeps (through the redrawn token; its size when every token
            passed).
        whole : BoolTensor[P]
            Whether every token passed (no token was redrawn).
        log_mu : DoubleTensor[P]
            ``log mu`` of the kept coordinates.
        """
        q = self.q
        size, x, data, key = size[pick], x[pick], data[pick], vv.key[pick]
        width = x.shape[1]
        if width < 2:
            return size, torch.ones_like(size, dtype=torch.bool), first[pick]
        chain = chain[pick]
        j = self._offsets[1:width].unsqueeze(0)  # tokens 1..
        in_window = j < size.unsqueeze(1)
        xt = x[:, 1:]
        target_x = chain[:, : width - 1].gather(2, xt.unsqueeze(-1)).squeeze(-1)
        draft_x = data[:, 1:].gather(2, xt.unsqueeze(-1)).squeeze(-1)
        u = keys.uniform(key.unsqueeze(1), keys.Tag.ACCEPT, j)
        keep = accept_draft(target_x - draft_x, u) & in_window
        stop = torch.where(~keep & in_window, j, size.unsqueeze(1)).min(1).values
        log_mu = first[pick] + torch.where(j < stop.unsqueeze(1), target_x, 0.0).sum(1)
        rejected = torch.nonzero(stop < size).flatten()
        if rejected.numel():
            js = stop[rejected]
            pick_j = js.view(-1, 1, 1).expand(-1, 1, q)
            rows_j = chain[rejected].gather(1, pick_j - 1).squeeze(1)  # [R, q]
            draft_j = data[rejected].gather(1, pick_j).squeeze(1)
            residual = (rows_j.exp() - draft_j.exp()).clamp(min=0.0)
            log_residual = torch.log(residual / residual.sum(1, keepdim=True))
            v = self._counter[0, 0].unsqueeze(0)
            g = keys.gumbel(key[rejected].unsqueeze(1), keys.Tag.RESAMPLE, v)
            y = torch.argmax(log_residual + g, dim=-1)
            coord = self.rows.coords(vv.draw[pick][rejected], vv.a[pick][rejected] + js)
            self._write(vv.seq[pick][rejected], coord, y)
            log_mu[rejected] += rows_j.gather(1, y.unsqueeze(1)).squeeze(1)
        return torch.where(stop < size, stop + 1, size), stop >= size, log_mu

    def _store(self, log_probs: torch.Tensor) -> torch.Tensor:
        slots = self.slots.alloc(log_probs.shape[0])
        width = min(self.width, log_probs.shape[1])
        self.slots["data"][slots, :width] = log_probs[:, :width]
        return slots
