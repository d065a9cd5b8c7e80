"""What a sampler run returns: one result type for every method and setting."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from pyro_autospec.engine.methods import Schedule
from pyro_autospec.engine.modes import ordinary

__all__ = ["SampleResult", "host_output"]


def host_output(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised ordinary tensor on the host, for a result the samplers fill as draws
    finish: allocated once, in the dtype returned, outside inference mode (so that handing it
    back needs no copy, see :func:`~pyro_autospec.engine.modes.ordinary`)."""
    with torch.inference_mode(False):
        return torch.empty(shape, dtype=dtype)


@dataclass
class SampleResult:
    """Draws and what they cost.

    Attributes
    ----------
    samples : Tensor[N, n] or Tensor[N, d]
        The draws: LongTensor[N, n] on ``[q]^n`` (in the oracle's coordinate indexing);
        ``X_T / T`` for :func:`~pyro_autospec.engine.diffusion.sample_diffusion`, ``X_T`` for
        :func:`~pyro_autospec.engine.diffusion.sample_sde`.
    log_prob : DoubleTensor[N]
        On ``[q]^n``: ``log mu_sigma(x)``, the log probability of each draw under the oracle's
        chain rule in the order used (for an exact, consistent oracle: ``log mu(x)``). For a
        diffusion: the log density of the path's increments under the discretised chain.
    rounds : int
        Batched oracle calls of the whole run (its latency on parallel hardware).
    sample_rounds : LongTensor[N]
        Rounds in which draw ``k`` had a query in flight: its own latency in rounds.
    oracle_rows : int
        Rows (conditionings, or ``(t, x)`` pairs) of the whole run, cancelled work included.
    method : str
        The sampler that produced the draws.
    wall_time : float
        Seconds the run took.
    orders : LongTensor[N, n] or None
        On ``[q]^n``: ``orders[k, j]`` is the coordinate visited ``j``-th by draw ``k``.
        A draw's order is a function of the seed and its number, so it is not stored during
        the run: it is computed when first read (and kept).
    paths : Tensor[N, num_steps + 1, d] or None
        Diffusions with ``return_paths=True``: the whole chains ``X_{t_0}, ..., X_{t_N}``.
    times : DoubleTensor[num_steps + 1] or None
        Diffusions: the time grid.
    error : DoubleTensor[N] or None
        ``"picard"`` only: distance between each sample and the sample of the sequential chain
        driven by the same noise (``None`` for the exact methods).
    engine : str
        ``"fast"`` or ``"reference"``.
    per_rank : dict or None
        Runs spread over processes (``distributed=True``): per rank, ``num_draws``,
        ``first_draw``, ``rounds``, ``oracle_rows`` and ``wall_time`` (lists by rank).
    schedule : Schedule
        The method's resolved knobs (the schedule used, defaults included; a read-only mapping
        too). Passing it back, ``sample_any_order(oracle, N, method=result.method, seed=seed,
        schedule=result.schedule)``, reproduces the draws on any device and batch.
    seed : int or None
        The int seed of the run: the ``seed`` given, or the one drawn from a generator or (for
        ``seed=None``) from torch's global generator
        (:func:`~pyro_autospec.engine.keys.seed_value`). Passing it back as ``seed=`` with the
        same schedule repeats the draws. ``None`` where a caller made the result from a root
        key of its own.
    timing : dict
        Host seconds of the run's parts: ``"oracle"`` (inside the oracle's methods) and, on
        ``[q]^n``, ``"inputs"`` (building the protocol's dense ``values`` and ``mask``). The
        engine's own bookkeeping is ``wall_time`` minus these. On a GPU these are launch
        times, not device times.
    """

    samples: torch.Tensor
    log_prob: torch.Tensor
    rounds: int
    sample_rounds: torch.Tensor
    oracle_rows: int
    method: str
    wall_time: float
    orders: torch.Tensor | None = None
    paths: torch.Tensor | None = None
    times: torch.Tensor | None = None
    error: torch.Tensor | None = None
    engine: str = "fast"
    timing: dict = field(default_factory=dict)
    schedule: Schedule = field(default_factory=Schedule)
    per_rank: dict | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        # The samplers run in inference mode; hand back tensors a caller may write or train on.
        # (``orders`` is converted by its setter, without computing lazy orders)
        for name in ("samples", "log_prob", "sample_rounds", "paths", "times", "error"):
            setattr(self, name, ordinary(getattr(self, name)))

    @property
    def num_samples(self) -> int:
        """``N``, the number of draws."""
        return int(self.samples.shape[0])

    @property
    def num_steps(self) -> int | None:
        """The number of Euler-Maruyama steps of a diffusion (``None`` on ``[q]^n``)."""
        return None if self.times is None else int(self.times.shape[0]) - 1

    def __repr__(self) -> str:
        mean_rounds = self.sample_rounds.double().mean().item() if self.num_samples else 0.0
        size = (
            f"num_steps={self.num_steps}"
            if self.times is not None
            else f"num_coords={self.samples.shape[1] if self.samples.dim() == 2 else 0}"
        )
        text = (
            f"SampleResult(method={self.method!r}, num_samples={self.num_samples}, {size}, "
            f"rounds={self.rounds}, mean sample_rounds={mean_rounds:.1f}, "
            f"oracle_rows={self.oracle_rows}, wall_time={self.wall_time:.3f}s"
        )
        if self.error is not None:
            text += f", max error={self.error.max().item():.3g}"
        return text + ")"


def _get_orders(self: SampleResult) -> torch.Tensor | None:
    value = self.__dict__.get("_orders")
    if value is not None and not isinstance(value, torch.Tensor):
        value = ordinary(value.materialize())  # a VisitOrders: computed once, when first read
        self.__dict__["_orders"] = value
    return value


def _set_orders(self: SampleResult, value) -> None:
    """A LongTensor[N, n], ``None``, or an object whose ``materialize()`` returns the orders
    (:class:`~pyro_autospec.engine.rows.VisitOrders`), called when they are first read."""
    self.__dict__["_orders"] = ordinary(value) if isinstance(value, torch.Tensor) else value


# After the dataclass is made: its __init__ assigns ``orders`` through this property.
SampleResult.orders = property(_get_orders, _set_orders, doc=_set_orders.__doc__)
