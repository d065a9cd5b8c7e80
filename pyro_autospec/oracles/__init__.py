"""Oracles: the only way the engine talks to a distribution.

Exact structured oracles (none of them imports Pyro):

* :class:`TabularOracle`: a full joint table over ``[q]^n``.
* :class:`MarkovChainOracle`, :class:`HMMOracle`, :class:`PairwiseChainOracle`: chains, hidden
  Markov models and chain-structured pairwise models.
* :class:`TreePottsOracle`: Potts / Ising models on trees and forests.
* :class:`DPPOracle`, :class:`SpanningTreeOracle`: determinantal point processes and
  (weighted) uniform spanning trees.
* :class:`CurieWeissOracle`: the mean-field Ising model.
"""

from pyro_autospec.engine.protocols import (
    MarginalOracle,
    MeanOracle,
    has_chain_marginals,
    has_chain_then,
    has_targeted_marginals,
    is_inference_safe,
)

from .curie_weiss import CurieWeissOracle
from .dpp import DPPOracle
from .hmm import HMMOracle, PairwiseChainOracle
from .markov import MarkovChainOracle
from .spanning_tree import SpanningTreeOracle
from .tabular import TabularOracle
from .tree_potts import TreePottsOracle

__all__ = [
    "MarginalOracle",
    "MeanOracle",
    "has_chain_marginals",
    "has_chain_then",
    "has_targeted_marginals",
    "is_inference_safe",
    "TabularOracle",
    "MarkovChainOracle",
    "HMMOracle",
    "PairwiseChainOracle",
    "TreePottsOracle",
    "DPPOracle",
    "SpanningTreeOracle",
    "CurieWeissOracle",
]

# more oracles are exported below
from .denoisers import FiniteSupportDenoiser, GaussianDenoiser, GaussianMixtureDenoiser  # noqa: E402

__all__ += ["GaussianDenoiser", "GaussianMixtureDenoiser", "FiniteSupportDenoiser"]

from pyro_autospec.parallel.sharded import ShardedOracle  # noqa: E402

__all__ += ["ShardedOracle"]
