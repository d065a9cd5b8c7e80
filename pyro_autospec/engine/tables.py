"""Preallocated struct-of-arrays tables: the state of the vectorised engine.

A :class:`Table` holds one tensor per field, all with the same first dimension (the capacity),
and hands out row ids. Freed ids are reused; the capacity doubles when the table is full. Every
operation is a handful of tensor calls whatever the number of rows involved, so the engine's
bookkeeping costs no Python per node, thread or row.
"""

from __future__ import annotations

import torch

__all__ = ["Table"]


class Table:
    """Rows of named fields with allocation and freeing by id.

    Parameters
    ----------
    fields : dict
        ``name -> (shape, dtype, fill)``: each field is a tensor ``[capacity, *shape]``; new
        rows are set to ``fill``.
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
    >>> table.free(ids[:1]); table.alloc(1, fill=True).tolist()
    [0]
    """

    def __init__(self, fields: dict, device: torch.device, capacity: int = 256):
        self.device = device
        self.spec = dict(fields)
        self.capacity = int(capacity)
        self.used = torch.zeros(self.capacity, dtype=torch.bool, device=device)
        self.data: dict[str, torch.Tensor] = {}
        for name, (shape, dtype, fill) in self.spec.items():
            self.data[name] = torch.full((self.capacity, *shape), fill, dtype=dtype, device=device)
        self.num_used = 0

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.data[name]

    def _grow(self, needed: int) -> None:
        new = max(2 * self.capacity, needed)
        for name, (shape, dtype, fill) in self.spec.items():
            grown = torch.full((new, *shape), fill, dtype=dtype, device=self.device)
            grown[: self.capacity] = self.data[name]
            self.data[name] = grown
        used = torch.zeros(new, dtype=torch.bool, device=self.device)
        used[: self.capacity] = self.used
        self.used = used
        self.capacity = new

    def alloc(self, count: int, fill: bool = False) -> torch.Tensor:
        """Ids of ``count`` free rows (LongTensor[count]).

        Fields keep what the rows held before (their fill for rows never used) unless
        ``fill``: callers set the fields they read.
        """
        if count == 0:
            return torch.zeros(0, dtype=torch.long, device=self.device)
        if self.num_used + count > self.capacity:
            self._grow(self.num_used + count)
        ids = torch.nonzero(~self.used).flatten()[:count]
        self.used[ids] = True
        self.num_used += count
        if fill:
            for name, (_, _, value) in self.spec.items():
                self.data[name][ids] = value
        return ids

    def free(self, ids: torch.Tensor) -> None:
        """Release rows (ids must be in use and distinct)."""
        if ids.numel():
            self.used[ids] = False
            self.num_used -= int(ids.numel())
