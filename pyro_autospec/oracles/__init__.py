"""Oracles: the only way the engine talks to a distribution.

Exact structured oracles (none of them imports Pyro), all derived from :class:`ExactOracle`
(devices, validation and generic chain queries, for a user's oracle too):

* :class:`TabularOracle`: a full joint table over ``[q]^n``.
* :class:`MarkovChainOracle`, :class:`HMMOracle`, :class:`PairwiseChainOracle`: chains, hidden
  Markov models and chain-structured pairwise models.
* :class:`TreePottsOracle`: Potts / Ising models on trees and forests.
* :class:`DPPOracle`, :class:`SpanningTreeOracle`: determinantal point processes and
  (weighted) uniform spanning trees.
* :class:`CurieWeissOracle`: the mean-field Ising model.

Exact conditional means for diffusions (:class:`~pyro_autospec.engine.protocols.MeanOracle`):
:class:`GaussianDenoiser`, :class:`GaussianMixtureDenoiser`, :class:`FiniteSupportDenoiser`.
The protocols themselves are the engine's (:mod:`pyro_autospec.engine.protocols`), re-exported
here; :class:`ShardedOracle` (one oracle over several processes) is
:mod:`pyro_autospec.parallel`'s. The exact oracle of a Pyro model, by enumeration, is
:class:`pyro_autospec.model.EnumOracle`.
"""

from pyro_autospec.engine.protocols import (
    MarginalOracle,
    MeanOracle,
    borrows_inputs,
    has_chain_marginals,
    has_chain_then,
    has_targeted_marginals,
    is_inference_safe,
)
from pyro_autospec.parallel.sharded import ShardedOracle

from .curie_weiss import CurieWeissOracle
from .denoisers import FiniteSupportDenoiser, GaussianDenoiser, GaussianMixtureDenoiser
from .dpp import DPPOracle
from .exact import ExactOracle
from .hmm import HMMOracle, PairwiseChainOracle
from .markov import MarkovChainOracle
from .spanning_tree import SpanningTreeOracle
from .tabular import TabularOracle
from .tree_potts import TreePottsOracle

__all__ = [
    "MarginalOracle",
    "MeanOracle",
    "ExactOracle",
    "borrows_inputs",
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
    "GaussianDenoiser",
    "GaussianMixtureDenoiser",
    "FiniteSupportDenoiser",
    "ShardedOracle",
]
