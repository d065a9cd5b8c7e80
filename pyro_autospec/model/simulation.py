"""Running a Pyro model with discrete latent sites forward, and its log joint per data set.

Three readings of a model that need no guide, only the model (its discrete sites laid out by
:func:`~pyro_autospec.model.discover_sites`):

* :func:`simulate_discrete`: prior predictive pairs ``(x, data)``, the model run forward under
  ``poutine.uncondition`` in a plate of simulations (:func:`.tracing.simulate_trace`);
* :func:`factor_sites`: the ``pyro.factor`` sites, whose effect a forward simulation loses;
* :func:`joint_log_prob`: ``log p(x_k, data_k)`` for a batch of assignments, each with its
  own data (:func:`~pyro_autospec.model.log_joint` when they share the model's data).

:class:`~pyro_autospec.guides.AnyOrderGuide` uses them: its training on simulations
(``guides/any_order_training.py``), its probes of the model's pairwise structure on other
data sets (``guides/structure.py``) and its objectives (``guides/training.py``). The
continuous counterpart of :func:`simulate_discrete` is :func:`.continuous.simulate`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from pyro import poutine
from pyro.poutine.util import prune_subsample_sites

from pyro_autospec._shapes import broadcast_shape
from pyro_autospec.model.discrete import SiteLayout
from pyro_autospec.model.errors import AutoSpecModelError
from pyro_autospec.model.log_joint import data_device, log_joint
from pyro_autospec.model.tracing import (
    over_draws,
    seed_generators,
    simulate_trace,
    users_generators_kept,
)

__all__ = ["factor_sites", "joint_log_prob", "simulate_discrete"]


def factor_sites(model: Callable, args: tuple, kwargs: dict | None = None) -> list[str]:
    """Names of the model's ``pyro.factor`` sites (their effect is lost in forward simulation).

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> def model():
    ...     z = pyro.sample("z", dist.Bernoulli(0.5))
    ...     pyro.factor("bonus", 2.0 * z)
    >>> factor_sites(model, ())
    ['bonus']
    """
    with poutine.block(), torch.no_grad():
        trace = poutine.trace(model).get_trace(*args, **(kwargs or {}))
    return [
        name
        for name, site in trace.nodes.items()
        if site["type"] == "sample" and type(site["fn"]).__name__ == "Unit"
    ]


def _observed_draw_shape(layout: SiteLayout, name: str, num: int) -> tuple[int, ...]:
    value_shape = tuple(layout.observed[name].shape)
    batch = tuple(layout.observed_batch_shapes[name])
    pad = layout.max_plate_nesting - len(batch)
    return (num,) + (1,) * pad + value_shape


def joint_log_prob(
    model: Callable,
    args: tuple,
    kwargs: dict | None,
    layout: SiteLayout,
    coords: torch.Tensor,
    observed: Mapping[str, torch.Tensor] | None = None,
    *,
    chunk_size: int = 4096,
) -> torch.Tensor:
    """``log p(x_k, data_k)`` for a batch of assignments, each with its own data if given.

    Parameters
    ----------
    model : callable
    args, kwargs
        The model's arguments.
    layout : SiteLayout
    coords : LongTensor[N, n]
        Assignments (support indices).
    observed : dict, optional
        ``name -> Tensor[N, *value_shape]``: per-draw values of observed sites, which replace
        the observations in ``args`` (``poutine.condition`` overrides ``obs=``). ``None``: the
        data in ``args`` for every draw (then this is
        :func:`~pyro_autospec.model.log_joint`).

    Returns
    -------
    DoubleTensor[N]

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> from pyro_autospec.model import discover_sites
    >>> def model(y):
    ...     z = pyro.sample("z", dist.Bernoulli(0.5))
    ...     pyro.sample("y", dist.Normal(z, 1.0), obs=y)
    >>> layout = discover_sites(model, (torch.tensor(0.0),))
    >>> lp = joint_log_prob(model, (torch.tensor(0.0),), {}, layout, torch.tensor([[1], [1]]),
    ...                     {"y": torch.tensor([0.0, 1.0])})
    >>> bool(lp[1] > lp[0])
    True
    """
    kwargs = {} if kwargs is None else kwargs
    coords = torch.as_tensor(coords).long()
    home = coords.device  # the answer's device; the model runs on its data's
    coords = coords.to(data_device(args, kwargs))
    if observed is None:
        return log_joint(model, args, kwargs, layout, layout.from_coords(coords)).to(home)
    unknown = sorted(set(observed) - set(layout.observed))
    if unknown:
        raise ValueError(f"observed names {unknown}, which are not observed sites of the model")
    observed = {k: torch.as_tensor(v, device=coords.device) for k, v in observed.items()}
    num = coords.shape[0]
    mpn = layout.max_plate_nesting
    parts = []
    for start in range(0, num, chunk_size):
        stop = min(num, start + chunk_size)
        size = stop - start
        values = layout.from_coords(coords[start:stop])
        data = {}
        for site in layout.sites:
            pad = mpn - len(site.batch_shape)
            shape = (size,) + (1,) * pad + tuple(site.batch_shape) + tuple(site.event_shape)
            data[site.name] = values[site.name].to(site.dtype).reshape(shape)
        for name, value in observed.items():
            data[name] = value[start:stop].reshape(_observed_draw_shape(layout, name, size))

        batched = over_draws(model, size, mpn)
        with poutine.block(), torch.no_grad():
            trace = poutine.trace(poutine.condition(batched, data=data)).get_trace(*args, **kwargs)
        trace = prune_subsample_sites(trace)
        trace.compute_log_prob()
        total = torch.zeros(size, dtype=torch.float64, device=coords.device)
        for site in trace.nodes.values():
            if site["type"] != "sample":
                continue
            lp = site["log_prob"].detach().to(torch.float64)
            lp = lp.expand(broadcast_shape(lp.shape, (size,) + (1,) * mpn))
            total = total + lp.reshape(size, -1).sum(-1)
        parts.append(total)
    return torch.cat(parts).to(home)


def simulate_discrete(
    model: Callable,
    args: tuple,
    kwargs: dict | None,
    layout: SiteLayout,
    num_simulations: int,
    *,
    seed: int | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Prior predictive pairs ``(x, data)``: the model run forward in a plate of simulations.

    Observed sites are sampled (``poutine.uncondition``). ``pyro.factor`` sites cannot be
    simulated forward: with them, the pairs are NOT draws of the model's joint (check with
    :func:`factor_sites`).

    Parameters
    ----------
    model, args, kwargs, layout
        As in :func:`joint_log_prob`; the observed values in ``args`` are ignored.
    num_simulations : int
        ``S``.
    seed : int, optional
        Seeds torch's RNG inside a fork (the global state is left as it was).

    Returns
    -------
    coords : LongTensor[S, n]
        The latent discrete sites, as support indices.
    observed : dict
        ``name -> Tensor[S, *value_shape]`` for every observed site.

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> from pyro_autospec.model import discover_sites
    >>> def model(y):
    ...     with pyro.plate("p", 3):
    ...         z = pyro.sample("z", dist.Bernoulli(0.5))
    ...         pyro.sample("y", dist.Normal(z, 0.1), obs=y)
    >>> layout = discover_sites(model, (torch.zeros(3),))
    >>> coords, observed = simulate_discrete(model, (torch.zeros(3),), {}, layout, 5, seed=0)
    >>> coords.shape, observed["y"].shape, bool(((observed["y"] - coords).abs() < 1).all())
    (torch.Size([5, 3]), torch.Size([5, 3]), True)
    """
    kwargs = {} if kwargs is None else kwargs
    if not isinstance(num_simulations, int) or num_simulations < 1:
        raise ValueError(f"num_simulations must be a positive int; got {num_simulations!r}")
    num = num_simulations
    mpn = layout.max_plate_nesting
    with users_generators_kept(), torch.no_grad():
        if seed is not None:
            seed_generators(seed)
        trace = simulate_trace(model, args, kwargs, num, mpn)
    values = {}
    for site in layout.sites:
        value = trace.nodes[site.name]["value"]
        shape = (num,) + (1,) * (mpn - len(site.batch_shape)) + tuple(site.shape)
        values[site.name] = value.expand(shape).reshape((num,) + tuple(site.shape))
    observed = {}
    for name, ref in layout.observed.items():
        value = trace.nodes[name]["value"]
        shape = _observed_draw_shape(layout, name, num)
        try:
            observed[name] = value.expand(shape).reshape((num,) + tuple(ref.shape))
        except RuntimeError as e:
            raise AutoSpecModelError(
                f"observed site '{name}' did not broadcast over a plate of simulations "
                f"(value shape {tuple(value.shape)}, expected {shape}); declare its batch "
                f"dimensions with plates"
            ) from e
    return layout.to_coords(values), observed
