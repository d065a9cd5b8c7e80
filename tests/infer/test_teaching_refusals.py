"""Refusals that teach: each names the site or plate, the cause and a way out (issue 32)."""

import math
import random
import warnings

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine
from pyro.infer import MCMC
from pyro.ops.indexing import Vindex
from torch.distributions import constraints

from pyro_autospec.infer import (
    AutoSpec,
    AutoSpecKernel,
    AutoSpecModelError,
    IntractableEnumerationError,
    MixedDrawsError,
    SelfCheckError,
    UnsupportedSiteError,
)
from pyro_autospec.model import DynamicStructureError, enumerate_posterior
from pyro_autospec.model.enum import EnumOracle
from pyro_autospec.model.log_joint import evaluate
from pyro_autospec.model.randomness import HiddenRandomnessError
from tests.catalogue.brute_force import assert_draws_follow, enumerate_joint, flatten_draws, lp


def run(model, *args, **kwargs):
    kwargs.setdefault("num_samples", 2)
    return AutoSpec(model, disable_progbar=True, **kwargs).run(*args)


def test_more_sites_than_tensor_dims_points_to_a_guide():
    def star():  # 70 sites each coupled to the first: every one keeps its own dim
        root = pyro.sample("x_0", dist.Bernoulli(0.5))
        for i in range(1, 70):
            x = pyro.sample(f"x_{i}", dist.Bernoulli(0.5))
            pyro.factor(f"f_{i}", 0.3 * (2 * root - 1) * (2 * x - 1))

    with pytest.raises(IntractableEnumerationError) as info:
        EnumOracle(star)
    text = str(info.value)
    assert "70 discrete latent sites" in text and "'x_0'" in text
    assert "own tensor dim" in text and "64 dims" in text
    assert "guide=guide" in text and "AnyOrderGuide" in text
    assert "control flow" not in text and "reduce a sampled value" not in text


@pytest.mark.parametrize("num_sites", [27, 40])
def test_a_term_coupling_too_many_sites_is_refused_before_it_is_built(num_sites):
    """Thirty Bernoulli sites summed into one likelihood make a term of 2^30 entries under
    enumeration (a dim per site): it is refused as intractable, naming the limit, before the
    model's run allocates it (27 sites raised torch's own einsum error after 4 GB; 30 this
    error after 8.6 GB; 70 were killed for memory)."""

    def summed(y):
        zs = [pyro.sample(f"z{i}", dist.Bernoulli(0.5)) for i in range(num_sites)]
        pyro.sample("y", dist.Normal(sum(zs), 1.0), obs=y)

    with pytest.raises(IntractableEnumerationError) as info:
        run(summed, torch.tensor(3.0))
    text = str(info.value)
    assert "a term of the model under enumeration" in text
    assert f"computed after site 'z{num_sites - 1}'" in text
    # the running sum is refused once it spans 27 sites
    assert "about 2^27.0; the limit is 2^26" in text and "AnyOrderGuide" in text


def ising_one_plated_site():
    """An Ising grid as one plated site, its coupling summed with keepdim=True."""
    with pyro.plate("rows", 4, dim=-2), pyro.plate("cols", 4, dim=-1):
        x = pyro.sample("x", dist.Bernoulli(0.5))
    s = 2 * x - 1
    down = (s[..., 1:, :] * s[..., :-1, :]).sum((-1, -2), keepdim=True)
    right = (s[..., :, 1:] * s[..., :, :-1]).sum((-1, -2), keepdim=True)
    pyro.factor("coupling", 0.4 * (down + right))


def test_coupling_inside_one_plated_site_names_the_cause():
    with pytest.raises(IntractableEnumerationError) as info:
        run(ising_one_plated_site)
    text = str(info.value)
    assert "Site 'coupling' lies outside plate(s) 'rows', 'cols'" in text
    assert "discrete site 'x'" in text and "couples the elements of one plate" in text
    assert "guide=guide" in text
    assert "log q(x)" not in text and "Please report" not in text


def unsqueezed_parameter(y):
    c = pyro.sample("c", dist.Bernoulli(0.5)).long()
    with pyro.plate("n", len(y)):
        probs = Vindex(torch.tensor([0.2, 0.7]))[c].unsqueeze(-1)  # a dim of its own
        k = pyro.sample("k", dist.Binomial(torch.full((len(y),), 5.0), probs))
        pyro.sample("y", dist.Normal(k, 1.0), obs=y)


def test_a_parameter_given_a_dim_of_its_own_is_named_as_a_cause():
    """Not only a reduction over a plate (found outside the project: that was all it said)."""
    with pytest.raises(DynamicStructureError, match=r"a dim of its own \(x.unsqueeze\(-1\)"):
        run(unsqueezed_parameter, torch.tensor([1.0, 4.0, 2.0, 3.3]))


def second_order_chain(history):
    def model():
        before, last = torch.tensor(0.0), torch.tensor(0.0)
        for t in pyro.markov(range(5), history=history):
            x = pyro.sample(f"x_{t}", dist.Bernoulli(0.2 + 0.3 * before + 0.4 * last))
            before, last = last, x

    return model


def test_dependence_past_the_markov_history_names_the_sites():
    with pytest.raises(AutoSpecModelError) as info:
        EnumOracle(second_order_chain(history=1))
    text = str(info.value)
    assert "Site 'x_2' depends on site 'x_0'" in text
    assert "pyro.markov history" in text and "history=2" in text
    assert "Please report" not in text
    # with the history the model needs, the oracle is exact
    oracle = EnumOracle(second_order_chain(history=2))
    states, log_prob = enumerate_posterior(second_order_chain(history=2))
    values = torch.zeros(2, 5, dtype=torch.long)
    mask = torch.zeros(2, 5, dtype=torch.bool)
    marginals = oracle.log_marginals(values, mask)[0].exp()
    for i in range(5):
        expected = log_prob.exp()[states[:, i] == 1].sum()
        assert abs(float(marginals[i, 1]) - float(expected)) < 1e-10


RING_DATA = torch.tensor([0.1, 1.2, 0.9, -0.3, 1.5])


