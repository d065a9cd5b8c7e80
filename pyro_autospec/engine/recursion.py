"""Autospeculation as a tensor program: the recursion of every draw, block and thread at once.

This is the fast engine's recursion (the reference is the generator recursion in
:mod:`pyro_autospec.engine.reference`). Its state is two tables of integer fields
(:class:`~pyro_autospec.engine.tables.Matrix`, one column per field, so that several fields of
many rows are read or written by one gather or scatter):

* **nodes**: blocks ``(a, b]`` of positions being sampled given a prefix. A node waits for its
  *draft row* (``WAIT_ROW``), or has drafted and waits for its verification (``WAIT_VERIFY``),
  or was rejected and races residual tries (``RACING``).
* **sequences**: something that samples blocks one after the other. A *root* samples the
  top-level leaves ``(L_j, L_{j+1}]`` of one draw; a *thread* (residual try ``i`` of a racing
  node ``(a, b]``) samples ``(a, m]`` then ``(m, b]`` with ``m = (a + b) // 2`` and is then
  accepted or rejected by the residual rule. Each sequence owns a *frame* (its partial sample;
  kept by the problem).

A round is one batched oracle call over the requests of the waiting nodes of all draws (a cap on
rows per round takes the oldest first). The answers then *cascade*: accepted drafts complete
their nodes, completed nodes start the next block of their sequence, finished threads settle
their race, decided races complete their owner node, and so on, until every live node waits for
the next round. Each step of the cascade is a few tensor operations over every node or thread
that moved, whatever their number: there is no Python per row, per node or per thread.

Races are decided by thread index, never by finishing order (:doc:`/algorithm`): a race waits
until the smallest index that has not rejected has finished; if it accepted it wins and every
other live thread of the race is cancelled with all its descendants; if every launched thread
rejected, the next batch ``ceil((1 + rho)^r) <= i < ceil((1 + rho)^(r + 1))`` starts.

All randomness is keyed (:mod:`pyro_autospec.engine.keys`): draw ``s`` has key
``child(seed, DRAW, s)``, the top-level leaf starting at ``a`` ``child(draw, LEAF, a)``, try
``i`` of a node ``child(node, THREAD, i)`` and its halves ``child(try, CHILD, 0 | 1)``. Hence
the output depends on the seed and the oracle only, not on the schedule, and equals the
reference engine's draw for draw.

What the positions mean (coordinates of ``[q]^n`` or steps of a diffusion), how a block is
drafted and verified and what a frame holds is the business of a *problem*
(:class:`~pyro_autospec.engine.discrete.DiscreteBlocks`,
:class:`~pyro_autospec.engine.euler.EulerBlocks`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from pyro_autospec.engine import keys
from pyro_autospec.engine.modes import engine_mode
from pyro_autospec.engine.rejection import accept_draft, accept_residual
from pyro_autospec.engine.schedule import BlockPolicy, leaf_starts, part_bounds
from pyro_autospec.engine.stepping import run_rounds
from pyro_autospec.engine.tables import Matrix, ragged

__all__ = ["NodeView", "Recursion", "RunCounts", "next_batch", "leaf_starts"]

# node states
FREE, WAIT_ROW, WAIT_VERIFY, RACING, BUSY = 0, 1, 2, 3, 4
# sequence statuses
RUNNING, ACCEPTED, REJECTED = 0, 1, 2
_BIG = torch.iinfo(torch.int64).max

_NODE_INT = {
    "draw": 0,
    "seq": -1,
    "a": 0,
    "b": 0,
    "nxt": 0,
    "key": 0,
    "state": FREE,
    "stamp": 0,
    "row": -1,
    "next_row": -1,
    "race_next": 1,
    "race_batch": 0,
    "owns_row": 0,
    "token": 0,
    "kept": 0,
}
_SEQ_INT = {
    "draw": 0,
    "owner": -1,
    "index": 0,
    "key": 0,
    "lo": 0,
    "hi": 0,
    "nxt": 0,
    "stage": 0,
    "child": -1,
    "status": RUNNING,
    "carry": -1,
    "win": 0,
    "depth": 0,
    "parts": 2,
    "token": 0,
    "tokens": 0,
    "misses": 0,
}
(
    N_DRAW,
    N_SEQ,
    N_A,
    N_B,
    N_NXT,
    N_KEY,
    N_STATE,
    N_STAMP,
    N_ROW,
    N_NEXT,
    N_RNEXT,
    N_RBATCH,
    N_OWNS,
    N_TOKEN,
    N_KEPT,
) = range(len(_NODE_INT))
(
    S_DRAW,
    S_OWNER,
    S_INDEX,
    S_KEY,
    S_LO,
    S_HI,
    S_NXT,
    S_STAGE,
    S_CHILD,
    S_STATUS,
    S_CARRY,
    S_WIN,
    S_DEPTH,
    S_PARTS,
    S_TOKEN,
    S_TOKENS,
    S_MISSES,
) = range(len(_SEQ_INT))
F_LOG_MU, F_RHO = 0, 1


class NodeView:
    """The fields of the nodes ``ids`` that problems read, from one gather.

    Attributes
    ----------
    ids, draw, seq, a, b, nxt, key, row, token : LongTensor[K]
        Node ids; their draw (local index), sequence, block ``(a, b]``, the end ``nxt`` of the
        block after them (``nxt == b``: none), key, draft-row slot, and 1 where the block is
        sampled token by token.
    """

    __slots__ = ("ids", "draw", "seq", "a", "b", "nxt", "key", "row", "token")

    def __init__(
        self, table: torch.Tensor, pick: torch.Tensor | None, ids: torch.Tensor | None = None
    ):
        """Rows ``pick`` of ``table`` (all of them if ``pick`` is None): the nodes ``ids``.

        ``NodeView(nodes_matrix, ids)`` reads the nodes ``ids``; ``NodeView(block, pick, ids)``
        reads rows of a block already gathered for the nodes ``ids``.
        """
        if ids is None:
            ids, block = pick, table.index_select(0, pick)
        else:
            block = table.index_select(0, pick)
        self.ids = ids
        cols = block.unbind(1)
        self.draw, self.seq, self.a, self.b, self.nxt, self.key = cols[:6]
        self.row = cols[N_ROW]
        self.token = cols[N_TOKEN]

    def __len__(self) -> int:
        return int(self.ids.numel())


def next_batch(
    next_index: torch.Tensor, batch: torch.Tensor, rho: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Thread indices of the next batch of a race: ``[next_index, stop)`` and the new batch.

    Batch ``r`` holds the indices ``ceil((1+rho)^r) <= i < ceil((1+rho)^(r+1))``; empty batches
    are skipped. Both engines call this function, so they launch the same batches.

    Parameters
    ----------
    next_index, batch : LongTensor[R]
        Smallest index not launched yet, and the number of batches considered so far.
    rho : DoubleTensor[R]
        Batch growth of each race.

    Returns
    -------
    stop, batch : LongTensor[R]
    """
    growth = torch.log1p(rho)
    r = torch.maximum(batch, torch.floor(torch.log(next_index.double()) / growth).long())
    stop = torch.ceil(torch.exp(growth * (r + 1).double())).long()
    while True:  # rounding of the closed form (at most a step or two)
        low = stop <= next_index
        if not bool(low.any()):
            break
        r = torch.where(low, r + 1, r)
        stop = torch.where(low, torch.ceil(torch.exp(growth * (r + 1).double())).long(), stop)
    return stop, r + 1


