"""Pyro distributions backed by the exact parallel samplers (the Pyro-facing layer)."""

from pyro_autospec.distributions.euler_maruyama import EulerMaruyamaPath
from pyro_autospec.distributions.stochastic_localization import StochasticLocalization

__all__ = ["EulerMaruyamaPath", "StochasticLocalization"]
