"""The inputs of an oracle that does not borrow them: buffers filled again only while nothing
else holds them (:class:`~pyro_autospec.engine.host_rows.FreshInputs`)."""

import weakref

import numpy as np
import pytest
import torch

from pyro_autospec.engine import sample_any_order
from pyro_autospec.engine.host_rows import FreshInputs
from pyro_autospec.engine.modes import engine_mode, tensor_mode
from pyro_autospec.oracles import MarkovChainOracle

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
    inputs = FreshInputs(torch.from_numpy)
    values, mask = inputs.fill(*_arrays(0))
    kept = keep(values)
    seen = read(kept).clone()
    del values, mask
    again, again_mask = inputs.fill(*_arrays(1))
    assert torch.equal(again, torch.from_numpy(_arrays(1)[0]))
    assert torch.equal(read(kept), seen)  # what the oracle kept did not change
    del kept
    # nothing holds the second buffers: the third call fills them again
    buffer = inputs.buffers[0]
    del again, again_mask
    third, _ = inputs.fill(*_arrays(2))
    assert inputs.buffers[0] is buffer and torch.equal(third, torch.from_numpy(_arrays(2)[0]))


def test_buffers_are_filled_again_once_let_go_and_a_write_into_them_is_undone():
    inputs = FreshInputs(torch.from_numpy)
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
    inputs = FreshInputs(torch.from_numpy)
    inputs.fill(np.zeros((2, 3), dtype=np.int64))
    first = inputs.buffers
    inputs.fill(np.zeros((3, 3), dtype=np.int64))
    assert inputs.buffers is not first
    second = inputs.buffers
    inputs.fill(np.zeros((3, 3), dtype=np.int32))
    assert inputs.buffers is not second and inputs.tensors[0].dtype == torch.int32


def test_inputs_made_in_the_engine_mode_for_an_oracle_that_needs_ordinary_tensors():
    with engine_mode():
        made = tensor_mode(True)

        def make(array):
            with made():
                return torch.from_numpy(array)

        inputs = FreshInputs(make)
        for offset in range(3):
            values, mask = inputs.fill(*_arrays(offset))
            assert not values.is_inference() and not mask.is_inference()
            del values, mask


class CountsBuffers:
    """A ``log_marginals_at``-only Markov chain that counts the calls given the very tensors
    of an earlier call (a weak reference keeps nothing alive, so only tensors the engine
    kept can be met again)."""

    def __init__(self, n: int):
        self.chain = MarkovChainOracle(
            torch.tensor([0.5, 0.5]), torch.tensor([[0.8, 0.2], [0.3, 0.7]]), n
        )
        self.num_coords, self.num_values = n, 2
        self.seen: list = []
        self.calls = self.again = 0

    def log_marginals(self, values, mask):
        return self.chain.log_marginals(values, mask)

    def log_marginals_at(self, values, mask, targets):
        self.calls += 1
        self.again += any(ref() is values for ref in self.seen)
        self.seen.append(weakref.ref(values))
        return self.chain.log_marginals_at(values, mask, targets)


def test_the_lock_step_fills_the_same_buffers_for_an_oracle_that_keeps_nothing():
    oracle = CountsBuffers(64)
    plain = sample_any_order(oracle.chain, 32, seed=3, method="sequential")
    oracle.consistent_queries = True  # only the run's own calls
    counted = sample_any_order(oracle, 32, seed=3, method="sequential")
    assert torch.equal(counted.samples, plain.samples)
    assert oracle.calls >= 64 and oracle.again >= oracle.calls - 2


@pytest.mark.parametrize("method", ["agr24", "speculative"])
def test_the_general_loop_fills_the_buffers_of_each_call_size_again(method):
    """The windowed loop's calls vary in size: the buffers of each of the last sizes are
    filled again while unheld (that kept inputs stay as they were is
    ``tests/engine/test_errors.py``'s ``KeepsViews``)."""
    oracle = CountsBuffers(256)
    plain = sample_any_order(oracle.chain, 32, seed=3, method=method)
    oracle.consistent_queries = True
    counted = sample_any_order(oracle, 32, seed=3, method=method)
    assert torch.equal(counted.samples, plain.samples)
    assert oracle.again >= oracle.calls // 4
