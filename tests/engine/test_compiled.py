"""The compiled lock step (numba) against the NumPy one: the same draws and the same bits of
their log probabilities, the same errors, on oracles as users write them."""

from __future__ import annotations

import builtins
import functools
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from pyro_autospec.engine import OracleError, Schedule, compiled, keys, sample_any_order
from pyro_autospec.engine.compiled import LockStep, draw_rows, shift_rows
from pyro_autospec.oracles import MarkovChainOracle
from tests.catalogue.user_oracles import HandChain, RandomNADE

numba = pytest.importorskip("numba")  # the test extra installs it; CI runs these tests

ROOT = Path(__file__).resolve().parents[2]


class Borrowing:
    """An oracle declaring ``borrows_inputs``: the lock step hands it the same inputs at
    every step."""

    borrows_inputs = True

    def __init__(self, inner):
        self.inner = inner
        self.num_coords, self.num_values = inner.num_coords, inner.num_values

    def log_marginals_at(self, values, mask, targets):
        return self.inner.log_marginals_at(values, mask, targets)


class BorrowingUnchecked(Borrowing):
    """:class:`Borrowing` without the consistency check, whose calls :class:`Broken` would
    count as steps."""

    consistent_queries = True


class Broken:
    """Answers like ``inner`` except draw ``row``'s row at step ``step``, replaced by
    ``entries`` (the lock step asks every draw's row at each step, in draw order; calls of
    fewer rows, the engine's probes, are not steps). It skips the consistency check, whose
    calls would count as steps: the lock step's errors are the subject here."""

    consistent_queries = True

    def __init__(self, inner, step, row, entries):
        self.inner, self.step, self.row, self.entries = inner, step, row, entries
        self.num_coords, self.num_values = inner.num_coords, inner.num_values
        self.calls = 0

    def log_marginals_at(self, values, mask, targets):
        out = self.inner.log_marginals_at(values, mask, targets).clone()
        if out.shape[0] > self.row:  # a step's call (not a probe of one row)
            if self.calls == self.step:
                out[self.row, 0] = torch.tensor(self.entries, dtype=out.dtype)
            self.calls += 1
        return out


def _both(oracle, draws, monkeypatch, **kwargs):
    """The same run with the lock step compiled and in NumPy."""
    monkeypatch.setenv("PYRO_AUTOSPEC_NUMBA", "1")
    fast = sample_any_order(oracle, draws, **kwargs)
    monkeypatch.setenv("PYRO_AUTOSPEC_NUMBA", "0")
    slow = sample_any_order(oracle, draws, **kwargs)
    return fast, slow


class Transposed:
    """Returns its rows laid out values-first (``[q, W, R]`` permuted), or (``broadcast``)
    one float32 row for every coordinate, broadcast (stride 0): layouts whose rows NumPy
    would sum in another order than contiguous ones."""

    def __init__(self, inner, broadcast=False):
        self.inner, self.broadcast = inner, broadcast
        self.num_coords, self.num_values = inner.num_coords, inner.num_values

    def log_marginals_at(self, values, mask, targets):
        out = self.inner.log_marginals_at(values, mask, targets)
        if self.broadcast:  # every coordinate the same law, one row in memory
            return torch.log_softmax(self.inner.base[0].float(), -1).expand(out.shape)
        stored = torch.empty(out.shape[::-1], dtype=out.dtype).permute(2, 1, 0)
        stored.copy_(out)
        return stored


