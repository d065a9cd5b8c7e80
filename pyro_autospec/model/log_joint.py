"""The log joint ``log p(x, data)`` of a batch of draws of a model's latent sites, in one trace.

One function, :func:`evaluate`, serves every kind of latent site (discrete, continuous, or
both): the model runs inside a ``pyro.plate`` over draws at ``dim = -(max_plate_nesting + 1)``,
conditioned on the draws reshaped to ``(N,) + (1,) * pad + batch_shape + event_shape``. It
returns, per draw,

* ``total``: the sum of every site's **scaled and masked** log density (latent sites, observed
  sites and factors): the density the sampler targets, as ``pyro.infer.MCMC`` does;
* ``pointwise``: the log likelihood of every observed site, **masked but not scaled**, shaped
  like the site's batch (what ArviZ's ``log_likelihood`` group holds);
* ``deterministic``: the values of the ``pyro.deterministic`` sites (as ``Predictive`` returns
  them: ``[N, *value shape]``);
* ``magnitude``: the sum of the absolute values of all terms, from which callers derive float
  tolerances.

It does not use ``Predictive``, which silently draws latent sites missing from the given
samples from the prior and mis-reshapes the event dimensions of sites outside plates.
:func:`log_joint` (discrete layouts) and :func:`continuous_log_joint` (continuous layouts) are
thin wrappers; :func:`enumerate_posterior` is the brute-force reference of the tests.
"""

from __future__ import annotations

import math
import warnings
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import pyro
import torch
from pyro import poutine
from pyro.distributions.util import scale_and_mask
from pyro.poutine.util import prune_subsample_sites

from pyro_autospec._shapes import broadcast_shape
from pyro_autospec._warnings import user_stacklevel
from pyro_autospec.model.continuous import ContinuousLayout
from pyro_autospec.model.discrete import PlainRun, SiteLayout, discover_sites
from pyro_autospec.model.errors import AutoSpecModelError, DynamicStructureError, MixedDrawsError
from pyro_autospec.model.randomness import (
    HIDDEN_RANDOMNESS,
    Generators,
    HiddenRandomnessError,
    RandomUse,
)
from pyro_autospec.model.tracing import (
    DRAWS_PLATE,
    SiteRecorder,
    assertion_error,
    batching_advice,
    compute_log_prob,
    over_draws,
    plate_dims,
    plated_reduction_advice,
    quiet_warnings,
    scored_log_joint,
    site_role,
    structure_error,
)

__all__ = [
    "LogJoint",
    "SharedNumbersWarning",
    "continuous_log_joint",
    "enumerate_posterior",
    "evaluate",
    "log_joint",
]

_MIXED_DRAWS = (
    "The model cannot be evaluated on a batch of draws: a site's value loses the batch "
    "dimensions the model is run with, so draws mix. Usually a pyro.factor or a distribution "
    "parameter reduces over a plate dimension, as in (s[..., 1:] * s[..., :-1]).sum(-1): keep "
    "the dimension with .sum(-1, keepdim=True) so every value keeps its leading batch "
    "dimensions. Code that reduces or indexes a value as a whole (z.sum(), z.mean(), z.max(), "
    "z[0], z.reshape(-1)[0], z.item(), `if z.any():`) reads every draw at once, and every "
    "value enumeration gives the site too, so no exact sampler can use it: reduce and index "
    "along the site's own dims from the right (z.sum(-1), z[..., 0])."
)


@dataclass
class LogJoint:
    """The log joint of ``N`` draws, and what comes with it.

    Attributes
    ----------
    total : DoubleTensor[N]
        ``log p(x, data)``: every site's scaled, masked log density, summed.
    pointwise : dict of str -> ``DoubleTensor[N, *batch_shape]``
        Masked, unscaled log likelihood of every observed data site.
    deterministic : dict of str -> ``Tensor[N, *shape]``
        Values of the ``pyro.deterministic`` sites.
    magnitude : DoubleTensor[N]
        Sum of the absolute values of every term of ``total`` (for float tolerances).
    dtype : torch.dtype
        The lowest floating precision among the model's log densities.
    random : bool
        Whether the model drew from a global random generator while it was run on the given
        values (numbers no scored site reads, :mod:`~pyro_autospec.model.randomness`: its
        deterministic sites may then differ between two draws of one assignment).
    """

    total: torch.Tensor
    pointwise: dict = field(default_factory=dict)
    deterministic: dict = field(default_factory=dict)
    magnitude: torch.Tensor | None = None
    dtype: torch.dtype = torch.float64
    random: bool = False


