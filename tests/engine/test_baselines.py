"""The baselines are exact too, and AGR24 equals the sequential Gumbel-max sampler path by path."""

import pytest
import torch

from pyro_autospec.engine import OracleError, Schedule, host_plane, sample_any_order
from pyro_autospec.engine.host_rows import HostRows
from pyro_autospec.oracles.markov import MarkovChainOracle
from pyro_autospec.oracles.tabular import TabularOracle
from tests.catalogue.targets import TARGETS
from tests.stats import assert_samples_match, state_index


@pytest.mark.parametrize("method", ["speculative", "agr24"])
@pytest.mark.parametrize("target", ["pairs_equal", "near_deterministic", "potts"])
def test_baseline_exact(method, target):
    oracle = TabularOracle(logits=TARGETS[target]())
    result = sample_any_order(oracle, 4000, seed=21, method=method)
    assert_samples_match(result.samples, oracle.log_probs, oracle.num_values)
    idx = torch.from_numpy(state_index(result.samples, oracle.num_values))
    torch.testing.assert_close(result.log_prob, oracle.log_probs.flatten()[idx], rtol=0, atol=1e-9)


@pytest.mark.parametrize("window", [1, 3, 16])
def test_speculative_windows_exact(window):
    oracle = TabularOracle(logits=TARGETS["pairs_equal"]())
    result = sample_any_order(
        oracle, 4000, seed=5, method="speculative", schedule=Schedule(window=window)
    )
    assert_samples_match(result.samples, oracle.log_probs, oracle.num_values)


@pytest.mark.parametrize("window_scale", [0.5, 1.0, 4.0])
def test_agr24_equals_sequential_gumbel_max_path_by_path(window_scale):
    stay = torch.tensor([[0.8, 0.15, 0.05], [0.1, 0.8, 0.1], [0.3, 0.3, 0.4]])
    chain = MarkovChainOracle(torch.tensor([0.2, 0.5, 0.3]), stay, 300)
    fast = sample_any_order(
        chain, 6, seed=9, method="agr24", schedule=Schedule(window_scale=window_scale)
    )
    slow = sample_any_order(chain, 6, seed=9, method="gumbel_sequential")
    assert torch.equal(fast.orders, slow.orders)
    assert torch.equal(fast.samples, slow.samples)
    torch.testing.assert_close(fast.log_prob, slow.log_prob)
    assert fast.sample_rounds.double().mean() < slow.sample_rounds.double().mean()
    assert (slow.sample_rounds == 300).all()


def test_gumbel_sequential_exact():
    oracle = TabularOracle(logits=TARGETS["potts"]())
    result = sample_any_order(oracle, 4000, seed=4, method="gumbel_sequential")
    assert_samples_match(result.samples, oracle.log_probs, oracle.num_values)


@pytest.mark.parametrize("method", ["sequential", "gumbel_sequential"])
def test_sequential_all_draws_at_once_equals_the_batched_loop(method, capsys):
    # With every draw in flight and no row cap, the sequential methods run all draws in
    # lockstep; a draw or row cap takes the general loop. Same rows, noise and arithmetic.
    stay = torch.tensor([[0.8, 0.15, 0.05], [0.1, 0.8, 0.1], [0.3, 0.3, 0.4]])
    chain = MarkovChainOracle(torch.tensor([0.2, 0.5, 0.3]), stay, 40)
    base = sample_any_order(chain, 7, seed=2, method=method, progress=True)
    assert method in capsys.readouterr().err
    assert base.rounds == 40 and base.oracle_rows == 7 * 40
    assert base.sample_rounds.tolist() == [40] * 7
    for knobs in ({"max_concurrent_draws": 3}, {"max_rows_per_round": 5}):
        other = sample_any_order(chain, 7, seed=2, method=method, schedule=knobs)
        assert torch.equal(other.samples, base.samples)
        assert torch.equal(other.log_prob, base.log_prob)
        assert other.oracle_rows == base.oracle_rows


