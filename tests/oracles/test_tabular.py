import math

import pytest
import torch

from pyro_autospec.engine.protocols import has_targeted_marginals
from pyro_autospec.oracles import MarginalOracle
from pyro_autospec.oracles.tabular import TabularOracle
from tests.catalogue.oracle_reference import (
    assert_chain_matches_rows,
    naive_conditionals,
    random_chains,
    random_queries,
)


@pytest.mark.parametrize("n,q", [(1, 3), (3, 2), (4, 3), (5, 2)])
def test_matches_naive_enumeration(n, q):
    gen = torch.Generator().manual_seed(n * 10 + q)
    log_table = torch.randn([q] * n, generator=gen, dtype=torch.float64) * 2
    log_table.view(-1)[::5] = float("-inf")  # some impossible states
    oracle = TabularOracle(logits=log_table)
    values, mask, targets = random_queries(n, q, 40, seed=n + q)
    out = oracle.log_marginals(values, mask)
    out_at = oracle.log_marginals_at(values, mask, targets)
    assert out.shape == (40, n, q) and out.dtype == torch.float64
    assert out_at.shape == (40, 3, q)
    for b in range(40):
        expected = naive_conditionals(log_table, values[b], mask[b])
        if torch.isnan(expected).any():
            continue  # impossible pins
        torch.testing.assert_close(out[b].exp(), expected, atol=1e-12, rtol=0)
        torch.testing.assert_close(out_at[b].exp(), expected[targets[b]], atol=1e-12, rtol=0)
        assert torch.equal(out[b] == -math.inf, expected == 0)


def test_probabilities_and_logs_agree():
    gen = torch.Generator().manual_seed(0)
    probs = torch.rand([3] * 3, generator=gen, dtype=torch.float64)
    a = TabularOracle(probs=probs)
    b = TabularOracle(logits=probs.log())
    c = TabularOracle(probs=probs / probs.sum())
    values, mask, targets = random_queries(3, 3, 20, seed=1)
    torch.testing.assert_close(a.log_marginals(values, mask), b.log_marginals(values, mask))
    torch.testing.assert_close(a.log_marginals(values, mask), c.log_marginals(values, mask))
    torch.testing.assert_close(a.log_probs.exp().sum(), torch.tensor(1.0, dtype=torch.float64))


def test_pinned_coordinates_are_point_masses_and_batch_of_one():
    oracle = TabularOracle(probs=torch.tensor([[0.4, 0.1], [0.2, 0.3]]))
    values = torch.tensor([[1, 7]])  # junk at the unpinned coordinate
    mask = torch.tensor([[True, False]])
    out = oracle.log_marginals(values, mask)
    assert out.shape == (1, 2, 2)
    torch.testing.assert_close(out[0].exp(), torch.tensor([[0.0, 1.0], [0.4, 0.6]]).double())
    at = oracle.log_marginals_at(values, mask, torch.tensor([[1, 1, 0]]))
    torch.testing.assert_close(at[0, :2], out[0, [1, 1]])


def test_impossible_pins_give_nan_not_error():
    oracle = TabularOracle(probs=torch.tensor([[0.5, 0.0], [0.0, 0.5]]))
    out = oracle.log_marginals(torch.tensor([[0, 1]]), torch.tensor([[True, True]]))
    assert torch.isnan(out).all()


def test_protocol_and_large_batches_are_chunked():
    oracle = TabularOracle(probs=torch.rand([2] * 12, dtype=torch.float64))
    assert isinstance(oracle, MarginalOracle) and has_targeted_marginals(oracle)
    assert oracle.num_coords == 12 and oracle.num_values == 2
    values, mask, targets = random_queries(12, 2, 1500, seed=3)
    out = oracle.log_marginals_at(values, mask, targets)
    full = oracle.log_marginals(values, mask)
    torch.testing.assert_close(out, full.gather(1, targets[..., None].expand(-1, -1, 2)))
    ok = ~torch.isnan(full).any(-1).any(-1)
    torch.testing.assert_close(full[ok].exp().sum(-1), torch.ones(int(ok.sum()), 12).double())


def test_to_device_copy():
    oracle = TabularOracle(probs=torch.rand(2, 2))
    moved = oracle.to("cpu")
    assert moved is not oracle and moved.log_probs.device.type == "cpu"


@pytest.mark.parametrize(
    "table,message",
    [
        (torch.rand(2, 3), "shape \\[q\\] \\* n"),
        (torch.zeros(2, 2), "zero total mass"),
        (torch.tensor(0.5), "one dimension per coordinate"),
        (torch.tensor([[0.5, float("nan")], [0.1, 0.1]]), "NaN"),
        ("abc", "probs must be a tensor"),
    ],
)
def test_constructor_errors(table, message):
    with pytest.raises(ValueError, match=message):
        TabularOracle(probs=table)


