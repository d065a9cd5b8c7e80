"""From a Pyro model's discrete latent sites to the engine's coordinates and back.

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

This is the mapping a custom :class:`~pyro_autospec.engine.protocols.MarginalOracle` passed as
``AutoSpec(model, oracle=...)`` must follow; :attr:`SiteLayout.coordinates` lists it.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import pyro
import pyro.distributions as dist
import torch
from pyro.poutine.util import prune_subsample_sites
from torch.distributions import biject_to

from pyro_autospec.engine.protocols import has_targeted_marginals, oracle_num_draws
from pyro_autospec.model.continuous import ContinuousSite
from pyro_autospec.model.errors import (
    AutoSpecModelError,
    DynamicStructureError,
    UnsupportedSiteError,
)
from pyro_autospec.model.tracing import (
    check_subsampling,
    enumerated_trace,
    plate_dims,
    plate_nesting,
    scaled_sites,
    scored_log_joint,
    seed_generators,
    site_role,
    trace_model,
    users_generators_kept,
)

__all__ = ["DiscreteSite", "PlainRun", "SiteLayout", "discover_sites"]

_NUM_STRUCTURE_CHECKS = 8
# A model whose latent sites are all discrete is traced this many times: any Python branch on
# a discrete value also fails in the enumerated trace that every such run makes next (the value
# is then a tensor of the site's whole support), and every exact draw is self-checked.
_NUM_DISCRETE_STRUCTURE_CHECKS = 2


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
    support : ``Tensor[K, *event_shape]``
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
        """Map support indices ``LongTensor[...]`` to values ``Tensor[..., *event_shape]``.

        One ``index_select`` over the flattened indices: the same values as
        ``support[index]``, faster with many draws (advanced indexing with a large index
        tensor takes a slower general path).
        """
        support = self.support.to(index.device)
        picked = support.index_select(0, index.reshape(-1))
        return picked.reshape(tuple(index.shape) + tuple(support.shape[1:]))

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


@dataclass(frozen=True, eq=False)
class PlainRun:
    """One plain run of a model (one draw from its prior given the data, no batch of draws,
    nothing enumerated): its discrete latent values and its log joint there.

    :func:`discover_sites` keeps its structure traces as plain runs, and the check of a batch
    of draws for mixing (:func:`~pyro_autospec.model.log_joint.evaluate`) evaluates them in the
    batch: a model that mixes the draws of a batch gives one of them another log joint there
    than it had alone. They add assignments seen alone to the draws the check traces alone,
    at the cost of two rows of the batch.

    Attributes
    ----------
    values : dict
        ``name -> Tensor[*batch_shape, *event_shape]`` of every discrete latent site.
    log_joint : float
        ``log p(x, data)`` of the run: every site's scaled and masked log density (latent
        sites, observed sites and factors), summed in float64.
    """

    values: dict[str, torch.Tensor]
    log_joint: float


def _plain_run(trace, sites: list[DiscreteSite]) -> PlainRun | None:
    """The plain run a pruned structure trace is; ``None`` where its log densities cannot
    be computed (the batched evaluation then raises the model's error)."""
    try:
        # a number for a check: no graph of the params' uses, and no validation (the run
        # joins the first batch of draws, which is validated)
        with torch.no_grad(), pyro.validation_enabled(False):
            trace.compute_log_prob()
            total = float(scored_log_joint(trace))
    except Exception:  # noqa: BLE001 - a check's shortcut, never its verdict
        return None
    values = {site.name: trace.nodes[site.name]["value"].detach() for site in sites}
    return PlainRun(values, total)


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
    continuous : list of ContinuousSite
        The model's continuous latent sites (empty unless discovery allowed them), in trace
        order; a mixed model samples them by NUTS.
    deterministic : dict
        ``name -> value shape`` of the ``pyro.deterministic`` sites, in trace order.
    scales : dict
        ``name -> mean scale`` of the sites under ``poutine.scale`` (or in a plate with a fixed
        subsample); the posterior AutoSpec samples is the scaled one, as in ``MCMC``.
    plain_runs : tuple of PlainRun
        The plain runs discovery traced, when every latent site is discrete (else empty): the
        check of a batch of draws for mixing compares the batch with them.

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
    continuous: list[ContinuousSite] = field(default_factory=list)
    deterministic: dict[str, torch.Size] = field(default_factory=dict)
    scales: dict[str, float] = field(default_factory=dict)
    plain_runs: tuple[PlainRun, ...] = field(default=(), repr=False, compare=False)

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

    @property
    def continuous_names(self) -> list[str]:
        """Continuous latent site names in trace order (empty for a discrete model)."""
        return [site.name for site in self.continuous]

    def latent_shapes(self) -> dict[str, tuple[torch.Size, torch.Size]]:
        """``name -> (batch_shape, event_shape)`` of every latent site, discrete and continuous."""
        out = {site.name: (site.batch_shape, site.event_shape) for site in self.sites}
        for site in self.continuous:
            rank = len(site.shape) - site.event_dim
            out[site.name] = (torch.Size(site.shape[:rank]), torch.Size(site.shape[rank:]))
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
            n = value.shape[0] if value.dim() and n is None else n
            if value.dim() == 0 or value.numel() != n * math.prod(site.shape):
                raise ValueError(
                    f"values of discrete site '{site.name}' must have shape [N, "
                    f"*{tuple(site.shape)}] (N = {n} draws, as the first site's), got "
                    f"{tuple(value.shape)}: are they another model's or other data's?"
                )
            index = site.value_to_index(value.reshape((n,) + site.shape))
            blocks.append(index.reshape(n, site.num_coords))
        return torch.cat(blocks, dim=1)

    def check_oracle(self, oracle: object) -> None:
        """Check that a user oracle's ``num_coords`` / ``num_values`` fit this layout.

        Also makes one unconditioned query (two rows, see Pyro issue 3102; through
        ``log_marginals_at`` with every coordinate as a target where the oracle has only that)
        and checks that the output has shape ``[2, n, q]`` and no mass outside each
        coordinate's support.
        """
        for attr in ("num_coords", "num_values"):
            if not hasattr(oracle, attr):
                raise TypeError(
                    f"oracle must be 'enum' or a MarginalOracle (with num_coords, num_values and "
                    f"log_marginals or log_marginals_at); {type(oracle).__name__} has no "
                    f"'{attr}'"
                )
        whole_rows = callable(getattr(oracle, "log_marginals", None))
        if not whole_rows and not has_targeted_marginals(oracle):
            raise TypeError(
                f"oracle must be 'enum' or a MarginalOracle (with num_coords, num_values and "
                f"log_marginals or log_marginals_at); {type(oracle).__name__} has neither "
                f"method"
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
        device = getattr(oracle, "device", None) or "cpu"
        values = torch.zeros(2, self.num_coords, dtype=torch.long, device=device)
        mask = torch.zeros(2, self.num_coords, dtype=torch.bool, device=device)
        extra = {}
        if oracle_num_draws(oracle) is not None:  # a family: ask about draw 0
            extra["draws"] = torch.zeros(2, dtype=torch.long, device=device)
        if whole_rows:
            method, out = "log_marginals", oracle.log_marginals(values, mask, **extra)
        else:  # every coordinate as a target: the same [2, n, q] rows
            targets = torch.arange(self.num_coords, device=device).expand(2, -1)
            method = "log_marginals_at"
            out = oracle.log_marginals_at(values, mask, targets, **extra)
        if tuple(out.shape) != (2, self.num_coords, self.num_values):
            raise ValueError(
                f"oracle.{method} returned shape {tuple(out.shape)}, expected "
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


def _has_continuous(trace) -> bool:
    """Whether a trace has a continuous latent sample site."""
    return any(
        site["type"] == "sample"
        and site_role(site) == "latent"
        and not site["fn"].support.is_discrete
        for site in trace.nodes.values()
    )


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


def _continuous_site_error(name: str, kind: str) -> UnsupportedSiteError:
    return UnsupportedSiteError(
        f"Site '{name}' is a continuous latent site ({kind}), and this path enumerates discrete "
        f"latent sites only. AutoSpec(model) without an oracle or guide samples models with "
        f"continuous sites (NUTS on them with the discrete sites enumerated, then exact draws "
        f"of the discrete sites given each continuous draw). Otherwise condition it on a value "
        f"with `poutine.condition(model, data={{'{name}': value}})` (or observe it)."
    )


def _check_discrete_site(name: str, site: dict) -> None:
    fn = site["fn"]
    kind = type(fn).__name__
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
        generic = (
            f" Enumerable sites are Bernoulli, Categorical, OneHotCategorical, Binomial and "
            f"BetaBinomial (with homogeneous total_count). Use one of those (for example a "
            f"truncated Categorical in place of a Poisson or Geometric), or condition the site "
            f"with `poutine.condition(model, data={{'{name}': value}})`."
        )
        if isinstance(fn, dist.Independent) or (
            isinstance(fn, dist.MaskedDistribution) and isinstance(fn.base_dist, dist.Independent)
        ):
            support_error = (
                "`.to_event()` makes its elements one joint event, which Pyro does not enumerate"
            )
            hint = " Declare its batch dimensions with `pyro.plate` instead of `.to_event()`."
            generic = ""  # an enumerable kind already: the plate is the way out
        elif "Inhomogeneous total count" in support_error:
            hint = (
                " Its elements have different total_count, so they have no common support: "
                "sample the count as a Categorical over 0..max(total_count) with logits "
                "dist.Binomial(total_count.unsqueeze(-1), p.unsqueeze(-1), "
                "validate_args=False).log_prob(torch.arange(max_count + 1.0)), which are -inf "
                "above each element's own count."
            )
        raise UnsupportedSiteError(
            f"Site '{name}' is a discrete latent site ({kind}) that AutoSpec cannot enumerate: "
            f"{support_error.rstrip('.')}.{hint}{generic}"
        )


def _check_finite_data(name: str, site: dict) -> None:
    """Refuse observed values that are not tensors, and NaN or infinite ones that the model
    does not mask out."""
    value = site["value"]
    if not torch.is_tensor(value):
        raise AutoSpecModelError(
            f"Site '{name}' observes a {type(value).__name__} ({value!r:.40}), not a tensor. "
            "Pyro's distributions score tensors only: pass a tensor as obs= (for example "
            "torch.as_tensor(y) in the model, or a tensor as the model's argument)."
        )
    if not value.is_floating_point():
        return
    bad = ~torch.isfinite(value.detach())
    event_dim = len(site["fn"].event_shape)
    if event_dim:
        bad = bad.flatten(-event_dim).any(-1)
    fn = site["fn"]
    for mask in (site.get("mask"), getattr(fn, "_mask", None)):  # poutine.mask, fn.mask()
        if mask is False:
            return
        if torch.is_tensor(mask):
            shape = torch.broadcast_shapes(mask.shape, bad.shape)
            bad = bad.expand(shape) & mask.bool().expand(shape)
    if not bool(bad.any()):
        return
    first = tuple(int(i) for i in bad.nonzero()[0]) if bad.dim() else ()
    count = int(bad.sum())
    sample = value.detach()[first] if first else value.detach()
    shown = float(sample.reshape(-1)[0]) if sample.numel() else float("nan")
    raise AutoSpecModelError(
        f"The data of observed site '{name}' hold {count} value(s) that are not finite (the "
        f"first at index {first}: {shown}). A NaN or infinite observation has no density, so "
        f"no posterior exists; this is the data, not the model or the sampler. Remove those "
        f"entries, or mask them out and give them any finite value: `with "
        f"poutine.mask(mask=torch.isfinite(y)): pyro.sample('{name}', ..., "
        f"obs=torch.nan_to_num(y))` (Pyro's support check rejects a NaN even where masked)."
    )


def _check_observed_shape(name: str, site: dict) -> None:
    """Refuse an observation with batch dims its distribution does not have (no plate)."""
    fn, value = site["fn"], site["value"]
    if not torch.is_tensor(value):
        return
    event_dim = len(fn.event_shape)
    value_batch = value.shape[: value.dim() - event_dim]
    extra = len(value_batch) - len(fn.batch_shape)
    wide = [(i - len(value_batch), s) for i, s in enumerate(value_batch[:extra]) if s > 1]
    if not wide:
        return
    dim, size = wide[0]
    plates = ", ".join(
        f"'{f.name}' ({f.size}, dim {f.dim})" for f in site["cond_indep_stack"] if f.vectorized
    )
    where = f" inside plate(s) {plates}" if plates else ""
    raise AutoSpecModelError(
        f"Observed site '{name}'{where} has a value of shape {tuple(value.shape)}, but its "
        f"distribution has batch shape {tuple(fn.batch_shape)}: its dim {dim} of size {size} "
        f"is declared by no pyro.plate, and its log density is broadcast over it. AutoSpec "
        f"(like Pyro's enumeration) places its batch of draws and enumerated values left of "
        f"the declared plates, where that dim would collide with them. Declare it: wrap the "
        f"site in pyro.plate('...', {size}, dim={dim}) (the data's rows then are independent "
        f"given the latent sites), or move it to the event with .to_event()."
    )


def _check_plates(name: str, site: dict, max_plate_nesting: int, latent: bool) -> None:
    fn = site["fn"]
    plates = plate_dims(site)
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


def _compare_signatures(expected: tuple, actual: tuple) -> None:
    if expected == actual:
        return
    exp = {s[0]: s for s in expected}
    act = {s[0]: s for s in actual}
    for name in list(exp) + list(act):
        if name not in act or name not in exp:
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


def _check_plate_sizes(trace) -> None:
    """Refuse a vectorized plate declared without a size (``pyro.plate("data")``)."""
    for name, node in trace.nodes.items():
        if node["type"] != "sample":
            continue
        for frame in node["cond_indep_stack"]:
            if frame.vectorized and (frame.size is None or frame.size < 0):
                value = node.get("value")
                shape = tuple(value.shape) if torch.is_tensor(value) else ()
                dim = frame.dim if frame.dim is not None else -1
                size = shape[dim] if shape and -len(shape) <= dim else None
                example = size if size is not None else "N"
                raise AutoSpecModelError(
                    f"Plate '{frame.name}' (around site '{name}') has no size: "
                    f"pyro.plate('{frame.name}') without a size lets its dim {dim} take any "
                    f"size, but AutoSpec batches draws and enumerated values next to the "
                    f"model's plates and needs every plate's size. Give it: "
                    f"pyro.plate('{frame.name}', {example})"
                    + (f" (site '{name}' has {size} elements there)." if size else ".")
                )


def _check_no_vectorized_markov(trace) -> None:
    """Refuse ``pyro.contrib.funsor.vectorized_markov``: without funsor's handlers it makes
    overlapping duplicate sites (named ``x_slice(0, 3, None)``), not the chain the user wrote."""
    for name, node in trace.nodes.items():
        if node["type"] == "sample" and "slice(" in str(name):
            raise UnsupportedSiteError(
                f"Site '{name}' looks like a site of pyro.contrib.funsor.vectorized_markov, "
                f"which means a Markov chain only under pyro.contrib.funsor's enumeration "
                f"handlers; run as plain Pyro, it makes overlapping duplicate sites. Write the "
                f"chain with pyro.markov (a Python loop over time steps) instead; AutoSpec's "
                f"enumeration oracle contracts it efficiently."
            )


def _check_continuous_parents(
    model: Callable, args: tuple, kwargs: dict, max_plate_nesting: int, names: list[str]
) -> None:
    """Refuse a continuous latent site whose distribution depends on a discrete one.

    The model is traced once with its discrete sites enumerated (each at its own dim left of
    the plates): a continuous site whose distribution has a batch dim there reads a discrete
    site. Where the model fails under enumeration, the sites traced before the failure are
    read (such a site often makes a later one fail: an observation expanded to a fixed
    shape); a model that cannot be traced at all is left to the later stages, which name its
    fault.
    """
    trace = enumerated_trace(model, args, kwargs, max_plate_nesting, partial=True)
    if trace is None:
        return
    holder: dict[int, str] = {}
    for name, node in trace.nodes.items():
        if node["type"] != "sample" or site_role(node) != "latent":
            continue
        dim = (node.get("infer") or {}).get("_enumerate_dim")
        if dim is not None:
            holder[dim] = name
            continue
        if name not in names:
            continue
        batch_shape = node["fn"].batch_shape
        parents = [
            holder[d]
            for d in sorted(holder, reverse=True)
            if len(batch_shape) >= -d and batch_shape[d] > 1
        ]
        if parents:
            listed = ", ".join(f"'{p}'" for p in parents)
            first = parents[0]
            stem = name[: -len("_unobserved")]
            observed = trace.nodes.get(f"{stem}_observed") if name.endswith("_unobserved") else None
            if observed is not None and observed.get("is_observed"):
                raise UnsupportedSiteError(
                    f"Site '{name}' holds the entries of the observation '{stem}' that its "
                    f"`obs_mask` hides: Pyro samples them as a continuous latent site, and its "
                    f"distribution depends on the discrete site(s) {listed}. AutoSpec samples "
                    f"continuous sites before discrete ones, so it cannot sample them. The "
                    f"masked entries do not change the posterior of the other sites; to drop "
                    f"them from the likelihood, observe '{stem}' under `poutine.mask(mask=...)` "
                    f"instead of passing `obs_mask` (give the hidden entries any finite value), "
                    f"and draw the missing values afterwards with `pyro.infer.Predictive` if "
                    f"you need them."
                )
            raise UnsupportedSiteError(
                f"Site '{name}' (continuous, {type(node['fn']).__name__}) has a distribution that "
                f"depends on the discrete site(s) {listed}. AutoSpec samples the continuous "
                f"sites first (NUTS with the discrete sites summed out) and then the discrete "
                f"sites given each continuous draw, so a continuous site must not depend on a "
                f"discrete one. Ways out: sample one continuous value per value of '{first}' "
                f"before it and select with '{first}' (e.g. `values = pyro.sample('{name}', "
                f"dist.Normal(torch.zeros(K), 1.0).to_event(1))`, then "
                f"`Vindex(values)[..., {first}]`: one vector site, which runs on a batch of "
                f"continuous draws at once, where a plate of K values sharing a dim with the data "
                f"is traced once per draw), as a mixture's component parameters are; or "
                f"condition '{name}' on a value with "
                f"poutine.condition.{_continuous_site_hints(name, node)}"
            )


def _continuous_site_hints(name: str, node: dict) -> str:
    """What else a continuous site that depends on a discrete one may have meant to be."""
    hints = [
        f" If '{name}' is an observation, it was given obs=None here (data=None, as in a "
        f"prior-predictive call), which makes it a latent site: AutoSpec draws the posterior "
        f"given data; for draws from the prior use pyro.infer.Predictive(model, "
        f"num_samples=...)."
    ]
    fn = node["fn"]
    while not isinstance(fn, dist.Delta) and hasattr(fn, "base_dist"):  # masked, expanded
        fn = fn.base_dist
    if isinstance(fn, dist.Delta):
        hints.append(
            f" A Delta site that is a function of discrete sites is a deterministic value: "
            f"record it with pyro.deterministic('{name}', value), which AutoSpec returns with "
            f"the draws."
        )
    return "".join(hints)


def discover_sites(
    model: Callable,
    args: tuple = (),
    kwargs: dict | None = None,
    *,
    max_plate_nesting: int | None = None,
    continuous: str = "error",
) -> SiteLayout:
    """Find a model's discrete latent sites and check that AutoSpec can sample them exactly.

    The model is traced under ``poutine.block`` a few times (with a forked torch RNG seeded
    by the library, so the global random state is left unchanged; where the first run creates
    a ``pyro.param``, it is created again by one more run that draws from the user's
    generators as they stand, as a plain run of Pyro would) to check that its structure does
    not change: twice
    when its latent sites are all discrete (a Python branch on a discrete value also fails
    when the model is traced under enumeration, as every AutoSpec run then does), eight times
    when it has continuous ones.

    Parameters
    ----------
    model : callable
        A Pyro model.
    args, kwargs
        The model's arguments.
    max_plate_nesting : int, optional
        Found from the model's plates and batch shapes when ``None``.
    continuous : {"error", "allow"}
        What to do with continuous latent sites: raise :class:`UnsupportedSiteError`, or list
        them in :attr:`SiteLayout.continuous` (a mixed model).

    Returns
    -------
    SiteLayout

    Raises
    ------
    UnsupportedSiteError
        For a continuous latent site (unless allowed), or a discrete one without finite
        enumerable support.
    SubsamplingError
        For a plate that draws a random subsample of its data on every run.
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
    if continuous not in ("error", "allow"):
        raise ValueError(f"continuous must be 'error' or 'allow'; got {continuous!r}")
    kwargs = {} if kwargs is None else kwargs
    store = pyro.get_param_store()
    known = set(store.keys())
    with users_generators_kept():
        seed_generators(20260101)
        raw = [trace_model(model, args, kwargs, prune=False)]
        checks = (
            _NUM_STRUCTURE_CHECKS if _has_continuous(raw[0]) else _NUM_DISCRETE_STRUCTURE_CHECKS
        )
        created = [name for name in store.keys() if name not in known]
        if not created:
            raw += [trace_model(model, args, kwargs, prune=False) for _ in range(checks - 1)]
    if created:
        # the run created parameters (pyro.param("w", torch.rand(2))) from the library's
        # seed: they are created again by a run on the user's generators as they stand, as a
        # plain run of Pyro would create them; the first run's densities, of the library's
        # values, are set aside
        for name in created:
            del store[name]
        with users_generators_kept():
            raw.append(trace_model(model, args, kwargs, prune=False))
            seed_generators(20260102)
            raw += [trace_model(model, args, kwargs, prune=False) for _ in range(checks - 1)]
    check_subsampling(raw[0])
    traces = [prune_subsample_sites(t) for t in raw]
    trace = traces[0]
    _check_no_vectorized_markov(trace)
    _check_plate_sizes(trace)
    signature = _signature(trace)
    for other in traces[1:]:
        _compare_signatures(signature, _signature(other))

    depth = plate_nesting(trace)
    if max_plate_nesting is None:
        max_plate_nesting = depth
    elif max_plate_nesting < depth:
        raise AutoSpecModelError(
            f"max_plate_nesting={max_plate_nesting} but the model nests plates and batch "
            f"dimensions {depth} deep; pass max_plate_nesting={depth} or leave it as None."
        )

    sites: list[DiscreteSite] = []
    continuous_sites: list[ContinuousSite] = []
    observed: dict[str, torch.Tensor] = OrderedDict()
    observed_shapes: dict[str, torch.Size] = OrderedDict()
    deterministic: dict[str, torch.Size] = OrderedDict()
    offset, continuous_offset = 0, 0
    unplated: AutoSpecModelError | None = None
    for name, site in trace.nodes.items():
        if site["type"] != "sample":
            continue
        fn = site["fn"]
        role = site_role(site)
        if role == "deterministic":
            deterministic[name] = torch.Size(site["value"].shape)
            continue
        if role in ("factor", "subsample"):
            continue
        if role == "data":
            _check_finite_data(name, site)
            _check_observed_shape(name, site)
            try:
                _check_plates(name, site, max_plate_nesting, latent=False)
            except AutoSpecModelError as error:  # raised once the latent sites are known:
                unplated = unplated or error  # a model without discrete ones is told so first
            observed[name] = site["value"].detach()
            observed_shapes[name] = fn.batch_shape
            continue
        if not fn.support.is_discrete:
            if continuous == "error":
                raise _continuous_site_error(name, type(fn).__name__)
            value = site["value"].detach()
            unconstrained = biject_to(fn.support).inv(value)
            block = ContinuousSite(
                name,
                torch.Size(value.shape),
                int(fn.event_dim),
                fn.support,
                torch.Size(unconstrained.shape),
                continuous_offset,
            )
            continuous_offset += block.numel
            continuous_sites.append(block)
            continue
        _check_discrete_site(name, site)
        _check_plates(name, site, max_plate_nesting, latent=True)
        support = fn.enumerate_support(expand=False)
        k = support.shape[0]
        batch_dims = tuple(range(1, 1 + len(fn.batch_shape)))
        if support.shape[1 : 1 + len(fn.batch_shape)].numel() != 1 and bool(
            (support == support[(slice(None),) + (slice(0, 1),) * len(batch_dims)]).all()
        ):
            # a distribution that expands its support whatever expand= says, with one
            # support for every batch element: its first element's
            support = support[(slice(None),) + (0,) * len(batch_dims)]
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
    if unplated is not None and sites:
        raise unplated
    if continuous_sites and sites:
        _check_continuous_parents(
            model, args, kwargs, max_plate_nesting, [c.name for c in continuous_sites]
        )
    if not sites:
        extra = (
            f" Its latent sites {[s.name for s in continuous_sites]} are all continuous: use "
            f"pyro.infer.MCMC(NUTS(model)), or AutoSpec(model, guide=DiffusionGuide(...))."
            if continuous_sites
            else ""
        )
        raise AutoSpecModelError(
            "The model has no unobserved discrete sample site: there is nothing for AutoSpec to "
            "sample (observed sites need `obs=`; latent ones Bernoulli, Categorical, "
            "OneHotCategorical, Binomial or BetaBinomial)." + extra
        )
    return SiteLayout(
        sites=sites,
        max_plate_nesting=max_plate_nesting,
        observed=observed,
        observed_batch_shapes=observed_shapes,
        signature=signature,
        continuous=continuous_sites,
        deterministic=deterministic,
        scales=scaled_sites(trace),
        plain_runs=()
        if continuous_sites
        else _plain_runs(traces[1:] if created else traces, sites),
    )


def _plain_runs(traces: list, sites: list[DiscreteSite]) -> tuple[PlainRun, ...]:
    runs = (_plain_run(trace, sites) for trace in traces)
    return tuple(run for run in runs if run is not None)
