"""Rows of a :class:`~pyro_autospec.oracles.base.MarginalOracle`: requesting, batching, checking.

A sampler asks for rows with a :class:`RowRequest`: one assignment ``values`` of one sample,
several *cuts* (row ``j`` conditions on the first ``cuts[j]`` coordinates of that sample's
order) and, per row, a contiguous range of *target* positions of the order whose marginals it
needs. :class:`RowDispatcher` answers every request of a round with one batched oracle call
(cut into memory-sized chunks, which still count as one round), checks every returned row and
normalises it in float64.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pyro_autospec.engine.errors import OracleError
from pyro_autospec.oracles.base import has_targeted_marginals, oracle_num_draws

__all__ = ["RowRequest", "RowAnswer", "RowDispatcher"]


@dataclass
class RowRequest:
    """Rows conditioned on prefixes of one assignment of one sample.

    Parameters
    ----------
    sample : int
        Which sample (selects its order).
    values : ndarray int64[n]
        The assignment; only the first ``cuts[j]`` coordinates of the order are read by row ``j``.
    cuts : ndarray int64[r]
        Row ``j`` conditions on the coordinates ``order[:cuts[j]]``.
    starts, stops : ndarray int64[r]
        Row ``j`` returns the marginals of the coordinates ``order[starts[j]:stops[j]]``.
    """

    sample: int
    values: np.ndarray
    cuts: np.ndarray
    starts: np.ndarray
    stops: np.ndarray

    @property
    def num_rows(self) -> int:
        return len(self.cuts)


@dataclass
class RowAnswer:
    """Checked rows for one :class:`RowRequest`.

    Attributes
    ----------
    log_probs : ndarray float64[sum(stops - starts), q]
        Normalised log marginals, row after row, each row's targets in order.
    bad : ndarray bool[sum(stops - starts)]
        True where the oracle's row was unusable (NaN, ``+inf``, no mass, or not summing to
        one). Such a row is an error only if its conditioning is possible; the sampler decides.
    log_mass : ndarray float64[sum(stops - starts)]
        The log of the total mass the oracle returned (0 for a normalised row), for messages.
    offsets : ndarray int64[r + 1]
        Row ``j`` occupies ``log_probs[offsets[j]:offsets[j + 1]]``.
    """

    log_probs: np.ndarray
    bad: np.ndarray
    log_mass: np.ndarray
    offsets: np.ndarray

    def row(self, j: int) -> np.ndarray:
        return self.log_probs[self.offsets[j] : self.offsets[j + 1]]

    def check(self, j: int, what: str) -> np.ndarray:
        """Return row ``j``, raising :class:`OracleError` if any of its targets is bad."""
        lo, hi = self.offsets[j], self.offsets[j + 1]
        bad = self.bad[lo:hi]
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            mass = self.log_mass[lo + k]
            if np.isnan(mass):
                problem = "contains NaN"
            elif mass == -np.inf:
                problem = "gives zero mass to every value"
            elif mass == np.inf:
                problem = "contains +inf"
            else:
                problem = f"sums to {np.exp(mass):.6g} instead of 1"
            raise OracleError(
                f"The oracle's {what} (target {k} of that row) {problem}, although it is "
                "conditioned on an assignment of positive probability. log_marginals must return "
                "log probabilities normalised over the values of each coordinate (use "
                "torch.log_softmax on logits; -inf only for impossible values)."
            )
        return self.log_probs[lo:hi]


def _tolerance(dtype: torch.dtype) -> float:
    """How far ``logsumexp`` of a row may stray from 0 in the oracle's own precision."""
    eps = torch.finfo(dtype).eps if dtype.is_floating_point else 0.0
    return float(min(0.05, max(1e-9, 1000.0 * eps)))


