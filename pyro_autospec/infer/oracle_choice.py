"""Which oracle a run asks: the compiled enumeration oracle, or the user's, checked.

``oracle="enum"`` compiles an :class:`~pyro_autospec.model.enum.EnumOracle` once; any other
oracle (or guide) is checked against the model's coordinates by one probe query.

*A guide and the run's data.* A learned guide conditions on a data set through its potentials
(``guide.context``: the unary and pairwise log potentials the model gives its sites at that
data). Whether a guide answers for the data of a run is decided by those potentials,
recomputed from the run's arguments as they are when it starts, not by the arguments'
identity: a tensor changed in place (``y.fill_(...)``) is the same object, and compares equal
to itself, yet gives other potentials. Torch's version counter (``tensor._version``) would
need a count taken when the guide was built, is a private attribute, and misses data the
model reads from elsewhere (a closure, a list); a copy of the arguments would need taking at
that time too. The potentials are what the guide keeps of its data, so comparing them needs
nothing more: one probe of the model per run, as asking a guide for other data does anyway.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

from pyro_autospec._warnings import user_stacklevel
from pyro_autospec.infer.display import compact_names
from pyro_autospec.model.discrete import SiteLayout
from pyro_autospec.model.enum import EnumOracle

__all__ = [
    "build_oracle",
    "check_guide_sites",
    "guide_for_call",
    "same_call",
    "snapshot",
    "warn_other_data",
]

#: Potentials recomputed for the same data agree with the stored ones to float rounding; data
#: that move any potential further than this (relative and absolute) are other data.
_CONTEXT_TOLERANCE = 1e-5


def build_oracle(
    oracle: Any,
    model: Callable,
    args: tuple,
    kwargs: dict,
    layout: SiteLayout,
    device: torch.device | str | None = None,
):
    """``"enum"``: a compiled :class:`~pyro_autospec.model.enum.EnumOracle`; else check it.

    A user's oracle is checked against ``layout`` by one probe query
    (:meth:`~pyro_autospec.model.discrete.SiteLayout.check_oracle`).

    Examples
    --------
    >>> import pyro, pyro.distributions as dist
    >>> from pyro_autospec.model import discover_sites
    >>> def model():
    ...     pyro.sample("z", dist.Bernoulli(0.5))
    >>> build_oracle("enum", model, (), {}, discover_sites(model))
    EnumOracle(num_coords=1, num_values=2, sites=['z'])
    """
    if isinstance(oracle, str):
        if oracle != "enum":
            raise ValueError(
                f"oracle must be 'enum' or a MarginalOracle instance; got the string {oracle!r}"
            )

        return EnumOracle(model, args, kwargs, layout=layout, device=device)
    layout.check_oracle(oracle)
    return oracle


def snapshot(value: Any) -> Any:
    """What a call's arguments were: tensors copied (in-place changes show), the rest kept."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (tuple, list)):
        return type(value)(snapshot(v) for v in value)
    if isinstance(value, dict):
        return {k: snapshot(v) for k, v in value.items()}
    return value


def same_call(a: Any, b: Any) -> bool:
    """Whether two calls' arguments (or their snapshots) are the same: equal tensors,
    identical other objects."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and a.device == b.device
            and bool(torch.equal(a, b))
        )
    if isinstance(a, (tuple, list)) or isinstance(b, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same_call, a, b))
    if isinstance(a, dict) or isinstance(b, dict):
        return (
            isinstance(a, dict)
            and isinstance(b, dict)
            and a.keys() == b.keys()
            and all(same_call(a[k], b[k]) for k in a)
        )
    return a is b


def _same_context(a: Any, b: Any) -> bool:
    """Whether two guide contexts hold the same potentials (to float rounding)."""
    for x, y in ((a.unary, b.unary), (a.slots, b.slots)):
        if x is None or y is None:
            if x is not y:
                return False
            continue
        y = y.to(x.device)
        if x.shape != y.shape or not torch.allclose(
            x, y, rtol=_CONTEXT_TOLERANCE, atol=_CONTEXT_TOLERANCE
        ):
            return False
    return True


def _contexts(guide: Any) -> bool:
    """Whether ``guide`` keeps its data set's potentials and computes them for other data."""
    return (
        getattr(guide, "context", None) is not None
        and callable(getattr(guide, "context_for", None))
        and callable(getattr(guide, "conditioned", None))
    )


