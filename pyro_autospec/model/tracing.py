"""Tracing a Pyro model once, and reading its sites: the helpers every other module shares.

* :func:`trace_model`: one trace under ``poutine.block`` (nothing leaks to an outer handler);
* :func:`over_draws`, :func:`simulate_trace`: the model batched over a plate of draws, and
  one forward simulation of it (observed sites sampled);
* :func:`check_subsampling`: a clear error for plates that subsample their data at random;
* :func:`site_role`: ``"latent"``, ``"data"``, ``"deterministic"``, ``"factor"`` or
  ``"subsample"`` for every sample site;
* :func:`plate_nesting`: the model's plate and batch depth (``max_plate_nesting``);
* :func:`scaled_sites`: sites under ``poutine.scale`` (or a subsampled plate's scale);
* :class:`SiteRecorder` and :func:`structure_error`: name the site where a batched or
  enumerated run of the model failed;
* :func:`users_generators_kept`, :func:`seed_generators`: the global torch generators seeded
  for the library's runs and put back after them.
"""

from __future__ import annotations

import math
import os
import re
import traceback
import warnings
from collections.abc import Callable

import pyro
import torch
from pyro import poutine
from pyro.poutine.subsample_messenger import _Subsample
from pyro.poutine.util import prune_subsample_sites
from torch.overrides import TorchFunctionMode

from pyro_autospec.model.errors import (
    AutoSpecModelError,
    DynamicStructureError,
    SubsamplingError,
)

__all__ = [
    "DRAWS_PLATE",
    "EntriesGuard",
    "MAX_ENUMERATED_ENTRIES",
    "TensorTooLarge",
    "SiteRecorder",
    "over_draws",
    "check_subsampling",
    "enumerated",
    "parallel_enumeration",
    "plate_dims",
    "plate_nesting",
    "scaled_sites",
    "simulate_trace",
    "site_role",
    "compute_log_prob",
    "scored_log_joint",
    "plain_run_note",
    "plated_reduction_advice",
    "structure_error",
    "trace_model",
    "seed_generators",
    "users_generators_kept",
]

#: Name of the plate over draws that batched runs of a model use (left of every model plate).
DRAWS_PLATE = "_autospec_draws"


def users_generators_kept():
    """A context in which the library may seed and draw from torch's global generators: on
    leaving it, torch's CPU generator and the generator of every CUDA device already in use
    are as they were on entering it, so a run leaves the user's random streams alone.

    ``torch.manual_seed`` seeds the CUDA generators too, and a model on a GPU draws from its
    device's generator, so forking the CPU's alone (``fork_rng(devices=[])``) would reset the
    user's CUDA stream.
    """
    in_use = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    return torch.random.fork_rng(devices=in_use)


def seed_generators(seed: int) -> None:
    """Seed torch's CPU generator, and the CUDA devices' where CUDA is in use, for the
    library's own runs (inside :func:`users_generators_kept`).

    ``torch.manual_seed`` would also queue a seed for CUDA's lazy start, in place of one the
    user queued with their own ``torch.manual_seed`` before ever touching the GPU, so that
    the user's CUDA stream would start from the library's seed after the run.
    """
    torch.random.default_generator.manual_seed(seed)
    if torch.cuda.is_initialized():
        torch.cuda.manual_seed_all(seed)


def over_draws(model: Callable, num_draws: int, max_plate_nesting: int) -> Callable:
    """``model`` run on ``num_draws`` draws at once: under the plate of draws
    (:data:`DRAWS_PLATE`, size ``num_draws``, dim ``-(max_plate_nesting + 1)``, left of every
    plate of the model).

    Every batched run of a model (its log joint on draws, its enumeration over a family of
    draws, its simulations, a guide's probes) traces the model this way.

    Examples
    --------
    >>> import pyro, pyro.distributions as dist
    >>> def model():
    ...     with pyro.plate("data", 3):
    ...         return pyro.sample("z", dist.Normal(0.0, 1.0))
    >>> over_draws(model, 5, max_plate_nesting=1)().shape
    torch.Size([5, 3])
    """

    def batched(*args, **kwargs):
        with pyro.plate(DRAWS_PLATE, num_draws, dim=-(max_plate_nesting + 1)):
            return model(*args, **kwargs)

    return batched


def simulate_trace(
    model: Callable, args: tuple, kwargs: dict | None, num: int, max_plate_nesting: int
):
    """One forward simulation of ``num`` draws of the model, observed sites sampled.

    ``poutine.uncondition(model)`` under the plate of draws (:func:`over_draws`), traced inside
    ``poutine.block`` (nothing leaks to an outer handler), the plates' subsample sites pruned.
    Torch's RNG is the caller's: seed or fork it around the call.

    Parameters
    ----------
    model : callable
    args, kwargs
        The model's arguments (the observed values themselves are ignored).
    num : int
        The number of draws (the size of the plate of draws).
    max_plate_nesting : int
        The model's plate depth; the plate of draws sits at ``dim = -(max_plate_nesting + 1)``.

    Returns
    -------
    pyro.poutine.Trace

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> def model(y):
    ...     z = pyro.sample("z", dist.Bernoulli(0.5))
    ...     with pyro.plate("data", 3):
    ...         pyro.sample("y", dist.Normal(z, 1.0), obs=y)
    >>> trace = simulate_trace(model, (torch.zeros(3),), {}, 4, max_plate_nesting=1)
    >>> trace.nodes["z"]["value"].shape, trace.nodes["y"]["value"].shape
    (torch.Size([4, 1]), torch.Size([4, 3]))
    """
    kwargs = {} if kwargs is None else kwargs
    with poutine.block():
        batched = over_draws(poutine.uncondition(model), num, max_plate_nesting)
        trace = poutine.trace(batched).get_trace(*args, **kwargs)
    return prune_subsample_sites(trace)


