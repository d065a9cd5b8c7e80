"""Models with continuous AND discrete latent sites: NUTS, then exact discrete draws.

Tier 3: posterior means of every site within 5 standard errors (from the effective sample
size of the chain) of the exact posterior computed by hand on a grid (tests/infer/
_mixed_models.py). The change-point model is also run through Pyro's NUTS + infer_discrete
and, when installed, NumPyro's DiscreteHMCGibbs: every method agrees with the exact answer.
"""

from __future__ import annotations

import io
import math
import warnings
from contextlib import redirect_stdout

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC, NUTS, config_enumerate, infer_discrete
from pyro.ops.stats import effective_sample_size

from pyro_autospec.infer import AutoSpec, UnsupportedSiteError
from tests.infer._mixed_models import (
    CHANGE_DATA,
    HMM_DATA,
    MIXTURE_DATA,
    change_point,
    change_point_exact,
    hmm_exact,
    hmm_unknown_transition,
    mixture,
    mixture_exact,
)

K_SIGMA = 5.0


def assert_means_match(
    draws: torch.Tensor, exact: torch.Tensor, what: str, binary: bool = False
) -> None:
    """``draws`` [chains, samples, ...] against exact means, within K_SIGMA standard errors.

    For 0/1 sites the standard deviation is the exact ``sqrt(p (1 - p))`` (a rare value may
    not appear at all in a few hundred draws, leaving a sample deviation of 0).
    """
    draws = draws.double()
    flat = draws.reshape(-1, *draws.shape[2:])
    mean = flat.mean(0)
    exact = exact.double()
    sd = (exact * (1 - exact)).sqrt() if binary else flat.std(0)
    ess = effective_sample_size(draws)
    # nearly constant sites give NaN: count their draws
    ess = torch.where(torch.isnan(ess), float(flat.shape[0]), ess).clamp(min=2.0)
    se = sd / ess.sqrt()
    error = (mean - exact).abs()
    assert bool((error <= K_SIGMA * se + 1e-9).all()), (
        f"{what}: mean {mean}, exact {exact}, se {se}"
    )


def run_autospec(model, data, num_samples=400, warmup_steps=300, seed=0):
    return AutoSpec(
        model,
        num_samples=num_samples,
        warmup_steps=warmup_steps,
        seed=seed,
        disable_progbar=True,
    ).run(data)


@pytest.fixture(scope="module")
def mixture_fit():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*broadcast over a batch.*")
        warnings.filterwarnings("ignore", message=".*evaluate on a batch.*")
        return run_autospec(mixture, MIXTURE_DATA)


def test_gaussian_mixture_means(mixture_fit):
    exact = mixture_exact()
    samples = mixture_fit.get_samples(group_by_chain=True)
    assert samples["assignment"].dtype == torch.long and samples["locs"].dtype == torch.float32
    assert_means_match(samples["locs"], exact["locs"], "locs")
    assert_means_match(samples["assignment"], exact["assignment"], "assignment", binary=True)


def test_mixture_arviz_log_likelihood_is_given_every_latent_site(mixture_fit):
    """The conditional pointwise log likelihood uses the draw's own assignments, not prior
    draws."""
    idata = mixture_fit.to_inference_data(log_likelihood="conditional")
    assert set(idata.posterior.data_vars) == {"locs", "assignment"}
    samples = mixture_fit.get_samples(group_by_chain=True)
    locs = samples["locs"].double()
    chosen = locs.gather(-1, samples["assignment"])  # [chain, draw, N]
    direct = dist.Normal(chosen, 1.0).log_prob(MIXTURE_DATA.double())
    np.testing.assert_allclose(idata.log_likelihood["obs"].values, direct.numpy(), atol=1e-5)
    assert idata.sample_stats["diverging"].shape == (1, 400)
    diag = mixture_fit.diagnostics()
    assert {"divergences", "acceptance rate", "seconds"} <= set(diag)


def test_transforms_are_those_of_the_nuts_run_as_in_mcmc(mixture_fit):
    """``transforms`` is MCMC's attribute: ``{site: constrained -> unconstrained}`` for every
    continuous latent site (NUTS's own), none for the discrete sites."""
    transforms = mixture_fit.transforms
    assert set(transforms) == {"locs"}
    locs = mixture_fit.get_samples()["locs"]
    support = dist.Normal(0.0, 1.0).support
    expected = torch.distributions.biject_to(support).inv(locs)
    assert torch.equal(transforms["locs"](locs), expected)
    discrete = AutoSpec(lambda: pyro.sample("z", dist.Bernoulli(0.5)), 5, seed=0)
    assert discrete.transforms is None  # as MCMC's before run()
    assert discrete.run().transforms == {}


