"""Output for models with many sites: per-step sites grouped, compact names, short tables.

A model written with ``pyro.markov`` names its per-step sites ``x_0, x_1, ..., x_299``. Here
such sites (same stem, an underscore and an integer, same shape) form one *variable* ``x``:
``repr`` and the summaries name it ``x_0..x_299`` instead of listing 300 names, and
``summary(group=True)`` prints one row for it.
"""

from __future__ import annotations

import math
import re
from collections import OrderedDict
from collections.abc import Mapping, Sequence

import torch

from pyro_autospec.infer.summaries import (
    MIN_DRAWS_FOR_DIAGNOSTICS,
    print_summary_table,
    summary_table,
)

__all__ = ["MAX_ROWS", "compact_names", "group_sites", "print_summary", "select_sites"]

#: ``summary(group=None)`` groups when the per-element table would print more rows than this.
MAX_ROWS = 40

_INDEXED = re.compile(r"^(?P<stem>.+?)_(?P<index>\d+)$")


def group_sites(
    names: Sequence[str], shapes: Mapping[str, tuple] | None = None
) -> OrderedDict[str, list[str]]:
    """Group per-step sites ``stem_0, stem_1, ...`` under one key, in order of appearance.

    Two or more sites named ``stem_<integer>`` (with the same shape, when ``shapes`` is given)
    form a group keyed ``stem`` (``stem_*`` where a site is itself named ``stem``), its members
    sorted by index; every other site is a group of its own, keyed by its name.

    Examples
    --------
    >>> dict(group_sites(["p", "x_0", "x_1", "x_2", "y_7"]))
    {'p': ['p'], 'x': ['x_0', 'x_1', 'x_2'], 'y_7': ['y_7']}
    """
    names = list(names)
    stems: OrderedDict[tuple, list[tuple[int, str]]] = OrderedDict()
    for name in names:
        match = _INDEXED.match(name)
        if match is None:
            continue
        shape = None if shapes is None else tuple(shapes[name])
        stems.setdefault((match["stem"], shape), []).append((int(match["index"]), name))
    grouped: dict[str, tuple[str, list[str]]] = {}
    taken = set(names)
    for (stem, _), members in stems.items():
        if len(members) < 2:
            continue
        key = stem if stem not in taken else f"{stem}_*"
        while key in taken:
            key += "*"
        taken.add(key)
        ordered = [name for _, name in sorted(members)]
        for name in ordered:
            grouped[name] = (key, ordered)
    out: OrderedDict[str, list[str]] = OrderedDict()
    for name in names:
        if name in grouped:
            key, members = grouped[name]
            out.setdefault(key, members)
        else:
            out[name] = [name]
    return out


def group_label(key: str, members: Sequence[str]) -> str:
    """``x_0..x_299`` for a group with consecutive indices, ``x_* (5 sites)`` otherwise.

    Examples
    --------
    >>> group_label("x", ["x_0", "x_1", "x_2"]), group_label("x", ["x_0", "x_5"])
    ('x_0..x_2', 'x_* (2 sites)')
    """
    if len(members) == 1:
        return members[0]
    indices = [int(_INDEXED.match(m)["index"]) for m in members]
    if indices == list(range(indices[0], indices[0] + len(indices))):
        return f"{members[0]}..{members[-1]}"
    stem = _INDEXED.match(members[0])["stem"]
    return f"{stem}_* ({len(members)} sites)"


def compact_names(names: Sequence[str], limit: int = 8) -> str:
    """A short list of site names: per-step sites as one range, at most ``limit`` entries.

    Examples
    --------
    >>> compact_names(["p"] + [f"x_{t}" for t in range(300)])
    "['p', 'x_0..x_299']"
    >>> compact_names([f"s{i}" for i in range(12)], limit=3)
    "['s0', 's1', 's2', ... 9 more]"
    """
    labels = [group_label(k, v) for k, v in group_sites(names).items()]
    shown = ", ".join(repr(label) for label in labels[:limit])
    if len(labels) > limit:
        shown += f", ... {len(labels) - limit} more"
    return f"[{shown}]"


def select_sites(
    samples: Mapping[str, torch.Tensor], var_names: str | Sequence[str] | None
) -> OrderedDict[str, torch.Tensor]:
    """The sites named by ``var_names``: site names or group keys (``"x"`` for ``x_0..``).

    Raises
    ------
    ValueError
        For a name that is neither a site nor a group, listing the names there are.
    """
    samples = OrderedDict(samples)
    if var_names is None:
        return samples
    if isinstance(var_names, str):
        var_names = [var_names]
    groups = group_sites(list(samples))
    many = {key: members for key, members in groups.items() if len(members) > 1}
    # the label a summary prints for a group (x_0..x_11) names it too
    labels = {group_label(key, members): key for key, members in many.items()}
    chosen: list[str] = []
    unknown = []
    for name in var_names:
        if name in samples:
            members = [name]
        elif name in groups:
            members = groups[name]
        elif name in labels:
            members = groups[labels[name]]
        else:
            unknown.append(name)
            continue
        chosen += [m for m in members if m not in chosen]
    if unknown:
        selects = ", ".join(
            f"{key!r} selects {group_label(key, members)}" for key, members in many.items()
        )
        raise ValueError(
            f"var_names {unknown} are not sites of the run; sites and per-step groups are "
            f"{compact_names(list(samples), limit=20)}"
            + (f" (of the groups, {selects})" if selects else "")
        )
    return OrderedDict((k, samples[k]) for k in samples if k in chosen)


