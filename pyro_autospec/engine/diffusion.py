"""Exact parallel simulation of Euler-Maruyama chains and diffusions by autospeculation.

The target is the law of the Euler-Maruyama chain of ``dX = b(t, X) dt + s dB`` on a grid
``t_0 < t_1 < ... < t_N`` (``h_k = t_{k+1} - t_k``)::

    X_{k+1} = X_k + b(t_k, X_k) h_k + s sqrt(h_k) xi_k,    xi_k ~ N(0, I_d).

Sequentially that is ``N`` rounds: every step needs the drift at the state the previous step
produced. Autospeculation drafts windows of steps with the drift frozen and verifies a draft
in ONE round (the drifts along the drafted path). By default (``rule="token"``,
:mod:`pyro_autospec.engine.euler_tokens`) it keeps the drafted steps one by one and redraws
the first failed step from the residual, on the host control plane; ``rule="block"`` accepts
whole blocks and repairs rejections with exact residual tries raced by index
(:doc:`/diffusion`). The output is EXACTLY the sequential chain's law; parallelism only
changes the number of rounds.

For stochastic localization (:func:`sample_diffusion`) the drift is the denoiser
``f(t, x) = E[Y | t Y + B_t = x]``, ``X_0 = 0``, ``s = 1`` and the sample is ``X_T / T``.

Methods: ``"autospec"``, ``"sequential"`` (one step per round, the reference) and ``"picard"``
(ParaDiGMS-style sliding-window fixed-point iteration; approximate, it reports its error
against the sequential path driven by the same noise), all with the same counting of rounds
and rows. Engines: ``"fast"`` (:mod:`pyro_autospec.engine.euler_tokens` and the tensor
programs of :mod:`pyro_autospec.engine.euler`) and
``"reference"`` (generators, :mod:`pyro_autospec.engine.reference.euler`), with the same keyed
noise, so the same draws. The block rule runs on the reference engine whatever ``engine``
says (``result.engine`` records it): it is kept to study the paper's recursion, and the token
rule took fewer rounds and rows than it on every benchmark.

This module does not import Pyro.

References
----------
1. N. Anari, C. Baronio, CJ Chen, A. Haqi, F. Koehler, A. Li, T.-D. Vuong. "Parallel Sampling
   via Autospeculation." arXiv:2511.07869 (STOC 2026).
2. J. Benton, V. De Bortoli, A. Doucet, G. Deligiannidis. "Nearly d-linear convergence bounds
   for diffusion models via stochastic localization." ICLR 2024.
3. A. Shih, S. Belkhale, S. Ermon, D. Sadigh, N. Anari. "Parallel Sampling of Diffusion
   Models." NeurIPS 2023 (ParaDiGMS).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from pyro_autospec.engine import keys
from pyro_autospec.engine.consistency import check_drift_consistency
from pyro_autospec.engine.diffusion_schedule import check_times, diffusion_times
from pyro_autospec.engine.errors import OracleError, check_device, check_eval_mode
from pyro_autospec.engine.euler import Chain, DriftEvaluator, check_drift_output
from pyro_autospec.engine.euler_baselines import follow_noise, picard, sequential
from pyro_autospec.engine.euler_tokens import EulerTokens
from pyro_autospec.engine.memory import Footprint, check_memory, format_bytes
from pyro_autospec.engine.methods import (
    DIFFUSION,
    DIFFUSION_AUTOSPEC,
    Schedule,
    accepts_keyword_knobs,
    check_windows,
    default_max_block,
    given_knobs,
    is_count,
    is_real,
    resolve_knobs,
)
from pyro_autospec.engine.modes import ordinary
from pyro_autospec.engine.protocols import declares_consistent_queries
from pyro_autospec.engine.reference import run_euler
from pyro_autospec.engine.result import SampleResult
from pyro_autospec.engine.spread import spread_draws

__all__ = [
    "DiffusionResult",
    "diffusion_times",
    "euler_maruyama_log_prob",
    "sample_diffusion",
    "sample_sde",
]

Drift = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

#: Diffusions return the one result type of the engine.
DiffusionResult = SampleResult


@dataclass
class _Settings:
    """Everything one diffusion run needs, validated."""

    drift: Any
    grid: np.ndarray
    x0: np.ndarray  # [num_samples, d]
    scale: float
    method: str
    knobs: dict
    seed: Any
    device: torch.device
    dtype: torch.dtype
    engine: str
    return_paths: bool
    progress: bool
    name: str
    divide_by_time: bool
    draw_ids: torch.Tensor | None = None  # global numbers of the draws (default 0 .. N - 1)
    root_key: int | None = None  # the run's key, set by _dispatch from ``seed``


def _oracle_placement(drift, device, dtype, like: torch.Tensor | None, name: str = "oracle"):
    """Device and dtype of oracle inputs: explicit, else the oracle's, else ``like``'s.

    ``name`` (``"drift"`` or ``"oracle"``) names ``drift`` in the error for a dtype that is not
    floating point, which also says where the dtype came from.
    """
    params = None
    if isinstance(drift, torch.nn.Module):
        params = next(iter(drift.parameters()), None)
    if device is None:
        device = getattr(drift, "device", None)
        if device is None and params is not None:
            device = params.device
        if device is None and like is not None:
            device = like.device
    source = "the dtype= argument"
    fix = "pass dtype=torch.float32 (or torch.float64)"
    if dtype is None:
        dtype = getattr(drift, "dtype", None)
        source = f"the {name}'s `dtype` attribute ({name}.dtype)"
        fix = (
            f"give the {name} a floating point `dtype` attribute, or pass dtype=torch.float32 "
            f"(or torch.float64), which overrides it"
        )
        if not isinstance(dtype, torch.dtype) and params is not None:
            dtype = params.dtype
            source = f"the dtype of the {name}'s first parameter"
            fix = f"make the {name}'s parameters floating point, or pass dtype=torch.float32"
        if not isinstance(dtype, torch.dtype) and like is not None and like.is_floating_point():
            dtype = like.dtype
        if not isinstance(dtype, torch.dtype):
            dtype = torch.get_default_dtype()
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(
            f"dtype must be a floating point torch.dtype (the states of a diffusion are real "
            f"vectors); got {dtype!r}, from {source}: {fix}"
        )
    return check_device(device if device is not None else "cpu"), dtype


def _float64_on(device: torch.device) -> torch.device:
    return torch.device("cpu") if device.type == "mps" else device


RULES = ("token", "block")


def _knobs(method, scale, given: dict, num_steps: int) -> dict:
    """Validated knobs of ``method``: its defaults, then ``given`` (unknown ones raise), with
    the rule's defaults filled in, so that the result records the schedule that ran."""
    if not (is_real(scale) and scale > 0 and math.isfinite(scale)):
        raise ValueError(
            f"scale must be a positive float (noise level s of dX = b dt + s dB), got {scale!r}"
        )
    knobs = resolve_knobs(method, DIFFUSION, DIFFUSION_AUTOSPEC, given)
    if method == "autospec":
        _autospec_knobs(knobs, num_steps)
    if method == "picard":
        window, tolerance = knobs["window"], knobs["tolerance"]
        if not is_count(window):
            raise ValueError(
                f"window must be a positive int (picard window of steps), got {window!r}"
            )
        if not (is_real(tolerance) and tolerance >= 0 and math.isfinite(tolerance)):
            raise ValueError(f"tolerance must be a non-negative float, got {tolerance!r}")
        knobs.update(window=int(window), tolerance=float(tolerance))
    for name in ("max_rows_per_round", "max_rows_per_call", "max_concurrent_draws"):
        value = knobs.get(name)
        if value is not None and not is_count(value):
            raise ValueError(f"{name} must be a positive int or None; got {value!r}")
    return knobs


