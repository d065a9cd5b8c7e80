"""The runtime self-check pools every draw of a run, whatever the path and the chains.

For an exact oracle ``log p(x, data) - log q(x)`` is the same constant ``log Z`` for every draw
of the run, so the check compares draws across chains (and, for ``AutoSpecKernel``, across the
engine runs that feed ``MCMC``): one draw per chain must not make it vacuous.
"""

from __future__ import annotations

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC
from pyro.ops.indexing import Vindex

from pyro_autospec.infer import AutoSpec, AutoSpecKernel, SelfCheckError
from tests.catalogue.brute_force import assert_draws_follow, enumerate_joint, flatten_draws
from tests.catalogue.oracles import RowsOnly


def biased():
    """Two coins far from uniform: a uniform oracle is not its posterior."""
    with pyro.plate("p", 2):
        pyro.sample("z", dist.Bernoulli(0.95))


class Uniform:
    """A uniform oracle over two binary coordinates: exact for another density."""

    num_coords, num_values = 2, 2

    def log_marginals(self, values, mask):
        return torch.full((values.shape[0], 2, 2), -math.log(2.0), dtype=torch.float64)


class Truncated:
    """Exact for ``biased`` on the values with ``z[0] = 1`` only: ``log p - log q`` is the one
    constant ``log 0.95`` on every draw, so draws compared with each other agree."""

    num_coords, num_values = 2, 2

    def log_marginals(self, values, mask):
        rows = torch.tensor([[0.0, 1.0], [0.05, 0.95]], dtype=torch.float64).log()
        return rows.expand(values.shape[0], 2, 2).clone()


def _fit(num_samples, num_chains, seed=0):
    return AutoSpec(
        biased,
        num_samples=num_samples,
        num_chains=num_chains,
        oracle=Uniform(),
        seed=seed,
        disable_progbar=True,
    )


@pytest.fixture
def without_log_z(monkeypatch):
    """No reference ``log Z`` (as for a model too costly to enumerate): the draws are compared
    with each other only, which is what pooling is for."""
    from pyro_autospec.infer import self_check

    monkeypatch.setattr(self_check, "reference_log_normalizer", lambda *args: None)


def test_one_draw_per_chain_is_checked_across_chains(without_log_z):
    """Four chains of one draw: the check must compare the four draws (it used to pass)."""
    with pytest.raises(SelfCheckError, match="varies across draws.*NOT exact"):
        _fit(1, 4).run()


def test_pooled_and_single_chain_agree(without_log_z):
    """The same number of draws raises whether they come in one chain or in several."""
    with pytest.raises(SelfCheckError):
        _fit(4, 1).run()
    with pytest.raises(SelfCheckError):
        _fit(2, 2).run()


def test_a_passing_run_reports_the_pooled_deviation(capsys):
    fit = AutoSpec(biased, num_samples=1, num_chains=6, seed=0, disable_progbar=True).run()
    fit.summary()
    assert "Self-check passed" in capsys.readouterr().out


@pytest.mark.parametrize(
    "oracle, draws_per_run, reference, match",
    [
        # AutoSpecKernel checks its draws like AutoSpec (it skipped the check)
        (Uniform, 8, False, "varies across draws"),
        # one draw per engine run: the check compares the draws of successive runs
        (Uniform, 1, False, "varies across draws"),
        # exact on part of the posterior: only log Z shows it
        (Truncated, 8, True, "differs from the log normaliser"),
    ],
)
def test_kernel_runs_the_self_check(oracle, draws_per_run, reference, match, request):
    if not reference:
        request.getfixturevalue("without_log_z")
    kernel = AutoSpecKernel(biased, oracle=oracle(), seed=0, draws_per_run=draws_per_run)
    mcmc = MCMC(kernel, num_samples=8, warmup_steps=0, num_chains=1, disable_progbar=True)
    with pytest.raises(SelfCheckError, match=f"{match}.*NOT exact"):
        mcmc.run()


def test_kernel_with_the_enumeration_oracle_passes():
    kernel = AutoSpecKernel(biased, seed=0, draws_per_run=1)
    mcmc = MCMC(kernel, num_samples=6, warmup_steps=0, num_chains=1, disable_progbar=True)
    mcmc.run()
    assert mcmc.get_samples()["z"].shape == (6, 2)
    assert kernel.max_self_check_error is not None and kernel.max_self_check_error < 1e-6


