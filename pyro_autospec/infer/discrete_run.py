"""The run of a model whose latent sites are all discrete: exact draws, or a guide corrected.

With the default oracle (exact enumeration, compiled once) or a user's exact oracle, every draw
is an exact, independent draw of ``p(x | data)``, and the run checks it: ``log p(x, data) -
log q(x)`` must be the same for every draw of every chain (see
:class:`~pyro_autospec.infer.self_check.SelfCheck`). With a guide (an approximate oracle)
each draw carries the log importance weight ``log p(x, data) - log q_sigma(x)`` and the
``correction`` turns the guide's draws into draws of the posterior; the guide's diagnostics
(k-hat, weights' ESS, IMH acceptance) all come from :meth:`DiscreteRun.guide_report`.

*Which sampler.* With the default oracle on a CPU, ``sampler="auto"`` draws by forward
filtering, backward sampling (:mod:`pyro_autospec.model.ffbs`: one elimination pass, then all
draws at once) whenever the model's factor graph has an elimination that fits, and by the
any-order engine (``method``) otherwise; ``"engine"`` always takes the engine, ``"ffbs"``
requires the elimination. Both are exact and self-checked on every draw; ``results[i].method``
and the summary say which ran.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch

from pyro_autospec._warnings import user_stacklevel
from pyro_autospec.diagnostics.weights import weight_diagnostics
from pyro_autospec.engine.memory import Footprint, check_memory, format_bytes
from pyro_autospec.engine.stepping import progress_bar
from pyro_autospec.infer.correction import importance_resample, independent_metropolis_hastings
from pyro_autospec.infer.draws import DrawEvaluator, ModelCall, Pointwise, check_assignments
from pyro_autospec.infer.oracle_choice import (
    build_oracle,
    check_guide_sites,
    guide_for_call,
    warn_other_data,
)
from pyro_autospec.infer.run_base import Extras, RunBase, RunSettings
from pyro_autospec.infer.seeds import correction_seed
from pyro_autospec.infer.self_check import SelfCheck, reference_for, reference_log_normalizer
from pyro_autospec.model.discrete import SiteLayout
from pyro_autospec.model.enum import EnumOracle, check_evidence, nan_sites
from pyro_autospec.model.errors import AutoSpecModelError
from pyro_autospec.model.ffbs import ELIMINATION_DOES_NOT_FIT, plan_ffbs, sample_exact

__all__ = ["SAMPLERS", "DiscreteRun", "warn_scales"]

#: Values of ``AutoSpec(sampler=...)``.
SAMPLERS = ("auto", "engine", "ffbs")


def warn_scales(layout: SiteLayout) -> None:
    """Warn once per run that scaled sites make the target the scaled density."""
    if not layout.scales:
        return
    sites = ", ".join(f"'{k}' (mean scale {v:.3g})" for k, v in layout.scales.items())
    warnings.warn(
        f"Sites {sites} are scaled (poutine.scale, or a plate with a fixed subsample): the "
        f"draws follow the scaled density exp(sum of scale * log p), as pyro.infer.MCMC does, "
        f"and the recorded lp includes the scales; the pointwise log likelihood does not.",
        UserWarning,
        stacklevel=user_stacklevel(),
    )


def _pick(values: torch.Tensor, keep: torch.Tensor | slice) -> torch.Tensor:
    """The rows ``keep`` of a chain's ``values`` (a slice: a view, no copy)."""
    return values[keep if isinstance(keep, slice) else keep.to(values.device)]


def _stack_chains(per_chain: dict) -> OrderedDict:
    """``name -> Tensor[C, ...]`` from each name's list of the chains' tensors, emptying the
    lists as it goes (one name's copy at a time beside them; one chain: a view)."""
    out = OrderedDict()
    for name in list(per_chain):
        parts = per_chain.pop(name)
        out[name] = parts[0].unsqueeze(0) if len(parts) == 1 else torch.stack(parts)
        del parts
    return out


