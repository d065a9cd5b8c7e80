"""Training the guides: one Adam loop, and fitting an any-order guide to a posterior.

:func:`train` is the optimisation loop every ``fit_*`` method of
:class:`~pyro_autospec.guides.AnyOrderGuide` and
:class:`~pyro_autospec.guides.DiffusionGuide` runs: Adam, a cosine decay of the learning rate,
optional gradient clipping, a progress bar, the loss history.

:func:`fit_posterior` fits an :class:`~pyro_autospec.guides.AnyOrderGuide` to
``p(x | data)`` with the model's joint density only. The guide draws from itself (exactly;
every draw of the engine comes with ``log q_sigma(x)``, which is reused as it is) and the
model scores the draws with ``log p(x, data)``. Two gradient estimators over the extended
space ``(x, sigma) ~ Uniform(sigma) q_sigma(x)``:

* ``"forward"``: the any-order likelihood of the guide's own draws, weighted by the
  self-normalised importance weights ``softmax(log p - log q_sigma)``. Each draw costs ONE
  network pass: a random prefix of a random order is pinned and every unpinned coordinate is
  scored, with the masked-diffusion weight ``n / (n - t)`` (:meth:`AnyOrderGuide.any_order_loss`).
  Mass-covering; informative once the weights are (a guide that starts near the posterior, as
  the ``"graph"`` architecture does).
* ``"reverse"``: the score-function (REINFORCE) gradient of the reverse KL
  ``E_q[log q_sigma(x) - log p(x, data)]`` with a leave-one-out baseline. The score
  ``grad log q_sigma(x)`` is a sum of ``n`` chain-rule terms, each its own network pass; an
  unbiased estimate uses ``num_positions`` of them, at random.
* ``"both"``: the sum. The reverse term moves a poor guide into the posterior's bulk.

``"both"`` is the default: a guide that starts far from the posterior reached a lower KL with
it than with ``"forward"`` at equal wall time, and one that starts close ended equal.
``python benchmarks/guides.py --parts training`` measures it; the figures are in
:doc:`/benchmarks`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tqdm.auto import tqdm

from pyro_autospec.engine import sample_any_order
from pyro_autospec.model.simulation import joint_log_prob

__all__ = ["OBJECTIVES", "fit_posterior", "train"]

OBJECTIVES = ("reverse", "forward", "both")


def seeded_generator(seed: int | None, device: torch.device | str | None = None):
    """The random stream of a training loop: a ``torch.Generator`` on ``device`` (default the
    CPU) seeded with ``seed``, or ``None`` (torch's global stream) when ``seed`` is ``None``."""
    if seed is None:
        return None
    return torch.Generator(device=device).manual_seed(seed)


def train(
    module: torch.nn.Module,
    step_loss: Callable[[int], tuple[torch.Tensor, float]],
    *,
    num_steps: int,
    lr: float,
    lr_decay: float = 1.0,
    max_grad_norm: float | None = None,
    max_seconds: float | None = None,
    desc: str = "train",
    label: str = "loss",
    disable_progbar: bool = False,
) -> list[float]:
    """The Adam loop shared by every guide's ``fit_*`` method.

    Parameters
    ----------
    module : nn.Module
        Its parameters are trained. It is put in train mode during the loop and in eval mode
        after; if it has a list attribute ``loss_history``, the history is appended to it.
    step_loss : callable
        ``step_loss(step) -> (loss, value)``: a differentiable scalar to minimise and the float
        to record for that step.
    num_steps : int
        Adam steps.
    lr : float
        The learning rate of the first step.
    lr_decay : float
        The rate falls along a cosine from ``lr`` to ``lr * lr_decay`` at the last step
        (``1.0``: constant).
    max_grad_norm : float, optional
        Clip the gradient's norm to this.
    max_seconds : float, optional
        Stop after the step that ends past this wall time (the cosine then follows elapsed
        time instead of steps, so the rate still ends at ``lr * lr_decay``).
    desc, label : str
        The progress bar's title and the name of the recorded value.
    disable_progbar : bool
        Hide the ``tqdm`` bar.

    Returns
    -------
    list of float
        The value of every step.

    Examples
    --------
    >>> import torch
    >>> layer = torch.nn.Linear(1, 1)
    >>> def step_loss(step):
    ...     loss = (layer(torch.ones(1, 1)) - 3.0).pow(2).sum()
    ...     return loss, float(loss.detach())
    >>> history = train(layer, step_loss, num_steps=200, lr=0.1, disable_progbar=True)
    >>> history[-1] < 1e-3 < history[0]
    True
    """
    if not isinstance(num_steps, int) or num_steps < 1:
        raise ValueError(f"num_steps must be a positive int; got {num_steps!r}")
    if not lr > 0:
        raise ValueError(f"lr must be positive; got {lr}")
    if not 0.0 <= lr_decay <= 1.0:
        raise ValueError(f"lr_decay must be in [0, 1]; got {lr_decay}")
    params = [p for p in module.parameters() if p.requires_grad]
    if not params:
        raise ValueError(
            f"{type(module).__name__} has no trainable parameters (e.g. a graph guide with "
            f"num_layers=0 is belief propagation alone); nothing to fit"
        )
    optimizer = torch.optim.Adam(params, lr=lr)
    start = time.perf_counter()

    def rate(step: int) -> float:
        if max_seconds is not None:
            frac = min(1.0, (time.perf_counter() - start) / max_seconds)
        else:
            frac = step / max(1, num_steps - 1)
        return lr * (lr_decay + (1.0 - lr_decay) * 0.5 * (1.0 + math.cos(math.pi * frac)))

    history: list[float] = []
    bar = tqdm(range(num_steps), desc=desc, disable=disable_progbar)
    module.train()
    try:
        for step in bar:
            for group in optimizer.param_groups:
                group["lr"] = rate(step)
            loss, value = step_loss(step)
            optimizer.zero_grad()
            loss.backward()
            if max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
            optimizer.step()
            history.append(float(value))
            if step % 10 == 0 or step == num_steps - 1:
                bar.set_postfix({label: f"{history[-1]:.4g}"}, refresh=False)
            if max_seconds is not None and time.perf_counter() - start > max_seconds:
                break
    finally:
        module.eval()
    if isinstance(getattr(module, "loss_history", None), list):
        module.loss_history.extend(history)
    return history


def _check_posterior_options(guide, objective, lr_decay, num_particles) -> None:
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}; got {objective!r}")
    if guide.model is None:
        raise ValueError(
            "fit_posterior needs a guide built from a Pyro model: AnyOrderGuide(model, model_args)"
        )
    if not 0.0 < lr_decay <= 1.0:
        raise ValueError(f"lr_decay must be in (0, 1]; got {lr_decay}")
    if num_particles < 2:
        raise ValueError(f"num_particles must be >= 2 (for the baseline); got {num_particles}")


