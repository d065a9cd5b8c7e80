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


def ising_cycle(data, coupling=1.2, noise=1.5):
    """An Ising ring (one loop: belief propagation is NOT exact on it)."""
    n = data.shape[-1]
    with pyro.plate("sites", n):
        z = pyro.sample("z", dist.Bernoulli(0.5))
    s = 2.0 * z - 1.0
    ring = s * torch.roll(s, 1, dims=-1)
    pyro.factor("coupling", coupling * ring.sum(-1, keepdim=True))
    with pyro.plate("obs", n):
        pyro.sample("y", dist.Normal(s, noise), obs=data)


def potts_triangle(data):
    """Three 3-state sites on a triangle (Potts coupling) and a 2-state site joined to site 0;
    Gaussian observations of the 3-state sites. Mixed support sizes, q = 3."""
    with pyro.plate("sites", 3):
        x = pyro.sample("x", dist.Categorical(torch.ones(3) / 3))
    b = pyro.sample("b", dist.Bernoulli(0.4))
    same = (x[..., 0] == x[..., 1]).float() + (x[..., 1] == x[..., 2]).float()
    same = same + (x[..., 0] == x[..., 2]).float()
    pyro.factor("potts", 0.9 * same.unsqueeze(-1))
    pyro.factor("link", 1.5 * b * (x[..., :1] == 2).float())
    with pyro.plate("obs", 3):
        pyro.sample("y", dist.Normal(x.float(), 1.0), obs=data)


def generative_pairs(data, noise=0.7):
    """A generative model (no pyro.factor): a hidden pair chain z0 -> z1 -> ... with
    Gaussian observations; forward simulation draws its joint."""
    n = data.shape[-1]
    z = pyro.sample("z0", dist.Bernoulli(0.5))
    zs = [z]
    for i in range(1, n):
        z = pyro.sample(f"z{i}", dist.Bernoulli(0.15 + 0.7 * z))
        zs.append(z)
    s = 2.0 * torch.stack(zs, -1) - 1.0
    pyro.sample("y", dist.Normal(s, noise).to_event(1), obs=data)


def mixed_sites():
    """A Bernoulli site and a plate of three-valued Categorical sites (q = 3)."""
    a = pyro.sample("a", dist.Bernoulli(0.3))
    with pyro.plate("p", 2):
        pyro.sample("b", dist.Categorical(torch.tensor([0.2, 0.3, 0.5])))
    return a
