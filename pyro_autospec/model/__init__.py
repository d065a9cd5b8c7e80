"""Pyro-model plumbing shared by the front end, the enumeration oracle and the guides.

Everything AutoSpec needs to know about a Pyro model, and nothing that samples: tracing it once
(:mod:`.tracing`), its discrete latent sites and their coordinates (:mod:`.discrete`), its
continuous latent sites and data (:mod:`.continuous`), and the batched log joint of draws
(:mod:`.log_joint`). It imports Pyro but nothing else of this package except its own modules,
so :mod:`pyro_autospec.infer`, :mod:`pyro_autospec.oracles.enum` and
:mod:`pyro_autospec.guides` can all import it without importing each other.
"""

from pyro_autospec.model.continuous import (
    ContinuousLayout,
    ContinuousSite,
    DataSite,
    check_continuous_only,
    check_layout,
    discover_continuous_sites,
    observed_data,
    simulate,
)
from pyro_autospec.model.discrete import DiscreteSite, SiteLayout, discover_sites
from pyro_autospec.model.errors import (
    AutoSpecModelError,
    DynamicStructureError,
    IntractableEnumerationError,
    SubsamplingError,
    UnsupportedSiteError,
)
from pyro_autospec.model.log_joint import (
    LogJoint,
    continuous_log_joint,
    enumerate_posterior,
    evaluate,
    log_joint,
)
from pyro_autospec.model.tracing import trace_model

__all__ = [
    "AutoSpecModelError",
    "ContinuousLayout",
    "ContinuousSite",
    "DataSite",
    "DiscreteSite",
    "DynamicStructureError",
    "IntractableEnumerationError",
    "LogJoint",
    "SiteLayout",
    "SubsamplingError",
    "UnsupportedSiteError",
    "check_continuous_only",
    "check_layout",
    "continuous_log_joint",
    "discover_continuous_sites",
    "discover_sites",
    "enumerate_posterior",
    "evaluate",
    "log_joint",
    "observed_data",
    "simulate",
    "trace_model",
]