def trace_model(model: Callable, args: tuple = (), kwargs: dict | None = None, *, prune=True):
    """One trace of ``model(*args, **kwargs)`` under ``poutine.block``.

    Parameters
    ----------
    model : callable
    args, kwargs
        The model's arguments.
    prune : bool
        Drop the plates' internal subsample sites (:func:`check_subsampling` needs them).

    Returns
    -------
    pyro.poutine.Trace

    Examples
    --------
    >>> import pyro, pyro.distributions as dist
    >>> def model():
    ...     pyro.sample("z", dist.Bernoulli(0.5))
    >>> list(trace_model(model).nodes)
    ['_INPUT', 'z', '_RETURN']
    """
    kwargs = {} if kwargs is None else kwargs
    recorder = SiteRecorder()
    try:
        with poutine.block(), recorder:
            trace = poutine.trace(model).get_trace(*args, **kwargs)
    except AutoSpecModelError:
        raise
    except Exception as error:  # the model's own error: pass it on, noting where it stopped
        if hasattr(error, "add_note"):  # Python 3.11+
            error.add_note(plain_run_note(recorder.names))
        raise
    return prune_subsample_sites(trace) if prune else trace


def plain_run_note(seen: list[str]) -> str:
    """A note for an error a model raises in a plain run of Pyro: it is the model's own.

    A plain run (one draw, nothing enumerated, no extra batch dims) is how
    ``poutine.trace(model).get_trace(*args, **kwargs)`` runs the model, so AutoSpec passes the
    error on unchanged (its type and message are the user's) and only adds this note (Python
    3.11+ prints it under the traceback), naming the last site reached.

    Examples
    --------
    >>> print(plain_run_note(["x", "y"])[:69])
    AutoSpec: the model raised this after site 'y' in a plain run of Pyro
    """
    last = f" after site '{seen[-1]}'" if seen else " before its first sample site"
    return (
        f"AutoSpec: the model raised this{last} in a plain run of Pyro (one draw, nothing "
        f"enumerated, no extra batch dims: what poutine.trace(model).get_trace(*args, **kwargs) "
        f"does), before AutoSpec changed anything, so the cause lies in the model or in its "
        f"arguments. Make a plain Pyro run of the model succeed first."
    )


def scored_log_joint(trace) -> torch.Tensor:
    """``log p`` of one traced run whose log densities are computed: every scored site's
    (latent, observed, factor; not deterministic) scaled and masked log density, each summed
    in float64, then added."""
    terms = [
        site["log_prob"].double().sum()
        for site in trace.nodes.values()
        if site["type"] == "sample" and site_role(site) != "deterministic"
    ]
    return torch.stack(terms).sum() if terms else torch.zeros((), dtype=torch.float64)


def site_role(site: dict) -> str:
    """What a sample site is to AutoSpec.

    Returns
    -------
    str
        ``"subsample"`` (a plate's index site), ``"deterministic"`` (``pyro.deterministic``),
        ``"factor"`` (``pyro.factor``, or another auxiliary observed site), ``"data"`` (an
        observed site) or ``"latent"``.

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> def model():
    ...     z = pyro.sample("z", dist.Bernoulli(0.5))
    ...     pyro.deterministic("twice", 2 * z)
    ...     pyro.factor("f", z)
    ...     pyro.sample("y", dist.Normal(z, 1.0), obs=torch.tensor(0.0))
    >>> trace = trace_model(model)
    >>> [site_role(trace.nodes[n]) for n in ("z", "twice", "f", "y")]
    ['latent', 'deterministic', 'factor', 'data']
    """
    fn = site["fn"]
    infer = site.get("infer") or {}
    if isinstance(fn, _Subsample):
        return "subsample"
    if infer.get("_deterministic", False):
        return "deterministic"
    if site["is_observed"]:
        if infer.get("is_auxiliary", False) or type(fn).__name__ == "Unit":
            return "factor"
        return "data"
    return "latent"


def plate_dims(site: dict) -> dict[int, int]:
    """``dim -> size`` of the vectorized plates around a site."""
    return {f.dim: f.size for f in site["cond_indep_stack"] if f.vectorized and f.dim is not None}


def plate_nesting(trace) -> int:
    """The depth of plates and batch dimensions of every site (``max_plate_nesting``).

    Examples
    --------
    >>> import pyro, pyro.distributions as dist
    >>> def model():
    ...     with pyro.plate("a", 2, dim=-2):
    ...         pyro.sample("z", dist.Bernoulli(0.5))
    >>> plate_nesting(trace_model(model))
    2
    """
    depth = 0
    for site in trace.nodes.values():
        if site["type"] != "sample" or site_role(site) == "subsample":
            continue
        for frame in site["cond_indep_stack"]:
            if frame.vectorized and frame.dim is not None:
                depth = max(depth, -frame.dim)
        if site_role(site) != "deterministic":
            depth = max(depth, len(site["fn"].batch_shape))
    return depth