class ScribblingOracle:
    """A protocol-only oracle (full rows) that overwrites its inputs, as an inference-safe
    oracle may (any other runs outside inference mode, where the inputs are read-only)."""

    inference_safe = True

    def __init__(self, inner):
        self.inner = inner
        self.num_coords, self.num_values = inner.num_coords, inner.num_values

    def log_marginals(self, values, mask):
        out = self.inner.log_marginals(values, mask)
        values.fill_(1)
        mask.fill_(True)
        return out


@pytest.mark.parametrize("method", ["sequential", "gumbel_sequential"])
def test_lockstep_keeps_its_samples_from_the_oracle_and_splits_calls(method):
    # The lockstep loop keeps its partial samples dense across steps: an oracle that writes
    # into its inputs must not change them, and a small memory budget splits each step into
    # several calls (rows, noise and draws unchanged).
    stay = torch.tensor([[0.8, 0.15, 0.05], [0.1, 0.8, 0.1], [0.3, 0.3, 0.4]])
    chain = MarkovChainOracle(torch.tensor([0.2, 0.5, 0.3]), stay, 30)
    base = sample_any_order(chain, 9, seed=6, method=method)
    budget = 2 * (30 + 30 * 3)  # two rows of the full-row protocol per call
    for oracle, knobs in (
        (ScribblingOracle(chain), {}),
        (ScribblingOracle(chain), {"max_elements": budget}),
        (chain, {"max_elements": budget}),
    ):
        other = sample_any_order(oracle, 9, seed=6, method=method, schedule=knobs)
        assert torch.equal(other.samples, base.samples)
        torch.testing.assert_close(other.log_prob, base.log_prob, rtol=0, atol=1e-12)
        assert other.rounds == 30 and other.oracle_rows == 9 * 30


@pytest.mark.parametrize("method", ["autospec", "speculative", "agr24", "sequential"])
def test_upload_path_gives_the_same_draws(method, monkeypatch):
    """The token methods' round either reads the host's partial samples in place (a CPU) or
    uploads the rows of the draws that ask (another device); both give the same run. The
    upload path runs here on a CPU, with continuous batching and a cap so that rounds hold
    some lanes only."""

    chain = MarkovChainOracle(torch.tensor([0.5, 0.5]), torch.tensor([[0.9, 0.1], [0.3, 0.7]]), 40)
    knobs = {"max_concurrent_draws": 5, "max_rows_per_round": 23}
    in_place = sample_any_order(chain, 12, seed=3, method=method, schedule=knobs)
    monkeypatch.setattr(HostRows, "zero_copy", False)
    uploaded = sample_any_order(chain, 12, seed=3, method=method, schedule=knobs)
    assert torch.equal(in_place.samples, uploaded.samples)
    assert torch.equal(in_place.log_prob, uploaded.log_prob)
    assert in_place.rounds == uploaded.rounds and in_place.oracle_rows == uploaded.oracle_rows


@pytest.mark.parametrize(
    "method, knobs, same_as",
    [
        ("sequential", {}, "sequential"),
        ("gumbel_sequential", {}, "gumbel_sequential"),
        ("autospec", {"max_block": 1}, "sequential"),
        ("speculative", {"window": 1}, "sequential"),
        ("agr24", {"window_scale": 0.01}, "gumbel_sequential"),
    ],
)
def test_windows_of_one_coordinate_run_in_lock_step_with_the_same_draws(
    method, knobs, same_as, monkeypatch
):
    """Every method whose windows are all one coordinate runs on the lock-step path when all
    its draws are in flight, and draws there what the general loop draws (a draw in flight
    fewer forces the general loop): for ``"agr24"`` the sequential Gumbel-max sampler's."""
    steps = []
    counted = host_plane._Lockstep._counted  # every lock step, on the host or the device
    monkeypatch.setattr(
        host_plane._Lockstep, "_counted", lambda self: steps.append(type(self)) or counted(self)
    )
    stay = torch.tensor([[0.8, 0.15, 0.05], [0.1, 0.8, 0.1], [0.3, 0.3, 0.4]])
    chain = MarkovChainOracle(torch.tensor([0.2, 0.5, 0.3]), stay, 40)
    lock = sample_any_order(chain, 6, seed=9, method=method, schedule=knobs)
    assert len(steps) == 40 and lock.rounds == 40
    general = sample_any_order(
        chain, 6, seed=9, method=method, schedule={**knobs, "max_concurrent_draws": 5}
    )
    assert len(steps) == 40  # the general loop took no lock step
    reference = sample_any_order(
        chain, 6, seed=9, method=same_as, schedule=Schedule(max_concurrent_draws=5)
    )
    assert torch.equal(lock.samples, general.samples)
    assert torch.equal(lock.samples, reference.samples)
    torch.testing.assert_close(lock.log_prob, general.log_prob, rtol=0, atol=1e-12)
    assert set(steps) == {host_plane._HostLockstep}  # a CPU: the host's frames
    # the device's lock step (dense tensors, the oracle's inputs uploaded), run on a CPU
    monkeypatch.setattr(HostRows, "zero_copy", False)
    uploaded = sample_any_order(chain, 6, seed=9, method=method, schedule=knobs)
    assert steps[40:] == [host_plane._Lockstep] * 40
    assert torch.equal(uploaded.samples, lock.samples)
    assert torch.equal(uploaded.log_prob, lock.log_prob)


