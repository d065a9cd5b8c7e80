"""AnyOrderGuide: the oracle contract, exactness of its draws for any weights, other data sets,
save/load, fit_to_samples."""

import io
import itertools

import numpy as np
import pytest
import torch

from pyro_autospec import sample_any_order
from pyro_autospec.engine.consistency import check_consistency
from pyro_autospec.guides import AnyOrderGuide
from pyro_autospec.model import enumerate_posterior
from tests.catalogue.guide_models import ising_chain, ising_cycle, mixed_sites, potts_triangle
from tests.stats import P_THRESHOLD, chisquare_pvalue

ARCHITECTURES = ["graph", "mlp", "transformer"]
POTTS_DATA = torch.tensor([0.2, 1.7, 0.9])


def _random_guide(architecture="mlp", scale=1.5, seed=0, model=potts_triangle, data=POTTS_DATA):
    """An UNTRAINED network with weights N(0, scale^2 / fan_in), the zero-initialised output
    layers included: rows far from the posterior and strongly inconsistent across orders."""
    torch.manual_seed(seed)
    guide = AnyOrderGuide(
        model, (data,), architecture=architecture, hidden_dim=16, num_layers=1, bp_iterations=2
    )
    with torch.no_grad():
        for param in guide.parameters():
            if param.dim() > 1:
                param.normal_(0.0, scale / param.shape[-1] ** 0.5)
            else:
                param.add_(torch.randn(param.shape) * 0.3)  # layer norms keep gains near 1
    return guide.eval()


def _bare_guide(n, q, architecture="mlp", scale=1.5, seed=0):
    torch.manual_seed(seed)
    guide = AnyOrderGuide(
        num_coords=n, num_values=q, architecture=architecture, hidden_dim=16, num_layers=1
    )
    with torch.no_grad():
        for param in guide.parameters():
            if param.dim() > 1:
                param.normal_(0.0, scale / param.shape[-1] ** 0.5)
    return guide.eval()


def _states(model=potts_triangle, data=POTTS_DATA):
    return enumerate_posterior(model, (data,))[0]


def _index(samples, states):
    lookup = {tuple(s): k for k, s in enumerate(states.tolist())}
    return np.array([lookup[tuple(s)] for s in samples.tolist()])


def _sequential_law(guide, states, order):
    """log q_sigma(x) for every state, by the chain rule with the network: DoubleTensor[M]."""
    orders = torch.as_tensor(order).expand(states.shape[0], -1)
    with torch.no_grad():
        return guide.sequential_log_prob(states, orders).sum(-1).double()


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_rows_ignore_unpinned_values(architecture):
    guide = _random_guide(architecture)
    gen = torch.Generator().manual_seed(1)
    values = torch.randint(0, 2, (64, 4), generator=gen)
    mask = torch.rand(64, 4, generator=gen) < 0.5
    other = torch.where(mask, values, torch.randint(0, 2, (64, 4), generator=gen))
    out = guide.log_marginals(values, mask)
    assert out.shape == (64, 4, 3)
    torch.testing.assert_close(out, guide.log_marginals(other, mask))
    assert torch.allclose(out.exp().sum(-1), torch.ones(64, 4), atol=1e-5)
    assert torch.isinf(out[:, 3, 2]).all()  # the Bernoulli coordinate has no value 2
    # The rows do depend on the pinned values and on the mask.
    assert not torch.allclose(out, guide.log_marginals(1 - values, mask))


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_targeted_rows_equal_full_rows(architecture):
    # The engine asks log_marginals_at when an oracle has it; it must be the gathered full row.
    guide = _random_guide(architecture)
    guide.chunk_size = 7  # several chunks
    gen = torch.Generator().manual_seed(2)
    values = torch.randint(0, 2, (40, 4), generator=gen)
    mask = torch.rand(40, 4, generator=gen) < 0.5
    targets = torch.randint(0, 4, (40, 3), generator=gen)
    full = guide.log_marginals(values, mask)
    at = guide.log_marginals_at(values, mask, targets)
    assert at.shape == (40, 3, 3)
    expected = full.gather(1, targets.unsqueeze(-1).expand(-1, -1, 3))
    torch.testing.assert_close(at, expected, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="targets must be"):
        guide.log_marginals_at(values, mask, targets[:3])


def test_support_of_each_site():
    guide = AnyOrderGuide(mixed_sites, hidden_dim=8)
    assert (guide.num_coords, guide.num_values, guide.architecture) == (3, 3, "graph")
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
    with pytest.raises(ValueError, match="reads the factor graph"):
        AnyOrderGuide(num_coords=2, num_values=2, architecture="graph")
    with pytest.raises(ValueError, match="hidden_dim"):
        AnyOrderGuide(num_coords=2, num_values=2, hidden_dim=0)
    guide = AnyOrderGuide(num_coords=2, num_values=2, hidden_dim=4)
    assert guide.architecture == "mlp"
    with pytest.raises(ValueError, match="values must be"):
        guide.log_marginals(torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 3).bool())
    with pytest.raises(ValueError, match="fit_posterior needs"):
        guide.fit_posterior(num_steps=1)
    with pytest.raises(ValueError, match="needs a guide built from a Pyro model"):
        guide.oracle(torch.zeros(2))


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_log_prob_is_the_chain_rule(architecture):
    guide = _random_guide(architecture)
    result = sample_any_order(guide, 32, seed=3)
    with torch.no_grad():
        expected = guide.sequential_log_prob(result.samples, result.orders).sum(-1).double()
    assert torch.allclose(result.log_prob, expected, atol=1e-4)


