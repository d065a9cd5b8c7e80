"""The exact oracle of a determinantal point process (DPP) on a finite ground set."""

from __future__ import annotations

from math import inf
from typing import Any

import torch

from ._util import (
    as_float64,
    chain_repeats,
    pinned_with_chain,
    point_mass,
    work_entries,
)
from .exact import ChainThen, ExactOracle

__all__ = ["DPPOracle"]

# Largest number of float64 entries of the temporaries of one chunk of rows on a CPU (64 MiB);
# more on a GPU (``work_entries``).
_MAX_WORK_ENTRIES = 1 << 23
# Tolerance on symmetry and on the spectrum of a kernel, relative to its scale.
_TOLERANCE = 1e-9
# Eigenvalues of K at most this are zero (the numerical rank); at least 1 - this are one.
_RANK_TOLERANCE = 1e-12
# Conditional probabilities closer than this to 0 or 1 are set to 0 or 1. The Schur complements
# of a projection kernel leave a true 0 at up to a few 1e-12 (4.2e-12 seen at n = 12, rank 4):
# below this, a pin of probability "4e-12" is one the next conditioning finds impossible.
_SNAP = 1e-9
_PATHS = ("auto", "lowrank", "block", "free")


def _check_symmetric(matrix: torch.Tensor, name: str) -> torch.Tensor:
    if matrix.dim() != 2 or matrix.shape[0] != matrix.shape[1] or matrix.shape[0] < 1:
        raise ValueError(f"{name} must be a square [n, n] matrix; got shape {tuple(matrix.shape)}")
    scale = max(1.0, float(matrix.abs().max()))
    if (matrix - matrix.T).abs().max() > _TOLERANCE * scale:
        raise ValueError(
            f"{name} must be symmetric; symmetrise it with ({name} + {name}.T) / 2 if the "
            f"asymmetry is rounding"
        )
    return (matrix + matrix.T) / 2


def _padded_indices(member: torch.Tensor, width: int, fill: int) -> torch.Tensor:
    """LongTensor[B, width]: the indices where ``member`` [B, n] is True, then ``fill``."""
    order = torch.argsort((~member).to(torch.int8), dim=1, stable=True)[:, :width]
    count = member.sum(1, keepdim=True)
    slots = torch.arange(width, device=member.device)
    return torch.where(slots < count, order, fill)


