"""Continuous latent sites of a Pyro model: discovery, flattening, simulation, sampling.

A model whose latent sites are all continuous is sampled by stochastic localization: a
:class:`~pyro_autospec.oracles.base.MeanOracle` over the model's latents, flattened into one
vector ``y`` in unconstrained space (each site mapped by ``biject_to(site.support).inv``, in
trace order, each site flattened in C order), drives :func:`~pyro_autospec.engine.diffusion.
sample_diffusion`; the draws ``X_T / T`` are mapped back site by site with
``biject_to(site.support)``. This module holds the Pyro glue:

* :func:`discover_continuous_sites` -> :class:`ContinuousLayout` (latent sites, observed data
  sites, ``max_plate_nesting``; a clear error for discrete latent sites);
* :func:`simulate`: prior predictive ``(latent, data)`` pairs, vectorised over a plate;
* :func:`continuous_log_joint`: ``log p(x, data)`` of a batch of draws in one trace;
* :func:`sample_continuous`: what ``AutoSpec(model, guide=DiffusionGuide(...))`` needs (draws
  per site with MCMC shapes, rounds per draw, oracle rows, ``lp``, pointwise log likelihood).

References
----------
.. [1] N. Anari, R. Baronio, X. Chen, A. Haqi, F. Koehler, Y. Li, T.-D. Vuong. Parallel
   Sampling via Autospeculation. STOC 2026, arXiv:2511.07869.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyro
import torch
from pyro import poutine
from pyro.poutine.util import prune_subsample_sites
from torch.distributions import biject_to

from pyro_autospec.infer.sites import AutoSpecModelError, UnsupportedSiteError

__all__ = [
    "ContinuousLayout",
    "ContinuousResult",
    "ContinuousSite",
    "DataSite",
    "check_continuous_only",
    "continuous_log_joint",
    "discover_continuous_sites",
    "sample_continuous",
    "simulate",
]


@dataclass
class ContinuousSite:
    """One continuous latent site and its slice of the flattened unconstrained vector.

    Attributes
    ----------
    name : str
        The site name.
    shape : torch.Size
        The shape of one draw of the site (``batch_shape + event_shape`` inside its plates).
    event_dim : int
        ``fn.event_dim`` of the site's distribution.
    support : Constraint
        The support; ``biject_to(support)`` maps unconstrained values to it.
    unconstrained_shape : torch.Size
        The shape of ``biject_to(support).inv(value)`` (differs from ``shape`` for a simplex
        or a Cholesky factor).
    offset : int
        Start of the site's coordinates in the flattened vector.
    """

    name: str
    shape: torch.Size
    event_dim: int
    support: Any
    unconstrained_shape: torch.Size
    offset: int

    @property
    def transform(self):
        """``biject_to(support)``: unconstrained -> constrained."""
        return biject_to(self.support)

    @property
    def numel(self) -> int:
        """Number of unconstrained coordinates of the site."""
        return int(torch.Size(self.unconstrained_shape).numel())

    @property
    def coords(self) -> slice:
        """The site's slice of the flattened vector."""
        return slice(self.offset, self.offset + self.numel)


@dataclass
class DataSite:
    """One observed site: its name, value shape and slice of the flattened data vector."""

    name: str
    shape: torch.Size
    offset: int

    @property
    def numel(self) -> int:
        """Number of scalar observations of the site."""
        return int(torch.Size(self.shape).numel())


