"""Oracles as users write them (``tests/catalogue/user_oracles.py``): their queries agree with
brute force, and the samplers are exact for them (chi-square, tier 2).

For an imperfect oracle (a network whose conditionals are not the marginals of one joint) the
target is the law of the sequential sampler with the same oracle in the same order: with a
fixed order it is computable by brute force, state by state.
"""

import itertools
import math

import numpy as np
import pytest
import torch

from pyro_autospec.engine import Schedule, sample_any_order
from tests.catalogue.user_oracles import (
    HandChain,
    NoAdjacentZeros,
    ProductMixture,
    RandomNADE,
    chain_rule_log_prob,
)
from tests.stats import P_THRESHOLD, assert_samples_match, chisquare_pvalue, state_index

ORDER = [3, 0, 4, 1, 2]


def joint_states(n, q):
    return torch.tensor(list(itertools.product(range(q), repeat=n)))


def brute_conditionals(log_joint, values, mask, q):
    """``log mu(X_i = . | X_S = values_S)`` for every i by summing the joint: [B, n, q]."""
    n = values.shape[1]
    states = joint_states(n, q)
    logp = log_joint(states)
    out = torch.empty(values.shape[0], n, q, dtype=torch.float64)
    for b in range(values.shape[0]):
        keep = (states[:, mask[b]] == values[b, mask[b]]).all(1)
        for i in range(n):
            for v in range(q):
                out[b, i, v] = torch.logsumexp(logp[keep & (states[:, i] == v)], 0)
        out[b] -= torch.logsumexp(out[b], -1, keepdim=True)
    return out


def random_queries(n, q, rows=12, seed=0):
    gen = torch.Generator().manual_seed(seed)
    values = torch.randint(0, q, (rows, n), generator=gen)
    mask = torch.rand(rows, n, generator=gen) < 0.5
    return values, mask


def chain_queries(n, q, rows=12, length=3, seed=1):
    """``(values, prefix mask, chain)``: each chain an ordered run of unpinned coordinates."""
    gen = torch.Generator().manual_seed(seed)
    values = torch.randint(0, q, (rows, n), generator=gen)
    orders = torch.rand(rows, n, generator=gen).argsort(1)
    cut = torch.randint(0, n - length + 1, (rows,), generator=gen)
    ranks = orders.argsort(1)
    mask = ranks < cut.unsqueeze(1)
    chain = orders.gather(1, cut.unsqueeze(1) + torch.arange(length))
    return values, mask, chain


def rows_of_chain(oracle, values, mask, chain):
    """The chain's rows one targeted row at a time: [C, L, q]."""
    out, mask = [], mask.clone()
    for j in range(chain.shape[1]):
        out.append(oracle.log_marginals_at(values, mask, chain[:, j : j + 1])[:, 0])
        mask.scatter_(1, chain[:, j : j + 1], True)
    return torch.stack(out, 1)


@pytest.mark.parametrize("chains", [True, False])
def test_nade_queries_agree(chains):
    net = RandomNADE(5, 3, hidden=8, scale=2.0, seed=1, chains=chains)
    values, mask = random_queries(5, 3)
    full = net.log_marginals(values, mask)
    at = net.log_marginals_at(values, mask, torch.arange(5).expand(12, 5))
    torch.testing.assert_close(at, full)
    # values at unpinned positions are ignored
    noise = torch.where(mask, values, torch.randint_like(values, 3))
    torch.testing.assert_close(net.log_marginals(noise, mask), full)
    values, mask, chain = chain_queries(5, 3)
    if not chains:
        assert not callable(getattr(net, "log_marginals_chain", None))
        return
    expected = rows_of_chain(net, values, mask, chain)
    torch.testing.assert_close(net.log_marginals_chain(values, mask, chain), expected)
    then = torch.tensor([[0, 1, 2, 3, 4]]).expand(12, 5)
    out, after = net.log_marginals_chain_then(values, mask, chain, then)
    torch.testing.assert_close(out, expected)
    pinned = mask.clone().scatter_(1, chain, True)
    free = net.log_marginals_at(values, pinned, then)
    point = torch.full_like(free, -torch.inf).scatter_(2, values.unsqueeze(-1), 0.0)
    torch.testing.assert_close(after, torch.where(pinned.unsqueeze(-1), point, free))


