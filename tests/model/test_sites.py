"""Site discovery, the coordinate mapping, the batched log joint, and model errors."""

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine

from pyro_autospec.infer import AutoSpec
from pyro_autospec.model import (
    AutoSpecModelError,
    DynamicStructureError,
    UnsupportedSiteError,
    discover_sites,
    enumerate_posterior,
    log_joint,
)


def model(y):
    a = pyro.sample("a", dist.Bernoulli(0.3))
    rows, cols = pyro.plate("rows", 2, dim=-2), pyro.plate("cols", 3, dim=-1)
    with rows, cols:
        b = pyro.sample("b", dist.Categorical(torch.tensor([0.2, 0.3, 0.5])))
    c = pyro.sample("c", dist.OneHotCategorical(torch.tensor([0.5, 0.25, 0.25])))
    d = pyro.sample("d", dist.Binomial(4, 0.5))
    mean = a + b.float() + (c * torch.arange(3.0)).sum(-1) + d
    with rows, cols:
        pyro.sample("y", dist.Normal(mean, 1.0), obs=y)
    pyro.factor("f", 0.1 * a)
    pyro.deterministic("total", mean.sum((-1, -2)))


Y = torch.arange(6.0).reshape(2, 3)


def test_layout_follows_trace_order_and_c_order():
    layout = discover_sites(model, (Y,))
    assert layout.names == ["a", "b", "c", "d"]
    assert [s.num_coords for s in layout.sites] == [1, 6, 1, 1]
    assert layout.num_coords == 9 and layout.num_values == 5
    assert layout.support_sizes.tolist() == [2, 3, 3, 3, 3, 3, 3, 3, 5]
    assert layout.coordinates[1:4] == [("b", (0, 0)), ("b", (0, 1)), ("b", (0, 2))]
    assert layout.max_plate_nesting == 2
    assert list(layout.observed) == ["y"]  # factor and deterministic sites are not data
    assert layout["b"].dtype == torch.long and layout["a"].dtype == torch.float32