@dataclass
class ContinuousLayout:
    """The continuous latent sites and observed sites of a model, in trace order.

    Attributes
    ----------
    sites : list of ContinuousSite
        Latent sites, in trace order.
    data : list of DataSite
        Observed sites (``obs=``), in trace order; deterministic and factor sites excluded.
    max_plate_nesting : int
        Plate and batch dimensions used by the model (the simulation plate goes left of them).

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> def model(y):
    ...     scale = pyro.sample("scale", dist.LogNormal(0.0, 1.0))
    ...     with pyro.plate("data", 3):
    ...         pyro.sample("y", dist.Normal(0.0, scale), obs=y)
    >>> layout = discover_continuous_sites(model, (torch.zeros(3),))
    >>> layout.names, layout.dim, layout.data_dim
    (['scale'], 1, 3)
    """

    sites: list[ContinuousSite]
    data: list[DataSite]
    max_plate_nesting: int

    @property
    def names(self) -> list[str]:
        """Latent site names, in trace order."""
        return [site.name for site in self.sites]

    @property
    def dim(self) -> int:
        """``d``: unconstrained latent coordinates in all."""
        return sum(site.numel for site in self.sites)

    @property
    def data_dim(self) -> int:
        """Scalar observations in all."""
        return sum(site.numel for site in self.data)

    def __getitem__(self, name: str) -> ContinuousSite:
        for site in self.sites:
            if site.name == name:
                return site
        raise KeyError(name)

    def signature(self) -> tuple:
        """What must agree between two layouts for one guide to serve both."""
        return (
            tuple((s.name, tuple(s.shape), tuple(s.unconstrained_shape)) for s in self.sites),
            tuple((s.name, tuple(s.shape)) for s in self.data),
        )

    def to_unconstrained(self, values: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Flatten constrained values ``name -> Tensor[N, *shape]`` into Tensor[N, d]."""
        parts = []
        for site in self.sites:
            if site.name not in values:
                raise KeyError(f"missing values for continuous latent site '{site.name}'")
            value = torch.as_tensor(values[site.name])
            num = value.shape[0] if value.dim() > len(site.shape) else 1
            unconstrained = site.transform.inv(value.reshape((num,) + tuple(site.shape)))
            parts.append(unconstrained.reshape(num, site.numel))
        return torch.cat(parts, dim=-1)

    def from_unconstrained(self, y: torch.Tensor) -> OrderedDict[str, torch.Tensor]:
        """Split Tensor[N, d] into constrained values ``name -> Tensor[N, *shape]``."""
        if y.dim() != 2 or y.shape[-1] != self.dim:
            raise ValueError(f"expected a Tensor[N, {self.dim}], got {tuple(y.shape)}")
        out = OrderedDict()
        for site in self.sites:
            part = y[:, site.coords].reshape((y.shape[0],) + tuple(site.unconstrained_shape))
            out[site.name] = site.transform(part).reshape((y.shape[0],) + tuple(site.shape))
        return out

    def data_vector(self, observed: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Flatten observed values ``name -> Tensor[*shape]`` (or [S, *shape]) to [S, D]."""
        parts = []
        for site in self.data:
            value = torch.as_tensor(observed[site.name])
            num = value.numel() // max(site.numel, 1)
            if value.numel() != num * site.numel:
                raise ValueError(
                    f"observed site '{site.name}' has {value.numel()} values; the layout "
                    f"expects a multiple of {site.numel} (shape {tuple(site.shape)})"
                )
            parts.append(value.reshape(num, site.numel).to(torch.get_default_dtype()))
        if not parts:
            return torch.zeros(1, 0)
        return torch.cat(parts, dim=-1)


# ---------------------------------------------------------------------------------- discovery
def _is_auxiliary(site: dict) -> bool:
    """Deterministic and factor sites: observed, but not data."""
    return bool(site["infer"].get("_deterministic")) or type(site["fn"]).__name__ == "Unit"


def _trace(model: Callable, args: tuple, kwargs: dict):
    with poutine.block():
        trace = poutine.trace(model).get_trace(*args, **kwargs)
    return prune_subsample_sites(trace)


def _max_plate_nesting(trace) -> int:
    depth = 0
    for site in trace.nodes.values():
        if site["type"] != "sample":
            continue
        for frame in site["cond_indep_stack"]:
            if frame.dim is not None:
                depth = max(depth, -frame.dim)
        depth = max(depth, len(site["fn"].batch_shape))
    return depth


def check_continuous_only(continuous: list[str], discrete: list[str]) -> None:
    """Raise :class:`UnsupportedSiteError` unless the latents are all continuous (and exist)."""
    if discrete and continuous:
        raise UnsupportedSiteError(
            f"The model has continuous latent sites {continuous} AND discrete latent sites "
            f"{discrete}. Supported: models whose latent sites are all discrete (AutoSpec(model) "
            f"or AnyOrderGuide) or all continuous (DiffusionGuide). Marginalise the discrete "
            f"sites out of the model, or fix one kind with poutine.condition."
        )
    if not continuous:
        raise UnsupportedSiteError(
            "The model has no continuous latent sites; a DiffusionGuide needs at least one "
            "(use AutoSpec(model) for models whose latent sites are all discrete)."
        )


def discover_continuous_sites(
    model: Callable,
    args: tuple = (),
    kwargs: dict | None = None,
    *,
    max_plate_nesting: int | None = None,
) -> ContinuousLayout:
    """Trace ``model`` once and lay out its continuous latent sites and observed sites.

    Parameters
    ----------
    model : callable
        A Pyro model; its data are passed through ``obs=``.
    args, kwargs
        The model's arguments (data included).
    max_plate_nesting : int, optional
        Found from the trace (plates and distribution batch dimensions) when ``None``.

    Returns
    -------
    ContinuousLayout

    Raises
    ------
    UnsupportedSiteError
        If the model has discrete latent sites (alone or beside continuous ones), or none.

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> def model():
    ...     p = pyro.sample("p", dist.Dirichlet(torch.ones(3)))
    ...     pyro.sample("x", dist.Categorical(p), obs=torch.tensor(1))
    >>> site = discover_continuous_sites(model).sites[0]
    >>> site.name, tuple(site.shape), tuple(site.unconstrained_shape)
    ('p', (3,), (2,))
    """
    kwargs = {} if kwargs is None else kwargs
    trace = _trace(model, args, kwargs)
    mpn = _max_plate_nesting(trace) if max_plate_nesting is None else int(max_plate_nesting)
    sites, data, continuous, discrete = [], [], [], []
    offset, data_offset = 0, 0
    for name, site in trace.nodes.items():
        if site["type"] != "sample":
            continue
        if site["is_observed"]:
            if _is_auxiliary(site):
                continue
            shape = torch.Size(site["value"].shape)
            data.append(DataSite(name, shape, data_offset))
            data_offset += int(shape.numel())
            continue
        fn = site["fn"]
        if fn.support.is_discrete:
            discrete.append(name)
            continue
        continuous.append(name)
        value = site["value"]
        unconstrained = biject_to(fn.support).inv(value)
        sites.append(
            ContinuousSite(
                name,
                torch.Size(value.shape),
                int(fn.event_dim),
                fn.support,
                torch.Size(unconstrained.shape),
                offset,
            )
        )
        offset += int(unconstrained.numel())
    check_continuous_only(continuous, discrete)
    if mpn < _max_plate_nesting(trace):
        raise AutoSpecModelError(
            f"max_plate_nesting = {mpn} is smaller than the model's plate and batch "
            f"dimensions ({_max_plate_nesting(trace)}); pass None to find it"
        )
    return ContinuousLayout(sites, data, mpn)


def observed_data(
    model: Callable, args: tuple, kwargs: dict | None, layout: ContinuousLayout
) -> torch.Tensor:
    """The model's observed values for these arguments, flattened: Tensor[1, D]."""
    trace = _trace(model, args, {} if kwargs is None else kwargs)
    values = {}
    for site in layout.data:
        if site.name not in trace.nodes or not trace.nodes[site.name]["is_observed"]:
            raise AutoSpecModelError(
                f"site '{site.name}' is not observed with these arguments; pass the data the "
                f"guide conditions on (obs=...)"
            )
        values[site.name] = trace.nodes[site.name]["value"]
    return layout.data_vector(values)


def check_layout(expected: ContinuousLayout, actual: ContinuousLayout) -> None:
    """Raise a clear error when a guide's layout and the model's layout differ."""
    if expected.signature() != actual.signature():
        raise AutoSpecModelError(
            f"the model with these arguments has latent sites / data "
            f"{actual.signature()}, but the guide was built for {expected.signature()}; "
            f"build the guide with arguments of the same shapes"
        )


# ---------------------------------------------------------------------------------- simulation
def _fork_rng(seed: int | None):
    if seed is None:
        return _NullContext()
    context = torch.random.fork_rng(devices=[])
    return _SeededContext(context, int(seed))


class _NullContext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _SeededContext:
    def __init__(self, context, seed: int):
        self.context, self.seed = context, seed

    def __enter__(self):
        self.context.__enter__()
        torch.manual_seed(self.seed)
        return self

    def __exit__(self, *exc):
        return self.context.__exit__(*exc)


def simulate(
    model: Callable,
    args: tuple,
    kwargs: dict | None,
    layout: ContinuousLayout,
    num_simulations: int,
    *,
    seed: int | None = None,
    vectorize: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Prior predictive draws ``(y, data)``: latents in unconstrained space and data.

    The model runs under ``poutine.uncondition`` (observed sites are sampled) inside a plate of
    size ``num_simulations`` at ``dim = -(max_plate_nesting + 1)``.

    Parameters
    ----------
    model : callable
    args, kwargs
        The model's arguments (the observed values themselves are ignored).
    layout : ContinuousLayout
    num_simulations : int
        ``S``, the number of ``(latent, data)`` pairs.
    seed : int, optional
        Seeds torch's RNG inside a fork (the global state is left as it was).
    vectorize : bool
        One vectorised trace (default), or one trace per simulation (for models that do not
        broadcast over an extra batch dimension on the left).

    Returns
    -------
    y : Tensor[S, d]
        Unconstrained latents.
    data : Tensor[S, D]
        Flattened simulated data.

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> def model(y):
    ...     loc = pyro.sample("loc", dist.Normal(0.0, 1.0))
    ...     with pyro.plate("data", 2):
    ...         pyro.sample("y", dist.Normal(loc, 1.0), obs=y)
    >>> layout = discover_continuous_sites(model, (torch.zeros(2),))
    >>> y, data = simulate(model, (torch.zeros(2),), {}, layout, 5, seed=0)
    >>> y.shape, data.shape
    (torch.Size([5, 1]), torch.Size([5, 2]))
    """
    kwargs = {} if kwargs is None else kwargs
    if not isinstance(num_simulations, (int, np.integer)) or num_simulations < 1:
        raise ValueError(f"num_simulations must be a positive int, got {num_simulations!r}")
    num = int(num_simulations)
    unconditioned = poutine.uncondition(model)
    with _fork_rng(seed), torch.no_grad():
        if vectorize:
            with (
                poutine.block(),
                pyro.plate("_simulations", num, dim=-(layout.max_plate_nesting + 1)),
            ):
                trace = poutine.trace(unconditioned).get_trace(*args, **kwargs)
            traces = [prune_subsample_sites(trace)]
        else:
            traces = [_trace(unconditioned, args, kwargs) for _ in range(num)]
    latents, data = {}, {}
    for site in layout.sites:
        values = [tr.nodes[site.name]["value"] for tr in traces]
        y = torch.cat([site.transform.inv(v).reshape(-1) for v in values])
        if y.numel() != num * site.numel:
            raise AutoSpecModelError(
                f"site '{site.name}' did not broadcast over the simulation plate (got "
                f"{y.numel()} values for {num} simulations of {site.numel}); pass "
                f"vectorize=False"
            )
        latents[site.name] = y.reshape(num, site.numel)
    for site in layout.data:
        values = torch.cat([tr.nodes[site.name]["value"].reshape(-1) for tr in traces])
        if values.numel() != num * site.numel:
            raise AutoSpecModelError(
                f"observed site '{site.name}' did not broadcast over the simulation plate; "
                f"pass vectorize=False"
            )
        data[site.name] = values.reshape(num, site.numel)
    y = torch.cat([latents[s.name] for s in layout.sites], dim=-1)
    d = layout.data_vector(data) if layout.data else torch.zeros(num, 0)
    return y.to(torch.get_default_dtype()), d


# ---------------------------------------------------------------------------------- log joint
def continuous_log_joint(
    model: Callable,
    args: tuple,
    kwargs: dict | None,
    layout: ContinuousLayout,
    values: Mapping[str, torch.Tensor],
    *,
    pointwise: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``log p(x, data)`` of a batch of draws of the continuous sites, in one trace.

    Parameters
    ----------
    model : callable
    args, kwargs
        The model's arguments (data included).
    layout : ContinuousLayout
    values : dict
        ``name -> Tensor[N, *site.shape]`` for every latent site (constrained values).
    pointwise : bool
        Also return the pointwise log likelihood of every observed site.

    Returns
    -------
    log_prob : DoubleTensor[N]
        Sum of every site's scaled, masked log density (no Jacobian: constrained space).
    pointwise : dict, only if ``pointwise=True``
        ``name -> DoubleTensor[N, *site shape]`` for each observed site.

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> def model():
    ...     pyro.sample("x", dist.Normal(0.0, 1.0))
    >>> layout = discover_continuous_sites(model)
    >>> continuous_log_joint(model, (), {}, layout, {"x": torch.zeros(2)})
    tensor([-0.9189, -0.9189], dtype=torch.float64)
    """
    kwargs = {} if kwargs is None else kwargs
    num = int(torch.as_tensor(values[layout.names[0]]).shape[0])
    mpn = layout.max_plate_nesting
    conditioned = {}
    for site in layout.sites:
        batch_rank = len(site.shape) - site.event_dim
        shape = (num,) + (1,) * (mpn - batch_rank) + tuple(site.shape)
        conditioned[site.name] = torch.as_tensor(values[site.name]).reshape(shape)
    with poutine.block(), torch.no_grad(), pyro.plate("_draws", num, dim=-(mpn + 1)):
        trace = poutine.trace(poutine.condition(model, conditioned)).get_trace(*args, **kwargs)
    trace = prune_subsample_sites(trace)
    trace.compute_log_prob()
    total = torch.zeros(num, dtype=torch.float64)
    points = {}
    for name, site in trace.nodes.items():
        if site["type"] != "sample":
            continue
        log_prob = site["log_prob"].double()
        log_prob = log_prob.expand((num,) + log_prob.shape[1:]) if log_prob.dim() else log_prob
        per_draw = log_prob.reshape(num, -1) if log_prob.dim() else log_prob.expand(num)[:, None]
        total = total + per_draw.sum(-1)
        if site["is_observed"] and any(s.name == name for s in layout.data):
            points[name] = per_draw
    if not pointwise:
        return total
    return total, points


# ---------------------------------------------------------------------------------- sampling
@dataclass
class ContinuousResult:
    """Draws of a model's continuous latent sites and what they cost.

    Attributes
    ----------
    samples : OrderedDict of str -> Tensor[N, *site.shape]
        Constrained draws per site (the shapes of ``MCMC.get_samples()``).
    unconstrained : Tensor[N, d]
        The flattened unconstrained draws ``X_T / T``.
    diffusion : DiffusionResult
        The engine's result (``rounds``, ``sample_rounds``, ``oracle_rows``, ``log_prob``...).
    lp : DoubleTensor[N] or None
        ``log p(x, data)`` of every draw (constrained space), when computed.
    pointwise : dict of str -> DoubleTensor[N, n_obs]
        Pointwise log likelihood of every observed site (flattened per draw), when computed.
    """

    samples: OrderedDict
    unconstrained: torch.Tensor
    diffusion: Any
    lp: torch.Tensor | None = None
    pointwise: dict = field(default_factory=dict)

    @property
    def sample_rounds(self) -> torch.Tensor:
        """LongTensor[N]: rounds in which each draw had an oracle query in flight."""
        return self.diffusion.sample_rounds

    @property
    def rounds(self) -> int:
        """Batched oracle calls of the whole run."""
        return self.diffusion.rounds

    @property
    def oracle_rows(self) -> int:
        """``(t, x)`` rows of the whole run."""
        return self.diffusion.oracle_rows

    @property
    def log_prob(self) -> torch.Tensor:
        """DoubleTensor[N]: log density of each draw's Euler-Maruyama PATH (not of ``x``)."""
        return self.diffusion.log_prob


_SCHEDULE_KNOBS = ("rho", "max_block", "max_rows_per_round", "max_rows_per_call")


def sample_continuous(
    guide: Any,
    num_samples: int,
    *args: Any,
    model_kwargs: dict | None = None,
    method: str = "autospec",
    seed: int | np.random.Generator | torch.Generator | None = None,
    progress: bool = False,
    oracle: Any = None,
    log_joint: bool = True,
    **schedule: Any,
) -> ContinuousResult:
    """Draw a model's continuous latent sites from a diffusion guide, exactly for its chain.

    Parameters
    ----------
    guide : DiffusionGuide
        Any object with ``model``, ``layout`` (:class:`ContinuousLayout`), ``times``
        (Tensor[N + 1]) and ``oracle(*args, **kwargs)`` (a ``MeanOracle`` over ``layout.dim``
        given the data in ``args``).
    num_samples : int
        Draws.
    *args
        The model's positional arguments (data included); default: those the guide was built
        with (``guide.model_args``) when none are given.
    model_kwargs : dict, optional
        The model's keyword arguments.
    method : {"autospec", "sequential", "picard"}
        Passed to :func:`~pyro_autospec.engine.diffusion.sample_diffusion`; the first two give
        the same law (the sequential Euler-Maruyama chain of the guide).
    seed : int or Generator, optional
        Seeds the engine.
    progress : bool
        Show the engine's progress bar.
    oracle : MeanOracle, optional
        Use this denoiser instead of ``guide.oracle(*args)`` (it must have ``dim = layout.dim``);
        the layout, grid and transforms are still the guide's. For tests with an exact denoiser.
    log_joint : bool
        Also compute ``lp = log p(x, data)`` and the pointwise log likelihood.
    **schedule
        Engine knobs ``rho``, ``max_block``, ``max_rows_per_round``, ``max_rows_per_call``; they
        move rounds against rows and never change the law of the draws.

    Returns
    -------
    ContinuousResult

    Raises
    ------
    UnsupportedSiteError
        For a model with discrete latent sites.
    AutoSpecModelError
        If the model's sites with these arguments differ from the guide's.

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> from pyro_autospec.guides.diffusion import DiffusionGuide
    >>> def model(y):
    ...     loc = pyro.sample("loc", dist.Normal(0.0, 1.0))
    ...     with pyro.plate("data", 3):
    ...         pyro.sample("y", dist.Normal(loc, 1.0), obs=y)
    >>> guide = DiffusionGuide(model, (torch.zeros(3),), hidden_dim=8, num_steps=16)
    >>> out = sample_continuous(guide, 10, torch.tensor([0.5, 1.0, 1.5]), seed=0)
    >>> out.samples["loc"].shape, out.sample_rounds.shape, out.lp.shape
    (torch.Size([10]), torch.Size([10]), torch.Size([10]))
    """
    from pyro_autospec.engine.diffusion import sample_diffusion

    unknown = sorted(set(schedule) - set(_SCHEDULE_KNOBS))
    if unknown:
        raise TypeError(
            f"unknown keyword(s) {unknown}; pass model keywords as model_kwargs={{...}}; the "
            f"engine knobs are {list(_SCHEDULE_KNOBS)}"
        )
    if not args and model_kwargs is None:
        args = tuple(getattr(guide, "model_args", ()))
        model_kwargs = dict(getattr(guide, "model_kwargs", {}) or {})
    model_kwargs = {} if model_kwargs is None else dict(model_kwargs)
    layout = discover_continuous_sites(
        guide.model, args, model_kwargs, max_plate_nesting=guide.layout.max_plate_nesting
    )
    check_layout(guide.layout, layout)
    if oracle is None:
        oracle = guide.oracle(*args, **model_kwargs)
    if getattr(oracle, "dim", None) != layout.dim:
        raise ValueError(
            f"oracle has dim = {getattr(oracle, 'dim', None)}; the model's continuous latents "
            f"have d = {layout.dim} unconstrained coordinates"
        )
    result = sample_diffusion(
        oracle,
        num_samples,
        times=guide.times,
        method=method,
        seed=seed,
        progress=progress,
        **schedule,
    )
    y = result.samples.detach().to("cpu", torch.get_default_dtype())
    samples = layout.from_unconstrained(y)
    out = ContinuousResult(samples, y, result)
    if log_joint:
        out.lp, out.pointwise = continuous_log_joint(
            guide.model, args, model_kwargs, layout, samples, pointwise=True
        )
    return out
