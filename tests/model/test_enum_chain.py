"""EnumOracle's lowering of chain-structured models to a PairwiseChainOracle.

The lowered oracle must answer exactly what the contraction answers (and what brute force over
every assignment gives), for the handlers real HMMs use: ``pyro.markov``, ``poutine.mask``,
``poutine.scale``, sites of different support sizes and forbidden transitions.
"""

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine

from pyro_autospec.model import enumerate_posterior
from pyro_autospec.model.enum import EnumOracle
from pyro_autospec.model.errors import IntractableEnumerationError
from tests.catalogue.oracle_reference import (
    assert_chain_matches_rows,
    random_chains,
)

TRANS = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.0, 0.3, 0.7]])  # 2 -> 0 forbidden
LOCS = torch.tensor([-1.0, 0.5, 2.0])


def hmm(ys, observed=None):
    """A first site with two values, then three-state steps; some steps masked or scaled."""
    z = pyro.sample("z_0", dist.Bernoulli(0.3)).long()
    for t in pyro.markov(range(1, len(ys))):
        with poutine.mask(mask=observed is None or bool(observed[t])):
            z = pyro.sample(f"z_{t}", dist.Categorical(logits=TRANS.log()[z]))
        with poutine.scale(scale=1.0 + 0.5 * (t % 2)):
            pyro.sample(f"y_{t}", dist.Normal(LOCS[z], 1.0), obs=ys[t])


def skip_chain(ys):
    """z_2 depends on z_0: not a chain in trace order."""
    z0 = pyro.sample("z_0", dist.Categorical(torch.ones(3) / 3))
    z1 = pyro.sample("z_1", dist.Categorical(TRANS[z0]))
    z2 = pyro.sample("z_2", dist.Categorical(TRANS[z0]))
    for t, z in enumerate((z0, z1, z2)):
        pyro.sample(f"y_{t}", dist.Normal(LOCS[z], 1.0), obs=ys[t])


def plated(ys, lengths=None):
    """Independent chains in a plate (one per column of ``ys``), masked past their lengths,
    as in Pyro's ``examples/hmm.py``: each site holds one coordinate per chain."""
    with pyro.plate("chains", ys.shape[1]):
        z = 0
        for t in pyro.markov(range(len(ys))):
            live = True if lengths is None else t < lengths
            with poutine.mask(mask=live):
                z = pyro.sample(f"z_{t}", dist.Categorical(logits=TRANS.log()[z]))
                pyro.sample(f"y_{t}", dist.Normal(LOCS[z], 1.0), obs=ys[t])


def coupled(ys):
    """Two chains in a plate plus a site all their elements share: not independent chains."""
    shared = pyro.sample("shared", dist.Categorical(torch.ones(3) / 3))
    with pyro.plate("chains", 2):
        z0 = pyro.sample("z_0", dist.Categorical(torch.ones(3) / 3))
        z1 = pyro.sample("z_1", dist.Categorical(TRANS[z0]))
        pyro.factor("agree", (z1 == shared).float())


def coupled_over_the_plate(ys):
    """A factor outside the plate that reads its elements: enumeration cannot express it."""
    with pyro.plate("chains", 2):
        z0 = pyro.sample("z_0", dist.Categorical(torch.ones(3) / 3))
        z1 = pyro.sample("z_1", dist.Categorical(TRANS[z0]))
    pyro.factor("agree", (z1.unsqueeze(-1) == z1.unsqueeze(-2)).float().sum((-1, -2)))


def posterior_queries(states, log_prob, rows: int, k: int, gen):
    """Rows pinned at posterior draws (possible assignments), ``k`` targets each."""
    values = states[torch.multinomial(log_prob.exp(), rows, replacement=True, generator=gen)]
    mask = torch.rand(rows, states.shape[1], generator=gen) < 0.4
    mask[0] = False
    return values, mask, torch.randint(0, states.shape[1], (rows, k), generator=gen)


def assert_brute_force(got, states, log_prob, values, mask, targets):
    """``got`` [B, k, q] equals the posterior table conditioned on each row's pins."""
    p = log_prob.exp()
    for b in range(values.shape[0]):
        pb = p * ((states == values[b]) | ~mask[b]).all(1)
        for k in range(targets.shape[1]):
            for v in range(got.shape[2]):
                mass = pb[states[:, targets[b, k]] == v].sum() / pb.sum()
                assert math.isclose(got[b, k, v].exp().item(), mass.item(), abs_tol=1e-12)


YS = torch.tensor([0.3, -1.2, 2.5, 0.1, 1.9, -0.4, 0.8])
OBSERVED = torch.tensor([1, 1, 0, 1, 1, 0, 1])


def test_chain_models_are_lowered_and_others_are_not():
    assert EnumOracle(hmm, (YS,))._chain is not None
    assert EnumOracle(hmm, (YS,), lower_chains=False)._chain is None
    assert EnumOracle(skip_chain, (YS[:3],))._chain is None
    assert EnumOracle(plated, (YS[:3, None].expand(3, 2),))._chain is not None
    assert EnumOracle(coupled, (YS[:2],))._chain is None
    with pytest.raises(IntractableEnumerationError, match="outside plate"):
        EnumOracle(coupled_over_the_plate, (YS[:2],))