def _autospec_knobs(knobs: dict, num_steps: int) -> None:
    """Check ``"autospec"``'s knobs for its rule and fill in the rule's defaults."""
    rule = knobs["rule"]
    if rule not in RULES:
        raise ValueError(
            f"rule must be 'token' (step by step, the default) or 'block' (blocks of steps "
            f"with residual races); got {rule!r}"
        )
    max_block = knobs["max_block"]
    if max_block is not None and not is_count(max_block):
        raise ValueError(f"max_block must be a positive int or None, got {max_block!r}")
    if rule == "token":
        if knobs["rho"] is not None:
            raise ValueError(
                "rho sets the residual races of rule='block'; the token rule (the default) "
                "races nothing. Pass rule='block' with rho, or drop rho"
            )
        given = {k: knobs[k] for k in ("max_block", "min_block") if knobs[k] is not None}
        knobs.update(
            max_block=int(max_block or default_max_block(num_steps)),
            min_block=2 if knobs["min_block"] is None else knobs["min_block"],
        )
        check_windows(knobs, given)
        knobs["min_block"] = int(knobs["min_block"])
        return
    if knobs["min_block"] is not None:
        raise ValueError(
            "min_block sets the token rule's smallest window; rule='block' tiles the chain "
            "into blocks of at most max_block steps. Drop min_block, or use rule='token'"
        )
    rho = 1.0 if knobs["rho"] is None else knobs["rho"]
    if not (
        rho == "adaptive"
        or callable(rho)
        or (isinstance(rho, (int, float)) and rho > 0 and math.isfinite(rho))
    ):
        raise ValueError(
            f"rho must be a positive float (thread batch growth 1 + rho), 'adaptive' or a "
            f"callable rho(block_size, log_ratio) -> float; got {rho!r}"
        )
    knobs["rho"] = rho


