"""Errors raised when an oracle or an input would make a sample silently wrong."""

from __future__ import annotations

__all__ = ["OracleError"]


class OracleError(ValueError):
    """An oracle returned something the exact sampler cannot use.

    Raised for rows conditioned on a possible assignment that contain NaN or ``+inf``, that do
    not sum to one, or that give zero mass to every value; for outputs of the wrong shape or
    dtype; and for oracles whose ``num_coords`` / ``num_values`` / ``dim`` disagree with what
    they return. The message names the row and the usual fix.
    """