def _draw_shape(batch_shape, event_shape, num_draws: int, mpn: int) -> tuple[int, ...]:
    pad = mpn - len(batch_shape)
    return (num_draws,) + (1,) * pad + tuple(batch_shape) + tuple(event_shape)


def _per_draw(value: torch.Tensor, shape: torch.Size, num_draws: int, name: str) -> torch.Tensor:
    """A batched run's value of a deterministic site as ``[N, *shape]``."""
    rank = len(shape)
    lead = value.shape[: value.dim() - rank] if value.dim() >= rank else torch.Size()
    if math.prod(lead) == num_draws:
        value = value.reshape((num_draws,) + tuple(value.shape[value.dim() - rank :]))
    elif math.prod(lead) == 1:
        value = value.reshape(tuple(value.shape[value.dim() - rank :])).unsqueeze(0)
    else:
        raise MixedDrawsError(
            f"Deterministic site '{name}' has shape {tuple(value.shape)} in a batch of "
            f"{num_draws} draws, which does not split into draws of shape {tuple(shape)}. "
            + _MIXED_DRAWS
        )
    try:
        return value.expand((num_draws,) + tuple(shape))
    except RuntimeError as e:
        raise MixedDrawsError(
            f"Deterministic site '{name}' has shape {tuple(value.shape[1:])} per draw in a batch "
            f"but {tuple(shape)} alone. " + _MIXED_DRAWS
        ) from e


def _check_declared_dims(name, site, log_prob, plain_shape, plated) -> None:
    """A site's log density in the batched run may grow only on the draws' dim.

    A dim of size > 1 that the plain run's batch shape ``plain_shape`` does not have and no
    plate around the site declares is a value that lost a batch dim in the batched run: a
    plated site reduced over its plate (``a.sum(-2)``) moves the draws onto another dim.
    """
    declared = plate_dims(site)
    plain = tuple(plain_shape)
    for dim in range(-log_prob.dim(), 0):
        if log_prob.shape[dim] == 1 or dim in declared:
            continue
        if -dim <= len(plain) and plain[dim] == log_prob.shape[dim]:
            continue
        plates = ", ".join(
            f"'{f.name}' (dim {f.dim})"
            for f in site["cond_indep_stack"]
            if f.vectorized and f.dim is not None and f.name != DRAWS_PLATE
        )
        inside = f"inside plate(s) {plates}" if plates else "outside every plate"
        raise DynamicStructureError(
            f"Site '{name}' ({inside}) has, in a run on a batch of draws, a log density of shape "
            f"{tuple(log_prob.shape)} whose dim {dim} (size {log_prob.shape[dim]}) no plate "
            f"around it declares, although a plain run of the model has none: a value it reads "
            f"lost a batch dim, so AutoSpec's batch of draws (a plate left of the model's "
            f"plates) shifted onto dim {dim}. "
            + (
                plated_reduction_advice(plated)
                if plated
                else "The usual cause is a sampled value reduced over its plate (a.sum(-1)) "
                "and fed into a site outside that plate: compute it inside the plate."
            )
        )


@dataclass(frozen=True)
class _Evaluation:
    """What every batched trace of one :func:`evaluate` call shares: the model and its
    arguments, the latent sites' shapes, the plate depth, and the observed and deterministic
    sites to return."""

    model: Callable
    args: tuple
    kwargs: dict
    shapes: Mapping[str, tuple[torch.Size, torch.Size]]
    max_plate_nesting: int
    observed_shapes: Mapping[str, torch.Size]
    deterministic_shapes: Mapping[str, torch.Size]
    #: The watch of the runs for random numbers no visible site records (shared by
    #: :meth:`only_latent`'s copies)
    random_use: RandomUse = field(default_factory=RandomUse, compare=False)

    def only_latent(self) -> _Evaluation:
        """The same evaluation returning no pointwise or deterministic values."""
        return replace(self, observed_shapes={}, deterministic_shapes={})


