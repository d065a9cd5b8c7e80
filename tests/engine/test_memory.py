"""Memory bounded by the draws in flight (issue 32, point 4).

A draw's order and partial sample exist only while it is in flight (``max_concurrent_draws``
lanes); finished samples go into one preallocated output; orders are recomputed from the keys
when a result's ``orders`` is read; a run whose outputs cannot fit is refused before anything
of its size is allocated. None of this may change a single draw.
"""

from __future__ import annotations

import math
import time

import pytest
import torch

import pyro_autospec.engine.any_order as any_order_module
import pyro_autospec.engine.host_plane as host_plane_module
import pyro_autospec.engine.memory as memory_module
from pyro_autospec.engine import Schedule, keys, sample_any_order
from pyro_autospec.engine.any_order import draw_orders
from pyro_autospec.engine.diffusion import sample_diffusion, sample_sde
from pyro_autospec.engine.host_rows import HostRows
from pyro_autospec.engine.memory import check_output_size
from pyro_autospec.engine.methods import DISCRETE, method_names
from pyro_autospec.engine.rows import OracleRows, VisitOrders
from pyro_autospec.oracles import HMMOracle, MarkovChainOracle
from pyro_autospec.oracles.denoisers import FiniteSupportDenoiser

METHODS = method_names(DISCRETE)  # every discrete method, the engine's own ones too
SCHEDULES = {
    "default": {},
    "blocks": {"token_below": 0},  # residual races: tries with frames of their own
    "blocks_fixed": {"blocks": "fixed", "token_below": 0, "race_depth": None, "rho": 1e-9},
    "cap": {"max_rows_per_round": 5},
}


def _chain(n: int = 40) -> MarkovChainOracle:
    return MarkovChainOracle([0.5, 0.5], [[0.9, 0.1], [0.2, 0.8]], n)


def _hmm(n: int = 30) -> HMMOracle:
    g = torch.Generator().manual_seed(3)
    T = torch.tensor([[0.8, 0.1, 0.1], [0.1, 0.8, 0.1], [0.1, 0.1, 0.8]])
    return HMMOracle(torch.full((3,), 1 / 3), T, torch.randn(n, 3, generator=g))


def _same(a, b) -> None:
    assert torch.equal(a.samples, b.samples)
    # the oracle's arithmetic may round differently in batches of another size
    torch.testing.assert_close(a.log_prob, b.log_prob, rtol=0, atol=1e-10)
    assert torch.equal(a.orders, b.orders)


class Recorder:
    """Wraps :class:`OracleRows` in ``any_order`` and :class:`HostRows` in the host control
    plane: keeps every instance, and checks on every request that the draws asked about are in
    flight (hold a lane)."""

    def __init__(self, monkeypatch):
        self.instances: list[OracleRows] = []
        self.hosts: list[HostRows] = []
        self.most_in_flight = 0
        recorder = self

        class Checked(OracleRows):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                recorder.instances.append(self)

            def start(self, draws):
                super().start(draws)
                in_flight = int((self.draw_in >= 0).sum())
                recorder.most_in_flight = max(recorder.most_in_flight, in_flight)

            def coords(self, draw, pos):
                if not self.resident:
                    assert bool((self.lane_of[draw] >= 0).all()), "a finished draw was asked"
                return super().coords(draw, pos)

        class CheckedHost(HostRows):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                recorder.hosts.append(self)

            def start(self, lanes, draws):
                assert (self.draw_in[lanes] < 0).all(), "a draw started in a busy lane"
                super().start(lanes, draws)
                in_flight = int((self.draw_in >= 0).sum())
                recorder.most_in_flight = max(recorder.most_in_flight, in_flight)

        monkeypatch.setattr(any_order_module, "OracleRows", Checked)
        monkeypatch.setattr(host_plane_module, "HostRows", CheckedHost)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("concurrency", [1, 3, 8])
def test_draws_do_not_depend_on_the_draws_in_flight(method, concurrency, monkeypatch):
    oracle = _chain()
    whole = sample_any_order(oracle, 17, method=method, seed=5)
    recorder = Recorder(monkeypatch)
    part = sample_any_order(
        oracle, 17, method=method, seed=5, schedule=Schedule(max_concurrent_draws=concurrency)
    )
    _same(part, whole)
    (rows,) = recorder.instances
    # the lanes that hold the draws in flight: the host control plane's, or the lockstep loop's
    holder = recorder.hosts[0] if recorder.hosts else rows
    # only `concurrency` draws ever held an order, and every lane is free at the end
    assert tuple(holder.orders.shape) == (concurrency, oracle.num_coords)
    assert tuple(holder.ranks.shape) == (concurrency, oracle.num_coords)
    assert recorder.most_in_flight == concurrency
    assert bool((holder.draw_in < 0).all())
    if not recorder.hosts:
        assert bool((rows.lane_of < 0).all())