def check_guide_sites(guide: Any, model: Callable, layout: SiteLayout) -> None:
    """Refuse a guide built for a model whose discrete latent sites are not the run's, and
    warn about one built from another model function with the same sites.

    A guide built from a model (``guide.layout``, ``guide.model``) answers for that model:
    conditioned on the run's data it traces its own model, so a guide of another model would
    fail with that model's sites in the message, or, with the same sites, answer for the
    other model. Functions are told apart by their module and qualified name (a model
    defined again, in a notebook cell, is the same model). A guide without a layout (built
    from sizes alone) is checked by its sizes only.
    """
    built = getattr(guide, "layout", None)
    theirs = getattr(built, "coordinates", None)
    if theirs is None:
        return
    if list(theirs) != list(layout.coordinates):
        same_names = [site.name for site in built.sites] == [site.name for site in layout.sites]

        def described(lay: Any) -> str:
            names = compact_names([site.name for site in lay.sites])
            text = f"{names} ({lay.num_coords} coordinates, {lay.num_values} values)"
            if same_names:  # then their shapes differ: say so
                shapes = ", ".join(f"'{s.name}' {tuple(s.batch_shape)}" for s in lay.sites)
                text += f", batch shapes {shapes}"
            return text

        raise ValueError(
            f"The guide was built for a model whose discrete latent sites are "
            f"{described(built)}; this run's model has {described(layout)}. A guide answers "
            "for the model it was built from. Build and train one for this model "
            "(AnyOrderGuide(model, model_args)), or run the model the guide was built for."
        )
    own = getattr(guide, "model", None)
    if own is None or own is model:
        return
    ours, theirs = _function_name(model), _function_name(own)
    if ours and theirs and ours != theirs:
        warnings.warn(
            f"the guide was built from the model {theirs[1]!r} and this run's model is "
            f"{ours[1]!r}: they have the same discrete latent sites, but the guide answers for "
            "its own model (its potentials and factor graph come from it). If the two differ, "
            "build and train a guide for this model.",
            UserWarning,
            stacklevel=user_stacklevel(),
        )


def _function_name(f: Any) -> tuple[str, str] | None:
    """``(module, qualified name)`` of a function, ``None`` for an object without them (a
    handler's wrapper)."""
    module, name = getattr(f, "__module__", None), getattr(f, "__qualname__", None)
    return (module, name) if isinstance(module, str) and isinstance(name, str) else None


def guide_for_call(guide: Any, args: tuple, kwargs: dict) -> Any:
    """The guide as it answers for the run's data ``model(*args, **kwargs)``.

    A guide built from a model (``AnyOrderGuide``) answers for its own data set
    (``model_args``) until conditioned on another (``guide.oracle(*args)``); a run on other
    data asks it for the run's data, as a ``DiffusionGuide`` is asked. The run's data are the
    guide's own only if they give the guide's potentials now: data changed in place since the
    guide was built (the same tensor, ``y.fill_(...)``) are other data, and the guide is
    asked for them (see the module's notes). Any other oracle is returned as it is (see
    :func:`warn_other_data`).
    """
    own = getattr(guide, "model_args", None)
    if getattr(guide, "model", None) is None or own is None or not hasattr(guide, "oracle"):
        return guide
    if not same_call((tuple(own), dict(guide.model_kwargs)), (tuple(args), dict(kwargs))):
        return guide.oracle(*args, **kwargs)
    if not _contexts(guide):
        return guide
    # the same arguments: the same values too, unless they were changed in place since
    current = guide.context_for(None, *args, **kwargs)
    if _same_context(current, guide.context):
        return guide
    return guide.conditioned(current)


def warn_other_data(oracle: Any, args: tuple, kwargs: dict, correction: str | None) -> None:
    """Warn (once per call) when ``oracle`` is a guide's oracle for other data than the run's.

    ``guide.oracle(*A)`` answers for data ``A`` whatever data a run is given (the conditioned
    oracle keeps ``A``'s potentials, not ``A``); run on data ``B``, or on ``A`` changed in
    place afterwards, its draws are proposals for the posterior given ``A``. The check
    recomputes the potentials of the run's arguments through the oracle's guide and compares
    them with the oracle's (see the module's notes). Anything but a guide's oracle for one
    data set is not checked; neither is a run without arguments of a guide built with some
    (the guide has no way to compute that call's potentials).
    """
    guide, context = getattr(oracle, "guide", None), getattr(oracle, "context", None)
    if context is None or getattr(guide, "model", None) is None or not _contexts(guide):
        return
    if getattr(context, "num_sets", 1) != 1:
        return
    if not args and not kwargs and (guide.model_args or guide.model_kwargs):
        return
    if _same_context(guide.context_for(None, *args, **kwargs), context):
        return
    if correction is None:
        effect = (
            "With correction=None the draws are that other posterior's (as the guide learned "
            "it), not draws for this run's data."
        )
    else:
        effect = (
            f"correction={correction!r} still targets this run's posterior (the weights use "
            f"the model at run()'s data), but proposals for other data give poor weights (see "
            f"the k-hat)."
        )
    warnings.warn(
        f"guide= is a guide's oracle conditioned on other data than this run's: its potentials "
        f"differ from those of the arguments run() was given (it was built by guide.oracle(...) "
        f"for other arguments, or the data were changed in place after it was built), so its "
        f"draws are proposals for the posterior given that other data. {effect} Pass the guide "
        f"itself, AutoSpec(model, guide=guide), which is asked for the data run() is given, or "
        f"build the oracle for the data you run on: guide.oracle(*args, **kwargs) with run()'s "
        f"arguments, after any change to them.",
        UserWarning,
        stacklevel=user_stacklevel(),
    )
