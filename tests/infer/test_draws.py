"""One path from the engine's draws to results (infer/draws.py), taken by every exact path.

``AutoSpec`` on a discrete model (by the engine or by forward filtering, backward sampling),
``AutoSpec`` on a model with continuous sites, and ``AutoSpecKernel`` all turn their draws
into site values, the log joint and the pooled self-check through ``DrawEvaluator``.
"""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC

from pyro_autospec.infer import AutoSpec, AutoSpecKernel
from pyro_autospec.infer.draws import DrawEvaluator, ModelCall
from pyro_autospec.infer.self_check import SelfCheck
from pyro_autospec.model import discover_sites

DATA = torch.tensor([0.3, 1.8, 2.4])


def discrete(y):
    g = pyro.sample("g", dist.Categorical(torch.tensor([0.3, 0.3, 0.4])))
    with pyro.plate("data", len(y)):
        z = pyro.sample("z", dist.Bernoulli(0.5))
        pyro.sample("y", dist.Normal(z + g.float(), 0.8), obs=y)


def mixed(y):
    loc = pyro.sample("loc", dist.Normal(0.0, 2.0))
    with pyro.plate("data", len(y)):
        z = pyro.sample("z", dist.Bernoulli(0.5))
        pyro.sample("y", dist.Normal(loc + z, 0.8), obs=y)


@pytest.fixture
def calls(monkeypatch):
    """Counts the batches evaluated and the pooled checks run by ``DrawEvaluator``."""
    counts = {"evaluate": 0, "check": 0}
    evaluate, check = DrawEvaluator.evaluate, DrawEvaluator.check

    def counting_evaluate(self, *args, **kwargs):
        counts["evaluate"] += 1
        return evaluate(self, *args, **kwargs)

    def counting_check(self):
        counts["check"] += 1
        return check(self)

    monkeypatch.setattr(DrawEvaluator, "evaluate", counting_evaluate)
    monkeypatch.setattr(DrawEvaluator, "check", counting_check)
    return counts


@pytest.mark.parametrize("sampler", ["engine", "ffbs"])
def test_autospec_discrete_takes_the_one_path(calls, sampler):
    fit = AutoSpec(
        discrete, num_samples=5, num_chains=3, seed=0, sampler=sampler, disable_progbar=True
    ).run(DATA)
    # a batch per chain, one pooled check; the 15 draws are joined by 49 more for the check
    # alone (fewer than 64) and by 64 uniform probes, in the first chain's batch
    assert calls == {"evaluate": 3, "check": 1}
    assert fit._run.num_check_draws == 49 and fit._run.num_probes == 64
    assert fit.diagnostics()["sampler"] == ("ffbs" if sampler == "ffbs" else "autospec")
    assert fit._run.max_self_check_error is not None


def test_autospec_mixed_takes_the_one_path(calls):
    fit = AutoSpec(
        mixed, num_samples=4, num_chains=2, warmup_steps=4, seed=0, disable_progbar=True
    ).run(DATA)
    assert calls == {"evaluate": 1, "check": 1}  # every chain's draws in one engine run
    assert fit._run.max_self_check_error is not None


def test_kernel_takes_the_one_path(calls):
    kernel = AutoSpecKernel(discrete, seed=0, draws_per_run=4)
    MCMC(kernel, num_samples=10, warmup_steps=0, disable_progbar=True).run(DATA)
    # 11 draws (the first state too) in runs of 4: three engine runs, each checked as it comes
    assert calls == {"evaluate": 3, "check": 3}
    assert kernel.max_self_check_error is not None


def test_evaluated_draws_carry_values_log_joint_and_weights():
    layout = discover_sites(discrete, (DATA,))
    coords = torch.tensor([[0, 0, 0, 0], [2, 1, 1, 1]])
    oracle_lp = torch.tensor([-1.0, -2.0])

    class Oracle:  # a stand-in: the check below compares the draws with each other
        pass

    draws = DrawEvaluator(ModelCall(discrete, (DATA,), {}), layout, self_check=SelfCheck(Oracle()))
    out = draws.evaluate(coords, oracle_lp)
    assert out.values["g"].tolist() == [0, 2] and out.values["z"].tolist() == [[0.0] * 3, [1.0] * 3]
    assert out.lp.dtype == torch.float64 and out.lp.shape == (2,)
    assert torch.equal(out.log_weight, out.lp - oracle_lp.double())
    assert set(out.joint.pointwise) == {"y"}


def global_latent(y):
    g = pyro.sample("g", dist.Categorical(torch.tensor([0.3, 0.3, 0.4])))
    with pyro.plate("data", len(y)):
        pyro.sample("y", dist.Normal(g.float(), 0.8), obs=y)
    pyro.deterministic("shift", 2.0 * g.float())


