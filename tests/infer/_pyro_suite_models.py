"""A catalogue of Pyro's own test-suite and example models with discrete latent sites.

Each model is copied from Pyro (Apache-2.0, https://github.com/pyro-ppl/pyro, at ff6ae1c),
as its test or example writes it, with the path and test named in ``Case.source``; where a
test is parametrised, the parameters are given in the case's name. Sizes that make a test's
point with 10,000 particles (a ``particles`` plate) are cut to a few, so that brute force
over every assignment stays small; nothing else is changed. Pyro's ``TraceEnum_ELBO``,
``infer_discrete`` or ``compute_marginals`` enumerate the discrete sites of every model here,
except those marked ``pyro_refuses`` (Pyro's own test asserts an error).

Shared by the sweep (``benchmarks/pyro_suite.py``) and its tests
(``tests/infer/test_pyro_suite.py``). Besides the catalogue this module holds the reference
laws the draws are tested against (:func:`exact_law`): brute force over every assignment of
the discrete latent sites (each scored by Pyro's own ``trace.log_prob_sum()``, masks and
scales included), or, for a model too large for that, Pyro's
``TraceEnum_ELBO.compute_marginals`` on a few sites. Continuous latent sites are fixed to one
draw of their prior (:func:`prepare`), so that the discrete posterior is exact and cheap.
"""

# Models copied from Pyro (https://github.com/pyro-ppl/pyro), Apache-2.0, Copyright Uber
# Technologies, Inc. and the Pyro contributors.

from __future__ import annotations

import argparse
import itertools
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyro
import pyro.distributions as dist
import torch
from pyro import poutine
from pyro.infer import TraceEnum_ELBO, config_enumerate
from pyro.ops.indexing import Vindex
from torch.distributions import constraints

from tests.infer import _pyro_hmm_examples as hmm_examples
from tests.stats import chisquare_pvalue

__all__ = ["CASES", "Case", "exact_law", "prepare", "draws_as_states"]

ENUM = "tests/infer/test_enum.py"
VALID = "tests/infer/test_valid_models.py"
DISCRETE = "tests/infer/test_discrete.py"
HMM = "examples/hmm.py"
SIMPLEX = constraints.simplex
MAX_BRUTE_STATES = 4096


@dataclass
class Case:
    """One model of the catalogue.

    ``check``: ``"brute"`` (the joint law of every discrete latent coordinate by brute force),
    ``"marginals"`` (Pyro's ``compute_marginals`` on the sites in ``marginal_sites``, first
    element of each), or ``"none"`` (runs or refuses; no reference law). ``params``: Pyro
    params the test sets before the model runs (name -> (value, constraint)). ``refusal``:
    for a model AutoSpec refuses, words its message must contain (the cause); ``model_error``:
    for a model that fails in a plain run of Pyro, the type of its own error. Both empty: a
    model AutoSpec must sample exactly.
    """

    name: str
    source: str
    model: Callable
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    params: dict = field(default_factory=dict)
    check: str = "brute"
    marginal_sites: tuple = ()
    max_plate_nesting: int | None = None
    pyro_refuses: bool = False
    note: str = ""
    refusal: str = ""
    model_error: str = ""


CASES: list[Case] = []


def add(name, source, model, *args, **options):
    CASES.append(Case(name, source, model, args, **options))


# ---------------------------------------------------------------- tests/infer/test_discrete.py


@config_enumerate
def discrete_plate_smoke():
    p = pyro.param("p", torch.tensor([0.25, 0.75]))
    q = pyro.param("q", torch.tensor([[0.25, 0.75], [0.75, 0.25]]))
    loc = pyro.param("loc", torch.tensor([-1.0, 1.0]))
    z1 = pyro.sample("z1", dist.Categorical(p))
    with pyro.plate("plate", 2):
        z2 = pyro.sample("z2", dist.Categorical(q[z1]))
        pyro.sample("x2", dist.Normal(loc[z2], 1.0), obs=torch.ones(2))


@config_enumerate
def discrete_distribution_1(num_particles=1, z=None):
    data = torch.tensor([1.0, 2.0, 3.0])
    p = pyro.param("p", torch.tensor(0.25))
    with pyro.plate("num_particles", num_particles, dim=-2):
        z = pyro.sample("z", dist.Bernoulli(p), obs=z)
        with pyro.plate("data", 3):
            pyro.sample("x", dist.Normal(z, 1.0), obs=data)


@config_enumerate
def discrete_distribution_2(num_particles=1, z1=None, z2=None):
    data = torch.tensor([[-1.0, -1.0, 0.0], [-1.0, 1.0, 1.0]])
    p = pyro.param("p", torch.tensor([[0.25, 0.75], [0.1, 0.9]]))
    loc = pyro.param("loc", torch.tensor([-1.0, 1.0]))
    with pyro.plate("num_particles", num_particles, dim=-2):
        z1 = pyro.sample("z1", dist.Categorical(p[0]), obs=z1)
        z2 = pyro.sample("z2", dist.Categorical(p[z1]), obs=z2)
        with pyro.plate("data", 3):
            pyro.sample("x1", dist.Normal(loc[z1], 1.0), obs=data[0])
            pyro.sample("x2", dist.Normal(loc[z2], 1.0), obs=data[1])


@config_enumerate
def discrete_distribution_3(num_particles=1, z1=None, z2=None):
    data = [torch.tensor([-1.0, -1.0, 0.0]), torch.tensor([-1.0, 1.0])]
    p = pyro.param("p", torch.tensor([0.25, 0.75]))
    loc = pyro.param("loc", torch.tensor([-1.0, 1.0]))
    with pyro.plate("num_particles", num_particles, dim=-2):
        z1 = pyro.sample("z1", dist.Categorical(p), obs=z1)
        with pyro.plate("data[0]", 3):
            pyro.sample("x1", dist.Normal(loc[z1], 1.0), obs=data[0])
        with pyro.plate("data[1]", 2):
            z2 = pyro.sample("z2", dist.Categorical(p), obs=z2)
            pyro.sample("x2", dist.Normal(loc[z2], 1.0), obs=data[1])


@config_enumerate
def discrete_distribution_masked(num_particles=1, z=None):
    data = torch.tensor([1.0, 2.0, 3.0])
    mask = torch.tensor([True, False, False])
    p = pyro.param("p", torch.tensor(0.25))
    with pyro.plate("num_particles", num_particles, dim=-2):
        z = pyro.sample("z", dist.Bernoulli(p), obs=z)
        with pyro.plate("data", 3), poutine.mask(mask=mask):
            pyro.sample("x", dist.Normal(z, 1.0), obs=data)


def discrete_hmm(data, hidden_dim=10):  # test_hmm_smoke, as infer_discrete's docstring
    transition = 0.3 / hidden_dim + 0.7 * torch.eye(hidden_dim)
    means = torch.arange(float(hidden_dim))
    states = [0]
    for t in pyro.markov(range(len(data))):
        states.append(pyro.sample(f"states_{t}", dist.Categorical(transition[states[-1]])))
        data[t] = pyro.sample(f"obs_{t}", dist.Normal(means[states[-1]], 1.0), obs=data[t])
    return states, data


def discrete_warning(data):
    x = pyro.sample("x", dist.Categorical(torch.ones(3)))
    with pyro.plate("data", len(data)):
        pyro.sample("obs", dist.Normal(x.float(), 1), obs=data)


add("plate_smoke", f"{DISCRETE}::test_plate_smoke", discrete_plate_smoke)
add("distribution_1", f"{DISCRETE}::test_distribution_1", discrete_distribution_1)
add("distribution_2", f"{DISCRETE}::test_distribution_2", discrete_distribution_2)
add("distribution_3", f"{DISCRETE}::test_distribution_3", discrete_distribution_3)
add("distribution_masked", f"{DISCRETE}::test_distribution_masked", discrete_distribution_masked)
add(
    "hmm_smoke[length=2]",
    f"{DISCRETE}::test_hmm_smoke",
    config_enumerate(discrete_hmm),
    [torch.tensor(0.5), torch.tensor(3.0)],
)
add(
    "hmm_smoke[length=10]",
    f"{DISCRETE}::test_hmm_smoke",
    config_enumerate(discrete_hmm),
    [torch.tensor(float(t % 4)) for t in range(10)],
    check="marginals",
    marginal_sites=("states_0", "states_5", "states_9"),
)
add("warning", f"{DISCRETE}::test_warning", discrete_warning, torch.tensor([0.3, -1.2, 2.0, 0.1]))

# ------------------------------------------------------------------- tests/infer/test_enum.py


def enum_iter_scalar():
    p = pyro.param("p", torch.tensor(0.05))
    probs = pyro.param("probs", torch.tensor([0.1, 0.2, 0.3, 0.4]))
    x = pyro.sample("x", dist.Bernoulli(p))
    y = pyro.sample("y", dist.Categorical(probs))
    return dict(x=x, y=y)


def enum_iter_vector(expand):
    @config_enumerate(default="sequential", expand=expand)
    def model():
        p = pyro.param("p", torch.tensor([0.05, 0.15]))
        probs = pyro.param("probs", torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1]]))
        with pyro.plate("plate", 2):
            x = pyro.sample("x", dist.Bernoulli(p))
            y = pyro.sample("y", dist.Categorical(probs))
            if expand:
                assert x.size() == (2,)
                assert y.size() == (2,)
            else:
                assert x.shape == (1,)
                assert y.shape == (1,)
        return dict(x=x, y=y)

    return model


class UnsafeBernoulli(dist.Bernoulli):
    def log_prob(self, value):
        i = value.long()
        j = torch.arange(len(self.probs), dtype=torch.long)
        return torch.stack([(-self.probs).log1p(), self.probs.log()])[i, j]


def enum_avoid_nan():
    p = torch.tensor([0.0, 0.5, 1.0])
    with pyro.plate("batch", 3):
        pyro.sample("z", UnsafeBernoulli(p))


def gmm_model(data, verbose=False):
    p = pyro.param("p", torch.tensor(0.3, requires_grad=True))
    scale = pyro.param("scale", torch.tensor(1.0, requires_grad=True))
    mus = torch.tensor([-1.0, 1.0])
    for i in pyro.plate("data", len(data)):
        z = pyro.sample(f"z_{i}", dist.Bernoulli(p))
        z = z.long()
        pyro.sample(f"x_{i}", dist.Normal(mus[z], scale), obs=data[i])


def gmm_batch_model(data):
    p = pyro.param("p", torch.tensor([0.3], requires_grad=True))
    p = torch.cat([p, 1 - p])
    scale = pyro.param("scale", torch.tensor([1.0], requires_grad=True))
    mus = torch.tensor([-1.0, 1.0])
    with pyro.plate("data", len(data)) as batch:
        n = len(batch)
        z = pyro.sample("z", dist.OneHotCategorical(p).expand_by([n]))
        assert z.shape[-1] == 2
        loc = (z * mus).sum(-1)
        pyro.sample("x", dist.Normal(loc, scale.expand(n)), obs=data[batch])


def enum_elbo_bern(scale, num_particles=3):
    @poutine.scale(scale=scale)
    def model():
        with pyro.plate("particles", num_particles):
            pyro.sample("z", dist.Bernoulli(0.25).expand_by([num_particles]))

    return model


def enum_elbo_bern_bern():
    pyro.sample("x1", dist.Bernoulli(0.2))
    pyro.sample("x2", dist.Bernoulli(0.4))


def enum_elbo_berns():
    pyro.sample("x1", dist.Bernoulli(0.1))
    pyro.sample("x2", dist.Bernoulli(0.2))
    pyro.sample("x3", dist.Bernoulli(0.3))


def enum_elbo_categoricals():
    p1 = torch.tensor([0.6, 0.4])
    p2 = torch.tensor([0.3, 0.3, 0.4])
    p3 = torch.tensor([0.1, 0.2, 0.3, 0.4])
    pyro.sample("x1", dist.Categorical(p1))
    pyro.sample("x2", dist.Categorical(p2))
    pyro.sample("x3", dist.Categorical(p3))


P_KL = 0.2693204236205713


