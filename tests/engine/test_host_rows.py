"""The inputs of an oracle that does not borrow them: new tensors every call, over buffers
filled again only where nothing is left of the last call's tensors
(:class:`~pyro_autospec.engine.host_rows.FreshInputs`)."""

import weakref

import numpy as np
import pytest
import torch

from pyro_autospec.engine import sample_any_order
from pyro_autospec.engine.host_rows import FreshInputs
from pyro_autospec.engine.modes import engine_mode, tensor_mode
from pyro_autospec.oracles import MarkovChainOracle


def from_numpy(*arrays):
    return tuple(torch.from_numpy(array) for array in arrays)


#: Ways an oracle may keep something of its inputs, and how to read the values it kept: each
#: must keep the buffer from being filled again.
KEEPERS = {
    "the tensor": (lambda t: t, lambda kept: kept),
    "a view": (lambda t: t[:, :2], lambda kept: kept),
    "a NumPy array of it": (lambda t: t.numpy(), torch.from_numpy),
    "its storage": (
        lambda t: t.untyped_storage(),
        lambda kept: torch.empty(0, dtype=torch.long).set_(kept, 0, (3, 4)),
    ),
    "its .data": (lambda t: t.data, lambda kept: kept),
    "a detached tensor": (lambda t: t.detach(), lambda kept: kept),
    "a graph that saved it": (
        lambda t: torch.nn.functional.embedding(t, torch.ones(8, 2, requires_grad=True)),
        lambda kept: kept.grad_fn._saved_indices,
    ),
}


def _arrays(offset: int) -> tuple[np.ndarray, np.ndarray]:
    values = (np.arange(12).reshape(3, 4) + offset) % 8
    return values, values % 2 == 0


@pytest.mark.parametrize("keeper", list(KEEPERS))
def test_a_buffer_something_still_holds_is_never_written_again(keeper):
    keep, read = KEEPERS[keeper]
    inputs = FreshInputs(from_numpy)
    values, mask = inputs.fill(*_arrays(0))
    kept = keep(values)
    seen = read(kept).clone()
    del values, mask
    again, again_mask = inputs.fill(*_arrays(1))
    assert torch.equal(again, torch.from_numpy(_arrays(1)[0]))
    assert torch.equal(read(kept), seen)  # what the oracle kept did not change
    del kept
    # nothing holds the second buffers: the third call fills them again
    buffers = inputs.buffers  # the tuple: no more references to the arrays
    del again, again_mask
    third, _ = inputs.fill(*_arrays(2))
    assert inputs.buffers is buffers and torch.equal(third, torch.from_numpy(_arrays(2)[0]))


@pytest.mark.parametrize("storage", [False, True])
def test_a_weak_reference_to_an_input_never_meets_the_next_call(storage):
    """A memo of the last call on weak references meets only tensors with their values."""
    inputs = FreshInputs(from_numpy)
    values, mask = inputs.fill(*_arrays(0))
    ref = weakref.ref(values.untyped_storage() if storage else values)
    del values, mask
    again, _ = inputs.fill(*_arrays(1))
    assert ref() is None  # the last call's tensor (and storage) are gone: nothing to meet


def _pickled_for_another_process(tensor):
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing  # noqa: F401  (registers the reductions that share memory)

    ForkingPickler.dumps(tensor)


class _Subclass(torch.Tensor):
    pass


#: Ways an oracle may move or replace the memory its input reads, or change the tensor object,
#: keeping no reference: the next call must get a new tensor with nothing of the old one.
MOVERS = {
    "share_memory_": lambda t: t.share_memory_(),
    "pickled for another process": _pickled_for_another_process,
    ".data =": lambda t: setattr(t, "data", t.clone()),
    "set_": lambda t: t.set_(t.clone()),
    "an attribute set on it": lambda t: setattr(t, "memo", 1),
    "its class changed": lambda t: setattr(t, "__class__", _Subclass),
    "a .grad set on it": lambda t: setattr(t, "grad", torch.zeros_like(t)),
}


@pytest.mark.parametrize("mover", list(MOVERS))
def test_the_next_call_gets_a_new_tensor_with_nothing_of_one_the_oracle_moved_or_marked(mover):
    inputs = FreshInputs(from_numpy)
    values, mask = inputs.fill(*_arrays(0))
    MOVERS[mover](values)
    del values, mask
    again, _ = inputs.fill(*_arrays(1))
    assert torch.equal(again, torch.from_numpy(_arrays(1)[0]))
    assert type(again) is torch.Tensor and not again.__dict__ and again.grad is None


class Shares:
    """A Markov chain whose calls move their inputs to shared memory (as handing them to
    worker processes does), keeping no reference to them."""

    def __init__(self, chain):
        self.chain, self.num_coords, self.num_values = chain, chain.num_coords, 2

    def log_marginals(self, values, mask):
        values.share_memory_()
        mask.share_memory_()
        return self.chain.log_marginals(values, mask)