#: The mark :class:`SiteRecorder` gives a plate's subsample site in ``infer``: whether its
#: indices were set before Pyro would draw them (a fixed ``subsample=``).
FIXED_SUBSAMPLE = "_autospec_fixed_subsample"


def check_subsampling(trace) -> None:
    """Raise :class:`SubsamplingError` if a plate draws a random subsample on every run.

    ``trace`` must be unpruned (see :func:`trace_model` with ``prune=False``). A plate given a
    fixed ``subsample=`` tensor is accepted, with or without ``subsample_size`` (Pyro then
    uses the given indices on every run): its sites are scaled by ``size / subsample_size``
    (see :func:`scaled_sites`). Where ``trace`` was not made by :func:`trace_model` (no mark
    says whether the indices were given), a plate with ``subsample_size`` below its size is
    refused.

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> def model():
    ...     with pyro.plate("data", 10, subsample_size=3):
    ...         pyro.sample("z", dist.Bernoulli(0.5))
    >>> check_subsampling(trace_model(model, prune=False))
    Traceback (most recent call last):
    ...
    pyro_autospec.model.errors.SubsamplingError: Plate 'data' draws a random subsample of 3 ...
    """
    for name, site in trace.nodes.items():
        if site["type"] != "sample" or not isinstance(site["fn"], _Subsample):
            continue
        fn = site["fn"]
        size, sub = int(fn.size), fn.subsample_size
        if (site.get("infer") or {}).get(FIXED_SUBSAMPLE):
            continue
        if sub is not None and int(sub) < size:
            raise SubsamplingError(
                f"Plate '{name}' draws a random subsample of {int(sub)} of its {size} elements on "
                f"every run (subsample_size={int(sub)}): each run of the model sees different "
                f"data, so there is no single posterior to sample exactly. Remove subsample_size "
                f"(AutoSpec conditions on all the data in one batched pass), or pass a fixed "
                f"subsample=torch.arange(...) to the plate (the model is then scaled by "
                f"size / subsample_size, as under poutine.scale)."
            )


def scaled_sites(trace) -> dict[str, float]:
    """``name -> scale`` of the sample sites whose log density is scaled (not 1).

    Scales come from ``poutine.scale`` or from a plate with a fixed subsample.

    Examples
    --------
    >>> import pyro, pyro.distributions as dist
    >>> from pyro import poutine
    >>> def model():
    ...     with poutine.scale(scale=4.0):
    ...         pyro.sample("z", dist.Bernoulli(0.5))
    >>> scaled_sites(trace_model(model))
    {'z': 4.0}
    """
    out = {}
    for name, site in trace.nodes.items():
        if site["type"] != "sample" or site_role(site) in ("subsample", "deterministic"):
            continue
        scale = site.get("scale", 1.0)
        if isinstance(scale, torch.Tensor):
            if scale.numel() == 1 and float(scale) == 1.0:
                continue
            out[name] = float(scale.double().mean())
        elif scale != 1.0:
            out[name] = float(scale)
    return out


def enumerated(model: Callable) -> Callable:
    """``model`` with every unobserved enumerable site enumerated in parallel
    (:func:`parallel_enumeration`): what NUTS needs to sum the discrete sites out."""
    return poutine.infer_config(model, parallel_enumeration)


def parallel_enumeration(msg: dict) -> dict:
    """``poutine.infer_config`` rule: enumerate every unobserved enumerable site in parallel.

    Overrides ``infer={"enumerate": "sequential"}`` (which a contraction cannot use) and
    Monte Carlo enumeration (``infer={"num_samples": k}``, a hint for ELBO estimates: the
    sampler is exact and enumerates every value), and marks sites without an annotation
    (``config_enumerate``'s default).
    """
    fn = msg["fn"]
    if msg["is_observed"] or isinstance(fn, _Subsample):
        return {}
    if getattr(fn, "has_enumerate_support", False):
        return {"enumerate": "parallel", "num_samples": None}
    return {}


def enumerated_trace(
    model: Callable,
    args: tuple,
    kwargs: dict,
    max_plate_nesting: int,
    log_prob: bool = False,
    partial: bool = False,
):
    """One trace of ``model`` with every discrete latent site enumerated in parallel, each at a
    dim of its own left of the plates (with ``log_prob``, its log densities computed, masked
    and scaled as a contraction sees them); ``None`` when the model cannot be traced so (the
    later stages name that fault), or with ``partial`` the sites traced before it failed (a
    continuous site that reads a discrete one often makes a later site fail under
    enumeration). Blocked from outer handlers, quiet, without gradients."""
    enumerated = poutine.infer_config(model, parallel_enumeration)
    # a spare dim right of the enumeration dims, as the enumeration oracle's draws' plate:
    # the guard then tells them from the model's own dims as the oracle's does
    guard = EntriesGuard(MAX_ENUMERATED_ENTRIES, plate_dims=max_plate_nesting + 1)
    tracer = None
    try:
        with poutine.block(), quiet_warnings(), torch.no_grad(), guard:
            enum_model = poutine.enum(enumerated, first_available_dim=-(max_plate_nesting + 2))
            tracer = poutine.trace(enum_model)
            trace = tracer.get_trace(*args, **kwargs)
            if log_prob:
                trace.compute_log_prob()
    except Exception:  # noqa: BLE001 - reported with its cause by the enumeration oracle
        if partial and tracer is not None:
            return tracer.msngr.trace
        return None
    return trace