def observed(y):
    z = pyro.sample("z", dist.Bernoulli(0.3))
    pyro.sample("y", dist.Normal(2.0 * z, 1.0), obs=y)


def test_kernel_starts_a_new_check_for_new_data():
    """Setups with other argument values (another log Z) are not pooled, even when the data is
    the same tensor changed in place; ``MCMC`` runs with equal values are."""

    class NoNormaliser:  # the exact oracle, without log_normalizer: draws compared together
        num_coords, num_values = 1, 2

        def __init__(self, y):
            self.y = y

        def log_marginals(self, values, mask):
            z = torch.tensor([0.0, 1.0])
            logits = dist.Bernoulli(0.3).log_prob(z) + dist.Normal(2.0 * z, 1.0).log_prob(self.y)
            return torch.log_softmax(logits.double(), -1).expand(values.shape[0], 1, 2)

    y = torch.tensor(0.5)
    kernel = AutoSpecKernel(observed, oracle=NoNormaliser(y), seed=0, draws_per_run=4)
    for value in (0.5, -3.0, -3.0):
        y.fill_(value)  # new data, same object: log Z differs
        kernel.setup(0, y)
        for _ in range(6):
            kernel.sample({})
        assert kernel.max_self_check_error < 1e-6
    MCMC(kernel, num_samples=8, warmup_steps=0, disable_progbar=True).run(y)
    assert kernel.max_self_check_error < 1e-6


def test_a_reused_kernel_checks_a_changed_model_afresh():
    """An MCMC run after an SVI step changed a ``pyro.param`` of the model (or after a tensor
    the model closes over was changed in place) failed its self-check, with the same
    arguments: the check pooled the new draws with those of the old law (found outside the
    project). Every setup checks afresh."""
    prior = torch.tensor(0.3)

    def model(y):
        p = pyro.param("p_reused", torch.tensor(0.5), constraint=dist.constraints.unit_interval)
        with pyro.plate("n", len(y)):
            w = pyro.sample("w", dist.Bernoulli(p * prior / 0.3))
            pyro.sample("y", dist.Normal(w.float(), 3.0), obs=y)

    pyro.clear_param_store()
    y = torch.zeros(4)
    kernel = AutoSpecKernel(model, seed=0, draws_per_run=4)
    MCMC(kernel, num_samples=8, warmup_steps=0, disable_progbar=True).run(y)
    with torch.no_grad():
        pyro.get_param_store().get_param("p_reused").unconstrained().add_(0.7)  # as Adam does
    MCMC(kernel, num_samples=8, warmup_steps=0, disable_progbar=True).run(y)
    prior.fill_(0.2)  # a tensor the model closes over
    mcmc = MCMC(kernel, num_samples=8, warmup_steps=0, disable_progbar=True)
    mcmc.run(y)
    assert kernel.max_self_check_error < 1e-6
    assert mcmc.get_samples()["w"].shape == (8, 4)
    pyro.clear_param_store()


def test_an_oracle_exact_on_part_of_the_posterior_is_caught_against_log_z():
    """It passed the check with 3000 draws (an outside test): ``log Z`` by elimination."""
    for num_samples, num_chains in ((200, 2), (1, 1)):
        fit = AutoSpec(
            biased,
            num_samples=num_samples,
            num_chains=num_chains,
            oracle=Truncated(),
            seed=0,
            disable_progbar=True,
        )
        with pytest.raises(SelfCheckError, match="differs from the log normaliser.*no mass"):
            fit.run()


class Exact:
    """``biased``'s posterior, without ``log_normalizer()``."""

    num_coords, num_values = 2, 2

    def log_marginals(self, values, mask):
        rows = torch.tensor([0.05, 0.95], dtype=torch.float64).log()
        return rows.expand(values.shape[0], 2, 2).clone()


def test_a_user_oracle_is_checked_against_log_z_and_the_summary_says_so(capsys):
    fit = AutoSpec(biased, num_samples=1, oracle=Exact(), seed=0, disable_progbar=True).run()
    assert fit._run.max_self_check_error < 1e-5  # float32 model
    fit.summary()
    out = capsys.readouterr().out
    assert "equals log Z, from an exact elimination" in out and "one draw" in out