def _run_chunk(job: _Evaluation, values, n: int, unbatched: bool = False) -> LogJoint:
    """One batched trace of ``n`` draws (``values``: ``name -> Tensor[n, ...]``); with
    ``unbatched``, one draw in the model's own shapes."""
    model, args, kwargs, shapes = job.model, job.args, job.kwargs, job.shapes
    mpn = job.max_plate_nesting
    observed_shapes, deterministic_shapes = job.observed_shapes, job.deterministic_shapes
    data = {}
    for name, (batch_shape, event_shape) in shapes.items():
        value = torch.as_tensor(values[name])
        if tuple(value.shape[1:]) != tuple(batch_shape) + tuple(event_shape):
            raise ValueError(
                f"values['{name}'] has shape {tuple(value.shape)}, expected "
                f"(N,) + {tuple(batch_shape) + tuple(event_shape)}"
            )
        if unbatched:  # one draw, in the model's own shapes (a plate of size 1 around it)
            data[name] = value[0]
        else:
            data[name] = value.reshape(_draw_shape(batch_shape, event_shape, n, mpn))

    batched = over_draws(model, n, mpn)

    def run():
        recorder = SiteRecorder(latent=data)
        try:
            # no autograd graph: every output is detached, so the graph of a pyro.param's
            # uses and Pyro's NaN hooks on it would only cost time
            with poutine.block(), recorder, quiet_warnings(), torch.no_grad():
                run_trace = poutine.trace(poutine.condition(batched, data=data))
                run_trace = prune_subsample_sites(run_trace.get_trace(*args, **kwargs))
                compute_log_prob(run_trace, "on a batch of draws")
        except (RuntimeError, ValueError, TypeError, IndexError) as e:
            raise structure_error(e, recorder.names, "on a batch of draws", recorder.plated) from e
        except AssertionError as e:
            raise assertion_error(e, recorder.names, "on a batch of draws", mpn) from e
        return run_trace, recorder

    with job.random_use.watching(data, lambda: run()[0]):
        trace, recorder = run()

    device = None
    total = magnitude = None
    pointwise, deterministic = {}, {}
    dtype = torch.float64
    seen = set()
    for name, site in trace.nodes.items():
        if site["type"] != "sample":
            continue
        role = site_role(site)
        if role == "deterministic":
            if name in deterministic_shapes:
                deterministic[name] = _per_draw(
                    site["value"].detach(), deterministic_shapes[name], n, name
                )
            continue
        seen.add(name)
        if not site["is_observed"] and name not in shapes:
            raise DynamicStructureError(
                f"Site '{name}' is latent in the batched run of the model but was not found when "
                f"the model was first traced: the model's structure depends on random values. "
                f"AutoSpec needs a fixed set of sites."
            )
        raw = site["log_prob"].detach()
        plain = observed_shapes.get(name, shapes[name][0] if name in shapes else None)
        if plain is not None:
            _check_declared_dims(name, site, raw, plain, recorder.plated)
        if raw.is_floating_point() and torch.finfo(raw.dtype).eps > torch.finfo(dtype).eps:
            dtype = raw.dtype
        lp = raw.to(torch.float64)
        if device is None:
            device = lp.device
            total = torch.zeros(n, dtype=torch.float64, device=device)
            magnitude = torch.zeros(n, dtype=torch.float64, device=device)
        try:
            full = broadcast_shape(lp.shape, (n,) + (1,) * mpn)
        except RuntimeError as e:
            raise MixedDrawsError(f"Site '{name}': " + _MIXED_DRAWS) from e
        lp = lp.expand(full)
        if lp.shape[0] != n:
            raise MixedDrawsError(f"Site '{name}': " + _MIXED_DRAWS)
        total = total + lp.reshape(n, -1).sum(-1)
        magnitude = magnitude + lp.abs().reshape(n, -1).sum(-1)
        if name in observed_shapes:
            unscaled = scale_and_mask(site["unscaled_log_prob"].detach(), mask=site["mask"])
            unscaled = unscaled.to(torch.float64)
            shape = tuple(observed_shapes[name])
            target = (n,) + (1,) * (mpn - len(shape)) + shape
            pointwise[name] = unscaled.expand(target).reshape((n,) + shape)
    missing = set(shapes) - seen
    if missing:
        raise DynamicStructureError(
            f"Site '{sorted(missing)[0]}' was not sampled in the batched run of the model: the "
            f"model's structure depends on random values. AutoSpec needs a fixed set of sites."
        )
    if total is None:
        total = torch.zeros(n, dtype=torch.float64)
        magnitude = torch.zeros(n, dtype=torch.float64)
    return LogJoint(total, pointwise, deterministic, magnitude, dtype)


