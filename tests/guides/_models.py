"""Small enumerable models shared by the guide tests."""

import pyro
import pyro.distributions as dist
import torch


def ising_chain(data, coupling=0.8, noise=1.0):
    """A noisy 1-D Ising chain: spins z in {0, 1}, Gaussian observations of 2z - 1."""
    n = data.shape[-1]
    with pyro.plate("sites", n):
        z = pyro.sample("z", dist.Bernoulli(0.5))
    s = 2.0 * z - 1.0
    # keepdim: the factor's batch dimension stays at the plate's position under outer plates.
    pyro.factor("coupling", coupling * (s[..., 1:] * s[..., :-1]).sum(-1, keepdim=True))
    with pyro.plate("obs", n):
        pyro.sample("y", dist.Normal(s, noise), obs=data)


def mixed_sites():
    """A Bernoulli site and a plate of three-valued Categorical sites (q = 3)."""
    a = pyro.sample("a", dist.Bernoulli(0.3))
    with pyro.plate("p", 2):
        pyro.sample("b", dist.Categorical(torch.tensor([0.2, 0.3, 0.5])))
    return a
