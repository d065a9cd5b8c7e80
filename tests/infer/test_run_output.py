"""What a run tells its user: measured seconds per stage, rounds and rows of the whole run, a
faster exact method where one likely is, and output that stays short for many sites."""

import logging

import arviz as az
import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.ops import stats

from pyro_autospec.diagnostics import effective_sample_size, split_gelman_rubin
from pyro_autospec.engine import Schedule
from pyro_autospec.infer import AutoSpec
from pyro_autospec.infer.display import compact_names, print_summary
from pyro_autospec.infer.run_base import ROWS_RATIO_FOR_ADVICE

DATA = torch.tensor([1.2, -0.7, 0.3, 2.0, -1.5, 0.8, 0.1, -0.4])


def chain(y):  # the README's noisy Ising chain: 8 per-step sites
    prev = None
    for i in pyro.markov(range(len(y))):
        z = pyro.sample(f"z_{i}", dist.Bernoulli(0.5))
        if prev is not None:
            pyro.factor(f"c_{i}", 0.5 * (2 * z - 1) * (2 * prev - 1))
        pyro.sample(f"y_{i}", dist.Normal(2 * z - 1, 0.9), obs=y[i])
        prev = z


@pytest.fixture(scope="module")
def fit():
    # the engine's counts (the default sampler on a CPU here is forward filtering, backward
    # sampling, which has no rounds to report)
    return AutoSpec(
        chain, num_samples=200, num_chains=2, seed=0, disable_progbar=True, sampler="engine"
    ).run(DATA)


def test_seconds_are_measured_per_stage(fit):
    seconds = fit.diagnostics()["seconds"]
    stages = ["tracing", "compiling", "oracle", "engine", "evaluation", "self-check"]
    assert list(seconds) == stages + ["total"]
    assert all(v >= 0.0 for v in seconds.values())
    assert sum(seconds[k] for k in stages) <= seconds["total"] + 1e-6
    assert seconds["total"] == fit.timing["total"]
    # the oracle and engine stages add up to the engine runs' own clocks
    engine = sum(r.wall_time for r in fit.results)
    assert seconds["oracle"] + seconds["engine"] == pytest.approx(engine, rel=1e-9)
    whole = fit.diagnostics()["whole run"]
    assert whole["rounds"] == sum(r.rounds for r in fit.results)
    assert whole["oracle_rows"] == sum(r.oracle_rows for r in fit.results)
    assert whole["draws"] == 400 and whole["seconds"] == seconds["total"]
    idata = fit.to_inference_data()
    assert idata.posterior.attrs["wall_time"] == pytest.approx(seconds["total"])
    assert idata.posterior.attrs["rounds"] == whole["rounds"]


def test_summary_says_time_rounds_and_rows_of_the_whole_run(fit, capsys):
    fit.summary()
    out = capsys.readouterr().out
    total = fit.timing["total"]
    assert f"Wall time (measured): {total:.2f} s for 400 draws" in out
    assert "per draw" in out and "compiling" in out and "self-check" in out
    rounds = sum(r.rounds for r in fit.results)
    rows = sum(r.oracle_rows for r in fit.results)
    flat = " ".join(out.split())
    assert f"Whole run: {rounds:,} rounds and {rows:,} oracle rows for 400 draws" in flat
    assert "the sequential sampler: 16 rounds and 3,200 rows" in flat
    assert "fewer rounds" not in out and "faster than" not in out


def test_a_faster_exact_method_is_named_when_rows_say_so(capsys):
    # the block rule with recursive races on whole blocks: several times n rows on this model
    fit = AutoSpec(
        chain,
        num_samples=200,
        num_chains=2,
        seed=0,
        disable_progbar=True,
        sampler="engine",
        schedule=Schedule(blocks="fixed", token_below=0, race_depth=None),
    ).run(DATA)
    rows_per_draw = sum(r.oracle_rows for r in fit.results) / 400
    assert rows_per_draw >= ROWS_RATIO_FOR_ADVICE * 8  # this seed: several times n
    fit.summary()
    flat = " ".join(capsys.readouterr().out.split())
    assert "Likely faster here: method='sequential'" in flat
    assert "AutoSpec(model, ..., method='sequential')" in flat
    assert f"({rows_per_draw:.1f} against n = 8)" in flat