def enum_elbo_plate(num_particles=1, plate_dim=2):
    p = P_KL
    with pyro.plate("particles", num_particles):
        pyro.sample("y", dist.Bernoulli(p).expand_by([num_particles]))
        with pyro.plate("plate", plate_dim):
            pyro.sample("z", dist.Bernoulli(p).expand_by([plate_dim, num_particles]))


def enum_elbo_iplate(num_particles=1, plate_dim=2):
    p = P_KL
    with pyro.plate("particles", num_particles):
        pyro.sample("x", dist.Bernoulli(p).expand_by([num_particles]))
        for i in pyro.plate("plate", plate_dim):
            pyro.sample(f"y_{i}", dist.Bernoulli(p).expand_by([num_particles]))


def enum_elbo_plate_plate(outer_dim=2, inner_dim=2):
    d = dist.Bernoulli(P_KL)
    context1 = pyro.plate("outer", outer_dim, dim=-1)
    context2 = pyro.plate("inner", inner_dim, dim=-2)
    pyro.sample("w", d)
    with context1:
        pyro.sample("x", d)
    with context2:
        pyro.sample("y", d)
    with context1, context2:
        pyro.sample("z", d)


def enum_elbo_plate_iplate(num_particles=1, outer_dim=3, inner_dim=2):
    p = P_KL
    with pyro.plate("particles", num_particles):
        pyro.sample("x", dist.Bernoulli(p).expand_by([num_particles]))
        with pyro.plate("outer", outer_dim):
            pyro.sample("y", dist.Bernoulli(p).expand_by([outer_dim, num_particles]))
            for i in pyro.plate("inner", inner_dim):
                pyro.sample(f"z_{i}", dist.Bernoulli(p).expand_by([outer_dim, num_particles]))


def enum_elbo_iplate_plate(num_particles=1, outer_dim=2, inner_dim=2):
    p = P_KL
    with pyro.plate("particles", num_particles):
        pyro.sample("x", dist.Bernoulli(p).expand_by([num_particles]))
        inner_plate = pyro.plate("inner", inner_dim)
        for i in pyro.plate("outer", outer_dim):
            pyro.sample(f"y_{i}", dist.Bernoulli(p).expand_by([num_particles]))
            with inner_plate:
                pyro.sample(f"z_{i}", dist.Bernoulli(p).expand_by([inner_dim, num_particles]))


def enum_elbo_iplate_iplate(num_particles=1, outer_dim=2, inner_dim=2):
    p = P_KL
    with pyro.plate("particles", num_particles):
        pyro.sample("x", dist.Bernoulli(p).expand_by([num_particles]))
        inner_iplate = pyro.plate("inner", outer_dim)
        for i in pyro.plate("outer", inner_dim):
            pyro.sample(f"y_{i}", dist.Bernoulli(p).expand_by([num_particles]))
            for j in inner_iplate:
                pyro.sample(f"z_{i}_{j}", dist.Bernoulli(p).expand_by([num_particles]))


def enum_non_mean_field_bern_bern(num_particles=3):
    with pyro.plate("particles", num_particles):
        y = pyro.sample("y", dist.Bernoulli(0.33).expand_by([num_particles]))
        pyro.sample("z", dist.Bernoulli(0.55 * y + 0.10))


def enum_non_mean_field_bern_normal(num_particles=3, pi3=0.22):
    with pyro.plate("particles", num_particles):
        q3 = pyro.param("q3", torch.tensor(pi3, requires_grad=True))
        y = pyro.sample("y", dist.Bernoulli(q3).expand_by([num_particles]))
        pyro.sample("z", dist.Normal(0.55 * y + q3, 1.0))


def enum_non_mean_field_normal_bern(num_particles=3, pi1=0.33, pi2=0.44, pi3=0.22):
    with pyro.plate("particles", num_particles):
        q3 = pyro.param("q3", torch.tensor(pi3, requires_grad=True))
        q4 = pyro.param("q4", torch.tensor(0.5 * (pi1 + pi2), requires_grad=True))
        z = pyro.sample("z", dist.Normal(q3, 1.0).expand_by([num_particles]))
        zz = torch.exp(z) / (1.0 + torch.exp(z))
        pyro.sample("y", dist.Bernoulli(q4 * zz))


def enum_elbo_rsvi(num_particles=3):
    with pyro.plate("particles", num_particles):
        pyro.sample("z", dist.Bernoulli(0.25).expand_by([num_particles]))
        pyro.sample("y", dist.Gamma(0.50, 1.0).expand_by([num_particles]))


def enum_hmm_in_model(data):
    init_probs = torch.tensor([0.5, 0.5])
    transition_probs = pyro.param(
        "transition_probs", torch.tensor([[0.9, 0.1], [0.1, 0.9]]), constraint=SIMPLEX
    )
    locs = pyro.param("obs_locs", torch.tensor([-1.0, 1.0]))
    scale = pyro.param("obs_scale", torch.tensor(1.0), constraint=constraints.positive)
    x = None
    for i, y in pyro.markov(enumerate(data)):
        probs = init_probs if x is None else transition_probs[x]
        x = pyro.sample(f"x_{i}", dist.Categorical(probs))
        pyro.sample(f"y_{i}", dist.Normal(locs[x], scale), obs=y)


def enum_hmm_in_guide(data):
    init_probs = torch.tensor([0.5, 0.5])
    transition_probs = pyro.param(
        "transition_probs", torch.tensor([[0.75, 0.25], [0.25, 0.75]]), constraint=SIMPLEX
    )
    emission_probs = pyro.param(
        "emission_probs", torch.tensor([[0.75, 0.25], [0.25, 0.75]]), constraint=SIMPLEX
    )
    x = None
    for i, y in pyro.markov(enumerate(data)):
        probs = init_probs if x is None else transition_probs[x]
        x = pyro.sample(f"x_{i}", dist.Categorical(probs))
        pyro.sample(f"y_{i}", dist.Categorical(emission_probs[x]), obs=y)


@config_enumerate
def enum_hmm_enumerate_model(data):
    transition_probs = pyro.param(
        "transition_probs", torch.tensor([[0.75, 0.25], [0.25, 0.75]]), constraint=SIMPLEX
    )
    emission_probs = pyro.param(
        "emission_probs", torch.tensor([[0.75, 0.25], [0.25, 0.75]]), constraint=SIMPLEX
    )
    x = 0
    for t, y in pyro.markov(enumerate(data)):
        x = pyro.sample(f"x_{t}", dist.Categorical(transition_probs[x]))
        pyro.sample(f"y_{t}", dist.Categorical(emission_probs[x]), obs=y)


def enum_hmm_enumerate_model_and_guide(data):
    transition_probs = pyro.param(
        "transition_probs", torch.tensor([[0.75, 0.25], [0.25, 0.75]]), constraint=SIMPLEX
    )
    emission_probs = pyro.param(
        "emission_probs", torch.tensor([[0.75, 0.25], [0.25, 0.75]]), constraint=SIMPLEX
    )
    x = pyro.sample("x", dist.Categorical(torch.tensor([0.5, 0.5])))
    for t, y in pyro.markov(enumerate(data)):
        x = pyro.sample(
            f"x_{t}", dist.Categorical(transition_probs[x]), infer={"enumerate": "parallel"}
        )
        pyro.sample(f"y_{t}", dist.Categorical(emission_probs[x]), obs=y)


add("iter_discrete_traces_scalar", f"{ENUM}::test_iter_discrete_traces_scalar", enum_iter_scalar)
for _expand in (False, True):
    add(
        f"iter_discrete_traces_vector[expand={_expand}]",
        f"{ENUM}::test_iter_discrete_traces_vector",
        enum_iter_vector(_expand),
        note="asserts shapes of Pyro's sequential enumeration",
    )
add("avoid_nan", f"{ENUM}::test_avoid_nan", enum_avoid_nan, note="a log_prob that indexes a plate")
add("gmm_model", f"{ENUM}::test_gmm_iter_discrete_traces", gmm_model, torch.tensor([0.0, 1.0, 9.0]))
add(
    "gmm_batch_model",
    f"{ENUM}::test_gmm_batch_iter_discrete_traces",
    gmm_batch_model,
    torch.tensor([0.0, 1.0, 9.0]),
)
add("elbo_bern[scale=10]", f"{ENUM}::test_elbo_bern", enum_elbo_bern(10))
add("elbo_bern_bern", f"{ENUM}::test_elbo_bern_bern", enum_elbo_bern_bern)
add("elbo_berns", f"{ENUM}::test_elbo_berns", enum_elbo_berns)
add("elbo_categoricals", f"{ENUM}::test_elbo_categoricals", enum_elbo_categoricals)
add("elbo_plate", f"{ENUM}::test_elbo_plate", enum_elbo_plate)
add("elbo_iplate", f"{ENUM}::test_elbo_iplate", enum_elbo_iplate)
add("elbo_plate_plate", f"{ENUM}::test_elbo_plate_plate", enum_elbo_plate_plate)
add("elbo_plate_iplate", f"{ENUM}::test_elbo_plate_iplate", enum_elbo_plate_iplate)
add("elbo_iplate_plate", f"{ENUM}::test_elbo_iplate_plate", enum_elbo_iplate_plate)
add("elbo_iplate_iplate", f"{ENUM}::test_elbo_iplate_iplate", enum_elbo_iplate_iplate)
add(
    "non_mean_field_bern_bern",
    f"{ENUM}::test_non_mean_field_bern_bern_elbo_gradient",
    enum_non_mean_field_bern_bern,
)
add(
    "non_mean_field_bern_normal",
    f"{ENUM}::test_non_mean_field_bern_normal_elbo_gradient",
    enum_non_mean_field_bern_normal,
)
add(
    "non_mean_field_normal_bern",
    f"{ENUM}::test_non_mean_field_normal_bern_elbo_gradient",
    enum_non_mean_field_normal_bern,
)
add("elbo_rsvi", f"{ENUM}::test_elbo_rsvi", enum_elbo_rsvi)
add("elbo_hmm_in_model[3]", f"{ENUM}::test_elbo_hmm_in_model", enum_hmm_in_model, torch.ones(3))
add(
    "elbo_hmm_in_model[20]",
    f"{ENUM}::test_elbo_hmm_in_model",
    enum_hmm_in_model,
    torch.ones(20),
    check="marginals",
    marginal_sites=("x_0", "x_10", "x_19"),
)
add("elbo_hmm_in_guide[4]", f"{ENUM}::test_elbo_hmm_in_guide", enum_hmm_in_guide, torch.ones(4))
add(
    "hmm_enumerate_model[5]",
    f"{ENUM}::test_hmm_enumerate_model",
    enum_hmm_enumerate_model,
    torch.tensor([0, 1, 1, 0, 1]),
)
add(
    "hmm_enumerate_model_and_guide[4]",
    f"{ENUM}::test_hmm_enumerate_model_and_guide",
    enum_hmm_enumerate_model_and_guide,
    torch.tensor([0, 1, 1, 0]),
)

# test_elbo_enumerate_1 .. 3 (the "auto" models; the "hand" models enumerate nothing)
ENUMERATE_PARAMS = {
    "model_probs_x": (torch.tensor([0.4, 0.6]), SIMPLEX),
    "model_probs_y": (torch.tensor([[0.75, 0.25], [0.55, 0.45]]), SIMPLEX),
    "model_probs_z": (torch.tensor([0.3, 0.7]), SIMPLEX),
}
ENUMERATE_PARAMS_2 = dict(
    ENUMERATE_PARAMS, model_probs_z=(torch.tensor([[0.3, 0.7], [0.2, 0.8]]), SIMPLEX)
)


def enum_enumerate_1(scale):
    @poutine.scale(scale=scale)
    def auto_model():
        probs_x = pyro.param("model_probs_x")
        probs_y = pyro.param("model_probs_y")
        probs_z = pyro.param("model_probs_z")
        x = pyro.sample("x", dist.Categorical(probs_x))
        pyro.sample("y", dist.Categorical(probs_y[x]), infer={"enumerate": "parallel"})
        pyro.sample("z", dist.Categorical(probs_z), obs=torch.tensor(0))

    return auto_model


