"""Slow, obviously correct references for the oracle tests: enumeration of [q]^n."""

from __future__ import annotations

import itertools
import math

import torch

from pyro_autospec.oracles.tabular import TabularOracle


def enumerate_joint(log_prob, n: int, q: int) -> torch.Tensor:
    """DoubleTensor [q]*n of ``log_prob(x)`` (a function of a tuple) over every state."""
    table = torch.empty([q] * n, dtype=torch.float64)
    for x in itertools.product(range(q), repeat=n):
        table[x] = float(log_prob(x))
    return table


def naive_conditionals(log_table: torch.Tensor, values, mask) -> torch.Tensor:
    """Conditional marginals [n, q] of one row by a Python loop over the states (probabilities)."""
    n, q = log_table.dim(), log_table.shape[0]
    sums = torch.zeros(n, q, dtype=torch.float64)
    for x in itertools.product(range(q), repeat=n):
        if any(bool(mask[j]) and x[j] != int(values[j]) for j in range(n)):
            continue
        p = math.exp(float(log_table[x]))
        for i in range(n):
            sums[i, x[i]] += p
    return sums / sums[0].sum()


class Wrapper:
    """An oracle's sizes and ``log_marginals``: the base of test wrappers that offer some of
    its other methods (or answer them another way)."""

    def __init__(self, oracle):
        self.oracle = oracle
        self.num_coords, self.num_values = oracle.num_coords, oracle.num_values

    def log_marginals(self, values, mask):
        return self.oracle.log_marginals(values, mask)


def random_queries(n: int, q: int, batch: int, seed: int, pin_probability: float = 0.4):
    """Random (values, mask, targets) with every mask density; targets have 3 columns."""
    gen = torch.Generator().manual_seed(seed)
    values = torch.randint(0, q, (batch, n), generator=gen)
    density = torch.rand(batch, 1, generator=gen) * 2 * pin_probability
    mask = torch.rand(batch, n, generator=gen) < density
    mask[0] = False  # nothing pinned
    if batch > 1:
        mask[1] = True  # everything pinned
    # junk at unpinned positions must be ignored
    values = torch.where(mask, values, torch.randint(-5, 5 + q, (batch, n), generator=gen))
    targets = torch.randint(0, n, (batch, 3), generator=gen)
    return values, mask, targets


def assert_same_marginals(
    oracle, reference, values, mask, targets, atol: float = 1e-9, exact_zeros: bool = True
) -> int:
    """Compare ``log_marginals`` and ``log_marginals_at`` on the rows that are possible under
    ``reference``; returns how many rows were compared. With ``exact_zeros`` the zero
    probabilities must also agree exactly (off for linear-algebra oracles)."""
    expected = reference.log_marginals(values, mask)
    possible = ~torch.isnan(expected).any(-1).any(-1)
    got = oracle.log_marginals(values, mask)
    assert got.dtype == torch.float64
    assert got.shape == expected.shape
    _close(got[possible], expected[possible], atol, exact_zeros)
    expected_at = reference.log_marginals_at(values, mask, targets)
    got_at = oracle.log_marginals_at(values, mask, targets)
    assert got_at.dtype == torch.float64
    assert got_at.shape == expected_at.shape
    _close(got_at[possible], expected_at[possible], atol, exact_zeros)
    return int(possible.sum())


def _close(got: torch.Tensor, expected: torch.Tensor, atol: float, exact_zeros: bool) -> None:
    assert not torch.isnan(got).any(), "NaN on a row conditioned on a possible assignment"
    torch.testing.assert_close(got.exp(), expected.exp(), atol=atol, rtol=0)
    if not exact_zeros:
        return
    # zero stays zero, and log probabilities agree where the probability is not tiny
    assert torch.equal(got == float("-inf"), expected == float("-inf"))
    big = expected > -20
    torch.testing.assert_close(got[big], expected[big], atol=atol * 1e3, rtol=1e-9)


def tabular_reference(log_prob, n: int, q: int) -> TabularOracle:
    """The TabularOracle of the enumerated joint."""
    return TabularOracle(logits=enumerate_joint(log_prob, n, q))


