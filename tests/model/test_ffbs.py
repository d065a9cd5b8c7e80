"""Tier 2: forward filtering, backward sampling (AutoSpec's ``sampler="ffbs"``) is exact.

Every model's joint is written BY HAND (no pyro_autospec, no Pyro handler), enumerated, and
the draws are tested against it by chi-square (fixed seeds, p > 2e-5, >= 30 expected counts
per bin): a hidden Markov chain, a dynamic Bayesian network (chains coupled within a step), a
factorial HMM, a global site with a plate of local ones, and a plate of chains whose emissions
sit in a nested plate. Also: the method is chosen automatically and recorded, the self-check
runs on every draw, and models whose elimination does not fit go to the engine.
"""

from __future__ import annotations

import math

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.ops.indexing import Vindex

import pyro_autospec.model.ffbs as ffbs
from pyro_autospec.infer import AutoSpec, SelfCheckError
from pyro_autospec.model.enum import EnumOracle
from pyro_autospec.model.log_joint import ALWAYS_ALONE
from tests.catalogue.brute_force import assert_draws_follow, enumerate_joint, flatten_draws, lp

TRANS = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.3, 0.3, 0.4]])
LOCS = torch.tensor([-1.0, 0.5, 2.0])
YS = torch.tensor([0.3, -1.2, 1.9, 0.4])


def sample(model, *args, num_samples=6000, seed=0, sampler="ffbs", **kwargs):
    return AutoSpec(
        model, num_samples=num_samples, seed=seed, disable_progbar=True, sampler=sampler, **kwargs
    ).run(*args)


def hmm(ys):
    z = 0
    for t in pyro.markov(range(len(ys))):
        z = pyro.sample(f"z_{t}", dist.Categorical(TRANS[z]))
        pyro.sample(f"y_{t}", dist.Normal(LOCS[z], 1.0), obs=ys[t])


def hmm_joint(s):
    total, prev = 0.0, 0
    for t, z in enumerate(s):
        total += math.log(TRANS[prev, z]) + lp(dist.Normal(LOCS[z], 1.0), YS[t])
        prev = z
    return total


def dbn(ys):
    """Two binary chains: a_t on a_{t-1}; b_t on b_{t-1} and a_t; y_t on both."""
    a = b = 0
    for t in pyro.markov(range(len(ys))):
        a = pyro.sample(f"a_{t}", dist.Bernoulli(0.2 + 0.6 * a))
        b = pyro.sample(f"b_{t}", dist.Bernoulli(0.1 + 0.5 * b + 0.3 * a))
        pyro.sample(f"y_{t}", dist.Normal(a + 2.0 * b, 0.8), obs=ys[t])


def dbn_joint(s, ys):
    total, a_prev, b_prev = 0.0, 0, 0
    for t in range(len(ys)):
        a, b = s[2 * t], s[2 * t + 1]
        total += lp(dist.Bernoulli(0.2 + 0.6 * a_prev), float(a))
        total += lp(dist.Bernoulli(0.1 + 0.5 * b_prev + 0.3 * a), float(b))
        total += lp(dist.Normal(a + 2.0 * b, 0.8), ys[t])
        a_prev, b_prev = a, b
    return total


FTRANS = torch.tensor([[0.8, 0.2], [0.3, 0.7]])


def factorial(ys):
    w = x = 0
    for t in pyro.markov(range(len(ys))):
        w = pyro.sample(f"w_{t}", dist.Categorical(FTRANS[w]))
        x = pyro.sample(f"x_{t}", dist.Categorical(FTRANS.flip(0)[x]))
        pyro.sample(f"y_{t}", dist.Normal(w - 2.0 * x, 0.7), obs=ys[t])


def factorial_joint(s, ys):
    total, w_prev, x_prev = 0.0, 0, 0
    for t in range(len(ys)):
        w, x = s[2 * t], s[2 * t + 1]
        total += math.log(FTRANS[w_prev, w]) + math.log(FTRANS.flip(0)[x_prev, x])
        total += lp(dist.Normal(w - 2.0 * x, 0.7), ys[t])
        w_prev, x_prev = w, x
    return total


def global_local(y):
    g = pyro.sample("g", dist.Categorical(torch.tensor([0.4, 0.6])))
    with pyro.plate("data", len(y)):
        local = pyro.sample("local", dist.Bernoulli(torch.tensor([0.2, 0.7])[g]))
        pyro.sample("y", dist.Normal(local + g, 0.8), obs=y)


