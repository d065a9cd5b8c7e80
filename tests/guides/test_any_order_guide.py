"""AnyOrderGuide: the oracle contract, exactness of its draws, save/load, fit_to_samples."""

import io
import itertools

import numpy as np
import pytest
import torch

from pyro_autospec import sample_any_order
from pyro_autospec.guides import AnyOrderGuide
from tests.guides._models import ising_chain, mixed_sites
from tests.stats import P_THRESHOLD, chisquare_pvalue, state_index

ARCHITECTURES = ["mlp", "transformer"]


def _random_guide(n, q, architecture="mlp", scale=1.5, seed=0):
    """An UNTRAINED network with weights N(0, scale^2 / fan_in): rows far from uniform and
    strongly inconsistent across orders."""
    torch.manual_seed(seed)
    guide = AnyOrderGuide(
        num_coords=n, num_values=q, architecture=architecture, hidden_dim=16, num_layers=1
    )
    with torch.no_grad():
        for param in guide.parameters():
            if param.dim() > 1:
                param.normal_(0.0, scale / param.shape[-1] ** 0.5)
    return guide.eval()


def _all_states(n, q):
    return torch.tensor(list(itertools.product(range(q), repeat=n)))


def _sequential_law(guide, states, order):
    """log q_sigma(x) for every state, by the chain rule with the network: DoubleTensor[M]."""
    orders = torch.as_tensor(order).expand(states.shape[0], -1)
    with torch.no_grad():
        return guide.sequential_log_prob(states, orders).sum(-1).double()


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_rows_ignore_unpinned_values(architecture):
    guide = _random_guide(5, 3, architecture)
    gen = torch.Generator().manual_seed(1)
    values = torch.randint(0, 3, (64, 5), generator=gen)
    mask = torch.rand(64, 5, generator=gen) < 0.5
    other = torch.where(mask, values, torch.randint(0, 3, (64, 5), generator=gen))
    out = guide.log_marginals(values, mask)
    assert out.shape == (64, 5, 3)
    assert torch.equal(out, guide.log_marginals(other, mask))
    assert torch.allclose(out.exp().sum(-1), torch.ones(64, 5), atol=1e-5)
    # The rows do depend on the pinned values and on the mask.
    assert not torch.allclose(out, guide.log_marginals((values + 1) % 3, mask))


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_targeted_rows_equal_full_rows(architecture):
    # The engine asks log_marginals_at when an oracle has it; it must be the gathered full row.
    guide = _random_guide(6, 3, architecture)
    guide.chunk_size = 7  # several chunks
    gen = torch.Generator().manual_seed(2)
    values = torch.randint(0, 3, (40, 6), generator=gen)
    mask = torch.rand(40, 6, generator=gen) < 0.5
    targets = torch.randint(0, 6, (40, 4), generator=gen)
    full = guide.log_marginals(values, mask)
    at = guide.log_marginals_at(values, mask, targets)
    assert at.shape == (40, 4, 3)
    expected = full.gather(1, targets.unsqueeze(-1).expand(-1, -1, 3))
    torch.testing.assert_close(at, expected, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="targets must be"):
        guide.log_marginals_at(values, mask, targets[:3])


def test_targeted_rows_respect_each_sites_support():
    guide = AnyOrderGuide(mixed_sites, hidden_dim=8)
    values = torch.zeros(2, 3, dtype=torch.long)
    targets = torch.arange(3).expand(2, 3)
    at = guide.log_marginals_at(values, values.bool(), targets)
    assert torch.equal(torch.isinf(at), torch.isinf(guide.log_marginals(values, values.bool())))


def test_support_of_each_site():
    guide = AnyOrderGuide(mixed_sites, hidden_dim=8)
    assert (guide.num_coords, guide.num_values) == (3, 3)
    out = guide.log_marginals(torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 3).bool())
    assert torch.isinf(out[:, 0, 2]).all() and torch.isfinite(out[:, 1:]).all()
    guide.layout.check_oracle(guide)
    draws = sample_any_order(guide, 200, seed=0).samples
    assert bool((draws[:, 0] < 2).all())