# -- chain queries -------------------------------------------------------------------------------
def random_chains(
    n: int,
    q: int,
    num_chains: int,
    length: int,
    seed: int,
    pin_probability: float = 0.4,
    values: torch.Tensor | None = None,
):
    """Random chain queries ``(values, mask, chain)`` as the engine makes them.

    Chains have random lengths in ``1..length`` (the first has length 1 and the second the
    full length), are made of distinct coordinates outside the prefix, and are padded by
    repeating their last coordinate. Values are valid at pinned and chain coordinates (random,
    or taken from ``values`` [C, n], e.g. exact samples) and garbage elsewhere. Masks have every
    density; a prefix too full for a chain lends the chain pinned coordinates (then a point
    mass), which the protocol allows.
    """
    gen = torch.Generator().manual_seed(seed)
    if values is None:
        values = torch.randint(0, q, (num_chains, n), generator=gen)
    density = torch.rand(num_chains, 1, generator=gen) * 2 * pin_probability
    mask = torch.rand(num_chains, n, generator=gen) < density
    mask[0] = False
    lengths = torch.randint(1, length + 1, (num_chains,), generator=gen)
    lengths[0] = 1
    if num_chains > 1:
        lengths[1] = length
    # distinct coordinates, unpinned ones first, in random order
    keys = torch.rand(num_chains, n, generator=gen) + mask.double()
    order = keys.argsort(dim=1)[:, :length]
    if length > n:
        order = torch.cat([order, order[:, -1:].expand(-1, length - n)], 1)
    slots = torch.arange(length)
    last = order.gather(1, (lengths.clamp(max=n) - 1).unsqueeze(1))
    chain = torch.where(slots < lengths.unsqueeze(1), order, last)
    on_chain = torch.zeros_like(mask).scatter_(1, chain, True)
    junk = torch.randint(-5, 5 + q, (num_chains, n), generator=gen)
    values = torch.where(mask | on_chain, values, junk)
    return values, mask, chain


def chain_by_rows(oracle, values, mask, chain) -> torch.Tensor:
    """The answer to a chain query by ``L`` calls of ``log_marginals_at`` (the definition)."""
    out = []
    grown = mask.clone()
    for j in range(chain.shape[1]):
        out.append(oracle.log_marginals_at(values, grown, chain[:, j : j + 1])[:, 0])
        grown = grown.scatter(1, chain[:, j : j + 1], True)
    return torch.stack(out, 1)


def assert_chain_matches_rows(
    oracle, values, mask, chain, atol: float = 1e-10, reference=None, exact_zeros: bool = True
) -> int:
    """Native chain answers equal the row-by-row ones on rows conditioned on a possible
    assignment (``reference``'s rows, default the oracle's own, are not NaN); returns how
    many rows were compared. Rows conditioned on impossible assignments may be NaN. With
    ``exact_zeros`` the zero probabilities must agree exactly (off for linear algebra)."""
    got = oracle.log_marginals_chain(values, mask, chain)
    expected = chain_by_rows(oracle, values, mask, chain)
    assert got.dtype == torch.float64
    assert got.shape == expected.shape == (*chain.shape, oracle.num_values)
    if reference is not None:
        possible = ~torch.isnan(chain_by_rows(reference, values, mask, chain)).any(-1)
    else:
        possible = ~torch.isnan(expected).any(-1)
    assert not torch.isnan(got[possible]).any(), "NaN on a row conditioned on a possible prefix"
    torch.testing.assert_close(got[possible].exp(), expected[possible].exp(), atol=atol, rtol=0)
    if not exact_zeros:
        return int(possible.sum())
    # zero probabilities agree exactly, log probabilities where they are not tiny
    assert torch.equal(got[possible] == float("-inf"), expected[possible] == float("-inf"))
    big = expected[possible] > -20
    torch.testing.assert_close(got[possible][big], expected[possible][big], atol=atol, rtol=0)
    return int(possible.sum())


def exact_samples(oracle, num_samples: int, seed: int) -> torch.Tensor:
    """LongTensor[N, n] of exact draws by the chain rule in index order (``n`` calls of
    ``log_marginals_at``), for queries whose pins must all be possible."""
    gen = torch.Generator().manual_seed(seed)
    n = oracle.num_coords
    values = torch.zeros(num_samples, n, dtype=torch.long)
    mask = torch.zeros(num_samples, n, dtype=torch.bool)
    for i in range(n):
        target = torch.full((num_samples, 1), i)
        probs = oracle.log_marginals_at(values, mask, target)[:, 0].exp()
        values[:, i] = torch.multinomial(probs, 1, generator=gen)[:, 0]
        mask[:, i] = True
    return values
