"""Guide networks: learned oracles over a Pyro model's latent sites.

* :class:`AnyOrderGuide` (discrete sites) is a :class:`~pyro_autospec.oracles.base.MarginalOracle`
  trained with :meth:`AnyOrderGuide.fit_to_samples` (draws at hand) or :func:`fit_posterior`
  (the model's joint density only); ``AutoSpec(model, guide=guide, correction=...)`` samples it
  exactly by autospeculation and corrects the draws to the exact posterior (importance
  resampling with Pareto smoothing, or independent Metropolis-Hastings).
* :class:`DiffusionGuide` (continuous sites) is a denoiser ``f(t, x; data)`` over the
  unconstrained continuous latents, trained by simulation; ``AutoSpec(model, guide=guide)``
  draws from its discretised diffusion exactly as the sequential Euler-Maruyama chain would.
"""

from pyro_autospec.guides.any_order import AnyOrderGuide
from pyro_autospec.guides.correction import importance_resample, independent_metropolis_hastings
from pyro_autospec.guides.diffusion import ConditionedDenoiser, DiffusionGuide
from pyro_autospec.guides.training import fit_posterior

__all__ = [
    "AnyOrderGuide",
    "ConditionedDenoiser",
    "DiffusionGuide",
    "fit_posterior",
    "importance_resample",
    "independent_metropolis_hastings",
]
