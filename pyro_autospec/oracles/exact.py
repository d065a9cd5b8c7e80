"""The base class of the exact oracles: devices, validation and the chain queries.

:class:`ExactOracle` turns three private methods into the
:class:`~pyro_autospec.engine.protocols.MarginalOracle` protocol: a subclass computes
``_log_marginals_at`` (and, where it can do better than rows, ``_log_marginals`` and
``_log_marginals_chain``) on validated inputs on its own device; the base class checks every
query, answers it on the device of its ``values`` (moving, and caching, a copy of the
parameters there) and expands a chain query into rows when the subclass has no native one.
:class:`ChainThen` adds ``log_marginals_chain_then`` the same way. Every oracle of
:mod:`pyro_autospec.oracles` derives from it; so may a user's.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from ._util import chain_repeats, check_query, check_targets, point_mass

__all__ = ["ChainThen", "ExactOracle"]

# Largest number of mask entries of one chunk of rows of the generic chain queries.
_MAX_CHAIN_ROW_ENTRIES = 1 << 22


class ExactOracle:
    """Base class: device handling and the ``log_marginals`` / ``log_marginals_at`` pair.

    Subclasses set ``num_coords`` and ``num_values``, keep their parameters as tensor
    attributes, and implement ``_log_marginals_at(values, mask, targets)`` (with inputs already
    validated, on the parameters' device) and optionally ``_log_marginals(values, mask)`` and
    ``_log_marginals_chain(values, mask, chain)`` (native chain queries; the default here
    expands a chain into rows).

    Subclasses inherit ``inference_safe = True``: the engine calls them under
    :func:`torch.inference_mode` (see :class:`~pyro_autospec.engine.protocols.MarginalOracle`). A
    subclass whose methods create parameters or change state sets it to ``False``. They also
    inherit ``consistent_queries = True`` only for the query methods they inherit: a subclass
    that implements a query method (``_log_marginals_at`` and the others) is checked by the
    engine before sampling (:func:`~pyro_autospec.engine.consistency.check_consistency`)
    unless it sets ``consistent_queries = True`` itself (every shipped oracle does; the
    conformance tests run the check on each of them). And they inherit
    ``borrows_inputs = True`` (they read their inputs only during a call, so the engine may
    reuse them): a subclass that keeps its inputs (a cache of its last question) sets it to
    ``False``.
    """

    num_coords: int
    num_values: int
    inference_safe = True
    consistent_queries = True
    borrows_inputs = True

    # -- devices -----------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        """The device the parameters live on."""
        for value in vars(self).values():
            if isinstance(value, torch.Tensor):
                return value.device
        return torch.device("cpu")

    def to(self, device: str | torch.device) -> ExactOracle:
        """Return a copy of this oracle with every parameter tensor on ``device``."""
        device = torch.device(device)
        new = copy.copy(self)
        new._device_cache = {}
        for name, value in vars(self).items():
            if isinstance(value, torch.Tensor):
                setattr(new, name, value.to(device))
            elif isinstance(value, ExactOracle):
                setattr(new, name, value.to(device))
            elif isinstance(value, list) and any(isinstance(v, torch.Tensor) for v in value):
                setattr(new, name, [v.to(device) for v in value])
        return new

    def _on(self, device: torch.device) -> ExactOracle:
        """This oracle, or a cached copy of it on ``device``."""
        if device == self.device:
            return self
        cache: dict[Any, ExactOracle] = self.__dict__.setdefault("_device_cache", {})
        key = str(device)
        if key not in cache:
            cache[key] = self.to(device)
        return cache[key]

    # -- the protocol -------------------------------------------------------------------------
    def log_marginals(self, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Conditional log marginals of every coordinate.

        Parameters
        ----------
        values : LongTensor[B, n]
            Pinned values (entries where ``mask`` is False are ignored and may be anything).
        mask : BoolTensor[B, n]
            True where the coordinate is pinned.

        Returns
        -------
        DoubleTensor[B, n, q]
            ``log mu(X_i = v | X_S = values_S)``; a pinned coordinate gets a point mass at its
            pinned value. Rows conditioned on an impossible assignment may hold NaN.
        """
        values, mask = check_query(values, mask, self.num_coords)
        oracle = self._on(values.device)
        return oracle._log_marginals(values, mask)

    def log_marginals_at(
        self, values: torch.Tensor, mask: torch.Tensor, targets: torch.Tensor
    ) -> torch.Tensor:
        """Conditional log marginals of the coordinates ``targets`` only.

        Parameters
        ----------
        values : LongTensor[B, n]
            Pinned values (entries where ``mask`` is False are ignored).
        mask : BoolTensor[B, n]
            True where the coordinate is pinned.
        targets : LongTensor[B, k]
            Coordinate indices (repeats allowed).

        Returns
        -------
        DoubleTensor[B, k, q]
            ``out[b, j] = log mu(X_{targets[b, j]} = . | X_S = values_S)`` for ``S = mask[b]``.
        """
        values, mask = check_query(values, mask, self.num_coords)
        targets = check_targets(targets, values.shape[0], self.num_coords)
        oracle = self._on(values.device)
        return oracle._log_marginals_at(values, mask, targets.to(values.device))

    def log_marginals_chain(
        self, values: torch.Tensor, mask: torch.Tensor, chain: torch.Tensor
    ) -> torch.Tensor:
        """Chain query: the conditional of every chain coordinate given the pins before it.

        The verification of a drafted block in one call (see :doc:`/oracles`).

        Parameters
        ----------
        values : LongTensor[C, n]
            One values vector per chain: the pinned prefix and the chain's values (entries
            pinned by neither are ignored and may be anything).
        mask : BoolTensor[C, n]
            The pinned prefix of each chain.
        chain : LongTensor[C, L]
            Coordinate indices, in the order they are pinned. A chain shorter than ``L`` is
            padded by repeating its last coordinate; such rows (a coordinate already pinned by
            ``mask`` or earlier in its chain) get a point mass at its value and cost next to
            nothing.

        Returns
        -------
        DoubleTensor[C, L, q]
            ``out[c, j] = log mu(X_{chain[c, j]} = . | X_S = values_S)`` with
            ``S = mask[c] + chain[c, :j]``. Rows conditioned on an impossible assignment may
            hold NaN.

        Examples
        --------
        >>> import torch
        >>> from pyro_autospec.oracles import MarkovChainOracle
        >>> oracle = MarkovChainOracle([0.5, 0.5], [[0.9, 0.1], [0.2, 0.8]], n=4)
        >>> values = torch.tensor([[1, 0, 1, 1]])
        >>> mask = torch.tensor([[True, False, False, False]])
        >>> chain = torch.tensor([[3, 1, 2, 2]])  # the last row is padding
        >>> out = oracle.log_marginals_chain(values, mask, chain)  # [1, 4, 2]
        >>> at = oracle.log_marginals_at(values, mask | (torch.arange(4) == 3), torch.tensor([[1]]))
        >>> torch.allclose(out[0, 1], at[0, 0])  # x_1 given x_0 and x_3
        True
        >>> out[0, 3].exp()  # padding: a point mass at values[2]
        tensor([0., 1.], dtype=torch.float64)
        """
        values, mask = check_query(values, mask, self.num_coords)
        chain = check_targets(chain, values.shape[0], self.num_coords, name="chain")
        oracle = self._on(values.device)
        return oracle._log_marginals_chain(values, mask, chain.to(values.device))

    def _log_marginals(self, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        batch = values.shape[0]
        targets = torch.arange(self.num_coords, device=values.device).expand(batch, -1)
        return self._log_marginals_at(values, mask, targets)

    def _log_marginals_at(
        self, values: torch.Tensor, mask: torch.Tensor, targets: torch.Tensor
    ) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def _log_marginals_chain(
        self, values: torch.Tensor, mask: torch.Tensor, chain: torch.Tensor
    ) -> torch.Tensor:
        """Generic chain queries: one row per chain coordinate not pinned yet, in chunks of
        at most ``2^22`` mask entries; rows already pinned get their point mass directly."""
        num_chains, length = chain.shape
        n, q = self.num_coords, self.num_values
        device = values.device
        pinned = mask.gather(1, chain) | chain_repeats(chain)
        out = point_mass(
            torch.zeros(num_chains, length, q, dtype=torch.float64, device=device),
            torch.ones_like(pinned),
            values.gather(1, chain),
        )
        live_chain, live_step = (~pinned).nonzero(as_tuple=True)
        step = max(1, _MAX_CHAIN_ROW_ENTRIES // n)
        positions = torch.arange(length, device=device)
        for s in range(0, len(live_chain), step):
            rows, cuts = live_chain[s : s + step], live_step[s : s + step]
            row_mask = mask.index_select(0, rows)
            before = positions < cuts.unsqueeze(1)  # chain coordinates pinned in this row
            coords = chain.index_select(0, rows)
            flat = (torch.arange(len(rows), device=device).unsqueeze(1) * n + coords)[before]
            row_mask.view(-1).index_fill_(0, flat, True)
            targets = coords.gather(1, cuts.unsqueeze(1))
            answer = self._log_marginals_at(values.index_select(0, rows), row_mask, targets)
            if s == 0 and answer.dtype != out.dtype:  # a subclass may answer in float32:
                out = out.to(answer.dtype)  # the point masses are exact in its dtype, and its
            out[rows, cuts] = answer[:, 0].to(out.dtype)  # rows keep that dtype's tolerance
        return out

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_coords={self.num_coords}, "
            f"num_values={self.num_values}, device={self.device})"
        )


class ChainThen:
    """Mixin for an :class:`ExactOracle` that answers a chain query and the row after it in
    one call: it implements ``_log_marginals_chain_then(values, mask, chain, then)`` (inputs
    validated, on its device), returning ``(out [C, L, q], after [C, T, q])``."""

    def log_marginals_chain_then(
        self, values: torch.Tensor, mask: torch.Tensor, chain: torch.Tensor, then: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A chain query and the row after it: what a verification and the next block's
        draft row need, for about the price of the chain alone.

        Parameters
        ----------
        values, mask, chain
            As in :meth:`ExactOracle.log_marginals_chain`.
        then : LongTensor[C, T]
            Coordinates read by one more row per chain, which pins the prefix and the whole
            chain (repeats allowed).

        Returns
        -------
        out : DoubleTensor[C, L, q]
            :meth:`ExactOracle.log_marginals_chain`.
        after : DoubleTensor[C, T, q]
            ``after[c, k] = log mu(X_{then[c, k]} = . | X_S = values_S)`` with
            ``S = mask[c] + chain[c]``; a point mass where ``then[c, k]`` is in ``S``. Rows
            conditioned on an impossible assignment may hold NaN or any values.

        Examples
        --------
        >>> import torch
        >>> from pyro_autospec.oracles import TreePottsOracle
        >>> oracle = TreePottsOracle.ising([(0, 1), (1, 2), (1, 3)], coupling=0.5)
        >>> values = torch.tensor([[1, 0, 1, 0]])
        >>> mask = torch.tensor([[True, False, False, False]])
        >>> out, after = oracle.log_marginals_chain_then(
        ...     values, mask, torch.tensor([[2, 1]]), torch.tensor([[3]])
        ... )
        >>> pins = torch.tensor([[True, True, True, False]])
        >>> row = oracle.log_marginals_at(values, pins, torch.tensor([[3]]))
        >>> torch.allclose(after, row)  # x_3 given x_0, x_2 and x_1
        True
        """
        values, mask = check_query(values, mask, self.num_coords)
        batch = values.shape[0]
        chain = check_targets(chain, batch, self.num_coords, name="chain").to(values.device)
        then = check_targets(then, batch, self.num_coords, name="then").to(values.device)
        return self._on(values.device)._log_marginals_chain_then(values, mask, chain, then)
