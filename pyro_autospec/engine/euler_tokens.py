"""Autospeculation on Euler-Maruyama chains step by step, on the host control plane.

The target is the law of the chain ``X_{k+1} = X_k + b(t_k, X_k) h_k + s sqrt(h_k) xi_k`` on
``t_0 < ... < t_N`` (:mod:`pyro_autospec.engine.diffusion`). Every draw walks its steps in
time order, a *window* of steps per round, like speculative decoding with its tokens:

* **Draft.** The window's ``w`` increments are drawn with one frozen drift ``b*``:
  ``dX_j = b* h_j + s sqrt(h_j) z_j``. ``b*`` is the last drift the draw knows: the drift at
  the window's start when the previous window passed whole (it was the verification's last
  row), else the drift at the start of the step that was redrawn.
* **Verify**, in one round: the drifts ``b_j = b(t_j, X_j)`` along the drafted path (the
  start's too when it is not known yet, and the one at the window's end, which drafts the next
  window). Step ``j`` passes when ``log u_j < min(0, l_j)`` with
  ``l_j = [<b_j - b*, dX_j> - (|b_j|^2 - |b*|^2) h_j / 2] / s^2``, the log ratio of the
  chain's step density ``N(b_j h_j, s^2 h_j I)`` to the draft's ``N(b* h_j, s^2 h_j I)``.
* **The first step that fails is redrawn** from the residual ``(p - q)_+ / TV`` by the
  reflection coupling of the two Gaussians (no oracle call): with ``e`` the unit vector along
  ``b* - b_j``, ``z' = z_j - 2 <e, z_j> e`` and ``dX_j = b_j h_j + s sqrt(h_j) z'``. The
  steps after it are dropped, and the next window starts after it.

Each kept step has exactly the chain's law given the path before it: a passed step has
density ``min(p, q)``, a redrawn one ``p - min(p, q)`` (the coupling is maximal), and the
noise and uniform of step ``k`` (keyed by the draw and ``k``) are independent of the path
before it, which alone chose the draft. So the output is the chain's law, whatever the
windows. Window sizes follow the draw's own past (:meth:`~pyro_autospec.engine.schedule.
BlockPolicy.token_window`: twice its mean run of passed steps per redrawn one), so they are
exact too. A step is one row; nothing is raced, so there are no residual tries and no heavy
tail of rows.

Randomness is keyed: step ``k`` of a draw reads ``normal(child(draw, LEAF, k), DRAFT, c)``
(the sequential chain's noise of that step) and ``uniform(child(draw, LEAF, k), ACCEPT, 0)``.
With ``max_block=1`` every window is one step whose drift is known: the sequential chain,
draw for draw.

The draws' state lives on the host in NumPy float64 arrays; a round uploads the drafted
states once, calls the drift once and copies its answers back once. The reference engine
(:func:`pyro_autospec.engine.reference.discrete.token_draw`) runs the same window arithmetic
(:func:`draft_windows`, :func:`verify_windows`) one draw at a time through its generator
scheduler, so both engines give the same draws.

This module does not import Pyro.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from pyro_autospec.engine import keys
from pyro_autospec.engine.euler import (
    Chain,
    DriftEvaluator,
    EulerOutput,
    check_log_ratio,
    paths_from_increments,
    raise_not_finite,
)
from pyro_autospec.engine.modes import engine_mode
from pyro_autospec.engine.schedule import BlockPolicy
from pyro_autospec.engine.stepping import run_rounds

__all__ = [
    "EulerTokens",
    "HostChain",
    "Draft",
    "Verdict",
    "draft_windows",
    "euler_step",
    "host_drift",
    "host_float64",
    "host_output",
    "row_mask",
    "token_policy",
    "verify_windows",
]


def host_float64(tensor: torch.Tensor) -> np.ndarray:
    """``tensor`` as a float64 NumPy array on the host (no copy where it already is one)."""
    return tensor.detach().to("cpu", torch.float64).numpy()


def host_drift(evaluate: DriftEvaluator, t: np.ndarray, x: np.ndarray) -> np.ndarray:
    """One drift call on host arrays: times ``t`` [B] and states ``x`` [B, d] in, the drift
    float64 [B, d] out. ``x`` is handed over as it is: pass an array nothing else reads after
    the call (a drift may write into its input)."""
    return host_float64(evaluate(torch.from_numpy(t), torch.from_numpy(x)))


def euler_step(
    chain: HostChain, k: int, drift: np.ndarray, z: np.ndarray, name: str
) -> tuple[np.ndarray, np.ndarray]:
    """Step ``k`` of the chain from the drift ``b`` ([..., d]) and standard noise ``z``
    ([..., d]): the increment ``b h_k + s sqrt(h_k) z`` and its log density under the step's
    Gaussian ([...]), in the arithmetic every sequential chain of the host plane uses (so
    that both engines give the same bits).

    Raises
    ------
    OracleError
        Where ``|b|^2 h`` overflows float64 (``name`` names the drift or oracle).
    """
    h = chain.h[k]
    increment = drift * h + chain.sd[k] * z
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow is raised, named
        resid = increment - drift * h
        log_density = chain.step_log_norm[k] - 0.5 * (resid * resid).sum(-1) / (chain.var * h)
    check_log_ratio(_NO_RATIO, np.atleast_1d(log_density), name)  # a step has no ratio
    return increment, log_density


_NO_RATIO = np.zeros(0)


@dataclass(frozen=True)
class HostChain:
    """The time grid of a chain as NumPy float64 arrays on the host.

    Attributes
    ----------
    times : ndarray[N + 1]
    h : ndarray[N]
        Step lengths.
    sd : ndarray[N]
        Noise standard deviations ``s sqrt(h_k)``.
    var : float
        ``s^2``.
    step_log_norm : ndarray[N]
        ``-d / 2 log(2 pi s^2 h_k)``: the log normaliser of a step's density.
    dim : int
    """

    times: np.ndarray
    h: np.ndarray
    sd: np.ndarray
    var: float
    step_log_norm: np.ndarray
    dim: int

    @classmethod
    def of(cls, chain: Chain) -> HostChain:
        """The host copy of ``chain`` (float64 whatever the device)."""
        times = host_float64(chain.times)
        h = np.diff(times)
        var = float(chain.var)
        return cls(
            times=times,
            h=h,
            sd=np.sqrt(var) * np.sqrt(h),
            var=var,
            step_log_norm=-0.5 * chain.dim * np.log(2 * np.pi * var * h),
            dim=chain.dim,
        )

    @property
    def num_steps(self) -> int:
        return int(self.h.shape[0])


def token_policy(knobs: dict) -> BlockPolicy:
    """The window policy of the token rule's resolved knobs (``max_block``, ``min_block``)."""
    return BlockPolicy(
        max_block=int(knobs["max_block"]), min_block=int(knobs["min_block"]), token_below=None
    )


