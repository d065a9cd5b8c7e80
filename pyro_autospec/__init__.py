"""pyro-autospec: exact parallel sampling for Pyro programs by autospeculation.

The engine (:mod:`pyro_autospec.engine`) and the structured oracles never import Pyro; the Pyro
front end (:class:`AutoSpec`, :class:`AutoSpecKernel`) and the Pyro distributions are loaded
lazily, on first use, so ``import pyro_autospec`` stays light. The subpackages are attributes
of the package, imported on first access as in ``pyro.infer``: ``pyro_autospec.engine``,
``.parallel``, ``.oracles``, ``.model``, ``.infer``, ``.guides``, ``.diagnostics`` and
``.distributions``. The documentation is at :doc:`/index`; the algorithm is explained in
:doc:`/algorithm`; how the packages are laid out in :doc:`/architecture`.

Examples
--------
>>> import torch
>>> from pyro_autospec import sample_any_order
>>> from pyro_autospec.oracles import MarkovChainOracle
>>> stay = torch.tensor([[0.73, 0.27], [0.27, 0.73]])
>>> chain = MarkovChainOracle(torch.tensor([0.5, 0.5]), stay, 256)
>>> result = sample_any_order(chain, 4, seed=0)
>>> bool(result.sample_rounds.double().mean() < 256)
True
>>> import pyro_autospec
>>> pyro_autospec.guides.AnyOrderGuide.__name__  # subpackages load on first access
'AnyOrderGuide'
"""

from __future__ import annotations

import importlib
from typing import Any

from pyro_autospec.engine import (
    OracleError,
    SampleResult,
    Schedule,
    default_schedule,
    sample_any_order,
)
from pyro_autospec.engine.protocols import MarginalOracle, MeanOracle

__version__ = "0.1.0"

# name -> module, imported on first access (these modules import Pyro or are heavier).
_LAZY = {
    "AutoSpec": "pyro_autospec.infer",
    "AutoSpecKernel": "pyro_autospec.infer",
    "AnyOrderGuide": "pyro_autospec.guides",
    "DiffusionGuide": "pyro_autospec.guides",
    "sample_diffusion": "pyro_autospec.engine.diffusion",
    "sample_sde": "pyro_autospec.engine.diffusion",
    "diffusion_times": "pyro_autospec.engine.diffusion",
    "euler_maruyama_log_prob": "pyro_autospec.engine.diffusion",
}

# Subpackages reachable as attributes, imported on first access (model, infer, guides,
# diagnostics and distributions import Pyro; the engine, parallel and the oracles do not).
_SUBPACKAGES = (
    "engine",
    "parallel",
    "oracles",
    "model",
    "infer",
    "guides",
    "diagnostics",
    "distributions",
)

__all__ = [
    "MarginalOracle",
    "MeanOracle",
    "OracleError",
    "SampleResult",
    "Schedule",
    "default_schedule",
    "sample_any_order",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    if name in _SUBPACKAGES:
        # import_module also binds the subpackage as an attribute of this package.
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'pyro_autospec' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | set(_SUBPACKAGES))
