"""Exact draws of a tractable model by forward filtering, backward sampling, all draws at once.

The chain rule of the posterior in one fixed elimination order, with the conditionals read off
incremental messages: variable elimination over the factor graph that
:class:`~pyro_autospec.model.enum.EnumOracle` compiled (the model's scaled, masked
log-density factors, plates included) computes one message per site (*forward filtering*),
then every draw samples the sites in the reverse order, each from its bucket's factor given
the sites already drawn (*backward sampling*). On a hidden Markov chain this is the
forward-filtering backward-sampling algorithm; on several chains coupled per step (a dynamic
Bayesian network, a factorial HMM) it is the same over the steps' joint states. The order is
greedy: the site whose bucket is smallest, ties in trace order, sites inside a plate before the
sites outside it that they share a factor with. The forward pass is done once per run; the
backward pass is one sequence of batched gathers for all draws of a chain (``num_sites``
sequential steps, vectorised over draws and plates).

Every draw also gets ``log q(x)``: the sum of the log conditionals it was drawn from. With
``log Z`` from the forward pass, the run's self-check
(:func:`~pyro_autospec.infer.self_check.check_exact_draws`) tests ``log p(x, data) - log q(x) =
log Z`` for every draw, where ``log p(x, data)`` comes from running the model on the draw.

:func:`plan_ffbs` returns ``None`` when the elimination does not fit: plates that do not nest
along the order (a site outside a plate whose factor couples sites inside it, with those
sites eliminated after it), a bucket larger than :data:`MAX_BUCKET_ENTRIES` or all buckets
together larger than :data:`MAX_TOTAL_ENTRIES`, or a model with no possible assignment. The
run then uses the any-order engine, which refuses or samples such models as before.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import torch

from pyro_autospec.engine import keys
from pyro_autospec.engine.protocols import oracle_num_draws
from pyro_autospec.engine.result import SampleResult

__all__ = [
    "ELIMINATION_DOES_NOT_FIT",
    "FFBSPlan",
    "MAX_BUCKET_ENTRIES",
    "MAX_TOTAL_ENTRIES",
    "plan_ffbs",
    "sample_exact",
]

#: Largest bucket (a product of factors over one site and its neighbours) in entries.
MAX_BUCKET_ENTRIES = 2**22
#: Largest sum of the stored buckets' entries (float64: 8 bytes each).
MAX_TOTAL_ENTRIES = 2**25
#: The error of ``sampler="ffbs"`` where :func:`plan_ffbs` finds no elimination that fits.
ELIMINATION_DOES_NOT_FIT = (
    "sampler='ffbs' needs an elimination of the model's discrete sites that fits: plates "
    "that nest along the sites' order, and buckets of at most 2^22 entries (see "
    "pyro_autospec.model.ffbs); use sampler='auto', which falls back to the any-order engine"
)
#: Coordinates (draws times ``n``) of one chunk of the backward pass (:meth:`FFBSPlan.sample`).
MAX_CHUNK_ENTRIES = 2**20


@dataclass
class _Bucket:
    site: int  # index into the oracle's evidence specs (sites in trace order)
    later: tuple  # sites eliminated after this one that its factor depends on
    # [*K_later, *plates, K_site]: the site's conditional given the later sites, normalised
    # over its values once here rather than once per draw in the backward pass (a row of
    # -inf, later values no value of the site completes, is NaN)
    log_probs: torch.Tensor
    finite: bool  # no -inf (or NaN) entry: a drawn value never lands on an impossible one


def _bucket(site: int, later: tuple, table: torch.Tensor, num_plates: int) -> _Bucket:
    """The bucket of ``table`` (``[*plates, K_site, *K_later]``, log space): its rows moved
    to the last dim and normalised, as the backward pass reads them."""
    order = list(range(num_plates + 1, table.dim())) + list(range(num_plates + 1))
    log_probs = torch.log_softmax(table.permute(order).contiguous(), dim=-1)
    return _Bucket(site, later, log_probs, bool(torch.isfinite(log_probs).all()))


@dataclass
class FFBSPlan:
    """A compiled elimination: the buckets in elimination order, ``log Z`` and the layout.

    Attributes
    ----------
    buckets : list
        One per site, in elimination order.
    log_normalizer : float or DoubleTensor[M]
        ``log sum_x p(x, data)`` (the oracle's constant included); one per target of a
        family.
    num_coords : int
    plate_sizes : tuple of int
        Sizes of the plates in the canonical order of the plan.
    forward_seconds : float
        Time of the forward pass.
    family : bool
        The plan of a family of ``M`` targets (an oracle with ``num_draws``, the discrete sites
        given each of ``M`` continuous draws): its first plate holds the targets, every site
        lies in it, and :meth:`sample` draws one assignment per target.
    """

    buckets: list
    log_normalizer: float | torch.Tensor
    num_coords: int
    plate_sizes: tuple
    site_plates: list  # per site: its plate symbols' positions, in the site's batch order
    site_coords: list  # per site: its coordinate slice
    forward_seconds: float
    device: torch.device
    family: bool = False  # a family of targets: plate 0 holds one target per draw

    @property
    def num_steps(self) -> int:
        """Sequential steps of the backward pass (one per site)."""
        return len(self.buckets)

    def sample(self, num_draws: int, seed: int, chunk_size: int | None = None) -> SampleResult:
        """``num_draws`` exact draws, vectorised, from keyed uniforms of ``seed``
        (:mod:`~pyro_autospec.engine.keys`).

        The backward pass runs over ``chunk_size`` draws at a time (by default
        :data:`MAX_CHUNK_ENTRIES` coordinates), so that beyond the ``[N, n]`` draws it holds
        one chunk's tables; draw ``i`` reads the uniforms of its own index, so the draws do
        not depend on the chunks.

        Returns
        -------
        SampleResult
            ``method="ffbs"``; ``rounds`` and ``sample_rounds`` count the sequential steps of
            the backward pass (one per site), ``oracle_rows`` is 0 (no oracle query).
        """
        start = time.perf_counter()
        device = self.device
        # keyed uniforms (the engine's generator): site bucket b reads child(root, NOISE, b)
        root = torch.tensor(keys.seed_key(int(seed)), dtype=torch.long, device=device)
        if self.family and num_draws != self.plate_sizes[0]:
            raise ValueError(
                f"this plan is a family of {self.plate_sizes[0]} targets, one per draw; "
                f"num_draws must equal it, got {num_draws}"
            )
        if self.family:  # one pass: the targets are the first plate's entries
            chunk_size = num_draws
        if chunk_size is None:
            chunk_size = MAX_CHUNK_ENTRIES // max(1, self.num_coords)
        chunk_size = max(1, int(chunk_size))
        first = 0

        def draw(number: int, shape: tuple, log_probs: torch.Tensor, finite: bool):
            k = log_probs.shape[-1]
            # contiguous: the layout whose exp the draws have always read, bit for bit
            cdf = log_probs.contiguous().exp().cumsum(-1)
            per_draw = math.prod(shape[1:])  # the draws lead: draw i reads its own counters
            counter = torch.arange(
                first * per_draw, (first + shape[0]) * per_draw, device=device
            ).reshape(shape)
            u = keys.uniform(keys.child(root, keys.Tag.NOISE, number), keys.Tag.DRAFT, counter)
            u = u * cdf[..., -1]
            x = torch.searchsorted(cdf, u.unsqueeze(-1), right=True).clamp_(max=k - 1)
            if finite:  # every value of every row is possible
                return x
            # a rounding edge may land on an impossible value: take the most likely one there
            bad = ~torch.isfinite(log_probs.gather(-1, x))
            if bool(bad.any()):
                x = torch.where(bad, log_probs.argmax(-1, keepdim=True), x)
            return x

        samples = torch.empty(num_draws, self.num_coords, dtype=torch.long, device=device)
        log_q = torch.empty(num_draws, dtype=torch.float64, device=device)
        for first in range(0, num_draws, chunk_size):
            size = min(chunk_size, num_draws - first)
            # a family's pass is one assignment of every target at once ([1, M, ...])
            values, log_q[first : first + size] = self._backward(1 if self.family else size, draw)
            for site, coords in enumerate(self.site_coords):
                x = values[site].permute(self._batch_order(site))
                samples[first : first + size, coords] = x.reshape(size, -1)
            del values
        steps = self.num_steps
        return SampleResult(
            samples=samples,
            log_prob=log_q,
            rounds=steps,
            sample_rounds=torch.full((num_draws,), steps, dtype=torch.long, device=device),
            oracle_rows=0,
            method="ffbs",
            wall_time=time.perf_counter() - start,
            timing={"forward": self.forward_seconds},
            seed=int(seed),
        )

    def log_prob(self, samples: torch.Tensor) -> torch.Tensor:
        """``log q(x)`` of any assignments ``x`` under the law :meth:`sample` draws from: the
        backward pass's conditionals read at ``x`` instead of drawn (``-inf`` where ``q`` has
        no mass).

        Parameters
        ----------
        samples : LongTensor[N, n]
            Assignments as coordinates, in the layout of :meth:`sample`'s output.

        Returns
        -------
        DoubleTensor[N]
        """
        num_draws = 1 if self.family else samples.shape[0]  # a family: [M, n] is one pass
        samples = samples.to(self.device)
        given = {}
        for site, coords in enumerate(self.site_coords):
            order = self._batch_order(site)
            shape = self._site_shape(site, num_draws)
            x = samples[:, coords].reshape([shape[d] for d in order])
            given[site] = x.permute(sorted(range(len(order)), key=order.__getitem__))
        return self._backward(num_draws, None, given)[1]

    def _backward(self, num_draws: int, draw, given: dict | None = None) -> tuple[dict, Any]:
        """The backward pass: each site's conditional given the later sites' values, from
        which ``draw(number, shape, log_probs, finite)`` picks the site's values
        (``[*shape, 1]``),
        or which reads the ``given`` values. Returns every site's values (site -> ``shape``)
        and ``log q`` of each draw."""
        device = self.device
        num_plates = len(self.plate_sizes)
        values: dict[int, torch.Tensor] = {}
        rows = self.plate_sizes[0] if self.family else num_draws  # a family: one per target
        log_q = torch.zeros(rows, dtype=torch.float64, device=device)
        aranges = []
        zero = torch.zeros([1] * (num_plates + 1), dtype=torch.long, device=device)
        for i, size in enumerate(self.plate_sizes):
            shape = [1] * (num_plates + 1)
            shape[i + 1] = size
            aranges.append(torch.arange(size, device=device).reshape(shape))
        for number, bucket in enumerate(reversed(self.buckets)):
            table = bucket.log_probs
            k = table.shape[-1]
            if bucket.later:
                # [*K_later, *plates, K]: index the later sites' draws and the plates
                index = tuple(values[s] for s in bucket.later) + tuple(
                    a if table.shape[len(bucket.later) + i] > 1 else zero
                    for i, a in enumerate(aranges)
                )
                log_probs = table[index]
            else:
                log_probs = table.unsqueeze(0)
            shape = self._site_shape(bucket.site, num_draws)
            log_probs = log_probs.expand(shape + (k,))
            if given is None:
                x = draw(number, shape, log_probs, bucket.finite)
                picked = log_probs.gather(-1, x)
            else:
                x = given[bucket.site].unsqueeze(-1)
                # given later values that no value of this site completes (every logit -inf),
                # log_softmax is NaN: the assignment has no mass
                picked = log_probs.gather(-1, x).nan_to_num(nan=-math.inf, neginf=-math.inf)
            log_q += picked.squeeze(-1).expand(shape).reshape(rows, -1).sum(1)
            values[bucket.site] = x.squeeze(-1)
        return values, log_q

    def _batch_order(self, site: int) -> list:
        """The dims of a site's values (``[N, *plates]``, :meth:`_site_shape`) in the order of
        its coordinates: the draws, the site's plates in its own batch order, then the unit
        dims (C order)."""
        plates = self.site_plates[site]
        rest = [d for d in range(1, len(self.plate_sizes) + 1) if d - 1 not in plates]
        return [0] + [p + 1 for p in plates] + rest

    def _site_shape(self, site: int, num_draws: int) -> tuple:
        shape = [num_draws] + [1] * len(self.plate_sizes)
        for p in self.site_plates[site]:
            shape[p + 1] = self.plate_sizes[p]
        return tuple(shape)


def _elimination_order(scopes: list, has: list, support: list) -> list:
    """A greedy elimination order: the site whose bucket is smallest, ties in trace order.

    A site may go only when every neighbour's plates are among its own (sites inside a plate
    before the sites outside it that they share a factor with). On a chain this is the
    forward order; a site shared by many (a global site sampled first) goes last.
    """
    num = len(has)
    neighbours = [set() for _ in range(num)]
    for scope in scopes:
        for v in scope:
            neighbours[v] |= scope
    for v in range(num):
        neighbours[v].discard(v)
    remaining = set(range(num))

    def key(v):
        eligible = all(has[u] <= has[v] for u in neighbours[v])
        size = support[v] * math.prod(support[u] for u in neighbours[v])
        return (not eligible, size, v)

    keys = {v: key(v) for v in remaining}
    order = []
    while remaining:
        v = min(remaining, key=keys.__getitem__)
        order.append(v)
        remaining.discard(v)
        for u in neighbours[v]:
            neighbours[u] |= neighbours[v]
            neighbours[u].discard(u)
            neighbours[u].discard(v)
        for u in neighbours[v]:
            keys[u] = key(u)
    return order


def plan_ffbs(oracle, too_large: list | None = None) -> FFBSPlan | None:
    """Variable elimination over a compiled :class:`~pyro_autospec.model.enum.EnumOracle`.

    Parameters
    ----------
    oracle : EnumOracle
        Compiled for one target, or for a family of ``M`` targets (``continuous_values``: the
        discrete sites given each continuous draw), whose plan draws one assignment per
        target in one pass.
    too_large : list, optional
        Where the elimination is refused for its size, a sentence saying so is appended
        (the other refusals add nothing: they are structural, not costly).

    Returns
    -------
    FFBSPlan or None
        ``None`` when the elimination does not fit (see the module's notes).

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> from pyro_autospec.model.enum import EnumOracle
    >>> def model(y):
    ...     z = 0
    ...     for t in pyro.markov(range(len(y))):
    ...         z = pyro.sample(f"z_{t}", dist.Bernoulli(0.2 + 0.6 * z))
    ...         pyro.sample(f"y_{t}", dist.Normal(z, 1.0), obs=y[t])
    >>> plan = plan_ffbs(EnumOracle(model, (torch.tensor([0.1, 0.9, 1.2]),)))
    >>> result = plan.sample(4, seed=0)
    >>> result.samples.shape, result.method, plan.num_steps
    (torch.Size([4, 3]), 'ffbs', 3)
    """
    num_targets = oracle_num_draws(oracle)
    family = num_targets is not None
    start = time.perf_counter()
    specs = oracle._evidence
    draws = oracle._draws_symbol
    sizes = oracle._dim_to_size
    var_of = {}
    for index, spec in enumerate(specs):
        var_of[spec.dims[-2]] = index
    plates = sorted(
        {d for spec in specs for d in spec.dims[:-2]}
        | {d for _, dims, _ in oracle._terms for d in dims if d not in var_of and d != draws}
    )
    if family:  # the targets: a first plate that every site lies in, never summed over
        plates = [draws] + plates
    plate_pos = {p: i for i, p in enumerate(plates)}
    plate_sizes = tuple(num_targets if p == draws else int(sizes[p]) for p in plates)
    num_plates = len(plates)
    site_plates = [
        ([0] if family else []) + [plate_pos[d] for d in spec.dims[:-2]] for spec in specs
    ]
    has = [frozenset(ps) for ps in site_plates]
    support = [spec.support_size for spec in specs]
    device = oracle.device

    scopes = [{var_of[d] for d in dims if d in var_of} for _, dims, _ in oracle._terms]
    order = _elimination_order(scopes, has, support)
    position = {site: k for k, site in enumerate(order)}
    pending: list[list] = [[] for _ in order]  # per position: factors (tensor, sites)

    def summed(t: torch.Tensor) -> float | torch.Tensor:
        """The sum of a table ``[*plates]``: per target for a family (DoubleTensor[M])."""
        if not family:
            return float(t.sum())
        return t.double().reshape(t.shape[0], -1).sum(1).expand(num_targets)

    def add(tensor: torch.Tensor, sites: tuple) -> float | torch.Tensor | None:
        if not sites:
            return summed(tensor)
        pending[min(position[s] for s in sites)].append((tensor, sites))
        return None

    constant = oracle._constant.detach().double()
    log_z = constant.reshape(-1).expand(num_targets).clone() if family else float(constant.sum())
    for tensor, dims, _ in oracle._terms:
        tensor = torch.as_tensor(tensor).detach()
        t = tensor.view(tensor.shape)
        if draws in dims and not family:
            axis = dims.index(draws)
            if t.shape[axis] != 1:
                return None
            t = t.squeeze(axis)
            dims = dims.replace(draws, "")
        sites = tuple(sorted((var_of[d] for d in dims if d in var_of), key=position.get))
        perm = [dims.index(p) for p in plates if p in dims] + [
            dims.index(specs[s].dims[-2]) for s in sites
        ]
        if len(perm) != len(dims):
            return None
        t = t.permute(perm)
        sized = iter(t.shape)  # a plate's dim as the factor holds it (1 where it broadcasts)
        shape = [next(sized) if p in dims else 1 for p in plates]
        shape += [support[s] for s in sites]
        t = t.reshape(shape)
        extra = add(t, sites)
        if extra is not None:
            log_z = log_z + extra
    total = 0
    buckets = []
    for k, site in enumerate(order):
        factors = pending[k]
        later = sorted({s for _, ss in factors for s in ss if s != site}, key=position.get)
        names = [site] + later
        shape = [1] * num_plates + [support[s] for s in names]
        for t, _ in factors:
            for i in range(num_plates):
                shape[i] = max(shape[i], t.shape[i])
        entries = math.prod(shape)
        total += entries
        if entries > MAX_BUCKET_ENTRIES or total > MAX_TOTAL_ENTRIES:
            if too_large is not None:
                too_large.append(
                    f"eliminating site '{specs[site].name}' needs a table of {entries:,} "
                    f"entries (at most {MAX_BUCKET_ENTRIES:,}; {total:,} in all, at most "
                    f"{MAX_TOTAL_ENTRIES:,})"
                )
            return None
        table = torch.zeros(shape, dtype=torch.float64, device=device)
        for t, ss in factors:
            view = list(t.shape[:num_plates]) + [1] * len(names)
            for s in ss:
                view[num_plates + names.index(s)] = support[s]
            aligned = t.permute(
                list(range(num_plates)) + [num_plates + ss.index(s) for s in names if s in ss]
            ).reshape(view)
            table = table + aligned
        # plates the site is outside of: product over them (a sum of logs), unless a later
        # site lives in them (then they do not nest along this order)
        for i in range(num_plates):
            if table.shape[i] > 1 and i not in has[site]:
                if any(i in has[s] for s in later):
                    return None
                table = table.sum(i, keepdim=True)
        buckets.append(_bucket(site, tuple(later), table, num_plates))
        message = torch.logsumexp(table, dim=num_plates)
        for i in range(num_plates):
            if family and i == 0:  # one message per target
                continue
            if message.shape[i] > 1 and not any(i in has[s] for s in later):
                message = message.sum(i, keepdim=True)
        if later:
            pending[position[later[0]]].append((message, tuple(later)))
        else:
            log_z = log_z + summed(message)
    if not bool(torch.isfinite(torch.as_tensor(log_z)).all()):
        return None
    return FFBSPlan(
        buckets=buckets,
        log_normalizer=log_z,
        num_coords=oracle.num_coords,
        plate_sizes=plate_sizes,
        site_plates=site_plates,
        site_coords=[spec.coords for spec in specs],
        forward_seconds=time.perf_counter() - start,
        device=torch.device(device),
        family=family,
    )


def sample_exact(
    plan: FFBSPlan, num_draws: int, seed: int, chunk_size: int | None = None
) -> SampleResult:
    """``num_draws`` exact draws of a plan (:meth:`FFBSPlan.sample`), seeded by ``seed``."""
    return plan.sample(num_draws, seed, chunk_size)