@pytest.mark.parametrize(
    "engine, knobs",
    [("fast", {"token_below": 0}), ("reference", {"token_below": 0}), ("reference", {})],
)
def test_the_reference_engine_holds_the_orders_of_the_draws_in_flight(engine, knobs, monkeypatch):
    """The reference engine (the block rule's one engine, whatever ``engine`` says) holds an
    order only while its draw runs, like the host control plane."""
    oracle = _chain()
    whole = sample_any_order(oracle, 11, seed=2, engine=engine, schedule=knobs)
    recorder = Recorder(monkeypatch)
    part = sample_any_order(
        oracle, 11, seed=2, engine=engine, schedule={**knobs, "max_concurrent_draws": 3}
    )
    _same(part, whole)
    (rows,) = recorder.instances
    assert tuple(rows.orders.shape) == (3, oracle.num_coords)
    assert recorder.most_in_flight == 3
    assert bool((rows.draw_in < 0).all()) and bool((rows.lane_of < 0).all())


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_autospec_schedules_agree_with_the_reference_engine_under_batching(schedule):
    oracle = _hmm()
    knobs = SCHEDULES[schedule]
    slow = sample_any_order(oracle, 9, seed=11, engine="reference", schedule=knobs)
    whole = sample_any_order(oracle, 9, seed=11, schedule=knobs)
    batched = sample_any_order(oracle, 9, seed=11, schedule={**knobs, "max_concurrent_draws": 2})
    _same(whole, batched)
    assert torch.equal(whole.samples, slow.samples)
    torch.testing.assert_close(whole.log_prob, slow.log_prob, rtol=0, atol=1e-10)
    assert torch.equal(whole.orders, slow.orders)
    if "max_rows_per_round" not in knobs:  # the same rounds and rows as the reference
        assert (whole.rounds, whole.oracle_rows) == (slow.rounds, slow.oracle_rows)


def test_lanes_stay_bounded_over_many_draws(monkeypatch):
    recorder = Recorder(monkeypatch)
    oracle = _chain(32)
    result = sample_any_order(oracle, 200, seed=0, schedule=Schedule(max_concurrent_draws=8))
    (holder,) = recorder.hosts  # the default schedule runs on the host control plane
    assert holder.orders.shape[0] == 8 and holder.ranks.shape[0] == 8
    assert recorder.instances[0].orders is None  # the lockstep loop's lanes: not allocated
    assert recorder.most_in_flight == 8
    assert result.samples.shape == (200, 32)
    assert torch.equal(result.samples, sample_any_order(oracle, 200, seed=0).samples)


@pytest.mark.parametrize("order", ["random", "fixed"])
def test_orders_are_computed_from_the_keys_when_read(order):
    oracle = _chain(20)
    fixed = torch.randperm(20, generator=torch.Generator().manual_seed(2))
    given = "random" if order == "random" else fixed
    result = sample_any_order(
        oracle, 13, seed=4, schedule=Schedule(max_concurrent_draws=4), order=given
    )
    assert not isinstance(result.__dict__["_orders"], torch.Tensor)  # nothing stored yet
    draw_keys = keys.draw_keys(keys.seed_key(4), torch.arange(13))
    want = draw_orders(None if order == "random" else fixed, draw_keys, 20)
    got = result.orders
    assert got.dtype == torch.long and torch.equal(got, want)
    assert result.orders is got  # computed once
    got[0, 0] = got[0, 0]  # an ordinary tensor: writable
    if order == "fixed":
        assert bool((got == fixed).all())
    # every row a permutation
    assert torch.equal(got.sort(1).values, torch.arange(20).expand(13, 20))


def test_visit_orders_materialise_in_chunks(monkeypatch):
    monkeypatch.setattr(VisitOrders, "CHUNK", 3)
    draw_keys = keys.draw_keys(keys.seed_key(9), torch.arange(10))
    source = VisitOrders(None, draw_keys, 7)
    assert torch.equal(source.materialize(), draw_orders(None, draw_keys, 7))
    picked = torch.tensor([8, 1])
    assert torch.equal(source.of(picked), draw_orders(None, draw_keys[picked], 7))


def test_results_are_ordinary_tensors_without_copies_under_inference_mode():
    oracle = _chain(16)
    with torch.inference_mode():
        result = sample_any_order(oracle, 6, seed=0, schedule=Schedule(max_concurrent_draws=2))
    for value in (result.samples, result.log_prob, result.orders):
        assert not value.is_inference()
    assert result.samples.dtype == torch.long
    result.samples[0, 0] = 1 - result.samples[0, 0]  # a caller may write into its draws