def test_negative_probabilities_rejected():
    with pytest.raises(ValueError, match="logits="):
        TabularOracle(probs=torch.tensor([0.5, -0.1]))


def test_log_potentials_that_are_all_nonnegative_are_read_as_logits():
    """The issue's table: exp(2) on the diagonal, not a probability table [.5, 0, 0, .5]."""
    from pyro_autospec.engine import sample_any_order
    from tests.stats import assert_samples_match

    logits = torch.tensor([[2.0, 0.0], [0.0, 2.0]])
    oracle = TabularOracle(logits=logits)
    expected = torch.softmax(logits.flatten().double(), 0)
    torch.testing.assert_close(oracle.log_probs.exp().flatten(), expected)
    assert abs(float(expected[0]) - 0.44) < 0.005 and abs(float(expected[1]) - 0.06) < 0.005
    samples = sample_any_order(oracle, 4000, seed=0).samples
    assert_samples_match(samples, expected.log().reshape(2, 2), q=2)


@pytest.mark.parametrize("call", ["positional", "positional_log", "log_keyword", "both", "none"])
def test_the_reading_of_a_table_is_never_guessed(call):
    table = torch.tensor([[2.0, 0.0], [0.0, 2.0]])
    make = {
        "positional": lambda: TabularOracle(table),
        "positional_log": lambda: TabularOracle(table, log=True),
        "log_keyword": lambda: TabularOracle(table=table, log=False),
        "both": lambda: TabularOracle(logits=table, probs=table),
        "none": lambda: TabularOracle(),
    }[call]
    match = "exactly one of logits= .* and probs=" if call in ("both", "none") else "logits="
    with pytest.raises(TypeError, match=match):
        make()


def test_query_shape_errors():
    oracle = TabularOracle(probs=torch.rand(2, 2))
    with pytest.raises(ValueError, match="values must have shape"):
        oracle.log_marginals(
            torch.zeros(3, 3, dtype=torch.long), torch.zeros(3, 3, dtype=torch.bool)
        )
    with pytest.raises(ValueError, match="targets"):
        oracle.log_marginals_at(
            torch.zeros(1, 2, dtype=torch.long),
            torch.zeros(1, 2, dtype=torch.bool),
            torch.tensor([[2]]),
        )


def test_every_structured_oracle_moves_to_a_device():
    from pyro_autospec.oracles import (
        CurieWeissOracle,
        DPPOracle,
        HMMOracle,
        MarkovChainOracle,
        SpanningTreeOracle,
        TreePottsOracle,
    )

    oracles = [
        TabularOracle(probs=torch.rand(2, 2, 2)),
        MarkovChainOracle([0.5, 0.5], [[0.9, 0.1], [0.1, 0.9]], 3),
        HMMOracle([0.5, 0.5], [[0.9, 0.1], [0.1, 0.9]], torch.zeros(3, 2)),
        TreePottsOracle([(0, 1), (1, 2)], 1.0, torch.zeros(3, 2), 2),
        DPPOracle(L=torch.eye(3)),
        SpanningTreeOracle(3, [(0, 1), (1, 2), (0, 2)]),
        CurieWeissOracle(3, 1.0),
    ]
    values = torch.tensor([[1, 0, 0]])
    mask = torch.tensor([[True, False, False]])
    for oracle in oracles:
        moved = oracle.to("cpu")
        assert moved is not oracle and moved.device.type == "cpu"
        assert isinstance(moved, MarginalOracle) and has_targeted_marginals(moved)
        assert repr(moved).startswith(type(oracle).__name__)
        out = moved.log_marginals(values, mask)
        assert out.shape == (1, 3, moved.num_values) and out.dtype == torch.float64
        torch.testing.assert_close(out, oracle.log_marginals(values, mask))


def test_chain_queries_by_rows(monkeypatch):
    # the generic chain queries of ExactOracle: rows only where the coordinate is not pinned yet
    gen = torch.Generator().manual_seed(2)
    log_table = torch.randn([3] * 5, generator=gen, dtype=torch.float64)
    log_table.view(-1)[::4] = float("-inf")  # impossible prefixes
    oracle = TabularOracle(logits=log_table)
    values, mask, chain = random_chains(5, 3, 80, 7, seed=3)  # chains longer than n: padding
    assert assert_chain_matches_rows(oracle, values, mask, chain) > 80
    asked = []
    original = TabularOracle._log_marginals_at

    def spy(self, values, mask, targets):
        asked.append(values.shape[0])
        return original(self, values, mask, targets)

    monkeypatch.setattr(TabularOracle, "_log_marginals_at", spy)
    oracle.log_marginals_chain(values, mask, chain)
    repeated = torch.zeros_like(chain, dtype=torch.bool)
    for j in range(1, chain.shape[1]):
        repeated[:, j] = (chain[:, :j] == chain[:, j : j + 1]).any(1)
    live = ~(mask.gather(1, chain) | repeated)
    assert sum(asked) == int(live.sum())  # padding rows cost no row
