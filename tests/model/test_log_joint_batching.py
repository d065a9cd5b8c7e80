"""Values that lose the draws' batch dimension get a clear error, not a wrong log joint."""

import pyro
import pyro.distributions as dist
import pytest
import torch

from pyro_autospec.model import AutoSpecModelError, discover_sites, log_joint


def chain_without_keepdim(y):
    with pyro.plate("sites", 4):
        s = pyro.sample("s", dist.Bernoulli(0.5))
    spins = 2 * s - 1
    pyro.factor("coupling", 0.7 * (spins[..., 1:] * spins[..., :-1]).sum(-1))  # no keepdim
    pyro.sample("y", dist.Normal(0.0, 1.0), obs=y)


def chain_with_keepdim(y):
    with pyro.plate("sites", 4):
        s = pyro.sample("s", dist.Bernoulli(0.5))
    spins = 2 * s - 1
    pyro.factor("coupling", 0.7 * (spins[..., 1:] * spins[..., :-1]).sum(-1, keepdim=True))
    pyro.sample("y", dist.Normal(0.0, 1.0), obs=y)


def test_mixing_draws_is_an_error():
    y = torch.tensor(0.3)
    layout = discover_sites(chain_without_keepdim, (y,), {})
    values = {"s": torch.tensor([[0.0, 0, 0, 0], [1, 0, 1, 0], [1, 1, 1, 1], [0, 1, 1, 0]])}
    with pytest.raises(AutoSpecModelError, match="keepdim=True"):
        log_joint(chain_without_keepdim, (y,), {}, layout, values)


def test_keepdim_model_matches_per_draw_values():
    y = torch.tensor(0.3)
    layout = discover_sites(chain_with_keepdim, (y,), {})
    values = {"s": torch.tensor([[0.0, 0, 0, 0], [1, 0, 1, 0], [1, 1, 1, 1], [0, 1, 1, 0]])}
    batched = log_joint(chain_with_keepdim, (y,), {}, layout, values)
    alone = torch.cat(
        [log_joint(chain_with_keepdim, (y,), {}, layout, {"s": v[None]}) for v in values["s"]]
    )
    torch.testing.assert_close(batched, alone)
