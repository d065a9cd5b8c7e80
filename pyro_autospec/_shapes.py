"""Shape arithmetic without PyTorch's symbolic-shape machinery.

``torch.broadcast_shapes`` imports ``torch.fx.experimental.symbolic_shapes`` (and with it
SymPy) on its first call: about two seconds of a process's first ``AutoSpec.run``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["broadcast_shape"]


def broadcast_shape(*shapes: Sequence[int]) -> torch.Size:
    """The broadcast of ``shapes`` under NumPy's rules, as :func:`torch.broadcast_shapes`.

    Examples
    --------
    >>> broadcast_shape((3, 1), (1, 4), (4,))
    torch.Size([3, 4])
    """
    ndim = max((len(s) for s in shapes), default=0)
    out = [1] * ndim
    for shape in shapes:
        for i, size in enumerate(shape, ndim - len(shape)):
            size = int(size)
            if size == 1 or size == out[i]:
                continue
            if out[i] != 1:
                raise RuntimeError(f"shapes {[tuple(s) for s in shapes]} do not broadcast")
            out[i] = size
    return torch.Size(out)
