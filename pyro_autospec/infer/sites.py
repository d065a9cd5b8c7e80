"""Old import path of the discrete-site plumbing; it now lives in :mod:`pyro_autospec.model`.

Kept so that existing code keeps working: import from :mod:`pyro_autospec.model` instead
(``discover_sites``, ``SiteLayout``, ``DiscreteSite``, ``log_joint``, ``enumerate_posterior``
and the errors).
"""

from pyro_autospec.model.discrete import DiscreteSite, SiteLayout, discover_sites
from pyro_autospec.model.errors import (
    AutoSpecModelError,
    DynamicStructureError,
    IntractableEnumerationError,
    SubsamplingError,
    UnsupportedSiteError,
)
from pyro_autospec.model.log_joint import enumerate_posterior, log_joint

__all__ = [
    "AutoSpecModelError",
    "DiscreteSite",
    "DynamicStructureError",
    "IntractableEnumerationError",
    "SiteLayout",
    "SubsamplingError",
    "UnsupportedSiteError",
    "discover_sites",
    "enumerate_posterior",
    "log_joint",
]