def test_buffers_are_filled_again_once_let_go_and_a_write_into_them_is_undone():
    inputs = FreshInputs(from_numpy)
    values, mask = inputs.fill(*_arrays(0))
    values.fill_(7)  # an oracle writing into its inputs
    mask.numpy()[:] = True  # through NumPy, with no trace in the tensor's version
    buffers = inputs.buffers
    del values, mask
    values, mask = inputs.fill(*_arrays(0))
    assert inputs.buffers is buffers
    assert torch.equal(values, torch.from_numpy(_arrays(0)[0]))
    assert torch.equal(mask, torch.from_numpy(_arrays(0)[1]))


def test_other_shapes_or_dtypes_get_new_buffers():
    inputs = FreshInputs(from_numpy)
    inputs.fill(np.zeros((2, 3), dtype=np.int64))
    first = inputs.buffers
    inputs.fill(np.zeros((3, 3), dtype=np.int64))
    assert inputs.buffers is not first
    second = inputs.buffers
    inputs.fill(np.zeros((3, 3), dtype=np.int32))
    assert inputs.buffers is not second and inputs.tensors()[0].dtype == torch.int32


def test_inputs_made_in_the_engine_mode_for_an_oracle_that_needs_ordinary_tensors():
    with engine_mode():
        made = tensor_mode(True)

        def make(*arrays):
            with made():
                return from_numpy(*arrays)

        inputs = FreshInputs(make)
        for offset in range(3):
            values, mask = inputs.fill(*_arrays(offset))
            assert not values.is_inference() and not mask.is_inference()
            del values, mask


class Counted:
    """A ``log_marginals_at``-only Markov chain (keeps nothing of its inputs)."""

    consistent_queries = True  # only the run's own calls

    def __init__(self, n: int):
        self.chain = MarkovChainOracle(
            torch.tensor([0.5, 0.5]), torch.tensor([[0.8, 0.2], [0.3, 0.7]]), n
        )
        self.num_coords, self.num_values = n, 2
        self.calls = 0

    def log_marginals(self, values, mask):
        return self.chain.log_marginals(values, mask)

    def log_marginals_at(self, values, mask, targets):
        self.calls += 1
        return self.chain.log_marginals_at(values, mask, targets)


@pytest.fixture
def fills(monkeypatch):
    """How many times buffers were filled again (the oracle holding nothing to count them:
    even a weak reference to its inputs keeps them from being filled again)."""
    counted = {"again": 0}
    unheld = FreshInputs._unheld

    def counting(self, specs):
        again = unheld(self, specs)
        counted["again"] += again
        return again

    monkeypatch.setattr(FreshInputs, "_unheld", counting)
    return counted


def test_the_lock_step_fills_the_same_buffers_for_an_oracle_that_keeps_nothing(fills):
    oracle = Counted(64)
    plain = sample_any_order(oracle.chain, 32, seed=3, method="sequential")
    counted = sample_any_order(oracle, 32, seed=3, method="sequential")
    assert torch.equal(counted.samples, plain.samples)
    assert oracle.calls >= 64 and fills["again"] >= oracle.calls - 2


@pytest.mark.parametrize("method", ["agr24", "speculative"])
def test_the_general_loop_fills_the_buffers_of_each_call_size_again(method, fills):
    """The windowed loop's calls vary in size: the buffers of each of the last sizes are
    filled again while unheld (that kept inputs stay as they were is
    ``tests/engine/test_errors.py``'s ``KeepsViews``)."""
    oracle = Counted(256)
    plain = sample_any_order(oracle.chain, 32, seed=3, method=method)
    counted = sample_any_order(oracle, 32, seed=3, method=method)
    assert torch.equal(counted.samples, plain.samples)
    assert fills["again"] >= oracle.calls // 4


class WeakLastCall:
    """A memo of the last call that holds its inputs only weakly (an outside reviewer's)."""

    def __init__(self, chain):
        self.chain, self.num_coords, self.num_values = chain, chain.num_coords, 2
        self.ref, self.out = None, None

    def log_marginals(self, values, mask):
        if self.ref is not None and self.ref[0]() is values and self.ref[1]() is mask:
            return self.out
        self.ref = (weakref.ref(values), weakref.ref(mask))
        self.out = self.chain.log_marginals(values, mask)
        return self.out


class AttributeMemo:
    """A memo of the answer set on the input tensor itself (an outside reviewer's)."""

    def __init__(self, chain):
        self.chain, self.num_coords, self.num_values = chain, chain.num_coords, 2

    def log_marginals(self, values, mask):
        out = values.__dict__.get("memo")
        if out is None:
            out = values.memo = self.chain.log_marginals(values, mask)
        return out


@pytest.mark.parametrize("method", ["sequential", "agr24"])
@pytest.mark.parametrize("oracle", [Shares, WeakLastCall, AttributeMemo])
def test_oracles_that_move_or_mark_their_inputs_get_the_same_draws(oracle, method):
    """Outside reviewers' oracles, each of which saw another call's inputs when the engine
    handed the same tensor objects again."""
    chain = MarkovChainOracle(torch.tensor([0.5, 0.5]), torch.tensor([[0.8, 0.2], [0.3, 0.7]]), 24)
    plain = sample_any_order(chain, 32, seed=5, method=method)
    theirs = sample_any_order(oracle(chain), 32, seed=5, method=method, schedule=plain.schedule)
    assert torch.equal(theirs.samples, plain.samples)
