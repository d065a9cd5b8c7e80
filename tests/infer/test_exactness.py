"""Tier 2: chi-square of AutoSpec's draws against the brute-force posterior.

Fixed seeds, scipy p-values, failure rate 2e-5 per test, >= 30 expected counts per bin (states
with fewer are pooled into one bin; a test raises rather than passes when bins are too thin).
"""

import pytest
import scipy.stats
import torch

from pyro_autospec.infer import AutoSpec
from pyro_autospec.model import enumerate_posterior
from tests.catalogue.models import CASES, unit_plate_model

ALPHA = 2e-5
MIN_EXPECTED = 30.0


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


def test_a_site_in_a_plate_of_size_one_that_a_site_outside_reads():
    """The engine's oracle reduces that site's evidence over the plate before summing it
    out; it once read the 0/1 evidence as log factors there (pins ignored, log Z off by 1)."""
    args = (torch.tensor([2.5]),)
    autospec = AutoSpec(
        unit_plate_model, num_samples=3000, seed=0, disable_progbar=True, sampler="engine"
    )
    autospec.run(*args)
    states, log_prob = enumerate_posterior(unit_plate_model, args, layout=autospec.layout)
    draws = autospec.layout.to_coords(autospec.get_samples())
    assert chi_square_p_value(draws, states, log_prob) > ALPHA


def test_chi_square_detects_a_wrong_sampler():
    """The test has power: draws from the prior fail against the posterior."""
    model, args, num_samples = CASES["ising_2x3"]
    states, log_prob = enumerate_posterior(model, args)
    generator = torch.Generator().manual_seed(0)
    draws = states[torch.randint(len(states), (num_samples,), generator=generator)]
    assert chi_square_p_value(draws, states, log_prob) < ALPHA
