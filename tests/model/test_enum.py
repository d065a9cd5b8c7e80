"""EnumOracle against brute-force enumeration (Tier 0: exact laws, no sampling)."""

import math

import pyro
import pyro.distributions as dist
import pytest
import torch

from pyro_autospec.engine.protocols import MarginalOracle
from pyro_autospec.model import DynamicStructureError, enumerate_posterior
from pyro_autospec.model.enum import EnumOracle
from pyro_autospec.model.enum_contract import StepTooLarge
from tests.catalogue.models import hmm_model, onehot_model, unit_plate_model


def mixed_model(y):
    a = pyro.sample("a", dist.Bernoulli(0.3))
    c = pyro.sample("c", dist.Binomial(3, 0.4))
    with pyro.plate("p", 2):
        b = pyro.sample("b", dist.Categorical(torch.tensor([0.2, 0.3, 0.5])))
        pyro.sample("y", dist.Normal(a + b + 0.5 * c, 1.0), obs=y)


CASES = [
    (mixed_model, (torch.tensor([1.0, 2.5]),)),
    (hmm_model, (torch.tensor([-0.5, 0.3, 2.2, 1.0]),)),
    (onehot_model, (torch.tensor([1.2, -0.4]),)),
    (unit_plate_model, (torch.tensor([2.5]),)),
]


def brute_conditionals(states, log_prob, sizes, values, mask):
    """log mu(X_i = v | X_S = values_S) by summing the joint table."""
    p = log_prob.exp()
    batch, n = values.shape
    out = torch.full((batch, n, int(sizes.max())), -math.inf, dtype=torch.float64)
    for b in range(batch):
        keep = ((states == values[b]) | ~mask[b]).all(1)
        pb = p * keep
        pb = pb / pb.sum()
        for i in range(n):
            for v in range(int(sizes[i])):
                out[b, i, v] = pb[states[:, i] == v].sum().log()
    return out


def random_queries(states, log_prob, batch, generator):
    """Queries conditioned on possible assignments (drawn from the posterior)."""
    idx = torch.multinomial(log_prob.exp(), batch, replacement=True, generator=generator)
    mask = torch.rand(batch, states.shape[1], generator=generator) < 0.5
    mask[0] = False  # one unconditioned row
    return states[idx], mask


@pytest.mark.parametrize("model,args", CASES, ids=["mixed", "hmm", "onehot", "unit_plate"])
def test_matches_brute_force(model, args):
    oracle = EnumOracle(model, args)
    assert isinstance(oracle, MarginalOracle)
    states, log_prob = enumerate_posterior(model, args, layout=oracle.layout)
    sizes = oracle.layout.support_sizes
    values, mask = random_queries(states, log_prob, 12, torch.Generator().manual_seed(0))
    out = oracle.log_marginals(values, mask)
    assert out.shape == (12, oracle.num_coords, oracle.num_values)
    assert out.dtype == torch.float64
    assert oracle.num_calls == 1  # one contraction for the whole batch
    expected = brute_conditionals(states, log_prob, sizes, values, mask)
    outside = torch.isinf(expected)
    assert torch.isinf(out[outside]).all() and (out[outside] < 0).all()
    torch.testing.assert_close(out[~outside].exp(), expected[~outside].exp(), atol=2e-6, rtol=0)


def test_targets_chunks_and_padding():
    model, args = CASES[0]
    oracle = EnumOracle(model, args, batch_size=3)
    states, log_prob = enumerate_posterior(model, args, layout=oracle.layout)
    values, mask = random_queries(states, log_prob, 7, torch.Generator().manual_seed(1))
    mask[1:] = True  # 7 distinct conditionings
    values[1:] = states[torch.randperm(len(states), generator=torch.Generator().manual_seed(2))[:6]]
    full = oracle.log_marginals(values, mask)
    assert oracle.num_calls == 3  # chunks of 3, 3 and 1 (padded to 2: Pyro issue 3102)
    repeated = oracle.log_marginals(values[[1, 1, 2, 1]], mask[[1, 1, 2, 1]])
    assert oracle.num_calls == 4  # identical conditionings are computed once
    torch.testing.assert_close(repeated, full[[1, 1, 2, 1]])
    single = oracle.log_marginals(values[:1], mask[:1])
    torch.testing.assert_close(single, full[:1])
    # values at unpinned positions are ignored
    torch.testing.assert_close(oracle.log_marginals(values[:1] * 0, mask[:1]), full[:1])
    targets = torch.tensor([[3, 0, 3]] * 7)
    at = oracle.log_marginals_at(values, mask, targets)
    assert at.shape == (7, 3, oracle.num_values)
    torch.testing.assert_close(at, full[:, [3, 0, 3]])
    assert oracle.log_marginals(values[:0], mask[:0]).shape == (0, 4, 4)