def enum_enumerate_2(scale):
    @poutine.scale(scale=scale)
    def auto_model():
        probs_x = pyro.param("model_probs_x")
        probs_y = pyro.param("model_probs_y")
        probs_z = pyro.param("model_probs_z")
        x = pyro.sample("x", dist.Categorical(probs_x))
        y = pyro.sample("y", dist.Categorical(probs_y[x]), infer={"enumerate": "parallel"})
        pyro.sample("z", dist.Categorical(probs_z[y]), obs=torch.tensor(0))

    return auto_model


def enum_enumerate_3(scale):
    def auto_model():
        probs_x = pyro.param("model_probs_x")
        probs_y = pyro.param("model_probs_y")
        probs_z = pyro.param("model_probs_z")
        x = pyro.sample("x", dist.Categorical(probs_x))
        with poutine.scale(scale=scale):
            y = pyro.sample("y", dist.Categorical(probs_y[x]), infer={"enumerate": "parallel"})
            pyro.sample("z", dist.Categorical(probs_z[y]), obs=torch.tensor(0))

    return auto_model


add(
    "elbo_enumerate_1[scale=10]",
    f"{ENUM}::test_elbo_enumerate_1",
    enum_enumerate_1(10),
    params=ENUMERATE_PARAMS,
)
add(
    "elbo_enumerate_2[scale=10]",
    f"{ENUM}::test_elbo_enumerate_2",
    enum_enumerate_2(10),
    params=ENUMERATE_PARAMS_2,
)
add(
    "elbo_enumerate_3[scale=10]",
    f"{ENUM}::test_elbo_enumerate_3",
    enum_enumerate_3(10),
    params=ENUMERATE_PARAMS_2,
)


def enum_plate_1(num_samples, num_masked, scale):
    def auto_model(data):
        probs_x = pyro.param("model_probs_x")
        probs_y = pyro.param("model_probs_y")
        probs_z = pyro.param("model_probs_z")
        x = pyro.sample("x", dist.Categorical(probs_x))
        with poutine.scale(scale=scale):
            y = pyro.sample("y", dist.Categorical(probs_y[x]), infer={"enumerate": "parallel"})
            if num_masked == num_samples:
                with pyro.plate("data", len(data)):
                    pyro.sample("z", dist.Categorical(probs_z[y]), obs=data)
            else:
                with pyro.plate("data", len(data)):
                    with poutine.mask(mask=torch.arange(num_samples) < num_masked):
                        pyro.sample("z", dist.Categorical(probs_z[y]), obs=data)

    return auto_model


def enum_plate_2(num_samples, num_masked, scale):
    def auto_model(data):
        probs_x = pyro.param("model_probs_x")
        probs_y = pyro.param("model_probs_y")
        probs_z = pyro.param("model_probs_z")
        x = pyro.sample("x", dist.Categorical(probs_x))
        with poutine.scale(scale=scale):
            with pyro.plate("data", len(data)):
                if num_masked == num_samples:
                    y = pyro.sample(
                        "y", dist.Categorical(probs_y[x]), infer={"enumerate": "parallel"}
                    )
                    pyro.sample("z", dist.Categorical(probs_z[y]), obs=data)
                else:
                    with poutine.mask(mask=torch.arange(num_samples) < num_masked):
                        y = pyro.sample(
                            "y", dist.Categorical(probs_y[x]), infer={"enumerate": "parallel"}
                        )
                        pyro.sample("z", dist.Categorical(probs_z[y]), obs=data)

    return auto_model


def enum_plate_3(num_samples, num_masked, scale):
    @poutine.scale(scale=scale)
    def auto_model(data):
        probs_x = pyro.param("model_probs_x")
        probs_y = pyro.param("model_probs_y")
        probs_z = pyro.param("model_probs_z")
        with pyro.plate("data", len(data)):
            if num_masked == num_samples:
                x = pyro.sample("x", dist.Categorical(probs_x))
                y = pyro.sample("y", dist.Categorical(probs_y[x]), infer={"enumerate": "parallel"})
                pyro.sample("z", dist.Categorical(probs_z[y]), obs=data)
            else:
                with poutine.mask(mask=torch.arange(num_samples) < num_masked):
                    x = pyro.sample("x", dist.Categorical(probs_x))
                    y = pyro.sample(
                        "y", dist.Categorical(probs_y[x]), infer={"enumerate": "parallel"}
                    )
                    pyro.sample("z", dist.Categorical(probs_z[y]), obs=data)

    return auto_model


for _fn, _n in ((enum_plate_1, 1), (enum_plate_2, 2), (enum_plate_3, 3)):
    for _label, (_samples, _masked) in (("batch", (2, 2)), ("masked", (3, 2))):
        add(
            f"elbo_enumerate_plate_{_n}[{_label},scale=10]",
            f"{ENUM}::test_elbo_enumerate_plate_{_n}",
            _fn(_samples, _masked, 10),
            torch.tensor([1, 0, 1][:_samples]),
            params=ENUMERATE_PARAMS_2,
        )


def enum_plate_4(outer_obs, inner_obs):
    outer_data = torch.tensor(2.0)
    inner_data = torch.tensor([0.5, 1.5])

    def auto_model():
        probs_a = pyro.param("probs_a")
        probs_b = pyro.param("probs_b")
        locs = pyro.param("locs")
        scales = pyro.param("scales")
        a = pyro.sample("a", dist.Categorical(probs_a), infer={"enumerate": "parallel"})
        if outer_obs:
            pyro.sample("outer_obs", dist.Normal(0.0, scales[a]), obs=outer_data)
        with pyro.plate("inner", 2):
            b = pyro.sample("b", dist.Categorical(probs_b), infer={"enumerate": "parallel"})
            if inner_obs:
                pyro.sample("inner_obs", dist.Normal(locs[b], scales[a]), obs=inner_data)

    return auto_model


PLATE_4_PARAMS = {
    "probs_a": (torch.tensor([0.4, 0.6]), SIMPLEX),
    "probs_b": (torch.tensor([0.6, 0.4]), SIMPLEX),
    "locs": (torch.tensor([-1.0, 1.0]), None),
    "scales": (torch.tensor([1.0, 2.0]), constraints.positive),
}
for _outer, _inner in ((False, True), (True, True)):
    add(
        f"elbo_enumerate_plate_4[outer={_outer},inner={_inner}]",
        f"{ENUM}::test_elbo_enumerate_plate_4",
        enum_plate_4(_outer, _inner),
        params=PLATE_4_PARAMS,
    )

PLATE_5_PARAMS = {
    "model_probs_a": (torch.tensor([0.45, 0.55]), SIMPLEX),
    "model_probs_b": (torch.tensor([0.6, 0.4]), SIMPLEX),
    "model_probs_c": (
        torch.tensor([[[0.4, 0.5, 0.1], [0.3, 0.5, 0.2]], [[0.3, 0.4, 0.3], [0.4, 0.4, 0.2]]]),
        SIMPLEX,
    ),
}


@config_enumerate
def enum_plate_5_model_plate():
    data = torch.tensor([1, 2])
    probs_a = pyro.param("model_probs_a")
    probs_b = pyro.param("model_probs_b")
    probs_c = pyro.param("model_probs_c")
    a = pyro.sample("a", dist.Categorical(probs_a))
    with pyro.plate("b_axis", 2):
        b = pyro.sample("b", dist.Categorical(probs_b))
        pyro.sample("c", dist.Categorical(Vindex(probs_c)[a, b]), obs=data)


@config_enumerate
def enum_plate_5_model_iplate():
    data = torch.tensor([1, 2])
    probs_a = pyro.param("model_probs_a")
    probs_b = pyro.param("model_probs_b")
    probs_c = pyro.param("model_probs_c")
    a = pyro.sample("a", dist.Categorical(probs_a))
    for i in pyro.plate("b_axis", 2):
        b = pyro.sample(f"b_{i}", dist.Categorical(probs_b))
        pyro.sample(f"c_{i}", dist.Categorical(Vindex(probs_c)[a, b]), obs=data[i])


@config_enumerate
def enum_plate_6_model_plate():
    data = torch.tensor([1, 2])
    probs_a = pyro.param("model_probs_a")
    probs_b = pyro.param("model_probs_b")
    probs_c = pyro.param("model_probs_c")
    a = pyro.sample("a", dist.Categorical(probs_a))
    b = pyro.sample("b", dist.Categorical(probs_b))
    with pyro.plate("b_axis", 2):
        pyro.sample("c", dist.Categorical(Vindex(probs_c)[a, b]), obs=data)


add(
    "elbo_enumerate_plate_5[plate]",
    f"{ENUM}::test_elbo_enumerate_plate_5",
    enum_plate_5_model_plate,
    params=PLATE_5_PARAMS,
)
add(
    "elbo_enumerate_plate_5[iplate]",
    f"{ENUM}::test_elbo_enumerate_plate_5",
    enum_plate_5_model_iplate,
    params=PLATE_5_PARAMS,
)
add(
    "elbo_enumerate_plate_6[plate]",
    f"{ENUM}::test_elbo_enumerate_plate_6",
    enum_plate_6_model_plate,
    params=PLATE_5_PARAMS,
)

PLATE_7_PARAMS = {
    "model_probs_a": (torch.tensor([0.45, 0.55]), SIMPLEX),
    "model_probs_b": (torch.tensor([[0.6, 0.4], [0.4, 0.6]]), SIMPLEX),
    "model_probs_c": (torch.tensor([[0.75, 0.25], [0.55, 0.45]]), SIMPLEX),
    "model_probs_d": (
        torch.tensor([[[0.4, 0.6], [0.3, 0.7]], [[0.3, 0.7], [0.2, 0.8]]]),
        SIMPLEX,
    ),
    "model_probs_e": (torch.tensor([[0.75, 0.25], [0.55, 0.45]]), SIMPLEX),
}


def enum_plate_7(scale):
    @poutine.scale(scale=scale)
    def auto_model(data):
        probs_a = pyro.param("model_probs_a")
        probs_b = pyro.param("model_probs_b")
        probs_c = pyro.param("model_probs_c")
        probs_d = pyro.param("model_probs_d")
        probs_e = pyro.param("model_probs_e")
        a = pyro.sample("a", dist.Categorical(probs_a))
        b = pyro.sample("b", dist.Categorical(probs_b[a]), infer={"enumerate": "parallel"})
        with pyro.plate("data", 2):
            c = pyro.sample("c", dist.Categorical(probs_c[a]))
            d = pyro.sample(
                "d", dist.Categorical(Vindex(probs_d)[b, c]), infer={"enumerate": "parallel"}
            )
            pyro.sample("obs", dist.Categorical(probs_e[d]), obs=data)

    return auto_model


add(
    "elbo_enumerate_plate_7[scale=10]",
    f"{ENUM}::test_elbo_enumerate_plate_7",
    enum_plate_7(10),
    torch.tensor([0, 0]),
    params=PLATE_7_PARAMS,
)

PLATES_PARAMS = {
    "probs_a": (torch.tensor([0.45, 0.55]), SIMPLEX),
    "probs_b": (torch.tensor([[0.6, 0.4], [0.4, 0.6]]), SIMPLEX),
    "probs_c": (torch.tensor([[0.75, 0.25], [0.55, 0.45]]), SIMPLEX),
    "probs_d": (torch.tensor([[0.4, 0.6], [0.3, 0.7]]), SIMPLEX),
}


@config_enumerate
def enum_plates_1():
    b_data = torch.tensor([0, 1])
    d_data = torch.tensor([0, 0, 1])
    probs_a = pyro.param("probs_a")
    probs_b = pyro.param("probs_b")
    probs_c = pyro.param("probs_c")
    probs_d = pyro.param("probs_d")
    with pyro.plate("a_axis", 2):
        a = pyro.sample("a", dist.Categorical(probs_a))
        pyro.sample("b", dist.Categorical(probs_b[a]), obs=b_data)
    with pyro.plate("c_axis", 3):
        c = pyro.sample("c", dist.Categorical(probs_c))
        pyro.sample("d", dist.Categorical(probs_d[c]), obs=d_data)


@config_enumerate
def enum_plates_2():
    b_data = torch.tensor([0, 1])
    c_data = torch.tensor([0, 0, 1])
    probs_a = pyro.param("probs_a")
    probs_b = pyro.param("probs_b")
    probs_c = pyro.param("probs_c")
    a = pyro.sample("a", dist.Categorical(probs_a))
    with pyro.plate("b_axis", 2):
        pyro.sample("b", dist.Categorical(probs_b[a]), obs=b_data)
    with pyro.plate("c_axis", 3):
        pyro.sample("c", dist.Categorical(probs_c[a]), obs=c_data)


