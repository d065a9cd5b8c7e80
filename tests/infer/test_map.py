"""``AutoSpec.map``: the most probable joint assignment of the discrete sites, against brute
force (every joint state scored)."""

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine

from pyro_autospec.infer import AutoSpec, UnsupportedSiteError
from pyro_autospec.model import discover_sites
from pyro_autospec.model.log_joint import enumerate_posterior
from tests.catalogue.brute_force import enumerate_joint, lp
from tests.catalogue.models import CASES


def brute_force_map(model, args):
    """The best state (as coordinates) and the gap to the second best (ties would be moot)."""
    layout = discover_sites(model, args, {})
    states, log_prob = enumerate_posterior(model, args, layout=layout)
    top = log_prob.topk(2)
    return layout, states[top.indices[0]], float(top.values[0] - top.values[1])


@pytest.mark.parametrize("name", list(CASES))
def test_map_is_the_most_probable_state(name):
    model, args, _ = CASES[name]
    layout, best, gap = brute_force_map(model, args)
    assert gap > 1e-3, "the test needs a unique maximum"
    found = AutoSpec(model, num_samples=1).map(*args)
    assert list(found) == layout.names
    got = layout.to_coords({k: v[None] for k, v in found.items()})[0]
    assert got.tolist() == best.tolist()
    plain = poutine.trace(model).get_trace(*args)
    assert {k: v.shape for k, v in found.items()} == {
        k: plain.nodes[k]["value"].shape for k in found
    }


def test_map_gives_sites_with_one_value_the_models_shape():
    """Pyro's decoded trace keeps a size-1 enumeration dim on a site with one value."""

    def model(y):
        a = pyro.sample("a", dist.Categorical(torch.tensor([1.0])))
        b = pyro.sample("b", dist.Binomial(0, 0.5))
        c = pyro.sample("c", dist.Bernoulli(0.4))
        with pyro.plate("data", 3):
            pyro.sample("y", dist.Normal(a.float() + b + c, 1.0), obs=y)

    found = AutoSpec(model, num_samples=1).map(torch.tensor([0.3, 2.2, -0.4]))
    assert {k: v.shape for k, v in found.items()} == {k: () for k in "abc"}
    assert found["a"].dtype == torch.long and found["b"].item() == 0


def long_hmm(y):
    trans = torch.tensor([[0.8, 0.2], [0.3, 0.7]])
    x = 0
    for t in pyro.markov(range(len(y))):
        x = pyro.sample(f"x_{t}", dist.Categorical(trans[x] if t else torch.tensor([0.6, 0.4])))
        pyro.sample(f"y_{t}", dist.Normal(torch.tensor([-1.0, 1.0])[x], 1.2), obs=y[t])


def test_viterbi_path_of_a_longer_chain_against_a_hand_written_joint():
    y = torch.tensor([-0.9, 0.4, 1.6, -0.3, 0.2, 1.1, 0.7, -1.4, -0.2, 0.9, 1.3, -0.6])
    trans = [[0.8, 0.2], [0.3, 0.7]]
    locs = [-1.0, 1.0]

    def joint(s):
        total = math.log([0.6, 0.4][s[0]])
        for t in range(1, len(s)):
            total += math.log(trans[s[t - 1]][s[t]])
        return total + sum(lp(dist.Normal(locs[x], 1.2), y[t]) for t, x in enumerate(s))

    states, probs = enumerate_joint([2] * len(y), joint)
    order = probs.argsort()
    assert probs[order[-1]] > 1.001 * probs[order[-2]]
    found = AutoSpec(long_hmm, num_samples=1).map(y)
    path = [int(found[f"x_{t}"]) for t in range(len(y))]
    assert path == list(states[order[-1]])
    assert found["x_0"].dtype == torch.long and found["x_0"].shape == ()


def scaled_masked(y):
    g = pyro.sample("g", dist.Categorical(torch.tensor([0.5, 0.3, 0.2])))
    with pyro.plate("data", 3):
        z = pyro.sample("z", dist.Bernoulli(0.35))
        with poutine.scale(scale=4.0):
            pyro.sample("y", dist.Normal(z + g.float(), 1.0), obs=y)
        with poutine.mask(mask=torch.tensor([True, False, True])):
            pyro.factor("f", 1.5 * z)


def test_map_follows_scales_and_masks_as_the_draws_do():
    y = torch.tensor([0.4, 1.9, 2.2])

    def joint(s):
        g, z = s[0], s[1:]
        total = math.log([0.5, 0.3, 0.2][g])
        for i, zi in enumerate(z):
            total += math.log(0.35 if zi else 0.65)
            total += 4.0 * lp(dist.Normal(float(zi + g), 1.0), y[i])
            total += 1.5 * zi if i != 1 else 0.0
        return total

    states, probs = enumerate_joint([3, 2, 2, 2], joint)
    best = states[int(probs.argmax())]
    with pytest.warns(UserWarning, match="scaled"):
        found = AutoSpec(scaled_masked, num_samples=1).map(y)
    assert int(found["g"]) == best[0]
    assert found["z"].tolist() == [float(v) for v in best[1:]]
    assert found["z"].dtype == torch.float32


def mixture(y):
    loc = pyro.sample("loc", dist.Normal(0.0, 3.0))
    with pyro.plate("data", len(y)):
        z = pyro.sample("z", dist.Bernoulli(0.5))
        pyro.sample("y", dist.Normal(loc * (2 * z - 1), 1.0), obs=y)


def test_continuous_sites_raise_with_the_way_out():
    y = torch.tensor([2.1, -1.9, 2.4])
    with pytest.raises(UnsupportedSiteError, match=r"continuous latent sites \['loc'\].*condition"):
        AutoSpec(mixture, num_samples=1).map(y)
    conditioned = poutine.condition(mixture, data={"loc": torch.tensor(2.0)})
    found = AutoSpec(conditioned, num_samples=1).map(y)
    assert found["z"].tolist() == [1.0, 0.0, 1.0]


def test_too_many_states_for_the_fallback_raise(monkeypatch):
    from pyro_autospec.model import map_decode

    model, args, _ = CASES["onehot"]  # Pyro's pass cannot decode OneHotCategorical sites
    monkeypatch.setattr(map_decode, "MAX_BRUTE_FORCE_STATES", 4)
    with pytest.raises(UnsupportedSiteError, match="OneHotCategorical sites are a known cause"):
        AutoSpec(model, num_samples=1).map(*args)