#: The most combinations of enumerated values one tensor may span in a run of the model under
#: parallel enumeration (a contraction step of more entries per query is refused too).
MAX_ENUMERATED_ENTRIES = 2**26


class EntriesGuard(TorchFunctionMode):
    """Raise :class:`TensorTooLarge` where a run of the model under parallel enumeration makes a
    tensor whose enumeration dims hold more than ``limit`` combinations, before torch
    allocates it where its operands' broadcast shape tells its size (elementwise operations,
    which is how coupled sites multiply out).

    Enumeration gives each discrete site a dim of its own left of the model's dims, so a term
    reading ``k`` coupled sites spans the product of their supports: ``2**30`` for thirty
    Bernoulli sites summed into one likelihood, which would fill the memory before any
    contraction could measure it. Only the dims left of the model's own count (plates, the
    draws' plate, event dims and any tensor of the model's that enumeration does not reach
    lie to their right), so large plates and large data are not limited.

    Parameters
    ----------
    limit : int
        Combinations of enumerated values allowed in one tensor.
    plate_dims : int
        How many rightmost dims of a batch are the model's (its plates, and the draws'
        plate): enumeration allocates dims left of them only.

    Examples
    --------
    >>> import torch
    >>> with EntriesGuard(limit=1000, plate_dims=1):
    ...     y = torch.zeros(40, 1, 1, 3) + torch.zeros(1, 50, 1, 3)  # 2,000 combinations
    Traceback (most recent call last):
    ...
    pyro_autospec.model.tracing.TensorTooLarge: a tensor of shape (40, 50, 1, 3)
    >>> with EntriesGuard(limit=1000, plate_dims=1):  # large, but in the model's dims
    ...     y = torch.zeros(4, 1, 10_000) + torch.zeros(1, 5, 10_000)
    """

    def __init__(self, limit: int, plate_dims: int):
        super().__init__()
        self.limit, self.plate_dims = limit, plate_dims
        #: The shape of the tensor refused, once one was (Pyro re-raises errors of a model
        #: run as their type with a longer message, so the error itself keeps only words).
        self.refused: tuple | None = None

    def combinations(self, shape) -> int:
        """The product of ``shape``'s dims left of the model's (enumeration dims)."""
        return math.prod(shape[: max(0, len(shape) - self.plate_dims)])

    def _check(self, shape) -> None:
        if self.combinations(shape) > self.limit:
            self.refused = tuple(shape)
            raise TensorTooLarge(f"a tensor of shape {self.refused}")

    def __torch_function__(self, func, types, args=(), kwargs=None):
        # every torch call of the model's run passes here: entry counts first (cheap), the
        # combinations of the operands' broadcast shape only where the entries are many
        limit, count, bound = self.limit, 0, 1
        for operand in (*args, *kwargs.values()) if kwargs else args:
            if isinstance(operand, torch.Tensor):
                count, bound = count + 1, bound * operand.numel()
        if count > 1 and bound > limit:
            self._check_operands(args, kwargs)
        out = func(*args, **kwargs) if kwargs else func(*args)
        for tensor in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(tensor, torch.Tensor) and tensor.numel() > limit:
                self._check(tensor.shape)
        return out

    def _check_operands(self, args, kwargs) -> None:
        """Refuse operands whose broadcast shape spans too many combinations (an elementwise
        call would allocate it)."""
        operands = (*args, *kwargs.values()) if kwargs else args
        shapes = [a.shape for a in operands if isinstance(a, torch.Tensor)]
        if math.prod(self.combinations(shape) for shape in shapes) <= self.limit:
            return
        try:
            shape = torch.broadcast_shapes(*shapes)
        except RuntimeError:  # not elementwise: its output tells
            return
        self._check(shape)


class TensorTooLarge(RuntimeError):
    """:class:`EntriesGuard` met a tensor over its limit (its shape is the guard's
    ``refused``)."""


class SiteRecorder(poutine.messenger.Messenger):
    """Remembers the sample sites seen so far, to name the site where a run failed.

    ``names``: every sample site in order; ``plated``: the unobserved enumerable (discrete)
    sites inside vectorized plates of the model, with their plates' names. ``latent``: names
    of the latent sites, where a run conditions them on values (they look observed then).
    ``current``: the last sample site whose message reached this handler; applied inside
    ``poutine.enum`` (wrapping the model), it names a site that enumeration refuses, since
    handlers inside see a message first.
    """

    def __init__(self, latent=None):
        super().__init__()
        self.names: list[str] = []
        self.plated: dict[str, list[str]] = {}
        self.latent = None if latent is None else set(latent)
        self.current: str | None = None
        self.markov: set[str] = set()  # sites inside a pyro.markov context

    def _pyro_sample(self, msg):
        if isinstance(msg["fn"], _Subsample):
            # a plate's indices already set here (subsample=, or poutine.condition on the
            # plate's name) are the same on every run: check_subsampling reads this mark
            msg["infer"] = {**(msg.get("infer") or {}), FIXED_SUBSAMPLE: msg["value"] is not None}
        if not msg["name"].startswith("_autospec"):
            self.current = msg["name"]

    def _pyro_post_sample(self, msg):
        if msg["name"].startswith("_autospec") or isinstance(msg["fn"], _Subsample):
            return
        self.names.append(msg["name"])
        if (msg.get("infer") or {}).get("_markov_scope") is not None:
            self.markov.add(msg["name"])
        observed = msg["is_observed"] if self.latent is None else msg["name"] not in self.latent
        if observed or not getattr(msg["fn"], "has_enumerate_support", False):
            return
        plates = [
            f.name
            for f in msg["cond_indep_stack"]
            if f.vectorized and f.dim is not None and f.name != DRAWS_PLATE
        ]
        if plates:
            self.plated[msg["name"]] = plates