def test_mixture_and_chain_queries_are_exact_conditionals():
    mix = ProductMixture(5, 3, components=4, sharpness=1.5, seed=2)
    values, mask = random_queries(5, 3)
    expected = brute_conditionals(mix.log_joint, values, mask, 3)
    free = ~mask  # the engine ignores the rows of pinned coordinates
    torch.testing.assert_close(mix.log_marginals(values, mask)[free], expected[free])
    at = mix.log_marginals_at(values, mask, torch.tensor([4, 0]).expand(12, 2))
    torch.testing.assert_close(at[free[:, [4, 0]]], expected[:, [4, 0]][free[:, [4, 0]]])
    values, mask, chain = chain_queries(5, 3)
    torch.testing.assert_close(
        mix.log_marginals_chain(values, mask, chain), rows_of_chain(mix, values, mask, chain)
    )
    hand = HandChain(6, stay=0.8)
    values, mask = random_queries(6, 2)
    expected = brute_conditionals(hand.log_joint, values, mask, 2)
    at = hand.log_marginals_at(values, mask, torch.arange(6).expand(12, 6))
    torch.testing.assert_close(at[~mask], expected[~mask])
    assert not callable(getattr(hand, "log_marginals_chain", None))


def nade_law(net, order):
    states = joint_states(net.num_coords, net.num_values)
    return states, chain_rule_log_prob(net, states, order).exp().numpy()


def test_nade_is_imperfect():
    """The test network's sequential law depends on the order: not one joint's marginals."""
    net = RandomNADE(5, 3, hidden=8, scale=2.0, seed=1)
    _, law = nade_law(net, ORDER)
    _, other = nade_law(net, list(range(5)))
    assert 0.5 * np.abs(law - other).sum() > 0.05
    assert abs(law.sum() - 1) < 1e-5


