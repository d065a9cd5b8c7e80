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
  drawn from their row, as the recursion's leaves). After a rejected token it does not spend
  a round on a fresh draft row: the next window is drafted from *stale* rows, the
  verification's rows of the tokens after the rejected one and the prefetched row, all
  conditioned on the drafted prefix, and its first token is verified too (a draft may be any
  distribution chosen from the past). The reference engine does the same
  (:func:`pyro_autospec.engine.reference.recursion.draw`), draw for draw.

**A host control plane.** The draws' bookkeeping (positions, windows, states, stamps, the
drafted tokens and the acceptance tests) lives on the host in NumPy arrays, whatever the
oracle's device. A round is a handful of tensor operations on the oracle's device: upload the
partial samples of the draws that ask and the requests (one copy each), the oracle's batched
call (:meth:`~pyro_autospec.engine.rows.OracleRows.ask`), and one copy of its answers back.
Everything else is array arithmetic on the host, vectorised over the draws of the round; the
keyed random numbers are computed there too (torch on the CPU, the functions the reference
engine calls).

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
import time

import numpy as np
import torch

from pyro_autospec.engine import keys
from pyro_autospec.engine.compiled import compiled_lock_step
from pyro_autospec.engine.host_rows import FreshInputs, HostRows
from pyro_autospec.engine.methods import DISCRETE, block_policy, method_names, on_cpu
from pyro_autospec.engine.modes import engine_mode
from pyro_autospec.engine.result import host_output
from pyro_autospec.engine.rows import Answer, OracleRows, normalise_rows, place_answers
from pyro_autospec.engine.schedule import token_only
from pyro_autospec.engine.stepping import run_rounds

__all__ = ["TokenSampler", "agr24_window", "TOKEN_METHODS"]

#: The discrete baselines, in the order of the registry
#: (:data:`~pyro_autospec.engine.methods.METHODS`): every discrete method but ``"autospec"``,
#: which runs here only as an all-token policy.
TOKEN_METHODS = tuple(name for name in method_names(DISCRETE) if name != "autospec")
_WAIT_ROW, _WAIT_VERIFY = 1, 2
#: How a bad row is named (``fields`` of :meth:`~pyro_autospec.engine.rows.OracleRows.raise_bad`
#: give the coordinate, the draw and the number of coordinates pinned)
_ROW_FOR = (
    "row for coordinate {coordinate} of draw {draw}, conditioned on {pinned} coordinates of "
    "an exact sample,"
)

#: A drafted value the target gives less than ``1e-12`` is taken as impossible when choosing
#: stale draft rows: the rows conditioned on it are conditioned on an event of zero
#: probability up to rounding (a determinant's or a ``1 - p``'s), so they hold rounding noise,
#: and drafting from them would make the draws depend on the oracle's last bits.
STALE_LOG_FLOOR = math.log(1e-12)


def agr24_window(t: np.ndarray, q: int, scale: float) -> np.ndarray:
    """AGR24's window after ``t`` fixed coordinates: ``ceil(scale (t / log q)^(1/3))``, >= 1.

    Examples
    --------
    >>> agr24_window(np.array([0, 100, 1000]), 4, 1.0).tolist()
    [1, 5, 9]
    """
    t = np.asarray(t, dtype=np.float64)
    window = np.ceil(scale * (t / max(math.log(q), 1e-12)) ** (1.0 / 3.0))
    return np.clip(window, 1, 2**53).astype(np.int64)  # the caller clips to what is left


#: Entries ``draws x window x q`` of the token rows a round holds on the host, above which
#: the draws in flight are capped by default (:func:`token_lanes`), on a CPU; 16 times more
#: elsewhere.
ROW_ENTRIES = 2**22
#: Coordinates of the draws in flight (``draws x n``) above which the draws in flight of the
#: windowed methods are capped by default (:func:`token_lanes`), on a CPU; 16 times more
#: elsewhere.
STATE_ENTRIES = 2**20


def token_width(method: str, knobs: dict, n: int, q: int) -> int:
    """The widest window a lane of :class:`TokenSampler` verifies in one round."""
    if method in ("sequential", "gumbel_sequential"):
        return 1
    if method == "speculative":
        return min(int(knobs.get("window", 8)), n)
    if method == "autospec":
        return min(int(knobs["max_block"]), n)
    scale = float(knobs.get("window_scale", 1.0))
    return min(int(agr24_window(np.array([n]), q, scale)[0]), n)