_SIZE_MISMATCH = ("must match the size", "Shape mismatch", "shape mismatch", "size mismatch",
                  "cannot be broadcast", "broadcast")  # fmt: skip


def plated_reduction_advice(plated: dict[str, list[str]]) -> str:
    """Name the plated discrete sites and say why reducing one over its plate cannot work."""
    listed = ", ".join(
        f"'{name}' (plate {', '.join(repr(p) for p in plates)})"
        for name, plates in list(plated.items())[:3]
    )
    return (
        f"The discrete site(s) {listed} lie inside a plate; the usual cause is that one was "
        f"reduced over its plate (a.sum(-1), a.max(-1), a.prod(-1)) and combined with values "
        f"of another plate or of AutoSpec's extra batch dims (a batch of draws "
        f"left of the plates, and enumerated values, as in Pyro's enumeration). Under "
        f"enumeration all elements of a plated site share one dim, so nothing outside its "
        f"plate can read them one by one. Another cause is a parameter given a dim of its "
        f"own (x.unsqueeze(-1), x[..., None], a reshape) where a plate's dim or an "
        f"enumerated value's is expected: keep parameters in the sites' batch shape, "
        f"right-aligned with the plates. Ways out: compute what is needed inside that plate "
        f"from each element's own value; write the elements as separate sites; replace a sum "
        f"of Bernoulli elements by one Binomial count site; or use a learned guide, which needs "
        f"no enumeration: guide = AnyOrderGuide(model, args); guide.fit_posterior(*args); "
        f"AutoSpec(model, guide=guide, correction='imh')."
    )


