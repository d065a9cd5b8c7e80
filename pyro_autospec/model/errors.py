"""Errors for Pyro models that AutoSpec cannot sample; each message names the site and the fix."""

from __future__ import annotations

__all__ = [
    "AutoSpecModelError",
    "DynamicStructureError",
    "IntractableEnumerationError",
    "MixedDrawsError",
    "SubsamplingError",
    "UnsupportedSiteError",
]


class AutoSpecModelError(ValueError):
    """A Pyro model AutoSpec cannot sample exactly; the message names the site and the way out."""


class UnsupportedSiteError(AutoSpecModelError):
    """A latent site that is continuous, or discrete without finite enumerable support."""


class DynamicStructureError(AutoSpecModelError):
    """The set, shapes or supports of the model's sample sites change from run to run."""


class SubsamplingError(AutoSpecModelError):
    """A plate draws a random subsample of its data on every run of the model."""


class MixedDrawsError(AutoSpecModelError):
    """The model mixes the draws of a batch: a value reduced or indexed across the draws, so a
    draw scored in a batch differs from the same draw scored alone by more than rounding (a
    fault of the model's code, which no other batch of draws avoids)."""


class IntractableEnumerationError(AutoSpecModelError):
    """Exact enumeration of the discrete sites is impossible (plates) or too large (treewidth)."""
