"""``AutoSpec(model)``: exact draws of a Pyro model's latent sites, used like ``MCMC``.

Discrete sites are drawn by autospeculation from a ``MarginalOracle`` (exact enumeration by
default, or a learned :class:`~pyro_autospec.guides.AnyOrderGuide`); continuous sites from a
:class:`~pyro_autospec.guides.diffusion.DiffusionGuide`, exactly in the law of its discretised
diffusion.

References
----------
.. [1] N. Anari, C. Baronio, CJ Chen, A. Haqi, F. Koehler, A. Li, T.-D. Vuong. Parallel
   Sampling via Autospeculation. STOC 2026, arXiv:2511.07869.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from pyro import poutine
from pyro.infer.mcmc.util import diagnostics as _mcmc_diagnostics
from pyro.infer.mcmc.util import print_summary, select_samples

from pyro_autospec.infer.sites import SiteLayout, discover_sites, log_joint

__all__ = ["AutoSpec", "build_oracle", "chain_seeds", "check_schedule"]

_SCHEDULE_KNOBS = ("rho", "max_block", "max_rows_per_round", "max_elements")
CORRECTIONS = (None, "importance", "imh")
METHODS = ("autospec", "sequential", "speculative", "agr24", "picard")


def check_schedule(schedule: dict) -> dict:
    """Reject unknown schedule keywords early, naming the accepted ones."""
    unknown = sorted(set(schedule) - set(_SCHEDULE_KNOBS))
    if unknown:
        raise TypeError(
            f"unknown keyword(s) {unknown}; the schedule knobs passed to the engine are "
            f"{list(_SCHEDULE_KNOBS)}"
        )
    return dict(schedule)


def chain_seeds(seed: int | torch.Generator | None, num: int) -> list[int]:
    """``num`` engine seeds from ``seed``; ``None`` draws them from torch's global RNG.

    With ``seed=None`` the draws follow ``pyro.set_rng_seed`` like every Pyro sampler.
    """
    if seed is None:
        gen = None
    elif isinstance(seed, torch.Generator):
        gen = seed
    elif isinstance(seed, (int, np.integer)):
        gen = torch.Generator().manual_seed(int(seed))
    else:
        raise TypeError(
            f"seed must be an int, a torch.Generator or None; got {type(seed).__name__}"
        )
    draws = torch.randint(0, 2**62, (num,), generator=gen, device=gen.device if gen else "cpu")
    return [int(s) for s in draws.tolist()]


def build_oracle(oracle: Any, model: Callable, args: tuple, kwargs: dict, layout: SiteLayout):
    """``"enum"``: an :class:`~pyro_autospec.oracles.enum.EnumOracle`; else check the oracle."""
    if isinstance(oracle, str):
        if oracle != "enum":
            raise ValueError(
                f"oracle must be 'enum' or a MarginalOracle instance; got the string {oracle!r}"
            )
        from pyro_autospec.oracles.enum import EnumOracle

        return EnumOracle(model, args, kwargs, layout=layout)
    layout.check_oracle(oracle)
    return oracle


def _is_diffusion_guide(guide: Any) -> bool:
    """A diffusion guide serves ``MeanOracle`` rows over continuous sites (not marginals)."""
    return (
        guide is not None
        and hasattr(guide, "times")
        and hasattr(guide, "layout")
        and callable(getattr(guide, "oracle", None))
        and not callable(getattr(guide, "log_marginals", None))
    )


@dataclass
class _ContinuousView:
    """What the summaries need of a continuous model: its sites, steps and data."""

    names: list
    num_coords: int  # steps of the diffusion: the sequential sampler's rounds per draw
    observed: dict


def _integer_dtype(value: torch.Tensor) -> bool:
    return not value.is_floating_point() or bool((value == value.round()).all())


class AutoSpec:
    """Exact, independent draws of a Pyro model's discrete latent sites given its data.

    ``AutoSpec`` has the interface of :class:`pyro.infer.MCMC` (``run``, ``get_samples``,
    ``diagnostics``, ``summary``) but its draws are exact and independent: every draw follows
    the chain rule of the posterior ``p(x | data)`` over the model's discrete latent sites in
    a uniformly random order, and autospeculation [1]_ samples ``n`` coordinates in about
    ``sqrt(n)`` batched oracle calls ("rounds") instead of ``n``.

    Parameters
    ----------
    model : callable
        A Pyro model whose latent sites are all enumerable discrete sites (Bernoulli,
        Categorical, OneHotCategorical, Binomial, BetaBinomial), inside plates or not.
        Continuous latent sites must be conditioned (``poutine.condition``) first.
    num_samples : int
        Draws per chain.
    num_chains : int
        Chains: independent batches of exact draws (one engine run each, seeded separately).
    oracle : "enum" or MarginalOracle
        ``"enum"``: exact conditional marginals by Pyro's enumeration
        (:class:`~pyro_autospec.oracles.enum.EnumOracle`). Or any object with ``num_coords``,
        ``num_values`` and ``log_marginals(values, mask)`` that follows the coordinate mapping
        of :mod:`pyro_autospec.infer.sites`: sites in trace order, each site's values
        flattened in C order over its batch shape (``OneHotCategorical``: one coordinate per
        event), values as indices into ``enumerate_support``, ``num_values`` the largest
        support. The mapping is checked by one probe query before sampling.
    method : {"autospec", "sequential", "speculative", "agr24"}
        ``"sequential"`` is the chain-rule reference (``n`` rounds per draw); the last two are
        the baselines of :mod:`pyro_autospec.engine.baselines` (all exact). With a diffusion
        guide: ``"autospec"``, ``"sequential"`` or ``"picard"`` (approximate).
    guide : MarginalOracle, optional
        An approximate oracle, typically a trained
        :class:`~pyro_autospec.guides.AnyOrderGuide`; replaces ``oracle``. Its draws are exact
        for the guide's own random-order law ``Uniform(sigma) q_sigma(x)``; every draw records
        ``log_weight = log p(x, data) - log q_sigma(x)``, and :meth:`diagnostics` reports the
        weights' Pareto k-hat (PSIS) and ESS.
    correction : {None, "importance", "imh"}
        ``None``: return the guide's draws as they are (a warning says so if a guide is
        given). ``"importance"``: resample ``num_samples`` draws per chain, with replacement,
        from ``num_samples`` guide draws by PSIS-smoothed importance weights (consistent, not
        exact at finite size; duplicates make the MCMC ESS of :meth:`diagnostics` optimistic:
        the weights' ESS bounds the information). ``"imh"``: each chain is an independent
        Metropolis-Hastings chain with the guide as proposal (exact MCMC; R-hat and ESS mean
        what they mean for MCMC); it draws ``warmup_steps + num_samples`` proposals.
    warmup_steps : int, optional
        Discarded steps of each ``"imh"`` chain (default ``num_samples // 10``).
    max_plate_nesting : int, optional
        Found from the model when ``None``.
    seed : int, torch.Generator or None
        ``None`` follows torch's global RNG (``pyro.set_rng_seed``).
    disable_progbar : bool
        Hide the ``tqdm`` bar over rounds.
    save_params : list of str, optional
        Sites to keep in :meth:`get_samples` (default: all discrete latent sites).
    **schedule
        Engine knobs ``rho``, ``max_block``, ``max_rows_per_round``, ``max_elements``; they
        move rounds against rows and never change the law of the draws.

    Attributes
    ----------
    layout : SiteLayout
        The coordinate mapping (after :meth:`run`).
    results : list of SampleResult
        The engine's result for every chain (after :meth:`run`).

    Notes
    -----
    With an exact oracle every draw is an exact, independent draw of ``p(x | data)``; with an
    approximate oracle ``q``, each draw is exact for ``q``'s chain rule in its order, and
    ``lp - oracle_log_prob`` (with ``guide=``: ``get_extra_fields()["log_weight"]``) are log
    importance weights on the space of (draw, order) pairs (ALGORITHM.md section 6); ``correction=``
    uses them. A Pareto k-hat of 0.7 or more means the weights' tail is too heavy for either
    correction to be trusted (a warning is raised); train the guide longer or make it wider.

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> def model(data):
    ...     with pyro.plate("pixels", 4):
    ...         z = pyro.sample("z", dist.Bernoulli(0.5))
    ...         pyro.sample("y", dist.Normal(2.0 * z - 1.0, 1.0), obs=data)
    >>> autospec = AutoSpec(model, num_samples=50, num_chains=2, seed=0, disable_progbar=True)
    >>> autospec.run(torch.tensor([1.2, -0.7, 0.3, 2.0]))
    AutoSpec(method='autospec', num_samples=50, num_chains=2, sites=['z'])
    >>> samples = autospec.get_samples()
    >>> samples["z"].shape, samples["z"].dtype
    (torch.Size([100, 4]), torch.float32)
    >>> autospec.get_samples(group_by_chain=True)["z"].shape
    torch.Size([2, 50, 4])
    """

    def __init__(
        self,
        model: Callable,
        *,
        num_samples: int,
        num_chains: int = 1,
        oracle: Any = "enum",
        method: str = "autospec",
        guide: Any = None,
        correction: str | None = None,
        warmup_steps: int | None = None,
        max_plate_nesting: int | None = None,
        seed: int | torch.Generator | None = None,
        disable_progbar: bool = False,
        save_params: Sequence[str] | None = None,
        **schedule: Any,
    ):
        if not callable(model):
            raise TypeError(f"model must be callable; got {type(model).__name__}")
        if not isinstance(num_samples, (int, np.integer)) or num_samples < 1:
            raise ValueError(f"num_samples must be a positive int; got {num_samples!r}")
        if not isinstance(num_chains, (int, np.integer)) or num_chains < 1:
            raise ValueError(f"num_chains must be a positive int; got {num_chains!r}")
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}; got {method!r}")
        if correction not in CORRECTIONS:
            raise ValueError(f"correction must be None, 'importance' or 'imh'; got {correction!r}")
        if guide is not None and not (isinstance(oracle, str) and oracle == "enum"):
            raise ValueError(
                "pass either oracle= or guide=, not both: a guide is the (approximate) oracle"
            )
        if warmup_steps is not None and (
            not isinstance(warmup_steps, (int, np.integer)) or warmup_steps < 0
        ):
            raise ValueError(f"warmup_steps must be a non-negative int; got {warmup_steps!r}")
        if warmup_steps and correction != "imh":
            raise ValueError(
                "warmup_steps only applies to correction='imh' (independent Metropolis-Hastings "
                "chains); exact draws and importance resampling need no warm-up"
            )
        self.guide = guide
        self.correction = correction
        self.warmup_steps = (
            (int(num_samples) // 10 if correction == "imh" else 0)
            if warmup_steps is None
            else int(warmup_steps)
        )
        self.model = model
        self.num_samples = int(num_samples)
        self.num_chains = int(num_chains)
        self.oracle = oracle
        self.method = method
        self.max_plate_nesting = max_plate_nesting
        self.seed = seed
        self.disable_progbar = disable_progbar
        self.save_params = None if save_params is None else list(save_params)
        self.schedule = check_schedule(schedule)
        self.layout: SiteLayout | None = None
        self.results: list = []
        self._samples: dict[str, torch.Tensor] | None = None
        self._extra: dict[str, torch.Tensor] = {}
        self._pointwise: dict[str, torch.Tensor] = {}
        self._args: tuple = ()
        self._kwargs: dict = {}
        self._guide_log_weight: torch.Tensor | None = None

    def __repr__(self) -> str:
        sites = self.layout.names if self.layout is not None else None
        extra = ""
        if self.guide is not None or self.correction is not None:
            extra = f", guide={type(self.guide).__name__}, correction={self.correction!r}"
        return (
            f"AutoSpec(method={self.method!r}, num_samples={self.num_samples}, "
            f"num_chains={self.num_chains}, sites={sites}{extra})"
        )

    @poutine.block
    def run(self, *args: Any, **kwargs: Any) -> AutoSpec:
        """Draw ``num_chains * num_samples`` exact samples of the discrete latent sites.

        Parameters
        ----------
        *args, **kwargs
            The model's arguments (data included).

        Returns
        -------
        AutoSpec
            ``self``.
        """
        from pyro_autospec.engine import sample_any_order

        self._args, self._kwargs = args, kwargs
        if _is_diffusion_guide(self.guide):
            return self._run_continuous(args, kwargs)
        layout = discover_sites(self.model, args, kwargs, max_plate_nesting=self.max_plate_nesting)
        if self.save_params is not None:
            unknown = sorted(set(self.save_params) - set(layout.names))
            if unknown:
                raise ValueError(
                    f"save_params names {unknown}, which are not discrete latent sites of the "
                    f"model ({layout.names})"
                )
        oracle = self.oracle if self.guide is None else self.guide
        oracle = build_oracle(oracle, self.model, args, kwargs, layout)
        self.layout = layout
        self.results = []
        per_chain = {name: [] for name in layout.names}
        extra = {
            "n_rounds": [],
            "oracle_rows": [],
            "lp": [],
            "oracle_log_prob": [],
        }
        if self._weights_tracked():
            extra["log_weight"] = []
        if self.correction == "imh":
            extra["accepted"], extra["acceptance_rate"] = [], []
        pointwise = {name: [] for name in layout.observed}
        guide_log_weight = []
        num_draws = self.num_samples + self.warmup_steps
        for seed in chain_seeds(self.seed, self.num_chains):
            result = sample_any_order(
                oracle,
                num_draws,
                method=self.method,
                seed=seed,
                progress=not self.disable_progbar,
                **self.schedule,
            )
            self.results.append(result)
            values = layout.from_coords(result.samples.cpu())
            lp, pw = log_joint(self.model, args, kwargs, layout, values, pointwise=True)
            oracle_lp = result.log_prob.cpu().double()
            log_weight = lp - oracle_lp
            guide_log_weight.append(log_weight)
            keep = self._correct(log_weight, seed, extra)
            for name in layout.names:
                per_chain[name].append(values[name][keep])
            for name in pointwise:
                pointwise[name].append(pw[name][keep])
            extra["n_rounds"].append(result.sample_rounds.cpu().long()[keep])
            extra["oracle_rows"].append(
                torch.full((self.num_samples,), result.oracle_rows / num_draws, dtype=torch.float64)
            )
            extra["lp"].append(lp[keep])
            extra["oracle_log_prob"].append(oracle_lp[keep])
            if "log_weight" in extra:
                extra["log_weight"].append(log_weight[keep])
        self._samples = OrderedDict((k, torch.stack(v)) for k, v in per_chain.items())
        self._extra = {k: torch.stack(v) for k, v in extra.items()}
        self._pointwise = {k: torch.stack(v) for k, v in pointwise.items()}
        self._guide_log_weight = torch.stack(guide_log_weight)
        self._warn_weights()
        return self

    def _run_continuous(self, args: tuple, kwargs: dict) -> AutoSpec:
        """Draw the continuous latent sites from a diffusion guide (one engine run per chain)."""
        from pyro_autospec.infer.continuous import sample_continuous

        if self.correction is not None:
            raise ValueError(
                "correction= needs the guide's density of each draw; a DiffusionGuide's draws "
                "X_T / T have no tractable density, so use correction=None and check the guide "
                "with pyro_autospec.diagnostics.sbc"
            )
        guide_layout = self.guide.layout
        if self.save_params is not None:
            unknown = sorted(set(self.save_params) - set(guide_layout.names))
            if unknown:
                raise ValueError(
                    f"save_params names {unknown}, which are not continuous latent sites of the "
                    f"model ({guide_layout.names})"
                )
        trace = poutine.trace(self.model).get_trace(*args, **kwargs)
        observed = {site.name: trace.nodes[site.name]["value"] for site in guide_layout.data}
        self.layout = _ContinuousView(
            names=guide_layout.names,
            num_coords=int(self.guide.times.shape[0]) - 1,
            observed=observed,
        )
        self.results = []
        per_chain = {name: [] for name in guide_layout.names}
        extra = {"n_rounds": [], "oracle_rows": [], "lp": [], "oracle_log_prob": []}
        pointwise = {name: [] for name in observed}
        schedule = {k: v for k, v in self.schedule.items() if k != "max_elements"}
        for seed in chain_seeds(self.seed, self.num_chains):
            out = sample_continuous(
                self.guide,
                self.num_samples,
                *args,
                model_kwargs=kwargs,
                method=self.method,
                seed=seed,
                progress=not self.disable_progbar,
                **schedule,
            )
            self.results.append(out.diffusion)
            for name in guide_layout.names:
                per_chain[name].append(out.samples[name])
            for name in pointwise:
                pointwise[name].append(out.pointwise[name])
            extra["n_rounds"].append(out.sample_rounds.cpu().long())
            extra["oracle_rows"].append(
                torch.full(
                    (self.num_samples,), out.oracle_rows / self.num_samples, dtype=torch.float64
                )
            )
            extra["lp"].append(out.lp)
            # the density of the sampling path, not of the draw: no importance weight
            extra["oracle_log_prob"].append(out.diffusion.log_prob.cpu().double())
        self._samples = OrderedDict((k, torch.stack(v)) for k, v in per_chain.items())
        self._extra = {k: torch.stack(v) for k, v in extra.items()}
        self._pointwise = {k: torch.stack(v) for k, v in pointwise.items()}
        self._guide_log_weight = None
        return self

    def _correct(self, log_weight: torch.Tensor, seed: int, extra: dict) -> torch.Tensor:
        """Indices of the draws a chain returns, after the correction."""
        from pyro_autospec.guides.correction import (
            importance_resample,
            independent_metropolis_hastings,
        )

        if self.correction is None:
            return torch.arange(self.num_samples)
        if not bool(torch.isfinite(log_weight).any()):
            raise ValueError(
                "every guide draw has zero probability under the model (log p(x, data) = -inf): "
                "the guide cannot be corrected; train it (fit_posterior) or check the model"
            )
        # A stream of its own: the engine's generator for this chain is default_rng(seed).
        rng = np.random.default_rng([seed, 1])
        if self.correction == "importance":
            index, _ = importance_resample(log_weight, self.num_samples, seed=rng)
            return index
        index, accepted, accept_prob = independent_metropolis_hastings(log_weight, seed=rng)
        warm = self.warmup_steps
        extra["accepted"].append(accepted[warm:])
        extra["acceptance_rate"].append(accept_prob[warm:])
        return index[warm:]

    def _weights_tracked(self) -> bool:
        # A diffusion guide's draws have no tractable density, hence no importance weights.
        if _is_diffusion_guide(self.guide):
            return False
        return self.guide is not None or self.correction is not None

    def weight_diagnostics(self) -> dict[str, Any]:
        """Pareto k-hat and ESS of the guide draws' importance weights, per chain and pooled.

        Computed on all draws the guide made (before any correction).

        Returns
        -------
        dict
            ``"khat"`` and ``"weights_ess"``: ``{"chain i": float, ..., "all": float}``;
            ``"num_draws"``: guide draws per chain.
        """
        from pyro_autospec.diagnostics.weights import pareto_khat, weights_ess

        self._check_run()
        lw = self._guide_log_weight
        chains = [f"chain {i}" for i in range(lw.shape[0])]
        khat = {c: pareto_khat(w) for c, w in zip(chains, lw, strict=True)}
        ess = {c: weights_ess(w) for c, w in zip(chains, lw, strict=True)}
        khat["all"] = pareto_khat(lw.reshape(-1))
        ess["all"] = weights_ess(lw.reshape(-1))
        return {"khat": khat, "weights_ess": ess, "num_draws": int(lw.shape[1])}

    def _warn_weights(self) -> None:
        from pyro_autospec.diagnostics.weights import KHAT_BAD

        if not self._weights_tracked():
            return
        diag = self.weight_diagnostics()
        khat, ess = diag["khat"]["all"], diag["weights_ess"]["all"]
        total = diag["num_draws"] * self.num_chains
        if self.correction is None:
            warnings.warn(
                f"AutoSpec with a guide and correction=None returns the guide's draws, which are "
                f"exact for the guide, not for the model's posterior (Pareto k-hat {khat:.2f}, "
                f"weights' ESS {ess:.0f} of {total}); use correction='importance' or 'imh'",
                UserWarning,
                stacklevel=3,
            )
        elif not khat < KHAT_BAD:
            warnings.warn(
                f"Pareto k-hat of the guide's importance weights is {khat:.2f} (>= {KHAT_BAD}; "
                f"weights' ESS {ess:.0f} of {total}): the weights have a heavy tail and the "
                f"'{self.correction}' correction cannot be trusted. Train the guide longer "
                f"(fit_posterior), make it larger, or draw more samples.",
                UserWarning,
                stacklevel=3,
            )

    def _check_run(self) -> None:
        if self._samples is None:
            raise RuntimeError("call AutoSpec.run(*args, **kwargs) first")

    def _saved(self) -> dict[str, torch.Tensor]:
        self._check_run()
        if self.save_params is None:
            return dict(self._samples)
        return {k: v for k, v in self._samples.items() if k in self.save_params}

    def get_samples(
        self,
        num_samples: int | None = None,
        group_by_chain: bool = False,
        include_discrete: bool = True,
    ) -> dict[str, torch.Tensor]:
        """The draws, keyed by site name, in the model's shapes and dtypes.

        Parameters
        ----------
        num_samples : int, optional
            Resample this many draws with replacement (as ``MCMC.get_samples``).
        group_by_chain : bool
            Keep the chain dimension: ``Tensor[num_chains, num_samples, *shape]``; otherwise
            ``Tensor[num_chains * num_samples, *shape]``.
        include_discrete : bool
            ``False`` drops discrete sites; every site AutoSpec samples is discrete, so the
            result is then empty (the keyword matches ``MCMC``'s).

        Returns
        -------
        dict
            ``name -> Tensor``; Categorical sites are long, Bernoulli sites float, as the model
            samples them.
        """
        samples = self._saved() if include_discrete else {}
        if not samples:
            return {}
        return select_samples(samples, num_samples, group_by_chain)

    def get_extra_fields(self, group_by_chain: bool = False) -> dict[str, torch.Tensor]:
        """Per-draw statistics of the run.

        Returns
        -------
        dict
            Each ``Tensor[num_chains, num_samples]`` (``group_by_chain``) or flattened:

            * ``n_rounds`` (long): rounds in which the draw had an oracle query in flight (its
              latency; the sequential sampler takes ``n`` per draw);
            * ``oracle_rows`` (float64): the chain's oracle rows divided by its draws (the
              engine counts rows per run, not per draw);
            * ``lp`` (float64): ``log p(x, data)``, the model's log joint at the draw;
            * ``oracle_log_prob`` (float64): the draw's log probability under the oracle's
              chain rule (for an exact oracle ``log p(x | data)``);
            * with a ``guide`` or a ``correction``: ``log_weight`` (float64):
              ``lp - oracle_log_prob``, the draw's log importance weight;
            * with ``correction="imh"``: ``accepted`` (bool: the step moved) and
              ``acceptance_rate`` (float64: its acceptance probability).

            The fields describe the returned draws (after any correction).
        """
        self._check_run()
        if group_by_chain:
            return dict(self._extra)
        return {k: v.reshape(-1) for k, v in self._extra.items()}

    def _float_samples(self) -> dict[str, torch.Tensor]:
        return {k: v.double() for k, v in self._saved().items()}

    def diagnostics(self) -> dict[str, Any]:
        """ESS and split R-hat per site (on float copies), divergences and engine counts.

        Returns
        -------
        dict
            ``site -> {"n_eff": Tensor, "r_hat": Tensor}`` as ``MCMC.diagnostics``, plus
            ``"divergences"`` (``{"chain i": []}``: exact draws never diverge), ``"rounds"``,
            ``"oracle_rows"``, ``"mean rounds per draw"`` and ``"wall_time"`` per chain.
            With a guide or a correction also ``"khat"`` and ``"weights_ess"`` (see
            :meth:`weight_diagnostics`) and, for ``"imh"``, ``"acceptance rate"`` per chain.
        """
        self._check_run()
        diag = _mcmc_diagnostics(self._float_samples(), group_by_chain=True)
        chains = [f"chain {i}" for i in range(self.num_chains)]
        diag["divergences"] = {c: [] for c in chains}
        diag["rounds"] = {c: r.rounds for c, r in zip(chains, self.results, strict=True)}
        diag["oracle_rows"] = {c: r.oracle_rows for c, r in zip(chains, self.results, strict=True)}
        diag["mean rounds per draw"] = {
            c: float(r.sample_rounds.double().mean())
            for c, r in zip(chains, self.results, strict=True)
        }
        diag["wall_time"] = {c: r.wall_time for c, r in zip(chains, self.results, strict=True)}
        if self._weights_tracked():
            weights = self.weight_diagnostics()
            diag["khat"] = weights["khat"]
            diag["weights_ess"] = weights["weights_ess"]
        if self.correction == "imh":
            rate = self._extra["accepted"].double().mean(-1)
            diag["acceptance rate"] = {c: float(r) for c, r in zip(chains, rate, strict=True)}
        return diag

    def rounds_summary(self) -> str:
        """One paragraph: rounds per draw against the sequential sampler's ``n``."""
        self._check_run()
        n = self.layout.num_coords
        per_draw = torch.cat([r.sample_rounds.double() for r in self.results])
        mean = float(per_draw.mean())
        whole = max(r.rounds for r in self.results)
        rows = sum(r.oracle_rows for r in self.results) / (self.num_samples * self.num_chains)
        change = 1.0 - mean / n
        verdict = (
            f"{100 * change:.0f}% fewer rounds than sequential"
            if change >= 0
            else f"{100 * -change:.0f}% MORE rounds than sequential"
        )
        return (
            f"Rounds ({self.method}): {mean:.2f} per draw on average (max "
            f"{int(per_draw.max())}); the sequential sampler takes {n} per draw (n = {n} "
            f"{'diffusion steps' if _is_diffusion_guide(self.guide) else 'coordinates'}): "
            f"{verdict}.\n"
            f"Whole run: {whole} rounds per chain of {self.num_samples} draws (sequential: {n}); "
            f"{rows:.1f} oracle rows per draw (sequential: {n})."
        )

    def summary(self, prob: float = 0.9) -> None:
        """Print a table like ``MCMC.summary``, discrete sites included, and the rounds saved.

        Parameters
        ----------
        prob : float
            Mass of the credible interval.
        """
        self._check_run()
        print_summary(self._float_samples(), prob=prob, group_by_chain=True)
        print("Number of divergences: 0")
        print(self.rounds_summary())
        if self._weights_tracked():
            print(self.weights_summary())

    def weights_summary(self) -> str:
        """One paragraph: Pareto k-hat and ESS of the guide's importance weights."""
        from pyro_autospec.diagnostics.weights import KHAT_BAD, KHAT_GOOD

        diag = self.weight_diagnostics()
        khat, ess = diag["khat"]["all"], diag["weights_ess"]["all"]
        total = diag["num_draws"] * self.num_chains
        if khat < KHAT_GOOD:
            verdict = "reliable"
        elif khat < KHAT_BAD:
            verdict = "usable with caution (slow convergence)"
        else:
            verdict = "NOT reliable: the correction cannot be trusted"
        per_chain = ", ".join(f"{v:.2f}" for c, v in diag["khat"].items() if c != "all")
        text = (
            f"Importance weights log p(x, data) - log q_sigma(x) of {total} guide draws: Pareto "
            f"k-hat {khat:.2f} ({verdict}; per chain {per_chain}), weights' ESS {ess:.1f} "
            f"({100 * ess / total:.1f}%). Correction: {self.correction}."
        )
        if self.correction == "imh":
            rate = float(self._extra["accepted"].double().mean())
            text += f" IMH acceptance rate {rate:.2f}."
        return text

    def to_inference_data(
        self,
        coords: dict | None = None,
        dims: dict | None = None,
        log_likelihood: bool = True,
    ):
        """ArviZ data: posterior, sample_stats, observed_data and the pointwise log likelihood.

        The log likelihood of every observed site is computed by the project from one batched
        conditioned trace per chain (not ``Predictive``). Integer-valued sites (Bernoulli,
        Binomial, OneHotCategorical) are stored as int64 so ArviZ plots them as histograms.

        Parameters
        ----------
        coords, dims : dict, optional
            As in ``az.from_pyro``.
        log_likelihood : bool
            Include the ``log_likelihood`` group (arrays ``[chain, draw, *batch_shape]``).

        Returns
        -------
        arviz.InferenceData (ArviZ 0.x) or xarray.DataTree (ArviZ 1.x)
        """
        from pyro_autospec.diagnostics.arviz import to_inference_data

        self._check_run()
        posterior = {}
        for name, value in self._saved().items():
            posterior[name] = value.long() if _integer_dtype(value) else value
        extra = self._extra
        sample_stats = {
            "lp": extra["lp"],
            "n_rounds": extra["n_rounds"],
            "oracle_rows": extra["oracle_rows"],
            "oracle_log_prob": extra["oracle_log_prob"],
            "diverging": torch.zeros(extra["lp"].shape, dtype=torch.bool),
        }
        if "log_weight" in extra:
            sample_stats["log_weight"] = extra["log_weight"]
        if "acceptance_rate" in extra:
            sample_stats["acceptance_rate"] = extra["acceptance_rate"]
        attrs = {"inference_library": "pyro_autospec", "method": self.method}
        if self._weights_tracked():
            weights = self.weight_diagnostics()
            attrs["correction"] = str(self.correction)
            attrs["pareto_khat"] = weights["khat"]["all"]
            attrs["weights_ess"] = weights["weights_ess"]["all"]
        return to_inference_data(
            posterior,
            sample_stats=sample_stats,
            log_likelihood=dict(self._pointwise) if log_likelihood else None,
            observed_data=dict(self.layout.observed),
            coords=coords,
            dims=dims,
            attrs=attrs,
        )