def structure_error(
    error: Exception,
    seen: list[str],
    what: str,
    plated: dict[str, list[str]] | None = None,
    current: str | None = None,
    markov: set[str] | None = None,
) -> DynamicStructureError:
    """A :class:`DynamicStructureError` naming the last site reached before ``error``.

    Parameters
    ----------
    error : Exception
        What PyTorch or Pyro raised.
    seen : list of str
        Sites reached before the failure (from a :class:`SiteRecorder`).
    what : str
        The kind of run, e.g. ``"on a batch of draws"`` or ``"under enumeration"``.
    plated : dict, optional
        The discrete sites seen inside plates (:attr:`SiteRecorder.plated`), named when the
        error is a size mismatch (the usual sign of a plated site reduced over its plate).
    current : str, optional
        The site being sampled when the error came (:attr:`SiteRecorder.current` of a
        recorder inside ``poutine.enum``), named when enumeration refused it.
    markov : set of str, optional
        The sites seen inside a ``pyro.markov`` context (:attr:`SiteRecorder.markov`): a
        tensor that does not pack at a site outside them, after them, is read as a site after
        a markov loop that reads values sampled inside it.
    """
    last = f" (after site '{seen[-1]}')" if seen else ""
    reason = error_reason(error)
    plated = plated or {}
    if "Expected all tensors to be on the same device" in reason:
        return DynamicStructureError(
            f"Running the model {what} failed{last}: {reason}. The model mixes devices: the "
            f"values AutoSpec gives its discrete sites live on the device of its data (or the "
            f"device= asked for), and a tensor the model makes itself (a distribution's "
            f"parameter such as Bernoulli(0.5), a torch.tensor(...) constant) lives on the "
            f"default device. Make the model's tensors on its data's device "
            f"(torch.tensor(..., device=data.device)), or set torch.set_default_device(...) "
            f"before building and running the model."
        )
    if "can't be cast to the desired output type" in reason or "two bool tensors" in reason:
        return DynamicStructureError(
            f"Running the model {what} failed{last}: {reason}. A site's value has a dtype its "
            f"distribution cannot score (Pyro computes the log densities after the model has "
            f"run, so this need not be the last site): Bernoulli and Binomial observations "
            f"must be floating point, as in a plain Pyro run, whose log_prob_sum() fails the "
            f"same way. Pass the data as floats (y.float())."
        )
    if "within the support" in reason:
        return DynamicStructureError(
            f"Running the model {what} failed{last}: {reason}. An observed value lies outside "
            f"the support of its distribution for some value of an earlier discrete site (for "
            f"example a count larger than an enumerated Binomial total), so the model has no "
            f"density there. Restrict that site's support to the feasible values (e.g. a "
            f"Categorical over them) or mask the impossible terms with poutine.mask."
        )
    mismatch = re.search(
        r"Shape mismatch inside plate\('([^']+)'\) at site (\S+) dim (-?\d+)", reason
    )
    if mismatch and mismatch.group(1) == DRAWS_PLATE:
        _, site, dim = mismatch.groups()
        reason = reason.replace(f"plate('{DRAWS_PLATE}')", "AutoSpec's plate of draws")
        return DynamicStructureError(
            f"Running the model {what} failed{last}: {reason}. Site '{site}' has at dim {dim}, "
            f"the dim of AutoSpec's batch of draws (left of the model's plates), a size other "
            f"than the number of draws: a value it reads has lost a batch dim, so the plates' "
            f"dims shifted into the place of the draws. "
            + (
                plated_reduction_advice(plated)
                if plated
                else "The usual cause is a sampled value reduced over a plate (a.sum(-1)) and "
                "fed into another plate: compute it inside the plate of what it reads."
            )
        )
    if mismatch:
        plate, site, dim = mismatch.groups()
        return DynamicStructureError(
            f"Running the model {what} failed{last}: {reason}. Site '{site}' has at dim {dim}, "
            f"the dim of plate '{plate}', a size other than the plate's: a value it reads has "
            f"lost a batch dim, so AutoSpec's extra batch dims (a batch of draws left of the "
            f"plates, and enumerated values) shifted into the plate's place. The usual cause is "
            f"a plated site reduced over its plate and fed into another plate (a.sum(-1)). "
            f"Under enumeration a site outside a plate cannot read the elements of a discrete "
            f"site inside it at all: compute '{site}' inside the plate of what it reads, write "
            f"the elements as separate sites, or, for a sum of Bernoulli elements, sample one "
            f"Binomial count instead."
        )
    packing = re.search(
        r"packing tensors at site '([^']+)'.*Allowed dims: ([^\n]*)\n\s*Actual shape: ([^\n]*)",
        str(error),
        re.S,
    )
    if packing:
        site, allowed, shape = (part.strip() for part in packing.groups())
        if markov and site not in markov:
            return DynamicStructureError(
                f"Running the model {what} failed{last}: {reason} Site '{site}' has a tensor "
                f"of shape {shape}, where only dims {allowed} may have a size other than 1. "
                f"'{site}' comes after a pyro.markov loop: most likely it reads values sampled "
                f"inside the loop, whose enumeration dims markov recycles (Pyro's "
                f"TraceEnum_ELBO and infer_discrete fail here too). Sample it inside the loop's "
                f"last step, with a history that reaches back to every step it reads (a factor "
                f"closing a ring of T steps reads T - 1 steps back). Otherwise a value of a "
                f"discrete site was given a new dim (x.unsqueeze(-1), x[..., None], view, "
                f"reshape): let it broadcast from the right as it comes."
            )
        return DynamicStructureError(
            f"Running the model {what} failed{last}: {reason} Site '{site}' has a tensor of "
            f"shape {shape}, where only dims {allowed} may have a size other than 1 (the "
            f"model's plates, then AutoSpec's batch of draws and enumerated values on their "
            f"left). The usual cause is a value of a discrete site given a new dim "
            f"(x.unsqueeze(-1), x[..., None], view, reshape), which moves its batch and "
            f"enumeration dims left of where Pyro put them. Let a discrete site's value "
            f"broadcast from the right as it comes (in a plain run it has the site's own "
            f"shape, under enumeration extra dims on its left): write "
            f"dist.Poisson(x.float() + 0.5) rather than dist.Poisson(x.float().unsqueeze(-1) + "
            f"0.5) inside a plate, and use Vindex to index with it."
        )
    if "Inhomogeneous total count" in reason:
        who = (
            f"Site '{current}'" if current else f"The site after '{seen[-1]}'" if seen else "A site"
        )
        return DynamicStructureError(
            f"Running the model {what} failed{last}: {reason.rstrip('.')}. {who} is a count "
            f"(Binomial or BetaBinomial) whose total_count depends on the value of an earlier "
            f"discrete site, so its support changes with that value and Pyro cannot "
            f"enumerate it. Give it a fixed support and score the dependence instead: sample "
            f"the count as Binomial(max_count, p).mask(False) (or a Categorical over "
            f"0..max_count) and score the transition with an observed dist.ExtendedBinomial, "
            f"whose density is 0 outside the support, as reparameterized_discrete_model in "
            f"Pyro's examples/sir_hmc.py does; or condition the site with `poutine.condition`."
        )
    if plated and any(key in reason for key in _SIZE_MISMATCH):
        return DynamicStructureError(
            f"Running the model {what} failed{last}: {reason}. " + plated_reduction_advice(plated)
        )
    return DynamicStructureError(
        f"Running the model {what} failed{last}: {reason}. AutoSpec evaluates the model on "
        f"batched (and enumerated) values of its discrete sites, so the model must not branch "
        f"on their values with Python control flow (if/int()/.item()), nor reduce a sampled "
        f"value over a plate or batch dimension; use tensor operations (torch.where, Vindex, "
        f"poutine.mask, sums with keepdim=True over dimensions that are not plates) so its "
        f"structure is fixed. Nor may a site after a pyro.markov loop read a value sampled "
        f"inside it (markov recycles the loop's enumeration dims): sample such a site inside "
        f"the loop's last step."
    )


def _base(fn):
    """The distribution inside Pyro's wrappers (mask, to_event, expand)."""
    while type(fn).__name__ in ("MaskedDistribution", "Independent", "ExpandedDistribution"):
        fn = fn.base_dist
    return fn


def _is_custom(fn) -> bool:
    """A distribution class written outside Pyro and PyTorch (a user's own)."""
    module = type(_base(fn)).__module__ or ""
    return not module.startswith(("pyro.", "torch."))


