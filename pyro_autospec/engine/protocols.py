"""The engine's contract: the protocols through which it talks to a distribution.

The engine never imports Pyro, nor any package of this library above the ground floor
(``parallel`` and ``_warnings``; :doc:`/architecture`). A distribution reaches
the sampler through one of two small protocols, in the spirit of BlackJAX's ``logdensity_fn``:

* :class:`MarginalOracle` for distributions over ``[q]^n`` (any-order autoregressive setting):
  conditional marginals ``mu(X_i = v | X_S = x_S)``.
* :class:`MeanOracle` for distributions over ``R^d`` (diffusion setting): the conditional mean
  ``f(t, x) = E[Y | t Y + B_t = x]``.

One call of either is one *round*; each row of the batch is one *row* of work.

A marginal oracle may offer more than ``log_marginals``. Each optional capability is a named
protocol here (:class:`TargetedMarginals`, :class:`ChainMarginals`, :class:`ChainThenMarginals`,
:class:`FamilyOfTargets`, :class:`InferenceSafe`, :class:`ConsistentQueries`,
:class:`BorrowsInputs`) with one check (:func:`has_targeted_marginals`,
:func:`has_chain_marginals`, :func:`has_chain_then`, :func:`oracle_num_draws`,
:func:`is_inference_safe`, :func:`declares_consistent_queries`, :func:`borrows_inputs`).
The engine reads them all once, when a run starts, into one :class:`Capabilities` record that
the run's checks, its schedule and its rows share, and asks only for what the oracle offers.
The checks read the attribute (``getattr``), so an oracle that forwards methods through
``__getattr__`` (a wrapper) is seen as offering them.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

__all__ = [
    "BorrowsInputs",
    "Capabilities",
    "ChainMarginals",
    "ChainThenMarginals",
    "ConsistentQueries",
    "FamilyOfTargets",
    "InferenceSafe",
    "MarginalOracle",
    "MeanOracle",
    "TargetedMarginals",
    "borrows_inputs",
    "chain_rows",
    "declares_consistent_queries",
    "has_chain_marginals",
    "has_chain_then",
    "has_targeted_marginals",
    "is_inference_safe",
    "oracle_num_draws",
]


@runtime_checkable
class MarginalOracle(Protocol):
    """Conditional marginals of a distribution ``mu`` on ``[q]^n``.

    Attributes
    ----------
    num_coords : int
        ``n``, the number of coordinates (discrete sites).
    num_values : int
        ``q``, the largest support size. Coordinates with a smaller support return ``-inf``
        for the values outside it.

    Methods
    -------
    log_marginals(values, mask)
        ``values``: LongTensor[B, n]; ``mask``: BoolTensor[B, n] (True where pinned).
        Returns a float Tensor[B, n, q] with ``log mu(X_i = v | X_S = values_S)`` for every
        coordinate ``i``, where ``S = mask[b]``. Rows of pinned coordinates are ignored by
        the engine; values at unpinned positions must be ignored by the oracle.

    An oracle may also define ``log_marginals_at(values, mask, targets)`` with ``targets``
    a LongTensor[B, k] of coordinate indices, returning Tensor[B, k, q] for just those
    coordinates. The engine then never materialises ``[B, n, q]``. Entries of ``targets``
    may repeat (the engine pads with repeats); each row is still one conditioning.

    An oracle may also answer *chain queries* natively with
    ``log_marginals_chain(values, mask, chain)``: ``values`` LongTensor[C, n], ``mask``
    BoolTensor[C, n] (the pinned prefix) and ``chain`` LongTensor[C, L] (coordinates, none of
    them in ``mask``), returning Tensor[C, L, q] with

    ``out[c, j] = log mu(X_{chain[c, j]} = . | X_S = values_S)``, ``S = mask[c] + chain[c, :j]``:

    the conditional of every chain coordinate given the prefix and the chain coordinates before
    it, read at ``values``. This is what the verification of a drafted block needs (one values
    vector, one order, a range of cuts), and an oracle can often answer it far below the cost
    of ``L`` separate rows: nearest-pin updates for chains and trees, rank-one updates for
    DPPs, one pass of a causal any-order network. A chain shorter than ``L`` is padded by
    repeating its last coordinate; the engine ignores those rows (the repeated coordinate is
    then pinned, so an exact oracle returns a point mass there). Without the method the engine
    asks for the ``L`` rows one by one. Each chain row counts as one row of work either way.

    A verification is usually followed by the draft row of the next block, conditioned on the
    prefix and the whole chain. An oracle that can answer it with the chain, for less than a
    separate row, defines ``log_marginals_chain_then(values, mask, chain, then)`` with
    ``then`` LongTensor[C, T] (coordinates, repeats allowed), returning ``(out, after)``:
    ``out`` as above and ``after`` Tensor[C, T, q] with

    ``after[c, k] = log mu(X_{then[c, k]} = . | X_S = values_S)``, ``S = mask[c] + chain[c]``

    (a point mass where ``then[c, k]`` is in ``S``). The engine then asks such rows with their
    chain; otherwise as targeted rows. They count as rows either way.

    *A family of targets, one per draw.* An oracle with an integer attribute ``num_draws``
    describes ``num_draws`` distributions on the same ``[q]^n`` (for example the discrete
    sites of a Pyro model given each of several draws of its continuous sites).
    ``sample_any_order`` then draws one sample from each (``num_samples`` must equal
    ``num_draws``) and passes a keyword ``draws`` (LongTensor[B], or [C] for chains) to every
    method, telling which target each row conditions on.

    *Inference mode.* An oracle whose methods only compute from their inputs and from tensors
    fixed when it was built (no parameters created, no state changed, no autograd) may set
    the class attribute ``inference_safe = True``. The engine then calls it under
    :func:`torch.inference_mode`, as it runs its own bookkeeping, which takes about a fifth
    off PyTorch's cost per operation on a CPU. Every other oracle is called with inference
    mode off and in the grad mode of the caller of the sampler, so that a tensor it creates
    (a ``pyro.param`` first set during sampling, a cache) stays an ordinary tensor. With
    grad enabled its inputs are ordinary tensors made for it (autograd may save them: an
    embedding of the values), unless it borrows them; under ``torch.no_grad()`` they are
    inference tensors: read
    them, never write into them. Every call gets
    inputs that nothing else holds, never written again once the oracle keeps any of them, so
    an oracle may keep them (a cache of its last question). Inputs the oracle kept nothing of
    may be filled again for a later call: new tensor objects over the same memory, so a cache
    must hold the tensors it compares (or copies of them), never key on ``id()`` or
    ``data_ptr()`` alone; a saved address holds nothing, and may later read another call's
    inputs. The built-in exact
    oracles are inference-safe.

    *Borrowed inputs.* An oracle that reads its inputs only while a call runs (it keeps no
    reference to them, nor to views of them, once it returns, and never writes into them) may
    set the class attribute ``borrows_inputs = True``. The engine may then hand successive
    calls the same input tensors, updated in place between calls. Sequential sampling in lock
    step (one coordinate of every draw per call) then writes only the coordinates drawn since
    the last call instead of copying every draw's ``[n]`` values and mask for each call. The
    draws are the same either way.

    *One answer to one question.* Before sampling, the engine asks the oracle a handful of
    small questions every way it offers (:func:`~pyro_autospec.engine.consistency.
    check_consistency`) and refuses it where two answers differ. An oracle whose methods are
    tested to agree may set the class attribute ``consistent_queries = True`` to skip that
    check (a few milliseconds); the library's own oracles do, and ``tests/oracles/
    test_conformance.py`` runs the check on each of them.

    Examples
    --------
    >>> import torch
    >>> class Independent:
    ...     num_coords, num_values = 3, 2
    ...     def log_marginals(self, values, mask):
    ...         return torch.full((values.shape[0], 3, 2), 0.5).log()
    >>> isinstance(Independent(), MarginalOracle)
    True
    """

    num_coords: int
    num_values: int

    def log_marginals(self, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor: ...


@runtime_checkable
class MeanOracle(Protocol):
    """Conditional mean ``f(t, x) = E[Y | t Y + B_t = x]`` of a distribution on ``R^d``.

    Attributes
    ----------
    dim : int
        ``d``, the dimension of ``Y``.

    Methods
    -------
    __call__(t, x)
        ``t``: Tensor[B] of times, ``x``: Tensor[B, d]. Returns Tensor[B, d].

    Like a :class:`MarginalOracle`, a mean oracle may set ``inference_safe = True`` (the
    built-in denoisers do); any other is called with inference mode off, under
    :func:`torch.no_grad`.

    Examples
    --------
    >>> import torch
    >>> class PointMass:
    ...     dim = 2
    ...     def __call__(self, t, x):
    ...         return torch.ones_like(x)
    >>> isinstance(PointMass(), MeanOracle)
    True
    """

    dim: int

    def __call__(self, t: torch.Tensor, x: torch.Tensor) -> torch.Tensor: ...


class TargetedMarginals(Protocol):
    """Capability: the marginals of some coordinates only (:class:`MarginalOracle`).

    ``log_marginals_at(values, mask, targets)`` with ``targets`` LongTensor[B, k] returns
    Tensor[B, k, q]. Checked by :func:`has_targeted_marginals`.
    """

    def log_marginals_at(
        self, values: torch.Tensor, mask: torch.Tensor, targets: torch.Tensor, **kwargs
    ) -> torch.Tensor: ...


class ChainMarginals(Protocol):
    """Capability: chain queries answered natively (:class:`MarginalOracle`).

    ``log_marginals_chain(values, mask, chain)`` returns Tensor[C, L, q]. Checked by
    :func:`has_chain_marginals`; :func:`chain_rows` spells the same query as rows.
    """

    def log_marginals_chain(
        self, values: torch.Tensor, mask: torch.Tensor, chain: torch.Tensor, **kwargs
    ) -> torch.Tensor: ...


class ChainThenMarginals(Protocol):
    """Capability: a chain query and the row after it in one call (:class:`MarginalOracle`).

    ``log_marginals_chain_then(values, mask, chain, then)`` returns ``(out, after)``. Checked
    by :func:`has_chain_then`.
    """

    def log_marginals_chain_then(
        self,
        values: torch.Tensor,
        mask: torch.Tensor,
        chain: torch.Tensor,
        then: torch.Tensor,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


class FamilyOfTargets(Protocol):
    """Capability: ``num_draws`` targets on the same ``[q]^n``, one per draw
    (:class:`MarginalOracle`); every method then takes a keyword ``draws``. Read by
    :func:`oracle_num_draws`."""

    num_draws: int


class ConsistentQueries(Protocol):
    """Capability: the oracle's query methods are known to answer one conditional the same
    way (``consistent_queries = True``; :class:`MarginalOracle`), so the engine skips
    :func:`~pyro_autospec.engine.consistency.check_consistency`. Checked by
    :func:`declares_consistent_queries`."""

    consistent_queries: bool


class InferenceSafe(Protocol):
    """Capability: the oracle may be called under :func:`torch.inference_mode`
    (``inference_safe = True``; :class:`MarginalOracle`). Checked by
    :func:`is_inference_safe`."""

    inference_safe: bool


class BorrowsInputs(Protocol):
    """Capability: the oracle reads its inputs only while a call runs, so the engine may reuse
    them, updated in place, for its next call (``borrows_inputs = True``;
    :class:`MarginalOracle`). Checked by :func:`borrows_inputs`."""

    borrows_inputs: bool


def has_targeted_marginals(oracle: object) -> bool:
    """Whether ``oracle`` offers ``log_marginals_at(values, mask, targets)``."""
    return callable(getattr(oracle, "log_marginals_at", None))


def has_chain_marginals(oracle: object) -> bool:
    """Whether ``oracle`` answers chain queries natively (``log_marginals_chain``)."""
    return callable(getattr(oracle, "log_marginals_chain", None))


def has_chain_then(oracle: object) -> bool:
    """Whether ``oracle`` answers a chain query and the row after it in one call
    (``log_marginals_chain_then``)."""
    return callable(getattr(oracle, "log_marginals_chain_then", None))


def is_inference_safe(oracle: object) -> bool:
    """Whether ``oracle`` may be called under :func:`torch.inference_mode`
    (``oracle.inference_safe``; see :class:`MarginalOracle`)."""
    return getattr(oracle, "inference_safe", False) is True


#: The methods that answer an oracle's questions (public, and the private ones that an
#: ``ExactOracle`` subclass implements).
QUERY_METHODS = tuple(
    prefix + name
    for prefix in ("", "_")
    for name in (
        "log_marginals",
        "log_marginals_at",
        "log_marginals_chain",
        "log_marginals_chain_then",
    )
)


def declares_consistent_queries(oracle: object) -> bool:
    """Whether ``oracle`` declares its query methods consistent
    (``oracle.consistent_queries``; see :class:`MarginalOracle`).

    A declaration covers the query methods (:data:`QUERY_METHODS`) of the class that makes it
    and of the classes it inherits from, not those of a subclass: a subclass that defines a
    query method of its own (a user's subclass of ``ExactOracle`` implementing
    ``_log_marginals_at``) is checked unless it declares ``consistent_queries = True`` itself.

    Examples
    --------
    >>> class Declared:
    ...     consistent_queries = True
    ...     def log_marginals(self, values, mask): ...
    >>> class Overrides(Declared):
    ...     def log_marginals(self, values, mask): ...
    >>> declares_consistent_queries(Declared()), declares_consistent_queries(Overrides())
    (True, False)
    """
    if getattr(oracle, "consistent_queries", False) is not True:
        return False
    if "consistent_queries" in getattr(oracle, "__dict__", {}):
        return True  # set on the object itself
    for klass in type(oracle).__mro__:
        if "consistent_queries" in vars(klass):
            return True  # the declaring class, reached before any query method below it
        if any(name in vars(klass) for name in QUERY_METHODS):
            return False  # a query method the declaration does not cover
    return True


def borrows_inputs(oracle: object) -> bool:
    """Whether ``oracle`` only borrows its inputs during a call (``oracle.borrows_inputs``;
    see :class:`MarginalOracle`), so that the engine may reuse them."""
    return getattr(oracle, "borrows_inputs", False) is True


def oracle_num_draws(oracle: object) -> int | None:
    """``oracle.num_draws`` for a family of targets (one per draw), else ``None``.

    Raises
    ------
    TypeError
        If it is neither ``None`` nor an int >= 1 (Python's or NumPy's; a float such as
        ``5.5``, a string or a bool is refused, not truncated).
    """
    value = getattr(oracle, "num_draws", None)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        fix = " (convert it: int(oracle.num_draws))" if isinstance(value, torch.Tensor) else ""
        raise TypeError(
            f"oracle.num_draws must be None or an int >= 1 (the number of targets of a family, "
            f"one per draw); got {value!r}{fix}"
        )
    return int(value)


@dataclass(frozen=True)
class Capabilities:
    """What a marginal oracle offers beyond ``log_marginals``, read once per run.

    Attributes
    ----------
    targeted : bool
        :func:`has_targeted_marginals`.
    chains : bool
        :func:`has_chain_marginals`.
    chain_then : bool
        :func:`has_chain_then`.
    inference_safe : bool
        :func:`is_inference_safe`.
    consistent_queries : bool
        :func:`declares_consistent_queries`.
    borrows_inputs : bool
        :func:`borrows_inputs`.
    num_draws : int or None
        :func:`oracle_num_draws`: the number of targets of a family, else ``None``.

    Examples
    --------
    >>> import torch
    >>> from pyro_autospec.oracles import MarkovChainOracle
    >>> chain = MarkovChainOracle(torch.tensor([0.5, 0.5]), torch.eye(2) * 0.6 + 0.2, 8)
    >>> caps = Capabilities.of(chain)
    >>> caps.chains, caps.borrows_inputs, caps.num_draws
    (True, True, None)
    """

    targeted: bool
    chains: bool
    chain_then: bool
    inference_safe: bool
    consistent_queries: bool
    borrows_inputs: bool
    num_draws: int | None

    @classmethod
    def of(cls, oracle: object) -> Capabilities:
        """Read every capability of ``oracle`` (each check above, once)."""
        return cls(
            targeted=has_targeted_marginals(oracle),
            chains=has_chain_marginals(oracle),
            chain_then=has_chain_then(oracle),
            inference_safe=is_inference_safe(oracle),
            consistent_queries=declares_consistent_queries(oracle),
            borrows_inputs=borrows_inputs(oracle),
            num_draws=oracle_num_draws(oracle),
        )


def chain_rows(
    values: torch.Tensor, mask: torch.Tensor, chain: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A chain query's ``L`` nested conditionings as ``C L`` ordinary rows, chain by chain.

    Row ``c L + j`` pins ``mask[c]`` and ``chain[c, :j]`` and targets ``chain[c, j]`` (a
    padding repeat of an earlier chain coordinate is then pinned: a point mass). For oracles
    whose chain queries cost no less than their rows.

    Parameters
    ----------
    values : LongTensor[C, n]
    mask : BoolTensor[C, n]
    chain : LongTensor[C, L]

    Returns
    -------
    rows_values : LongTensor[C L, n]
        ``values[c]`` for every row of chain ``c``.
    rows_mask : BoolTensor[C L, n]
    targets : LongTensor[C L, 1]
    """
    num, length = chain.shape
    n = mask.shape[1]
    first = torch.full((num, n), length, dtype=torch.long, device=chain.device)
    steps = torch.arange(length, device=chain.device)
    first.scatter_reduce_(1, chain, steps.expand(num, length), reduce="amin")
    pinned = first[:, None, :] < steps[None, :, None]  # [C, L, n]: before step j of the chain
    rows_mask = (pinned | mask[:, None, :]).reshape(num * length, n)
    rows_values = values[:, None, :].expand(num, length, n).reshape(num * length, n)
    return rows_values, rows_mask, chain.reshape(num * length, 1)