@pytest.mark.parametrize("method", ["autospec", "sequential"])
def test_exact_in_a_fixed_order(method):
    """Chi-square: draws in a FIXED order against the untrained network's own sequential law."""
    order = [2, 0, 3, 1]
    guide = _random_guide("graph", seed=2)
    states = _states()
    law = _sequential_law(guide, states, order).exp().numpy()
    # The network is inconsistent across orders: this law is not the law of another order.
    other = _sequential_law(guide, states, [0, 1, 2, 3]).exp().numpy()
    assert 0.5 * np.abs(law - other).sum() > 0.05
    result = sample_any_order(guide, 6000, method=method, seed=11, order=order)
    counts = np.bincount(_index(result.samples, states), minlength=states.shape[0])
    p = chisquare_pvalue(counts, law)
    assert p > P_THRESHOLD, f"chi-square p-value {p:.3g}"


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_exact_in_random_orders(architecture):
    """Chi-square: draws in random orders against the mixture of q_sigma over all 24 orders."""
    guide = _random_guide(architecture, seed=5)
    states = _states()
    laws = torch.stack(
        [_sequential_law(guide, states, o) for o in itertools.permutations(range(4))]
    ).exp()
    mixture = laws.mean(0).numpy()
    assert 0.5 * (laws - laws.mean(0)).abs().sum(-1).max() > 0.02  # inconsistent network
    result = sample_any_order(guide, 4000, seed=7)
    counts = np.bincount(_index(result.samples, states), minlength=states.shape[0])
    p = chisquare_pvalue(counts, mixture)
    assert p > P_THRESHOLD, f"chi-square p-value {p:.3g}"