def test_no_advice_for_the_sequential_sampler_itself(capsys):
    fit = AutoSpec(chain, num_samples=20, method="sequential", seed=0, disable_progbar=True)
    fit.run(DATA)
    fit.summary()
    out = capsys.readouterr().out
    assert "Likely faster" not in out and "Wall time (measured)" in out


def test_advice_rule_off_a_cpu(fit):
    run = fit._run
    run.on_cpu = lambda: False  # a GPU: rows are cheap, only fewer rows AND rounds count
    assert run.faster_method(rounds=10, seq_rounds=16, rows_per_draw=40.0, n=8) == ""
    assert "at least its rounds" in run.faster_method(16, 16, 40.0, 8)
    del run.on_cpu
    assert run.faster_method(10, 16, 9.0, 8) == ""  # 1.1x n: within noise, no advice
    assert "on a CPU" in run.faster_method(10, 16, 40.0, 8)


# ------------------------------------------------------------------------- many sites
def hmm(y):
    x = 0
    for t in pyro.markov(range(len(y))):
        x = pyro.sample(f"x_{t}", dist.Bernoulli(0.2 + 0.6 * x))
        pyro.sample(f"y_{t}", dist.Normal(2.0 * x - 1.0, 1.0), obs=y[t])


HMM_DATA = torch.linspace(-2.0, 2.0, 45)


@pytest.fixture(scope="module")
def hmm_fit():
    return AutoSpec(hmm, num_samples=60, seed=1, disable_progbar=True).run(HMM_DATA)


def test_repr_names_per_step_sites_as_one_range(hmm_fit):
    assert repr(hmm_fit) == (
        "AutoSpec(method='autospec', num_samples=60, num_chains=1, sites=['x_0..x_44'])"
    )
    assert compact_names(["p"] + [f"x_{t}" for t in range(300)]) == "['p', 'x_0..x_299']"
    many = compact_names([f"a{i}" for i in range(30)])
    assert many.endswith(", ... 22 more]") and len(many) < 100


def test_summary_groups_per_step_sites(hmm_fit, capsys):
    hmm_fit.summary()  # 45 rows would be printed one per element: grouped by default
    out = capsys.readouterr().out
    table = out.split("Number of divergences")[0]
    assert len(table.splitlines()) < 12, table
    (row,) = [line for line in table.splitlines() if line.strip().startswith("x_0..x_44")]
    samples = hmm_fit.get_samples()
    means = torch.stack([samples[f"x_{t}"].double().mean() for t in range(45)])
    diag = hmm_fit.diagnostics()
    n_eff = torch.stack([diag[f"x_{t}"]["n_eff"] for t in range(45)])
    fields = row.split()
    assert fields[1] == "45"
    assert float(fields[2]) == pytest.approx(float(means.min()), abs=0.006)
    assert float(fields[3]) == pytest.approx(float(means.max()), abs=0.006)
    assert float(fields[4]) == pytest.approx(float(n_eff[~n_eff.isnan()].min()), abs=0.006)
    assert "x_1," not in out  # no list of 45 names anywhere


def test_summary_var_names_and_group_false(hmm_fit, capsys):
    hmm_fit.summary(var_names=["x"], group=False)
    out = capsys.readouterr().out
    assert "x_0 " in out and "x_44 " in out and "elements" not in out
    hmm_fit.summary(var_names="x_3")
    out = capsys.readouterr().out.split("Number of divergences")[0]
    assert "x_3 " in out and "x_4 " not in out
    with pytest.raises(ValueError, match=r"not sites of the run.*'x_0\.\.x_44'.*'x' selects"):
        hmm_fit.summary(var_names=["nope"])
    hmm_fit.summary(var_names="x_0..x_44")  # the label the summary prints names the group
    out = capsys.readouterr().out
    assert "x_0..x_44" in out and "elements" in out


