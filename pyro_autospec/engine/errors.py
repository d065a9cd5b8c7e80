"""Errors raised when an oracle or an input would make a sample silently wrong."""

from __future__ import annotations

import types

import torch

__all__ = ["OracleError", "check_eval_mode"]


class OracleError(ValueError):
    """An oracle returned something the exact sampler cannot use.

    Raised for rows conditioned on a possible assignment that contain NaN or ``+inf``, that do
    not sum to one, or that give zero mass to every value; for outputs of the wrong shape or
    dtype; for oracles whose ``num_coords`` / ``num_values`` / ``dim`` disagree with what
    they return; and, before sampling, for an oracle that answers with a network in training
    mode with dropout or batch norm (:func:`check_eval_mode`). The message names the row (or
    the layer) and the usual fix.
    """


def _networks(oracle: object) -> dict[str, torch.nn.Module]:
    """The :class:`torch.nn.Module` s an oracle answers with, by name: the oracle itself, its
    attributes, the object of a bound method, and the variables (closed over or global) a
    plain function reads."""
    candidates: list[tuple[str, object]] = [("oracle", oracle)]
    if isinstance(oracle, types.MethodType):  # e.g. net.forward
        candidates.append(("oracle.__self__", oracle.__self__))
    if isinstance(oracle, types.FunctionType):
        code = oracle.__code__
        cells = zip(code.co_freevars, oracle.__closure__ or ())
        candidates += [(name, cell.cell_contents) for name, cell in cells if _full(cell)]
        scope = oracle.__globals__
        candidates += [(name, scope[name]) for name in code.co_names if name in scope]
    else:
        try:  # not through a __getattr__ the oracle may define
            attributes = dict(object.__getattribute__(oracle, "__dict__"))
        except AttributeError:  # __slots__
            attributes = {}
        candidates += [(f"oracle.{k}", v) for k, v in attributes.items()]
    found: dict[str, torch.nn.Module] = {}
    for name, value in candidates:
        if isinstance(value, torch.nn.Module) and all(value is not m for m in found.values()):
            found[name] = value
    return found


def _full(cell) -> bool:
    try:
        cell.cell_contents  # noqa: B018 (raises on an empty cell)
    except ValueError:
        return False
    return True


def _random_in_training(layer: torch.nn.Module) -> bool:
    """Whether ``layer`` answers at random (dropout) or from its batch (batch norm) when in
    training mode."""
    if isinstance(layer, torch.nn.modules.dropout._DropoutNd):
        return layer.p > 0
    if isinstance(layer, torch.nn.modules.batchnorm._BatchNorm):
        return True
    rate = getattr(layer, "dropout", 0.0)  # MultiheadAttention, RNN, LSTM, GRU
    return isinstance(rate, float) and rate > 0


def check_eval_mode(oracle: object) -> None:
    """Raise if a network the oracle answers with is in training mode with a layer that makes
    its answers random (dropout) or dependent on the batch (batch norm).

    Such an oracle gives a different conditional each time it is asked the same question, so
    no sampler can be exact for it: the engine asks a row several times (draft, verification)
    and in batches of varying composition. The fix is ``net.eval()`` before sampling. Modules
    are found on the oracle itself, its attributes, the object of a bound method and the
    variables (closed over or global) a function reads.

    Raises
    ------
    OracleError
        Naming the first such layer.

    Examples
    --------
    >>> net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.1))
    >>> check_eval_mode(lambda t, x: net(x))
    Traceback (most recent call last):
    ...
    pyro_autospec.engine.errors.OracleError: net[1] (Dropout) is in training mode: ...
    >>> _ = net.eval()
    >>> check_eval_mode(lambda t, x: net(x))
    """
    for name, network in _networks(oracle).items():
        for path, layer in network.named_modules():
            if layer.training and _random_in_training(layer):
                parts = [p for p in path.split(".") if p]
                where = name + "".join(f"[{p}]" if p.isdigit() else f".{p}" for p in parts)
                raise OracleError(
                    f"{where} ({type(layer).__name__}) is in training mode: its answers are "
                    "random or depend on the batch, so no sampler can be exact for this "
                    f"oracle; call {name}.eval() before sampling"
                )
