"""The run of a model with continuous AND discrete latent sites: NUTS, then exact discrete draws.

1. The continuous sites are sampled by Pyro's own ``MCMC(NUTS)``, with every discrete site
   enumerated out (parallel enumeration; the marginal density NUTS sees is the model's density
   summed over the discrete sites, masks and scales included). One ``MCMC`` per chain, run one
   after the other, each seeded from ``seed``.
2. Given each of the ``M = num_chains * num_samples`` continuous draws ``theta_m``, the
   discrete sites are drawn exactly from ``p(x | theta_m, data)`` from a family of ``M``
   targets: an :class:`~pyro_autospec.model.enum.EnumOracle` compiled once with the
   continuous draws in a plate (``num_draws = M``). With ``sampler="auto"`` on a CPU (and the
   default method) or ``sampler="ffbs"``, by forward filtering, backward sampling with the
   targets as a plate (:func:`~pyro_autospec.model.ffbs.plan_ffbs`: one elimination pass for
   every target, linear in the data where the discrete sites are independent given the
   continuous ones); where the elimination does not fit, or with ``sampler="engine"``, by ONE
   engine run (``method``) over the family.

Each pair ``(theta_m, x_m)`` is then a draw of the joint posterior (as good as the NUTS chain
is), and ``get_samples()`` returns both kinds. The log joint, the pointwise log likelihood of
every observed site (given all latent sites of the draw) and the ``pyro.deterministic`` sites
come from one batched trace per chunk of draws, not from ``Predictive``. The self-check here
is per draw: ``log p(x_m, theta_m, data) - log q(x_m | theta_m)`` must equal the log
normaliser of draw ``m``'s target.
"""

from __future__ import annotations

import time
import warnings
from collections import OrderedDict
from collections.abc import Callable

import torch
from pyro.infer import MCMC, NUTS

from pyro_autospec._warnings import user_stacklevel
from pyro_autospec.engine import keys
from pyro_autospec.engine.result import SampleResult
from pyro_autospec.infer.display import compact_names
from pyro_autospec.infer.draws import DrawEvaluator, ModelCall
from pyro_autospec.infer.run_base import Extras, RunBase, RunSettings
from pyro_autospec.infer.self_check import SelfCheck
from pyro_autospec.model.discrete import SiteLayout
from pyro_autospec.model.enum import EnumOracle
from pyro_autospec.model.ffbs import ELIMINATION_DOES_NOT_FIT, plan_ffbs, sample_exact
from pyro_autospec.model.tracing import (
    enumerated,
    seed_generators,
    trace_model,
    users_generators_kept,
)

__all__ = ["MixedRun"]

#: Said under Pyro's error when NUTS finds no starting point for the continuous sites.
_NUTS_START_NOTE = (
    "AutoSpec ran Pyro's NUTS on the continuous sites with the discrete sites summed out, and "
    "Pyro found no initial values where that log density and its gradient are finite. Common "
    "causes: a rate or probability that is exactly 0 for some value of a discrete site (a "
    "zero-inflated Poisson written as Poisson(rate * (1 - z)): add a small constant, or use "
    "pyro.distributions.ZeroInflatedPoisson), or data outside a distribution's support. Other "
    "initial values go in nuts_kwargs={'init_strategy': pyro.infer.autoguide.init_to_value("
    "values=...)}."
)