def test_diagnostics_name_what_drew_the_discrete_sites(mixture_fit):
    """``diagnostics()["sampler"]`` named the sampler of discrete-only models but was missing
    (``None`` from ``.get``) for models with continuous sites (found by an outside user): it
    names what drew the discrete sites given each NUTS draw, ``"continuous_sampler"`` NUTS."""
    diag = mixture_fit.diagnostics()  # on a CPU: one elimination pass for every NUTS draw
    assert diag["sampler"] == mixture_fit.results[0].method == "ffbs"
    assert diag["continuous_sampler"] == "pyro NUTS (discrete sites enumerated)"
    attrs = mixture_fit.to_inference_data(log_likelihood=False).posterior.attrs
    assert attrs["sampler"] == "ffbs"
    out = io.StringIO()
    with redirect_stdout(out):
        mixture_fit.summary()
    assert "by forward filtering, backward sampling ('ffbs'" in out.getvalue()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*broadcast over a batch.*")
        warnings.filterwarnings("ignore", message=".*evaluate on a batch.*")
        fit = AutoSpec(
            mixture, 4, warmup_steps=4, method="sequential", seed=0, disable_progbar=True
        ).run(MIXTURE_DATA)
    assert fit.diagnostics()["sampler"] == "sequential"
    out = io.StringIO()
    with redirect_stdout(out):
        fit.summary()
    assert "by the engine's method 'sequential'" in out.getvalue()


@pytest.fixture(scope="module")
def hmm_fit():
    return run_autospec(hmm_unknown_transition, HMM_DATA, seed=1)


def test_hmm_with_unknown_transition_means(hmm_fit):
    exact = hmm_exact()
    samples = hmm_fit.get_samples(group_by_chain=True)
    assert_means_match(samples["stay"], exact["stay"], "stay")
    x = torch.stack([samples[f"x_{t}"] for t in range(len(HMM_DATA))], -1)
    assert_means_match(x, exact["x"], "x", binary=True)


def test_summary_reports_both_stages(hmm_fit, capsys):
    hmm_fit.summary()
    out = capsys.readouterr().out
    assert "stay" in out and "x_0" in out
    assert "Pyro NUTS with the discrete sites enumerated out" in out
    assert "Self-check passed" in out and "log normaliser" in out
    assert "Wall time (measured)" in out and "NUTS" in out  # the NUTS stage, measured
    seconds = hmm_fit.timing
    assert {"tracing", "compiling", "nuts", "oracle", "engine", "evaluation", "self-check"} <= set(
        seconds
    )
    assert seconds["nuts"] <= seconds["total"]


@pytest.fixture(scope="module")
def change_fit():
    return run_autospec(change_point, CHANGE_DATA, seed=2)


def test_change_point_means(change_fit):
    exact = change_point_exact()
    samples = change_fit.get_samples(group_by_chain=True)
    for name in ("early", "late", "tau"):
        assert_means_match(samples[name], exact[name], name)


def test_change_point_pyro_nuts_and_infer_discrete_agree():
    """The reference a Pyro user would run: NUTS, then infer_discrete per draw."""
    exact = change_point_exact()
    pyro.set_rng_seed(3)
    mcmc = MCMC(
        NUTS(config_enumerate(change_point), max_plate_nesting=1),
        num_samples=400,
        warmup_steps=300,
        disable_progbar=True,
    )
    mcmc.run(CHANGE_DATA)
    draws = mcmc.get_samples()
    taus = []
    for i in range(400):
        conditioned = pyro.poutine.condition(change_point, data={k: v[i] for k, v in draws.items()})
        sampler = infer_discrete(config_enumerate(conditioned), first_available_dim=-2)
        trace = pyro.poutine.trace(sampler).get_trace(CHANGE_DATA)
        taus.append(trace.nodes["tau"]["value"])
    assert_means_match(torch.stack(taus)[None], exact["tau"], "tau (infer_discrete)")
    assert_means_match(draws["early"][None], exact["early"], "early (NUTS)")


def test_change_point_numpyro_discrete_hmc_gibbs_agrees():
    jax = pytest.importorskip("jax")
    numpyro = pytest.importorskip("numpyro")
    import numpyro.distributions as ndist
    from numpyro.infer import MCMC as NMCMC
    from numpyro.infer import NUTS as NNUTS
    from numpyro.infer import DiscreteHMCGibbs

    counts = jax.numpy.asarray(CHANGE_DATA.numpy())
    T = len(CHANGE_DATA)

    def numpyro_model():
        early = numpyro.sample("early", ndist.Gamma(2.0, 0.5))
        late = numpyro.sample("late", ndist.Gamma(2.0, 0.5))
        tau = numpyro.sample("tau", ndist.Categorical(jax.numpy.ones(T) / T))
        rate = jax.numpy.where(jax.numpy.arange(T) < tau, early, late)
        numpyro.sample("counts", ndist.Poisson(rate), obs=counts)

    mcmc = NMCMC(
        DiscreteHMCGibbs(NNUTS(numpyro_model)),
        num_warmup=500,
        num_samples=2000,
        progress_bar=False,
    )
    mcmc.run(jax.random.PRNGKey(0))
    samples = mcmc.get_samples()
    exact = change_point_exact()
    for name in ("early", "late", "tau"):
        value = torch.tensor(np.array(samples[name]), dtype=torch.float64)
        assert_means_match(value[None], exact[name], f"{name} (DiscreteHMCGibbs)")


