"""What every kind of AutoSpec run stores and how it is read: samples, fields, summaries, ArviZ.

A run object (:class:`~pyro_autospec.infer.discrete_run.DiscreteRun`,
:class:`~pyro_autospec.infer.mixed_run.MixedRun`,
:class:`~pyro_autospec.infer.diffusion_run.DiffusionRun`) fills the fields of
:class:`RunBase` in its ``run``; the reading methods here are shared. Each kind adds its own
lines to the summary, fields to ``sample_stats`` and entries to ``diagnostics()`` through the
hooks :meth:`RunBase.extras` (one method, so that a kind's diagnostics live in one place).
"""

from __future__ import annotations

import logging
import re
import textwrap
import time
import warnings
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from pyro.infer.mcmc.util import select_samples

from pyro_autospec._warnings import user_stacklevel
from pyro_autospec.diagnostics.arviz import to_inference_data
from pyro_autospec.engine import sample_any_order
from pyro_autospec.engine.methods import is_count
from pyro_autospec.infer.display import print_summary
from pyro_autospec.infer.seeds import chain_seeds
from pyro_autospec.infer.summaries import check_prob, site_diagnostics

_LOG = logging.getLogger("pyro_autospec")

__all__ = ["Extras", "RunBase", "RunSettings", "STAGES"]

#: The stages of a run whose wall time is recorded in ``RunBase.timing``, in run order.
STAGES = {
    "tracing": "tracing the model",
    "compiling": "compiling the oracle",
    "nuts": "NUTS",
    "oracle": "oracle",
    "engine": "engine",
    "evaluation": "evaluating the draws",
    "self-check": "self-check",
    "correction": "correction",
}
#: On a CPU, a run whose oracle rows per draw exceed ``n`` (the sequential sampler's) by this
#: factor gets a line suggesting ``method="sequential"`` (see :meth:`RunBase.speed_summary`).
ROWS_RATIO_FOR_ADVICE = 1.25


@dataclass(frozen=True)
class RunSettings:
    """What :class:`~pyro_autospec.infer.AutoSpec` hands every run kind, built once.

    Attributes
    ----------
    method : str
    num_samples, num_chains : int
        Draws per chain, and chains.
    seed : int, Generator or None
    progress : bool
    save_params : list of str or None
    schedule : dict
        The schedule's knobs (:class:`~pyro_autospec.Schedule`'s fields).
    warmup_steps : int
        NUTS's or the IMH chains' warm-up (0 where none applies).
    device : torch.device or None
    distributed : bool
        Whether the draws are spread over a ``torch.distributed`` group.
    """

    method: str
    num_samples: int
    num_chains: int
    seed: Any
    progress: bool
    save_params: list | None
    schedule: dict
    warmup_steps: int = 0
    device: torch.device | None = None
    distributed: bool = False

    def seeds(self, num: int, *, stream: int | None = None) -> list[int]:
        """``num`` engine seeds from the run's seed (``stream``: a stream beside its own, see
        :class:`~pyro_autospec.infer.seeds.ChainSeeds`), the same on every rank of a
        distributed run."""
        return chain_seeds(self.seed, num, stream=stream, distributed=self.distributed)


@dataclass
class Extras:
    """A run kind's additions to the shared summaries.

    Attributes
    ----------
    summary_lines : list of str
        Paragraphs printed after the table by ``summary()``.
    diagnostics : dict
        Entries added to ``diagnostics()``.
    sample_stats : dict
        ``name -> Tensor[num_chains, num_samples]`` added to ArviZ's ``sample_stats``.
    attrs : dict
        Attributes of the ArviZ groups.
    """

    summary_lines: list = field(default_factory=list)
    diagnostics: dict = field(default_factory=dict)
    sample_stats: dict = field(default_factory=dict)
    attrs: dict = field(default_factory=dict)


def _wrap(line: str, width: int = 100) -> str:
    """Fill a paragraph to ``width`` columns, never between a number and its unit."""
    glued = re.sub(r"(\d) (s|ms|rows|rounds)\b", "\\1\0\\2", line)
    glued = glued.replace("n = ", "n\0=\0")
    text = textwrap.fill(glued, width, break_long_words=False, break_on_hyphens=False)
    return text.replace("\0", " ")


