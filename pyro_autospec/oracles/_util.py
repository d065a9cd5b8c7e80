"""Shared helpers of the exact structured oracles: validation, devices and the base class.

The log-space algebra they use is :mod:`pyro_autospec.engine.logspace`.

Nothing here is public API. Every oracle in this package

* stores its parameters as float64 tensors on one device,
* validates constructor arguments with a :class:`ValueError` that names the argument and the fix,
* answers queries on the device of the ``values`` it is given (moving, and caching, a copy of
  its parameters there when needed), and
* returns float64 log probabilities in which a pinned coordinate is a point mass at its pinned
  value (the engine ignores those rows; the convention makes them well defined).
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch

__all__ = [
    "ExactOracle",
    "numpy_generator",
    "as_float64",
    "chain_repeats",
    "check_query",
    "check_targets",
    "point_mass",
    "work_entries",
]

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
    subclass whose methods create parameters or change state sets it to ``False``.
    """

    num_coords: int
    num_values: int
    inference_safe = True

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
            out[rows, cuts] = answer[:, 0]
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


# -- randomness of the oracles' own helpers ----------------------------------------------------
def numpy_generator(seed) -> np.random.Generator:
    """A NumPy generator from an int, ``None``, a NumPy or a torch generator.

    Only for the oracles' own exact samplers and random targets (``sample``, ``unit_sphere``);
    the engine's randomness is keyed (:mod:`pyro_autospec.engine.keys`).
    """
    if isinstance(seed, np.random.Generator):
        return seed
    if isinstance(seed, torch.Generator):
        return np.random.default_rng(
            int(torch.randint(0, 2**62, (), generator=seed, device=seed.device).item())
        )
    if seed is None or isinstance(seed, (int, np.integer)):
        return np.random.default_rng(None if seed is None else int(seed))
    raise TypeError(
        f"seed must be an int, None, or a numpy/torch Generator; got {type(seed).__name__}"
    )


# -- memory budgets ---------------------------------------------------------------------------
# On a GPU, a chunk of rows is a handful of kernel launches: chunks sized for a CPU cache leave
# it idle. `python benchmarks/oracle_chunks.py` measures it (benchmarks/README.md): larger
# chunks made the DPP oracle several times faster on an H100 and slower on a CPU.
_GPU_WORK_ENTRIES = 1 << 27  # float64 entries: 1 GiB
_GPU_MEMORY_FRACTION = 16  # and at most 1/16 of the GPU's memory


