"""The most probable joint assignment of a model's discrete sites (``AutoSpec.map``).

A max-product pass: Pyro's :func:`~pyro.infer.infer_discrete` with ``temperature=0`` over
the model with every discrete site enumerated in parallel. Pyro's pass leaves out the scales
of ``poutine.scale`` (and of plates with a fixed subsample), while the draws follow the scaled
density; so every scaled site's distribution is first replaced by one whose log density is
the scaled one (:class:`ScaleIntoDensity`), and the pass maximises the density the draws
follow. Where Pyro's pass cannot decode the model (``OneHotCategorical`` sites) and the model
has few enough joint states, every state is scored instead.

Before either, the model is compiled as a run compiles it
(:class:`~pyro_autospec.model.enum.EnumOracle`, without measuring its queries), so that
``map`` refuses what a run refuses: a site reaching past its ``pyro.markov`` history, for
one, which Pyro's pass decodes silently wrong. Where the compiled oracle had to give every
site its own enumeration dim (``pyro.markov`` recycles a dim between sites that a later one
reads both of: a re-entered ``keep=True`` loop, or a grid with a fresh inner ``pyro.markov``
per row), the pass runs with ``pyro.markov`` hidden from enumeration too, as Pyro's recycled
dims decode such a model wrong. After, data of probability zero are refused: the most
probable state has density zero exactly when every state has.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from pyro import poutine
from pyro.distributions import TorchDistribution
from pyro.infer import infer_discrete
from pyro.poutine.messenger import Messenger

from pyro_autospec.model.discrete import SiteLayout
from pyro_autospec.model.enum import EnumOracle, check_evidence, with_oracle_dims
from pyro_autospec.model.errors import UnsupportedSiteError
from pyro_autospec.model.log_joint import enumerate_posterior, log_joint
from pyro_autospec.model.tracing import parallel_enumeration

__all__ = ["MAX_BRUTE_FORCE_STATES", "ScaleIntoDensity", "most_probable"]

#: Largest number of joint states scored one by one when the max-product pass cannot run.
MAX_BRUTE_FORCE_STATES = 2**16


class _Scaled(TorchDistribution):
    """``base`` with log density ``scale * base.log_prob`` (support and enumeration kept)."""

    arg_constraints: dict = {}

    def __init__(self, base, scale):
        self.base, self.scale = base, scale
        super().__init__(base.batch_shape, base.event_shape, validate_args=False)

    @property
    def has_enumerate_support(self) -> bool:
        return bool(getattr(self.base, "has_enumerate_support", False))

    @property
    def support(self):
        return self.base.support

    def enumerate_support(self, expand: bool = True) -> torch.Tensor:
        return self.base.enumerate_support(expand=expand)

    def expand(self, batch_shape, _instance=None):
        return _Scaled(self.base.expand(batch_shape), self.scale)

    def sample(self, sample_shape=()):
        return self.base.sample(torch.Size(sample_shape))

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        return self.scale * self.base.log_prob(value)


class ScaleIntoDensity(Messenger):
    """Move each site's scale into its distribution's log density (scale 1 afterwards).

    Put it outside the model (inside any enumeration or tracing handler): the model's own
    ``poutine.scale`` and plates have set ``msg["scale"]`` by the time it sees a site.
    """

    def _process_message(self, msg: dict) -> None:
        if msg["type"] != "sample":
            return
        scale = msg.get("scale", 1.0)
        if isinstance(scale, torch.Tensor) or scale != 1.0:
            msg["fn"] = _Scaled(msg["fn"], scale)
            msg["scale"] = 1.0


def _zeros(layout: SiteLayout) -> torch.Tensor:
    """LongTensor[1, n]: one assignment of the coordinates, to read the sites' shapes."""
    return torch.zeros(1, layout.num_coords, dtype=torch.long)


def most_probable(
    model: Callable, args: tuple, kwargs: dict, layout: SiteLayout
) -> dict[str, torch.Tensor]:
    """``argmax_x p(x | data)`` over the discrete sites of ``layout`` (see the module).

    Returns
    -------
    dict
        ``name -> Tensor`` in the model's shape and dtype for every discrete latent site.

    Raises
    ------
    AutoSpecModelError, UnsupportedSiteError
        Where a run of the model would refuse it, or the data have probability zero.
    """
    oracle = EnumOracle(model, args, kwargs, layout=layout, lazy=True)  # refuses as a run does
    enumerated = poutine.infer_config(ScaleIntoDensity()(model), parallel_enumeration)
    enumerated = with_oracle_dims(oracle, enumerated)  # every site its own dim where it did
    decoder = infer_discrete(
        enumerated, first_available_dim=-1 - layout.max_plate_nesting, temperature=0
    )
    try:
        trace = poutine.trace(decoder).get_trace(*args, **kwargs)
        # a site with one value keeps a size-1 enumeration dim in Pyro's decoded trace
        shapes = {k: v.shape[1:] for k, v in layout.from_coords(_zeros(layout)).items()}
        best = {
            name: trace.nodes[name]["value"].detach().reshape(shapes[name]) for name in layout.names
        }
        # the data have probability zero exactly where the most probable state has
        check_evidence(trace.log_prob_sum().detach())
        return best
    except (ValueError, RuntimeError, NotImplementedError, KeyError) as error:
        states = math.prod(int(k) for k in layout.support_sizes.tolist())
        if states > MAX_BRUTE_FORCE_STATES:
            raise UnsupportedSiteError(
                f"map(): Pyro's infer_discrete(temperature=0) could not decode this model "
                f"({type(error).__name__}: {str(error).splitlines()[0]}), and its "
                f"{layout.num_coords} discrete coordinates have {states:.3g} joint states, too "
                f"many to score one by one (at most {MAX_BRUTE_FORCE_STATES}). "
                f"OneHotCategorical sites are a known cause: write them as Categorical sites "
                f"(and one_hot the value) for map()."
            ) from error
        states, log_prob = enumerate_posterior(model, args, kwargs, layout=layout)
        best = states[int(torch.nan_to_num(log_prob, nan=-math.inf).argmax())][None]
        best = {k: v[0] for k, v in layout.from_coords(best).items()}
        batch = {k: v[None] for k, v in best.items()}
        check_evidence(log_joint(model, args, kwargs, layout, batch))
        return best
