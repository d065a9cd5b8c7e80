"""AutoSpec's MCMC-like interface: shapes, dtypes, extra fields, diagnostics, ArviZ, oracles."""

import warnings
from dataclasses import fields

import arviz as az
import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine
from pyro.infer import MCMC

from pyro_autospec.engine import SampleResult
from pyro_autospec.engine.methods import Schedule
from pyro_autospec.infer import AutoSpec, AutoSpecKernel
from pyro_autospec.model.enum import EnumOracle

DATA = torch.tensor([0.3, 1.8, 2.4])


def model(y):
    g = pyro.sample("g", dist.Categorical(torch.tensor([0.3, 0.3, 0.4])))
    with pyro.plate("data", len(y)):
        z = pyro.sample("z", dist.Bernoulli(0.5))
        pyro.sample("y", dist.Normal(z + g.float(), 0.8), obs=y)


@pytest.fixture(scope="module")
def fitted():
    return AutoSpec(model, num_samples=40, num_chains=2, seed=0, disable_progbar=True).run(DATA)


def test_get_samples_shapes_and_dtypes(fitted):
    samples = fitted.get_samples()
    assert samples["g"].shape == (80,) and samples["g"].dtype == torch.long
    assert samples["z"].shape == (80, 3) and samples["z"].dtype == torch.float32
    grouped = fitted.get_samples(group_by_chain=True)
    assert grouped["g"].shape == (2, 40) and grouped["z"].shape == (2, 40, 3)
    assert torch.equal(grouped["z"].reshape(80, 3), samples["z"])
    assert fitted.get_samples(num_samples=7)["z"].shape == (7, 3)
    assert fitted.get_samples(include_discrete=False) == {}
    assert set(samples["g"].tolist()) <= {0, 1, 2}


def test_extra_fields(fitted):
    extra = fitted.get_extra_fields()
    assert set(extra) == {"sample_rounds", "oracle_rows_per_draw", "lp", "oracle_log_prob"}
    # the counts go by the names of the engine's result: oracle_rows is the run's total, the
    # per-draw field says that it is a share of it
    assert {"sample_rounds", "oracle_rows"} <= {f.name for f in fields(SampleResult)}
    total = fitted.diagnostics()["whole run"]["oracle_rows"]
    torch.testing.assert_close(
        extra["oracle_rows_per_draw"].sum(), torch.tensor(float(total), dtype=torch.float64)
    )
    attrs = fitted.to_inference_data(log_likelihood=False).posterior.attrs
    assert attrs["oracle_rows"] == total
    assert extra["sample_rounds"].shape == (80,) and extra["sample_rounds"].dtype == torch.long
    assert extra["lp"].dtype == torch.float64
    assert fitted.get_extra_fields(group_by_chain=True)["lp"].shape == (2, 40)
    # lp is log p(x, data): check one draw directly
    samples = fitted.get_samples()
    draw = {k: v[5] for k, v in samples.items()}
    trace = poutine.trace(poutine.condition(model, data=draw)).get_trace(DATA)
    assert extra["lp"][5].item() == pytest.approx(trace.log_prob_sum().item(), abs=1e-4)


def test_chains_differ_and_seed_reproduces(fitted):
    grouped = fitted.get_samples(group_by_chain=True)
    assert not torch.equal(grouped["z"][0], grouped["z"][1])
    again = AutoSpec(model, num_samples=40, num_chains=2, seed=0, disable_progbar=True).run(DATA)
    assert torch.equal(again.get_samples()["z"], fitted.get_samples()["z"])


def test_diagnostics_and_summary_on_integer_sites(fitted, capsys):
    diag = fitted.diagnostics()
    assert set(diag["g"]) == {"n_eff", "r_hat"}
    assert diag["divergences"] == {"chain 0": [], "chain 1": []}
    assert diag["rounds"]["chain 0"] == fitted.results[0].rounds
    assert "oracle_rows" in diag and "mean rounds per draw" in diag
    fitted.summary(prob=0.8)
    out = capsys.readouterr().out
    assert "g" in out and "z[0]" in out and "n_eff" in out and "10.0%" in out
    assert "Number of divergences: 0" in out
    assert "sequential sampler takes 4 per draw" in " ".join(out.split())  # lines wrap


@pytest.mark.parametrize("prob", [1.5, 0.0, 1.0, -0.1, "x", True, torch.tensor(1.5)])
def test_summary_refuses_a_mass_outside_zero_one_before_printing(fitted, capsys, prob):
    """``prob=1.5`` failed with an IndexError from inside Pyro's ``hpdi`` (as MCMC's summary
    does; found by an outside user): a ValueError that names the range, and nothing printed."""
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        fitted.summary(prob=prob)
    assert capsys.readouterr().out == ""


def test_summary_takes_the_scalars_pyro_takes(fitted, capsys):
    """A torch or NumPy scalar mass works, as in Pyro's summary."""
    fitted.summary(prob=torch.tensor(0.5))
    fitted.summary(prob=np.float32(0.8))
    assert "25.0%" in capsys.readouterr().out