def _custom_log_prob_error(name: str, fn, what: str, reason: str) -> AutoSpecModelError:
    fn = _base(fn)
    kind = type(fn).__name__
    return AutoSpecModelError(
        f"Site '{name}': the log_prob of its distribution {kind} (module "
        f"{type(fn).__module__}) {reason} when AutoSpec ran the model {what}. AutoSpec, like "
        f"Pyro's enumeration, evaluates every site on a batch of draws and on enumerated "
        f"values of the discrete sites, as extra batch dims left of the plates, so a "
        f"distribution's log_prob must broadcast over leading batch dims of its parameters and "
        f"of the value, and return their broadcast batch shape (use broadcasting arithmetic, "
        f"not reshape(-1), view, flatten or fixed dim indices). Check it with parameters "
        f"expanded by a leading dim: {kind}(param.expand(2, *param.shape)).log_prob(value)."
    )


def compute_log_prob(trace, what: str) -> None:
    """``trace.compute_log_prob()``, naming a user's distribution whose log_prob does not
    broadcast over the extra batch dims (it raises, or returns another shape)."""
    try:
        trace.compute_log_prob()
    except (RuntimeError, ValueError, TypeError, IndexError) as error:
        for name, site in trace.nodes.items():
            if site["type"] != "sample" or not _is_custom(site["fn"]):
                continue
            try:
                site["fn"].log_prob(site["value"])
            except (RuntimeError, ValueError, TypeError, IndexError) as inner:
                reason = f"raised '{error_reason(inner)}'"
                raise _custom_log_prob_error(name, site["fn"], what, reason) from error
        raise
    for name, site in trace.nodes.items():
        if site["type"] != "sample" or "unscaled_log_prob" not in site:
            continue
        fn, value = _base(site["fn"]), site["value"]  # Pyro's wrappers would expand it
        if not _is_custom(fn) or not torch.is_tensor(value):
            continue
        value_batch = value.shape[: value.dim() - len(fn.event_shape)]
        try:
            expected = torch.broadcast_shapes(fn.batch_shape, value_batch)
            actual = torch.as_tensor(fn.log_prob(value)).shape
        except (RuntimeError, ValueError, TypeError, IndexError):
            continue  # Pyro's wrappers evaluated it; nothing to compare
        if actual != expected:
            reason = (
                f"returned shape {tuple(actual)} for batch shape {tuple(fn.batch_shape)} and "
                f"value shape {tuple(value.shape)} (expected {tuple(expected)})"
            )
            raise _custom_log_prob_error(name, fn, what, reason)


def batching_advice(model: Callable, args: tuple, kwargs: dict) -> str:
    """How to make a model run on a batch of continuous draws: name the plates that share a dim.

    A continuous site in a plate (a mixture's ``components``) that shares its dim with the
    plate of the sites indexed by it (``data``) cannot batch: indexing consumes that dim, so
    the draws land on the other plate. Otherwise the usual cause is plain indexing.
    """
    try:
        trace = trace_model(model, args, kwargs)
    except Exception:  # noqa: BLE001 - only advice; the plain-indexing hint stands
        trace = None
    clashes, continuous = [], []
    if trace is not None:
        continuous = [
            name
            for name, site in trace.nodes.items()
            if site["type"] == "sample"
            and site_role(site) == "latent"
            and not site["fn"].support.is_discrete
        ]
        frames = {
            name: [f for f in site["cond_indep_stack"] if f.vectorized]
            for name, site in trace.nodes.items()
            if site["type"] == "sample"
        }
        for name in continuous:
            for frame in frames.get(name, ()):
                for other, other_frames in frames.items():
                    if other in continuous:
                        continue
                    for g in other_frames:
                        if g.dim == frame.dim and g.name != frame.name:
                            clashes.append((name, frame, other, g))
    if not clashes and trace is not None:
        # a continuous site in a plate that a discrete site is outside of (an HMM's transition
        # rows in a plate, indexed by the chain's state): indexing consumes the plate's dim
        discrete = {  # name -> number of values
            name: _support_size(site["fn"])
            for name, site in trace.nodes.items()
            if site["type"] == "sample"
            and site_role(site) == "latent"
            and site["fn"].support.is_discrete
        }
        for name in continuous:
            for frame in frames.get(name, ()):
                # a discrete site outside the plate, with as many values as the plate has
                # elements: the pattern of rows indexed by a state (no proof, hence "likely")
                outside = [
                    d
                    for d, size in discrete.items()
                    if frame not in frames.get(d, ()) and size == frame.size
                ]
                if outside:
                    return (
                        f"A likely cause: the continuous site '{name}' lives in plate "
                        f"'{frame.name}' (dim {frame.dim}), outside of which the discrete site "
                        f"'{outside[0]}' is sampled: indexing '{name}' by it consumes that "
                        f"dim, so a batch of draws of '{name}' moves onto it. To batch it, "
                        f"sample '{name}' as one site outside the plate, the plate's dim made "
                        f"an event dim: pyro.sample('{name}', <its distribution>.expand("
                        f"[{frame.size}]).to_event(1)) (for Dirichlet rows, "
                        f"dist.Dirichlet(torch.ones({frame.size}, K)).to_event(1)), and index "
                        f"it with Vindex({name})[..., {outside[0]}, :] or "
                        f"Vindex({name})[..., {outside[0]}]."
                    )
    if not clashes:
        return (
            "The usual causes: plain indexing by a sampled value (index with Vindex from "
            "pyro.ops.indexing or ellipses, e.g. Vindex(locs)[..., z] instead of locs[z]), or "
            "a dim added or dropped by hand on a sampled value (x[..., None], unsqueeze, view, "
            "a sum or matmul over a dim that a batch of draws shifts): let values broadcast "
            "from the right as they come."
        )
    name, frame, other, g = clashes[0]
    return (
        f"The continuous site '{name}' lives in plate '{frame.name}' (dim {frame.dim}), the same "
        f"dim as plate '{g.name}' of site '{other}': indexing '{name}' by a discrete site "
        f"consumes that dim, so a batch of draws of '{name}' lands on plate '{g.name}'. To "
        f"batch it, sample '{name}' as one vector site outside the plates, e.g. "
        f"pyro.sample('{name}', dist.Normal(0.0, 1.0).expand([{frame.size}]).to_event(1)), "
        f"and index it with Vindex({name})[..., z]."
    )