def evaluate(
    model: Callable,
    args: tuple,
    kwargs: dict | None,
    values: Mapping[str, torch.Tensor],
    shapes: Mapping[str, tuple[torch.Size, torch.Size]],
    max_plate_nesting: int,
    *,
    observed_shapes: Mapping[str, torch.Size] | None = None,
    deterministic_shapes: Mapping[str, torch.Size] | None = None,
    chunk_size: int = 4096,
    check_mixing: bool = True,
    per_draw_fallback: bool = False,
    plain_runs: Sequence[PlainRun] = (),
) -> LogJoint:
    """Evaluate the model on ``N`` draws of its latent sites in batched traces.

    Parameters
    ----------
    model : callable
    args, kwargs
        The model's arguments (data included).
    values : dict
        ``name -> Tensor[N, *batch_shape, *event_shape]`` for every latent site.
    shapes : dict
        ``name -> (batch_shape, event_shape)`` of every latent site (from one unbatched trace).
    max_plate_nesting : int
        The model's plate and batch depth; the draws go one dimension further left.
    observed_shapes : dict, optional
        ``name -> batch_shape`` of the observed sites whose pointwise log likelihood to return.
    deterministic_shapes : dict, optional
        ``name -> value shape`` of the deterministic sites to return. One whose random numbers
        the draws of a batch would share (``torch.randn(())``) is evaluated one draw at a
        time, with a warning, so that each draw has numbers of its own.
    chunk_size : int
        Draws per trace.
    check_mixing : bool
        Raise :class:`~pyro_autospec.model.errors.MixedDrawsError` if the batch changed a
        draw's log joint: a model whose values lose the draws' dimension, or that reduces or
        indexes a value as a whole (``z.sum()``, ``z[0]``), mixes draws. ``plain_runs`` join
        the first batch and are compared with their log joint alone; up to
        ``ALONE_CHECKS`` draws (the first, the one most unlike it, others spread over the
        batch) are scored again each in its own shapes: ``ALWAYS_ALONE`` traced alone, the
        others in one run of the model under :func:`torch.func.vmap` (``_unsettled``). A
        draw that is not settled so is traced alone.
    per_draw_fallback : bool
        If the model cannot run on a batch of draws (for example ``locs[z]`` with ``locs``
        batched), evaluate it one draw at a time, in its own shapes, with a warning.
    plain_runs : sequence of PlainRun
        Plain runs of the model on the same data, from
        :attr:`~pyro_autospec.model.discrete.SiteLayout.plain_runs`: assignments seen alone
        already, which the check for mixing adds to its own. Only their discrete latent sites
        are read: pass them only where those are all of ``values``' sites. A plain run on
        other data costs a trace of one draw alone, and raises nothing.

    Returns
    -------
    LogJoint

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> def model():
    ...     z = pyro.sample("z", dist.Bernoulli(0.25))
    ...     pyro.deterministic("twice", 2 * z)
    ...     pyro.sample("y", dist.Bernoulli(0.5 + 0.25 * z), obs=torch.tensor(1.0))
    >>> out = evaluate(model, (), {}, {"z": torch.tensor([0.0, 1.0])},
    ...                {"z": (torch.Size(), torch.Size())}, 0,
    ...                observed_shapes={"y": torch.Size()}, deterministic_shapes={"twice": ()})
    >>> out.total.exp()
    tensor([0.3750, 0.1875], dtype=torch.float64)
    >>> out.deterministic["twice"]
    tensor([0., 2.])
    """
    kwargs = {} if kwargs is None else kwargs
    observed_shapes = {} if observed_shapes is None else dict(observed_shapes)
    deterministic_shapes = {} if deterministic_shapes is None else dict(deterministic_shapes)
    shapes = OrderedDict((k, (torch.Size(b), torch.Size(e))) for k, (b, e) in shapes.items())
    if not shapes:
        raise ValueError("evaluate needs at least one latent site")
    first = next(iter(shapes))
    num_draws = int(torch.as_tensor(values[first]).shape[0])
    job = _Evaluation(
        model, args, kwargs, shapes, max_plate_nesting, observed_shapes, deterministic_shapes
    )
    try:
        out = _evaluate_batched(job, values, chunk_size, check_mixing, num_draws, plain_runs)
    except AutoSpecModelError as error:
        if not per_draw_fallback or isinstance(error, HiddenRandomnessError):
            raise  # no evaluation one draw at a time can help
        reason = str(error).split(". ")[0]
    else:
        if out.random and out.deterministic and num_draws > 1:
            out = _own_numbers(job, values, out, num_draws)
        return out
    warnings.warn(
        f"The model does not evaluate on a batch of draws ({reason}); AutoSpec evaluated it "
        f"one draw at a time ({num_draws} traces). " + batching_advice(model, args, kwargs or {}),
        UserWarning,
        stacklevel=user_stacklevel(),
    )
    parts = [
        _run_chunk(
            job,
            {name: torch.as_tensor(values[name])[i : i + 1] for name in shapes},
            1,
            unbatched=True,
        )
        for i in range(num_draws)
    ]
    return replace(_concatenate(parts), random=job.random_use.moved)


