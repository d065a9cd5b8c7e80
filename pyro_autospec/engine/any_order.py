"""Exact any-order sampling of a distribution on ``[q]^n``: autospeculation and its baselines.

The target is a distribution ``mu`` on ``[q]^n`` given by a
:class:`~pyro_autospec.engine.protocols.MarginalOracle`. Each draw visits the coordinates in an
order ``sigma`` (uniformly random by default) and is sampled block by block (:doc:`/algorithm`):
a block is drafted from the marginals given the prefix, verified against the chain rule in ONE
round, and repaired after a rejection by exact residual tries raced by thread index.

Two engines run it with the same keyed randomness (:mod:`pyro_autospec.engine.keys`), so they
give the same draws for the same seed:

* ``engine="fast"`` (default): every draw's window as host arrays, with one batched oracle call
  per round on the oracle's device (:mod:`pyro_autospec.engine.host_plane`);
* ``engine="reference"``: plain Python generators, one per draw and try, on a round scheduler
  (:mod:`pyro_autospec.engine.reference`): slow and obviously correct.

The block rule (``token_below`` not ``None``: windows accepted whole or raced by residual tries)
runs on the reference engine whatever ``engine`` says, and its result says so
(``result.engine == "reference"``). It is kept to study the recursion of the paper; the default
token rule took fewer rounds and fewer rows than it on every benchmark (:doc:`/algorithm`).

References
----------
.. [1] N. Anari, C. Baronio, CJ Chen, A. Haqi, F. Koehler, A. Li, T.-D. Vuong. Parallel
   Sampling via Autospeculation. STOC 2026, arXiv:2511.07869.
"""

from __future__ import annotations

import inspect
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from pyro_autospec.engine import keys
from pyro_autospec.engine.consistency import check_consistency
from pyro_autospec.engine.errors import OracleError, check_device, check_eval_mode
from pyro_autospec.engine.host_plane import TokenSampler, token_lanes, token_width
from pyro_autospec.engine.memory import check_output_size
from pyro_autospec.engine.methods import (
    DISCRETE,
    Schedule,
    accepts_keyword_knobs,
    block_policy,
    check_windows,
    default_max_block,
    default_max_elements,
    default_schedule,
    given_knobs,
    is_count,
    is_real,
    resolve_knobs,
)
from pyro_autospec.engine.protocols import Capabilities
from pyro_autospec.engine.reference import run_discrete
from pyro_autospec.engine.result import SampleResult
from pyro_autospec.engine.rows import (
    OracleRows,
    VisitOrders,
    draw_orders,  # noqa: F401  (re-exported: the orders of a run, for callers and tests)
)
from pyro_autospec.engine.schedule import token_only
from pyro_autospec.engine.spread import spread_draws

__all__ = ["AnyOrderRun", "sample_any_order", "default_schedule", "run_any_order", "ENGINES"]

ENGINES = ("fast", "reference")


def _check_oracle(oracle, caps: Capabilities) -> tuple[int, int]:
    for name in ("num_coords", "num_values"):
        value = getattr(oracle, name, None)
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
            fix = f" (convert it: int(oracle.{name}))" if isinstance(value, torch.Tensor) else ""
            raise TypeError(
                f"oracle.{name} must be an int; got {value!r}{fix}. A MarginalOracle has "
                "attributes num_coords (n) and num_values (q) and a method log_marginals."
            )
    if not callable(getattr(oracle, "log_marginals", None)) and not caps.targeted:
        raise TypeError(
            "oracle must define log_marginals(values, mask), or log_marginals_at(values, mask, "
            "targets) (see MarginalOracle); chain queries alone are not enough"
        )
    if caps.num_draws is not None:
        _check_family_keyword(oracle)
    n, q = int(oracle.num_coords), int(oracle.num_values)
    if n < 1 or q < 1:
        raise ValueError(f"oracle.num_coords and oracle.num_values must be >= 1; got n={n}, q={q}")
    check_eval_mode(oracle, reach=1 if caps.consistent_queries else 4)
    return n, q