def _lu_factor(system: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``torch.linalg.lu_factor_ex`` of a batch [B, m, m], one system at a time where a batched
    call can be wrong.

    Once ``torch.set_num_threads`` has been called with more than one thread (by the user, or
    by any library: it switches MKL's dynamic threading off), PyTorch's batched LU on the CPU
    runs MKL's ``dgetrf`` on several threads at once for ``m`` of about 15 or more, and MKL's
    row swaps are not safe under that: some batches raise and others return wrong factors
    without an error (pytorch/pytorch#141358; fix proposed in #181570). With torch 2.13.0+cpu
    and two threads, 29 of 150 batches were silently wrong. A batch of one is safe whatever the
    threading, and this never touches the process's thread settings. Factoring one system at a
    time costs a Python loop over the batch (see ``benchmarks/README.md`` for CPU timings).
    """
    if system.device.type == "cpu" and torch.get_num_threads() > 1 and system.shape[-1] >= 15:
        parts = [torch.linalg.lu_factor_ex(one) for one in system]
        return tuple(torch.stack(column) for column in zip(*parts))  # type: ignore[return-value]
    return torch.linalg.lu_factor_ex(system)


def _solve(system: torch.Tensor, rhs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``system^-1 rhs`` batched, and a BoolTensor[B] of the singular systems (their rows of the
    solution are garbage and must be masked by the caller)."""
    # Factor every system once, swap singular ones for the identity (so that the batched
    # solve cannot fail) and mark them.
    factors, pivots, info = _lu_factor(system)
    singular = info != 0
    if singular.any():
        eye = torch.eye(system.shape[-1], dtype=system.dtype, device=system.device)
        system = torch.where(singular[:, None, None], eye, system)
        factors, pivots, _ = _lu_factor(system)
    return torch.linalg.lu_solve(factors, pivots, rhs), singular


def _chunks(sizes: list[int], entries_per_row, limit: int) -> list[tuple[int, int]]:
    """Cut rows sorted by increasing size into ``[start, stop)`` chunks whose temporaries hold
    at most ``limit`` entries (at least one row each)."""
    out, start = [], 0
    while start < len(sizes):
        stop = start + 1
        while stop < len(sizes) and (stop + 1 - start) * entries_per_row(sizes[stop]) <= limit:
            stop += 1
        out.append((start, stop))
        start = stop
    return out


class DPPOracle(ChainThen, ExactOracle):
    r"""Exact conditional marginals of a determinantal point process.

    The ground set ``{0, ..., n-1}`` is the set of coordinates; coordinate ``i`` takes value 1
    when item ``i`` is in the random set ``X`` and 0 when it is not.

    Parameters
    ----------
    kernel : Tensor or array [n, n], optional
        The marginal kernel ``K`` (symmetric, eigenvalues in ``[0, 1]``):
        ``P(A subset of X) = det(K_A)``. Projection kernels (eigenvalues 0 or 1) are allowed.
    L : Tensor or array [n, n], optional
        An L-ensemble kernel (symmetric positive semi-definite): ``P(X = A) ∝ det(L_A)``. It is
        turned into ``K = L (I + L)^-1``.
    features : Tensor or array [n, d], optional
        Features ``Phi`` of a low-rank (dual) L-ensemble ``L = Phi Phi^T``. Then
        ``K = Phi (I_d + Phi^T Phi)^-1 Phi^T`` is computed from the ``d x d`` dual (a thin SVD
        of ``Phi``, ``O(n d^2)``); no ``[n, n]`` matrix is formed.
    device : str or torch.device, optional
        Where to keep the kernel.

    Pass exactly one of ``kernel``, ``L`` and ``features``.

    Attributes
    ----------
    num_coords : int
        ``n``.
    num_values : int
        2.
    rank : int
        ``r``, the number of eigenvalues of ``K`` above ``1e-12`` (``|X| <= r`` always).
    factor : DoubleTensor[n, max(r, 1)]
        ``V`` with ``K = V V^T`` and ``V^T V = diag(eigenvalues of K)``.
    kernel : DoubleTensor[n, n]
        The marginal kernel ``K`` (formed on access when built from ``features``).
    path : str
        ``"auto"`` (default): each row takes the cheapest exact formulation below (by a flop
        count); ``"lowrank"``, ``"block"`` or ``"free"`` (only when built from ``L``) force
        one. All are exact; forcing one is for tests and timing.
    max_work_entries : int or None
        Most float64 entries in the temporaries of one chunk of rows. ``None`` (default):
        ``2^23`` (64 MiB) on a CPU, ``2^27`` (1 GiB, at most a sixteenth of the memory) on a
        GPU, where small chunks leave the device idle. Any value gives the same answers.

    Notes
    -----
    Conditioning on ``A`` in and ``B`` out (``S = A ∪ B``, ``s = |S|``, ``a = |A|``) is the
    chain of Schur updates ``K <- K - K[:, i] K[i, :] / K_ii`` (pin in) and
    ``K <- K + K[:, i] K[i, :] / (1 - K_ii)`` (pin out). Three closed forms are used, all in
    float64, each row taking the cheapest; rows are grouped by formulation, sorted by the size
    of their system, padded with the identity and solved in chunks of at most ``2^23``
    entries of temporaries:

    *Pinned block* (any kernel). Both updates are Schur complements of ``K - diag(1_B)``, so

    ``P(t in X | pins) = K_tt - K_tS (K - diag(1_B))_SS^-1 K_St``,

    one ``[s, s]`` system per row: ``O(s^3 + s^2 k)`` for ``k`` targets (plus ``O(s^2 r)``
    to form ``K_SS`` from ``V`` when built from ``features``).

    *Low rank* (``K = V V^T``, ``V`` of shape ``[n, r]``). Pinning ``B`` out gives
    ``K' = V C V^T`` with ``C = (I_r - V_B^T V_B)^-1``; ``det(I_r - V_B^T V_B) = P(X ∩ B = ∅)``.
    The ``[r, r]`` matrix is formed from whichever of ``B`` and its complement ``B^c`` is
    smaller: ``I_r - V_B^T V_B = diag(1 - eig K) + V_{B^c}^T V_{B^c}``. Pinning ``A`` in is
    the Schur complement on ``K'_AA = V_A C V_A^T`` (``[a, a]``, ``a <= r``), so

    ``P(t in X | pins) = v_t^T C v_t - K'_tA (K'_AA)^-1 K'_At``,

    ``O(min(|B|, n - |B|) r^2 + r^3 + (k + a) r^2 + a^3)`` per row, never ``O(n^2)``.

    *Free items* (only when built from ``L``). Pinning ``B`` out deletes ``B`` from ``L``;
    with ``U`` the items not pinned out and ``F`` the free ones,
    ``P(t in X | pins) = 1 - [(L_UU + diag(1_F))^-1]_tt`` for ``t`` in ``F``: one
    ``[u, u]`` system, ``u = n - |B|``, ``O(u^3 + u^2 k)`` per row (cheap late in a sample,
    when most items are pinned out).

    Impossible pin sets give NaN rows: a singular system (zero pivot; ``|det|`` of the pinned
    block is the probability of the pins), more in-pins than the rank, or fewer items left
    free or in than the number of unit eigenvalues (``|X|`` is at least that). Against
    rounding, probabilities are clipped to ``[0, 1]`` and those within ``1e-9`` of 0 or 1 are
    set to 0 or 1, so that the support is exact (a projection DPP never draws more items than
    its rank; its Schur complements leave true zeros at a few ``1e-12``); eigenvalues of ``K``
    below ``1e-12`` are dropped. The law moves by at most about ``1e-9`` per coordinate. On a
    CPU with several torch threads the LU factorisations
    run one system at a time (PyTorch's batched LU with MKL can return wrong factors silently
    there, pytorch/pytorch#141358); chunks of rows are sized by ``max_work_entries``.

    *Chain queries* (:meth:`log_marginals_chain`). One conditioning per chain on its prefix,
    by the cheapest formulation above, gives the conditional kernel ``K'`` on the ``L`` chain
    items (an ``[L, L]`` block instead of its diagonal). Pinning the chain items one after the
    other is then Gaussian elimination without pivoting of ``K' - diag(out)``, whose ``j``-th
    pivot is ``P(chain[j] in X | prefix, chain[:j]) - out_j``: ``O(L^3)`` per chain after one
    conditioning, instead of ``L`` conditionings. The elimination is written out (``L``
    batched rank-one updates), so no batched LU is involved. A pivot of 0 is a pin of
    probability 0: the rows after it hold NaN or garbage, as rows conditioned on an
    impossible assignment may.

    Examples
    --------
    >>> import torch
    >>> oracle = DPPOracle(L=torch.tensor([[1.0, 0.5], [0.5, 1.0]]))
    >>> values = torch.tensor([[1, 0]])
    >>> mask = torch.tensor([[True, False]])
    >>> oracle.log_marginals(values, mask)[0, 1].exp()  # P(1 in X | 0 in X)
    tensor([0.5714, 0.4286], dtype=torch.float64)

    A low-rank L-ensemble from features, ``L = Phi Phi^T`` (rank 2 on 4 items):

    >>> phi = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.5, -0.5]])
    >>> dual = DPPOracle(features=phi)
    >>> dual.rank
    2
    >>> torch.allclose(dual.kernel, DPPOracle(L=phi @ phi.T).kernel)
    True
    >>> values = torch.tensor([[1, 1, 0, 0]])
    >>> mask = torch.tensor([[True, True, False, False]])
    >>> dual.log_marginals(values, mask)[0, 2:, 1].exp()  # two items in: no room for more
    tensor([0., 0.], dtype=torch.float64)
    """

    consistent_queries = True  # its query methods (the conformance tests check them)

    def __init__(
        self,
        kernel: Any = None,
        L: Any = None,
        device: str | torch.device | None = None,
        features: Any = None,
    ) -> None:
        if sum(x is not None for x in (kernel, L, features)) != 1:
            raise ValueError(
                "pass exactly one of kernel (the marginal kernel K), L (an L-ensemble) and "
                "features (Phi with L = Phi Phi^T)"
            )
        k = ell = None
        if kernel is not None:
            k = _check_symmetric(as_float64(kernel, "kernel", device), "kernel")
            eig, vectors = torch.linalg.eigh(k)
            if eig.min() < -_TOLERANCE or eig.max() > 1 + _TOLERANCE:
                raise ValueError(
                    f"kernel must have eigenvalues in [0, 1] (a marginal kernel); got "
                    f"[{float(eig.min()):.3g}, {float(eig.max()):.3g}]. For an unnormalised "
                    f"kernel pass it as L= instead"
                )
            eig = eig.clamp(0.0, 1.0)
        elif L is not None:
            ell = _check_symmetric(as_float64(L, "L", device), "L")
            lam, vectors = torch.linalg.eigh(ell)
            if lam.min() < -_TOLERANCE * max(1.0, float(lam.abs().max())):
                raise ValueError(
                    f"L must be positive semi-definite; its smallest eigenvalue is "
                    f"{float(lam.min()):.3g}"
                )
            lam = lam.clamp(min=0)
            eig = lam / (1 + lam)
            k = (vectors * eig) @ vectors.T
            k = (k + k.T) / 2
        else:
            phi = as_float64(features, "features", device)
            if phi.dim() != 2 or phi.shape[0] < 1 or phi.shape[1] < 1:
                raise ValueError(
                    f"features must be a [n, d] matrix (L = features @ features.T); got shape "
                    f"{tuple(phi.shape)}"
                )
            vectors, sv, _ = torch.linalg.svd(phi, full_matrices=False)  # Phi = U S W^T
            eig = sv**2 / (1 + sv**2)  # K = U diag(s^2 / (1 + s^2)) U^T
        n = vectors.shape[0]
        keep = eig > _RANK_TOLERANCE
        self.rank = int(keep.sum())
        self.num_unit = int((eig >= 1 - _RANK_TOLERANCE).sum())
        if self.rank == 0:  # K = 0: keep one zero column so that shapes stay non-empty
            keep = eig == eig.max()
            keep &= keep.cumsum(0) == 1
            eig = torch.zeros_like(eig)
        self.eigenvalues = eig[keep]  # [r]
        factor = vectors[:, keep] * self.eigenvalues.sqrt()
        # A zero row at index n lets padded index lists gather zeros.
        self._factor_padded = torch.cat([factor, factor.new_zeros(1, factor.shape[1])])
        if ell is not None:
            self._ell_padded = torch.zeros(n + 1, n + 1, dtype=ell.dtype, device=ell.device)
            self._ell_padded[:n, :n] = ell
        else:
            self._ell_padded = None
        if k is not None:
            self._kernel_padded = torch.zeros(n + 1, n + 1, dtype=k.dtype, device=k.device)
            self._kernel_padded[:n, :n] = k
            self._diagonal = k.diagonal().clone()
        else:
            self._kernel_padded = None
            self._diagonal = (factor**2).sum(1)
        self.num_coords = n
        self.num_values = 2
        self.path = "auto"
        self.max_work_entries: int | None = None

    @property
    def path(self) -> str:
        """The formulation rows take (see the class docstring); checked when it is set."""
        return self._path

    @path.setter
    def path(self, value: str) -> None:
        if value not in _PATHS:
            raise ValueError(f"path must be one of {_PATHS}; got {value!r}")
        if value == "free" and self._ell_padded is None:
            raise ValueError('path "free" needs an oracle built from L=')
        self._path = value

    @property
    def factor(self) -> torch.Tensor:
        """``V``: DoubleTensor[n, max(r, 1)] with ``K = V V^T``."""
        return self._factor_padded[:-1]

    @property
    def kernel(self) -> torch.Tensor:
        """The marginal kernel ``K``: DoubleTensor[n, n]."""
        if self._kernel_padded is not None:
            return self._kernel_padded[:-1, :-1]
        v = self.factor
        k = v @ v.T
        return (k + k.T) / 2

    # -- the three formulations -------------------------------------------------------------
    # Each returns P(t in X | pins) for its targets, [B, k], or with ``full`` the conditional
    # kernel on its targets K'_TT, [B, k, k] (diagonal: those probabilities), and a BoolTensor
    # [B] of the singular rows.
    def _lowrank(
        self, out_pins: torch.Tensor, in_pins: torch.Tensor, targets: torch.Tensor, full: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``[r, r]`` form."""
        n = self.num_coords
        vz = self._factor_padded
        r = vz.shape[1]
        eye = torch.eye(r, dtype=vz.dtype, device=vz.device)
        b = out_pins.sum(1)
        use_b = b <= n - b
        gather = torch.where(use_b[:, None], out_pins, ~out_pins)
        w = vz[_padded_indices(gather, int(gather.sum(1).max()), n)]  # [B, g, r]
        gram = w.transpose(1, 2) @ w
        system = torch.where(
            use_b[:, None, None], eye - gram, torch.diag(1 - self.eigenvalues) + gram
        )  # I - V_B^T V_B, symmetric positive semi-definite
        a = in_pins.sum(1)
        a_max = int(a.max())
        v_t = vz[targets]  # [B, k, r]
        v_a = vz[_padded_indices(in_pins, a_max, n)]  # [B, a_max, r] (zero padding)
        k = targets.shape[1]
        y, singular = _solve(system, torch.cat([v_t, v_a], 1).transpose(1, 2))  # C [v_t, v_A]
        y_t, y_a = y[..., :k], y[..., k:]
        if full:
            result = v_t @ y_t  # V_T C V_T^T
        else:
            result = (v_t * y_t.transpose(1, 2)).sum(-1)  # v_t^T C v_t
        if a_max:
            k_ta = v_t @ y_a  # [B, k, a]
            padding = torch.arange(a_max, device=a.device) >= a[:, None]
            k_aa = v_a @ y_a + torch.diag_embed(padding.to(vz.dtype))  # identity on padding
            z, singular_a = _solve(k_aa, k_ta.transpose(1, 2))
            if full:
                result = result - k_ta @ z
            else:
                result = result - (k_ta.transpose(1, 2) * z).sum(1)
            singular = singular | singular_a
        return result, singular

    def _block(
        self, out_pins: torch.Tensor, in_pins: torch.Tensor, targets: torch.Tensor, full: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``[s, s]`` pinned block."""
        n = self.num_coords
        pinned = out_pins | in_pins
        s = pinned.sum(1)
        s_max = int(s.max())
        if full:
            if self._kernel_padded is not None:
                base = self._kernel_padded[targets[:, :, None], targets[:, None, :]]
            else:
                v_t = self._factor_padded[targets]
                base = v_t @ v_t.transpose(1, 2)
        else:
            base = self._diagonal[targets]
        if s_max == 0:
            return base.clone(), torch.zeros(len(s), dtype=torch.bool, device=s.device)
        index = _padded_indices(pinned, s_max, n)  # [B, s]
        if self._kernel_padded is not None:
            kz = self._kernel_padded
            k_ss = kz[index[:, :, None], index[:, None, :]]
            k_st = kz[index[:, :, None], targets[:, None, :]]  # [B, s, k]
        else:
            v_s = self._factor_padded[index]
            k_ss = v_s @ v_s.transpose(1, 2)
            k_st = v_s @ self._factor_padded[targets].transpose(1, 2)
        padding = torch.arange(s_max, device=s.device) >= s[:, None]
        out_flag = out_pins.gather(1, index.clamp(max=n - 1)) & ~padding
        system = (
            k_ss
            - torch.diag_embed(out_flag.to(k_ss.dtype))
            + torch.diag_embed(padding.to(k_ss.dtype))
        )
        solution, singular = _solve(system, k_st)
        if full:
            return base - k_st.transpose(1, 2) @ solution, singular
        return base - (k_st * solution).sum(1), singular

    def _free(
        self, out_pins: torch.Tensor, in_pins: torch.Tensor, targets: torch.Tensor, full: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``L`` on the items not pinned out (``U``): ``K'_FF = I - [(L_UU + diag(1_F))^-1]_FF``
        for the free items ``F``. Pinned targets get 0 (their entries of ``K'_TT`` are
        meaningless)."""
        n = self.num_coords
        kept = ~out_pins  # U = A ∪ F
        u = kept.sum(1)
        u_max = int(u.max())
        index = _padded_indices(kept, u_max, n)  # [B, u]
        ez = self._ell_padded
        padding = torch.arange(u_max, device=u.device) >= u[:, None]
        free = ~in_pins.gather(1, index.clamp(max=n - 1)) & ~padding
        system = ez[index[:, :, None], index[:, None, :]] + torch.diag_embed(
            (free | padding).to(ez.dtype)
        )
        rhs = (index[:, :, None] == targets[:, None, :]).to(ez.dtype)  # e_t, zero if t not in U
        solution, singular = _solve(system, rhs)
        if full:
            eye = torch.eye(targets.shape[1], dtype=ez.dtype, device=ez.device)
            return eye - rhs.transpose(1, 2) @ solution, singular
        free_target = ~(out_pins | in_pins).gather(1, targets)
        prob = torch.where(free_target, 1 - (rhs * solution).sum(1), 0.0)
        return prob, singular

    def _costs(self, out_pins, in_pins, k: int, full: bool) -> tuple[torch.Tensor, ...]:
        """Rough flop counts per row of the three formulations (float64 tensors [B])."""
        n, r = self.num_coords, self._factor_padded.shape[1]
        b = out_pins.sum(1).double()
        a = in_pins.sum(1).double()
        s = a + b
        g = torch.minimum(b, n - b)
        square = k * k if full else 0  # the [k, k] products of a full block
        low = 2 * g * r**2 + r**3 + 2 * (k + a) * r**2 + 2 * a * r * (k + a) + a**3
        low = low + 2 * square * (r + a)
        block = s**3 + 2 * s**2 * k + 2 * s * square
        if self._kernel_padded is None:
            block = block + 2 * s**2 * r + 2 * s * k * r
        u = n - b
        if self._ell_padded is not None:
            free = u**3 + 2 * u**2 * k + 2 * u * square
        else:
            free = torch.full_like(u, inf)
        return low, block, free

    def _conditioned(
        self, out_pins: torch.Tensor, in_pins: torch.Tensor, targets: torch.Tensor, full: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row by its cheapest formulation, grouped and chunked: ``P(targets in X)``
        [B, k] (or ``K'_TT`` [B, k, k] with ``full``) and the singular rows [B]."""
        n, k = self.num_coords, targets.shape[1]
        r = self._factor_padded.shape[1]
        batch = out_pins.shape[0]
        if self.path == "auto":
            choice = torch.stack(self._costs(out_pins, in_pins, k, full)).argmin(0)
        else:
            choice = torch.full((batch,), _PATHS.index(self.path) - 1, device=out_pins.device)
        shape = (batch, k, k) if full else (batch, k)
        result = torch.empty(shape, dtype=torch.float64, device=out_pins.device)
        singular = torch.zeros(batch, dtype=torch.bool, device=out_pins.device)
        limit = self.max_work_entries or work_entries(out_pins.device, _MAX_WORK_ENTRIES)
        square = 3 * k * k if full else 0
        for path in range(3):
            rows = (choice == path).nonzero().flatten()
            if not len(rows):
                continue
            if path == 0:
                b = out_pins[rows].sum(1)
                size = torch.maximum(torch.minimum(b, n - b), in_pins[rows].sum(1))

                def entries(m: int) -> int:
                    return m * r + r * r + 3 * r * (k + r) + r * r + 4 * k * r + square
            elif path == 1:
                size = (out_pins | in_pins)[rows].sum(1)

                def entries(m: int) -> int:
                    extra = 0 if self._kernel_padded is not None else m * r + k * r
                    return 4 * m * m + 3 * m * k + extra + 2 * k + square
            else:
                size = n - out_pins[rows].sum(1)

                def entries(m: int) -> int:
                    return 4 * m * m + 3 * m * k + 2 * k + square

            order = torch.argsort(size, stable=True)
            rows = rows[order]
            sizes = size[order].tolist()
            method = (self._lowrank, self._block, self._free)[path]
            for start, stop in _chunks(sizes, entries, limit):
                chunk = rows[start:stop]
                part, bad = method(out_pins[chunk], in_pins[chunk], targets[chunk], full)
                result[chunk] = part
                singular[chunk] |= bad
        return result, singular

    def _pins(
        self, values: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Out-pins, in-pins (emptied on impossible rows) and the count-impossible rows: an
        ``|X|`` above the rank, or below the number of unit eigenvalues."""
        out_pins = mask & (values == 0)
        in_pins = mask & ~out_pins
        impossible = (in_pins.sum(1) > self.rank) | (
            self.num_coords - out_pins.sum(1) < self.num_unit
        )
        return out_pins, in_pins & ~impossible[:, None], impossible

    def _in_probability(
        self, values: torch.Tensor, mask: torch.Tensor, targets: torch.Tensor
    ) -> torch.Tensor:
        """``P(targets in X | pins)``: DoubleTensor[B, k] (NaN on impossible rows)."""
        out_pins, in_pins, impossible = self._pins(values, mask)
        prob, singular = self._conditioned(out_pins, in_pins, targets, full=False)
        return _snap(prob, singular | impossible)

    def _log_marginals_at(
        self, values: torch.Tensor, mask: torch.Tensor, targets: torch.Tensor
    ) -> torch.Tensor:
        k = targets.shape[1]
        if values.shape[0]:
            prob = self._in_probability(values, mask, targets)
        else:
            prob = torch.empty(0, k, dtype=torch.float64, device=values.device)
        out = torch.stack([torch.log1p(-prob), torch.log(prob)], -1)
        return point_mass(out, mask.gather(1, targets), values.gather(1, targets).clamp(0, 1))

    def _log_marginals_chain(
        self, values: torch.Tensor, mask: torch.Tensor, chain: torch.Tensor
    ) -> torch.Tensor:
        """One conditioning per chain on its ``[L, L]`` block, then an elimination."""
        return self._chain_and_then(values, mask, chain, None)[0]

    def _log_marginals_chain_then(
        self, values: torch.Tensor, mask: torch.Tensor, chain: torch.Tensor, then: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The same conditioning on the ``[L + T, L + T]`` block of the chain and ``then``:
        after the chain's ``L`` elimination steps the ``then`` block is the kernel given the
        prefix and the whole chain."""
        return self._chain_and_then(values, mask, chain, then)

    def _chain_and_then(
        self, values: torch.Tensor, mask: torch.Tensor, chain: torch.Tensor, then
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        num_chains, length = chain.shape
        width = 0 if then is None else then.shape[1]
        device = values.device
        x = values.gather(1, chain).clamp(0, 1)
        inert = mask.gather(1, chain) | chain_repeats(chain)  # point masses
        if num_chains == 0 or length + width == 0:
            prob = torch.empty(num_chains, length + width, dtype=torch.float64, device=device)
        else:
            out_pins, in_pins, impossible = self._pins(values, mask)
            targets = chain if then is None else torch.cat([chain, then], 1)
            block, singular = self._conditioned(out_pins, in_pins, targets, full=True)
            prob = _chain_probabilities(block, x, inert)
            # |X| <= rank and |X| >= the number of unit eigenvalues, row by row (the row
            # after the chain: once the whole chain is pinned)
            new_in = (~inert & (x == 1)).long()
            new_out = (~inert & (x == 0)).long()
            ins = in_pins.sum(1, keepdim=True) + new_in.cumsum(1) - new_in
            outs = out_pins.sum(1, keepdim=True) + new_out.cumsum(1) - new_out
            if width:
                all_in = in_pins.sum(1, keepdim=True) + new_in.sum(1, keepdim=True)
                all_out = out_pins.sum(1, keepdim=True) + new_out.sum(1, keepdim=True)
                ins = torch.cat([ins, all_in.expand(-1, width)], 1)
                outs = torch.cat([outs, all_out.expand(-1, width)], 1)
            bad = (ins > self.rank) | (self.num_coords - outs < self.num_unit)
            prob = _snap(prob, (singular | impossible).unsqueeze(1) | bad)
        out = torch.stack([torch.log1p(-prob), torch.log(prob)], -1)
        chain_out = point_mass(out[:, :length], inert, x)
        if then is None:
            return chain_out, None
        done = pinned_with_chain(mask, chain).gather(1, then)
        after = point_mass(out[:, length:], done, values.gather(1, then).clamp(0, 1))
        return chain_out, after


def _chain_probabilities(block: torch.Tensor, x: torch.Tensor, inert: torch.Tensor) -> torch.Tensor:
    """``P(chain[j] in X | prefix, chain[:j])`` [C, L] from the conditional kernel ``K'``
    [C, L, L] of the chain given its prefix, and the chain's values ``x`` [C, L]. A block
    [C, L + T, L + T] whose last ``T`` items follow the chain gives [C, L + T]: the chain's,
    then ``P(item in X | prefix, chain)`` of each of those items (none is eliminated).

    Pinning item ``i`` in is ``K <- K - K[:, i] K[i, :] / K_ii`` and pinning it out
    ``K <- K - K[:, i] K[i, :] / (K_ii - 1)``: Gaussian elimination without pivoting of
    ``A = K' - diag(out)``, whose ``j``-th pivot is ``P(chain[j] in X | ...) - out_j``. A
    right-looking elimination, ``O(L^3)`` per chain. A zero pivot is a pin of probability 0:
    the rows after it hold inf or NaN (they are conditioned on an impossible assignment).
    ``inert`` coordinates (already pinned) are removed: identity rows and columns.
    """
    num_chains, size, _ = block.shape
    length = x.shape[1]
    after = block.new_zeros(num_chains, size - length)
    out_flag = torch.cat([((x == 0) & ~inert).to(block.dtype), after], 1)
    inert = torch.cat([inert, after > 0], 1)
    keep = ~(inert.unsqueeze(1) | inert.unsqueeze(2))
    a = (
        torch.where(keep, block, 0.0)
        - torch.diag_embed(out_flag)
        + torch.diag_embed(inert.to(block.dtype))
    )
    for j in range(length):
        if j + 1 < size:
            column = a[:, j + 1 :, j] / a[:, j, j].unsqueeze(1)  # [C, m]
            trailing = a[:, j + 1 :, j + 1 :]
            trailing.baddbmm_(column.unsqueeze(2), a[:, j : j + 1, j + 1 :], alpha=-1.0)
    return a.diagonal(dim1=1, dim2=2) + out_flag


def _snap(prob: torch.Tensor, bad: torch.Tensor) -> torch.Tensor:
    """Clip probabilities to ``[0, 1]``, set those within ``1e-9`` of 0 or 1 to 0 or 1 (so
    that the support is exact despite the rounding of the Schur complements), and put
    NaN on the rows ``bad`` ([B] or the shape of ``prob``)."""
    prob = prob.clamp(0.0, 1.0)
    prob = torch.where(prob < _SNAP, 0.0, torch.where(prob > 1 - _SNAP, 1.0, prob))
    if bad.any():
        if bad.dim() < prob.dim():
            bad = bad.unsqueeze(-1)
        prob = torch.where(bad, float("nan"), prob)
    return prob
