"""Reading a Pyro model: everything AutoSpec needs to know about one, and nothing that samples.

Tracing it once (:mod:`.tracing`), its discrete latent sites and their coordinates
(:mod:`.discrete`), its continuous latent sites and data (:mod:`.continuous`), the batched log
joint of draws (:mod:`.log_joint`), forward simulation and the log joint of draws each with its
own data (:mod:`.simulation`, which the guides use), and the exact oracle of its discrete sites
by enumeration, compiled once (:class:`EnumOracle`, :mod:`.enum`, with its contraction
:mod:`.enum_contract`).
It imports Pyro, the engine's protocols and the exact oracles (the enumeration oracle lowers
chains to :class:`~pyro_autospec.oracles.PairwiseChainOracle`), and nothing above them, so
:mod:`pyro_autospec.infer` and :mod:`pyro_autospec.guides` can both import it without
importing each other.
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
from pyro_autospec.model.discrete import DiscreteSite, PlainRun, SiteLayout, discover_sites
from pyro_autospec.model.enum import EnumOracle
from pyro_autospec.model.errors import (
    AutoSpecModelError,
    DynamicStructureError,
    IntractableEnumerationError,
    MixedDrawsError,
    SubsamplingError,
    UnsupportedSiteError,
)
from pyro_autospec.model.log_joint import (
    LogJoint,
    SharedNumbersWarning,
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
    "EnumOracle",
    "IntractableEnumerationError",
    "MixedDrawsError",
    "LogJoint",
    "PlainRun",
    "SharedNumbersWarning",
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