@dataclass(frozen=True)
class PosteriorEstimator:
    """The gradient estimator of :func:`fit_posterior`, fixed for a whole fit.

    Attributes
    ----------
    objective : {"both", "reverse", "forward"}
        Which estimator (see the module docstring).
    num_positions : int
        Chain-rule terms per draw in the score estimate (``"reverse"``); ``n`` uses all.
    generator : torch.Generator or None
        Draws the score's positions and the any-order loss's orders and cuts (the global
        generator where ``None``).
    """

    objective: str
    num_positions: int
    generator: torch.Generator | None


def posterior_loss(
    guide: Any,
    x: torch.Tensor,
    orders: torch.Tensor,
    f: torch.Tensor,
    estimator: PosteriorEstimator,
    *,
    context: Any = None,
    index: torch.Tensor | None = None,
) -> torch.Tensor:
    """The surrogate loss of one step of :func:`fit_posterior` (its gradient is the estimator).

    Parameters
    ----------
    guide : AnyOrderGuide
    x, orders : LongTensor[N, n]
        The guide's draws and their orders.
    f : DoubleTensor[N]
        ``log q_sigma(x) - log p(x, data)`` per draw (``+inf`` where ``p`` is zero).
    estimator : PosteriorEstimator
        The objective, the positions per draw and the generator, as in :func:`fit_posterior`.
    context, index
        Per-draw data sets (amortised training; see :meth:`AnyOrderGuide.any_order_loss`).

    Returns
    -------
    Tensor[]
    """
    objective, generator = estimator.objective, estimator.generator
    n = guide.num_coords
    k = min(int(estimator.num_positions), n)
    finite = torch.isfinite(f)
    loss = torch.zeros((), device=guide.device)
    if objective in ("reverse", "both"):
        fm = f[finite]
        m = fm.numel()
        if m >= 2:
            baseline = (fm.sum() - fm) / (m - 1)
            advantage = (fm - baseline).float().to(guide.device)
            positions = torch.rand(m, n, generator=generator).argsort(-1)[:, :k] if k < n else None
            sub = None if index is None else index[finite.to(index.device)]
            terms = guide.sequential_log_prob(
                x[finite], orders[finite], positions, context=context, index=sub
            )
            loss = loss + (advantage * terms.sum(-1) * (n / k)).mean()
    if objective in ("forward", "both"):
        weights = torch.softmax(-f.masked_fill(~finite, math.inf), 0).float()
        loss = loss + guide.any_order_loss(
            x, weights=weights, generator=generator, context=context, index=index
        )
    return loss


