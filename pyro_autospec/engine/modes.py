"""The engine's PyTorch modes: its own work under inference mode, foreign code outside it.

The engine's bookkeeping is thousands of small tensor operations per round, and on a CPU each
costs a few microseconds of dispatch whatever its arithmetic. Under
:func:`torch.inference_mode` PyTorch skips autograd and version counting, which takes about a
fifth off that cost. But a tensor created there is an *inference tensor*: it can never be
written in place, or saved for backward, outside inference mode. So code the engine does not
own (an oracle, a drift) runs with inference mode off, unless it declares itself
``inference_safe`` (:func:`~pyro_autospec.engine.protocols.is_inference_safe`), and the samplers
hand back ordinary tensors (:func:`ordinary`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from pyro_autospec.engine.errors import OracleError
from pyro_autospec.engine.protocols import borrows_inputs, is_inference_safe

__all__ = [
    "BorrowedInputsCheck",
    "calling",
    "engine_mode",
    "foreign_inputs",
    "ordinary",
    "tensor_mode",
]

#: Decorator and context manager for the engine's own loops.
engine_mode = torch.inference_mode


class _Foreign:
    """The mode of one foreign call: inference mode off, grad mode ``grad_enabled``; a
    ``RuntimeError`` of PyTorch's about inference tensors becomes an :class:`OracleError`
    that says what the oracle did. A class rather than a generator, with PyTorch's own mode
    guards: it wraps every oracle call, and a generator's context costs several times more.
    """

    __slots__ = ("grad_enabled", "_inference", "_grad_before")

    def __init__(self, grad_enabled: bool):
        self.grad_enabled = grad_enabled

    def __enter__(self) -> None:
        # what torch.inference_mode(False) and torch.set_grad_enabled do, without their
        # Python wrappers
        self._inference = torch._C._InferenceMode(False)
        self._inference.__enter__()
        self._grad_before = torch.is_grad_enabled()
        torch._C._set_grad_enabled(self.grad_enabled)

    def __exit__(self, kind, error, trace) -> bool:
        torch._C._set_grad_enabled(self._grad_before)
        self._inference.__exit__(kind, error, trace)
        if isinstance(error, RuntimeError):
            _explain(error)
        return False


def _explain(error: RuntimeError) -> None:
    """Raise an :class:`OracleError` that says what a foreign call did, where PyTorch's
    ``error`` is about inference tensors; else return."""
    if "requires_grad=True on inference tensor" in str(error):
        raise OracleError(
            "The oracle (or drift) set requires_grad on a tensor created under "
            "inference mode: usually one of its inputs (values, mask, or a time or "
            "state), which are read-only. To differentiate with respect to an input, "
            "differentiate a copy: x = x.clone().requires_grad_() (under "
            "torch.enable_grad() if the sampler is called with grad off)."
        ) from error
    if "Inference tensors cannot be saved for backward" in str(error):
        raise OracleError(
            "The oracle (or drift) used a tensor created under inference mode in "
            "computation that autograd records (it is called in the grad mode of the "
            "sampler's caller): a tensor of its own made inside "
            "torch.inference_mode(), or an input of an oracle that declares "
            "borrows_inputs (borrowed inputs are the engine's inference tensors; an "
            "oracle whose autograd saves its inputs must not declare it). Make it "
            "outside inference mode, or call the sampler under torch.no_grad() if the "
            "oracle needs no gradients."
        ) from error
    if "Inplace update to inference tensor" in str(error):
        raise OracleError(
            "The oracle (or drift) wrote in place into a tensor created under inference "
            "mode: usually one the engine gave it (values, mask, targets, chain, or a time "
            "or state), which are read-only, as other rows of the round may share them; or "
            "one the oracle itself made inside torch.inference_mode(). Copy before writing "
            "(values = values.clone()), or use an out-of-place operation "
            "(torch.where(mask, values, 0) in place of values[~mask] = 0)."
        ) from error


def calling(oracle: object, grad_enabled: bool = False, inference_safe: bool | None = None):
    """The context in which the engine calls ``oracle`` (or a drift).

    Parameters
    ----------
    oracle : object
        What is called.
    grad_enabled : bool
        The grad mode of a foreign call: the one of the sampler's caller, for an oracle that
        differentiates internally.
    inference_safe : bool, optional
        Whether ``oracle`` is inference-safe, as a run already read it
        (:class:`~pyro_autospec.engine.protocols.Capabilities`); read from ``oracle`` if
        ``None``.

    Returns
    -------
    A context manager factory: ``with calling(oracle, g)(): ...``. An inference-safe oracle
    stays in the engine's mode; any other runs with inference mode off.

    Examples
    --------
    >>> import torch
    >>> class Plain:
    ...     pass
    >>> with engine_mode(), calling(Plain())():
    ...     torch.is_inference_mode_enabled()
    False
    """
    if is_inference_safe(oracle) if inference_safe is None else inference_safe:
        return contextlib.nullcontext
    return lambda: _Foreign(grad_enabled)


class BorrowedInputsCheck:
    """The context of an oracle's calls, with a check that an oracle that borrows its inputs
    leaves them as they were.

    Outside inference mode a write into the engine's inputs (inference tensors) by a torch
    operation raises, and :func:`calling` turns that into an :class:`OracleError`. In
    inference mode (an ``inference_safe`` oracle, every subclass of ``ExactOracle`` among them,
    or an oracle's own ``torch.inference_mode()`` block) PyTorch allows it, and nothing stops a
    write through NumPy (``values.numpy()[...] = 0``): an oracle that borrows its inputs would
    change tensors the engine reads again, and the draws would follow another law. So some of
    its calls compare their inputs with a copy
    made before the call: the first :attr:`FIRST` of a run, then every call whose number is a
    power of two (a sample of the calls spread over the run, about ``log2`` of their number,
    as the consistency check is a sample of questions: a write on every call, or on most, is
    caught, also one that changes nothing in the first calls, as zeroing a mask that holds no
    pin yet).

    Parameters
    ----------
    context : callable
        ``calling(oracle, ...)``: the context of one call.
    checked : bool
        Whether the oracle borrows its inputs.

    Examples
    --------
    >>> import contextlib, torch
    >>> check = BorrowedInputsCheck(contextlib.nullcontext, checked=True)
    >>> values, mask = torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 2, dtype=torch.bool)
    >>> with check(values, mask):
    ...     values.add_(1)
    Traceback (most recent call last):
    ...
    pyro_autospec.engine.errors.OracleError: The oracle wrote into the inputs it borrows ...
    """

    #: The first calls of a run whose inputs are all compared with a copy.
    FIRST = 4

    def __init__(self, context, checked: bool):
        self.context = context
        self.checked = checked
        self.calls = 0

    def __call__(self, values: torch.Tensor, mask: torch.Tensor):
        """The context of one call on ``values`` and ``mask`` (the inputs the engine may hand
        again; its other inputs are made for each call): the plain context where the call is
        not compared."""
        number, self.calls = self.calls, self.calls + 1
        if not self.checked or (number >= self.FIRST and number & (number - 1)):
            return self.context()
        return self._compared(values, mask)

    @contextlib.contextmanager
    def _compared(self, values: torch.Tensor, mask: torch.Tensor) -> Iterator[None]:
        copies = values.clone(), mask.clone()
        with self.context():
            yield
        if not (torch.equal(copies[0], values) and torch.equal(copies[1], mask)):
            raise OracleError(
                "The oracle wrote into the inputs it borrows (borrows_inputs = True; every "
                "subclass of ExactOracle inherits it), which it promises only to read: the "
                "engine may hand successive calls, or other rows of a round, the same values "
                "and mask and read them again, so the draws would follow another law. "
                "Copy before writing (values = values.clone()), use an out-of-place operation "
                "(torch.where(mask, values, 0) in place of values[~mask] = 0), or set the class "
                "attribute borrows_inputs = False."
            )


def ordinary(tensor: torch.Tensor | None) -> torch.Tensor | None:
    """``tensor``, copied into an ordinary tensor if it is an inference tensor (also when the
    caller is in inference mode: the copy is made outside it)."""
    if tensor is not None and tensor.is_inference():
        with torch.inference_mode(False):
            return tensor.clone()
    return tensor


def foreign_inputs(
    oracle: object,
    grad_enabled: bool,
    inference_safe: bool | None = None,
    borrows: bool | None = None,
) -> bool:
    """Whether ``oracle`` must get ordinary tensors as inputs: it runs out of inference mode
    with grad enabled (:func:`calling`), where autograd may save its inputs for backward (an
    embedding of the values, a linear layer on a drift's state), which PyTorch refuses for an
    inference tensor. The engine then makes those inputs outside inference mode, or copies
    them (:func:`ordinary`). An oracle that borrows its inputs
    (:func:`~pyro_autospec.engine.protocols.borrows_inputs`) only reads them: it gets the
    engine's own, never copies.

    Examples
    --------
    >>> class Plain:
    ...     pass
    >>> foreign_inputs(Plain(), True), foreign_inputs(Plain(), False)
    (True, False)
    """
    safe = is_inference_safe(oracle) if inference_safe is None else inference_safe
    borrows = borrows_inputs(oracle) if borrows is None else borrows
    return bool(grad_enabled) and not safe and not borrows


def tensor_mode(ordinary_inputs: bool):
    """The context in which the engine makes an oracle's inputs from host arrays: out of
    inference mode where the oracle needs ordinary tensors (:func:`foreign_inputs`), so that
    ``torch.from_numpy`` gives one without a copy; else a no-op.

    Examples
    --------
    >>> import numpy as np
    >>> with engine_mode(), tensor_mode(True)():
    ...     torch.from_numpy(np.zeros(2)).is_inference()
    False
    """
    return (lambda: torch.inference_mode(False)) if ordinary_inputs else contextlib.nullcontext