class Additive:
    """A float64 oracle whose rows do not depend on the batch they are asked in (elementwise
    arithmetic only): the logits of coordinate ``i`` are ``base[i]`` plus ``slope[i]`` times
    the sum of the pinned values."""

    def __init__(self, n, q, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.num_coords, self.num_values = n, q
        self.base = 2.0 * torch.randn(n, q, generator=g, dtype=torch.float64)
        self.slope = 0.3 * torch.randn(n, q, generator=g, dtype=torch.float64)

    def log_marginals_at(self, values, mask, targets):
        pinned = (values * mask).sum(1).double()[:, None, None]  # [R, 1, 1]
        return torch.log_softmax(self.base[targets] + self.slope[targets] * pinned, -1)


ORACLES = {
    # float64 rows, log_marginals_at only, inputs fresh or borrowed
    "hand_chain": lambda: HandChain(30),
    "hand_chain_borrowed": lambda: Borrowing(HandChain(30)),
    # float32 whole rows of a network, q = 2, 9 and 33 (NumPy sums rows of 8 or more pairwise)
    "nade_q2": lambda: RandomNADE(20, 2, hidden=8, scale=2.0, chains=False),
    "nade_q9": lambda: RandomNADE(20, 9, hidden=8, scale=2.0, chains=False),
    "nade_q33": lambda: RandomNADE(12, 33, hidden=8, scale=3.0, chains=False),
    # rows stored values-first, or one float32 row broadcast: summed as contiguous rows
    "additive_q9_transposed": lambda: Transposed(Additive(20, 9)),
    "additive_q33_transposed": lambda: Transposed(Additive(12, 33)),
    "additive_q9_broadcast": lambda: Transposed(Additive(20, 9), broadcast=True),
    # a shipped family with zero-probability values (-inf entries)
    "markov_sparse": lambda: MarkovChainOracle(
        torch.tensor([0.5, 0.5, 0.0]),
        torch.tensor([[0.9, 0.1, 0.0], [0.0, 0.3, 0.7], [0.2, 0.0, 0.8]]),
        25,
    ),
}


@pytest.mark.parametrize("name", sorted(ORACLES))
@pytest.mark.parametrize("method", ["sequential", "gumbel_sequential"])
def test_compiled_lock_step_gives_the_numpy_bits(name, method, monkeypatch):
    oracle = ORACLES[name]()
    fast, slow = _both(oracle, 9, monkeypatch, seed=3, method=method)
    assert torch.equal(fast.samples, slow.samples)
    assert torch.equal(fast.log_prob, slow.log_prob)
    assert fast.rounds == slow.rounds == oracle.num_coords
    # the general loop (a draw cap) reads the same bits: the batch composition changes nothing
    monkeypatch.setenv("PYRO_AUTOSPEC_NUMBA", "1")
    loop = sample_any_order(
        oracle, 9, seed=3, method=method, schedule=Schedule(max_concurrent_draws=4)
    )
    assert torch.equal(loop.samples, fast.samples)
    assert torch.equal(loop.log_prob, fast.log_prob)


@pytest.mark.parametrize("name", ["hand_chain", "hand_chain_borrowed", "nade_q9"])
def test_steps_split_into_several_calls_give_the_same_draws(name, monkeypatch):
    """A small ``max_elements`` cuts each step into calls of a few draws each."""
    oracle = ORACLES[name]()
    whole = _both(oracle, 11, monkeypatch, seed=5, method="sequential")[0]
    fast, slow = _both(
        oracle, 11, monkeypatch, seed=5, method="sequential", schedule={"max_elements": 60}
    )
    for result in (fast, slow):
        assert torch.equal(result.samples, whole.samples)
        assert torch.equal(result.log_prob, whole.log_prob)
    assert fast.oracle_rows == whole.oracle_rows


def test_the_step_as_written_is_the_compiled_step():
    """The Python functions numba compiles, run as Python, give the compiled bits: rows with
    -inf entries, ties, float32 and float64, values in narrow frames or int64."""
    rng = np.random.default_rng(0)
    compiled_step = compiled.compiled_lock_step()
    python_step = LockStep(shift_rows, draw_rows)
    for dtype, q, frame in ((np.float64, 3, np.int64), (np.float32, 12, np.uint8)):
        logits = rng.normal(size=(7, 1, q)) * 3
        logits[rng.random(logits.shape) < 0.2] = -np.inf
        logits[:, 0, 0] = 1.0  # every row has mass
        logits[2, 0, :] = 0.0  # a row of ties, drawn without noise: the first maximum
        out = (logits - np.log(np.exp(logits).sum(-1, keepdims=True))).astype(dtype)
        noise = rng.gumbel(size=(7, 4, q))
        noise[2] = 0.0
        coords = rng.integers(0, 10, 7)
        results = []
        for step in (compiled_step, python_step):
            values, log_mu = np.zeros((7, 10), dtype=frame), np.zeros(7)
            mask = np.zeros((7, 10), dtype=bool)
            assert step(out, noise, 2, values, mask, coords, log_mu, 1e-5) == -1
            results.append((values, mask, log_mu))
        for a, b in zip(*results):
            np.testing.assert_array_equal(a, b)
        assert np.isfinite(results[0][2]).all()
        assert results[0][0][2, coords[2]] == 0  # the tie goes to the first value


@pytest.mark.parametrize(
    "entries, problem",
    [
        ([float("nan"), 0.0], "contains NaN"),
        ([0.0, float("inf")], r"contains \+inf"),
        ([float("-inf"), float("-inf")], "gives zero mass to every value"),
        ([0.3, 0.2], "sums to"),
    ],
)
@pytest.mark.parametrize("borrowed", [False, True])
def test_bad_rows_raise_the_same_error_compiled_or_not(entries, problem, borrowed, monkeypatch):
    messages = []
    for flag in ("1", "0"):
        monkeypatch.setenv("PYRO_AUTOSPEC_NUMBA", flag)
        oracle = Broken(HandChain(12), step=4, row=3, entries=entries)
        if borrowed:
            oracle = BorrowingUnchecked(oracle)
        with pytest.raises(OracleError, match=problem) as error:
            sample_any_order(oracle, 6, seed=1, method="sequential")
        messages.append(str(error.value))
    assert messages[0] == messages[1]
    assert "of draw 3, conditioned on 4 coordinates" in messages[0]


class LaterCall:
    """Calls of one draw each (a small ``max_elements``; 6 calls a step): at step 2, draw 1's
    row sums to 2 and draw 2's call returns the wrong shape."""

    num_coords, num_values = 10, 2
    consistent_queries = True  # no probes before the run: the calls are the steps'

    def __init__(self):
        self.inner, self.calls = HandChain(10), 0

    def log_marginals_at(self, values, mask, targets):
        assert values.shape[0] == 1
        out = self.inner.log_marginals_at(values, mask, targets)
        self.calls += 1
        if self.calls == 2 * 6 + 2:
            out = torch.zeros_like(out)
        if self.calls == 2 * 6 + 3:
            return out[:, :, :1]
        return out


def test_every_call_of_a_step_is_asked_before_any_row_is_checked(monkeypatch):
    """Both steps ask every call of a step first: the third call's wrong shape is what both
    raise, not the second call's bad row."""
    messages = []
    for flag in ("1", "0"):
        monkeypatch.setenv("PYRO_AUTOSPEC_NUMBA", flag)
        oracle = LaterCall()
        with pytest.raises(OracleError, match="returned shape") as error:
            sample_any_order(
                oracle, 6, seed=1, method="sequential", schedule=Schedule(max_elements=4)
            )
        messages.append((str(error.value), oracle.calls))
    assert messages[0] == messages[1]


@pytest.mark.parametrize("window", [1, 4, 7])
def test_noise_windows_that_do_not_divide_n_give_the_same_bits(window, monkeypatch):
    """The lock step draws its noise ``window`` steps at a time (keys.NOISE_ENTRIES entries);
    a window that does not divide n refreshes mid-run and at the ragged end."""
    oracle = Additive(30, 5)
    monkeypatch.setattr(keys, "NOISE_ENTRIES", window * 6 * 5)
    fast, slow = _both(oracle, 6, monkeypatch, seed=4, method="sequential")
    monkeypatch.setattr(keys, "NOISE_ENTRIES", 2**21)
    whole = sample_any_order(oracle, 6, seed=4, method="sequential")
    for result in (fast, slow):
        assert torch.equal(result.samples, whole.samples)
        assert torch.equal(result.log_prob, whole.log_prob)


class Family:
    """A family of targets, one per draw (``num_draws``, ``draws=``): draw ``d``'s logits are
    shifted by ``d``."""

    num_coords, num_values, num_draws = 15, 4, 7
    borrows_inputs = True

    def __init__(self):
        self.inner = Additive(15, 4)

    def log_marginals_at(self, values, mask, targets, draws):
        logits = self.inner.log_marginals_at(values, mask, targets)
        shift = 0.4 * draws.double()[:, None, None] * torch.arange(4.0, dtype=torch.float64)
        return torch.log_softmax(logits + shift, -1)


@pytest.mark.parametrize("max_elements", [None, 8])
def test_families_give_the_same_bits(max_elements, monkeypatch):
    knobs = {} if max_elements is None else {"max_elements": max_elements}
    fast, slow = _both(Family(), 7, monkeypatch, seed=2, method="sequential", schedule=knobs)
    assert torch.equal(fast.samples, slow.samples)
    assert torch.equal(fast.log_prob, slow.log_prob)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_rows_give_the_same_bits(dtype, monkeypatch):
    class Half(Additive):
        def log_marginals_at(self, values, mask, targets):
            return super().log_marginals_at(values, mask, targets).to(dtype)

    fast, slow = _both(Half(12, 6), 5, monkeypatch, seed=3, method="sequential")
    assert torch.equal(fast.samples, slow.samples)
    assert torch.equal(fast.log_prob, slow.log_prob)


def test_two_bad_rows_in_one_step_name_the_first_compiled_or_not(monkeypatch):
    """Draw 2's row does not sum to 1 and draw 4's has no finite entry: both steps name draw
    2 (the compiled step looks for non-finite rows first)."""

    class TwoBad(Broken):
        consistent_queries = True  # its own query method: Broken's declaration does not cover it

        def log_marginals_at(self, values, mask, targets):
            out = super().log_marginals_at(values, mask, targets)
            if self.calls == self.step + 1 and out.shape[0] > self.row:
                out[4, 0] = float("-inf")
            return out

    messages = []
    for flag in ("1", "0"):
        monkeypatch.setenv("PYRO_AUTOSPEC_NUMBA", flag)
        with pytest.raises(OracleError, match="of draw 2, .* sums to") as error:
            sample_any_order(TwoBad(HandChain(9), 3, 2, [0.0, 0.0]), 6, seed=1, method="sequential")
        messages.append(str(error.value))
    assert messages[0] == messages[1]


@pytest.mark.parametrize("flag", ["0", "false", "No", " OFF "])
def test_the_environment_variable_turns_the_compiled_step_off(flag, monkeypatch):
    monkeypatch.setenv("PYRO_AUTOSPEC_NUMBA", flag)
    assert compiled.compiled_lock_step() is None
    monkeypatch.setenv("PYRO_AUTOSPEC_NUMBA", "1")
    assert isinstance(compiled.compiled_lock_step(), LockStep)
    monkeypatch.delenv("PYRO_AUTOSPEC_NUMBA")
    assert compiled.wanted()


def test_a_numba_that_does_not_import_falls_back_to_numpy_with_a_warning(monkeypatch):
    """numba installed but built for another NumPy fails on import: the lock step runs in
    NumPy, with the same draws, and says so once."""
    real_import = builtins.__import__

    def refuse(name, *args, **kwargs):
        if name == "numba":
            raise ImportError("Numba needs NumPy 2.4 or less")
        return real_import(name, *args, **kwargs)

    oracle = HandChain(15)
    monkeypatch.setenv("PYRO_AUTOSPEC_NUMBA", "1")
    expected = sample_any_order(oracle, 5, seed=2, method="sequential")
    monkeypatch.setattr(compiled, "_compiled", functools.cache(compiled._compiled.__wrapped__))
    monkeypatch.setattr(builtins, "__import__", refuse)
    with pytest.warns(RuntimeWarning, match="numba is installed but does not import"):
        assert compiled.compiled_lock_step() is None
    with warnings.catch_warnings():  # warned once only
        warnings.simplefilter("error")
        result = sample_any_order(oracle, 5, seed=2, method="sequential")
    assert torch.equal(result.samples, expected.samples)
    assert torch.equal(result.log_prob, expected.log_prob)


def test_numba_with_its_jit_disabled_leaves_the_step_to_numpy(monkeypatch):
    """NUMBA_DISABLE_JIT would run the step's loops as Python: NumPy is faster."""
    monkeypatch.setenv("PYRO_AUTOSPEC_NUMBA", "1")
    monkeypatch.setattr(numba.config, "DISABLE_JIT", True)
    monkeypatch.setattr(compiled, "_compiled", functools.cache(compiled._compiled.__wrapped__))
    assert compiled.compiled_lock_step() is None


_RUN = """
import torch
from pyro_autospec.engine import sample_any_order

class Chain:
    num_coords, num_values = 12, 3

    def log_marginals_at(self, values, mask, targets):
        logits = (values * mask).sum(1).double()[:, None, None] * torch.tensor([0.1, 0.2, 0.3])
        return torch.log_softmax(logits + targets[..., None].double(), -1)

result = sample_any_order(Chain(), 5, seed=7, method="sequential")
print(result.samples.tolist(), result.log_prob.tolist())
"""


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_a_damaged_numba_cache_is_compiled_around_with_a_warning(damage, tmp_path):
    """numba writes its cache atomically, but a disk or a user may damage it: loading it then
    raises a pickle error, and the step compiles without the cache instead."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path), "PYRO_AUTOSPEC_NUMBA": "1"}

    def run():
        return subprocess.run(
            [sys.executable, "-c", _RUN], env=env, capture_output=True, text=True, cwd=ROOT
        )

    first = run()
    assert first.returncode == 0, first.stderr
    files = [path for path in tmp_path.rglob("*") if path.suffix in (".nbi", ".nbc")]
    assert files, "numba wrote no cache"
    for path in files:
        data = path.read_bytes()
        path.write_bytes(b"\x00" * 16 if damage == "garbage" else data[: len(data) // 2])
    second = run()
    assert second.returncode == 0, second.stderr
    assert "cache of the compiled lock step is damaged" in second.stderr
    assert second.stdout == first.stdout


@pytest.fixture
def fresh_count(monkeypatch):
    """The default setting, in a process where numba has not started and no lock step ran."""
    monkeypatch.delenv("PYRO_AUTOSPEC_NUMBA", raising=False)
    monkeypatch.setattr(compiled, "_steps_in_numpy", 0)
    monkeypatch.setattr(compiled, "_started", False)
    monkeypatch.setattr(compiled, "START_AFTER_STEPS", 50)


def test_by_default_numba_starts_once_the_numpy_steps_reach_its_price(fresh_count):
    """Short runs stay in NumPy (numba's start would cost more than it saves), until the
    process's steps, the coming run's included, reach START_AFTER_STEPS; then every run is
    compiled. Asked with no steps, the step is compiled at once."""
    assert compiled.setting() == "auto"
    assert compiled.compiled_lock_step(steps=20) is None
    assert compiled.compiled_lock_step(steps=29) is None  # 49 steps in NumPy
    assert isinstance(compiled.compiled_lock_step(steps=1), LockStep)  # 50: numba starts
    assert isinstance(compiled.compiled_lock_step(steps=1), LockStep)  # started: stays
    assert compiled._steps_in_numpy == 49


def test_the_steps_are_counted_over_runs_and_the_draws_do_not_change(fresh_count, monkeypatch):
    oracle = HandChain(20)
    calls = []
    real_call = LockStep.__call__

    def counted(self, *args):
        calls.append(1)
        return real_call(self, *args)

    monkeypatch.setattr(LockStep, "__call__", counted)
    runs = [sample_any_order(oracle, 4, seed=6, method="sequential") for _ in range(3)]
    # 20 and 20 steps in NumPy; the third run (60 >= 50) is compiled, step by step
    assert len(calls) == 20
    for run in runs[1:]:
        assert torch.equal(run.samples, runs[0].samples)
        assert torch.equal(run.log_prob, runs[0].log_prob)


@pytest.mark.parametrize("flag, imported", [(None, False), ("auto", False), ("1", True)])
def test_a_short_run_in_a_fresh_process_does_not_start_numba(flag, imported):
    """numba's start (about 1.5 to 2 s) is paid only where asked, or where it pays."""
    env = {k: v for k, v in os.environ.items() if k != "PYRO_AUTOSPEC_NUMBA"}
    if flag is not None:
        env["PYRO_AUTOSPEC_NUMBA"] = flag
    code = _RUN + "import sys\nprint('numba' in sys.modules)\n"
    run = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=ROOT
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[-1] == str(imported)
