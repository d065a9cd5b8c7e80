"""Sampling a model's continuous latent sites from a diffusion guide.

:func:`sample_continuous` is what ``AutoSpec(model, guide=DiffusionGuide(...))`` runs: the
guide's :class:`~pyro_autospec.engine.protocols.MeanOracle` drives
:func:`~pyro_autospec.engine.diffusion.sample_diffusion`, and the draws ``X_T / T`` are mapped
back to the model's sites. The layout, simulation and log joint it uses live in
:mod:`pyro_autospec.model`.

References
----------
.. [1] N. Anari, C. Baronio, CJ Chen, A. Haqi, F. Koehler, A. Li, T.-D. Vuong. Parallel
   Sampling via Autospeculation. STOC 2026, arXiv:2511.07869.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from pyro_autospec.engine.diffusion import sample_diffusion
from pyro_autospec.engine.methods import accepts_keyword_knobs
from pyro_autospec.infer.knobs import SCHEDULE_KNOBS
from pyro_autospec.model.continuous import check_layout, discover_continuous_sites
from pyro_autospec.model.log_joint import continuous_log_joint

__all__ = ["ContinuousResult", "sample_continuous"]


# ---------------------------------------------------------------------------------- sampling
@dataclass
class ContinuousResult:
    """Draws of a model's continuous latent sites and what they cost.

    Attributes
    ----------
    samples : OrderedDict of str -> Tensor[N, *site.shape]
        Constrained draws per site (the shapes of ``MCMC.get_samples()``).
    unconstrained : Tensor[N, d]
        The flattened unconstrained draws ``X_T / T``.
    diffusion : DiffusionResult
        The engine's result (``rounds``, ``sample_rounds``, ``oracle_rows``, ``log_prob``...).
    lp : DoubleTensor[N] or None
        ``log p(x, data)`` of every draw (constrained space), when computed.
    pointwise : dict of str -> DoubleTensor[N, n_obs]
        Pointwise log likelihood of every observed site (flattened per draw), when computed.
    """

    samples: OrderedDict
    unconstrained: torch.Tensor
    diffusion: Any
    lp: torch.Tensor | None = None
    pointwise: dict = field(default_factory=dict)

    @property
    def sample_rounds(self) -> torch.Tensor:
        """LongTensor[N]: rounds in which each draw had an oracle query in flight."""
        return self.diffusion.sample_rounds

    @property
    def rounds(self) -> int:
        """Batched oracle calls of the whole run."""
        return self.diffusion.rounds

    @property
    def oracle_rows(self) -> int:
        """``(t, x)`` rows of the whole run."""
        return self.diffusion.oracle_rows

    @property
    def log_prob(self) -> torch.Tensor:
        """DoubleTensor[N]: log density of each draw's Euler-Maruyama PATH (not of ``x``)."""
        return self.diffusion.log_prob


def _refuse_model_keywords(func: Callable, unknown: list[str]) -> None:
    raise TypeError(
        f"unknown keyword(s) {unknown}; pass model keywords as model_kwargs={{...}} and "
        f"the engine's knobs as schedule=Schedule(...) (one of {list(SCHEDULE_KNOBS)})"
    )


