"""StochasticLocalization: draws of X_T / T as a Pyro distribution; intractable log_prob."""

from __future__ import annotations

import pyro
import pytest
import torch
from scipy import stats

from pyro_autospec.distributions import StochasticLocalization
from pyro_autospec.engine.diffusion import sample_diffusion
from pyro_autospec.engine.methods import Schedule
from pyro_autospec.oracles.denoisers import FiniteSupportDenoiser, GaussianMixtureDenoiser

ALPHA = 2e-5


@pytest.fixture(autouse=True, scope="module")
def single_thread_torch():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def mixture():
    return GaussianMixtureDenoiser(
        torch.tensor([0.6, 0.4]),
        torch.tensor([[-1.5, 0.0], [1.5, 0.5]]),
        0.2 * torch.eye(2).expand(2, 2, 2),
    )


def test_sample_shape_seed_and_result():
    dist = StochasticLocalization(mixture(), num_steps=16, delta=0.05)
    assert dist.event_shape == (2,) and dist.batch_shape == ()
    pyro.set_rng_seed(0)
    draws = dist.sample((3, 4))
    assert draws.shape == (3, 4, 2) and draws.dtype == torch.float64
    assert dist.last_result.num_samples == 12 and dist.last_result.method == "autospec"
    pyro.set_rng_seed(0)
    assert torch.equal(dist.sample((3, 4)), draws)
    assert dist.expand((5,)).sample().shape == (5, 2)


def test_schedule_knobs_go_in_one_schedule_and_keywords_warn_at_the_callers_line():
    typed = StochasticLocalization(mixture(), num_steps=16, delta=0.05, schedule={"rule": "block"})
    with pytest.warns(FutureWarning, match=r"pass schedule=Schedule\(rule='block'\)") as caught:
        keywords = StochasticLocalization(mixture(), num_steps=16, delta=0.05, rule="block")
    assert {w.filename for w in caught if "schedule knobs" in str(w.message)} == {__file__}
    assert typed.sampler_options == keywords.sampler_options == {"schedule": Schedule(rule="block")}
    pyro.set_rng_seed(0)
    draws = typed.sample((4,))
    assert typed.last_result.schedule["rule"] == "block"
    pyro.set_rng_seed(0)
    assert torch.equal(keywords.sample((4,)), draws)


def test_law_matches_sequential_sampler():
    oracle = mixture()
    times = torch.tensor([0.0, 0.3, 1.0, 3.0, 8.0, 20.0], dtype=torch.float64)
    pyro.set_rng_seed(1)
    draws = StochasticLocalization(oracle, times).sample((1500,)).numpy()
    reference = sample_diffusion(
        oracle, 1500, times=times, method="sequential", seed=2
    ).samples.numpy()
    for i in range(2):
        assert stats.ks_2samp(draws[:, i], reference[:, i]).pvalue > ALPHA


def test_log_prob_raises_a_clear_error():
    dist = StochasticLocalization(FiniteSupportDenoiser(torch.eye(2)), num_steps=8)
    with pytest.raises(NotImplementedError, match="intractable.*EulerMaruyamaPath"):
        dist.log_prob(torch.zeros(2))

    def model():
        return pyro.sample("y", dist)

    trace = pyro.poutine.trace(model).get_trace()  # sampling inside a model works
    assert trace.nodes["y"]["value"].shape == (2,)


def test_errors():
    oracle = FiniteSupportDenoiser(torch.eye(2))
    with pytest.raises(ValueError, match=r"times\[0\] must be 0"):
        StochasticLocalization(oracle, torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="not both"):
        StochasticLocalization(oracle, torch.tensor([0.0, 2.0]), num_steps=4)
    with pytest.raises(ValueError, match="integer attribute `dim`"):
        StochasticLocalization(lambda t, x: x, num_steps=4)
