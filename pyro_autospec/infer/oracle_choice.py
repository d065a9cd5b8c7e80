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

__all__ = ["build_oracle"]


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