def fit_posterior(
    guide: Any,
    *args: Any,
    num_steps: int = 200,
    num_particles: int = 64,
    num_positions: int = 32,
    objective: str = "both",
    lr: float = 3e-3,
    lr_decay: float = 0.1,
    method: str = "sequential",
    max_seconds: float | None = None,
    seed: int | None = None,
    disable_progbar: bool = False,
    **kwargs: Any,
) -> list[float]:
    """Fit ``guide`` to ``p(x | data)`` of its model using only ``log p(x, data)``.

    Parameters
    ----------
    guide : AnyOrderGuide
        A guide built from a model (``guide.model``).
    *args, **kwargs
        The model's arguments (data included); default the ones the guide was built with.
        Keywords named below are training options and are not passed to the model. The guide
        is fitted to THESE data (an amortised guide keeps its network and only sees them
        through their potentials).
    num_steps : int
        Adam steps.
    num_particles : int
        Exact draws of the guide per step (one engine run of ``num_particles`` draws).
    num_positions : int
        Chain-rule terms per draw in the score estimate (``"reverse"``); ``n`` uses all.
    objective : {"both", "reverse", "forward"}
        The gradient estimator (see the module docstring).
    lr : float
        Adam learning rate at the first step.
    lr_decay : float
        The learning rate falls along a cosine from ``lr`` to ``lr * lr_decay`` at the last
        step (``1.0``: constant).
    method : {"sequential", "autospec"}
        How the engine draws the guide (both exact, same law; ``"sequential"`` is faster on a
        CPU, ``"autospec"`` takes fewer rounds, which pays on a GPU).
    max_seconds : float, optional
        Stop after this much training time (see :func:`train`).
    seed : int, optional
        Seeds the draws, the positions and the orders.
    disable_progbar : bool
        Hide the ``tqdm`` bar.

    Returns
    -------
    list of float
        Per step, the estimate of ``E_q[log q_sigma(x) - log p(x, data)]`` (the negative ELBO
        on the extended space: it decreases towards ``-log p(data)`` as ``q`` approaches the
        posterior) from that step's draws; also appended to ``guide.loss_history``.

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> from pyro_autospec.guides import AnyOrderGuide
    >>> def model(data):
    ...     with pyro.plate("pixels", len(data)):
    ...         z = pyro.sample("z", dist.Bernoulli(0.5))
    ...         pyro.sample("y", dist.Normal(2.0 * z - 1.0, 0.5), obs=data)
    >>> data = torch.tensor([1.0, -1.0, 0.8, -0.9])
    >>> guide = AnyOrderGuide(model, (data,), architecture="mlp", hidden_dim=16)
    >>> history = guide.fit_posterior(
    ...     data, num_steps=30, num_particles=32, seed=0, disable_progbar=True
    ... )
    >>> sum(history[-5:]) / 5 < sum(history[:5]) / 5
    True
    """
    _check_posterior_options(guide, objective, lr_decay, num_particles)
    if not args and not kwargs:
        args, kwargs = guide.model_args, guide.model_kwargs
    oracle = guide.oracle(*args, **kwargs)
    context = oracle.context
    layout = guide.layout
    gen = seeded_generator(seed)
    seeds = torch.randint(0, 2**62, (int(num_steps),), generator=gen).tolist()
    estimator = PosteriorEstimator(objective, num_positions, gen)

    def step_loss(step: int):
        guide.eval()
        draws = sample_any_order(oracle, int(num_particles), method=method, seed=seeds[step])
        x, orders = draws.samples.cpu(), draws.orders.cpu()
        lp = joint_log_prob(guide.model, args, kwargs, layout, x)
        f = draws.log_prob.cpu().double() - lp  # log q - log p, per draw (reused, not recomputed)
        finite = torch.isfinite(f)
        if not bool(finite.any()):
            raise ValueError(
                "every draw of the guide has zero probability under the model; check the model "
                "or start from a guide fitted with fit_to_samples"
            )
        guide.train()
        loss = posterior_loss(guide, x, orders, f, estimator, context=context)
        return loss, float(f[finite].mean())

    return train(
        guide,
        step_loss,
        num_steps=int(num_steps),
        lr=lr,
        lr_decay=lr_decay,
        max_seconds=max_seconds,
        desc="fit_posterior",
        label="neg_elbo",
        disable_progbar=disable_progbar,
    )


