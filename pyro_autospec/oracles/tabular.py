"""The exact oracle of a distribution given by its full joint table over ``[q]^n``."""

from __future__ import annotations

from typing import Any

import torch

from ._util import as_float64
from .exact import ExactOracle

__all__ = ["TabularOracle"]

# Largest number of entries of one batched work tensor [rows, q^n] (float64: 32 MiB).
_MAX_WORK_ENTRIES = 1 << 22
# Largest joint table accepted (q^n entries).
_MAX_TABLE_ENTRIES = 1 << 26


class TabularOracle(ExactOracle):
    """Exact conditional marginals of a joint table over ``[q]^n`` (``n`` up to about 16).

    Parameters
    ----------
    logits : Tensor or array of shape [q] * n, optional
        The joint distribution as log-potentials (unnormalised log probabilities; ``-inf`` for
        impossible states). Any real values: a table of log-potentials that are all ``>= 0``
        is read as log values all the same.
    probs : Tensor or array of shape [q] * n, optional
        The joint distribution as non-negative weights (unnormalised probabilities).
        Pass exactly one of ``logits`` and ``probs``.
    device : str or torch.device, optional
        Where to keep the table (default: where the table is, else CPU).
    table, log
        Not accepted: a table passed by position (or with ``log=``) raises a ``TypeError``
        that says to pass ``logits=`` or ``probs=``, since the sign of the entries cannot tell
        log-potentials that are all ``>= 0`` from probabilities.

    Attributes
    ----------
    num_coords : int
        ``n``.
    num_values : int
        ``q``.
    log_probs : DoubleTensor[q, ..., q]
        The normalised joint log probabilities (``n`` dimensions).

    Notes
    -----
    A row conditioned on ``X_S = x_S`` adds ``-inf`` to every state that disagrees with a pin,
    scales the row by its most likely compatible state (so no row underflows as a whole) and
    marginalises with one matrix product against the one-hot digits of the states; a row
    costs ``O(n q^{n+1})`` flops. Rows are processed in chunks so that a work tensor has at
    most ``2^22`` entries. Rows in which some value has a marginal below ``1e-250`` times the
    most likely compatible state (or exactly zero) are redone with an exact ``logsumexp``, so
    no probability is lost to underflow. Pinned coordinates get a point mass at their value;
    rows conditioned on an impossible assignment are NaN. Chain queries
    (:meth:`log_marginals_chain`) are answered row by row (a row is the oracle's whole work
    anyway); padding rows cost nothing.

    Examples
    --------
    >>> import torch
    >>> joint = torch.tensor([[0.4, 0.1], [0.2, 0.3]])  # P(x0, x1)
    >>> oracle = TabularOracle(probs=joint)
    >>> values = torch.tensor([[1, 0]])
    >>> mask = torch.tensor([[True, False]])
    >>> oracle.log_marginals(values, mask)[0, 1].exp()  # P(x1 | x0 = 1)
    tensor([0.4000, 0.6000], dtype=torch.float64)

    Log-potentials, ``exp(2)`` on the diagonal (probabilities ``[.44, .06, .06, .44]``):

    >>> coupled = TabularOracle(logits=torch.tensor([[2.0, 0.0], [0.0, 2.0]]))
    >>> coupled.log_probs.exp().flatten()
    tensor([0.4404, 0.0596, 0.0596, 0.4404], dtype=torch.float64)
    """

    consistent_queries = True  # its query methods (the conformance tests check them)

    def __init__(
        self,
        table: Any = None,
        *,
        logits: Any = None,
        probs: Any = None,
        device: str | torch.device | None = None,
        log: bool | None = None,
    ) -> None:
        if table is not None or log is not None:
            hint = {True: "logits=", False: "probs="}.get(log, "logits= or probs=")
            raise TypeError(
                "TabularOracle takes the joint table as logits= (log-potentials: unnormalised "
                "log probabilities, -inf for impossible states) or probs= (non-negative "
                "weights); the sign of the entries cannot tell which (log-potentials may all "
                f"be >= 0). Pass the table as {hint}"
                "; log=True meant logits=, log=False probs=."
            )
        if (logits is None) == (probs is None):
            raise TypeError(
                "TabularOracle needs exactly one of logits= (log-potentials) and probs= "
                f"(non-negative weights); got {'both' if logits is not None else 'neither'}"
            )
        name = "logits" if probs is None else "probs"
        t = as_float64(logits if probs is None else probs, name, device, allow_neg_inf=True)
        if t.dim() < 1:
            raise ValueError(
                f"{name} must have one dimension per coordinate, shape [q] * n; got a scalar"
            )
        q = t.shape[0]
        if any(s != q for s in t.shape) or q < 1:
            raise ValueError(
                f"{name} must have shape [q] * n (every coordinate with the same number of "
                f"values; pad smaller supports with probability 0); got {tuple(t.shape)}"
            )
        if t.numel() > _MAX_TABLE_ENTRIES:
            raise ValueError(
                f"{name} has {t.numel()} entries (more than {_MAX_TABLE_ENTRIES}); use a "
                f"structured oracle (MarkovChainOracle, HMMOracle, TreePottsOracle, ...) instead"
            )
        if probs is not None:
            if (t < 0).any():
                raise ValueError(
                    "probs has negative entries; pass log-potentials as logits= instead"
                )
            t = t.log()
        total = torch.logsumexp(t.reshape(-1), 0)
        if not torch.isfinite(total):
            raise ValueError(
                f"{name} gives zero total mass; pass a table with at least one possible state "
                f"(a positive probability, or a finite log-potential)"
            )
        self.log_probs = t - total
        self.num_coords = t.dim()
        self.num_values = q

    def _marginals_chunk(
        self, values: torch.Tensor, mask: torch.Tensor, coords: list[int]
    ) -> torch.Tensor:
        """Log marginals [B, len(coords), q] of a chunk of rows."""
        n, q = self.num_coords, self.num_values
        batch = values.shape[0]
        arange = torch.arange(q, device=values.device)
        # penalty[b, j, v] = -inf where coordinate j is pinned to another value than v
        clash = mask.unsqueeze(-1) & (values.unsqueeze(-1) != arange)
        penalty = torch.where(clash, float("-inf"), 0.0).to(torch.float64)
        w = self.log_probs.unsqueeze(0).expand(batch, *([q] * n)).clone()
        for j in range(n):
            shape = [batch] + [1] * n
            shape[j + 1] = q
            w += penalty[:, j].reshape(shape)
        flat = w.reshape(batch, -1)
        # scale each row by its largest compatible state, then sum with one matrix product
        row_max = flat.amax(dim=1, keepdim=True)
        weights = torch.exp(flat - row_max)  # NaN on impossible rows, as documented
        onehot = self._digit_onehot()[:, coords].reshape(flat.shape[1], len(coords) * q)
        sums = (weights @ onehot).reshape(batch, len(coords), q)
        total = weights.sum(dim=1)
        out = sums.log() - total.log()[:, None, None]
        # Sums below 1e-250 of the best state may have lost digits to underflow: redo those
        # rows with an exact logsumexp (pinned coordinates are exact point masses anyway).
        index = torch.tensor(coords, device=values.device)
        free = ~mask[:, index]
        redo = ((sums < 1e-250) & free.unsqueeze(-1)).flatten(1).any(1) & (total > 0)
        if redo.any():
            rows = redo.nonzero().flatten()
            exact = w[rows]
            dims = list(range(1, n + 1))
            parts = []
            for i in coords:
                others = tuple(d for d in dims if d != i + 1)
                parts.append(torch.logsumexp(exact, dim=others) if others else exact)
            log_total = torch.logsumexp(exact.reshape(len(rows), -1), dim=1)
            out[rows] = torch.stack(parts, 1) - log_total[:, None, None]
        return out

    def _digit_onehot(self) -> torch.Tensor:
        """DoubleTensor[q^n, n, q]: ``onehot[s, i, v] = 1`` iff state ``s`` has ``x_i = v``."""
        cached = self.__dict__.get("_onehot")
        if cached is None or cached.device != self.log_probs.device:
            n, q = self.num_coords, self.num_values
            states = torch.arange(q**n, device=self.log_probs.device)
            powers = q ** torch.arange(n - 1, -1, -1, device=states.device)
            digits = (states[:, None] // powers) % q  # [q^n, n], coordinate 0 most significant
            cached = (digits.unsqueeze(-1) == torch.arange(q, device=states.device)).double()
            self._onehot = cached
        return cached

    def _chunk_size(self) -> int:
        return max(1, _MAX_WORK_ENTRIES // self.log_probs.numel())

    def _log_marginals(self, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        coords = list(range(self.num_coords))
        step = self._chunk_size()
        chunks = [
            self._marginals_chunk(values[s : s + step], mask[s : s + step], coords)
            for s in range(0, values.shape[0], step)
        ]
        if not chunks:
            return torch.empty(
                0, self.num_coords, self.num_values, dtype=torch.float64, device=values.device
            )
        return torch.cat(chunks, 0)

    def _log_marginals_at(
        self, values: torch.Tensor, mask: torch.Tensor, targets: torch.Tensor
    ) -> torch.Tensor:
        step = self._chunk_size()
        q = self.num_values
        chunks = []
        for s in range(0, values.shape[0], step):
            tg = targets[s : s + step]
            coords = torch.unique(tg).tolist()
            if not coords:
                chunks.append(torch.empty(tg.shape[0], 0, q, dtype=torch.float64, device=tg.device))
                continue
            part = self._marginals_chunk(values[s : s + step], mask[s : s + step], coords)
            position = torch.full((self.num_coords,), -1, dtype=torch.long, device=tg.device)
            position[torch.tensor(coords, device=tg.device)] = torch.arange(
                len(coords), device=tg.device
            )
            index = position[tg].unsqueeze(-1).expand(-1, -1, q)
            chunks.append(part.gather(1, index))
        if not chunks:
            return torch.empty(0, targets.shape[1], q, dtype=torch.float64, device=values.device)
        return torch.cat(chunks, 0)
