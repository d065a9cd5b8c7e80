"""Diagnostics of importance weights: Pareto k-hat (PSIS, via ArviZ), weights' ESS, IMH acceptance.

For draws ``(x, sigma)`` of a guide and a target known up to a constant, the log weights are
``log w = log p(x, data) - log q_sigma(x)``. Pareto-smoothed importance sampling [1]_ fits a
generalised Pareto distribution to the largest weights; its shape ``k-hat`` says whether
self-normalised estimates can be trusted: ``k < 0.5`` good, ``0.5 <= k < 0.7`` usable with
caution (slow convergence), ``k >= 0.7`` not trustworthy (variance may be infinite).

:func:`weight_diagnostics` computes everything a user acts on in one call (k-hat, the weights'
ESS, the acceptance rate of independent Metropolis-Hastings with the guide as proposal) and
words the warning with the fix; :class:`~pyro_autospec.infer.AutoSpec` reports it in
``summary()`` and in ArviZ's ``sample_stats``.

References
----------
.. [1] A. Vehtari, D. Simpson, A. Gelman, Y. Yao, J. Gabry. Pareto smoothed importance
   sampling. JMLR 25(72), 2024.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch

from pyro_autospec.diagnostics.arviz import psislw

__all__ = [
    "FLAT_LOG_WEIGHTS",
    "IMH_ACCEPTANCE_LOW",
    "KHAT_BAD",
    "KHAT_GOOD",
    "LOW_WEIGHTS_ESS",
    "MIN_TAIL_VALUES",
    "WeightDiagnostics",
    "imh_acceptance_estimate",
    "pareto_khat",
    "psis",
    "tail_values",
    "tied_tail",
    "weight_diagnostics",
    "weights_ess",
]

#: Below this k-hat the smoothed weights are reliable.
KHAT_GOOD = 0.5
#: At or above this k-hat the correction cannot be trusted.
KHAT_BAD = 0.7
#: Log weights whose spread (max - min) is at most this (weights within a factor of 2 of each
#: other) have no tail for a Pareto fit: their k-hat is reported as -inf (:func:`psis`).
FLAT_LOG_WEIGHTS = math.log(2.0)
#: Below this acceptance rate independent Metropolis-Hastings chains stick.
IMH_ACCEPTANCE_LOW = 0.1
#: A tail (the largest weights a Pareto fit reads) holding fewer distinct values than this (and
#: than half the tail) is not continuous: draws of a small discrete space revisit the same
#: values, and the fit to them is noise (k-hat 1 to inf on weights whose ESS was 75%). Its
#: k-hat is ``nan`` (:func:`tied_tail`).
MIN_TAIL_VALUES = 20
#: Where k-hat is unavailable (a tied tail) or only "usable with caution", a weights' ESS
#: below this share of the draws warns.
LOW_WEIGHTS_ESS = 0.1


def _as_numpy(log_weight) -> np.ndarray:
    if isinstance(log_weight, torch.Tensor):
        log_weight = log_weight.detach().cpu().double().numpy()
    return np.asarray(log_weight, dtype=np.float64)


def psis(log_weight) -> tuple[np.ndarray, float]:
    """Pareto-smoothed, normalised log weights and their k-hat (``arviz.psislw``).

    Parameters
    ----------
    log_weight : Tensor[N] or array[N]
        Unnormalised log importance weights; ``-inf`` allowed (zero weight).

    Returns
    -------
    smoothed : ndarray float64[N]
        Smoothed log weights, normalised so that ``exp(smoothed).sum() == 1``.
    khat : float
        The Pareto shape estimate: ``nan`` where it cannot be estimated (fewer than 5 draws,
        or a tail of a few tied values, :func:`tied_tail`: those weights are not smoothed);
        ``-inf`` for weights within a factor of 2 of each other
        (:data:`FLAT_LOG_WEIGHTS`: no tail to fit).

    Examples
    --------
    >>> import numpy as np
    >>> smoothed, khat = psis(np.random.default_rng(0).normal(size=1000))
    >>> round(float(np.exp(smoothed).sum()), 6), khat < 0.5
    (1.0, True)
    """
    lw = _as_numpy(log_weight).reshape(-1)
    finite = np.isfinite(lw)
    if finite.sum() == 0:
        raise ValueError("every importance weight is zero (log weight -inf or nan)")
    out = np.full_like(lw, -np.inf)
    if finite.sum() < 5:
        out[finite] = lw[finite] - np.logaddexp.reduce(lw[finite])
        return out, math.nan
    if np.ptp(lw[finite]) <= FLAT_LOG_WEIGHTS:
        # Weights within a factor of 2 of each other (an exact oracle, or a guide close to the
        # target): no draw can carry more than twice another's weight, so there is no tail.
        # The generalised Pareto fit to the largest of them is noise (a few tied values of a
        # discrete target: ArviZ gave k-hat 1.18 and 7.92 on weights 0.9% and 10% apart, and
        # inf on three values 35% apart); bounded weights have k <= 0, reported -inf. They are
        # normalised as they are, without smoothing.
        out[finite] = lw[finite] - np.logaddexp.reduce(lw[finite])
        return out, -math.inf
    if tied_tail(lw[finite]):
        # Ties in the tail: the draws revisit a few values (a small discrete space), whose
        # weights are bounded; a Pareto fit to them is noise, and smoothing by it would move
        # weight between the revisited values. They are normalised as they are.
        out[finite] = lw[finite] - np.logaddexp.reduce(lw[finite])
        return out, math.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        smoothed, khat = psislw(lw[finite] - lw[finite].max())
    out[finite] = smoothed
    return out, float(khat)


def _tail_size(num: int) -> int:
    """How many of ``num`` weights the Pareto fit reads (ArviZ's ``psislw``, ``r_eff = 1``)."""
    return int(math.ceil(min(0.2 * num, 3.0 * math.sqrt(num))))


def tied_tail(log_weight) -> bool:
    """Whether the tail a Pareto fit reads is a few tied values: fewer distinct ones than
    :data:`MIN_TAIL_VALUES` and than half the tail (a tail of 19 weights, that of 95 draws or
    fewer, is fitted unless it repeats itself).

    Examples
    --------
    >>> import numpy as np
    >>> tied_tail(np.arange(1000.0) % 3), tied_tail(np.arange(80.0)), tied_tail(np.arange(80.0) % 5)
    (True, False, True)
    """
    lw = _as_numpy(log_weight).reshape(-1)
    size = _tail_size(int(np.isfinite(lw).sum()))
    return tail_values(lw) < min(MIN_TAIL_VALUES, size / 2)


def tail_values(log_weight) -> int:
    """The number of distinct values among the largest finite weights, those a Pareto fit
    reads; at most that tail's size (see :data:`MIN_TAIL_VALUES`).

    Examples
    --------
    >>> import numpy as np
    >>> tail_values(np.arange(1000.0)), tail_values(np.arange(1000.0) % 3)
    (95, 1)
    """
    lw = _as_numpy(log_weight).reshape(-1)
    lw = np.sort(lw[np.isfinite(lw)])
    return int(np.unique(lw[-_tail_size(lw.size) :]).size) if lw.size else 0


def pareto_khat(log_weight) -> float:
    """The PSIS Pareto shape ``k-hat`` of a set of log weights (see :func:`psis`).

    Examples
    --------
    >>> import numpy as np
    >>> heavy = np.random.default_rng(0).standard_cauchy(4000)  # log of heavy-tailed weights
    >>> pareto_khat(np.log(np.abs(heavy))) > 0.7
    True
    """
    return psis(log_weight)[1]


def weights_ess(log_weight) -> float:
    """Kish's effective sample size ``(sum w)^2 / sum w^2`` of importance weights.

    Parameters
    ----------
    log_weight : Tensor[N] or array[N]
        Log weights (any constant offset).

    Returns
    -------
    float
        Between 1 and ``N``; ``N`` for equal weights.

    Examples
    --------
    >>> import numpy as np
    >>> round(weights_ess(np.zeros(100)), 6)
    100.0
    """
    lw = _as_numpy(log_weight).reshape(-1)
    lw = lw[np.isfinite(lw)]
    if lw.size == 0:
        return 0.0
    return float(math.exp(2 * np.logaddexp.reduce(lw) - np.logaddexp.reduce(2 * lw)))


def imh_acceptance_estimate(log_weight) -> float:
    """Stationary acceptance rate of independent Metropolis-Hastings, from the weights alone.

    With the guide ``q`` as proposal and the target ``p``, a chain at stationarity accepts
    with probability ``E_{x ~ p, x' ~ q} min(1, w(x') / w(x))``. The draws ``x_l ~ q`` and
    their weights estimate it without running a chain (self-normalised for ``x ~ p``):

    ``sum_k wbar_k (1 / N) sum_l min(1, w_l / w_k)``, ``wbar_k = w_k / sum w``,

    in ``O(N log N)`` (sorted prefix sums). It needs no particular order of the draws, so it
    also says what ``correction="imh"`` would give when ``"importance"`` was used.

    Parameters
    ----------
    log_weight : Tensor[N] or array[N]
        Log weights (any constant offset; ``-inf`` allowed).

    Returns
    -------
    float
        In ``[0, 1]``; ``1`` for equal weights.

    Examples
    --------
    >>> import numpy as np
    >>> round(imh_acceptance_estimate(np.zeros(10)), 6)
    1.0
    >>> rng = np.random.default_rng(0)
    >>> 0.3 < imh_acceptance_estimate(rng.normal(0.0, 1.0, 4000)) < 0.7
    True
    """
    lw = _as_numpy(log_weight).reshape(-1)
    num = lw.size
    lw = lw[np.isfinite(lw)]
    if lw.size == 0:
        return 0.0
    s = np.sort(lw)
    m = s.size
    # below[k] = log sum_{l < k} exp(s_l); -inf for k = 0.
    below = np.concatenate([[-np.inf], np.logaddexp.accumulate(s)[:-1]])
    # sum over all N proposals of min(1, w_l / w_k): zero-weight proposals add 0.
    inner = (m - np.arange(m)) + np.exp(below - s)
    wbar = np.exp(s - np.logaddexp.reduce(s))
    return float(min(1.0, np.sum(wbar * inner) / num))


@dataclass
class WeightDiagnostics:
    """What :func:`weight_diagnostics` found; ``str()`` is a one-paragraph summary.

    Attributes
    ----------
    khat : float
        Pareto k-hat of all draws' weights pooled (``-inf`` for equal weights).
    weights_ess : float
        Kish's ESS of the pooled weights.
    num_draws : int
        Guide draws in all (every chain, before any correction).
    imh_acceptance : float
        The IMH acceptance rate: the mean acceptance probability of the chains when they were
        run (``acceptance_source = "chains"``), else :func:`imh_acceptance_estimate`.
    acceptance_source : {"chains", "estimate"}
    correction : str or None
        The correction the draws went through (``None``, ``"importance"``, ``"imh"``).
    khat_per_chain, weights_ess_per_chain : list of float
        The same per chain (one entry for a single set of draws).
    khat_unavailable : str or None
        Why the pooled k-hat is ``nan``, where it is.
    evidence_share : float
        The weights' mean over the model's exact evidence ``Z`` (``E_q[p / q] = Z`` times the
        posterior mass where the guide draws): below 1 by more than its noise, the guide
        gives part of the posterior little or no mass, which no correction recovers. ``nan``
        where no exact ``Z`` was given.
    evidence_tolerance : float
        How far below 1 :attr:`evidence_share` may fall by chance (four standard errors of
        the weights' mean, at least 5%).
    """

    khat: float
    weights_ess: float
    num_draws: int
    imh_acceptance: float
    acceptance_source: str
    correction: str | None = None
    khat_per_chain: list = field(default_factory=list)
    weights_ess_per_chain: list = field(default_factory=list)
    khat_unavailable: str | None = None
    evidence_share: float = math.nan
    evidence_tolerance: float = math.nan

    @property
    def verdict(self) -> str:
        """``"reliable"``, ``"usable with caution"``, ``"not reliable"`` (from k-hat), or
        ``"unavailable"`` (fewer than 5 draws: no k-hat)."""
        if math.isnan(self.khat):
            return "unavailable"
        if self.khat < KHAT_GOOD:
            return "reliable"
        if self.khat < KHAT_BAD:
            return "usable with caution"
        return "not reliable"

    def warning(self) -> str | None:
        """The warning a user should see, naming the fix, or ``None``."""
        if self.correction is None:
            return (
                f"with correction=None the draws are exact for the guide, not for the model's "
                f"posterior (Pareto "
                f"k-hat {self.khat:.2f}, weights' ESS {self.weights_ess:.0f} of "
                f"{self.num_draws}); use correction='importance' or correction='imh'"
            )
        problems = []
        share = self.weights_ess / max(self.num_draws, 1)
        if self.evidence_share < 1.0 - self.evidence_tolerance:
            problems.append(
                f"the weights' mean is {self.evidence_share:.1%} of the model's evidence Z "
                f"(exact, by elimination): the guide or oracle the draws come from gives about "
                f"{1 - self.evidence_share:.0%} "
                f"of the posterior little or no mass, which no correction recovers"
            )
        # a low ESS where k-hat is unavailable or only "usable with caution" (0.5 to 0.7: an
        # outside test found 47 of 20,000 draws at k-hat 0.69, and P(a = 1) 0.32 against
        # 0.62); a good k-hat's low ESS is slow, not wrong, and k-hat >= 0.7 warns below
        cautious = math.isnan(self.khat) or KHAT_GOOD <= self.khat < KHAT_BAD
        if cautious and self.num_draws >= 5 and share < LOW_WEIGHTS_ESS:
            khat = (
                f"k-hat is unavailable: {self.khat_unavailable}"
                if math.isnan(self.khat)
                else f"k-hat {self.khat:.2f}"
            )
            problems.append(
                f"the weights' ESS is {self.weights_ess:.0f} of {self.num_draws} draws "
                f"({share:.1%}; {khat}): a few draws carry most of the weight and the "
                f"'{self.correction}' correction cannot be trusted"
            )
        if self.khat >= KHAT_BAD:  # NaN (too few draws for a k-hat) is no evidence
            problems.append(
                f"Pareto k-hat of the importance weights is {self.khat:.2f} (>= {KHAT_BAD}; "
                f"weights' ESS {self.weights_ess:.0f} of {self.num_draws}): the weights have a "
                f"heavy tail and the '{self.correction}' correction cannot be trusted"
            )
        if self.correction == "imh" and self.imh_acceptance < IMH_ACCEPTANCE_LOW:
            problems.append(
                f"the IMH chains accept {self.imh_acceptance:.1%} of their proposals: they "
                f"stick, so their effective sample size is small"
            )
        if not problems:
            return None
        if self.evidence_share < 1.0 - self.evidence_tolerance:
            fix = (
                "More draws do not help where the draws' law gives no mass: train the guide "
                "longer or make it wider (a guide network gives every value some mass), or "
                "give an oracle of your own the posterior's whole support"
            )
        elif self.khat >= 1.0:
            fix = (
                "Train the guide longer (fit_posterior: more num_steps or max_seconds) or make "
                "it wider (hidden_dim, num_layers; architecture='graph' reads the model's "
                "factor graph); with k-hat >= 1 more draws do not help"
            )
        else:
            more = (
                "run more draws (num_samples, warmup_steps)"
                if self.correction == "imh"
                else "use correction='imh' with more draws (num_samples, warmup_steps)"
            )
            fix = (
                "Train the guide longer (fit_posterior: more num_steps or max_seconds), make "
                f"it wider (hidden_dim, num_layers), or {more} and check R-hat"
            )
        return "; ".join(problems) + ". " + fix + "."

    def warn(self, stacklevel: int = 2) -> None:
        """Issue :meth:`warning` as a ``UserWarning`` if there is one."""
        message = self.warning()
        if message is not None:
            warnings.warn(message, UserWarning, stacklevel=stacklevel + 1)

    def as_dict(self) -> dict:
        """Plain values (for ``diagnostics()``, ArviZ attributes, JSON)."""
        return {
            "khat": self.khat,
            "weights_ess": self.weights_ess,
            "num_draws": self.num_draws,
            "imh_acceptance": self.imh_acceptance,
            "acceptance_source": self.acceptance_source,
            "correction": self.correction,
            "verdict": self.verdict,
            "khat_per_chain": list(self.khat_per_chain),
            "weights_ess_per_chain": list(self.weights_ess_per_chain),
            "evidence_share": self.evidence_share,
        }

    def __str__(self) -> str:
        per_chain = ", ".join(f"{k:.2f}" for k in self.khat_per_chain)
        source = "estimated"
        if self.acceptance_source == "chains":
            source = "mean acceptance probability of the chains"
        return (
            f"Importance weights log p(x, data) - log q_sigma(x) of {self.num_draws} guide "
            f"draws: Pareto k-hat {self.khat:.2f} ({self.verdict}; per chain {per_chain}), "
            f"weights' ESS {self.weights_ess:.1f} ({100 * self.weights_ess / self.num_draws:.1f}"
            f"%), IMH acceptance {self.imh_acceptance:.2f} ({source})"
            + (
                ""
                if math.isnan(self.evidence_share)
                else f", weights' mean {self.evidence_share:.1%} of the exact evidence Z"
            )
            + f". Correction: {self.correction}."
        )


def weight_diagnostics(
    log_weight,
    *,
    accept_prob=None,
    correction: str | None = "importance",
    log_normalizer: float | None = None,
) -> WeightDiagnostics:
    """k-hat, weights' ESS and IMH acceptance of a guide's draws, in one call.

    Parameters
    ----------
    log_weight : Tensor[C, N] or Tensor[N] (or arrays)
        ``log p(x, data) - log q_sigma(x)`` of every guide draw, per chain (all draws the guide
        made, warm-up included, before any correction).
    accept_prob : Tensor[C, M] or Tensor[M], optional
        The acceptance probabilities of the IMH chains' steps, when they were run
        (``independent_metropolis_hastings``); their mean is the acceptance rate. Otherwise
        it is estimated from the weights (:func:`imh_acceptance_estimate`).
    correction : {None, "importance", "imh"}
        The correction applied, for the verdict and the warning.
    log_normalizer : float, optional
        The model's exact ``log Z`` (by elimination), where known: the weights' mean is
        compared with it (:attr:`WeightDiagnostics.evidence_share`).

    Returns
    -------
    WeightDiagnostics

    Examples
    --------
    >>> import torch
    >>> log_weight = torch.randn(2, 500, generator=torch.Generator().manual_seed(0)) * 0.3
    >>> diag = weight_diagnostics(log_weight, correction="imh")
    >>> diag.verdict, diag.num_draws, diag.warning() is None, diag.imh_acceptance > 0.7
    ('reliable', 1000, True, True)
    >>> heavy = weight_diagnostics(torch.randn(1000) * 4.0, correction="imh")
    >>> "Train the guide longer" in heavy.warning()
    True
    """
    lw = _as_numpy(log_weight)
    if lw.ndim == 1:
        lw = lw[None]
    if lw.ndim != 2 or lw.size == 0:
        raise ValueError(
            f"log_weight must be Tensor[C, N] or Tensor[N] with draws; got shape {lw.shape}"
        )
    if correction not in (None, "importance", "imh"):
        raise ValueError(f"correction must be None, 'importance' or 'imh'; got {correction!r}")
    pooled = lw.reshape(-1)
    if accept_prob is not None:
        rate = float(np.mean(_as_numpy(accept_prob)))
        source = "chains"
    else:
        rate = imh_acceptance_estimate(pooled)
        source = "estimate"
    khat = pareto_khat(pooled)
    unavailable = None
    if math.isnan(khat):
        finite = int(np.isfinite(pooled).sum())
        unavailable = f"fewer than 5 draws of nonzero weight ({finite})"
        if finite >= 5:
            unavailable = "the Pareto fit failed"
        if finite >= 5 and tied_tail(pooled):
            unavailable = (
                f"the {_tail_size(finite)} largest weights take {tail_values(pooled)} distinct "
                f"values (draws of a small discrete space, revisited): no continuous tail to "
                f"fit, and the weights are not smoothed"
            )
    return WeightDiagnostics(
        khat=khat,
        khat_unavailable=unavailable,
        weights_ess=weights_ess(pooled),
        num_draws=int(pooled.size),
        imh_acceptance=rate,
        acceptance_source=source,
        correction=correction,
        khat_per_chain=[pareto_khat(chain) for chain in lw],
        weights_ess_per_chain=[weights_ess(chain) for chain in lw],
        **_evidence(pooled, log_normalizer),
    )


def _evidence(log_weight: np.ndarray, log_normalizer: float | None) -> dict[str, float]:
    """The weights' mean over the exact evidence, and how far below 1 it may fall by chance
    (four standard errors of the mean of ``N`` weights, relative: ``sqrt((N / ESS - 1) / N)``
    with Kish's ESS; at least 5%)."""
    if log_normalizer is None or not math.isfinite(log_normalizer):
        return {}
    finite = log_weight[np.isfinite(log_weight)]
    num = log_weight.size
    if finite.size == 0:
        return {"evidence_share": 0.0, "evidence_tolerance": 0.05}
    top = finite.max()
    log_mean = top + math.log(np.exp(finite - top).sum() / num)
    ess = weights_ess(log_weight)
    error = math.sqrt(max(num / ess - 1.0, 0.0) / num)
    return {
        "evidence_share": math.exp(log_mean - log_normalizer),
        "evidence_tolerance": max(0.05, 4.0 * error),
    }