def test_from_coords_and_back():
    layout = discover_sites(model, (Y,))
    coords = torch.tensor([[1, 0, 1, 2, 0, 1, 2, 2, 4], [0, 2, 2, 2, 1, 1, 1, 0, 0]])
    values = layout.from_coords(coords)
    assert values["a"].shape == (2,) and values["a"].dtype == torch.float32
    assert values["b"].shape == (2, 2, 3) and values["b"].dtype == torch.long
    assert values["b"][0].tolist() == [[0, 1, 2], [0, 1, 2]]
    assert values["c"].tolist() == [[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]
    assert values["d"].tolist() == [4.0, 0.0]
    assert torch.equal(layout.to_coords(values), coords)
    # values of another shape (another model's draws) are named, not torch's reshape error
    wrong = dict(values, b=values["b"][:, :, :2])
    with pytest.raises(ValueError, match=r"site 'b' must have shape \[N, \*\(2, 3\)\]"):
        layout.to_coords(wrong)


def test_batched_log_joint_equals_per_draw_loop():
    layout = discover_sites(model, (Y,))
    generator = torch.Generator().manual_seed(0)
    coords = torch.stack(
        [torch.randint(int(k), (5,), generator=generator) for k in layout.support_sizes], dim=1
    )
    values = layout.from_coords(coords)
    total, pointwise = log_joint(model, (Y,), {}, layout, values, pointwise=True)
    assert total.shape == (5,) and total.dtype == torch.float64
    assert pointwise["y"].shape == (5, 2, 3)
    for k in range(5):
        conditioned = poutine.condition(model, data={n: v[k] for n, v in values.items()})
        trace = poutine.trace(conditioned).get_trace(Y)
        assert total[k].item() == pytest.approx(trace.log_prob_sum().item(), abs=1e-4)
        trace.compute_log_prob()
        torch.testing.assert_close(pointwise["y"][k].float(), trace.nodes["y"]["log_prob"])


def test_enumerate_posterior_is_normalised():
    def small(y):
        z = pyro.sample("z", dist.Categorical(torch.tensor([0.5, 0.3, 0.2])))
        pyro.sample("y", dist.Normal(z.float(), 1.0), obs=y)

    states, log_prob = enumerate_posterior(small, (torch.tensor(1.0),))
    assert states.tolist() == [[0], [1], [2]]
    assert log_prob.exp().sum().item() == pytest.approx(1.0)


# ---- errors: each names the site and the way out -------------------------------------------


def continuous_model():
    pyro.sample("z", dist.Bernoulli(0.5))
    pyro.sample("scale", dist.LogNormal(0.0, 1.0))


def test_continuous_latent_site_error():
    with pytest.raises(
        UnsupportedSiteError, match=r"Site 'scale' is a continuous.*poutine\.condition"
    ):
        discover_sites(continuous_model)
    conditioned = poutine.condition(continuous_model, data={"scale": torch.tensor(1.0)})
    assert discover_sites(conditioned).names == ["z"]  # the suggested way out works


@pytest.mark.parametrize(
    "family", [dist.Poisson(3.0), dist.Geometric(0.4)], ids=["Poisson", "Geometric"]
)
def test_non_enumerable_discrete_site_error(family):
    def m():
        pyro.sample("z", dist.Bernoulli(0.5))
        pyro.sample("count", family)

    name = type(family).__name__
    with pytest.raises(
        UnsupportedSiteError,
        match=rf"Site 'count' is a discrete latent site \({name}\).*Categorical",
    ):
        AutoSpec(m, num_samples=2, disable_progbar=True).run()


def test_to_event_site_error_suggests_plate():
    def m():
        pyro.sample("z", dist.Bernoulli(0.5 * torch.ones(3)).to_event(1))

    with pytest.raises(UnsupportedSiteError, match=r"'z'.*pyro\.plate"):
        discover_sites(m)


def test_undeclared_batch_dim_error():
    def m():
        pyro.sample("z", dist.Bernoulli(0.5 * torch.ones(3)))

    with pytest.raises(AutoSpecModelError, match=r"'z'.*no `pyro.plate`"):
        discover_sites(m)


def test_dynamic_structure_error():
    def m():
        z = pyro.sample("z", dist.Bernoulli(0.5))
        if z.item() == 1:
            pyro.sample("w", dist.Bernoulli(0.5))

    with pytest.raises(DynamicStructureError, match=r"Site 'w' appears in some runs"):
        AutoSpec(m, num_samples=2, disable_progbar=True).run()

    def fixed_sites_but_branching():
        z = pyro.sample("z", dist.Bernoulli(0.5))
        loc = 1.0 if z.item() == 1 else 0.0
        pyro.sample("y", dist.Normal(loc, 1.0), obs=torch.tensor(0.5))

    with pytest.raises(DynamicStructureError, match=r"after site 'z'.*Python control flow"):
        AutoSpec(fixed_sites_but_branching, num_samples=2, disable_progbar=True).run()


def test_a_count_whose_total_reads_a_discrete_site_is_told_so():
    """Pyro's ``examples/sir_hmc.py`` ``discrete_model``: the total of a Binomial is the
    count left after an earlier discrete site, so its support moves with that value."""

    def m(data):
        s = torch.tensor(3.0)
        for t, datum in enumerate(data):
            s2i = pyro.sample(f"S2I_{t}", dist.Binomial(s, 0.4))
            s = s - s2i
            pyro.sample(f"obs_{t}", dist.ExtendedBinomial(s2i, 0.7), obs=datum)

    with pytest.raises(
        DynamicStructureError,
        match=r"Site 'S2I_1' is a count \(Binomial or BetaBinomial\) whose total_count "
        r"depends on the value of an earlier discrete site.*mask\(False\)",
    ):
        AutoSpec(m, num_samples=2, disable_progbar=True).run(torch.tensor([1.0, 0.0]))


def test_no_discrete_site_error():
    def m(y):
        pyro.sample("y", dist.Normal(0.0, 1.0), obs=y)

    with pytest.raises(AutoSpecModelError, match="no unobserved discrete"):
        discover_sites(m, (torch.tensor(0.0),))


def test_max_plate_nesting_too_small():
    with pytest.raises(AutoSpecModelError, match="max_plate_nesting=2"):
        discover_sites(model, (Y,), max_plate_nesting=1)


def test_discovery_leaves_global_rng_alone():
    torch.manual_seed(3)
    expected = torch.rand(3)
    torch.manual_seed(3)
    discover_sites(model, (Y,))
    assert torch.equal(torch.rand(3), expected)


def test_a_model_that_mixes_devices_is_told_so():
    # (on a CPU-only machine the mismatch is raised by hand, as torch words it on a GPU)
    def on_two_devices():
        z = pyro.sample("z", dist.Bernoulli(0.5))
        if z.dim() > 0:  # AutoSpec's batched or enumerated values
            raise RuntimeError(
                "Expected all tensors to be on the same device, but found at least two "
                "devices, cuda:0 and cpu!"
            )

    with pytest.raises(DynamicStructureError, match=r"mixes devices.*device=data\.device"):
        AutoSpec(on_two_devices, num_samples=2, disable_progbar=True).run()


class ExpandsItsSupport(dist.TorchDistribution):
    """Three values with its own logits; ``enumerate_support`` expands whatever ``expand=``
    says, as many hand-written distributions do (every batch element has the same support)."""

    arg_constraints = {}
    support = dist.constraints.integer_interval(0, 2)
    has_enumerate_support = True

    def __init__(self, logits):
        self.logits = logits - logits.logsumexp(-1, keepdim=True)
        super().__init__(logits.shape[:-1], torch.Size(), validate_args=False)

    def expand(self, batch_shape, _instance=None):
        return ExpandsItsSupport(self.logits.expand(tuple(batch_shape) + (3,)))

    def sample(self, sample_shape=()):
        return torch.distributions.Categorical(logits=self.logits).sample(torch.Size(sample_shape))

    def log_prob(self, value):
        logits, value = torch.broadcast_tensors(self.logits, value.long().unsqueeze(-1))
        return logits.gather(-1, value[..., :1]).squeeze(-1)

    def enumerate_support(self, expand=True):
        shape = (-1,) + (1,) * len(self.batch_shape)
        return torch.arange(3).view(shape).expand((-1,) + self.batch_shape)


def test_a_support_expanded_whatever_expand_says_is_one_support():
    """It was refused as "a support that differs between its batch elements" (an outside
    test; Pyro's infer_discrete samples it); its draws follow the exact law."""
    from tests.catalogue.brute_force import assert_draws_follow, enumerate_joint, flatten_draws

    logits = torch.tensor([0.3, -0.2, 0.5])
    y = torch.tensor([2.0, 0.2])

    def model():
        with pyro.plate("d", 2):
            z = pyro.sample("z", ExpandsItsSupport(logits))
            pyro.sample("y", dist.Normal(z.float(), 1.0), obs=y)

    def log_joint(s):
        prior = logits.log_softmax(-1)
        return sum(
            float(prior[k]) + float(dist.Normal(float(k), 1.0).log_prob(y[i]))
            for i, k in enumerate(s)
        )

    fit = AutoSpec(model, 3000, seed=0, disable_progbar=True).run()
    states, probs = enumerate_joint([3, 3], log_joint)
    assert_draws_follow(flatten_draws(fit.get_samples(), ["z"]), states, probs)
