"""The conformance catalogues: one line per oracle, for ``tests/oracles/test_conformance.py``
and ``tests/oracles/test_mean_conformance.py``.

``CONFORMANCE`` names every marginal oracle the library ships and the user oracles of
``tests/catalogue/user_oracles.py``, each built small (n of 3 to 6, q of 2 to 4). To test a new
oracle, add one line: a name and a :class:`Conformance` (a factory, and the brute-force joint
where one is known).

``MEAN_CONFORMANCE`` names every mean oracle (denoiser) the library ships, each built small
(d of 2 to 3). To test a new one, add one line: a name and a :class:`MeanConformance` (a
factory, and ``E[Y]`` where it is known).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from pyro_autospec.oracles import (
    CurieWeissOracle,
    DPPOracle,
    FiniteSupportDenoiser,
    GaussianDenoiser,
    GaussianMixtureDenoiser,
    HMMOracle,
    MarkovChainOracle,
    PairwiseChainOracle,
    SpanningTreeOracle,
    TabularOracle,
    TreePottsOracle,
)
from pyro_autospec.parallel import ShardedOracle
from tests.catalogue.distributed import one_rank_group
from tests.catalogue.guide_models import ising_chain
from tests.catalogue.models import CASES
from tests.catalogue.oracles import random_hmm, random_kernel
from tests.catalogue.references import (
    chain_log_prob,
    curie_weiss_log_prob,
    dpp_log_prob,
    hmm_log_prob,
    pairwise_chain_log_prob,
    posterior_log_prob,
    potts_log_prob,
    spanning_tree_log_prob,
)
from tests.catalogue.user_oracles import HandChain, NoAdjacentZeros, ProductMixture, RandomNADE


@dataclass(frozen=True)
class Conformance:
    """One oracle of the conformance suite (``tests/oracles/test_conformance.py``).

    Parameters
    ----------
    make : callable
        ``make()`` returns a fresh, small oracle (n of 4 to 8, q of 2 to 4), or a generator
        yielding one (closed after the test: for an oracle that needs a process group).
    log_prob : callable, optional
        ``log_prob(oracle)`` returns a function of a state (tuple of values) giving its
        unnormalised log probability by brute force; the chain rule's law must equal it.
        ``None``: no tractable joint is known (then a consistent oracle's chain rule must give
        the same law in every order).
    consistent : bool
        Whether the conditionals are those of one joint (exact oracles); an imperfect learned
        oracle's chain rule depends on the order.
    point_masses : bool
        Whether the oracle documents that a pinned coordinate's row is a point mass at its value.
    """

    make: Callable[[], Any]
    log_prob: Callable[[Any], Callable[[tuple], float]] | None = None
    consistent: bool = True
    point_masses: bool = True


def fixed(log_prob):
    """A ``Conformance.log_prob`` that does not need the oracle."""
    return lambda oracle: log_prob


def sharded(make):
    """``make()``'s oracle behind a ShardedOracle, in a one-rank group for the test's length."""

    def generator():
        with one_rank_group():
            yield ShardedOracle(make())

    return generator


def _random(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _with_zeros(table: torch.Tensor) -> torch.Tensor:
    """``table`` with a few ``-inf`` entries (hard constraints)."""
    table = table.clone()
    table.view(-1)[:: max(1, table.numel() // 5)] = -math.inf
    table.view(-1)[1] = 0.0
    return table


# the parameters of the small oracles
TABLE = _with_zeros(_random(0, 3, 3, 3, 3, 3))
CHAIN = (
    torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64),
    torch.tensor([[0.6, 0.0, 0.4], [0.2, 0.5, 0.3], [0.3, 0.3, 0.4]], dtype=torch.float64),
)
HMM = random_hmm(5, 3, seed=3, zeros=True)
PAIRWISE = (_random(4, 6, 2), _with_zeros(_random(5, 5, 2, 2)))
pairwise_log_prob = pairwise_chain_log_prob(*PAIRWISE)
POTTS = ([(0, 1), (0, 2), (2, 3), (4, 5)], _with_zeros(_random(6, 4, 3, 3)), _random(7, 6, 3))
KERNEL = random_kernel(5, seed=8)
PROJECTION = random_kernel(6, seed=9, projection_rank=3)
GRAPH = (4, [(0, 1), (1, 2), (2, 3), (3, 0), (0, 2)], [1.0, 2.0, 0.5, 1.5, 3.0])
CW = (6, 1.3, 0.2)
NADE = {"n": 5, "q": 3, "hidden": 8, "scale": 2.0, "seed": 1}
NADE_ROWS = {**NADE, "chains": False}
MIXTURE = {"n": 5, "q": 3, "components": 4, "sharpness": 1.5, "seed": 2}
GUIDE_MLP = {"num_coords": 5, "num_values": 3, "architecture": "mlp", "hidden_dim": 16}
ISING_DATA = (torch.tensor([0.8, -0.3, 1.1, -1.0, 0.2]),)


def _tabular():
    return TabularOracle(logits=TABLE)


def _tree_potts():
    return TreePottsOracle(torch.tensor(POTTS[0]), *POTTS[1:], num_values=3)


def _enum(name):
    from pyro_autospec.model import EnumOracle

    model, args, _ = CASES[name]
    return lambda: EnumOracle(model, args)


def _posterior(name):
    model, args, _ = CASES[name]
    return lambda oracle: posterior_log_prob(model, args, oracle.layout)


def _guide(**kwargs):
    def make():
        from pyro_autospec.guides import AnyOrderGuide

        torch.manual_seed(0)
        return AnyOrderGuide(**kwargs)

    return make


def _joint(oracle):
    """A user oracle's own ``log_joint`` (of a LongTensor[M, n]) as a function of a state."""
    return lambda x: float(oracle.log_joint(torch.tensor([x]))[0])


