"""A ``pyro.markov(..., keep=True)`` loop entered again (a grid, as in Pyro's
``test_enum_recycling_grid``): ``pyro.markov`` gives two sites one enumeration dim while a later
site still reads both, so Pyro's own enumeration is wrong there; AutoSpec gives every site its
own dim and samples the grid exactly (chi-square against a hand-written brute force). The same
holds for a grid with a fresh inner ``pyro.markov`` loop per row (nested markov contexts), where
``pyro.markov`` hides each row from the next one that reads it: found before sampling, sampled
exactly where every site fits a dim of its own, refused up front where not."""

import itertools
import math
from collections import defaultdict

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.ops.indexing import Vindex

from pyro_autospec.infer import AutoSpec
from pyro_autospec.model.enum import EnumOracle
from pyro_autospec.model.errors import IntractableEnumerationError
from tests.catalogue.brute_force import assert_draws_follow, flatten_draws
from tests.stats import P_THRESHOLD, chisquare_pvalue

SIZE = 4
# P(x[i, j] = 1 | up, left): strong coupling, so a wrong dim is far from the truth
PROBS = torch.tensor([[0.15, 0.6], [0.7, 0.9]], dtype=torch.float64)
Y = torch.tensor(
    [[0.9, -0.2, 1.4, 0.1], [-0.6, 1.1, 0.3, 1.6], [1.2, 0.2, -0.4, 0.8], [0.5, 1.3, 1.0, -0.1]],
    dtype=torch.float64,
)


def grid(size=SIZE):
    x = defaultdict(lambda: torch.tensor(0))
    columns = pyro.markov(range(size), keep=True)  # one loop object, entered once per row
    for i in pyro.markov(range(size)):
        for j in columns:
            p = Vindex(PROBS)[x[i - 1, j], x[i, j - 1]]
            x[i, j] = pyro.sample(f"x_{i}_{j}", dist.Bernoulli(p)).long()
            pyro.sample(f"y_{i}_{j}", dist.Normal(x[i, j].double(), 1.0), obs=Y[i % SIZE, j % SIZE])


def brute_force(size=SIZE):
    """Every assignment of the grid, its log joint written by hand (vectorised over states)."""
    states = np.array(list(itertools.product([0, 1], repeat=size * size)))
    x = states.reshape(-1, size, size)
    up = np.concatenate([np.zeros_like(x[:, :1]), x[:, :-1]], axis=1)
    left = np.concatenate([np.zeros_like(x[:, :, :1]), x[:, :, :-1]], axis=2)
    p = PROBS.numpy()[up, left]
    y = Y.numpy()[np.arange(size)[:, None] % SIZE, np.arange(size)[None, :] % SIZE]
    logs = np.where(x == 1, np.log(p), np.log1p(-p)) - 0.5 * (y - x) ** 2
    logs = logs.sum((1, 2)) - 0.5 * size * size * math.log(2 * math.pi)
    top = logs.max()
    probs = np.exp(logs - top)
    evidence = top + math.log(probs.sum())
    return [tuple(s) for s in states.tolist()], probs / probs.sum(), evidence


@pytest.mark.parametrize("size", [3, 4])
def test_oracle_marginals_and_evidence_equal_brute_force(size):
    states, probs, evidence = brute_force(size)
    oracle = EnumOracle(lambda: grid(size))
    n = size * size
    assert abs(float(oracle.log_normalizer()) - evidence) < 1e-9
    zeros = torch.zeros(2, n, dtype=torch.long)
    marginals = oracle.log_marginals(zeros, zeros.bool())[0].exp()[:, 1].numpy()
    expected = (np.array(states) * probs[:, None]).sum(0)
    np.testing.assert_allclose(marginals, expected, atol=1e-10)


def test_grid_draws_follow_the_posterior():
    names = [f"x_{i}_{j}" for i in range(SIZE) for j in range(SIZE)]
    autospec = AutoSpec(grid, num_samples=3000, seed=3, disable_progbar=True).run()
    draws = flatten_draws(autospec.get_samples(), names)
    states, probs, _ = brute_force()
    assert_draws_follow(draws, states, probs)  # the whole joint, thin states pooled
    # the 2x2 block where pyro.markov gave x_2_1 and x_1_2 one dim, with every state binned
    block = [names.index(n) for n in ("x_1_1", "x_1_2", "x_2_1", "x_2_2")]
    index = np.array(states)[:, block] @ np.array([8, 4, 2, 1])
    exact = np.bincount(index, weights=probs, minlength=16)
    counts = np.bincount(draws[:, block] @ np.array([8, 4, 2, 1]), minlength=16)
    assert chisquare_pvalue(counts, exact) > P_THRESHOLD


def test_grid_too_large_for_own_dims_is_refused_with_the_cause():
    with pytest.raises(IntractableEnumerationError, match=r"keep=True.*64 dims"):
        EnumOracle(lambda: grid(9))


def test_a_long_chain_keeps_recycling_dims():
    """A plain pyro.markov chain is not a conflict: its sites leave the scope before their
    dims are reused, so a chain longer than torch's 64 dims still enumerates."""
    import pyro_autospec.model.enum as enum_module

    trans = torch.tensor([[0.9, 0.1], [0.2, 0.8]])

    def hmm(ys):
        z = 0
        for t in pyro.markov(range(len(ys))):
            z = pyro.sample(f"z_{t}", dist.Categorical(trans[z]))
            pyro.sample(f"y_{t}", dist.Normal(2.0 * z - 1.0, 1.0), obs=ys[t])

    ys = torch.linspace(-1, 1, 100)
    seen = []
    original = enum_module._markov_conflicts

    def spy(trace):
        seen.append(original(trace))
        return seen[-1]

    enum_module._markov_conflicts = spy
    try:
        fit = AutoSpec(hmm, num_samples=5, seed=0, disable_progbar=True, sampler="engine")
        fit.run(ys)
    finally:
        enum_module._markov_conflicts = original
    assert seen and seen[0] == []
    assert fit.get_samples()["z_99"].shape == (5,)


