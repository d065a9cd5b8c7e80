"""Autospeculation as a tensor program: the recursion of every draw, block and thread at once.

This is the fast engine's recursion (the reference is the generator recursion in
:mod:`pyro_autospec.engine.reference`). Its state is two :class:`~pyro_autospec.engine.tables.
Table`\\ s:

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
from pyro_autospec.engine.rejection import accept_draft, accept_residual
from pyro_autospec.engine.tables import Table

__all__ = ["Recursion", "RunCounts", "next_batch", "leaf_starts"]

# node states
FREE, WAIT_ROW, WAIT_VERIFY, RACING, BUSY = 0, 1, 2, 3, 4
# sequence statuses
RUNNING, ACCEPTED, REJECTED = 0, 1, 2
_BIG = torch.iinfo(torch.int64).max


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


def leaf_starts(n: int, max_block: int) -> list[int]:
    """Boundaries ``0 = L_0 < ... < L_m = n`` of the top-level leaves.

    A block larger than ``max_block`` is cut between its ``k = ceil(size / max_block)`` leaves,
    half of them on each side, recursively, so every leaf has ``floor`` or ``ceil`` of
    ``n / k`` coordinates (about ``max_block``). Any cut keeps the output exact: it is the
    chain rule.

    Examples
    --------
    >>> leaf_starts(10, 4)
    [0, 3, 6, 8, 10]
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


@dataclass
class RunCounts:
    """What a run cost: rounds (whole run), rows, and rounds per draw."""

    rounds: int
    rows: int
    sample_rounds: torch.Tensor