_QUERIES = ("log_marginals", "log_marginals_at", "log_marginals_chain", "log_marginals_chain_then")


def _check_family_keyword(oracle) -> None:
    """A family of targets (``num_draws``) is asked with ``draws=``: refuse, by name, a query
    method that cannot take it (rather than the oracle's own TypeError mid-run)."""
    for name in _QUERIES:
        method = getattr(oracle, name, None)
        if not callable(method):
            continue
        try:
            parameters = inspect.signature(method).parameters.values()
        except (TypeError, ValueError):  # a builtin or C method: no signature to read
            continue
        if any(p.name == "draws" or p.kind is p.VAR_KEYWORD for p in parameters):
            continue
        raise TypeError(
            f"oracle.{name} takes no keyword draws, but the oracle has num_draws = "
            f"{oracle.num_draws}: an oracle with num_draws is a family of targets, one per "
            f"draw, and the engine asks it which draws each row is for with draws= (a "
            f"LongTensor of draw numbers). Add draws=None to {name}, or drop num_draws for "
            f"one target shared by every draw."
        )


def check_order(order, n: int) -> torch.Tensor | None:
    """``None`` for ``"random"``; else the fixed permutation as a LongTensor[n]."""
    if isinstance(order, str):
        if order != "random":
            raise ValueError(
                f"order must be 'random' or a permutation of range({n}); got {order!r}"
            )
        return None
    perm = np.asarray(order.cpu() if isinstance(order, torch.Tensor) else order)
    if perm.shape != (n,) or not np.issubdtype(perm.dtype, np.integer):
        raise ValueError(
            f"order must be 'random' or an integer permutation of shape ({n},); "
            f"got shape {perm.shape} of dtype {perm.dtype}"
        )
    if not np.array_equal(np.sort(perm), np.arange(n)):
        raise ValueError(
            f"order must be a permutation of range({n}): every coordinate exactly once"
        )
    return torch.as_tensor(perm, dtype=torch.long)


