"""Continuous latent sites of a Pyro model: discovery, flattening and prior simulation.

A model's continuous latent sites are flattened into one vector ``y`` in unconstrained space
(each site mapped by ``biject_to(site.support).inv``, in trace order, each site flattened in C
order). This is the layout a :class:`~pyro_autospec.guides.DiffusionGuide` works in:

* :func:`discover_continuous_sites` -> :class:`ContinuousLayout` (latent sites, observed data
  sites, ``max_plate_nesting``; a clear error for discrete latent sites);
* :func:`observed_data`, :func:`check_layout`: the data a guide conditions on;
* :func:`simulate`: prior predictive ``(latent, data)`` pairs, vectorised over a plate.

The log joint of a batch of draws is :func:`pyro_autospec.model.log_joint.continuous_log_joint`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from pyro import poutine
from torch.distributions import biject_to

from pyro_autospec.model.errors import AutoSpecModelError, UnsupportedSiteError
from pyro_autospec.model.tracing import (
    plate_nesting,
    seed_generators,
    simulate_trace,
    site_role,
    trace_model,
    users_generators_kept,
)

__all__ = [
    "ContinuousLayout",
    "ContinuousSite",
    "DataSite",
    "check_continuous_only",
    "check_layout",
    "discover_continuous_sites",
    "observed_data",
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
    """One observed site: its name, value shape and slice of the flattened data vector.

    ``batch_shape`` is the shape of its pointwise log likelihood (``None`` if unknown).
    """

    name: str
    shape: torch.Size
    offset: int
    batch_shape: torch.Size | None = None

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
        """Flatten observed values ``name -> Tensor[*shape]`` (or ``[S, *shape]``) to ``[S, D]``."""
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
def check_continuous_only(continuous: list[str], discrete: list[str]) -> None:
    """Raise :class:`UnsupportedSiteError` unless the latents are all continuous (and exist)."""
    if discrete and continuous:
        raise UnsupportedSiteError(
            f"The model has continuous latent sites {continuous} AND discrete latent sites "
            f"{discrete}; a DiffusionGuide covers continuous latent sites only. AutoSpec(model) "
            f"without a guide samples such mixed models (NUTS on the continuous sites with the "
            f"discrete ones enumerated, then exact draws of the discrete sites given each "
            f"continuous draw); or fix one kind with poutine.condition."
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
    trace = trace_model(model, args, kwargs)
    mpn = plate_nesting(trace) if max_plate_nesting is None else int(max_plate_nesting)
    sites, data, continuous, discrete = [], [], [], []
    offset, data_offset = 0, 0
    for name, site in trace.nodes.items():
        if site["type"] != "sample":
            continue
        role = site_role(site)
        if role in ("deterministic", "factor", "subsample"):
            continue
        if site["is_observed"]:
            shape = torch.Size(site["value"].shape)
            data.append(DataSite(name, shape, data_offset, torch.Size(site["fn"].batch_shape)))
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
    if mpn < plate_nesting(trace):
        raise AutoSpecModelError(
            f"max_plate_nesting = {mpn} is smaller than the model's plate and batch "
            f"dimensions ({plate_nesting(trace)}); pass None to find it"
        )
    return ContinuousLayout(sites, data, mpn)


def observed_data(
    model: Callable, args: tuple, kwargs: dict | None, layout: ContinuousLayout
) -> torch.Tensor:
    """The model's observed values for these arguments, flattened: Tensor[1, D]."""
    trace = trace_model(model, args, {} if kwargs is None else kwargs)
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
            f"build the guide from this model, with arguments of the same shapes"
        )


# ---------------------------------------------------------------------------------- simulation
def _fork_rng(seed: int | None):
    if seed is None:
        return _NullContext()
    context = users_generators_kept()
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
        seed_generators(self.seed)
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
    with _fork_rng(seed), torch.no_grad():
        if vectorize:
            traces = [simulate_trace(model, args, kwargs, num, layout.max_plate_nesting)]
        else:
            unconditioned = poutine.uncondition(model)
            traces = [trace_model(unconditioned, args, kwargs) for _ in range(num)]
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
