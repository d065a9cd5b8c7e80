"""Tier 2: chi-square of AutoSpec's draws against the brute-force posterior.

Fixed seeds, scipy p-values, failure rate 2e-5 per test, >= 30 expected counts per bin (states
with fewer are pooled into one bin; a test raises rather than passes when bins are too thin).
"""

import pyro
import pyro.distributions as dist
import pytest
import scipy.stats
import torch

from pyro_autospec.infer import AutoSpec
from pyro_autospec.model import enumerate_posterior

ALPHA = 2e-5
MIN_EXPECTED = 30.0


def ising_model(y, rows=2, cols=3, coupling=0.6, sigma=0.8):
    """A noisy Ising image: one Bernoulli site per pixel, pairwise factors, Gaussian pixels."""
    spins = {}
    for i in range(rows):
        for j in range(cols):
            z = pyro.sample(f"z_{i}_{j}", dist.Bernoulli(0.5))
            spins[i, j] = 2.0 * z - 1.0
            pyro.sample(f"y_{i}_{j}", dist.Normal(spins[i, j], sigma), obs=y[i, j])
            if i > 0:
                pyro.factor(f"h_{i}_{j}", coupling * spins[i, j] * spins[i - 1, j])
            if j > 0:
                pyro.factor(f"v_{i}_{j}", coupling * spins[i, j] * spins[i, j - 1])


def hmm_model(ys):
    trans = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.3, 0.3, 0.4]])
    locs = torch.tensor([-1.0, 0.5, 2.0])
    z = 0
    for t in pyro.markov(range(len(ys))):
        z = pyro.sample(f"z_{t}", dist.Categorical(trans[z]))
        pyro.sample(f"y_{t}", dist.Normal(locs[z], 1.0), obs=ys[t])


def mixed_model(y):
    a = pyro.sample("a", dist.Bernoulli(0.3))
    c = pyro.sample("c", dist.Categorical(torch.tensor([0.1, 0.2, 0.3, 0.4])))
    b = pyro.sample("b", dist.Binomial(2, 0.5))
    pyro.sample("y", dist.Normal(a + c - b, 1.0), obs=y)


def plated_model(y):
    g = pyro.sample("g", dist.Categorical(torch.tensor([0.4, 0.6])))
    probs = torch.tensor([0.2, 0.7])[g]
    with pyro.plate("data", len(y)):
        local = pyro.sample("local", dist.Bernoulli(probs))
        pyro.sample("y", dist.Normal(local + g, 0.8), obs=y)


def onehot_model(y):
    w = pyro.sample("w", dist.Bernoulli(0.6))
    with pyro.plate("p", 2):
        z = pyro.sample("z", dist.OneHotCategorical(torch.tensor([0.2, 0.5, 0.3])))
        mean = (z * torch.tensor([-1.0, 0.0, 1.5])).sum(-1) + w
        pyro.sample("y", dist.Normal(mean, 0.7), obs=y)


CASES = {
    "ising_2x3": (ising_model, (torch.tensor([[0.9, -0.2, 1.1], [0.3, -1.0, 0.5]]),), 3000),
    "hmm_markov": (hmm_model, (torch.tensor([-0.5, 0.3, 2.2, 1.0]),), 3000),
    "mixed_supports": (mixed_model, (torch.tensor(1.3),), 2000),
    "plated_global_local": (plated_model, (torch.tensor([0.1, 1.4, 1.9]),), 2000),
    "onehot": (onehot_model, (torch.tensor([1.2, -0.4]),), 2000),
}


def chi_square_p_value(draws, states, log_prob):
    """p-value of the draws' state counts against the exact posterior, with pooled bins."""
    num = draws.shape[0]
    match = (draws[:, None, :] == states[None, :, :]).all(-1)
    assert bool(match.any(1).all()), "a draw is not a state of the model"
    counts = match.sum(0).double()
    expected = log_prob.exp() * num
    big = expected >= MIN_EXPECTED
    observed = list(counts[big])
    wanted = list(expected[big])
    if (~big).any():
        rest = expected[~big].sum()
        if rest >= MIN_EXPECTED:
            observed.append(counts[~big].sum())
            wanted.append(rest)
        elif observed:  # pool the thin tail into the smallest bin
            k = min(range(len(wanted)), key=lambda i: wanted[i])
            observed[k] = observed[k] + counts[~big].sum()
            wanted[k] = wanted[k] + rest
    if len(observed) < 2:
        raise ValueError("too few bins with >= 30 expected counts: draw more samples")
    observed = torch.stack(observed).numpy()
    wanted = torch.stack(wanted).numpy()
    wanted = wanted * observed.sum() / wanted.sum()
    return scipy.stats.chisquare(observed, wanted).pvalue


@pytest.mark.parametrize("sampler", ["auto", "engine"])
@pytest.mark.parametrize("name", list(CASES))
def test_autospec_draws_are_exact(name, sampler):
    model, args, num_samples = CASES[name]
    autospec = AutoSpec(
        model, num_samples=num_samples, seed=0, disable_progbar=True, sampler=sampler
    )
    autospec.run(*args)
    layout = autospec.layout
    states, log_prob = enumerate_posterior(model, args, layout=layout)
    draws = layout.to_coords(autospec.get_samples())
    p_value = chi_square_p_value(draws, states, log_prob)
    assert p_value > ALPHA, f"{name}: p = {p_value:.2e}"
    # the engine's chain-rule log prob is the exact log posterior of each draw
    lp = autospec.get_extra_fields()["lp"]
    oracle_lp = autospec.get_extra_fields()["oracle_log_prob"]
    log_evidence = (lp - oracle_lp).mean()
    torch.testing.assert_close(lp - oracle_lp, log_evidence.expand_as(lp), atol=1e-4, rtol=0)


def test_chi_square_detects_a_wrong_sampler():
    """The test has power: draws from the prior fail against the posterior."""
    model, args, num_samples = CASES["ising_2x3"]
    states, log_prob = enumerate_posterior(model, args)
    generator = torch.Generator().manual_seed(0)
    draws = states[torch.randint(len(states), (num_samples,), generator=generator)]
    assert chi_square_p_value(draws, states, log_prob) < ALPHA
