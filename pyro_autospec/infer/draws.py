"""From the engine's draws to results: site values, the log joint and the pooled self-check.

Every path from a model to exact draws (:class:`~pyro_autospec.infer.discrete_run.DiscreteRun`
for ``AutoSpec``, :class:`~pyro_autospec.infer.mixed_run.MixedRun` for models with continuous
sites too, :class:`~pyro_autospec.infer.kernel.AutoSpecKernel` behind Pyro's ``MCMC``) turns
the engine's coordinates into results the same way, through :class:`DrawEvaluator`:

1. the coordinates become site values
   (:meth:`~pyro_autospec.model.discrete.SiteLayout.from_coords`), with any continuous values
   of the draws beside them;
2. the model is evaluated on all of them in batched traces
   (:func:`~pyro_autospec.model.log_joint.evaluate`): the log joint ``log p(x, data)``, the
   pointwise log likelihood and the deterministic sites;
3. exact draws join the run's :class:`~pyro_autospec.infer.self_check.SelfCheck`, and
   :meth:`DrawEvaluator.check` tests every draw added so far at once. The first batch of
   varied draws (with the self-check's uniform probes, where it has them) is checked for
   mixing as it is evaluated: the plain runs of the model that site discovery traced join
   it, and up to ``ALONE_CHECKS`` of its draws are scored alone again
   (:func:`~pyro_autospec.model.log_joint.evaluate`). A model that mixes the draws of a batch
   may mix the enumeration's values the same way (``z.mean()`` of a scalar site), so that its
   oracle's law is as wrong as the batch's scores and the self-check passes; it raises
   :class:`~pyro_autospec.model.errors.MixedDrawsError`. Draws that may be evaluated one at a
   time instead (``per_draw_fallback``) are checked in every batch and then evaluated draw by
   draw.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace

import torch

from pyro_autospec._warnings import user_stacklevel
from pyro_autospec.engine import keys
from pyro_autospec.engine.keys import derive_seed
from pyro_autospec.infer.seeds import check_draws_seed
from pyro_autospec.infer.self_check import SelfCheck
from pyro_autospec.model.discrete import SiteLayout
from pyro_autospec.model.enum import EnumOracle
from pyro_autospec.model.errors import AutoSpecModelError, MixedDrawsError
from pyro_autospec.model.ffbs import FFBSPlan, plan_ffbs, sample_exact
from pyro_autospec.model.log_joint import LogJoint, SharedNumbersWarning, evaluate
from pyro_autospec.model.randomness import HiddenRandomnessError

__all__ = [
    "CheckAssignments",
    "DrawEvaluator",
    "EvaluatedDraws",
    "ModelCall",
    "Pointwise",
    "check_assignments",
]


@dataclass(frozen=True)
class ModelCall:
    """A model and the arguments of one call of it: what :class:`DrawEvaluator` evaluates.

    Attributes
    ----------
    model : callable
    args : tuple
    kwargs : dict
        The model's arguments (data included).
    """

    model: Callable
    args: tuple
    kwargs: dict


@dataclass
class EvaluatedDraws:
    """One batch of draws, evaluated.

    Attributes
    ----------
    values : dict
        ``name -> Tensor[N, *shape]``: every latent site's value (discrete sites in their
        native dtype), on the evaluation's device.
    joint : LogJoint
        The model's log joint of each draw, its pointwise log likelihood and deterministic
        sites (see :func:`~pyro_autospec.model.log_joint.evaluate`); with ``rows``, the
        pointwise log likelihood of the distinct assignments only.
    oracle_log_prob : DoubleTensor[N]
        ``log q(x)`` of each draw under the oracle that produced it, on the joint's device.
    rows : LongTensor[N] or None
        Where the draws were evaluated once per distinct assignment: the row of
        ``joint.pointwise`` of each draw (``pointwise[name][rows]`` is the draws' own, an
        ``[N, *batch_shape]`` table that can be much larger than the model's data).
    """

    values: dict
    joint: LogJoint
    oracle_log_prob: torch.Tensor
    rows: torch.Tensor | None = None

    @property
    def lp(self) -> torch.Tensor:
        """``log p(x, data)`` of each draw (DoubleTensor[N])."""
        return self.joint.total

    @property
    def log_weight(self) -> torch.Tensor:
        """``log p(x, data) - log q(x)``: a guide's log importance weights (``log Z`` of every
        draw for an exact oracle)."""
        return self.joint.total - self.oracle_log_prob


@dataclass(frozen=True)
class CheckAssignments:
    """Assignments made for the self-check alone, never returned: extra draws of the run's
    law (the first ``num_draws`` rows) and assignments drawn uniformly from the sites'
    supports (the ``num_probes`` after them).

    Attributes
    ----------
    samples : LongTensor[M, n]
        The assignments, as coordinates of the run's layout.
    log_prob : DoubleTensor[M]
        ``log q(x)`` of each under the law the run's draws come from (``-inf`` where it has
        no mass).
    num_draws, num_probes : int
    """

    samples: torch.Tensor
    log_prob: torch.Tensor
    num_draws: int
    num_probes: int


#: Fewest draws the self-check compares: a shorter run makes extra draws for the check alone
#: (:func:`check_assignments`).
MIN_CHECKED_DRAWS = 64
#: Assignments drawn uniformly from the sites' supports at which every run compares the
#: model's log density with the law it drew from.
NUM_PROBES = 64
#: Most entries (latent coordinates and observed elements, per draw, times draws) that those
#: extra assignments may have the model evaluate.
MAX_CHECK_ENTRIES = 2**22
#: Most entries (latent coordinates and observed elements, per draw, times draws) of one
#: chunk of :meth:`DrawEvaluator.evaluate_in_chunks`.
MAX_CHUNK_ENTRIES = 2**18
#: Draws per batched trace of the model (:func:`~pyro_autospec.model.log_joint.evaluate`).
EVALUATION_TRACE = 4096
#: ``DrawEvaluator.evaluate(distinct=FIND)``: look for the distinct assignments of the batch.
FIND = object()


def check_assignments(
    layout: SiteLayout,
    oracle: object,
    seed: int,
    num_draws: int,
    *,
    plan: FFBSPlan | None = None,
) -> CheckAssignments | None:
    """What the self-check compares beside a run's own ``num_draws`` draws, never returned
    (``None`` where forward filtering's elimination does not fit the oracle).

    A model that the enumeration does not reproduce (a read past a ``pyro.markov``
    history, a handler it cannot see) has its draws drawn from another law ``q``, and
    ``log p(x, data) - log q(x) = log Z`` fails only on assignments where the two laws
    differ. The run's draws, from ``q``, may never land there: one draw lands where they
    agree about half the time, and a ``q`` that gives the region no mass never lands
    there at all, whatever the number of draws. So forward filtering's law is also read
    at :data:`NUM_PROBES` assignments drawn uniformly from the sites' supports
    (:meth:`~pyro_autospec.model.ffbs.FFBSPlan.log_prob`), and a run of fewer than
    :data:`MIN_CHECKED_DRAWS` draws is joined by more draws from ``q``. They read a seed
    stream of their own (:func:`~pyro_autospec.infer.seeds.check_draws_seed`), and the model
    evaluates them in the batch of the first chain's draws (:meth:`DrawEvaluator.evaluate`),
    at most :data:`MAX_CHECK_ENTRIES` entries of them. Where the engine draws the run on the
    enumeration oracle, forward filtering reads the same factors.

    Parameters
    ----------
    layout : SiteLayout
    oracle : EnumOracle
        The enumeration oracle of the model (another oracle: ``None`` unless ``plan``).
    seed : int
        The run's first chain's seed.
    num_draws : int
        Draws the run makes (all chains).
    plan : FFBSPlan, optional
        Forward filtering's plan, where the run already has one.
    """
    observed = sum(math.prod(shape) for shape in layout.observed_batch_shapes.values())
    budget = MAX_CHECK_ENTRIES // max(1, layout.num_coords + observed)
    short = max(0, min(MIN_CHECKED_DRAWS - num_draws, budget // 2))
    probes = min(NUM_PROBES, budget // 2)
    if short + probes <= 0:
        return None
    if plan is None:
        plan = plan_ffbs(oracle) if isinstance(oracle, EnumOracle) else None
    if plan is None:  # the elimination does not fit: the run's draws alone
        return None
    seed = check_draws_seed(seed)
    parts, log_q = [], []
    if short > 0:
        extra = sample_exact(plan, short, seed)
        parts.append(extra.samples)
        log_q.append(extra.log_prob)
    if probes > 0:
        sizes = torch.tensor(
            [site.support_size for site in layout.sites for _ in range(site.num_coords)],
            dtype=torch.float64,
        )
        root = torch.tensor(keys.seed_key(derive_seed(seed, 1)), dtype=torch.long)
        u = keys.uniform(root, keys.Tag.DRAFT, torch.arange(probes * len(sizes)))
        uniform = (u.reshape(probes, -1) * sizes).long().to(plan.device)
        parts.append(uniform)
        log_q.append(plan.log_prob(uniform))
    return CheckAssignments(torch.cat(parts), torch.cat(log_q), short, probes)


def _no_stage(name: str) -> AbstractContextManager:
    return nullcontext()


class DrawEvaluator:
    """The one path from the engine's draws of a model to its results (see the module's notes).

    Parameters
    ----------
    call : ModelCall
        The model and its arguments (data included).
    layout : SiteLayout
        The coordinates of the model's discrete sites.
    self_check : SelfCheck, optional
        The run's pooled self-check (exact draws); ``None`` for a guide's draws.
    device : torch.device, optional
        Where the model is evaluated (the site values are moved there).
    outputs : bool
        Also return the pointwise log likelihood of the observed sites and the deterministic
        sites (``AutoSpec``'s runs; ``AutoSpecKernel`` needs only the log joint).
    per_draw_fallback : bool
        Evaluate one draw at a time where the model cannot run on a batch (models with
        continuous sites; see :func:`~pyro_autospec.model.log_joint.evaluate`).
    stage : callable, optional
        ``stage(name)`` is a context manager that times a stage of the run
        (:meth:`~pyro_autospec.infer.run_base.RunBase.stage`): ``"evaluation"`` and
        ``"self-check"``.
    """

    def __init__(
        self,
        call: ModelCall,
        layout: SiteLayout,
        *,
        self_check: SelfCheck | None,
        device: torch.device | str | None = None,
        outputs: bool = True,
        per_draw_fallback: bool = False,
        stage: Callable[[str], AbstractContextManager] | None = None,
    ):
        self.call = call
        self.layout = layout
        self.self_check = self_check
        self.device = device
        self.outputs = outputs
        self.per_draw_fallback = per_draw_fallback
        self.stage = _no_stage if stage is None else stage
        #: (extra draws, uniform probes) of :class:`CheckAssignments` that joined the check, and
        #: how many of those probes have no mass under either law (left out of it)
        self.compared = (0, 0, 0)
        self._mixing_checked = False  # a batch of varied draws was checked for mixing

    def _evaluate(self, values: Mapping[str, torch.Tensor], check_mixing: bool) -> LogJoint:
        layout = self.layout
        outputs = {}
        if self.outputs:
            outputs = {
                "observed_shapes": layout.observed_batch_shapes,
                "deterministic_shapes": layout.deterministic,
            }
        call = self.call
        return evaluate(
            call.model,
            call.args,
            call.kwargs,
            values,
            layout.latent_shapes(),
            layout.max_plate_nesting,
            check_mixing=check_mixing,
            per_draw_fallback=self.per_draw_fallback,
            plain_runs=() if set(values) - set(layout.names) else layout.plain_runs,
            **outputs,
        )

    def evaluate(
        self,
        samples: torch.Tensor,
        oracle_log_prob: torch.Tensor,
        continuous: Mapping[str, torch.Tensor] | None = None,
        checks: CheckAssignments | None = None,
        *,
        distinct: object = FIND,
    ) -> EvaluatedDraws:
        """Site values, log joint (and outputs) of one batch of draws; exact draws join the
        self-check (tested by :meth:`check`).

        Parameters
        ----------
        samples : LongTensor[N, n]
            The engine's draws, as coordinates of :attr:`layout`.
        oracle_log_prob : Tensor[N]
            ``log q(x)`` of each draw.
        continuous : dict, optional
            ``name -> Tensor[N, *shape]``: the draws' values of continuous sites.
        checks : CheckAssignments, optional
            Assignments for the self-check alone, evaluated in the same batch as the draws (one
            trace of the model for both). An assignment of probability zero under both laws
            (``log p = log q = -inf``) says nothing and is left out; one that has mass under
            one law only fails the check. The model need not be written for assignments its
            draws never reach (a count above its total, an index out of range): where it
            raises a ``ValueError`` or an ``IndexError`` (also wrapped in the library's own
            model error), the batch is evaluated again with the extra draws of the law only,
            then with none; any other error is raised. :attr:`compared` says what joined the
            check.
        distinct : tuple, None or FIND
            ``(unique, inverse)`` of ``samples`` already found (:func:`_distinct`), ``None``
            to evaluate every draw, or :data:`FIND` (the default) to look for them.
        """
        if checks is not None and continuous is None and self.self_check is not None:
            self.compared = (0, 0, 0)
            tries = [checks]
            if checks.num_draws and checks.num_probes:  # the extra draws alone, if need be
                rows = slice(0, checks.num_draws)
                tries.append(
                    CheckAssignments(
                        checks.samples[rows], checks.log_prob[rows], checks.num_draws, 0
                    )
                )
            for attempt in tries:
                try:
                    return self._evaluate_with(
                        samples, oracle_log_prob, attempt, FIND if distinct is not None else None
                    )
                except (AutoSpecModelError, ValueError, IndexError) as error:
                    if not _cannot_score(error):
                        raise
        return self._evaluate_alone(samples, oracle_log_prob, continuous, distinct=distinct)

    def evaluate_in_chunks(
        self,
        samples: torch.Tensor,
        oracle_log_prob: torch.Tensor,
        checks: CheckAssignments | None = None,
        chunk_size: int | None = None,
    ) -> EvaluatedDraws:
        """:meth:`evaluate` of many draws, ``chunk_size`` at a time, into outputs made once.

        What the evaluation holds beyond its outputs (the site values, the log joint, the
        pointwise log likelihood and the deterministic sites, which the run returns) is then
        one chunk's model traces and tables, whatever the number of draws. The draws and their
        values are the same as :meth:`evaluate`'s; ``checks`` join the first chunk. Where at
        most half of all the draws are distinct, the model is evaluated on the distinct
        assignments alone, all at once (:meth:`evaluate`): their tables are then the
        outputs, one row per distinct assignment, which chunks of draws would lose.

        Parameters
        ----------
        samples : LongTensor[N, n]
        oracle_log_prob : Tensor[N]
        checks : CheckAssignments, optional
        chunk_size : int, optional
            Draws per chunk (default :meth:`chunk_size`).
        """
        num = samples.shape[0]
        size = self.chunk_size() if chunk_size is None else max(1, int(chunk_size))
        if num <= size:
            return self.evaluate(samples, oracle_log_prob, checks=checks)
        distinct = _distinct(samples)
        if distinct is not None:
            return self.evaluate(samples, oracle_log_prob, checks=checks, distinct=distinct)
        out = None
        for first in range(0, num, size):
            rows = slice(first, min(first + size, num))
            part = self.evaluate(
                samples[rows],
                oracle_log_prob[rows],
                checks=checks if first == 0 else None,
                distinct=None,  # most draws differ: every draw's own row
            )
            out = _Assembly(part, num) if out is None else out
            out.put(rows, part)
        return out.done()

    def chunk_size(self) -> int:
        """Draws per chunk of :meth:`evaluate_in_chunks`: :data:`MAX_CHUNK_ENTRIES` latent
        coordinates and observed elements in all, at least the model's own trace size
        (:func:`~pyro_autospec.model.log_joint.evaluate` traces 4096 draws at a time)."""
        layout = self.layout
        observed = sum(math.prod(shape) for shape in layout.observed_batch_shapes.values())
        per_draw = max(1, layout.num_coords + observed)
        return max(EVALUATION_TRACE, MAX_CHUNK_ENTRIES // per_draw)

    def _evaluate_alone(
        self, samples, oracle_log_prob, continuous, *, join: bool = True, distinct=FIND
    ):
        with self.stage("evaluation"):
            values = self._values(samples, continuous)
            # the first batch of varied draws (the self-check's probes among them) is
            # checked for mixing, and every batch that may be evaluated draw by draw instead
            check = self.per_draw_fallback or not self._mixing_checked
            if continuous:
                distinct = None
            elif distinct is FIND:
                distinct = _distinct(samples)
            rows = None
            if distinct is None:
                joint = self._evaluate(values, check)
            else:  # each distinct assignment once: the model is deterministic given it
                unique, rows = distinct
                with warnings.catch_warnings():  # its deterministic values are not kept then
                    warnings.simplefilter("ignore", SharedNumbersWarning)
                    joint = _take(self._evaluate(self._values(unique, None), check), rows)
                if joint.random and joint.deterministic:
                    # unless it draws random numbers no scored site reads: its deterministic
                    # sites (a posterior predictive's noise) differ from draw to draw
                    joint, rows = self._evaluate(values, check), None
            if samples.shape[0] > 1 and bool((samples != samples[:1]).any()):
                self._mixing_checked = True
        oracle_lp = oracle_log_prob.double().to(joint.total.device)
        if self.self_check is not None and join:
            with self.stage("self-check"):
                self.self_check.add(joint.total, oracle_lp, joint.magnitude, joint.dtype)
        return EvaluatedDraws(values, joint, oracle_lp, rows)

    def _evaluate_with(
        self,
        samples: torch.Tensor,
        oracle_log_prob: torch.Tensor,
        checks: CheckAssignments,
        distinct=FIND,
    ) -> EvaluatedDraws:
        """The draws and the check's assignments in one batch, split after evaluation."""
        num = samples.shape[0]
        everything = torch.cat([samples, checks.samples.to(samples.device)])
        log_q = torch.cat(
            [oracle_log_prob.double(), checks.log_prob.double().to(oracle_log_prob.device)]
        )
        with warnings.catch_warnings(record=True) as caught:  # the model's warnings on the
            warnings.simplefilter("ignore")  # check's assignments; the draws' own, raised below
            warnings.simplefilter("always", SharedNumbersWarning)
            evaluated = self._evaluate_alone(everything, log_q, None, join=False, distinct=distinct)
        for warning in caught:  # under the user's filters
            warnings.warn(warning.message, stacklevel=user_stacklevel())
        own, rest = _rows(evaluated, slice(0, num)), _rows(evaluated, slice(num, None))
        with self.stage("self-check"):
            self.self_check.add(own.lp, own.oracle_log_prob, own.joint.magnitude, own.joint.dtype)
            keep = ~(torch.isneginf(rest.lp) & torch.isneginf(rest.oracle_log_prob))
            lp, log_q = rest.lp[keep], rest.oracle_log_prob[keep]
            magnitude = rest.joint.magnitude[keep]
            self.self_check.add(lp, log_q, magnitude, rest.joint.dtype, returned=False)
        self.compared = (checks.num_draws, checks.num_probes, int((~keep).sum()))
        return own

    def _values(self, samples: torch.Tensor, continuous: Mapping | None) -> dict:
        values = self.layout.from_coords(samples)
        if self.device is not None:
            values = {k: v.to(self.device) for k, v in values.items()}
        for name, value in (continuous or {}).items():
            values[name] = value if self.device is None else value.to(self.device)
        return values

    def check(self) -> float | None:
        """The self-check of every exact draw evaluated so far, pooled; the largest deviation
        (``None`` without a self-check).

        Raises
        ------
        SelfCheckError
            When ``log p(x, data) - log q(x)`` is not one constant.
        """
        if self.self_check is None:
            return None
        with self.stage("self-check"):
            return self.self_check.check()


class _Assembly:
    """The outputs of :meth:`DrawEvaluator.evaluate_in_chunks`, made once for all ``num``
    draws from the first chunk's shapes and filled chunk by chunk (every draw's own row:
    chunks are evaluated draw by draw, never once per distinct assignment)."""

    def __init__(self, first: EvaluatedDraws, num: int):
        joint = first.joint

        def like(t: torch.Tensor) -> torch.Tensor:
            return t.new_empty((num,) + tuple(t.shape[1:]))

        self.values = {k: like(v) for k, v in first.values.items()}
        self.total = like(joint.total)
        self.magnitude = None if joint.magnitude is None else like(joint.magnitude)
        self.pointwise = {k: like(v) for k, v in joint.pointwise.items()}
        self.deterministic = {k: like(v) for k, v in joint.deterministic.items()}
        self.oracle_log_prob = like(first.oracle_log_prob)
        self.dtype, self.random = joint.dtype, joint.random

    def put(self, rows: slice, part: EvaluatedDraws) -> None:
        joint = part.joint
        for k, v in part.values.items():
            self.values[k][rows] = v
        self.total[rows] = joint.total
        if self.magnitude is not None:
            self.magnitude[rows] = joint.magnitude
        for k, v in joint.pointwise.items():
            self.pointwise[k][rows] = v
        for k, v in joint.deterministic.items():
            self.deterministic[k][rows] = v
        self.oracle_log_prob[rows] = part.oracle_log_prob
        if torch.finfo(joint.dtype).eps > torch.finfo(self.dtype).eps:
            self.dtype = joint.dtype
        self.random = self.random or joint.random

    def done(self) -> EvaluatedDraws:
        joint = LogJoint(
            self.total, self.pointwise, self.deterministic, self.magnitude, self.dtype, self.random
        )
        return EvaluatedDraws(self.values, joint, self.oracle_log_prob)


def _rows(evaluated: EvaluatedDraws, rows: slice) -> EvaluatedDraws:
    """The draws ``rows`` of an evaluated batch (the pointwise tables of distinct
    assignments are kept whole; their index is sliced)."""
    joint = evaluated.joint
    per_row = evaluated.rows is None
    return EvaluatedDraws(
        values={k: v[rows] for k, v in evaluated.values.items()},
        joint=replace(
            joint,
            total=joint.total[rows],
            pointwise={k: v[rows] for k, v in joint.pointwise.items()}
            if per_row
            else dict(joint.pointwise),
            deterministic={k: v[rows] for k, v in joint.deterministic.items()},
            magnitude=None if joint.magnitude is None else joint.magnitude[rows],
        ),
        oracle_log_prob=evaluated.oracle_log_prob[rows],
        rows=None if per_row else evaluated.rows[rows],
    )


def _cannot_score(error: BaseException) -> bool:
    """Whether ``error`` (or the first error in its chain of causes) says the model cannot
    score an assignment (a ``ValueError`` of validation, an ``IndexError``), rather than a
    fault of its own."""
    if isinstance(error, (HiddenRandomnessError, MixedDrawsError)):  # on any values
        return False
    root = error
    while root.__cause__ is not None:
        root = root.__cause__
    return isinstance(root, (ValueError, IndexError))


def _distinct(samples: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(unique [U, n], inverse [N])`` of the draws ``samples`` [N, n] when at most half of
    them are distinct (a few discrete sites, many draws: evaluating each assignment once then
    saves most of the model's work, whatever the size of its data), else ``None``."""
    if samples.shape[0] < 4:
        return None
    unique, inverse = _unique_rows(samples)
    if 2 * unique.shape[0] > samples.shape[0]:
        return None
    return unique, inverse


def _unique_rows(samples: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.unique(samples, dim=0, return_inverse=True)``: rows in lexicographic order.
    Rows of a few coordinates are first read as one number each (base ``max + 1``, the first
    coordinate the most significant, so the numbers sort as the rows do), which
    ``torch.unique`` sorts many times faster than rows."""
    num, n = samples.shape
    if num == 0 or n == 0:
        return torch.unique(samples, dim=0, return_inverse=True)
    base = int(samples.max()) + 1
    if int(samples.min()) < 0 or n * math.log2(max(base, 2)) > 62:
        return torch.unique(samples, dim=0, return_inverse=True)
    powers = base ** torch.arange(n - 1, -1, -1, device=samples.device)
    keys = (samples.long() * powers).sum(1)
    _, inverse = torch.unique(keys, return_inverse=True)
    first = torch.full((int(inverse.max()) + 1,), num, device=samples.device)
    first = first.scatter_reduce(0, inverse, torch.arange(num, device=samples.device), "amin")
    return samples[first], inverse


def _take(joint: LogJoint, inverse: torch.Tensor) -> LogJoint:
    """The log joint of distinct draws, spread back to every draw (``inverse`` [N]); the
    pointwise log likelihood stays one row per distinct draw."""
    index = inverse.to(joint.total.device)
    return replace(
        joint,
        total=joint.total[index],
        pointwise=dict(joint.pointwise),
        deterministic={k: v[index.to(v.device)] for k, v in joint.deterministic.items()},
        magnitude=None if joint.magnitude is None else joint.magnitude[index],
    )


class Pointwise(Mapping):
    """The pointwise log likelihood of a run, ``name -> Tensor[C, S, *batch_shape]``, made a
    tensor when first read.

    Each chain's piece is a tensor ``[S, *batch_shape]``, or ``(table, rows)``: the rows
    ``table[rows]`` of draws evaluated once per distinct assignment
    (:attr:`EvaluatedDraws.rows`). A run over a large data plate keeps only the distinct
    rows until ArviZ's ``log_likelihood`` group asks for every draw's.
    """

    def __init__(self, pieces: Mapping[str, list]):
        self._pieces = {name: list(parts) for name, parts in pieces.items()}
        self._made: dict[str, torch.Tensor] = {}

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._made:
            parts = [
                part if isinstance(part, torch.Tensor) else part[0][part[1].to(part[0].device)]
                for part in self._pieces[name]
            ]
            self._made[name] = torch.stack(parts)
        return self._made[name]

    def __iter__(self):
        return iter(self._pieces)

    def __len__(self) -> int:
        return len(self._pieces)