def test_bare_oracle_rows():
    guide = _bare_guide(5, 3)
    gen = torch.Generator().manual_seed(1)
    values = torch.randint(0, 3, (16, 5), generator=gen)
    mask = torch.rand(16, 5, generator=gen) < 0.5
    out = guide.log_marginals(values, mask)
    assert torch.equal(out, guide.log_marginals(torch.where(mask, values, 0), mask))
    chain = guide.log_marginals_chain(values, torch.zeros_like(mask), torch.tensor([[0, 1]] * 16))
    first = guide.log_marginals_at(values, torch.zeros_like(mask), torch.zeros(16, 1).long())
    torch.testing.assert_close(chain[:, :1], first, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_save_load_identical_rows(architecture, tmp_path):
    data = torch.tensor([1.0, -0.5, 0.2, 0.9])
    guide = AnyOrderGuide(ising_chain, (data,), architecture=architecture, hidden_dim=16)
    guide.fit_to_samples(torch.randint(0, 2, (64, 4)), num_steps=5, disable_progbar=True)
    path = tmp_path / "guide.pt"
    guide.save(path)
    copy = AnyOrderGuide.load(path, ising_chain, (data,))
    assert copy.config == guide.config and copy.loss_history == guide.loss_history
    values = torch.randint(0, 2, (32, 4))
    mask = torch.rand(32, 4) < 0.5
    assert torch.equal(guide.log_marginals(values, mask), copy.log_marginals(values, mask))
    a = sample_any_order(guide, 16, seed=4)
    b = sample_any_order(copy, 16, seed=4)
    assert torch.equal(a.samples, b.samples) and torch.equal(a.log_prob, b.log_prob)
    # A plain state_dict loads into a guide built the same way; a different width refuses.
    fresh = AnyOrderGuide(ising_chain, (data,), architecture=architecture, hidden_dim=16)
    fresh.load_state_dict(torch.load(io.BytesIO(_state_bytes(guide))))
    assert torch.equal(fresh.log_marginals(values, mask), guide.log_marginals(values, mask))
    wrong = AnyOrderGuide(ising_chain, (data,), architecture=architecture, hidden_dim=8)
    with pytest.raises(RuntimeError):
        wrong.load_state_dict(torch.load(io.BytesIO(_state_bytes(guide))))


def _state_bytes(guide):
    buffer = io.BytesIO()
    torch.save(guide.state_dict(), buffer)
    return buffer.getvalue()


def test_a_loaded_guide_answers_for_the_data_it_is_loaded_with(tmp_path):
    data = torch.tensor([1.0, -0.5, 0.2, 0.9])
    guide = AnyOrderGuide(ising_chain, (data,))
    guide.save(tmp_path / "guide.pt")
    loaded = AnyOrderGuide.load(tmp_path / "guide.pt", ising_chain, (-data,))
    empty = torch.zeros(1, 4, dtype=torch.long)
    expected = guide.oracle(-data).log_marginals(empty, empty.bool())
    torch.testing.assert_close(loaded.log_marginals(empty, empty.bool()), expected)


def test_other_data_sets_and_families():
    data = torch.tensor([1.5, 1.5, 1.5, -1.5, -1.5, -1.5])
    guide = AnyOrderGuide(ising_cycle, (data,))
    flipped = guide.oracle(-data)
    empty = torch.zeros(1, 6, dtype=torch.long)
    own = guide.log_marginals(empty, empty.bool()).exp()[0, :, 1]
    other = flipped.log_marginals(empty, empty.bool()).exp()[0, :, 1]
    torch.testing.assert_close(other, 1 - own, atol=1e-5, rtol=1e-5)  # the spin-flip symmetry
    # The conditioned oracle is what the guide itself is for its own data.
    same = guide.oracle(data).log_marginals(empty, empty.bool())
    torch.testing.assert_close(same, guide.log_marginals(empty, empty.bool()))
    # A family: 200 draws for each of two data sets in one engine run.
    context = guide.context_for({"y": torch.stack([data, -data])})
    family = guide.conditioned(context, repeats=200)
    assert family.num_draws == 400
    rows = family.log_marginals(empty.expand(2, 6), empty.bool().expand(2, 6), draws=[199, 200])
    torch.testing.assert_close(rows[:1], guide.log_marginals(empty, empty.bool()))
    torch.testing.assert_close(rows[1:], flipped.log_marginals(empty, empty.bool()))
    draws = sample_any_order(family, 400, seed=0).samples.double()
    sign = torch.tensor([1.0, 1.0, 1.0, -1.0, -1.0, -1.0], dtype=torch.float64)
    assert float((draws[:200].mean(0) - draws[200:].mean(0)) @ sign) > 1.0
    with pytest.raises(ValueError, match="needs draws="):
        family.log_marginals(empty, empty.bool())
    with pytest.raises(ValueError, match="coordinates"):
        guide.oracle(torch.zeros(3))


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_the_engines_consistency_check_passes_on_guides_and_their_conditioned_oracles(
    architecture,
):
    """What ``consistent_queries = True`` on :class:`AnyOrderGuide` and ``ConditionedGuide``
    rests on (the engine then skips the check): the check passes on an untrained guide, on
    it conditioned on other data, and on a family of data sets."""
    guide = _random_guide(architecture)
    assert guide.consistent_queries and guide.oracle(-POTTS_DATA).consistent_queries
    check_consistency(guide)
    check_consistency(guide.oracle(-POTTS_DATA))
    context = guide.context_for({"y": torch.stack([POTTS_DATA, -POTTS_DATA])})
    check_consistency(guide.conditioned(context, repeats=3))


def test_fit_to_samples_moves_towards_the_data():
    n, q = 3, 2
    states = torch.tensor(list(itertools.product(range(q), repeat=n)))
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
    losses = guide.fit_to_samples(
        data, num_steps=300, lr=1e-2, lr_decay=0.1, seed=0, disable_progbar=True
    )
    after = tv()
    assert np.mean(losses[-30:]) < np.mean(losses[:30])
    assert after < 0.05 < before
    assert guide.loss_history == losses


@pytest.mark.parametrize("architecture", ["graph", "mlp"])
def test_fit_to_samples_refuses_a_value_outside_its_coordinates_support(architecture):
    """Engine coordinates [a, b0, b1] with q = 3: a = 2 is outside the Bernoulli's support.
    It was accepted: an infinite loss, then NaN weights, silently."""
    guide = AnyOrderGuide(mixed_sites, (), architecture=architecture)
    bad = torch.tensor([[0, 1, 2], [2, 0, 1]])
    with pytest.raises(ValueError, match=r"sample 1 gives coordinate 0 \(site 'a'.*value 2"):
        guide.fit_to_samples(bad, num_steps=2, disable_progbar=True)
    assert all(bool(torch.isfinite(p).all()) for p in guide.parameters())


def test_untrained_graph_guide_keeps_both_modes_of_a_symmetric_posterior():
    # Zero data: the posterior is symmetric under flipping every spin. The centred potentials
    # start belief propagation from each site's own (zero) evidence, so with nothing pinned
    # every marginal is 1/2 whatever the base assignment the structure was probed at.
    torch.manual_seed(0)
    guide = AnyOrderGuide(ising_cycle, (torch.zeros(6),), bp_iterations=3)
    values = torch.zeros(1, 6, dtype=torch.long)
    probs = guide.log_marginals(values, torch.zeros(1, 6, dtype=torch.bool)).exp()
    assert torch.allclose(probs, torch.full_like(probs, 0.5), atol=1e-5)