def ring_log_joint(x: tuple) -> float:
    """The ring's log joint, written by hand."""
    total = sum(lp(dist.Normal(float(v), 0.7), RING_DATA[t]) for t, v in enumerate(x))
    total += sum(1.0 * (x[t] == x[t - 1]) for t in range(1, 5)) + 2.0 * (x[0] == x[4])
    return total


def ring(history):
    """A chain whose last step closes a ring with a factor reading ``x_0``: ``history`` must
    reach back 4 steps. An observation reads each step."""
    ys = RING_DATA

    def model():
        xs = []
        for t in pyro.markov(range(5), history=history):
            x = pyro.sample(f"x_{t}", dist.Bernoulli(0.5))
            pyro.sample(f"y_{t}", dist.Normal(x, 0.7), obs=ys[t])
            if t > 0:
                pyro.factor(f"c_{t}", 1.0 * (x == xs[-1]).float())
            if t == 4:
                pyro.factor("ring", 2.0 * (xs[0] == x).float())
            xs.append(x)

    return model


@pytest.mark.parametrize("num_samples", [1, 2, 400])
def test_a_factor_reading_past_the_markov_history_is_refused_before_any_draw(num_samples):
    """The factor's log density shows the read in no shape (``x_0``'s dim now holds a later
    site, read on the diagonal): the draws followed another law, and the self-check caught it
    only on the draws where the two laws differ (about half of one-draw runs passed)."""
    with pytest.raises(AutoSpecModelError) as info:
        AutoSpec(ring(history=1), num_samples, seed=0, disable_progbar=True).run()
    text = str(info.value)
    assert "Site 'ring' reads site 'x_0'" in text and "history=h" in text
    assert "Please report" not in text


def test_a_factor_after_the_markov_loop_reading_inside_it_is_named_as_such():
    """Its tensor does not pack; the message led with unsqueeze and Poisson, which the model
    does not use (an outside test)."""

    def model():
        xs = []
        for t in pyro.markov(range(4)):
            xs.append(pyro.sample(f"x_{t}", dist.Bernoulli(0.5)))
        pyro.factor("ring", 2.0 * (xs[0] == xs[-1]).float())

    with pytest.raises(DynamicStructureError) as info:
        AutoSpec(model, 10, seed=0, disable_progbar=True).run()
    text = str(info.value)
    assert "'ring' comes after a pyro.markov loop" in text and "history" in text
    assert "Poisson" not in text


def test_a_factor_within_the_markov_history_samples_the_ring_exactly():
    fit = AutoSpec(ring(history=4), 3000, seed=0, disable_progbar=True).run()
    states, probs = enumerate_joint([2] * 5, ring_log_joint)
    names = [f"x_{t}" for t in range(5)]
    assert_draws_follow(flatten_draws(fit.get_samples(), names), states, probs)


def test_map_refuses_what_a_run_refuses():
    """``map`` compiles the model as a run does: Pyro's max-product pass alone decodes the
    second-order chain under ``history=1`` silently wrong."""
    with pytest.raises(AutoSpecModelError, match="further back than its pyro.markov history"):
        AutoSpec(second_order_chain(history=1), 1).map()


def sibling_markov_steps():
    """One ``with pyro.markov():`` per step: sibling contexts that reuse one enumeration dim."""
    x = torch.tensor(0)
    for t in range(4):
        with pyro.markov():
            x = pyro.sample(f"x_{t}", dist.Categorical(torch.tensor([[0.7, 0.2, 0.1]] * 3)[x]))
            pyro.sample(f"y_{t}", dist.Normal(x.float(), 0.7), obs=torch.tensor(1.0))


def test_an_assert_inside_pyro_under_enumeration_names_the_markov_contexts():
    with pytest.raises(AutoSpecModelError) as info:
        AutoSpec(sibling_markov_steps, 10, seed=0, disable_progbar=True).run()
    text = str(info.value)
    assert "not in the model's code" in text and "for t in pyro.markov(range(T))" in text


def impossible_data(y):
    """``y = 5`` lies outside ``Uniform(0, z + 1)`` for both values of ``z``."""
    with pyro.plate("n", len(y)):
        z = pyro.sample("z", dist.Categorical(torch.tensor([0.5, 0.5])))
        pyro.sample("y", dist.Uniform(0.0, z.float() + 1.0, validate_args=False), obs=y)


@pytest.mark.parametrize("sampler", ["auto", "engine"])
def test_data_of_probability_zero_are_refused_as_such(sampler):
    y = torch.tensor([0.5, 5.0, 1.5])
    fit = AutoSpec(impossible_data, 10, seed=0, disable_progbar=True, sampler=sampler)
    with pytest.raises(AutoSpecModelError, match="data have probability zero"):
        fit.run(y)
    with pytest.raises(AutoSpecModelError, match="data have probability zero"):
        fit.map(y)
    AutoSpec(impossible_data, 10, seed=0, disable_progbar=True).run(torch.tensor([0.5, 1.5]))


def scale_depends_on_z(y):
    z = pyro.sample("z", dist.Bernoulli(0.5))
    scale = pyro.sample("scale", dist.LogNormal(z, 1.0))
    with pyro.plate("data", len(y)):
        pyro.sample("y", dist.Normal(0.0, scale), obs=y)


def test_continuous_site_depending_on_a_discrete_one_is_refused_before_nuts(monkeypatch):
    import pyro_autospec.infer.mixed_run as mixed_run

    def no_nuts(*args, **kwargs):
        raise AssertionError("NUTS started")

    monkeypatch.setattr(mixed_run, "MCMC", no_nuts)
    with pytest.raises(UnsupportedSiteError) as info:
        run(scale_depends_on_z, torch.randn(10), warmup_steps=5)
    text = str(info.value)
    assert "Site 'scale' (continuous, LogNormal)" in text
    assert "depends on the discrete site(s) 'z'" in text and "Vindex" in text
    assert "expected (M,)" not in text


def loc_depends_on_z_then_expanded(y):
    z = pyro.sample("z", dist.Bernoulli(0.5))
    loc = pyro.sample("loc", dist.Normal(3.0 * z, 1.0))
    pyro.sample("y", dist.Normal(loc, 1.0).expand([len(y)]).to_event(1), obs=y)


