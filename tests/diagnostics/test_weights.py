"""One call for the weights' diagnostics: k-hat, ESS, IMH acceptance, and the warning's fix."""

import math
import warnings

import numpy as np
import pytest
import torch

from pyro_autospec.diagnostics.weights import (
    WeightDiagnostics,
    imh_acceptance_estimate,
    pareto_khat,
    psis,
    weight_diagnostics,
    weights_ess,
)
from pyro_autospec.infer.correction import independent_metropolis_hastings


@pytest.mark.parametrize("sd", [0.3, 1.0, 2.0])
def test_acceptance_estimate_matches_a_long_chain(sd):
    """Proposals with log-normal weights: the estimate from the weights alone against the
    mean acceptance probability of an IMH chain over a second, independent set of proposals
    (a chain of 200,000 steps: its mean has a standard error far below the tolerance)."""
    rng = np.random.default_rng(0)
    estimate = imh_acceptance_estimate(rng.normal(0.0, sd, 20000))
    _, _, accept_prob = independent_metropolis_hastings(
        torch.as_tensor(rng.normal(0.0, sd, 200000)), seed=1
    )
    chain = float(accept_prob[1000:].mean())
    assert abs(estimate - chain) < 0.03, (estimate, chain)


def test_acceptance_estimate_edge_cases():
    assert imh_acceptance_estimate(np.zeros(7)) == pytest.approx(1.0)
    # Zero weights: never accepted, and they take their share of the proposals.
    lw = np.array([0.0, 0.0, -np.inf, -np.inf])
    assert imh_acceptance_estimate(lw) == pytest.approx(0.5)
    assert imh_acceptance_estimate(np.full(3, -np.inf)) == 0.0
    # One dominant weight: almost nothing is accepted from it.
    assert imh_acceptance_estimate(np.array([0.0, -30.0, -30.0, -30.0])) < 0.26


def test_weight_diagnostics_pools_chains_and_reports():
    gen = torch.Generator().manual_seed(0)
    lw = torch.randn(3, 400, generator=gen, dtype=torch.float64) * 0.5
    diag = weight_diagnostics(lw, correction="importance")
    assert isinstance(diag, WeightDiagnostics)
    assert diag.num_draws == 1200 and len(diag.khat_per_chain) == 3
    assert diag.khat == pytest.approx(pareto_khat(lw.reshape(-1)))
    assert diag.weights_ess == pytest.approx(weights_ess(lw.reshape(-1)))
    assert diag.acceptance_source == "estimate" and 0.6 < diag.imh_acceptance < 0.9
    assert diag.verdict == "reliable" and diag.warning() is None
    record = diag.as_dict()
    assert record["khat"] == diag.khat and record["correction"] == "importance"
    assert "Pareto k-hat" in str(diag) and "IMH acceptance" in str(diag)
    chains = weight_diagnostics(lw, accept_prob=torch.full((3, 100), 0.25), correction="imh")
    assert chains.acceptance_source == "chains" and chains.imh_acceptance == pytest.approx(0.25)
    single = weight_diagnostics(lw[0])
    assert single.num_draws == 400 and len(single.khat_per_chain) == 1


def test_warnings_name_the_fix():
    rng = np.random.default_rng(1)
    heavy = weight_diagnostics(rng.standard_cauchy(2000) * 3, correction="imh")
    assert heavy.verdict == "not reliable"
    assert "Train the guide longer" in heavy.warning() and "wider" in heavy.warning()
    moderate = weight_diagnostics(rng.normal(0.0, 3.0, 2000), correction="imh")
    message = moderate.warning()
    assert message is not None and "IMH chains accept" in message
    # k-hat below 1: an IMH run is told to run more draws, not to use IMH (it does)
    mild = weight_diagnostics(np.random.default_rng(2).normal(0.0, 2.0, 2000), correction="imh")
    assert 0.7 <= mild.khat < 1.0
    assert "run more draws" in mild.warning() and "use correction='imh'" not in mild.warning()
    raw = weight_diagnostics(rng.normal(0.0, 0.1, 100), correction=None)
    assert "correction='importance' or correction='imh'" in raw.warning()
    with pytest.warns(UserWarning, match="Train the guide longer"):
        heavy.warn()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        weight_diagnostics(rng.normal(0.0, 0.1, 100), correction="imh").warn()


def test_too_few_draws_give_no_khat_and_no_khat_warning():
    few = weight_diagnostics(np.array([0.0, 5.0, -5.0]), correction="importance")
    assert np.isnan(few.khat) and few.verdict == "unavailable"
    assert few.warning() is None


def test_bad_arguments():
    with pytest.raises(ValueError, match="log_weight"):
        weight_diagnostics(torch.zeros(2, 2, 2))
    with pytest.raises(ValueError, match="correction"):
        weight_diagnostics(torch.zeros(5), correction="smc")


