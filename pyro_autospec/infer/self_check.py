"""The runtime self-check of exact draws: ``log p(x, data) - log q(x)`` is one constant.

For an exact oracle ``q(x) = p(x, data) / Z``, so the difference is ``log Z`` for every draw of
a run. :func:`check_exact_draws` tests one batch within a rounding tolerance;
:class:`SelfCheck` pools every draw of a run (all chains, or all engine runs of
``AutoSpecKernel``) before testing; :class:`SelfCheckError` is what a failure raises.

Draws compared only with each other cannot show an oracle that leaves out part of the
posterior: ``q(x) = p(x, data) / Z_S`` on a subset ``S`` of the values gives the one constant
``log Z_S`` on every draw. Where the model's discrete sites can be eliminated exactly and
enumerating them is cheap, :func:`reference_log_normalizer` gives ``log Z`` itself, and an
oracle passed as ``oracle=`` is checked against it (so is a single draw).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from pyro_autospec.model.enum import EnumOracle
from pyro_autospec.model.ffbs import plan_ffbs
from pyro_autospec.model.tracing import trace_model

__all__ = [
    "MAX_REFERENCE_ENTRIES",
    "SelfCheck",
    "SelfCheckError",
    "check_exact_draws",
    "enumeration_bound",
    "reference_for",
    "reference_log_normalizer",
]


class SelfCheckError(RuntimeError):
    """``log p(x, data) - log q(x)`` was not constant across draws of an exact oracle."""


def _eps(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).eps) if dtype.is_floating_point else 0.0


def check_exact_draws(
    log_joint: torch.Tensor,
    oracle_log_prob: torch.Tensor,
    magnitude: torch.Tensor,
    dtype: torch.dtype,
    *,
    log_normalizer: torch.Tensor | None = None,
    custom_oracle: bool = False,
    returned: torch.Tensor | None = None,
) -> float:
    """The runtime self-check: ``log p(x, data) - log q(x)`` must not vary across draws.

    For an exact oracle ``q(x) = p(x, data) / Z``, so the difference is ``log Z`` for every
    draw (for a family, ``log Z`` of each draw's target, given as ``log_normalizer``). It is
    checked within a tolerance of ``16 eps(dtype) (|terms| + 1)``, where ``|terms|`` is the sum
    of the absolute values of the log-density terms of the draw and ``dtype`` the model's
    precision: the oracle and the model then compute the same float terms and only rounding
    differs.

    Parameters
    ----------
    log_joint, oracle_log_prob, magnitude : DoubleTensor[N]
    dtype : torch.dtype
        The lowest precision among the model's log densities (and the oracle's output).
    log_normalizer : DoubleTensor[N], optional
        Each draw's ``log Z``; without it the differences must agree with each other.
    custom_oracle : bool
        Word the error for an oracle the user passed.
    returned : BoolTensor[N], optional
        Which rows are the run's draws; the others are assignments made for the check alone
        (the error says which the failing row is).

    Returns
    -------
    float
        The largest deviation seen.

    Raises
    ------
    SelfCheckError
        With the draws that disagree and what to do.

    Examples
    --------
    >>> import torch
    >>> lp = torch.tensor([-3.0, -4.0], dtype=torch.float64)
    >>> q = torch.tensor([-1.0, -2.0], dtype=torch.float64)  # lp - q = -2 for both draws
    >>> check_exact_draws(lp, q, lp.abs(), torch.float32)
    0.0
    """
    diff = log_joint.double() - oracle_log_prob.double().to(log_joint.device)
    tolerance = 16.0 * max(_eps(dtype), 1e-15) * (magnitude.double().to(diff.device) + 1.0)
    if log_normalizer is not None:
        deviation = diff - log_normalizer.double().to(diff.device)
        what = "differs from the log normaliser of the draw's target"
    else:
        finite = diff[torch.isfinite(diff)]
        center = finite.median() if finite.numel() else torch.tensor(0.0, dtype=diff.dtype)
        deviation = diff - center
        tolerance = tolerance + tolerance.median()
        what = "varies across draws"
    bad = ~(deviation.abs() <= tolerance)
    if not bool(bad.any()):
        return float(deviation.abs().max()) if deviation.numel() else 0.0
    i = int(bad.nonzero()[0, 0])
    spread = float(deviation[bad].abs().max())
    row = f"Draw {i}"
    if returned is not None and not bool(returned[i]):
        row = f"Row {i} (an assignment made for this check alone, not a returned draw)"
    if custom_oracle:
        advice = (
            "The oracle passed as oracle= is not exact for this model (coordinates in another "
            "order, an approximation, a different density, or one that gives no mass to some "
            "of the posterior's values: then log p(x, data) - log q(x) is below log Z on every "
            "draw). Pass an approximate oracle as guide= with correction='importance' or "
            "'imh', which correct its draws."
        )
    else:
        advice = (
            "The enumeration oracle and the model's log density disagree. A common cause is a "
            "model whose density is not a fixed function of its sites: it draws random numbers "
            "that no visible pyro.sample site records (poutine.block hiding a latent site, "
            "torch.rand or .sample() inside the model); make them sites of the model. Another "
            "is pyro.markov contexts that share enumeration dims between sites that depend on "
            "each other: a site (a pyro.factor or an observation too) that reads a site further "
            "back than its pyro.markov history (raise history=h to the longest lag it reads), "
            "or a new pyro.markov per row of a grid inside an outer one (re-enter one markov "
            "object per axis instead, as Pyro's grid examples do); Pyro's own enumeration is "
            "wrong there too. Another is a site read across its own plate: a value inside "
            "pyro.plate that mixes the plate's entries (w.flip(-1), w.roll(1, -1), "
            "w.sum(-1, keepdim=True).expand(w.shape), w[..., perm]) couples entries that the "
            "plate declares independent; make such a site one vector site instead "
            "(.to_event(1), outside the plate, as Pyro requires for enumeration). Otherwise "
            "the model uses a handler or construct "
            "AutoSpec does not reproduce: please report it with the model; meanwhile use "
            "pyro.infer.infer_discrete or MCMC."
        )
    raise SelfCheckError(
        f"Self-check failed: log p(x, data) - log q(x) {what} by up to {spread:.3g} "
        f"(tolerance {float(tolerance[i]):.2g} from {dtype} precision), so the draws are NOT "
        f"exact draws of the model's posterior. {row}: log p(x, data) = "
        f"{float(log_joint[i]):.6g}, log q(x) = {float(oracle_log_prob[i]):.6g}. {advice}"
    )


class SelfCheck:
    """The self-check of a whole run: every draw of every chain (or engine run) pooled.

    For an exact oracle, ``log p(x, data) - log q(x)`` is one constant ``log Z`` for every draw
    of the run, whichever chain or engine run produced it; checking each chain on its own
    compares nothing when a chain holds one draw. Every path from a model to exact draws
    (:class:`~pyro_autospec.infer.discrete_run.DiscreteRun`,
    :class:`~pyro_autospec.infer.mixed_run.MixedRun`,
    :class:`~pyro_autospec.infer.kernel.AutoSpecKernel`) adds its draws here and calls
    :meth:`check`, which runs :func:`check_exact_draws` on all of them, through
    :class:`~pyro_autospec.infer.draws.DrawEvaluator`.

    Parameters
    ----------
    oracle : MarginalOracle
        The oracle that produced the draws. If it has ``log_normalizer()`` (one ``log Z``, or
        one per draw of a family), each draw is compared with it; otherwise the draws are
        compared with each other.
    custom_oracle : bool
        Word the error for an oracle the user passed.
    log_normalizer : float, optional
        ``log Z`` of the draws' law when the sampler knows it (forward filtering's), used in
        place of ``oracle.log_normalizer()``.
    keep : int, optional
        Pool at most this many earlier draws (the first ones) with each new batch, for a
        sampler that checks as it goes (:class:`~pyro_autospec.infer.kernel.AutoSpecKernel`):
        every new draw is still compared with the reference draws, in bounded memory.

    Examples
    --------
    >>> import torch
    >>> class Oracle:  # an exact oracle of a density with log Z = log 2
    ...     pass
    >>> check = SelfCheck(Oracle())
    >>> lp = torch.tensor([-2.0], dtype=torch.float64)
    >>> check.add(lp, lp - 0.5, lp.abs(), torch.float64)
    >>> check.add(lp - 1.0, lp - 1.5, lp.abs(), torch.float64)  # another chain, same log Z
    >>> check.check()
    0.0
    """

    def __init__(
        self,
        oracle: Any,
        *,
        custom_oracle: bool = False,
        log_normalizer: float | None = None,
        keep: int | None = None,
    ):
        self.oracle = oracle
        self.log_normalizer = log_normalizer
        self.custom_oracle = custom_oracle
        self.keep = keep
        self._parts: list[tuple[torch.Tensor, ...]] = []
        self._dtype: torch.dtype | None = None
        self.max_error: float | None = None

    def add(
        self,
        log_joint: torch.Tensor,
        oracle_log_prob: torch.Tensor,
        magnitude: torch.Tensor,
        dtype: torch.dtype,
        *,
        returned: bool = True,
    ) -> None:
        """Add a batch of draws (DoubleTensors[N]; ``dtype`` as in :func:`check_exact_draws`);
        ``returned=False`` for assignments made for the check alone."""
        device = log_joint.device
        self._parts.append(
            (
                log_joint.detach().double(),
                oracle_log_prob.detach().double().to(device),
                magnitude.detach().double().to(device),
                torch.full(log_joint.shape, returned, dtype=torch.bool, device=device),
            )
        )
        if self._dtype is None or _eps(dtype) > _eps(self._dtype):
            self._dtype = dtype

    def check(self) -> float:
        """Check every draw added so far; return the largest deviation (also ``max_error``).

        Raises
        ------
        SelfCheckError
            When the draws disagree (see :func:`check_exact_draws`).
        """
        if not self._parts:
            return 0.0
        device = self._parts[0][0].device
        lp, q, magnitude, returned = (
            torch.cat([p[k].to(device) for p in self._parts]) for k in range(4)
        )
        normalizer = getattr(self.oracle, "log_normalizer", None)
        if self.log_normalizer is not None:
            normalizer = torch.tensor(float(self.log_normalizer), dtype=torch.float64)
            normalizer = normalizer.to(device)
        elif normalizer is not None:
            normalizer = normalizer().double().to(device)
            if normalizer.numel() == 1:
                normalizer = normalizer.reshape(()).expand_as(lp)
        error = check_exact_draws(
            lp,
            q,
            magnitude,
            self._dtype,
            log_normalizer=normalizer,
            custom_oracle=self.custom_oracle,
            returned=returned,
        )
        self.max_error = error if self.max_error is None else max(self.max_error, error)
        if self.keep is not None and lp.numel() > self.keep:
            keep = slice(None, self.keep)
            self._parts = [(lp[keep], q[keep], magnitude[keep], returned[keep])]
        return self.max_error


#: The largest :func:`enumeration_bound` for which :func:`reference_log_normalizer` enumerates
#: the model: 2^20 entries (4 MiB per float32 table). Pyro's tables, their temporaries and
#: the time to build them grow with the bound, and the reference is an extra to a run.
MAX_REFERENCE_ENTRIES = 2**20


def enumeration_bound(layout: Any, trace: Any = None) -> int:
    """A bound on the entries of the tables Pyro's parallel enumeration of the model builds.

    Every discrete site is enumerated in its own dim (``support_size`` values). A site outside
    any ``pyro.markov`` context keeps its dim for the whole run; a site inside one shares the
    tables only of the sites in its markov scope (the steps its ``history`` reaches back to:
    Pyro's ``_markov_scope``, read from ``trace``, a plain trace of the model), since Pyro
    recycles the dims of the others. A table then holds at most the values of every global
    site, times those of the largest markov scope, times every sample site's shape (latent,
    observed, ``pyro.factor``: batch and event dims, right-aligned) at its largest size per
    dim. It bounds the sites' densities, not arbitrary code inside the model. Without
    ``trace`` every site counts as global.

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> from pyro_autospec.model import discover_sites, trace_model
    >>> def model(y):
    ...     z = pyro.sample("z", dist.Categorical(torch.ones(3) / 3))
    ...     w = pyro.sample("w", dist.Bernoulli(0.5))
    ...     with pyro.plate("data", len(y)):
    ...         pyro.sample("y", dist.Normal(z + w, 1.0), obs=y)
    >>> enumeration_bound(discover_sites(model, (torch.zeros(10),)))
    60
    >>> def chain(y):  # 30 binary steps: 2^30 as if global, 2 * 2 in markov steps
    ...     x = 0
    ...     for t in pyro.markov(range(len(y))):
    ...         x = pyro.sample(f"x_{t}", dist.Bernoulli(0.3 + 0.4 * x))
    ...         pyro.sample(f"y_{t}", dist.Normal(x, 1.0), obs=y[t])
    >>> y = torch.zeros(30)
    >>> enumeration_bound(discover_sites(chain, (y,)), trace_model(chain, (y,)))
    4
    """
    support = {site.name: site.support_size for site in layout.sites}
    scopes = {}  # markov site -> the markov sites its tables may share
    if trace is not None:
        for name, node in trace.nodes.items():
            infer = node.get("infer") or {}
            if name in support and infer.get("_markov_depth"):
                scopes[name] = {
                    other for other in infer.get("_markov_scope", ()) if other in support
                }
    entries = math.prod(q for name, q in support.items() if name not in scopes)
    entries *= max(
        (
            math.prod(support[t] for t in ({name} | scope) if t in scopes)
            for name, scope in scopes.items()
        ),
        default=1,
    )
    shapes = [site.shape for site in layout.sites]
    shapes += [torch.Size(shape) for shape in layout.observed_batch_shapes.values()]
    # every sample site, factors included: (name, observed, kind, batch shape, event shape)
    shapes += [torch.Size(tuple(entry[3]) + tuple(entry[4])) for entry in layout.signature]
    rank = max((len(shape) for shape in shapes), default=0)
    for dim in range(1, rank + 1):
        entries *= max(shape[-dim] if len(shape) >= dim else 1 for shape in shapes)
    return entries


def reference_log_normalizer(
    model: Any,
    args: tuple,
    kwargs: dict,
    layout: Any,
    device: Any = None,
    why_not: list | None = None,
) -> float | None:
    """``log Z = log sum_x p(x, data)`` over the model's discrete sites, by exact elimination.

    The reference for an oracle passed as ``oracle=``: draws compared only with each other
    pass for an oracle exact on part of the posterior's values.

    Parameters
    ----------
    model : callable
        The Pyro model.
    args, kwargs
        Its arguments.
    layout : SiteLayout
        Its discrete sites (:func:`~pyro_autospec.model.discover_sites`).
    device : optional
        Where the elimination runs.
    why_not : list, optional
        Where there is no reference, a sentence saying why is appended.

    Returns
    -------
    float or None
        ``None`` where enumerating the model could need tables larger than
        :data:`MAX_REFERENCE_ENTRIES` (:func:`enumeration_bound`: checked before the model is
        traced, since Pyro's enumeration builds them while the model runs, where no limit
        applies), where Pyro's enumeration of the model fails, where the elimination does not
        fit (:func:`~pyro_autospec.model.ffbs.plan_ffbs`) or ``log Z`` is not finite; then
        the draws are compared with each other only.

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> from pyro_autospec.model import discover_sites
    >>> def model():
    ...     z = pyro.sample("z", dist.Bernoulli(0.25))
    ...     pyro.factor("f", 2.0 * z)
    >>> log_z = reference_log_normalizer(model, (), {}, discover_sites(model))
    >>> abs(log_z - math.log(0.75 + 0.25 * math.exp(2.0))) < 1e-6
    True
    """

    def refuse(reason: str) -> None:
        if why_not is not None:
            why_not.append(reason)

    try:
        trace = trace_model(model, args, kwargs)  # a plain run: the markov scopes
    except Exception as error:  # the reference is optional: the draws are still compared
        refuse(f"the model failed in a plain run ({type(error).__name__})")
        return None
    bound = enumeration_bound(layout, trace)
    if bound > MAX_REFERENCE_ENTRIES:
        refuse(
            f"enumerating the model could build tables of {bound:,} entries, more than "
            f"{MAX_REFERENCE_ENTRIES:,}"
        )
        return None
    too_large: list[str] = []
    try:
        oracle = EnumOracle(model, args, kwargs, layout=layout, device=device, lazy=True)
        plan = plan_ffbs(oracle, too_large)
    except Exception as error:  # the reference is optional: the draws are still compared
        first = str(error).split(". ")[0].splitlines()[0] if str(error) else ""
        refuse(f"Pyro's enumeration of the model failed ({type(error).__name__}: {first})")
        return None
    if plan is None:
        refuse(
            too_large[0]
            if too_large
            else "the elimination does not fit the model's plates (sites outside a plate "
            "coupled to sites inside it, eliminated after them)"
        )
        return None
    log_z = float(plan.log_normalizer)
    if not math.isfinite(log_z):
        refuse(f"log Z is {log_z}")
        return None
    return log_z


def reference_for(
    oracle: Any, custom: bool, model: Any, args: tuple, kwargs: dict, layout: Any, device: Any
) -> tuple[float | None, str]:
    """The reference ``log Z`` a run's self-check compares an oracle passed as ``oracle=``
    with, and why there is none: ``(None, "")`` for the default oracle and for one with its
    own ``log_normalizer()``, which need none (:func:`reference_log_normalizer`).

    Examples
    --------
    >>> reference_for(object(), False, None, (), {}, None, None)
    (None, '')
    """
    if not custom or hasattr(oracle, "log_normalizer"):
        return None, ""
    why_not: list[str] = []
    log_z = reference_log_normalizer(model, args, kwargs, layout, device, why_not)
    return log_z, (why_not[0] if why_not else "")