def test_to_inference_data_log_likelihood_is_exact(fitted):
    idata = fitted.to_inference_data(dims={"y": ["obs"], "z": ["obs"]}, coords={"obs": [0, 1, 2]})
    assert idata.posterior["g"].shape == (2, 40)
    assert idata.posterior["z"].dims == ("chain", "draw", "obs")
    assert idata.posterior["z"].dtype == np.int64  # histograms in az.plot_trace
    assert idata.sample_stats["lp"].shape == (2, 40)
    assert not idata.sample_stats["diverging"].values.any()
    np.testing.assert_allclose(idata.observed_data["y"].values, DATA.numpy())
    ll = idata.log_likelihood["y"].values
    assert ll.shape == (2, 40, 3)
    samples = fitted.get_samples(group_by_chain=True)
    g = samples["g"].double()[..., None]
    direct = dist.Normal(samples["z"].double() + g, 0.8).log_prob(DATA.double())
    np.testing.assert_allclose(ll, direct.numpy(), atol=1e-5)
    az.summary(idata)  # the ArviZ tools run on it
    assert "log_likelihood" not in fitted.to_inference_data(log_likelihood=False).groups()


def test_save_params():
    fit = AutoSpec(model, num_samples=5, save_params=["g"], seed=1, disable_progbar=True).run(DATA)
    assert list(fit.get_samples()) == ["g"]
    with pytest.raises(ValueError, match="not latent or deterministic sites"):
        AutoSpec(model, num_samples=5, save_params=["nope"], disable_progbar=True).run(DATA)


def test_sequential_method_and_schedule_knobs():
    fit = AutoSpec(model, num_samples=10, method="sequential", seed=2, disable_progbar=True).run(
        DATA
    )
    assert (fit.get_extra_fields()["sample_rounds"] == 4).all()
    with pytest.raises(TypeError, match="unknown keyword"):
        AutoSpec(model, num_samples=10, not_a_knob=3)
    with pytest.raises(ValueError, match="method"):
        AutoSpec(model, num_samples=10, method="gibbs")


def test_schedule_object_or_keywords_give_the_same_draws():
    kwargs = {"num_samples": 40, "seed": 3, "sampler": "engine", "disable_progbar": True}
    with warnings.catch_warnings(record=True) as caught:  # the library passes no keywords on
        warnings.simplefilter("always")
        typed = AutoSpec(model, schedule=Schedule(max_block=2, min_block=1), **kwargs).run(DATA)
        kernel = AutoSpecKernel(model, schedule={"max_block": 2}, draws_per_run=4)
        MCMC(kernel, num_samples=4, warmup_steps=0, disable_progbar=True).run(DATA)
    assert not [w for w in caught if "schedule knobs as keywords" in str(w.message)]
    with pytest.warns(
        FutureWarning, match=r"pass schedule=Schedule\(max_block=2, min_block=1\)"
    ) as caught:
        plain = AutoSpec(model, max_block=2, min_block=1, **kwargs).run(DATA)
    assert {w.filename for w in caught if "schedule knobs" in str(w.message)} == {__file__}
    with pytest.warns(FutureWarning, match=r"pass schedule=Schedule\(rho=2\.0\)") as caught:
        AutoSpecKernel(model, rho=2.0)
    assert {w.filename for w in caught if "schedule knobs" in str(w.message)} == {__file__}
    for name, value in typed.get_samples().items():
        assert torch.equal(value, plain.get_samples()[name])
    assert typed.results[0].schedule["max_block"] == 2
    back = AutoSpec(model, schedule=typed.results[0].schedule, **kwargs).run(DATA)
    for name, value in typed.get_samples().items():
        assert torch.equal(value, back.get_samples()[name])
    with pytest.raises(TypeError, match="given both in schedule= and as keywords"):
        AutoSpec(model, num_samples=10, schedule={"rho": 2.0}, rho=1.0)
    with pytest.raises(TypeError, match="unknown schedule knobs"):
        AutoSpec(model, num_samples=10, schedule={"not_a_knob": 3})


class _Wrapped:
    """A user oracle following the documented mapping (here: an EnumOracle in disguise)."""

    def __init__(self, inner, num_values=None):
        self.inner = inner
        self.num_coords = inner.num_coords
        self.num_values = inner.num_values if num_values is None else num_values

    def log_marginals(self, values, mask):
        return self.inner.log_marginals(values, mask)


