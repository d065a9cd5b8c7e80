"""What a run tells its user: measured seconds per stage, rounds and rows of the whole run, a
faster exact method where one likely is, and output that stays short for many sites."""

import pyro
import pyro.distributions as dist
import pytest
import torch

from pyro_autospec.infer import AutoSpec
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
    return AutoSpec(chain, num_samples=200, num_chains=2, seed=0, disable_progbar=True).run(DATA)


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
    idata = fit.to_inference_data()
    assert idata.posterior.attrs["wall_time"] == pytest.approx(seconds["total"])


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


def test_a_faster_exact_method_is_named_when_rows_say_so(fit, capsys):
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