def global_local_joint(s, y):
    g, local = s[0], s[1:]
    total = math.log([0.4, 0.6][g])
    for i, z in enumerate(local):
        total += lp(dist.Bernoulli([0.2, 0.7][g]), float(z))
        total += lp(dist.Normal(z + g, 0.8), y[i])
    return total


EMIT = torch.tensor([[0.2, 0.7], [0.9, 0.4]])  # [state, tone]
NESTED_Y = torch.tensor(
    [[[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]], [[0.0, 1.0], [1.0, 0.0], [1.0, 1.0]]]
)


def nested_chains(ys):
    """A plate of 2 sequences, each a binary chain of 3 steps with a plate of 2 tones."""
    tones = pyro.plate("tones", 2, dim=-1)
    with pyro.plate("sequences", 2, dim=-2):
        x = torch.tensor(0)
        for t in pyro.markov(range(3)):
            x = pyro.sample(f"x_{t}", dist.Bernoulli(Vindex(torch.tensor([0.3, 0.8]))[x.long()]))
            with tones:
                probs = Vindex(EMIT)[x.long(), torch.arange(2)]
                pyro.sample(f"y_{t}", dist.Bernoulli(probs), obs=ys[:, t])


def nested_joint(s):  # (x_0[s0], x_0[s1], x_1[s0], x_1[s1], x_2[s0], x_2[s1])
    total = 0.0
    for seq in range(2):
        prev = 0
        for t in range(3):
            x = s[2 * t + seq]
            total += lp(dist.Bernoulli([0.3, 0.8][prev]), float(x))
            total += lp(dist.Bernoulli(EMIT[x]), NESTED_Y[seq, t])
            prev = x
    return total


# left to right: a state never goes back, so most assignments have no mass (-inf in the
# elimination's tables; logits, as probs of 0 are clamped to a small positive number)
LEFT_RIGHT = torch.tensor([[0.6, 0.3, 0.1], [0.0, 0.7, 0.3], [0.0, 0.0, 1.0]])


def left_right(ys):
    z = 0
    for t in pyro.markov(range(len(ys))):
        z = pyro.sample(f"z_{t}", dist.Categorical(logits=LEFT_RIGHT.log()[z]))
        pyro.sample(f"y_{t}", dist.Normal(LOCS[z], 1.0), obs=ys[t])


def left_right_joint(s):
    total, prev = 0.0, 0
    for t, z in enumerate(s):
        if LEFT_RIGHT[prev, z] == 0:
            return -math.inf
        total += math.log(LEFT_RIGHT[prev, z]) + lp(dist.Normal(LOCS[z], 1.0), YS[t])
        prev = z
    return total