@pytest.mark.parametrize("method", ["autospec", "sequential"])
def test_impossible_sizes_are_refused_before_any_allocation(method):
    oracle = _chain(1024)
    start = time.perf_counter()
    with pytest.raises(MemoryError) as info:
        sample_any_order(
            oracle, 10**12, method=method, seed=0, schedule=Schedule(max_concurrent_draws=256)
        )
    assert time.perf_counter() - start < 5  # refused, not attempted (generous on a CPU)
    text = str(info.value)
    for part in ("num_samples=1000000000000", "n=1024", "PiB", "fewer draws per call"):
        assert part in text


def test_the_draws_in_flight_alone_can_be_too_many(monkeypatch):
    # a machine of 32 MiB: 1000 samples of n = 1024 fit (7.8 MiB), but 1000 draws in flight
    # at 32 bytes per coordinate (31 MiB) beside them do not; 16 do
    monkeypatch.setattr(memory_module, "machine_memory", lambda: 32 * 2**20)
    oracle = _chain(1024)
    with pytest.raises(MemoryError, match="max_concurrent_draws") as info:
        sample_any_order(oracle, 1000, seed=0)
    assert "fewer draws" not in str(info.value)
    with pytest.raises(MemoryError, match="fewer draws per call"):
        sample_any_order(oracle, 10_000, seed=0, schedule=Schedule(max_concurrent_draws=16))
    check_output_size(1000, 1024, in_flight=16, bytes_per_flight=32)  # fits: no error


class _Uniform:
    """Independent uniform coordinates over a large alphabet (every draft passes)."""

    consistent_queries = True

    def __init__(self, n: int, q: int):
        self.num_coords, self.num_values = n, q

    def log_marginals_at(self, values, mask, targets):
        return torch.full((*targets.shape, self.num_values), -math.log(self.num_values))

    def log_marginals(self, values, mask):
        return torch.full((*values.shape, self.num_values), -math.log(self.num_values))


@pytest.mark.parametrize(
    "method, knobs, lanes",
    [
        ("autospec", {"max_block": 4}, 256),
        ("autospec", {}, 300),
        ("speculative", {}, 256),
        ("agr24", {}, 300),
    ],
)
def test_a_large_alphabet_caps_the_draws_in_flight_by_default(method, knobs, lanes, monkeypatch):
    """A round holds ``[draws, window, q]`` float64 rows: with q = 4096 and 1,000 draws all
    in flight they took 4.3 GB and twice sequential sampling's time. By default the draws in
    flight are capped (here 2**22 // (4 * 4096) = 256 for windows of 4; AGR24's window is 1
    here, under the cap, and so is autospec's default window on a CPU for 300 draws of an
    oracle without chain queries); the draws are those of all in flight."""
    recorder = Recorder(monkeypatch)
    oracle = _Uniform(4, 4096)
    capped = sample_any_order(oracle, 300, seed=1, method=method, schedule=knobs)
    assert recorder.most_in_flight == lanes and capped.schedule["max_concurrent_draws"] is None
    every = sample_any_order(
        oracle, 300, seed=1, method=method, schedule={**knobs, "max_concurrent_draws": 300}
    )
    assert torch.equal(capped.samples, every.samples)
    assert torch.equal(capped.log_prob, every.log_prob)


@pytest.mark.parametrize("method", ["autospec", "speculative", "agr24"])
def test_the_draws_state_caps_the_draws_in_flight_by_default(method, monkeypatch):
    """Every draw in flight holds its order, ranks and partial sample: by default the windowed
    methods hold at most ``STATE_ENTRIES // n`` draws in flight (here 400 // 40 = 10 of 64),
    so a large run holds its output and a bounded state, not every draw's; the draws are
    those of all in flight. The lock step (windows of one coordinate) keeps them all."""
    monkeypatch.setattr(host_plane_module, "STATE_ENTRIES", 400)
    recorder = Recorder(monkeypatch)
    capped = sample_any_order(_chain(), 64, seed=2, method=method)
    assert recorder.most_in_flight == 10 and capped.schedule["max_concurrent_draws"] is None
    every = sample_any_order(
        _chain(), 64, seed=2, method=method, schedule=Schedule(max_concurrent_draws=64)
    )
    _same(capped, every)
    lock_step = sample_any_order(
        _chain(), 64, seed=2, method="autospec", schedule=Schedule(max_block=1)
    )
    assert lock_step.rounds == 40  # every draw in flight: one round per coordinate