class SharedNumbersWarning(UserWarning):
    """Deterministic sites whose random numbers the draws of a batch shared were evaluated
    one draw at a time (:func:`_own_numbers`)."""


#: Copies of each probed draw in the batch that finds shared random numbers, and reseeded runs
#: of it (:func:`_own_numbers`): numbers of a draw's own agree across all copies by chance
#: with probability at most ``2 ** -((SHARED_COPIES - 1) * SHARED_RUNS)`` for a fair coin.
SHARED_COPIES = 8
SHARED_RUNS = 3


def _own_numbers(job: _Evaluation, values, out: LogJoint, num_draws: int) -> LogJoint:
    """``out`` with its deterministic sites evaluated again one draw at a time where random
    numbers the draws of a batch share reach one of them (``torch.randn(())``, a latent site
    hidden from the batch's plate), so that every draw has numbers of its own, as in Pyro's
    ``MCMC``. All of them are evaluated again, so that sites that read one another stay
    consistent.

    The probe: :data:`SHARED_COPIES` copies of each of the draws :func:`_rows_to_check`
    picks, in one batch, run :data:`SHARED_RUNS` times with the global generators seeded
    afresh (and restored after). A site shares its numbers where every copy of a draw gets
    the same value in every run, while that value changes from run to run. Numbers of low
    entropy (a shared coin that lands alike in every run) and shared numbers beside numbers
    of each draw's own (``torch.randn(()) + torch.randn(z.shape)``) are not told apart.
    """
    rows = _rows_to_check(job, values, num_draws)
    batch = {
        name: torch.as_tensor(values[name])[rows].repeat_interleave(SHARED_COPIES, 0)
        for name in job.shapes
    }
    cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    runs = []
    with Generators(cuda).restored():
        for seed in range(1, SHARED_RUNS + 1):
            Generators.seed(seed)
            runs.append(_run_chunk(job, batch, len(rows) * SHARED_COPIES).deterministic)
    shared = [name for name in out.deterministic if _shared(runs, name, len(rows))]
    if not shared:
        return out
    warnings.warn(
        f"pyro.deterministic site(s) {shared} read random numbers that the draws of a batch "
        f"share (drawn with a shape of their own, such as torch.randn(()), or by a latent site "
        f"hidden from the batch): AutoSpec evaluated the deterministic sites one draw at a "
        f"time ({num_draws} traces), so that each draw has numbers of its own, as in Pyro's "
        f"MCMC. Draw them with a shape that broadcasts with the sites they go with "
        f"(torch.randn(z.shape)), or compute them afterwards with pyro.infer.Predictive.",
        SharedNumbersWarning,
        stacklevel=user_stacklevel(),
    )
    parts = [
        _run_chunk(
            replace(job, observed_shapes={}),
            {name: torch.as_tensor(values[name])[i : i + 1] for name in job.shapes},
            1,
            unbatched=True,
        ).deterministic
        for i in range(num_draws)
    ]
    deterministic = {
        name: torch.cat([part[name] for part in parts]).to(value.device)
        for name, value in out.deterministic.items()
    }
    return replace(out, deterministic=deterministic)


def _shared(runs: list[dict], name: str, num_rows: int) -> bool:
    """Whether some probed draw has one value of site ``name`` across all its copies in every
    run, and another from run to run."""
    per_run = [run[name].reshape(num_rows, SHARED_COPIES, -1) for run in runs]
    for row in range(num_rows):
        values = [value[row] for value in per_run]
        alike = all(bool((value == value[:1]).all()) for value in values)
        if alike and any(not torch.equal(values[0], value) for value in values[1:]):
            return True
    return False


def _concatenate(parts: list) -> LogJoint:
    return LogJoint(
        total=torch.cat([p.total for p in parts]),
        pointwise={k: torch.cat([p.pointwise[k] for p in parts]) for k in parts[0].pointwise},
        deterministic={
            k: torch.cat([p.deterministic[k] for p in parts]) for k in parts[0].deterministic
        },
        magnitude=torch.cat([p.magnitude for p in parts]),
        dtype=min((p.dtype for p in parts), key=lambda d: -torch.finfo(d).eps),
    )