class RowDispatcher:
    """Answer all row requests of one round with batched oracle calls.

    Parameters
    ----------
    oracle : MarginalOracle
    orders : ndarray int64[N, n]
        The visiting order of every sample.
    device : torch.device
        Where query tensors are built for the oracle.
    max_elements : int
        Largest ``rows x targets x q`` (or ``rows x n x q`` for full-row oracles) per oracle
        call; larger rounds are chunked. Chunks of one round count as one round.
    """

    def __init__(
        self,
        oracle,
        orders: np.ndarray,
        device: torch.device,
        max_elements: int = 2**24,
    ):
        self.oracle = oracle
        self.orders = orders
        self.ranks = np.empty_like(orders)
        np.put_along_axis(self.ranks, orders, np.arange(orders.shape[1])[None, :], axis=1)
        self.device = device
        self.max_elements = int(max_elements)
        self.n = int(oracle.num_coords)
        self.q = int(oracle.num_values)
        self.targeted = has_targeted_marginals(oracle)
        self.family = oracle_num_draws(oracle) is not None
        self.calls = 0

    def __call__(self, requests: list[RowRequest]) -> list[RowAnswer]:
        n, q = self.n, self.q
        num_rows = np.array([r.num_rows for r in requests])
        row_req = np.repeat(np.arange(len(requests)), num_rows)
        cuts = np.concatenate([r.cuts for r in requests])
        starts = np.concatenate([r.starts for r in requests])
        stops = np.concatenate([r.stops for r in requests])
        widths = stops - starts
        samples = np.array([r.sample for r in requests])
        values = np.stack([r.values for r in requests])
        # Sort rows by width so that padding targets to the widest row of a chunk wastes little.
        perm = np.argsort(widths, kind="stable")
        per_row = n * q if not self.targeted else None
        pieces: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        lo = 0
        total = len(perm)
        while lo < total:
            # Grow the chunk while it fits in the element budget.
            hi = lo + 1
            if self.targeted:
                while hi < total and (hi + 1 - lo) * int(widths[perm[hi]]) * q <= self.max_elements:
                    hi += 1
            else:
                hi = min(total, lo + max(1, self.max_elements // per_row))
            idx = perm[lo:hi]
            pieces.append((idx, *self._call(idx, row_req, cuts, starts, widths, samples, values)))
            lo = hi
        self.calls += 1
        # Scatter back: each row's unpadded targets, in the requests' own order.
        offsets_all = np.zeros(len(widths) + 1, dtype=np.int64)
        np.cumsum(widths, out=offsets_all[1:])
        log_probs = np.empty((offsets_all[-1], q))
        bad = np.empty(offsets_all[-1], dtype=bool)
        log_mass = np.empty(offsets_all[-1])
        for idx, lp, bd, lm in pieces:
            w = widths[idx]
            keep = np.arange(lp.shape[1])[None, :] < w[:, None]
            dest = (offsets_all[idx][:, None] + np.arange(lp.shape[1])[None, :])[keep]
            log_probs[dest] = lp[keep]
            bad[dest] = bd[keep]
            log_mass[dest] = lm[keep]
        answers = []
        row_lo = 0
        for r in range(len(requests)):
            row_hi = row_lo + num_rows[r]
            a, b = offsets_all[row_lo], offsets_all[row_hi]
            answers.append(
                RowAnswer(
                    log_probs[a:b], bad[a:b], log_mass[a:b], offsets_all[row_lo : row_hi + 1] - a
                )
            )
            row_lo = row_hi
        return answers

    def _call(self, idx, row_req, cuts, starts, widths, samples, values):
        n, q = self.n, self.q
        req = row_req[idx]
        smp = samples[req]
        width = int(widths[idx].max())
        vals = torch.from_numpy(values[req]).to(self.device)
        mask = torch.from_numpy(self.ranks[smp] < cuts[idx][:, None]).to(self.device)
        # Padded target positions repeat each row's last target.
        pos = starts[idx][:, None] + np.minimum(np.arange(width)[None, :], widths[idx][:, None] - 1)
        targets_np = np.take_along_axis(self.orders[smp], pos, axis=1)
        targets = torch.from_numpy(targets_np).to(self.device)
        extra = {"draws": torch.from_numpy(smp).to(self.device)} if self.family else {}
        if self.targeted:
            out = self.oracle.log_marginals_at(vals, mask, targets, **extra)
            expected = (len(idx), width, q)
            name = "log_marginals_at"
        else:
            out = self.oracle.log_marginals(vals, mask, **extra)
            expected = (len(idx), n, q)
            name = "log_marginals"
        if not isinstance(out, torch.Tensor):
            raise OracleError(f"oracle.{name} must return a torch.Tensor, got {type(out).__name__}")
        if tuple(out.shape) != expected:
            raise OracleError(
                f"oracle.{name} returned shape {tuple(out.shape)} for {len(idx)} rows; expected "
                f"{expected} = (rows, {'targets' if self.targeted else 'num_coords'}, num_values). "
                "Check the oracle's num_coords and num_values attributes."
            )
        if not out.dtype.is_floating_point:
            raise OracleError(
                f"oracle.{name} must return floating point log probabilities, got {out.dtype}"
            )
        tol = _tolerance(out.dtype)
        if not self.targeted:
            out = out.gather(1, targets.unsqueeze(-1).expand(-1, -1, q))
        out = out.detach().to(torch.float64)
        log_mass = torch.logsumexp(out, dim=-1)
        bad = (
            torch.isnan(out).any(-1)
            | (out == float("inf")).any(-1)
            | ~torch.isfinite(log_mass)
            | (log_mass.abs() > tol)
        )
        normalised = out - log_mass.unsqueeze(-1)
        return normalised.cpu().numpy(), bad.cpu().numpy(), log_mass.cpu().numpy()