@config_enumerate
def enum_plates_3():
    data = torch.tensor([[0, 1], [0, 0]])
    probs_a = pyro.param("probs_a")
    probs_b = pyro.param("probs_b")
    a = pyro.sample("a", dist.Categorical(probs_a))
    with pyro.plate("outer", 2):
        with pyro.plate("inner", 2):
            pyro.sample("b", dist.Categorical(probs_b[a]), obs=data)


@config_enumerate
def enum_plates_4(data):
    probs_a = pyro.param("probs_a")
    probs_b = pyro.param("probs_b")
    probs_c = pyro.param("probs_c")
    a = pyro.sample("a", dist.Categorical(probs_a))
    with pyro.plate("outer", 2):
        b = pyro.sample("b", dist.Categorical(probs_b[a]))
        with pyro.plate("inner", 2):
            pyro.sample("c", dist.Categorical(probs_c[b]), obs=data)


@config_enumerate
def enum_plates_5():
    data = torch.tensor([[0, 1], [0, 0]])
    probs_a = pyro.param("probs_a")
    probs_b = pyro.param("probs_b")
    probs_c = pyro.param("probs_c")
    a = pyro.sample("a", dist.Categorical(probs_a))
    with pyro.plate("outer", 2):
        b = pyro.sample("b", dist.Categorical(probs_b[a]))
        with pyro.plate("inner", 2):
            pyro.sample("c", dist.Categorical(Vindex(probs_c)[a, b]), obs=data)


PLATES_5_PARAMS = dict(
    PLATES_PARAMS,
    probs_c=(torch.tensor([[[0.4, 0.6], [0.3, 0.7]], [[0.2, 0.8], [0.1, 0.9]]]), SIMPLEX),
)
add(
    "elbo_enumerate_plates_1",
    f"{ENUM}::test_elbo_enumerate_plates_1",
    enum_plates_1,
    params=dict(PLATES_PARAMS, probs_c=(torch.tensor([0.75, 0.25]), SIMPLEX)),
)
add(
    "elbo_enumerate_plates_2",
    f"{ENUM}::test_elbo_enumerate_plates_2",
    enum_plates_2,
    params=PLATES_PARAMS,
)
add(
    "elbo_enumerate_plates_3",
    f"{ENUM}::test_elbo_enumerate_plates_3",
    enum_plates_3,
    params=PLATES_PARAMS,
)
add(
    "elbo_enumerate_plates_4",
    f"{ENUM}::test_elbo_enumerate_plates_4",
    enum_plates_4,
    torch.tensor([[0, 1], [0, 0]]),
    params=PLATES_PARAMS,
)
add(
    "elbo_enumerate_plates_5",
    f"{ENUM}::test_elbo_enumerate_plates_5",
    enum_plates_5,
    params=PLATES_5_PARAMS,
)

PLATES_6_PARAMS = {
    "probs_a": (torch.tensor([0.45, 0.55]), SIMPLEX),
    "probs_b": (torch.tensor([[0.6, 0.4], [0.4, 0.6]]), SIMPLEX),
    "probs_c": (torch.tensor([[0.75, 0.25], [0.55, 0.45]]), SIMPLEX),
    "probs_d": (torch.tensor([[[0.4, 0.6], [0.3, 0.7]], [[0.3, 0.7], [0.2, 0.8]]]), SIMPLEX),
}


@config_enumerate
def plates_6_iplate_iplate(data):
    probs_a = pyro.param("probs_a")
    probs_b = pyro.param("probs_b")
    probs_c = pyro.param("probs_c")
    probs_d = pyro.param("probs_d")
    b_axis = pyro.plate("b_axis", 2)
    c_axis = pyro.plate("c_axis", 2)
    a = pyro.sample("a", dist.Categorical(probs_a))
    b = [pyro.sample(f"b_{i}", dist.Categorical(probs_b[a])) for i in b_axis]
    c = [pyro.sample(f"c_{j}", dist.Categorical(probs_c[a])) for j in c_axis]
    for i in b_axis:
        for j in c_axis:
            pyro.sample(
                f"d_{i}_{j}",
                dist.Categorical(Vindex(probs_d)[b[i], c[j]]),
                obs=data[i, j],
            )


@config_enumerate
def plates_6_iplate_plate(data):
    probs_a = pyro.param("probs_a")
    probs_b = pyro.param("probs_b")
    probs_c = pyro.param("probs_c")
    probs_d = pyro.param("probs_d")
    b_axis = pyro.plate("b_axis", 2)
    c_axis = pyro.plate("c_axis", 2)
    a = pyro.sample("a", dist.Categorical(probs_a))
    b = [pyro.sample(f"b_{i}", dist.Categorical(probs_b[a])) for i in b_axis]
    with c_axis:
        c = pyro.sample("c", dist.Categorical(probs_c[a]))
    for i in b_axis:
        with c_axis:
            pyro.sample(f"d_{i}", dist.Categorical(Vindex(probs_d)[b[i], c]), obs=data[i])


@config_enumerate
def plates_6_plate_iplate(data):
    probs_a = pyro.param("probs_a")
    probs_b = pyro.param("probs_b")
    probs_c = pyro.param("probs_c")
    probs_d = pyro.param("probs_d")
    b_axis = pyro.plate("b_axis", 2)
    c_axis = pyro.plate("c_axis", 2)
    a = pyro.sample("a", dist.Categorical(probs_a))
    with b_axis:
        b = pyro.sample("b", dist.Categorical(probs_b[a]))
    c = [pyro.sample(f"c_{j}", dist.Categorical(probs_c[a])) for j in c_axis]
    with b_axis:
        for j in c_axis:
            pyro.sample(f"d_{j}", dist.Categorical(Vindex(probs_d)[b, c[j]]), obs=data[:, j])


@config_enumerate
def plates_6_plate_plate(data):
    probs_a = pyro.param("probs_a")
    probs_b = pyro.param("probs_b")
    probs_c = pyro.param("probs_c")
    probs_d = pyro.param("probs_d")
    b_axis = pyro.plate("b_axis", 2, dim=-1)
    c_axis = pyro.plate("c_axis", 2, dim=-2)
    a = pyro.sample("a", dist.Categorical(probs_a))
    with b_axis:
        b = pyro.sample("b", dist.Categorical(probs_b[a]))
    with c_axis:
        c = pyro.sample("c", dist.Categorical(probs_c[a]))
    with b_axis, c_axis:
        pyro.sample("d", dist.Categorical(Vindex(probs_d)[b, c]), obs=data)


PLATES_DATA = torch.tensor([[0, 1], [0, 0]])
for _label, _fn in (
    ("iplate_iplate", plates_6_iplate_iplate),
    ("iplate_plate", plates_6_iplate_plate),
    ("plate_iplate", plates_6_plate_iplate),
    ("plate_plate", plates_6_plate_plate),
):
    add(
        f"elbo_enumerate_plates_6[{_label}]",
        f"{ENUM}::test_elbo_enumerate_plates_6",
        _fn,
        PLATES_DATA,
        params=PLATES_6_PARAMS,
        pyro_refuses=_label == "plate_plate",
    )

PLATES_7_PARAMS = {
    "probs_a": (torch.tensor([0.45, 0.55]), SIMPLEX),
    "probs_b": (torch.tensor([[0.6, 0.4], [0.4, 0.6]]), SIMPLEX),
    "probs_c": (torch.tensor([[0.75, 0.25], [0.55, 0.45]]), SIMPLEX),
    "probs_d": (torch.tensor([[0.3, 0.7], [0.2, 0.8]]), SIMPLEX),
    "probs_e": (torch.tensor([[0.4, 0.6], [0.3, 0.7]]), SIMPLEX),
}


@config_enumerate
def plates_7_iplate_iplate(data):
    probs_a = pyro.param("probs_a")
    probs_b = pyro.param("probs_b")
    probs_c = pyro.param("probs_c")
    probs_d = pyro.param("probs_d")
    probs_e = pyro.param("probs_e")
    b_axis = pyro.plate("b_axis", 2)
    c_axis = pyro.plate("c_axis", 2)
    a = pyro.sample("a", dist.Categorical(probs_a))
    b = [pyro.sample(f"b_{i}", dist.Categorical(probs_b[a])) for i in b_axis]
    c = [pyro.sample(f"c_{j}", dist.Categorical(probs_c[a])) for j in c_axis]
    for i in b_axis:
        for j in c_axis:
            pyro.sample(f"d_{i}_{j}", dist.Categorical(probs_d[b[i]]), obs=data[i, j])
            pyro.sample(f"e_{i}_{j}", dist.Categorical(probs_e[c[j]]), obs=data[i, j])


@config_enumerate
def plates_7_iplate_plate(data):
    probs_a = pyro.param("probs_a")
    probs_b = pyro.param("probs_b")
    probs_c = pyro.param("probs_c")
    probs_d = pyro.param("probs_d")
    probs_e = pyro.param("probs_e")
    b_axis = pyro.plate("b_axis", 2)
    c_axis = pyro.plate("c_axis", 2)
    a = pyro.sample("a", dist.Categorical(probs_a))
    b = [pyro.sample(f"b_{i}", dist.Categorical(probs_b[a])) for i in b_axis]
    with c_axis:
        c = pyro.sample("c", dist.Categorical(probs_c[a]))
    for i in b_axis:
        with c_axis:
            pyro.sample(f"d_{i}", dist.Categorical(probs_d[b[i]]), obs=data[i])
            pyro.sample(f"e_{i}", dist.Categorical(probs_e[c]), obs=data[i])


@config_enumerate
def plates_7_plate_iplate(data):
    probs_a = pyro.param("probs_a")
    probs_b = pyro.param("probs_b")
    probs_c = pyro.param("probs_c")
    probs_d = pyro.param("probs_d")
    probs_e = pyro.param("probs_e")
    b_axis = pyro.plate("b_axis", 2)
    c_axis = pyro.plate("c_axis", 2)
    a = pyro.sample("a", dist.Categorical(probs_a))
    with b_axis:
        b = pyro.sample("b", dist.Categorical(probs_b[a]))
    c = [pyro.sample(f"c_{j}", dist.Categorical(probs_c[a])) for j in c_axis]
    with b_axis:
        for j in c_axis:
            pyro.sample(f"d_{j}", dist.Categorical(probs_d[b]), obs=data[:, j])
            pyro.sample(f"e_{j}", dist.Categorical(probs_e[c[j]]), obs=data[:, j])


@config_enumerate
def plates_7_plate_plate(data):
    probs_a = pyro.param("probs_a")
    probs_b = pyro.param("probs_b")
    probs_c = pyro.param("probs_c")
    probs_d = pyro.param("probs_d")
    probs_e = pyro.param("probs_e")
    b_axis = pyro.plate("b_axis", 2, dim=-1)
    c_axis = pyro.plate("c_axis", 2, dim=-2)
    a = pyro.sample("a", dist.Categorical(probs_a))
    with b_axis:
        b = pyro.sample("b", dist.Categorical(probs_b[a]))
    with c_axis:
        c = pyro.sample("c", dist.Categorical(probs_c[a]))
    with b_axis, c_axis:
        pyro.sample("d", dist.Categorical(probs_d[b]), obs=data)
        pyro.sample("e", dist.Categorical(probs_e[c]), obs=data)


for _label, _fn in (
    ("iplate_iplate", plates_7_iplate_iplate),
    ("iplate_plate", plates_7_iplate_plate),
    ("plate_iplate", plates_7_plate_iplate),
    ("plate_plate", plates_7_plate_plate),
):
    add(
        f"elbo_enumerate_plates_7[{_label}]",
        f"{ENUM}::test_elbo_enumerate_plates_7",
        _fn,
        PLATES_DATA,
        params=PLATES_7_PARAMS,
    )