@accepts_keyword_knobs()
def sample_any_order(
    oracle,
    num_samples: int,
    *,
    method: str = "autospec",
    seed: int | None | torch.Generator = None,
    order: str | Sequence[int] | torch.Tensor = "random",
    device: str | torch.device | None = None,
    engine: str = "fast",
    progress: bool = False,
    distributed: bool = False,
    schedule: Schedule | Mapping | None = None,
) -> SampleResult:
    """Draw exact samples from a :class:`~pyro_autospec.engine.protocols.MarginalOracle`.

    Parameters
    ----------
    oracle : MarginalOracle
        Conditional marginals of the target ``mu`` on ``[q]^n`` (or a family of targets, one per
        draw, when it has ``num_draws``; see :doc:`/oracles`).
    num_samples : int
        ``N``, the number of independent draws. They advance together: every round is one
        batched oracle call over the pending rows of all draws in flight.
    method : {"autospec", "sequential", "speculative", "agr24", "gumbel_sequential"}
        ``"autospec"`` (recursive speculative rejection, about ``sqrt(n)`` rounds),
        ``"sequential"`` (the chain rule, ``n`` rounds: the reference), ``"speculative"``
        (token-level self-speculation, knob ``window``), ``"agr24"`` (the Gumbel-window sampler
        of Anari, Gao and Rubinstein, knob ``window_scale``) and ``"gumbel_sequential"`` (the
        sequential Gumbel-max sampler with the noise ``"agr24"`` uses; same seed, same path).
        All are exact for the oracle's chain rule in the order used (:doc:`/choosing`).
    seed : int, torch.Generator, numpy.random.Generator or None
        Same seed and schedule, same draws, whatever the engine, device, batch composition
        (``max_concurrent_draws``), caps (``max_rows_per_round``) and call sizes
        (``max_elements``). The schedule is the window knobs as resolved
        (``result.schedule``): left to their defaults they depend on the device, the draws in
        flight and whether the oracle answers chain queries
        (:func:`~pyro_autospec.engine.methods.default_max_block`), so changing
        ``max_concurrent_draws`` alone may change the draws; pass
        ``schedule=result.schedule`` to repeat a run elsewhere. The window knobs
        (``max_block``, ``min_block``, ``first_block``, ``blocks``, ``token_below``,
        ``race_depth``) change which random numbers the draws read, not their law; ``rho``
        (the batch growth of residual tries) changes only the rows and rounds spent, not the
        draws. ``log_prob``, a sum over the rows drawn from, may differ in its last bits
        (about 1e-14 at n = 200) between batch compositions, as the order of that sum and the
        batching of the oracle's calls change; the samples do not. An oracle whose own output
        moves with the size of its batch (a float32 network) moves ``log_prob`` by its own
        rounding too (about 1e-6). An int must lie in ``[0, 2**64)``
        (:func:`~pyro_autospec.engine.keys.check_seed`).
    order : "random" or permutation of ``range(n)``
        ``"random"`` draws a fresh uniform order per draw (needed for the ``sqrt(n)`` bound);
        a fixed permutation is used for every draw.
    device : str or torch.device, optional
        Where the oracle's inputs and the engine's state live (default: ``oracle.device`` if it
        has one, else the CPU).
    engine : {"fast", "reference"}
        ``"fast"``: the host control plane. ``"reference"``: the generator engine, slow and
        obviously correct. Both give the same draws, rounds and rows (the rows-per-round cap
        may order requests differently, which changes rounds only). The block rule
        (``token_below`` not ``None``) always runs on the reference engine.
    progress : bool
        Show a progress bar over finished draws, with rounds and rows.
    distributed : bool
        Inside an initialised ``torch.distributed`` process group (e.g. under ``torchrun``),
        every rank makes this same call; each samples a contiguous share of the draws on its
        own device and every rank returns the full result, the same draws as one process with
        the same seed, plus ``per_rank`` counts (:mod:`pyro_autospec.engine.spread`).
    schedule : Schedule or dict, optional
        The schedule's knobs in one typed object (:class:`~pyro_autospec.Schedule` lists them:
        ``rho``, ``max_block`` (``"autospec"``, see :func:`default_schedule`), ``window``
        (``"speculative"``), ``window_scale`` (``"agr24"``), ``max_rows_per_round``,
        ``max_concurrent_draws``, ``max_elements``, ...). For this sampler
        ``max_concurrent_draws`` defaults to every draw, but for the windowed methods, whose
        rounds hold ``[draws, window, q]`` rows, at most ``2**22 // (window x q)`` and
        ``2**20 // n`` on a CPU (16 times more elsewhere:
        :func:`~pyro_autospec.engine.host_plane.token_lanes`); only the draws in flight hold an
        order and partial samples, so it bounds the engine's memory beside the ``N x n``
        output. None of the knobs changes the law of the output; only ``max_block`` and the
        windows change which numbers the draws read. A result's ``schedule`` passed back gives
        the same draws, and so does ``result.schedule.replace(max_concurrent_draws=8)``: with
        the window knobs fixed, caps do not change the draws.
        The knobs as keywords (``max_block=8``), the old spelling, still work with a
        :class:`FutureWarning` (not both ways for one knob; a cap given as a keyword replaces
        the schedule's).

    Returns
    -------
    SampleResult
        ``samples`` LongTensor[N, n], ``log_prob`` float64[N], ``orders`` LongTensor[N, n]
        (computed from the seed when first read), ``rounds``, ``sample_rounds``
        LongTensor[N], ``oracle_rows``, ``wall_time``.

    Raises
    ------
    OracleError
        If the oracle returns NaN, rows that do not sum to one, rows with no mass, or tensors
        of the wrong shape or dtype; or, before sampling, if it answers with a network in
        training mode with dropout or batch norm (random answers; call ``.eval()``, see
        :func:`~pyro_autospec.engine.errors.check_eval_mode`).
    MemoryError
        Before anything of the run's size is allocated, if the samples (``8 N n`` bytes) and
        the state of the draws in flight cannot fit in this machine's memory.

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
    >>> slow = sample_any_order(chain, 8, seed=0, engine="reference")
    >>> torch.equal(result.samples, slow.samples)
    True
    """
    seed = keys.check_seed(seed)
    caps = Capabilities.of(oracle)  # what the oracle offers, read once for the whole run
    n, q = _check_oracle(oracle, caps)
    if not is_count(num_samples):
        raise ValueError(f"num_samples must be a positive int; got {num_samples!r}")
    num_samples = int(num_samples)
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}; got {engine!r}")
    num_draws = caps.num_draws
    if num_draws is not None and num_draws != num_samples:
        raise ValueError(
            f"the oracle is a family of {num_draws} targets (oracle.num_draws), one per draw; "
            f"num_samples must equal it, got {num_samples}"
        )
    given = given_knobs(schedule)
    knobs = resolve_knobs(method, DISCRETE, default_schedule(n), given)
    if device is None:
        device = getattr(oracle, "device", None) or "cpu"
    device = check_device(device)
    if knobs["max_elements"] is None:  # a preset by hardware; the draws do not depend on it
        knobs["max_elements"] = default_max_elements(device)
    in_flight = min(int(knobs.get("max_concurrent_draws") or num_samples), num_samples)
    if "max_block" in knobs and "max_block" not in given:  # a preset by hardware, batch, oracle
        knobs["max_block"] = default_max_block(n, in_flight, device, caps.chains, caps.targeted)
    _check_knobs(knobs)
    if "max_block" in knobs:
        check_windows(knobs, given)
    if not caps.consistent_queries:  # one answer to one question, asked any way
        check_consistency(oracle, device, caps)
    # before anything of the run's size is allocated: the samples [N, n] must fit, and the
    # state of the draws in flight (orders, ranks, partial samples and tries: about 32 bytes
    # per coordinate of each, and the rows of their windows)
    if engine == "fast":
        in_flight = token_lanes(method, knobs, n, q, num_samples, device)
    flight_bytes = _bytes_per_flight(method, knobs, n, q)
    check_output_size(num_samples, n, in_flight=in_flight, bytes_per_flight=flight_bytes)
    run = AnyOrderRun(oracle, method, knobs, check_order(order, n), engine, progress, caps)
    if distributed:  # hook: spread the draws over the ranks of a process group
        return spread_draws(
            num_samples,
            seed,
            lambda draw_ids, root_key, where: run_any_order(run, draw_ids, root_key, where),
            device=device,
            signature=(n, q, method, engine, knobs, run.order),
            oracle=oracle,
        )
    value = keys.seed_value(seed)
    result = run_any_order(run, torch.arange(num_samples), keys.seed_key(value), device)
    result.seed = value
    return result


