"""Three small models with continuous AND discrete latent sites, and their exact posteriors.

Each exact posterior is computed by hand, without pyro_autospec and without MCMC: the discrete
sites are summed out analytically and the continuous ones integrated on a fine grid. The
models are the ones the front end is validated on (tests/infer/test_mixed.py) and benchmarked
on (benchmarks/mixed_models.py): a Gaussian mixture, an HMM with an unknown transition matrix
and a change-point model.
"""

from __future__ import annotations

import math

import pyro
import pyro.distributions as dist
import torch
from pyro.ops.indexing import Vindex

# ---------------------------------------------------------------------- a Gaussian mixture
MIXTURE_DATA = torch.tensor([-2.3, -1.6, -2.9, 1.4, 2.2, 0.4])
MIXTURE_PRIOR_LOCS = (-2.0, 2.0)


def mixture(data):
    """Two Gaussian components with known weights and scale, unknown locations."""
    with pyro.plate("components", 2):
        locs = pyro.sample("locs", dist.Normal(torch.tensor(MIXTURE_PRIOR_LOCS), 1.0))
    with pyro.plate("data", len(data)):
        assignment = pyro.sample("assignment", dist.Categorical(torch.tensor([0.5, 0.5])))
        pyro.sample("obs", dist.Normal(Vindex(locs)[..., assignment], 1.0), obs=data)


def mixture_exact(data=MIXTURE_DATA, points: int = 241) -> dict[str, torch.Tensor]:
    """Posterior means of ``locs`` [2] and ``assignment`` [N] by a 2-D grid."""
    grid = torch.linspace(-6.0, 6.0, points, dtype=torch.float64)
    l0, l1 = torch.meshgrid(grid, grid, indexing="ij")
    data = data.double()
    log_prior = dist.Normal(MIXTURE_PRIOR_LOCS[0], 1.0).log_prob(l0) + dist.Normal(
        MIXTURE_PRIOR_LOCS[1], 1.0
    ).log_prob(l1)
    comp0 = math.log(0.5) + dist.Normal(l0[..., None], 1.0).log_prob(data)  # [G, G, N]
    comp1 = math.log(0.5) + dist.Normal(l1[..., None], 1.0).log_prob(data)
    per_point = torch.logaddexp(comp0, comp1)
    log_post = log_prior + per_point.sum(-1)
    weights = (log_post - log_post.logsumexp((0, 1))).exp()
    p_one = (comp1 - per_point).exp()  # P(assignment = 1 | locs, y)
    return {
        "locs": torch.stack([(weights * l0).sum(), (weights * l1).sum()]),
        "assignment": (weights[..., None] * p_one).sum((0, 1)),
    }


# --------------------------------------------------------------- an HMM, unknown transitions
HMM_DATA = torch.tensor([-1.2, -0.8, 0.9, 1.3, 1.1, -0.4, -1.0, 0.7])
HMM_LOCS = torch.tensor([-1.0, 1.0])


def hmm_unknown_transition(data):
    """Two hidden states; the probability of staying is unknown (Beta prior)."""
    stay = pyro.sample("stay", dist.Beta(2.0, 2.0))
    trans = torch.stack([torch.stack([stay, 1 - stay], -1), torch.stack([1 - stay, stay], -1)], -2)
    x = 0
    for t in pyro.markov(range(len(data))):
        x = pyro.sample(f"x_{t}", dist.Categorical(Vindex(trans)[..., x, :]))
        pyro.sample(f"y_{t}", dist.Normal(Vindex(HMM_LOCS)[..., x], 0.8), obs=data[t])


def hmm_exact(data=HMM_DATA, points: int = 2001) -> dict[str, torch.Tensor]:
    """Posterior means of ``stay`` and of every ``x_t`` by forward-backward on a grid."""
    stay = torch.linspace(0.0, 1.0, points + 2, dtype=torch.float64)[1:-1]
    emit = dist.Normal(HMM_LOCS.double(), 0.8).log_prob(data.double()[:, None]).exp()  # [T, 2]
    trans = torch.stack(
        [torch.stack([stay, 1 - stay], -1), torch.stack([1 - stay, stay], -1)], -2
    )  # [G, 2, 2]
    T = len(data)
    alpha = trans[:, 0, :] * emit[0]  # from x_{-1} = 0
    scales = [alpha.sum(-1)]
    alpha = alpha / scales[-1][:, None]
    alphas = [alpha]
    for t in range(1, T):
        alpha = (alpha[:, None, :] @ trans).squeeze(-2) * emit[t]
        scales.append(alpha.sum(-1))
        alpha = alpha / scales[-1][:, None]
        alphas.append(alpha)
    log_like = torch.stack(scales).log().sum(0)
    log_post = dist.Beta(2.0, 2.0).log_prob(stay) + log_like
    weights = (log_post - log_post.logsumexp(0)).exp()
    beta = torch.ones_like(alpha)
    marginals = [None] * T
    for t in range(T - 1, -1, -1):
        m = alphas[t] * beta
        marginals[t] = m / m.sum(-1, keepdim=True)
        if t > 0:
            beta = (trans @ (emit[t] * beta)[..., None]).squeeze(-1)
            beta = beta / beta.sum(-1, keepdim=True)
    x_means = torch.stack([(weights[:, None] * m).sum(0)[1] for m in marginals])
    return {"stay": (weights * stay).sum(), "x": x_means}


# ------------------------------------------------------------------------- a change point
CHANGE_DATA = torch.tensor([4.0, 5.0, 3.0, 6.0, 4.0, 1.0, 0.0, 2.0, 1.0, 1.0])


def change_point(counts):
    """Poisson counts whose rate changes once, at an unknown time ``tau``."""
    T = len(counts)
    early = pyro.sample("early", dist.Gamma(2.0, 0.5))
    late = pyro.sample("late", dist.Gamma(2.0, 0.5))
    tau = pyro.sample("tau", dist.Categorical(torch.ones(T) / T))
    with pyro.plate("time", T):
        rate = torch.where(torch.arange(T) < tau, early, late)
        pyro.sample("counts", dist.Poisson(rate), obs=counts)


def change_point_exact(counts=CHANGE_DATA, points: int = 301) -> dict[str, torch.Tensor]:
    """Posterior means of ``early``, ``late`` and ``tau`` by a 2-D grid and a sum over tau."""
    grid = torch.linspace(1e-3, 20.0, points, dtype=torch.float64)
    counts = counts.double()
    T = len(counts)
    log_prior = dist.Gamma(2.0, 0.5).log_prob(grid)
    early_lp = dist.Poisson(grid[:, None]).log_prob(counts)  # [G, T]
    late_lp = dist.Poisson(grid[:, None]).log_prob(counts)
    # sum_{t < tau} early + sum_{t >= tau} late, for every tau
    early_cum = torch.cat([torch.zeros(points, 1, dtype=torch.float64), early_lp.cumsum(-1)], -1)
    late_cum = late_lp.flip(-1).cumsum(-1).flip(-1)
    late_cum = torch.cat([late_cum, torch.zeros(points, 1, dtype=torch.float64)], -1)
    taus = torch.arange(T)
    log_joint = (
        log_prior[:, None, None]
        + log_prior[None, :, None]
        + early_cum[:, None, taus]
        + late_cum[None, :, taus]
    )  # [early, late, tau]
    weights = (log_joint - log_joint.logsumexp((0, 1, 2))).exp()
    return {
        "early": (weights.sum((1, 2)) * grid).sum(),
        "late": (weights.sum((0, 2)) * grid).sum(),
        "tau": (weights.sum((0, 1)) * taus.double()).sum(),
    }
