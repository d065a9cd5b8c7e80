"""The Pyro front end: ``AutoSpec(model)`` and ``AutoSpecKernel``.

``AutoSpec`` is a thin facade over one run object per kind of model (discrete sites only,
continuous and discrete sites, continuous sites with a diffusion guide); a guide's draws are
corrected to the exact posterior by :mod:`.correction`. The Pyro-model plumbing (site
discovery, tracing, batched log joint) lives in :mod:`pyro_autospec.model`; the names below are
re-exported from there. This package imports Pyro; the engine (:mod:`pyro_autospec.engine`)
never does.
"""

from pyro_autospec.infer.autospec import AutoSpec
from pyro_autospec.infer.correction import importance_resample, independent_metropolis_hastings
from pyro_autospec.infer.kernel import AutoSpecKernel
from pyro_autospec.infer.self_check import SelfCheckError
from pyro_autospec.model import (
    AutoSpecModelError,
    DiscreteSite,
    DynamicStructureError,
    IntractableEnumerationError,
    MixedDrawsError,
    SiteLayout,
    SubsamplingError,
    UnsupportedSiteError,
    discover_sites,
    log_joint,
)

__all__ = [
    "AutoSpec",
    "AutoSpecKernel",
    "AutoSpecModelError",
    "DiscreteSite",
    "DynamicStructureError",
    "IntractableEnumerationError",
    "MixedDrawsError",
    "SelfCheckError",
    "SiteLayout",
    "SubsamplingError",
    "UnsupportedSiteError",
    "discover_sites",
    "importance_resample",
    "independent_metropolis_hastings",
    "log_joint",
]