def test_the_refusal_stands_where_a_later_site_fails_under_enumeration(monkeypatch):
    """An observation expanded to the data's shape fails under enumeration once its loc reads
    z (Pyro's own NUTS fails there too): the refusal of 'loc' came only with the plate form
    and this form gave torch's expand error from inside NUTS (found by an outside user). The
    sites traced before the failure are read, so the refusal comes before NUTS."""
    import pyro_autospec.infer.mixed_run as mixed_run

    def no_nuts(*args, **kwargs):
        raise AssertionError("NUTS started")

    monkeypatch.setattr(mixed_run, "MCMC", no_nuts)
    with pytest.raises(UnsupportedSiteError, match=r"Site 'loc' \(continuous, Normal\) has a"):
        run(loc_depends_on_z_then_expanded, torch.tensor([0.3, -1.0, 2.0]), warmup_steps=5)


def masked_continuous_observation(y):
    with pyro.plate("n", 5):
        z = pyro.sample("z", dist.Bernoulli(0.3))
        mask = torch.tensor([True, False, True, True, False])
        pyro.sample("y", dist.Normal(2.0 * z - 0.5, 0.8), obs=y, obs_mask=mask)


def test_obs_mask_on_a_continuous_observation_names_the_observation_and_the_fix():
    """Pyro turns the hidden entries into a latent site 'y_unobserved' the user never wrote:
    the refusal names the observation, ``obs_mask`` and ``poutine.mask``."""
    with pytest.raises(UnsupportedSiteError) as info:
        run(masked_continuous_observation, torch.randn(5), warmup_steps=5)
    text = str(info.value)
    assert "the observation 'y' that its `obs_mask` hides" in text
    assert "poutine.mask" in text and "Vindex" not in text


def test_to_event_on_a_discrete_site_says_why_it_is_not_enumerated():
    def model():
        pyro.sample("z", dist.Bernoulli(0.5 * torch.ones(3)).to_event(1))

    with pytest.raises(UnsupportedSiteError) as info:
        run(model)
    text = str(info.value)
    assert "`.to_event()` makes its elements one joint event" in text
    assert "no finite enumerable support" not in text and "pyro.plate" in text
    assert "Poisson" not in text  # advice for kinds that are not enumerable does not apply


COUNTS = torch.tensor([2.0, 3.0])


def counts_with_their_own_totals(written_as_advised):
    def model(y):
        with pyro.plate("p", 2):
            if written_as_advised:
                logits = dist.Binomial(
                    COUNTS.unsqueeze(-1), torch.tensor(0.4).unsqueeze(-1), validate_args=False
                ).log_prob(torch.arange(4.0))
                n = pyro.sample("n", dist.Categorical(logits=logits)).float()
            else:
                n = pyro.sample("n", dist.Binomial(COUNTS, 0.4))
            pyro.sample("y", dist.Normal(n, 1.0), obs=y)

    return model


def test_a_binomial_whose_elements_have_their_own_totals_is_refused_with_a_rewrite():
    y = torch.tensor([2.0, 0.5])
    with pytest.raises(UnsupportedSiteError) as info:
        run(counts_with_their_own_totals(written_as_advised=False), y)
    text = str(info.value)
    assert "different total_count" in text and "Categorical over 0..max(total_count)" in text
    # the rewrite the message gives runs, and is exact (brute force, by hand)
    fit = AutoSpec(counts_with_their_own_totals(True), 3000, seed=0, disable_progbar=True)
    fit.run(y)

    def log_joint(x):
        binomial = dist.Binomial(COUNTS, 0.4, validate_args=False)
        prior = binomial.log_prob(torch.tensor(x, dtype=torch.float))
        if not torch.isfinite(prior).all():
            return -math.inf
        return float(prior.sum()) + sum(
            lp(dist.Normal(float(k), 1.0), y[i]) for i, k in enumerate(x)
        )

    states, probs = enumerate_joint([4, 4], log_joint)
    assert_draws_follow(flatten_draws(fit.get_samples(), ["n"]), states, probs)


def test_plate_without_a_size_says_so():
    def model(y):
        p = pyro.sample("z", dist.Bernoulli(0.5))
        with pyro.plate("data"):
            pyro.sample("y", dist.Normal(p, 1.0), obs=y)

    with pytest.raises(AutoSpecModelError) as info:
        run(model, torch.randn(5))
    text = str(info.value)
    assert "Plate 'data' (around site 'y') has no size" in text
    assert "pyro.plate('data', 5)" in text
    assert "no `pyro.plate` declares" not in text and "keepdim" not in text


def plate_sum_into_another_plate(y):
    z = pyro.sample("z", dist.Categorical(torch.ones(3) / 3))
    with pyro.plate("pa", 2):
        a = pyro.sample("a", dist.Bernoulli(0.2 + 0.3 * (z == 1).float()))
    with pyro.plate("pb", 3):
        b = pyro.sample("b", dist.Bernoulli(0.5))
        pyro.sample("y", dist.Normal(a.sum(-1) + b, 1.0), obs=y)


def test_plate_sum_fed_into_another_plate_names_the_sites():
    with pytest.raises(IntractableEnumerationError) as info:
        run(plate_sum_into_another_plate, torch.zeros(3))
    text = str(info.value)
    assert "Site 'y' has a log density of the wrong shape under enumeration" in text
    assert "discrete site(s) 'a'" in text and "a.sum(-1)" in text and "guide=guide" in text
    assert "einsum" not in text and "broadcast a dimension" not in text


def test_observation_wider_than_its_plate_names_the_dim():
    def model():
        with pyro.plate("data", 5):
            z = pyro.sample("z", dist.Bernoulli(0.5))
            pyro.sample("y", dist.Normal(z, 1.0), obs=torch.zeros(2, 5))

    with pytest.raises(AutoSpecModelError) as info:
        run(model)
    text = str(info.value)
    assert "Observed site 'y' inside plate(s) 'data' (5, dim -1)" in text
    assert "shape (2, 5)" in text and "dim -2 of size 2" in text
    assert "pyro.plate('...', 2, dim=-2)" in text
    assert "must match the size" not in text