class DiscreteRun(RunBase):
    """Draws of a discrete-only model's latent sites by the any-order engine.

    Parameters
    ----------
    model : callable
    layout : SiteLayout
    settings : RunSettings
        Method, draws per chain, chains, warm-up (IMH), seed, device and engine knobs.
    oracle : "enum" or MarginalOracle
    guide : MarginalOracle, optional
        An approximate oracle (replaces ``oracle``).
    correction : {None, "importance", "imh"}
    sampler : {"auto", "engine", "ffbs"}
        See the module's notes.
    """

    def __init__(
        self,
        model: Callable,
        layout: SiteLayout,
        settings: RunSettings,
        *,
        oracle: Any,
        guide: Any,
        correction: str | None,
        sampler: str = "auto",
    ):
        super().__init__(settings)
        self.sampler = sampler
        self.model = model
        self.layout = layout
        self.oracle = oracle
        self.guide = guide
        self.correction = correction
        self.discrete_names = list(layout.names)
        self.guide_log_weight: torch.Tensor | None = None
        self.evidence_log_z: float | None = None  # the model's exact log Z, for the weights
        self.max_self_check_error: float | None = None
        # extra draws and uniform probes the self-check compared (draws.check_assignments)
        self.num_check_draws = self.num_probes = self.num_massless_probes = 0

    @property
    def independent_draws(self) -> bool:
        """Exact oracle, no correction: every draw is an independent draw of the posterior."""
        return self.guide is None and self.correction is None

    @property
    def weights_tracked(self) -> bool:
        return self.guide is not None or self.correction is not None

    def run(self, args: tuple, kwargs: dict) -> DiscreteRun:
        layout = self.layout
        if self.guide is not None:
            check_guide_sites(self.guide, self.model, layout)
        source = self.oracle if self.guide is None else guide_for_call(self.guide, args, kwargs)
        plan = None
        if self._wants_ffbs():
            too_large: list[str] = []
            with self.stage("compiling"):
                oracle = self._ffbs_oracle(args, kwargs)
                plan = plan_ffbs(oracle, too_large)
            if plan is None and self.sampler == "auto" and too_large:
                warnings.warn(
                    f"forward filtering, backward sampling does not fit this model: "
                    f"{too_large[0]}. The any-order engine runs instead, and each of its "
                    f"oracle rows is a contraction of the model's factors of about that size, "
                    f"so the run may be slow. A learned guide needs no enumeration: guide = "
                    f"AnyOrderGuide(model, args); guide.fit_posterior(*args); AutoSpec(model, "
                    f"guide=guide, correction='imh')",
                    UserWarning,
                    stacklevel=user_stacklevel(),
                )
            if plan is None and self.sampler == "ffbs":
                raise ValueError(ELIMINATION_DOES_NOT_FIT)
        else:
            with self.stage("compiling"):
                oracle = build_oracle(source, self.model, args, kwargs, layout, self.device)
                if self.guide is not None and source is self.guide:
                    # a guide's oracle for other data (guide.oracle(*A)) answers for them
                    warn_other_data(source, args, kwargs, self.correction)
        self._args, self._kwargs, self._oracle = args, kwargs, oracle
        exact = self.guide is None and self.correction is None  # else the draws are corrected
        custom = exact and not isinstance(self.oracle, str)

        def explain_nan() -> list[str]:
            return nan_sites(self.model, args, kwargs, layout.max_plate_nesting)

        if plan is not None:
            check_evidence(plan.log_normalizer, explain_nan)
        elif isinstance(oracle, EnumOracle):
            check_evidence(oracle.log_normalizer(), explain_nan)
        device = self.device or getattr(oracle, "device", None)
        self.oracle_device = device
        self.observed = dict(layout.observed)
        per_chain = {name: [] for name in layout.names}
        determ = {name: [] for name in layout.deterministic}
        pointwise = {name: [] for name in layout.observed}
        extra = {"sample_rounds": [], "oracle_rows_per_draw": [], "lp": [], "oracle_log_prob": []}
        if self.weights_tracked:
            extra["log_weight"] = []
        if self.correction == "imh":
            extra["accepted"], extra["acceptance_rate"] = [], []
        all_weights = []
        self_check = None
        self.self_check_reference, self.self_check_why_not = None, ""
        if exact:
            log_z = None if plan is None else plan.log_normalizer
            if custom and not hasattr(oracle, "log_normalizer"):
                # draws compared only with each other pass for an oracle that is exact on
                # part of the posterior's values: log Z by elimination, where it fits
                with self.stage("self-check"):
                    log_z, self.self_check_why_not = reference_for(
                        oracle, custom, self.model, args, kwargs, layout, self.device
                    )
                self.self_check_reference = "none" if log_z is None else "enumeration"
            self_check = SelfCheck(oracle, custom_oracle=custom, log_normalizer=log_z)
        elif self.correction is not None:
            # the weights' mean estimates Z times the posterior mass the guide draws: the
            # exact Z, where the elimination fits, shows mass the guide never draws
            with self.stage("correction"):
                self.evidence_log_z = reference_log_normalizer(
                    self.model, args, kwargs, layout, self.device
                )
        draws = DrawEvaluator(
            ModelCall(self.model, args, kwargs),
            layout,
            self_check=self_check,
            device=device,
            stage=self.stage,
        )
        num_draws = self.num_samples + self.warmup_steps
        self._check_memory(num_draws)
        self.results = []
        seeds = self.settings.seeds(self.num_chains)
        checks = None
        if self_check is not None and (plan is not None or isinstance(oracle, EnumOracle)):
            with self.stage("self-check"):
                checks = check_assignments(
                    layout, oracle, seeds[0], self.num_chains * num_draws, plan=plan
                )
        # forward filtering draws a chain in one pass, so its bar counts chains' draws (the
        # engine shows its own, round by round)
        bar = progress_bar(self.progress and plan is not None, len(seeds) * num_draws, "ffbs")
        for chain, seed in enumerate(seeds):
            if plan is not None:
                result = self.record(sample_exact(plan, num_draws, seed))
            else:
                result = self.engine_run(oracle, num_draws, seed, device)
            # the check's assignments in the first chain's first chunk: one trace of the model
            evaluated = draws.evaluate_in_chunks(
                result.samples, result.log_prob, checks=checks if chain == 0 else None
            )
            values, joint = evaluated.values, evaluated.joint
            lp, oracle_lp = evaluated.lp, evaluated.oracle_log_prob
            log_weight = evaluated.log_weight
            all_weights.append(log_weight.cpu())
            with self.stage("correction") if self.correction else nullcontext():
                keep = self._correct(log_weight.cpu(), seed, extra)
            for name in layout.names:
                per_chain[name].append(_pick(values[name], keep))
            for name in determ:
                determ[name].append(_pick(joint.deterministic[name], keep))
            for name in pointwise:
                table = joint.pointwise[name]
                rows = evaluated.rows
                if rows is None:
                    pointwise[name].append(_pick(table, keep))
                else:  # the distinct draws' rows index the host draws
                    pointwise[name].append((table, _pick(rows, keep)))
            # copies: the result's own tensors stay the result's (results[i])
            rounds = result.sample_rounds.to(lp.device, torch.long, copy=True)
            extra["sample_rounds"].append(_pick(rounds, keep))
            extra["oracle_rows_per_draw"].append(
                torch.full(
                    (self.num_samples,),
                    result.oracle_rows / num_draws,
                    dtype=torch.float64,
                    device=lp.device,
                )
            )
            extra["lp"].append(_pick(lp, keep))
            extra["oracle_log_prob"].append(_pick(oracle_lp.clone(), keep))
            if "log_weight" in extra:
                extra["log_weight"].append(_pick(log_weight, keep))
            lp_device = lp.device
            del evaluated, values, joint, lp, oracle_lp, log_weight  # the chain's pieces
            if bar is not None:
                bar.update(num_draws)
        if bar is not None:
            bar.close()
        self.num_check_draws, self.num_probes, self.num_massless_probes = draws.compared
        self.order_timing()
        # every draw of every chain at once: one draw per chain still compares draws
        self.max_self_check_error = draws.check()
        if self.self_check_reference == "none" and self.num_chains * num_draws < 2:
            why = self.self_check_why_not or "the model's discrete sites were not eliminated"
            warnings.warn(
                f"the self-check compared nothing: the run made one draw from the oracle passed "
                f"as oracle=, which has no log_normalizer(), and there is no exact log Z to "
                f"compare it with ({why}; see "
                f"pyro_autospec.infer.self_check.reference_log_normalizer); with two or more "
                f"draws (num_samples or num_chains) they are compared with each other",
                UserWarning,
                stacklevel=user_stacklevel(),
            )
        if plan is not None:  # what the summary reports; the buckets' tables are let go
            self.ffbs_plan = {"forward_seconds": plan.forward_seconds, "steps": plan.num_steps}
        self.samples = _stack_chains(per_chain)
        self.deterministic = _stack_chains(determ)
        self.extra = _stack_chains({k: [t.to(lp_device) for t in v] for k, v in extra.items()})
        self.pointwise = Pointwise(pointwise)
        self.guide_log_weight = torch.stack(all_weights)
        self._warn_weights()
        return self

    def _check_memory(self, num_draws: int) -> None:
        """Refuse, before any draw, a run whose draws this machine certainly cannot hold.

        Counted is what a run must hold whatever its model: per draw its coordinates (int64),
        the sites' values (8 bytes an entry at most) and about a dozen per-draw numbers
        (forward filtering's tables and the model's traces hold one chunk of draws at a time:
        :meth:`~pyro_autospec.model.ffbs.FFBSPlan.sample`,
        :meth:`~pyro_autospec.infer.draws.DrawEvaluator.evaluate_in_chunks`). The log
        densities and the pointwise log likelihood are left out (they are kept once per
        distinct assignment), so this is a lower bound: a run near the machine's memory may
        still fail in torch's allocator.
        """
        layout = self.layout
        n = layout.num_coords
        widest = max((site.num_coords * site.support_size for site in layout.sites), default=0)
        held = 16 * n + 96
        total = self.num_chains * num_draws
        request = f"num_samples={self.num_samples}"
        if self.warmup_steps:
            request += f" (+ warmup_steps={self.warmup_steps})"
        if self.num_chains > 1:
            request += f" x num_chains={self.num_chains}"
        check_memory(
            Footprint(total, held, largest=num_draws * max(n, widest)),
            request=f"{request} draws of a model with {n} discrete coordinates",
            holds=f"at least {format_bytes(held)} per draw: its coordinates and site values",
            exact=self.independent_draws,
        )

    def _wants_ffbs(self) -> bool:
        """Forward filtering, backward sampling: asked for, or ``"auto"`` where it applies."""
        if self.sampler == "engine" or self.guide is not None or self.correction is not None:
            return False
        if not (isinstance(self.oracle, str) and self.oracle == "enum"):
            return False
        # with distributed=True every rank draws every draw (one cheap pass): all ranks and
        # a single process agree
        return self.elimination_wanted(self.sampler)

    def _ffbs_oracle(self, args: tuple, kwargs: dict):
        """The compiled factors (lazy: the contraction is measured only if the engine runs)."""
        return EnumOracle(
            self.model, args, kwargs, layout=self.layout, device=self.device, lazy=True
        )

    def marginal_pointwise(self) -> dict:
        """The pointwise log likelihood with the discrete sites summed out per observation
        (see :meth:`~pyro_autospec.model.enum.EnumOracle.pointwise_log_likelihood`): it
        depends on no latent site here, so every draw has the same values."""
        oracle = self._oracle
        if not isinstance(oracle, EnumOracle):
            try:
                oracle = EnumOracle(self.model, self._args, self._kwargs, layout=self.layout)
            except AutoSpecModelError as error:
                first = str(error).split(". ")[0]
                raise ValueError(
                    f"the model's discrete sites cannot be enumerated ({first})"
                ) from error
        shape = (self.num_chains, self.num_samples)
        return {
            name: value[0].to(self.extra["lp"].device).expand(shape + value.shape[1:])
            for name, value in oracle.pointwise_log_likelihood().items()
        }

    def _correct(self, log_weight: torch.Tensor, seed: int, extra: dict) -> torch.Tensor | slice:
        """Indices of the draws a chain returns, after the correction (without one, the
        first ``num_samples``: a slice, whose rows are views of the chain's)."""
        if self.correction is None:
            return slice(0, self.num_samples)
        if not bool(torch.isfinite(log_weight).any()):
            raise ValueError(
                "every guide draw has zero probability under the model (log p(x, data) = -inf): "
                "the guide cannot be corrected; train it (fit_posterior) or check the model"
            )
        seed = correction_seed(seed)  # a stream of the chain's seed, for keyed uniforms
        if self.correction == "importance":
            index, _ = importance_resample(log_weight, self.num_samples, seed=seed)
            return index
        index, accepted, accept_prob = independent_metropolis_hastings(log_weight, seed=seed)
        warm = self.warmup_steps
        extra["accepted"].append(accepted[warm:])
        extra["acceptance_rate"].append(accept_prob[warm:])
        return index[warm:]

    # ------------------------------------------------------------------- guide diagnostics
    def guide_diagnostics(self):
        """k-hat, weights' ESS and IMH acceptance of the guide's draws, from the one function
        :func:`~pyro_autospec.diagnostics.weights.weight_diagnostics` (``None`` without a guide).

        The IMH acceptance is the chains' mean acceptance probability (after warm-up) when
        ``correction="imh"`` ran them, else estimated from the weights.
        """
        if not self.weights_tracked or self.guide_log_weight is None:
            return None
        accept_prob = self.extra.get("acceptance_rate") if self.correction == "imh" else None
        return weight_diagnostics(
            self.guide_log_weight,
            accept_prob=accept_prob,
            correction=self.correction,
            log_normalizer=self.evidence_log_z,
        )

    def weight_diagnostics(self) -> dict[str, Any]:
        """Pareto k-hat and ESS of the guide draws' importance weights, per chain and pooled.

        With fewer than 5 draws per chain, or where the largest weights are a few tied values
        (:func:`~pyro_autospec.diagnostics.weights.tied_tail`), the k-hat is NaN (reported as
        unavailable, with the reason).
        """
        diag = self.guide_diagnostics()
        chains = [f"chain {i}" for i in range(len(diag.khat_per_chain))]
        khat = dict(zip(chains, diag.khat_per_chain, strict=True))
        ess = dict(zip(chains, diag.weights_ess_per_chain, strict=True))
        khat["all"], ess["all"] = diag.khat, diag.weights_ess
        per = diag.num_draws // len(chains)
        draws = {**dict.fromkeys(chains, per), "all": diag.num_draws}
        return {"khat": khat, "weights_ess": ess, "num_draws": per, "weights_draws": draws}

    def guide_report(self) -> Extras:
        """Everything the guide run adds to the summaries, from one place.

        ``diagnostics()`` gets ``khat``, ``weights_ess`` and ``weights_draws`` (the guide draws
        weighed, warm-up included: the ESS's denominator; per chain and ``"all"``),
        ``imh_acceptance`` and (IMH) the per-chain ``acceptance rate``; ArviZ's ``sample_stats``
        gets ``log_weight`` (and, IMH, ``acceptance_rate``) per draw, and every group the
        attributes ``pareto_khat``, ``weights_ess``, ``imh_acceptance`` and ``correction``;
        ``summary()`` prints them with the fix when they are poor.
        """
        report = Extras()
        diag = self.guide_diagnostics()
        if diag is None:
            return report
        per_chain = self.weight_diagnostics()
        report.diagnostics["khat"] = per_chain["khat"]
        report.diagnostics["weights_ess"] = per_chain["weights_ess"]
        # the ESS's denominator: every guide draw weighed (IMH's warm-up included)
        report.diagnostics["weights_draws"] = per_chain["weights_draws"]
        report.diagnostics["imh_acceptance"] = diag.imh_acceptance
        if "log_weight" in self.extra:
            report.sample_stats["log_weight"] = self.extra["log_weight"]
        if "acceptance_rate" in self.extra:
            report.sample_stats["acceptance_rate"] = self.extra["acceptance_rate"]
        report.attrs.update(
            {
                "correction": str(self.correction),
                "pareto_khat": diag.khat,
                "weights_ess": diag.weights_ess,
                "imh_acceptance": diag.imh_acceptance,
                "imh_acceptance_source": diag.acceptance_source,
                "evidence_share": diag.evidence_share,  # nan without an exact Z
            }
        )
        verdict = diag.verdict
        if verdict == "unavailable":
            verdict = f"unavailable: {diag.khat_unavailable}"
        elif verdict == "usable with caution":
            verdict = "usable with caution (slow convergence)"
        elif verdict == "not reliable":
            verdict = "NOT reliable: the correction cannot be trusted"
        per = ", ".join(f"{k:.2f}" for k in diag.khat_per_chain)
        source = "estimated"
        if diag.acceptance_source == "chains":
            source = "mean acceptance probability of the chains"
        text = (
            f"Importance weights log p(x, data) - log q_sigma(x) of {diag.num_draws} guide "
            f"draws: Pareto k-hat {diag.khat:.2f} ({verdict}; per chain {per}), weights' ESS "
            f"{diag.weights_ess:.1f} ({100 * diag.weights_ess / diag.num_draws:.1f}%), IMH "
            f"acceptance {diag.imh_acceptance:.2f} ({source}). Correction: {self.correction}."
        )
        if self.correction == "imh":
            rate = self.extra["accepted"].double().mean(-1)
            chains = [f"chain {i}" for i in range(self.num_chains)]
            report.diagnostics["acceptance rate"] = {
                c: float(r) for c, r in zip(chains, rate, strict=True)
            }
            text += f" Realised IMH acceptance rate {float(rate.mean()):.2f}."
        warning = diag.warning()
        if warning is not None:
            text += f" Warning: {warning}"
        report.summary_lines.append(text)
        return report

    def weights_summary(self) -> str:
        """One paragraph: Pareto k-hat and ESS of the guide's importance weights."""
        lines = self.guide_report().summary_lines
        return lines[0] if lines else ""

    def _warn_weights(self) -> None:
        diag = self.guide_diagnostics()
        if diag is not None:
            diag.warn(stacklevel=user_stacklevel())

    # ------------------------------------------------------------------------- summaries
    def extras(self) -> Extras:
        # which sampler made the draws ("ffbs", or the engine's method) is RunBase's, for
        # every kind of run: diagnostics()["sampler"] and ArviZ's "sampler" attribute
        return self.guide_report()

    def self_check_summary(self) -> str:
        if self.max_self_check_error is None:
            return ""
        total = self.num_chains * (self.num_samples + self.warmup_steps)
        draws = "the run's one draw" if total == 1 else f"all {total} draws of the run"
        if self.num_check_draws:
            draws += f" and {self.num_check_draws} more drawn for this check alone"
        if self.num_probes:
            probes, massless = self.num_probes, self.num_massless_probes
            if massless:
                draws += (
                    f", and at {probes - massless} of {probes} uniformly drawn assignments "
                    f"(the other {massless} have no mass under either law)"
                )
            else:
                draws += f", and at {probes} uniformly drawn assignments"
        deviation = f"largest deviation {self.max_self_check_error:.2g}"
        if self.self_check_reference == "none":
            why = self.self_check_why_not or "the model's discrete sites were not eliminated"
            if total == 1:
                return (
                    f"Self-check: nothing compared (one draw of the oracle passed as oracle=, "
                    f"and no exact log Z: {why})."
                )
            return (
                f"Self-check passed: log p(x, data) - log q(x) is constant across {draws} "
                f"(every chain; {deviation}). No exact log Z to compare it with ({why}): an "
                f"oracle= exact on part of the posterior's values only would pass this check."
            )
        if self.self_check_reference == "enumeration":
            return (
                f"Self-check passed: log p(x, data) - log q(x) equals log Z, from an exact "
                f"elimination of the model's discrete sites, for {draws} ({deviation})."
            )
        if total == 1:
            return (
                f"Self-check passed: log p(x, data) - log q(x) equals log Z for {draws} "
                f"({deviation})."
            )
        return (
            f"Self-check passed: log p(x, data) - log q(x) is constant across {draws} "
            f"(every chain; {deviation})."
        )
