"""Log-space algebra shared by the engine and the exact oracles.

``logsumexp`` and ``sum_last`` keep a row's rounding independent of its batch on a CPU (the
engine's checks of an oracle's rows and the exact oracles' answers rely on it); ``log_matmul``
is an exact product of matrices held in log space.
"""

from __future__ import annotations

import torch

__all__ = ["log_matmul", "log_normalize", "logsumexp", "safe_max", "sum_last"]

# Largest temporary of one log_matmul chunk (float64 entries: 128 MiB).
_MAX_LOG_MATMUL_ENTRIES = 1 << 24


def safe_max(x: torch.Tensor, dim: int) -> torch.Tensor:
    """``x.amax(dim, keepdim=True)`` with non-finite maxima replaced by 0 (a safe shift)."""
    m = x.amax(dim=dim, keepdim=True)
    return torch.where(torch.isfinite(m), m, torch.zeros_like(m))


def log_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``log(exp(a) @ exp(b))`` for (batched, broadcast) matrices, exact in log space.

    ``a``: Tensor[..., i, j]; ``b``: Tensor[..., j, k]; returns Tensor[..., i, k]; ``-inf``
    entries (zero probabilities) are allowed.

    Rows of ``a`` and columns of ``b`` are first scaled by their maxima and multiplied by BLAS;
    an entry of that product is then exact to rounding unless it is below ``1e-200`` (some of
    its terms may have underflowed). The batch items holding such entries are recomputed as a
    ``logsumexp`` over ``j`` of ``a[..., i, j] + b[..., j, k]``, so no dynamic range is lost.
    """
    ra = safe_max(a, -1)
    cb = safe_max(b, -2)
    prod = torch.exp(a - ra) @ torch.exp(b - cb)
    out = torch.log(prod) + ra + cb
    suspicious = prod < 1e-200
    if not bool(suspicious.any()):
        return out
    batch = out.shape[:-2]
    i, j, k = a.shape[-2], a.shape[-1], b.shape[-1]
    flat_out = out.reshape(-1, i, k)
    items = suspicious.reshape(-1, i * k).any(1).nonzero().flatten()
    a_items = a.expand(*batch, i, j).reshape(-1, i, j)
    b_items = b.expand(*batch, j, k).reshape(-1, j, k)
    step = max(1, _MAX_LOG_MATMUL_ENTRIES // (i * j * k))
    for s in range(0, len(items), step):
        index = items[s : s + step]
        exact = logsumexp(a_items[index].unsqueeze(-1) + b_items[index].unsqueeze(-3), dim=-2)
        flat_out[index] = exact
    return flat_out.reshape(out.shape)


def logsumexp(x: torch.Tensor, dim: int = -1, keepdim: bool = False) -> torch.Tensor:
    """``log(sum(exp(x)))`` along ``dim``; ``-inf`` where every entry is ``-inf``.

    (Faster than :func:`torch.logsumexp` on CPU when ``x`` holds ``-inf`` entries.)
    """
    m = safe_max(x, dim)
    e = (x - m).exp()
    if dim in (-1, x.dim() - 1):
        out = sum_last(e).unsqueeze(-1).log() + m
    else:
        out = e.sum(dim=dim, keepdim=True).log() + m
    return out if keepdim else out.squeeze(dim)


def sum_last(x: torch.Tensor) -> torch.Tensor:
    """``x.sum(-1)`` for a floating ``x`` [..., q]; [...].

    On a CPU, torch's reduction over a short contiguous last dimension costs more per entry
    than adding the ``q`` slices. For ``q <= 4`` on a CPU the slices are added, left to right:
    the same order, so the same rounding, for every row whatever the batch. Elsewhere this is
    ``x.sum(-1)``.
    """
    q = x.shape[-1]
    if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64) or not 0 < q <= 4:
        return x.sum(-1)
    parts = x.unbind(-1)
    out = parts[0].clone()
    for part in parts[1:]:
        out += part
    return out


def log_normalize(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``x - logsumexp(x)`` along ``dim`` (NaN where every entry is ``-inf``)."""
    return x - logsumexp(x, dim=dim, keepdim=True)