PLATES_8_PARAMS = {
    "model_probs_a": (torch.tensor([0.45, 0.55]), SIMPLEX),
    "model_probs_b": (torch.tensor([0.6, 0.4]), SIMPLEX),
    "model_probs_c": PLATE_5_PARAMS["model_probs_c"],
}
PLATES_8_DATA = torch.tensor([[0, 1], [0, 2]])


@config_enumerate
def plates_8_plate_plate():
    data = PLATES_8_DATA
    probs_a = pyro.param("model_probs_a")
    probs_b = pyro.param("model_probs_b")
    probs_c = pyro.param("model_probs_c")
    a = pyro.sample("a", dist.Categorical(probs_a))
    with pyro.plate("outer", 2):
        b = pyro.sample("b", dist.Categorical(probs_b))
        with pyro.plate("inner", 2):
            pyro.sample("c", dist.Categorical(Vindex(probs_c)[a, b]), obs=data)


@config_enumerate
def plates_8_iplate_plate():
    data = PLATES_8_DATA
    probs_a = pyro.param("model_probs_a")
    probs_b = pyro.param("model_probs_b")
    probs_c = pyro.param("model_probs_c")
    inner = pyro.plate("inner", 2)
    a = pyro.sample("a", dist.Categorical(probs_a))
    for i in pyro.plate("outer", 2):
        b = pyro.sample(f"b_{i}", dist.Categorical(probs_b))
        with inner:
            pyro.sample(f"c_{i}", dist.Categorical(Vindex(probs_c)[a, b]), obs=data[:, i])


@config_enumerate
def plates_8_plate_iplate():
    data = PLATES_8_DATA
    probs_a = pyro.param("model_probs_a")
    probs_b = pyro.param("model_probs_b")
    probs_c = pyro.param("model_probs_c")
    a = pyro.sample("a", dist.Categorical(probs_a))
    with pyro.plate("outer", 2):
        b = pyro.sample("b", dist.Categorical(probs_b))
        for j in pyro.plate("inner", 2):
            pyro.sample(f"c_{j}", dist.Categorical(Vindex(probs_c)[a, b]), obs=data[j])


@config_enumerate
def plates_8_iplate_iplate():
    data = PLATES_8_DATA
    probs_a = pyro.param("model_probs_a")
    probs_b = pyro.param("model_probs_b")
    probs_c = pyro.param("model_probs_c")
    inner = pyro.plate("inner", 2)
    a = pyro.sample("a", dist.Categorical(probs_a))
    for i in pyro.plate("outer", 2):
        b = pyro.sample(f"b_{i}", dist.Categorical(probs_b))
        for j in inner:
            pyro.sample(f"c_{i}_{j}", dist.Categorical(Vindex(probs_c)[a, b]), obs=data[j, i])


for _label, _fn in (
    ("plate_plate", plates_8_plate_plate),
    ("iplate_plate", plates_8_iplate_plate),
    ("plate_iplate", plates_8_plate_iplate),
    ("iplate_iplate", plates_8_iplate_iplate),
):
    add(
        f"elbo_enumerate_plates_8[{_label}]",
        f"{ENUM}::test_elbo_enumerate_plates_8",
        _fn,
        params=PLATES_8_PARAMS,
    )


def elbo_scale_auto_model(data):
    def component_model(data, which, suffix=""):
        loc = pyro.param("locs", torch.tensor([-1.0, 1.0]))[which]
        with pyro.plate("data" + suffix, len(data)):
            pyro.sample("obs" + suffix, dist.Normal(loc, 1.0), obs=data)

    mixture_probs = pyro.param("mixture_probs")
    which = pyro.sample("which", dist.Categorical(mixture_probs))
    component_model(data, which)


add(
    "elbo_scale",
    f"{ENUM}::test_elbo_scale",
    elbo_scale_auto_model,
    torch.tensor([0.5, -1.5, 2.0]),
    params={"mixture_probs": (torch.tensor([0.25, 0.75]), SIMPLEX)},
)


def elbo_dbn_growth(data):
    uniform = torch.tensor([0.5, 0.5])
    probs_z = pyro.param("probs_z", torch.tensor([[0.75, 0.25], [0.25, 0.75]]), constraint=SIMPLEX)
    for i, z in pyro.markov(enumerate(data)):
        pyro.sample(f"x_{i}", dist.Categorical(uniform))
        y = pyro.sample(f"y_{i}", dist.Categorical(uniform))
        pyro.sample(f"z_{i}", dist.Categorical(probs_z[y]), obs=z)


add("elbo_hmm_growth[5]", f"{ENUM}::test_elbo_hmm_growth", enum_hmm_in_guide, torch.ones(5))
add("elbo_dbn_growth[4]", f"{ENUM}::test_elbo_dbn_growth", elbo_dbn_growth, torch.ones(4))


def bernoulli_pyramid(N_b=3, N_c=5):
    a = pyro.sample("a", dist.Bernoulli(0.33))
    with pyro.plate("b_plate", N_b):
        b = pyro.sample("b", dist.Bernoulli(0.25 * a + 0.50))
        with pyro.plate("c_plate", N_c):
            pyro.sample("c", dist.Bernoulli(0.15 * a + 0.20 * b + 0.32))


def bernoulli_non_tree(b_factor=0.03, c_factor=0.04, d_offset=0.32):
    a = pyro.sample("a", dist.Bernoulli(0.33))
    b = pyro.sample("b", dist.Bernoulli(0.25 * a + 0.50))
    c = pyro.sample("c", dist.Bernoulli(0.25 * a + 0.10 * b + 0.50))
    pyro.sample("d", dist.Bernoulli(b_factor * b + c_factor * c + d_offset))


add(
    "bernoulli_pyramid[N_b=3,N_c=5]",
    f"{ENUM}::test_bernoulli_pyramid_elbo_gradient",
    bernoulli_pyramid,
    check="marginals",
    marginal_sites=("a", "b", "c"),
)
add("bernoulli_non_tree", f"{ENUM}::test_bernoulli_non_tree_elbo_gradient", bernoulli_non_tree)


def zip_composite_model(data):
    gate = pyro.param("gate")
    rate = pyro.param("rate")
    dist1 = dist.Delta(torch.tensor(0.0))
    dist0 = dist.Poisson(rate)
    with pyro.plate("data", len(data)):
        mask = pyro.sample("mask", dist.Bernoulli(gate), infer={"enumerate": "parallel"}).bool()
        pyro.sample("obs", dist.MaskedMixture(mask, dist0, dist1), obs=data)


add(
    "elbo_zip[composite]",
    f"{ENUM}::test_elbo_zip",
    zip_composite_model,
    torch.tensor([0.0, 1.0, 2.0]),
    params={"gate": (torch.tensor(0.25), None), "rate": (torch.tensor(1.0), None)},
)


def mixture_of_diag_normals_hand_model():
    data = torch.tensor([[0.0, 0.0], [1.0, 1.0], [2.0, 3.0], [1.0, 11.0]])
    locs = pyro.param("locs")
    coord_scale = pyro.param("coord_scale")
    component_logits = pyro.param("component_logits")
    with pyro.plate("data", len(data), dim=-2):
        which = pyro.sample(
            "mask", dist.Categorical(logits=component_logits), infer={"enumerate": "parallel"}
        )
        with pyro.plate("components", len(component_logits), dim=-1) as component_ind:
            with poutine.mask(mask=(which == component_ind)):
                pyro.sample(
                    "obs",
                    dist.Normal(locs, coord_scale).to_event(1),
                    obs=data.unsqueeze(-2),
                )


add(
    "mixture_of_diag_normals[hand_model]",
    f"{ENUM}::test_mixture_of_diag_normals",
    mixture_of_diag_normals_hand_model,
    params={
        "locs": (torch.tensor([[0.0, 0.0], [0.0, 1.0], [0.0, 10.0]]), None),
        "component_logits": (torch.tensor([0.0, -1.0, 2.0]), None),
        "coord_scale": (torch.tensor([[2.0, 1.0], [1.0, 2], [4.0, 4.0]]), None),
    },
)


def compute_marginals_single(Dist, prior):
    prior = torch.tensor(prior)
    data = torch.tensor([0.0, 0.1, 0.2, 0.9, 1.0, 1.1])

    @config_enumerate
    def model():
        locs = torch.tensor([-1.0, 0.0, 1.0, 2.0])
        x = pyro.sample("x", Dist(prior))
        if Dist is dist.Bernoulli:
            x = x.long()
        elif Dist is dist.OneHotCategorical:
            x = x.max(-1)[1]
        with pyro.plate("data", len(data)):
            pyro.sample("obs", dist.Normal(locs[x], 1.0), obs=data)

    return model


for _Dist, _prior in (
    (dist.Bernoulli, 0.2),
    (dist.Categorical, [0.2, 0.3, 0.5]),
    (dist.OneHotCategorical, [0.2, 0.3, 0.3, 0.2]),
):
    add(
        f"compute_marginals_single[{_Dist.__name__}]",
        f"{ENUM}::test_compute_marginals_single",
        compute_marginals_single(_Dist, _prior),
    )


@config_enumerate
def compute_marginals_restrictions():
    w = pyro.sample("w", dist.Bernoulli(0.1))
    x = pyro.sample("x", dist.Bernoulli(0.2))
    y = pyro.sample("y", dist.Bernoulli(0.3))
    z = pyro.sample("z", dist.Bernoulli(0.4))
    pyro.sample("obs", dist.Normal(0.0, 1.0), obs=w + x + y + z)


@config_enumerate
def compute_marginals_hmm(data):
    transition_probs = torch.tensor([[0.75, 0.25], [0.25, 0.75]])
    emission_probs = torch.tensor([[0.75, 0.25], [0.25, 0.75]])
    x = torch.tensor(0)
    for i in pyro.markov(range(len(data) + 1)):
        if i < len(data):
            x = pyro.sample(f"x_{i}", dist.Categorical(transition_probs[x]))
            pyro.sample(f"y_{i}", dist.Categorical(emission_probs[x]), obs=data[i])
        else:
            pyro.sample(f"x_{i}", dist.Categorical(transition_probs[x]), obs=torch.tensor(1))


@config_enumerate
def marginals_2678(a=None, b=None):
    a = pyro.sample("a", dist.Bernoulli(0.75), obs=a)
    pyro.sample("b", dist.Bernoulli(1 - 0.25 * a), obs=b)


add(
    "compute_marginals_restrictions",
    f"{ENUM}::test_compute_marginals_restrictions",
    compute_marginals_restrictions,
)
add(
    "compute_marginals_hmm[4]",
    f"{ENUM}::test_compute_marginals_hmm",
    compute_marginals_hmm,
    torch.zeros(4, dtype=torch.long),
)
add("marginals_2678[]", f"{ENUM}::test_marginals_2678", marginals_2678)
add(
    "marginals_2678[b]",
    f"{ENUM}::test_marginals_2678",
    marginals_2678,
    kwargs={"b": torch.tensor(1.0)},
)


@config_enumerate
def backwardsample_smoke(data):
    xs = list(data)
    zs = []
    for i in range(2):
        K = i + 2  # number of mixture components
        zs.append(pyro.sample(f"z_{i}", dist.Categorical(torch.ones(K))))
        if i == 0:
            loc = pyro.param("loc", torch.tensor([0.3, -0.8]))[zs[i]]
            xs[i] = pyro.sample(f"x_{i}", dist.Normal(loc, 1.0), obs=data[i])
        elif i == 1:
            logits = pyro.param("logits", torch.tensor([[0.1, -0.5], [1.2, 0.3], [-0.7, 0.4]]))[
                zs[i]
            ]
            xs[i] = pyro.sample(f"x_{i}", dist.Categorical(logits=logits), obs=data[i])
    z12 = zs[0] + 2 * zs[1]
    pyro.sample("z_12", dist.Categorical(torch.arange(6.0)), obs=z12)
    return xs, zs


@config_enumerate
def backwardsample_2(data, num_particles=4):
    with pyro.plate("particles", num_particles):
        p_z = torch.tensor([0.1, 0.9])
        x = pyro.sample("x", dist.Categorical(torch.tensor([0.5, 0.5])))
        z = pyro.sample("z", dist.Bernoulli(p_z[x]), obs=data)
    return x, z