def test_without_log_z_one_draw_warns_that_nothing_was_compared(without_log_z, capsys):
    """Where the elimination does not fit, draws can only be compared with each other."""
    with pytest.warns(UserWarning, match="the self-check compared nothing"):
        fit = AutoSpec(biased, 1, oracle=Truncated(), seed=0, disable_progbar=True).run()
    fit.summary()
    assert "Self-check: nothing compared" in capsys.readouterr().out
    fit = AutoSpec(biased, 50, oracle=Truncated(), seed=0, disable_progbar=True).run()
    fit.summary()  # the truncated oracle passes: the summary says what was not checked
    assert "exact on part of the posterior's values only would pass" in capsys.readouterr().out


def test_no_reference_where_enumerating_the_model_could_be_costly(monkeypatch):
    """Pyro's enumeration builds its tables while the model runs, before any limit applies:
    30 coupled sites summed into one observation would need 2^30 entries (an outside review
    measured 23 s and 2.3 GB at 26 sites, only to be refused). The bound is checked first."""
    from pyro_autospec.infer import self_check
    from pyro_autospec.model import discover_sites

    def summed(y):
        zs = [pyro.sample(f"z{i}", dist.Bernoulli(0.5)) for i in range(30)]
        pyro.sample("y", dist.Normal(sum(zs), 1.0), obs=y)

    layout = discover_sites(summed, (torch.tensor(3.0),))
    assert self_check.enumeration_bound(layout) == 2**30

    def fail(*args, **kwargs):
        raise AssertionError("the model was enumerated")

    monkeypatch.setattr(self_check, "EnumOracle", fail)
    assert self_check.reference_log_normalizer(summed, (torch.tensor(3.0),), {}, layout) is None


def test_the_enumeration_bound_counts_factors_and_event_dims():
    """An outside review: a pyro.factor in a plate of 5000 and an observation with an event
    dim of 2000 were left out of the bound (12 sites: 4096 counted, 2e7 entries built)."""
    from pyro_autospec.infer import self_check
    from pyro_autospec.model import discover_sites

    def plated_factor():
        zs = [pyro.sample(f"z{i}", dist.Bernoulli(0.5)) for i in range(12)]
        with pyro.plate("data", 5000):
            pyro.factor("f", sum(zs) * torch.ones(5000))

    def event_dims(y):
        zs = [pyro.sample(f"z{i}", dist.Bernoulli(0.5)) for i in range(12)]
        pyro.sample("y", dist.Normal(sum(zs) * torch.ones(2000), 1.0).to_event(1), obs=y)

    assert self_check.enumeration_bound(discover_sites(plated_factor)) == 4096 * 5000
    layout = discover_sites(event_dims, (torch.zeros(2000),))
    assert self_check.enumeration_bound(layout) == 4096 * 2000


def _chain(y, pinned=False):
    x = 0
    for t in pyro.markov(range(len(y))):
        x = pyro.sample(f"x_{t}", dist.Bernoulli(0.3 + 0.4 * x))
        if pinned and t == 0:  # the chain's posterior on x_0 = 1 only
            pyro.factor("pin", torch.where(x == 1, 0.0, -math.inf))
        pyro.sample(f"y_{t}", dist.Normal(x, 1.0), obs=y[t])


def test_a_markov_chain_is_checked_against_log_z():
    """30 binary steps: counted as global sites the bound was 2^30 and the chain went
    unchecked; in markov scopes it is 4 entries per table."""
    from pyro_autospec.model.enum import EnumOracle

    y = torch.linspace(-1.0, 2.0, 30)
    exact = RowsOnly(EnumOracle(_chain, (y,)))
    fit = AutoSpec(_chain, 20, oracle=exact, seed=0, disable_progbar=True).run(y)
    assert fit._run.self_check_reference == "enumeration"
    truncated = RowsOnly(EnumOracle(_chain, (y,), {"pinned": True}))
    fit = AutoSpec(_chain, 20, oracle=truncated, seed=0, disable_progbar=True)
    with pytest.raises(SelfCheckError, match="differs from the log normaliser"):
        fit.run(y)


