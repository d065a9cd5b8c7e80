"""Every sampler runs as rounds through one loop (``engine.stepping.run_rounds``): its
progress bar shows, and showing it changes nothing."""

from __future__ import annotations

import pytest
import torch

from pyro_autospec.engine import sample_any_order
from pyro_autospec.engine.diffusion import sample_diffusion
from pyro_autospec.engine.diffusion_schedule import diffusion_times
from pyro_autospec.oracles import MarkovChainOracle
from pyro_autospec.oracles.denoisers import GaussianDenoiser

CHAIN = MarkovChainOracle([0.5, 0.5], [[0.9, 0.1], [0.2, 0.8]], 24)

DISCRETE = {
    "host plane (default autospec)": ("autospec", "fast", {}),
    "host plane, continuous batching": ("speculative", "fast", {"max_concurrent_draws": 2}),
    "lockstep chain rule": ("sequential", "fast", {}),
    "block rule (always on the reference engine)": ("autospec", "fast", {"token_below": 0}),
    "reference engine": ("autospec", "reference", {}),
}


@pytest.mark.parametrize("case", list(DISCRETE))
def test_discrete_samplers_show_progress_and_change_nothing(case, capsys):
    method, engine, knobs = DISCRETE[case]
    quiet = sample_any_order(CHAIN, 5, seed=4, method=method, engine=engine, schedule=knobs)
    shown = sample_any_order(
        CHAIN, 5, seed=4, method=method, engine=engine, progress=True, schedule=knobs
    )
    assert method in capsys.readouterr().err  # the bar, labelled with the method
    assert torch.equal(quiet.samples, shown.samples)
    assert (quiet.rounds, quiet.oracle_rows) == (shown.rounds, shown.oracle_rows)


DIFFUSION = {
    "lockstep Euler chain": ("sequential", {}),
    "Euler chain, continuous batching": ("sequential", {"max_concurrent_draws": 2}),
    "Picard": ("picard", {}),
    "autospec": ("autospec", {}),
}


@pytest.mark.parametrize("case", list(DIFFUSION))
def test_diffusion_samplers_show_progress_and_change_nothing(case, capsys):
    method, knobs = DIFFUSION[case]
    oracle = GaussianDenoiser(torch.zeros(2), torch.eye(2))
    times = diffusion_times(8, delta=0.05)
    quiet = sample_diffusion(oracle, 4, times=times, method=method, seed=2, schedule=knobs)
    shown = sample_diffusion(
        oracle, 4, times=times, method=method, seed=2, progress=True, schedule=knobs
    )
    assert capsys.readouterr().err  # a bar was drawn
    assert torch.equal(quiet.samples, shown.samples)
    assert (quiet.rounds, quiet.oracle_rows) == (shown.rounds, shown.oracle_rows)


def test_the_bar_is_redrawn_at_most_once_per_mininterval(capsys):
    """A cheap round takes microseconds: a redraw per round (a front-end message per round
    in a notebook) cost more than the sampling. 2,000 rounds in well under a second here."""
    chain = MarkovChainOracle([0.5, 0.5], [[0.9, 0.1], [0.2, 0.8]], 2000)
    result = sample_any_order(chain, 1, seed=0, method="sequential", progress=True)
    assert result.rounds == 2000
    final = capsys.readouterr().err
    assert final.count("\r") < 200 and "rounds=2000" in final  # the last state is shown
