"""Pyro models shared by test modules.

``CASES`` maps a name to ``(model, args, num_samples)``: small discrete posteriors whose exact
law is enumerable (a noisy Ising image, an HMM, mixed supports, a plate, one-hot sites), used by
the exactness and MAP tests of AutoSpec. ``conjugate_model`` is a continuous model with a known
Gaussian posterior (``exact_posterior``), used by the diffusion guide's tests.
"""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import torch


def ising_model(y, rows=2, cols=3, coupling=0.6, sigma=0.8):
    """A noisy Ising image: one Bernoulli site per pixel, pairwise factors, Gaussian pixels."""
    spins = {}
    for i in range(rows):
        for j in range(cols):
            z = pyro.sample(f"z_{i}_{j}", dist.Bernoulli(0.5))
            spins[i, j] = 2.0 * z - 1.0
            pyro.sample(f"y_{i}_{j}", dist.Normal(spins[i, j], sigma), obs=y[i, j])
            if i > 0:
                pyro.factor(f"h_{i}_{j}", coupling * spins[i, j] * spins[i - 1, j])
            if j > 0:
                pyro.factor(f"v_{i}_{j}", coupling * spins[i, j] * spins[i, j - 1])


def hmm_model(ys):
    trans = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.3, 0.3, 0.4]])
    locs = torch.tensor([-1.0, 0.5, 2.0])
    z = 0
    for t in pyro.markov(range(len(ys))):
        z = pyro.sample(f"z_{t}", dist.Categorical(trans[z]))
        pyro.sample(f"y_{t}", dist.Normal(locs[z], 1.0), obs=ys[t])


def mixed_model(y):
    a = pyro.sample("a", dist.Bernoulli(0.3))
    c = pyro.sample("c", dist.Categorical(torch.tensor([0.1, 0.2, 0.3, 0.4])))
    b = pyro.sample("b", dist.Binomial(2, 0.5))
    pyro.sample("y", dist.Normal(a + c - b, 1.0), obs=y)


def plated_model(y):
    g = pyro.sample("g", dist.Categorical(torch.tensor([0.4, 0.6])))
    probs = torch.tensor([0.2, 0.7])[g]
    with pyro.plate("data", len(y)):
        local = pyro.sample("local", dist.Bernoulli(probs))
        pyro.sample("y", dist.Normal(local + g, 0.8), obs=y)


def onehot_model(y):
    w = pyro.sample("w", dist.Bernoulli(0.6))
    with pyro.plate("p", 2):
        z = pyro.sample("z", dist.OneHotCategorical(torch.tensor([0.2, 0.5, 0.3])))
        mean = (z * torch.tensor([-1.0, 0.0, 1.5])).sum(-1) + w
        pyro.sample("y", dist.Normal(mean, 0.7), obs=y)


def unit_plate_model(y):
    """A site in a plate of size 1 that sites outside the plate read (its evidence is
    reduced over the plate before it is summed out)."""
    with pyro.plate("one", 1):
        b = pyro.sample("b", dist.Bernoulli(0.3))
    p0, p1 = torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.1, 0.2, 0.7])
    c = pyro.sample("c", dist.Categorical(p0 + b.unsqueeze(-1) * (p1 - p0)))
    pyro.sample("y", dist.Normal(b + c, 1.0), obs=y)


CASES = {
    "ising_2x3": (ising_model, (torch.tensor([[0.9, -0.2, 1.1], [0.3, -1.0, 0.5]]),), 3000),
    "hmm_markov": (hmm_model, (torch.tensor([-0.5, 0.3, 2.2, 1.0]),), 3000),
    "mixed_supports": (mixed_model, (torch.tensor(1.3),), 2000),
    "plated_global_local": (plated_model, (torch.tensor([0.1, 1.4, 1.9]),), 2000),
    "onehot": (onehot_model, (torch.tensor([1.2, -0.4]),), 2000),
}


OBS_SD = 0.5


def conjugate_model(y):
    """Conjugate: loc ~ N(0, I_2), log(scale) ~ N(0, 1), y | . ~ N((loc, log scale), 0.5^2)."""
    loc = pyro.sample("loc", dist.Normal(torch.zeros(2), 1.0).to_event(1))
    scale = pyro.sample("scale", dist.LogNormal(0.0, 1.0))
    with pyro.plate("data", y.shape[0]):
        pyro.sample("y_loc", dist.Normal(loc, OBS_SD).to_event(1), obs=y[:, :2])
        pyro.sample("y_log", dist.Normal(scale.log(), OBS_SD), obs=y[:, 2])


def exact_posterior(y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and covariance of (loc, log scale) given y: Tensor[3], Tensor[3, 3] (float64)."""
    precision = 1.0 + y.shape[0] / OBS_SD**2
    mean = y.double().sum(0) / OBS_SD**2 / precision
    return mean, torch.eye(3, dtype=torch.float64) / precision