class Borrows:
    """A Markov chain that borrows its inputs (unless ``borrows`` is False):
    ``log_marginals_at`` (``targeted``) or only ``log_marginals``. It records the tensors it is
    handed and how many coordinates each call pins; ``writes`` makes it break the promise by
    writing into its inputs."""

    def __init__(self, chain, targeted: bool, writes: bool = False, borrows: bool = True):
        self.chain, self.writes, self.borrows_inputs = chain, writes, borrows
        self.num_coords, self.num_values = chain.num_coords, chain.num_values
        self.tensors, self.pinned = set(), []
        if targeted:
            self.log_marginals_at = self._at

    def _seen(self, values, mask):
        self.tensors.add((values.data_ptr(), mask.data_ptr()))
        self.pinned.append(mask.sum(1).unique().tolist())
        if self.writes:
            values[:, 0] = 0

    def log_marginals(self, values, mask):
        self._seen(values, mask)
        return self.chain.log_marginals(values, mask)

    def _at(self, values, mask, targets):
        self._seen(values, mask)
        return self.chain.log_marginals_at(values, mask, targets)


@pytest.mark.parametrize("targeted", [True, False])
def test_an_oracle_that_borrows_its_inputs_gets_the_same_ones_updated_in_place(
    targeted, monkeypatch
):
    """In lock step, an oracle that borrows its inputs is handed the same tensors at every step,
    with the coordinates drawn since written into them (so step ``t`` pins ``t`` coordinates
    of every draw); the draws are those of fresh inputs, also when a step takes several calls,
    on the host's arrays and on the device's dense tensors."""
    stay = torch.tensor([[0.8, 0.15, 0.05], [0.1, 0.8, 0.1], [0.3, 0.3, 0.4]])
    chain = MarkovChainOracle(torch.tensor([0.2, 0.5, 0.3]), stay, 40)
    fresh = sample_any_order(
        Borrows(chain, targeted, borrows=False), 6, seed=9, method="sequential"
    )
    oracle = Borrows(chain, targeted)
    monkeypatch.setattr(Borrows, "consistent_queries", True, raising=False)  # calls: steps only
    borrowed = sample_any_order(oracle, 6, seed=9, method="sequential")
    assert len(oracle.tensors) == 1 and oracle.pinned == [[t] for t in range(40)]
    assert torch.equal(borrowed.samples, fresh.samples)
    assert torch.equal(borrowed.log_prob, fresh.log_prob)
    # a budget of two draws' rows per call: 3 calls a step, each with its own rows of the inputs
    steps = []
    counted = host_plane._Lockstep._counted
    monkeypatch.setattr(
        host_plane._Lockstep,
        "_counted",
        lambda self: steps.append(getattr(self, "borrowed", None)) or counted(self),
    )
    budget = 2 * (40 + (1 if targeted else 40) * 3)  # two rows' inputs and outputs
    split = Borrows(chain, targeted)
    chunked = sample_any_order(
        split, 6, seed=9, method="sequential", schedule=Schedule(max_elements=budget)
    )
    assert steps == [True] * 40 and len(split.tensors) == 3
    assert torch.equal(chunked.samples, fresh.samples)
    # the device's lock step (dense tensors, run on a CPU) hands views of its own tensors
    monkeypatch.setattr(HostRows, "zero_copy", False)
    on_device = Borrows(chain, targeted)
    dense = sample_any_order(on_device, 6, seed=9, method="sequential")
    assert len(on_device.tensors) == 1 and on_device.pinned == [[t] for t in range(40)]
    assert torch.equal(dense.samples, fresh.samples)


