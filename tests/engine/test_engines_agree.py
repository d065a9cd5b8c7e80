"""Tier 1: the fast engine against the generator reference, draw for draw.

Both engines read the same keyed random numbers (:mod:`pyro_autospec.engine.keys`), so for the
same seed they must return the same samples and log probabilities on every oracle family,
method and schedule; without a rows-per-round cap they also take the same rounds and rows.
Schedule knobs that only move work between rounds (``rho``, the cap, continuous batching,
memory chunks) must not change a single draw. The block rule (residual races) has one engine,
the reference; its draws are pinned by ``tests/test_draws_unchanged.py``, recorded when a fast
twin still agreed with it draw for draw.
"""

from __future__ import annotations

import pytest
import torch

from pyro_autospec.engine import Schedule, sample_any_order
from pyro_autospec.engine.diffusion import sample_diffusion, sample_sde
from pyro_autospec.oracles import (
    CurieWeissOracle,
    DPPOracle,
    HMMOracle,
    MarkovChainOracle,
    SpanningTreeOracle,
    TabularOracle,
    TreePottsOracle,
)
from pyro_autospec.oracles.denoisers import FiniteSupportDenoiser
from tests.catalogue.targets import TARGETS
from tests.catalogue.user_oracles import NoAdjacentZeros, RandomNADE


def _oracles() -> dict:
    g = torch.Generator().manual_seed(0)
    n = 24
    T = torch.tensor([[0.8, 0.1, 0.1], [0.1, 0.8, 0.1], [0.1, 0.1, 0.8]])
    parents = [int(torch.randint(0, i, (), generator=g)) for i in range(1, n)]
    edges = torch.tensor([[p, i + 1] for i, p in enumerate(parents)])
    grid = [(r * 3 + c, r * 3 + c + 1) for r in range(3) for c in range(2)]
    grid += [(r * 3 + c, (r + 1) * 3 + c) for r in range(2) for c in range(3)]
    pts = torch.rand(n, 2, generator=g, dtype=torch.float64)
    return {
        "tabular": TabularOracle(logits=TARGETS["pairs_equal"]()),
        "markov": MarkovChainOracle([0.5, 0.5], [[0.9, 0.1], [0.2, 0.8]], n),
        "hmm": HMMOracle(torch.full((3,), 1 / 3), T, torch.randn(n, 3, generator=g)),
        "tree_potts": TreePottsOracle(
            edges,
            torch.full((n - 1,), 0.7, dtype=torch.float64),
            0.2 * torch.randn(n, 2, generator=g, dtype=torch.float64),
            num_values=2,
        ),
        "dpp": DPPOracle(L=3.0 * torch.exp(-(torch.cdist(pts, pts) ** 2) * n / 2)),
        "spanning_tree": SpanningTreeOracle(9, torch.tensor(grid)),
        "curie_weiss": CurieWeissOracle(n, beta=1.2, h=0.1),
        # an imperfect network with hard zeros: stale rows after impossible drafted tokens
        "constrained_network": NoAdjacentZeros(
            RandomNADE(n, 3, hidden=8, scale=2.0, seed=4, chains=False)
        ),
    }


ORACLES = _oracles()
SCHEDULES = {
    "default": {},
    "tiny_rho": {"rho": 1e-9, "max_block": 16},
    "cap": {"max_rows_per_round": 7},
    "batching": {"max_concurrent_draws": 3},
    "chunks": {"max_elements": 500},
}


def _same(a, b, counts: bool, atol: float = 1e-10) -> None:
    assert torch.equal(a.samples, b.samples)
    assert torch.equal(a.orders, b.orders)
    torch.testing.assert_close(a.log_prob, b.log_prob, rtol=0, atol=atol)
    if counts:
        assert a.rounds == b.rounds and a.oracle_rows == b.oracle_rows
        assert torch.equal(a.sample_rounds, b.sample_rounds)


