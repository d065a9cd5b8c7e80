"""The planned log-space contraction: plans, exactness against Pyro's LogRing, safe gradients."""

import math

import pytest
import torch
from pyro.ops.contract import contract_to_tensor
from pyro.ops.rings import LogRing

from pyro_autospec.model.enum_contract import PlannedLogRing, plan_contraction


def test_plan_on_a_chain_is_linear():
    """Evidence folds into each variable, then the chain is eliminated step by step."""
    inputs = (
        ["Ba"] + [f"{a}{b}" for a, b in zip("abcdefg", "bcdefgh")] + [f"B{v}" for v in "bcdefgh"]
    )
    sizes = {d: 10 for d in "abcdefgh"} | {"B": 64}
    plan = plan_contraction(inputs, "B", sizes)
    largest = max(
        math.prod(sizes[d] for d in set(inputs_or_out(plan, inputs, i))) for i in range(len(plan))
    )
    assert largest <= 64 * 10 * 10  # never more than a [B, K, K] product space
    assert len(plan) == len(inputs) - 1


def inputs_or_out(plan, inputs, k):
    names = list(inputs) + [step[3] for step in plan]
    i, j, elim, out = plan[k]
    return names[i] + (names[j] if j is not None else "")


def _packed(tensor, dims):
    tensor._pyro_dims = dims
    return tensor


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_pyro_logring(seed):
    generator = torch.Generator().manual_seed(seed)

    def term(dims, *shape):
        return _packed(torch.randn(*shape, generator=generator, dtype=torch.float64) * 3, dims)

    terms = [
        term("Bab", 5, 3, 4),
        term("bc", 4, 2),
        term("Bc", 5, 2),
        term("ad", 3, 6),
        term("d", 6),
    ]
    terms[2][0, 1] = -math.inf
    sum_dims = {"a", "b", "c", "d"}

    def run(ring_class):
        tree = {frozenset("B"): [t.clone() for t in terms]}
        for t, s in zip(tree[frozenset("B")], terms):
            t._pyro_dims = s._pyro_dims
        from collections import OrderedDict

        return contract_to_tensor(
            OrderedDict(tree),
            set(sum_dims),
            target_ordinal=frozenset("B"),
            ring=ring_class(dim_to_size={"B": 5}),
        )

    torch.testing.assert_close(run(PlannedLogRing), run(LogRing))


def test_gradients_are_marginals_and_nan_free():
    """d logZ / d log e = marginals, with impossible values giving 0, not NaN."""
    from collections import OrderedDict

    pair = torch.tensor([[0.0, -math.inf], [-1.0, 0.5]], dtype=torch.float64)
    evidence = torch.tensor([[0.0, -math.inf]], dtype=torch.float64).expand(2, 2).clone()
    evidence.requires_grad_(True)
    tree = OrderedDict({frozenset("B"): [_packed(pair.clone(), "ab"), _packed(evidence, "Ba")]})
    logz = contract_to_tensor(
        tree, {"a", "b"}, target_ordinal=frozenset("B"), ring=PlannedLogRing(dim_to_size={"B": 2})
    )
    (grad,) = torch.autograd.grad(logz.sum(), evidence)
    assert not torch.isnan(grad).any()
    torch.testing.assert_close(grad, torch.tensor([[1.0, 0.0], [1.0, 0.0]], dtype=torch.float64))
