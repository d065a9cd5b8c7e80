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
from pyro_autospec.engine.protocols import is_inference_safe

__all__ = ["calling", "engine_mode", "ordinary"]

#: Decorator and context manager for the engine's own loops.
engine_mode = torch.inference_mode


@contextlib.contextmanager
def _foreign(grad_enabled: bool) -> Iterator[None]:
    with torch.inference_mode(False), torch.set_grad_enabled(grad_enabled):
        try:
            yield
        except RuntimeError as error:
            if "requires_grad=True on inference tensor" in str(error):
                raise OracleError(
                    "The oracle (or drift) set requires_grad on a tensor created under "
                    "inference mode: usually one of its inputs (values, mask, or a time or "
                    "state), which are read-only. To differentiate with respect to an input, "
                    "differentiate a copy: x = x.clone().requires_grad_() (under "
                    "torch.enable_grad() if the sampler is called with grad off)."
                ) from error
            if "Inplace update to inference tensor" not in str(error):
                raise
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
    return lambda: _foreign(grad_enabled)


def ordinary(tensor: torch.Tensor | None) -> torch.Tensor | None:
    """``tensor``, copied into an ordinary tensor if it is an inference tensor (also when the
    caller is in inference mode: the copy is made outside it)."""
    if tensor is not None and tensor.is_inference():
        with torch.inference_mode(False):
            return tensor.clone()
    return tensor
