"""Exact any-order sampling by autospeculation, and the sequential reference.

The target is a distribution ``mu`` on ``[q]^n`` given by a
:class:`~pyro_autospec.oracles.base.MarginalOracle`. Each sample visits the coordinates in an
order ``sigma`` (uniformly random by default); positions below are positions in that order.

A *node* samples a block ``S = (a, b]`` of positions given the prefix ``x_{1..a}`` and returns
``(x, log mu_S(x_S), next_row)``. It may hold the *draft row* (the marginals of positions
``a+1..H`` given the prefix), prefetched by whoever sampled the prefix, where ``(b, H]`` is the
block that follows it in the recursion.

* ``|S| = 1``: draw ``x_{a+1}`` from the draft row.
* ``|S| > max_block``: split into a left and a right part of about equal numbers of leaves of
  at most ``max_block`` coordinates, then sample left, then right (the chain rule; exact).
* otherwise *speculate* (ALGORITHM.md sections 2-4): draft ``x_S ~ nu_S``, every coordinate
  from the draft row independently; in ONE round query the rows conditioned on
  ``x_{1..i-1}`` for ``i = a+2..b`` (the target ``mu_S``) plus a *prefetch* row conditioned on
  all of ``x_{1..b}`` (the next block's draft row); accept with probability
  ``min(1, mu_S / nu_S)``. After a rejection run exact tries ``y ~ mu_S`` (left half, then
  right half, recursively) as parallel threads and return the first accepted by thread index,
  each accepted with probability ``max(0, 1 - nu_S(y) / mu_S(y))``.

Every round gathers the pending rows of all samples and all threads into one batched oracle
call (:mod:`pyro_autospec.engine.scheduler`).

References
----------
.. [1] N. Anari, C. Baronio, CJ Chen, A. Haqi, F. Koehler, A. Li, T.-D. Vuong. Parallel
   Sampling via Autospeculation. STOC 2026, arXiv:2511.07869.
"""

from __future__ import annotations

import math
import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from pyro_autospec.engine.errors import OracleError
from pyro_autospec.engine.random import make_rng
from pyro_autospec.engine.rejection import accept_draft, accept_residual
from pyro_autospec.engine.result import SampleResult
from pyro_autospec.engine.rows import RowAnswer, RowDispatcher, RowRequest
from pyro_autospec.engine.scheduler import Call, FirstAccepted, Scheduler
from pyro_autospec.oracles.base import oracle_num_draws

__all__ = ["sample_any_order", "default_schedule", "METHODS"]

# A node's return value: (values int64[n], log mu_S(x_S), next draft row or None).
_NodeResult = tuple[np.ndarray, float, "np.ndarray | None"]


@dataclass(frozen=True)
class _Schedule:
    rho: float
    max_block: int


def default_schedule(num_coords: int) -> dict:
    """The default schedule knobs for ``n = num_coords`` coordinates.

    Returns
    -------
    dict
        ``rho``: batch growth of residual threads (batch ``r`` launches threads
        ``ceil((1+rho)^r) .. ceil((1+rho)^(r+1)) - 1``); ``max_block``: the largest block that
        is speculated (larger blocks are split without a draft, since for them
        ``TV(mu_S, nu_S)`` is close to one and the verification would be wasted);
        ``max_rows_per_round``: ``None`` (no cap).

    Notes
    -----
    None of these knobs changes the law of the output; they trade rounds (latency) against
    rows (work). Larger ``rho`` launches more threads at once: fewer rounds, more cancelled
    rows; ``rho = 3`` starts every residual with three parallel tries. ``max_block`` around
    ``sqrt(n)`` skips verifications of large blocks, which almost surely fail: in a random
    order ``TV(mu_S, nu_S)`` grows like ``|S| / sqrt(n)``; below 8 coordinates a split costs
    more rounds than a failed verification, hence the floor. On the binary Markov chain
    (n = 256..4096, ``benchmarks/rounds.py --sweep``) these defaults took 30-40% fewer rounds
    and fewer rows than ``rho = 1``, ``max_block = 4 sqrt(n)``.
    """
    return {
        "rho": 3.0,
        "max_block": max(8, int(round(math.sqrt(num_coords)))),
        "max_rows_per_round": None,
    }


