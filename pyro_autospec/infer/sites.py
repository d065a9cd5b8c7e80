"""From a Pyro model to the engine's coordinates and back.

A Pyro model's unobserved, enumerable discrete sample sites become the coordinates of a
distribution on ``[q]^n``, the setting of the any-order engine:

* sites are taken in **trace order** (the order the model samples them);
* each site contributes one coordinate per element of its batch shape, flattened in **C order**
  (``value.reshape(-1)``); a ``OneHotCategorical`` site contributes one coordinate per event
  (its one-hot last dimension is the value, not a coordinate);
* a coordinate's value is the **index** of the site's value in
  ``fn.enumerate_support(expand=False)`` (for Bernoulli, Categorical, Binomial and
  BetaBinomial this is the value itself; for OneHotCategorical it is the hot position);
* ``num_values`` is the largest support size over all sites; a coordinate whose site has a
  smaller support gives ``-inf`` to the values outside it.

This is the mapping a custom :class:`~pyro_autospec.oracles.base.MarginalOracle` passed as
``AutoSpec(model, oracle=...)`` must follow; :attr:`SiteLayout.coordinates` lists it.

The module also computes the model's log joint ``log p(x, data)`` for a batch of assignments
in one conditioned trace (a ``pyro.plate`` over draws), and the pointwise log likelihood of
each observed site, without ``Predictive`` (see PYRO_NOTES: ``Predictive`` silently draws
missing latent sites from the prior and mis-reshapes event dimensions).
"""

from __future__ import annotations

import math
import warnings
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import pyro
import pyro.distributions as dist
import torch
from pyro import poutine
from pyro.poutine.subsample_messenger import _Subsample
from pyro.poutine.util import prune_subsample_sites

__all__ = [
    "AutoSpecModelError",
    "UnsupportedSiteError",
    "DynamicStructureError",
    "DiscreteSite",
    "SiteLayout",
    "discover_sites",
    "log_joint",
    "enumerate_posterior",
]

_DRAWS_PLATE = "_autospec_draws"
_NUM_STRUCTURE_CHECKS = 8


class AutoSpecModelError(ValueError):
    """A Pyro model AutoSpec cannot sample exactly; the message names the site and the way out."""


class UnsupportedSiteError(AutoSpecModelError):
    """A latent site that is continuous, or discrete without finite enumerable support."""


class DynamicStructureError(AutoSpecModelError):
    """The set, shapes or supports of the model's sample sites change from run to run."""


@dataclass
class DiscreteSite:
    """One unobserved enumerable discrete sample site and its block of coordinates.

    Attributes
    ----------
    name : str
        The site's name.
    distribution : str
        The class name of the site's distribution (``"Bernoulli"``, ``"Categorical"``, ...).
    batch_shape : torch.Size
        The site's batch shape (plates included), e.g. ``(4, 5)`` for a 4x5 grid.
    event_shape : torch.Size
        ``()`` except for ``OneHotCategorical`` (``(K,)``).
    support : Tensor[K, *event_shape]
        The site's support in ``enumerate_support`` order; coordinate value ``k`` means
        ``support[k]``. Its dtype is the site's native dtype.
    offset : int
        Index of the site's first coordinate.
    """

    name: str
    distribution: str
    batch_shape: torch.Size
    event_shape: torch.Size
    support: torch.Tensor
    offset: int = 0

    @property
    def shape(self) -> torch.Size:
        """Shape of one value of the site: ``batch_shape + event_shape``."""
        return self.batch_shape + self.event_shape

    @property
    def num_coords(self) -> int:
        """Number of coordinates: ``prod(batch_shape)``."""
        return math.prod(self.batch_shape)

    @property
    def support_size(self) -> int:
        """``K``, the number of values one coordinate can take."""
        return int(self.support.shape[0])

    @property
    def dtype(self) -> torch.dtype:
        """The site's native dtype (long for Categorical, float for Bernoulli, ...)."""
        return self.support.dtype

    @property
    def coords(self) -> slice:
        """The site's slice of the engine's coordinates."""
        return slice(self.offset, self.offset + self.num_coords)

    def index_to_value(self, index: torch.Tensor) -> torch.Tensor:
        """Map support indices ``LongTensor[...]`` to values ``Tensor[..., *event_shape]``."""
        return self.support.to(index.device)[index]

    def value_to_index(self, value: torch.Tensor) -> torch.Tensor:
        """Map values ``Tensor[..., *event_shape]`` to support indices ``LongTensor[...]``.

        Works for any broadcastable leading shape (also for enumerated values).
        """
        event_dim = len(self.event_shape)
        support = self.support.to(value.device, value.dtype)
        k = support.shape[0]
        expanded = value.unsqueeze(-1 - event_dim)  # [..., 1, *event]
        equal = expanded == support.reshape((k,) + self.event_shape)
        if event_dim:
            equal = equal.flatten(-event_dim).all(-1)
        found = equal.any(-1)
        if not bool(found.all()):
            raise AutoSpecModelError(
                f"Site '{self.name}': a value outside the site's enumerated support "
                f"{self.support.tolist()} was given."
            )
        return equal.long().argmax(-1)