def test_custom_oracle_is_used_and_checked():
    inner = EnumOracle(model, (DATA,))
    fit = AutoSpec(model, num_samples=20, oracle=_Wrapped(inner), seed=3, disable_progbar=True)
    fit.run(DATA)
    assert inner.num_calls > 0 and fit.get_samples()["z"].shape == (20, 3)

    class WrongSize(_Wrapped):
        num_coords = 5

    bad = WrongSize(inner)
    bad.num_coords = 5
    with pytest.raises(ValueError, match=r"num_coords=4.*'g': 1 coords x 3 values.*C order"):
        AutoSpec(model, num_samples=2, oracle=bad, disable_progbar=True).run(DATA)

    class Leaky(_Wrapped):
        def log_marginals(self, values, mask):
            return torch.zeros(values.shape[0], self.num_coords, self.num_values).log_softmax(-1)

    with pytest.raises(ValueError, match=r"outside the support of site 'z'"):
        AutoSpec(model, num_samples=2, oracle=Leaky(inner), disable_progbar=True).run(DATA)
    with pytest.raises(ValueError, match="oracle must be 'enum'"):
        AutoSpec(model, num_samples=2, oracle="tabular", disable_progbar=True).run(DATA)


@pytest.mark.parametrize("sampler", ["engine", "ffbs"])
def test_run_is_blocked_and_progress_bar(capsys, sampler):
    with pytest.warns(UserWarning, match="inside Pyro handlers"), poutine.trace() as tracer:
        AutoSpec(model, num_samples=3, seed=4, disable_progbar=False, sampler=sampler).run(DATA)
    assert len(tracer.trace.nodes) == 0
    err = capsys.readouterr().err
    if sampler == "engine":
        assert "rounds=" in err  # the engine's tqdm bar, with rounds
    else:
        assert "ffbs: 100%" in err and "3/3" in err  # forward filtering's, over the draws


def test_params_created_while_sampling_stay_trainable():
    """The engine runs in inference mode; a pyro.param first set while AutoSpec samples must
    still train afterwards (an inference tensor could not be updated in place)."""
    pyro.clear_param_store()

    def shifted(y):
        shift = pyro.param("shift", torch.tensor(0.5))
        g = pyro.sample("g", dist.Categorical(torch.tensor([0.3, 0.3, 0.4])))
        with pyro.plate("data", len(y)):
            z = pyro.sample("z", dist.Bernoulli(0.5))
            pyro.sample("y", dist.Normal(z + g.float() + shift, 0.8), obs=y)

    fit = AutoSpec(shifted, num_samples=10, seed=0, disable_progbar=True).run(DATA)
    draw = {k: v[0] for k, v in fit.get_samples().items()}
    unconstrained = pyro.param("shift").unconstrained()
    assert not unconstrained.is_inference()
    optimizer = torch.optim.SGD([unconstrained], lr=0.1)
    loss = -poutine.trace(poutine.condition(shifted, data=draw)).get_trace(DATA).log_prob_sum()
    loss.backward()
    optimizer.step()
    assert pyro.param("shift").item() != 0.5
    pyro.clear_param_store()


@pytest.mark.parametrize("context", ["no_grad", "inference_mode"])
@pytest.mark.parametrize("sampler", ["auto", "engine"])
def test_a_run_under_no_grad_or_inference_mode_gives_the_same_draws(context, sampler):
    """The enumeration oracle takes its marginals as gradients; a caller's ``no_grad`` or
    ``inference_mode`` must not break it nor change the draws."""

    def model(y):
        x = pyro.sample("x", dist.Categorical(torch.ones(3) / 3))
        pyro.sample("y", dist.Normal(x.float(), 1.0), obs=y)

    y = torch.tensor(1.0)
    base = AutoSpec(model, 50, seed=0, disable_progbar=True, sampler=sampler).run(y)
    mode = torch.no_grad() if context == "no_grad" else torch.inference_mode()
    with mode:
        run = AutoSpec(model, 50, seed=0, disable_progbar=True, sampler=sampler).run(y)
    assert torch.equal(run.get_samples()["x"], base.get_samples()["x"])


@pytest.mark.parametrize("sampler", ["auto", "engine"])
def test_a_run_too_large_for_the_machine_is_refused_before_any_draw(sampler):
    """Forward filtering allocated until torch's raw error (after 55 s at 10**8 draws of a
    4-site model); the run now names what a draw holds and how many fit."""
    fit = AutoSpec(model, 10**10, seed=0, sampler=sampler, disable_progbar=True)
    with pytest.raises(MemoryError) as info:
        fit.run(DATA)
    text = str(info.value)
    assert "num_samples=10000000000 draws" in text and "per draw" in text
    assert "fit in half of this machine's memory" in text


def test_handlers_around_run_are_blocked_with_a_warning():
    """``run`` blocks outer handlers as ``MCMC.run`` does; a condition written around the
    call changed nothing, silently."""
    z = {"z": torch.tensor(1)}
    with pytest.warns(UserWarning, match=r"inside Pyro handlers \(ConditionMessenger\)"):
        with poutine.condition(data=z):
            fit = AutoSpec(model, 20, seed=0, disable_progbar=True).run(DATA)
    plain = AutoSpec(model, 20, seed=0, disable_progbar=True).run(DATA)
    assert torch.equal(fit.get_samples()["z"], plain.get_samples()["z"])
