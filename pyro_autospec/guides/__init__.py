"""Guide networks: learned oracles over a Pyro model's latent sites.

* :class:`AnyOrderGuide` (discrete sites) is a
  :class:`~pyro_autospec.engine.protocols.MarginalOracle` that reads the model's factor graph
  (:mod:`~pyro_autospec.guides.structure`) and is trained
  with :meth:`AnyOrderGuide.fit_to_samples` (draws at hand), :func:`fit_posterior` (the model's
  joint density only) or :meth:`AnyOrderGuide.fit_simulation` (amortised over data sets);
  ``AutoSpec(model, guide=guide, correction=...)`` samples it exactly by autospeculation and
  corrects the draws to the exact posterior (importance resampling with Pareto smoothing, or
  independent Metropolis-Hastings: :mod:`pyro_autospec.infer.correction`);
  :func:`~pyro_autospec.diagnostics.weights.weight_diagnostics` says whether to trust the
  correction.
* :class:`DiffusionGuide` (continuous sites) is a denoiser ``f(t, x; data)`` over the
  unconstrained continuous latents, trained by simulation; ``AutoSpec(model, guide=guide)``
  draws from its discretised diffusion exactly as the sequential Euler-Maruyama chain would.

Both guides train with the one Adam loop :func:`~pyro_autospec.guides.training.train`. See
:doc:`/guides`.
"""

from pyro_autospec.guides.any_order import AnyOrderGuide, ConditionedGuide, GuideContext
from pyro_autospec.guides.diffusion import ConditionedDenoiser, DiffusionGuide
from pyro_autospec.guides.structure import ModelStructure, probe_structure
from pyro_autospec.guides.training import fit_posterior, train

__all__ = [
    "AnyOrderGuide",
    "ConditionedDenoiser",
    "ConditionedGuide",
    "DiffusionGuide",
    "GuideContext",
    "ModelStructure",
    "fit_posterior",
    "probe_structure",
    "train",
]
