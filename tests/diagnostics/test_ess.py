"""The per-element ESS: Pyro's numbers, in memory linear in the number of draws."""

import pytest
import torch
from pyro.ops import stats

from pyro_autospec.diagnostics import effective_sample_size


@pytest.mark.parametrize("chains, draws", [(1, 200), (2, 101), (4, 1000), (3, 2), (1, 3)])
def test_the_ess_is_pyros(chains, draws):
    g = torch.Generator().manual_seed(chains * 1000 + draws)
    walk = torch.randn(chains, draws, 3, generator=g, dtype=torch.float64).cumsum(1) * 0.1
    x = walk + torch.randn(chains, draws, 3, generator=g, dtype=torch.float64)
    assert torch.equal(effective_sample_size(x), stats.effective_sample_size(x))


def test_the_ess_of_many_draws_fits_in_memory():
    """Pyro's running minimum is an ``[N, N]`` table: 80 GB for these 100,000 draws."""
    x = torch.randint(0, 2, (1, 100_000, 2), generator=torch.Generator().manual_seed(0))
    ess = effective_sample_size(x)
    assert ess.shape == (2,) and bool(((ess > 90_000) & (ess < 110_000)).all())


def test_an_element_one_chain_never_varied_keeps_pyros_ess():
    # a rare value that one chain never drew: that chain is constant, the others are not
    g = torch.Generator().manual_seed(0)
    x = (torch.rand(4, 50, 2, generator=g) < 0.3).double()
    x[0, :, 0] = 0.0
    ours = effective_sample_size(x)
    pyros = stats.effective_sample_size(x, chain_dim=0, sample_dim=1)
    assert bool(ours.isfinite().all())
    torch.testing.assert_close(ours, pyros, rtol=1e-12, atol=0)
