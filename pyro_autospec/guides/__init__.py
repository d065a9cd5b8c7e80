"""Guide networks: learned any-order oracles over a Pyro model's discrete latent sites.

:class:`AnyOrderGuide` is a :class:`~pyro_autospec.oracles.base.MarginalOracle` trained with
:meth:`AnyOrderGuide.fit_to_samples` (draws at hand) or :func:`fit_posterior` (the model's
joint density only); ``AutoSpec(model, guide=guide, correction=...)`` samples it exactly by
autospeculation and corrects the draws to the exact posterior (importance resampling with
Pareto smoothing, or independent Metropolis-Hastings).
"""

from pyro_autospec.guides.any_order import AnyOrderGuide
from pyro_autospec.guides.correction import importance_resample, independent_metropolis_hastings
from pyro_autospec.guides.training import fit_posterior

__all__ = [
    "AnyOrderGuide",
    "fit_posterior",
    "importance_resample",
    "independent_metropolis_hastings",
]