@dataclass(frozen=True, eq=False)
class AnyOrderRun:
    """A checked run of :func:`sample_any_order`, whatever share of its draws is run.

    Attributes
    ----------
    oracle : MarginalOracle
    method : str
    knobs : dict
        The method's resolved knobs (:func:`~pyro_autospec.engine.methods.resolve_knobs`).
    order : LongTensor[n] or None
        A fixed visiting order, or ``None`` for a random order per draw.
    engine : {"fast", "reference"}
    progress : bool
    capabilities : Capabilities
        What the oracle offers, read once (from ``oracle`` if not given).
    """

    oracle: Any
    method: str
    knobs: dict
    order: torch.Tensor | None = None
    engine: str = "fast"
    progress: bool = False
    capabilities: Capabilities | None = None

    def __post_init__(self) -> None:
        if self.capabilities is None:  # frozen: set once, here
            object.__setattr__(self, "capabilities", Capabilities.of(self.oracle))


def run_any_order(
    run: AnyOrderRun, draw_ids: torch.Tensor, root_key: int, device: torch.device
) -> SampleResult:
    """Run the draws ``draw_ids`` (global numbers) of ``run`` with root key ``root_key`` on
    ``device``.

    ``run`` is checked by :func:`sample_any_order`. Any subset of a run's draws gives the same
    draws as the whole run, which is what spreads a run over processes.
    """
    oracle, method, knobs, engine = run.oracle, run.method, run.knobs, run.engine
    order, progress = run.order, run.progress
    start = time.perf_counter()
    n = int(oracle.num_coords)
    num_samples = int(draw_ids.numel())
    draw_ids = draw_ids.to(device)
    draw_keys = keys.draw_keys(root_key, draw_ids)
    orders = VisitOrders(order, draw_keys, n)
    if method == "autospec" and not token_only(block_policy(knobs)):
        engine = "reference"  # the block rule's residual races run on the generator recursion
    # both engines hold the orders of the draws in flight only
    if engine == "reference":
        lanes = min(int(knobs.get("max_concurrent_draws") or num_samples), num_samples)
    else:
        lanes = token_lanes(method, knobs, n, int(oracle.num_values), num_samples, device)
    budget = knobs.get("max_elements") or default_max_elements(device)
    rows = OracleRows(
        oracle, orders, device, budget, draw_ids, lanes=lanes, capabilities=run.capabilities
    )
    if engine == "reference":
        samples, log_prob, rounds, oracle_rows, sample_rounds = run_discrete(
            rows, draw_keys, method, knobs, progress
        )
    else:
        sampler = TokenSampler(rows, draw_keys, method, knobs, progress)
        sampler.run()
        samples, log_prob = sampler.samples, sampler.log_prob
        rounds, oracle_rows, sample_rounds = (
            sampler.rounds,
            sampler.oracle_rows,
            sampler.sample_rounds,
        )
    if not bool(torch.isfinite(log_prob).all()):
        raise OracleError("a sample got log probability -inf under the oracle's chain rule")
    return SampleResult(
        samples=samples.cpu(),
        log_prob=log_prob.cpu(),
        orders=orders.to("cpu"),  # computed from the keys when first read
        rounds=int(rounds),
        sample_rounds=sample_rounds.cpu(),
        oracle_rows=int(oracle_rows),
        method=method,
        wall_time=time.perf_counter() - start,
        engine=engine,
        timing=dict(rows.seconds),
        schedule=Schedule.of(knobs),
    )