@accepts_keyword_knobs(_refuse_model_keywords)
def sample_continuous(
    guide: Any,
    num_samples: int,
    *args: Any,
    model_kwargs: dict | None = None,
    method: str = "autospec",
    seed: int | np.random.Generator | torch.Generator | None = None,
    progress: bool = False,
    oracle: Any = None,
    log_joint: bool = True,
    model: Callable | None = None,
    schedule: Mapping | None = None,
    distributed: bool = False,
) -> ContinuousResult:
    """Draw a model's continuous latent sites from a diffusion guide, exactly for its chain.

    Parameters
    ----------
    guide : DiffusionGuide
        Any object with ``model``, ``layout``
        (:class:`~pyro_autospec.model.ContinuousLayout`), ``times`` (Tensor[N + 1]) and
        ``oracle(*args, **kwargs)`` (a ``MeanOracle`` over ``layout.dim`` given the data in
        ``args``).
    num_samples : int
        Draws.
    *args
        The model's positional arguments (data included); default: those the guide was built
        with (``guide.model_args``) when none are given.
    model_kwargs : dict, optional
        The model's keyword arguments.
    method : {"autospec", "sequential", "picard"}
        Passed to :func:`~pyro_autospec.engine.diffusion.sample_diffusion`; the first two give
        the same law (the sequential Euler-Maruyama chain of the guide).
    seed : int or Generator, optional
        Seeds the engine.
    progress : bool
        Show the engine's progress bar.
    oracle : MeanOracle, optional
        Use this denoiser instead of ``guide.oracle(*args)`` (it must have ``dim = layout.dim``);
        the layout, grid and transforms are still the guide's. For tests with an exact denoiser.
    log_joint : bool
        Also compute ``lp = log p(x, data)`` and the pointwise log likelihood.
    model : callable, optional
        The model whose sites the draws are and whose ``lp`` is computed (default: the one the
        guide was built from, ``guide.model``). Its sites with these arguments must be the
        guide's; the draws follow the guide's diffusion whatever the model.
    schedule : Schedule or dict, optional
        The engine's schedule (:class:`~pyro_autospec.Schedule`: ``rule``, ``max_block``,
        ``min_block``, ``rho`` and the caps, :func:`~pyro_autospec.sample_sde`); it moves rounds
        against rows and never changes the law of the draws.
    distributed : bool
        Spread the draws over the ranks of a ``torch.distributed`` group (every rank makes the
        same call and returns every draw).

    Returns
    -------
    ContinuousResult

    Raises
    ------
    UnsupportedSiteError
        For a model with discrete latent sites.
    AutoSpecModelError
        If the model's sites with these arguments differ from the guide's.

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> from pyro_autospec.guides.diffusion import DiffusionGuide
    >>> def model(y):
    ...     loc = pyro.sample("loc", dist.Normal(0.0, 1.0))
    ...     with pyro.plate("data", 3):
    ...         pyro.sample("y", dist.Normal(loc, 1.0), obs=y)
    >>> guide = DiffusionGuide(model, (torch.zeros(3),), hidden_dim=8, num_steps=16)
    >>> out = sample_continuous(guide, 10, torch.tensor([0.5, 1.0, 1.5]), seed=0)
    >>> out.samples["loc"].shape, out.sample_rounds.shape, out.lp.shape
    (torch.Size([10]), torch.Size([10]), torch.Size([10]))
    """
    if not args and model_kwargs is None:
        args = tuple(getattr(guide, "model_args", ()))
        model_kwargs = dict(getattr(guide, "model_kwargs", {}) or {})
    model_kwargs = {} if model_kwargs is None else dict(model_kwargs)
    model = guide.model if model is None else model
    layout = discover_continuous_sites(
        model, args, model_kwargs, max_plate_nesting=guide.layout.max_plate_nesting
    )
    check_layout(guide.layout, layout)
    if oracle is None:
        oracle = guide.oracle(*args, **model_kwargs)
    if getattr(oracle, "dim", None) != layout.dim:
        raise ValueError(
            f"oracle has dim = {getattr(oracle, 'dim', None)}; the model's continuous latents "
            f"have d = {layout.dim} unconstrained coordinates"
        )
    result = sample_diffusion(
        oracle,
        num_samples,
        times=guide.times,
        method=method,
        seed=seed,
        progress=progress,
        distributed=distributed,
        schedule=schedule,
    )
    y = result.samples.detach().to("cpu", torch.get_default_dtype())
    samples = layout.from_unconstrained(y)
    out = ContinuousResult(samples, y, result)
    if log_joint:
        out.lp, out.pointwise = continuous_log_joint(
            model, args, model_kwargs, layout, samples, pointwise=True
        )
    return out