def test_chains_in_a_plate_equal_brute_force_and_contraction():
    ys = torch.stack([YS[:4], YS[1:5] - 0.5], 1)  # 4 steps, 2 chains
    lengths = torch.tensor([4, 2])
    args = (ys, lengths)
    oracle = EnumOracle(plated, args)
    assert oracle._chain is not None and oracle._chain_order is not None
    n, q = oracle.num_coords, oracle.num_values
    states, log_prob = enumerate_posterior(plated, args, layout=oracle.layout)
    gen = torch.Generator().manual_seed(5)
    values, mask, targets = posterior_queries(states, log_prob, 30, 2, gen)
    got = oracle.log_marginals_at(values, mask, targets)  # 2 targets per 8 coords: the chain
    assert_brute_force(got, states, log_prob, values, mask, targets)
    exact = states[torch.multinomial(log_prob.exp(), 20, replacement=True, generator=gen)]
    values, mask, chain = random_chains(n, q, 20, 6, seed=6, values=exact)
    assert assert_chain_matches_rows(oracle, values, mask, chain, atol=1e-12) > 10
    general = EnumOracle(plated, args, lower_chains=False)
    torch.testing.assert_close(
        oracle.log_marginals_chain(values, mask, chain).exp(),
        general.log_marginals_chain(values, mask, chain).exp(),
        atol=1e-12,
        rtol=0,
    )


@pytest.mark.parametrize("observed", [None, OBSERVED], ids=["plain", "masked"])
def test_lowered_answers_equal_brute_force_and_contraction(observed):
    oracle = EnumOracle(hmm, (YS, observed))
    assert oracle._chain is not None
    q = oracle.num_values
    states, log_prob = enumerate_posterior(hmm, (YS, observed), layout=oracle.layout)
    values, mask, targets = posterior_queries(
        states, log_prob, 40, 1, torch.Generator().manual_seed(0)
    )
    got = oracle.log_marginals_at(values, mask, targets)  # 4 targets per 7 coords: chain path
    assert_brute_force(got, states, log_prob, values, mask, targets)
    # the contraction (the general path) gives the same numbers, -inf included
    contraction = oracle.log_marginals(values, mask).gather(
        1, targets[:, :, None].expand(-1, -1, q)
    )
    assert torch.equal(torch.isneginf(got), torch.isneginf(contraction))
    finite = torch.isfinite(contraction)
    torch.testing.assert_close(got[finite], contraction[finite], atol=1e-12, rtol=0)


def test_lowered_chain_queries_equal_rows():
    oracle = EnumOracle(hmm, (YS, OBSERVED))
    states, log_prob = enumerate_posterior(hmm, (YS, OBSERVED), layout=oracle.layout)
    gen = torch.Generator().manual_seed(1)
    exact = states[torch.multinomial(log_prob.exp(), 30, replacement=True, generator=gen)]
    values, mask, chain = random_chains(oracle.num_coords, 3, 30, 5, seed=2, values=exact)
    assert assert_chain_matches_rows(oracle, values, mask, chain, atol=1e-12) > 20


def sticky(ys):
    """The state never changes: pins that disagree are impossible together."""
    z = pyro.sample("z_0", dist.Categorical(torch.ones(3) / 3))
    for t in pyro.markov(range(1, len(ys))):
        z = pyro.sample(f"z_{t}", dist.Categorical(logits=torch.eye(3).log()[z]))
        pyro.sample(f"y_{t}", dist.Normal(LOCS[z], 1.0), obs=ys[t])


def test_target_between_incompatible_pins_is_neginf_not_nan():
    oracle = EnumOracle(sticky, (YS,))
    assert oracle._chain is not None
    values = torch.zeros(1, oracle.num_coords, dtype=torch.long)
    values[0, 4] = 1
    mask = torch.zeros_like(values, dtype=torch.bool)
    mask[0, [1, 4]] = True  # z_1 = 0 and z_4 = 1: impossible together
    out = oracle.log_marginals_chain(values, mask, torch.tensor([[2, 3]]))
    assert torch.isneginf(out).all()


def test_many_targets_use_the_contraction():
    oracle = EnumOracle(hmm, (YS,))
    calls = oracle.num_calls
    values = torch.zeros(3, oracle.num_coords, dtype=torch.long)
    mask = torch.zeros_like(values, dtype=torch.bool)
    oracle.log_marginals_at(values, mask, torch.tensor([[0, 1, 2]] * 3))  # 3 of 7: contraction
    assert oracle.num_calls == calls + 1
    oracle.log_marginals_at(values, mask, torch.tensor([[0]] * 3))  # 1 of 7: the chain
    assert oracle.num_calls == calls + 1
