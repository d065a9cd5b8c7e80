"""The sampling engine: oracle-agnostic, Pyro-free."""

from pyro_autospec.engine.any_order import ENGINES, sample_any_order
from pyro_autospec.engine.errors import OracleError
from pyro_autospec.engine.methods import METHODS, Schedule, default_schedule
from pyro_autospec.engine.result import SampleResult

__all__ = [
    "ENGINES",
    "METHODS",
    "OracleError",
    "SampleResult",
    "Schedule",
    "default_schedule",
    "sample_any_order",
]
