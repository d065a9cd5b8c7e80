"""``AutoSpec(model)``: draws of a Pyro model's latent sites, used like ``MCMC``.

A thin facade: it checks the arguments, looks at the model once, and hands the work to one run
object per kind of model:

* discrete latent sites only: :class:`~pyro_autospec.infer.discrete_run.DiscreteRun` (exact
  draws by autospeculation from an exact oracle, or a learned guide with a correction);
* continuous AND discrete latent sites:
  :class:`~pyro_autospec.infer.mixed_run.MixedRun` (NUTS on the continuous sites, exact
  draws of the discrete sites given each continuous draw);
* continuous sites only, with a diffusion guide:
  :class:`~pyro_autospec.infer.diffusion_run.DiffusionRun`.

References
----------
.. [1] N. Anari, C. Baronio, CJ Chen, A. Haqi, F. Koehler, A. Li, T.-D. Vuong. Parallel
   Sampling via Autospeculation. STOC 2026, arXiv:2511.07869.
"""

from __future__ import annotations

import time
import warnings
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from pyro import poutine
from pyro.poutine.runtime import _PYRO_STACK

from pyro_autospec._warnings import user_stacklevel
from pyro_autospec.engine.errors import check_device
from pyro_autospec.engine.keys import check_seed
from pyro_autospec.engine.methods import (
    DISCRETE,
    Schedule,
    accepts_keyword_knobs,
    given_knobs,
    method_names,
)
from pyro_autospec.engine.protocols import oracle_num_draws
from pyro_autospec.infer.diffusion_run import DiffusionRun
from pyro_autospec.infer.discrete_run import SAMPLERS, DiscreteRun, warn_scales
from pyro_autospec.infer.display import compact_names
from pyro_autospec.infer.knobs import (
    CORRECTIONS,
    METHODS,
    check_count,
    check_model,
    refuse_unknown_keywords,
)
from pyro_autospec.infer.mixed_run import MixedRun
from pyro_autospec.infer.oracle_choice import build_oracle
from pyro_autospec.infer.run_base import RunSettings
from pyro_autospec.infer.seeds import chain_seeds, run_seed
from pyro_autospec.model.discrete import discover_sites
from pyro_autospec.model.errors import UnsupportedSiteError
from pyro_autospec.model.map_decode import most_probable
from pyro_autospec.model.tracing import users_generators_kept
from pyro_autospec.parallel.groups import require_process_group

__all__ = ["AutoSpec", "build_oracle", "chain_seeds"]

_DISCRETE_METHODS = method_names(DISCRETE, front_end=True)


def _is_diffusion_guide(guide: Any) -> bool:
    """A diffusion guide serves ``MeanOracle`` rows over continuous sites (not marginals)."""
    return (
        guide is not None
        and hasattr(guide, "times")
        and hasattr(guide, "layout")
        and callable(getattr(guide, "oracle", None))
        and not callable(getattr(guide, "log_marginals", None))
    )


@dataclass(frozen=True)
class ModelKernel:
    """What ``AutoSpec.kernel`` gives: the model, read as ``mcmc.kernel.model`` is read
    (``arviz.from_pyro``). AutoSpec has no MCMC kernel; to run exact draws inside
    ``pyro.infer.MCMC``, use :class:`~pyro_autospec.infer.AutoSpecKernel`."""

    model: Callable