def test_a_discrete_value_given_a_new_dim_keeps_the_shapes_pyro_names():
    """A global discrete site unsqueezed before a plate breaks Pyro's packing of enumerated
    tensors: the message keeps Pyro's shapes and names the new dim, not control flow."""

    def model(y):
        n = pyro.sample("n", dist.Categorical(torch.ones(4) / 4))
        with pyro.plate("obs", len(y)):
            pyro.sample("y", dist.Poisson(n.float().unsqueeze(-1) + 0.5), obs=y)

    with pytest.raises(DynamicStructureError) as info:
        run(model, torch.tensor([2.0, 3.0, 1.0]))
    text = str(info.value)
    assert "Site 'y' has a tensor of shape (4, 1, 1, 3)" in text
    assert "only dims -3, -2, -1" in text and "unsqueeze(-1)" in text
    assert "control flow" not in text


def noisy_bits(y):
    with pyro.plate("data", len(y)):
        z = pyro.sample("z", dist.Bernoulli(0.5))
        pyro.sample("y", dist.Normal(z, 1.0), obs=y)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_data_blames_the_data_and_the_site(bad):
    with pytest.raises(AutoSpecModelError) as info:
        run(noisy_bits, torch.tensor([0.0, bad, 1.0]))
    text = str(info.value)
    assert "The data of observed site 'y' hold 1 value(s) that are not finite" in text
    assert "index (1,)" in text and "poutine.mask(mask=torch.isfinite(y))" in text
    assert "oracle" not in text and "Binomial" not in text


def test_an_observed_python_number_is_refused_as_such():
    """Found by an outside user: ``obs=0.3`` crashed inside the library with an
    AttributeError; Pyro's distributions score tensors only."""

    def model(y):
        z = pyro.sample("z", dist.Bernoulli(0.5))
        pyro.sample("y", dist.Normal(z, 1.0), obs=y)

    with pytest.raises(AutoSpecModelError, match="Site 'y' observes a float .* not a tensor"):
        run(model, 0.3)