def _check_num_samples(num_samples) -> int:
    if not is_count(num_samples):
        raise ValueError(f"num_samples must be a positive int, got {num_samples!r}")
    return int(num_samples)


def _check_memory(
    num_samples: int,
    dim: int,
    num_steps: int,
    method: str,
    knobs: dict,
    engine: str,
    return_paths: bool,
) -> None:
    """Refuse, before the starts are allocated, a run whose draws cannot fit in memory.

    Every draw keeps its start and its final state (float64 ``[N, d]`` each) and 64 bytes of
    bookkeeping to the end; where the whole paths ``[N, S + 1, d]`` are kept, twice more (the
    increments and the paths made from them), three times for ``"picard"`` (its noise, its
    paths and the pass that scores them). A draw in flight holds about six float64
    ``[max_block + 1, d]`` arrays of its windows (a window of one step for
    ``"sequential"``, its whole path and a window for ``"picard"``).

    Raises
    ------
    MemoryError
        From :func:`~pyro_autospec.engine.memory.check_memory`, naming what to lower.
    """
    steps = num_steps + 1
    block = method == "autospec" and knobs["rule"] == "block"
    kept, copies, also = None, 2, ""
    if method == "picard":
        kept, copies = "method='picard'", 3
        also = (
            "Picard keeps every draw's noise and whole path; 'autospec' and 'sequential' keep "
            "the final states only."
        )
    elif block or engine == "reference":
        kept = "rule='block'" if block else "engine='reference'"
        also = (
            "The reference engine, where the block rule runs, keeps every draw's whole path; "
            "the token rule (the default) on engine='fast' without return_paths keeps the "
            "final states only."
        )
    elif return_paths:
        kept = "return_paths=True"
        paths = 8 * copies * num_samples * steps * dim
        also = f"Or pass return_paths=False: the whole paths take {format_bytes(paths)} of it."
    per_draw = 16 * dim + 64 + (8 * copies * steps * dim if kept else 0)
    if method == "autospec":
        window = min(int(knobs["max_block"] or num_steps), num_steps)
        per_flight = 48 * (window + 1) * dim
    elif method == "sequential":
        per_flight = 96 * dim
    else:
        per_flight = 8 * steps * dim + 48 * int(knobs["window"]) * dim
    holds = f"the starts and samples: 2 x {num_samples} x {dim} float64 entries"
    if kept:
        holds += f"; the whole paths, kept for {kept}: {copies} x {num_samples} x {steps} x {dim}"
    check_memory(
        Footprint(
            num_samples,
            per_draw,
            in_flight=min(int(knobs.get("max_concurrent_draws") or num_samples), num_samples),
            bytes_per_flight=per_flight,
            largest=num_samples * (steps if kept else 1) * dim,
        ),
        request=f"num_samples={num_samples} draws of d={dim} coordinates over {num_steps} steps",
        holds=f"{holds}; plus the state of the draws in flight",
        exact=method != "picard",
        also=also,
    )


