"""Rows asked with their chain (``log_marginals_chain_then``) equal rows asked alone."""

from __future__ import annotations

import pytest
import torch

import pyro_autospec.engine.rows as rows_module
from pyro_autospec.engine.rows import OracleRows, ragged
from tests.catalogue.oracle_reference import Wrapper
from tests.catalogue.oracles import random_forest


class WithoutThen(Wrapper):
    """The same oracle without ``log_marginals_chain_then``: the engine asks targeted rows."""

    def log_marginals_at(self, values, mask, targets):
        return self.oracle.log_marginals_at(values, mask, targets)

    def log_marginals_chain(self, values, mask, chain):
        return self.oracle.log_marginals_chain(values, mask, chain)


def requests(n: int, num_draws: int, seed: int):
    """Chains of frames ``0 .. 7`` and rows: the row after some chains (one of them twice),
    rows that end where a chain ends but read elsewhere or belong to another order, and
    unrelated rows."""
    gen = torch.Generator().manual_seed(seed)
    frame = torch.arange(8)
    draw = frame % num_draws
    length = torch.randint(1, 30, (8,), generator=gen)
    cut = torch.randint(0, n - 40, (8,), generator=gen)
    chains = (frame, draw, cut, length)
    end = cut + length
    width = torch.randint(1, 8, (12,), generator=gen)
    row_frame = torch.tensor([0, 1, 2, 3, 0, 4, 5, 9, 10, 6, 7, 7])
    row_draw = row_frame % num_draws
    row_draw[5] = (row_draw[5] + 1) % num_draws  # another order: not the row after chain 4
    row_cut = torch.cat([end[[0, 1, 2, 3, 0, 4, 5]], torch.tensor([5, 17, 0, 3, 9])])
    row_start = row_cut.clone()
    row_start[6] += 2  # reads past the end of chain 5: not the row after it
    rows = (row_frame, row_draw, row_cut, row_start, width)
    return rows, chains


@pytest.mark.parametrize("hard", [False, True])
@pytest.mark.parametrize("call_cost", [rows_module.CALL_COST, 1])
def test_rows_after_chains_match_rows_asked_alone(hard, call_cost, monkeypatch):
    # call_cost 1 cuts the chains into groups of similar lengths
    monkeypatch.setattr(rows_module, "CALL_COST", call_cost)
    n, q, num_draws = 80, 3, 3
    oracle = random_forest(n, seed=11, q=q, hard=hard, forest=True)
    gen = torch.Generator().manual_seed(1)
    orders = torch.stack([torch.randperm(n, generator=gen) for _ in range(num_draws)])
    frames = torch.randint(0, q, (11, n), generator=gen).to(torch.int8)
    rows, chains = requests(n, num_draws, seed=2)
    fused = OracleRows(oracle, orders, torch.device("cpu"), max_elements=1 << 20)
    alone = OracleRows(WithoutThen(oracle), orders, torch.device("cpu"), max_elements=1 << 20)
    assert fused.native_then and not alone.native_then
    got_rows, got_chains = fused.ask(frames, rows, chains)
    want_rows, want_chains = alone.ask(frames, rows, chains)
    for got, want, width in ((got_rows, want_rows, rows[4]), (got_chains, want_chains, chains[3])):
        valid = torch.arange(got.log_probs.shape[1]) < width.unsqueeze(1)
        assert torch.equal(got.bad[valid], want.bad[valid])
        torch.testing.assert_close(got.log_probs[valid], want.log_probs[valid], equal_nan=True)
    # the row after a chain was asked with it: fewer targeted calls
    calls = []
    original = oracle.log_marginals_at
    monkeypatch.setattr(oracle, "log_marginals_at", lambda *a: calls.append(a[2]) or original(*a))
    fused.ask(frames, rows, chains)
    # the rows after chains 0-3 went with them; the second row after chain 0, the row of
    # another order and the one reading past chain 5 were asked alone, like the others
    assert sum(c.shape[0] for c in calls) == 12 - 4


def test_width_groups_partition_requests_and_minimise_padding():
    gen = torch.Generator().manual_seed(0)
    small = torch.randint(1, 16, (200,), generator=gen)  # 200 * 15 <= CALL_COST: one call
    assert [g.tolist() for g in rows_module.width_groups(small)] == [list(range(200))]
    # many narrow requests and a few wide ones: padding the narrow ones to the widest would
    # cost far more than a second call
    width = torch.cat([torch.ones(5000, dtype=torch.long), torch.full((3,), 900)])
    width = width[torch.randperm(width.numel(), generator=gen)]
    groups = rows_module.width_groups(width)
    assert len(groups) == 2
    assert sorted(torch.cat(groups).tolist()) == list(range(width.numel()))
    assert {int(width[g].max()) for g in groups} == {1, 900}


def test_ragged_layout():
    segment, position, start = ragged(torch.tensor([3, 0, 1, 2]))
    assert segment.tolist() == [0, 0, 0, 2, 3, 3]
    assert position.tolist() == [0, 1, 2, 0, 0, 1]
    assert start.tolist() == [0, 3, 3, 4]
    segment, position, start = ragged(torch.zeros(0, dtype=torch.long))
    assert segment.numel() == position.numel() == start.numel() == 0
