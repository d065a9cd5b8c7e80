"""Log-space sum-product contractions with cached elimination plans, safe to differentiate.

:class:`PlannedLogRing` is a drop-in :class:`pyro.ops.rings.LogRing` for
:func:`pyro.ops.contract.contract_to_tensor` (which handles plates). Its ``sumproduct`` differs
from Pyro's in three ways that the compiled enumeration oracle needs:

* **A plan per shape, cached.** The order of pairwise contractions is chosen once per
  ``(dims, shapes)`` by a greedy variable elimination that folds a term into any term whose
  dims contain its own (evidence into messages) and then eliminates the variable whose
  neighbourhood is smallest. On a hidden Markov chain of length ``T`` this is the forward
  algorithm: ``T`` steps of ``[B, K] x [K, K]``, linear in ``T`` (opt_einsum's greedy path,
  which Pyro uses, builds ``[K, B, K]`` outer products on the same chain).
* **Exact in log space.** Each pairwise step shifts both operands by their maxima, multiplies
  in linear space (a batched matrix product) and takes the log. When the product underflows
  (operands whose mass sits at different values, log ratios beyond about 700), the step is
  recomputed exactly as a broadcast sum followed by ``logsumexp``.
* **Differentiable without NaN.** The marginals of every coordinate are read as the gradient
  of ``log Z`` with respect to the evidence (``d log Z / d log e_i(v) = P(x_i = v | e)``).
  ``log`` and ``logsumexp`` here have backward passes that give 0, not NaN, where a value is
  impossible (``-inf``), so impossible branches never poison possible rows.
"""

from __future__ import annotations

import math

import torch
from pyro.ops.rings import LogRing

__all__ = [
    "PlannedLogRing",
    "constant_factor",
    "linear_factor",
    "plan_contraction",
]

# Underflow threshold of a linear-space product (float64 normal range ends near 2.2e-308).
_TINY = 1e-250
_PLANS: dict = {}
_MAX_PLANS = 4096