def _run(s: _Settings) -> SampleResult:
    num, dim = s.x0.shape
    start_time = time.perf_counter()
    root = s.root_key
    draw_ids = torch.arange(num) if s.draw_ids is None else s.draw_ids
    grad_enabled = torch.is_grad_enabled()
    engine = s.engine
    if s.method == "autospec" and s.knobs["rule"] == "block":
        engine = "reference"  # the block rule's residual races run on the generator recursion
    # the token rule checks the drifts at the states its chain reaches (its drafts may go
    # where the chain never does)
    token_rule = s.method == "autospec" and s.knobs["rule"] != "block"
    evaluate = DriftEvaluator(
        s.drift, dim, s.device, s.dtype, s.knobs["max_rows_per_call"], s.name, not token_rule
    )
    times = torch.as_tensor(s.grid, dtype=torch.float64)
    chain = Chain(times, s.scale, dim, s.device)
    x0 = torch.as_tensor(s.x0, dtype=chain.wide, device=s.device)
    draw_keys = keys.draw_keys(root, draw_ids.to(s.device))
    error = None
    if engine == "reference":
        out = run_euler(chain, evaluate, x0, draw_keys, s.method, s.knobs, s.progress)
    elif s.method == "autospec":
        out = EulerTokens(chain, evaluate, x0, draw_keys, s.knobs, s.return_paths).run(s.progress)
    elif s.method == "sequential":
        out = sequential(chain, evaluate, x0, draw_keys, s.knobs, s.return_paths, s.progress)
    else:
        out = picard(chain, evaluate, x0, draw_keys, s.knobs, s.progress)
    wall_time = time.perf_counter() - start_time
    final, paths, log_prob = out.final, out.paths, out.log_prob
    if s.method == "picard":
        # in the caller's grad mode, as every drift call (a drift may differentiate inside)
        with torch.set_grad_enabled(grad_enabled):
            log_prob = euler_maruyama_log_prob(
                s.drift,
                s.grid,
                ordinary(paths) if grad_enabled else paths,  # a network may save them
                scale=s.scale,
                device=s.device,
                dtype=s.dtype,
                max_rows_per_call=s.knobs["max_rows_per_call"] or 65536,
            ).detach()
        reference = follow_noise(chain, evaluate, x0, out.noise)
        error = (final - reference.to(final)).norm(dim=-1)
    if s.divide_by_time:
        final = final / float(s.grid[-1])
        if error is not None:
            error = error / float(s.grid[-1])
    stats = _float64_on(s.device)
    samples = final.to(device=s.device, dtype=s.dtype)
    if not bool(torch.isfinite(samples).all()):
        largest = float(final.abs().max())
        raise OracleError(
            f"the samples do not fit {s.dtype}: the chain, kept in float64, reached |x| = "
            f"{largest:.3g}, beyond what {s.dtype} holds, because the "
            f"{s.name} returned values that large. Check "
            f"its scale, or pass dtype=torch.float64"
        )
    return SampleResult(
        samples=samples,
        paths=paths.to(device=s.device, dtype=s.dtype) if s.return_paths else None,
        log_prob=log_prob.to(device=stats, dtype=torch.float64),
        rounds=int(out.rounds),
        sample_rounds=out.sample_rounds.cpu().long(),
        oracle_rows=int(out.oracle_rows),
        method=s.method,
        wall_time=wall_time,
        times=torch.as_tensor(s.grid, dtype=torch.float64, device=stats),
        error=None if error is None else error.to(device=stats, dtype=torch.float64),
        engine=engine,
        timing={"oracle": evaluate.seconds},
        schedule=Schedule.of(s.knobs),
    )


def _dispatch(distributed: bool, s: _Settings) -> SampleResult:
    """Run ``s`` here, or (hook) spread its draws over the ranks of a process group."""
    if s.method != "sequential" and not declares_consistent_queries(s.drift):
        # one answer per row, in any call; on the whole run's starts, so every rank agrees
        evaluate = DriftEvaluator(s.drift, s.x0.shape[1], s.device, s.dtype, None, s.name)
        times = torch.as_tensor(s.grid, dtype=evaluate.wide, device=s.device)
        x0 = torch.as_tensor(s.x0[:4], dtype=evaluate.wide, device=s.device)
        check_drift_consistency(evaluate, times, x0)
    if not distributed:
        value = keys.seed_value(s.seed)
        result = _run(replace(s, root_key=keys.seed_key(value)))
        result.seed = value
        return result
    return spread_draws(
        s.x0.shape[0],
        s.seed,
        lambda draw_ids, root_key, where: _run(
            replace(
                s, x0=s.x0[draw_ids.numpy()], draw_ids=draw_ids, root_key=root_key, device=where
            )
        ),
        device=s.device,
        signature=(s.grid.tolist(), s.scale, s.method, s.knobs, str(s.dtype), s.engine, s.name),
        oracle=s.drift,
    )


