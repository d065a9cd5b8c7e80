"""The shared Adam loop, fit_posterior and fit_simulation move guides towards posteriors."""

import functools
import itertools

import numpy as np
import pytest
import torch

from pyro_autospec.guides import AnyOrderGuide, fit_posterior, train
from pyro_autospec.model import enumerate_posterior
from tests.catalogue.guide_models import generative_pairs, ising_chain, ising_cycle

DATA = torch.tensor([1.0, 0.5, -0.3, -1.0, 0.2])
CYCLE_DATA = torch.tensor([0.4, -1.0, 0.3, 1.2, -0.2, 0.8])


def _mixture_tv(guide, model, data, oracle=None):
    """TV between the guide's random-order law (mean of q_sigma over all n! orders) and p."""
    states, log_post = enumerate_posterior(model, (data,))
    n = states.shape[1]
    orders = torch.tensor(list(itertools.permutations(range(n))))
    num_states, num_orders = states.shape[0], orders.shape[0]
    x = states.repeat_interleave(num_orders, 0)
    context = None if oracle is None else oracle.context
    with torch.no_grad():
        lq = guide.sequential_log_prob(x, orders.repeat(num_states, 1), context=context).sum(-1)
    mixture = lq.reshape(num_states, num_orders).double().exp().mean(-1)
    return 0.5 * float((mixture - log_post.exp()).abs().sum())


def test_train_runs_a_cosine_schedule(monkeypatch):
    rates = []
    step = torch.optim.Adam.step

    def spy(self, *args, **kwargs):
        rates.append(self.param_groups[0]["lr"])
        return step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.Adam, "step", spy)
    layer = torch.nn.Linear(2, 1)
    layer.loss_history = []

    def step_loss(i):
        loss = layer(torch.ones(1, 2)).pow(2).sum()
        return loss, float(loss.detach())

    history = train(layer, step_loss, num_steps=5, lr=1e-2, lr_decay=0.1, disable_progbar=True)
    assert len(history) == 5 and layer.loss_history == history and not layer.training
    assert rates[0] == pytest.approx(1e-2) and rates[-1] == pytest.approx(1e-3)
    assert all(a > b for a, b in zip(rates, rates[1:]))
    rates.clear()
    train(layer, step_loss, num_steps=3, lr=1e-2, disable_progbar=True)
    assert rates == [pytest.approx(1e-2)] * 3
    # A time budget stops the loop early.
    few = train(layer, step_loss, num_steps=10**6, lr=1e-3, max_seconds=0.05, disable_progbar=True)
    assert 1 <= len(few) < 10**6


def test_train_checks_its_arguments():
    layer = torch.nn.Linear(1, 1)

    def step_loss(i):
        return layer(torch.ones(1, 1)).sum(), 0.0

    with pytest.raises(ValueError, match="num_steps"):
        train(layer, step_loss, num_steps=0, lr=1e-3)
    with pytest.raises(ValueError, match="lr_decay"):
        train(layer, step_loss, num_steps=1, lr=1e-3, lr_decay=2.0)
    with pytest.raises(ValueError, match="no trainable parameters"):
        train(torch.nn.Identity(), step_loss, num_steps=1, lr=1e-3)


@pytest.mark.parametrize("objective", ["reverse", "both"])
def test_fit_posterior_lowers_objective_and_tv(objective):
    torch.manual_seed(0)
    guide = AnyOrderGuide(ising_chain, (DATA,), architecture="mlp", hidden_dim=32)
    before = _mixture_tv(guide, ising_chain, DATA)
    history = guide.fit_posterior(
        DATA, num_steps=100, num_particles=64, objective=objective, seed=1, disable_progbar=True
    )
    after = _mixture_tv(guide, ising_chain, DATA)
    assert np.mean(history[-10:]) < np.mean(history[:10])
    assert after < 0.5 * before and after < 0.15, (before, after)
    assert guide.loss_history == history


def test_fit_posterior_corrects_belief_propagation_on_a_loop():
    # One round of BP on a strongly coupled 5-ring (the centred potentials make BP with more
    # rounds nearly exact here, TV 0.01, which leaves the network nothing to learn).
    model = functools.partial(ising_cycle, coupling=1.5)
    data = CYCLE_DATA[:5]
    torch.manual_seed(0)
    guide = AnyOrderGuide(model, (data,), bp_iterations=1, num_layers=1)
    before = _mixture_tv(guide, model, data)
    guide.fit_posterior(
        num_steps=40,
        num_particles=128,
        objective="forward",
        lr=1e-2,
        seed=0,
        disable_progbar=True,
    )
    after = _mixture_tv(guide, model, data)
    assert before > 0.1 and after < 0.7 * before, (before, after)


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


def test_fit_simulation_amortises_over_data_sets():
    """An MLP trained on simulated (x, data) pairs gets closer to the posterior of data sets
    it never saw, with no retraining."""
    torch.manual_seed(0)
    data = torch.zeros(5)
    guide = AnyOrderGuide(generative_pairs, (data,), architecture="mlp", hidden_dim=64)
    held_out = [
        torch.tensor([1.0, 0.8, -0.9, -1.2, 0.3]),
        torch.tensor([-0.5, 1.1, 1.0, 0.2, -1.0]),
    ]

    def tv():
        return np.mean([_mixture_tv(guide, generative_pairs, d, guide.oracle(d)) for d in held_out])

    before = tv()
    losses = guide.fit_simulation(
        4000, num_steps=400, batch_size=128, lr=3e-3, seed=0, disable_progbar=True
    )
    after = tv()
    assert len(losses) == 400 and np.mean(losses[-40:]) < np.mean(losses[:40])
    assert after < 0.5 * before, (before, after)


def test_fit_simulation_with_factors_fits_each_simulated_posterior():
    guide = AnyOrderGuide(ising_cycle, (CYCLE_DATA,), num_layers=1)
    with pytest.raises(ValueError, match="pyro.factor"):
        guide.fit_simulation(8, objective="likelihood", num_steps=1, disable_progbar=True)
    with pytest.raises(ValueError, match="objective"):
        guide.fit_simulation(8, objective="elbo")
    history = guide.fit_simulation(
        16, num_steps=3, num_particles=16, datasets_per_step=4, seed=0, disable_progbar=True
    )
    assert len(history) == 3 and all(np.isfinite(history))