def fit_posterior_datasets(
    guide: Any,
    observed: dict[str, torch.Tensor],
    *,
    num_steps: int,
    num_particles: int,
    datasets_per_step: int,
    num_positions: int,
    objective: str,
    lr: float,
    lr_decay: float,
    method: str,
    max_seconds: float | None,
    seed: int | None,
    disable_progbar: bool,
    model_args: Sequence = (),
    model_kwargs: dict | None = None,
) -> list[float]:
    """Amortised :func:`fit_posterior`: each step fits ``q(. | data_k)`` to ``p(. | data_k)``
    for ``datasets_per_step`` data sets drawn from ``observed`` (``name -> Tensor[K, ...]``).

    Used by :meth:`AnyOrderGuide.fit_simulation` with ``objective="posterior"``; one engine run
    per step draws ``num_particles`` draws spread over the step's data sets (a family of
    targets, one per draw).
    """
    _check_posterior_options(guide, objective, lr_decay, num_particles)
    args, kwargs = tuple(model_args), dict(model_kwargs or {})
    num_sets = next(iter(observed.values())).shape[0]
    per_set = max(2, int(num_particles) // int(datasets_per_step))
    count = min(int(datasets_per_step), num_sets)
    gen = seeded_generator(seed)
    seeds = torch.randint(0, 2**62, (int(num_steps),), generator=gen).tolist()
    estimator = PosteriorEstimator(objective, num_positions, gen)
    bank = guide.context_for(observed, *args, **kwargs)

    def step_loss(step: int):
        guide.eval()
        chosen = torch.randperm(num_sets, generator=gen)[:count]
        context = bank.subset(chosen)
        oracle = guide.conditioned(context, repeats=per_set)
        draws = sample_any_order(oracle, count * per_set, method=method, seed=seeds[step])
        x, orders = draws.samples.cpu(), draws.orders.cpu()
        index = torch.arange(count).repeat_interleave(per_set)
        data = {k: v[chosen][index] for k, v in observed.items()}
        lp = joint_log_prob(guide.model, args, kwargs, guide.layout, x, data)
        f = draws.log_prob.cpu().double() - lp
        finite = torch.isfinite(f)
        if not bool(finite.any()):
            raise ValueError("every draw of the guide has zero probability under the model")
        guide.train()
        loss = torch.zeros((), device=guide.device)
        for s in range(count):
            rows = index == s
            loss = (
                loss
                + posterior_loss(
                    guide,
                    x[rows],
                    orders[rows],
                    f[rows],
                    estimator,
                    context=context,
                    index=index[rows],
                )
                / count
            )
        return loss, float(f[finite].mean())

    return train(
        guide,
        step_loss,
        num_steps=int(num_steps),
        lr=lr,
        lr_decay=lr_decay,
        max_seconds=max_seconds,
        desc="fit_simulation",
        label="neg_elbo",
        disable_progbar=disable_progbar,
    )