def test_bad_arguments():
    with pytest.raises(ValueError, match="num_coords"):
        AnyOrderGuide()
    with pytest.raises(ValueError, match="architecture"):
        AnyOrderGuide(num_coords=2, num_values=2, architecture="rnn")
    guide = AnyOrderGuide(num_coords=2, num_values=2, hidden_dim=4)
    with pytest.raises(ValueError, match="values must be"):
        guide.log_marginals(torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 3).bool())
    with pytest.raises(ValueError, match="fit_posterior needs"):
        guide.fit_posterior(num_steps=1)


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_log_prob_is_the_chain_rule(architecture):
    guide = _random_guide(6, 2, architecture)
    result = sample_any_order(guide, 32, seed=3)
    with torch.no_grad():
        expected = guide.sequential_log_prob(result.samples, result.orders).sum(-1).double()
    assert torch.allclose(result.log_prob, expected, atol=1e-4)


@pytest.mark.parametrize("method", ["autospec", "sequential"])
def test_exact_in_a_fixed_order(method):
    """Chi-square: draws in a FIXED order against the untrained network's own sequential law."""
    n, q, order = 4, 3, [2, 0, 3, 1]
    guide = _random_guide(n, q, seed=2)
    states = _all_states(n, q)
    law = _sequential_law(guide, states, order).exp().numpy()
    # The network is inconsistent across orders: this law is not the law of another order.
    other = _sequential_law(guide, states, [0, 1, 2, 3]).exp().numpy()
    assert 0.5 * np.abs(law - other).sum() > 0.1
    result = sample_any_order(guide, 6000, method=method, seed=11, order=order)
    counts = np.bincount(state_index(result.samples, q), minlength=q**n)
    p = chisquare_pvalue(counts, law)
    assert p > P_THRESHOLD, f"chi-square p-value {p:.3g}"


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_exact_in_random_orders(architecture):
    """Chi-square: draws in random orders against the mixture of q_sigma over all 24 orders."""
    n, q = 4, 2
    guide = _random_guide(n, q, architecture, seed=5)
    states = _all_states(n, q)
    laws = torch.stack(
        [_sequential_law(guide, states, o) for o in itertools.permutations(range(n))]
    ).exp()
    mixture = laws.mean(0).numpy()
    assert 0.5 * (laws - laws.mean(0)).abs().sum(-1).max() > 0.1  # inconsistent network
    result = sample_any_order(guide, 3000, seed=7)
    counts = np.bincount(state_index(result.samples, q), minlength=q**n)
    p = chisquare_pvalue(counts, mixture)
    assert p > P_THRESHOLD, f"chi-square p-value {p:.3g}"


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_save_load_identical_rows(architecture, tmp_path):
    data = torch.tensor([1.0, -0.5, 0.2, 0.9])
    guide = AnyOrderGuide(ising_chain, (data,), architecture=architecture, hidden_dim=16)
    guide.fit_to_samples(torch.randint(0, 2, (64, 4)), num_steps=5, disable_progbar=True)
    path = tmp_path / "guide.pt"
    torch.save(guide.state_dict(), path)
    copy = AnyOrderGuide(ising_chain, (data,), architecture=architecture, hidden_dim=16)
    copy.load_state_dict(torch.load(path))
    values = torch.randint(0, 2, (32, 4))
    mask = torch.rand(32, 4) < 0.5
    assert torch.equal(guide.log_marginals(values, mask), copy.log_marginals(values, mask))
    a = sample_any_order(guide, 16, seed=4)
    b = sample_any_order(copy, 16, seed=4)
    assert torch.equal(a.samples, b.samples) and torch.equal(a.log_prob, b.log_prob)
    wrong = AnyOrderGuide(ising_chain, (data,), architecture=architecture, hidden_dim=8)
    with pytest.raises(RuntimeError):
        wrong.load_state_dict(torch.load(io.BytesIO(path.read_bytes())))


def test_fit_to_samples_moves_towards_the_data():
    n, q = 3, 2
    states = _all_states(n, q)
    target = torch.tensor([0.4, 0.02, 0.02, 0.06, 0.06, 0.02, 0.02, 0.4], dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    data = states[torch.multinomial(target, 4000, replacement=True, generator=gen)]
    torch.manual_seed(0)
    guide = AnyOrderGuide(num_coords=n, num_values=q, hidden_dim=32)

    def tv():
        laws = torch.stack(
            [_sequential_law(guide, states, o) for o in itertools.permutations(range(n))]
        )
        return 0.5 * float((laws.exp().mean(0) - target).abs().sum())

    before = tv()
    losses = guide.fit_to_samples(data, num_steps=300, lr=1e-2, seed=0, disable_progbar=True)
    after = tv()
    assert np.mean(losses[-30:]) < np.mean(losses[:30])
    assert after < 0.05 < before
    assert guide.loss_history == losses