def _steps(chain: HostChain, k: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Steps ``k + j`` of windows starting at ``k`` (clamped to the last): int64 [L, width],
    and the positions ``j`` [width]."""
    j = np.arange(width)
    return np.minimum(k[:, None] + j, chain.num_steps - 1), j


@dataclass
class Draft:
    """Drafted windows: steps ``k .. k + w - 1`` of each draw with its drift frozen (all arrays
    have ``L`` rows; ``W = max w``).

    Attributes
    ----------
    draw_keys : ndarray[L] of int64
        The draws' keys.
    k, w : ndarray[L] of int64
        First step and length (``>= 0``) of each window.
    frozen : ndarray[L, d]
        The draft drift ``b*``.
    z : ndarray[L, W, d]
        Standard normal noise of the steps.
    increments : ndarray[L, W, d]
        ``b* h + s sqrt(h) z`` (zero beyond a window's end).
    states : ndarray[L, W + 1, d]
        ``X_k`` and the drafted states after each step.
    """

    draw_keys: np.ndarray
    k: np.ndarray
    w: np.ndarray
    frozen: np.ndarray
    z: np.ndarray
    increments: np.ndarray
    states: np.ndarray


def draft_windows(chain: HostChain, draw_keys: np.ndarray, windows: np.ndarray, x, frozen) -> Draft:
    """Draft windows of steps with the drift frozen.

    Parameters
    ----------
    chain : HostChain
    draw_keys : ndarray[L] of int64
        The draws' keys.
    windows : ndarray[L, 2] of int64
        First step ``k`` and length ``w >= 0`` of each window.
    x : ndarray[L, d]
        State ``X_k`` of each draw.
    frozen : ndarray[L, d]
        The draft drift ``b*``.

    Returns
    -------
    Draft
    """
    k, w = windows[:, 0], windows[:, 1]
    width = int(w.max()) if w.size else 0
    step, j = _steps(chain, k, width)
    step_keys = keys.host_child(draw_keys[:, None], keys.Tag.LEAF, step)
    z = keys.host_normal(step_keys[..., None], keys.Tag.DRAFT, np.arange(chain.dim))
    z = z.reshape(k.shape[0], width, chain.dim)
    increments = frozen[:, None, :] * chain.h[step][..., None] + chain.sd[step][..., None] * z
    increments = np.where((j < w[:, None])[..., None], increments, 0.0)
    states = np.concatenate([x[:, None], x[:, None] + np.cumsum(increments, 1)], 1)
    return Draft(draw_keys, k, w, frozen, z, increments, states)


def row_mask(chain: HostChain, windows: np.ndarray, known: np.ndarray) -> np.ndarray:
    """Which states of the windows (``windows`` as in :func:`draft_windows`) the verification
    asks the drift at: bool [L, W + 1].

    State ``j`` of a window (``X_{k + j}``) is asked for ``j = 0`` unless its drift is known,
    for ``0 < j < w``, and for ``j = w`` (it drafts the next window) unless that is the
    chain's end.
    """
    k, w = windows[:, 0], windows[:, 1]
    width = int(w.max()) if w.size else 0
    j = np.arange(width + 1)
    return (
        (j >= known.astype(np.int64)[:, None])
        & (j <= w[:, None])
        & (k[:, None] + j < chain.num_steps)
    )


@dataclass
class Verdict:
    """What the verification of windows decided (all arrays have ``L`` rows).

    Attributes
    ----------
    count : ndarray[L] of int64
        Steps kept: the passed ones, and the redrawn one if a step failed.
    missed : ndarray[L] of bool
        Whether a step failed (and was redrawn).
    increments : ndarray[L, W, d]
        The kept increments (zero beyond ``count``).
    log_density : ndarray[L]
        ``sum log N(dX_k; b_k h_k, s^2 h_k I)`` over the kept steps.
    state : ndarray[L, d]
        The state after the kept steps.
    drift : ndarray[L, d]
        The drift the next window is drafted with: at the new state when the window passed
        whole, else at the start of the redrawn step.
    """

    count: np.ndarray
    missed: np.ndarray
    increments: np.ndarray
    log_density: np.ndarray
    state: np.ndarray
    drift: np.ndarray


def verify_windows(
    chain: HostChain,
    draft: Draft,
    drifts: np.ndarray,
    name: str = "drift",
    beyond_dtype: Callable[[float, np.ndarray], None] | None = None,
) -> Verdict:
    """Accept the drafted steps of windows one by one; redraw the first that fails.

    Parameters
    ----------
    chain : HostChain
    draft : Draft
        What :func:`draft_windows` returned.
    drifts : ndarray[L, W + 1, d]
        The drift at each state of ``draft.states`` (at least at ``j <= w``, ``j < N - k``).
        NaN or inf is an error only at a state the chain reaches.
    name : str
        ``"drift"`` or ``"oracle"``, for messages.
    beyond_dtype : callable, optional
        ``(t, state)``: raises if a reached state whose drift is not finite lies beyond the
        drift's dtype (:meth:`~pyro_autospec.engine.euler.DriftEvaluator.beyond_dtype_error`),
        the clearer error there.

    Returns
    -------
    Verdict
    """
    draw_keys, k, w, frozen = draft.draw_keys, draft.k, draft.w, draft.frozen
    z, increments, states = draft.z, draft.increments, draft.states
    num, width = increments.shape[:2]
    rows = np.arange(num)
    step, j = _steps(chain, k, width)
    h = chain.h[step]  # [L, W]
    f = drifts[:, :width]  # the drift at the start of each step
    valid = j < w[:, None]
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow is raised below, named
        log_ratio = (
            ((f - frozen[:, None]) * increments).sum(-1)
            - 0.5 * ((f * f).sum(-1) - (frozen * frozen).sum(-1)[:, None]) * h
        ) / chain.var
    step_keys = keys.host_child(draw_keys[:, None], keys.Tag.LEAF, step)
    log_u = keys.host_log_uniform(step_keys, keys.Tag.ACCEPT, 0)
    failed = valid & ~(log_u < np.minimum(log_ratio, 0.0))  # a NaN ratio fails
    missed = failed.any(1)
    first = np.where(missed, failed.argmax(1) if width else 0, w)
    # the chain reaches the states up to ``first`` (the redrawn step's start, or the window's
    # end, which drafts the next window): their drifts are the sequential chain's, and one
    # that is not finite is an error; a drafted state past a rejection is never visited
    bad = ~np.isfinite(drifts[rows, first]).all(-1)
    if bad.any():
        lane = int(np.flatnonzero(bad)[0])
        at = min(int(k[lane] + first[lane]), chain.num_steps - 1)
        state = states[lane, first[lane]]
        if beyond_dtype is not None:
            beyond_dtype(float(chain.times[at]), state)
        norm = np.linalg.norm(state)
        raise_not_finite(name, f"row {lane} of a round", float(chain.times[at]), norm)
    reached = valid & (j <= first[:, None])
    kept = np.where((j < first[:, None])[..., None], increments, 0.0)
    if missed.any():
        lanes = np.flatnonzero(missed)
        at = first[lanes]
        s = step[lanes, at]
        z_at, f_at = z[lanes, at], f[lanes, at]
        # the reflection coupling of N(b* h, s^2 h I) (drafted) and N(b h, s^2 h I) (target)
        gap = (frozen[lanes] - f_at) * (chain.h[s] / chain.sd[s])[:, None]
        norm = np.sqrt((gap * gap).sum(-1))
        e = gap / np.where(norm > 0, norm, 1.0)[:, None]
        reflected = z_at - 2.0 * (e * z_at).sum(-1)[:, None] * e
        kept[lanes, at] = f_at * chain.h[s][:, None] + chain.sd[s][:, None] * reflected
    count = first + missed
    with np.errstate(over="ignore", invalid="ignore"):
        resid = kept - f * h[..., None]
        terms = chain.step_log_norm[step] - 0.5 * (resid * resid).sum(-1) / (chain.var * h)
    check_log_ratio(log_ratio[reached], terms[j < count[:, None]], "drift or mean oracle")
    # a running sum along the window: the same bits whatever the other windows' lengths
    running = np.cumsum(np.where(j < count[:, None], terms, 0.0), 1)
    log_density = np.zeros(num)
    if width:
        log_density = np.where(count > 0, running[rows, np.maximum(count - 1, 0)], 0.0)
    state = states[rows, first].copy()
    if missed.any():
        state[lanes] += kept[lanes, first[lanes]]
    return Verdict(count, missed, kept, log_density, state, drifts[rows, first].copy())


class EulerTokens:
    """Autospeculation on Euler-Maruyama chains, step by step: a
    :class:`~pyro_autospec.engine.stepping.RoundStepper` over draws.

    Parameters
    ----------
    chain : Chain
    evaluate : DriftEvaluator
    x0 : Tensor[D, d]
        Start states.
    draw_keys : LongTensor[D]
    knobs : dict
        The resolved knobs of ``rule="token"``: ``max_block`` and ``min_block`` (each draw's
        windows, :func:`token_policy`), ``max_rows_per_round`` (draws whose requests do not
        fit wait for the next round, oldest draws first; a round takes at least one draw) and
        ``max_concurrent_draws`` (continuous batching: new draws start as earlier ones
        finish).
    return_paths : bool
        Keep every kept increment.
    """

    def __init__(
        self,
        chain: Chain,
        evaluate: DriftEvaluator,
        x0: torch.Tensor,
        draw_keys: torch.Tensor,
        knobs: dict,
        return_paths: bool,
    ):
        self.host = HostChain.of(chain)
        self.evaluate = evaluate
        self.policy = token_policy(knobs)
        self.cap = knobs.get("max_rows_per_round")
        num, d = x0.shape
        self.num, self.d, self.n = num, d, self.host.num_steps
        self.x0 = host_float64(x0)
        self.keys = draw_keys.detach().cpu().numpy()
        lanes = min(int(knobs.get("max_concurrent_draws") or num), num)
        self.draw = np.full(lanes, -1, dtype=np.int64)
        self.k = np.zeros(lanes, dtype=np.int64)
        self.x = np.zeros((lanes, d))
        self.frozen = np.zeros((lanes, d))
        self.known = np.zeros(lanes, dtype=bool)
        self.fresh = np.zeros(lanes, dtype=bool)  # the first round asks the start's drift only
        self.win = np.zeros(lanes, dtype=np.int64)
        self.tokens = np.zeros(lanes, dtype=np.int64)
        self.misses = np.zeros(lanes, dtype=np.int64)
        self.log_mu = np.zeros(lanes)
        self.final = np.zeros((num, d))
        self.log_prob = np.zeros(num)
        self.increments = np.zeros((num, self.n, d)) if return_paths else None
        self.sample_rounds = np.zeros(num, dtype=np.int64)
        self.started = self.finished = self.rounds = self.oracle_rows = 0

    @property
    def done(self) -> bool:
        return self.finished >= self.num

    def start(self) -> None:
        """Free lanes take the next draws."""
        free = np.flatnonzero(self.draw < 0)[: self.num - self.started]
        if free.size == 0:
            return
        draws = np.arange(self.started, self.started + free.size)
        self.started += free.size
        self.draw[free] = draws
        self.k[free] = 0
        self.x[free] = self.x0[draws]
        self.known[free] = False
        self.fresh[free] = True
        self.tokens[free] = self.misses[free] = 0
        self.log_mu[free] = 0.0

    def _windows(self, lanes: np.ndarray) -> np.ndarray:
        return np.where(self.fresh[lanes], 0, np.minimum(self.win[lanes], self.n - self.k[lanes]))

    def _round_lanes(self) -> np.ndarray:
        """The lanes of this round, oldest draws first, within the cap on rows."""
        active = np.flatnonzero(self.draw >= 0)
        active = active[np.argsort(self.draw[active], kind="stable")]
        if self.cap is None:
            return active
        windows = np.stack([self.k[active], self._windows(active)], 1)
        rows = row_mask(self.host, windows, self.known[active]).sum(1)
        fits = np.cumsum(rows) <= self.cap
        fits[0] = True
        return active[fits]

    def step(self) -> None:
        lanes = self._round_lanes()
        host, k, x, frozen = self.host, self.k[lanes], self.x[lanes], self.frozen[lanes]
        windows = np.stack([k, self._windows(lanes)], 1)
        known, draw_keys = self.known[lanes], self.keys[self.draw[lanes]]
        draft = draft_windows(host, draw_keys, windows, x, frozen)
        increments, states = draft.increments, draft.states
        mask = row_mask(host, windows, known)
        drifts = np.zeros(states.shape)
        drifts[known, 0] = frozen[known]
        count = int(mask.sum())
        if count:
            t = host.times[np.minimum(k[:, None] + np.arange(mask.shape[1]), self.n)]
            drifts[mask] = host_drift(self.evaluate, t[mask], states[mask])
            self.rounds += 1
            self.oracle_rows += count
            self.sample_rounds[self.draw[lanes[mask.any(1)]]] += 1
        verdict = verify_windows(
            host, draft, drifts, self.evaluate.name, self.evaluate.beyond_dtype_error
        )
        self.log_mu[lanes] += verdict.log_density
        self.x[lanes] = verdict.state
        self.frozen[lanes] = verdict.drift
        self.known[lanes] = ~verdict.missed
        if self.increments is not None:
            keep = np.arange(increments.shape[1]) < verdict.count[:, None]
            steps = k[:, None] + np.arange(increments.shape[1])
            rows = np.broadcast_to(self.draw[lanes][:, None], steps.shape)
            self.increments[rows[keep], steps[keep]] = verdict.increments[keep]
        self.k[lanes] += verdict.count
        fresh = self.fresh[lanes]
        moved = lanes[~fresh]
        self.tokens[moved] += verdict.count[~fresh]
        self.misses[moved] += verdict.missed[~fresh]
        self.win[moved] = self.policy.token_window(self.tokens[moved], self.misses[moved])
        self.win[lanes[fresh]] = self.policy.start_window()
        self.fresh[lanes] = False
        ended = lanes[self.k[lanes] >= self.n]
        draws = self.draw[ended]
        self.final[draws] = self.x[ended]
        self.log_prob[draws] = self.log_mu[ended]
        self.draw[ended] = -1
        self.finished += ended.size
        self.start()

    @engine_mode()
    def run(self, progress: bool = False, desc: str = "autospec") -> EulerOutput:
        """Run every draw to completion, with a progress bar named ``desc`` if ``progress``.

        Returns
        -------
        EulerOutput
            On the host, in float64.

        Examples
        --------
        >>> import torch
        >>> from pyro_autospec.engine import keys
        >>> from pyro_autospec.engine.euler import Chain, DriftEvaluator
        >>> chain = Chain(torch.linspace(0.0, 1.0, 65), 1.0, 1, torch.device("cpu"))
        >>> cpu = torch.device("cpu")
        >>> drift = DriftEvaluator(lambda t, x: -x, 1, cpu, torch.float64, None, "drift")
        >>> draws = keys.draw_keys(0, torch.arange(4))
        >>> knobs = {"max_block": 16, "min_block": 2}
        >>> out = EulerTokens(chain, drift, torch.zeros(4, 1), draws, knobs, False).run()
        >>> out.final.shape, out.rounds < 64
        (torch.Size([4, 1]), True)
        """
        run_rounds(self, total=self.num, progress=progress, desc=desc)
        return host_output(self)


def host_output(stepper) -> EulerOutput:
    """What a stepper of the host plane drew, as tensors: its ``final`` [D, d], ``log_prob``
    [D], ``increments`` [D, N, d] (or None) from ``x0`` [D, d], ``sample_rounds`` [D] and its
    counts."""
    final = torch.from_numpy(stepper.final)
    paths = None
    if stepper.increments is not None:
        start = torch.from_numpy(stepper.x0)
        paths = paths_from_increments(start, torch.from_numpy(stepper.increments), final)
    return EulerOutput(
        final,
        paths,
        torch.from_numpy(stepper.log_prob),
        stepper.rounds,
        stepper.oracle_rows,
        torch.from_numpy(stepper.sample_rounds),
    )