def test_the_memory_check_counts_the_rows_of_a_large_alphabet(monkeypatch):
    """About six float64 ``[window, q]`` rows per draw in flight (q = 2**16: 25 MB a draw)."""
    monkeypatch.setattr(memory_module, "machine_memory", lambda: 2**30)
    with pytest.raises(MemoryError, match="max_concurrent_draws"):
        sample_any_order(
            _Uniform(8, 2**16), 64, seed=0, schedule=Schedule(max_concurrent_draws=64, max_block=8)
        )


def test_reading_orders_too_large_for_the_machine_is_refused(monkeypatch):
    result = sample_any_order(_chain(64), 40, seed=0, schedule=Schedule(max_concurrent_draws=4))
    monkeypatch.setattr(memory_module, "machine_memory", lambda: 4096)
    with pytest.raises(MemoryError, match="result.orders"):
        result.orders  # noqa: B018


def test_distributed_results_compute_orders_when_read_too(one_rank_group):
    fixed = torch.randperm(20, generator=torch.Generator().manual_seed(1))
    for order in ("random", fixed):
        plain = sample_any_order(_chain(20), 7, seed=2, order=order)
        spread = sample_any_order(_chain(20), 7, seed=2, order=order, distributed=True)
        assert not isinstance(spread.__dict__["_orders"], torch.Tensor)  # not gathered
        _same(spread, plain)


def _minus(t, x):
    return -x


@pytest.mark.parametrize(
    "knobs",
    [
        {},
        {"method": "sequential"},
        {"method": "picard"},
        {"return_paths": True},
        {"engine": "reference"},
        {"rule": "block"},
    ],
)
def test_impossible_diffusions_are_refused_before_any_allocation(knobs):
    times = torch.linspace(0.0, 1.0, 257)
    start = time.perf_counter()
    with pytest.raises(MemoryError) as info:
        options = {k: v for k, v in knobs.items() if k in ("method", "return_paths", "engine")}
        schedule = {k: v for k, v in knobs.items() if k not in options}
        sample_sde(_minus, times, torch.zeros(1000), 10**12, seed=0, schedule=schedule, **options)
    assert time.perf_counter() - start < 5  # refused, not attempted (generous on a CPU)
    text = str(info.value)
    for part in ("num_samples=1000000000000", "d=1000", "256 steps", "PiB", "this machine has"):
        assert part in text
    assert "fewer draws per call" in text
    if not knobs:  # every draw in flight, each with windows of 33 steps: more than the samples
        assert "Set max_concurrent_draws (e.g. 256) too" in text
    picard = knobs.get("method") == "picard"
    hints = {  # what keeps the whole paths, named
        "method='picard'": picard,
        "return_paths=False": "return_paths" in knobs,
        "engine='reference'": "engine" in knobs,
        "rule='block'": "rule" in knobs,
    }
    assert {hint: hint in text for hint in hints} == hints
    assert ("exact and independent" in text) == (not picard)


def test_an_impossible_stochastic_localization_is_refused():
    oracle = FiniteSupportDenoiser(torch.tensor([[1.0, 0.0], [-1.0, 0.0]]))
    with pytest.raises(MemoryError, match=r"num_samples=10+ draws of d=2 .* PiB .*fewer draws"):
        sample_diffusion(oracle, 10**17, num_steps=64, seed=0)


def test_the_draws_in_flight_of_a_diffusion_alone_can_be_too_many(monkeypatch):
    # a machine of 1 MiB: 40 draws of d = 64 (43 KB) fit, but their windows of 33 steps all in
    # flight (4 MB) do not; 4 in flight do, and the run gives the same draws
    times = torch.linspace(0.0, 1.0, 257)
    every = sample_sde(_minus, times, torch.zeros(64), 40, seed=3)
    monkeypatch.setattr(memory_module, "machine_memory", lambda: 2**20)
    with pytest.raises(MemoryError, match="max_concurrent_draws") as info:
        sample_sde(_minus, times, torch.zeros(64), 40, seed=3)
    assert "fewer draws" not in str(info.value)
    few = sample_sde(
        _minus, times, torch.zeros(64), 40, seed=3, schedule=Schedule(max_concurrent_draws=4)
    )
    assert torch.equal(few.samples, every.samples)


def test_paths_too_large_for_the_machine_name_return_paths(monkeypatch):
    monkeypatch.setattr(memory_module, "machine_memory", lambda: 8 * 2**20)
    times = torch.linspace(0.0, 1.0, 257)
    with pytest.raises(MemoryError, match="Or pass return_paths=False: the whole paths take"):
        sample_sde(_minus, times, torch.zeros(8), 1000, seed=0, return_paths=True)