@config_enumerate
def backwardsample_3(data, num_particles=4):
    with pyro.plate("particles", num_particles):
        p_z = torch.tensor([[0.9, 0.1], [0.1, 0.9]])
        x = pyro.sample("x", dist.Categorical(torch.tensor([0.5, 0.5])))
        y = pyro.sample("y", dist.Categorical(torch.tensor([0.5, 0.5])))
        z = pyro.sample("z", dist.Bernoulli(p_z[x, y]), obs=data)
    return x, y, z


for _label, _data in (
    ("None,None", [None, None]),
    ("0.0,None", [torch.tensor(0.0), None]),
    ("0.0,0", [torch.tensor(0.0), torch.tensor(0)]),
):
    add(
        f"backwardsample_posterior_smoke[{_label}]",
        f"{ENUM}::test_backwardsample_posterior_smoke",
        backwardsample_smoke,
        _data,
    )
add(
    "backwardsample_posterior_2",
    f"{ENUM}::test_backwardsample_posterior_2",
    backwardsample_2,
    torch.zeros(4),
)
add(
    "backwardsample_posterior_3",
    f"{ENUM}::test_backwardsample_posterior_3",
    backwardsample_3,
    torch.ones(4),
)


def multi_dependence(K=5, d=2, N_obs=3):
    @config_enumerate
    def model(N=1):
        with pyro.plate("data_plate", N, dim=-2):
            mixing_weights = pyro.param("pi", torch.ones(K) / K, constraint=SIMPLEX)
            means = pyro.sample("mu", dist.Normal(torch.zeros(K, d), torch.ones(K, d)).to_event(2))
            with pyro.plate("observations", N_obs, dim=-1):
                s = pyro.sample("s", dist.Categorical(mixing_weights))
                pyro.sample("x", dist.Normal(Vindex(means)[..., s, :], 0.1).to_event(1))
                pyro.sample("y", dist.Normal(Vindex(means)[..., s, :], 0.1).to_event(1))

    return model


add(
    "multi_dependence_enumeration[N=2]",
    f"{ENUM}::test_multi_dependence_enumeration",
    multi_dependence(),
    2,
    check="marginals",
    marginal_sites=("s",),
)

# ------------------------------------------------------------ tests/infer/test_valid_models.py
INFER = {"enumerate": "parallel"}


def enum_in_model_ok():
    p = pyro.param("p", torch.tensor(0.25))
    a = pyro.sample("a", dist.Bernoulli(p))
    b = pyro.sample("b", dist.Bernoulli(p + a / 2))
    c = pyro.sample("c", dist.Bernoulli(p + b / 2), infer=INFER)
    d = pyro.sample("d", dist.Bernoulli(p + c / 2))
    e = pyro.sample("e", dist.Bernoulli(p + d / 2))
    f = pyro.sample("f", dist.Bernoulli(p + e / 2), infer=INFER)
    pyro.sample("g", dist.Bernoulli(p + f / 2), obs=torch.tensor(0.0))


def enum_in_model_plate_ok():
    p = pyro.param("p", torch.tensor(0.25))
    a = pyro.sample("a", dist.Bernoulli(p))
    b = pyro.sample("b", dist.Bernoulli(p + a / 2))
    with pyro.plate("data", 3):
        c = pyro.sample("c", dist.Bernoulli(p + b / 2), infer=INFER)
        d = pyro.sample("d", dist.Bernoulli(p + c / 2))
        e = pyro.sample("e", dist.Bernoulli(p + d / 2))
        f = pyro.sample("f", dist.Bernoulli(p + e / 2), infer=INFER)
        pyro.sample("g", dist.Bernoulli(p + f / 2), obs=torch.zeros(3))


@config_enumerate
def enum_in_model_plate_reuse_ok():
    p = pyro.param("p", torch.tensor([0.2, 0.8]))
    a = pyro.sample("a", dist.Bernoulli(0.3)).long()
    with pyro.plate("b_axis", 2):
        pyro.sample("b", dist.Bernoulli(p[a]), obs=torch.tensor([0.0, 1.0]))
    c = pyro.sample("c", dist.Bernoulli(0.3)).long()
    with pyro.plate("c_axis", 2):
        pyro.sample("d", dist.Bernoulli(p[c]), obs=torch.tensor([0.0, 0.0]))


@config_enumerate
def enum_in_model_multi_scale():
    p = pyro.param("p", torch.tensor([0.2, 0.8]))
    x = pyro.sample("x", dist.Bernoulli(0.3)).long()
    with poutine.scale(scale=2.0):
        pyro.sample("y", dist.Bernoulli(p[x]), obs=torch.tensor(0.0))


def enum_in_model_diamond(use_vindex):
    data = torch.tensor([[0, 1], [0, 0]])

    @config_enumerate
    def model():
        pyro.param("probs_a", torch.tensor([0.45, 0.55]))
        pyro.param("probs_b", torch.tensor([[0.6, 0.4], [0.4, 0.6]]))
        pyro.param("probs_c", torch.tensor([[0.75, 0.25], [0.55, 0.45]]))
        pyro.param("probs_d", torch.tensor([[[0.4, 0.6], [0.3, 0.7]], [[0.3, 0.7], [0.2, 0.8]]]))
        probs_a = pyro.param("probs_a")
        probs_b = pyro.param("probs_b")
        probs_c = pyro.param("probs_c")
        probs_d = pyro.param("probs_d")
        b_axis = pyro.plate("b_axis", 2, dim=-1)
        c_axis = pyro.plate("c_axis", 2, dim=-2)
        a = pyro.sample("a", dist.Categorical(probs_a))
        with b_axis:
            b = pyro.sample("b", dist.Categorical(probs_b[a]))
        with c_axis:
            c = pyro.sample("c", dist.Categorical(probs_c[a]))
        with b_axis, c_axis:
            if use_vindex:
                probs = Vindex(probs_d)[b, c]
            else:
                d_ind = torch.arange(2, dtype=torch.long)
                probs = probs_d[b.unsqueeze(-1), c.unsqueeze(-1), d_ind]
            pyro.sample("d", dist.Categorical(probs), obs=data)

    return model


def enum_discrete_iplate_single():
    p = torch.tensor(0.5)
    for i in pyro.plate("plate", 10, 5):
        pyro.sample(f"x_{i}", dist.Bernoulli(p))


def enum_discrete_parallel_nested():
    p2 = torch.ones(2) / 2
    p3 = torch.ones(3) / 3
    pyro.sample("x2", dist.OneHotCategorical(p2))
    pyro.sample("x3", dist.OneHotCategorical(p3))


def enumerate_parallel_plate():
    p2 = torch.ones(2) / 2
    p34 = torch.ones(3, 4) / 4
    p536 = torch.ones(5, 3, 6) / 6
    pyro.sample("x2", dist.Categorical(p2))
    with pyro.plate("outer", 3):
        pyro.sample("x34", dist.Categorical(p34))
        with pyro.plate("inner", 5):
            pyro.sample("x536", dist.Categorical(p536))


def enum_discrete_iplate_plate_dependency():
    pyro.sample("w", dist.Bernoulli(0.5), infer={"enumerate": "parallel"})
    inner_plate = pyro.plate("plate", 10)
    for i in pyro.plate("iplate", 3):
        pyro.sample(f"y_{i}", dist.Bernoulli(0.5))
        with inner_plate:
            pyro.sample(f"x_{i}", dist.Bernoulli(0.5).expand_by([10]))


def enum_discrete_non_enumerated_plate():
    pyro.sample("w", dist.Bernoulli(0.5), infer={"enumerate": "parallel"})
    with pyro.plate("non_enum", 2):
        a = pyro.sample("a", dist.Bernoulli(0.5).expand_by([2]), infer={"enumerate": None})
    p = (1.0 + a.sum(-1)) / (2.0 + a.size(0))  # introduce dependency of b on a
    with pyro.plate("enum_1", 3):
        pyro.sample("b", dist.Bernoulli(p).expand_by([3]), infer={"enumerate": None})


def enum_discrete_plate_dependency():
    pyro.sample("w", dist.Bernoulli(0.5), infer={"enumerate": "parallel"})
    with pyro.plate("plate", 10, 5):
        x = pyro.sample("x", dist.Bernoulli(0.5).expand_by([5]))
    pyro.sample("y", dist.Bernoulli(x.mean()))  # user should move this line up


add("enum_in_model_ok", f"{VALID}::test_enum_in_model_ok", enum_in_model_ok)
add("enum_in_model_plate_ok", f"{VALID}::test_enum_in_model_plate_ok", enum_in_model_plate_ok)
add(
    "enum_in_model_plate_reuse_ok",
    f"{VALID}::test_enum_in_model_plate_reuse_ok",
    enum_in_model_plate_reuse_ok,
)
add(
    "enum_in_model_multi_scale",
    f"{VALID}::test_enum_in_model_multi_scale_error",
    enum_in_model_multi_scale,
    pyro_refuses=True,
)
for _vindex in (False, True):
    add(
        f"enum_in_model_diamond[vindex={_vindex}]",
        f"{VALID}::test_enum_in_model_diamond_error",
        enum_in_model_diamond(_vindex),
        pyro_refuses=True,
    )
add(
    "enum_discrete_iplate_single",
    f"{VALID}::test_enum_discrete_iplate_single_ok",
    enum_discrete_iplate_single,
    note="random subsample",
)
add(
    "enum_discrete_parallel_nested",
    f"{VALID}::test_enum_discrete_parallel_nested_ok",
    enum_discrete_parallel_nested,
)
add(
    "enumerate_parallel_plate",
    f"{VALID}::test_enumerate_parallel_plate_ok",
    enumerate_parallel_plate,
    check="marginals",
    marginal_sites=("x2", "x34", "x536"),
)
add(
    "enum_discrete_iplate_plate_dependency",
    f"{VALID}::test_enum_discrete_iplate_plate_dependency_ok",
    enum_discrete_iplate_plate_dependency,
    check="marginals",
    marginal_sites=("w", "y_1", "x_2"),
    note="subsample of 5 dropped: Pyro's test subsamples at random",
)
add(
    "enum_discrete_non_enumerated_plate",
    f"{VALID}::test_enum_discrete_non_enumerated_plate_ok",
    enum_discrete_non_enumerated_plate,
    note="a plate site summed into another plate",
)
add(
    "enum_discrete_plate_dependency",
    f"{VALID}::test_enum_discrete_plate_dependency_warning",
    enum_discrete_plate_dependency,
    pyro_refuses=True,
    note="random subsample; Pyro warns",
)


@config_enumerate
def recycling_chain():
    p = pyro.param("p", torch.tensor([[0.2, 0.8], [0.1, 0.9]]))
    x = 0
    for t in pyro.markov(range(100)):
        x = pyro.sample(f"x_{t}", dist.Categorical(p[x]))
        assert x.dim() <= 2


def recycling_dbn(markov, use_vindex):
    @config_enumerate
    def model():
        p = pyro.param("p", torch.ones(3, 3))
        q = pyro.param("q", torch.ones(2))
        r = pyro.param("r", torch.ones(3, 2, 4))
        x = 0
        times = pyro.markov(range(100)) if markov else range(11)
        for t in times:
            x = pyro.sample(f"x_{t}", dist.Categorical(p[x]))
            y = pyro.sample(f"y_{t}", dist.Categorical(q))
            if use_vindex:
                probs = Vindex(r)[x, y]
            else:
                z_ind = torch.arange(4, dtype=torch.long)
                probs = r[x.unsqueeze(-1), y.unsqueeze(-1), z_ind]
            pyro.sample(f"z_{t}", dist.Categorical(probs), obs=torch.tensor(0.0))

    return model


@config_enumerate
def recycling_nested():
    p = pyro.param("p", torch.ones(3, 3))
    x = pyro.sample("x", dist.Categorical(p[0]))
    y = x
    for i in pyro.markov(range(10)):
        y = pyro.sample(f"y_{i}", dist.Categorical(p[y]))
        z = y
        for j in pyro.markov(range(10)):
            z = pyro.sample(f"z_{i}_{j}", dist.Categorical(p[z]))