def _bytes_per_flight(method: str, knobs: dict, n: int, q: int) -> int:
    """Bytes per coordinate of a draw in flight: 32 for its order, ranks and partial sample,
    and for the windowed methods about six float64 ``[window, q]`` rows (draft and target
    rows, noise, temporaries) spread over its ``n`` coordinates."""
    if method not in ("autospec", "speculative", "agr24"):
        return 32
    return 32 + math.ceil(48 * token_width(method, knobs, n, q) * q / n)


def _check_knobs(knobs: dict) -> None:
    rho = knobs.get("rho", 1.0)
    if not (rho == "adaptive" or (is_real(rho) and 0 < rho <= 1e6 and math.isfinite(rho))):
        raise ValueError(f"rho must be a finite number in (0, 1e6] or 'adaptive'; got {rho!r}")
    block = knobs.get("max_block")
    if "max_block" in knobs and not is_count(block):
        raise ValueError(f"max_block must be a positive int; got {block!r}")
    elements = knobs.get("max_elements")
    if elements is not None and not (is_real(elements) and 1 <= elements < math.inf):
        raise ValueError(f"max_elements must be a number >= 1 or None; got {elements!r}")
    for name in ("max_rows_per_round", "max_concurrent_draws"):
        value = knobs.get(name)
        if value is not None and not is_count(value):
            raise ValueError(f"{name} must be a positive int or None; got {value!r}")
    window = knobs.get("window")
    if "window" in knobs and not is_count(window):
        raise ValueError(f"window must be a positive int; got {window!r}")
    scale = knobs.get("window_scale")
    if "window_scale" in knobs and not (is_real(scale) and 0 < scale < math.inf):
        raise ValueError(f"window_scale must be a finite positive number; got {scale!r}")
