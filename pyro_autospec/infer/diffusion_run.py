"""The run of a model whose latent sites are all continuous, through a diffusion guide.

The continuous sites are drawn from a :class:`~pyro_autospec.guides.DiffusionGuide` by
stochastic localization, exactly in the law of its discretised diffusion (one engine run per
chain, :func:`~pyro_autospec.infer.continuous.sample_continuous`). The draws have no tractable
density, so there is no importance weight and no correction; check the guide with
:mod:`pyro_autospec.diagnostics.sbc`.
"""

from __future__ import annotations

import time
import warnings
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from pyro_autospec._warnings import user_stacklevel
from pyro_autospec.infer.continuous import sample_continuous
from pyro_autospec.infer.run_base import RunBase, RunSettings
from pyro_autospec.model.tracing import trace_model

__all__ = ["DiffusionRun"]


@dataclass
class ContinuousView:
    """What the summaries need of a continuous model: its sites, steps and data."""

    names: list
    num_coords: int  # steps of the diffusion: the sequential sampler's rounds per draw
    observed: dict


class DiffusionRun(RunBase):
    """Draws of a continuous-only model's latent sites from a diffusion guide."""

    unit = "diffusion steps"
    independent_draws = True  # one engine run per chain; its draws are independent

    def __init__(self, model: Callable, guide: Any, settings: RunSettings):
        super().__init__(settings)
        self.model = model
        self.guide = guide
        self.schedule = {k: v for k, v in settings.schedule.items() if k != "max_elements"}

    def run(self, args: tuple, kwargs: dict) -> DiffusionRun:
        guide_layout = self.guide.layout
        if self.model is not getattr(self.guide, "model", self.model):
            warnings.warn(
                "the guide was built from another model than the one AutoSpec was given: the "
                "draws follow the guide's diffusion, learned for that model's posterior, and "
                "lp and the log likelihood are this model's (its sites must be the guide's)",
                UserWarning,
                stacklevel=user_stacklevel(),
            )
        if self.save_params is not None:
            unknown = sorted(set(self.save_params) - set(guide_layout.names))
            if unknown:
                raise ValueError(
                    f"save_params names {unknown}, which are not continuous latent sites of the "
                    f"model ({guide_layout.names})"
                )
        with self.stage("tracing"):
            trace = trace_model(self.model, args, kwargs)
        self.observed = {site.name: trace.nodes[site.name]["value"] for site in guide_layout.data}
        self.transforms = {site.name: site.transform.inv for site in guide_layout.sites}
        self.layout = ContinuousView(
            names=guide_layout.names,
            num_coords=int(self.guide.times.shape[0]) - 1,
            observed=self.observed,
        )
        per_chain = {name: [] for name in guide_layout.names}
        extra = {"sample_rounds": [], "oracle_rows_per_draw": [], "lp": [], "oracle_log_prob": []}
        pointwise = {name: [] for name in self.observed}
        self.results = []
        for seed in self.settings.seeds(self.num_chains):
            start = time.perf_counter()
            out = sample_continuous(
                self.guide,
                self.num_samples,
                *args,
                model_kwargs=kwargs,
                method=self.method,
                seed=seed,
                progress=self.progress,
                model=self.model,
                distributed=self.settings.distributed,
                schedule=self.schedule,
            )
            self.record(out.diffusion)
            self.oracle_device = out.diffusion.samples.device
            # the rest of sample_continuous: mapping the draws back and the model's log joint
            rest = time.perf_counter() - start - float(out.diffusion.wall_time)
            self.timing["evaluation"] = self.timing.get("evaluation", 0.0) + max(rest, 0.0)
            for name in guide_layout.names:
                per_chain[name].append(out.samples[name])
            for name in pointwise:
                pointwise[name].append(out.pointwise[name])
            extra["sample_rounds"].append(out.sample_rounds.cpu().long())
            extra["oracle_rows_per_draw"].append(
                torch.full(
                    (self.num_samples,), out.oracle_rows / self.num_samples, dtype=torch.float64
                )
            )
            extra["lp"].append(out.lp)
            # the density of the sampling path, not of the draw: no importance weight
            extra["oracle_log_prob"].append(out.diffusion.log_prob.cpu().double())
        self.samples = OrderedDict((k, torch.stack(v)) for k, v in per_chain.items())
        self.extra = {k: torch.stack(v) for k, v in extra.items()}
        self.pointwise = {k: torch.stack(v) for k, v in pointwise.items()}
        return self
