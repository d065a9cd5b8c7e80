"""Token-level samplers on ``[q]^n`` as tensor programs: the baselines beside autospeculation.

Every draw walks its order ``sigma`` from position ``t = 0`` to ``n``. Each round, every draw
in flight has exactly one request: its *draft row* (marginals of the next window given
``sigma[:t]``) or the *verification* of a drafted window (a chain query, plus the prefetch of
the next window's draft row). All draws advance together, one batched oracle call per round.

* ``"sequential"``: windows of one coordinate, drawn from their exact row (``n`` rounds).
* ``"gumbel_sequential"``: the same with the fixed Gumbel noise of ``"agr24"``: the
  path-by-path reference of ``"agr24"``.
* ``"speculative"``: token-level self-speculation (speculative decoding without a draft model):
  draft ``k`` coordinates from the draft row, verify them in one round, accept token by token
  with ``min(1, mu / nu)`` and resample the first rejected one from ``(mu - nu)_+``. Exact.
* ``"agr24"``: the Gumbel-window sampler reconstructed from Anari, Gao and Rubinstein (STOC 2024)
  [2]_: fixed Gumbel noise per position, a window of ``ceil(scale (t / log q)^(1/3))`` drafted
  by Gumbel-max from the marginals given the prefix, every drafted coordinate recomputed given
  the drafted ones before it, keeping the longest agreeing prefix plus the first recomputed
  coordinate. It equals the sequential Gumbel-max sampler path by path. Exact.

* ``"autospec"`` with an adaptive token schedule (:class:`~pyro_autospec.engine.schedule.
  BlockPolicy` with every window sampled token by token, the default): ``"speculative"`` whose
  windows follow the policy, each draw's from its own past (windows of one coordinate are
  drawn from their row, as the recursion's leaves). It takes the same draws, rounds and rows
  as the recursion (:mod:`pyro_autospec.engine.recursion`) with the same schedule, on the
  token methods' lighter bookkeeping.

Randomness is keyed (:mod:`pyro_autospec.engine.keys`): the window starting at ``t`` of draw
``s`` has key ``child(draw, LEAF, t)`` (draft noise, acceptance uniforms, resampling noise);
the fixed Gumbels of ``"agr24"`` are ``gumbel(draw, NOISE, t * q + v)``.

References
----------
.. [2] N. Anari, R. Gao, A. Rubinstein. Parallel Sampling via Counting. STOC 2024,
   arXiv:2408.09442.
"""

from __future__ import annotations

import math

import torch

from pyro_autospec.engine import keys
from pyro_autospec.engine.discrete import value_dtype
from pyro_autospec.engine.modes import engine_mode
from pyro_autospec.engine.rejection import accept_draft
from pyro_autospec.engine.result import host_output
from pyro_autospec.engine.rows import Answer, OracleRows
from pyro_autospec.engine.schedule import BlockPolicy, token_only

__all__ = ["WindowSampler", "agr24_window", "TOKEN_METHODS"]

TOKEN_METHODS = ("sequential", "gumbel_sequential", "speculative", "agr24")
_WAIT_ROW, _WAIT_VERIFY = 1, 2


def agr24_window(t: torch.Tensor, q: int, scale: float) -> torch.Tensor:
    """AGR24's window after ``t`` fixed coordinates: ``ceil(scale (t / log q)^(1/3))``, >= 1."""
    return torch.clamp(
        torch.ceil(scale * (t.double() / max(math.log(q), 1e-12)) ** (1.0 / 3.0)), min=1
    ).long()