def test_the_summary_says_why_there_is_no_log_z(capsys):
    """21 binary sites: tables of 2^21 entries at most, over the bound; an outside test asked
    why the summary had no reference."""

    def coins():
        for i in range(21):
            pyro.sample(f"c{i}", dist.Bernoulli(0.5))

    class Fair:
        num_coords, num_values = 21, 2

        def log_marginals(self, values, mask):
            return torch.full((values.shape[0], 21, 2), -math.log(2.0), dtype=torch.float64)

    AutoSpec(coins, 4, oracle=Fair(), seed=0, disable_progbar=True).run().summary()
    out = " ".join(capsys.readouterr().out.split())
    assert "No exact log Z to compare it with (enumerating the model could build tables" in out
    assert "2,097,152 entries, more than 1,048,576" in out


LONG_RING_DATA = torch.randn(40, generator=torch.Generator().manual_seed(0))


def long_ring():
    """40 steps with ``history=1`` whose last step reads ``x_0`` (past the history): too many
    sites for the wide trace that refuses it before drawing, so the self-check must catch it.
    The enumeration scores the ring on the diagonal, and a draw passes the check whenever its
    ``x_0`` equals its ``x_39``: about half of the posterior's draws."""
    xs = []
    for t in pyro.markov(range(40)):
        x = pyro.sample(f"x_{t}", dist.Bernoulli(0.5))
        pyro.sample(f"y_{t}", dist.Normal(x, 0.7), obs=LONG_RING_DATA[t])
        if t == 39:
            pyro.factor("ring", 2.0 * (xs[0] == x).float())
        xs.append(x)


def short_chain():
    """An exact six-step chain the self-check passes."""
    for t in pyro.markov(range(6)):
        x = pyro.sample(f"x_{t}", dist.Bernoulli(0.3))
        pyro.sample(f"y_{t}", dist.Normal(x, 0.7), obs=LONG_RING_DATA[t])


@pytest.mark.parametrize("sampler", ["auto", "engine"])
@pytest.mark.parametrize("seed", range(6))
def test_a_one_draw_run_is_checked_on_extra_draws(seed, sampler):
    """A run of fewer than 64 draws makes the rest for the self-check alone (by forward
    filtering, also when the engine drew the run's own); before, these one-draw runs
    returned their draw silently."""
    with pytest.raises(SelfCheckError):
        AutoSpec(long_ring, 1, seed=seed, sampler=sampler, disable_progbar=True).run()


def test_the_extra_draws_of_the_check_leave_the_returned_draws_alone():
    short = AutoSpec(short_chain, 3, seed=4, disable_progbar=True).run()
    long = AutoSpec(short_chain, 80, seed=4, disable_progbar=True).run()
    assert short._run.num_check_draws == 61 and long._run.num_check_draws == 0
    for name, value in short.get_samples().items():
        assert torch.equal(value, long.get_samples()[name][:3])
    assert "61 more drawn for this check alone" in short._run.self_check_summary()


def hidden_ring(steps):
    """A ``history=1`` chain whose last step reads ``z_0``, weighted so that the enumerated
    law (which reads ``z_{T-2}`` for ``z_0``: its prior is 1e-9 where ``z_0``'s is 0.999) gives
    ``z_{T-1} = 1`` a mass of about 1.5e-6, where the model gives it 0.998: the run's draws
    do not land where the two laws differ, however many a run holds. After an outside
    test."""

    def prior(t):
        return 0.999 if t == 0 else (1e-9 if t == steps - 2 else (1e-6 if t == steps - 1 else 0.5))

    def model():
        zs = []
        for t in pyro.markov(range(steps)):
            z = pyro.sample(f"z_{t}", dist.Bernoulli(prior(t)))
            if t == steps - 1:
                pyro.factor("ring", 20.0 * z * zs[0])
            zs.append(z)

    return model


@pytest.mark.parametrize("sampler", ["auto", "engine"])
def test_uniform_probes_catch_a_law_the_draws_never_visit(sampler):
    fit = AutoSpec(hidden_ring(40), 500, seed=0, sampler=sampler, disable_progbar=True)
    with pytest.raises(SelfCheckError, match="further back than its pyro.markov history") as info:
        fit.run()
    assert "an assignment made for this check alone, not a returned draw" in str(info.value)


