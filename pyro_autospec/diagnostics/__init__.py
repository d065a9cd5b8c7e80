"""Diagnostics: ArviZ conversion (all ArviZ version handling lives in :mod:`.arviz`),
per-element ESS and R-hat (:mod:`.ess`), importance-weight diagnostics (:mod:`.weights`) and
simulation-based calibration (:mod:`.sbc`).
"""

from pyro_autospec.diagnostics.arviz import arviz_major_version, to_inference_data
from pyro_autospec.diagnostics.ess import effective_sample_size, split_gelman_rubin
from pyro_autospec.diagnostics.sbc import SBCResult, plot_sbc_ranks, rank_uniformity_pvalue, sbc
from pyro_autospec.diagnostics.weights import pareto_khat, psis, weights_ess

__all__ = [
    "SBCResult",
    "arviz_major_version",
    "effective_sample_size",
    "pareto_khat",
    "plot_sbc_ranks",
    "psis",
    "rank_uniformity_pvalue",
    "sbc",
    "split_gelman_rubin",
    "to_inference_data",
    "weights_ess",
]