def _support_size(fn) -> int | None:
    """The number of values of a discrete distribution, where it enumerates them."""
    try:
        return int(fn.enumerate_support(expand=False).shape[0])
    except Exception:  # noqa: BLE001 - only advice: no support, no match
        return None


def _library_file(filename: str) -> str | None:
    """``"pyro"`` or ``"torch"`` where ``filename`` is a module of that library, else None."""
    path = os.path.realpath(filename)
    for module in (pyro, torch):
        root = os.path.dirname(os.path.realpath(module.__file__))
        if path.startswith(root + os.sep):
            return module.__name__
    return None


def assertion_error(
    error: AssertionError, seen: list[str], what: str, max_plate_nesting: int
) -> AutoSpecModelError:
    """An :class:`AutoSpecModelError` for an ``assert`` in the model that fails on the extra
    batch dims AutoSpec runs it with (the draws dim, and enumeration dims under enumeration).
    """
    last = f" after site '{seen[-1]}'" if seen else ""
    said = f" ({error})" if str(error) else ""
    draws = -(max_plate_nesting + 1)
    frames = traceback.extract_tb(error.__traceback__)
    library = _library_file(frames[-1].filename) if frames else None
    if library is not None and what == "under enumeration":
        return AutoSpecModelError(
            f"An assert inside {library} (not in the model's code) failed{said}{last} when "
            f"AutoSpec ran the model under enumeration, most likely because two sites' "
            f"enumerated values met on one tensor "
            f"dim. Common causes: one `with pyro.markov():` per step (sibling contexts reuse "
            f"the same dims: put the whole loop in one `for t in pyro.markov(range(T))`), or a "
            f"site that depends on a site further back than its pyro.markov history (raise "
            f"history=h to the longest lag), or a grid whose rows each open a fresh inner "
            f"pyro.markov loop that the next row reads (make one `columns = "
            f"pyro.markov(range(n), keep=True)` before the row loop and iterate it in every "
            f"row)."
        )
    return AutoSpecModelError(
        f"The model raised AssertionError{said}{last} when AutoSpec ran it {what}. AutoSpec "
        f"runs the model with extra batch dims left of its plates: one for a batch of draws "
        f"(dim {draws}) and, under enumeration, one per discrete site from dim {draws - 1} "
        f"leftwards, as Pyro's enumeration does (there, one dim further right). A shape assert "
        f"written for one draw fails there: assert on the rightmost dims (x.shape[-k:] == ...) "
        f"or on plate sizes, not on x.dim() or x.shape[0]. See 'Extra batch dims' in the "
        f"README."
    )


def error_reason(error: BaseException) -> str:
    r"""One line that says why ``error`` happened, looking through Pyro's wrappers.

    Pyro re-raises a distribution's error as ``"Error while computing log_prob at site 'c':"``
    followed by the real message on the next lines (and chains the original as ``__cause__``):
    keep the header and the first line of the real message.

    Examples
    --------
    >>> error_reason(ValueError("Error at site 'c':\nExpected value within the support"))
    "Error at site 'c': Expected value within the support"
    >>> error_reason(KeyError())
    'KeyError'
    """
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if not lines:
        cause = error.__cause__ or error.__context__
        return error_reason(cause) if cause is not None else type(error).__name__
    if lines[0].endswith(":"):
        detail = lines[1] if len(lines) > 1 else None
        if detail is None and (error.__cause__ or error.__context__) is not None:
            detail = error_reason(error.__cause__ or error.__context__)
        if detail:
            return f"{lines[0]} {_short(detail)}"
    return _short(lines[0])


def _short(line: str) -> str:
    """``line`` without the tensors torch prints after a support error."""
    cut = line.find("within the support")
    if cut >= 0:
        return line[: cut + len("within the support")]
    return line


def quiet_warnings():
    """A context that hides Pyro's harmless warnings about our internal plates."""
    context = warnings.catch_warnings()

    class _Quiet:
        def __enter__(self):
            context.__enter__()
            warnings.filterwarnings("ignore", message=".*was not registered.*")
            warnings.filterwarnings("ignore", message=".*not in guide.*")
            warnings.filterwarnings("ignore", message=".*plate.*guide.*")
            return self

        def __exit__(self, *exc):
            return context.__exit__(*exc)

    return _Quiet()
