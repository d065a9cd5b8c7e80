"""The front end's accepted values: methods, corrections and the engine's schedule knobs.

The methods and knobs come from the engine's one list (:mod:`pyro_autospec.engine.methods`);
:func:`refuse_unknown_keywords` rejects an unknown keyword to ``AutoSpec`` or ``AutoSpecKernel``
before anything runs, naming the accepted ones.
"""

from __future__ import annotations

from typing import Any

from pyro.infer.mcmc.mcmc_kernel import MCMCKernel

from pyro_autospec.engine.methods import (
    DIFFUSION,
    DISCRETE,
    is_count,
    knob_names,
    method_names,
)

__all__ = [
    "CORRECTIONS",
    "METHODS",
    "SCHEDULE_KNOBS",
    "check_count",
    "check_model",
    "refuse_unknown_keywords",
]

#: The engine's schedule knobs on ``[q]^n`` and on diffusions (each method accepts its own;
#: the engine checks).
SCHEDULE_KNOBS = tuple(dict.fromkeys(knob_names(DISCRETE) + knob_names(DIFFUSION)))
CORRECTIONS = (None, "importance", "imh")
#: The methods the front end offers (discrete and diffusion), from the engine's one list.
METHODS = method_names(front_end=True)


#: ``pyro.infer.MCMC``'s arguments that ``AutoSpec`` does not take (it takes the others:
#: ``num_samples``, ``warmup_steps``, ``num_chains``, ``disable_progbar``, ``save_params``).
MCMC_ONLY = ("initial_params", "hook_fn", "mp_context", "disable_validation", "transforms")


def refuse_unknown_keywords(func: Any, unknown: list[str]) -> None:
    """Refuse keywords that ``AutoSpec`` or ``AutoSpecKernel`` (``func``) does not take: an
    argument of ``pyro.infer.MCMC`` they do not take is named as such, any other name with
    the schedule's knobs (the ``refuse_unknown`` of
    :func:`~pyro_autospec.engine.methods.accepts_keyword_knobs`).

    Examples
    --------
    >>> refuse_unknown_keywords(None, ["hook_fn"])
    Traceback (most recent call last):
    ...
    TypeError: ['hook_fn'] is an argument of pyro.infer.MCMC that AutoSpec does not take ...
    """
    mcmc_only = [name for name in unknown if name in MCMC_ONLY]
    if mcmc_only:
        raise TypeError(
            f"{mcmc_only} {'is an argument' if len(mcmc_only) == 1 else 'are arguments'} of "
            "pyro.infer.MCMC that AutoSpec does not take (with AutoSpecKernel, pass it to "
            "MCMC): exact draws of discrete sites start from nothing and run no hooks. For the "
            "NUTS stage of a model with continuous "
            "sites, pass NUTS's own options as nuts_kwargs={...} (initial values: "
            "nuts_kwargs={'init_strategy': pyro.infer.autoguide.init_to_value(values=...)})"
        )
    raise TypeError(
        f"unknown keyword(s) {unknown}; the schedule knobs go in schedule=Schedule(...) (one "
        f"of {list(SCHEDULE_KNOBS)}; the device is the keyword device=)"
    )


def check_count(name: str, value: Any, minimum: int, optional: bool = False) -> None:
    """Refuse ``value`` unless it is an int (Python's or NumPy's, not a bool) of at least
    ``minimum``, or ``None`` where ``optional``.

    Examples
    --------
    >>> check_count("num_chains", 2, 1)
    >>> check_count("num_chains", True, 1)
    Traceback (most recent call last):
    ...
    ValueError: num_chains must be an int >= 1; got True
    """
    if optional and value is None:
        return
    if not is_count(value, minimum):
        none = " or None" if optional else ""
        raise ValueError(f"{name} must be an int >= {minimum}{none}; got {value!r}")


def check_model(model: Any, what: str) -> None:
    """Refuse anything but a Pyro model (a callable): an MCMC kernel such as ``NUTS(model)``,
    which is callable too, failed deep inside Pyro's integrator.

    Examples
    --------
    >>> check_model(print, "AutoSpec")
    >>> check_model(3, "AutoSpec")
    Traceback (most recent call last):
    ...
    TypeError: AutoSpec's model must be callable (a Pyro model); got int
    """
    if isinstance(model, MCMCKernel):
        inner = getattr(model, "model", None)
        name = getattr(inner, "__name__", "model")
        raise TypeError(
            f"{what} takes the Pyro model itself, not an MCMC kernel ({type(model).__name__}): "
            f"{what}({name}, ...); to run the discrete sites inside pyro.infer.MCMC, use "
            f"MCMC(AutoSpecKernel({name}), ...). A model with continuous sites gets NUTS from "
            f"AutoSpec itself (options as nuts_kwargs={{...}})"
        )
    if not callable(model):
        raise TypeError(
            f"{what}'s model must be callable (a Pyro model); got {type(model).__name__}"
        )