def constant_element(y):
    with pyro.plate("p", 3):
        z = pyro.sample("z", dist.Bernoulli(torch.tensor([0.3, 1.0, 0.6])))
        pyro.sample("y", dist.Normal(z.float(), 1.0), obs=y)


def test_a_constant_element_leaves_the_others_ess_finite(capsys):
    fit = AutoSpec(constant_element, num_samples=40, seed=0, disable_progbar=True)
    fit.run(torch.zeros(3))
    assert (fit.get_samples()["z"][:, 1] == 1).all()
    diag = fit.diagnostics()["z"]
    assert diag["n_eff"][1].isnan() and diag["r_hat"][1].isnan()
    assert (
        torch.isfinite(diag["n_eff"][[0, 2]]).all() and torch.isfinite(diag["r_hat"][[0, 2]]).all()
    )
    fit.summary()
    assert "1 element(s) have n_eff nan" in capsys.readouterr().out


def test_effective_sample_size_per_element():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 300, 4, generator=gen)
    x[..., 1] = 3.0  # constant
    x[0, :, 2], x[1, :, 2] = 0.0, 1.0  # constant within each chain only
    ess = effective_sample_size(x)
    assert ess[1].isnan() and ess[2].isnan()
    together = stats.effective_sample_size(x[..., [0, 3]].double())
    torch.testing.assert_close(ess[[0, 3]], together)  # the same estimator, element by element
    rhat = split_gelman_rubin(x)
    assert rhat[1].isnan() and rhat[2] > 10 and abs(rhat[0] - 1) < 0.05


def test_one_chain_goes_to_arviz_without_warnings(hmm_fit, caplog):
    idata = hmm_fit.to_inference_data()
    assert idata.posterior["x_0"].shape == (2, 30)
    assert idata.posterior.attrs["chains_split_from"] == 1
    assert idata.sample_stats["lp"].shape == (2, 30)
    assert idata.log_likelihood["y_0"].shape == (2, 30)
    flat = idata.posterior["x_5"].values.reshape(-1)
    np.testing.assert_array_equal(flat, hmm_fit.get_samples()["x_5"].numpy())  # in order
    samples = hmm_fit.get_samples()
    varying = [k for k, v in samples.items() if v.std() > 0.3][:3]
    assert len(varying) == 3
    with caplog.at_level(logging.WARNING):
        table = az.summary(idata, var_names=varying)
    assert "Shape validation failed" not in caplog.text
    assert np.isfinite(table["r_hat"].values).all()
    assert hmm_fit.to_inference_data(split_chains=False).posterior["x_0"].shape == (1, 60)


@pytest.mark.parametrize(("draws", "chains"), [(45, 3), (7, 1), (8, 2), (13, 1)])
def test_export_chains_rule(hmm_fit, draws, chains):
    run = hmm_fit._run
    saved = run.num_samples
    run.num_samples = draws
    try:
        assert run.export_chains() == chains
    finally:
        run.num_samples = saved


@pytest.mark.parametrize("group", [False, True])
def test_the_summary_tells_chains_stuck_apart_from_a_site_the_data_fix(capsys, group):
    """Each chain constant at its own value (labels switched between chains) was explained as
    'all equal, as for a site the data fix' (found outside the project)."""
    fixed = torch.ones(2, 10, 1)
    stuck = torch.stack([torch.zeros(10, 1), torch.ones(10, 1)])
    mixing = torch.rand(2, 10, 1, generator=torch.Generator().manual_seed(0))
    print_summary({"a": fixed, "b": stuck, "c": mixing}, group=group)
    out = capsys.readouterr().out
    assert "1 element(s) have n_eff nan: their draws are all equal, in every chain" in out
    assert "1 element(s) have n_eff nan and r_hat inf: each chain holds one value" in out
