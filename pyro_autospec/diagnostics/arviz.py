"""The one place that knows ArviZ's versions.

ArviZ 0.x builds an ``InferenceData`` with ``az.from_dict(posterior=..., sample_stats=..., ...)``
(one keyword per group). ArviZ 1.x (Python >= 3.12) takes ONE nested dict
``{group: {variable: array}}`` and returns an ``xarray.DataTree``; it has no ``from_pyro``.
Everything else in the project calls :func:`to_inference_data` and never ``az.from_dict``,
and reaches ArviZ's statistics through :func:`summary` and :func:`psislw`. ArviZ is imported
on first use (importing it takes over a second), so that loading the library does not pay
for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["to_inference_data", "arviz_major_version", "summary", "psislw"]


def arviz_major_version() -> int:
    """The installed ArviZ major version (0 or 1; ``-1`` if ArviZ is not installed)."""
    try:
        import arviz as az
    except ImportError:
        return -1
    return int(str(az.__version__).split(".")[0])


def summary(data: Any, **kwargs: Any) -> Any:
    """``az.summary(data, **kwargs)``: ArviZ's table of means, ESS and r-hat (a DataFrame)."""
    import arviz as az

    return az.summary(data, **kwargs)


def psislw(log_weights: np.ndarray) -> tuple[np.ndarray, float]:
    """``az.psislw``: Pareto-smoothed log weights (``[N]``) and the Pareto shape ``k-hat``."""
    import arviz as az

    smoothed, khat = az.psislw(log_weights)
    return np.asarray(smoothed), float(khat)


def _as_numpy(group: Mapping[str, Any] | None) -> dict[str, np.ndarray] | None:
    if group is None:
        return None
    out = {}
    for name, value in group.items():
        if hasattr(value, "detach"):
            value = value.detach().cpu().numpy()
        out[name] = np.asarray(value)
    return out


def to_inference_data(
    posterior: Mapping[str, Any],
    *,
    sample_stats: Mapping[str, Any] | None = None,
    log_likelihood: Mapping[str, Any] | None = None,
    observed_data: Mapping[str, Any] | None = None,
    coords: Mapping[str, Any] | None = None,
    dims: Mapping[str, list[str]] | None = None,
    attrs: Mapping[str, Any] | None = None,
):
    """Build ArviZ data from arrays shaped ``(chain, draw, ...)``, for ArviZ 0.x and 1.x.

    Parameters
    ----------
    posterior : dict
        ``name -> array[chain, draw, *shape]`` (NumPy arrays or tensors).
    sample_stats : dict, optional
        ``name -> array[chain, draw]`` (``lp``, ``diverging``, ``sample_rounds``, ...).
    log_likelihood : dict, optional
        Observed site name ``-> array[chain, draw, *batch_shape]``: pointwise log likelihood.
    observed_data : dict, optional
        Observed site name ``-> array``.
    coords, dims : dict, optional
        As in ``az.from_dict``.
    attrs : dict, optional
        Attributes stored with every group.

    Returns
    -------
    arviz.InferenceData (ArviZ 0.x) or xarray.DataTree (ArviZ 1.x)

    Raises
    ------
    ValueError
        For a variable named ``chain`` or ``draw``: those are ArviZ's dimensions, and ArviZ
        would drop the variable without a word.

    Examples
    --------
    >>> import numpy as np
    >>> idata = to_inference_data(
    ...     {"z": np.zeros((2, 5), dtype=np.int64)}, sample_stats={"lp": np.zeros((2, 5))}
    ... )
    >>> idata.posterior["z"].shape
    (2, 5)
    >>> to_inference_data({"z": np.zeros((1, 3))}, attrs={"method": "autospec"}).posterior.attrs[
    ...     "method"
    ... ]
    'autospec'
    """
    import arviz as az

    for group in (posterior, sample_stats, log_likelihood, observed_data):
        clash = sorted(set(group or ()) & {"chain", "draw"})
        if clash:
            raise ValueError(
                f"A site named {clash[0]!r} cannot go into ArviZ data: 'chain' and 'draw' are "
                "the names of ArviZ's own dimensions, and ArviZ would drop the site without a "
                "word. Rename the site in the model (get_samples() still has it)."
            )
    groups = {
        "posterior": _as_numpy(posterior),
        "sample_stats": _as_numpy(sample_stats),
        "log_likelihood": _as_numpy(log_likelihood),
        "observed_data": _as_numpy(observed_data),
    }
    groups = {k: v for k, v in groups.items() if v}
    coords = None if coords is None else dict(coords)
    dims = None if dims is None else dict(dims)
    attrs = None if attrs is None else dict(attrs)
    if arviz_major_version() >= 1:
        data = az.from_dict(groups, coords=coords, dims=dims, attrs=attrs)
        groups_of = [data[name] for name in groups if name in data.children]
    else:
        data = az.from_dict(**groups, coords=coords, dims=dims, attrs=attrs)
        groups_of = [getattr(data, name) for name in data.groups()]
    # ArviZ 0.23's from_dict accepts attrs but drops them: set them on every group.
    for group in groups_of:
        group.attrs.update(attrs or {})
    return data
