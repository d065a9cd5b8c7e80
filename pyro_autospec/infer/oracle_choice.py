"""Which oracle a run asks: the compiled enumeration oracle, or the user's, checked.

``oracle="enum"`` compiles an :class:`~pyro_autospec.model.enum.EnumOracle` once; any other
oracle (or guide) is checked against the model's coordinates by one probe query.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from pyro_autospec.model.discrete import SiteLayout
from pyro_autospec.model.enum import EnumOracle

__all__ = ["build_oracle", "guide_for_call", "same_call", "snapshot"]


def build_oracle(
    oracle: Any,
    model: Callable,
    args: tuple,
    kwargs: dict,
    layout: SiteLayout,
    device: torch.device | str | None = None,
):
    """``"enum"``: a compiled :class:`~pyro_autospec.model.enum.EnumOracle`; else check it.

    A user's oracle is checked against ``layout`` by one probe query
    (:meth:`~pyro_autospec.model.discrete.SiteLayout.check_oracle`).

    Examples
    --------
    >>> import pyro, pyro.distributions as dist
    >>> from pyro_autospec.model import discover_sites
    >>> def model():
    ...     pyro.sample("z", dist.Bernoulli(0.5))
    >>> build_oracle("enum", model, (), {}, discover_sites(model))
    EnumOracle(num_coords=1, num_values=2, sites=['z'])
    """
    if isinstance(oracle, str):
        if oracle != "enum":
            raise ValueError(
                f"oracle must be 'enum' or a MarginalOracle instance; got the string {oracle!r}"
            )

        return EnumOracle(model, args, kwargs, layout=layout, device=device)
    layout.check_oracle(oracle)
    return oracle


def snapshot(value: Any) -> Any:
    """What a call's arguments were: tensors copied (in-place changes show), the rest kept."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (tuple, list)):
        return type(value)(snapshot(v) for v in value)
    if isinstance(value, dict):
        return {k: snapshot(v) for k, v in value.items()}
    return value


def same_call(a: Any, b: Any) -> bool:
    """Whether two calls' arguments (or their snapshots) are the same: equal tensors,
    identical other objects."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and a.device == b.device
            and bool(torch.equal(a, b))
        )
    if isinstance(a, (tuple, list)) or isinstance(b, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same_call, a, b))
    if isinstance(a, dict) or isinstance(b, dict):
        return (
            isinstance(a, dict)
            and isinstance(b, dict)
            and a.keys() == b.keys()
            and all(same_call(a[k], b[k]) for k in a)
        )
    return a is b


def guide_for_call(guide: Any, args: tuple, kwargs: dict) -> Any:
    """The guide as it answers for the run's data ``model(*args, **kwargs)``.

    A guide built from a model (``AnyOrderGuide``) answers for its own data set
    (``model_args``) until conditioned on another (``guide.oracle(*args)``); a run on other
    data asks it for the run's data, as a ``DiffusionGuide`` is asked. Any other oracle is
    returned as it is.
    """
    own = getattr(guide, "model_args", None)
    if getattr(guide, "model", None) is None or own is None or not hasattr(guide, "oracle"):
        return guide
    if same_call((tuple(own), dict(guide.model_kwargs)), (tuple(args), dict(kwargs))):
        return guide
    return guide.oracle(*args, **kwargs)