CASES = {
    "hmm": (hmm, (YS,), [3] * 4, hmm_joint, [f"z_{t}" for t in range(4)]),
    "dbn": (
        dbn,
        (YS[:3],),
        [2] * 6,
        lambda s: dbn_joint(s, YS[:3]),
        [f"{c}_{t}" for t in range(3) for c in "ab"],
    ),
    "factorial": (
        factorial,
        (YS[:3],),
        [2] * 6,
        lambda s: factorial_joint(s, YS[:3]),
        [f"{c}_{t}" for t in range(3) for c in "wx"],
    ),
    "global_local": (
        global_local,
        (YS[:3],),
        [2] * 4,
        lambda s: global_local_joint(s, YS[:3]),
        ["g", "local"],
    ),
    "nested_chains": (nested_chains, (NESTED_Y,), [2] * 6, nested_joint, ["x_0", "x_1", "x_2"]),
    "left_right": (left_right, (YS,), [3] * 4, left_right_joint, [f"z_{t}" for t in range(4)]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_draws_follow_the_brute_force_posterior(name):
    model, args, sizes, joint, names = CASES[name]
    fit = sample(model, *args, seed=11)
    assert fit.results[0].method == "ffbs"
    states, probs = enumerate_joint(sizes, joint)
    assert_draws_follow(flatten_draws(fit.get_samples(), names), states, probs)


def test_impossible_values_are_never_drawn():
    """The backward pass reads each site's conditional normalised once per table; a table
    with impossible values (-inf) keeps the check that no draw lands on one, and its
    ``log q`` is the brute-force posterior's log probability of the draw."""
    model, args, sizes, joint, names = CASES["left_right"]
    plan = ffbs.plan_ffbs(EnumOracle(model, args))
    assert not all(bucket.finite for bucket in plan.buckets)
    result = plan.sample(4000, seed=5)
    states, probs = enumerate_joint(sizes, joint)
    log_posterior = dict(zip(states, np.log(np.where(probs > 0, probs, 1.0)), strict=True))
    expected = [log_posterior[tuple(row)] for row in result.samples.tolist()]
    np.testing.assert_allclose(result.log_prob.numpy(), expected, atol=1e-9)
    assert_draws_follow(result.samples.numpy(), states, probs)
    # an assignment of no mass has log q = -inf (not NaN, nor the lowest float)
    impossible = torch.tensor([[0, 1, 0, 0]])
    assert plan.log_prob(impossible).item() == -math.inf


def test_self_check_leaves_out_probes_without_mass(capsys):
    """Uniform probes that neither law gives mass to say nothing: they are left out of the
    self-check (its largest deviation was inf when they joined it) and the summary says so."""
    model, args, *_ = CASES["left_right"]
    fit = sample(model, *args, num_samples=50, seed=0)
    run = fit._run
    assert run.num_probes == 64 and 0 < run.num_massless_probes < 64
    assert math.isfinite(run.max_self_check_error)
    fit.summary()
    out = capsys.readouterr().out
    with_mass = 64 - run.num_massless_probes
    assert f"at {with_mass} of 64 uniformly drawn assignments" in out
    assert f"the other {run.num_massless_probes} have no mass under either law" in out


@pytest.mark.parametrize("name", ["hmm", "dbn"])
def test_auto_picks_ffbs_and_the_engine_agrees(name):
    model, args, sizes, joint, names = CASES[name]
    auto = sample(model, *args, num_samples=3000, seed=3, sampler="auto", num_chains=2)
    assert [r.method for r in auto.results] == ["ffbs", "ffbs"]
    engine = sample(model, *args, num_samples=3000, seed=3, sampler="engine")
    assert engine.results[0].method == "autospec"
    states, probs = enumerate_joint(sizes, joint)
    assert_draws_follow(flatten_draws(auto.get_samples(), names), states, probs)
    assert_draws_follow(flatten_draws(engine.get_samples(), names), states, probs)
    # the same posterior: the log normaliser lp - log q agrees between the two samplers
    a, e = auto.get_extra_fields(), engine.get_extra_fields()
    np.testing.assert_allclose(
        (a["lp"] - a["oracle_log_prob"]).numpy(),
        (e["lp"] - e["oracle_log_prob"])[0].item(),
        atol=1e-4,
    )


def test_method_is_recorded_everywhere(capsys):
    fit = sample(hmm, YS, num_samples=20, sampler="auto")
    assert fit.diagnostics()["sampler"] == "ffbs"
    extra = fit.get_extra_fields()
    assert set(extra) == {"sample_rounds", "oracle_rows_per_draw", "lp", "oracle_log_prob"}
    assert (extra["sample_rounds"] == 4).all() and (extra["oracle_rows_per_draw"] == 0).all()
    fit.summary()
    out = capsys.readouterr().out
    assert "forward filtering, backward sampling" in out and "Self-check passed" in out
    assert fit.to_inference_data().posterior.attrs["sampler"] == "ffbs"
    engine = sample(hmm, YS, num_samples=20, sampler="engine")
    assert engine.diagnostics()["sampler"] == "autospec"


def test_self_check_runs_on_every_draw(monkeypatch):
    original = ffbs.FFBSPlan.sample

    def one_bad_draw(self, num_draws, seed, chunk_size=None):
        result = original(self, num_draws, seed, chunk_size)
        result.log_prob[num_draws - 1] += 1e-3  # the last draw only
        return result

    monkeypatch.setattr(ffbs.FFBSPlan, "sample", one_bad_draw)
    with pytest.raises(SelfCheckError, match="NOT exact"):
        sample(hmm, YS, num_samples=50)


@pytest.mark.parametrize("name", sorted(CASES))
def test_draws_do_not_depend_on_the_chunks(name):
    """The backward pass runs a chunk of draws at a time (its tables then hold one chunk's,
    whatever the number of draws); each draw reads the uniforms of its own index, so the
    draws and their ``log q`` are the same bit for bit in any chunks."""
    from pyro_autospec.model.enum import EnumOracle

    model, args, *_ = CASES[name]
    plan = ffbs.plan_ffbs(EnumOracle(model, args))
    whole = plan.sample(50, seed=4)
    for chunk_size in (1, 7, 49):
        chunked = plan.sample(50, seed=4, chunk_size=chunk_size)
        assert torch.equal(chunked.samples, whole.samples)
        assert torch.equal(chunked.log_prob, whole.log_prob)


def test_seed_reproduces_and_chains_differ():
    one = sample(dbn, YS, num_samples=40, num_chains=2, seed=5)
    two = sample(dbn, YS, num_samples=40, num_chains=2, seed=5)
    grouped = one.get_samples(group_by_chain=True)
    assert torch.equal(grouped["a_0"], two.get_samples(group_by_chain=True)["a_0"])
    assert not torch.equal(one.results[0].samples, one.results[1].samples)


def test_a_bucket_too_large_goes_to_the_engine(monkeypatch):
    """The default falls back to the engine and says so (it did silently: an outside test's
    densely coupled model went from 12.6 s to more than 100 s without a word)."""
    monkeypatch.setattr(ffbs, "MAX_BUCKET_ENTRIES", 4)  # the HMM's buckets hold 9 or 3 entries
    with pytest.warns(UserWarning, match=r"does not fit this model: eliminating site '\w+' "):
        fit = sample(hmm, YS, num_samples=10, sampler="auto")
    assert fit.results[0].method == "autospec"
    with pytest.raises(ValueError, match="sampler='ffbs' needs an elimination"):
        sample(hmm, YS, num_samples=10, sampler="ffbs")


def star(y):
    """A global site sampled first, then five sites that each share a factor with it."""
    g = pyro.sample("g", dist.Bernoulli(0.4))
    for i in range(5):
        z = pyro.sample(f"z{i}", dist.Bernoulli(0.3 + 0.4 * g))
        pyro.sample(f"y{i}", dist.Normal(z + g, 0.8), obs=y[i])


STAR_Y = torch.tensor([0.2, 1.9, 1.1, -0.4, 0.8])


def star_joint(s):
    g, zs = s[0], s[1:]
    total = lp(dist.Bernoulli(0.4), float(g))
    for i, z in enumerate(zs):
        total += lp(dist.Bernoulli(0.3 + 0.4 * g), float(z))
        total += lp(dist.Normal(z + g, 0.8), STAR_Y[i])
    return total


def test_greedy_order_eliminates_a_global_site_last(monkeypatch):
    # in trace order the global site's bucket would hold all six sites (64 entries)
    monkeypatch.setattr(ffbs, "MAX_BUCKET_ENTRIES", 4)
    fit = sample(star, STAR_Y, seed=4)
    assert fit.results[0].method == "ffbs"
    states, probs = enumerate_joint([2] * 6, star_joint)
    draws = flatten_draws(fit.get_samples(), ["g"] + [f"z{i}" for i in range(5)])
    assert_draws_follow(draws, states, probs)


def test_engine_methods_and_guides_keep_the_engine():
    assert sample(hmm, YS, num_samples=10, sampler="auto", method="agr24").results[0].method == (
        "agr24"
    )
    with pytest.raises(ValueError, match="sampler must be one of"):
        AutoSpec(hmm, num_samples=10, sampler="gibbs")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_ffbs_on_cuda():
    trans, locs = TRANS.cuda(), LOCS.cuda()

    def model(ys):
        z = 0
        for t in pyro.markov(range(len(ys))):
            z = pyro.sample(f"z_{t}", dist.Categorical(trans[z]))
            pyro.sample(f"y_{t}", dist.Normal(locs[z], 1.0), obs=ys[t])

    fit = sample(model, YS.cuda(), num_samples=6000, seed=2, device="cuda")
    assert fit.results[0].method == "ffbs"
    samples = fit.get_samples()
    assert samples["z_0"].device.type == "cuda"
    states, probs = enumerate_joint([3] * 4, hmm_joint)
    names = [f"z_{t}" for t in range(4)]
    cpu = {k: v.cpu() for k, v in samples.items()}
    assert_draws_follow(flatten_draws(cpu, names), states, probs)
    auto = sample(model, YS.cuda(), num_samples=10, sampler="auto", device="cuda")
    assert auto.results[0].method == "autospec"  # on a GPU "auto" keeps the engine


@pytest.mark.parametrize("steps, num_samples, traces", [(4, 64, 5), (40, 64, 4), (40, 1, 4)])
def test_a_discrete_run_traces_the_model_a_fixed_number_of_times(steps, num_samples, traces):
    calls = []

    def counted(ys):
        calls.append(1)
        hmm(ys)

    ys = torch.randn(steps, generator=torch.Generator().manual_seed(0))
    fit = sample(counted, ys, num_samples=num_samples, sampler="auto")
    # two structure traces, the enumerated trace, the batched evaluation of the draws (with
    # the self-check's 64 uniform probes, and the extra draws of a run of fewer than 64, in
    # the same batch); a small markov model (supports' product at most 2^20) once more, with
    # a tensor dim per site, to find a site that reads further back than its history; and
    # ALONE_CHECKS draws of the batch each in its own shapes, in one run under
    # torch.func.vmap, to find a model that mixes the draws of a batch, but the first and
    # the one most unlike it, traced alone (the structure traces, evaluated in the batch
    # too, add two assignments seen alone at no cost)
    assert len(calls) == traces + ALWAYS_ALONE + 1
    assert fit._run.num_check_draws == 64 - num_samples and fit._run.num_probes == 64


def test_log_prob_reads_the_sampled_law_at_any_assignment():
    """``FFBSPlan.log_prob`` is the law ``sample`` draws from, read at given assignments: the
    draws' own ``log_prob`` bit for bit, and ``log p(x, data) - log Z`` by brute force at
    every assignment of a two-chain model (the self-check's uniform probes read it)."""
    from pyro_autospec.model.enum import EnumOracle

    ys = torch.tensor([0.4, 2.2, 1.1])
    plan = ffbs.plan_ffbs(EnumOracle(dbn, (ys,)))
    drawn = plan.sample(40, seed=3)
    assert torch.equal(plan.log_prob(drawn.samples), drawn.log_prob)
    states = torch.tensor(list(np.ndindex(*([2] * 6))))  # coordinates a_0, b_0, a_1, ...
    log_joint = torch.tensor(
        [dbn_joint(tuple(s.tolist()), ys) for s in states], dtype=torch.float64
    )
    log_z = torch.logsumexp(log_joint, 0)
    expected = log_joint - log_z
    assert torch.allclose(plan.log_prob(states), expected, atol=1e-5, rtol=0)


def test_a_family_plan_draws_each_target_given_its_continuous_values():
    """A mixed model's discrete sites given each continuous draw (a family of targets, one
    per draw) are eliminated in one pass with the targets as a first plate: each target's
    draws follow its own posterior (chi-square against brute force), and ``log Z`` and
    ``log q`` agree with the oracle's."""

    def model(y):
        locs = pyro.sample("locs", dist.Normal(torch.zeros(2), 2.0).to_event(1))
        w = pyro.sample("w", dist.Bernoulli(0.3))  # a site outside the plate
        with pyro.plate("n", len(y)):
            z = pyro.sample("z", dist.Bernoulli(0.2 + 0.6 * w))
            pyro.sample("y", dist.Normal(Vindex(locs)[..., z.long()], 1.0), obs=y)

    y = torch.tensor([0.5, -1.0, 2.0])
    targets = torch.tensor([[-1.0, 1.0], [0.5, 2.5]])
    reps = 20000
    oracle = EnumOracle(model, (y,), continuous_values={"locs": targets.repeat_interleave(reps, 0)})
    plan = ffbs.plan_ffbs(oracle)
    assert plan is not None and plan.family
    result = plan.sample(2 * reps, seed=3)
    assert result.samples.shape == (2 * reps, 4)
    torch.testing.assert_close(plan.log_normalizer, oracle.log_normalizer().double())
    torch.testing.assert_close(plan.log_prob(result.samples), result.log_prob)
    with pytest.raises(ValueError, match="family of 40000 targets"):
        plan.sample(3, seed=0)
    for k, locs in enumerate(targets):

        def joint(state, locs=locs):
            w, z = state[0], state[1:]
            total = math.log(0.3 if w else 0.7)
            for zi, yi in zip(z, y, strict=True):
                p = 0.2 + 0.6 * w
                total += math.log(p if zi else 1 - p)
                total += float(dist.Normal(locs[zi], 1.0).log_prob(yi))
            return total

        states, probs = enumerate_joint([2, 2, 2, 2], joint)
        assert_draws_follow(result.samples[k * reps : (k + 1) * reps].numpy(), states, probs)