class WindowSampler:
    """Run a token-level method for ``num_draws`` draws.

    Parameters
    ----------
    rows : OracleRows
    draw_keys : LongTensor[D]
        Keys of the draws (:func:`pyro_autospec.engine.keys.draw_keys`).
    method : {"sequential", "gumbel_sequential", "speculative", "agr24"}
    window : int
        ``"speculative"``: tokens drafted per window.
    window_scale : float
        ``"agr24"``: scale of the window.
    max_rows_per_round, max_concurrent_draws, progress :
        As in :class:`~pyro_autospec.engine.recursion.Recursion`.
    """

    def __init__(
        self,
        rows: OracleRows,
        draw_keys: torch.Tensor,
        method: str,
        *,
        window: int = 8,
        window_scale: float = 1.0,
        max_rows_per_round: int | None = None,
        max_concurrent_draws: int | None = None,
        progress: bool = False,
        policy: BlockPolicy | None = None,
    ):
        if method == "autospec":
            if policy is None or not token_only(policy):
                raise ValueError("method 'autospec' here needs an adaptive all-token policy")
        elif method not in TOKEN_METHODS:
            raise ValueError(f"method must be one of {TOKEN_METHODS}, got {method!r}")
        self.rows = rows
        self.method = method
        self.policy = policy
        self.device = dev = rows.device
        self.n, self.q = rows.n, rows.q
        self.num_draws = int(draw_keys.numel())
        self.window = int(window)
        self.window_scale = float(window_scale)
        self.cap = max_rows_per_round
        self.progress = progress
        lanes = min(int(max_concurrent_draws or self.num_draws), self.num_draws)
        self.draw_keys = draw_keys.to(dev)
        if method in ("sequential", "gumbel_sequential"):
            self.width = 1
        elif method == "speculative":
            self.width = min(self.window, self.n)
        elif method == "autospec":
            self.width = min(int(policy.max_block), self.n)
        else:
            self.width = int(agr24_window(torch.tensor([self.n]), self.q, self.window_scale))
            self.width = min(self.width, self.n)
        self.frames = torch.zeros(lanes, self.n, dtype=value_dtype(self.q), device=dev)
        self.draw = torch.full((lanes,), -1, dtype=torch.long, device=dev)
        self.t = torch.zeros(lanes, dtype=torch.long, device=dev)
        self.state = torch.zeros(lanes, dtype=torch.long, device=dev)
        self.stamp = torch.zeros(lanes, dtype=torch.long, device=dev)
        self.log_mu = torch.zeros(lanes, dtype=torch.float64, device=dev)
        self.draft_rows = torch.zeros(lanes, self.width, self.q, dtype=torch.float64, device=dev)
        self.k = torch.zeros(lanes, dtype=torch.long, device=dev)  # current window
        # "autospec": each lane's policy window, and its token windows' kept coordinates and
        # rejected tokens so far (what the next window is chosen from)
        self.win = torch.zeros(lanes, dtype=torch.long, device=dev)
        self.tokens = torch.zeros(lanes, dtype=torch.long, device=dev)
        self.misses = torch.zeros(lanes, dtype=torch.long, device=dev)
        self.samples = host_output((self.num_draws, self.n), torch.long)  # filled at finish
        self.log_prob = torch.full((self.num_draws,), math.nan, dtype=torch.float64, device=dev)
        self.sample_rounds = torch.zeros(self.num_draws, dtype=torch.long, device=dev)
        self.rounds = self.total_rows = 0
        self.started = self.finished = 0
        self.clock = 0

    # ---------------------------------------------------------------------------- windows
    def _size(self, t: torch.Tensor, lanes: torch.Tensor | None = None) -> torch.Tensor:
        """Window drafted at position ``t`` (clipped to the end) by ``lanes`` ("autospec")."""
        if self.method == "autospec":
            size = self.win[lanes]
        elif self.method in ("sequential", "gumbel_sequential"):
            size = torch.ones_like(t)
        elif self.method == "speculative":
            size = torch.full_like(t, self.window)
        else:
            size = agr24_window(t, self.q, self.window_scale)
        return torch.minimum(size, self.n - t)

    def _next_size(self, t: torch.Tensor, k: torch.Tensor, lanes: torch.Tensor) -> torch.Tensor:
        """Width of the draft row prefetched with the verification of the window ``(t, t + k]``
        of ``lanes``: the next window if all of it is kept (0 at the end)."""
        if self.method != "autospec":
            return self._size(t + k)
        token = torch.ones_like(k, dtype=torch.bool)
        win = self.win[lanes]
        after = self.policy.prefetch(win, token, self.tokens[lanes], self.misses[lanes])
        return torch.minimum(after, self.n - t - k)

    def _set_stamp(self, lanes: torch.Tensor) -> None:
        self.stamp[lanes] = torch.arange(self.clock, self.clock + lanes.numel(), device=self.device)
        self.clock += lanes.numel()

    def _start(self) -> None:
        free = torch.nonzero(self.draw < 0).flatten()
        count = min(free.numel(), self.num_draws - self.started)
        if count <= 0:
            return
        lanes = free[:count]
        draws = torch.arange(self.started, self.started + count, device=self.device)
        self.draw[lanes] = draws
        self.rows.start(draws)
        self.started += count
        self.t[lanes] = 0
        if self.method == "autospec":
            self.win[lanes] = self.policy.start_window()
            self.tokens[lanes] = 0
            self.misses[lanes] = 0
        self.log_mu[lanes] = 0.0
        self.frames[lanes] = 0
        self.state[lanes] = _WAIT_ROW
        self._set_stamp(lanes)

    def _finish(self, lanes: torch.Tensor) -> None:
        if lanes.numel() == 0:
            return
        draws = self.draw[lanes]
        self.samples.index_copy_(0, draws.cpu(), self.frames[lanes].long().cpu())
        self.log_prob[draws] = self.log_mu[lanes]
        self.rows.finish(draws)
        self.draw[lanes] = -1
        self.state[lanes] = 0
        self.finished += int(lanes.numel())

    def _coords(self, lanes: torch.Tensor, start: torch.Tensor, count: int) -> torch.Tensor:
        pos = (start.unsqueeze(1) + torch.arange(count, device=self.device)).clamp(max=self.n - 1)
        return self.rows.coords(self.draw[lanes], pos)

    def _noise(self, lanes: torch.Tensor, width: int) -> torch.Tensor:
        """Draft noise [L, width, q] of the window at ``t`` of each lane."""
        draw_keys = self.draw_keys[self.draw[lanes]].unsqueeze(1)
        return self._window_noise(draw_keys, self.t[lanes].unsqueeze(1), width)[:, 0]

    def _window_noise(self, draw_keys: torch.Tensor, t: torch.Tensor, width: int) -> torch.Tensor:
        """Draft noise [L, S, width, q] of the windows starting at ``t`` [L, S] (broadcast) of
        the draws of keys ``draw_keys`` [L, 1]: Gumbels keyed by the draw and the position
        (``"gumbel_sequential"``, ``"agr24"``) or by the window (``child(draw, LEAF, t)``)."""
        j = torch.arange(width, device=self.device).view(1, 1, width, 1)
        v = torch.arange(self.q, device=self.device)
        if self.method in ("gumbel_sequential", "agr24"):
            counter = (t.unsqueeze(-1).unsqueeze(-1) + j) * self.q + v
            return keys.gumbel(draw_keys.view(-1, 1, 1, 1), keys.Tag.NOISE, counter)
        window_keys = keys.child(draw_keys, keys.Tag.LEAF, t)  # [L, S]
        return keys.gumbel(
            window_keys.view(*window_keys.shape, 1, 1), keys.Tag.DRAFT, j * self.q + v
        )

    def _draft(self, lanes: torch.Tensor) -> None:
        """Draft the window of every lane from its draft row; finish a last lone coordinate."""
        if lanes.numel() == 0:
            return
        t = self.t[lanes]
        k = self._size(t, lanes)
        self.k[lanes] = k
        width = int(k.max())
        data = self.draft_rows[lanes, :width]
        x = torch.argmax(data + self._noise(lanes, width), dim=-1)
        valid = torch.arange(width, device=self.device).unsqueeze(0) < k.unsqueeze(1)
        coords = self._coords(lanes, t, width)
        lane_grid = lanes.unsqueeze(1).expand_as(coords)
        self.frames[lane_grid[valid], coords[valid]] = x[valid].to(self.frames.dtype)
        if self.method == "autospec":  # a window of one coordinate: the recursion's leaf
            lone = k == 1
        else:  # the last coordinate, drawn from its exact row
            lone = (k == 1) & (self._next_size(t, k, lanes) == 0)
        if bool(lone.any()):
            done = lanes[lone]
            self.log_mu[done] += data[lone, 0].gather(1, x[lone, :1]).squeeze(1)
            self.t[done] += 1
            if self.method == "autospec":
                self._windows_kept(done, torch.ones_like(done), torch.zeros_like(done))
                ended = self.t[done] >= self.n
                self._finish(done[ended])
                going = done[~ended]
                self.state[going] = _WAIT_ROW
                self._set_stamp(going)
            else:
                self._finish(done)
        rest = lanes[~lone]
        if self.method in ("sequential", "gumbel_sequential"):
            # no verification: the coordinate is drawn from its exact row
            self.log_mu[rest] += data[~lone, 0].gather(1, x[~lone, :1]).squeeze(1)
            self.t[rest] += 1
            ended = rest[self.t[rest] >= self.n]
            self._finish(ended)
            going = rest[self.t[rest] < self.n]
            self.state[going] = _WAIT_ROW
            self._set_stamp(going)
            return
        self.state[rest] = _WAIT_VERIFY
        self._set_stamp(rest)

    def _windows_kept(self, lanes, kept, missed) -> None:
        """The token windows of ``lanes`` kept ``kept`` coordinates, ``missed``
        (0 or 1) of them redrawn after a rejection ("autospec"): choose each lane's next window."""
        self.tokens[lanes] += kept
        self.misses[lanes] += missed
        full = missed == 0
        token = torch.ones_like(full)
        window, _ = self.policy.next_block(
            self.win[lanes], token, full, kept, self.tokens[lanes], self.misses[lanes]
        )
        self.win[lanes] = window

    # ----------------------------------------------------------------------------- rounds
    @engine_mode()
    def run(self):
        if self._in_lockstep():
            self._lockstep()
            return
        bar = None
        if self.progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=self.num_draws, desc=self.method, unit="draw")
        try:
            self._start()
            while self.finished < self.num_draws:
                self._round()
                self._start()
                if bar is not None:
                    bar.n = self.finished
                    bar.set_postfix(rounds=self.rounds, rows=self.total_rows, refresh=False)
                    bar.refresh()
        finally:
            if bar is not None:
                bar.close()

    def _in_lockstep(self) -> bool:
        """One coordinate per round, every draw in flight from the start, rounds not split."""
        return (
            self.method in ("sequential", "gumbel_sequential")
            and 0 < self.draw.numel() == self.num_draws
            and (self.cap is None or self.cap >= self.num_draws)
        )

    def _lockstep(self) -> None:
        """The sequential methods when :meth:`_in_lockstep`: round ``t`` draws position ``t``
        of every draw. The same rows, noise and arithmetic as the general loop (so the same
        draws), without its per-lane bookkeeping: the partial samples are kept dense, and the
        noise of many steps is drawn at once."""
        num, n = self.num_draws, self.n
        lanes = torch.arange(num, device=self.device)
        self.draw[:] = lanes
        self.rows.start(lanes)
        self.started = num
        values = torch.zeros(num, n, dtype=torch.long, device=self.device)
        mask = torch.zeros(num, n, dtype=torch.bool, device=self.device)
        # [n, D]: coordinate of step t of each draw
        coords = self.rows.orders_of(lanes).t().contiguous()
        flat = coords + (lanes * n).unsqueeze(0)  # the same, as indices into values.view(-1)
        window = max(1, min(n, keys.NOISE_ENTRIES // max(1, num * self.q)))
        draw_keys = self.draw_keys[lanes].unsqueeze(1)  # [D, 1]
        bar = None
        if self.progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=n, desc=self.method, unit="step")
        try:
            for t in range(n):
                if t % window == 0:  # the noise of steps t .. t + window - 1: [D, window, q]
                    ts = torch.arange(t, min(n, t + window), device=self.device)
                    noise = self._window_noise(draw_keys, ts.unsqueeze(0), 1)[:, :, 0]
                answer = self.rows.next_rows(values, mask, coords[t])
                OracleRows.raise_bad(
                    answer,
                    answer.bad,
                    "draft row {row} (target {target}), conditioned on a prefix of an exact "
                    "sample,",
                )
                data = answer.log_probs[:, 0]  # [D, q]
                x = torch.argmax(data + noise[:, t % window], dim=-1)  # [D]
                values.view(-1).index_copy_(0, flat[t], x)
                mask.view(-1).index_fill_(0, flat[t], True)
                self.log_mu += data.gather(1, x.unsqueeze(1)).squeeze(1)
                if bar is not None:
                    bar.update(1)
        finally:
            if bar is not None:
                bar.close()
        self.frames.copy_(values)
        self.rounds = n
        self.total_rows = n * num
        self.sample_rounds.fill_(n)
        self.t.fill_(n)
        self._finish(lanes)

    def _round(self) -> None:
        lanes = torch.nonzero(self.state > 0).flatten()
        verify = self.state[lanes] == _WAIT_VERIFY
        t, k = self.t[lanes], self.k[lanes]
        nxt = torch.where(verify, self._next_size(t, k, lanes), 0)
        rows = torch.where(verify, k - 1 + (nxt > 0).long(), 1)
        if self.cap is not None:
            order = torch.argsort(self.stamp[lanes])
            lanes, verify, t, k, nxt, rows = (x[order] for x in (lanes, verify, t, k, nxt, rows))
            keep = rows.cumsum(0) <= self.cap
            keep[0] = True
            lanes, verify, t, k, nxt, rows = (x[keep] for x in (lanes, verify, t, k, nxt, rows))
        self.rounds += 1
        self.total_rows += int(rows.sum())
        self.sample_rounds[self.draw[lanes]] += 1
        want_row = lanes[~verify]
        vl, vt, vk, vn = lanes[verify], t[verify], k[verify], nxt[verify]
        pre = vn > 0
        draw = self.draw
        row_req = (
            torch.cat([want_row, vl[pre]]),
            torch.cat([draw[want_row], draw[vl[pre]]]),
            torch.cat([t[~verify], (vt + vk)[pre]]),
            torch.cat([t[~verify], (vt + vk)[pre]]),
            torch.cat([self._size(t[~verify], want_row), vn[pre]]),
        )
        long_chain = vk > 1
        chains = (vl[long_chain], draw[vl[long_chain]], (vt + 1)[long_chain], (vk - 1)[long_chain])
        row_answer, chain_answer = self.rows.ask(
            self.frames,
            row_req if row_req[0].numel() else None,
            chains if chains[0].numel() else None,
        )
        nr = want_row.numel()
        if nr:
            OracleRows.raise_bad(
                row_answer.part(slice(0, nr)),
                row_answer.bad[:nr],
                "draft row {row} (target {target}), conditioned on a prefix of an exact sample,",
            )
            width = row_answer.log_probs.shape[1]
            self.draft_rows[want_row, :width] = row_answer.log_probs[:nr]
        if vl.numel():
            prefetch = row_answer.part(slice(nr, None)) if bool(pre.any()) else None
            self._verify(vl, vt, vk, vn, long_chain, chain_answer, prefetch)
        self._draft(want_row)

    def _verify(self, lanes, t, k, nxt, long_chain, chain_answer, prefetch) -> None:
        width = max(int(k.max()), 2)  # tokens 1.. exist in the padded view
        data = (
            self.draft_rows[lanes, :width]
            if self.width >= width
            else torch.cat([self.draft_rows[lanes], self.draft_rows[lanes, :1]], 1)
        )
        coords = self._coords(lanes, t, width)
        x = self.frames[lanes.unsqueeze(1), coords].long()  # drafted window [L, width]
        num = lanes.numel()
        q = self.q
        # target rows of tokens 1..k-1 (token 0's target row is its draft row)
        target = torch.zeros(num, width - 1, q, dtype=torch.float64, device=self.device)
        bad = torch.zeros(num, width - 1, dtype=torch.bool, device=self.device)
        mass = torch.zeros(num, width - 1, dtype=torch.float64, device=self.device)
        if chain_answer is not None:
            length = chain_answer.log_probs.shape[1]
            target[long_chain, :length] = chain_answer.log_probs
            bad[long_chain, :length] = chain_answer.bad
            mass[long_chain, :length] = chain_answer.log_mass
        j = torch.arange(1, width, device=self.device).unsqueeze(0)  # tokens 1..
        in_window = j < k.unsqueeze(1)
        xt = x[:, 1:]
        target_x = target.gather(2, xt.unsqueeze(-1)).squeeze(-1)
        if self.method in ("speculative", "autospec"):
            draft_x = data[:, 1:].gather(2, xt.unsqueeze(-1)).squeeze(-1)
            key = keys.child(self.draw_keys[self.draw[lanes]], keys.Tag.LEAF, t)
            u = keys.uniform(key.unsqueeze(1), keys.Tag.ACCEPT, j)
            keep = accept_draft(target_x - draft_x, u) & in_window
        else:  # agr24: the recomputed coordinate must agree with the draft
            noise = self._fixed_noise(lanes, t, j)
            y = torch.argmax(target + noise, dim=-1)
            keep = (y == xt) & in_window
        # first rejected (or disagreeing) token J in 1..k-1, or k when all pass
        stop = torch.where(~keep & in_window, j, k.unsqueeze(1)).min(1).values
        checked = (j <= stop.unsqueeze(1)) & in_window  # rows conditioned on accepted tokens
        OracleRows.raise_bad(
            Answer(target, bad & checked, mass),
            bad & checked,
            "verification row {target} of window {row} of the round",
        )
        first = data[:, 0].gather(1, x[:, :1]).squeeze(1)
        before = torch.where(j < stop.unsqueeze(1), target_x, 0.0).sum(1)
        log_mu = first + before
        rejected = stop < k
        rl = lanes[rejected]
        if rl.numel():
            js = stop[rejected]
            rows_j = (
                target[rejected].gather(1, (js - 1).view(-1, 1, 1).expand(-1, 1, q)).squeeze(1)
            )  # [R, q]
            coord = self.rows.coords(self.draw[rl], t[rejected] + js)
            if self.method in ("speculative", "autospec"):
                draft_j = data[rejected].gather(1, js.view(-1, 1, 1).expand(-1, 1, q)).squeeze(1)
                residual = (rows_j.exp() - draft_j.exp()).clamp(min=0.0)
                log_residual = torch.log(residual / residual.sum(1, keepdim=True))
                key = keys.child(self.draw_keys[self.draw[rl]], keys.Tag.LEAF, t[rejected])
                v = torch.arange(q, device=self.device).unsqueeze(0)
                g = keys.gumbel(key.unsqueeze(1), keys.Tag.RESAMPLE, v)
                yj = torch.argmax(log_residual + g, dim=-1)
            else:
                yj = torch.argmax(
                    rows_j + self._fixed_noise(rl, t[rejected], js.unsqueeze(1))[:, 0], -1
                )
            self.frames[rl, coord] = yj.to(self.frames.dtype)
            log_mu[rejected] += rows_j.gather(1, yj.unsqueeze(1)).squeeze(1)
        self.log_mu[lanes] += log_mu
        advance = torch.where(rejected, stop + 1, k)
        self.t[lanes] = t + advance
        if self.method == "autospec":
            self._windows_kept(lanes, advance, rejected.long())
        ended = self.t[lanes] >= self.n
        self._finish(lanes[ended])
        # all accepted with a prefetched row: draft the next window at once
        go_on = ~rejected & ~ended
        with_row = go_on & (nxt > 0)
        if prefetch is not None:
            has = nxt > 0
            OracleRows.raise_bad(
                prefetch,
                prefetch.bad & with_row[has].unsqueeze(1),
                "prefetched draft row {row} (target {target}), conditioned on an accepted window,",
            )
            pw = prefetch.log_probs.shape[1]
            self.draft_rows[lanes[has], :pw] = prefetch.log_probs
        again = lanes[with_row]
        wait = lanes[(go_on & ~with_row) | (rejected & ~ended)]
        self.state[wait] = _WAIT_ROW
        self._set_stamp(wait)
        self._draft(again)

    def _fixed_noise(self, lanes: torch.Tensor, t: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        """AGR24's fixed Gumbels of positions ``t + j``: [L, J, q]."""
        key = self.draw_keys[self.draw[lanes]].view(-1, 1, 1)
        v = torch.arange(self.q, device=self.device).view(1, 1, self.q)
        pos = (t.view(-1, 1) + j).clamp(max=self.n - 1).unsqueeze(-1)
        return keys.gumbel(key, keys.Tag.NOISE, pos * self.q + v)
