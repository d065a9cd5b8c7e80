"""The front end's accepted values: methods, corrections and the engine's schedule knobs.

The methods and knobs come from the engine's one list (:mod:`pyro_autospec.engine.methods`);
:func:`check_schedule` rejects an unknown keyword before anything runs, naming the accepted ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyro_autospec.engine.methods import DIFFUSION, DISCRETE, given_knobs, knob_names, method_names

__all__ = ["CORRECTIONS", "METHODS", "SCHEDULE_KNOBS", "check_schedule"]

#: The engine's schedule knobs on ``[q]^n`` and on diffusions (each method accepts its own;
#: the engine checks).
SCHEDULE_KNOBS = tuple(dict.fromkeys(knob_names(DISCRETE) + knob_names(DIFFUSION)))
CORRECTIONS = (None, "importance", "imh")
#: The methods the front end offers (discrete and diffusion), from the engine's one list.
METHODS = method_names(front_end=True)


def check_schedule(schedule: Mapping | None, knobs: Mapping[str, Any]) -> dict:
    """The knobs given as ``schedule=`` (a :class:`~pyro_autospec.Schedule` or a dict) and as
    keywords, merged; an unknown keyword is rejected early, naming the accepted ones.

    Examples
    --------
    >>> check_schedule(None, {"rho": 2.0})
    {'rho': 2.0}
    """
    unknown = sorted(set(knobs) - set(SCHEDULE_KNOBS))
    if unknown:
        raise TypeError(
            f"unknown keyword(s) {unknown}; the schedule knobs passed to the engine are "
            f"{list(SCHEDULE_KNOBS)} (the device is the keyword device=)"
        )
    return given_knobs(schedule, knobs)