def _evaluate_batched(
    job: _Evaluation,
    values,
    chunk_size: int,
    check_mixing: bool,
    num_draws: int,
    plain_runs: Sequence[PlainRun] = (),
) -> LogJoint:
    check = check_mixing and num_draws > 1
    plain = list(plain_runs) if check else []
    if plain:  # rows 0 .. len(plain) - 1 of the first batch
        values = _with_plain_runs(job, values, plain)
    total_rows = num_draws + len(plain)
    parts, start = [], 0
    while start < total_rows:  # the first chunk holds the plain runs too
        stop = min(start + chunk_size + (len(plain) if start == 0 else 0), total_rows)
        chunk = {name: torch.as_tensor(values[name])[start:stop] for name in job.shapes}
        try:
            parts.append(_run_chunk(job, chunk, stop - start))
        except RuntimeError as e:  # shapes of the batched run do not line up
            raise MixedDrawsError(_MIXED_DRAWS + f" (PyTorch said: {e})") from e
        start = stop
    out = _concatenate(parts)
    if check:
        size = min(chunk_size, num_draws) + len(plain)
        _check_plain_runs(job, values, out, plain, size)
        rows = _rows_to_check(job, values, total_rows, skip=len(plain))
        for row in _unsettled(job, values, out, rows):
            _check_alone(job, values, out, row, size)
        out = _drop_rows(out, len(plain))
    return replace(out, random=job.random_use.moved)


def _with_plain_runs(job: _Evaluation, values, plain: list[PlainRun]) -> dict:
    """``values`` with the plain runs' values as their first rows."""
    out = {}
    for name in job.shapes:
        value = torch.as_tensor(values[name])
        runs = [run.values[name].to(value.device, value.dtype) for run in plain]
        out[name] = torch.cat([torch.stack(runs), value])
    return out


def _drop_rows(joint: LogJoint, first: int) -> LogJoint:
    """``joint`` without its first ``first`` rows."""
    if not first:
        return joint
    return replace(
        joint,
        total=joint.total[first:],
        pointwise={k: v[first:] for k, v in joint.pointwise.items()},
        deterministic={k: v[first:] for k, v in joint.deterministic.items()},
        magnitude=joint.magnitude[first:],
    )


def _check_plain_runs(
    job: _Evaluation, values, batched: LogJoint, plain: list[PlainRun], size: int
) -> None:
    """Compare the plain runs (rows ``0 .. len(plain) - 1``) with their log joint in the
    batch: more assignments seen alone, at no cost but their rows.

    A plain run whose log joint in the batch is not its own within rounding is traced alone
    (:func:`_check_alone`, which raises for a model that mixes draws or draws hidden random
    numbers, and passes rounding). The plain runs are prior draws under a fixed seed, often
    alike: they add to the draws traced alone (:func:`_rows_to_check`), and stand for none
    of them. A model that catches its own error on a batch (``try: int(z)``) and gives one
    value a log joint of its own is found only where that value is seen alone.
    """
    for row, run in enumerate(plain):
        if not _same(run.log_joint, float(batched.total[row]), _alone_tolerance(batched, row)):
            _check_alone(job, values, batched, row, size)


def _same(x: float, y: float, tolerance: float) -> bool:
    """Two log joints within rounding, or the same infinity."""
    return abs(x - y) <= tolerance or (math.isinf(x) and x == y)


#: How many draws of a batch are scored again each in its own shapes (under vmap) to find a
#: model that mixes draws.
ALONE_CHECKS = 4
#: How many of them are always traced alone: the first draw and the one most unlike it
#: (``_unsettled``).
ALWAYS_ALONE = 2


def _rows_to_check(job: _Evaluation, values, num_rows: int, skip: int = 0) -> list[int]:
    """The draws scored again alone to find a model that mixes the draws of a batch: among
    the rows from ``skip`` on (the rows before are plain runs), the first, the one whose
    values differ from the first's in most elements, and others spread over them,
    :data:`ALONE_CHECKS` in all at most.

    A value reduced over the whole batch (``z.sum()``, ``z.max()``, ``if z.any():``) or
    indexed along the draws (``z[0]``, ``z.reshape(-1)[0]``) gives every draw the same
    number: the first row's own, or the other's, or neither's, but not both's where their
    values differ. A term that reads such a number only on some values (``z.sum() == 2``)
    shows on a draw of those values, which the draws spread over a batch of distinct
    assignments (sorted, with the self-check's uniform probes) are likely to include.
    """
    differ = sum(
        (torch.as_tensor(values[name])[skip:] != torch.as_tensor(values[name])[skip : skip + 1])
        .reshape(num_rows - skip, -1)
        .sum(-1)
        for name in job.shapes
    )
    most = skip + int(differ.argmax())  # one host read
    spread = torch.linspace(skip, num_rows - 1, ALONE_CHECKS).round().long().tolist()
    return list(dict.fromkeys([skip, most, *spread]))[:ALONE_CHECKS]


