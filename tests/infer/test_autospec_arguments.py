"""Argument checks of AutoSpec that are easy to get wrong."""

import warnings

import arviz
import pyro
import pyro.distributions as dist
import pytest
import torch

from pyro_autospec import AutoSpec
from pyro_autospec.oracles import TabularOracle


def model():
    pyro.sample("z", dist.Bernoulli(0.5))


def test_warmup_and_nuts_kwargs_of_a_discrete_model_are_ignored_with_a_warning():
    """A discrete model's exact draws need no warm-up: code written for MCMC runs unchanged,
    and the run says what it ignored (the model's kind is known only then; models with
    continuous sites use warmup_steps and nuts_kwargs for NUTS)."""
    fit = AutoSpec(model, num_samples=10, seed=0, disable_progbar=True).run()
    with pytest.warns(UserWarning, match=r"warmup_steps=5 is ignored") as caught:
        warm = AutoSpec(model, num_samples=10, warmup_steps=5, seed=0, disable_progbar=True)
        warm.run()
    assert caught[0].filename == __file__  # points at the caller's run()
    assert warm.warmup_steps == 0
    assert torch.equal(warm.get_samples()["z"], fit.get_samples()["z"])  # nothing discarded
    with pytest.warns(UserWarning, match=r"nuts_kwargs \['max_tree_depth'\] are ignored"):
        AutoSpec(model, num_samples=10, nuts_kwargs={"max_tree_depth": 5}).run()
    approximate = TabularOracle(logits=torch.tensor([0.2, -0.1]))  # a proposal of one's own
    imh = AutoSpec(
        model, num_samples=10, warmup_steps=5, correction="imh", guide=approximate, seed=0
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warmup_steps applies to the IMH chains
        imh.run()
        AutoSpec(model, num_samples=10, warmup_steps=0, disable_progbar=True).run()  # as MCMC's
    assert imh.warmup_steps == 5


def test_warmup_steps_is_the_third_positional_argument_as_in_mcmc():
    """``MCMC(kernel, num_samples, warmup_steps)`` is written positionally: the same call with
    AutoSpec gives warmup_steps, as to MCMC, rather than Python's generic TypeError."""
    imh = AutoSpec(model, 10, 3, correction="imh", guide=TabularOracle(logits=torch.zeros(2)))
    assert imh.warmup_steps == 3
    with pytest.raises(TypeError, match="positional"):
        AutoSpec(model, 10, 3, None)  # MCMC's initial_params is not an argument of AutoSpec


@pytest.mark.parametrize("correction", ["importance", "imh"])
def test_a_correction_of_the_exact_default_oracle_is_refused(correction):
    """Without a guide or an oracle of one's own there is nothing to correct: the likely
    mistake is a forgotten guide=."""
    with pytest.raises(ValueError, match="default oracle='enum' is exact"):
        AutoSpec(model, num_samples=10, correction=correction)


def mixed(y):
    mu = pyro.sample("mu", dist.Normal(0.0, 2.0))
    with pyro.plate("data", len(y)):
        z = pyro.sample("z", dist.Bernoulli(0.5))
        pyro.sample("y", dist.Normal(z * mu, 1.0), obs=y)


def test_max_plate_nesting_given_to_nuts_is_autospecs():
    """Pyro users pass ``max_plate_nesting`` to NUTS; NUTS then got it twice (a TypeError)."""
    fit = AutoSpec(mixed, 2, nuts_kwargs={"max_plate_nesting": 1, "max_tree_depth": 3})
    assert fit.max_plate_nesting == 1 and fit.nuts_kwargs == {"max_tree_depth": 3}
    assert AutoSpec(mixed, 2, max_plate_nesting=1, nuts_kwargs={"max_plate_nesting": 1})
    with pytest.raises(ValueError, match="pass it once"):
        AutoSpec(mixed, 2, max_plate_nesting=2, nuts_kwargs={"max_plate_nesting": 1})


def test_the_elimination_sampler_draws_the_discrete_sites_of_a_mixed_model():
    """``sampler="ffbs"`` promises the elimination or an error (it was once ignored here):
    with continuous sites it eliminates the discrete ones given every NUTS draw at once;
    ``sampler="engine"`` takes the engine."""
    data = torch.tensor([2.1, -0.1])
    fit = AutoSpec(mixed, 2, warmup_steps=2, sampler="ffbs", seed=0, disable_progbar=True)
    assert fit.run(data).diagnostics()["sampler"] == "ffbs"
    engine = AutoSpec(mixed, 2, warmup_steps=2, sampler="engine", seed=0, disable_progbar=True)
    assert engine.run(data).diagnostics()["sampler"] == "autospec"


def test_bad_device_and_schedule_knob():
    with pytest.raises(ValueError, match=r"is not a torch device \('cpu', 'cuda'"):
        AutoSpec(model, num_samples=2, device="gpu please")
    with pytest.raises(TypeError, match="schedule knobs"):
        AutoSpec(model, num_samples=2, devcie="cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA machine has the device")
def test_a_device_this_machine_lacks_is_refused_up_front():
    """It was ignored with a DiffusionGuide, and an AssertionError from torch elsewhere."""
    with pytest.raises(ValueError, match="sees no CUDA GPU"):
        AutoSpec(model, num_samples=2, device="cuda")
    with pytest.raises(ValueError, match="meta tensors hold no numbers"):
        AutoSpec(model, num_samples=2, device="meta")


def test_the_elimination_sampler_is_refused_with_a_guide_or_an_oracle_of_ones_own():
    """It was silently replaced by the engine."""
    from pyro_autospec.oracles import TabularOracle

    oracle = TabularOracle(logits=torch.zeros(2))
    for knobs in ({"guide": oracle}, {"oracle": oracle}, {"correction": "imh"}):
        with pytest.raises(ValueError, match="sampler='ffbs' eliminates the model's own"):
            AutoSpec(model, num_samples=2, sampler="ffbs", **knobs)


@pytest.mark.parametrize(
    "knobs",
    [
        {"num_samples": True},
        {"num_chains": True},
        {"max_plate_nesting": 1.5},
        {"max_plate_nesting": "1"},
        {"warmup_steps": True},
    ],
)
def test_counts_must_be_ints(knobs):
    """True was taken as 1; 1.5 and '1' failed later with messages about the model."""
    from pyro_autospec import AutoSpecKernel

    arguments = {"num_samples": 2, **knobs}
    name = next(iter(knobs))
    with pytest.raises(ValueError, match=f"{name} must be an int"):
        AutoSpec(model, **arguments)
    if name == "max_plate_nesting":
        with pytest.raises(ValueError, match=f"{name} must be an int"):
            AutoSpecKernel(model, **knobs)
    with pytest.raises(ValueError, match="draws_per_run must be an int"):
        AutoSpecKernel(model, draws_per_run=True)


def test_method_list_is_consistent():
    with pytest.raises(ValueError, match="speculative") as error:
        AutoSpec(model, num_samples=10, method="gibbs")
    # the methods of discrete sites, then the one only a diffusion guide takes
    assert "('autospec', 'sequential', 'speculative', 'agr24') (discrete sites)" in str(error.value)
    assert "diffusion guide also ('picard',)" in str(error.value)


@pytest.mark.parametrize("bad", [-1, 0, 2.5, True])
def test_get_samples_num_samples_is_checked(bad):
    def coin():
        pyro.sample("x", dist.Bernoulli(0.3))

    fit = AutoSpec(coin, num_samples=10, seed=0, disable_progbar=True).run()
    with pytest.raises(ValueError, match="positive int"):
        fit.get_samples(num_samples=bad)
    assert fit.get_samples(num_samples=3)["x"].shape == (3,)


@pytest.mark.parametrize("name", ["initial_params", "hook_fn", "mp_context"])
def test_arguments_of_mcmc_that_autospec_does_not_take_are_named_so(name):
    with pytest.raises(TypeError, match="of pyro.infer.MCMC that AutoSpec does not take"):
        AutoSpec(model, num_samples=10, **{name: None})


def test_arviz_before_a_run_says_to_run_first():
    """ArviZ's from_pyro reads the data of the run (MCMC's _args) to trace the model."""
    with pytest.raises(RuntimeError, match=r"call AutoSpec.run\(\*args, \*\*kwargs\) first"):
        arviz.from_pyro(AutoSpec(model, num_samples=10))


def test_a_site_named_like_an_entry_of_the_run_keeps_its_diagnostics():
    def named(flip):
        pyro.sample("rounds", dist.Bernoulli(flip))
        pyro.sample("sampler", dist.Bernoulli(flip))

    fit = AutoSpec(named, num_samples=20, num_chains=2, seed=0, disable_progbar=True)
    fit.run(torch.tensor(0.3))
    with pytest.warns(UserWarning, match=r"sites \['rounds', 'sampler'\] share their names"):
        diagnostics = fit.diagnostics()
    assert set(diagnostics["rounds"]) == {"n_eff", "r_hat"}
    assert set(diagnostics["sampler"]) == {"n_eff", "r_hat"}
    assert diagnostics["run: sampler"] in ("ffbs", "autospec")
    assert set(diagnostics["run: rounds"]) == {"chain 0", "chain 1"}


@pytest.mark.parametrize("correction", ["importance", "imh"])
def test_an_approximate_oracle_of_ones_own_is_corrected_as_a_guide_is(correction):
    """``correction=`` is for a guide or an approximate oracle of one's own: passed as
    ``oracle=`` it is corrected (no exactness self-check), with the draws of ``guide=``."""

    def coupled(y):
        z0 = pyro.sample("z0", dist.Bernoulli(0.5))
        z1 = pyro.sample("z1", dist.Bernoulli(0.5))
        pyro.factor("c", 1.5 * (2 * z0 - 1) * (2 * z1 - 1))
        pyro.sample("y", dist.Normal(z0 + z1, 1.0), obs=y)

    uniform = TabularOracle(probs=torch.full((2, 2), 0.25))  # not the posterior
    fits = []
    for role in ("oracle", "guide"):
        fit = AutoSpec(
            coupled, 300, correction=correction, seed=0, disable_progbar=True, **{role: uniform}
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # k-hat of four distinct weights
            fits.append(fit.run(torch.tensor(1.0)).get_samples())
    for name in ("z0", "z1"):
        assert torch.equal(fits[0][name], fits[1][name])


def _one_coin(y):
    z = pyro.sample("z", dist.Bernoulli(0.3))
    pyro.sample("y", dist.Normal(z.float(), 1.0), obs=y)


@pytest.mark.parametrize(
    "guide, words",
    [("mlp", "got str 'mlp'"), (42, "got int 42"), (TabularOracle, "the class TabularOracle")],
)
def test_a_guide_that_is_no_guide_is_named_as_guide(guide, words):
    """An outside test: these were refused as a bad oracle=, which the user never passed."""
    with pytest.raises(TypeError, match=rf"guide must be a built guide.*{words}"):
        AutoSpec(_one_coin, 10, guide=guide, correction="imh")


def test_a_family_of_targets_is_refused_as_guide_or_oracle():
    """An outside test: a guide conditioned on several data sets (num_draws) ran with as many
    draws as targets, each draw from another data set's posterior, with a k-hat warning only."""
    family = TabularOracle(logits=torch.zeros(2, dtype=torch.float64))
    family.num_draws = 10
    for name in ("guide", "oracle"):
        with pytest.raises(ValueError, match=rf"{name}= is a family of 10 targets"):
            AutoSpec(_one_coin, 10, **{name: family}, correction="imh")