@accepts_keyword_knobs()
def sample_sde(
    drift: Drift,
    times,
    x0,
    num_samples: int,
    *,
    scale: float = 1.0,
    method: str = "autospec",
    seed: int | None | np.random.Generator | torch.Generator = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    return_paths: bool = False,
    progress: bool = False,
    engine: str = "fast",
    distributed: bool = False,
    schedule: Schedule | Mapping | None = None,
) -> SampleResult:
    r"""Euler-Maruyama paths of ``dX = b(t, X) dt + scale dB``, exactly in law, in few rounds.

    Parameters
    ----------
    drift : callable
        ``b(t: Tensor[B], x: Tensor[B, d]) -> Tensor[B, d]``, batched over rows. One call is
        one round and counts ``B`` rows. An optional attribute ``dim`` is checked against ``x0``.
    times : Tensor[N + 1]
        Strictly increasing grid ``t_0 < ... < t_N``.
    x0 : Tensor[d] or Tensor[num_samples, d]
        Initial state(s).
    num_samples : int
        Number of independent paths.
    scale : float
        Noise level ``s``: the step variance is ``s^2 h_k``.
    method : {"autospec", "sequential", "picard"}
        ``"autospec"``: the exact parallel sampler (default). ``"sequential"``: the reference
        chain, one step per round. ``"picard"``: ParaDiGMS-style sliding-window fixed-point
        iteration with pre-drawn noise; APPROXIMATE, see ``error`` in the result.
    seed : int, numpy.random.Generator or torch.Generator, optional
        Root of all randomness (keyed by draw, step, block and try, in float64); the same seed
        and schedule give the same output whatever the engine, device, batch composition,
        caps and call sizes. The window knobs (``rule``, ``max_block``, ``min_block``,
        ``rho``) change which random numbers the draws read (the draft drift is frozen at a
        window's start), not their law. An int must lie in ``[0, 2**64)``
        (:func:`~pyro_autospec.engine.keys.check_seed`).
    device, dtype : optional
        Where and in which dtype the drift is called. Default: the drift's own ``device`` /
        ``dtype`` attributes (or its parameters for an ``nn.Module``), else those of ``x0``,
        else CPU and the default dtype. The chain itself is kept in float64. The dtype must be
        floating point: an integer one is refused with where it came from (``dtype=`` or the
        drift's ``dtype`` attribute).
    return_paths : bool
        Also return the whole paths ``[num_samples, N + 1, d]``.
    progress : bool
        Show a progress bar over finished samples.
    engine : {"fast", "reference"}
        The vectorised engine or the generator reference; the same draws either way.
        ``rule="block"`` always runs on the reference engine.
    distributed : bool
        Inside an initialised ``torch.distributed`` process group, every rank makes this same
        call; each simulates a contiguous share of the paths on its own device and every rank
        returns them all, the same as one process with the same seed, plus ``per_rank``
        counts (:mod:`pyro_autospec.engine.spread`).
    schedule : Schedule or dict, optional
        The schedule's knobs in one typed object (:class:`~pyro_autospec.Schedule`). A
        result's ``schedule`` passed back gives the same draws, and so does
        ``result.schedule.replace(max_concurrent_draws=8)``. None changes the output law.
        For this sampler:

        * Every method: ``max_rows_per_round`` (a cap on the rows of one round: draws go
          oldest first while their requests fit, and a round takes at least one draw's whole
          request whatever the cap: the token rule's window, up to ``max_block + 1`` rows;
          Picard's ``window``), ``max_rows_per_call``
          (cut each round into oracle calls of at most this many rows, for memory; still one
          round) and ``max_concurrent_draws``
          (continuous batching: new draws start as earlier ones finish).
        * ``"autospec"``: ``rule`` (``"token"``, the default, or ``"block"``).
          ``"token"`` verifies windows of frozen-drift steps step by step and redraws the first
          failed step by the reflection coupling (:mod:`~pyro_autospec.engine.euler_tokens`):
          one window per round, sized from the draw's past between ``min_block`` (default 2)
          and ``max_block`` (default ``max(8, 2 sqrt N)``). ``"block"`` accepts or rejects
          whole blocks and repairs rejections with residual races: ``rho`` (float,
          ``"adaptive"`` or callable; default 1): residual threads are launched in batches of
          indices ``ceil((1 + rho)^r) <= i < ceil((1 + rho)^(r + 1))``; larger ``rho`` means
          fewer rounds and more rows. ``"adaptive"`` sets it per rejected draft from the
          draft's log ratio ``l``: ``clip(1 / (1 - exp(l)) - 1, 1, 4)`` (about ``1 / TV``
          tries at once: shorter tails of rounds, 2 to 3 times the rows); a callable
          ``rho(block_size, log_ratio) -> float`` is also accepted. ``max_block`` (int,
          default none): blocks with more steps than this are split without drafting.
          ``max_block`` and ``min_block`` change which random numbers the draws read (not
          their law); the other knobs change rounds and rows only.
        * ``"picard"``: ``window`` (default 16), the steps updated per iteration, and
          ``tolerance`` (default 0.1): a step is converged when ``|X_new - X_old|^2 / (d s^2
          h_k) <= tolerance^2`` (as in ParaDiGMS).

        The knobs as keywords (``max_block=8``), the old spelling, still work with a
        :class:`FutureWarning` (not both ways for one knob; a cap given as a keyword replaces
        the schedule's).

    Returns
    -------
    SampleResult
        ``samples`` Tensor[num_samples, d] (the final states ``X_{t_N}``), ``paths``,
        ``log_prob``, ``rounds``, ``sample_rounds``, ``oracle_rows``, ...

    Raises
    ------
    ValueError
        For a grid that is not strictly increasing, a shape or dimension mismatch, or a bad option.
    OracleError
        If the drift returns NaN/inf or a wrongly shaped tensor, or calls a network in
        training mode with dropout or batch norm
        (:func:`~pyro_autospec.engine.errors.check_eval_mode`).
    MemoryError
        Before anything of the run's size is allocated, if its draws cannot fit in this
        machine's memory: the start and final state of every draw (``16 d`` bytes each), the
        whole paths where they are kept (``return_paths``, ``"picard"``, the reference
        engine: ``num_samples x (N + 1) x d`` float64 entries, twice or more) and the windows
        of the draws in flight. The message says what the run needs, about how many draws
        fit, and what to lower: ``num_samples`` per call, ``max_concurrent_draws`` (the draws
        in flight), or ``return_paths``.

    Notes
    -----
    Autospeculation on the increments (module docstring): a block ``[a, b)`` is drafted with
    the drift frozen at its start and verified in ONE round with the log ratio

    ``log dmu_S/dnu_S = sum_{a<k<b} [<b_k - b_a, dX_k> - (|b_k|^2 - |b_a|^2) h_k / 2] / s^2``.

    The token rule accepts its terms step by step and redraws the first failed step from the
    residual of two Gaussians; the block rule, on rejection, races exact tries (left half,
    then right half) as threads and the smallest accepted index wins (:doc:`/algorithm`).
    ``log_prob`` is the chain's log density of
    the returned increments; for ``"picard"`` it is computed on the returned path with an
    extra, uncounted, oracle pass.

    Examples
    --------
    >>> import torch
    >>> times = torch.linspace(0.0, 1.0, 33)
    >>> result = sample_sde(lambda t, x: -x, times, torch.zeros(2), 100, seed=0)
    >>> result.samples.shape, result.method
    (torch.Size([100, 2]), 'autospec')
    >>> bool(result.sample_rounds.double().median() < 32)
    True
    """
    seed = keys.check_seed(seed)
    grid = check_times(times)
    like = x0 if isinstance(x0, torch.Tensor) else None
    num_samples = _check_num_samples(num_samples)
    x0_array = (
        x0.detach().to("cpu", torch.float64).numpy()
        if isinstance(x0, torch.Tensor)
        else np.asarray(x0, dtype=np.float64)
    )
    if x0_array.ndim not in (1, 2) or (x0_array.ndim == 2 and x0_array.shape[0] != num_samples):
        raise ValueError(
            f"x0 must have shape [d] or [num_samples, d] = [{num_samples}, d], "
            f"got {tuple(x0_array.shape)}"
        )
    if not np.isfinite(x0_array).all():
        raise ValueError("x0 contains NaN or inf")
    dim = int(x0_array.shape[-1])
    if dim < 1:
        raise ValueError(f"x0 has dimension d = 0 (shape {tuple(x0_array.shape)}); d must be >= 1")
    drift_dim = getattr(drift, "dim", None)
    if drift_dim is not None and drift_dim != dim:
        raise ValueError(
            f"dimension mismatch: the drift has dim = {drift_dim} but x0 has d = {dim}; "
            f"pass x0 of shape [{drift_dim}] (or a drift for d = {dim})"
        )
    knobs = _knobs(method, scale, given_knobs(schedule), len(grid) - 1)
    _check_engine(engine)
    check_eval_mode(drift)
    device, dtype = _oracle_placement(drift, device, dtype, like, "drift")
    _check_memory(num_samples, dim, len(grid) - 1, method, knobs, engine, return_paths)
    starts = np.broadcast_to(x0_array, (num_samples, dim)).astype(np.float64)
    return _dispatch(
        distributed,
        _Settings(
            drift,
            grid,
            starts,
            float(scale),
            method,
            knobs,
            seed,
            device,
            dtype,
            engine,
            return_paths,
            progress,
            "drift",
            False,
        ),
    )