def _alone_tolerance(batched: LogJoint, row: int) -> float:
    """The rounding a draw's log joint may show between two routines: ``64 eps`` of its
    summed magnitudes, in the model's dtype."""
    return 64 * torch.finfo(batched.dtype).eps * (1.0 + float(batched.magnitude[row]))


def _unsettled(job: _Evaluation, values, batched: LogJoint, rows: list[int]) -> list[int]:
    """The draws of ``rows`` whose log joint alone is still to be compared with the batch's.

    The first :data:`ALWAYS_ALONE` of ``rows`` (the first draw and the one most unlike it)
    are always traced alone. The others are first run once, all together, under
    :func:`torch.func.vmap`, each in its own shapes: vmap runs the model's code once, but
    every tensor operation sees one draw, so a value reduced or indexed over the batch
    (``z.sum()``, ``z[0]``) is the draw's own, as in a trace of the draw alone. A draw whose
    vmapped log joint is the batch's, within rounding, is settled. Any other draw, and every
    draw where the model cannot run under vmap (random numbers, ``.item()``, a branch on a
    tensor's value, a dim torch's vmap cannot place: any exception) is left to
    :func:`_check_alone` too. vmap cannot stand in for every trace: ``int(z)`` fails on a
    batch and under vmap alike, and a model that catches that error takes the same branch
    in both, while a draw traced alone takes another; and a model that keeps state between
    calls shows it in one run at most. The draws traced alone, and the plain runs
    (:func:`_check_plain_runs`), catch both.
    """
    always, rest = list(rows[:ALWAYS_ALONE]), list(rows[ALWAYS_ALONE:])
    if not rest:
        return always
    try:
        scores = _scores_under_vmap(job, values, rest)
    except Exception:  # noqa: BLE001 - every draw to its own trace, which raises the model's
        return always + rest  # own errors; torch's vmap raises many kinds of error of its own
    for row, score in zip(rest, scores.tolist(), strict=True):
        if not _same(score, float(batched.total[row]), _alone_tolerance(batched, row)):
            always.append(row)
    return always


def _scores_under_vmap(job: _Evaluation, values, rows: list[int]) -> torch.Tensor:
    """``log p(x, data)`` of the draws ``rows``, each in the model's own shapes, in one run
    of the model under :func:`torch.func.vmap` (validation off: the batch was validated)."""
    model, args, kwargs = job.model, job.args, job.kwargs
    index = torch.tensor(rows)
    stacked = {name: torch.as_tensor(values[name])[index] for name in job.shapes}

    def score(one: dict) -> torch.Tensor:
        with poutine.block(), quiet_warnings():
            trace = poutine.trace(poutine.condition(model, data=one)).get_trace(*args, **kwargs)
            trace = prune_subsample_sites(trace)
            trace.compute_log_prob()
        return scored_log_joint(trace)

    with pyro.validation_enabled(False), torch.no_grad():
        scores = torch.func.vmap(score, randomness="error")(stacked)
    if scores.shape != (len(rows),):
        raise RuntimeError(f"vmap returned scores of shape {tuple(scores.shape)}")
    return scores


def _score_again(job: _Evaluation, values, n: int) -> LogJoint:
    """The log joint of values the batch scored already, in a trace of ``n`` draws of its
    own; validation off (the batch validated these values), which spares a third of a
    trace's time on models of many sites."""
    with pyro.validation_enabled(False):
        return _run_chunk(job.only_latent(), values, n)


def _check_alone(job: _Evaluation, values, batched: LogJoint, row: int, size: int) -> None:
    """Raise if the draw ``row`` evaluated alone has another log joint than in the batch
    (of ``size`` draws per trace).

    A gap within rounding of the model's dtype (``64 eps`` of the draw's summed magnitudes)
    passes. A gap past ``sqrt(eps)`` of them is the model's: mixed draws (the prior term
    dropped, a factor read from another draw) move a log joint by a fraction of a unit. In
    between, the gap may be rounding of another routine (a float32 matrix product over a
    batch and over one row, under a sharp likelihood): the draw is scored again in a batch of
    ``size`` copies of itself, the batch's routine, and passes where its score there is the
    batch's, so that the other draws' values do not reach it.
    """
    one = {name: torch.as_tensor(values[name])[row : row + 1] for name in job.shapes}
    alone = _score_again(job, one, 1)
    eps = torch.finfo(batched.dtype).eps
    scale = 1.0 + float(batched.magnitude[row])
    tolerance = _alone_tolerance(batched, row)

    def same(x: float, y: float) -> bool:
        return _same(x, y, tolerance)

    a, b = float(alone.total[0]), float(batched.total[row])
    if same(a, b):
        return
    again = float(_score_again(job, one, 1).total[0])
    if not same(again, a):
        raise HiddenRandomnessError(
            f"log p(x, data) of one draw is {a:.6g}, then {again:.6g} when the model "
            f"is run again on the same values: {HIDDEN_RANDOMNESS}."
        )
    if abs(a - b) < math.sqrt(eps) * scale:
        copies = {k: v.expand(size, *v.shape[1:]).contiguous() for k, v in one.items()}
        own = float(_score_again(job, copies, size).total[0])
        if same(own, b):
            return  # rounding of the batch's routine against the one draw's
    raise MixedDrawsError(
        f"log p(x, data) of one draw is {a:.6g} alone but {b:.6g} in a batch. "
        + _MIXED_DRAWS
        + " If no value is reduced so, the model may draw random numbers shaped like "
        "its batch, the same on every run (under poutine.seed, or from a generator of "
        f"its own): {HIDDEN_RANDOMNESS}."
    )