class MixedRun(RunBase):
    """NUTS on the continuous sites, exact autospeculation on the discrete sites given them.

    Parameters
    ----------
    model : callable
    layout : SiteLayout
        With :attr:`~pyro_autospec.model.discrete.SiteLayout.continuous` sites.
    settings : RunSettings
        Method (for the discrete sites), draws and warm-up per chain as in ``pyro.infer.MCMC``,
        seed, device and engine knobs.
    nuts_kwargs : dict
        Passed to :class:`pyro.infer.NUTS` (``target_accept_prob``, ``max_tree_depth``, ...).
    sampler : {"auto", "engine", "ffbs"}
        What draws the discrete sites given the continuous draws (see the module's notes).
    """

    def __init__(
        self,
        model: Callable,
        layout: SiteLayout,
        settings: RunSettings,
        *,
        nuts_kwargs: dict,
        sampler: str = "auto",
    ):
        super().__init__(settings)
        self.sampler = sampler
        self.model = model
        self.layout = layout
        self.nuts_kwargs = dict(nuts_kwargs)
        self.discrete_names = list(layout.names)
        self.nuts_diagnostics: list[dict] = []
        self.timing: dict[str, float] = {}
        self.max_self_check_error: float | None = None

    def _check_enumeration(self, args: tuple, kwargs: dict) -> None:
        """Compile the oracle on one prior draw: a clear error before any NUTS step."""
        trace = trace_model(self.model, args, kwargs)
        values = {
            s.name: trace.nodes[s.name]["value"].detach()[None] for s in self.layout.continuous
        }
        EnumOracle(self.model, args, kwargs, layout=self.layout, continuous_values=values)

    def run(self, args: tuple, kwargs: dict) -> MixedRun:
        layout = self.layout
        with self.stage("compiling"):
            self._check_enumeration(args, kwargs)
        nuts_seeds = self.settings.seeds(self.num_chains)
        # the discrete engine run's seed, from a stream beside the NUTS chains' (an int seed),
        # or next in the generator's stream
        (engine_seed,) = self.settings.seeds(1, stream=1)
        model = enumerated(self.model)
        continuous = {site.name: [] for site in layout.continuous}
        diverging = []
        start = time.perf_counter()
        self.nuts_diagnostics = []
        for seed in nuts_seeds:
            kernel = NUTS(model, max_plate_nesting=layout.max_plate_nesting, **self.nuts_kwargs)
            last: dict = {}

            def record(kernel, samples, stage, i, last=last):
                if stage == "Sample":  # the kernel resets its counters after the run
                    info = kernel.diagnostics()
                    last["divergences"] = list(info.get("divergences", []))
                    last["acceptance rate"] = float(info.get("acceptance rate", float("nan")))

            mcmc = MCMC(
                kernel,
                num_samples=self.num_samples,
                warmup_steps=self.warmup_steps,
                num_chains=1,
                disable_progbar=not self.progress,
                hook_fn=record,
            )
            with users_generators_kept():
                seed_generators(seed)  # from chain_seeds: in [0, 2**62)
                try:
                    mcmc.run(*args, **kwargs)
                except ValueError as error:
                    if "cannot find valid initial params" in str(error) and hasattr(
                        error,
                        "add_note",  # Python 3.11+
                    ):
                        error.add_note(_NUTS_START_NOTE)
                    raise
            draws = mcmc.get_samples()
            self.transforms = dict(mcmc.transforms)  # the same for every chain
            for name in continuous:
                continuous[name].append(draws[name].detach())
            info = dict(last)  # this chain's divergences (post warm-up) and acceptance rate
            self.nuts_diagnostics.append(info)
            flags = torch.zeros(self.num_samples, dtype=torch.bool)
            flags[[i for i in info.get("divergences", []) if 0 <= i < self.num_samples]] = True
            diverging.append(flags)
        self.timing["nuts"] = time.perf_counter() - start

        total = self.num_chains * self.num_samples
        flat = {k: torch.cat(v) for k, v in continuous.items()}  # [M, *shape], chain-major
        eliminate = self.elimination_wanted(self.sampler)
        plans = None
        with self.stage("compiling"):
            oracle = EnumOracle(
                self.model,
                args,
                kwargs,
                layout=layout,
                continuous_values=flat,
                device=self.device,
                lazy=eliminate,  # the contraction is measured only if the engine runs
            )
            if eliminate:
                plans = self._family_plans(oracle, args, kwargs, flat)
        if plans is None and self.sampler == "ffbs":
            raise ValueError(ELIMINATION_DOES_NOT_FIT)
        self.oracle_device = oracle.device
        self.results = []
        if plans is not None:
            result = self.record(_sample_plans(plans, engine_seed))
            self.ffbs_plan = {
                "forward_seconds": sum(plan.forward_seconds for _, plan in plans),
                "steps": plans[0][1].num_steps,
            }
        else:
            result = self.engine_run(oracle, total, engine_seed, oracle.device)
        draws = DrawEvaluator(
            ModelCall(self.model, args, kwargs),
            layout,
            self_check=SelfCheck(oracle),
            device=oracle.device,
            per_draw_fallback=True,
            stage=self.stage,
        )
        evaluated = draws.evaluate(result.samples, result.log_prob, continuous=flat)
        self.max_self_check_error = draws.check()
        values, joint, oracle_lp = evaluated.values, evaluated.joint, evaluated.oracle_log_prob

        def by_chain(t):
            return t.reshape((self.num_chains, self.num_samples) + tuple(t.shape[1:]))

        order = [s.name for s in layout.continuous] + layout.names
        trace_order = [site[0] for site in layout.signature if site[0] in order]
        self.samples = OrderedDict((k, by_chain(values[k])) for k in trace_order)
        self.deterministic = OrderedDict((k, by_chain(v)) for k, v in joint.deterministic.items())
        self.pointwise = {k: by_chain(v) for k, v in joint.pointwise.items()}
        self._oracle, self._by_chain = oracle, by_chain
        self.observed = dict(layout.observed)
        rows = result.oracle_rows / total
        self.extra = {
            "sample_rounds": by_chain(result.sample_rounds.long()),
            "oracle_rows_per_draw": torch.full(
                (self.num_chains, self.num_samples), rows, dtype=torch.float64
            ),
            "lp": by_chain(joint.total),
            "oracle_log_prob": by_chain(oracle_lp),
        }
        self._diverging = torch.stack(diverging)
        return self

    def _family_plans(self, oracle, args: tuple, kwargs: dict, flat: dict) -> list | None:
        """Forward filtering, backward sampling of the family's targets: one plan for all of
        them, or, where its tables would be too large, one per chunk of consecutive targets
        (halved until they fit); ``[(draws slice, plan), ...]``, or ``None`` where even one
        target's elimination does not fit."""
        too_large: list[str] = []
        plan = plan_ffbs(oracle, too_large)
        if plan is not None or not too_large:
            return None if plan is None else [(slice(0, oracle.num_draws), plan)]
        total = oracle.num_draws
        size = total
        while size > 1:
            size = (size + 1) // 2
            plans = []
            for start in range(0, total, size):
                part = slice(start, min(start + size, total))
                chunk = EnumOracle(
                    self.model,
                    args,
                    kwargs,
                    layout=self.layout,
                    continuous_values={k: v[part] for k, v in flat.items()},
                    device=self.device,
                    lazy=True,
                )
                plan = plan_ffbs(chunk, too_large)
                if plan is None:
                    break
                plans.append((part, plan))
            else:
                return plans
            if not too_large:  # refused for its structure, not its size
                return None
            if size > 1:
                too_large.clear()
        if self.sampler == "auto":
            warnings.warn(
                f"forward filtering, backward sampling does not fit this model's discrete "
                f"sites even for one continuous draw: {too_large[0]}. The any-order engine "
                f"draws them instead, and each of its oracle rows is a contraction of the "
                f"model's factors of about that size, so the run may be slow",
                UserWarning,
                stacklevel=user_stacklevel(),
            )
        return None

    def marginal_pointwise(self) -> dict:
        """The pointwise log likelihood given each draw's continuous values, with the discrete
        sites summed out per observation (see
        :meth:`~pyro_autospec.model.enum.EnumOracle.pointwise_log_likelihood`)."""
        out = self._oracle.pointwise_log_likelihood()
        return {k: self._by_chain(v.to(self.pointwise[k].device)) for k, v in out.items()}

    def extras(self) -> Extras:
        chains = [f"chain {i}" for i in range(self.num_chains)]
        report = Extras()
        divergences = {
            c: list(info.get("divergences", []))
            for c, info in zip(chains, self.nuts_diagnostics, strict=True)
        }
        rates = {
            c: float(info.get("acceptance rate", float("nan")))
            for c, info in zip(chains, self.nuts_diagnostics, strict=True)
        }
        report.diagnostics["divergences"] = divergences
        report.diagnostics["acceptance rate"] = rates
        report.sample_stats["diverging"] = self._diverging
        # diagnostics()["sampler"] (RunBase) names what drew the discrete sites given them
        report.attrs["continuous_sampler"] = "pyro NUTS (discrete sites enumerated)"
        report.diagnostics["continuous_sampler"] = report.attrs["continuous_sampler"]
        names = compact_names([s.name for s in self.layout.continuous])
        discrete = sum(self.timing.get(k, 0.0) for k in ("compiling", "oracle", "engine"))
        if self.sampler_used() == "ffbs":
            how = (
                f"by forward filtering, backward sampling ('ffbs': one elimination pass for "
                f"every draw; {discrete:.1f} s: compiling and sampling)"
            )
        else:
            how = (
                f"by the engine's method {self.sampler_used()!r} ({discrete:.1f} s: compiling, "
                f"oracle and engine)"
            )
        report.summary_lines.append(
            f"Continuous sites {names}: Pyro NUTS with the discrete sites enumerated out "
            f"({self.warmup_steps} warm-up steps per chain; acceptance rate "
            f"{', '.join(f'{r:.2f}' for r in rates.values())}; "
            f"{sum(len(v) for v in divergences.values())} divergences; "
            f"{self.timing.get('nuts', 0.0):.1f} s). Discrete sites "
            f"{compact_names(self.layout.names)}: "
            f"one exact draw given each continuous draw, {how}."
        )
        return report

    def self_check_summary(self) -> str:
        if self.max_self_check_error is None:
            return ""
        return (
            f"Self-check passed: log p(x, theta, data) - log q(x | theta) equals each draw's "
            f"log normaliser (largest deviation {self.max_self_check_error:.2g})."
        )


def _sample_plans(plans: list, seed: int) -> SampleResult:
    """The draws of every chunk of targets (``[(draws slice, plan), ...]``), in one result.

    One plan draws with ``seed`` itself; chunk ``k`` of several with
    ``keys.derive_seed(seed, k)``, so that no two chunks read the same keyed uniforms.
    """
    if len(plans) == 1:
        ((part, plan),) = plans
        return sample_exact(plan, part.stop - part.start, seed)
    results = [
        sample_exact(plan, part.stop - part.start, keys.derive_seed(seed, k))
        for k, (part, plan) in enumerate(plans)
    ]
    first = results[0]
    return SampleResult(
        samples=torch.cat([r.samples for r in results]),
        log_prob=torch.cat([r.log_prob for r in results]),
        rounds=sum(r.rounds for r in results),
        sample_rounds=torch.cat([r.sample_rounds for r in results]),
        oracle_rows=0,
        method=first.method,
        wall_time=sum(r.wall_time for r in results),
        timing={"forward": sum(r.timing.get("forward", 0.0) for r in results)},
        seed=int(seed),
    )
