"""What a sampler run returns."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["SampleResult"]


@dataclass
class SampleResult:
    """Samples of a distribution on ``[q]^n`` and what they cost.

    Attributes
    ----------
    samples : LongTensor[N, n]
        The draws, in the oracle's original coordinate indexing.
    log_prob : DoubleTensor[N]
        ``log mu_sigma(x)``: the log probability of each draw under the oracle's chain rule in
        the order used to draw it (for an exact, consistent oracle: ``log mu(x)``).
    orders : LongTensor[N, n]
        ``orders[k, j]`` is the coordinate visited ``j``-th by draw ``k``.
    rounds : int
        Batched oracle calls the whole run made (the latency on parallel hardware).
    sample_rounds : LongTensor[N]
        Rounds in which draw ``k`` had a query in flight: its own latency in rounds.
    oracle_rows : int
        Rows (conditionings) queried by the whole run, cancelled work included.
    method : str
        The sampler that produced the draws.
    wall_time : float
        Seconds the run took.
    """

    samples: torch.Tensor
    log_prob: torch.Tensor
    orders: torch.Tensor
    rounds: int
    sample_rounds: torch.Tensor
    oracle_rows: int
    method: str
    wall_time: float

    @property
    def num_samples(self) -> int:
        """``N``, the number of draws."""
        return int(self.samples.shape[0])

    def __repr__(self) -> str:
        n = self.samples.shape[1] if self.samples.dim() == 2 else 0
        mean_rounds = self.sample_rounds.double().mean().item() if self.num_samples else 0.0
        return (
            f"SampleResult(method={self.method!r}, num_samples={self.num_samples}, num_coords={n}, "
            f"rounds={self.rounds}, mean sample_rounds={mean_rounds:.1f}, "
            f"oracle_rows={self.oracle_rows}, wall_time={self.wall_time:.3f}s)"
        )
