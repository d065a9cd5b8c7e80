"""The adaptive schedule (:mod:`pyro_autospec.engine.schedule`): exact on oracles that are not
one joint distribution, reproducible for a seed and schedule, and cheap where drafts fail.

An imperfect network's conditionals are not the marginals of one joint; every exact sampler in
a fixed order then draws from the network's own chain rule in that order, which the tests
compute by enumeration (tier 2: chi-square, p > 2e-5, >= 30 expected counts per bin).
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import math
import warnings

import pytest
import torch

from pyro_autospec import sample_sde
from pyro_autospec.engine import sample_any_order
from pyro_autospec.engine.methods import (
    DEFAULT,
    DIFFUSION,
    DISCRETE,
    LEAN_DRAWS,
    LEAN_ROWS_DRAWS,
    SEQUENTIAL_DRAWS,
    Schedule,
    default_max_block,
    default_max_elements,
    knob_names,
)
from pyro_autospec.engine.schedule import BlockPolicy
from pyro_autospec.oracles import MarkovChainOracle
from tests.catalogue.user_oracles import HandChain, RandomNADE
from tests.stats import assert_samples_match


class TinyNetwork:
    """A random one-hidden-layer any-order network: ``h = tanh(b + sum_{j in S} W[j, x_j])``,
    ``log mu(X_i | X_S) = log_softmax(c_i + V_i h)``. Its conditionals are inconsistent."""

    def __init__(self, n=5, q=3, hidden=6, scale=1.5, seed=0, chain=False):
        g = torch.Generator().manual_seed(seed)
        self.num_coords, self.num_values = n, q
        self.W = scale * torch.randn(n, q, hidden, generator=g, dtype=torch.float64)
        self.V = scale * torch.randn(n, q, hidden, generator=g, dtype=torch.float64)
        self.b = torch.randn(hidden, generator=g, dtype=torch.float64)
        self.c = torch.randn(n, q, generator=g, dtype=torch.float64)
        if chain:
            self.log_marginals_chain = self._chain

    def _logits(self, pre, coords):
        h = torch.tanh(pre)  # [..., H]
        return torch.log_softmax(self.c[coords] + (self.V[coords] * h.unsqueeze(-2)).sum(-1), -1)

    def _pre(self, values, mask):
        w = self.W[torch.arange(self.num_coords), values.clamp(0, self.num_values - 1)]
        return self.b + (w * mask.unsqueeze(-1)).sum(1)

    def log_marginals(self, values, mask):
        pre = self._pre(values, mask).unsqueeze(1).expand(-1, self.num_coords, -1)
        return self._logits(pre, torch.arange(self.num_coords))

    def _chain(self, values, mask, chain):
        w = self.W[chain, values.gather(1, chain).clamp(0, self.num_values - 1)]  # [C, L, H]
        pre = self._pre(values, mask).unsqueeze(1) + torch.cumsum(w, 1) - w
        return self._logits(pre, chain)

    def chain_rule_law(self, order) -> torch.Tensor:
        """``log q_sigma(x)`` for every state, as a tensor [q] * n (row-major)."""
        n, q = self.num_coords, self.num_values
        states = torch.tensor(list(itertools.product(range(q), repeat=n)))
        mask = torch.zeros_like(states, dtype=torch.bool)
        total = torch.zeros(states.shape[0], dtype=torch.float64)
        for i in order:
            rows = self.log_marginals(states, mask)[:, i]  # [S, q]
            total += rows.gather(1, states[:, i : i + 1]).squeeze(1)
            mask[:, i] = True
        return total.reshape([q] * n)


SCHEDULES = {
    "default": {},
    "blocks": {"token_below": 0},
    "blocks_deep": {"token_below": 0, "race_depth": None, "max_block": 5},
    "blocks_chain_tries": {"token_below": 0, "race_depth": 0, "max_block": 5},
    "hybrid": {"token_below": 3, "max_block": 5, "first_block": 2},
}


@pytest.mark.parametrize("chain", [False, True], ids=["rows", "chain_queries"])
@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
def test_imperfect_network_exact_for_its_chain_rule(schedule, chain):
    net = TinyNetwork(chain=chain)
    order = [3, 0, 4, 1, 2]
    law = net.chain_rule_law(order)
    assert not torch.allclose(law, TinyNetwork().chain_rule_law(list(range(5))))  # inconsistent
    result = sample_any_order(net, 4000, seed=13, order=order, schedule=SCHEDULES[schedule])
    assert_samples_match(result.samples, law, net.num_values)
    # the returned log probability is the network's chain rule in the order used
    index = torch.tensor([[3**4, 3**3, 9, 3, 1]]) @ result.samples.T
    torch.testing.assert_close(result.log_prob, law.flatten()[index[0]], rtol=0, atol=1e-9)


def test_same_seed_and_schedule_same_draws_whatever_the_batch():
    net = TinyNetwork(n=12, q=2, seed=3, chain=True)
    for knobs in ({}, {"token_below": 0}, {"token_below": 6, "max_block": 8}):
        whole = sample_any_order(net, 16, seed=21, schedule=knobs)
        for other in (
            {"max_concurrent_draws": 8},
            {"max_concurrent_draws": 3, "max_rows_per_round": 5},
            {"max_elements": 64},
        ):
            again = sample_any_order(net, 16, seed=21, schedule={**knobs, **other})
            assert torch.equal(whole.samples, again.samples)
            torch.testing.assert_close(whole.log_prob, again.log_prob, rtol=0, atol=0)


def test_windows_shrink_where_drafts_fail():
    """On an inconsistent network the block rule with chain-rule tries does far less work than
    recursive tries at every depth (the cap on nested races), and the token rule less still."""
    net = TinyNetwork(n=96, q=4, hidden=16, scale=1.0, seed=5, chain=True)
    deep = sample_any_order(
        net, 4, seed=1, schedule=Schedule(token_below=0, race_depth=None, max_block=32)
    )
    capped = sample_any_order(
        net, 4, seed=1, schedule=Schedule(token_below=0, race_depth=0, max_block=32)
    )
    token = sample_any_order(net, 4, seed=1, schedule=Schedule(max_block=32))
    assert capped.oracle_rows < deep.oracle_rows
    assert token.oracle_rows <= 3 * 4 * net.num_coords
    assert token.rounds < net.num_coords


def test_policy_rules():
    policy = BlockPolicy(max_block=32, min_block=4, first_block=8, token_below=8)
    assert policy.start_window() == 8 and not policy.start_token()
    window, token = policy.next_block(
        torch.tensor([8, 8, 4, 4, 8, 8]),
        torch.tensor([False, False, True, True, True, True]),
        torch.tensor([True, False, True, False, True, False]),
        torch.tensor([0, 0, 4, 1, 8, 40]),
        torch.tensor([0, 0, 0, 1, 0, 4]),
    )
    # block accepted: grow; block raced: halve (below 8: token mode). A token window is
    # followed by ceil(2 (tokens + 1) / (misses + 1)), clamped into [min_block, max_block]:
    # passed whole with 4 tokens and no miss: 10 (stays token below 8); kept 1 with one miss:
    # 2, floored at 4; a whole token window of 8 or more: 18, back to blocks; a draw that kept
    # 40 coordinates over 4 rejected tokens: 17 (its runs, not this window's, decide)
    assert window.tolist() == [16, 4, 10, 4, 18, 17]
    assert token.tolist() == [False, True, True, True, False, True]
    # a prefetched draft row covers the window that follows a whole pass
    ahead = policy.prefetch(
        torch.tensor([8, 4, 6]),
        torch.tensor([False, True, True]),
        torch.tensor([0, 0, 40]),
        torch.tensor([0, 0, 4]),
    )
    assert ahead.tolist() == [16, 10, 19]
    with pytest.raises(ValueError, match="blocks must be one of"):
        BlockPolicy(max_block=8, blocks="dynamic")
    with pytest.raises(ValueError, match="token_below"):
        BlockPolicy(max_block=8, token_below=-1)
    assert BlockPolicy(max_block=8, token_below=None).start_token()
    assert math.isclose(BlockPolicy(max_block=3, min_block=5).start_window(), 3)


def test_unknown_knob_names_the_schedule():
    net = TinyNetwork()
    with pytest.raises(TypeError, match="token_below"):
        sample_any_order(net, 2, seed=0, token_below_=3)


def test_result_records_the_schedule_and_passing_it_back_reproduces_the_draws():
    net = TinyNetwork(n=10, q=2, seed=2, chain=True)
    first = sample_any_order(net, 6, seed=9, schedule=Schedule(token_below=4, max_block=6))
    assert first.schedule["token_below"] == 4 and first.schedule["blocks"] == "adaptive"
    again = sample_any_order(net, 6, seed=9, method=first.method, schedule=first.schedule)
    assert torch.equal(first.samples, again.samples)
    default = sample_any_order(net, 6, seed=9)
    assert not torch.equal(first.samples, default.samples)


# ------------------------------------------------------------------ the typed Schedule object
def test_schedule_object_is_the_mapping_of_the_knobs_set():
    schedule = Schedule(max_block=32, race_depth=None, rho=2.0)
    assert dict(schedule) == {"max_block": 32, "rho": 2.0, "race_depth": None}
    assert schedule["race_depth"] is None and "first_block" not in schedule
    with pytest.raises(KeyError):
        schedule["first_block"]
    assert schedule == {"max_block": 32, "race_depth": None, "rho": 2.0}
    assert schedule.replace(max_block=DEFAULT) == {"race_depth": None, "rho": 2.0}
    assert Schedule.of(dict(schedule)) == schedule
    with pytest.raises(TypeError, match="unknown schedule knobs \\['max_blocks'\\]"):
        Schedule.of({"max_blocks": 3})
    with pytest.raises(TypeError, match="must be a Schedule or a dict"):
        Schedule.of([("max_block", 3)])
    # the one list: every knob some method accepts is a field, and nothing else
    every = set(knob_names(DISCRETE)) | set(knob_names(DIFFUSION))
    assert every == {f.name for f in dataclasses.fields(Schedule)}


def test_the_recorded_schedule_passed_back_gives_the_same_draws():
    oracle = MarkovChainOracle([0.5, 0.5], [[0.9, 0.1], [0.2, 0.8]], 60)
    given = Schedule(max_block=12, min_block=3)
    first = sample_any_order(oracle, 6, seed=4, schedule=given)
    assert isinstance(first.schedule, Schedule)
    assert first.schedule["max_block"] == 12 and first.schedule["rho"] == 3.0  # defaults filled
    again = sample_any_order(oracle, 6, seed=4, schedule=first.schedule)
    with pytest.warns(FutureWarning, match="schedule knobs as keywords"):
        keywords = sample_any_order(oracle, 6, seed=4, **first.schedule)
    assert torch.equal(first.samples, again.samples) and torch.equal(
        first.samples, keywords.samples
    )
    for method in ("sequential", "speculative", "agr24"):
        base = sample_any_order(oracle, 6, seed=4, method=method)
        back = sample_any_order(oracle, 6, seed=4, method=method, schedule=base.schedule)
        assert torch.equal(base.samples, back.samples)
    one = sample_any_order(
        oracle, 6, seed=4, schedule=Schedule(max_block=1)
    )  # below the default min_block
    assert (one.schedule["min_block"], one.schedule["max_block"]) == (1, 1)
    assert torch.equal(
        one.samples, sample_any_order(oracle, 6, seed=4, schedule=one.schedule).samples
    )
    with pytest.raises(TypeError, match="given both in schedule= and as keywords"):
        sample_any_order(oracle, 2, seed=0, schedule=given, max_block=4)
    hint = r"pass schedule=schedule\.replace\(max_block=4\)"  # the message says how
    with pytest.raises(TypeError, match=hint):
        sample_any_order(oracle, 6, seed=4, schedule=first.schedule, max_block=4)
    # a result's schedule run again with fewer draws in flight: a cap given as a keyword
    # replaces the schedule's (caps never change the draws)
    fewer = sample_any_order(
        oracle, 6, seed=4, schedule=first.schedule.replace(max_concurrent_draws=2)
    )
    with pytest.warns(FutureWarning, match="schedule knobs as keywords"):
        capped = sample_any_order(
            oracle, 6, seed=4, schedule=first.schedule, max_concurrent_draws=2
        )
    assert torch.equal(fewer.samples, first.samples) and torch.equal(capped.samples, first.samples)
    assert capped.schedule["max_concurrent_draws"] == 2
    with pytest.raises(TypeError, match="unknown schedule knobs \\['tolerance'\\]"):
        sample_any_order(oracle, 2, seed=0, schedule=Schedule(tolerance=0.2))


def _ours(caught) -> list:
    """The deprecation warnings of knobs given as keywords among ``caught``."""
    return [w for w in caught if "schedule knobs as keywords" in str(w.message)]


def test_knobs_as_keywords_are_deprecated_and_the_warning_names_the_schedule_to_pass():
    oracle = MarkovChainOracle([0.5, 0.5], [[0.9, 0.1], [0.2, 0.8]], 40)
    with pytest.warns(FutureWarning) as caught:
        old = sample_any_order(oracle, 4, seed=1, max_block=4, rho=2.0)
    (warning,) = _ours(caught)
    assert "pass schedule=Schedule(max_block=4, rho=2.0)" in str(warning.message)
    assert warning.filename == __file__  # the caller's line, not the library's
    new = sample_any_order(oracle, 4, seed=1, schedule=Schedule(max_block=4, rho=2.0))
    assert torch.equal(old.samples, new.samples)  # still honoured, the same draws
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sample_any_order(oracle, 4, seed=1, schedule={"max_block": 4})
    assert not _ours(caught)
    with pytest.warns(FutureWarning) as caught:
        capped = sample_any_order(oracle, 4, seed=1, schedule=new.schedule, max_concurrent_draws=2)
    (warning,) = _ours(caught)
    assert "schedule=Schedule.of(schedule).replace(max_concurrent_draws=2)" in str(warning.message)
    assert torch.equal(capped.samples, new.samples)
    times = torch.linspace(0.0, 1.0, 9, dtype=torch.float64)
    with pytest.warns(FutureWarning) as caught:
        sample_sde(lambda t, x: -x, times, torch.zeros(2), 3, seed=0, rule="block")
    (warning,) = _ours(caught)
    assert "pass schedule=Schedule(rule='block')" in str(warning.message)
    assert warning.filename == __file__


def test_no_public_signature_takes_knobs_as_keywords_yet_the_old_spelling_still_runs():
    """The samplers' signatures name ``schedule=`` and nothing catch-all (``help()`` and IDEs
    show what a user may pass); knobs given as keywords, the old spelling, still reach the
    schedule with the warning, and any other unknown keyword is refused before anything runs
    with a message naming the knobs."""
    from pyro_autospec import AutoSpec, AutoSpecKernel, sample_diffusion
    from pyro_autospec.infer.continuous import sample_continuous

    for func in (
        sample_any_order,
        sample_sde,
        sample_diffusion,
        sample_continuous,
        AutoSpec,
        AutoSpecKernel,
    ):
        kinds = [p.kind for p in inspect.signature(func).parameters.values()]
        assert inspect.Parameter.VAR_KEYWORD not in kinds, func
        assert "schedule" in inspect.signature(func).parameters, func
    oracle = MarkovChainOracle([0.5, 0.5], [[0.9, 0.1], [0.2, 0.8]], 40)
    with pytest.raises(
        TypeError, match=r"unknown schedule knobs or arguments \['max_blok'\] for sample_any_order"
    ):
        sample_any_order(oracle, 4, seed=1, max_blok=4)
    with pytest.raises(TypeError, match="is an argument of pyro.infer.MCMC"):
        AutoSpec(print, 4, hook_fn=None)
    with pytest.warns(FutureWarning, match="schedule knobs as keywords"):
        fit = AutoSpec(print, 4, max_block=4)
    assert fit.schedule == {"max_block": 4}


def test_the_largest_window_is_a_preset_by_device_and_batch():
    """``max(8, 2 sqrt n)``, or ``max(8, sqrt n)`` on an accelerator with 256 draws in
    flight; a given ``max_block`` wins, and the recorded one gives the same draws."""
    assert default_max_block(256) == default_max_block(256, 4096, "cpu") == 32
    assert default_max_block(256, 256, torch.device("cuda", 0)) == 16
    assert default_max_block(256, 255, "cuda") == 32
    assert default_max_block(16, 256, "cuda") == 8  # never below 8
    oracle = MarkovChainOracle([0.5, 0.5], [[0.9, 0.1], [0.2, 0.8]], 256)
    run = sample_any_order(oracle, LEAN_DRAWS, seed=1, schedule=Schedule(max_concurrent_draws=300))
    assert run.schedule["max_block"] == 32  # on a CPU
    given = sample_any_order(oracle, 4, seed=1, schedule=Schedule(max_block=16))
    assert given.schedule["max_block"] == 16
    again = sample_any_order(oracle, 4, seed=1, schedule=given.schedule)
    assert torch.equal(again.samples, given.samples)


def test_the_largest_window_is_rows_lean_on_a_cpu_for_an_oracle_without_chain_queries():
    """8 on a CPU with 4 draws in flight or more when the oracle has no
    ``log_marginals_chain`` (every verified token is a call of its own); recorded, and the
    recorded schedule gives the same draws with another batch and on the reference engine."""
    assert default_max_block(256, LEAN_ROWS_DRAWS, "cpu", chain_queries=False) == 8
    assert default_max_block(256, LEAN_ROWS_DRAWS - 1, "cpu", chain_queries=False) == 32
    assert default_max_block(256, 4096, "cuda", chain_queries=False) == 16  # GPU: as before
    rows_only, chains = HandChain(256), RandomNADE(256, 3, seed=0)
    lean = sample_any_order(rows_only, LEAN_ROWS_DRAWS, seed=2)
    assert lean.schedule["max_block"] == 8
    assert sample_any_order(rows_only, LEAN_ROWS_DRAWS - 1, seed=2).schedule["max_block"] == 32
    assert sample_any_order(chains, LEAN_ROWS_DRAWS, seed=2).schedule["max_block"] == 32
    # in flight, not asked for: 4 draws two at a time take the rounds-first window
    assert (
        sample_any_order(rows_only, 4, seed=2, schedule=Schedule(max_concurrent_draws=2)).schedule[
            "max_block"
        ]
        == 32
    )
    one_at_a_time = {**dict(lean.schedule), "max_concurrent_draws": 1}
    for schedule, engine in ((one_at_a_time, "fast"), (lean.schedule, "reference")):
        again = sample_any_order(rows_only, 4, seed=2, schedule=schedule, engine=engine)
        assert torch.equal(again.samples, lean.samples)


def test_the_largest_window_is_rows_lean_on_a_cpu_for_an_oracle_with_whole_rows_alone():
    """8 on a CPU whatever the draws when the oracle answers whole rows alone (no
    ``log_marginals_at``, no chain queries): every verified token costs a whole row. An oracle
    with ``log_marginals_at`` keeps the rounds-first window below 4 draws, and a GPU its own
    preset; the recorded schedule gives the same draws on the reference engine."""
    assert default_max_block(256, 1, "cpu", chain_queries=False, targeted_queries=False) == 8
    assert default_max_block(256, 1, "cuda", chain_queries=False, targeted_queries=False) == 32
    whole = RandomNADE(256, 3, seed=0, chains=False)
    whole.log_marginals_at = None  # the protocol checks callable(getattr(oracle, name, None))
    one = sample_any_order(whole, 1, seed=2)
    assert one.schedule["max_block"] == 8
    targeted = RandomNADE(256, 3, seed=0, chains=False)
    assert sample_any_order(targeted, 1, seed=2).schedule["max_block"] == 32
    again = sample_any_order(whole, 1, seed=2, schedule=one.schedule, engine="reference")
    assert torch.equal(again.samples, one.samples)


def test_many_draws_of_an_oracle_without_chain_queries_are_drawn_sequentially_on_a_cpu():
    """From 16 draws in flight on a CPU, an oracle without chain queries gets windows of one
    coordinate: sequential sampling's draws, on its lock-step path (``n`` rounds, ``n`` rows a
    draw). Recorded, so the schedule passed back gives the same draws in other batches; an
    oracle with chain queries, fewer draws in flight and a GPU keep their windows."""
    assert default_max_block(256, SEQUENTIAL_DRAWS, "cpu", chain_queries=False) == 1
    assert default_max_block(256, SEQUENTIAL_DRAWS - 1, "cpu", chain_queries=False) == 8
    assert default_max_block(256, SEQUENTIAL_DRAWS, "cpu") == 32
    assert default_max_block(256, 4096, "cuda", chain_queries=False) == 16
    rows_only = RandomNADE(64, 3, seed=0, chains=False)
    run = sample_any_order(rows_only, SEQUENTIAL_DRAWS, seed=5)
    assert run.schedule["max_block"] == 1
    assert run.rounds == 64 and run.oracle_rows == 64 * SEQUENTIAL_DRAWS
    sequential = sample_any_order(rows_only, SEQUENTIAL_DRAWS, seed=5, method="sequential")
    assert torch.equal(run.samples, sequential.samples)
    batched = {**dict(run.schedule), "max_concurrent_draws": 5}
    for engine in ("fast", "reference"):
        again = sample_any_order(
            rows_only, SEQUENTIAL_DRAWS, seed=5, schedule=batched, engine=engine
        )
        assert torch.equal(again.samples, run.samples)
    chains = RandomNADE(64, 3, seed=0)
    assert sample_any_order(chains, SEQUENTIAL_DRAWS, seed=5).schedule["max_block"] == 16


def test_the_call_size_is_a_preset_by_device_that_never_changes_the_draws():
    oracle = MarkovChainOracle([0.5, 0.5], [[0.9, 0.1], [0.2, 0.8]], 60)
    here = sample_any_order(oracle, 6, seed=4)
    assert here.schedule["max_elements"] == default_max_elements("cpu") == 2**20
    assert default_max_elements(torch.device("cuda", 1)) == 2**24
    for budget in (2**24, 300):  # one call per round, or many small ones
        other = sample_any_order(oracle, 6, seed=4, schedule=Schedule(max_elements=budget))
        assert torch.equal(other.samples, here.samples)
        assert other.rounds == here.rounds and other.schedule["max_elements"] == budget