@dataclass
class SiteLayout:
    """How a model's discrete latent sites map to the engine's ``[q]^n`` coordinates.

    Attributes
    ----------
    sites : list of DiscreteSite
        The unobserved enumerable discrete sites, in trace order.
    max_plate_nesting : int
        The model's plate nesting (largest ``-dim`` of any plate, or the value given).
    observed : dict
        ``name -> value`` of the observed sites (data), in trace order; ``pyro.factor`` and
        ``pyro.deterministic`` sites excluded.
    observed_batch_shapes : dict
        ``name -> batch shape`` of each observed site (the shape of its pointwise log
        likelihood).
    signature : tuple
        The structure (names, kinds, shapes) used to detect dynamic models.

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> def model():
    ...     a = pyro.sample("a", dist.Bernoulli(0.3))
    ...     with pyro.plate("p", 2):
    ...         pyro.sample("b", dist.Categorical(torch.ones(3) / 3))
    >>> layout = discover_sites(model)
    >>> layout.num_coords, layout.num_values, layout.coordinates
    (3, 3, [('a', ()), ('b', (0,)), ('b', (1,))])
    """

    sites: list[DiscreteSite]
    max_plate_nesting: int
    observed: dict[str, torch.Tensor] = field(default_factory=dict)
    observed_batch_shapes: dict[str, torch.Size] = field(default_factory=dict)
    signature: tuple = ()

    @property
    def num_coords(self) -> int:
        """``n``: total number of coordinates."""
        return sum(site.num_coords for site in self.sites)

    @property
    def num_values(self) -> int:
        """``q``: the largest support size."""
        return max(site.support_size for site in self.sites)

    @property
    def names(self) -> list[str]:
        """Site names in trace order."""
        return [site.name for site in self.sites]

    @property
    def support_sizes(self) -> torch.Tensor:
        """LongTensor[n]: the support size of every coordinate."""
        return torch.cat(
            [
                torch.full((site.num_coords,), site.support_size, dtype=torch.long)
                for site in self.sites
            ]
        )

    @property
    def coordinates(self) -> list[tuple[str, tuple[int, ...]]]:
        """``(site name, index into the site's batch shape)`` for every coordinate, in order."""
        out = []
        for site in self.sites:
            for flat in range(site.num_coords):
                out.append((site.name, tuple(_unravel(flat, site.batch_shape))))
        return out

    def __getitem__(self, name: str) -> DiscreteSite:
        for site in self.sites:
            if site.name == name:
                return site
        raise KeyError(name)

    def from_coords(self, coords: torch.Tensor) -> dict[str, torch.Tensor]:
        """Map engine draws ``LongTensor[N, n]`` to ``{name: Tensor[N, *site.shape]}``.

        Values have the sites' native dtypes (long for Categorical, float for Bernoulli).
        """
        if coords.dim() != 2 or coords.shape[1] != self.num_coords:
            raise ValueError(
                f"expected coords of shape [N, {self.num_coords}], got {tuple(coords.shape)}"
            )
        n = coords.shape[0]
        out = OrderedDict()
        for site in self.sites:
            index = coords[:, site.coords].reshape((n,) + site.batch_shape)
            out[site.name] = site.index_to_value(index)
        return out

    def to_coords(self, values: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Map ``{name: Tensor[N, *site.shape]}`` to ``LongTensor[N, n]`` (inverts from_coords)."""
        blocks = []
        n = None
        for site in self.sites:
            if site.name not in values:
                raise KeyError(f"missing values for discrete site '{site.name}'")
            value = torch.as_tensor(values[site.name])
            n = value.shape[0] if n is None else n
            index = site.value_to_index(value.reshape((n,) + site.shape))
            blocks.append(index.reshape(n, site.num_coords))
        return torch.cat(blocks, dim=1)

    def check_oracle(self, oracle: object) -> None:
        """Check that a user oracle's ``num_coords`` / ``num_values`` fit this layout.

        Also makes one unconditioned query (two rows, see Pyro issue 3102) and checks that the
        output has shape ``[2, n, q]`` and no mass outside each coordinate's support.
        """
        for attr in ("num_coords", "num_values", "log_marginals"):
            if not hasattr(oracle, attr):
                raise TypeError(
                    f"oracle must be 'enum' or a MarginalOracle (with num_coords, num_values and "
                    f"log_marginals); {type(oracle).__name__} has no '{attr}'"
                )
        expected = ", ".join(
            f"'{s.name}': {s.num_coords} coords x {s.support_size} values" for s in self.sites
        )
        if int(oracle.num_coords) != self.num_coords or int(oracle.num_values) != self.num_values:
            raise ValueError(
                f"oracle has num_coords={oracle.num_coords}, num_values={oracle.num_values}, but "
                f"the model's discrete sites need num_coords={self.num_coords}, "
                f"num_values={self.num_values} ({expected}; sites in trace order, each site's "
                f"values flattened in C order over its batch shape, values as support indices)"
            )
        values = torch.zeros(2, self.num_coords, dtype=torch.long)
        mask = torch.zeros(2, self.num_coords, dtype=torch.bool)
        out = oracle.log_marginals(values, mask)
        if tuple(out.shape) != (2, self.num_coords, self.num_values):
            raise ValueError(
                f"oracle.log_marginals returned shape {tuple(out.shape)}, expected "
                f"(B, {self.num_coords}, {self.num_values})"
            )
        sizes = self.support_sizes.to(out.device)
        outside = torch.arange(self.num_values, device=out.device) >= sizes[:, None]
        if bool((out[:, outside] > -math.inf).any()):
            bad = int(outside.nonzero()[0, 0])
            name, idx = self.coordinates[bad]
            raise ValueError(
                f"oracle gives mass to values outside the support of site '{name}' (coordinate "
                f"{bad}, element {idx}, support size {int(sizes[bad])}); it must return -inf there"
            )


def _unravel(flat: int, shape: torch.Size) -> list[int]:
    out = []
    for size in reversed(shape):
        out.append(flat % size)
        flat //= size
    return list(reversed(out))


def _is_data_site(site: dict) -> bool:
    infer = site.get("infer") or {}
    return not infer.get("is_auxiliary", False) and not infer.get("_deterministic", False)


def _trace(model: Callable, args: tuple, kwargs: dict):
    with poutine.block():
        trace = poutine.trace(model).get_trace(*args, **kwargs)
    return prune_subsample_sites(trace)


def _signature(trace) -> tuple:
    out = []
    for name, site in trace.nodes.items():
        if site["type"] != "sample":
            continue
        fn = site["fn"]
        out.append(
            (
                name,
                bool(site["is_observed"]),
                type(fn).__name__,
                tuple(fn.batch_shape),
                tuple(fn.event_shape),
            )
        )
    return tuple(out)


def _plate_dims(site: dict) -> dict[int, int]:
    return {f.dim: f.size for f in site["cond_indep_stack"] if f.vectorized and f.dim is not None}


def _check_site(name: str, site: dict) -> None:
    fn = site["fn"]
    kind = type(fn).__name__
    if not fn.support.is_discrete:
        raise UnsupportedSiteError(
            f"Site '{name}' is a continuous latent site ({kind}); AutoSpec samples discrete "
            f"latent sites exactly and cannot sample continuous ones. Condition it on a value "
            f"with `poutine.condition(model, data={{'{name}': value}})` (or observe it), or sample "
            f"it with a continuous method (HMC/NUTS, or the diffusion guide once it exists)."
        )
    support_error = None
    if getattr(fn, "has_enumerate_support", False):
        try:
            fn.enumerate_support(expand=False)
        except (NotImplementedError, ValueError, RuntimeError) as e:
            support_error = str(e)
    else:
        support_error = "it has no finite enumerable support"
    if support_error is not None:
        hint = ""
        if isinstance(fn, dist.Independent) or (
            isinstance(fn, dist.MaskedDistribution) and isinstance(fn.base_dist, dist.Independent)
        ):
            hint = " Declare its batch dimensions with `pyro.plate` instead of `.to_event()`."
        raise UnsupportedSiteError(
            f"Site '{name}' is a discrete latent site ({kind}) that AutoSpec cannot enumerate: "
            f"{support_error}.{hint} Enumerable sites are Bernoulli, Categorical, "
            f"OneHotCategorical, Binomial and BetaBinomial (with homogeneous total_count). "
            f"Use one of those (for example a truncated Categorical in place of a Poisson or "
            f"Geometric), or condition the site with `poutine.condition(model, data={{'{name}': "
            f"value}})`."
        )


def _check_plates(name: str, site: dict, max_plate_nesting: int, latent: bool) -> None:
    fn = site["fn"]
    plates = _plate_dims(site)
    batch_shape = fn.batch_shape
    for i, size in enumerate(batch_shape):
        d = i - len(batch_shape)
        if size > 1 and plates.get(d) != size:
            where = "latent" if latent else "observed"
            raise AutoSpecModelError(
                f"Site '{name}' ({where}, batch shape {tuple(batch_shape)}) has a batch dimension "
                f"{d} of size {size} that no `pyro.plate` declares. Exact enumeration needs every "
                f"batch dimension inside a plate: wrap the site in `pyro.plate(..., {size}, "
                f"dim={d})`" + ("." if latent else ", or move it to the event with `.to_event()`.")
            )
    if len(batch_shape) > max_plate_nesting and any(
        s > 1 for s in batch_shape[: -max_plate_nesting or None]
    ):
        raise AutoSpecModelError(
            f"Site '{name}' has batch shape {tuple(batch_shape)} but max_plate_nesting="
            f"{max_plate_nesting}; increase max_plate_nesting."
        )


def discover_sites(
    model: Callable,
    args: tuple = (),
    kwargs: dict | None = None,
    *,
    max_plate_nesting: int | None = None,
) -> SiteLayout:
    """Find a model's discrete latent sites and check that AutoSpec can sample them exactly.

    The model is traced under ``poutine.block`` a few times (with a forked torch RNG, so the
    global random state is left unchanged) to check that its structure does not change.

    Parameters
    ----------
    model : callable
        A Pyro model.
    args, kwargs
        The model's arguments.
    max_plate_nesting : int, optional
        Found from the model's plates when ``None``.

    Returns
    -------
    SiteLayout

    Raises
    ------
    UnsupportedSiteError
        For a continuous latent site, or a discrete one without finite enumerable support.
    DynamicStructureError
        When different runs give different sites, shapes or supports.
    AutoSpecModelError
        When there is no discrete latent site, or a batch dimension is not declared by a plate.

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> def model(data):
    ...     z = pyro.sample("z", dist.Bernoulli(0.5))
    ...     pyro.sample("y", dist.Normal(z, 1.0), obs=data)
    >>> layout = discover_sites(model, (torch.tensor(0.3),))
    >>> layout.names, layout.num_coords, list(layout.observed)
    (['z'], 1, ['y'])
    """
    kwargs = {} if kwargs is None else kwargs
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(20260101)
        traces = [_trace(model, args, kwargs) for _ in range(_NUM_STRUCTURE_CHECKS)]
    trace = traces[0]
    signature = _signature(trace)
    for other in traces[1:]:
        _compare_signatures(signature, _signature(other))

    plate_nesting = 0
    for site in trace.nodes.values():
        if site["type"] == "sample":
            for f in site["cond_indep_stack"]:
                if f.vectorized and f.dim is not None:
                    plate_nesting = max(plate_nesting, -f.dim)
    if max_plate_nesting is None:
        max_plate_nesting = plate_nesting
    elif max_plate_nesting < plate_nesting:
        raise AutoSpecModelError(
            f"max_plate_nesting={max_plate_nesting} but the model nests plates {plate_nesting} "
            f"deep; pass max_plate_nesting={plate_nesting} or leave it as None."
        )

    sites: list[DiscreteSite] = []
    observed: dict[str, torch.Tensor] = OrderedDict()
    observed_shapes: dict[str, torch.Size] = OrderedDict()
    offset = 0
    for name, site in trace.nodes.items():
        if site["type"] != "sample":
            continue
        fn = site["fn"]
        if site["is_observed"]:
            if _is_data_site(site):
                _check_plates(name, site, max_plate_nesting, latent=False)
                observed[name] = site["value"].detach()
                observed_shapes[name] = fn.batch_shape
            continue
        _check_site(name, site)
        _check_plates(name, site, max_plate_nesting, latent=True)
        support = fn.enumerate_support(expand=False)
        k = support.shape[0]
        if support.shape[1 : 1 + len(fn.batch_shape)].numel() != 1:
            raise UnsupportedSiteError(
                f"Site '{name}' ({type(fn).__name__}) has a support that differs between its batch "
                f"elements; AutoSpec needs one support per site. Split it into sites with equal "
                f"supports."
            )
        support = support.reshape((k,) + fn.event_shape)
        value = site["value"]
        if tuple(value.shape) != tuple(fn.batch_shape + fn.event_shape):
            raise AutoSpecModelError(
                f"Site '{name}' has value shape {tuple(value.shape)} but batch + event shape "
                f"{tuple(fn.batch_shape + fn.event_shape)}; declare its batch dimensions with "
                f"plates."
            )
        block = DiscreteSite(
            name=name,
            distribution=type(fn).__name__,
            batch_shape=fn.batch_shape,
            event_shape=fn.event_shape,
            support=support.detach().to(value.dtype),
            offset=offset,
        )
        offset += block.num_coords
        sites.append(block)
    if not sites:
        raise AutoSpecModelError(
            "The model has no unobserved discrete sample site: there is nothing for AutoSpec to "
            "sample (observed sites need `obs=`; latent ones Bernoulli, Categorical, "
            "OneHotCategorical, Binomial or BetaBinomial)."
        )
    return SiteLayout(
        sites=sites,
        max_plate_nesting=max_plate_nesting,
        observed=observed,
        observed_batch_shapes=observed_shapes,
        signature=signature,
    )


def _compare_signatures(expected: tuple, actual: tuple) -> None:
    if expected == actual:
        return
    exp = {s[0]: s for s in expected}
    act = {s[0]: s for s in actual}
    for name in list(exp) + list(act):
        if name not in act:
            raise DynamicStructureError(
                f"Site '{name}' appears in some runs of the model and not in others: the model's "
                f"structure depends on random values. AutoSpec needs a fixed set of sites; sample "
                f"'{name}' in every run and select with tensors (torch.where, Vindex, "
                f"poutine.mask) instead of Python control flow."
            )
        if name not in exp:
            raise DynamicStructureError(
                f"Site '{name}' appears in some runs of the model and not in others: the model's "
                f"structure depends on random values. AutoSpec needs a fixed set of sites; sample "
                f"'{name}' in every run and select with tensors (torch.where, Vindex, "
                f"poutine.mask) instead of Python control flow."
            )
        if exp[name] != act[name]:
            raise DynamicStructureError(
                f"Site '{name}' changes between runs of the model (kind, distribution or shape: "
                f"{exp[name][1:]} vs {act[name][1:]}). AutoSpec needs a fixed model structure; "
                f"make the site's distribution and shape independent of random values."
            )
    raise DynamicStructureError("The order of the model's sample sites changes between runs.")


def _draw_shape(site: DiscreteSite, num_draws: int, mpn: int) -> tuple[int, ...]:
    pad = mpn - len(site.batch_shape)
    return (num_draws,) + (1,) * pad + tuple(site.batch_shape) + tuple(site.event_shape)


def _value_error_to_structure(error: Exception, trace_names: list[str]) -> DynamicStructureError:
    last = f" (after site '{trace_names[-1]}')" if trace_names else ""
    reason = str(error).splitlines()[0] if str(error) else type(error).__name__
    return DynamicStructureError(
        f"Running the model on a batch of draws failed{last}: {reason}. AutoSpec evaluates the "
        f"model on batched (and enumerated) values of its discrete sites, so the model must not "
        f"branch on their values with Python control flow (if/int()/.item()); use tensor "
        f"operations (torch.where, Vindex, poutine.mask) so its structure is fixed."
    )


class _SiteRecorder(poutine.messenger.Messenger):
    """Remembers the sample sites seen so far, to name the site where a run failed."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def _pyro_post_sample(self, msg):
        if not msg["name"].startswith("_autospec") and not isinstance(msg["fn"], _Subsample):
            self.names.append(msg["name"])


def log_joint(
    model: Callable,
    args: tuple,
    kwargs: dict | None,
    layout: SiteLayout,
    values: Mapping[str, torch.Tensor],
    *,
    pointwise: bool = False,
    chunk_size: int = 4096,
) -> torch.Tensor | tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``log p(x, data)`` of a batch of assignments of the discrete sites, in one trace per chunk.

    The model runs inside a ``pyro.plate`` over draws at ``dim = -(max_plate_nesting + 1)``,
    conditioned on ``values`` reshaped to ``(N,) + (1,) * pad + batch_shape + event_shape``.

    Parameters
    ----------
    model : callable
    args, kwargs
        The model's arguments.
    layout : SiteLayout
        From :func:`discover_sites`.
    values : dict
        ``name -> Tensor[N, *site.shape]`` for every discrete site of ``layout``.
    pointwise : bool
        Also return the pointwise log likelihood of every observed site.
    chunk_size : int
        Draws per trace.

    Returns
    -------
    log_prob : DoubleTensor[N]
        ``log p(x, data)``: the sum of every site's scaled, masked log prob (latent sites,
        observed sites and factors).
    pointwise : dict, only if ``pointwise=True``
        ``name -> DoubleTensor[N, *batch_shape]`` for each observed site.

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> def model():
    ...     z = pyro.sample("z", dist.Bernoulli(0.25))
    ...     pyro.sample("y", dist.Bernoulli(0.5 + 0.25 * z), obs=torch.tensor(1.0))
    >>> layout = discover_sites(model)
    >>> lp = log_joint(model, (), {}, layout, {"z": torch.tensor([0.0, 1.0])})
    >>> torch.allclose(lp.exp(), torch.tensor([0.75 * 0.5, 0.25 * 0.75], dtype=torch.float64))
    True
    """
    kwargs = {} if kwargs is None else kwargs
    names = layout.names
    num_draws = int(torch.as_tensor(values[names[0]]).shape[0])
    totals, points = [], {name: [] for name in layout.observed}
    for start in range(0, num_draws, chunk_size):
        stop = min(start + chunk_size, num_draws)
        chunk = {name: torch.as_tensor(values[name])[start:stop] for name in names}
        try:
            total, pw = _log_joint_chunk(model, args, kwargs, layout, chunk, stop - start)
        except RuntimeError as e:  # shapes of the batched run do not line up
            raise AutoSpecModelError(_MIXED_DRAWS + f" (PyTorch said: {e})") from e
        totals.append(total)
        for name in points:
            points[name].append(pw[name])
    total = torch.cat(totals)
    if num_draws > 1:
        _check_draws_do_not_mix(model, args, kwargs, layout, values, total)
    if not pointwise:
        return total
    return total, {name: torch.cat(parts) for name, parts in points.items()}


def _check_draws_do_not_mix(model, args, kwargs, layout, values, total) -> None:
    """The batched log joint of draw 0 must equal its log joint computed alone.

    A ``pyro.factor`` (or a site) whose value loses the draws' batch dimension, for example
    ``pyro.factor("f", (s[..., 1:] * s[..., :-1]).sum(-1))`` with ``s`` a plated site, lands on
    a plate dimension and broadcasts against the other draws: the batched total would be
    silently wrong. One extra trace of a single draw catches it.
    """
    first = {name: torch.as_tensor(values[name])[:1] for name in layout.names}
    alone, _ = _log_joint_chunk(model, args, kwargs, layout, first, 1)
    if not torch.allclose(alone[0], total[0], rtol=1e-6, atol=1e-6, equal_nan=True):
        raise AutoSpecModelError(
            f"log p(x, data) of one draw is {float(alone[0]):.6g} alone but "
            f"{float(total[0]):.6g} in a batch. " + _MIXED_DRAWS
        )


_MIXED_DRAWS = (
    "The model cannot be evaluated on a batch of draws: a site's value loses the batch "
    "dimensions the model is run with, so draws mix. Usually a pyro.factor or a distribution "
    "parameter reduces over a plate dimension, as in (s[..., 1:] * s[..., :-1]).sum(-1): keep "
    "the dimension with .sum(-1, keepdim=True) so every value keeps its leading batch dimensions."
)


def _log_joint_chunk(model, args, kwargs, layout, chunk, num_draws):
    mpn = layout.max_plate_nesting
    data = {}
    for site in layout.sites:
        value = chunk[site.name]
        if tuple(value.shape[1:]) != tuple(site.shape):
            raise ValueError(
                f"values['{site.name}'] has shape {tuple(value.shape)}, expected "
                f"(N,) + {tuple(site.shape)}"
            )
        data[site.name] = value.to(site.dtype).reshape(_draw_shape(site, num_draws, mpn))

    def batched(*a, **k):
        with pyro.plate(_DRAWS_PLATE, num_draws, dim=-(mpn + 1)):
            return model(*a, **k)

    recorder = _SiteRecorder()
    try:
        with poutine.block(), recorder, warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*was not registered.*")
            trace = poutine.trace(poutine.condition(batched, data=data)).get_trace(*args, **kwargs)
            trace = prune_subsample_sites(trace)
            trace.compute_log_prob()
    except (RuntimeError, ValueError, TypeError, IndexError) as e:
        raise _value_error_to_structure(e, recorder.names) from e

    known = set(layout.names)
    total = torch.zeros(num_draws, dtype=torch.float64)
    pointwise = {}
    for name, site in trace.nodes.items():
        if site["type"] != "sample":
            continue
        if not site["is_observed"] and name not in known:
            raise DynamicStructureError(
                f"Site '{name}' is latent in the batched run of the model but was not found when "
                f"the model was first traced: the model's structure depends on random values. "
                f"AutoSpec needs a fixed set of sites."
            )
        lp = site["log_prob"].detach().to(torch.float64)
        lp = lp.expand(torch.broadcast_shapes(lp.shape, (num_draws,) + (1,) * mpn))
        total = total + lp.reshape(num_draws, -1).sum(-1)
        if name in layout.observed:
            shape = tuple(layout.observed_batch_shapes[name])
            full = (num_draws,) + (1,) * (mpn - len(shape)) + shape
            pointwise[name] = lp.expand(full).reshape((num_draws,) + shape)
    missing = known - {n for n, s in trace.nodes.items() if s["type"] == "sample"}
    if missing:
        raise DynamicStructureError(
            f"Site '{sorted(missing)[0]}' was not sampled in the batched run of the model: the "
            f"model's structure depends on random values. AutoSpec needs a fixed set of sites."
        )
    return total, pointwise


def enumerate_posterior(
    model: Callable,
    args: tuple = (),
    kwargs: dict | None = None,
    *,
    layout: SiteLayout | None = None,
    max_states: int = 2**16,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact posterior over every assignment of the discrete sites, by brute force.

    The obviously correct slow path that tests compare samplers and oracles against: it lists
    all ``prod(support sizes)`` assignments and evaluates :func:`log_joint` on each.

    Returns
    -------
    states : LongTensor[M, n]
        Every assignment, as support indices (lexicographic order).
    log_prob : DoubleTensor[M]
        ``log p(x | data)``, normalised.

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> def model():
    ...     pyro.sample("a", dist.Bernoulli(0.2))
    ...     pyro.sample("b", dist.Categorical(torch.tensor([0.5, 0.25, 0.25])))
    >>> states, log_prob = enumerate_posterior(model)
    >>> states.shape, round(float(log_prob.exp()[0]), 3)
    (torch.Size([6, 2]), 0.4)
    """
    kwargs = {} if kwargs is None else kwargs
    if layout is None:
        layout = discover_sites(model, args, kwargs)
    sizes = layout.support_sizes.tolist()
    if math.prod(sizes) > max_states:
        raise ValueError(f"{math.prod(sizes)} states exceed max_states={max_states}")
    grids = torch.meshgrid(*[torch.arange(k) for k in sizes], indexing="ij")
    states = torch.stack([g.reshape(-1) for g in grids], dim=-1)
    lp = log_joint(model, args, kwargs, layout, layout.from_coords(states))
    return states, lp - lp.logsumexp(0)
