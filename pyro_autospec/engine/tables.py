"""Preallocated struct-of-arrays tables: the state of the vectorised engine.

A :class:`Table` holds one tensor per field, all with the same first dimension (the capacity),
and hands out row ids. Freed ids are reused; the capacity doubles when the table is full. Every
operation is a handful of tensor calls whatever the number of rows involved, so the engine's
bookkeeping costs no Python per node, thread or row.

A :class:`Matrix` keeps many integer fields as the columns of one ``[capacity, fields]``
tensor, so that reading or writing several fields of a set of rows is one gather or one
scatter, not one per field.

Segments of different lengths (the steps of blocks of different sizes) are laid out flat, one
after the other (:func:`ragged`), rather than padded to the longest: the work is then their
total length whatever the spread of their sizes. :func:`segment_cumsum` and
:func:`segment_sum` sum within them.
"""

from __future__ import annotations

import torch

__all__ = ["Matrix", "Table", "ragged", "segment_cumsum", "segment_sum", "take"]


def take(matrix: torch.Tensor, row: torch.Tensor, col: torch.Tensor) -> torch.Tensor:
    """``matrix[row[k], col[k, ...]]`` of a contiguous ``matrix`` [R, m]: the shape of ``col``
    ([K] or [K, W]; ``row`` [K]).

    By flat indices into the matrix: ``torch.take`` for small requests (the fewest calls), one
    ``index_select`` for large ones (faster per entry on a CPU). Both are two to three times
    faster on a CPU than indexing with two index tensors.

    Examples
    --------
    >>> m = torch.arange(12).view(3, 4)
    >>> take(m, torch.tensor([2, 0]), torch.tensor([[1, 3], [0, 0]]))
    tensor([[ 9, 11],
            [ 0,  0]])
    """
    flat = torch.add(col, row if col.dim() == 1 else row.unsqueeze(1), alpha=matrix.shape[1])
    if flat.numel() <= _TAKE_LIMIT:
        return torch.take(matrix, flat)
    return matrix.view(-1).index_select(0, flat.view(-1)).view(col.shape)


#: Largest request answered by ``torch.take`` (measured on a CPU: beyond it ``index_select``
#: is faster).
_TAKE_LIMIT = 4096


