"""An exact conditional-marginal oracle from a Pyro model, compiled once by enumeration.

:class:`EnumOracle` traces the model ONCE under Pyro's parallel enumeration and keeps its
factor graph: every site's scaled, masked log-density tensor with its plate and enumeration
dims (Pyro's packed form). A query row ``b`` pins some coordinates ``X_S = values_S``; that
evidence enters as one log-factor per site, ``0`` where allowed and ``-inf`` where a pinned
coordinate takes another value. Every round is then one batched contraction of the factor graph
with the evidence of all rows (:func:`pyro.ops.contract.contract_to_tensor` with
:class:`~pyro_autospec.model.enum_contract.PlannedLogRing`, whose elimination plans are cached
per shape), giving ``log Z_b`` for every row, and one backward pass: the gradient of
``sum_b log Z_b`` with respect to the evidence is every coordinate's conditional marginal
``P(X_i = v | X_S = values_S, data)``. The model never runs again after compilation.

Because the factors are the ones ``trace.log_prob_sum()`` adds up (``poutine.mask``,
``obs_mask``, ``poutine.scale`` and plates included), the oracle's target is exactly the density
``pyro.infer.MCMC`` samples. Unlike ``TraceEnum_ELBO``, masks on enumerated sites are applied.

*Families.* With ``continuous_values`` (``M`` draws of the model's continuous sites), the oracle
is a family of ``M`` targets, the discrete sites given each draw (``num_draws = M``, every
method takes ``draws``): the model is traced once with the draws in a plate, and each query row
reads its draw's slice of the factors.

Cost: ``O(rows x (sum of the elimination's intermediate sizes))`` per round, e.g. linear in the
length of a hidden Markov chain; exponential in treewidth. A model whose factor graph is a
chain, or independent chains in one plate (each factor on one site or two consecutive ones), is
lowered once to a :class:`~pyro_autospec.oracles.PairwiseChainOracle`, whose targeted and chain
queries cost ``O(q^2)`` per target whatever the chain's length. See :doc:`/oracles`.
"""

from __future__ import annotations

import math
import warnings
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from pyro import poutine
from pyro.ops.contract import contract_to_tensor
from pyro.poutine.util import prune_subsample_sites

from pyro_autospec._warnings import user_stacklevel
from pyro_autospec.engine.protocols import chain_rows
from pyro_autospec.model.discrete import SiteLayout, discover_sites
from pyro_autospec.model.enum_contract import (
    PlannedLogRing,
    StepTooLarge,
    _align,
    constant_factor,
    linear_factor,
)
from pyro_autospec.model.errors import (
    AutoSpecModelError,
    DynamicStructureError,
    IntractableEnumerationError,
    UnsupportedSiteError,
)
from pyro_autospec.model.tracing import (
    DRAWS_PLATE,
    MAX_ENUMERATED_ENTRIES,
    EntriesGuard,
    SiteRecorder,
    TensorTooLarge,
    assertion_error,
    batching_advice,
    compute_log_prob,
    enumerated_trace,
    over_draws,
    parallel_enumeration,
    quiet_warnings,
    site_role,
    structure_error,
)
from pyro_autospec.oracles.hmm import PairwiseChainOracle

__all__ = ["EnumOracle", "check_evidence"]