def _check_engine(engine: str) -> None:
    if engine not in ("fast", "reference"):
        raise ValueError(f"engine must be 'fast' or 'reference'; got {engine!r}")


@accepts_keyword_knobs()
def sample_diffusion(
    oracle,
    num_samples: int,
    *,
    times=None,
    num_steps: int | None = None,
    delta: float | None = None,
    t_switch: float | None = None,
    method: str = "autospec",
    seed: int | None | np.random.Generator | torch.Generator = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    return_paths: bool = False,
    progress: bool = False,
    engine: str = "fast",
    distributed: bool = False,
    schedule: Schedule | Mapping | None = None,
) -> SampleResult:
    r"""Sample ``mu`` through stochastic localization with a conditional-mean oracle.

    Simulates the Euler-Maruyama chain of ``dX_t = f(t, X_t) dt + dB_t``, ``X_0 = 0``, with
    ``f(t, x) = E[Y | t Y + B_t = x]`` and ``Y ~ mu``, on ``0 = t_0 < ... < t_N = T``, and
    returns ``X_T / T``, which approximates ``mu * N(0, I / T)``. With ``method="autospec"``
    the output is distributed EXACTLY as the sequential chain with the same oracle and times.

    Parameters
    ----------
    oracle : MeanOracle
        ``dim`` = d and ``oracle(t: Tensor[B], x: Tensor[B, d]) -> Tensor[B, d]``.
    num_samples : int
        Number of draws.
    times : Tensor[N + 1], optional
        Any strictly increasing grid starting at 0. Default: :func:`diffusion_times`
        (uniform steps up to ``t = 1``, then geometric up to ``T = 1 / delta``, after BDDD23).
    num_steps : int, optional
        ``N`` for the default grid (256 if not given).
    delta : float, optional
        Final noise variance of the default grid, ``T = 1 / delta`` (1e-3 if not given).
    t_switch : float, optional
        Where the default grid turns from uniform to geometric steps (an option of
        :func:`diffusion_times`, 1.0 if not given; part of the grid, not of the schedule).
    schedule : Schedule or dict, optional
        As in :func:`sample_sde` (its knobs as keywords, the old spelling, still work with a
        :class:`FutureWarning`). It does not hold the grid: ``result.schedule`` with the same
        ``num_steps``, ``delta`` and ``t_switch`` (or ``times=result.times``) reproduces a run.
    method, seed, device, dtype, return_paths, progress, engine, distributed :
        As in :func:`sample_sde` (``scale = 1``).

    Returns
    -------
    SampleResult
        ``samples`` Tensor[num_samples, d] = ``X_T / T``; ``paths`` (unscaled ``X_t``) when
        ``return_paths``; ``log_prob``, ``rounds``, ``sample_rounds``, ``oracle_rows``,
        ``times``; ``error`` for picard.

    Raises
    ------
    ValueError
        Bad grid (not increasing, not starting at 0, grid and schedule options both given),
        an oracle without an integer ``dim``, or a bad option.
    OracleError
        NaN/inf or wrongly shaped oracle outputs, or a network in training mode with dropout
        or batch norm (:func:`~pyro_autospec.engine.errors.check_eval_mode`).
    MemoryError
        Before anything of the run's size is allocated, if its draws cannot fit in this
        machine's memory, as in :func:`sample_sde`.

    Notes
    -----
    See :func:`sample_sde` and :doc:`/diffusion` for the algorithm. For a
    target with bounded support, ``f(t, X_t)`` is a martingale whose total quadratic variation
    is at most ``tr Cov(Y)``: drafts with a frozen drift are then rarely rejected outside a
    few blocks, which is where the ``O~(sqrt N)`` rounds come from.

    Examples
    --------
    >>> import torch
    >>> from pyro_autospec.oracles.denoisers import FiniteSupportDenoiser
    >>> oracle = FiniteSupportDenoiser(torch.tensor([[1.0, 0.0], [-1.0, 0.0]]))
    >>> result = sample_diffusion(oracle, 50, num_steps=64, seed=0)
    >>> result.samples.shape
    torch.Size([50, 2])
    >>> bool((result.samples[:, 0].abs() - 1).abs().max() < 0.5)
    True
    """
    seed = keys.check_seed(seed)
    dim = getattr(oracle, "dim", None)
    if not is_count(dim):
        raise ValueError(
            f"oracle must have an integer attribute `dim` (d >= 1, the MeanOracle protocol), "
            f"got {dim!r}"
        )
    grid_options = {} if t_switch is None else {"t_switch": t_switch}
    if times is None:
        grid = check_times(
            diffusion_times(
                256 if num_steps is None else num_steps,
                1e-3 if delta is None else delta,
                **grid_options,
            )
        )
    else:
        if num_steps is not None or delta is not None or grid_options:
            raise ValueError(
                "pass either `times` or the default grid's options (num_steps, delta, "
                "t_switch), not both"
            )
        grid = check_times(times)
        if grid[0] != 0.0:
            raise ValueError(
                f"times[0] must be 0 for stochastic localization (X_0 = 0 at t = 0), "
                f"got {grid[0]:.6g}; "
                f"use sample_sde for chains starting elsewhere"
            )
    num_samples = _check_num_samples(num_samples)
    knobs = _knobs(method, 1.0, given_knobs(schedule), len(grid) - 1)
    _check_engine(engine)
    check_eval_mode(oracle)
    device, dtype = _oracle_placement(oracle, device, dtype, None)
    _check_memory(num_samples, int(dim), len(grid) - 1, method, knobs, engine, return_paths)
    starts = np.zeros((num_samples, int(dim)))
    return _dispatch(
        distributed,
        _Settings(
            oracle,
            grid,
            starts,
            1.0,
            method,
            knobs,
            seed,
            device,
            dtype,
            engine,
            return_paths,
            progress,
            "oracle",
            True,
        ),
    )