CASES = {
    "autospec": ("autospec", {}, True),
    "autospec_whole_block": ("autospec", {"max_block": 5}, True),
    "autospec_rows_only": ("autospec", {}, False),
    "agr24": ("agr24", {}, True),
    "speculative": ("speculative", {"window": 3}, True),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_exact_for_imperfect_network_in_fixed_order(case):
    """Chi-square: draws in a fixed order against the network's own sequential law."""
    method, knobs, chains = CASES[case]
    net = RandomNADE(5, 3, hidden=8, scale=2.0, seed=1, chains=chains)
    states, law = nade_law(net, ORDER)
    result = sample_any_order(net, 4000, method=method, seed=21, order=ORDER, schedule=knobs)
    counts = np.bincount(state_index(result.samples, 3), minlength=states.shape[0])
    p = chisquare_pvalue(counts, law)
    assert p > P_THRESHOLD, f"chi-square p-value {p:.3g}"
    # log_prob is the chain rule in the sampling order
    expected = torch.from_numpy(np.log(law))[torch.from_numpy(state_index(result.samples, 3))]
    torch.testing.assert_close(result.log_prob, expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("case", sorted(CASES))
def test_exact_for_imperfect_network_with_hard_zeros(case):
    """Chi-square for a network with a bolted-on constraint: drafts hit values of probability
    zero, and the rows after such a token are conditioned on an impossible prefix."""
    method, knobs, _ = CASES[case]
    net = NoAdjacentZeros(RandomNADE(5, 3, hidden=8, scale=2.0, seed=1, chains=False))
    states = joint_states(5, 3)
    law = chain_rule_log_prob(net, states, ORDER).exp().numpy()
    assert (law == 0).sum() > 50  # the constraint rules out many states
    result = sample_any_order(net, 6000, method=method, seed=3, order=ORDER, schedule=knobs)
    counts = np.bincount(state_index(result.samples, 3), minlength=states.shape[0])
    p = chisquare_pvalue(counts, law)  # also asserts no impossible state was drawn
    assert p > P_THRESHOLD, f"chi-square p-value {p:.3g}"


@pytest.mark.parametrize("method", ["autospec", "agr24"])
def test_exact_for_consistent_user_oracles_in_random_orders(method):
    mix = ProductMixture(5, 3, components=4, sharpness=1.5, seed=2)
    result = sample_any_order(mix, 4000, method=method, seed=5)
    log_probs = mix.log_joint(joint_states(5, 3)).reshape([3] * 5)
    assert_samples_match(result.samples, log_probs, 3)
    hand = HandChain(7, stay=0.85)
    result = sample_any_order(hand, 4000, method=method, seed=6)
    log_probs = hand.log_joint(joint_states(7, 2)).reshape([2] * 7)
    assert_samples_match(result.samples, log_probs, 2)


def test_mixture_sample_is_exact():
    mix = ProductMixture(4, 3, components=3, sharpness=1.5, seed=4)
    log_probs = mix.log_joint(joint_states(4, 3)).reshape([3] * 4)
    assert_samples_match(mix.sample(4000, seed=0), log_probs, 3)


class Scribbler:
    """An oracle that writes into every tensor it is given once it has answered (a user's
    ``values[~mask] = 0`` done in place, a buffer reused as scratch): the engine's state must
    never be one of its inputs."""

    def __init__(self, inner):
        self.inner = inner
        self.num_coords, self.num_values = inner.num_coords, inner.num_values

    def __getattr__(self, name):
        method = getattr(self.inner, name)
        if not name.startswith("log_marginals"):
            return method

        def scribbling(*args, **kwargs):
            out = method(*args, **kwargs)
            for arg in args:
                if isinstance(arg, torch.Tensor):
                    arg.fill_(True if arg.dtype == torch.bool else 1)
            return out

        return scribbling


@pytest.mark.parametrize("method", ["autospec", "agr24", "speculative", "sequential"])
@pytest.mark.parametrize("make", [lambda: RandomNADE(12, 3, seed=2), lambda: HandChain(12)])
def test_an_oracle_writing_into_its_inputs_changes_nothing(make, method):
    """Same draws with and without the scribbling, on both engines, with chain queries (the
    NADE's) and single rows (the hand-written chain's), and for the block rule."""
    for engine in ("fast", "reference"):
        for knobs in ({}, {"token_below": 0}) if method == "autospec" else ({},):
            clean = sample_any_order(
                make(), 10, seed=4, method=method, engine=engine, schedule=knobs
            )
            dirty = sample_any_order(
                Scribbler(make()), 10, seed=4, method=method, engine=engine, schedule=knobs
            )
            assert torch.equal(clean.samples, dirty.samples)
            assert torch.equal(clean.log_prob, dirty.log_prob)


class OneOutputBuffer:
    """An oracle that answers in one buffer of its own, overwritten by its next call: it
    returns a view of it (nothing in the protocol asks for a fresh output)."""

    def __init__(self, inner):
        self.inner, self.buffer = inner, None
        self.num_coords, self.num_values = inner.num_coords, inner.num_values

    def log_marginals_at(self, values, mask, targets):
        out = self.inner.log_marginals_at(values, mask, targets)
        rows, width, _ = out.shape
        if self.buffer is None or self.buffer.shape[0] < rows or self.buffer.shape[1] < width:
            self.buffer = torch.empty(2 * rows, max(8, width), out.shape[-1], dtype=out.dtype)
        self.buffer[:rows, :width].copy_(out)
        return self.buffer[:rows, :width]


@pytest.mark.parametrize("method", ["sequential", "autospec", "agr24", "speculative"])
def test_an_oracle_answering_in_one_reused_buffer_gets_the_same_draws(method):
    """An outside test: the compiled lock step asks every call of a step before it reads any
    row, and read the views this oracle returned after its next call had overwritten them
    (5,000 draws of a chain at the default call size: neighbours agreed 0.83, not 0.90)."""
    chain = HandChain(12)
    small = {"max_elements": 4 * 12}  # a few rows per call: several calls per step
    fresh = sample_any_order(chain, 40, seed=5, method=method, schedule=small)
    reused = sample_any_order(OneOutputBuffer(chain), 40, seed=5, method=method, schedule=small)
    assert torch.equal(fresh.samples, reused.samples)
    assert torch.equal(fresh.log_prob, reused.log_prob)


def test_exact_with_the_rows_lean_window_of_an_oracle_without_chain_queries():
    """The default window a CPU takes for an oracle without chain queries and 4 to 15 draws in
    flight (``max(8, sqrt(n) / 4)``, here 8 against the rounds-first 20): windows of five
    consecutive coordinates of a stationary chain, anywhere along it, follow the chain's law."""
    n, stay = 100, 0.85
    hand = HandChain(n, stay=stay)
    result = sample_any_order(hand, 3000, seed=11, schedule=Schedule(max_concurrent_draws=8))
    assert result.schedule["max_block"] == 8
    states = joint_states(5, 2)
    same = (states[:, 1:] == states[:, :-1]).double()
    log_probs = math.log(0.5) + (same * math.log(stay) + (1 - same) * math.log(1 - stay)).sum(1)
    for start in (0, 47, n - 5):
        window = result.samples[:, start : start + 5]
        assert_samples_match(window, log_probs.reshape([2] * 5), 2)
