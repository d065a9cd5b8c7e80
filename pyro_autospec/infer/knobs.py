"""The front end's accepted values: methods, corrections and the engine's schedule knobs.

The methods and knobs come from the engine's one list (:mod:`pyro_autospec.engine.methods`);
:func:`check_schedule` rejects an unknown keyword before anything runs, naming the accepted ones.
"""

from __future__ import annotations

from pyro_autospec.engine.methods import DISCRETE, knob_names, method_names

__all__ = ["CORRECTIONS", "METHODS", "SCHEDULE_KNOBS", "check_schedule"]

#: The engine's schedule knobs on ``[q]^n`` (each method accepts its own; the engine checks).
SCHEDULE_KNOBS = knob_names(DISCRETE)
CORRECTIONS = (None, "importance", "imh")
#: The methods the front end offers (discrete and diffusion), from the engine's one list.
METHODS = method_names(front_end=True)


def check_schedule(schedule: dict) -> dict:
    """Reject unknown schedule keywords early, naming the accepted ones.

    Examples
    --------
    >>> check_schedule({"rho": 2.0})
    {'rho': 2.0}
    """
    unknown = sorted(set(schedule) - set(SCHEDULE_KNOBS))
    if unknown:
        raise TypeError(
            f"unknown keyword(s) {unknown}; the schedule knobs passed to the engine are "
            f"{list(SCHEDULE_KNOBS)} (the device is the keyword device=)"
        )
    return dict(schedule)