@dataclass
class RunCounts:
    """What a run cost: rounds (whole run), oracle rows, and rounds per draw."""

    rounds: int
    oracle_rows: int
    sample_rounds: torch.Tensor


def _col(*columns: int, device) -> torch.Tensor:
    return torch.tensor(columns, dtype=torch.long, device=device)


class Recursion:
    """Run autospeculation for a batch of draws of a problem.

    Parameters
    ----------
    problem : DiscreteBlocks or EulerBlocks
        Drafts, verifies and stores blocks (see the module docstring).
    draw_keys : LongTensor[D]
        Keys of the draws (:func:`pyro_autospec.engine.keys.draw_keys`); draw ``k`` of this
        run is stored at index ``k``.
    max_block : int
        Largest block that is speculated; larger top-level blocks are cut into leaves.
    policy : BlockPolicy, optional
        The adaptive schedule (:mod:`pyro_autospec.engine.schedule`): per-draw windows and
        the depth below which residual tries use the chain rule. Default: the fixed tiling of
        :func:`leaf_starts` with recursive tries at every depth.
    rho : float
        Batch growth of residual tries (the problem may set it per race, see
        ``problem.race_rho``).
    max_rows_per_round : int or None
        Cap on rows per round; the oldest requests go first (at least one per round).
    max_concurrent_draws : int or None
        Draws in flight at once; new draws start as earlier ones finish (continuous batching).
    progress : bool
        A tqdm bar over finished draws.
    desc : str
        Label of the bar.
    """

    def __init__(
        self,
        problem,
        draw_keys: torch.Tensor,
        *,
        max_block: int,
        rho: float,
        policy: BlockPolicy | None = None,
        max_rows_per_round: int | None = None,
        max_concurrent_draws: int | None = None,
        progress: bool = False,
        desc: str = "autospec",
    ):
        self.problem = problem
        self.device = dev = problem.device
        self.n = problem.num_positions
        self.num_draws = int(draw_keys.numel())
        self.rho = float(rho)
        self.max_rows_per_round = max_rows_per_round
        self.concurrency = int(max_concurrent_draws or self.num_draws)
        self.progress = progress
        self.desc = desc
        self.draw_keys = draw_keys.to(dev)
        self.policy = policy or BlockPolicy(max_block, blocks="fixed")
        bounds = leaf_starts(self.n, max_block)
        m = len(bounds) - 1
        self.num_leaves = m
        self.leaves = torch.tensor(
            [[bounds[j], bounds[j + 1], bounds[min(j + 2, m)]] for j in range(m)], device=dev
        )  # (a, b, nxt) of every top-level leaf
        capacity = 4 * min(self.concurrency, self.num_draws) + 64
        flags = {"ready": 0, "done": 0, "settle": 0}
        self.nodes = Matrix({**_NODE_INT, **flags}, {"log_mu": 0.0, "rho": 1.0}, dev, capacity)
        self.seqs = Matrix(_SEQ_INT, {"log_mu": 0.0}, dev, capacity)
        self.N_READY, self.N_DONE, self.N_SETTLE = (self.nodes.col[k] for k in flags)
        self._free_cols = _col(N_STATE, *(self.nodes.col[k] for k in flags), device=dev)
        self._free_vals = _col(FREE, 0, 0, 0, device=dev)
        self._new_cols = _col(
            N_DRAW,
            N_SEQ,
            N_A,
            N_B,
            N_NXT,
            N_KEY,
            N_STATE,
            N_STAMP,
            N_ROW,
            N_OWNS,
            N_TOKEN,
            self.N_READY,
            device=dev,
        )
        self._row_cols = _col(N_OWNS, N_STATE, self.N_READY, device=dev)
        self._row_vals = _col(1, BUSY, 1, device=dev)
        self._done_cols = _col(N_STATE, self.N_DONE, device=dev)
        self._done_vals = _col(BUSY, 1, device=dev)
        self._race_cols = _col(N_STATE, N_RNEXT, N_RBATCH, device=dev)
        self._race_vals = _col(RACING, 1, 0, device=dev)
        self._launch_cols = _col(N_RNEXT, N_RBATCH, device=dev)
        self._thread_cols = _col(S_DRAW, S_OWNER, S_INDEX, S_KEY, S_LO, S_HI, S_NXT, device=dev)
        self._root_cols = _col(S_DRAW, S_KEY, S_LO, S_HI, S_NXT, S_WIN, S_TOKEN, device=dev)
        self._part_cols = _col(S_DEPTH, S_PARTS, device=dev)
        self._leaf_tag = keys.tag_tensor(keys.Tag.LEAF, self.leaves)
        self._child_tag = keys.tag_tensor(keys.Tag.CHILD, self.leaves)
        problem.bind(self)
        self.stamp = 0
        self.rounds = 0
        self.oracle_rows = 0
        self.sample_rounds = torch.zeros(self.num_draws, dtype=torch.long, device=dev)
        self.log_prob = torch.full((self.num_draws,), math.nan, dtype=torch.float64, device=dev)
        self.started = 0
        self.finished = 0

    # ----------------------------------------------------------------------------- helpers
    def view(self, ids: torch.Tensor) -> NodeView:
        """The fields problems read of the nodes ``ids``."""
        return NodeView(self.nodes.i, ids)

    def _stamps(self, count: int) -> torch.Tensor:
        out = torch.arange(self.stamp, self.stamp + count, device=self.device)
        self.stamp += count
        return out

    def _new_nodes(self, seq, draw, a, b, nxt, key, row, owns_row, token=None) -> torch.Tensor:
        """Nodes ``(a, b]`` of sequences ``seq``: ready if they have a row, else waiting."""
        count = seq.numel()
        ids = self.nodes.alloc(count)
        if count == 0:
            return ids
        has_row = (row >= 0).long()
        state = torch.where(row >= 0, BUSY, WAIT_ROW)
        token = torch.zeros_like(a) if token is None else token
        fields = torch.stack(
            [draw, seq, a, b, nxt, key, state, self._stamps(count), row, owns_row, token, has_row],
            1,
        )
        self.nodes.i[ids.unsqueeze(1), self._new_cols] = fields
        self.seqs.i[seq, S_CHILD] = ids
        return ids

    def _free_nodes(self, ids: torch.Tensor) -> None:
        """Free nodes with the rows they own (their draft row if owned, a prefetched row)."""
        if ids.numel() == 0:
            return
        block = self.nodes.i.index_select(0, ids)
        owned = torch.where(block[:, N_OWNS] == 1, block[:, N_ROW], -1)
        rows = torch.cat([owned, block[:, N_NEXT]])
        self.problem.free_rows(rows[rows >= 0])
        self.nodes.i[ids.unsqueeze(1), self._free_cols] = self._free_vals
        self.nodes.free(ids)

    def _free_seqs(self, ids: torch.Tensor) -> None:
        if ids.numel() == 0:
            return
        carry = self.seqs.i[ids, S_CARRY]
        self.problem.free_rows(carry[carry >= 0])
        self.problem.free_frames(ids)
        self.seqs.free(ids)

    # ------------------------------------------------------------------------------ draws
    def _start_draws(self) -> None:
        count = min(
            self.concurrency - (self.started - self.finished), self.num_draws - self.started
        )
        if count <= 0:
            return
        draws = torch.arange(self.started, self.started + count, device=self.device)
        self.started += count
        ids = self.seqs.alloc(count)
        zero = torch.zeros_like(draws)
        full = torch.full_like(draws, self.n)
        key = self.draw_keys[draws]
        window = torch.full_like(draws, self.policy.start_window())
        token = torch.full_like(draws, int(self.policy.adaptive and self.policy.start_token()))
        self.seqs.i[ids.unsqueeze(1), self._root_cols] = torch.stack(
            [draws, key, zero, full, full, window, token], 1
        )
        self.problem.init_frames(ids, draws)
        if self.policy.adaptive:
            a, b, nxt = self._window_block(zero, window, token, zero, zero)
        else:
            a, b, nxt = (x.expand(count) for x in self.leaves[0].unbind(0))
        first = keys.child(key, keys.Tag.LEAF, a)
        self._new_nodes(ids, draws, a, b, nxt, first, torch.full_like(draws, -1), zero, token)

    def _window_block(self, a, window, token, tokens, misses):
        """``(a, b, nxt)`` of the adaptive top-level blocks starting at ``a`` (their window,
        mode and the draw's token counts so far: LongTensor[K])."""
        b = torch.clamp(a + window, max=self.n)
        after = self.policy.prefetch(window, token, tokens, misses)
        return a, b, torch.clamp(b + after, max=self.n)

    # ------------------------------------------------------------------------------ rounds
    @engine_mode()
    def run(self) -> RunCounts:
        """Run every draw to completion; return the counts (samples stay in the problem)."""
        run_rounds(self, total=self.num_draws, progress=self.progress, desc=self.desc)
        return RunCounts(self.rounds, self.oracle_rows, self.sample_rounds)

    def start(self) -> None:
        """Put the first draws in flight."""
        self._start_draws()

    def step(self) -> None:
        """One round, its cascade, then the draws that fit start."""
        self._round()
        self._cascade()
        self._start_draws()

    @property
    def done(self) -> bool:
        return self.finished >= self.num_draws

    def _round(self) -> None:
        nodes = self.nodes
        state = nodes.i[:, N_STATE]
        waiting = torch.nonzero((state == WAIT_ROW) | (state == WAIT_VERIFY)).flatten()
        if waiting.numel() == 0:
            raise RuntimeError("internal error: draws in flight but no request pending")
        block = nodes.i.index_select(0, waiting)
        a, b, nxt = block[:, N_A], block[:, N_B], block[:, N_NXT]
        is_verify = block[:, N_STATE] == WAIT_VERIFY
        rows = torch.where(is_verify, b - a - 1 + (nxt > b).long(), 1)
        if self.max_rows_per_round is not None:
            order = torch.argsort(block[:, N_STAMP])
            keep = rows[order].cumsum(0) <= self.max_rows_per_round
            keep[0] = True
            order = order[keep]
            waiting, block, is_verify, rows = (
                waiting[order],
                block[order],
                is_verify[order],
                rows[order],
            )
        self.rounds += 1
        self.oracle_rows += int(rows.sum())
        # +1 for every draw asking (once, however many of its nodes ask): no [num_draws]
        # temporary per round
        asking = block[:, N_DRAW]
        self.sample_rounds.index_put_((asking,), self.sample_rounds[asking] + 1)
        vi = torch.nonzero(is_verify).flatten()
        ri = torch.nonzero(~is_verify).flatten()
        row_view = NodeView(block, ri, waiting[ri])
        verify_view = NodeView(block, vi, waiting[vi])
        row_slots, log_ratio, log_mu, next_rows, tokens = self.problem.answer(row_view, verify_view)
        # draft rows arrived: those nodes start
        row_ids = row_view.ids
        nodes.i[row_ids, N_ROW] = row_slots
        nodes.i[row_ids.unsqueeze(1), self._row_cols] = self._row_vals
        ids = verify_view.ids
        if ids.numel() == 0:
            return
        u = keys.uniform(verify_view.key, keys.Tag.ACCEPT, 0)
        accepted = accept_draft(log_ratio, u)
        if tokens is not None:  # token windows always complete, with what they kept
            kept, whole = tokens
            accepted |= verify_view.token.bool()
            nodes.i[ids, N_KEPT] = kept
            nodes.i[ids, N_B] = verify_view.a + kept
            nodes.i[ids, N_RBATCH] = (~whole).long()  # a redrawn token counts as a rejection
        good = torch.nonzero(accepted).flatten()
        bad = torch.nonzero(~accepted).flatten()
        good_ids, bad_ids = ids[good], ids[bad]
        nodes.f[good_ids, F_LOG_MU] = log_mu[good]
        nodes.i[good_ids, N_NEXT] = next_rows[good]
        nodes.i[good_ids.unsqueeze(1), self._done_cols] = self._done_vals
        self.problem.accepted(verify_view, good)
        dropped = next_rows[bad]
        self.problem.free_rows(dropped[dropped >= 0])
        if bad.numel():
            nodes.i[bad_ids.unsqueeze(1), self._race_cols] = self._race_vals
            nodes.f[bad_ids, F_RHO] = self.problem.race_rho(
                verify_view, bad, log_ratio[bad], self.rho
            )
            self._launch(bad_ids)

    # ----------------------------------------------------------------------------- cascade
    def _cascade(self) -> None:
        # ``self.nodes.i`` is read afresh at every step: launches may grow (replace) the table.
        nodes = self.nodes
        while True:
            ready = torch.nonzero(nodes.i[:, self.N_READY]).flatten()
            if ready.numel():
                nodes.i[ready, self.N_READY] = 0
                self._start(ready)
            done = torch.nonzero(nodes.i[:, self.N_DONE]).flatten()
            if done.numel():
                nodes.i[done, self.N_DONE] = 0
                self._complete(done)
            settle = torch.nonzero(nodes.i[:, self.N_SETTLE]).flatten()
            if settle.numel():
                nodes.i[settle, self.N_SETTLE] = 0
                self._settle(settle)
            if ready.numel() == 0 and done.numel() == 0 and settle.numel() == 0:
                return

    def _start(self, ready: torch.Tensor) -> None:
        nodes = self.nodes
        block = nodes.i.index_select(0, ready)
        size = block[:, N_B] - block[:, N_A]
        li = torch.nonzero(size == 1).flatten()
        bi = torch.nonzero(size != 1).flatten()
        if li.numel():
            leaves = NodeView(block, li, ready[li])
            nodes.f[leaves.ids, F_LOG_MU] = self.problem.leaf(leaves)
            nodes.i[leaves.ids, self.N_DONE] = 1
        if bi.numel():
            blocks = NodeView(block, bi, ready[bi])
            self.problem.draft(blocks)
            count = bi.numel()
            nodes.i[blocks.ids, N_STATE] = WAIT_VERIFY
            nodes.i[blocks.ids, N_STAMP] = self._stamps(count)

    def _complete(self, done: torch.Tensor) -> None:
        """Nodes that finished: advance their sequences."""
        nodes, seqs = self.nodes, self.seqs
        block = nodes.i.index_select(0, done)
        seq, next_row = block[:, N_SEQ], block[:, N_NEXT]
        seqs.f[seq, 0] += nodes.f[done, F_LOG_MU]
        nodes.i[done, N_NEXT] = -1  # handed on below
        self._free_nodes(done)
        sblock = seqs.i.index_select(0, seq)
        stage = sblock[:, S_STAGE] + 1
        is_root = sblock[:, S_OWNER] < 0
        adaptive = self.policy.adaptive
        root_last = block[:, N_B] >= self.n if adaptive else stage >= self.num_leaves
        last = torch.where(is_root, root_last, stage >= sblock[:, S_PARTS])
        gi = torch.nonzero(~last).flatten()
        ei = torch.nonzero(last).flatten()
        if gi.numel():  # the next block, with the prefetched row if there is one
            go, go_stage, go_row = seq[gi], stage[gi], next_row[gi]
            seqs.i[go, S_STAGE] = go_stage
            sb = sblock[gi]
            root = is_root[gi]
            if adaptive:  # a root's next window and mode, from how its last block went
                nb = block[gi]
                token = nb[:, N_TOKEN].bool()
                full = nb[:, N_RBATCH] == 0  # draft accepted whole, or every token passed
                was_token = token.long()
                tokens = sb[:, S_TOKENS] + was_token * nb[:, N_KEPT]
                misses = sb[:, S_MISSES] + was_token * (~full).long()
                seqs.i[go, S_TOKENS] = tokens
                seqs.i[go, S_MISSES] = misses
                window, token = self.policy.next_block(sb[:, S_WIN], token, full, tokens, misses)
                seqs.i[go, S_WIN] = window
                seqs.i[go, S_TOKEN] = token.long()
                top = self._window_block(nb[:, N_B], window, token, tokens, misses)
                top = torch.stack(top, 1)
            else:
                top = self.leaves[go_stage.clamp(max=self.num_leaves - 1)]  # [G, 3]
            # a thread's part j of p: (lo + span j // p, lo + span (j + 1) // p], the last one
            # followed by the thread's own nxt
            lo, hi, parts = sb[:, S_LO], sb[:, S_HI], sb[:, S_PARTS].clamp(min=1)
            pa, pb = part_bounds(lo, hi, parts, go_stage)
            after = part_bounds(lo, hi, parts, go_stage + 1)[1]
            pn = torch.where(go_stage + 1 < parts, after, sb[:, S_NXT])
            mine = torch.stack([pa, pb, pn], 1)
            a, b, nxt = torch.where(root.unsqueeze(1), top, mine).unbind(1)
            key = keys.child(
                sb[:, S_KEY],
                torch.where(root, self._leaf_tag, self._child_tag),
                torch.where(root, a, go_stage),
            )
            mode = torch.where(root, seqs.i[go, S_TOKEN], 0) if adaptive else None
            self._new_nodes(go, sb[:, S_DRAW], a, b, nxt, key, go_row, (go_row >= 0).long(), mode)
        if ei.numel() == 0:
            return
        end = seq[ei]
        seqs.i[end, S_CARRY] = next_row[ei]
        seqs.i[end, S_CHILD] = -1
        root = is_root[ei]
        ri = torch.nonzero(root).flatten()
        ti = torch.nonzero(~root).flatten()
        if ri.numel():
            self._finish_draws(end[ri], sblock[ei[ri], S_DRAW])
        if ti.numel():
            self._finish_threads(end[ti], sblock[ei[ti]])

    def _finish_draws(self, roots: torch.Tensor, draws: torch.Tensor) -> None:
        self.log_prob[draws] = self.seqs.f[roots, 0]
        self.problem.finish(roots, draws)
        self._free_seqs(roots)
        self.finished += int(roots.numel())

    def _finish_threads(self, threads: torch.Tensor, sblock: torch.Tensor) -> None:
        seqs = self.seqs
        owners = sblock[:, S_OWNER]
        log_mu = seqs.f[threads, 0]
        if not bool((log_mu > -math.inf).all()):
            raise AssertionError("internal error: an exact try returned a value of probability 0")
        log_nu = self.problem.try_log_nu(threads, self.view(owners))
        u = keys.uniform(sblock[:, S_KEY], keys.Tag.ACCEPT, 0)
        accepted = accept_residual(log_mu - log_nu, u)
        seqs.i[threads, S_STATUS] = torch.where(accepted, ACCEPTED, REJECTED)
        carry = seqs.i[threads, S_CARRY]
        dropped = torch.where(accepted, -1, carry)
        self.problem.free_rows(dropped[dropped >= 0])
        seqs.i[threads, S_CARRY] = torch.where(accepted, carry, -1)
        self.nodes.i[owners, self.N_SETTLE] = 1

    # ------------------------------------------------------------------------------- races
    def _launch(self, races: torch.Tensor) -> None:
        """Launch the next batch of tries of every race in ``races``."""
        nodes, seqs = self.nodes, self.seqs
        rb = nodes.i.index_select(0, races)
        start = rb[:, N_RNEXT]
        stop, batch = next_batch(start, rb[:, N_RBATCH], nodes.f[races, F_RHO])
        nodes.i[races.unsqueeze(1), self._launch_cols] = torch.stack([stop, batch], 1)
        count = stop - start
        pick, j, _ = ragged(count)  # try `start + j` of race `pick`
        index = start[pick] + j
        ob = rb.index_select(0, pick)
        draw, a, b, nxt = ob[:, N_DRAW], ob[:, N_A], ob[:, N_B], ob[:, N_NXT]
        owner = races[pick]
        threads = seqs.alloc(pick.numel())
        try_key = keys.child(ob[:, N_KEY], keys.Tag.THREAD, index)
        seqs.i[threads.unsqueeze(1), self._thread_cols] = torch.stack(
            [draw, owner, index, try_key, a, b, nxt], 1
        )
        depth = self.seqs.i[ob[:, N_SEQ], S_DEPTH] + 1
        parts = self.policy.try_parts(depth, b - a)
        seqs.i[threads.unsqueeze(1), self._part_cols] = torch.stack([depth, parts], 1)
        self.problem.spawn(threads, ob[:, N_SEQ], a, b)
        left = keys.child(try_key, keys.Tag.CHILD, 0)
        first_end, second_end = (part_bounds(a, b, parts, j)[1] for j in (0, 1))
        self._new_nodes(threads, draw, a, first_end, second_end, left, ob[:, N_ROW], 0 * a)

    def _members(self, owners: torch.Tensor) -> torch.Tensor:
        """Live tries (sequence ids) of the races ``owners``."""
        seqs = self.seqs
        is_owner = torch.zeros(self.nodes.capacity, dtype=torch.bool, device=self.device)
        is_owner[owners] = True
        owner = seqs.i[:, S_OWNER]
        live = seqs.used & (owner >= 0)
        live &= is_owner[owner.clamp(min=0)]
        return torch.nonzero(live).flatten()

    def _settle(self, races: torch.Tensor) -> None:
        """Decide races whose smallest not-rejected try has finished."""
        nodes, seqs = self.nodes, self.seqs
        members = self._members(races)
        mb = seqs.i.index_select(0, members)
        owner = mb[:, S_OWNER]
        packed = torch.where(mb[:, S_STATUS] == REJECTED, _BIG, (mb[:, S_INDEX] << 32) | members)
        best = torch.full((nodes.capacity,), _BIG, dtype=torch.long, device=self.device)
        best.scatter_reduce_(0, owner, packed, reduce="amin")
        best = best[races]
        exhausted = best == _BIG
        candidate = torch.where(exhausted, 0, best & 0xFFFFFFFF)
        won = ~exhausted & (seqs.i[candidate, S_STATUS] == ACCEPTED)
        # every launched try rejected: free them, launch the next batch
        xi = torch.nonzero(exhausted).flatten()
        if xi.numel():
            out = races[xi]
            is_out = torch.zeros(nodes.capacity, dtype=torch.bool, device=self.device)
            is_out[out] = True
            self._free_seqs(members[is_out[owner]])
            self._launch(out)
        wi = torch.nonzero(won).flatten()
        if wi.numel() == 0:
            return
        winners, owners = candidate[wi], races[wi]
        nodes.f[owners, F_LOG_MU] = seqs.f[winners, 0]
        nodes.i[owners, N_NEXT] = seqs.i[winners, S_CARRY]
        seqs.i[winners, S_CARRY] = -1
        self.problem.commit(winners, nodes.i[owners, N_SEQ])
        losers = self._members(owners)
        is_winner = torch.zeros(seqs.capacity, dtype=torch.bool, device=self.device)
        is_winner[winners] = True
        self._free_seqs(winners)
        # Flag the owners done before cancelling: an owner inside a cancelled subtree (a race
        # decided in the same step as an enclosing one) is then freed with its flags cleared.
        nodes.i[owners.unsqueeze(1), self._done_cols] = self._done_vals
        self._kill(losers[~is_winner[losers]])

    def _kill(self, frontier: torch.Tensor) -> None:
        """Cancel sequences with everything below them (their blocks, races and tries)."""
        nodes, seqs = self.nodes, self.seqs
        while frontier.numel():
            child = seqs.i[frontier, S_CHILD]
            child = child[child >= 0]
            self._free_seqs(frontier)
            if child.numel() == 0:
                return
            racing = child[nodes.i[child, N_STATE] == RACING]
            self._free_nodes(child)
            if racing.numel() == 0:
                return
            frontier = self._members(racing)