def test_mixed_models_refuse_guides_and_custom_oracles():
    class Oracle:
        num_coords, num_values = 1, 10

        def log_marginals(self, values, mask):
            raise AssertionError("never called")

    with pytest.raises(UnsupportedSiteError, match=r"continuous latent sites \['early', 'late'\]"):
        AutoSpec(change_point, num_samples=2, oracle=Oracle(), disable_progbar=True).run(
            CHANGE_DATA
        )


@pytest.mark.skipif(not hasattr(ValueError(), "add_note"), reason="notes need Python 3.11")
def test_nuts_without_a_starting_point_says_why_under_pyros_error():
    """An outside test: a zero-inflated Poisson written as Poisson(rate * (1 - z)) stopped
    with Pyro's bare 'cannot find valid initial params'."""

    def zero_inflated(y):
        rate = pyro.sample("rate", dist.Gamma(2.0, 1.0))
        with pyro.plate("data", len(y)):
            z = pyro.sample("z", dist.Bernoulli(0.3))
            pyro.sample("y", dist.Poisson(rate * (1 - z)), obs=y)

    fit = AutoSpec(zero_inflated, 5, warmup_steps=5, seed=0, disable_progbar=True)
    with pytest.raises(ValueError, match="cannot find valid initial params") as info:
        fit.run(torch.tensor([0.0, 3.0, 0.0, 2.0]))
    note = " ".join(info.value.__notes__)
    assert "exactly 0" in note and "ZeroInflatedPoisson" in note and "init_strategy" in note


def test_targets_too_many_for_one_elimination_are_drawn_in_chunks(monkeypatch):
    """Where all NUTS draws' tables together exceed the elimination's limit, the discrete
    sites are eliminated for chunks of draws (halved until they fit), each chunk with a seed
    of its own, not left to the engine; the self-check passes and the chunks' draws follow
    the law (chi-square against brute force on repeated continuous values)."""
    from pyro.ops.indexing import Vindex

    import pyro_autospec.model.ffbs as ffbs
    from pyro_autospec.infer.mixed_run import _sample_plans
    from pyro_autospec.model.enum import EnumOracle
    from tests.catalogue.brute_force import assert_draws_follow, enumerate_joint

    def model(data):
        locs = pyro.sample("locs", dist.Normal(torch.tensor([-2.0, 2.0]), 1.0).to_event(1))
        with pyro.plate("data", len(data)):
            z = pyro.sample("z", dist.Categorical(torch.ones(2) / 2))
            pyro.sample("obs", dist.Normal(Vindex(locs)[..., z], 1.0), obs=data)

    data = torch.tensor([-2.0, 0.1, 2.2])
    monkeypatch.setattr(ffbs, "MAX_BUCKET_ENTRIES", 40 * 3 * 2 // 3)  # a third of the draws
    fit = AutoSpec(model, 40, warmup_steps=20, seed=0, disable_progbar=True).run(data)
    steps = fit.results[0].sample_rounds[0]
    assert fit.diagnostics()["sampler"] == "ffbs" and fit.results[0].rounds > steps
    assert fit._run.max_self_check_error < 1e-6
    # not even one draw's tables fit: the engine draws them, and the run says why
    monkeypatch.setattr(ffbs, "MAX_BUCKET_ENTRIES", 1)
    with pytest.warns(UserWarning, match="does not fit this model's discrete sites even for one"):
        slow = AutoSpec(model, 4, warmup_steps=4, seed=0, disable_progbar=True).run(data)
    assert slow.diagnostics()["sampler"] == "autospec"
    # two chunks of the same targets: their own seeds, and together the law
    locs = torch.tensor([[-1.0, 1.5]])
    reps = 3000
    monkeypatch.setattr(ffbs, "MAX_BUCKET_ENTRIES", 2**22)
    oracle = EnumOracle(model, (data,), continuous_values={"locs": locs.expand(reps, 2)})
    plan = ffbs.plan_ffbs(oracle)
    result = _sample_plans([(slice(0, reps), plan), (slice(reps, 2 * reps), plan)], seed=5)
    first, second = result.samples[:reps], result.samples[reps:]
    assert not torch.equal(first, second)

    def joint(z):
        total = 0.0
        for zi, yi in zip(z, data, strict=True):
            total += math.log(0.5) + float(dist.Normal(locs[0, zi], 1.0).log_prob(yi))
        return total

    states, probs = enumerate_joint([2, 2, 2], joint)
    assert_draws_follow(result.samples.numpy(), states, probs)