def recycling_grid(use_vindex):
    @config_enumerate
    def model():
        p = pyro.param("p_leaf", torch.ones(2, 2, 2))
        x = defaultdict(lambda: torch.tensor(0))
        y_axis = pyro.markov(range(4), keep=True)
        for i in pyro.markov(range(4)):
            for j in y_axis:
                if use_vindex:
                    probs = Vindex(p)[x[i - 1, j], x[i, j - 1]]
                else:
                    ind = torch.arange(2, dtype=torch.long)
                    probs = p[x[i - 1, j].unsqueeze(-1), x[i, j - 1].unsqueeze(-1), ind]
                x[i, j] = pyro.sample(f"x_{i}_{j}", dist.Categorical(probs))

    return model


def reentrant_data():
    data = (True, False)
    for _ in range(5):
        data = (data, data, False)
    return data


def reentrant_model(history=None):
    def model(data, state=0, address=""):
        if isinstance(data, bool):
            p = pyro.param("p_leaf", torch.ones(10))
            pyro.sample(
                f"leaf_{address}",
                dist.Bernoulli(p[state]),
                obs=torch.tensor(1.0 if data else 0.0),
            )
        else:
            p = pyro.param("p_branch", torch.ones(10, 10))
            for branch, letter in zip(data, "abcdefg"):
                next_state = pyro.sample(
                    f"branch_{address + letter}",
                    dist.Categorical(p[state]),
                    infer={"enumerate": "parallel"},
                )
                model(branch, next_state, address + letter)

    model = pyro.markov(model) if history is None else pyro.markov(model, history=history)
    return model


def mutual_recursion():
    def model_leaf(data, state=0, address=""):
        p = pyro.param("p_leaf", torch.ones(10))
        pyro.sample(
            f"leaf_{address}",
            dist.Bernoulli(p[state]),
            obs=torch.tensor(1.0 if data else 0.0),
        )

    @pyro.markov
    def model1(data, state=0, address=""):
        if isinstance(data, bool):
            model_leaf(data, state, address)
        else:
            p = pyro.param("p_branch", torch.ones(10, 10))
            for branch, letter in zip(data, "abcdefg"):
                next_state = pyro.sample(
                    f"branch_{address + letter}",
                    dist.Categorical(p[state]),
                    infer={"enumerate": "parallel"},
                )
                model2(branch, next_state, address + letter)

    @pyro.markov
    def model2(data, state=0, address=""):
        if isinstance(data, bool):
            model_leaf(data, state, address)
        else:
            p = pyro.param("p_branch", torch.ones(10, 10))
            for branch, letter in zip(data, "abcdefg"):
                next_state = pyro.sample(
                    f"branch_{address + letter}",
                    dist.Categorical(p[state]),
                    infer={"enumerate": "parallel"},
                )
                model1(branch, next_state, address + letter)

    return model1


def recycling_interleave():
    with pyro.markov() as m:
        with pyro.markov():
            with m:  # error here
                pyro.sample("x", dist.Categorical(torch.ones(4)), infer={"enumerate": "parallel"})


@config_enumerate
def recycling_plate():
    p = pyro.param("p", torch.ones(3, 3))
    q = pyro.param("q", torch.tensor([0.5, 0.5]))
    plate_x = pyro.plate("plate_x", 2, dim=-1)
    plate_y = pyro.plate("plate_y", 3, dim=-1)
    plate_z = pyro.plate("plate_z", 4, dim=-2)
    a = pyro.sample("a", dist.Bernoulli(q[0])).long()
    w = 0
    for i in pyro.markov(range(5)):
        w = pyro.sample(f"w_{i}", dist.Categorical(p[w]))
    with plate_x:
        b = pyro.sample("b", dist.Bernoulli(q[a])).long()
        x = 0
        for i in pyro.markov(range(6)):
            x = pyro.sample(f"x_{i}", dist.Categorical(p[x]))
    with plate_y:
        c = pyro.sample("c", dist.Bernoulli(q[a])).long()
        y = 0
        for i in pyro.markov(range(7)):
            y = pyro.sample(f"y_{i}", dist.Categorical(p[y]))
    with plate_z:
        d = pyro.sample("d", dist.Bernoulli(q[a])).long()
        z = 0
        for i in pyro.markov(range(8)):
            z = pyro.sample(f"z_{i}", dist.Categorical(p[z]))
    with plate_x, plate_z:
        e = pyro.sample("e", dist.Bernoulli(q[b])).long()
        xz = 0
        for i in pyro.markov(range(9)):
            xz = pyro.sample(f"xz_{i}", dist.Categorical(p[xz]))
    return a, b, c, d, e


def markov_history(history):
    @config_enumerate
    def model():
        p = pyro.param("p", 0.25 * torch.ones(2, 2))
        q = pyro.param("q", 0.25 * torch.ones(2))
        x_prev = torch.tensor(0)
        x_curr = torch.tensor(0)
        for t in pyro.markov(range(10), history=history):
            probs = p[x_prev, x_curr]
            x_prev, x_curr = x_curr, pyro.sample(f"x_{t}", dist.Bernoulli(probs)).long()
            pyro.sample(f"y_{t}", dist.Bernoulli(q[x_curr]), obs=torch.tensor(0.0))

    return model


add(
    "enum_recycling_chain",
    f"{VALID}::test_enum_recycling_chain",
    recycling_chain,
    check="marginals",
    marginal_sites=("x_0", "x_50", "x_99"),
)
for _markov in (False, True):
    for _vindex in (False, True):
        add(
            f"enum_recycling_dbn[markov={_markov},vindex={_vindex}]",
            f"{VALID}::test_enum_recycling_dbn",
            recycling_dbn(_markov, _vindex),
            check="marginals",
            marginal_sites=("x_0", "y_5", "x_10"),
        )
add(
    "enum_recycling_nested",
    f"{VALID}::test_enum_recycling_nested",
    recycling_nested,
    check="marginals",
    marginal_sites=("x", "y_4", "z_9_9"),
)
for _vindex in (False, True):
    add(
        f"enum_recycling_grid[vindex={_vindex}]",
        f"{VALID}::test_enum_recycling_grid",
        recycling_grid(_vindex),
        check="marginals",
        marginal_sites=("x_0_0", "x_2_1", "x_3_3"),
    )
add(
    "enum_recycling_reentrant",
    f"{VALID}::test_enum_recycling_reentrant",
    reentrant_model(),
    reentrant_data(),
    check="marginals",
    marginal_sites=("branch_a", "branch_ab", "branch_bac"),
)
for _history in (1, 2):
    add(
        f"enum_recycling_reentrant_history[{_history}]",
        f"{VALID}::test_enum_recycling_reentrant_history",
        reentrant_model(_history),
        reentrant_data(),
        check="marginals",
        marginal_sites=("branch_a", "branch_ab", "branch_bac"),
    )
add(
    "enum_recycling_mutual_recursion",
    f"{VALID}::test_enum_recycling_mutual_recursion",
    mutual_recursion(),
    reentrant_data(),
    check="marginals",
    marginal_sites=("branch_a", "branch_ab", "branch_bac"),
)
add("enum_recycling_interleave", f"{VALID}::test_enum_recycling_interleave", recycling_interleave)
add(
    "enum_recycling_plate",
    f"{VALID}::test_enum_recycling_plate",
    recycling_plate,
    check="marginals",
    marginal_sites=("a", "b", "e", "xz_8"),
)
for _history in (0, 1, 2, 3):
    add(
        f"markov_history[{_history}]",
        f"{VALID}::test_markov_history",
        markov_history(_history),
        check="marginals" if _history >= 2 else "brute",
        marginal_sites=("x_0", "x_5", "x_9"),
        pyro_refuses=_history < 2,
    )

# --------------------------------------------------------------------------- examples/hmm.py


def hmm_data(num_sequences=2, max_length=3, data_dim=3):
    generator = torch.Generator().manual_seed(0)
    sequences = torch.bernoulli(
        torch.full((num_sequences, max_length, data_dim), 0.3), generator=generator
    )
    lengths = torch.tensor([max_length, max_length - 1][:num_sequences])
    return sequences, lengths


def hmm_args(hidden_dim=2, raftery=False):
    return argparse.Namespace(
        hidden_dim=hidden_dim,
        nn_dim=4,
        nn_channels=2,
        jit=False,
        raftery_parameterization=raftery,
        clamp_probs=False,
    )


_HMM_PARAMS_6 = {
    "probs_x": (torch.tensor([[[0.7, 0.3], [0.4, 0.6]], [[0.2, 0.8], [0.5, 0.5]]]), SIMPLEX),
    "probs_y": (torch.tensor([[0.2, 0.6, 0.4], [0.7, 0.3, 0.5]]), constraints.unit_interval),
}
for _name, _model, _hidden in (
    ("model_0", hmm_examples.model_0, 2),
    ("model_1", hmm_examples.model_1, 2),
    ("model_2", hmm_examples.model_2, 2),
    ("model_3", hmm_examples.model_3, 4),
    ("model_4", hmm_examples.model_4, 4),
    ("model_5", hmm_examples.model_5, 2),
):
    add(f"hmm.{_name}", f"{HMM}::{_name}", _model, *hmm_data(), hmm_args(_hidden))
add(
    "hmm.model_6",
    f"{HMM}::model_6",
    hmm_examples.model_6,
    *hmm_data(),
    hmm_args(2),
    params=_HMM_PARAMS_6,
)
add(
    "hmm.model_6[raftery]",
    f"{HMM}::model_6",
    hmm_examples.model_6,
    *hmm_data(),
    hmm_args(2, raftery=True),
    params={
        "probs_x1": (torch.tensor([[0.7, 0.3], [0.4, 0.6]]), SIMPLEX),
        "probs_x2": (torch.tensor([[0.2, 0.8], [0.5, 0.5]]), SIMPLEX),
        "mix_lambda": (torch.tensor(0.5), constraints.unit_interval),
        "probs_y": _HMM_PARAMS_6["probs_y"],
    },
)


# The models AutoSpec refuses, each with words its message must contain (the cause named).
REFUSALS = {
    # the test's asserts hold only under Pyro's enumeration with its own dims: they fail on
    # AutoSpec's extra batch dims
    "iter_discrete_traces_vector[expand=True]": "extra batch dims",
    "enum_recycling_chain": "extra batch dims",  # assert x.dim() <= 2
    "avoid_nan": "must broadcast over leading batch dims",  # log_prob indexes arange(len(p))
    # Pyro's TraceEnum_ELBO refuses these too (plates that do not nest as a tree)
    "elbo_enumerate_plates_6[plate_plate]": "nest as a tree",
    "enum_in_model_diamond[vindex=False]": "nest as a tree",
    "enum_in_model_diamond[vindex=True]": "nest as a tree",
    # random subsampling: every run sees other data
    "enum_discrete_iplate_single": "random subsample",
    "enum_discrete_plate_dependency": "random subsample",
    # a plated site summed into another plate (Pyro's model works only when 'a' is replayed)
    "enum_discrete_non_enumerated_plate": "couples the elements of one plate",
    # a dependence further back than the markov history (Pyro raises "Enumeration dim conflict")
    "markov_history[0]": "pyro.markov history",
    "markov_history[1]": "pyro.markov history",
}
# Models that fail in a plain run of Pyro itself (no enumeration): AutoSpec passes the
# model's own error on unchanged (Python 3.11+ adds a note naming the last site reached).
MODEL_ERRORS = {
    # asserts x.shape == (1,): holds only under Pyro's sequential enumeration, expand=False
    "iter_discrete_traces_vector[expand=False]": "AssertionError",
}
for _case in CASES:
    _case.refusal = REFUSALS.get(_case.name, "")
    _case.model_error = MODEL_ERRORS.get(_case.name, "")
assert set(REFUSALS) | set(MODEL_ERRORS) <= {c.name for c in CASES}

# ------------------------------------------------------------- preparation and reference laws


def set_params(case: Case) -> None:
    """Clear Pyro's param store and set the case's params."""
    pyro.clear_param_store()
    for name, (value, constraint) in case.params.items():
        if constraint is None:
            pyro.param(name, value.clone())
        else:
            pyro.param(name, value.clone(), constraint=constraint)


def _latent_sites(model, args, kwargs):
    with poutine.block(hide_types=["param"]):
        trace = poutine.trace(model).get_trace(*args, **kwargs)
    return [
        site
        for site in trace.nodes.values()
        if site["type"] == "sample"
        and not site["is_observed"]
        and not site["name"].startswith("_")
        and type(site["fn"]).__name__ != "_Subsample"
    ]


