"""The keyed counter-based random numbers: the same bits everywhere, and uniform."""

from __future__ import annotations

import numpy as np
import scipy.stats
import torch

from pyro_autospec.engine import keys
from tests.stats import P_THRESHOLD


def _fmix_reference(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser written out on Python ints (the definition)."""
    mask = (1 << 64) - 1
    out = []
    for v in x.tolist():
        z = v & mask
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        z ^= z >> 31
        out.append(z - (1 << 64) if z >= 1 << 63 else z)
    return np.array(out, dtype=np.int64)


def test_cpu_and_torch_paths_give_the_same_bits():
    """The CPU path (NumPy uint64) and the path every other device runs (torch int64) agree
    bit for bit with the definition, so a GPU reads the same numbers as a CPU."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(-(2**63), 2**63 - 1, (5000,), generator=gen, dtype=torch.long)
    expected = torch.from_numpy(_fmix_reference(x.numpy()))
    assert torch.equal(keys._fmix(x), expected)
    assert torch.equal(keys._fmix_torch(x), expected)
    counter = torch.randint(0, 2**40, (5000,), generator=gen)
    torch_bits = keys._fmix_torch(x + (counter + 1) * keys._GAMMA)
    assert torch.equal(keys.bits(x, counter), torch_bits)


def test_host_numbers_match_the_device_arithmetic():
    """The host control plane's NumPy numbers (``host_*``) are the tensor functions' numbers:
    the same bits and uniforms as the torch arithmetic other devices run, and Gumbels equal to
    torch's formula up to the last bit of ``log``."""
    gen = torch.Generator().manual_seed(1)
    key = torch.randint(-(2**63), 2**63 - 1, (300, 1), generator=gen, dtype=torch.long)
    counter = torch.arange(7)
    device_bits = keys._fmix_torch(keys.stream(key, keys.Tag.DRAFT) + (counter + 1) * keys._GAMMA)
    host = keys.host_bits(key.numpy() ^ np.int64(keys.signed(keys.Tag.DRAFT)), counter.numpy())
    assert np.array_equal(host, device_bits.numpy())
    assert np.array_equal(
        keys.host_child(key.numpy(), keys.Tag.LEAF, counter.numpy()),
        keys.child(key, keys.Tag.LEAF, counter).numpy(),
    )
    device_u = keys._unit(device_bits)
    host_u = keys.host_uniform(key.numpy(), keys.Tag.DRAFT, counter.numpy())
    assert np.array_equal(host_u, device_u.numpy())
    assert np.array_equal(host_u, keys.uniform(key, keys.Tag.DRAFT, counter).numpy())
    host_g = keys.host_gumbel(key.numpy(), keys.Tag.DRAFT, counter.numpy())
    np.testing.assert_allclose(host_g, (-torch.log(-torch.log(device_u))).numpy(), rtol=1e-15)
    assert np.array_equal(host_g, keys.gumbel(key, keys.Tag.DRAFT, counter).numpy())
    np.testing.assert_array_equal(
        keys.host_log_uniform(key.numpy(), keys.Tag.ACCEPT, 3),
        keys.log(keys.uniform(key, keys.Tag.ACCEPT, 3)).numpy(),
    )


def test_uniforms_are_uniform_and_inside_the_unit_interval():
    u = keys.uniform(torch.tensor(keys.seed_key(1)), keys.Tag.DRAFT, torch.arange(200_000))
    assert float(u.min()) > 0.0 and float(u.max()) < 1.0
    counts = np.histogram(u.numpy(), bins=50, range=(0, 1))[0]
    assert scipy.stats.chisquare(counts).pvalue > P_THRESHOLD


def test_sibling_keys_give_independent_streams():
    """Pairs (first uniform of child i, first uniform of child i + 1) fill the unit square
    evenly: neighbouring keys are not correlated."""
    parent = torch.tensor(keys.seed_key(2))
    child = keys.child(parent, keys.Tag.THREAD, torch.arange(100_001))
    u = keys.uniform(child, keys.Tag.ACCEPT, 0).numpy()
    cells = (np.floor(u[:-1] * 10) * 10 + np.floor(u[1:] * 10)).astype(int)
    counts = np.bincount(cells, minlength=100)
    assert scipy.stats.chisquare(counts).pvalue > P_THRESHOLD


def test_gumbel_max_draws_categorical_probabilities():
    logits = torch.tensor([0.0, -1.0, 2.0, -3.0], dtype=torch.float64)
    g = keys.gumbel(
        torch.tensor(keys.seed_key(3)),
        keys.Tag.DRAFT,
        torch.arange(400_000).view(-1, 1) * 4 + torch.arange(4),
    )
    x = torch.argmax(logits + g, dim=1)
    counts = torch.bincount(x, minlength=4).numpy()
    probs = torch.softmax(logits, 0).numpy()
    assert scipy.stats.chisquare(counts, probs * counts.sum()).pvalue > P_THRESHOLD


def test_seed_keys_and_draw_keys():
    assert keys.seed_key(0) == keys.seed_key(0) != keys.seed_key(1)
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    assert keys.seed_key(g1) == keys.seed_key(g2)
    all_keys = keys.draw_keys(keys.seed_key(0), torch.arange(10))
    assert torch.equal(keys.draw_keys(keys.seed_key(0), torch.tensor([7, 2])), all_keys[[7, 2]])
    assert all_keys.unique().numel() == 10


def test_a_run_records_the_seed_that_repeats_it():
    """``seed=None`` or a generator: the run draws an int seed and records it
    (``result.seed``); ``seed=`` that int gives the same draws, on ``[q]^n`` and for a
    diffusion (before, such a run could not be repeated)."""
    from pyro_autospec import sample_any_order, sample_sde
    from pyro_autospec.oracles import MarkovChainOracle

    chain = MarkovChainOracle(torch.tensor([0.5, 0.5]), torch.tensor([[0.9, 0.1], [0.2, 0.8]]), 12)
    torch.manual_seed(3)
    fresh = sample_any_order(chain, 6)
    assert torch.equal(sample_any_order(chain, 6, seed=fresh.seed).samples, fresh.samples)
    torch.manual_seed(3)  # the global generator advanced once: manual_seed repeats the run
    assert sample_any_order(chain, 6).seed == fresh.seed
    drawn = sample_any_order(chain, 6, seed=np.random.default_rng(0))
    assert torch.equal(sample_any_order(chain, 6, seed=drawn.seed).samples, drawn.samples)
    assert sample_any_order(chain, 6, seed=2**64 - 1).seed == 2**64 - 1
    times = torch.linspace(0.0, 1.0, 9)
    path = sample_sde(lambda t, x: -x, times, torch.zeros(2), 3, seed=torch.Generator())
    again = sample_sde(lambda t, x: -x, times, torch.zeros(2), 3, seed=path.seed)
    assert torch.equal(again.samples, path.samples)
