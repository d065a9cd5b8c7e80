"""The sampling engine: oracle-agnostic, Pyro-free."""

from pyro_autospec.engine.any_order import default_schedule, sample_any_order
from pyro_autospec.engine.errors import OracleError
from pyro_autospec.engine.result import SampleResult
from pyro_autospec.engine.scheduler import Call, FirstAccepted, Scheduler

__all__ = [
    "Call",
    "FirstAccepted",
    "OracleError",
    "SampleResult",
    "Scheduler",
    "default_schedule",
    "sample_any_order",
]