class _Context:
    """What every node of one run shares."""

    def __init__(self, dispatcher: RowDispatcher, rng: np.random.Generator, schedule: _Schedule):
        self.orders = dispatcher.orders
        self.rng = rng
        self.schedule = schedule
        self.q = dispatcher.q
        self.knobs: dict = {}
        self.gumbels: np.ndarray | None = None

    def first_block_end(self, a: int, b: int) -> int:
        """End of the first block that is speculated or drawn when ``(a, b]`` is sampled.

        Blocks larger than ``max_block`` are split (:meth:`split`), so only the marginals of
        positions ``a..first_block_end(a, b) - 1`` are ever read from the draft row at ``a``.
        """
        while b - a > self.schedule.max_block:
            b = self.split(a, b)
        return b

    def split(self, a: int, b: int) -> int:
        """Where a block ``(a, b]`` larger than ``max_block`` is cut without a draft.

        The block is cut between its ``k = ceil((b - a) / max_block)`` leaves, half of them on
        each side, so every leaf has ``floor`` or ``ceil`` of ``(b - a) / k`` coordinates: close
        to ``max_block`` for every ``n``. (Cutting in halves would leave leaves of
        ``max_block / 2`` to ``max_block`` coordinates, and so up to twice as many of them,
        depending on where ``n`` falls between powers of two.) Any cut keeps the output exact:
        it is the chain rule.
        """
        size = b - a
        k = -(-size // self.schedule.max_block)
        return a + size * (k // 2) // k

    def draw(self, log_rows: np.ndarray) -> np.ndarray:
        """One categorical draw per row by Gumbel-max in float64: int64[rows]."""
        gumbel = -np.log(-np.log(self.rng.random(log_rows.shape)))
        return np.argmax(log_rows + gumbel, axis=-1)


def _request(sample, values, cuts, starts, stops) -> Call:
    cuts = np.asarray(cuts, dtype=np.int64)
    request = RowRequest(
        sample,
        values,
        cuts,
        np.asarray(starts, dtype=np.int64),
        np.asarray(stops, dtype=np.int64),
    )
    return Call(request, rows=len(cuts), sample=sample)


def _node(
    ctx: _Context,
    s: int,
    values: np.ndarray,
    a: int,
    b: int,
    horizon: int,
    row: np.ndarray | None,
) -> Generator[Call | FirstAccepted, object, _NodeResult]:
    """Sample positions ``(a, b]`` of sample ``s`` exactly given ``values`` on ``[0, a)``.

    ``row`` (float64[k, q] or None) holds the draft row: the log marginals of positions
    ``a..a+k-1`` given the prefix, with ``a + k >= first_block_end(a, b)``. ``(b, horizon]`` is
    the block sampled next; its draft row is prefetched with the verification.
    """
    order = ctx.orders[s]
    if row is None:
        end = ctx.first_block_end(a, b)
        answer: RowAnswer = yield _request(s, values, [a], [a], [end])
        row = answer.check(0, f"row for sample {s} conditioned on its first {a} coordinates")
    size = b - a
    if size == 1:
        x = int(ctx.draw(row[:1])[0])
        values = values.copy()
        values[order[a]] = x
        return values, float(row[0, x]), None
    if size > ctx.schedule.max_block:
        mid = ctx.split(a, b)
        left = yield from _node(ctx, s, values, a, mid, b, row[: b - a])
        right = yield from _node(ctx, s, left[0], mid, b, horizon, left[2])
        return right[0], left[1] + right[1], right[2]

    # --- Speculate: draft from the prefix-only row, verify the whole block in one round.
    draft_rows = row[:size]
    x = ctx.draw(draft_rows)
    log_nu = draft_rows[np.arange(size), x]
    drafted = values.copy()
    drafted[order[a:b]] = x
    cuts = np.arange(a + 1, b + (1 if horizon > b else 0))
    stops = np.minimum(cuts + 1, b)
    if horizon > b:
        stops[-1] = ctx.first_block_end(b, horizon)
    answer = yield _request(s, drafted, cuts, cuts, stops)
    # log_mu[j]: log mu of the drafted x_{a+1..a+1+j} given the prefix (cumulative).
    log_mu = np.empty(size)
    log_mu[0] = log_nu[0]
    for j in range(1, size):
        # Row j conditions on the drafted x_{a+1..a+j}: only meaningful while that has mass.
        if log_mu[j - 1] == -np.inf:
            log_mu[j:] = -np.inf
            break
        verify = answer.check(
            j - 1, f"row for sample {s} conditioned on its first {a + j} coordinates"
        )
        log_mu[j] = log_mu[j - 1] + verify[0, x[j]]
    log_target = log_mu[-1]
    log_draft = float(log_nu.sum())
    log_ratio = log_target - log_draft if log_target > -np.inf else -np.inf
    if accept_draft(log_ratio, ctx.rng):
        next_row = None
        if horizon > b:
            next_row = answer.check(
                len(cuts) - 1, f"row for sample {s} conditioned on its first {b} coordinates"
            )
        return drafted, float(log_target), next_row

    # --- Residual: exact tries y ~ mu_S, first accepted by thread index.
    mid = (a + b) // 2
    block = order[a:b]
    arange = np.arange(size)

    def thread(index: int) -> Generator:
        left = yield from _node(ctx, s, values, a, mid, b, draft_rows)
        right = yield from _node(ctx, s, left[0], mid, b, horizon, left[2])
        y, log_mu_y = right[0], left[1] + right[1]
        log_nu_y = float(draft_rows[arange, y[block]].sum())
        if not log_mu_y > -np.inf:
            raise AssertionError("an exact try returned a value of probability zero")
        accepted = accept_residual(log_mu_y - log_nu_y, ctx.rng)
        return accepted, (y, log_mu_y, right[2])

    result = yield FirstAccepted(thread, ctx.schedule.rho)
    return result


def _sequential(
    ctx: _Context, s: int, n: int
) -> Generator[Call, RowAnswer, tuple[np.ndarray, float]]:
    """The chain rule, one coordinate per round: the reference sampler."""
    order = ctx.orders[s]
    values = np.zeros(n, dtype=np.int64)
    log_prob = 0.0
    for j in range(n):
        answer = yield _request(s, values, [j], [j], [j + 1])
        row = answer.check(0, f"row for sample {s} conditioned on its first {j} coordinates")
        x = int(ctx.draw(row)[0])
        values = values.copy()
        values[order[j]] = x
        log_prob += float(row[0, x])
    return values, log_prob


def _autospec(ctx: _Context, s: int, n: int) -> Generator:
    values, log_prob, _ = yield from _node(ctx, s, np.zeros(n, dtype=np.int64), 0, n, n, None)
    return values, log_prob


def _speculative(ctx: _Context, s: int, n: int) -> Generator:
    from pyro_autospec.engine.baselines import speculative

    return (yield from speculative(ctx, s, n, window=ctx.knobs["window"]))


def _agr24(ctx: _Context, s: int, n: int) -> Generator:
    from pyro_autospec.engine.baselines import agr24

    return (yield from agr24(ctx, s, n, window_scale=ctx.knobs["window_scale"]))


def _gumbel_sequential(ctx: _Context, s: int, n: int) -> Generator:
    from pyro_autospec.engine.baselines import gumbel_sequential

    return (yield from gumbel_sequential(ctx, s, n))


#: method name -> (per-sample generator, extra schedule knobs with defaults, needs Gumbel noise)
METHODS = {
    "autospec": (_autospec, {}, False),
    "sequential": (_sequential, {}, False),
    "speculative": (_speculative, {"window": 8}, False),
    "agr24": (_agr24, {"window_scale": 1.0}, True),
    "gumbel_sequential": (_gumbel_sequential, {}, True),
}


def _check_oracle(oracle) -> tuple[int, int]:
    for name in ("num_coords", "num_values"):
        if not isinstance(getattr(oracle, name, None), (int, np.integer)):
            raise TypeError(
                f"oracle.{name} must be an int; got {getattr(oracle, name, None)!r}. "
                "A MarginalOracle "
                "has attributes num_coords (n) and num_values (q) and a method log_marginals."
            )
    if not callable(getattr(oracle, "log_marginals", None)) and not callable(
        getattr(oracle, "log_marginals_at", None)
    ):
        raise TypeError("oracle must define log_marginals(values, mask) (see MarginalOracle)")
    n, q = int(oracle.num_coords), int(oracle.num_values)
    if n < 1 or q < 1:
        raise ValueError(f"oracle.num_coords and oracle.num_values must be >= 1; got n={n}, q={q}")
    return n, q


def _make_orders(order, num_samples: int, n: int, rng: np.random.Generator) -> np.ndarray:
    if isinstance(order, str):
        if order != "random":
            raise ValueError(
                f"order must be 'random' or a permutation of range({n}); got {order!r}"
            )
        return np.argsort(rng.random((num_samples, n)), axis=1)
    perm = np.asarray(order.cpu() if isinstance(order, torch.Tensor) else order)
    if perm.shape != (n,) or not np.issubdtype(perm.dtype, np.integer):
        raise ValueError(
            f"order must be 'random' or an integer permutation of shape ({n},); "
            f"got shape {perm.shape}"
        )
    if not np.array_equal(np.sort(perm), np.arange(n)):
        raise ValueError(
            f"order must be a permutation of range({n}): every coordinate exactly once"
        )
    return np.tile(perm.astype(np.int64), (num_samples, 1))


def sample_any_order(
    oracle,
    num_samples: int,
    *,
    method: str = "autospec",
    seed: int | None | torch.Generator = None,
    order: str | Sequence[int] | torch.Tensor = "random",
    device: str | torch.device | None = None,
    progress: bool = False,
    **schedule,
) -> SampleResult:
    """Draw exact samples from a :class:`~pyro_autospec.oracles.base.MarginalOracle`.

    Parameters
    ----------
    oracle : MarginalOracle
        Conditional marginals of the target ``mu`` on ``[q]^n``.
    num_samples : int
        ``N``, the number of independent draws. All of them advance together: every round is
        one oracle call over the pending rows of all draws.
    method : {"autospec", "sequential", "speculative", "agr24", "gumbel_sequential"}
        ``"autospec"`` (recursive speculative rejection, about ``sqrt(n)`` rounds),
        ``"sequential"`` (the chain rule, ``n`` rounds: the reference), ``"speculative"``
        (token-level self-speculation, knob ``window``), ``"agr24"`` (the Gumbel-window sampler
        of Anari, Gao and Rubinstein, knob ``window_scale``) and ``"gumbel_sequential"`` (the
        sequential Gumbel-max sampler with the noise ``"agr24"`` uses; same seed, same path).
        All are exact for the oracle's chain rule in the order used; see
        :mod:`pyro_autospec.engine.baselines`.
    seed : int, torch.Generator or None
        Same seed, same output.
    order : "random" or permutation of ``range(n)``
        ``"random"`` draws a fresh uniform order per sample (needed for the ``sqrt(n)``
        bound); a fixed permutation is used for every sample.
    device : str or torch.device, optional
        Where the oracle's inputs are built (default: ``oracle.device`` if it has one, else CPU).
    progress : bool
        Show a progress bar over finished samples, with rounds and rows.
    **schedule
        ``rho``, ``max_block``, ``max_rows_per_round``, ``max_elements`` (see
        :func:`default_schedule`). They change rounds and rows, never the law of the output.

    Returns
    -------
    SampleResult
        ``samples`` LongTensor[N, n], ``log_prob`` float64[N], ``orders`` LongTensor[N, n],
        ``rounds``, ``sample_rounds`` LongTensor[N], ``oracle_rows``.

    Raises
    ------
    OracleError
        If the oracle returns NaN, rows that do not sum to one, rows with no mass, or tensors
        of the wrong shape or dtype.

    Examples
    --------
    >>> import torch
    >>> from pyro_autospec.oracles import MarkovChainOracle
    >>> stay = torch.tensor([[0.73, 0.27], [0.27, 0.73]])
    >>> chain = MarkovChainOracle(torch.tensor([0.5, 0.5]), stay, 64)
    >>> result = sample_any_order(chain, 8, seed=0)
    >>> result.samples.shape, result.samples.dtype
    (torch.Size([8, 64]), torch.int64)
    >>> bool(result.sample_rounds.double().mean() < 64)
    True
    """
    n, q = _check_oracle(oracle)
    if not isinstance(num_samples, (int, np.integer)) or num_samples < 1:
        raise ValueError(f"num_samples must be a positive int; got {num_samples!r}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {sorted(METHODS)}; got {method!r}")
    num_draws = oracle_num_draws(oracle)
    if num_draws is not None and num_draws != num_samples:
        raise ValueError(
            f"the oracle is a family of {num_draws} targets (oracle.num_draws), one per draw; "
            f"num_samples must equal it, got {num_samples}"
        )
    make_root, extra_knobs, needs_gumbel = METHODS[method]
    knobs = {**default_schedule(n), **extra_knobs}
    max_elements = schedule.pop("max_elements", 2**24)
    unknown = set(schedule) - set(knobs)
    if unknown:
        raise TypeError(
            f"unknown schedule knobs {sorted(unknown)}; expected some of {sorted(knobs)}"
        )
    knobs.update(schedule)
    if not (knobs["rho"] > 0 and math.isfinite(knobs["rho"]) and knobs["rho"] <= 1e6):
        raise ValueError(f"rho must be a finite number in (0, 1e6]; got {knobs['rho']}")
    if int(knobs["max_block"]) < 1:
        raise ValueError(f"max_block must be >= 1; got {knobs['max_block']}")
    if device is None:
        device = getattr(oracle, "device", None) or "cpu"
    device = torch.device(device)

    start = time.perf_counter()
    rng = make_rng(seed)
    orders = _make_orders(order, int(num_samples), n, rng)
    dispatcher = RowDispatcher(oracle, orders, device, max_elements=max_elements)
    ctx = _Context(dispatcher, rng, _Schedule(float(knobs["rho"]), int(knobs["max_block"])))
    ctx.knobs = knobs
    if needs_gumbel:
        ctx.gumbels = rng.gumbel(size=(int(num_samples), n, q))
    scheduler = Scheduler(
        dispatcher, max_rows_per_round=knobs["max_rows_per_round"], progress=progress, desc=method
    )
    roots = [make_root(ctx, s, n) for s in range(num_samples)]
    results = scheduler.run(roots)
    samples = np.stack([r[0] for r in results])
    log_prob = np.array([r[1] for r in results], dtype=np.float64)
    if not np.isfinite(log_prob).all():
        raise OracleError("a sample got log probability -inf under the oracle's chain rule")
    return SampleResult(
        samples=torch.from_numpy(samples),
        log_prob=torch.from_numpy(log_prob),
        orders=torch.from_numpy(orders),
        rounds=scheduler.stats.rounds,
        sample_rounds=torch.tensor(scheduler.stats.sample_rounds, dtype=torch.int64),
        oracle_rows=scheduler.stats.rows,
        method=method,
        wall_time=time.perf_counter() - start,
    )