def _unique_rows(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Distinct rows of ``keys`` [B, m] and each row's index among them (None: all distinct).

    Rows are hashed to one int64 each (``torch.unique`` over rows sorts them row by row, which
    is slow for long rows); a hash collision is detected and falls back to the exact method.
    """
    weights = torch.randint(1, 2**61, (keys.shape[1],), generator=_HASH_SEED, dtype=torch.long).to(
        keys.device
    )
    hashes = (keys * weights).sum(1)
    unique_hashes, inverse = torch.unique(hashes, return_inverse=True)
    if unique_hashes.shape[0] == keys.shape[0]:
        return keys, None
    first = torch.full_like(unique_hashes, keys.shape[0]).scatter_reduce(
        0, inverse, torch.arange(keys.shape[0], device=keys.device), reduce="amin"
    )
    unique = keys[first]
    if not bool((unique[inverse] == keys).all()):  # a collision: sort the rows instead
        return torch.unique(keys, dim=0, return_inverse=True)
    return unique, inverse


_HASH_SEED = torch.Generator().manual_seed(20260415)


def _log(probs: torch.Tensor) -> torch.Tensor:
    """``log`` of marginals read off a gradient: 0 (or NaN, an impossible row) becomes -inf."""
    return probs.log().nan_to_num_(nan=-math.inf, neginf=-math.inf)


def _impossible_to_neginf(log_probs: torch.Tensor) -> torch.Tensor:
    """A chain oracle's NaN (a row conditioned on an impossible assignment) becomes -inf."""
    return log_probs.nan_to_num_(nan=-math.inf, posinf=math.inf, neginf=-math.inf)


# A chain-structured model answers log_marginals_at by its PairwiseChainOracle when the targets
# per row are at most num_coords / this (each target costs about as much as 4 sites of a
# contraction row); all n marginals at once are cheaper by contraction.
_CHAIN_TARGETS_PER_COORD = 4

# Largest product of a single elimination step, per query row, before the model is refused.
_MAX_STEP_ENTRIES_PER_ROW = MAX_ENUMERATED_ENTRIES
#: Contractions whose steps all have at most this many entries are measured by running them.
_MEASURED_BY_RUNNING = 2**16
#: Largest product of the discrete sites' support sizes and the plates' sizes for which a model
#: with ``pyro.markov`` is traced once more with a tensor dim per site, to find a site that
#: reads further back than its history keeps (:meth:`EnumOracle._check_reads_past_history`):
#: there a value that every site feeds (a running count) broadcasts to that many entries. A
#: larger model keeps the self-check as guard.
_MAX_OWN_DIMS_ENTRIES = 2**20


@dataclass
class _Evidence:
    """Where one discrete site's evidence goes: its coordinates and packed dims."""

    name: str
    coords: slice
    support_size: int
    view_shape: tuple  # (sizes of the site's non-unit batch dims)
    dims: str  # plate symbols + enumeration symbol + draws symbol
    ordinal: frozenset


def _non_tree_error(error: Exception, symbol_to_plate: dict, evidence: list):
    listed = str(error).rsplit("[", 1)[-1].split("]")[0]
    symbols = [s.strip() for s in listed.split(",") if s.strip()]
    symbols = [s for s in symbols if symbol_to_plate.get(s) != DRAWS_PLATE]
    parts = []
    for symbol in symbols:
        sites = [spec.name for spec in evidence if symbol in spec.ordinal]
        plate = symbol_to_plate.get(symbol, symbol)
        parts.append(f"plate '{plate}'" + (f" (sites {sites})" if sites else ""))
    where = " and ".join(parts) if parts else "two independent plates"
    return IntractableEnumerationError(
        f"Exact enumeration needs plates that nest as a tree, but a factor of the model couples "
        f"enumerated sites of the independent {where} (Pyro's TraceEnum_ELBO has the same "
        f"rule: every pair of their elements would become dependent). Ways out: put the coupled "
        f"sites in one plate (or sample one of them outside its plate), make one of the plates "
        f"sequential (`for i in pyro.plate(...)`, at a cost exponential in its size), or use a "
        f"learned guide (AnyOrderGuide with a correction), which has no such rule."
    )


def _intractable_error(
    entries: float | None, site: str | None = None, term: bool = False
) -> IntractableEnumerationError:
    """The model is too large to enumerate: one elimination step has ``entries`` entries per
    query, or (``term``) a term of the model under enumeration, computed after ``site``, spans
    ``entries`` combinations of enumerated values, or a tensor of that run could not be
    allocated (``None``)."""
    where = f" (computed after site '{site}')" if site else ""
    limit = f"the limit is 2^{int(math.log2(_MAX_STEP_ENTRIES_PER_ROW))}"
    if entries is None:
        size = f"a tensor of the model under enumeration{where} could not be allocated"
    elif term:
        size = (
            f"a term of the model under enumeration{where} spans {entries:.3g} combinations of "
            f"the enumerated sites' values (about 2^{math.log2(max(entries, 1)):.1f}; {limit})"
        )
    else:
        size = (
            f"one elimination step has {entries:.3g} entries per query (about "
            f"2^{math.log2(max(entries, 1)):.1f}; {limit})"
        )
    return IntractableEnumerationError(
        f"Exact enumeration of the model's discrete sites is intractable: {size}. The cost of "
        f"enumeration is exponential in the treewidth of the model's discrete sites: each "
        f"enumerated site takes a dim of its own, and a term reading k of them has the product "
        f"of their supports. Ways out: declare independence with pyro.plate and chains with "
        f"pyro.markov so that variables are eliminated locally, use a learned guide "
        f"(AnyOrderGuide with a correction), or NumPyro's DiscreteHMCGibbs / MixedHMC."
    )


class _WithoutMarkov(poutine.messenger.Messenger):
    """Hide ``pyro.markov`` from enumeration: every enumerated site gets a dim of its own.

    It sits between the model (whose ``pyro.markov`` contexts mark each site's scope) and
    ``poutine.enum`` (which recycles dims by that scope), and removes the mark.
    """

    def _pyro_sample(self, msg):
        if msg.get("infer"):
            msg["infer"].pop("_markov_scope", None)


def _scoped_sites(trace):
    """``(name, node, infer, scope)`` of the sample sites of ``trace`` that ``pyro.markov``
    scoped, in trace order (``scope``: ``infer["_markov_scope"]``)."""
    for name, node in trace.nodes.items():
        if node["type"] != "sample":
            continue
        infer = node.get("infer") or {}
        scope = infer.get("_markov_scope")
        if scope is not None:
            yield name, node, infer, scope


def _markov_conflicts(trace) -> list[tuple[str, list[str]]]:
    """Sites that see a site whose enumeration dim ``pyro.markov`` already gave to another.

    Replays ``poutine.enum``'s bookkeeping: a site sees the enumerated sites in its markov
    scope (the same depth). Each enumerated site holds its own dim under an id; when a site's
    ``_dim_to_id`` maps that dim to another id, the dim was recycled while the first site is
    still in scope, and a distribution reading both cannot tell them apart. (A plain chain
    never does this: a site leaves the scope before its dim is reused.)
    """
    depth_of, own, holder = {}, {}, {}
    conflicts = []
    for name, node, infer, scope in _scoped_sites(trace):
        now = infer.get("_dim_to_id") or {}
        shared = set()
        for other, depth in scope.items():
            if depth_of.get(other) != depth or other not in own:
                continue
            dim, id_ = own[other]
            current = now.get(dim)
            if current is not None and current != id_:
                shared |= {other, holder.get((dim, current), other)}
        if shared:
            conflicts.append((name, sorted(shared)))
        depth_of[name] = infer.get("_markov_depth")
        dim = infer.get("_enumerate_dim")
        if dim is not None and not node["is_observed"] and dim in now:
            own[name] = (dim, now[dim])
            holder[(dim, now[dim])] = name
    return conflicts


class _KeepOuterScope(poutine.messenger.Messenger):
    """Keep a site in scope for a later site that sees it through one of its ``pyro.markov``
    contexts, though not through all of them.

    Pyro's enumeration hides a site from a later one unless every markov context of the first
    still sees it: in nested loops with a fresh inner ``pyro.markov`` per row, the previous row
    is hidden from the next one, and its tensor dims are reused. Placed like
    :class:`_WithoutMarkov`, this keeps those sites (and their dims) visible, so the trace shows
    which of them each site reads (see :func:`_hidden_reads`).
    """

    def __init__(self):
        super().__init__()
        self._depth: dict = {}  # site name -> its markov depth

    def _pyro_sample(self, msg):
        infer = msg.get("infer") or {}
        scope = infer.get("_markov_scope")
        if scope is None:
            return
        for name, count in list(scope.items()):
            depth = self._depth.get(name)
            if depth is not None and 0 < count < depth:
                scope[name] = depth
        self._depth[msg["name"]] = infer.get("_markov_depth")


def _partly_hidden(trace) -> bool:
    """Whether some site sees an earlier one through some of its ``pyro.markov`` contexts but
    not all (nested loops whose inner context is fresh per outer step): enumeration hides it."""
    depth_of = {}
    for name, _, infer, scope in _scoped_sites(trace):
        for other, count in scope.items():
            depth = depth_of.get(other)
            if depth is not None and 0 < count < depth:
                return True
        depth_of[name] = infer.get("_markov_depth")
    return False


def _hidden_reads(trace, wide) -> list[tuple[str, str, str]]:
    """Sites that read a site whose enumeration dim ``pyro.markov`` gave to another.

    ``wide`` is the model traced where a site's log density shows what it reads: under
    :class:`_KeepOuterScope` (every site keeps the dims of the sites its markov contexts partly
    see) or under :class:`_WithoutMarkov` (a dim per site).
    In ``trace`` (Pyro's own dims) each site interprets each dim of its log density as one
    site's (``_dim_to_id``); a read whose dim it takes for another site's cannot be expressed.
    Returns ``(site, read, holder)``: ``site`` reads ``read``, whose dim ``holder`` took.
    """
    latent = {}  # enum symbol in ``wide`` -> site
    own = {}  # site -> (dim, id) in ``trace``
    holder = {}  # (dim, id) -> site, in ``trace``
    for name, node in trace.nodes.items():
        infer = node.get("infer") or {}
        dim = infer.get("_enumerate_dim")
        if node["type"] != "sample" or node["is_observed"] or dim is None:
            continue
        ids = infer.get("_dim_to_id") or {}
        if dim in ids:
            own[name] = (dim, ids[dim])
            holder[own[name]] = name
        symbol = ((wide.nodes.get(name) or {}).get("infer") or {}).get("_enumerate_symbol")
        if symbol is not None:
            latent[symbol] = name
    found = []
    for name, node in wide.nodes.items():
        if node["type"] != "sample" or name not in trace.nodes:
            continue
        packed = (node.get("packed") or {}).get("log_prob")
        if not torch.is_tensor(packed):
            continue
        ids = (trace.nodes[name].get("infer") or {}).get("_dim_to_id") or {}
        for symbol, size in zip(packed._pyro_dims, packed.shape, strict=True):
            read = latent.get(symbol)
            if size == 1 or read is None or read == name or read not in own:
                continue
            dim, id_ = own[read]
            if ids.get(dim, id_) != id_:
                found.append((name, read, holder.get((dim, ids[dim]), "a later site")))
    return found


def with_oracle_dims(oracle: EnumOracle, model: Callable) -> Callable:
    """``model`` under the enumeration dims ``oracle`` compiled with: as it is, or with
    ``pyro.markov`` hidden from enumeration where the oracle gave every site its own dim (a dim
    that ``pyro.markov`` recycles between sites a later site reads both of). Another
    enumeration of the model (``map()``'s decoding pass) must use the same dims."""
    return model if oracle._markov else _WithoutMarkov()(model)


def _hidden_read_error(reads, reason: str) -> IntractableEnumerationError:
    name, read, other = reads[0]
    return IntractableEnumerationError(
        f"Site '{name}' reads site '{read}', which pyro.markov hides from it: '{read}' lies "
        f"in another pyro.markov context (nested loops with a fresh inner pyro.markov per "
        f"outer step, as a grid with one `for j in pyro.markov(...)` per row), so enumeration "
        f"gave its tensor dim to '{other}' and the dependence cannot be expressed; Pyro's own "
        f"enumeration is wrong there. AutoSpec then gives every site its own dim, which this "
        f"model does not fit: {reason}"
    )


def _markov_conflict_error(conflicts, reason: str) -> IntractableEnumerationError:
    name, shared = conflicts[0]
    listed = ", ".join(f"'{s}'" for s in shared)
    return IntractableEnumerationError(
        f"Site '{name}' sees sites {listed}, to which pyro.markov gave one tensor dim (a "
        f"pyro.markov(..., keep=True) loop entered again, as in a grid, reuses dims of sites a "
        f"later site still reads); Pyro's own enumeration is wrong there. AutoSpec then gives "
        f"every site its own dim, which this model does not fit: {reason}"
    )


def _too_many_dims_error(layout: SiteLayout, seen: list) -> IntractableEnumerationError:
    """torch's limit of 64 tensor dims reached: enumeration gives every live site a dim."""
    last = f" (the model failed after site '{seen[-1]}')" if seen else ""
    names = layout.names
    shown = ", ".join(f"'{n}'" for n in names[:4]) + (", ..." if len(names) > 4 else "")
    return IntractableEnumerationError(
        f"The model has {len(names)} discrete latent sites ({shown}), more than exact "
        f"enumeration can hold{last}: Pyro's parallel enumeration gives every discrete site its "
        f"own tensor dim, and torch supports at most 64 dims per tensor (of which the plates "
        f"take {layout.max_plate_nesting} and AutoSpec's batch of draws 1). "
        f"pyro.markov frees the dim of a site once the chain has moved past it, and a pyro.plate "
        f"gives all its elements one dim, but sites that stay coupled (a grid written with one "
        f"pyro.sample per cell) each keep theirs. Ways out: declare repeated sites in a "
        f"pyro.plate and chains with pyro.markov, or sample the sites with a learned guide, "
        f"guide = AnyOrderGuide(model, args); guide.fit_posterior(*args); then "
        f"AutoSpec(model, guide=guide, correction='imh'), which needs no enumeration (see "
        f"tutorials/07_beyond_enumeration)."
    )


def nan_sites(model: Callable, args: tuple, kwargs: dict, max_plate_nesting: int) -> list[str]:
    """The sample sites whose log density is NaN or +inf for some value of the discrete latent
    sites (each enumerated at a dim of its own), in trace order; ``[]`` when the model cannot
    be traced so (the later stages name that fault). A +inf term makes the normaliser NaN or
    +inf as well."""
    trace = enumerated_trace(model, args, kwargs, max_plate_nesting, log_prob=True)
    if trace is None:
        return []
    return [
        name
        for name, node in trace.nodes.items()
        if node["type"] == "sample"
        and not name.startswith("_autospec")
        and bool((torch.isnan(node["log_prob"]) | torch.isposinf(node["log_prob"])).any())
    ]


def check_evidence(
    log_normalizer: torch.Tensor | float, explain_nan: Callable[[], list[str]] | None = None
) -> None:
    """Refuse data of probability zero under every assignment of the discrete sites, and a
    model whose log density is NaN or +inf.

    Parameters
    ----------
    log_normalizer : Tensor or float
        ``log sum_x p(x, data)`` (0-dim; or one per draw of a family).
    explain_nan : callable, optional
        Returns the sites whose log density is NaN (:func:`nan_sites`), asked only when the
        normaliser is NaN.

    Raises
    ------
    AutoSpecModelError
        Where it is ``-inf``: there is no posterior to sample; ``+inf``: the density is
        infinite somewhere; where it is NaN and ``explain_nan`` names a site: the site's log
        density is not a number.
    """
    log_normalizer = torch.as_tensor(log_normalizer, dtype=torch.float64)
    not_finite = torch.isnan(log_normalizer) | torch.isposinf(log_normalizer)
    if explain_nan is not None and bool(not_finite.any()):
        names = explain_nan()
        if names:
            listed = ", ".join(f"'{name}'" for name in names)
            raise AutoSpecModelError(
                f"The log density of site(s) {listed} is NaN or +inf for some value of the "
                "discrete latent sites, so the posterior is not defined. Common causes: logits "
                "of +inf or -inf (torch's Bernoulli gives NaN there; use probs=, or clamp the "
                "logits), probabilities outside [0, 1], NaN parameters, or an observation "
                "where its density is infinite (y = 0 at a Beta(0.5, b) site, a Normal of "
                "scale 0)."
            )
    if bool((log_normalizer == float("inf")).any()):
        raise AutoSpecModelError(
            "The log density of the data is +inf for some value of the discrete latent sites "
            "(log p(data) = +inf), so the posterior is not defined: an observation sits where "
            "its density is infinite (e.g. y = 0 at a Beta(0.5, b) or Gamma(0.5, r) site, or a "
            "Normal whose scale is 0). Check the data and the parameters that the discrete "
            "sites select."
        )
    if bool((log_normalizer == -float("inf")).any()):  # NaN is left to the row checks
        raise AutoSpecModelError(
            "The data have probability zero under every assignment of the discrete latent "
            "sites (log p(data) = -inf), so there is no posterior to "
            "sample. Some observation lies outside the support of its distribution whatever "
            "the latent values (e.g. obs=5.0 at a Uniform(0.0, z + 1.0) site with z in "
            "{0, 1}), or the factors and masks rule out every assignment. Check the data "
            "against the model's supports."
        )


class EnumOracle:
    """Exact conditional marginals of a Pyro model's discrete latent sites, compiled once.

    Implements :class:`~pyro_autospec.engine.protocols.MarginalOracle` (with ``log_marginals_at``
    and ``log_marginals_chain``) for the posterior ``p(x | data)`` of the model's discrete
    latent sites (Bernoulli, Categorical, OneHotCategorical, Binomial, BetaBinomial), with the
    coordinate mapping of :mod:`pyro_autospec.model.discrete` (sites in trace order, C order
    within a site, values as support indices, ``num_values`` the largest support).

    Parameters
    ----------
    model : callable
        A Pyro model. Observed sites are conditioned on their ``obs`` values.
    args : tuple
        Positional arguments of ``model``.
    kwargs : dict, optional
        Keyword arguments of ``model``.
    max_plate_nesting : int, optional
        Found from the model when ``None``.
    batch_size : int
        Most query rows per contraction (at least 2).
    layout : SiteLayout, optional
        A layout from :func:`~pyro_autospec.model.discrete.discover_sites` (found when
        ``None``).
    num_threads : int or None
        torch intra-op threads during a contraction (restored afterwards). Enumeration runs
        many small tensor ops, for which extra threads mostly add synchronisation. ``None``
        leaves torch's setting. Any call of ``torch.set_num_threads``, this one included,
        switches MKL's dynamic threading off for the rest of the process; with more than one
        thread, PyTorch's batched LU on a CPU (``torch.linalg.solve`` or ``inv`` of stacks of
        matrices larger than about 14 x 14) can then return wrong results silently
        (pytorch/pytorch#141358). Pass ``None`` to leave your process's threads alone.
    device : str or torch.device, optional
        Where the factors live and queries are answered (default: where the model's tensors
        are).
    continuous_values : dict, optional
        ``name -> Tensor[M, *shape]``: ``M`` draws of every continuous latent site. The oracle
        is then a family of ``M`` targets (``num_draws = M``), the discrete sites given each
        draw, and every method takes ``draws`` (LongTensor[B]).
    max_elements : int
        Budget of tensor entries per contraction (with its backward pass); larger rounds are
        answered in several contractions.
    lower_chains : bool
        When the factor graph is a chain (see Notes), answer targeted and chain queries with
        a :class:`~pyro_autospec.oracles.PairwiseChainOracle` built from the factors (the
        same numbers, ``O(q^2)`` per target instead of a contraction per row). ``False``
        always contracts.
    lazy : bool
        Compile the factors only, and leave the measurement of the contraction (which
        refuses an intractable elimination, or plates that do not nest as a tree) and the
        chain lowering to the first query. For callers that read the factors themselves
        (:func:`~pyro_autospec.model.ffbs.plan_ffbs`); the queries are the same.

    Attributes
    ----------
    num_coords : int
        ``n``, the number of discrete coordinates.
    num_values : int
        ``q``, the largest support size.
    num_draws : int or None
        ``M`` for a family (``continuous_values``), else ``None``.
    layout : SiteLayout
        The coordinate mapping.
    num_calls : int
        Contractions made so far.
    device : torch.device

    Raises
    ------
    UnsupportedSiteError
        For a continuous latent site without ``continuous_values``.
    IntractableEnumerationError
        When plates do not nest as a tree, or the elimination is too large.
    DynamicStructureError
        When the model branches on a sampled value with Python control flow.

    Notes
    -----
    For row ``b`` with pinned set ``S``, the enumerated joint is
    ``p(x, data) prod_{i in S} 1[x_i = values_{b,i}]``. Writing the pins as additive log
    factors ``log e_i(v)`` (``0`` or ``-inf``), ``log Z_b = log sum_x p(x, data) prod_i
    e_i(x_i)`` and ``d log Z_b / d log e_i(v) = P(x_i = v | X_S = values_S, data)``: one
    forward contraction and one backward pass give all ``n q`` marginals of every row (the
    forward-backward algorithm on a chain). Rows with identical conditionings are computed
    once. A pinned coordinate gets a point mass; a row conditioned on an impossible assignment
    gets ``-inf`` everywhere.

    *Chains.* When every factor touches one discrete site or two consecutive ones in trace
    order, and the sites are all single coordinates or all batched in the same one plate (an
    HMM written with ``pyro.markov``, one sequence or a plate of independent sequences, masks
    and scales included), the factors are summed once into per-site and per-edge log
    potentials and targeted and chain queries go to a
    :class:`~pyro_autospec.oracles.PairwiseChainOracle`: the pins are then separators, and a
    target costs ``O(q^2)`` whatever ``n`` (all ``n`` marginals of a row, and many targets per
    row, still go to the contraction, which is cheaper for them). Rows conditioned on an
    impossible assignment are not defined there (the engine ignores them): a target between
    incompatible pins gets ``-inf``, one elsewhere may not.

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> def model(y):
    ...     a = pyro.sample("a", dist.Bernoulli(0.5))
    ...     b = pyro.sample("b", dist.Bernoulli(0.5))
    ...     pyro.sample("y", dist.Normal(a + b, 1.0), obs=y)
    >>> oracle = EnumOracle(model, (torch.tensor(2.0),))
    >>> values = torch.tensor([[0, 0], [0, 0]])
    >>> mask = torch.tensor([[False, False], [True, False]])
    >>> out = oracle.log_marginals(values, mask)  # [2, 2, 2]
    >>> out.shape, out.dtype
    (torch.Size([2, 2, 2]), torch.float64)
    >>> bool(out[1, 1, 1] > out[0, 1, 1])  # with a = 0 pinned, b alone explains y = 2
    True
    """

    #: False: pyro.markov hidden from enumeration; "wide": kept for partly hidden sites (only
    #: to find what each site reads, see _compile)
    _markov: bool | str = True
    #: Its queries are checked to agree by tests/oracles/test_conformance.py: the engine skips
    #: its consistency check.
    consistent_queries = True
    #: It reads its inputs only during a call: the engine may reuse them.
    borrows_inputs = True

    def __init__(
        self,
        model: Callable,
        args: tuple = (),
        kwargs: dict | None = None,
        *,
        max_plate_nesting: int | None = None,
        batch_size: int = 4096,
        layout: SiteLayout | None = None,
        num_threads: int | None = 1,
        device: str | torch.device | None = None,
        continuous_values: Mapping[str, torch.Tensor] | None = None,
        max_elements: int = 2**27,
        lower_chains: bool = True,
        lazy: bool = False,
    ):
        if batch_size < 2:
            raise ValueError(f"batch_size must be >= 2, got {batch_size}")
        self.model = model
        self.args = tuple(args)
        self.kwargs = {} if kwargs is None else dict(kwargs)
        if layout is None:
            layout = discover_sites(
                model,
                self.args,
                self.kwargs,
                max_plate_nesting=max_plate_nesting,
                continuous="allow" if continuous_values is not None else "error",
            )
        self.layout = layout
        self.batch_size = int(batch_size)
        self.max_elements = int(max_elements)
        self.num_coords = layout.num_coords
        self.num_values = layout.num_values
        self.num_calls = 0
        self.num_threads = num_threads
        self._continuous = self._check_continuous(continuous_values)
        self.num_draws = None if self._continuous is None else self._num_continuous
        self.device = None if device is None else torch.device(device)
        self.lower_chains = bool(lower_chains)
        self._lazy = bool(lazy)
        with torch.inference_mode(False):  # ordinary factors, which autograd may save
            self._compile()

    def __repr__(self) -> str:
        family = "" if self.num_draws is None else f", num_draws={self.num_draws}"
        return (
            f"EnumOracle(num_coords={self.num_coords}, num_values={self.num_values}, "
            f"sites={self.layout.names}{family})"
        )

    # ------------------------------------------------------------------------- compilation
    def _check_continuous(self, values):
        names = self.layout.continuous_names
        if values is None:
            if names:
                raise UnsupportedSiteError(
                    f"The model has continuous latent sites {names}; EnumOracle enumerates "
                    f"discrete sites given values of the continuous ones: pass "
                    f"continuous_values={{name: Tensor[M, *shape]}} (a family of M targets), or "
                    f"use AutoSpec(model), which samples them by NUTS."
                )
            return None
        missing = sorted(set(names) - set(values))
        extra = sorted(set(values) - set(names))
        if missing or extra:
            raise ValueError(
                f"continuous_values must give every continuous latent site {names} and nothing "
                f"else; missing {missing}, unknown {extra}"
            )
        shapes = self.layout.latent_shapes()
        num = None
        out = OrderedDict()
        for name in names:
            value = torch.as_tensor(values[name])
            batch, event = shapes[name]
            if tuple(value.shape[1:]) != tuple(batch + event):
                raise ValueError(
                    f"continuous_values['{name}'] has shape {tuple(value.shape)}, expected "
                    f"(M,) + {tuple(batch + event)}"
                )
            if num is not None and value.shape[0] != num:
                raise ValueError("every continuous_values tensor needs the same number of draws")
            num = value.shape[0]
            out[name] = value
        if not num:
            raise ValueError("continuous_values needs at least one draw")
        self._num_continuous = int(num)
        return out

    def _trace(self, draw: int | None = None):
        """The model's trace under enumeration, continuous draws in the draws plate.

        ``draw=None``: all ``M`` continuous draws batched in the plate (one trace). ``draw=m``:
        draw ``m`` alone, unbatched, in a plate of size 1 (for models that do not broadcast
        over an extra batch dimension of their continuous sites).
        """
        mpn = self.layout.max_plate_nesting
        model = self.model
        num = 1 if self._continuous is None or draw is not None else self._num_continuous
        if self._continuous is not None:
            shapes = self.layout.latent_shapes()
            data = {}
            for name, value in self._continuous.items():
                batch, event = shapes[name]
                if draw is None:
                    pad = (1,) * (mpn - len(batch))
                    data[name] = value.reshape((num,) + pad + tuple(batch) + tuple(event))
                else:
                    data[name] = value[draw]
            model = poutine.condition(model, data=data)
        enumerated = poutine.infer_config(model, parallel_enumeration)

        with_draws = over_draws(enumerated, num, mpn)
        recorder = SiteRecorder()
        if self._markov == "wide":
            traced = _KeepOuterScope()(with_draws)
        else:
            traced = with_oracle_dims(self, with_draws)
        # a term coupling many enumerated sites is refused before it fills the memory
        guard = EntriesGuard(_MAX_STEP_ENTRIES_PER_ROW, plate_dims=mpn + 1)
        try:
            with poutine.block(), quiet_warnings(), torch.no_grad(), guard:
                # the recorder inside enumeration: it sees each site before enum can refuse it
                enum_model = poutine.enum(recorder(traced), first_available_dim=-(mpn + 2))
                trace = poutine.trace(enum_model).get_trace(*self.args, **self.kwargs)
                trace = prune_subsample_sites(trace)
                compute_log_prob(trace, "under enumeration")
                trace.pack_tensors()
        except AutoSpecModelError:
            raise
        except TensorTooLarge as e:
            entries = guard.combinations(guard.refused)
            raise _intractable_error(entries, recorder.current, term=True) from e
        except (RuntimeError, ValueError, TypeError, IndexError, KeyError) as e:
            if "memory" in str(e) or "allocate" in str(e):
                raise _intractable_error(None, recorder.current) from e
            if "up to 64 dims" in str(e):
                raise _too_many_dims_error(self.layout, recorder.names) from e
            raise structure_error(
                e,
                recorder.names,
                "under enumeration",
                recorder.plated,
                recorder.current,
                recorder.markov,
            ) from e
        except AssertionError as e:
            raise assertion_error(e, recorder.names, "under enumeration", mpn) from e
        return trace

    def _traces(self) -> list:
        """One batched trace, or one trace per continuous draw if the model cannot batch them."""
        if self._continuous is None:
            return [self._trace()]
        try:
            batched = self._trace()
            reason = None if self._num_continuous == 1 else self._batch_mismatch(batched)
        except DynamicStructureError as error:
            reason = str(error).split(": ", 1)[-1].split(". ")[0]
        except AutoSpecModelError as error:
            if type(error) is not AutoSpecModelError or not isinstance(
                error.__cause__, AssertionError
            ):
                raise
            reason = "an assert failed on the batch"
        if reason is None:
            return [batched]
        traces = [self._trace(m) for m in range(self._num_continuous)]
        if self._num_continuous > 1:
            warnings.warn(
                f"The model does not broadcast over a batch of draws of its continuous sites "
                f"({reason}), so EnumOracle traced it once per draw ({self._num_continuous} "
                f"traces). " + batching_advice(self.model, self.args, self.kwargs),
                UserWarning,
                stacklevel=user_stacklevel(),
            )
        return traces

    def _batch_mismatch(self, batched) -> str | None:
        """Compare draw 0 of the batched trace with draw 0 traced alone; None if they agree.

        A model can broadcast without error and still mix draws (a batch of ``M`` continuous
        draws landing on a plate of the same size): its factors then differ from draw 0's.
        """
        alone = self._trace(0)
        draws = batched.plate_to_symbol[DRAWS_PLATE]
        for name, node in alone.nodes.items():
            if node["type"] != "sample" or site_role(node) in ("deterministic", "subsample"):
                continue
            one = node["packed"]["log_prob"]
            many = batched.nodes[name]["packed"]["log_prob"] if name in batched.nodes else None
            if not torch.is_tensor(one) or many is None:
                continue
            dims = many._pyro_dims
            if draws in dims:
                many = many.select(dims.index(draws), 0)
                dims = dims.replace(draws, "")
            if dims != one._pyro_dims or many.shape != one.shape:
                return f"site '{name}' changes shape in a batch of draws"
            tolerance = 1e-5 * (1.0 + float(one.abs().max())) if one.numel() else 0.0
            if not torch.allclose(many.double(), one.double(), atol=tolerance, rtol=1e-5):
                return f"site '{name}' mixes draws in a batch"
        return None

    def _compile(self) -> None:
        self._markov = True
        traces = self._traces()
        conflicts = _markov_conflicts(traces[0])
        hidden = [] if conflicts else self._hidden_reads(traces[0], len(traces) > 1)
        if conflicts or hidden:
            # pyro.markov gave two sites one dim while a later site still reads both (a
            # re-entered keep=True loop, as in a grid), or a site reads one that a fresh inner
            # pyro.markov hides (a grid with one inner loop per row): Pyro's own enumeration is
            # wrong there. Every site gets its own dim instead: exact, if the sites fit torch's
            # 64 dims; refused here, before any draw, if they do not.
            self._markov = False
            try:
                traces = self._traces()
            except IntractableEnumerationError as error:
                if conflicts:
                    raise _markov_conflict_error(conflicts, str(error)) from error
                raise _hidden_read_error(hidden, str(error)) from error
        trace = traces[0]
        self._check_markov_history(trace)
        if self._markov is True:
            self._check_reads_past_history(trace, len(traces) > 1)
        layout = self.layout
        plate_to_symbol = trace.plate_to_symbol
        self._symbol_to_plate = {s: p for p, s in plate_to_symbol.items()}
        draws = plate_to_symbol[DRAWS_PLATE]
        self._draws_symbol = draws
        known = set(layout.names)
        dim_to_size: dict[str, int] = {}
        for node in trace.nodes.values():
            for frame in node.get("cond_indep_stack", ()):
                if frame.vectorized and frame.name in plate_to_symbol:
                    dim_to_size[plate_to_symbol[frame.name]] = int(frame.size)

        # evidence: where each discrete site's pins go
        evidence, enum_symbols = [], set()
        site_plates: dict[str, tuple[str, str]] = {}  # enum symbol -> (site, its plates)
        for site in layout.sites:
            node = trace.nodes.get(site.name)
            if node is None or node["infer"].get("_enumerate_dim") is None:
                raise AutoSpecModelError(
                    f"Site '{site.name}' was not enumerated when the model was traced under "
                    f"enumeration; AutoSpec needs a fixed set of enumerable sites."
                )
            symbol = node["infer"]["_enumerate_symbol"]
            enum_symbols.add(symbol)
            dim_to_symbol = node["infer"]["_dim_to_symbol"]
            plates, view = "", []
            for i, size in enumerate(site.batch_shape):
                if size > 1:
                    plates += dim_to_symbol[i - len(site.batch_shape)]
                    view.append(int(size))
            ordinal = frozenset(
                plate_to_symbol[f.name] for f in node["cond_indep_stack"] if f.vectorized
            )
            dim_to_size[symbol] = site.support_size
            site_plates[symbol] = (site.name, plates)
            evidence.append(
                _Evidence(
                    site.name,
                    site.coords,
                    site.support_size,
                    tuple(view),
                    plates + symbol + draws,
                    ordinal | {draws},
                )
            )

        # model factors: every site's scaled, masked log density
        device = self.device
        terms, constant = [], None
        raw: dict[str, tuple] = {}  # site -> (log density, dims, role), for the pointwise form
        self._plate_dim = {
            plate_to_symbol[f.name]: f.dim
            for node in trace.nodes.values()
            for f in node.get("cond_indep_stack", ())
            if f.vectorized and f.name in plate_to_symbol
        }
        for name, node in trace.nodes.items():
            if node["type"] != "sample" or site_role(node) in ("deterministic", "subsample"):
                continue
            if not node["is_observed"] and name not in known:
                kind = type(node["fn"]).__name__
                raise UnsupportedSiteError(
                    f"Site '{name}' ({kind}) is latent but neither an enumerated discrete site nor "
                    f"given in continuous_values; EnumOracle cannot sum it out."
                )
            packed = node["packed"]["log_prob"]
            if not torch.is_tensor(packed):
                continue
            if device is None:
                device = packed.device
            dims = packed._pyro_dims
            tensor = packed.detach().to(device=device, dtype=torch.float64)
            if len(traces) > 1:  # one trace per continuous draw: stack them on the draws dim
                parts = [t.nodes[name]["packed"]["log_prob"] for t in traces]
                if any(p._pyro_dims != dims for p in parts):
                    raise DynamicStructureError(
                        f"Site '{name}' has different dims for different continuous draws; "
                        f"AutoSpec needs a fixed model structure."
                    )
                tensor = torch.stack([p.detach().to(device, torch.float64) for p in parts])
                dims = draws + dims
            ordinal = frozenset(
                plate_to_symbol[f.name] for f in node["cond_indep_stack"] if f.vectorized
            )
            raw[name] = (tensor, dims, site_role(node))
            self._check_plate_coupling(name, dims, ordinal, site_plates)
            self._check_dim_sizes(name, packed, dim_to_size, ordinal, site_plates)
            if not set(dims) & enum_symbols:  # no discrete site in it: a constant per draw
                keep = [i for i, d in enumerate(dims) if d != draws]
                part = tensor.sum(keep) if keep else tensor
                constant = part if constant is None else constant + part
                continue
            terms.append([tensor, dims, ordinal | {draws}])
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        num = 1 if self._continuous is None else self._num_continuous
        if constant is None:
            constant = torch.zeros((), dtype=torch.float64, device=self.device)
        self._constant = constant.expand(num) if constant.dim() == 0 else constant
        self._raw_factors = raw
        self._terms = self._simplify(terms, evidence, draws, enum_symbols)
        self._evidence = evidence
        self._sum_dims = enum_symbols
        self._dim_to_size = dim_to_size
        self._family = self._continuous is not None and num > 1
        self._log_normalizer = None
        self._chain_order = self._chain_position = None
        self._row_entries = self._chain = None
        if not self._lazy:
            self._prepare_queries()

    def _prepare_queries(self) -> None:
        """Measure the contraction (refusing an intractable one) and lower a chain."""
        if self._row_entries is not None:
            return
        self._row_entries = self._measure()
        if self.lower_chains and not self._family:
            self._chain = self._lower_to_chain()

    def _hidden_reads(self, trace, per_draw: bool) -> list[tuple[str, str, str]]:
        """Reads of sites that nested ``pyro.markov`` contexts hide (:func:`_hidden_reads`).

        Only where some site is partly hidden (:func:`_partly_hidden`; never in a plain
        chain) is the model traced once more, under :class:`_KeepOuterScope`. If that trace
        fails, nothing is found and the self-check after sampling stays the guard.
        """
        if not _partly_hidden(trace):
            return []
        wide = self._trace_once_more("wide", per_draw)
        return [] if wide is None else _hidden_reads(trace, wide)

    def _trace_once_more(self, markov: str | bool, per_draw: bool):
        """The model traced with ``pyro.markov`` handled as ``markov`` says (``"wide"``:
        :class:`_KeepOuterScope`; ``False``: :class:`_WithoutMarkov`), for a check; ``None``
        where that trace fails (the self-check after sampling stays the guard)."""
        self._markov = markov
        try:
            return self._trace(0 if per_draw else None)
        except AutoSpecModelError:
            return None
        finally:
            self._markov = True

    @staticmethod
    def _check_markov_history(trace) -> None:
        """Refuse a site whose distribution reaches past its ``pyro.markov`` history.

        ``pyro.markov(history=h)`` lets enumeration reuse the tensor dim of a site more than
        ``h`` steps back. A site that still depends on such a site gets that very dim: its
        distribution's parameters already vary along the dim it is enumerated into, and its
        log density is read on the diagonal (silently wrong in Pyro's ``infer_discrete``).
        """
        holder: dict[int, str] = {}  # enum dim -> the last site enumerated there
        for name, node in trace.nodes.items():
            if node["type"] != "sample" or node["is_observed"]:
                continue
            dim = (node.get("infer") or {}).get("_enumerate_dim")
            if dim is None:
                continue
            batch_shape = node["fn"].batch_shape
            if len(batch_shape) >= -dim and batch_shape[dim] > 1 and dim in holder:
                earlier = holder[dim]
                raise AutoSpecModelError(
                    f"Site '{name}' depends on site '{earlier}', which lies further back than "
                    f"its pyro.markov history keeps: enumeration reused the tensor dim of "
                    f"'{earlier}' for '{name}', so the dependence cannot be expressed (Pyro's "
                    f"infer_discrete silently samples the wrong law here). Ways out: raise "
                    f"history in pyro.markov(..., history=h) to the longest lag the model "
                    f"uses (history=2 for a second-order chain), or drop the dependence. "
                    f"Where each step opens its own `with pyro.markov():`, the steps are "
                    f"sibling contexts that reuse one dim: put the whole loop in one "
                    f"`for t in pyro.markov(range(T))` instead."
                )
            holder[dim] = name

    def _check_reads_past_history(self, trace, per_draw: bool) -> None:
        """Refuse a site (an observation or a ``pyro.factor`` included) that reads a site
        further back than its ``pyro.markov`` history keeps.

        :meth:`_check_markov_history` sees such a read in a latent site's distribution; an
        observed site's log density shows it in no shape (the read site's dim now holds a later
        site, and the density is read on the diagonal), so the draws would silently follow
        another law. Where the sites' supports times the plates' sizes stay within
        ``_MAX_OWN_DIMS_ENTRIES`` the model is traced once more with a dim per site
        (:class:`_WithoutMarkov`), whose log densities show every site each one reads
        (:func:`_hidden_reads`); elsewhere the self-check's uniform probes catch the other
        law after sampling.
        """
        if next(_scoped_sites(trace), None) is None:
            return
        plates = {
            frame.name: frame.size
            for node in trace.nodes.values()
            for frame in node.get("cond_indep_stack", ())
            if frame.vectorized and frame.name != DRAWS_PLATE
        }
        sizes = [site.support_size for site in self.layout.sites] + list(plates.values())
        if math.prod(sizes) > _MAX_OWN_DIMS_ENTRIES:
            return
        wide = self._trace_once_more(False, per_draw)
        reads = [] if wide is None else _hidden_reads(trace, wide)
        if reads:
            name, read, holder = reads[0]
            raise AutoSpecModelError(
                f"Site '{name}' reads site '{read}', which lies further back than its "
                f"pyro.markov history keeps: enumeration gave the tensor dim of '{read}' to "
                f"'{holder}', so '{name}' would be scored with '{holder}' in place of "
                f"'{read}' (Pyro's infer_discrete and TraceEnum_ELBO silently use that other "
                f"law). Ways out: raise history in pyro.markov(..., history=h) to the longest "
                f"lag the model reads (a factor closing a ring of T steps at the last step "
                f"reads T - 1 steps back), or drop the dependence."
            )

    def _check_dim_sizes(self, name, packed, dim_to_size, ordinal, site_plates) -> None:
        """Refuse a log density whose plate dim has another size than the plate's.

        It happens when a plated discrete site is reduced over its plate (``a.sum(-1)``) and
        fed into another plate: the site's enumeration dim shifts into a plate's dim, and the
        contraction would fail with a raw einsum or broadcast error.
        """
        for size, symbol in zip(packed.shape, packed._pyro_dims, strict=True):
            expected = dim_to_size.get(symbol)
            if expected is None or size in (1, expected):
                continue
            plate = self._symbol_to_plate.get(symbol)
            if symbol == self._draws_symbol:
                what = f"AutoSpec's batch of draws (size {expected})"
            elif plate is not None:
                what = f"plate '{plate}' (size {expected})"
            else:
                what = f"discrete site '{site_plates[symbol][0]}' ({expected} values)"
            inside = {p for _, plates in site_plates.values() for p in plates} - set(ordinal)
            suspects = [
                site
                for site, plates in site_plates.values()
                if set(plates) & inside and self.layout[site].support_size == size
            ]
            blame = (
                f" Probably the discrete site(s) {', '.join(repr(s) for s in suspects)} "
                f"(sampled in a plate '{name}' is not in) were reduced over their plate"
                if suspects
                else " Probably a plated discrete site was reduced over its plate"
            )
            raise IntractableEnumerationError(
                f"Site '{name}' has a log density of the wrong shape under enumeration: its dim "
                f"for {what} has size {size}, so the enumerated values of a discrete site landed "
                f"on a dim that belongs to something else.{blame} (e.g. a.sum(-1)) and fed into "
                f"'{name}', which shifts the enumeration dims. A site outside a plate cannot "
                f"depend on the elements of a discrete site inside it under enumeration (one dim "
                f"holds all elements' values). Ways out: compute what '{name}' needs inside that "
                f"plate from each element's own value; write the elements as separate sites; "
                f"replace a sum of Bernoulli elements by one Binomial count site; or use a learned"
                f" guide, which needs no enumeration: guide = AnyOrderGuide(model, args); "
                f"guide.fit_posterior(*args); AutoSpec(model, guide=guide, correction='imh')."
            )

    def _check_plate_coupling(self, name, dims, ordinal, site_plates) -> None:
        """Refuse a factor outside a plate that reads a discrete site inside it.

        Enumeration gives all elements of a plated site one tensor dim: a factor inside the
        plate sees each element's own value, but one outside it (an Ising coupling summed over
        the grid) can only see them all equal. Pyro's ``TraceEnum_ELBO`` has the same rule
        ("no variable outside of a plate depends on an enumerated variable inside it") and
        ``infer_discrete`` silently samples the wrong law there.
        """
        for symbol in dims:
            if symbol not in site_plates:
                continue
            site, plates = site_plates[symbol]
            outside = [p for p in plates if p not in ordinal]
            if not outside:
                continue
            names = ", ".join(f"'{self._symbol_to_plate[p]}'" for p in outside)
            what = f"Site '{name}'" if name != site else f"The log density of site '{site}'"
            raise IntractableEnumerationError(
                f"{what} lies outside plate(s) {names} but depends on the discrete site "
                f"'{site}' sampled inside them: it couples the elements of one plate with each "
                f"other, which enumeration cannot express. Enumeration gives all elements of "
                f"a plated site one shared tensor dim, so a factor outside the plate sees them "
                f"all take the same value (Pyro's TraceEnum_ELBO forbids this, and "
                f"infer_discrete silently samples the wrong law). Ways out: compute the "
                f"factor inside the plate, from each element's own value and sites outside "
                f"it; write the coupled elements as separate sites (a pyro.markov loop over "
                f"rows keeps a narrow grid tractable); or sample the model with a learned "
                f"guide, which needs no enumeration: guide = AnyOrderGuide(model, args); "
                f"guide.fit_posterior(*args); AutoSpec(model, guide=guide, correction='imh')."
            )

    def _simplify(self, terms, evidence, draws, enum_symbols):
        """Contract plates that no enumerated site lives in, and fold factors into supersets.

        Both are what the contraction would do first on every round; done once here.
        """
        home: dict[str, frozenset] = {}
        for _, dims, ordinal in terms:
            for d in set(dims) & enum_symbols:
                home[d] = home.get(d, ordinal) & ordinal
        for spec in evidence:
            for d in set(spec.dims) & enum_symbols:
                home[d] = home.get(d, spec.ordinal) & spec.ordinal
        for term in terms:
            tensor, dims, ordinal = term
            needed = frozenset({draws}).union(*(home[d] for d in set(dims) & enum_symbols))
            for plate in ordinal - needed:
                if plate in dims:
                    tensor = tensor.sum(dims.index(plate))
                    dims = dims.replace(plate, "")
            term[:] = [tensor, dims, ordinal & needed]
        # fold each factor into a factor of the same plates whose dims contain its own
        terms.sort(key=lambda t: -len(t[1]))
        kept: list[list] = []
        for tensor, dims, ordinal in terms:
            for other in kept:
                if other[2] == ordinal and set(dims) <= set(other[1]):
                    other[0] = other[0] + _align(tensor, dims, other[1]).expand_as(other[0])
                    break
            else:
                kept.append([tensor.contiguous(), dims, ordinal])
        for term in kept:  # the same tensor objects every round: exponentials cached on them
            term[0] = constant_factor(term[0], term[1])
        return kept

    def _lower_to_chain(self) -> PairwiseChainOracle | None:
        """The factor graph as a :class:`PairwiseChainOracle`, or None if it is not a chain.

        It is one when every factor touches one discrete site or two consecutive ones in
        trace order (``pyro.markov`` chains), and the sites are either all single coordinates
        or all batched in the same one plate of size ``P`` (``P`` independent chains, e.g.
        sequences in a plate, as in Pyro's ``examples/hmm.py``). The factors are then summed
        into per-site and per-edge log potentials, exactly the ones the contraction
        multiplies; the chains are laid end to end (chain ``p``'s sites in trace order, then
        chain ``p + 1``'s, joined by a zero potential) and ``_chain_order`` maps each position
        to its coordinate. Each query row then costs ``O(q^2)`` per target instead of a
        contraction over the whole graph.
        """
        q = self.num_values
        specs = self._evidence
        shapes = {spec.view_shape for spec in specs}
        if len(shapes) != 1 or len(next(iter(shapes))) > 1:
            return None
        plate_size = next(iter(shapes))[0] if next(iter(shapes)) else 1
        plate = specs[0].dims[0] if plate_size > 1 else None
        site_of, size_of = {}, {}
        for index, spec in enumerate(specs):
            if plate is not None and spec.dims[0] != plate:
                return None
            symbol = spec.dims[1 if plate is not None else 0]
            site_of[symbol], size_of[symbol] = index, spec.support_size
        num_sites = len(specs)
        if num_sites * plate_size != self.num_coords:
            return None
        unary = torch.zeros(plate_size, num_sites, q, dtype=torch.float64, device=self.device)
        pairwise = torch.zeros(
            plate_size, max(num_sites - 1, 0), q, q, dtype=torch.float64, device=self.device
        )
        for index, spec in enumerate(specs):
            unary[:, index, spec.support_size :] = -math.inf
        for tensor, dims, ordinal in self._terms:
            if plate is not None and plate not in ordinal:
                return None  # one factor over a whole plate of sites: not independent chains
            tensor = tensor.detach()
            kept = ""
            for d in reversed(dims):  # drop unit plates and the draws dim (one draw here)
                axis = dims.index(d)
                if d in site_of or (d == plate and tensor.shape[axis] == plate_size):
                    kept = d + kept
                elif tensor.shape[axis] == 1:
                    tensor = tensor.squeeze(axis)
                else:
                    return None
            sites = sorted((d for d in kept if d in site_of), key=site_of.get)
            batched = plate is not None and plate in kept
            order = ([plate] if batched else []) + sites
            tensor = tensor.permute([kept.index(d) for d in order])
            if not batched:
                tensor = tensor.unsqueeze(0)
            # a factor constant in a site or the plate is broadcast over it
            tensor = tensor.expand([plate_size] + [size_of[d] for d in sites])
            index = [site_of[d] for d in sites]
            if len(index) == 1:
                unary[:, index[0], : tensor.shape[1]] += tensor
            elif len(index) == 2 and index[1] - index[0] == 1:
                pairwise[:, index[0], : tensor.shape[1], : tensor.shape[2]] += tensor
            else:
                return None
        # chains end to end: position p * num_sites + s is site s of chain p
        joined = torch.zeros(
            max(plate_size * num_sites - 1, 0), q, q, dtype=torch.float64, device=self.device
        )
        for p in range(plate_size):
            start = p * num_sites
            joined[start : start + num_sites - 1] = pairwise[p]
        starts = torch.tensor([spec.coords.start for spec in specs], device=self.device)
        order = (starts[None, :] + torch.arange(plate_size, device=self.device)[:, None]).flatten()
        try:
            chain = PairwiseChainOracle(unary.reshape(-1, q), joined)
        except ValueError:  # nothing possible: the contraction reports it per row
            return None
        if torch.equal(order, torch.arange(self.num_coords, device=self.device)):
            self._chain_order = self._chain_position = None
        else:
            self._chain_order = order  # position -> coordinate
            self._chain_position = torch.empty_like(order)
            self._chain_position[order] = torch.arange(len(order), device=self.device)
        return chain

    def _tree(self, leaves: list, draws: torch.Tensor | None) -> OrderedDict:
        tree = OrderedDict()
        symbol = self._draws_symbol
        for tensor, dims, ordinal in self._terms:
            if self._family and symbol in dims:
                tensor = tensor.index_select(dims.index(symbol), draws)
                tensor._pyro_dims = dims
            elif getattr(tensor, "_pyro_dims", None) != dims:
                tensor = constant_factor(tensor.view(tensor.shape), dims)
            tree.setdefault(ordinal, []).append(tensor)
        for spec, leaf in zip(self._evidence, leaves, strict=True):
            part = linear_factor(leaf.view(leaf.shape), spec.dims)  # 0/1 evidence, linear
            tree.setdefault(spec.ordinal, []).append(part)
        return tree

    def _leaves(self, ev: torch.Tensor) -> list:
        """One evidence tensor per site, ``[*plate sizes, K, rows]``: views of ``ev`` [n, q, rows].

        Coordinates come first in ``ev`` so that every site's block is a view, and gradients
        are taken with respect to the views: the backward pass never materialises ``ev``.
        """
        rows = ev.shape[2]
        return [
            ev[spec.coords, : spec.support_size].reshape(
                spec.view_shape + (spec.support_size, rows)
            )
            for spec in self._evidence
        ]

    def _measure(self) -> int:
        """Entries per query row of one contraction; refuse an intractable elimination.

        A small contraction is measured by running it on two rows of zeros; one with a step of
        over :data:`_MEASURED_BY_RUNNING` entries is measured on ``meta`` tensors, shapes only
        (whose operators load ``torch._dynamo`` in a fresh process: over a second).
        """
        rows = 2
        try:
            entries = self._measured(rows, on_meta=False)
        except StepTooLarge:
            entries = self._measured(rows, on_meta=True)
        largest = max(entries, default=1) / rows
        if largest > _MAX_STEP_ENTRIES_PER_ROW:
            raise _intractable_error(largest)
        return max(1, int(2 * sum(entries) / rows))

    def _measured(self, rows: int, on_meta: bool) -> list[int]:
        """The entries of every step of one contraction of ``rows`` query rows."""
        device = "meta" if on_meta else self.device
        ev = torch.zeros(self.num_coords, self.num_values, rows, device=device)
        ev = ev.to(torch.float64)
        draws = torch.zeros(rows, dtype=torch.long, device=device) if self._family else None
        saved = self._terms
        if on_meta:
            self._terms = [[t.to("meta"), d, o] for t, d, o in saved]
        ring = PlannedLogRing(dim_to_size={**self._dim_to_size, self._draws_symbol: rows})
        ring.step_entries = []
        ring.entry_cap = None if on_meta else _MEASURED_BY_RUNNING
        try:
            with torch.no_grad():
                contract_to_tensor(
                    self._tree(self._leaves(ev), draws),
                    set(self._sum_dims),
                    target_ordinal=frozenset({self._draws_symbol}),
                    ring=ring,
                )
        except NotImplementedError as e:  # Pyro: "Expected tree-structured plate nesting"
            raise _non_tree_error(e, self._symbol_to_plate, self._evidence) from e
        finally:
            self._terms = saved
        return ring.step_entries

    # ------------------------------------------------------------------------------ queries
    def log_marginals(
        self, values: torch.Tensor, mask: torch.Tensor, draws: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Conditional log marginals of every coordinate.

        Parameters
        ----------
        values : LongTensor[B, n]
            Support indices; read only where ``mask`` is True.
        mask : BoolTensor[B, n]
            True where the coordinate is pinned.
        draws : LongTensor[B], optional
            For a family (``num_draws``): the draw each row conditions on.

        Returns
        -------
        DoubleTensor[B, n, q]
            ``log P(X_i = v | X_S = values_S, data)``; ``-inf`` outside each site's support.
        """
        values, mask, draws = self._check(values, mask, draws)
        self._prepare_queries()
        if values.shape[0] == 0:
            return torch.empty(
                0, self.num_coords, self.num_values, dtype=torch.float64, device=self.device
            )
        probs, inverse = self._probabilities(values, mask, draws)
        if inverse is not None:
            probs = probs[:, inverse]
        return _log(probs.transpose(0, 1))

    def _probabilities(self, values, mask, draws):
        """Linear marginals ``[n, U, q]`` of the ``U`` distinct rows, and the rows' index."""
        per_call = max(2, min(self.batch_size, self.max_elements // self._row_entries))
        # Identical conditionings (common: every draw starts unconditioned) are computed once.
        keys = torch.where(mask, values, -1)
        if draws is not None:
            keys = torch.cat([draws[:, None], keys], dim=1)
        unique, inverse = _unique_rows(keys)
        if draws is not None:
            draws_u, unique = unique[:, 0], unique[:, 1:]
        else:
            draws_u = None
        mask_u = unique >= 0
        values_u = unique.clamp(min=0)
        parts = []
        for start in range(0, values_u.shape[0], per_call):
            stop = start + per_call
            part_draws = None if draws_u is None else draws_u[start:stop]
            probs, _ = self._call(values_u[start:stop], mask_u[start:stop], part_draws, per_call)
            parts.append(probs)
        return (parts[0] if len(parts) == 1 else torch.cat(parts, 1)), inverse

    def log_marginals_at(
        self,
        values: torch.Tensor,
        mask: torch.Tensor,
        targets: torch.Tensor,
        draws: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Conditional log marginals of the coordinates ``targets`` only.

        Parameters
        ----------
        values : LongTensor[B, n]
        mask : BoolTensor[B, n]
        targets : LongTensor[B, k]
            Coordinate indices (may repeat).
        draws : LongTensor[B], optional
            For a family: the draw each row conditions on.

        Returns
        -------
        DoubleTensor[B, k, q]
        """
        values, mask, draws = self._check(values, mask, draws)
        self._prepare_queries()
        targets = torch.as_tensor(targets, dtype=torch.long, device=self.device)
        if (
            self._chain is not None
            and _CHAIN_TARGETS_PER_COORD * targets.shape[1] <= self.num_coords
        ):
            values, mask, targets = self._to_chain(values, mask, targets)
            return _impossible_to_neginf(self._chain.log_marginals_at(values, mask, targets))
        if values.shape[0] == 0:
            return torch.empty(
                0, targets.shape[1], self.num_values, dtype=torch.float64, device=self.device
            )
        probs, inverse = self._probabilities(values, mask, draws)
        rows = torch.arange(values.shape[0], device=self.device)
        rows = rows if inverse is None else inverse
        return _log(probs[targets, rows[:, None]])

    def log_marginals_chain(
        self,
        values: torch.Tensor,
        mask: torch.Tensor,
        chain: torch.Tensor,
        draws: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Chain queries: each chain coordinate given the prefix and the chain before it.

        ``out[c, j] = log P(X_{chain[c, j]} = . | X_S = values_S)`` with
        ``S = mask[c] + chain[c, :j]`` (see
        :class:`~pyro_autospec.engine.protocols.MarginalOracle`).
        For enumeration each of the ``L`` conditionings costs one contraction row, so this is
        no cheaper than ``L`` rows; it answers all of them in one batched call (identical
        conditionings, such as the padding of short chains, once).

        Parameters
        ----------
        values : LongTensor[C, n]
        mask : BoolTensor[C, n]
        chain : LongTensor[C, L]
        draws : LongTensor[C], optional

        Returns
        -------
        DoubleTensor[C, L, q]
        """
        values, mask, draws = self._check(values, mask, draws)
        self._prepare_queries()
        chain = torch.as_tensor(chain, dtype=torch.long, device=values.device)
        if self._chain is not None:
            values, mask, chain = self._to_chain(values, mask, chain)
            return _impossible_to_neginf(self._chain.log_marginals_chain(values, mask, chain))
        num, length = chain.shape
        rows_values, rows_mask, targets = chain_rows(values, mask, chain)
        rows_draws = None if draws is None else draws.repeat_interleave(length)
        out = self.log_marginals_at(rows_values, rows_mask, targets, rows_draws)
        return out.reshape(num, length, self.num_values)

    def _to_chain(self, values, mask, coords):
        """Queries in the lowered chain's positions (coordinates reordered chain by chain)."""
        if self._chain_order is None:
            return values, mask, coords
        order = self._chain_order
        return values[:, order], mask[:, order], self._chain_position[coords]

    def log_normalizer(self, draws: torch.Tensor | None = None) -> torch.Tensor:
        """``log sum_x p(x, data)`` (given each draw's continuous values, for a family).

        Parameters
        ----------
        draws : LongTensor[B], optional
            For a family: which draws (default: all of them).

        Returns
        -------
        DoubleTensor[B] (family) or a 0-dim DoubleTensor
        """
        if self._log_normalizer is None:
            self._prepare_queries()
            num = 1 if self._continuous is None else self._num_continuous
            everything = torch.arange(num, device=self.device)
            logz = []
            for start in range(0, num, self.batch_size):
                part = everything[start : start + self.batch_size]
                values = torch.zeros(len(part), self.num_coords, dtype=torch.long)
                mask = torch.zeros_like(values, dtype=torch.bool)
                _, z = self._call(
                    values.to(self.device),
                    mask.to(self.device),
                    part if self._family else None,
                    self.batch_size,
                )
                logz.append(z)
            self._log_normalizer = torch.cat(logz) + self._constant
        if self._continuous is None:
            return self._log_normalizer[0]
        if draws is None:
            return self._log_normalizer
        return self._log_normalizer[torch.as_tensor(draws, device=self.device)]

    def pointwise_log_likelihood(self) -> dict[str, torch.Tensor]:
        """The log likelihood of every observed element with the discrete sites summed out.

        For an observed site ``y`` whose elements each read their own discrete sites (a
        mixture's assignment ``z_i``: same plates as ``y``, read by nothing else, depending
        on no other discrete site), ``log p(y_i | theta) = logsumexp_z [log p(z_i | theta) +
        log p(y_i | z_i, theta)]`` given each draw's continuous values ``theta``: the
        pointwise form LOO and WAIC need. An observed site that reads no discrete site keeps
        its log density. Masked terms are left out, as in the log joint: a masked element
        (``poutine.mask`` or ``Distribution.mask``), whose log density is zero whatever the
        discrete sites it reads, is exactly 0, as Pyro's ``Trace.compute_log_prob`` and
        ``MaskedDistribution.log_prob`` give it, not the rounding of ``log sum_z p(z_i)``.

        Returns
        -------
        dict of str -> ``DoubleTensor[M, *batch_shape]``
            One row per continuous draw (``M = num_draws``; ``M = 1`` without continuous
            sites), in the layout's order of observed sites.

        Raises
        ------
        ValueError
            When some observed site's elements share a discrete site, or a site is scaled:
            the message names the sites. There is no per-observation marginal then; the
            conditional form (given the draw's discrete values) is the one left.

        Examples
        --------
        >>> import torch, pyro, pyro.distributions as dist
        >>> def model(y):
        ...     with pyro.plate("data", 2):
        ...         z = pyro.sample("z", dist.Bernoulli(0.5))
        ...         pyro.sample("y", dist.Normal(3.0 * z, 1.0), obs=y)
        >>> out = EnumOracle(model, (torch.tensor([0.0, 3.0]),)).pointwise_log_likelihood()
        >>> out["y"].shape
        torch.Size([1, 2])
        """
        draws, enum = self._draws_symbol, self._sum_dims
        site_of = {spec.dims[-2]: spec for spec in self._evidence}
        num = 1 if self._continuous is None else self._num_continuous
        out = OrderedDict()
        for name, batch_shape in self.layout.observed_batch_shapes.items():
            if name not in self._raw_factors:
                continue
            tensor, dims, _ = self._raw_factors[name]
            read = set(dims) & enum
            group = {site_of[s].name for s in read}
            if name in self.layout.scales or group & set(self.layout.scales):
                raise ValueError(
                    f"observed site '{name}' or a discrete site it reads is scaled "
                    f"(poutine.scale or a subsampled plate): no per-observation marginal"
                )
            parts = [(tensor, dims)]
            for other, (other_tensor, other_dims, _) in self._raw_factors.items():
                shared = set(other_dims) & read
                if other == name or not shared:
                    continue
                listed = ", ".join(sorted(f"'{site_of[s].name}'" for s in shared))
                if other not in group:
                    raise ValueError(
                        f"site '{other}' also reads the discrete site(s) {listed} that observed "
                        f"site '{name}' reads, so they cannot be summed out per observation"
                    )
                beyond = set(other_dims) & enum - read
                if beyond:
                    more = ", ".join(sorted(f"'{site_of[s].name}'" for s in beyond))
                    raise ValueError(
                        f"the discrete site '{other}' that observed site '{name}' reads depends "
                        f"on discrete site(s) {more}, which '{name}' does not read: its elements "
                        f"are not independent given the continuous sites"
                    )
                parts.append((other_tensor, other_dims))
            plates = set(dims) - enum - {draws}
            for symbol in read:
                spec = site_of[symbol]
                own = set(spec.dims) - {symbol, draws}
                if own != plates:
                    raise ValueError(
                        f"the discrete site '{spec.name}' is shared by several elements of "
                        f"observed site '{name}' (it is not in all of its plates), so it "
                        f"cannot be summed out per observation"
                    )
            order = "".join(sorted(set().union(*(set(d) for _, d in parts))))
            total = sum(_align(t, d, order) for t, d in parts)
            summed = [i for i, d in enumerate(order) if d in read]
            if summed:
                masked = _align(tensor, dims, order).abs().amax(summed) == 0
                total = total.logsumexp(summed).masked_fill(masked, 0.0)
            kept = "".join(d for d in order if d not in read)
            out[name] = self._to_batch(total, kept, num, batch_shape)
        return out

    def _to_batch(self, tensor, dims, num, batch_shape) -> torch.Tensor:
        """A packed ``tensor`` (draws and plate dims) as ``[num, *batch_shape]``."""
        rank = len(batch_shape)
        order, shape = [], [num] + list(batch_shape)
        target = [self._draws_symbol] + [None] * rank
        for symbol in dims:
            if symbol != self._draws_symbol:
                target[rank + self._plate_dim[symbol] + 1] = symbol
        present = [d for d in target if d is not None and d in dims]
        order = [dims.index(d) for d in present]
        tensor = tensor.permute(order) if order else tensor
        view = [tensor.shape[present.index(d)] if d in present else 1 for d in target]
        return tensor.reshape(view).expand(shape).clone()

    def _check(self, values, mask, draws):
        values = torch.as_tensor(values, device=self.device)
        mask = torch.as_tensor(mask, dtype=torch.bool, device=self.device)
        if values.dim() != 2 or values.shape[1] != self.num_coords or mask.shape != values.shape:
            raise ValueError(
                f"values and mask must have shape [B, {self.num_coords}]; got "
                f"{tuple(values.shape)} and {tuple(mask.shape)}"
            )
        if self.num_draws is None:
            if draws is not None:
                raise ValueError("draws= is only for a family oracle (continuous_values=...)")
        else:
            if draws is None:
                raise ValueError(
                    f"this EnumOracle is a family of {self.num_draws} targets (one per draw of "
                    f"the continuous sites): pass draws=LongTensor[B]"
                )
            draws = torch.as_tensor(draws, dtype=torch.long, device=self.device).reshape(-1)
            if draws.shape[0] != values.shape[0]:
                raise ValueError(f"draws has {draws.shape[0]} entries for {values.shape[0]} rows")
            if bool(((draws < 0) | (draws >= self.num_draws)).any()):
                raise ValueError(f"draws must lie in [0, {self.num_draws})")
        return values.long(), mask, draws

    def _call(self, values, mask, draws, limit):
        if self.num_threads is None:
            return self._contract(values, mask, draws, limit)
        previous = torch.get_num_threads()
        torch.set_num_threads(self.num_threads)
        try:
            return self._contract(values, mask, draws, limit)
        finally:
            torch.set_num_threads(previous)

    def _contract(self, values, mask, draws, limit):
        """Marginals [n, b, q] (linear, coordinates first) and log Z [b] of ``b`` rows."""
        rows = values.shape[0]
        # pad to a power of two (at least 2) so that cached plans are reused across rounds
        padded = 2
        while padded < rows:
            padded *= 2
        padded = max(rows, min(padded, max(limit, 2)))
        if padded > rows:
            extra = padded - rows
            values = torch.cat([values, values[:1].expand(extra, -1)])
            mask = torch.cat([mask, mask[:1].expand(extra, -1)])
            if draws is not None:
                draws = torch.cat([draws, draws[:1].expand(extra)])
        q = self.num_values
        values_t, mask_t = values.t(), mask.t()  # [n, rows]: coordinates first
        other = torch.arange(q, device=values.device)[:, None] != values_t[:, None, :]
        ring = PlannedLogRing(dim_to_size={**self._dim_to_size, self._draws_symbol: padded})
        # the marginals are gradients: taken whatever the caller's grad or inference mode
        with torch.inference_mode(False), torch.enable_grad():
            # linear evidence e_i(v) in {0, 1}: d log Z / d e_i(v) e_i(v) = P(X_i = v | pins)
            ev = (~(mask_t[:, None, :] & other)).to(torch.float64)  # [n, q, B]
            ev = ev.clone().requires_grad_(True)  # an ordinary tensor, also from inference ones
            leaves = self._leaves(ev)
            logz = contract_to_tensor(
                self._tree(leaves, draws),
                set(self._sum_dims),
                target_ordinal=frozenset({self._draws_symbol}),
                ring=ring,
            )
            logz = logz.expand(padded) if logz.dim() == 0 else logz
            grads = torch.autograd.grad(logz.sum(), leaves)
        self.num_calls += 1
        with torch.no_grad():
            blocks = [
                (grad * leaf).reshape(-1, grad.shape[-2], padded)
                for grad, leaf in zip(grads, leaves, strict=True)
            ]
            if all(block.shape[1] == q for block in blocks):
                probs = torch.cat(blocks)
            else:
                probs = torch.zeros_like(ev)
                for spec, block in zip(self._evidence, blocks, strict=True):
                    probs[spec.coords, : spec.support_size] = block
            probs = probs.transpose(1, 2)  # [n, rows, q]
        return probs[:, :rows], logz.detach()[:rows]