@pytest.mark.parametrize("name", sorted(ORACLES))
@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
def test_autospec_engines_agree(name, schedule):
    oracle, knobs = ORACLES[name], SCHEDULES[schedule]
    fast = sample_any_order(oracle, 12, seed=3, schedule=knobs)
    slow = sample_any_order(oracle, 12, seed=3, engine="reference", schedule=knobs)
    # a float32 network's rows round with the batch they are computed in (caps change it)
    atol = 1e-5 if name == "constrained_network" else 1e-10
    _same(fast, slow, counts="max_rows_per_round" not in knobs, atol=atol)


@pytest.mark.parametrize("method", ["sequential", "gumbel_sequential", "speculative", "agr24"])
@pytest.mark.parametrize("name", ["tabular", "markov", "tree_potts", "dpp"])
def test_baseline_engines_agree(method, name):
    oracle = ORACLES[name]
    for knobs in ({}, {"max_concurrent_draws": 4, "max_rows_per_round": 9}):
        fast = sample_any_order(oracle, 10, seed=5, method=method, schedule=knobs)
        slow = sample_any_order(
            oracle, 10, seed=5, method=method, engine="reference", schedule=knobs
        )
        _same(fast, slow, counts=not knobs)


@pytest.mark.parametrize("name", ["tabular", "hmm", "spanning_tree"])
@pytest.mark.parametrize("rule", [{}, {"token_below": 0}])
def test_schedule_knobs_do_not_change_draws(name, rule):
    oracle = ORACLES[name]
    base = sample_any_order(oracle, 30, seed=8, schedule=rule)
    for knobs in (
        {"rho": 0.2},
        {"rho": 9.0},
        {"max_rows_per_round": 5},
        {"max_concurrent_draws": 4},
        {"max_elements": 300},
    ):
        other = sample_any_order(oracle, 30, seed=8, schedule={**rule, **knobs})
        _same(base, other, counts=False)


def test_any_subset_of_draws_reproduces_those_draws():
    from pyro_autospec.engine import keys
    from pyro_autospec.engine.any_order import AnyOrderRun, run_any_order
    from pyro_autospec.engine.methods import DISCRETE, default_schedule, resolve_knobs

    oracle = ORACLES["hmm"]
    whole = sample_any_order(oracle, 20, seed=4)
    knobs = resolve_knobs("autospec", DISCRETE, default_schedule(oracle.num_coords), {})
    run = AnyOrderRun(oracle, "autospec", knobs)
    part = run_any_order(run, torch.tensor([17, 3, 11]), keys.seed_key(4), torch.device("cpu"))
    assert torch.equal(part.samples, whole.samples[[17, 3, 11]])


@pytest.mark.parametrize("knobs", [{"token_below": 0}, {"token_below": 6, "max_block": 12}])
def test_the_block_rule_runs_on_the_reference_engine_and_says_so(knobs):
    oracle = ORACLES["markov"]
    fast = sample_any_order(oracle, 6, seed=3, schedule=knobs)
    slow = sample_any_order(oracle, 6, seed=3, engine="reference", schedule=knobs)
    assert fast.engine == slow.engine == "reference"
    _same(fast, slow, counts=True)
    assert sample_any_order(oracle, 6, seed=3).engine == "fast"
    times = torch.linspace(0.0, 1.0, 9)
    block = sample_sde(
        lambda t, x: -x, times, torch.zeros(2), 3, seed=1, schedule=Schedule(rule="block")
    )
    assert block.engine == "reference"
    assert sample_sde(lambda t, x: -x, times, torch.zeros(2), 3, seed=1).engine == "fast"


def test_max_block_one_is_the_sequential_sampler():
    """One-coordinate leaves read the keys of the sequential sampler: the same draws."""
    oracle = ORACLES["markov"]
    a = sample_any_order(oracle, 10, seed=2, schedule=Schedule(max_block=1))
    b = sample_any_order(oracle, 10, seed=2, method="sequential")
    assert torch.equal(a.samples, b.samples)