class AutoSpec:
    """Draws of a Pyro model's latent sites given its data, with the interface of ``MCMC``.

    ``AutoSpec`` has the interface of :class:`pyro.infer.MCMC` (``run``, ``get_samples``,
    ``diagnostics``, ``summary``), gives the most probable assignment of the discrete sites
    with :meth:`map`, and picks a sampler by the model's latent sites:

    * **Discrete sites only**: exact, independent draws of ``p(x | data)``. Every draw follows
      the chain rule of the posterior in a uniformly random order, and autospeculation [1]
      samples ``n`` coordinates in about ``sqrt(n)`` batched oracle calls ("rounds") instead
      of ``n``. The default oracle is exact enumeration, compiled once
      (:class:`~pyro_autospec.model.enum.EnumOracle`).
    * **Continuous and discrete sites**: Pyro's ``NUTS`` samples the continuous sites with the
      discrete ones enumerated out; then the discrete sites are drawn exactly given each
      continuous draw, all draws at once (``sampler``). ``get_samples()`` returns both.
    * **Continuous sites only** with ``guide=DiffusionGuide(...)``: draws of the guide's
      discretised diffusion.

    Parameters
    ----------
    model : callable
        A Pyro model. Discrete latent sites must be enumerable (Bernoulli, Categorical,
        OneHotCategorical, Binomial, BetaBinomial), inside plates or not; ``poutine.mask``,
        ``obs_mask``, ``poutine.scale``, ``pyro.markov``, ``Vindex``, ``pyro.deterministic``
        and fixed plate subsamples are supported.
    num_samples : int
        Draws per chain.
    warmup_steps : int, optional
        NUTS warm-up steps per chain for models with continuous sites (default
        ``num_samples``, as ``MCMC``), or discarded steps of each ``"imh"`` chain (default
        ``num_samples // 10``). Exact draws of a discrete model need none: a value given
        there is ignored, with a warning (code written for ``MCMC`` runs unchanged). The
        third positional argument, as in ``MCMC(kernel, num_samples, warmup_steps)``.
    num_chains : int
        Chains. For exact draws: independent batches (one engine run each, seeded
        separately); with continuous sites: NUTS chains, run one after the other.
    oracle : "enum" or MarginalOracle
        ``"enum"``: exact conditional marginals by enumeration, compiled once. Or any object
        with ``num_coords``, ``num_values`` and ``log_marginals(values, mask)`` (or only
        ``log_marginals_at(values, mask, targets)``, as the engine accepts) that follows
        the coordinate mapping of :mod:`pyro_autospec.model.discrete` (discrete-only models):
        sites in trace order, each site's values flattened in C order over its batch shape
        (``OneHotCategorical``: one coordinate per event), values as indices into
        ``enumerate_support``, ``num_values`` the largest support. The mapping is checked by
        one probe query before sampling, and the draws by the self-check below.
    method : {"autospec", "sequential", "speculative", "agr24"}
        The engine's method for discrete sites. ``"sequential"`` is the chain-rule reference
        (``n`` rounds per draw); the last two are the baselines of
        :mod:`pyro_autospec.engine.host_plane` (all exact). With a diffusion guide:
        ``"autospec"``, ``"sequential"`` or ``"picard"`` (approximate).
    guide : MarginalOracle or DiffusionGuide, optional
        An approximate oracle, typically a trained
        :class:`~pyro_autospec.guides.AnyOrderGuide` (discrete-only models); replaces
        ``oracle``. Its draws are exact for the guide's own random-order law; every draw
        records ``log_weight = log p(x, data) - log q_sigma(x)``, and :meth:`diagnostics`
        reports the weights' Pareto k-hat (PSIS) and ESS. A guide answers for the data
        :meth:`run` is given: an ``AnyOrderGuide`` built on other data, or on data changed in
        place since, is asked through ``guide.oracle(*args, **kwargs)``. An oracle a guide
        built for other data (``guide.oracle(*other)``) answers for those, with a
        ``UserWarning`` (whether the data are the same is decided by the potentials the guide
        reads from them: see :mod:`~pyro_autospec.infer.oracle_choice`). A
        :class:`~pyro_autospec.guides.DiffusionGuide` samples continuous-only models.
    correction : {None, "importance", "imh"}
        For a guide, or an approximate oracle of your own (refused with the exact default
        ``oracle="enum"``). ``None``: return the guide's draws as they are (a warning says so).
        ``"importance"``: resample ``num_samples`` draws per chain by PSIS-smoothed importance
        weights (consistent, not exact at finite size). ``"imh"``: each chain is an
        independent Metropolis-Hastings chain with the guide as proposal (exact MCMC).
    max_plate_nesting : int, optional
        Found from the model when ``None``.
    seed : int, torch.Generator, numpy.random.Generator or None
        ``None`` follows torch's global RNG (``pyro.set_rng_seed``). An int must lie in
        ``[0, 2**64)``; other values raise at construction, as in every entry point
        (:func:`~pyro_autospec.engine.keys.check_seed`).
    disable_progbar : bool
        Hide the progress bars.
    save_params : list of str, optional
        Sites to keep in :meth:`get_samples` (default: every latent and deterministic site).
    device : str or torch.device, optional
        Where the oracle answers queries and the draws are evaluated (``"cuda"`` for a GPU);
        the model's own tensors (its data) must live there too. Default: where the model's
        tensors are.
    nuts_kwargs : dict, optional
        Keywords of :class:`pyro.infer.NUTS` for models with continuous sites
        (``target_accept_prob``, ``max_tree_depth``, ``jit_compile``, ...);
        ``max_plate_nesting`` there is taken as AutoSpec's own. Ignored, with a warning,
        for models without continuous sites.
    distributed : bool
        Spread the draws over the processes (ranks) of a ``torch.distributed`` process group
        (launched by ``torchrun``; see :doc:`/engine`). Every rank runs the same script with
        the same arguments and seed, samples its share of the draws, and ends with all of
        them: :meth:`get_samples` is the same on every rank, and identical to a single-process
        run with the same ``seed``. Model evaluations after sampling and, for models with
        continuous sites, the NUTS chains run on every rank (rank 0's seeds); only the
        discrete draws are shared out. ``seed=None`` takes rank 0's seeds.
    sampler : {"auto", "engine", "ffbs"}
        How exact draws of the discrete sites are made. ``"auto"`` (default): on a CPU
        with the default oracle and ``method="autospec"``, by forward filtering, backward
        sampling (:mod:`~pyro_autospec.model.ffbs`: one variable-elimination pass over the
        model's factors, then all draws at once, vectorised) whenever the elimination fits
        (chains, coupled chains, plates of chains, mixtures), else by the any-order engine.
        For a model with continuous sites the continuous draws are a plate of that pass (one
        pass for every draw). ``"engine"``: always the engine's ``method`` (autospeculation's
        rounds). ``"ffbs"``: always the elimination (an error if it does not fit). Both are
        exact and self-checked on every draw; ``results[i].method`` (``"ffbs"`` or the
        engine's method), ``diagnostics()["sampler"]``, the summary and ArviZ's ``sampler``
        attribute say which ran (for a model with continuous sites, what drew the discrete
        sites given the NUTS draws).
    schedule : Schedule or dict, optional
        The engine's schedule knobs in one typed object (:class:`~pyro_autospec.Schedule`:
        ``rho``, ``max_block``, ``max_rows_per_round``, ``max_elements``,
        ``max_concurrent_draws`` for continuous batching, ``rule`` for a diffusion guide, ...);
        they move rounds against rows and never change the law of the draws. The knobs as
        keywords (``max_block=8``), the old spelling, still work with a :class:`FutureWarning`
        (not both ways for one knob; a cap given as a keyword replaces the schedule's).

    Attributes
    ----------
    layout : SiteLayout
        The coordinate mapping (after :meth:`run`).
    results : list of SampleResult
        The engine's results (one per chain; one for all draws of a mixed model).
    run_kind : str
        ``"discrete"``, ``"mixed"`` or ``"diffusion"`` (after :meth:`run`).
    transforms : dict or None
        As ``pyro.infer.MCMC.transforms``: ``{site: transform}`` mapping each continuous latent
        site's constrained values to the unconstrained space (``biject_to(support).inv``).
        ``None`` before :meth:`run`; ``{}`` for a model without continuous sites (discrete
        sites take no transform); NUTS's own for a model with continuous and discrete sites;
        the guide's sites' for a diffusion guide.

    Raises
    ------
    SelfCheckError
        (from :meth:`run`) When ``log p(x, data) - log q(x)`` is not the same for every draw of
        an exact oracle: the oracle does not match the model's density, and the draws would
        not be exact.

    Notes
    -----
    **The self-check.** For an exact oracle ``q(x) = p(x, data) / Z``, so every draw has the
    same ``lp - oracle_log_prob = log Z``. Every run checks this within float tolerance (see
    :func:`~pyro_autospec.infer.self_check.check_exact_draws`) and raises otherwise: a handler
    that the enumeration oracle did not reproduce would show up here. **Scales.** Under
    ``poutine.scale`` (or a plate with a fixed subsample) the draws follow the scaled density
    ``exp(sum scale * log p)``, as ``MCMC`` does; ``lp`` includes the scales (a warning says
    so), the pointwise log likelihood does not. **Masks** (``poutine.mask``, ``obs_mask``):
    masked terms are left out of the density, so a masked latent element is uniform on its
    support. With an approximate oracle ``q``, ``lp - oracle_log_prob`` are log importance
    weights on the space of (draw, order) pairs (see :doc:`/guides`); a Pareto k-hat of 0.7
    or more means the weights' tail is too heavy for a correction to be trusted.

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> def model(data):
    ...     with pyro.plate("pixels", 4):
    ...         z = pyro.sample("z", dist.Bernoulli(0.5))
    ...         pyro.sample("y", dist.Normal(2.0 * z - 1.0, 1.0), obs=data)
    >>> autospec = AutoSpec(model, num_samples=50, num_chains=2, seed=0, disable_progbar=True)
    >>> autospec.run(torch.tensor([1.2, -0.7, 0.3, 2.0]))
    AutoSpec(method='autospec', num_samples=50, num_chains=2, sites=['z'])
    >>> samples = autospec.get_samples()
    >>> samples["z"].shape, samples["z"].dtype
    (torch.Size([100, 4]), torch.float32)
    >>> autospec.get_samples(group_by_chain=True)["z"].shape
    torch.Size([2, 50, 4])

    A model with a continuous site (NUTS, then exact draws of ``z`` given each ``loc``):

    >>> def mixture(data):
    ...     loc = pyro.sample("loc", dist.Normal(0.0, 3.0))
    ...     with pyro.plate("data", len(data)):
    ...         z = pyro.sample("z", dist.Bernoulli(0.5))
    ...         pyro.sample("y", dist.Normal(loc * (2 * z - 1), 1.0), obs=data)
    >>> fit = AutoSpec(mixture, num_samples=20, warmup_steps=20, seed=0, disable_progbar=True)
    >>> fit.run(torch.tensor([2.1, -1.9, 2.4]))
    AutoSpec(method='autospec', num_samples=20, num_chains=1, sites=['loc', 'z'])
    >>> {k: tuple(v.shape) for k, v in fit.get_samples().items()}
    {'loc': (20,), 'z': (20, 3)}
    """

    @accepts_keyword_knobs(refuse_unknown_keywords)
    def __init__(
        self,
        model: Callable,
        num_samples: int,
        warmup_steps: int | None = None,
        *,
        num_chains: int = 1,
        oracle: Any = "enum",
        method: str = "autospec",
        guide: Any = None,
        correction: str | None = None,
        max_plate_nesting: int | None = None,
        seed: int | torch.Generator | None = None,
        disable_progbar: bool = False,
        save_params: Sequence[str] | None = None,
        device: str | torch.device | None = None,
        nuts_kwargs: dict | None = None,
        distributed: bool = False,
        sampler: str = "auto",
        schedule: Schedule | Mapping | None = None,
    ):
        check_model(model, "AutoSpec")
        check_count("num_samples", num_samples, 1)
        check_count("num_chains", num_chains, 1)
        check_count("max_plate_nesting", max_plate_nesting, 0, optional=True)
        check_count("warmup_steps", warmup_steps, 0, optional=True)
        if method not in METHODS:
            diffusion_only = tuple(m for m in METHODS if m not in _DISCRETE_METHODS)
            raise ValueError(
                f"method must be one of {_DISCRETE_METHODS} (discrete sites), or with a "
                f"diffusion guide also {diffusion_only}; got {method!r}"
            )
        if sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {SAMPLERS}; got {sampler!r}")
        if correction not in CORRECTIONS:
            raise ValueError(f"correction must be None, 'importance' or 'imh'; got {correction!r}")
        own_oracle = isinstance(oracle, str) and oracle == "enum"
        if sampler == "ffbs" and (guide is not None or correction is not None or not own_oracle):
            raise ValueError(
                "sampler='ffbs' eliminates the model's own factors (oracle='enum'); a guide, "
                "a correction or an oracle of your own is sampled by the engine: leave "
                "sampler='auto' (or 'engine')"
            )
        if correction is not None and guide is None and own_oracle:
            raise ValueError(
                f"correction={correction!r} corrects the draws of an approximate oracle: a "
                "guide (guide=) or an oracle of your own (oracle=). The default oracle='enum' "
                "is exact, so its draws need none: leave correction=None, or pass the guide"
            )
        if guide is not None and not (isinstance(oracle, str) and oracle == "enum"):
            raise ValueError(
                "pass either oracle= or guide=, not both: a guide is the (approximate) oracle"
            )
        if guide is not None and (
            isinstance(guide, type)
            or not (hasattr(guide, "num_coords") or _is_diffusion_guide(guide))
        ):
            what = (
                f"the class {guide.__name__}, not an instance"
                if isinstance(guide, type)
                else f"{type(guide).__name__} {guide!r}"[:120]
            )
            raise TypeError(
                f"guide must be a built guide: an AnyOrderGuide (or another MarginalOracle, "
                f"with num_coords, num_values and log_marginals) for discrete sites, or a "
                f"DiffusionGuide for continuous ones; got {what}. Build it from the model "
                f"first, e.g. guide = AnyOrderGuide(model, args)"
            )
        for name, given in (("guide", guide), ("oracle", oracle)):
            if not isinstance(given, (str, type)) and oracle_num_draws(given) is not None:
                raise ValueError(
                    f"{name}= is a family of {oracle_num_draws(given)} targets (num_draws), one "
                    f"per draw, each conditioned on data of its own; AutoSpec samples the "
                    f"posterior of the data passed to run(): pass a {name} for that data "
                    f"(guide.oracle(*args), or the guide itself), and sample a family of data "
                    f"sets with pyro_autospec.sample_any_order(family, family.num_draws)"
                )
        # a bad name, a GPU this machine lacks, or meta: refused before any run
        self.device = None if device is None else check_device(device)
        self.model = model
        self.num_samples = int(num_samples)
        self.num_chains = int(num_chains)
        self.oracle = oracle
        self.method = method
        self.guide = guide
        self.correction = correction
        self.sampler = sampler
        self._warmup_steps = None if warmup_steps is None else int(warmup_steps)
        self.max_plate_nesting = max_plate_nesting
        self.seed = check_seed(seed)
        self.seed_used: int | None = None  # the int seed of the last run (run_seed)
        self.disable_progbar = disable_progbar
        self.save_params = None if save_params is None else list(save_params)
        self.nuts_kwargs = dict(nuts_kwargs or {})
        if "max_plate_nesting" in self.nuts_kwargs:  # as Pyro users pass it to NUTS
            nesting = self.nuts_kwargs.pop("max_plate_nesting")
            if max_plate_nesting is not None and nesting != max_plate_nesting:
                raise ValueError(
                    f"max_plate_nesting is {max_plate_nesting} but nuts_kwargs gives "
                    f"{nesting}; AutoSpec uses one value for NUTS and enumeration: pass it "
                    f"once, as AutoSpec(..., max_plate_nesting=...)"
                )
            self.max_plate_nesting = nesting
        self.schedule = given_knobs(schedule)
        if not isinstance(distributed, bool):
            raise TypeError(f"distributed must be True or False; got {distributed!r}")
        self.distributed = distributed
        self.run_kind: str | None = None
        self._run = None
        self.transforms: dict | None = None
        self._failure: str | None = None
        self._data: tuple[tuple, dict] = ((), {})

    def __repr__(self) -> str:
        sites = None
        if self._run is not None and self.run_kind != "diffusion":
            layout = self._run.layout
            continuous = [s.name for s in layout.continuous]
            order = [s[0] for s in layout.signature if s[0] in set(continuous + layout.names)]
            sites = compact_names(order)
        elif self._run is not None:
            sites = compact_names(self._run.layout.names)
        extra = ""
        if self.guide is not None or self.correction is not None:
            extra = f", guide={type(self.guide).__name__}, correction={self.correction!r}"
        return (
            f"AutoSpec(method={self.method!r}, num_samples={self.num_samples}, "
            f"num_chains={self.num_chains}, sites={sites}{extra})"
        )

    # -------------------------------------------------------------------------------- run
    @property
    def warmup_steps(self) -> int:
        """Warm-up steps: NUTS's (mixed models), the IMH chains' (``"imh"``), else 0."""
        if self.run_kind in ("discrete", "diffusion") and self.correction != "imh":
            return 0  # exact draws: a warmup_steps given was ignored, with a warning
        if self._warmup_steps is not None:
            return self._warmup_steps
        if self.run_kind == "mixed":
            return self.num_samples
        if self.correction == "imh":
            return self.num_samples // 10
        return 0

    @poutine.block
    def run(self, *args: Any, **kwargs: Any) -> AutoSpec:
        """Draw ``num_chains * num_samples`` samples of the model's latent sites.

        Parameters
        ----------
        *args, **kwargs
            The model's arguments (data included).

        Returns
        -------
        AutoSpec
            ``self``.

        Notes
        -----
        A run that raises (a failed self-check, an oracle or model error, ``KeyboardInterrupt``)
        leaves no draws behind: the draws of any earlier run are discarded when a run starts,
        and :meth:`get_samples` and the other readers raise until a run succeeds.

        With an int ``seed``, every ``run`` with the same arguments gives the same draws (the
        draws are keyed by the seed, not taken from a stream): unlike ``pyro.infer.MCMC``,
        calling ``run`` again does not give new draws. For more draws raise ``num_samples``
        or ``num_chains``, or build with another seed; with ``seed=None`` each run takes a
        fresh seed from Pyro's global generator (``pyro.set_rng_seed``), and a generator gives
        one. The int seed a run used is ``diagnostics()["seed"]`` and ArviZ's ``seed``
        attribute: ``seed=`` that int repeats the run.
        """
        _warn_outer_handlers("run")
        # Forget the previous run first: a failure below must not leave its draws readable.
        self._run, self.run_kind, self._failure = None, None, None
        self.transforms = None
        try:
            if self.distributed:
                require_process_group("AutoSpec(distributed=True)")
            # the run's int seed (seed=None draws it from torch's global generator, which it
            # advances once), recorded so that seed= that int repeats the run
            self.seed_used = run_seed(self.seed, distributed=self.distributed)
            # it keys every random number of the run, so tracing the model (whose continuous
            # sites draw from torch's global generator) leaves the user's CPU stream alone
            with users_generators_kept():
                return self._run_model(args, kwargs)
        except BaseException as error:
            self._run, self.run_kind = None, None
            self._failure = f"{type(error).__name__}: {error}"
            raise

    def _run_model(self, args: tuple, kwargs: dict) -> AutoSpec:
        self._data = (args, kwargs)
        progress = not self.disable_progbar
        start = time.perf_counter()
        if _is_diffusion_guide(self.guide):
            if self.correction is not None:
                raise ValueError(
                    "correction= needs the guide's density of each draw; a DiffusionGuide's "
                    "draws X_T / T have no tractable density, so use correction=None and check "
                    "the guide with pyro_autospec.diagnostics.sbc"
                )
            self._check_warmup("diffusion")
            self.run_kind = "diffusion"
            self._run = DiffusionRun(self.model, self.guide, self._settings(progress)).run(
                args, kwargs
            )
            self.transforms = dict(self._run.transforms)
            self._run.wall_time = time.perf_counter() - start
            return self
        if self.method not in _DISCRETE_METHODS:
            raise ValueError(
                f"method={self.method!r} is for diffusion guides; discrete sites take one of "
                f"{_DISCRETE_METHODS}"
            )
        layout = discover_sites(
            self.model,
            args,
            kwargs,
            max_plate_nesting=self.max_plate_nesting,
            continuous="allow",
        )
        tracing = time.perf_counter() - start
        self._check_save_params(layout)
        warn_scales(layout)
        if layout.continuous:
            self._run_mixed(layout, args, kwargs, progress)
        else:
            self._check_warmup("discrete")
            self.run_kind = "discrete"
            self._run = DiscreteRun(
                self.model,
                layout,
                self._settings(progress),
                oracle=self.oracle,
                guide=self.guide,
                correction=self.correction,
                sampler=self.sampler,
            ).run(args, kwargs)
        self.transforms = dict(self._run.transforms)
        timing = self._run.timing
        self._run.timing = OrderedDict([("tracing", tracing), *timing.items()])
        self._run.wall_time = time.perf_counter() - start
        return self

    @poutine.block
    def map(self, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:
        """The most probable joint assignment of the discrete sites given the data (MAP).

        The maximiser of ``p(x | data)`` over every joint assignment ``x`` of the discrete
        latent sites (a Viterbi path for an HMM): a max-product pass of Pyro's
        :func:`~pyro.infer.infer_discrete` with ``temperature=0`` over the model with every
        discrete site enumerated, the same density the draws follow (masks and scales
        included: see :mod:`pyro_autospec.model.map_decode`). Where Pyro cannot decode the
        model that way (``OneHotCategorical`` sites, for one) and the model has at most
        ``2**16`` joint states, every state is scored instead
        (:func:`~pyro_autospec.model.log_joint.enumerate_posterior`). Ties go to one of the
        tied assignments. Needs no :meth:`run`.

        Parameters
        ----------
        *args, **kwargs
            The model's arguments (data included).

        Returns
        -------
        dict
            ``name -> Tensor`` for every discrete latent site, in the model's shape and dtype
            (as one draw of :meth:`get_samples`, without the draw dimension).

        Raises
        ------
        UnsupportedSiteError
            For a model with continuous latent sites: condition them first, e.g.
            ``AutoSpec(poutine.condition(model, data={"loc": loc}), ...).map(data)`` gives
            the MAP of the discrete sites given ``loc``.
        AutoSpecModelError
            Where :meth:`run` would refuse the model (the model is compiled as a run compiles
            it first: Pyro's max-product pass alone decodes a chain whose sites reach past
            their ``pyro.markov`` history silently wrong), or where the data have probability
            zero under every assignment.

        Examples
        --------
        >>> import torch, pyro, pyro.distributions as dist
        >>> def hmm(y):
        ...     x = 0
        ...     for t in pyro.markov(range(len(y))):
        ...         x = pyro.sample(f"x_{t}", dist.Bernoulli(0.1 + 0.8 * x))
        ...         pyro.sample(f"y_{t}", dist.Normal(2.0 * x - 1.0, 1.0), obs=y[t])
        >>> path = AutoSpec(hmm, num_samples=1).map(torch.tensor([-1.0, 0.9, 1.2, -0.2]))
        >>> [int(path[f"x_{t}"]) for t in range(4)]
        [0, 1, 1, 1]
        """
        _warn_outer_handlers("map")
        layout = discover_sites(
            self.model,
            args,
            kwargs,
            max_plate_nesting=self.max_plate_nesting,
            continuous="allow",
        )
        if layout.continuous:
            names = compact_names([s.name for s in layout.continuous])
            raise UnsupportedSiteError(
                f"map() gives the most probable assignment of discrete sites; the model also "
                f"has continuous latent sites {names}, whose MAP is not an enumeration. "
                f"Condition them to get the discrete sites' MAP given their values, e.g. "
                f"AutoSpec(pyro.poutine.condition(model, data={{name: value}}), ...).map(...) "
                f"with values from get_samples() of a run."
            )
        warn_scales(layout)
        if not layout.names:
            return {}
        return most_probable(self.model, args, kwargs, layout)

    def _run_mixed(self, layout, args, kwargs, progress) -> None:
        names = [s.name for s in layout.continuous]
        if self.guide is not None or not isinstance(self.oracle, str) or self.correction:
            raise UnsupportedSiteError(
                f"The model has continuous latent sites {names}. Guides, custom oracles and "
                f"corrections serve models whose latent sites are all discrete; for this model "
                f"AutoSpec samples the continuous sites by NUTS and the discrete ones exactly "
                f"by enumeration (leave oracle='enum', guide=None, correction=None), or "
                f"condition the continuous sites with poutine.condition."
            )
        self.run_kind = "mixed"
        self._run = MixedRun(
            self.model,
            layout,
            self._settings(progress),
            nuts_kwargs=self.nuts_kwargs,
            sampler=self.sampler,
        ).run(args, kwargs)

    def _settings(self, progress: bool) -> RunSettings:
        """What every run kind needs from this object (``run_kind`` set first: the default
        warm-up depends on it)."""
        return RunSettings(
            method=self.method,
            num_samples=self.num_samples,
            num_chains=self.num_chains,
            seed=self.seed_used,
            progress=progress,
            save_params=self.save_params,
            schedule=self.schedule,
            warmup_steps=self.warmup_steps,
            device=self.device,
            distributed=self.distributed,
        )

    def _check_warmup(self, kind: str) -> None:
        """Warn that ``warmup_steps`` and ``nuts_kwargs`` are ignored where the draws are
        exact (code written for ``MCMC`` passes them; they change nothing here)."""
        model = "a discrete" if kind == "discrete" else "this"
        if self._warmup_steps and self.correction != "imh":
            warnings.warn(
                f"warmup_steps={self._warmup_steps} is ignored: exact draws of {model} model "
                "need no warm-up, so no draw is discarded (warmup_steps applies to models with "
                "continuous latent sites, NUTS warm-up, and to correction='imh'). Pass 0 or "
                "leave it out to silence this.",
                UserWarning,
                stacklevel=user_stacklevel(),
            )
        if self.nuts_kwargs:
            warnings.warn(
                f"nuts_kwargs {sorted(self.nuts_kwargs)} are ignored: {model} model has no "
                "continuous latent sites, so no NUTS runs.",
                UserWarning,
                stacklevel=user_stacklevel(),
            )

    def _check_save_params(self, layout) -> None:
        if self.save_params is None:
            return
        known = set(layout.names) | set(layout.continuous_names) | set(layout.deterministic)
        unknown = sorted(set(self.save_params) - known)
        if unknown:
            raise ValueError(
                f"save_params names {unknown}, which are not latent or deterministic sites of "
                f"the model (discrete latent sites: {layout.names}; continuous: "
                f"{layout.continuous_names}; deterministic: {list(layout.deterministic)})"
            )

    # ---------------------------------------------------------------------------- reading
    @property
    def _args(self) -> tuple:
        """The positional data of the last run, where ``pyro.infer.MCMC`` keeps them (ArviZ's
        ``from_pyro`` reads them to trace the model); before a run, the error every reader
        gives."""
        self._check_run()
        return self._data[0]

    @property
    def _kwargs(self) -> dict:
        """The keyword data of the last run (see :attr:`_args`)."""
        self._check_run()
        return self._data[1]

    def _check_run(self):
        if self._run is None:
            if self._failure is not None:
                failure = self._failure
                if len(failure) > 300:
                    failure = failure[:300] + "..."
                raise RuntimeError(
                    f"the last AutoSpec.run() failed ({failure}), so there are no draws to "
                    f"read: the draws of earlier runs were discarded when it started. Fix the "
                    f"cause and call run(*args, **kwargs) again."
                )
            raise RuntimeError("call AutoSpec.run(*args, **kwargs) first")
        return self._run

    @property
    def kernel(self) -> ModelKernel:
        """The model where ``pyro.infer.MCMC`` keeps it (``mcmc.kernel.model``), so that
        ``arviz.from_pyro(autospec)`` converts a run as it converts an ``MCMC``.

        ``az.from_pyro`` stores the chains as run (one chain is not split, see
        :meth:`to_inference_data`) and the *conditional* log likelihood (given every latent
        site of each draw, from ``pyro.infer.Predictive``); :meth:`to_inference_data` stores
        the marginal form that ``az.loo`` needs where it exists.

        Examples
        --------
        >>> import arviz as az, pyro, pyro.distributions as dist
        >>> def model(y):
        ...     z = pyro.sample("z", dist.Bernoulli(0.3))
        ...     pyro.sample("y", dist.Normal(2.0 * z, 1.0), obs=y)
        >>> autospec = AutoSpec(model, 40, num_chains=2, seed=0, disable_progbar=True)
        >>> _ = autospec.run(torch.tensor(1.5))
        >>> idata = az.from_pyro(autospec)
        >>> idata.posterior["z"].shape, idata.log_likelihood["y"].shape
        ((2, 40), (2, 40))
        """
        return ModelKernel(self.model)

    @property
    def layout(self):
        """The coordinate mapping of the discrete sites (after :meth:`run`)."""
        return None if self._run is None else self._run.layout

    @property
    def timing(self) -> dict[str, float]:
        """Measured wall seconds of the last :meth:`run`, by stage, and ``"total"``.

        The stages, in run order (those that ran): ``"tracing"`` (finding the sites),
        ``"compiling"`` (the oracle), ``"nuts"`` (models with continuous sites), ``"oracle"``
        (inside the oracle's methods), ``"engine"`` (the engine's own work), ``"evaluation"``
        (the model's log joint, deterministic sites and log likelihood of every draw),
        ``"self-check"`` and ``"correction"`` (guides). ``"total"`` is the whole ``run``; the
        stages leave out only Python glue. ``summary()`` prints them.
        """
        run = self._check_run()
        out = dict(run.timing)
        out["total"] = run.wall_time
        return out

    @property
    def results(self) -> list:
        """The engine's results (after :meth:`run`)."""
        return [] if self._run is None else self._run.results

    def get_samples(
        self,
        num_samples: int | None = None,
        group_by_chain: bool = False,
        include_discrete: bool = True,
    ) -> dict[str, torch.Tensor]:
        """The draws, keyed by site name, in the model's shapes and dtypes.

        Parameters
        ----------
        num_samples : int, optional
            Resample this many draws with replacement (as ``MCMC.get_samples``).
        group_by_chain : bool
            Keep the chain dimension: ``Tensor[num_chains, num_samples, *shape]``; otherwise
            ``Tensor[num_chains * num_samples, *shape]``.
        include_discrete : bool
            ``False`` drops the discrete latent sites and the ``pyro.deterministic`` sites
            (which may read them), so that ``Predictive`` or ``infer_discrete`` fed with the
            continuous draws recomputes both consistently.

        Returns
        -------
        dict
            ``name -> Tensor`` for every latent site (continuous and discrete) and every
            ``pyro.deterministic`` site (as ``Predictive`` returns them); Categorical sites
            are long, Bernoulli sites float, as the model samples them.
        """
        return self._check_run().get_samples(num_samples, group_by_chain, include_discrete)

    def get_extra_fields(self, group_by_chain: bool = False) -> dict[str, torch.Tensor]:
        """Per-draw statistics of the run.

        Returns
        -------
        dict
            Each ``Tensor[num_chains, num_samples]`` (``group_by_chain``) or flattened:

            * ``sample_rounds`` (long): rounds in which the draw's discrete sites had an oracle
              query in flight (its latency; the sequential sampler takes ``n`` per draw);
              for forward filtering, backward sampling (``results[0].method == "ffbs"``),
              the backward pass's sequential steps, one per site;
            * ``oracle_rows_per_draw`` (float64): the engine's oracle rows divided by its
              draws, the same for every draw of an engine run (0 for ``"ffbs"``, which queries
              no oracle); the run's total is ``diagnostics()["oracle_rows"]`` and ArviZ's
              ``oracle_rows`` attribute;
            * ``lp`` (float64): ``log p(x, data)``, the model's log joint at the draw (every
              site's scaled, masked log density: the density the draws follow);
            * ``oracle_log_prob`` (float64): the draw's log probability under the oracle's
              chain rule (for an exact oracle ``log p(x | data)``; for a mixed model, of the
              discrete sites given the continuous ones);
            * with a ``guide`` or a ``correction``: ``log_weight`` (float64):
              ``lp - oracle_log_prob``, the draw's log importance weight;
            * with ``correction="imh"``: ``accepted`` (bool) and ``acceptance_rate``.

            The fields describe the returned draws (after any correction).
        """
        return self._check_run().get_extra_fields(group_by_chain)

    def diagnostics(self) -> dict[str, Any]:
        """ESS and split R-hat per site (on float copies), divergences and engine counts.

        Works for any number of draws: with fewer than 4 draws per chain ``n_eff`` and
        ``r_hat`` are NaN and ``"unavailable"`` says why. Both are computed per element: an
        element whose draws vary within no chain is NaN alone, the others keep their
        values (:func:`~pyro_autospec.diagnostics.ess.effective_sample_size`).

        Returns
        -------
        dict
            ``site -> {"n_eff": Tensor, "r_hat": Tensor}`` as ``MCMC.diagnostics``, plus
            ``"divergences"`` (``{"chain i": [...]}``: exact draws never diverge; for a mixed
            model NUTS's), ``"rounds"``, ``"oracle_rows"``, ``"mean rounds per draw"`` and
            ``"wall_time"`` per chain; ``"seconds"`` (measured, per stage and ``"total"``, as
            :attr:`timing`), ``"whole run"`` (``rounds``, ``oracle_rows``, ``draws`` and
            ``seconds`` of the whole run), ``"seed"`` (the int seed the run used: ``seed=``
            it repeats the run) and ``"sampler"``: what drew the discrete sites,
            ``"ffbs"`` or the engine's method (``results[0].method``; for a mixed model, the
            method that drew them given each continuous draw, while ``"continuous_sampler"``
            names NUTS; for a diffusion guide, the diffusion's method). With a guide or a
            correction also ``"khat"``, ``"weights_ess"`` and ``"weights_draws"`` (the guide
            draws weighed, IMH's warm-up included: the ESS's denominator; per chain and
            ``"all"``) and
            ``"imh_acceptance"`` (the IMH chains' mean acceptance probability, or its estimate
            from the weights), all from
            :func:`~pyro_autospec.diagnostics.weights.weight_diagnostics` (and for ``"imh"``
            the realised ``"acceptance rate"`` per chain); for a mixed model NUTS's
            ``"acceptance rate"``. Where a site has the name of one of these entries, the
            site keeps it and the entry moves to ``"run: <name>"`` (with a warning).
        """
        return self._check_run().diagnostics()

    def summary(
        self,
        prob: float = 0.9,
        var_names: str | Sequence[str] | None = None,
        group: bool | None = None,
    ) -> None:
        """Print a table like ``MCMC.summary``, then what the run cost and its checks.

        After the table: the measured wall time (per draw and per stage, see
        :attr:`timing`), rounds and oracle rows of the whole run beside the sequential
        sampler's, a line naming a likely faster exact method where the counts say so (see
        :meth:`~pyro_autospec.infer.run_base.RunBase.speed_summary`), and the self-check.

        Parameters
        ----------
        prob : float
            Mass of the credible interval.
        var_names : str or list of str, optional
            Sites to show, or per-step groups: ``"x"`` selects ``x_0, x_1, ...``.
        group : bool, optional
            ``True``: one row per variable, per-step sites ``x_0 .. x_299`` stacked into one
            (its elements' range of means, smallest ``n_eff``, largest ``r_hat``). ``False``:
            one row per element. ``None`` (default): grouped when the per-element table
            would exceed 40 rows.

        Examples
        --------
        >>> import torch, pyro, pyro.distributions as dist
        >>> def hmm(y):
        ...     x = 0
        ...     for t in pyro.markov(range(len(y))):
        ...         x = pyro.sample(f"x_{t}", dist.Bernoulli(0.2 + 0.6 * x))
        ...         pyro.sample(f"y_{t}", dist.Normal(x, 1.0), obs=y[t])
        >>> fit = AutoSpec(hmm, num_samples=100, seed=0, disable_progbar=True)
        >>> fit.run(torch.zeros(50))
        AutoSpec(method='autospec', num_samples=100, num_chains=1, sites=['x_0..x_49'])
        >>> fit.summary(group=True)  # doctest: +ELLIPSIS
        <BLANKLINE>
                    elements  min mean  max mean min n_eff max r_hat
         x_0..x_49        50 ...
        """
        self._check_run().summary(prob, var_names=var_names, group=group)

    def rounds_summary(self) -> str:
        """The lines ``summary()`` prints after the table: measured seconds, rounds and rows
        of the whole run, a likely faster exact method if any, and the self-check."""
        return self._check_run().rounds_summary()

    def weight_diagnostics(self) -> dict[str, Any]:
        """Pareto k-hat and ESS of the guide draws' importance weights (guide runs only).

        They come from :func:`~pyro_autospec.diagnostics.weights.weight_diagnostics`
        applied to the log weights of every guide draw (warm-up included, before the
        correction), which also gives the IMH acceptance, the verdict and the fix to apply;
        ``summary()`` prints them and ``to_inference_data()`` stores them as attributes.
        """
        run = self._check_run()
        if not isinstance(run, DiscreteRun):
            raise RuntimeError("weight diagnostics exist for guides on discrete models only")
        return run.weight_diagnostics()

    def weights_summary(self) -> str:
        """One paragraph: Pareto k-hat and ESS of the guide's importance weights."""
        run = self._check_run()
        return run.weights_summary() if isinstance(run, DiscreteRun) else ""

    def to_inference_data(
        self,
        coords: dict | None = None,
        dims: dict | None = None,
        log_likelihood: bool | str = "auto",
        split_chains: bool = True,
    ):
        """ArviZ data: posterior, sample_stats, observed_data and the pointwise log likelihood.

        The ``log_likelihood`` group (arrays ``[chain, draw, *batch_shape]``, masked, not
        scaled: a masked element is exactly 0, as in Pyro's ``Trace.compute_log_prob``) comes
        in two forms:

        * ``"marginal"``: every observed element's log likelihood given the draw's continuous
          sites, with the discrete sites it reads summed out (a mixture's
          ``log sum_k w_k N(y_i; mu_k, s_k)``). It is what ``az.loo`` and ``az.waic`` need to
          estimate predictive accuracy, and exists when each observed element reads discrete
          sites of its own (same plates, read by nothing else, depending on no other discrete
          site) and the model can be enumerated. In a model without continuous sites it is
          the same for every draw (no parameter is learned): ``az.loo`` then gives the exact
          ``elpd`` with ``p_loo = 0``, and its Pareto k values, computed from a constant, mean
          nothing.
        * ``"conditional"``: given every latent site of the draw, discrete ones included,
          computed from batched conditioned traces. LOO on it treats each draw's sampled
          assignment as a parameter, which is not usable for model comparison.

        Integer-valued discrete sites are stored as int64 so that ArviZ plots them as
        histograms; deterministic sites are in the posterior group. Every group's attribute
        ``log_likelihood_form`` says which form was stored.

        **One chain of independent draws** (the default ``num_chains=1`` with an exact oracle,
        or a diffusion guide) is exported as 2 chains of ``num_samples / 2`` draws in order
        (or the smallest number of equal parts of 4 draws or more), so that ``az.summary``
        computes ``r_hat`` instead of warning "Shape validation failed" (ArviZ needs 2 chains
        of 4 draws). The draws are independent, so the split changes no statistic's meaning;
        the groups' attribute ``chains_split_from = 1`` records it, and ``split_chains=False``
        keeps one chain. Fewer than 8 draws, or a number with no split into equal parts of 4 or
        more (a prime, or 9), stay one chain (ArviZ then warns and gives ``r_hat`` NaN): take
        ``num_samples`` with a divisor, 200 rather than 199. Dependent draws (NUTS for
        continuous sites, ``correction="imh"`` or ``"importance"``) keep their chains: for
        those, run ``num_chains=2`` or more, as with ``MCMC``.

        Parameters
        ----------
        coords, dims : dict, optional
            As in ``az.from_pyro``.
        log_likelihood : {"auto", "marginal", "conditional", False}
            ``"auto"`` (default, also ``True``): ``"marginal"`` where the model allows it,
            else ``"conditional"`` (most chain models, an HMM, have no per-observation
            marginal), without a warning: the attribute ``log_likelihood_form`` says which
            form was stored, ``log_likelihood_reason`` why it is not the marginal one (also
            logged by the ``pyro_autospec`` logger at level INFO). Check the form before
            comparing models with ``az.loo`` or ``az.waic``: they need the marginal one.
            ``"marginal"`` raises where it does not exist. ``False`` leaves the group out.
        split_chains : bool
            Split one chain of independent draws as above (default ``True``).

        Returns
        -------
        arviz.InferenceData (ArviZ 0.x) or xarray.DataTree (ArviZ 1.x)
        """
        return self._check_run().to_inference_data(
            coords, dims, log_likelihood, method=self.method, split_chains=split_chains
        )


def _warn_outer_handlers(method: str) -> None:
    """Warn that Pyro handlers around :meth:`AutoSpec.run` (or ``map``) do not reach the model.

    ``run`` and ``map`` block them, as ``pyro.infer.MCMC.run`` does (their own
    ``poutine.block`` is the top of the handler stack here), so a ``poutine.condition`` or
    ``poutine.scale`` written around the call would silently change nothing.
    """
    # an outer poutine.block changes nothing that run's own does not
    outer = [
        type(handler).__name__
        for handler in _PYRO_STACK[:-1]
        if not isinstance(handler, poutine.block_messenger.BlockMessenger)
    ]
    if outer:
        warnings.warn(
            f"AutoSpec.{method} was called inside Pyro handlers ({', '.join(outer)}); like "
            f"pyro.infer.MCMC.run it blocks them, so they do not reach the model. Apply them "
            f"to the model instead: AutoSpec(poutine.condition(model, data=...), ...).",
            UserWarning,
            stacklevel=user_stacklevel(),
        )