# An Ising grid written as Pyro's test-suite grids are, but with a FRESH inner
# pyro.markov(keep=True) loop per row (nested markov contexts): Pyro's enumeration hides row i
# from row i + 1 (a site is visible only through all of its markov contexts) and gives row i's
# dims to row i + 1, while the vertical couplings read both. Before, the draws failed the
# self-check after sampling; now the reads are found up front.
COUPLING = 0.9
Y_ISING = torch.tensor([[0.4, -0.8, 1.1], [1.3, 0.2, -0.5], [-1.2, 0.9, 0.6]], dtype=torch.float64)


def ising_rows(size=3):
    x = {}
    for i in pyro.markov(range(size)):
        for j in pyro.markov(range(size), keep=True):  # a fresh inner loop per row
            x[i, j] = pyro.sample(f"x_{i}_{j}", dist.Bernoulli(0.5))
            s = 2.0 * x[i, j] - 1.0
            if j > 0:
                pyro.factor(f"h_{i}_{j}", COUPLING * s * (2.0 * x[i, j - 1] - 1.0))
            if i > 0:
                pyro.factor(f"v_{i}_{j}", COUPLING * s * (2.0 * x[i - 1, j] - 1.0))
            y = Y_ISING[i % 3, j % 3]
            pyro.sample(f"y_{i}_{j}", dist.Normal(s.double(), 1.0), obs=y)


def ising_brute_force(size=3):
    """The grid's law written by hand (no Pyro): every state's log joint."""
    states = np.array(list(itertools.product([0, 1], repeat=size * size)))
    s = 2.0 * states.reshape(-1, size, size) - 1.0
    y = Y_ISING.numpy()[np.arange(size)[:, None] % 3, np.arange(size)[None, :] % 3]
    horizontal = (s[:, :, 1:] * s[:, :, :-1]).sum((1, 2))
    vertical = (s[:, 1:] * s[:, :-1]).sum((1, 2))
    logs = COUPLING * (horizontal + vertical) - 0.5 * ((y - s) ** 2).sum((1, 2))
    probs = np.exp(logs - logs.max())
    return [tuple(t) for t in states.tolist()], probs / probs.sum()


def test_a_fresh_inner_markov_per_row_is_sampled_exactly():
    """Each row's reads of the previous row are found before sampling (they failed the
    self-check after it), and every site gets a dim of its own: the draws are exact."""
    names = [f"x_{i}_{j}" for i in range(3) for j in range(3)]
    states, probs = ising_brute_force()
    for sampler in ("auto", "engine"):
        fit = AutoSpec(ising_rows, num_samples=3000, seed=5, disable_progbar=True, sampler=sampler)
        assert_draws_follow(flatten_draws(fit.run().get_samples(), names), states, probs)
    oracle = EnumOracle(ising_rows)
    zeros = torch.zeros(1, 9, dtype=torch.long)
    marginals = oracle.log_marginals(zeros, zeros.bool())[0].exp()[:, 1].numpy()
    np.testing.assert_allclose(marginals, (np.array(states) * probs[:, None]).sum(0), atol=1e-10)
    assert oracle._markov is False  # every site its own dim, as for a re-entered keep=True loop


def test_a_fresh_inner_markov_per_row_too_large_is_refused_before_sampling():
    """Nine rows of nine: too many sites for a dim each. Refused when the oracle is compiled,
    naming the site that reads a hidden one, the hidden site and the cause."""
    with pytest.raises(
        IntractableEnumerationError,
        match=r"Site 'v_1_0' reads site 'x_0_0', which pyro.markov hides from it.*fresh inner "
        r"pyro.markov per outer step.*gave its tensor dim to 'x_1_0'.*64 dims.*AnyOrderGuide",
    ):
        EnumOracle(lambda: ising_rows(9))
    fit = AutoSpec(lambda: ising_rows(9), num_samples=10, disable_progbar=True)
    with pytest.raises(IntractableEnumerationError, match="pyro.markov hides"):
        fit.run()
    assert fit.results == []  # nothing was sampled


def test_nested_markov_chains_keep_pyros_dims():
    """Nested markov loops whose sites read only their own row's (Pyro's
    test_enum_recycling_nested) are no conflict: Pyro's recycled dims are kept."""
    trans = torch.tensor([[0.8, 0.2], [0.3, 0.7]])

    def nested():
        y = 0
        for i in pyro.markov(range(4)):
            y = pyro.sample(f"y_{i}", dist.Categorical(trans[y]))
            z = y
            for j in pyro.markov(range(4)):
                z = pyro.sample(f"z_{i}_{j}", dist.Categorical(trans[z]))

    assert EnumOracle(nested)._markov is True


@pytest.mark.parametrize("model", [ising_rows, grid], ids=["fresh_rows", "keep_true_reentered"])
def test_map_of_a_grid_is_the_brute_force_mode(model):
    """map() decoded the fresh-row grid with Pyro's recycled dims, silently wrong; it now
    decodes with a dim per site wherever the compiled oracle needed one."""
    states, probs = (ising_brute_force if model is ising_rows else brute_force)()[:2]
    size = 3 if model is ising_rows else SIZE
    best = AutoSpec(model, num_samples=1).map()
    decoded = tuple(int(best[f"x_{i}_{j}"]) for i in range(size) for j in range(size))
    assert decoded == states[int(np.argmax(probs))]
