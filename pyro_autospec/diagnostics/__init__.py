"""Diagnostics: ArviZ conversion (all ArviZ version handling lives in :mod:`.arviz`),
importance-weight diagnostics (:mod:`.weights`) and simulation-based calibration (:mod:`.sbc`).
"""

from pyro_autospec.diagnostics.arviz import arviz_major_version, to_inference_data
from pyro_autospec.diagnostics.sbc import SBCResult, plot_sbc_ranks, rank_uniformity_pvalue, sbc
from pyro_autospec.diagnostics.weights import pareto_khat, psis, weights_ess

__all__ = [
    "SBCResult",
    "arviz_major_version",
    "pareto_khat",
    "plot_sbc_ranks",
    "psis",
    "rank_uniformity_pvalue",
    "sbc",
    "to_inference_data",
    "weights_ess",
]
