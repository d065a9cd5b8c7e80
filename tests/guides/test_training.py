"""fit_posterior lowers its objective and moves the guide towards an enumerable posterior."""

import itertools

import numpy as np
import pytest
import torch

from pyro_autospec.guides import AnyOrderGuide, fit_posterior
from pyro_autospec.infer.sites import enumerate_posterior
from tests.guides._models import ising_chain

DATA = torch.tensor([1.0, 0.5, -0.3, -1.0, 0.2])


def _mixture_tv(guide, states, log_post):
    """TV between the guide's random-order law (mean of q_sigma over all n! orders) and p."""
    n = states.shape[1]
    orders = torch.tensor(list(itertools.permutations(range(n))))
    num_states, num_orders = states.shape[0], orders.shape[0]
    x = states.repeat_interleave(num_orders, 0)
    with torch.no_grad():
        lq = guide.sequential_log_prob(x, orders.repeat(num_states, 1)).sum(-1)
    mixture = lq.reshape(num_states, num_orders).double().exp().mean(-1)
    return 0.5 * float((mixture - log_post.exp()).abs().sum())


@pytest.mark.parametrize("objective", ["reverse", "both"])
def test_fit_posterior_lowers_objective_and_tv(objective):
    torch.manual_seed(0)
    states, log_post = enumerate_posterior(ising_chain, (DATA,))
    guide = AnyOrderGuide(ising_chain, (DATA,), hidden_dim=32)
    before = _mixture_tv(guide, states, log_post)
    history = guide.fit_posterior(
        DATA, num_steps=100, num_particles=64, objective=objective, seed=1, disable_progbar=True
    )
    after = _mixture_tv(guide, states, log_post)
    assert np.mean(history[-10:]) < np.mean(history[:10])
    assert after < 0.5 * before and after < 0.15, (before, after)
    assert guide.loss_history == history


def test_fit_posterior_checks_its_arguments():
    guide = AnyOrderGuide(ising_chain, (DATA,), hidden_dim=8)
    with pytest.raises(ValueError, match="objective"):
        fit_posterior(guide, DATA, objective="elbo")
    with pytest.raises(ValueError, match="coordinates"):
        fit_posterior(guide, torch.zeros(3), num_steps=1)
    with pytest.raises(ValueError, match="num_particles"):
        fit_posterior(guide, DATA, num_particles=1)
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="lr_decay"):
            fit_posterior(guide, DATA, lr_decay=bad)


def test_learning_rate_decays_along_a_cosine(monkeypatch):
    # The rate of each Adam step: lr at the first, lr * lr_decay at the last.
    rates = []
    step = torch.optim.Adam.step

    def spy(self, *args, **kwargs):
        rates.append(self.param_groups[0]["lr"])
        return step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.Adam, "step", spy)
    guide = AnyOrderGuide(ising_chain, (DATA,), hidden_dim=8)
    guide.fit_posterior(
        DATA, num_steps=5, num_particles=4, lr=1e-2, lr_decay=0.1, seed=0, disable_progbar=True
    )
    assert len(rates) == 5
    assert rates[0] == pytest.approx(1e-2) and rates[-1] == pytest.approx(1e-3)
    assert all(a > b for a, b in zip(rates, rates[1:]))