def euler_maruyama_log_prob(
    drift: Drift,
    times,
    paths: torch.Tensor,
    *,
    scale: float = 1.0,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    max_rows_per_call: int | None = 65536,
) -> torch.Tensor:
    r"""Log density of Euler-Maruyama paths: the sum of their Gaussian transition densities.

    Differentiable with respect to ``paths`` and to any parameters of ``drift`` (it is the
    ``log_prob`` of :class:`~pyro_autospec.distributions.EulerMaruyamaPath`).

    Parameters
    ----------
    drift : callable
        ``b(t: Tensor[B], x: Tensor[B, d]) -> Tensor[B, d]``.
    times : Tensor[N + 1]
        Strictly increasing grid.
    paths : Tensor[..., N + 1, d]
        States ``X_{t_0}, ..., X_{t_N}``; the first is taken as given (not scored).
    scale : float
        Noise level ``s``.
    device, dtype : optional
        Where and in which dtype the drift is called (default as in :func:`sample_sde`).
    max_rows_per_call : int, optional
        Rows per drift call (memory).

    Returns
    -------
    Tensor[...]
        ``sum_k log N(X_{k+1}; X_k + b(t_k, X_k) h_k, s^2 h_k I)``, in float64 (float32 on
        devices without float64), on the device of ``paths``.

    Raises
    ------
    ValueError
        Bad grid or shapes, or a drift ``dim`` that differs from ``d``.
    OracleError
        NaN/inf or wrongly shaped drift outputs.

    Examples
    --------
    >>> import torch
    >>> times = torch.tensor([0.0, 1.0])
    >>> paths = torch.tensor([[[0.0], [0.0]]])
    >>> euler_maruyama_log_prob(lambda t, x: torch.zeros_like(x), times, paths)  # log N(0; 0, 1)
    tensor([-0.9189], dtype=torch.float64)
    """
    grid = check_times(times)
    if not isinstance(paths, torch.Tensor):
        paths = torch.as_tensor(paths, dtype=torch.float64)
    if paths.dim() < 2 or paths.shape[-2] != grid.shape[0]:
        raise ValueError(
            f"paths must have shape [..., N + 1, d] with N + 1 = {grid.shape[0]} (len(times)), "
            f"got {tuple(paths.shape)}"
        )
    if not (is_real(scale) and scale > 0 and math.isfinite(scale)):
        raise ValueError(f"scale must be a positive float, got {scale!r}")
    dim = int(paths.shape[-1])
    drift_dim = getattr(drift, "dim", None)
    if drift_dim is not None and drift_dim != dim:
        raise ValueError(
            f"dimension mismatch: the drift has dim = {drift_dim} but paths have d = {dim}"
        )
    call_device, call_dtype = _oracle_placement(drift, device, dtype, paths, "drift")
    out_device = paths.device
    wide = torch.float32 if out_device.type == "mps" else torch.float64
    batch_shape = paths.shape[:-2]
    num_steps = grid.shape[0] - 1
    flat = paths.reshape(-1, num_steps + 1, dim)
    rows = flat.shape[0] * num_steps
    t = torch.as_tensor(grid[:-1], device=call_device, dtype=call_dtype).repeat(flat.shape[0])
    x = flat[:, :-1].reshape(rows, dim).to(device=call_device, dtype=call_dtype)
    chunk = max_rows_per_call or max(rows, 1)
    pieces = []
    for i in range(0, rows, chunk):
        out = drift(t[i : i + chunk], x[i : i + chunk])
        check_drift_output(out, t[i : i + chunk], x[i : i + chunk], dim, "drift", i)
        # a copy: a drift may answer in a buffer of its own that its next call overwrites
        pieces.append(out.to(device=out_device, dtype=wide, copy=True))
    drifts = torch.cat(pieces) if pieces else torch.zeros(0, dim, device=out_device, dtype=wide)
    drifts = drifts.reshape(flat.shape[0], num_steps, dim)
    h = torch.as_tensor(np.diff(grid), device=out_device, dtype=wide)
    increments = flat.to(wide).diff(dim=1)
    resid = increments - drifts * h[:, None]
    var = float(scale) ** 2
    log_norm = float(-0.5 * dim * np.log(2 * math.pi * var * np.diff(grid)).sum())
    log_prob = -0.5 * (resid * resid / h[:, None]).sum((-1, -2)) / var + log_norm
    return log_prob.reshape(batch_shape)