def test_bad_query_shape():
    model, args = CASES[0]
    oracle = EnumOracle(model, args)
    with pytest.raises(ValueError, match=r"\[B, 4\]"):
        oracle.log_marginals(
            torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 3, dtype=torch.bool)
        )
    with pytest.raises(ValueError, match="batch_size"):
        EnumOracle(model, args, batch_size=1)


def test_value_dependent_control_flow_is_reported():
    def model():
        z = pyro.sample("z", dist.Bernoulli(0.5))
        w = pyro.sample("w", dist.Bernoulli(0.5))
        loc = z if w.item() == 1 else -z  # Python control flow on a sampled value
        pyro.sample("x", dist.Normal(loc, 1.0), obs=torch.tensor(0.0))

    # discovery passes (the set of sites is fixed); compiling under enumeration does not
    with pytest.raises(DynamicStructureError, match="after site 'w'.*Python control flow"):
        EnumOracle(model)


# ------------------------------------------------------------- the compiled oracle's extras
def test_model_runs_once_not_per_round():
    calls = {"n": 0}

    def counted(y):
        calls["n"] += 1
        return mixed_model(y)

    oracle = EnumOracle(counted, (torch.tensor([1.0, 2.5]),))
    after_compile = calls["n"]
    values = torch.zeros(5, oracle.num_coords, dtype=torch.long)
    mask = torch.rand(5, oracle.num_coords, generator=torch.Generator().manual_seed(0)) < 0.5
    for _ in range(3):
        oracle.log_marginals(values, mask)
    assert calls["n"] == after_compile and oracle.num_calls == 3


@pytest.mark.parametrize("case", [0, 3], ids=["mixed", "unit_plate"])
def test_log_normalizer_is_the_evidence(case):
    model, args = CASES[case]
    oracle = EnumOracle(model, args)
    layout = oracle.layout
    from pyro_autospec.model import log_joint

    grids = torch.meshgrid(*[torch.arange(int(k)) for k in layout.support_sizes], indexing="ij")
    states = torch.stack([g.reshape(-1) for g in grids], -1)
    lp = log_joint(model, args, {}, layout, layout.from_coords(states))
    torch.testing.assert_close(oracle.log_normalizer(), lp.logsumexp(0), atol=1e-5, rtol=0)


def test_chain_queries_equal_rows():
    model, args = CASES[1]
    oracle = EnumOracle(model, args)
    states, log_prob = enumerate_posterior(model, args, layout=oracle.layout)
    generator = torch.Generator().manual_seed(3)
    values, mask = random_queries(states, log_prob, 4, generator)
    mask[:, 0] = False  # every chain starts at a free coordinate
    free = [torch.nonzero(~m).flatten() for m in mask]
    chain = torch.stack([torch.cat([f, f[-1:].repeat(4)])[:3] for f in free])
    out = oracle.log_marginals_chain(values, mask, chain)
    assert out.shape == (4, 3, oracle.num_values)
    for c in range(4):
        pinned = mask[c].clone()
        for j in range(3):
            row = oracle.log_marginals(values[c : c + 1], pinned[None])[0, chain[c, j]]
            torch.testing.assert_close(out[c, j], row)
            pinned[chain[c, j]] = True


def test_family_of_targets_matches_one_oracle_per_draw():
    def model(y):
        loc = pyro.sample("loc", dist.Normal(0.0, 2.0))
        with pyro.plate("d", 3):
            z = pyro.sample("z", dist.Bernoulli(0.5))
            pyro.sample("y", dist.Normal(loc * (2 * z - 1), 1.0), obs=y)

    y = torch.tensor([1.5, -0.3, 0.8])
    locs = torch.tensor([-1.0, 0.5, 2.0])
    family = EnumOracle(model, (y,), continuous_values={"loc": locs})
    assert family.num_draws == 3
    values = torch.tensor([[1, 0, 0]] * 6)
    mask = torch.tensor([[True, False, False]] * 3 + [[False, False, False]] * 3)
    draws = torch.tensor([0, 1, 2, 2, 1, 0])
    out = family.log_marginals(values, mask, draws=draws)
    normalizers = family.log_normalizer()
    for b in range(6):
        conditioned = pyro.poutine.condition(model, data={"loc": locs[draws[b]]})
        single = EnumOracle(conditioned, (y,))
        torch.testing.assert_close(
            out[b], single.log_marginals(values[b : b + 1], mask[b : b + 1])[0]
        )
        torch.testing.assert_close(
            normalizers[draws[b]], single.log_normalizer(), atol=1e-4, rtol=0
        )
    with pytest.raises(ValueError, match="pass draws="):
        family.log_marginals(values, mask)