def test_an_oracle_that_writes_into_borrowed_inputs_is_told_so():
    """Borrowed inputs are read-only like fresh ones: an oracle run outside inference mode
    that writes into them raises the engine's error (an inference-safe oracle must not), in
    either grad mode (borrowed inputs are never copied for the oracle)."""
    chain = MarkovChainOracle(torch.tensor([0.5, 0.5]), torch.tensor([[0.8, 0.2], [0.3, 0.7]]), 8)
    for grad in (False, True):
        with torch.set_grad_enabled(grad), pytest.raises(OracleError, match="wrote in place"):
            sample_any_order(Borrows(chain, True, writes=True), 4, seed=0, method="sequential")


class SafeBorrows(Borrows):
    inference_safe = True  # as every subclass of ExactOracle


class WritesThroughNumPy(Borrows):
    """Not inference-safe, so called out of inference mode, where PyTorch refuses a torch
    operation's write into an inference tensor, but not one through NumPy."""

    def _seen(self, values, mask):
        mask.numpy()[:] = False


def test_a_write_through_numpy_into_borrowed_inputs_is_refused():
    """An outside test: a plain oracle (not inference-safe) that borrows its inputs and wrote
    into them through NumPy was never refused, and lock step sampled another law."""
    chain = MarkovChainOracle(torch.tensor([0.5, 0.5]), torch.tensor([[0.8, 0.2], [0.3, 0.7]]), 8)
    for method in ("sequential", "autospec"):
        with pytest.raises(OracleError, match="wrote into the inputs it borrows"):
            sample_any_order(WritesThroughNumPy(chain, True), 20, seed=0, method=method)


class ZeroesItsMask(SafeBorrows):
    """Clears its mask after reading it (changes nothing where nothing is pinned yet)."""

    def _seen(self, values, mask):
        mask.zero_()


@pytest.mark.parametrize("method", ["sequential", "autospec", "agr24"])
@pytest.mark.parametrize("engine", ["fast", "reference"])
def test_an_inference_safe_oracle_that_writes_into_borrowed_inputs_is_refused(method, engine):
    """An outside test: in inference mode PyTorch lets an oracle write into the engine's
    inputs, so an oracle both inference-safe and borrowing (an ExactOracle subclass that
    scribbled on its mask) sampled another law silently in lock step. Its first calls now
    compare their inputs with a copy; one that leaves them alone samples as before."""
    chain = MarkovChainOracle(torch.tensor([0.5, 0.5]), torch.tensor([[0.8, 0.2], [0.3, 0.7]]), 8)
    with pytest.raises(OracleError, match="wrote into the inputs it borrows"):
        sample_any_order(
            SafeBorrows(chain, True, writes=True), 20, seed=0, method=method, engine=engine
        )
    kept = sample_any_order(SafeBorrows(chain, True), 20, seed=0, method=method, engine=engine)
    if method == "sequential":  # a write that changes nothing in the first step's many calls
        with pytest.raises(OracleError, match="wrote into the inputs it borrows"):
            sample_any_order(  # one row per call: 64 calls see the first step's empty mask
                ZeroesItsMask(chain, True),
                64,
                seed=0,
                method=method,
                schedule=Schedule(max_elements=10),
            )
    plain = sample_any_order(Borrows(chain, True), 20, seed=0, method=method, engine=engine)
    assert torch.equal(kept.samples, plain.samples)