def test_weights_within_a_factor_of_two_have_no_tail_to_fit():
    """A guide close to a discrete target: 2,200 weights taking 69 tied values within 0.9%
    of each other got k-hat 1.18 from the Pareto fit and a warning that the correction could
    not be trusted, beside an ESS of 100% and an IMH acceptance of 1.00."""
    rng = np.random.default_rng(0)
    tied = rng.choice(rng.uniform(0.0, 0.009, size=69), size=2200)
    smoothed, khat = psis(tied)
    assert khat == -math.inf
    np.testing.assert_allclose(smoothed, tied - np.logaddexp.reduce(tied))
    diag = weight_diagnostics(tied, correction="imh")
    assert diag.verdict == "reliable" and diag.warning() is None
    three = rng.choice(np.array([0.0, 0.15, 0.3]), size=2200)  # ArviZ: k-hat inf
    assert psis(three)[1] == -math.inf
    assert pareto_khat(rng.normal(size=2000) * 0.5) < 0.7  # spread weights are still fitted


def _revisited(num_states, num_draws, noise, seed=0):
    """Log weights of ``num_draws`` draws of a guide on ``num_states`` states: every state is
    drawn many times, so the weights take at most ``num_states`` tied values."""
    rng = np.random.default_rng(seed)
    log_p = rng.normal(size=num_states) * 1.5
    log_p -= np.logaddexp.reduce(log_p)
    log_q = log_p + noise * rng.normal(size=num_states)
    log_q -= np.logaddexp.reduce(log_q)
    states = rng.choice(num_states, size=num_draws, p=np.exp(log_q))
    return (log_p - log_q)[states]


def test_a_tail_of_tied_weights_has_no_khat_and_is_not_smoothed():
    """A guide in one order on 64 states, drawn 6,000 and 24,000 times: the tail held 5 or 6
    tied values, ArviZ's fit gave k-hat 1.06 and 0.98 beside a weights' ESS of 75% (the
    summary said the correction could not be trusted), and PSIS smoothing by that fit moved
    weight between the revisited states."""
    for num_draws in (6000, 24000):
        lw = _revisited(64, num_draws, noise=0.5)
        smoothed, khat = psis(lw)
        assert math.isnan(khat)
        np.testing.assert_allclose(smoothed, lw - np.logaddexp.reduce(lw))
        diag = weight_diagnostics(lw, correction="importance")
        assert diag.verdict == "unavailable" and diag.warning() is None
        assert "distinct values" in diag.khat_unavailable
        assert diag.weights_ess > 0.5 * num_draws
    spread = _revisited(10**6, 6000, noise=0.3)  # few ties: still fitted
    assert pareto_khat(spread) < 0.5


def test_a_tied_tail_with_a_small_weights_ess_warns():
    rng = np.random.default_rng(1)
    lw = rng.choice(np.array([0.0, 0.5, 1.0, 9.0]), size=4000, p=[0.5, 0.3, 0.199, 0.001])
    diag = weight_diagnostics(lw, correction="importance")
    assert math.isnan(diag.khat) and diag.weights_ess < 0.1 * 4000
    assert "the weights' ESS is" in diag.warning() and "cannot be trusted" in diag.warning()


def test_a_short_tail_without_ties_is_still_fitted():
    """The tail of 95 draws or fewer holds at most 19 weights: without ties it is fitted (an
    outside review: every run of 5 to 95 draws had lost its k-hat, and a heavy tail its
    warning)."""
    heavy = np.random.default_rng(3).standard_t(1.0, size=80) * 0.8
    diag = weight_diagnostics(heavy, correction="importance")
    assert diag.khat >= 0.7 and "cannot be trusted" in diag.warning()
    assert not math.isnan(pareto_khat(np.random.default_rng(0).normal(size=30)))


def _diagnostics(khat: float, ess: float, num: int) -> WeightDiagnostics:
    return WeightDiagnostics(khat, ess, num, 0.5, "estimate", correction="importance")


def test_a_low_ess_warns_where_khat_is_only_usable_with_caution():
    """An outside test: k-hat 0.69 ("usable with caution") with a weights' ESS of 47 of
    20,000 draws gave P(a = 1) 0.32 against 0.62 without a warning; the low ESS warned only
    where k-hat was unavailable. A good k-hat's low ESS is slow, not wrong: no warning."""
    assert "the weights' ESS is 47 of 20000" in _diagnostics(0.69, 47, 20000).warning()
    assert _diagnostics(0.02, 378, 4000).warning() is None
    heavy = _diagnostics(0.9, 3, 20000).warning()
    assert heavy.count("ESS") == 1 and "k-hat of the importance weights is 0.90" in heavy


def test_weights_whose_mean_falls_short_of_the_exact_evidence_warn():
    """Draws of a law that gives part of the posterior no mass: the weights' mean estimates
    Z times the mass the law reaches, so against the exact Z (by elimination) it shows the
    mass no correction recovers, which neither k-hat nor the ESS sees (equal weights)."""
    equal = np.zeros(1000)
    short = weight_diagnostics(equal, log_normalizer=math.log(1 / 0.4))
    assert short.evidence_share == pytest.approx(0.4)
    assert "40.0% of the model's evidence Z" in short.warning()
    whole = weight_diagnostics(equal, log_normalizer=0.0)
    assert whole.evidence_share == pytest.approx(1.0) and whole.warning() is None
    assert math.isnan(weight_diagnostics(equal).evidence_share)