def ragged(size: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The flat layout of ``K`` segments of lengths ``size`` [K], one after the other.

    Returns
    -------
    segment, position : LongTensor[T]
        For each of the ``T = size.sum()`` entries, its segment and its index in it.
    start : LongTensor[K]
        Index of each segment's first entry (``start + size - 1`` is its last).

    Examples
    --------
    >>> ragged(torch.tensor([2, 0, 3]))
    (tensor([0, 0, 2, 2, 2]), tensor([0, 1, 0, 1, 2]), tensor([0, 2, 2]))
    """
    start = torch.cumsum(size, 0) - size
    segment = torch.repeat_interleave(size)
    position = torch.arange(segment.numel(), device=size.device) - start[segment]
    return segment, position, start


def segment_cumsum(values: torch.Tensor, position: torch.Tensor, longest: int) -> torch.Tensor:
    """Inclusive sums of ``values`` [T, ...] within the segments of a :func:`ragged` layout.

    A doubling scan (``ceil(log2(longest))`` steps): entry ``k`` adds the partial sum ``s``
    entries back while that entry is in its segment (``position[k] >= s``). Each entry's sum
    is formed from its own segment's entries only, in an order fixed by its position, so it
    does not depend on what other segments share the call.

    Parameters
    ----------
    values : Tensor[T, ...]
        Floating point.
    position : LongTensor[T]
        Index of each entry in its segment.
    longest : int
        Length of the longest segment.

    Examples
    --------
    >>> segment_cumsum(torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]), torch.tensor([0, 1, 0, 1, 2]), 3)
    tensor([ 1.,  3.,  3.,  7., 12.])
    """
    out = values.clone()
    shift = 1
    while shift < longest:
        inside = (position[shift:] >= shift).view(-1, *([1] * (values.dim() - 1)))
        out[shift:] += torch.where(inside, out[:-shift], 0.0)  # the right side is a new tensor
        shift *= 2
    return out


def segment_sum(values: torch.Tensor, size: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """Sums of ``values`` [T, ...] over the segments of lengths ``size`` [K]: [K, ...].

    Each segment is summed on its own, in order (``torch.segment_reduce`` on a CPU or a CUDA
    device, else the last entry of :func:`segment_cumsum`), so a sum does not depend on the
    other segments of the call. An empty segment sums to 0.

    Examples
    --------
    >>> segment_sum(torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([2, 0, 2]),
    ...             torch.tensor([0, 1, 0, 1]))
    tensor([3., 0., 7.])
    """
    if values.device.type in ("cpu", "cuda"):
        return torch.segment_reduce(values, "sum", lengths=size, axis=0)
    return _segment_sum_by_scan(values, size, position)


def _segment_sum_by_scan(
    values: torch.Tensor, size: torch.Tensor, position: torch.Tensor
) -> torch.Tensor:
    """:func:`segment_sum` on devices without ``torch.segment_reduce``."""
    longest = int(size.max()) if size.numel() else 0
    total = segment_cumsum(values, position, longest)
    end = torch.cumsum(size, 0) - 1
    return torch.where(
        (size > 0).view(-1, *([1] * (values.dim() - 1))), total[end.clamp(min=0)], 0.0
    )


class _Slots:
    """Row ids handed out and taken back: a free list over ``used: BoolTensor[capacity]``.

    Subclasses keep their storage in ``capacity`` rows and implement :meth:`_grow_storage`
    (copy into ``new`` rows) and, if rows must be reset when handed out, :meth:`_reset`.
    """

    def _init_slots(self, device: torch.device, capacity: int) -> None:
        self.device = device
        self.capacity = int(capacity)
        self.used = torch.zeros(self.capacity, dtype=torch.bool, device=device)
        self.num_used = 0

    def _grow_storage(self, new: int) -> None:
        raise NotImplementedError

    def _reset(self, ids: torch.Tensor) -> None:
        """Called on the ids :meth:`alloc` hands out (default: keep what the rows held)."""

    def _grow(self, needed: int) -> None:
        new = max(2 * self.capacity, needed)
        self._grow_storage(new)
        used = torch.zeros(new, dtype=torch.bool, device=self.device)
        used[: self.capacity] = self.used
        self.used = used
        self.capacity = new

    def alloc(self, count: int) -> torch.Tensor:
        """Ids of ``count`` free rows (LongTensor[count])."""
        if count == 0:
            return torch.zeros(0, dtype=torch.long, device=self.device)
        if self.num_used + count > self.capacity:
            self._grow(self.num_used + count)
        ids = torch.nonzero(~self.used).flatten()[:count]
        self.used[ids] = True
        self.num_used += count
        self._reset(ids)
        return ids

    def free(self, ids: torch.Tensor) -> None:
        """Release rows (ids must be in use and distinct)."""
        if ids.numel():
            self.used[ids] = False
            self.num_used -= int(ids.numel())


class Table(_Slots):
    """Rows of named fields with allocation and freeing by id.

    Parameters
    ----------
    fields : dict
        ``name -> (shape, dtype, fill)``: each field is a tensor ``[capacity, *shape]``; rows
        never used hold ``fill``.
    device : torch.device
    capacity : int
        Initial number of rows.

    Examples
    --------
    >>> import torch
    >>> table = Table({"x": ((), torch.int64, -1)}, torch.device("cpu"), capacity=2)
    >>> ids = table.alloc(3)
    >>> ids.tolist(), table.capacity
    ([0, 1, 2], 4)
    >>> table.free(ids[:1]); table.alloc(1).tolist()
    [0]
    """

    def __init__(self, fields: dict, device: torch.device, capacity: int = 256):
        self._init_slots(device, capacity)
        self.spec = dict(fields)
        self.data: dict[str, torch.Tensor] = {}
        for name, (shape, dtype, fill) in self.spec.items():
            self.data[name] = torch.full((self.capacity, *shape), fill, dtype=dtype, device=device)

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.data[name]

    def _grow_storage(self, new: int) -> None:
        for name, (shape, dtype, fill) in self.spec.items():
            grown = torch.full((new, *shape), fill, dtype=dtype, device=self.device)
            grown[: self.capacity] = self.data[name]
            self.data[name] = grown


class Matrix(_Slots):
    """Integer fields as the columns of one LongTensor[capacity, fields], and a float matrix.

    Parameters
    ----------
    int_fields : dict
        ``name -> fill`` of the integer columns, in order.
    float_fields : dict
        ``name -> fill`` of the float64 columns, in order.
    device : torch.device
    capacity : int

    Attributes
    ----------
    i : LongTensor[capacity, len(int_fields)]
    f : DoubleTensor[capacity, len(float_fields)]
    used : BoolTensor[capacity]

    Examples
    --------
    >>> import torch
    >>> m = Matrix({"a": 0, "b": -1}, {"x": 0.0}, torch.device("cpu"), capacity=4)
    >>> ids = m.alloc(2)
    >>> m.i[ids, m.col["b"]].tolist()
    [-1, -1]
    """

    def __init__(
        self, int_fields: dict, float_fields: dict, device: torch.device, capacity: int
    ) -> None:
        self._init_slots(device, capacity)
        self.col = {name: k for k, name in enumerate(int_fields)}
        self.fcol = {name: k for k, name in enumerate(float_fields)}
        self._ifill = torch.tensor(list(int_fields.values()), dtype=torch.long, device=device)
        self._ffill = torch.tensor(list(float_fields.values()), dtype=torch.float64, device=device)
        self.i = self._ifill.repeat(self.capacity, 1)
        self.f = self._ffill.repeat(self.capacity, 1)

    def _grow_storage(self, new: int) -> None:
        self.i = torch.cat([self.i, self._ifill.repeat(new - self.capacity, 1)])
        self.f = torch.cat([self.f, self._ffill.repeat(new - self.capacity, 1)])

    def _reset(self, ids: torch.Tensor) -> None:
        """Rows handed out start at the fills."""
        self.i[ids] = self._ifill
        self.f[ids] = self._ffill
