"""A site marked infer={"enumerate": "sequential"} is still enumerated (in parallel) exactly."""

import pyro
import pyro.distributions as dist
import torch

from pyro_autospec.model.enum import EnumOracle

W_PROBS = torch.tensor([0.2, 0.5, 0.3])


def model(y):
    z = pyro.sample("z", dist.Bernoulli(0.3), infer={"enumerate": "sequential"})
    w = pyro.sample("w", dist.Categorical(W_PROBS))
    pyro.sample("y", dist.Normal(z + w.float(), 1.0), obs=y)


def test_sequential_marking_is_overridden():
    y = torch.tensor(1.5)
    oracle = EnumOracle(model, (y,), {})
    values = torch.zeros(2, oracle.num_coords, dtype=torch.long)
    mask = torch.zeros(2, oracle.num_coords, dtype=torch.bool)
    rows = oracle.log_marginals(values, mask)[0, 0, :2].exp().double()  # P(z | y)
    joint = torch.tensor(
        [
            [pz * pw * dist.Normal(z + w, 1.0).log_prob(y).exp() for w, pw in enumerate(W_PROBS)]
            for z, pz in enumerate([0.7, 0.3])
        ],
        dtype=torch.float64,
    )
    expected = joint.sum(1) / joint.sum()
    torch.testing.assert_close(rows, expected, rtol=1e-6, atol=1e-9)


def monte_carlo_model(y):
    z = pyro.sample("z", dist.Bernoulli(0.3), infer={"enumerate": "parallel", "num_samples": 2})
    w = pyro.sample("w", dist.Categorical(W_PROBS), infer={"num_samples": 5, "expand": True})
    pyro.sample("y", dist.Normal(z + w.float(), 1.0), obs=y)


def test_monte_carlo_enumeration_hints_are_overridden():
    """``infer={"num_samples": k}`` asks ELBO estimates for k samples of a site; the sampler
    enumerates every value instead, so the posterior is the same as without the hint (found
    by an outside user, whose run was refused with an unrelated message)."""
    from pyro_autospec import AutoSpec

    y = torch.tensor(1.5)
    hinted = EnumOracle(monte_carlo_model, (y,), {})
    plain = EnumOracle(model, (y,), {})
    values = torch.zeros(1, plain.num_coords, dtype=torch.long)
    mask = torch.zeros(1, plain.num_coords, dtype=torch.bool)
    torch.testing.assert_close(
        hinted.log_marginals(values, mask), plain.log_marginals(values, mask), rtol=0, atol=1e-12
    )
    a = AutoSpec(monte_carlo_model, 50, seed=3, disable_progbar=True).run(y).get_samples()
    b = AutoSpec(model, 50, seed=3, disable_progbar=True).run(y).get_samples()
    assert torch.equal(a["z"], b["z"]) and torch.equal(a["w"], b["w"])