class Recursion:
    """Run autospeculation for ``num_draws`` draws of a problem.

    Parameters
    ----------
    problem : DiscreteBlocks or EulerBlocks
        Drafts, verifies and stores blocks (see the module docstring).
    draw_keys : LongTensor[D]
        Keys of the draws (:func:`pyro_autospec.engine.keys.draw_keys`); draw ``k`` of this
        run is stored at index ``k``.
    max_block : int
        Largest block that is speculated; larger top-level blocks are cut into leaves.
    rho : float
        Batch growth of residual tries (the problem may set it per race, see
        ``problem.race_rho``).
    max_rows_per_round : int or None
        Cap on rows per round; the oldest requests go first (at least one per round).
    max_concurrent_draws : int or None
        Draws in flight at once; new draws start as earlier ones finish (continuous batching).
    progress : bool or callable
        A tqdm bar over finished draws.
    """

    def __init__(
        self,
        problem,
        draw_keys: torch.Tensor,
        *,
        max_block: int,
        rho: float,
        max_rows_per_round: int | None = None,
        max_concurrent_draws: int | None = None,
        progress: bool = False,
        desc: str = "autospec",
    ):
        self.problem = problem
        self.device = problem.device
        self.n = problem.num_positions
        self.num_draws = int(draw_keys.numel())
        self.rho = float(rho)
        self.max_rows_per_round = max_rows_per_round
        self.concurrency = int(max_concurrent_draws or self.num_draws)
        self.progress = progress
        self.desc = desc
        dev = self.device
        self.draw_keys = draw_keys.to(dev)
        self.leaves = torch.tensor(leaf_starts(self.n, max_block), device=dev)
        self.num_leaves = len(self.leaves) - 1
        long, f64, boolean = torch.long, torch.float64, torch.bool
        capacity = 4 * min(self.concurrency, self.num_draws) + 64
        self.nodes = Table(
            {
                "draw": ((), long, 0),
                "seq": ((), long, -1),
                "a": ((), long, 0),
                "b": ((), long, 0),
                "nxt": ((), long, 0),
                "key": ((), long, 0),
                "state": ((), long, FREE),
                "stamp": ((), long, 0),
                "row": ((), long, -1),
                "owns_row": ((), boolean, False),
                "next_row": ((), long, -1),
                "log_mu": ((), f64, 0.0),
                "race_next": ((), long, 1),
                "race_batch": ((), long, 0),
                "race_rho": ((), f64, 1.0),
                "ready": ((), boolean, False),
                "done": ((), boolean, False),
                "settle": ((), boolean, False),
            },
            dev,
            capacity,
        )
        self.seqs = Table(
            {
                "draw": ((), long, 0),
                "owner": ((), long, -1),  # racing node of a thread; -1 for a root
                "index": ((), long, 0),  # thread index
                "key": ((), long, 0),
                "a": ((), long, 0),
                "b": ((), long, 0),
                "nxt": ((), long, 0),
                "stage": ((), long, 0),
                "child": ((), long, -1),
                "log_mu": ((), f64, 0.0),
                "status": ((), long, RUNNING),
                "carry_row": ((), long, -1),
            },
            dev,
            capacity,
        )
        problem.bind(self)
        self._leaf_tag = keys.tag_tensor(keys.Tag.LEAF, self.leaves)
        self._child_tag = keys.tag_tensor(keys.Tag.CHILD, self.leaves)
        self.stamp = 0
        self.rounds = 0
        self.rows = 0
        self.sample_rounds = torch.zeros(self.num_draws, dtype=long, device=dev)
        self.log_prob = torch.full((self.num_draws,), math.nan, dtype=f64, device=dev)
        self.started = 0
        self.finished = 0

    # ----------------------------------------------------------------------------- helpers
    def _stamp(self, nodes: torch.Tensor) -> None:
        k = nodes.numel()
        self.nodes["stamp"][nodes] = torch.arange(self.stamp, self.stamp + k, device=self.device)
        self.stamp += k

    def _new_nodes(self, seq, a, b, nxt, key, row, owns_row) -> torch.Tensor:
        """Nodes ``(a, b]`` of sequences ``seq``; ready if they have a row, else waiting."""
        nodes = self.nodes
        ids = nodes.alloc(seq.numel())
        if ids.numel() == 0:
            return ids
        nodes["draw"][ids] = self.seqs["draw"][seq]
        nodes["seq"][ids] = seq
        nodes["a"][ids] = a
        nodes["b"][ids] = b
        nodes["nxt"][ids] = nxt
        nodes["key"][ids] = key
        nodes["row"][ids] = row
        nodes["owns_row"][ids] = owns_row
        has_row = row >= 0
        nodes["state"][ids] = torch.where(has_row, BUSY, WAIT_ROW)
        nodes["ready"][ids] = has_row
        waiting = ids[~has_row]
        if waiting.numel():
            self._stamp(waiting)
        self.seqs["child"][seq] = ids
        return ids

    def _free_nodes(self, ids: torch.Tensor) -> None:
        """Free nodes with the rows they own (draft rows they own, prefetched next rows)."""
        if ids.numel() == 0:
            return
        nodes = self.nodes
        owned = ids[nodes["owns_row"][ids]]
        rows = torch.cat([nodes["row"][owned], nodes["next_row"][ids]])
        self.problem.free_rows(rows[rows >= 0])
        for flag in ("ready", "done", "settle"):
            nodes[flag][ids] = False
        nodes["state"][ids] = FREE
        nodes["row"][ids] = -1
        nodes["next_row"][ids] = -1
        nodes.free(ids)

    def _reset_seqs(self, ids: torch.Tensor) -> None:
        """Fields a new sequence must start from (rows are reused without a fill)."""
        seqs = self.seqs
        seqs["stage"][ids] = 0
        seqs["log_mu"][ids] = 0.0
        seqs["status"][ids] = RUNNING

    def _free_seqs(self, ids: torch.Tensor) -> None:
        if ids.numel() == 0:
            return
        carry = self.seqs["carry_row"][ids]
        self.problem.free_rows(carry[carry >= 0])
        self.seqs["carry_row"][ids] = -1
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
        seqs = self.seqs
        ids = seqs.alloc(count)
        seqs["draw"][ids] = draws
        seqs["owner"][ids] = -1
        seqs["key"][ids] = self.draw_keys[draws]
        seqs["a"][ids] = 0
        seqs["b"][ids] = self.n
        seqs["nxt"][ids] = self.n
        self._reset_seqs(ids)
        self.problem.init_frames(ids, draws)
        first = self._child_bounds(ids, torch.zeros_like(ids))
        self._new_nodes(
            ids, *first, torch.full_like(ids, -1), torch.zeros_like(ids, dtype=torch.bool)
        )

    def _child_bounds(self, seq: torch.Tensor, stage: torch.Tensor):
        """``(a, b, nxt, key)`` of child ``stage`` of each sequence."""
        seqs = self.seqs
        is_root = seqs["owner"][seq] < 0
        lo, hi = seqs["a"][seq], seqs["b"][seq]
        mid = (lo + hi) // 2
        leaves = self.leaves
        m = self.num_leaves
        # roots: leaves L_stage, L_stage+1 (and L_stage+2 for the prefetch); threads: lo, mid, hi
        j = stage.clamp(max=m)
        root_a = leaves[j]
        root_b = leaves[(j + 1).clamp(max=m)]
        root_nxt = leaves[(j + 2).clamp(max=m)]
        thread_a = torch.where(stage == 0, lo, mid)
        thread_b = torch.where(stage == 0, mid, hi)
        thread_nxt = torch.where(stage == 0, hi, seqs["nxt"][seq])
        a = torch.where(is_root, root_a, thread_a)
        b = torch.where(is_root, root_b, thread_b)
        nxt = torch.where(is_root, root_nxt, thread_nxt)
        tag = torch.where(is_root, self._leaf_tag, self._child_tag)
        key = keys.child(seqs["key"][seq], tag, torch.where(is_root, a, stage))
        return a, b, nxt, key

    # ------------------------------------------------------------------------------ rounds
    @torch.inference_mode()
    def run(self) -> RunCounts:
        """Run every draw to completion; return the counts (samples stay in the problem)."""
        bar = None
        if self.progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=self.num_draws, desc=self.desc, unit="draw")
        try:
            self._start_draws()
            while self.finished < self.num_draws:
                self._round()
                self._cascade()
                self._start_draws()
                if bar is not None:
                    bar.n = self.finished
                    bar.set_postfix(rounds=self.rounds, rows=self.rows, refresh=False)
                    bar.refresh()
        finally:
            if bar is not None:
                bar.n = self.finished
                bar.close()
        return RunCounts(self.rounds, self.rows, self.sample_rounds)

    def _round(self) -> None:
        nodes = self.nodes
        state = nodes["state"]
        waiting = torch.nonzero((state == WAIT_ROW) | (state == WAIT_VERIFY)).flatten()
        if waiting.numel() == 0:
            raise RuntimeError("internal error: draws in flight but no request pending")
        is_verify = state[waiting] == WAIT_VERIFY
        a, b, nxt = nodes["a"][waiting], nodes["b"][waiting], nodes["nxt"][waiting]
        rows = torch.where(is_verify, b - a - 1 + (nxt > b).long(), 1)
        if self.max_rows_per_round is not None:
            order = torch.argsort(nodes["stamp"][waiting])
            waiting, is_verify, rows = waiting[order], is_verify[order], rows[order]
            total = rows.cumsum(0)
            keep = total <= self.max_rows_per_round
            keep[0] = True
            waiting, is_verify, rows = waiting[keep], is_verify[keep], rows[keep]
        self.rounds += 1
        self.rows += int(rows.sum())
        self.sample_rounds[torch.unique(nodes["draw"][waiting])] += 1
        row_nodes, verify_nodes = waiting[~is_verify], waiting[is_verify]
        row_slots, log_ratio, log_mu, next_rows = self.problem.answer(row_nodes, verify_nodes)
        # draft rows arrived: those nodes start
        nodes["row"][row_nodes] = row_slots
        nodes["owns_row"][row_nodes] = True
        state[row_nodes] = BUSY
        nodes["ready"][row_nodes] = True
        if verify_nodes.numel() == 0:
            return
        u = keys.uniform(nodes["key"][verify_nodes], keys.Tag.ACCEPT, 0)
        accepted = accept_draft(log_ratio, u)
        good, bad = verify_nodes[accepted], verify_nodes[~accepted]
        nodes["log_mu"][good] = log_mu[accepted]
        nodes["next_row"][good] = next_rows[accepted]
        self.problem.accepted(good)
        state[good] = BUSY
        nodes["done"][good] = True
        dropped = next_rows[~accepted]
        self.problem.free_rows(dropped[dropped >= 0])
        if bad.numel():
            state[bad] = RACING
            nodes["race_next"][bad] = 1
            nodes["race_batch"][bad] = 0
            nodes["race_rho"][bad] = self.problem.race_rho(bad, log_ratio[~accepted], self.rho)
            self._launch(bad)

    # ----------------------------------------------------------------------------- cascade
    def _cascade(self) -> None:
        nodes = self.nodes
        while True:
            ready = torch.nonzero(nodes["ready"]).flatten()
            if ready.numel():
                nodes["ready"][ready] = False
                self._start(ready)
            done = torch.nonzero(nodes["done"]).flatten()
            if done.numel():
                nodes["done"][done] = False
                self._complete(done)
            settle = torch.nonzero(nodes["settle"]).flatten()
            if settle.numel():
                nodes["settle"][settle] = False
                self._settle(settle)
            if ready.numel() == 0 and done.numel() == 0 and settle.numel() == 0:
                return

    def _start(self, ready: torch.Tensor) -> None:
        nodes = self.nodes
        size = nodes["b"][ready] - nodes["a"][ready]
        leaf = size == 1
        leaves, blocks = ready[leaf], ready[~leaf]
        if leaves.numel():
            nodes["log_mu"][leaves] = self.problem.leaf(leaves)
            nodes["done"][leaves] = True
        if blocks.numel():
            self.problem.draft(blocks)
            nodes["state"][blocks] = WAIT_VERIFY
            self._stamp(blocks)

    def _complete(self, done: torch.Tensor) -> None:
        """Nodes that finished: advance their sequences."""
        nodes, seqs = self.nodes, self.seqs
        seq = nodes["seq"][done]
        seqs["log_mu"][seq] += nodes["log_mu"][done]
        next_row = nodes["next_row"][done]
        nodes["next_row"][done] = -1  # handed on below
        stage = seqs["stage"][seq] + 1
        is_root = seqs["owner"][seq] < 0
        last = torch.where(is_root, stage >= self.num_leaves, stage >= 2)
        self._free_nodes(done)
        seqs["child"][seq] = -1
        # sequences that go on: the next block, with the prefetched row if there is one
        go, go_row, go_stage = seq[~last], next_row[~last], stage[~last]
        if go.numel():
            seqs["stage"][go] = go_stage
            a, b, nxt, key = self._child_bounds(go, go_stage)
            self._new_nodes(go, a, b, nxt, key, go_row, go_row >= 0)
        # sequences that are finished
        end, end_row = seq[last], next_row[last]
        if end.numel() == 0:
            return
        seqs["carry_row"][end] = end_row
        roots = end[is_root[last]]
        if roots.numel():
            self._finish_draws(roots)
        threads = end[~is_root[last]]
        if threads.numel():
            self._finish_threads(threads)

    def _finish_draws(self, roots: torch.Tensor) -> None:
        draws = self.seqs["draw"][roots]
        self.log_prob[draws] = self.seqs["log_mu"][roots]
        self.problem.finish(roots, draws)
        self._free_seqs(roots)
        self.finished += int(roots.numel())

    def _finish_threads(self, threads: torch.Tensor) -> None:
        seqs = self.seqs
        owners = seqs["owner"][threads]
        log_mu = seqs["log_mu"][threads]
        if not bool((log_mu > -math.inf).all()):
            raise AssertionError("internal error: an exact try returned a value of probability 0")
        log_nu = self.problem.try_log_nu(threads, owners)
        u = keys.uniform(seqs["key"][threads], keys.Tag.ACCEPT, 0)
        accepted = accept_residual(log_mu - log_nu, u)
        seqs["status"][threads] = torch.where(accepted, ACCEPTED, REJECTED)
        rejected = threads[~accepted]
        carry = seqs["carry_row"][rejected]
        self.problem.free_rows(carry[carry >= 0])
        seqs["carry_row"][rejected] = -1
        self.nodes["settle"][owners] = True

    # ------------------------------------------------------------------------------- races
    def _launch(self, races: torch.Tensor) -> None:
        """Launch the next batch of tries of every race in ``races``."""
        nodes, seqs = self.nodes, self.seqs
        start = nodes["race_next"][races]
        stop, batch = next_batch(start, nodes["race_batch"][races], nodes["race_rho"][races])
        nodes["race_next"][races] = stop
        nodes["race_batch"][races] = batch
        count = stop - start
        owner = torch.repeat_interleave(races, count)
        first = torch.repeat_interleave(start - torch.cumsum(count, 0) + count, count)
        index = first + torch.arange(owner.numel(), device=self.device)
        threads = seqs.alloc(owner.numel())
        seqs["draw"][threads] = nodes["draw"][owner]
        seqs["owner"][threads] = owner
        seqs["index"][threads] = index
        seqs["key"][threads] = keys.child(nodes["key"][owner], keys.Tag.THREAD, index)
        seqs["a"][threads] = nodes["a"][owner]
        seqs["b"][threads] = nodes["b"][owner]
        seqs["nxt"][threads] = nodes["nxt"][owner]
        self._reset_seqs(threads)
        self.problem.spawn(threads, nodes["seq"][owner])
        zero = torch.zeros_like(threads)
        a, b, nxt, key = self._child_bounds(threads, zero)
        self._new_nodes(threads, a, b, nxt, key, nodes["row"][owner], zero.bool())

    def _settle(self, races: torch.Tensor) -> None:
        """Decide races whose smallest not-rejected try has finished."""
        nodes, seqs = self.nodes, self.seqs
        is_race = torch.zeros(nodes.capacity, dtype=torch.bool, device=self.device)
        is_race[races] = True
        owner = seqs["owner"]
        members = torch.nonzero(seqs.used & (owner >= 0)).flatten()
        members = members[is_race[owner[members]]]
        status = seqs["status"][members]
        packed = torch.where(status == REJECTED, _BIG, (seqs["index"][members] << 32) | members)
        best = torch.full((nodes.capacity,), _BIG, dtype=torch.long, device=self.device)
        best.scatter_reduce_(0, owner[members], packed, reduce="amin")
        best = best[races]
        exhausted = best == _BIG
        candidate = torch.where(exhausted, 0, best & 0xFFFFFFFF)
        won = ~exhausted & (seqs["status"][candidate] == ACCEPTED)
        # every launched try rejected: free them, launch the next batch
        out = races[exhausted]
        if out.numel():
            is_out = torch.zeros_like(is_race)
            is_out[out] = True
            self._free_seqs(members[is_out[owner[members]]])
            self._launch(out)
        if not bool(won.any()):
            return
        winners, owners = candidate[won], races[won]
        nodes["log_mu"][owners] = seqs["log_mu"][winners]
        nodes["next_row"][owners] = seqs["carry_row"][winners]
        seqs["carry_row"][winners] = -1
        self.problem.commit(winners, nodes["seq"][owners])
        is_decided = torch.zeros_like(is_race)
        is_decided[owners] = True
        owner = seqs["owner"]  # the table may have grown with the launches above
        members = torch.nonzero(seqs.used & (owner >= 0)).flatten()
        losers = members[is_decided[owner[members]]]
        is_winner = torch.zeros(seqs.capacity, dtype=torch.bool, device=self.device)
        is_winner[winners] = True
        self._free_seqs(winners)
        # Flag the owners done before cancelling: an owner inside a cancelled subtree (a race
        # decided in the same step as an enclosing one) is then freed with its flags cleared.
        nodes["state"][owners] = BUSY
        nodes["done"][owners] = True
        self._kill(losers[~is_winner[losers]])

    def _kill(self, frontier: torch.Tensor) -> None:
        """Cancel sequences with everything below them (their blocks, races and tries)."""
        nodes, seqs = self.nodes, self.seqs
        while frontier.numel():
            child = seqs["child"][frontier]
            child = child[child >= 0]
            self._free_seqs(frontier)
            if child.numel() == 0:
                return
            racing = child[nodes["state"][child] == RACING]
            self._free_nodes(child)
            if racing.numel() == 0:
                return
            is_dead = torch.zeros(nodes.capacity, dtype=torch.bool, device=self.device)
            is_dead[racing] = True
            members = torch.nonzero(seqs.used & (seqs["owner"] >= 0)).flatten()
            frontier = members[is_dead[seqs["owner"][members]]]