class _SafeLog(torch.autograd.Function):
    """``log(x)`` whose gradient is ``1 / x`` where ``x > 0`` and 0 where ``x = 0``."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.log()

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return torch.nan_to_num(grad / x, nan=0.0, posinf=0.0, neginf=0.0)


class _SafeLogSumExp(torch.autograd.Function):
    """``logsumexp`` over ``dims`` whose gradient is 0 (not NaN) on all-``-inf`` slices."""

    @staticmethod
    def forward(ctx, x, dims):
        shift = x.amax(dim=dims, keepdim=True)
        shift = torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift))
        out = (x - shift).exp().sum(dim=dims, keepdim=True).log() + shift
        ctx.save_for_backward(x, out)
        ctx.dims = dims
        return out.squeeze(dims)

    @staticmethod
    def backward(ctx, grad):
        x, out = ctx.saved_tensors
        for d in sorted(ctx.dims):
            grad = grad.unsqueeze(d)
        weight = (x - out).exp()
        weight = torch.where(torch.isnan(weight), torch.zeros_like(weight), weight)
        return grad * weight, None


def _align(tensor: torch.Tensor, dims: str, order: str) -> torch.Tensor:
    """View ``tensor`` (dims named by ``dims``) with the dims of ``order``, size 1 if absent."""
    present = [d for d in order if d in dims]
    if [d for d in dims] != present:
        tensor = tensor.permute([dims.index(d) for d in present])
    shape = []
    sizes = iter(tensor.shape)
    for d in order:
        shape.append(next(sizes) if d in dims else 1)
    return tensor.reshape(shape)


def _broadcast_contract(x, xd, y, yd, elim, out):
    order = out + elim
    total = _align(x, xd, order)
    if y is not None:
        total = total + _align(y, yd, order)
    if elim:
        total = _SafeLogSumExp.apply(total, tuple(range(len(out), len(order))))
    return total


class _StepPlan:
    """Equations (and, for plain matrix products, permutations) of one pairwise step."""

    def __init__(self, xd: str, yd: str, elim: str, out: str):
        letters = {d: chr(97 + i) for i, d in enumerate(sorted(set(xd) | set(yd)))}

        def word(dims):
            return "".join(letters[d] for d in dims)

        self.forward = word(xd) + "," + word(yd) + "->" + word(out)
        backward = []
        for mine, other in ((xd, yd), (yd, xd)):
            reach = "".join(d for d in mine if d in out or d in other)
            backward.append((word(out) + "," + word(other) + "->" + word(reach), reach, mine))
        self.backward_x, self.backward_y = backward
        self.matrix = None
        self.inner = elim
        keep_x = [d for d in xd if d != elim]
        keep_y = [d for d in yd if d != elim]
        if len(elim) == 1 and elim in xd and elim in yd and not set(keep_x) & set(keep_y):
            if "".join(keep_x + keep_y) == out:
                px = [xd.index(d) for d in keep_x] + [xd.index(elim)]
                py = [yd.index(elim)] + [yd.index(d) for d in keep_y]
                inv_x = [px.index(i) for i in range(len(px))]
                inv_y = [py.index(i) for i in range(len(py))]
                self.matrix = (px, py, inv_x, inv_y)
        self.xd, self.yd = xd, yd


def _to_matrix(t: torch.Tensor, perm: list, inner: str, first: bool = False) -> torch.Tensor:
    """``t`` permuted by ``perm`` and flattened to a matrix with the summed dim inner."""
    t = t.permute(perm)
    size = t.shape[0] if first else t.shape[-1]
    return t.reshape(size, -1) if first else t.reshape(-1, size)


_STEP_PLANS: dict = {}


def _step_plan(xd: str, yd: str, elim: str, out: str) -> _StepPlan:
    key = (xd, yd, elim, out)
    plan = _STEP_PLANS.get(key)
    if plan is None:
        plan = _STEP_PLANS[key] = _StepPlan(xd, yd, elim, out)
    return plan


def linear_factor(tensor: torch.Tensor, dims: str) -> torch.Tensor:
    """Mark a factor given in LINEAR space (``exp`` of the log factor, e.g. 0/1 evidence).

    Only :class:`PlannedLogRing`'s ``sumproduct`` reads it; it must enter a contraction
    through ``sumproduct`` (every factor with a summed dim does).

    Examples
    --------
    >>> import torch
    >>> evidence = linear_factor(torch.tensor([0.0, 1.0]), "a")  # pins a to 1
    >>> evidence._pyro_dims, evidence._autospec_linear
    ('a', True)
    """
    tensor._pyro_dims = dims
    tensor._autospec_linear = True
    return tensor


def constant_factor(tensor: torch.Tensor, dims: str) -> torch.Tensor:
    """Mark a factor that never changes (a model factor) so its exponentials are cached.

    Examples
    --------
    >>> import torch
    >>> factor = constant_factor(torch.zeros(2, 2), "ab")
    >>> factor._pyro_dims, factor._autospec_exp
    ('ab', {})
    """
    tensor._pyro_dims = dims
    tensor._autospec_exp = {}
    return tensor


def plan_contraction(inputs: list[str], output: str, sizes: dict[str, int]) -> list[tuple]:
    """A greedy elimination plan for ``sum_{dims not in output} prod inputs``.

    Parameters
    ----------
    inputs : list of str
        The dims of every term (one character per dim, as Pyro packs them).
    output : str
        The dims to keep.
    sizes : dict
        The size of every dim.

    Returns
    -------
    list of (i, j, elim, out)
        Steps on a growing list of terms (inputs first, then each step's result): combine term
        ``i`` with term ``j`` (``None``: ``i`` alone), sum out the dims ``elim``, and keep the
        dims ``out`` in that order. The last step's result is the answer, with dims a
        permutation of ``output`` (or the single input, when no step is needed).

    Examples
    --------
    >>> plan = plan_contraction(["ab", "bc", "c"], "a", {"a": 2, "b": 3, "c": 4})
    >>> [(i, j, elim) for i, j, elim, _ in plan]
    [(1, 2, 'c'), (0, 3, 'b')]
    """
    terms: list[frozenset] = [frozenset(d) for d in inputs]
    names: list[str] = list(inputs)
    alive: set[int] = set(range(len(terms)))
    by_dim: dict[str, set[int]] = {}
    for i, dims in enumerate(terms):
        for d in dims:
            by_dim.setdefault(d, set()).add(i)
    remaining = set().union(*terms) - set(output) if terms else set()
    steps: list[tuple] = []

    def size(dims) -> int:
        return math.prod(sizes[d] for d in dims)

    def others_have(d: str, exclude: tuple) -> bool:
        return any(t not in exclude for t in by_dim.get(d, ()))

    def combine(i: int, j: int | None) -> None:
        pair = (i,) if j is None else (i, j)
        union = terms[i] | (terms[j] if j is not None else frozenset())
        elim = sorted(d for d in union if d in remaining and not others_have(d, pair))
        remaining.difference_update(elim)
        # the variables still to sum first, then the kept dims (plates, rows) in output order:
        # a chain step is then [K, K] @ [K, rows], torch's fastest layout for small K
        kept = names[i] + (names[j] if j is not None else "")
        order = [d for d in dict.fromkeys(kept) if d not in elim and d not in output]
        order += [d for d in output if d in union]
        new = len(terms)
        terms.append(frozenset(order))
        names.append("".join(order))
        for t in pair:
            alive.discard(t)
            for d in terms[t]:
                by_dim[d].discard(t)
        alive.add(new)
        for d in order:
            by_dim.setdefault(d, set()).add(new)
        steps.append((i, j, "".join(elim), names[new]))

    def fold_subsets() -> bool:
        for a in sorted(alive):
            dims = terms[a]
            if dims:
                candidates = set.intersection(*(by_dim[d] for d in dims)) - {a}
            else:
                candidates = alive - {a}
            if candidates:
                b = min(candidates, key=lambda t: (len(terms[t]), t))
                combine(b, a)
                return True
        return False

    while True:
        while fold_subsets():
            pass
        if not remaining:
            break
        best = None
        for v in sorted(remaining):
            group = sorted(by_dim.get(v, ()))
            cost = size(frozenset().union(*(terms[t] for t in group)))
            if best is None or cost < best[0]:
                best = (cost, v, group)
        _, v, group = best
        if len(group) == 1:
            combine(group[0], None)
            continue
        pairs = [
            (size(terms[a] | terms[b]), a, b) for k, a in enumerate(group) for b in group[k + 1 :]
        ]
        _, a, b = min(pairs)
        combine(a, b)
    while len(alive) > 1:
        a, b = sorted(alive)[:2]
        combine(a, b)
    return steps


class _Scaled:
    """A log-space factor kept as ``log(lin) + shift``: ``lin`` linear (at most 1 per slice)
    with dims ``dims``, ``shift`` a log scale over the kept dims ``shift_dims`` only."""

    __slots__ = ("lin", "dims", "shift", "shift_dims")

    def __init__(self, lin, dims, shift, shift_dims):
        self.lin, self.dims, self.shift, self.shift_dims = lin, dims, shift, shift_dims

    def to_log(self) -> torch.Tensor:
        return _SafeLog.apply(self.lin) + _align(self.shift, self.shift_dims, self.dims)


def _scale(t: torch.Tensor, dims: str, kept: str) -> _Scaled:
    """``t`` (log space) as ``exp(t - shift)`` with the shift over ``kept`` dims only; cached
    on constant factors (see :func:`constant_factor`). A :func:`linear_factor` is used as it
    is, with shift 0."""
    if getattr(t, "_autospec_linear", False):
        shift_dims = "".join(d for d in dims if d in kept)
        zeros = t.new_zeros([size for size, d in zip(t.shape, dims) if d in kept])
        return _Scaled(t, dims, zeros, shift_dims)
    cache = getattr(t, "_autospec_exp", None) if not t.requires_grad else None
    if cache is not None and kept in cache:
        return cache[kept]
    inner = [i for i, d in enumerate(dims) if d not in kept]
    shift = t.detach()
    if inner:
        shift = shift.amax(dim=inner, keepdim=True)
    shift = shift.clamp(min=torch.finfo(t.dtype).min)
    lin = (t - shift).exp()
    shift_dims = "".join(d for d in dims if d in kept)
    shift = shift.reshape([size for size, d in zip(t.shape, dims) if d in kept])
    result = _Scaled(lin, dims, shift, shift_dims)
    if cache is not None:
        cache[kept] = result
    return result


def _add_shifts(x: _Scaled, y: _Scaled | None, kept: str) -> tuple[torch.Tensor, str]:
    if y is None:
        return x.shift, x.shift_dims
    dims = "".join(d for d in kept if d in x.shift_dims or d in y.shift_dims)
    return _align(x.shift, x.shift_dims, dims) + _align(y.shift, y.shift_dims, dims), dims


def _scaled_step(x: _Scaled, y: _Scaled | None, elim: str, out: str, kept: str):
    """One planned step in scaled linear space; None when it underflows (caller falls back)."""
    shift, shift_dims = _add_shifts(x, y, kept)
    if y is None:
        lin = x.lin
        if elim:
            lin = lin.sum([x.dims.index(d) for d in elim])
        remaining = "".join(d for d in x.dims if d not in elim)
        if remaining != out:
            lin = lin.permute([remaining.index(d) for d in out])
    elif not elim:
        return _Scaled(
            _align(x.lin, x.dims, out) * _align(y.lin, y.dims, out), out, shift, shift_dims
        )
    else:
        plan = _step_plan(x.dims, y.dims, elim, out)
        if plan.matrix is None and _step_plan(y.dims, x.dims, elim, out).matrix is not None:
            x, y = y, x
            plan = _step_plan(x.dims, y.dims, elim, out)
        if plan.matrix is not None:
            px, py, _, _ = plan.matrix
            lin = _to_matrix(x.lin, px, elim) @ _to_matrix(y.lin, py, elim, first=True)
            sizes = dict(zip(x.dims, x.lin.shape)) | dict(zip(y.dims, y.lin.shape))
            lin = lin.reshape([sizes[d] for d in out])
        else:
            lin = torch.einsum(plan.forward, x.lin, y.lin)
    inner = [i for i, d in enumerate(out) if d not in kept]
    if not inner:
        return _Scaled(lin, out, shift, shift_dims)
    norm = lin.detach().amax(dim=inner, keepdim=True)
    if not lin.is_meta:
        floor = torch.finfo(lin.dtype).min
        tiny = norm < _TINY
        if bool(tiny.any()):
            outer = _align(shift, shift_dims, out)
            if bool((tiny & (outer > floor)).any()):
                return None  # underflow (or an exact zero): recompute in log space
    positive = norm > 0
    lin = lin / torch.where(positive, norm, torch.ones_like(norm))
    log_norm = torch.where(positive, norm, torch.zeros_like(norm)).log()
    new_dims = "".join(d for d in out if d in kept)
    log_norm = log_norm.reshape([size for size, d in zip(lin.shape, out) if d in kept])
    shift = _align(shift, shift_dims, new_dims) + log_norm
    return _Scaled(lin, out, shift, new_dims)


def _log_step(x: _Scaled, y: _Scaled | None, elim: str, out: str, kept: str) -> _Scaled:
    """The exact log-space step (for underflow), back in scaled form."""
    yl = None if y is None else y.to_log()
    result = _broadcast_contract(x.to_log(), x.dims, yl, "" if y is None else y.dims, elim, out)
    return _scale(result, out, kept)


def _as_log(term: torch.Tensor) -> torch.Tensor:
    """A :func:`linear_factor` in log space (with :class:`_SafeLog`'s NaN-free gradient);
    any other factor as it is."""
    if not getattr(term, "_autospec_linear", False):
        return term
    log = _SafeLog.apply(term)
    log._pyro_dims = term._pyro_dims
    return log


class StepTooLarge(Exception):
    """A step of a measured contraction has more entries than :attr:`PlannedLogRing.entry_cap`."""


class PlannedLogRing(LogRing):
    """:class:`~pyro.ops.rings.LogRing` whose ``sumproduct`` follows a cached greedy plan.

    Parameters
    ----------
    cache : dict, optional
        As for Pyro's rings.
    dim_to_size : dict, optional
        Sizes of plate dims, for broadcasting.

    Notes
    -----
    See the module docstring: plans are cached per ``(dims, shapes)``, each pairwise step is a
    shifted batched matrix product checked for underflow, and the backward pass is NaN-free.
    Set :attr:`step_entries` to a list to record, for every step, the number of entries of its
    product space (on ``meta`` tensors this measures a contraction without running it), and
    :attr:`entry_cap` to raise :class:`StepTooLarge` before a step with more entries runs.

    Examples
    --------
    >>> import torch
    >>> from collections import OrderedDict
    >>> from pyro.ops.contract import contract_to_tensor
    >>> pair = torch.tensor([[0.0, -1.0], [-2.0, 0.0]], dtype=torch.float64)
    >>> pair._pyro_dims = "ab"
    >>> logz = contract_to_tensor(OrderedDict({frozenset(): [pair]}), {"a", "b"},
    ...                           ring=PlannedLogRing())
    >>> round(float(logz), 4) == round(float(pair.logsumexp((0, 1))), 4)
    True
    """

    step_entries: list | None = None
    entry_cap: int | None = None

    def sumproduct(self, terms, dims):
        inputs = [term._pyro_dims for term in terms]
        output = "".join(sorted(set("".join(inputs)) - set(dims)))
        key = (tuple(inputs), tuple(tuple(t.shape) for t in terms), output)
        plan = _PLANS.get(key)
        if plan is None:
            sizes = {}
            for term in terms:
                sizes.update(zip(term._pyro_dims, term.shape))
            plan = plan_contraction(inputs, output, sizes)
            if len(_PLANS) >= _MAX_PLANS:
                _PLANS.clear()
            _PLANS[key] = plan
        values = [_scale(t, d, output) for t, d in zip(terms, inputs)]
        names = list(inputs)
        for i, j, elim, out in plan:
            x, y = values[i], (values[j] if j is not None else None)
            if self.step_entries is not None:
                sizes = dict(zip(x.dims, x.lin.shape))
                if y is not None:
                    sizes.update(zip(y.dims, y.lin.shape))
                self.step_entries.append(math.prod(sizes.values()))
                if self.entry_cap is not None and self.step_entries[-1] > self.entry_cap:
                    raise StepTooLarge(self.step_entries[-1])
            result = _scaled_step(x, y, elim, out, output)
            if result is None:
                result = _log_step(x, y, elim, out, output)
            values.append(result)
            names.append(out)
            values[i] = None
            if j is not None:
                values[j] = None
        if plan:
            result, dims_now = values[-1].to_log(), names[-1]
        else:  # one term, nothing to sum: in log space, as every result (a linear factor
            # gets here when it is reduced over a plate before its sum: the evidence of a
            # site in a plate of size 1 that a site outside the plate reads)
            result, dims_now = _as_log(terms[0]), inputs[0]
        if dims_now != output:
            result = result.permute([dims_now.index(d) for d in output])
        if any(result is term for term in terms):
            result = result.clone()
        result._pyro_dims = output
        return result