def test_each_distinct_assignment_is_evaluated_once(monkeypatch):
    """Few discrete sites and many draws: the model runs on the distinct assignments only
    (an outside user's global latent over 100,000 observations spent seconds and gigabytes
    scoring the same three assignments), and every draw gets its own assignment's results."""
    import pyro_autospec.infer.draws as draws_module

    batches = []
    evaluate = draws_module.evaluate

    def recording(model, args, kwargs, values, *rest, **options):
        batches.append(int(values["g"].shape[0]))
        return evaluate(model, args, kwargs, values, *rest, **options)

    monkeypatch.setattr(draws_module, "evaluate", recording)
    y = torch.tensor([0.2, 1.1, 1.9])
    fit = AutoSpec(global_latent, num_samples=300, seed=1, disable_progbar=True).run(y)
    assert batches and max(batches) <= 3  # three values of g, whatever the draws
    g = fit.get_samples()["g"]
    assert len(set(g.tolist())) == 3
    by_hand = torch.stack(
        [
            pyro.poutine.trace(pyro.poutine.condition(global_latent, data={"g": value}))
            .get_trace(y)
            .log_prob_sum()
            .double()
            for value in g
        ]
    )
    torch.testing.assert_close(fit.get_extra_fields()["lp"], by_hand, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(fit.get_samples()["shift"], 2.0 * g.float())
    pointwise = fit.to_inference_data(log_likelihood="conditional").log_likelihood["y"]
    assert pointwise.shape[-1] == 3 and pointwise.shape[0] * pointwise.shape[1] == 300


WIDE_DATA = torch.linspace(-1.0, 2.0, 12)


def wide(y):
    """12 binary sites: 200 draws are almost all distinct."""
    with pyro.plate("data", len(y)):
        z = pyro.sample("z", dist.Bernoulli(0.5))
        pyro.sample("y", dist.Normal(z, 1.5), obs=y)
        pyro.deterministic("twice", 2.0 * z)


@pytest.mark.parametrize("correction", [None, "importance"])
def test_a_run_in_chunks_returns_what_one_batch_returns(monkeypatch, correction):
    """A run whose draws are mostly distinct evaluates them a chunk at a time into outputs
    made once (what it holds beyond them is one chunk's), and returns bit for bit what one
    batch returns: the values, ``lp``, the deterministic sites and the pointwise log
    likelihood, exact or corrected."""
    import pyro_autospec.infer.draws as draws_module

    options = {"correction": correction, "guide": "auto"} if correction else {}

    def run():
        if correction:
            exact = AutoSpec(wide, num_samples=200, seed=2, disable_progbar=True).run(WIDE_DATA)
            options["guide"] = exact._run._oracle  # an exact oracle, corrected
        fit = AutoSpec(wide, num_samples=200, num_chains=2, seed=7, disable_progbar=True, **options)
        return fit.run(WIDE_DATA)

    whole = run()
    sizes = []
    evaluate = DrawEvaluator.evaluate

    def recording(self, samples, *args, **kwargs):
        sizes.append(samples.shape[0])
        return evaluate(self, samples, *args, **kwargs)

    monkeypatch.setattr(draws_module, "EVALUATION_TRACE", 1)
    monkeypatch.setattr(draws_module, "MAX_CHUNK_ENTRIES", 30 * 24)  # 30 draws per chunk
    monkeypatch.setattr(DrawEvaluator, "evaluate", recording)
    chunked = run()
    assert max(sizes) <= 30 and len(sizes) > 2 * 200 // 30
    for name, value in whole.get_samples().items():
        assert torch.equal(chunked.get_samples()[name], value), name
    for name in ("lp", "oracle_log_prob"):
        assert torch.equal(chunked.get_extra_fields()[name], whole.get_extra_fields()[name])
    one, two = (f.to_inference_data(log_likelihood="conditional") for f in (whole, chunked))
    assert one.log_likelihood["y"].equals(two.log_likelihood["y"])


def test_chunks_keep_one_row_per_distinct_assignment(monkeypatch):
    """Where at most half of a chain's draws are distinct, the pointwise log likelihood stays
    one row per distinct assignment however the draws would be chunked (a first chunk with
    mostly distinct draws made every draw's row before), and a run's extra fields are its
    own tensors, not views of ``results[i]``."""
    import pyro_autospec.infer.draws as draws_module

    monkeypatch.setattr(draws_module, "EVALUATION_TRACE", 1)
    monkeypatch.setattr(draws_module, "MAX_CHUNK_ENTRIES", 20)
    fit = AutoSpec(global_latent, num_samples=300, seed=1, disable_progbar=True).run(DATA)
    (table, rows), *_ = fit._run.pointwise._pieces["y"]
    assert table.shape[0] == 3 and rows.shape == (300,)
    extra = fit.get_extra_fields()
    extra["oracle_log_prob"][0] += 1.0
    extra["sample_rounds"][0] += 1
    assert fit.results[0].log_prob[0] != extra["oracle_log_prob"][0]
    assert fit.results[0].sample_rounds[0] != extra["sample_rounds"][0]


@pytest.mark.parametrize("num, n, q", [(1000, 3, 2), (500, 12, 3), (64, 1, 7), (200, 40, 4)])
def test_unique_rows_are_torch_unique(num, n, q):
    """Rows read as numbers sort as the rows do: the same unique rows, order and inverse as
    ``torch.unique(dim=0)`` (40 coordinates of 4 values do not fit in a number: rows)."""
    from pyro_autospec.infer.draws import _unique_rows

    samples = torch.randint(0, q, (num, n), generator=torch.Generator().manual_seed(n))
    unique, inverse = _unique_rows(samples)
    expected, expected_inverse = torch.unique(samples, dim=0, return_inverse=True)
    assert torch.equal(unique, expected) and torch.equal(inverse, expected_inverse)