def test_uniform_probes_pass_an_exact_model_and_are_counted():
    fit = AutoSpec(short_chain, 100, seed=1, disable_progbar=True).run()
    assert fit._run.num_probes == 64 and fit._run.num_check_draws == 0
    assert "at 64 uniformly drawn assignments" in fit._run.self_check_summary()


def test_probes_a_model_cannot_score_are_dropped():
    """A model need not run at assignments its draws never reach (here ``z = 2``, which has
    no prior mass): if evaluating the probes raises, they are dropped and the run's own draws
    stay the check."""

    def model():
        z = pyro.sample("z", dist.Categorical(torch.tensor([0.5, 0.5, 0.0])))
        if z.dim() == 1 and bool((z == 2).any()):  # a batch of draws that holds z = 2
            raise ValueError("not written for z = 2")
        pyro.sample("y", dist.Normal(z.float(), 1.0), obs=torch.tensor(0.3))

    fit = AutoSpec(model, 50, seed=0, disable_progbar=True).run()
    assert fit._run.num_probes == 0 and fit._run.num_check_draws == 14
    assert fit._run.max_self_check_error is not None


LEFT_TO_RIGHT = torch.tensor([[0.9, 0.1, 0.0], [0.0, 0.9, 0.1], [0.0, 0.0, 1.0]])
LTR_DATA = torch.linspace(0.0, 2.0, 5)


def left_to_right_hmm():
    """States only move forward and must end in the last one (a -inf factor): most uniform
    probes have no completion, where forward filtering's conditional was NaN, which failed
    the check of this correct model (an outside test; Pyro's infer_discrete samples it)."""
    x = 0
    for t in pyro.markov(range(5)):
        x = pyro.sample(f"x_{t}", dist.Categorical(Vindex(LEFT_TO_RIGHT)[x]))
        pyro.sample(f"y_{t}", dist.Normal(x.float(), 1.0), obs=LTR_DATA[t])
        if t == 4:
            pyro.factor("end", torch.where(x == 2, 0.0, float("-inf")))


def left_to_right_log_joint(s: tuple) -> float:
    total, prev = 0.0, 0
    for t, x in enumerate(s):
        step = float(LEFT_TO_RIGHT[prev, x])
        if step == 0.0 or (t == 4 and x != 2):
            return -math.inf
        total += math.log(step) + float(dist.Normal(float(x), 1.0).log_prob(LTR_DATA[t]))
        prev = x
    return total


@pytest.mark.parametrize("sampler", ["auto", "engine"])
def test_hard_constraints_pass_the_probes_and_sample_exactly(sampler):
    fit = AutoSpec(left_to_right_hmm, 3000, seed=0, sampler=sampler, disable_progbar=True).run()
    assert fit._run.num_probes == 64
    states, probs = enumerate_joint([3] * 5, left_to_right_log_joint)
    names = [f"x_{t}" for t in range(5)]
    assert_draws_follow(flatten_draws(fit.get_samples(), names), states, probs)


class TargetedOnly:
    """A user oracle with only ``log_marginals_at`` (exact: it reads the enumeration's rows),
    as the engine accepts; ``AutoSpec(oracle=...)`` refused it for lacking ``log_marginals``."""

    def __init__(self, model):
        from pyro_autospec.model.enum import EnumOracle

        self.inner = EnumOracle(model)
        self.num_coords, self.num_values = self.inner.num_coords, self.inner.num_values

    def log_marginals_at(self, values, mask, targets):
        rows = self.inner.log_marginals(values, mask)
        return rows.gather(1, targets.unsqueeze(-1).expand(-1, -1, self.num_values))


def test_an_oracle_with_only_log_marginals_at_runs_exactly_under_autospec():
    oracle = TargetedOnly(short_chain)
    fit = AutoSpec(short_chain, 3000, oracle=oracle, seed=0, disable_progbar=True).run()
    assert fit._run.self_check_reference == "enumeration"

    def log_joint(x):
        return sum(
            math.log(0.3 if v else 0.7)
            + float(dist.Normal(float(v), 0.7).log_prob(LONG_RING_DATA[t]))
            for t, v in enumerate(x)
        )

    states, probs = enumerate_joint([2] * 6, log_joint)
    names = [f"x_{t}" for t in range(6)]
    assert_draws_follow(flatten_draws(fit.get_samples(), names), states, probs)
