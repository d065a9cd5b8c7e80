"""What every kind of AutoSpec run stores and how it is read: samples, fields, summaries, ArviZ.

A run object (:class:`~pyro_autospec.infer.discrete_run.DiscreteRun`,
:class:`~pyro_autospec.infer.mixed_run.MixedRun`,
:class:`~pyro_autospec.infer.diffusion_run.DiffusionRun`) fills the fields of
:class:`RunBase` in its ``run``; the reading methods here are shared. Each kind adds its own
lines to the summary, fields to ``sample_stats`` and entries to ``diagnostics()`` through the
hooks :meth:`RunBase.extras` (one method, so that a kind's diagnostics live in one place).
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import torch
from pyro.infer.mcmc.util import select_samples

from pyro_autospec.infer.common import chain_seeds, print_summary_table, site_diagnostics

__all__ = ["Extras", "RunBase", "RunSettings"]

_OWN_SEED = object()


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
        Engine knobs (``distributed=True`` among them when asked for).
    warmup_steps : int
        NUTS's or the IMH chains' warm-up (0 where none applies).
    device : torch.device or None
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

    @property
    def distributed(self) -> bool:
        """Whether the draws are spread over a ``torch.distributed`` group."""
        return bool(self.schedule.get("distributed", False))

    def seeds(self, num: int, seed: Any = _OWN_SEED) -> list[int]:
        """``num`` engine seeds from ``seed`` (default: the run's own), the same on every rank
        of a distributed run."""
        seed = self.seed if seed is _OWN_SEED else seed
        return chain_seeds(seed, num, distributed=self.distributed)


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


def _integer_valued(value: torch.Tensor) -> bool:
    return not value.is_floating_point() or bool((value == value.round()).all())


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
        self.discrete_names: list = []
        self.layout: Any = None

    # ------------------------------------------------------------------------------- hooks
    def extras(self) -> Extras:
        """This kind's summary lines, diagnostics, sample stats and attributes."""
        return Extras()

    def rounds_summary(self) -> str:
        """One paragraph about rounds (kinds override it)."""
        return ""

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
        samples = self.saved()
        if not include_discrete:
            samples = {k: v for k, v in samples.items() if k not in self.discrete_names}
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
        diag, unavailable = site_diagnostics(self._float_samples())
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
            rounds = self.extra["n_rounds"].double()
            diag["mean rounds per draw"] = {
                c: float(r.mean()) for c, r in zip(chains, rounds, strict=True)
            }
        if unavailable:
            diag["unavailable"] = unavailable
        diag.update(self.extras().diagnostics)
        return diag

    def summary(self, prob: float = 0.9) -> None:
        samples = self._float_samples()
        print_summary_table(samples, prob=prob)
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
            warnings.warn(
                f"The ArviZ log_likelihood group is conditional on each draw's sampled "
                f"discrete values: {error}. az.loo and az.waic on it do not estimate the "
                f"predictive accuracy of the model (they would need the discrete sites summed "
                f"out per observation). Pass log_likelihood='conditional' to silence this.",
                UserWarning,
                stacklevel=4,
            )
            return dict(self.pointwise), "conditional"

    def to_inference_data(
        self,
        coords: dict | None = None,
        dims: dict | None = None,
        log_likelihood: bool | str = "auto",
        *,
        method: str = "autospec",
    ):
        from pyro_autospec.diagnostics.arviz import to_inference_data

        posterior = {}
        for name, value in self.saved().items():
            if name in self.discrete_names and _integer_valued(value):
                value = value.long()
            posterior[name] = value
        extras = self.extras()
        extra = self.extra
        sample_stats = {
            k: extra[k] for k in ("lp", "n_rounds", "oracle_rows", "oracle_log_prob") if k in extra
        }
        sample_stats["diverging"] = torch.zeros(extra["lp"].shape, dtype=torch.bool)
        sample_stats.update(extras.sample_stats)
        attrs = {"inference_library": "pyro_autospec", "method": method}
        attrs.update(extras.attrs)
        pointwise, form = self._log_likelihood_group(log_likelihood)
        if form is not None:
            attrs["log_likelihood_form"] = form
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