def _split(group: dict, chains: int) -> dict:
    """``[1, N, ...]`` arrays as ``[chains, N // chains, ...]`` (draws in order)."""
    return {
        k: v.reshape((chains, v.shape[1] // chains) + tuple(v.shape[2:])) for k, v in group.items()
    }


def _integer_valued(value: torch.Tensor) -> bool:
    return not value.is_floating_point() or bool((value == value.round()).all())


def with_sites(sites: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """``MCMC.diagnostics``'s ``site -> {"n_eff", "r_hat"}``, then the run's entries. A run
    entry whose name is also a site's moves to ``"run: <name>"`` (with a warning), so that
    no site's entry is lost.

    Examples
    --------
    >>> import warnings
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore")
    ...     sorted(with_sites({"rounds": {"n_eff": 1.0}}, {"rounds": 3, "seconds": 0.1}))
    ['rounds', 'run: rounds', 'seconds']
    """
    clash = sorted(set(sites) & set(run))
    if clash:
        warnings.warn(
            f"the model's sites {clash} share their names with entries diagnostics() gives "
            "for the run; the sites keep them, the run's are under "
            f"{[f'run: {name}' for name in clash]}",
            UserWarning,
            stacklevel=user_stacklevel(),
        )
    moved = {(f"run: {name}" if name in sites else name): value for name, value in run.items()}
    return {**sites, **moved}


class RunBase:
    """Storage and read-out shared by every run kind.

    Subclasses set, in ``run``: ``samples`` (``name -> Tensor[C, S, *shape]``, latent sites in
    trace order), ``deterministic`` (same shape convention), ``extra`` (``name ->
    Tensor[C, S]``), ``pointwise`` (``name -> Tensor[C, S, *batch_shape]``), ``observed``
    (``name -> Tensor``), ``results`` (the engine's results) and ``discrete_names``.
    """

    method: str = "autospec"

    def __init__(self, settings: RunSettings):
        self.settings = settings
        self.method = settings.method
        self.num_samples = int(settings.num_samples)
        self.num_chains = int(settings.num_chains)
        self.save_params = settings.save_params
        self.seed = settings.seed
        self.progress = settings.progress
        self.device = settings.device
        self.warmup_steps = int(settings.warmup_steps)
        self.schedule = dict(settings.schedule)
        self.samples: OrderedDict = OrderedDict()
        self.deterministic: OrderedDict = OrderedDict()
        self.extra: dict = {}
        self.pointwise: dict = {}
        self.observed: dict = {}
        self.results: list = []
        # after forward filtering, backward sampling: its forward seconds and steps (summary)
        self.ffbs_plan: dict | None = None
        self.discrete_names: list = []
        self.layout: Any = None
        #: ``{site: transform}`` to the unconstrained space of each continuous latent site,
        #: as ``pyro.infer.MCMC.transforms`` (none for discrete sites).
        self.transforms: dict = {}
        #: Measured wall seconds of each stage (keys of :data:`STAGES`), filled by ``run``.
        self.timing: OrderedDict = OrderedDict()
        #: Measured wall seconds of the whole ``AutoSpec.run`` (set by ``AutoSpec``).
        self.wall_time: float | None = None

    # ------------------------------------------------------------------------------ timing
    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Add the wall time of the ``with`` block to ``timing[name]``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.timing[name] = self.timing.get(name, 0.0) + time.perf_counter() - start

    def order_timing(self) -> None:
        """Put :attr:`timing` in the run order of :data:`STAGES` (a stage may first be timed
        out of that order: the self-check's assignments are made before the draws)."""
        order = list(STAGES)
        self.timing = OrderedDict(
            sorted(
                self.timing.items(),
                key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order),
            )
        )

    def engine_run(self, oracle: Any, num_draws: int, seed: int, device: Any) -> Any:
        """One run of the any-order engine with this run's method, knobs and progress bar
        (the engine's), recorded (:meth:`record`); every run kind's engine call is this one."""
        result = sample_any_order(
            oracle,
            num_draws,
            method=self.method,
            seed=seed,
            device=device,
            progress=self.progress,
            distributed=self.settings.distributed,
            schedule=self.schedule,
        )
        return self.record(result)

    def record(self, result: Any) -> Any:
        """Keep a sampler's result (``results``) and add its wall time to ``timing``."""
        self.results.append(result)
        self.add_engine_time(result)
        return result

    def add_engine_time(self, result) -> None:
        """Split an engine result's wall time into ``"oracle"`` (inside the oracle's methods)
        and ``"engine"`` (the rest: the engine's own bookkeeping and inputs)."""
        oracle = float(result.timing.get("oracle", 0.0)) if result.timing else 0.0
        oracle = min(oracle, float(result.wall_time))
        self.timing["oracle"] = self.timing.get("oracle", 0.0) + oracle
        self.timing["engine"] = self.timing.get("engine", 0.0) + float(result.wall_time) - oracle

    def whole_run(self) -> dict[str, float]:
        """Counts of the whole run: ``rounds`` and ``oracle_rows`` summed over the engine runs,
        the engine's ``draws`` (warm-up and guide draws included) and ``seconds`` (of
        ``AutoSpec.run``, NaN when not measured)."""
        return {
            "rounds": sum(int(r.rounds) for r in self.results),
            "oracle_rows": sum(int(r.oracle_rows) for r in self.results),
            "draws": sum(self.engine_draws()),
            "seconds": float("nan") if self.wall_time is None else float(self.wall_time),
        }

    def engine_draws(self) -> list[int]:
        """Draws of each engine run in :attr:`results` (warm-up or guide draws included)."""
        return [int(r.num_samples) for r in self.results]

    def elimination_wanted(self, sampler: str) -> bool:
        """Forward filtering, backward sampling: asked for (``sampler="ffbs"``), or
        ``"auto"`` on a CPU with the default method (the engine's methods are asked for by
        name; on a GPU the rounds of autospeculation are its point)."""
        if sampler == "ffbs":
            return True
        on_cpu = self.device is None or torch.device(self.device).type == "cpu"
        return sampler == "auto" and on_cpu and self.method == "autospec"

    def on_cpu(self) -> bool:
        """Whether the oracle answered on a CPU (where every oracle row costs time)."""
        device = self.device
        if device is None:
            oracle = getattr(self, "oracle_device", None)
            device = oracle if oracle is not None else torch.device("cpu")
        return torch.device(device).type == "cpu"

    def sampler_used(self) -> str | None:
        """What drew the discrete sites (the diffusion guide's states, for a diffusion run):
        ``"ffbs"`` (forward filtering, backward sampling) or the engine's method
        (``results[0].method``, e.g. ``"autospec"``); ``None`` before a run.

        ``diagnostics()["sampler"]`` and ArviZ's ``sampler`` attribute hold it for every kind
        of run; for a model with continuous sites NUTS drew those
        (``"continuous_sampler"``), and this names what drew the discrete sites given them.
        """
        return self.results[0].method if self.results else None

    # ------------------------------------------------------------------------------- hooks
    def extras(self) -> Extras:
        """This kind's summary lines, diagnostics, sample stats and attributes."""
        return Extras()

    #: What the engine's coordinates are, in the rounds line.
    unit = "coordinates"

    def self_check_summary(self) -> str:
        """The self-check's line (kinds with an exact oracle override it)."""
        return ""

    def rounds_summary(self) -> str:
        """Measured wall time per draw and per stage, rounds and rows, advice, self-check."""
        lines = [line for line in (self.speed_summary(), self.self_check_summary()) if line]
        return "\n".join(lines)

    def speed_summary(self) -> str:
        """Was it fast? Measured seconds, rounds and rows of the run, and a faster exact method.

        The seconds are measured by :meth:`stage` around each stage of the run (``timing``)
        and around the whole ``AutoSpec.run`` (``wall_time``); rounds and rows are the
        engine's counts, summed over its runs (chains run one after the other). The sequential
        sampler's counts are exact, not estimated: ``n`` rounds per engine run and ``n`` rows
        per draw. Where the run did :data:`ROWS_RATIO_FOR_ADVICE` times the sequential
        sampler's rows per draw or more on a CPU (where every row costs time), or more rows
        and at least as many rounds on any device, one more line names ``method="sequential"``
        as likely faster and says how to ask for it.
        """
        if not self.results or self.layout is None:
            return ""
        n = int(self.layout.num_coords)
        returned = self.num_chains * self.num_samples
        lines = []
        stages = ", ".join(
            f"{'NUTS' if k == 'nuts' else k} {v:.2f} s"
            for k, v in self.timing.items()
            if k in STAGES
        )
        if self.wall_time is not None:
            other = self.wall_time - sum(v for k, v in self.timing.items() if k in STAGES)
            per_draw = self.wall_time / max(returned, 1)
            per = f"{1e3 * per_draw:.2f} ms" if per_draw < 1.0 else f"{per_draw:.2f} s"
            lines.append(
                f"Wall time (measured): {self.wall_time:.2f} s for {returned} draws ({per} per "
                f"draw); by stage: {stages}, other {max(other, 0.0):.2f} s."
            )
        elif stages:
            lines.append(f"Wall time by stage (measured): {stages}.")
        whole = self.whole_run()
        draws, rounds, rows = whole["draws"], whole["rounds"], whole["oracle_rows"]
        rows_per_draw = rows / max(draws, 1)
        seq_rounds = n * len(self.results)
        lines.append(self.rounds_line(n, whole))
        advice = self.faster_method(rounds, seq_rounds, rows_per_draw, n)
        if advice:
            lines.append(advice)
        return "\n".join(_wrap(line) for line in "\n".join(lines).split("\n"))

    def rounds_line(self, n: int, whole: dict) -> str:
        """Rounds per draw and the whole run's rounds and rows, beside the sequential
        sampler's exact counts (or, after forward filtering, backward sampling, its steps)."""
        if self.ffbs_plan is not None:
            plan = self.ffbs_plan
            return (
                f"Sampler: forward filtering, backward sampling (exact): one elimination pass "
                f"over the model's factors ({plan['forward_seconds']:.3g} s), then every draw "
                f"at once in {plan['steps']} sequential steps, one per site (the sequential "
                f"sampler takes {n} per draw: n = {n} coordinates); no oracle rows. "
                f"sampler='engine' runs method={self.method!r} instead."
            )
        per_draw_rounds = torch.cat([r.sample_rounds.double().cpu() for r in self.results])
        draws, rounds, rows = whole["draws"], whole["rounds"], whole["oracle_rows"]
        runs = len(self.results)
        rows_per_draw = rows / max(draws, 1)
        seq_rounds, seq_rows = n * runs, n * draws
        engine_runs = "1 engine run" if runs == 1 else f"{runs} engine runs"
        return (
            f"Rounds ({self.method}): {float(per_draw_rounds.mean()):.2f} per draw on average "
            f"(max {int(per_draw_rounds.max())}); the sequential sampler takes {n} per draw "
            f"(n = {n} {self.unit}).\n"
            f"Whole run: {rounds:,} rounds and {rows:,} oracle rows for {draws:,} draws in "
            f"{engine_runs} ({rows_per_draw:.1f} rows per draw); the sequential sampler: "
            f"{seq_rounds:,} rounds and {seq_rows:,} rows ({n} per draw)."
        )

    def faster_method(self, rounds: int, seq_rounds: int, rows_per_draw: float, n: int) -> str:
        """The line naming ``method="sequential"`` where it likely is faster ("" otherwise)."""
        if self.ffbs_plan is not None or self.method in ("sequential", "picard") or n <= 0:
            return ""
        ratio = rows_per_draw / n
        more_rounds = rounds >= seq_rounds
        cpu = self.on_cpu()
        if ratio < ROWS_RATIO_FOR_ADVICE or not (cpu or more_rounds):
            return ""
        why = (
            f"this run did {ratio:.1f}x the sequential sampler's oracle rows per draw "
            f"({rows_per_draw:.1f} against n = {n})"
        )
        if more_rounds:
            why += f" and at least its rounds ({rounds} against {seq_rounds})"
        if cpu:
            why += ", and on a CPU every oracle row costs time"
        return (
            f"Likely faster here: method='sequential' (the same exact law), since {why}. Ask "
            f"for it with AutoSpec(model, ..., method='sequential')."
        )

    #: Whether the draws are independent (exact draws, or a diffusion guide's): then one
    #: chain may be exported to ArviZ as several (see :meth:`export_chains`).
    independent_draws = False

    def export_chains(self) -> int:
        """Chains of the ArviZ export: ``num_chains``, or, for ONE chain of independent draws,
        the smallest ``d >= 2`` that divides the draws with 4 or more per part (ArviZ's
        R-hat needs 2 chains of 4 draws; for independent draws the split changes no
        statistic's meaning). 1 when no such ``d`` exists (fewer than 8 draws, or a prime
        number of draws).
        """
        if self.num_chains != 1 or not self.independent_draws:
            return self.num_chains
        draws = self.num_samples
        for d in range(2, draws // 4 + 1):
            if draws % d == 0:
                return d
        return 1

    # ----------------------------------------------------------------------------- reading
    def saved(self) -> OrderedDict:
        """Latent and deterministic sites, restricted to ``save_params`` if given."""
        everything = OrderedDict(self.samples)
        everything.update(self.deterministic)
        if self.save_params is None:
            return everything
        return OrderedDict((k, v) for k, v in everything.items() if k in self.save_params)

    def get_samples(
        self,
        num_samples: int | None = None,
        group_by_chain: bool = False,
        include_discrete: bool = True,
    ) -> dict[str, torch.Tensor]:
        if num_samples is not None and not is_count(num_samples):
            raise ValueError(
                f"get_samples(num_samples=...) takes a positive int (that many draws picked at "
                f"random with replacement, as pyro.infer.MCMC does) or None (every draw); got "
                f"{num_samples!r}"
            )
        samples = self.saved()
        if not include_discrete:  # deterministic sites may read the discrete ones: dropped
            dropped = set(self.discrete_names) | set(self.deterministic)
            samples = {k: v for k, v in samples.items() if k not in dropped}
        if not samples:
            return {}
        return select_samples(samples, num_samples, group_by_chain)

    def get_extra_fields(self, group_by_chain: bool = False) -> dict[str, torch.Tensor]:
        if group_by_chain:
            return dict(self.extra)
        return {k: v.reshape((-1,) + v.shape[2:]) for k, v in self.extra.items()}

    def _float_samples(self) -> dict[str, torch.Tensor]:
        return {k: v.double() for k, v in self.saved().items()}

    def diagnostics(self) -> dict[str, Any]:
        sites, unavailable = site_diagnostics(self._float_samples())
        diag: dict[str, Any] = {}  # the run's entries, beside the sites'
        chains = [f"chain {i}" for i in range(self.num_chains)]
        diag["divergences"] = {c: [] for c in chains}
        if self.results:
            per_chain = self.results if len(self.results) == self.num_chains else None
            if per_chain is not None:
                diag["rounds"] = {c: r.rounds for c, r in zip(chains, per_chain, strict=True)}
                diag["oracle_rows"] = {
                    c: r.oracle_rows for c, r in zip(chains, per_chain, strict=True)
                }
                diag["wall_time"] = {c: r.wall_time for c, r in zip(chains, per_chain, strict=True)}
            else:
                diag["rounds"] = {"all chains": sum(r.rounds for r in self.results)}
                diag["oracle_rows"] = {"all chains": sum(r.oracle_rows for r in self.results)}
                diag["wall_time"] = {"all chains": sum(r.wall_time for r in self.results)}
            rounds = self.extra["sample_rounds"].double()
            diag["mean rounds per draw"] = {
                c: float(r.mean()) for c, r in zip(chains, rounds, strict=True)
            }
        if isinstance(self.settings.seed, int):  # the run's int seed: seed= it repeats the run
            diag["seed"] = self.settings.seed
        diag["seconds"] = dict(self.timing)
        if self.wall_time is not None:
            diag["seconds"]["total"] = self.wall_time
        if self.results:
            diag["whole run"] = self.whole_run()
            diag["sampler"] = self.sampler_used()
        if unavailable:
            diag["unavailable"] = unavailable
        diag.update(self.extras().diagnostics)
        return with_sites(sites, diag)

    def summary(self, prob: float = 0.9, var_names=None, group: bool | None = None) -> None:
        check_prob(prob)  # before anything is printed
        samples = self._float_samples()
        print_summary(samples, prob=prob, var_names=var_names, group=group)
        if samples and next(iter(samples.values())).shape[1] < 4:
            print(
                "n_eff and r_hat need at least 4 draws per chain: shown as nan (exact "
                "independent draws have n_eff equal to their number)."
            )
        extras = self.extras()
        divergences = extras.diagnostics.get("divergences")
        count = 0 if divergences is None else sum(len(v) for v in divergences.values())
        print(f"Number of divergences: {count}")
        text = self.rounds_summary()
        if text:
            print(text)
        for line in extras.summary_lines:
            print(line)

    def marginal_pointwise(self) -> dict:
        """``name -> Tensor[C, S, *batch_shape]``: the pointwise log likelihood with the
        discrete sites summed out per observation; ``ValueError`` (with the reason) when the
        model has no such form. A model without discrete sites has only one form."""
        if not self.discrete_names:
            return dict(self.pointwise)
        raise ValueError("this kind of run cannot sum its discrete sites out")

    def _log_likelihood_group(self, log_likelihood) -> tuple[dict | None, str | None]:
        """The ``log_likelihood`` group asked for, and its form (``"marginal"`` or
        ``"conditional"``)."""
        forms = (True, False, None, "auto", "marginal", "conditional")
        if not any(log_likelihood is f or log_likelihood == f for f in forms):
            raise ValueError(
                f"log_likelihood must be 'auto' (the default: 'marginal' where the model allows "
                f"it, else 'conditional'), 'marginal', 'conditional' or False; got "
                f"{log_likelihood!r}"
            )
        if log_likelihood is False or log_likelihood is None:
            return None, None
        if log_likelihood == "conditional":
            return dict(self.pointwise), "conditional"
        try:
            return self.marginal_pointwise(), "marginal"
        except ValueError as error:
            if log_likelihood == "marginal":
                raise ValueError(
                    f"log_likelihood='marginal' is not available for this model: {error}. "
                    f"Use log_likelihood='conditional' (each draw's log likelihood given its "
                    f"own discrete values), which LOO and WAIC cannot use to compare models."
                ) from error
            # Not a warning: most chain models (an HMM) have no per-observation marginal, and
            # the attribute log_likelihood_form says which form was stored. The reason is kept
            # for whoever reads the attributes or the log.
            self.log_likelihood_reason = str(error)
            _LOG.info(
                "The ArviZ log_likelihood group is conditional on each draw's sampled discrete "
                "values: %s. az.loo and az.waic on it do not estimate the predictive accuracy of "
                "the model (they would need the discrete sites summed out per observation).",
                error,
            )
            return dict(self.pointwise), "conditional"

    def to_inference_data(
        self,
        coords: dict | None = None,
        dims: dict | None = None,
        log_likelihood: bool | str = "auto",
        *,
        method: str = "autospec",
        split_chains: bool = True,
    ):
        posterior = {}
        for name, value in self.saved().items():
            if name in self.discrete_names and _integer_valued(value):
                value = value.long()
            posterior[name] = value
        extras = self.extras()
        extra = self.extra
        sample_stats = {
            k: extra[k]
            for k in ("lp", "sample_rounds", "oracle_rows_per_draw", "oracle_log_prob")
            if k in extra
        }
        sample_stats["diverging"] = torch.zeros(extra["lp"].shape, dtype=torch.bool)
        sample_stats.update(extras.sample_stats)
        attrs = {"inference_library": "pyro_autospec", "method": method}
        seed = self.settings.seed
        if isinstance(seed, int):  # netCDF holds int64: a larger seed as text
            attrs["seed"] = seed if seed < 2**63 else str(seed)
        if self.wall_time is not None:
            attrs["wall_time"] = float(self.wall_time)
        if self.results:
            whole = self.whole_run()
            attrs["rounds"], attrs["oracle_rows"] = whole["rounds"], whole["oracle_rows"]
            attrs["sampler"] = self.sampler_used()
        attrs.update(extras.attrs)
        pointwise, form = self._log_likelihood_group(log_likelihood)
        if form is not None:
            attrs["log_likelihood_form"] = form
            if form == "conditional" and log_likelihood in (True, "auto"):
                attrs["log_likelihood_reason"] = self.log_likelihood_reason
        split = self.export_chains() if split_chains and self.num_chains == 1 else 1
        if split > 1:
            posterior, sample_stats = _split(posterior, split), _split(sample_stats, split)
            pointwise = None if pointwise is None else _split(pointwise, split)
            attrs["chains_split_from"] = 1
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*More chains .* than draws.*")
            return to_inference_data(
                posterior,
                sample_stats=sample_stats,
                log_likelihood=pointwise,
                observed_data=dict(self.observed),
                coords=coords,
                dims=dims,
                attrs=attrs,
            )
