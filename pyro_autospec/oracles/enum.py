"""An exact conditional-marginal oracle from a Pyro model, by Pyro's parallel enumeration.

Each query row ``b`` conditions the model's discrete latent sites on its own evidence
``X_S = values_S`` (``S = mask[b]``). All rows of a call go into ONE enumerated trace and ONE
tensor contraction: the model runs inside a query plate of size ``B`` at
``dim = -(max_plate_nesting + 1)``, and right after every discrete site a factor adds
``-inf`` where row ``b`` pins the site and the enumerated value differs from the pinned one.
Pyro's ``TraceEnum_ELBO`` machinery then contracts the factor graph once and reads off every
site's marginal (``pyro.infer.traceenum_elbo._compute_marginals``, reimplemented here to
return log-probability tables for every enumerable family, Binomial included).

This is the exact reference oracle for tractable models (cost exponential in treewidth), not
the scalable path: see ``PYRO_NOTES.md``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import pyro
import torch
from opt_einsum import shared_intermediates
from pyro import poutine
from pyro.infer import TraceEnum_ELBO
from pyro.infer.traceenum_elbo import _compute_model_factors, _find_ordinal
from pyro.ops import packed
from pyro.ops.contract import contract_to_tensor
from pyro.ops.rings import LogRing
from pyro.poutine.subsample_messenger import _Subsample

from pyro_autospec.infer.sites import (
    AutoSpecModelError,
    DynamicStructureError,
    SiteLayout,
    discover_sites,
)

__all__ = ["EnumOracle"]

_QUERY_PLATE = "_autospec_queries"


def _empty_guide(*args, **kwargs):
    pass


class _Evidence(poutine.messenger.Messenger):
    """After each discrete site, a factor that is ``-inf`` where a query pins another value."""

    def __init__(self, layout: SiteLayout, index: dict, mask: dict):
        super().__init__()
        self.layout = layout
        self.index = index  # name -> LongTensor[B, 1.., *batch]
        self.mask = mask  # name -> BoolTensor[B, 1.., *batch]
        self.seen: list[str] = []

    def _pyro_post_sample(self, msg):
        name = msg["name"]
        if name.startswith("_autospec") or msg["is_observed"] or isinstance(msg["fn"], _Subsample):
            return
        self.seen.append(name)
        if name not in self.index:
            raise DynamicStructureError(
                f"Site '{name}' is latent under enumeration but was not found when the model "
                f"was first traced; AutoSpec needs a fixed set of sites."
            )
        site = self.layout[name]
        value_index = site.value_to_index(msg["value"])  # enumerated: [K, 1, ..., 1]
        differs = value_index != self.index[name]
        dtype = msg["fn"].log_prob(msg["value"]).dtype
        log_factor = torch.zeros(differs.shape, dtype=dtype, device=differs.device)
        log_factor = log_factor.masked_fill(differs & self.mask[name], -math.inf)
        pyro.factor(f"_autospec_evidence_{name}", log_factor)


def _parallel_enumeration(msg: dict) -> dict:
    """``infer_config`` rule: enumerate every unobserved enumerable site in parallel."""
    fn = msg["fn"]
    if msg["is_observed"] or type(fn).__name__ == "_Subsample":
        return {}
    if getattr(fn, "has_enumerate_support", False):
        return {"enumerate": "parallel"}
    return {}


class EnumOracle:
    """Exact conditional marginals of a Pyro model's discrete latent sites, by enumeration.

    Implements :class:`~pyro_autospec.oracles.base.MarginalOracle` for the posterior
    ``p(x | data)`` of a model whose latent sites are all enumerable discrete sites
    (Bernoulli, Categorical, OneHotCategorical, Binomial, BetaBinomial), with the coordinate
    mapping of :mod:`pyro_autospec.infer.sites` (sites in trace order, C order within a site,
    values as support indices, ``num_values`` the largest support).

    Parameters
    ----------
    model : callable
        A Pyro model. Observed sites are conditioned on their ``obs`` values.
    args : tuple
        Positional arguments of ``model``.
    kwargs : dict, optional
        Keyword arguments of ``model``.
    max_plate_nesting : int, optional
        Found from the model when ``None``.
    batch_size : int
        Query rows per contraction. Larger batches amortise Pyro's ~100 ms of tracing per
        contraction; memory grows as ``batch_size * 2^treewidth``.
    layout : SiteLayout, optional
        A layout from :func:`~pyro_autospec.infer.sites.discover_sites` (found when ``None``).
    num_threads : int or None
        torch intra-op threads during a contraction (restored afterwards). Enumeration runs
        many tiny tensor ops, for which extra threads only add synchronisation: on a loaded
        2-core machine one thread was 10x faster than two. ``None`` leaves torch's setting.
        Any call of ``torch.set_num_threads``, this one included, switches MKL's dynamic
        threading off for the rest of the process; with more than one thread, PyTorch's batched
        LU on a CPU (``torch.linalg.solve`` or ``inv`` of stacks of matrices larger than about
        14 x 14) can then return wrong results silently (pytorch/pytorch#141358). This
        package's own solves are guarded; pass ``None`` to leave your process's threads alone.

    Attributes
    ----------
    num_coords : int
        ``n``, the number of discrete coordinates.
    num_values : int
        ``q``, the largest support size.
    layout : SiteLayout
        The coordinate mapping.
    num_calls : int
        Contractions made so far.

    Notes
    -----
    For query row ``b`` with pinned set ``S``, the enumerated joint is
    ``p(x, data) * prod_{i in S} 1[x_i = values_{b,i}]``; contracting every site but ``i``
    and normalising gives ``mu(X_i = v | X_S = values_S, data)``. A query plate of size 1 hits
    Pyro issue 3102, so batches of one row are padded with an unconditioned row.

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> def model(y):
    ...     a = pyro.sample("a", dist.Bernoulli(0.5))
    ...     b = pyro.sample("b", dist.Bernoulli(0.5))
    ...     pyro.sample("y", dist.Normal(a + b, 1.0), obs=y)
    >>> oracle = EnumOracle(model, (torch.tensor(2.0),))
    >>> values = torch.tensor([[0, 0], [0, 0]])
    >>> mask = torch.tensor([[False, False], [True, False]])
    >>> out = oracle.log_marginals(values, mask)  # [2, 2, 2]
    >>> out.shape, out.dtype
    (torch.Size([2, 2, 2]), torch.float64)
    >>> bool(out[1, 1, 1] > out[0, 1, 1])  # with a = 0 pinned, b alone explains y = 2
    True
    """

    def __init__(
        self,
        model: Callable,
        args: tuple = (),
        kwargs: dict | None = None,
        *,
        max_plate_nesting: int | None = None,
        batch_size: int = 4096,
        layout: SiteLayout | None = None,
        num_threads: int | None = 1,
    ):
        if batch_size < 2:
            raise ValueError(f"batch_size must be >= 2 (Pyro issue 3102), got {batch_size}")
        self.model = model
        self.args = tuple(args)
        self.kwargs = {} if kwargs is None else dict(kwargs)
        if layout is None:
            layout = discover_sites(
                model, self.args, self.kwargs, max_plate_nesting=max_plate_nesting
            )
        self.layout = layout
        self.batch_size = int(batch_size)
        self.num_coords = layout.num_coords
        self.num_values = layout.num_values
        self.num_calls = 0
        self.num_threads = num_threads
        self._elbo = TraceEnum_ELBO(max_plate_nesting=layout.max_plate_nesting + 1)
        # Parallel enumeration of every latent discrete site, overriding a user's
        # infer={"enumerate": "sequential"} (which the contraction cannot use).
        self._enumerated = poutine.infer_config(model, _parallel_enumeration)

    def __repr__(self) -> str:
        return (
            f"EnumOracle(num_coords={self.num_coords}, num_values={self.num_values}, "
            f"sites={self.layout.names})"
        )

    def log_marginals(self, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Conditional log marginals of every coordinate.

        Parameters
        ----------
        values : LongTensor[B, n]
            Support indices; read only where ``mask`` is True.
        mask : BoolTensor[B, n]
            True where the coordinate is pinned.

        Returns
        -------
        DoubleTensor[B, n, q]
            ``log mu(X_i = v | X_S = values_S, data)``; ``-inf`` outside each site's support.
        """
        values, mask = self._check(values, mask)
        if values.shape[0] == 0:
            return torch.empty(0, self.num_coords, self.num_values, dtype=torch.float64)
        # Identical conditionings (common: every draw starts unconditioned) are computed once.
        keys = torch.cat([torch.where(mask, values, -1), mask.long()], dim=1)
        unique, inverse = torch.unique(keys, dim=0, return_inverse=True)
        values_u, mask_u = (
            unique[:, : self.num_coords].clamp(min=0),
            unique[:, self.num_coords :].bool(),
        )
        chunks = [
            self._call(values_u[i : i + self.batch_size], mask_u[i : i + self.batch_size])
            for i in range(0, values_u.shape[0], self.batch_size)
        ]
        return torch.cat(chunks)[inverse.to(chunks[0].device)]

    def log_marginals_at(
        self, values: torch.Tensor, mask: torch.Tensor, targets: torch.Tensor
    ) -> torch.Tensor:
        """Conditional log marginals of the coordinates ``targets`` only.

        Parameters
        ----------
        values : LongTensor[B, n]
        mask : BoolTensor[B, n]
        targets : LongTensor[B, k]
            Coordinate indices (may repeat).

        Returns
        -------
        DoubleTensor[B, k, q]
        """
        targets = torch.as_tensor(targets, dtype=torch.long)
        full = self.log_marginals(values, mask)
        index = targets.to(full.device)[:, :, None].expand(-1, -1, self.num_values)
        return full.gather(1, index)

    def _check(self, values, mask):
        values = torch.as_tensor(values)
        mask = torch.as_tensor(mask, dtype=torch.bool)
        if values.dim() != 2 or values.shape[1] != self.num_coords or mask.shape != values.shape:
            raise ValueError(
                f"values and mask must have shape [B, {self.num_coords}]; got "
                f"{tuple(values.shape)} and {tuple(mask.shape)}"
            )
        return values.long(), mask

    def _call(self, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if self.num_threads is None:
            return self._contract(values, mask)
        previous = torch.get_num_threads()
        torch.set_num_threads(self.num_threads)
        try:
            return self._contract(values, mask)
        finally:
            torch.set_num_threads(previous)

    def _contract(self, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        num_rows = values.shape[0]
        if num_rows < 2:  # Pyro issue 3102: a query plate of size 1 fails
            pad = 2 - num_rows
            values = torch.cat([values, values.new_zeros(pad, self.num_coords)])
            mask = torch.cat([mask, mask.new_zeros(pad, self.num_coords)])
        batch = values.shape[0]
        mpn = self.layout.max_plate_nesting
        index, pinned = {}, {}
        for site in self.layout.sites:
            shape = (batch,) + (1,) * (mpn - len(site.batch_shape)) + tuple(site.batch_shape)
            index[site.name] = values[:, site.coords].reshape(shape)
            pinned[site.name] = mask[:, site.coords].reshape(shape)
        evidence = _Evidence(self.layout, index, pinned)

        def queried(*args, **kwargs):
            with pyro.plate(_QUERY_PLATE, batch, dim=-(mpn + 1)), evidence:
                return self._enumerated(*args, **kwargs)

        try:
            with poutine.block(), warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*not in guide.*")
                warnings.filterwarnings("ignore", message=".*plate.*guide.*")
                model_trace, guide_trace = next(
                    self._elbo._get_traces(queried, _empty_guide, self.args, self.kwargs)
                )
                logits = self._marginals(model_trace, guide_trace, batch)
        except AutoSpecModelError:
            raise
        except (RuntimeError, ValueError, TypeError, IndexError, KeyError) as e:
            last = f" (after site '{evidence.seen[-1]}')" if evidence.seen else ""
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise DynamicStructureError(
                f"Enumerating the model failed{last}: {reason}. EnumOracle runs the model on "
                f"enumerated, batched values of its discrete sites, so the model must not branch "
                f"on their values with Python control flow (if/int()/.item()); use tensor "
                f"operations (torch.where, Vindex, poutine.mask) so its structure is fixed."
            ) from e
        self.num_calls += 1
        return logits[:num_rows]

    def _marginals(self, model_trace, guide_trace, batch: int) -> torch.Tensor:
        mpn = self.layout.max_plate_nesting
        _, log_factors, _, sum_dims, _ = _compute_model_factors(model_trace, guide_trace)
        out = torch.full((batch, self.num_coords, self.num_values), -math.inf, dtype=torch.float64)
        # Sizes of every plate symbol: Pyro's ring forgets plates a marginal does not vary over
        # and then fails to broadcast to them (a KeyError, as in Pyro issue 3102).
        plate_to_symbol = model_trace.plate_to_symbol
        dim_to_size = {}
        for node in model_trace.nodes.values():
            for f in node.get("cond_indep_stack", ()):
                if f.vectorized and f.name in plate_to_symbol:
                    dim_to_size[plate_to_symbol[f.name]] = f.size
        with shared_intermediates() as cache:
            ring = LogRing(cache, dim_to_size=dim_to_size)
            for site in self.layout.sites:
                node = model_trace.nodes[site.name]
                enum_dim = node["infer"].get("_enumerate_dim")
                if enum_dim is None:
                    raise AutoSpecModelError(f"Site '{site.name}' was not enumerated by Pyro.")
                logits = contract_to_tensor(
                    log_factors,
                    sum_dims,
                    target_ordinal=_find_ordinal(model_trace, node),
                    target_dims={node["infer"]["_enumerate_symbol"]},
                    ring=ring,
                )
                logits = packed.unpack(logits, model_trace.symbol_to_dim)
                # move the enumeration dim to the end, keep the query + plate dims
                logits = logits.unsqueeze(-1).transpose(-1, enum_dim - 1).squeeze(enum_dim - 1)
                k = site.support_size
                lead = logits.dim() - 1 - (mpn + 1)
                if lead > 0:
                    logits = logits.reshape(logits.shape[lead:])
                shape = (batch,) + (1,) * (mpn - len(site.batch_shape)) + tuple(site.batch_shape)
                logits = logits.expand(shape + (k,)).reshape(batch, site.num_coords, k)
                logits = logits.to(torch.float64)
                out[:, site.coords, :k] = logits - logits.logsumexp(-1, keepdim=True)
        return out
