"""Continuous-site layout, simulation, log joint and sample_continuous."""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import pytest
import torch

from pyro_autospec.guides.diffusion import DiffusionGuide
from pyro_autospec.infer.continuous import sample_continuous
from pyro_autospec.model import continuous_log_joint, discover_continuous_sites, simulate


def model(y):
    p = pyro.sample("p", dist.Dirichlet(torch.ones(3)))
    with pyro.plate("groups", 2):
        scale = pyro.sample("scale", dist.HalfNormal(1.0))
        pyro.deterministic("double", 2 * scale, event_dim=0)
    pyro.factor("penalty", -0.1 * scale.sum(-1, keepdim=True))
    with pyro.plate("data", y.shape[0], dim=-2):
        pyro.sample("y", dist.Normal(p[..., 0], scale), obs=y)


DATA = torch.randn(4, 2)


def test_layout_shapes_and_round_trip():
    layout = discover_continuous_sites(model, (DATA,))
    assert layout.names == ["p", "scale"]
    assert tuple(layout["p"].unconstrained_shape) == (2,) and layout.dim == 4
    assert [s.name for s in layout.data] == ["y"] and layout.data_dim == 8
    assert layout.max_plate_nesting == 2
    values = {"p": dist.Dirichlet(torch.ones(3)).sample((5,)), "scale": torch.rand(5, 2) + 0.1}
    y = layout.to_unconstrained(values)
    back = layout.from_unconstrained(y)
    for name in values:
        torch.testing.assert_close(back[name], values[name], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("vectorize", [True, False])
def test_simulate_shapes_and_prior(vectorize):
    layout = discover_continuous_sites(model, (DATA,))
    y, data = simulate(model, (DATA,), {}, layout, 400, seed=0, vectorize=vectorize)
    assert y.shape == (400, 4) and data.shape == (400, 8)
    scale = layout.from_unconstrained(y)["scale"]
    # HalfNormal(1) mean sqrt(2 / pi) ~ 0.80, sd ~ 0.60: 5 standard errors
    assert abs(scale.mean().item() - 0.798) < 5 * 0.603 / (800**0.5)
    again, _ = simulate(model, (DATA,), {}, layout, 400, seed=0, vectorize=vectorize)
    assert torch.equal(y, again)


def test_log_joint_matches_per_draw_trace():
    layout = discover_continuous_sites(model, (DATA,))
    values = {"p": dist.Dirichlet(torch.ones(3)).sample((3,)), "scale": torch.rand(3, 2) + 0.1}
    lp, pointwise = continuous_log_joint(model, (DATA,), {}, layout, values, pointwise=True)
    for i in range(3):
        conditioned = pyro.poutine.condition(model, {k: v[i] for k, v in values.items()})
        trace = pyro.poutine.trace(conditioned).get_trace(DATA)
        torch.testing.assert_close(lp[i], trace.log_prob_sum().double(), rtol=1e-5, atol=1e-5)
    assert pointwise["y"].shape == (3, 4, 2)  # [draws, *batch_shape]


def test_sample_continuous_result_fields():
    guide = DiffusionGuide(model, (DATA,), hidden_dim=8, num_steps=16)
    out = sample_continuous(guide, 12, DATA, seed=0)
    assert out.samples["p"].shape == (12, 3) and out.samples["scale"].shape == (12, 2)
    torch.testing.assert_close(out.samples["p"].sum(-1), torch.ones(12))
    assert out.unconstrained.shape == (12, 4)
    assert out.sample_rounds.shape == (12,) and out.rounds >= 1 and out.oracle_rows >= 12
    assert out.lp.shape == (12,) and out.log_prob.shape == (12,)
    same = sample_continuous(guide, 12, DATA, seed=0)
    assert torch.equal(out.unconstrained, same.unconstrained)