def work_entries(device: torch.device, cpu_entries: int) -> int:
    """Largest number of float64 entries in the temporaries of one chunk of rows.

    Parameters
    ----------
    device : torch.device
        Where the chunk is computed.
    cpu_entries : int
        The oracle's budget on a CPU (sized for caches and modest memory).

    Returns
    -------
    int
        ``cpu_entries`` on a CPU; on a CUDA device the larger of ``cpu_entries`` and
        ``min(2^27, memory / 8 / 16)`` (1 GiB, or a sixteenth of a small GPU's memory).
    """
    if device.type != "cuda":
        return cpu_entries
    memory = torch.cuda.get_device_properties(device).total_memory
    return max(cpu_entries, min(_GPU_WORK_ENTRIES, memory // 8 // _GPU_MEMORY_FRACTION))


# -- validation --------------------------------------------------------------------------------
def as_float64(
    x: Any,
    name: str,
    device: str | torch.device | None = None,
    allow_neg_inf: bool = False,
) -> torch.Tensor:
    """``x`` as a float64 tensor (copied), rejecting NaN and ``+inf`` (and ``-inf`` unless
    ``allow_neg_inf``) with a message naming ``name``."""
    try:
        if isinstance(x, torch.Tensor):
            t = x.detach().to(dtype=torch.float64, copy=True)
        else:
            t = torch.as_tensor(x, dtype=torch.float64).clone()
    except (TypeError, ValueError, RuntimeError) as error:
        raise ValueError(
            f"{name} must be a tensor or array of real numbers; could not convert "
            f"{type(x).__name__}: {error}"
        ) from error
    if device is not None:
        t = t.to(device)
    if torch.isnan(t).any():
        raise ValueError(f"{name} contains NaN; pass finite numbers")
    if (t == float("inf")).any():
        raise ValueError(f"{name} contains +inf; pass finite numbers")
    if not allow_neg_inf and (t == float("-inf")).any():
        raise ValueError(f"{name} contains -inf; pass finite numbers")
    return t


def check_query(
    values: torch.Tensor, mask: torch.Tensor, num_coords: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Check the shapes of a query; return ``values`` (long) and ``mask`` (bool).

    Entries of ``values`` where ``mask`` is False are left as they are (possibly out of
    range): oracles must only read pinned values, or clamp what they gather.
    """
    if not isinstance(values, torch.Tensor) or not isinstance(mask, torch.Tensor):
        raise ValueError("values and mask must be torch tensors of shape [B, num_coords]")
    if values.dim() != 2 or values.shape[1] != num_coords:
        raise ValueError(
            f"values must have shape [B, {num_coords}] (one row per conditioning); "
            f"got {tuple(values.shape)}"
        )
    if mask.shape != values.shape:
        raise ValueError(
            f"mask must have the shape of values {tuple(values.shape)}; got {tuple(mask.shape)}"
        )
    return values.long(), mask.to(device=values.device, dtype=torch.bool)


def check_targets(
    targets: torch.Tensor, batch: int, num_coords: int, name: str = "targets"
) -> torch.Tensor:
    """Check ``targets`` (LongTensor[B, k] of coordinate indices); ``name`` for messages."""
    if not isinstance(targets, torch.Tensor) or targets.dim() != 2 or targets.shape[0] != batch:
        shape = tuple(targets.shape) if isinstance(targets, torch.Tensor) else type(targets)
        width = "L" if name == "chain" else "k"
        raise ValueError(
            f"{name} must be a LongTensor of shape [{batch}, {width}] (one row per row of "
            f"values); got {shape}"
        )
    if targets.is_floating_point() or targets.is_complex() or targets.dtype == torch.bool:
        raise ValueError(f"{name} must hold integer coordinate indices; got {targets.dtype}")
    targets = targets.long()
    if targets.numel() and (targets.min() < 0 or targets.max() >= num_coords):
        raise ValueError(f"{name} must hold coordinate indices in [0, {num_coords})")
    return targets


def chain_repeats(chain: torch.Tensor) -> torch.Tensor:
    """BoolTensor[C, L]: whether ``chain[c, j]`` occurs in ``chain[c, :j]`` (padding).

    ``O(L log L)`` per chain: a stable sort puts equal coordinates next to each other in the
    order of the chain, so every one but the first of a run is a repeat.
    """
    repeated = torch.zeros(chain.shape, dtype=torch.bool, device=chain.device)
    if chain.shape[1] > 1:
        ordered, perm = chain.sort(dim=1, stable=True)
        repeated.scatter_(1, perm[:, 1:], ordered[:, 1:] == ordered[:, :-1])
    return repeated


def pinned_with_chain(mask: torch.Tensor, chain: torch.Tensor) -> torch.Tensor:
    """BoolTensor[C, n]: ``mask`` with every coordinate of ``chain`` [C, L] pinned (what the
    row after a chain conditions on)."""
    return mask.clone().scatter_(1, chain, True)


def point_mass(
    out: torch.Tensor, pinned: torch.Tensor, pinned_values: torch.Tensor
) -> torch.Tensor:
    """Replace ``out[..., :]`` by a log point mass at ``pinned_values`` where ``pinned``.

    ``out``: Tensor[..., q]; ``pinned``: BoolTensor[...]; ``pinned_values``: LongTensor[...].
    """
    q = out.shape[-1]
    onehot = torch.arange(q, device=out.device) == pinned_values.unsqueeze(-1)
    delta = torch.where(onehot, 0.0, float("-inf")).to(out.dtype)
    return torch.where(pinned.unsqueeze(-1), delta, out)