@pytest.mark.parametrize("sampler", ["auto", "engine"])
def test_a_nan_log_density_names_the_site(sampler):
    """Found by an outside user: Bernoulli logits of +-inf give NaN log densities, which the
    run reported as a fault of an oracle the user never wrote."""

    def model(y):
        with pyro.plate("p", 3):
            logits = torch.tensor([-float("inf"), 0.0, float("inf")])
            z = pyro.sample("z", dist.Bernoulli(logits=logits))
            pyro.sample("y", dist.Normal(z, 1.0), obs=y)

    with pytest.raises(AutoSpecModelError, match="site\\(s\\) 'z' is NaN .* logits of \\+inf"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run(model, torch.tensor([0.3, 1.2, -0.5]), sampler=sampler)


@pytest.mark.parametrize("sampler", ["auto", "engine"])
def test_an_infinite_density_names_the_site(sampler):
    """An observation where its density is +inf for one value of a discrete site (y = 0 at a
    Beta(0.5, 1)): the run blamed an oracle the user never wrote (an outside test)."""

    def model(y):
        z = pyro.sample("z", dist.Categorical(torch.ones(3) / 3))
        pyro.sample("y", dist.Beta(torch.tensor([0.5, 1.0, 2.0])[z], 1.0), obs=y)

    with pytest.raises(AutoSpecModelError, match="site\\(s\\) 'y' is NaN or \\+inf .* Beta"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run(model, torch.tensor(0.0), sampler=sampler)


def test_sites_named_like_arviz_dimensions_are_refused_by_to_inference_data():
    """ArviZ drops a variable named ``chain`` or ``draw`` without a word (outside user)."""

    def model(y):
        c = pyro.sample("chain", dist.Bernoulli(0.5))
        pyro.sample("y", dist.Normal(c, 1.0), obs=y)

    fit = run(model, torch.tensor(1.0), num_samples=5)
    assert "chain" in fit.get_samples()
    with pytest.raises(ValueError, match="named 'chain' cannot go into ArviZ data"):
        fit.to_inference_data()


def test_masked_non_finite_data_are_accepted():
    def masked(y):
        with pyro.plate("data", len(y)):
            z = pyro.sample("z", dist.Bernoulli(0.5))
            with pyro.poutine.mask(mask=torch.isfinite(y)):
                pyro.sample("y", dist.Normal(z, 1.0), obs=torch.nan_to_num(y, nan=0.0))

    fit = run(masked, torch.tensor([0.0, float("nan"), 1.0]), num_samples=4)
    assert fit.get_samples()["z"].shape == (4, 3)


def test_shape_assert_failing_on_the_extra_batch_dims_explains_them():
    def model():
        z = pyro.sample("z", dist.Bernoulli(0.5))
        w = pyro.sample("w", dist.Bernoulli(0.3 + 0.4 * z))
        assert w.dim() <= 2, f"w has shape {tuple(w.shape)}"  # holds under Pyro's enumeration
        pyro.sample("y", dist.Normal(w, 1.0), obs=torch.tensor(1.0))

    with pytest.raises(AutoSpecModelError) as info:
        run(model)
    text = str(info.value)
    assert "The model raised AssertionError (w has shape" in text and "after site 'w'" in text
    assert "extra batch dims" in text and "x.shape[-k:]" in text and "README" in text


class FlatLoc(dist.TorchDistribution):
    """A user's distribution whose log_prob is written for one draw: it flattens its loc."""

    arg_constraints = {}
    support = dist.constraints.real

    def __init__(self, loc):
        self.loc = loc
        super().__init__(batch_shape=loc.shape)

    def log_prob(self, value):
        return -0.5 * (value - self.loc.reshape(-1)) ** 2


class SummedLoc(FlatLoc):
    """Another whose log_prob returns the wrong shape (it sums the batch dims away)."""

    def log_prob(self, value):
        return (-0.5 * (value - self.loc) ** 2).sum()


def flat_loc_model(y):
    with pyro.plate("data", 3):
        z = pyro.sample("z", dist.Bernoulli(0.5))
        pyro.sample("y", FlatLoc(2.0 * z), obs=y)


def summed_loc_model(y):
    z = pyro.sample("z", dist.Bernoulli(0.5))
    pyro.sample("y", SummedLoc(2.0 * z), obs=y)


@pytest.mark.parametrize(
    "model, y, kind, what",
    [
        (flat_loc_model, torch.tensor([0.0, 2.0, 2.0]), "FlatLoc", "raised"),
        (summed_loc_model, torch.tensor(1.0), "SummedLoc", "returned shape"),
    ],
)
def test_custom_log_prob_that_does_not_broadcast_names_the_distribution(model, y, kind, what):
    with pytest.raises(AutoSpecModelError) as info:
        run(model, y)
    text = str(info.value)
    assert f"Site 'y': the log_prob of its distribution {kind}" in text and what in text
    assert "must broadcast over leading batch dims" in text
    assert "control flow" not in text and "reduce a sampled value" not in text


def plated_components(data):
    weights = pyro.sample("weights", dist.Dirichlet(torch.ones(3)))
    with pyro.plate("components", 3):
        locs = pyro.sample("locs", dist.Normal(0.0, 5.0))
    with pyro.plate("data", len(data)):
        z = pyro.sample("z", dist.Categorical(weights))
        pyro.sample("obs", dist.Normal(Vindex(locs)[..., z], 1.0), obs=data)


def vector_components(data):
    weights = pyro.sample("weights", dist.Dirichlet(torch.ones(3)))
    locs = pyro.sample("locs", dist.Normal(0.0, 5.0).expand([3]).to_event(1))
    with pyro.plate("data", len(data)):
        z = pyro.sample("z", dist.Categorical(weights))
        pyro.sample("obs", dist.Normal(Vindex(locs)[..., z], 1.0), obs=data)


def test_mixture_plates_sharing_a_dim_are_named_in_the_warning():
    data = torch.tensor([-1.0, 0.5, 2.0, 3.0, -2.5])
    draws = {"weights": torch.full((4, 3), 1 / 3), "locs": torch.randn(4, 3)}
    with pytest.warns(UserWarning) as record:
        EnumOracle(plated_components, (data,), continuous_values=draws)
    text = " ".join(str(w.message) for w in record)
    assert "'locs' lives in plate 'components' (dim -1)" in text
    assert "plate 'data' of site 'z'" in text and ".to_event(1)" in text
    assert "index with Vindex" not in text  # the model already does
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the advised form batches: no warning
        EnumOracle(vector_components, (data,), continuous_values=draws)


def test_plate_sum_without_enumeration_mismatch_names_the_plate_and_the_fix():
    def model():
        z = pyro.sample("z", dist.Bernoulli(0.5))
        with pyro.plate("pa", 2):
            a = pyro.sample("a", dist.Bernoulli(0.3 + 0.4 * z))
        with pyro.plate("pb", 3):
            pyro.sample("y", dist.Normal(a.sum(-1), 1.0), obs=torch.zeros(3))

    with pytest.raises(AutoSpecModelError) as info:
        run(model)
    text = str(info.value)
    assert "Site 'y' has at dim -1, the dim of plate 'pb', a size other than the plate's" in text
    assert "a.sum(-1)" in text and "Binomial" in text


def test_an_error_of_the_model_in_a_plain_run_is_passed_on_with_a_note():
    def model():  # the assert holds only under Pyro's sequential enumeration (expand=False)
        with pyro.plate("plate", 2):
            x = pyro.sample("x", dist.Bernoulli(0.5))
            pyro.sample("y", dist.Bernoulli(0.5))
            assert x.shape == (1,)

    with pytest.raises(AssertionError) as info:  # the model's own error, its type unchanged
        run(model)
    notes = " ".join(getattr(info.value, "__notes__", []))
    if hasattr(info.value, "add_note"):  # Python 3.11+
        assert "after site 'y' in a plain run of Pyro" in notes and "AutoSpec" in notes


def plated_sum_with_a_global(y):
    z = pyro.sample("z", dist.Categorical(torch.ones(3) / 3))
    with pyro.plate("pa", 2):
        a = pyro.sample("a", dist.Bernoulli(0.2 + 0.3 * (z == 1).float()))
    with pyro.plate("pb", 3):
        pyro.sample("y", dist.Normal(a.sum(-1) + z, 1.0), obs=y)


def plated_sum_without_a_global(y):
    with pyro.plate("pa", 2):
        a = pyro.sample("a", dist.Bernoulli(0.3))
    with pyro.plate("pb", 3):
        b = pyro.sample("b", dist.Bernoulli(0.5))
        pyro.sample("y", dist.Normal(a.sum(-1) + b, 1.0), obs=y)


def plated_sum_at_dim_two(y):
    z = pyro.sample("z", dist.Categorical(torch.ones(2) / 2))
    with pyro.plate("pa", 2, dim=-2):
        a = pyro.sample("a", dist.Bernoulli(0.2 + 0.3 * (z == 1).float()))
    with pyro.plate("pb", 2, dim=-1):
        pyro.sample("y", dist.Normal(a.sum(-2) + z, 1.0), obs=y)


@pytest.mark.parametrize("sampler", ["auto", "engine"])
@pytest.mark.parametrize(
    "model, y, named",
    [
        (plated_sum_with_a_global, torch.zeros(3), "The discrete site(s) 'a' (plate 'pa')"),
        (plated_sum_without_a_global, torch.zeros(3), "'a' (plate 'pa'), 'b' (plate 'pb')"),
        (plated_sum_at_dim_two, torch.zeros(2), "Site 'y' (inside plate(s) 'pb' (dim -1))"),
    ],
)
def test_a_plated_site_reduced_into_another_plate_names_the_sites(model, y, named, sampler):
    with pytest.raises(AutoSpecModelError) as info:
        run(model, y, sampler=sampler)
    text = str(info.value)
    assert named in text and "a.sum(-1)" in text and "guide=guide" in text
    assert "_autospec" not in text and "einsum" not in text and "PyTorch said" not in text
    assert "control flow" not in text  # not the generic advice about branching


def test_a_site_after_a_markov_loop_reading_its_state_is_told_where_to_go():
    """A site after a ``pyro.markov`` loop that reads the loop's last state is refused (markov
    recycles the loop's dims, which Pyro's own enumeration gets wrong silently), and the
    message says to sample it inside the loop's last step."""
    stay = torch.tensor([[0.7, 0.2, 0.1], [0.2, 0.6, 0.2], [0.1, 0.3, 0.6]])

    def after_loop(y):
        x = 0
        for t in pyro.markov(range(len(y))):
            x = pyro.sample(f"x_{t}", dist.Categorical(Vindex(stay)[..., x, :]))
            pyro.sample(f"y_{t}", dist.Normal(x.float(), 1.0), obs=y[t])
        g = pyro.sample("g", dist.Bernoulli(Vindex(torch.tensor([0.1, 0.5, 0.9]))[..., x]))
        pyro.sample("o", dist.Normal(g, 0.5), obs=torch.tensor(1.0))

    with pytest.raises(DynamicStructureError, match=r"after a pyro\.markov loop.*last step"):
        AutoSpec(after_loop, 10, seed=0, disable_progbar=True).run(torch.tensor([0.0, 1.0, 2.0]))


def test_a_continuous_only_model_is_told_so_before_its_unplated_data():
    """A model with continuous latent sites only and an unplated vector observation got the
    advice to add a plate, not that AutoSpec has nothing to sample (found outside the
    project); with a discrete site the plate message stays."""

    def continuous_only(y):
        mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
        pyro.sample("y", dist.Normal(mu, 1.0).expand([3]), obs=y)

    with pytest.raises(AutoSpecModelError, match="no unobserved discrete.*all continuous"):
        run(continuous_only, torch.zeros(3))

    def with_a_discrete_site(y):
        z = pyro.sample("z", dist.Bernoulli(0.5))
        pyro.sample("y", dist.Normal(z, 1.0).expand([3]), obs=y)

    with pytest.raises(AutoSpecModelError, match="that no `pyro.plate` declares"):
        run(with_a_discrete_site, torch.zeros(3))


def _bernoulli_data(y):
    z = pyro.sample("z", dist.Bernoulli(0.4))
    with pyro.plate("d", len(y)):
        pyro.sample("y", dist.Bernoulli(0.2 + 0.6 * z), obs=y)


@pytest.mark.parametrize("data", [torch.tensor([1, 0, 1]), torch.tensor([True, False, True])])
def test_integer_or_bool_bernoulli_data_are_named_as_a_dtype_problem(data):
    """An outside test: the message blamed Python branching and plate reductions."""
    with pytest.raises(DynamicStructureError) as info:
        run(_bernoulli_data, data)
    text = str(info.value)
    assert "dtype its distribution cannot score" in text and "y.float()" in text
    assert "control flow" not in text
    run(_bernoulli_data, data.float())


def test_random_numbers_drawn_outside_sample_sites_are_named():
    """It was reported as a plate reduction (.sum(-1)) that mixes draws."""

    def noisy(y):
        z = pyro.sample("z", dist.Bernoulli(0.4))
        noise = torch.randn(())
        pyro.sample("y", dist.Normal(z + noise, 1.0), obs=y)

    with pytest.raises(AutoSpecModelError, match="random numbers that no visible pyro.sample"):
        run(noisy, torch.tensor(0.3), num_samples=20, seed=0)


def _numpy_coin(y):
    z = pyro.sample("z", dist.Bernoulli(0.4))
    coin = float(np.random.binomial(1, 0.999))  # almost always 1: two runs rarely differ
    pyro.sample("y", dist.Normal(z * coin, 1.0), obs=y)


def _python_coin(y):
    z = pyro.sample("z", dist.Bernoulli(0.4))
    coin = float(random.random() < 0.999)
    pyro.sample("y", dist.Normal(z * coin, 1.0), obs=y)


@pytest.mark.parametrize("model", [_numpy_coin, _python_coin])
def test_numpy_and_python_random_numbers_reaching_a_site_are_refused(model):
    """NumPy's and Python's global generators are watched as torch's is: a number of low
    entropy from them, which two runs of the model (or two reseeded ones) almost never tell
    apart, is found by its generator moving just before a scored site's statement."""
    with pytest.raises(HiddenRandomnessError, match="just before the sample site .y."):
        run(model, torch.tensor(0.3), num_samples=20, seed=0)


def test_noise_drawn_before_a_param_statement_and_read_by_a_site_is_refused():
    """A move of the generator just before a param statement is excused (the initial-value
    idiom), so the model is run again with the generators seeded afresh: the noise moves the
    observed site's density, and the model is refused."""

    def model(y):
        noise = torch.randn(())
        scale = pyro.param("scale_after_noise", torch.tensor(1.0))
        z = pyro.sample("z", dist.Bernoulli(0.4))
        pyro.sample("y", dist.Normal(z + noise, scale), obs=y)

    with pytest.raises(HiddenRandomnessError, match="densities of its sites changed"):
        run(model, torch.tensor(0.3), num_samples=20, seed=0)
    pyro.clear_param_store()


def test_random_numbers_no_scored_site_reads_are_allowed():
    """False alarms the watch must not raise: ``pyro.param(name, torch.rand(...))`` draws an
    initial value on every run and ignores it once the parameter exists (Pyro's own HMM
    examples; here computed before the plate it is declared in), noise in a
    ``pyro.deterministic`` site (its log density is 0), and a number drawn after the last
    statement: no scored site reads them."""

    def model(y):
        init = torch.rand(2)
        with pyro.plate("k", 2):
            weights = pyro.param("weights_ignored_init", init, constraint=constraints.positive)
        z = pyro.sample("z", dist.Categorical(weights / weights.sum()))
        pyro.sample("y", dist.Normal(z.double(), 1.0), obs=y)
        pyro.deterministic("y_rep", z.double() + torch.randn((), dtype=torch.float64))
        return torch.randn(())

    pyro.clear_param_store()
    pyro.param("weights_ignored_init", torch.tensor([0.3, 0.7]), constraint=constraints.positive)
    before = torch.get_rng_state()
    fit = run(model, torch.tensor(0.5, dtype=torch.float64), num_samples=200, seed=0)
    assert fit.get_samples()["z"].shape == (200,)
    assert torch.equal(torch.get_rng_state(), before)  # the user's stream is left alone
    pyro.clear_param_store()


def _hidden_latent(y):
    with poutine.block(hide=["z"]):
        z = pyro.sample("z", dist.Bernoulli(0.9))
    w = pyro.sample("w", dist.Bernoulli(0.2 + 0.6 * z))
    pyro.sample("y", dist.Normal(w, 1.0), obs=y)


def _hidden_latent_then_param(y):
    _hidden_latent(y)
    pyro.param("p_after_hidden", torch.tensor(0.6))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("sampler", ["auto", "engine"])
@pytest.mark.parametrize("model", [_hidden_latent, _hidden_latent_then_param])
def test_a_latent_site_hidden_by_poutine_block_is_refused_whatever_it_draws(model, sampler, seed):
    """An outside test: ``z`` is drawn afresh on each run of the model, so the draws followed
    p(w | y, z = whatever the first run drew) and came back silently in 19 of 20 seeds; only
    two runs that happened to draw different values of ``z`` showed it. Now the model is run
    on given values with the global generators watched, and the site that drew is named
    (also where a param statement follows it, which a review found slipped through a watch
    that excused every draw before a param statement)."""
    pyro.set_rng_seed(seed)
    with pytest.raises(HiddenRandomnessError, match="The sample site 'z' drew a random value"):
        run(model, torch.tensor(1.0), num_samples=50, seed=seed, sampler=sampler)


def test_hidden_random_numbers_are_refused_before_the_one_draw_at_a_time_fallback():
    """A review: evaluated one draw at a time where a batch fails (mixed models), the refusal
    was first taken for a batching failure, with a warning of batching advice."""

    def model(y):
        loc = pyro.sample("loc", dist.Normal(0.0, 1.0))
        z = pyro.sample("z", dist.Bernoulli(0.4))
        pyro.sample("y", dist.Normal(loc + z + torch.randn(()), 1.0), obs=y)

    values = {"loc": torch.randn(5), "z": torch.ones(5)}
    shapes = {"loc": ((), ()), "z": ((), ())}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(HiddenRandomnessError):
            evaluate(model, (torch.tensor(0.3),), {}, values, shapes, 0, per_draw_fallback=True)


def test_a_kernel_passed_as_the_model_is_refused_with_the_way_out():
    """AutoSpec(NUTS(model)) failed inside Pyro's integrator ('Tensor' has no 'items')."""
    from pyro.infer import NUTS

    from pyro_autospec.infer import AutoSpecKernel

    for build in (lambda m: AutoSpec(m, 5), AutoSpecKernel):
        with pytest.raises(TypeError, match=r"not an MCMC kernel \(NUTS\).*AutoSpecKernel"):
            build(NUTS(_bernoulli_data))


def test_a_prior_predictive_call_and_a_delta_site_are_given_their_way_out():
    def model(data=None):
        z = pyro.sample("z", dist.Bernoulli(0.3))
        with pyro.plate("p", 3):
            pyro.sample("obs", dist.Normal(z, 1.0), obs=data)
            pyro.sample("w", dist.Delta(2.0 * z))

    with pytest.raises(UnsupportedSiteError, match="obs=None.*pyro.infer.Predictive"):
        run(model, None)
    with pytest.raises(UnsupportedSiteError, match=r"pyro.deterministic\('w', value\)"):
        run(model, torch.zeros(3))


def plated_rows(y):
    """An HMM whose transition rows are sampled in a plate, indexed by the chain's state."""
    with pyro.plate("rows", 2):
        trans = pyro.sample("trans", dist.Dirichlet(torch.ones(2)))
    x = 0
    for t in pyro.markov(range(len(y))):
        x = pyro.sample(f"x_{t}", dist.Categorical(Vindex(trans)[..., x, :]))
        pyro.sample(f"y_{t}", dist.Normal(Vindex(torch.tensor([-1.0, 1.0]))[..., x], 1.0), obs=y[t])


def vector_rows(y):
    trans = pyro.sample("trans", dist.Dirichlet(torch.ones(2, 2)).to_event(1))
    x = 0
    for t in pyro.markov(range(len(y))):
        x = pyro.sample(f"x_{t}", dist.Categorical(Vindex(trans)[..., x, :]))
        pyro.sample(f"y_{t}", dist.Normal(Vindex(torch.tensor([-1.0, 1.0]))[..., x], 1.0), obs=y[t])


def test_a_plate_of_transition_rows_is_named_in_the_warning():
    """An outside test: the warning advised Vindex, which the model already used; the cause
    is the plate of rows, which the chain's sites are outside of."""
    y = torch.tensor([0.3, -1.2, 0.8, 1.1])
    draws = {"trans": torch.full((4, 2, 2), 0.5)}
    with pytest.warns(UserWarning) as record:
        EnumOracle(plated_rows, (y,), continuous_values=draws)
    text = " ".join(str(w.message) for w in record)
    assert "'trans' lives in plate 'rows' (dim -1)" in text and "'x_0'" in text
    assert "dist.Dirichlet(torch.ones(2, K)).to_event(1)" in text
    assert "index with Vindex (pyro.ops.indexing) or ellipses" not in text
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the advised form batches: no warning
        EnumOracle(vector_rows, (y,), continuous_values=draws)


def test_a_plate_of_continuous_effects_is_not_blamed_for_plain_indexing():
    """An outside review: per-datum scales in a plate, a global switch outside it, and the
    plain indexing mu[z] as the cause; the advice named the scales' plate instead."""

    def model(y):
        mu = pyro.sample("mu", dist.Normal(torch.zeros(3), 1.0).to_event(1))
        z = pyro.sample("z", dist.Categorical(torch.ones(3) / 3))
        with pyro.plate("data", len(y)):
            s = pyro.sample("s", dist.LogNormal(0.0, 1.0))
            pyro.sample("y", dist.Normal(mu[z], s), obs=y)

    y = torch.tensor([0.3, -1.2, 0.8, 1.1, 0.2])
    draws = {"mu": torch.randn(4, 3), "s": torch.ones(4, 5)}
    with pytest.warns(UserWarning) as record:
        EnumOracle(model, (y,), continuous_values=draws)
    text = " ".join(str(w.message) for w in record)
    assert "lives in plate" not in text and "Vindex(locs)[..., z]" in text
    # the other usual cause, named too (an outside user's model used Vindex and had added a
    # dim by hand: the advice blamed only plain indexing)
    assert "a dim added or dropped by hand" in text


def _mean_of_a_scalar(y):
    z = pyro.sample("z", dist.Bernoulli(0.3))
    pyro.sample("y", dist.Normal(z.mean(), 0.5), obs=y)  # the identity on one run's scalar


def _first_of_a_flat_scalar(y):
    z = pyro.sample("z", dist.Bernoulli(0.3))
    pyro.sample("y", dist.Normal(z.reshape(-1)[0], 0.5), obs=y)


def _branch_on_any(y):
    z = pyro.sample("z", dist.Bernoulli(0.5))
    pyro.sample("y", dist.Normal(2.0 if z.any() else -2.0, 1.0), obs=y)


def _max_of_a_categorical(y):
    z = pyro.sample("z", dist.Categorical(torch.ones(4) / 4))
    pyro.sample("y", dist.Normal(z.float().max(), 0.5), obs=y)


def _factor_on_a_whole_plate_sum(y):
    with pyro.plate("p", 3):
        z = pyro.sample("z", dist.Bernoulli(torch.tensor([0.2, 0.5, 0.6])))
    pyro.factor("exactly_two", 3.0 * (z.sum() == 2).float())


def _factor_on_a_plates_first_element(y):
    with pyro.plate("p", 3):
        z = pyro.sample("z", dist.Bernoulli(torch.tensor([0.2, 0.5, 0.6])))
    pyro.factor("first_is_one", 3.0 * z[0])


WHOLE_VALUE_MODELS = [
    _mean_of_a_scalar,
    _first_of_a_flat_scalar,
    _branch_on_any,
    _max_of_a_categorical,
    _factor_on_a_whole_plate_sum,
    _factor_on_a_plates_first_element,
]


@pytest.mark.parametrize("num_samples", [1, 500])
@pytest.mark.parametrize("sampler", ["auto", "engine"])
@pytest.mark.parametrize("model", WHOLE_VALUE_MODELS)
def test_a_value_reduced_or_indexed_as_a_whole_is_refused(model, sampler, num_samples):
    """An outside test: code that is the identity on one plain run (``z.mean()`` of a scalar,
    ``z.reshape(-1)[0]``, ``if z.any():``, a factor on ``z.sum()`` or ``z[0]`` of a plate)
    reads every enumerated value at once, so the oracle's law dropped the term (the prior
    came back: P(z = 1) 0.29 against 0.76), and read every draw of a batch at once, the same
    way, so that the self-check passed. The first batch of varied draws (the self-check's
    probes included) now has draws scored alone again (their mixing error was taken for
    probes the model cannot score, and a one-draw run went on without them)."""
    with pytest.raises(MixedDrawsError, match="reads every draw at once"):
        run(model, torch.tensor(1.0), num_samples=num_samples, seed=0, sampler=sampler)


def test_a_value_reduced_as_a_whole_is_refused_in_the_kernel_too():
    kernel = AutoSpecKernel(_mean_of_a_scalar, seed=0)
    mcmc = MCMC(kernel, num_samples=200, warmup_steps=0, disable_progbar=True)
    with pytest.raises(MixedDrawsError, match="reads every draw at once"):
        mcmc.run(torch.tensor(1.0))


def test_a_float32_matrix_product_under_a_sharp_likelihood_is_not_taken_for_mixed_draws():
    """A review: ``basis[z] @ W`` rounds one way over a batch (a matrix product) and another
    over one draw (a vector product), and under a noise of 1e-3 over 100 observations the
    gap passed the check's rounding allowance: a legitimate model was refused. The draw is
    now scored again in a batch of copies of itself, the batch's routine, before it is."""
    gen = torch.Generator().manual_seed(0)
    base = torch.randn(64, generator=gen)
    basis = base + 1e-3 * torch.randn(16, 64, generator=gen)
    weights = torch.randn(64, 100, generator=gen)
    y = base @ weights + 1e-3 * torch.randn(100, generator=gen)

    def model(y):
        z = pyro.sample("z", dist.Categorical(torch.ones(16) / 16))
        with pyro.plate("d", 100):
            zz = z.squeeze(-1) if z.dim() else z  # the enumeration's dim, then the plate's
            pyro.sample("y", dist.Normal(basis[zz] @ weights, 1e-3), obs=y)

    for num_samples in (1, 200):
        run(model, y, num_samples=num_samples, seed=0)


def test_a_gap_of_rounding_between_routines_passes_and_a_gap_between_draws_does_not():
    """The same decision on any machine: a term that moves with the batch's size only (as a
    routine chosen by the batch's shape rounds) passes within ``sqrt(eps)`` of the draw's
    magnitudes, and one that reads another draw's value does not."""

    def by_size(y):
        z = pyro.sample("z", dist.Bernoulli(torch.tensor(0.4, dtype=torch.float64)))
        pyro.factor("routine", torch.tensor(1e-9 if z.numel() > 1 else 0.0, dtype=z.dtype))
        pyro.sample("y", dist.Normal(z, 1.0), obs=y)

    def by_value(y):
        z = pyro.sample("z", dist.Bernoulli(torch.tensor(0.4, dtype=torch.float64)))
        pyro.factor("mixed", 1e-9 * z.sum())
        pyro.sample("y", dist.Normal(z, 1.0), obs=y)

    y = torch.tensor(0.3, dtype=torch.float64)
    run(by_size, y, num_samples=50, seed=0)
    with pytest.raises(MixedDrawsError, match="alone but"):
        run(by_value, y, num_samples=50, seed=0)


def test_a_site_read_across_its_own_plate_is_named_among_the_self_checks_causes():
    """``w.flip(-1)`` inside the plate of ``w`` couples entries the plate declares independent;
    the self-check refused it, naming only causes that did not apply (found outside the
    project). It names this one now, with the fix (a vector site)."""

    def flipped(y):
        with pyro.plate("n", 3):
            w = pyro.sample("w", dist.Bernoulli(0.5))
            pyro.sample("y", dist.Normal(w.flip(-1), 0.5), obs=y)

    with pytest.raises(SelfCheckError, match=r"read across its own plate.*\.to_event\(1\)"):
        run(flipped, torch.tensor([1.0, 0.0, 0.0]))