C = Conformance
LEARNED = {"consistent": False, "point_masses": False}  # imperfect: the law depends on the order

# One line per oracle: every oracle the library ships (the denoisers are MeanOracles, not
# MarginalOracles: they are MEAN_CONFORMANCE's) and the user oracles of
# tests/catalogue/user_oracles.py.
CONFORMANCE = {
    "tabular": C(_tabular, fixed(lambda x: float(TABLE[x]))),
    "markov_chain": C(lambda: MarkovChainOracle(*CHAIN, 6), fixed(chain_log_prob(*CHAIN))),
    "hmm": C(lambda: HMMOracle(*HMM), fixed(hmm_log_prob(*HMM))),
    "pairwise_chain": C(lambda: PairwiseChainOracle(*PAIRWISE), fixed(pairwise_log_prob)),
    "tree_potts": C(_tree_potts, fixed(potts_log_prob(*POTTS))),
    "dpp": C(lambda: DPPOracle(KERNEL), fixed(dpp_log_prob(KERNEL))),
    "dpp_projection": C(lambda: DPPOracle(PROJECTION), fixed(dpp_log_prob(PROJECTION))),
    "spanning_tree": C(lambda: SpanningTreeOracle(*GRAPH), fixed(spanning_tree_log_prob(*GRAPH))),
    "curie_weiss": C(lambda: CurieWeissOracle(*CW), fixed(curie_weiss_log_prob(*CW))),
    "enum_mixed_supports": C(_enum("mixed_supports"), _posterior("mixed_supports")),
    "enum_hmm": C(_enum("hmm_markov"), _posterior("hmm_markov")),
    "sharded_tabular": C(sharded(_tabular), fixed(lambda x: float(TABLE[x]))),
    "sharded_hand_chain": C(sharded(lambda: HandChain(5, stay=0.8)), _joint, point_masses=False),
    "any_order_guide_mlp": C(_guide(**GUIDE_MLP), **LEARNED),
    "any_order_guide_graph": C(_guide(model=ising_chain, model_args=ISING_DATA), **LEARNED),
    "user_random_nade": C(lambda: RandomNADE(**NADE), **LEARNED),
    "user_random_nade_rows_only": C(lambda: RandomNADE(**NADE, chains=False), **LEARNED),
    "user_product_mixture": C(lambda: ProductMixture(**MIXTURE), _joint, point_masses=False),
    "user_hand_chain": C(lambda: HandChain(6, stay=0.8), _joint, point_masses=False),
    "user_constrained_nade": C(lambda: NoAdjacentZeros(RandomNADE(**NADE_ROWS)), **LEARNED),
}  # fmt: skip


# ------------------------------------------------------------------------ mean oracles
@dataclass(frozen=True)
class MeanConformance:
    """One mean oracle of the mean conformance suite (``tests/oracles/test_mean_conformance.py``).

    Parameters
    ----------
    make : callable
        ``make()`` returns a fresh, small mean oracle (``dim`` of 1 to 4), or a generator
        yielding one (closed after the test: for an oracle that needs a process group).
    mean : Tensor[d], optional
        ``E[Y]`` in closed form: ``f(0, 0)`` must equal it (``X_0 = 0`` says nothing of ``Y``).
        ``None``: not known.
    """

    make: Callable[[], Any]
    mean: torch.Tensor | None = None


def _spd(seed: int, d: int, rank: int | None = None) -> torch.Tensor:
    """A random symmetric positive semi-definite ``[d, d]`` matrix (singular for ``rank < d``)."""
    a = _random(seed, d, d if rank is None else rank)
    return a @ a.T / d + (0.1 * torch.eye(d, dtype=torch.float64) if rank is None else 0.0)


# the parameters of the small denoisers: (mean, cov), (weights, means, covs) with a singular
# component, and (points, weights)
GAUSSIAN = (torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64), _spd(20, 3))
GAUSSIAN_MIXTURE = (
    torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64),
    _random(21, 3, 2),
    torch.stack([_spd(22, 2), _spd(23, 2, rank=1), 0.05 * _spd(24, 2)]),
)
POINT_CLOUD = (_random(25, 7, 3), torch.tensor([1.0, 2.0, 0.5, 1.0, 3.0, 0.25, 1.0]).double())


def _gaussian():
    return GaussianDenoiser(*GAUSSIAN)


def _gaussian_mixture():
    return GaussianMixtureDenoiser(*GAUSSIAN_MIXTURE)


def _finite_support():
    return FiniteSupportDenoiser(*POINT_CLOUD)


def _weighted_mean(weights, points):
    return weights @ points / weights.sum()


MC = MeanConformance

# One line per mean oracle: every denoiser the library ships, and ShardedOracle around one.
MEAN_CONFORMANCE = {
    "gaussian": MC(_gaussian, GAUSSIAN[0]),
    "gaussian_mixture": MC(_gaussian_mixture, _weighted_mean(*GAUSSIAN_MIXTURE[:2])),
    "finite_support": MC(_finite_support, _weighted_mean(*POINT_CLOUD[::-1])),
    "sharded_gaussian": MC(sharded(_gaussian), GAUSSIAN[0]),
}  # fmt: skip