def data_device(args: tuple, kwargs: Mapping | None = None) -> torch.device:
    """The device of the model's data: that of the first tensor in ``args`` then ``kwargs``
    (looking into tuples, lists and dicts), else the CPU.

    Values built elsewhere (a grid of every assignment, a guide's probes) go there, so that a
    model whose data lives on a GPU sees its latent values on the same device.

    >>> data_device((1.0, [torch.zeros(2)]), {})
    device(type='cpu')
    """
    stack = [args, kwargs or {}]
    while stack:
        value = stack.pop(0)
        if isinstance(value, torch.Tensor):
            return value.device
        if isinstance(value, (tuple, list)):
            stack[:0] = list(value)
        elif isinstance(value, Mapping):
            stack[:0] = list(value.values())
    return torch.device("cpu")


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
    """``log p(x, data)`` of a batch of assignments of a layout's latent sites.

    Parameters
    ----------
    model : callable
    args, kwargs
        The model's arguments.
    layout : SiteLayout
        From :func:`~pyro_autospec.model.discrete.discover_sites`.
    values : dict
        ``name -> Tensor[N, *site.shape]`` for every discrete site of ``layout`` (and every
        continuous one, for a mixed layout).
    pointwise : bool
        Also return the pointwise log likelihood of every observed site.
    chunk_size : int
        Draws per trace.

    Returns
    -------
    log_prob : DoubleTensor[N]
        The sum of every site's scaled, masked log prob (latent sites, observed sites and
        factors).
    pointwise : dict, only if ``pointwise=True``
        ``name -> DoubleTensor[N, *batch_shape]`` for each observed site (masked, unscaled).

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
    shapes = layout.latent_shapes()
    typed = {}
    for name, value in values.items():
        value = torch.as_tensor(value)
        site = next((s for s in layout.sites if s.name == name), None)
        typed[name] = value.to(site.dtype) if site is not None else value
    out = evaluate(
        model,
        args,
        kwargs,
        typed,
        shapes,
        layout.max_plate_nesting,
        observed_shapes=layout.observed_batch_shapes if pointwise else None,
        chunk_size=chunk_size,
    )
    if not pointwise:
        return out.total
    return out.total, out.pointwise


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
        ``name -> DoubleTensor[N, *batch_shape]`` for each observed site (masked, unscaled).

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> from pyro_autospec.model.continuous import discover_continuous_sites
    >>> def model():
    ...     pyro.sample("x", dist.Normal(0.0, 1.0))
    >>> layout = discover_continuous_sites(model)
    >>> continuous_log_joint(model, (), {}, layout, {"x": torch.zeros(2)})
    tensor([-0.9189, -0.9189], dtype=torch.float64)
    """
    shapes = OrderedDict()
    for site in layout.sites:
        rank = len(site.shape) - site.event_dim
        shapes[site.name] = (torch.Size(site.shape[:rank]), torch.Size(site.shape[rank:]))
    observed = {}
    if pointwise:
        for site in layout.data:
            observed[site.name] = (
                site.batch_shape if site.batch_shape is not None else torch.Size(site.shape)
            )
    with torch.no_grad():
        out = evaluate(
            model,
            args,
            kwargs,
            values,
            shapes,
            layout.max_plate_nesting,
            observed_shapes=observed,
            check_mixing=False,
        )
    if not pointwise:
        return out.total
    return out.total, out.pointwise


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
    values = layout.from_coords(states.to(data_device(args, kwargs)))
    lp = log_joint(model, args, kwargs, layout, values).cpu()
    return states, lp - lp.logsumexp(0)