def test_strong_evidence_stays_exact():
    """Log ratios far beyond float64's exp range: the shifted product would underflow, so the
    contraction falls back to an exact logsumexp (checked against brute force)."""

    def model(y):
        a = pyro.sample("a", dist.Categorical(torch.ones(3) / 3))
        b = pyro.sample("b", dist.Categorical(torch.ones(3) / 3))
        pyro.sample("ya", dist.Normal(a.float(), 0.02), obs=y[0])
        pyro.sample("yb", dist.Normal(b.float(), 0.02), obs=y[1])
        pyro.factor("ab", -400.0 * (a - b).abs().float())

    args = (torch.tensor([0.0, 2.0]),)
    oracle = EnumOracle(model, args)
    states, log_prob = enumerate_posterior(model, args, layout=oracle.layout)
    values, mask = states[[0, 0]], torch.tensor([[False, False], [True, False]])
    out = oracle.log_marginals(values, mask)
    expected = brute_conditionals(states, log_prob, oracle.layout.support_sizes, values, mask)
    finite = torch.isfinite(expected)
    assert torch.isfinite(out[finite]).all()
    torch.testing.assert_close(out[finite], expected[finite], atol=1e-6, rtol=1e-9)


def test_masked_and_scaled_factors_are_the_model_density():
    """The oracle's target is exp(trace.log_prob_sum()): masks applied, scales multiplied."""

    def model(y):
        with pyro.plate("p", 2), pyro.poutine.mask(mask=torch.tensor([True, False])):
            z = pyro.sample("z", dist.Bernoulli(0.9))
            with pyro.poutine.scale(scale=2.5):
                pyro.sample("y", dist.Normal(z, 1.0), obs=y)

    args = (torch.tensor([0.4, -0.3]),)
    oracle = EnumOracle(model, args)
    states, log_prob = enumerate_posterior(model, args, layout=oracle.layout)
    values = torch.zeros(2, 2, dtype=torch.long)
    mask = torch.tensor([[False, False], [True, False]])
    out = oracle.log_marginals(values, mask)
    expected = brute_conditionals(states, log_prob, oracle.layout.support_sizes, values, mask)
    torch.testing.assert_close(out.exp(), expected.exp(), atol=1e-6, rtol=0)


def _wide(num_values=300):
    """Two coupled sites with 300 values each: a step of 300 * 300 entries per row."""

    def model():
        a = pyro.sample("a", dist.Categorical(logits=torch.zeros(num_values)))
        b = pyro.sample("b", dist.Categorical(logits=torch.zeros(num_values)))
        pyro.factor("coupling", -(((a - b).double() / 50.0) ** 2))

    return model


@pytest.mark.parametrize("name", ["hmm", "onehot", "wide"])
def test_a_contraction_measured_by_running_it_is_measured_as_on_meta_tensors(name):
    """Small contractions are measured by running two rows of zeros (meta tensors load
    torch._dynamo, over a second in a fresh process); larger ones fall back to meta. Both
    give the same entries, so the oracle's call sizes do not depend on the path."""
    model, args = {
        "hmm": (hmm_model, (torch.tensor([0.0, 1.0, 0.5]),)),
        "onehot": (onehot_model, (torch.tensor([0.5, -0.2]),)),
        "wide": (_wide(), ()),
    }[name]
    oracle = EnumOracle(model, args, lazy=True)
    on_meta = oracle._measured(2, on_meta=True)
    if name == "wide":
        with pytest.raises(StepTooLarge):
            oracle._measured(2, on_meta=False)
    else:
        assert oracle._measured(2, on_meta=False) == on_meta
    assert oracle._measure() == max(1, int(sum(on_meta)))


def test_a_model_whose_pyro_asserts_fail_on_a_batch_is_traced_per_draw():
    """The HMM of Pyro's enumeration tutorial indexes ``transition[x]`` without ``Vindex``:
    on a batch of continuous draws the index lands on the draws dim and an assert inside
    Pyro's ``Categorical.log_prob`` fails; one draw at a time it is exact."""

    def model(data):
        with pyro.plate("hidden_state", 2):
            transition = pyro.sample("transition", dist.Dirichlet(0.5 * torch.ones(2)))
            emission = pyro.sample("emission", dist.Dirichlet(0.5 * torch.ones(3)))
        x = 0
        for t, y in pyro.markov(enumerate(data)):
            x = pyro.sample(f"x_{t}", dist.Categorical(transition[x]))
            pyro.sample(f"y_{t}", dist.Categorical(emission[x]), obs=y)

    data = torch.tensor([2, 0, 1])
    transitions = torch.tensor([[[0.9, 0.1], [0.2, 0.8]], [[0.5, 0.5], [0.3, 0.7]]])
    emissions = torch.tensor([[[0.7, 0.2, 0.1], [0.1, 0.3, 0.6]]] * 2)
    with pytest.warns(UserWarning, match="traced it once per draw"):
        family = EnumOracle(
            model, (data,), continuous_values={"transition": transitions, "emission": emissions}
        )
        normalizers = family.log_normalizer()
    for m in range(2):
        values = {"transition": transitions[m], "emission": emissions[m]}
        single = EnumOracle(pyro.poutine.condition(model, data=values), (data,))
        torch.testing.assert_close(normalizers[m], single.log_normalizer(), atol=1e-5, rtol=0)