@pytest.mark.parametrize("method", ["autospec", "sequential", "picard"])
def test_diffusion_engines_agree(method):
    oracle = FiniteSupportDenoiser(torch.tensor([[1.0, 0.0], [-1.0, 0.5], [0.3, -0.3]]))
    cases = [{}, {"max_concurrent_draws": 3, "return_paths": True}]
    if method == "autospec":
        cases += [
            {"max_block": 8, "max_rows_per_round": 30},
            {"min_block": 1, "max_block": 5, "return_paths": True},
        ]
    for knobs in cases:
        paths = {"return_paths": knobs.get("return_paths", False)}
        knobs = {k: v for k, v in knobs.items() if k != "return_paths"}
        fast = sample_diffusion(
            oracle, 9, num_steps=48, seed=6, method=method, schedule=knobs, **paths
        )
        slow = sample_diffusion(
            oracle,
            9,
            num_steps=48,
            seed=6,
            method=method,
            engine="reference",
            schedule=knobs,
            **paths,
        )
        if method == "picard":
            torch.testing.assert_close(fast.samples, slow.samples, rtol=0, atol=1e-12)
            torch.testing.assert_close(fast.log_prob, slow.log_prob, rtol=0, atol=1e-9)
        else:  # the same bits, log densities included, as the docs promise
            assert torch.equal(fast.samples, slow.samples)
            assert torch.equal(fast.log_prob, slow.log_prob)
        if fast.paths is not None:
            torch.testing.assert_close(fast.paths, slow.paths, rtol=0, atol=1e-10)
        if "max_rows_per_round" not in knobs:
            assert fast.rounds == slow.rounds and fast.oracle_rows == slow.oracle_rows


@pytest.mark.parametrize("method", ["autospec", "sequential"])
def test_sde_engines_give_the_same_log_densities(method):
    """The reference's sequential chain summed its log density in torch (1e-12 apart), and
    on an uneven grid its steps' noise scales too (samples 4e-16 apart)."""
    steps = torch.rand(80, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    uneven = torch.cat([torch.zeros(1, dtype=torch.float64), (0.001 + 0.05 * steps).cumsum(0)])
    x0 = torch.linspace(-1.0, 1.0, 3, dtype=torch.float64)

    def drift(t, x):
        return -(x**3) + torch.sin(3 * x) + torch.cos(7 * t)[:, None]

    for times in (torch.linspace(0.0, 1.0, 101), uneven):
        fast = sample_sde(drift, times, x0, 12, seed=5, method=method, return_paths=True)
        slow = sample_sde(
            drift, times, x0, 12, seed=5, method=method, engine="reference", return_paths=True
        )
        for a, b in ((fast.samples, slow.samples), (fast.log_prob, slow.log_prob)):
            assert torch.equal(a, b)
        assert torch.equal(fast.paths, slow.paths)


def test_sde_engines_agree_and_knobs_do_not_change_draws():
    times = torch.linspace(0.0, 1.0, 41)
    x0 = torch.tensor([0.5, -0.2])
    base = sample_sde(lambda t, x: -torch.sin(x), times, x0, 8, scale=0.7, seed=1)
    slow = sample_sde(
        lambda t, x: -torch.sin(x), times, x0, 8, scale=0.7, seed=1, engine="reference"
    )
    torch.testing.assert_close(base.samples, slow.samples, rtol=0, atol=1e-12)
    for knobs in (
        {"max_concurrent_draws": 2},
        {"max_rows_per_call": 5},
        {"max_rows_per_round": 7},
    ):
        other = sample_sde(
            lambda t, x: -torch.sin(x), times, x0, 8, scale=0.7, seed=1, schedule=knobs
        )
        torch.testing.assert_close(base.samples, other.samples, rtol=0, atol=1e-12)
    block = sample_sde(
        lambda t, x: -torch.sin(x), times, x0, 8, scale=0.7, seed=1, schedule=Schedule(rule="block")
    )
    for knobs in ({"rho": 4.0}, {"max_concurrent_draws": 2}):
        other = sample_sde(
            lambda t, x: -torch.sin(x),
            times,
            x0,
            8,
            scale=0.7,
            seed=1,
            schedule={**knobs, "rule": "block"},
        )
        torch.testing.assert_close(block.samples, other.samples, rtol=0, atol=1e-12)
