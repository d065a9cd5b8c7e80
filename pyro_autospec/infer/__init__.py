"""The Pyro front end: ``AutoSpec(model)`` and ``AutoSpecKernel`` for discrete latent sites.

This package imports Pyro; the engine (:mod:`pyro_autospec.engine`) never does.
"""

from pyro_autospec.infer.autospec import AutoSpec
from pyro_autospec.infer.kernel import AutoSpecKernel
from pyro_autospec.infer.sites import (
    AutoSpecModelError,
    DiscreteSite,
    DynamicStructureError,
    SiteLayout,
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
    "SiteLayout",
    "UnsupportedSiteError",
    "discover_sites",
    "log_joint",
]