def token_lanes(method: str, knobs: dict, n: int, q: int, num_draws: int, device) -> int:
    """Draws in flight of a :class:`TokenSampler` run: ``max_concurrent_draws`` if given, else
    every draw, up to :data:`ROW_ENTRIES` ``// (window x q)`` and :data:`STATE_ENTRIES`
    ``// n`` for the windowed methods.

    A round of the windowed methods holds several ``[draws, window, q]`` float64 arrays (draft
    and target rows, the drafts' noise): with a large ``q`` and every draw in flight they take
    gigabytes. Every draw in flight also holds its order, ranks, partial sample and their
    temporaries, many times the output's size for a short model with many draws
    (``benchmarks/README.md``, "Memory"). Windows of one coordinate (the
    sequential methods, ``max_block=1``) keep every draw in flight: their lock step draws
    them all at once, with a dense state a few times the output. The draws do not depend on
    the lanes (continuous batching), only the rounds do.

    Examples
    --------
    >>> token_lanes("autospec", {"max_block": 8}, 16, 4096, 1000, "cpu")
    128
    >>> token_lanes("autospec", {"max_block": 64}, 1024, 2, 1000, "cpu")
    1000
    >>> token_lanes("autospec", {"max_block": 13}, 40, 3, 100_000, "cpu")
    26214
    """
    given = knobs.get("max_concurrent_draws")
    if given is not None or method in ("sequential", "gumbel_sequential"):
        return min(int(given or num_draws), num_draws)
    scale = 1 if on_cpu(device) else 16
    width = token_width(method, knobs, n, q)
    lanes = min(num_draws, ROW_ENTRIES * scale // (width * q))
    if width > 1:
        lanes = min(lanes, STATE_ENTRIES * scale // max(1, n))
    return max(1, lanes)


def _pick(table: np.ndarray, index: np.ndarray) -> np.ndarray:
    """``table[..., index[...]]`` along the last axis (``index`` has one axis fewer)."""
    return np.take_along_axis(table, index[..., None], -1)[..., 0]


def value_dtype(q: int) -> np.dtype:
    """Narrowest signed integer type that holds the values ``0 .. q - 1``.

    >>> value_dtype(4), value_dtype(300)
    (dtype('int8'), dtype('int16'))
    """
    for dtype in (np.int8, np.int16, np.int32):
        if q - 1 <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    return np.dtype(np.int64)


class TokenSampler:
    """Run a token-level method for ``num_draws`` draws.

    The draws' state lives on the host; a round asks the oracle through
    :class:`~pyro_autospec.engine.host_rows.HostRows` (on a CPU the oracle reads the host's
    arrays without a copy; elsewhere, or with ``HostRows.zero_copy = False``, which the tests
    use to run that path on a CPU, the round's inputs are uploaded).

    Parameters
    ----------
    rows : OracleRows
    draw_keys : LongTensor[D]
        Keys of the draws (:func:`pyro_autospec.engine.keys.draw_keys`).
    method : {"sequential", "gumbel_sequential", "speculative", "agr24", "autospec"}
        ``"autospec"`` needs knobs whose policy is adaptive and all-token.
    knobs : dict
        The method's resolved knobs (:func:`~pyro_autospec.engine.methods.resolve_knobs`):
        ``window`` (``"speculative"``: tokens drafted per window), ``window_scale``
        (``"agr24"``: scale of the window), ``max_rows_per_round`` and
        ``max_concurrent_draws`` (a cap on the rows of one round, and on the draws in flight),
        and for ``"autospec"`` the schedule that chooses each draw's windows
        (:func:`~pyro_autospec.engine.methods.block_policy`).
    progress : bool
        A tqdm bar over finished draws.

    Attributes
    ----------
    samples : LongTensor[D, n]
        The draws (on the host), filled as they finish.
    log_prob : DoubleTensor[D]
        Their log probabilities under the oracle's chain rule (on the host).
    sample_rounds : LongTensor[D]
        Rounds each draw took part in (on the host).
    rounds, oracle_rows : int
        Batched oracle calls of the run, and rows asked in all.
    finished : int
        Draws finished.
    """

    def __init__(
        self,
        rows: OracleRows,
        draw_keys: torch.Tensor,
        method: str,
        knobs: dict,
        progress: bool = False,
    ):
        policy = block_policy(knobs) if method == "autospec" else None
        window, window_scale = knobs.get("window", 8), knobs.get("window_scale", 1.0)
        max_rows_per_round = knobs.get("max_rows_per_round")
        if method == "autospec":
            if policy is None or not token_only(policy):
                raise ValueError("method 'autospec' here needs an adaptive all-token policy")
        elif method not in TOKEN_METHODS:
            raise ValueError(f"method must be one of {TOKEN_METHODS}, got {method!r}")
        self.rows = rows
        self.method = method
        self.policy = policy
        self.device = rows.device
        self.n, self.q = n, q = rows.n, rows.q
        self.num_draws = int(draw_keys.numel())
        self.window = int(window)
        self.window_scale = float(window_scale)
        self.cap = max_rows_per_round
        self.progress = progress
        self.num_lanes = lanes = token_lanes(method, knobs, n, q, self.num_draws, self.device)
        self.draw_keys = draw_keys.to(self.device)
        self.host_keys = draw_keys.cpu().numpy()
        self.width = token_width(method, knobs, n, q)
        # host state of the lanes (draws in flight), in the narrowest integer types
        dtype = value_dtype(q)
        self.frames = np.zeros((lanes, n), dtype=dtype)  # partial samples
        self.host = HostRows(rows, lanes)  # the oracle's rows, asked from the host
        self.order = self.host.orders  # [lanes, n]: the coordinate visited j-th by each lane
        self.draw = np.full(lanes, -1, dtype=np.int64)
        self.t = np.zeros(lanes, dtype=np.int64)
        self.state = np.zeros(lanes, dtype=np.int64)
        self.stamp = np.zeros(lanes, dtype=np.int64)
        self.k = np.zeros(lanes, dtype=np.int64)  # current window
        # "autospec": each lane's policy window, and its token windows' kept coordinates and
        # rejected tokens so far (what the next window is chosen from)
        self.win = np.zeros(lanes, dtype=np.int64)
        self.tokens = np.zeros(lanes, dtype=np.int64)
        self.misses = np.zeros(lanes, dtype=np.int64)
        self.log_mu = np.zeros(lanes, dtype=np.float64)
        self.draft_rows = np.zeros((lanes, self.width, q), dtype=np.float64)
        # "autospec": a draft row that is stale (conditioned on a prefix that ended in a
        # rejected token, not on the lane's own prefix), and how many coordinates it covers
        self.stale = np.zeros(lanes, dtype=bool)
        self.avail = np.zeros(lanes, dtype=np.int64)
        self.samples = host_output((self.num_draws, n), torch.long)  # filled at finish
        self._log_prob = np.full(self.num_draws, math.nan)
        self._sample_rounds = np.zeros(self.num_draws, dtype=np.int64)
        self.rounds = self.oracle_rows = 0
        self.started = self.finished = 0
        self.clock = 0
        self._v = np.arange(q)

    @property
    def log_prob(self) -> torch.Tensor:
        return torch.from_numpy(self._log_prob)

    @property
    def sample_rounds(self) -> torch.Tensor:
        return torch.from_numpy(self._sample_rounds)

    # ---------------------------------------------------------------------------- windows
    def _size(self, t: np.ndarray, lanes: np.ndarray | None = None) -> np.ndarray:
        """Window drafted at position ``t`` (clipped to the end) by ``lanes`` ("autospec")."""
        if self.method == "autospec":
            size = self.win[lanes]
            size = np.where(self.stale[lanes], np.minimum(size, self.avail[lanes]), size)
        elif self.method in ("sequential", "gumbel_sequential"):
            size = np.ones_like(t)
        elif self.method == "speculative":
            size = np.full_like(t, self.window)
        else:
            size = agr24_window(t, self.q, self.window_scale)
        return np.minimum(size, self.n - t)

    def _next_size(self, t: np.ndarray, k: np.ndarray, lanes: np.ndarray) -> np.ndarray:
        """Width of the draft row prefetched with the verification of the window ``(t, t + k]``
        of ``lanes``: the next window if all of it is kept (0 at the end)."""
        if self.method != "autospec":
            return self._size(t + k)
        after = self.policy.token_window(self.tokens[lanes] + self.win[lanes], self.misses[lanes])
        return np.minimum(after, self.n - t - k)

    def _windows_kept(self, lanes, kept, missed) -> None:
        """The token windows of ``lanes`` kept ``kept`` coordinates, ``missed`` (0 or 1) of
        them redrawn after a rejection ("autospec"): choose each lane's next window."""
        self.tokens[lanes] += kept
        self.misses[lanes] += missed
        self.win[lanes] = self.policy.token_window(self.tokens[lanes], self.misses[lanes])

    def _set_stamp(self, lanes: np.ndarray) -> None:
        self.stamp[lanes] = np.arange(self.clock, self.clock + lanes.size)
        self.clock += lanes.size

    def _start(self) -> None:
        free = np.flatnonzero(self.draw < 0)
        count = min(free.size, self.num_draws - self.started)
        if count <= 0:
            return
        lanes = free[:count]
        draws = np.arange(self.started, self.started + count)
        self.draw[lanes] = draws
        self.host.start(lanes, draws)
        self.started += count
        self.t[lanes] = 0
        if self.method == "autospec":
            self.win[lanes] = self.policy.start_window()
            self.tokens[lanes] = 0
            self.misses[lanes] = 0
            self.stale[lanes] = False
        self.log_mu[lanes] = 0.0
        self.frames[lanes] = 0
        self.state[lanes] = _WAIT_ROW
        self._set_stamp(lanes)

    def _finish(self, lanes: np.ndarray) -> None:
        if lanes.size == 0:
            return
        draws = self.draw[lanes]
        finished = torch.from_numpy(self.frames[lanes]).long()
        self.samples.index_copy_(0, torch.from_numpy(draws), finished)
        self._log_prob[draws] = self.log_mu[lanes]
        self.host.finish(lanes)
        self.draw[lanes] = -1
        self.state[lanes] = 0
        self.finished += int(lanes.size)

    def _coords(self, lanes: np.ndarray, start: np.ndarray, count: int) -> np.ndarray:
        """Coordinates at positions ``start .. start + count - 1`` (clamped) of ``lanes``."""
        pos = np.minimum(start[:, None] + np.arange(count), self.n - 1)
        return self.order[lanes[:, None], pos]

    def _window_keys(self, lanes: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Keys ``child(draw, LEAF, t)`` of the windows starting at ``t`` (int64 [L])."""
        return keys.host_child(self.host_keys[self.draw[lanes]], keys.Tag.LEAF, t)

    def _noise(self, lanes: np.ndarray, t: np.ndarray, width: int) -> np.ndarray:
        """Draft noise [L, width, q] of the windows at ``t``: Gumbels keyed by the draw and the
        position (``"gumbel_sequential"``, ``"agr24"``) or by the window."""
        if self.method in ("gumbel_sequential", "agr24"):
            return self._fixed_noise(lanes, t, np.arange(width)[None, :])
        counter = np.arange(width)[None, :, None] * self.q + self._v
        key = self._window_keys(lanes, t)[:, None, None]
        return keys.host_gumbel(key, keys.Tag.DRAFT, counter)

    def _noisy_argmax(
        self, data: np.ndarray, lanes: np.ndarray, t: np.ndarray, width: int
    ) -> np.ndarray:
        """Draft values ``argmax(data + noise)`` ([L, width]) in slices of lanes whose noise
        holds at most ``keys.NOISE_ENTRIES`` entries: with a large ``q`` and many draws in
        flight, the noise of all of them at once took gigabytes (the same numbers)."""
        step = max(1, keys.NOISE_ENTRIES // max(1, width * self.q))
        x = np.empty(data.shape[:2], dtype=np.int64)
        for a in range(0, lanes.size, step):
            part = slice(a, a + step)
            x[part] = np.argmax(data[part] + self._noise(lanes[part], t[part], width), axis=-1)
        return x

    def _fixed_noise(self, lanes: np.ndarray, t: np.ndarray, j: np.ndarray) -> np.ndarray:
        """AGR24's fixed Gumbels of positions ``t + j`` ([L] and [L or 1, J]): [L, J, q]."""
        key = self.host_keys[self.draw[lanes]][:, None, None]
        pos = np.minimum(t[:, None] + j, self.n - 1)[..., None]
        return keys.host_gumbel(key, keys.Tag.NOISE, pos * self.q + self._v)

    def _draft(self, lanes: np.ndarray) -> None:
        """Draft the window of every lane from its draft row; finish a last lone coordinate."""
        if lanes.size == 0:
            return
        t = self.t[lanes]
        k = self._size(t, lanes)
        self.k[lanes] = k
        width = int(k.max())
        data = self.draft_rows[lanes, :width]
        x = self._noisy_argmax(data, lanes, t, width)
        valid = np.arange(width)[None, :] < k[:, None]
        coords = self._coords(lanes, t, width)
        grid = np.broadcast_to(lanes[:, None], coords.shape)
        self.frames[grid[valid], coords[valid]] = x[valid]
        first = _pick(data[:, 0], x[:, 0])
        if self.method == "autospec":  # a window of one coordinate from a fresh row: a leaf
            lone = (k == 1) & ~self.stale[lanes]
        else:  # the last coordinate, drawn from its exact row
            lone = (k == 1) & (self._next_size(t, k, lanes) == 0)
        if lone.any():
            done = lanes[lone]
            self.log_mu[done] += first[lone]
            self.t[done] += 1
            if self.method == "autospec":
                self._windows_kept(done, np.ones_like(done), np.zeros_like(done))
                ended = self.t[done] >= self.n
                self._finish(done[ended])
                self._wait_row(done[~ended])
            else:
                self._finish(done)
        rest, first = lanes[~lone], first[~lone]
        if self.method in ("sequential", "gumbel_sequential"):
            # no verification: the coordinate is drawn from its exact row
            self.log_mu[rest] += first
            self.t[rest] += 1
            ended = self.t[rest] >= self.n
            self._finish(rest[ended])
            self._wait_row(rest[~ended])
            return
        self.state[rest] = _WAIT_VERIFY
        self._set_stamp(rest)

    def _wait_row(self, lanes: np.ndarray) -> None:
        self.state[lanes] = _WAIT_ROW
        self._set_stamp(lanes)

    # ----------------------------------------------------------------------------- rounds
    @engine_mode()
    def run(self) -> None:
        """Run every draw to completion (:func:`~pyro_autospec.engine.stepping.run_rounds`)."""
        if self._in_lockstep():
            lockstep = _HostLockstep(self) if self.host.on_cpu else _Lockstep(self)
            total, unit = self.n, "step"
            run_rounds(lockstep, total=total, progress=self.progress, desc=self.method, unit=unit)
            lockstep.finish()
        else:
            run_rounds(self, total=self.num_draws, progress=self.progress, desc=self.method)

    def start(self) -> None:
        """Put the first draws in flight."""
        self._start()

    def step(self) -> None:
        """One round, then the draws that fit start."""
        self._round()
        self._start()

    @property
    def done(self) -> bool:
        return self.finished >= self.num_draws

    def _in_lockstep(self) -> bool:
        """One coordinate per round, every draw in flight from the start, rounds not split.

        Every method whose windows are all of one coordinate draws each coordinate from its
        row with its draft noise, nothing to verify: the sequential methods, and
        ``"autospec"`` with ``max_block=1``, ``"speculative"`` with ``window=1`` and
        ``"agr24"`` whose window never grows past one (the same draws as ``"sequential"``,
        and, for ``"agr24"``, as ``"gumbel_sequential"``).
        """
        return (
            self.width == 1
            and 0 < self.num_lanes == self.num_draws
            and (self.cap is None or self.cap >= self.num_draws)
        )

    def _round(self) -> None:
        lanes = np.flatnonzero(self.state > 0)
        verify = self.state[lanes] == _WAIT_VERIFY
        t, k = self.t[lanes], self.k[lanes]
        nxt = np.where(verify, self._next_size(t, k, lanes), 0)
        # a window drafted from a fresh row keeps its first token unverified (its draft row is
        # its target row); a stale window verifies it too: its chain starts one earlier
        first = np.where(self.stale[lanes], 0, 1)
        rows = np.where(verify, k - first + (nxt > 0), 1)
        if self.cap is not None:
            order = np.argsort(self.stamp[lanes], kind="stable")
            lanes, verify, t, k, nxt, rows, first = (
                x[order] for x in (lanes, verify, t, k, nxt, rows, first)
            )
            keep = np.cumsum(rows) <= self.cap
            keep[0] = True
            lanes, verify, t, k, nxt, rows, first = (
                x[keep] for x in (lanes, verify, t, k, nxt, rows, first)
            )
        self.rounds += 1
        self.oracle_rows += int(rows.sum())
        self._sample_rounds[self.draw[lanes]] += 1
        want = ~verify
        want_row = lanes[want]
        verified_lanes, verified_t, verified_k = lanes[verify], t[verify], k[verify]
        verified_next, verified_first = nxt[verify], first[verify]
        pre = verified_next > 0
        long_chain = verified_k > verified_first  # a chain of at least one row
        # a prefetched row follows its window's chain in the same oracle call where the oracle
        # answers both at once; otherwise (and after a window of one token) it is a row of its own
        paired = pre & long_chain if self.rows.native_then else np.zeros_like(pre)
        alone = pre & ~paired
        draw, alone_lanes = self.draw, verified_lanes[alone]
        row_cut = np.concatenate([t[want], (verified_t + verified_k)[alone]])
        row_req = (
            np.concatenate([want_row, alone_lanes]),
            np.concatenate([draw[want_row], draw[alone_lanes]]),
            row_cut,
            row_cut,
            np.concatenate([self._size(t[want], want_row), verified_next[alone]]),
        )
        chain_lanes = verified_lanes[long_chain]
        chains = (
            chain_lanes,
            draw[chain_lanes],
            (verified_t + verified_first)[long_chain],
            (verified_k - verified_first)[long_chain],
            np.where(paired, verified_next, 0)[long_chain],  # width of the row after each chain
        )
        row_answer, chain_answer, then_answer = self.host.ask(self.frames, row_req, chains)
        num_drafts = want_row.size
        if num_drafts:
            head = row_answer.part(slice(0, num_drafts))
            row_start = row_req[3]

            def drafted(r: int, k: int) -> dict:
                return {
                    "coordinate": int(self.order[want_row[r], row_start[r] + k]),
                    "draw": int(draw[want_row[r]]),
                    "pinned": int(row_cut[r]),
                }

            OracleRows.raise_bad(head, head.bad, _ROW_FOR, drafted)
            self.draft_rows[want_row, : head.log_probs.shape[1]] = head.log_probs
        if verified_lanes.size:
            prefetch = None
            if pre.any():
                parts = []
                if alone.any():
                    parts.append((alone[pre], row_answer.part(slice(num_drafts, None))))
                if then_answer is not None:
                    parts.append((paired[pre], then_answer.part(paired[long_chain])))
                prefetch = self._prefetched(int(pre.sum()), int(verified_next.max()), parts)
            again = self._verify(
                verified_lanes,
                verified_t,
                verified_k,
                verified_next,
                long_chain,
                chain_answer,
                prefetch,
            )
            want_row = np.concatenate([again, want_row])
        self._draft(want_row)  # the lanes with a fresh draft row, all at once

    def _prefetched(self, count: int, width: int, parts) -> Answer:
        """The prefetched draft rows of a round's ``count`` verifications that have one
        (``[count, width, q]``), from the parts of the answers that hold them: ``(where
        [count] bool, Answer)``."""
        return place_answers(parts, count, width, self.q)

    def _verify(self, lanes, t, k, nxt, long_chain, chain, prefetch) -> np.ndarray:
        """Verify the drafted windows of ``lanes``; return the lanes whose next window can be
        drafted at once (every token kept, with a prefetched draft row; or, for
        ``"autospec"``, a token rejected, with stale draft rows for what follows it)."""
        width = max(int(k.max()), 2)  # tokens 1.. exist in the padded view
        data = (
            self.draft_rows[lanes, :width]
            if self.width >= width
            else np.concatenate([self.draft_rows[lanes], self.draft_rows[lanes, :1]], 1)
        )
        coords = self._coords(lanes, t, width)
        x = self.frames[lanes[:, None], coords]  # drafted window [L, width]
        num, q = lanes.size, self.q
        stale = self.stale[lanes]
        # target rows of tokens 0..k-1: a fresh window's token 0 has its draft row as target,
        # a stale window's comes first in its chain
        target = np.zeros((num, width, q))
        bad = np.zeros((num, width), dtype=bool)
        mass = np.zeros((num, width))
        target[:, 0] = data[:, 0]
        if chain is not None:
            length = chain.log_probs.shape[1]
            chained = np.flatnonzero(long_chain)
            for offset in (0, 1):
                pick = (stale[chained] if offset == 0 else ~stale[chained]).nonzero()[0]
                span = min(length, width - offset)
                where = chained[pick]
                target[where, offset : offset + span] = chain.log_probs[pick, :span]
                bad[where, offset : offset + span] = chain.bad[pick, :span]
                mass[where, offset : offset + span] = chain.log_mass[pick, :span]
        j = np.arange(width)[None, :]  # tokens 0..
        in_window = j < k[:, None]
        target_x = _pick(target, x)
        if self.method in ("speculative", "autospec"):
            draft_x = _pick(data, x)
            key = self._window_keys(lanes, t)[:, None]  # [L, 1], also the residuals'
            log_u = keys.host_log_uniform(key, keys.Tag.ACCEPT, j)
            with np.errstate(invalid="ignore"):  # -inf - -inf (padding) compares False
                keep = (log_u < target_x - draft_x) & in_window
            keep[:, 0] |= ~stale  # a fresh window's first token is drawn from its target row
        else:  # agr24: the recomputed coordinate must agree with the draft
            y = np.argmax(target + self._fixed_noise(lanes, t, j), axis=-1)
            keep = (y == x) & in_window
        # first rejected (or disagreeing) token J in 0..k-1, or k when all pass
        stop = np.where(~keep & in_window, j, k[:, None]).min(1)
        checked = (j <= stop[:, None]) & in_window  # rows conditioned on accepted tokens
        if (bad & checked).any():
            # the row raise_bad reports: the first bad one, in the order it reads them
            lane, column = (int(i) for i in np.argwhere(bad & checked)[0])
            OracleRows.raise_bad(
                Answer(target, bad & checked, mass),
                bad & checked,
                f"verification row for coordinate {int(self.order[lanes[lane], t[lane] + column])} "
                f"of draw {int(self.draw[lanes[lane]])} conditioned on its "
                f"first {int(t[lane]) + column} coordinates",
            )
        later = j[:, 1:]
        log_mu = np.where(stop > 0, target_x[:, 0], 0.0) + np.where(
            later < stop[:, None], target_x[:, 1:], 0.0
        ).sum(1)
        rejected = stop < k
        if rejected.any():
            rejected_lanes, stop_at, rejected_t = lanes[rejected], stop[rejected], t[rejected]
            rows_j = target[rejected, stop_at]  # [R, q]
            if self.method in ("speculative", "autospec"):
                draft_j = data[rejected, stop_at]
                residual = np.clip(np.exp(rows_j) - np.exp(draft_j), 0.0, None)
                with np.errstate(divide="ignore"):
                    log_residual = np.log(residual / residual.sum(1, keepdims=True))
                gumbel = keys.host_gumbel(key[rejected], keys.Tag.RESAMPLE, self._v)
                resampled = np.argmax(log_residual + gumbel, axis=-1)
            else:
                noise = self._fixed_noise(rejected_lanes, rejected_t, stop_at[:, None])[:, 0]
                resampled = np.argmax(rows_j + noise, -1)
            resampled_at = self.order[rejected_lanes, rejected_t + stop_at]
            self.frames[rejected_lanes, resampled_at] = resampled
            log_mu[rejected] += _pick(rows_j, resampled)
        self.log_mu[lanes] += log_mu
        advance = np.where(rejected, stop + 1, k)
        self.t[lanes] = t + advance
        if self.method == "autospec":
            self._windows_kept(lanes, advance, rejected.astype(np.int64))
        ended = self.t[lanes] >= self.n
        self._finish(lanes[ended])
        # all accepted with a prefetched row: the next window is drafted in this round
        go_on = ~rejected & ~ended
        with_row = go_on & (nxt > 0)
        has = nxt > 0
        if prefetch is not None:  # row r: the lane lanes[has][r], after its whole window
            ahead, after = lanes[has], (t + k)[has]

            def prefetched(r: int, j: int) -> dict:
                return {
                    "coordinate": int(self.order[ahead[r], after[r] + j]),
                    "draw": int(self.draw[ahead[r]]),
                    "pinned": int(after[r]),
                }

            OracleRows.raise_bad(
                prefetch,
                prefetch.bad & with_row[has][:, None],
                "prefetched row for coordinate {coordinate} of draw {draw}, conditioned on "
                "{pinned} coordinates (an accepted window),",
                prefetched,
            )
        restart = rejected & ~ended
        again = np.zeros(num, dtype=bool)
        if self.method == "autospec" and restart.any():
            # a later row may serve as a stale draft row unless it is bad or conditioned on a
            # drafted token (from the rejected one on) that the target calls impossible;
            # column k stands for the prefetched row (its bad rows are checked there)
            low = (j >= stop[:, None]) & in_window & ~(target_x > STALE_LOG_FLOOR)
            clean = np.cumsum(np.pad(low, ((0, 0), (1, 0))), 1) == 0
            usable = clean & np.pad(~bad, ((0, 0), (0, 1)), constant_values=True)
            again = self._stale_rows(lanes, k, nxt, stop, restart, target, usable, prefetch)
        if prefetch is not None:
            fresh = has & ~again
            self.draft_rows[lanes[fresh], : prefetch.log_probs.shape[1]] = prefetch.log_probs[
                fresh[has]
            ]
        self.stale[lanes] = again
        self._wait_row(lanes[(go_on & ~with_row) | (restart & ~again)])
        return lanes[with_row | again]

    def _stale_rows(self, lanes, k, nxt, stop, restart, target, usable, prefetch) -> np.ndarray:
        """Draft rows for the windows that follow a rejected token, without a round of their
        own ("autospec"): the verification's rows of the window's later tokens (conditioned on
        the drafted prefix, the rejected token included) and then its prefetched row. A draft
        may be any distribution chosen from the past; these rows are. Returns which lanes got
        one (at least one row before the first unusable one); ``avail`` says how many
        coordinates it covers, and the next window is no longer than that.

        ``usable`` bool [L, width + 1]: whether row ``j`` may serve (not bad, and every drafted
        token it is conditioned on, from the rejected one on, has target probability above
        :data:`STALE_LOG_FLOOR`); column ``k`` says it of the prefetched row.
        """
        num, width = target.shape[:2]
        j = np.arange(width)[None, :]
        later = (j > stop[:, None]) & (j < k[:, None])  # tokens after the rejected one
        # rows usable up to the first one that is not
        run = np.where(later & ~usable[:, :width], j, k[:, None]).min(1) - stop - 1
        whole = (run == k - stop - 1) & usable[np.arange(num), k]
        count = np.minimum(run, self.width)
        pre = np.zeros(num, dtype=np.int64)
        has = nxt > 0
        if prefetch is not None and has.any():
            good = ~prefetch.bad  # [H, W]: rows of the prefetch that are usable
            columns = np.arange(good.shape[1])
            first_bad = np.where(good, prefetch.log_probs.shape[1], columns).min(1)
            pre[has] = np.minimum(first_bad, nxt[has])
        pre = np.where(whole, pre, 0)
        total = np.minimum(count + pre, self.width)
        got = restart & (total > 0)
        picked = np.flatnonzero(got)
        if picked.size == 0:
            return got
        # one gather for every lane: position m of the new draft is the old window's token
        # stop + 1 + m while m < count, then the prefetched row's coordinate m - count
        m = np.arange(self.width)[None, :]
        counted = count[picked][:, None]
        source = np.minimum(stop[picked][:, None] + 1 + m, width - 1)
        rows = np.take_along_axis(target[picked], source[..., None], axis=1)
        if prefetch is not None:
            prefetched = np.minimum(pre[picked], self.width - count[picked])[:, None]
            row_of = (np.cumsum(has) - 1)[picked][:, None]  # each lane's row of the prefetch
            column = np.clip(m - counted, 0, prefetch.log_probs.shape[1] - 1)
            later = prefetch.log_probs[np.maximum(row_of, 0), column]
            from_prefetch = (m >= counted) & (m < counted + prefetched)
            rows = np.where(from_prefetch[..., None], later, rows)
        self.draft_rows[lanes[picked]] = rows
        self.avail[lanes[picked]] = total[picked]
        return got


class _Lockstep:
    """Windows of one coordinate when :meth:`TokenSampler._in_lockstep`: round ``t`` draws
    position ``t`` of every draw. The same rows, noise and arithmetic as the general loop (so
    the same draws), with no per-lane bookkeeping: the noise of many steps is drawn at once.
    A :class:`~pyro_autospec.engine.stepping.RoundStepper` whose units are steps.

    This class keeps the partial samples dense on the oracle's device (a GPU, or a CPU whose
    oracle is asked through uploads, as the tests do); :class:`_HostLockstep` keeps them in
    the sampler's host frames where the oracle reads host arrays."""

    def __init__(self, sampler: TokenSampler):
        self.sampler = sampler
        num = sampler.num_draws
        self.window = max(1, min(sampler.n, keys.NOISE_ENTRIES // max(1, num * sampler.q)))
        self.draw_keys = sampler.draw_keys.view(-1, 1, 1)  # [D, 1, 1]
        self.v = torch.arange(sampler.q, device=sampler.device)
        self.finished = self.rounds = self.oracle_rows = 0

    def start(self) -> None:
        sampler = self.sampler
        num = sampler.num_draws
        self.lanes = lanes = torch.arange(num, device=sampler.device)
        self.values = torch.zeros(num, sampler.n, dtype=torch.long, device=sampler.device)
        self.mask = torch.zeros(num, sampler.n, dtype=torch.bool, device=sampler.device)
        self.log_mu = torch.zeros(num, dtype=torch.float64, device=sampler.device)
        sampler.rows.start(lanes)
        sampler.started = sampler.num_draws
        # [n, D]: coordinate of step t of each draw, and as indices into values.view(-1)
        self.coords = sampler.rows.orders_of(lanes).t().contiguous()
        self.flat = self.coords + (lanes * sampler.n).unsqueeze(0)

    @property
    def done(self) -> bool:
        return self.finished >= self.sampler.n

    def _bad_row(self, t: int):
        """``fields`` for :meth:`OracleRows.raise_bad` at step ``t``: row ``r`` is draw
        ``r``'s row for its ``t``-th coordinate."""
        return lambda r, k: {"coordinate": int(self.coords[t][r]), "draw": r, "pinned": t}

    def _noise_window(self, t: int) -> torch.Tensor:
        """The draft noise of steps ``t .. t + window - 1`` of every draw ([D, window, q]), as
        :meth:`TokenSampler._noise` draws it."""
        sampler = self.sampler
        ts = torch.arange(t, min(sampler.n, t + self.window), device=sampler.device).view(1, -1, 1)
        if sampler.method in ("gumbel_sequential", "agr24"):
            return keys.gumbel(self.draw_keys, keys.Tag.NOISE, ts * sampler.q + self.v)
        step_keys = keys.child(self.draw_keys, keys.Tag.LEAF, ts)
        return keys.gumbel(step_keys, keys.Tag.DRAFT, self.v)

    def _noise(self, t: int) -> torch.Tensor:
        """The draft noise of step ``t`` of every draw ([D, q]), drawn ``window`` steps at a
        time."""
        if t % self.window == 0:
            self.noise = self._noise_window(t)
        return self.noise[:, t % self.window]

    def _counted(self) -> None:
        self.finished += 1
        self.rounds += 1
        self.oracle_rows += self.sampler.num_draws

    def step(self) -> None:
        sampler, t = self.sampler, self.finished
        answer = sampler.rows.next_rows(self.values, self.mask, self.coords[t])
        OracleRows.raise_bad(answer, answer.bad, _ROW_FOR, self._bad_row(t))
        data = answer.log_probs[:, 0]  # [D, q]
        x = torch.argmax(data + self._noise(t), dim=-1)  # [D]
        self.values.view(-1).index_copy_(0, self.flat[t], x)
        self.mask.view(-1).index_fill_(0, self.flat[t], True)
        self.log_mu += data.gather(1, x.unsqueeze(1)).squeeze(1)
        self._counted()

    def finish(self) -> None:
        """Hand the draws to the sampler."""
        sampler = self.sampler
        sampler.samples.copy_(self.values.cpu())
        sampler._log_prob[:] = self.log_mu.cpu().numpy()
        sampler.rounds, sampler.oracle_rows = self.rounds, self.oracle_rows
        sampler._sample_rounds[:] = sampler.n
        sampler.rows.finish(self.lanes)
        sampler.finished = sampler.num_draws


class _HostLockstep(_Lockstep):
    """:class:`_Lockstep` where the oracle reads host arrays (a CPU): the partial samples stay
    in the sampler's narrow host frames, and each step asks the rows of every draw at position
    ``t`` through :class:`~pyro_autospec.engine.host_rows.HostRows`, the general loop's
    requests and arithmetic (so the same draws).

    The partial samples live in dense ``values`` and ``mask`` arrays ([D, n]), with the
    coordinates drawn at each step written into them (``O(D)`` host work per step). An oracle
    that borrows its inputs (:func:`~pyro_autospec.engine.protocols.borrows_inputs`) gets
    views of them in every call; any other oracle gets copies that nothing else holds or
    writes (one ``memcpy`` of each per call, into the last call's buffers where the oracle
    kept nothing of them: :class:`~pyro_autospec.engine.host_rows.FreshInputs`).

    With numba installed, once numba pays in this process
    (:func:`~pyro_autospec.engine.compiled.compiled_lock_step`), each call's rows are
    checked, normalised and drawn from by :class:`~pyro_autospec.engine.compiled.LockStep`
    (two compiled calls around NumPy's ``exp``, sum and ``log``); else in NumPy. Both ask
    every call of a step before they check any row, so both ask the oracle the same
    questions and raise the same errors."""

    def __init__(self, sampler: TokenSampler):
        super().__init__(sampler)
        num = sampler.num_draws
        self.lanes = np.arange(num)
        self.log_mu = np.zeros(num, dtype=np.float64)
        # the calls of a step: consecutive lanes within the memory budget, as HostRows cuts
        # every draw's row of width one (the same calls as the general loop's)
        step = sampler.host._per_call(1 if sampler.rows.targeted else sampler.n)
        self.calls = [self.lanes[lo : lo + step] for lo in range(0, num, step)]
        self.borrowed = sampler.rows.borrows_inputs
        self.valid = np.ones((min(num, step), 1), dtype=bool)
        self.kernel = compiled_lock_step(steps=sampler.n)

    def start(self) -> None:
        sampler = self.sampler
        sampler._start()  # every draw in flight, draw s in lane s
        # the inputs of every call ([D, n]), and the coordinate of each step ([n, D]);
        # frames are written from the values when the draws finish
        self.values = sampler.frames[: sampler.num_draws].astype(np.int64)
        self.mask = np.zeros(self.values.shape, dtype=bool)
        self.coords = sampler.order[: sampler.num_draws].T.copy()
        self.inputs = []
        for lane in self.calls:  # per call: its rows, the targets of every step [n, R, 1],
            rows = slice(int(lane[0]), int(lane[-1]) + 1)  # and torch views of its inputs
            # (inference tensors: an oracle that borrows them and writes into them is refused)
            targets = torch.from_numpy(self.coords[:, rows, None].copy())
            views = (torch.from_numpy(self.values[rows]), torch.from_numpy(self.mask[rows]))
            self.inputs.append((rows, targets, sampler.host._extra(lane), views))
        self.views = self._views()
        if not self.borrowed:  # one set of buffers per call, filled again while unheld
            self.at = self.coords[..., None]  # [n, D, 1]: the targets of each step
            self.fresh = [FreshInputs(sampler.host._up_all) for _ in self.calls]

    def _out(self, i: int, t: int) -> torch.Tensor:
        """The rows at position ``t`` of the draws of call ``i`` as the oracle returned them
        ([R, 1, q])."""
        host, (rows, targets, extra, (values, mask)) = self.sampler.host, self.inputs[i]
        if self.borrowed:
            return host.targeted_out(values, mask, targets[t], extra)
        # fresh inputs: the oracle may keep them, or write into them
        begin = time.perf_counter()
        fresh = self.fresh[i]
        values, mask, target = fresh.fill(self.values[rows], self.mask[rows], self.at[t, rows])
        extra = host._extra(self.calls[i])
        self.sampler.rows.seconds["inputs"] += time.perf_counter() - begin
        return host.targeted_out(values, mask, target, extra)

    def _rows(self, t: int) -> np.ndarray:
        """Every draw's row at position ``t`` ([D, q]), checked and normalised (NumPy)."""
        parts = []
        for i, lane in enumerate(self.calls):
            parts.append(self.sampler.host._answer(self._out(i, t), self.valid[: lane.size]))
        if len(parts) > 1:
            fields = ("log_probs", "bad", "log_mass")
            parts = [Answer(*(np.concatenate([getattr(p, f) for p in parts]) for f in fields))]
        answer = parts[0]
        OracleRows.raise_bad(answer, answer.bad, _ROW_FOR, self._bad_row(t))
        return answer.log_probs[:, 0]

    def _noise(self, t: int) -> np.ndarray:
        if t % self.window == 0:
            self.noise = self._noise_window(t).numpy()
        return self.noise[:, t % self.window]

    def step(self) -> None:
        if self.kernel is None:
            self._step_numpy()
        else:
            self._step_compiled()
        self._counted()

    def _step_numpy(self) -> None:
        t, lanes = self.finished, self.lanes
        data = self._rows(t)  # [D, q]
        x = np.argmax(data + self._noise(t), axis=-1)  # [D]
        self.values[lanes, self.coords[t]] = x
        self.mask[lanes, self.coords[t]] = True
        self.log_mu += data[lanes, x]

    def _views(self) -> list[tuple]:
        """Per call of a step, what the compiled step writes: the first draw, and views of the
        partial samples ``[R, n]``, their mask ``[R, n]``, the coordinate of each step
        ``[n, R]`` and the log probabilities ``[R]``."""
        views = []
        for rows, *_ in self.inputs:
            parts = (self.values[rows], self.mask[rows], self.coords[:, rows])
            views.append((rows, *parts, self.log_mu[rows]))
        return views

    def _step_compiled(self) -> None:
        t = self.finished
        if t % self.window == 0:  # a fresh window of noise, and its part for each call
            self._noise(t)
            self.noises = [self.noise[view[0]] for view in self.views]
        column, to_host, kernel = t % self.window, self.sampler.host.to_host, self.kernel
        outs, last = [], len(self.calls) - 1
        for i in range(len(self.calls)):
            out, tol = to_host(self._out(i, t))
            # every call is asked before any row is read, and to_host may give a view: an
            # oracle may answer in a buffer of its own that its next call overwrites
            outs.append((out if i == last else out.copy(), tol))
        for (out, tol), noise, view in zip(outs, self.noises, self.views):
            rows, values, mask, coords, log_mu = view
            bad = kernel(out, noise, column, values, mask, coords[t], log_mu, tol)
            if bad >= 0:
                self._raise_bad(out, tol, rows.start, bad, t)

    def _raise_bad(self, out: np.ndarray, tol: float, first: int, row: int, t: int) -> None:
        """Raise the error the NumPy step raises for the rows ``out`` of the draws from
        ``first`` on, where the compiled step found row ``row`` not to be a distribution (it
        looks for non-finite maxima in every row before it checks any row's sum, so the
        NumPy check names the first bad row)."""
        answer = normalise_rows(out, np.ones(out.shape[:2], dtype=bool), tol)
        rows = slice(first, first + out.shape[0])
        whole = place_answers([(rows, answer)], self.sampler.num_draws, 1, out.shape[-1])
        if not whole.bad.any():  # the two checks read the same bits: not expected
            whole.bad[first + row, 0] = True
        OracleRows.raise_bad(whole, whole.bad, _ROW_FOR, self._bad_row(t))

    def finish(self) -> None:
        sampler = self.sampler
        sampler.frames[: sampler.num_draws] = self.values
        sampler.log_mu[:] = self.log_mu
        sampler._finish(self.lanes)
        sampler.rounds, sampler.oracle_rows = self.rounds, self.oracle_rows
        sampler._sample_rounds[:] = sampler.n