def _rows(samples: Mapping[str, torch.Tensor]) -> int:
    return sum(max(int(math.prod(v.shape[2:])), 1) for v in samples.values())


def print_summary(
    samples: Mapping[str, torch.Tensor],
    prob: float = 0.9,
    var_names: str | Sequence[str] | None = None,
    group: bool | None = None,
) -> None:
    """Print the summary table of ``samples`` (``name -> Tensor[chains, draws, *shape]``).

    Parameters
    ----------
    samples : dict
    prob : float
        Mass of the credible interval.
    var_names : str or list of str, optional
        Sites, or per-step groups (``"x"`` for ``x_0, x_1, ...``), to show (default: all).
    group : bool, optional
        ``False``: one row per element (``MCMC.summary``'s table). ``True``: one row per
        variable (per-step sites stacked into one), with the range of its elements' posterior
        means, the smallest ``n_eff`` and the largest ``r_hat`` among its elements. ``None``
        (default): ``True`` when the per-element table would have more than :data:`MAX_ROWS`
        rows.

    Examples
    --------
    >>> import torch
    >>> draws = {f"x_{t}": torch.tensor([[0.0, 1.0, 1.0, 0.0, 1.0]]) for t in range(3)}
    >>> print_summary(draws, group=True)  # doctest: +NORMALIZE_WHITESPACE
    <BLANKLINE>
                   elements  min mean  max mean min n_eff max r_hat
      x_0..x_2         3      0.60      0.60      4.50      0.71
    <BLANKLINE>
    One row per variable (per-step sites stacked): the range of its elements' posterior means,
    the smallest n_eff and the largest r_hat among them; summary(var_names=[...], group=False)
    prints every element.
    """
    samples = select_sites(samples, var_names)
    if not samples:
        return
    if group is None:
        group = _rows(samples) > MAX_ROWS
    if not group:
        print_summary_table(samples, prob=prob)
        _note_constant(
            sum(int(t["n_eff"].isnan().sum()) for t in summary_table(samples).values()), samples
        )
        return
    shapes = {k: tuple(v.shape[2:]) for k, v in samples.items()}
    groups = group_sites(list(samples), shapes)
    rows = []
    for key, members in groups.items():
        stacked = torch.stack([samples[m].double() for m in members], 2)
        flat = stacked.reshape(stacked.shape[:2] + (-1,))
        table = summary_table({key: flat}, prob)[key]
        n_eff, r_hat = table["n_eff"], table["r_hat"]
        rows.append(
            (
                group_label(key, members),
                flat.shape[2],
                float(table["mean"].min()),
                float(table["mean"].max()),
                _nan_reduce(n_eff, torch.min),
                _nan_reduce(r_hat, torch.max),
                int(n_eff.isnan().sum()),
            )
        )
    width = max(max(len(r[0]) for r in rows), 10)
    name = "{:>" + str(width) + "}"
    print()
    header = ["", "elements", "min mean", "max mean", "min n_eff", "max r_hat"]
    print((name + " {:>9}" * 5).format(*header))
    for label, count, low, high, ess, rhat, _ in rows:
        print((name + " {:>9d}" + " {:>9.2f}" * 4).format(label, count, low, high, ess, rhat))
    print()
    print(
        "One row per variable (per-step sites stacked): the range of its elements' posterior "
        "means,\nthe smallest n_eff and the largest r_hat among them; "
        "summary(var_names=[...], group=False)\nprints every element."
    )
    _note_constant(sum(r[6] for r in rows), samples, " (left out of the min and max)")


def _note_constant(count: int, samples: Mapping[str, torch.Tensor], more: str = "") -> None:
    draws = next(iter(samples.values())).shape[1]
    if not count or draws < MIN_DRAWS_FOR_DIAGNOSTICS:
        return
    # of the elements constant within every chain, those whose chains hold different values
    stuck = 0
    for value in samples.values():  # [chains, draws, ...]
        value = value.reshape(value.shape[0], value.shape[1], -1)  # [chains, draws, elements]
        constant = (value == value[:, :1]).all(1)  # [chains, elements]
        differ = (value[:, 0] != value[:1, 0]).any(0)  # [elements]
        stuck += int((constant.all(0) & differ).sum())
    if stuck < count:
        print(
            f"{count - stuck} element(s) have n_eff nan: their draws are all equal, in every "
            f"chain (as for a site the data fix){more}."
        )
    if stuck:
        print(
            f"{stuck} element(s) have n_eff nan and r_hat inf: each chain holds one value "
            f"throughout, but the chains hold different ones: they have not mixed (chains "
            f"stuck in different modes, or labels switched between them){more}."
        )


def _nan_reduce(value: torch.Tensor, reduce) -> float:
    finite = value[~value.isnan()]
    return float(reduce(finite)) if finite.numel() else math.nan
