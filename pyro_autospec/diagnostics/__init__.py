"""Diagnostics and ArviZ conversion (all ArviZ version handling lives in :mod:`.arviz`)."""

from pyro_autospec.diagnostics.arviz import arviz_major_version, to_inference_data

__all__ = ["arviz_major_version", "to_inference_data"]