def prepare(case: Case, seed: int = 0):
    """The model to sample and its arguments: params set, continuous latents fixed.

    Continuous latent sites are conditioned on one draw of the model (``seed``), so the draws
    of the discrete sites have an exact law that brute force can compute.
    """
    set_params(case)
    args, kwargs = case.args, dict(case.kwargs)
    if isinstance(args, tuple) and any(isinstance(a, list) for a in args):
        args = tuple(list(a) if isinstance(a, list) else a for a in args)  # models that assign
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        sites = _latent_sites(case.model, _copy_args(args), kwargs)
    fixed = {
        s["name"]: s["value"].detach()
        for s in sites
        if not getattr(s["fn"], "has_enumerate_support", False)
    }
    model = poutine.condition(case.model, data=fixed) if fixed else case.model
    return model, args, kwargs, fixed


def _copy_args(args):
    return tuple(list(a) if isinstance(a, list) else a for a in args)


def discrete_sites(model, args, kwargs):
    """(name, support size, coordinates, one-hot?, shape, dtype) of every discrete latent site."""
    out = []
    with torch.random.fork_rng():
        torch.manual_seed(0)
        sites = _latent_sites(model, _copy_args(args), kwargs)
    for site in sites:
        fn = site["fn"]
        support = fn.enumerate_support(expand=False)
        onehot = fn.event_shape != () and isinstance(
            getattr(fn, "base_dist", fn), dist.OneHotCategorical
        )
        size = support.shape[0]
        value = site["value"]
        numel = value.numel() // (value.shape[-1] if onehot else 1)
        out.append((site["name"], size, numel, onehot, tuple(value.shape), value.dtype))
    return out


def draws_as_states(samples: dict, sites) -> np.ndarray:
    """Draws as int64[N, n]: every site's coordinates in C order (one-hot as an index)."""
    parts = []
    for name, _, numel, onehot, _, _ in sites:
        value = samples[name]
        if onehot:
            value = value.argmax(-1)
        parts.append(value.reshape(value.shape[0], numel).round().long().cpu().numpy())
    return np.concatenate(parts, axis=1)


def exact_law(case: Case, model, args, kwargs):
    """The reference: ``("joint", states, probs)`` or ``("marginals", {site: probs})``."""
    sites = discrete_sites(model, args, kwargs)
    total = math.prod(size**numel for _, size, numel, *_ in sites)
    if case.check == "brute" and total <= MAX_BRUTE_STATES:
        return ("joint", sites, *_brute_force(model, args, kwargs, sites))
    return ("marginals", sites, _pyro_marginals(case, model, args, kwargs, sites))


def _brute_force(model, args, kwargs, sites):
    """Every state's probability: ``log p`` of one plain Pyro trace per state, or of all the
    states in one run under ``torch.func.vmap`` (each state in its own shapes) where that runs
    and agrees with the plain traces on :data:`VMAP_SPOT_CHECKS` states spread over them."""
    coords = [(name, size) for name, size, numel, *_ in sites for _ in range(numel)]
    states = list(itertools.product(*[range(size) for _, size in coords]))
    logs = _log_probs_under_vmap(model, args, kwargs, sites, states)
    if logs is None:
        logs = np.array([_plain_log_prob(model, args, kwargs, sites, state) for state in states])
    logs -= logs.max()
    probs = np.exp(logs)
    return states, probs / probs.sum()


#: States scored by plain traces too, to accept the reference computed under vmap.
VMAP_SPOT_CHECKS = 16


def _state_values(sites, state) -> dict:
    data, pos = {}, 0
    for name, size, numel, onehot, shape, dtype in sites:
        part = torch.tensor(state[pos : pos + numel])
        pos += numel
        if onehot:
            part = torch.nn.functional.one_hot(part, size)
        data[name] = part.to(dtype).reshape(shape)
    return data


def _log_prob(model, args, kwargs, data) -> torch.Tensor:
    conditioned = poutine.condition(model, data=data)
    with poutine.block(hide_types=["param"]):
        trace = poutine.trace(conditioned).get_trace(*_copy_args(args), **kwargs)
    return trace.log_prob_sum()


def _plain_log_prob(model, args, kwargs, sites, state) -> float:
    return float(_log_prob(model, args, kwargs, _state_values(sites, state)).detach())


def _log_probs_under_vmap(model, args, kwargs, sites, states) -> np.ndarray | None:
    if len(states) < 4 * VMAP_SPOT_CHECKS:
        return None  # plain traces are as quick
    table, batch, pos = torch.as_tensor(states), {}, 0
    for name, size, numel, onehot, shape, dtype in sites:
        part = table[:, pos : pos + numel]
        pos += numel
        if onehot:
            part = torch.nn.functional.one_hot(part, size)
        batch[name] = part.to(dtype).reshape((len(states), *shape))
    try:
        with pyro.validation_enabled(False):
            logs = torch.func.vmap(
                lambda one: _log_prob(model, args, kwargs, one), randomness="error"
            )(batch)
        logs = logs.detach().double().numpy()
    except Exception:  # noqa: BLE001 - a model vmap cannot run: plain traces
        return None
    if logs.shape != (len(states),):
        return None
    spots = np.linspace(0, len(states) - 1, VMAP_SPOT_CHECKS).round().astype(int)
    plain = np.array([_plain_log_prob(model, args, kwargs, sites, states[k]) for k in spots])
    if not np.allclose(logs[spots], plain, rtol=1e-5, atol=1e-4):
        return None
    return logs


def _pyro_marginals(case, model, args, kwargs, sites):
    """Pyro's exact ``compute_marginals`` on the first element of each named site."""
    wanted = case.marginal_sites or tuple(name for name, *_ in sites[:3])
    elbo = TraceEnum_ELBO(
        max_plate_nesting=case.max_plate_nesting or _plate_nesting(model, args, kwargs)
    )
    enumerated = config_enumerate(model, default="parallel")
    marginals = elbo.compute_marginals(
        enumerated, lambda *a, **k: None, *_copy_args(args), **kwargs
    )
    out = {}
    for name in wanted:
        d = marginals[name]
        probs = d.probs if hasattr(d, "probs") else d.logits.exp()
        if isinstance(d, dist.Bernoulli):
            probs = torch.stack([1 - probs, probs], -1)
        probs = probs.reshape(-1, probs.shape[-1])[0]
        out[name] = probs.detach().double().numpy()
    return out


def _plate_nesting(model, args, kwargs):
    with torch.random.fork_rng():
        torch.manual_seed(0)
        with poutine.block(hide_types=["param"]):
            trace = poutine.trace(model).get_trace(*_copy_args(args), **kwargs)
    dims = [
        -f.dim
        for site in trace.nodes.values()
        if site["type"] == "sample"
        for f in site["cond_indep_stack"]
        if f.vectorized and f.dim is not None
    ]
    return max(dims, default=0)


def law_pvalues(law, samples: dict) -> list[float]:
    """Chi-square p-values of the draws against the reference law (one per test)."""
    kind, sites = law[0], law[1]
    draws = draws_as_states(samples, sites)
    if kind == "joint":
        states, probs = law[2], law[3]
        index = {s: i for i, s in enumerate(states)}
        counts = np.zeros(len(states))
        for row in draws:
            key = tuple(int(v) for v in row)
            if key not in index:
                return [0.0]  # a value outside the support
            counts[index[key]] += 1
        return [_pvalue(counts, probs)]
    pvalues, offset = [], 0
    starts = {}
    for name, _, numel, *_ in sites:
        starts[name] = offset
        offset += numel
    for name, probs in law[2].items():
        column = draws[:, starts[name]]
        if column.min() < 0 or column.max() >= len(probs):
            return [0.0]
        counts = np.bincount(column, minlength=len(probs))
        pvalues.append(_pvalue(counts, probs))
    return pvalues


def _pvalue(counts, probs) -> float:
    """Chi-square p-value; 0 for a draw of probability zero, 1 for a law with one big bin."""
    try:
        return chisquare_pvalue(counts, probs)
    except AssertionError:  # a state of probability zero was drawn
        return 0.0
    except ValueError:  # (nearly) all the mass on one bin: nothing to test beyond the support
        return 1.0


# ------------------------------------------------------------------------------ running a case


@dataclass
class Outcome:
    """What AutoSpec did with a case: ``status`` and its detail.

    ``status``: ``"exact"`` (ran, and every chi-square p-value is above the threshold),
    ``"inexact"`` (ran, a p-value below it), ``"ran"`` (ran, not checked), ``"refused"`` (an
    ``AutoSpecModelError`` naming a site or plate of the model), ``"unclear"`` (a refusal that
    names nothing of the model or asks to be reported), ``"model-error"`` (the model fails in a
    plain run of Pyro too, and AutoSpec passed that error on), ``"crashed"`` (any other
    exception).
    """

    status: str
    detail: str = ""
    pvalues: list = field(default_factory=list)
    seconds: float = 0.0
    method: str = ""
    message: str = ""


def model_names(model, args, kwargs) -> set[str]:
    """Names of the sample sites and plates of one plain run of the model."""
    names = set()

    class Recorder(poutine.messenger.Messenger):
        def _pyro_post_sample(self, msg):
            names.add(msg["name"])
            names.update(f.name for f in msg["cond_indep_stack"])

    with torch.random.fork_rng():
        torch.manual_seed(0)
        try:
            with poutine.block(hide_types=["param"]), Recorder():
                model(*_copy_args(args), **kwargs)
        except Exception:  # noqa: BLE001 - a model that fails on its own: the sites before
            pass
    return names


def names_the_model(text: str, names) -> bool:
    return any(f"'{name}'" in text for name in names)


def run_case(case: Case, *, sampler="auto", num_samples=2000, seed=0, check=True) -> Outcome:
    """Run AutoSpec on the case and classify what happened."""
    import time
    import warnings

    from pyro_autospec.infer import AutoSpec, AutoSpecModelError

    try:
        model, args, kwargs, _ = prepare(case)
    except Exception as error:  # noqa: BLE001 - the model fails in a plain run of Pyro
        set_params(case)
        model, args, kwargs = case.model, case.args, dict(case.kwargs)
        check = False
        plain_error = f"fails in a plain Pyro run: {type(error).__name__}"
    else:
        plain_error = ""
    law = None
    reference_error = plain_error
    if check and case.check != "none":
        try:
            law = exact_law(case, model, args, kwargs)
        except Exception as error:  # noqa: BLE001 - no reference: the case is only run
            law = None
            reference_error = f"{type(error).__name__}: {str(error).splitlines()[0][:120]}"
        else:
            reference_error = ""
    set_params(case)
    start = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fit = AutoSpec(
                model, num_samples=num_samples, seed=seed, disable_progbar=True, sampler=sampler
            ).run(*_copy_args(args), **kwargs)
            samples = fit.get_samples()
    except AutoSpecModelError as error:
        text = str(error)
        first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
        clear = (
            names_the_model(text, model_names(model, args, kwargs)) and "Please report" not in text
        )
        return Outcome(
            "refused" if clear else "unclear",
            f"{type(error).__name__}: {first}",
            seconds=time.perf_counter() - start,
            message=text,
        )
    except Exception as error:  # noqa: BLE001 - the point: any raw error is reported
        text = str(error).strip()
        first = text.splitlines()[0] if text else ""
        own = plain_error.endswith(type(error).__name__)
        return Outcome(
            "model-error" if own else "crashed",
            f"{type(error).__name__}: {first}",
            seconds=time.perf_counter() - start,
            message=text,
        )
    seconds = time.perf_counter() - start
    method = fit.results[0].method if getattr(fit, "results", None) else ""
    if law is None:
        detail = f"no reference ({reference_error})" if reference_error else ""
        return Outcome("ran", detail, seconds=seconds, method=method)
    from tests.stats import P_THRESHOLD

    pvalues = law_pvalues(law, samples)
    status = "exact" if min(pvalues) > P_THRESHOLD else "inexact"
    detail = f"{law[0]}, min p = {min(pvalues):.3g}"
    return Outcome(status, detail, pvalues, seconds, method)
