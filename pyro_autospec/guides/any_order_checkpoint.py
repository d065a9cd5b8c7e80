"""Saving and loading an :class:`~pyro_autospec.guides.AnyOrderGuide`.

:meth:`~GuideCheckpoint.save` writes the configuration, the weights, the edges of the factor
graph, the names of the model's sample sites and the loss history; :meth:`~GuideCheckpoint.load`
rebuilds the guide for a model with the same sites (names and shapes), without probing every
pair again, from a file loaded with
``torch.load(weights_only=True)`` whose checksum must match (:mod:`pyro_autospec.guides._files`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from pyro_autospec.guides._files import load_plain, match_dtypes, not_a_guide, plain, save_plain
from pyro_autospec.model import SiteLayout, discover_sites

#: The keys of a saved ``AnyOrderGuide.config``, and those a file must hold.
CONFIG_KEYS = (
    "architecture",
    "hidden_dim",
    "num_layers",
    "num_heads",
    "bp_iterations",
    "max_plate_nesting",
    "num_coords",
    "num_values",
    "chunk_size",
)
CONFIG_REQUIRED = ("architecture", "num_coords", "num_values")

if TYPE_CHECKING:
    from pyro_autospec.guides.any_order import AnyOrderGuide

__all__ = ["GuideCheckpoint"]


class GuideCheckpoint:
    """:meth:`save` and :meth:`load` of :class:`~pyro_autospec.guides.AnyOrderGuide` (a
    mixin: it reads the guide's ``config``, ``edges``, ``state_dict`` and ``loss_history``)."""

    def save(self, path: Any) -> None:
        """Save the configuration, the weights, the edges, the names of the model's sample sites
        (latent, observed and ``pyro.factor``) and the loss history to ``path``.

        The file also holds a SHA-256 checksum of all of them, which :meth:`load` checks.

        Examples
        --------
        >>> import io, torch
        >>> from pyro_autospec.guides import AnyOrderGuide
        >>> guide = AnyOrderGuide(num_coords=3, num_values=2, hidden_dim=8)
        >>> buffer = io.BytesIO(); guide.save(buffer); _ = buffer.seek(0)
        >>> copy = AnyOrderGuide.load(buffer)
        >>> values = torch.zeros(1, 3, dtype=torch.long); mask = torch.zeros(1, 3, dtype=torch.bool)
        >>> torch.equal(copy.log_marginals(values, mask), guide.log_marginals(values, mask))
        True
        """
        content = {
            "config": plain(self.config),
            "edges": self.edges.cpu(),
            "state_dict": self.state_dict(),
            "loss": plain(list(self.loss_history)),
        }
        if self.layout is not None:  # the model's sites, checked when loaded for a model
            content["sites"] = model_sites(self.layout)
            content["shapes"] = site_shapes(self.layout)
        save_plain(content, path)

    @classmethod
    def load(
        cls,
        path: Any,
        model: Callable | None = None,
        model_args: tuple = (),
        model_kwargs: dict | None = None,
        map_location: Any = None,
    ) -> AnyOrderGuide:
        """Rebuild a guide saved by :meth:`save` for ``model`` (the same sites: names and shapes).

        The loaded guide has the saved weights, in the saved dtypes (a guide saved in float64
        loads in float64), on torch's default device (the CPU unless set): ``map_location``
        only says where ``torch.load`` reads the tensors; move the guide with
        ``.to(device)``. Its data set is ``model_args``: the potentials are computed again
        from the model, not read from the file.

        Parameters
        ----------
        path : str or file
        model : callable or SiteLayout, optional
            The model, or the ``SiteLayout``, the guide was built from. ``None`` only for a
            guide saved without one: a guide whose network reads a data set's potentials
            cannot answer for its data without the model.
        model_args, model_kwargs
            Its arguments: the data set the loaded guide answers for by default.
        map_location : optional
            Passed to ``torch.load``.

        Returns
        -------
        AnyOrderGuide

        Raises
        ------
        pickle.UnpicklingError
            When the file holds anything but tensors and plain data: it is loaded with
            ``torch.load(weights_only=True)``, so a file someone sent cannot run code.
        ValueError
            When the file is damaged (its checksum does not match, it is truncated) or not a
            guide file, or when ``model`` is ``None`` for a guide built from a model: a
            ``"graph"`` guide, or an ``"mlp"`` or ``"transformer"`` guide whose saved
            potentials are not all zero (loaded without the model it would answer with none,
            that is for no data, silently); or when ``model`` has other sample sites than the
            model the guide was saved for (a ``pyro.factor`` added or removed, a site renamed:
            the guide's factor graph and potentials belong to its own model), or sites of
            other shapes (data with other plate sizes). Files saved before the site names, or
            their shapes, were written are not checked for them.
        """
        saved = load_plain(path, map_location, "AnyOrderGuide", CONFIG_KEYS, CONFIG_REQUIRED)
        config = dict(saved["config"])
        n, q = config.pop("num_coords"), config.pop("num_values")
        if model is None:
            _check_bare(path, config["architecture"], saved["state_dict"])
            guide = cls(num_coords=n, num_values=q, **config)
        else:
            # the sites first: a guide built for other sites fails in odd places
            layout = model
            if callable(model) and not isinstance(model, SiteLayout):
                nesting = config.get("max_plate_nesting")
                layout = discover_sites(model, model_args, model_kwargs, max_plate_nesting=nesting)
            if isinstance(layout, SiteLayout):
                _check_sites(saved.get("sites"), layout, path)
                _check_shapes(saved.get("shapes"), layout, path)
            edges = None
            if config["architecture"] == "graph":
                edges = saved.get("edges")
                if not isinstance(edges, torch.Tensor):
                    raise ValueError(
                        f"{not_a_guide('AnyOrderGuide', path)}: it holds a 'graph' guide "
                        f"without its edges"
                    )
            guide = cls(model, model_args, model_kwargs, edges=edges, **config)
            if guide.num_coords != n or guide.num_values != q:
                raise ValueError(
                    f"the guide was saved for n={n}, q={q}; this model has "
                    f"n={guide.num_coords}, q={guide.num_values}"
                )
        # The saved dtypes (the context buffers' too), then the weights; the context buffers
        # belong to the data set: keep the ones just computed.
        match_dtypes(guide, saved["state_dict"], "AnyOrderGuide", path)
        state = {k: v for k, v in saved["state_dict"].items() if not k.startswith("context_")}
        missing, unexpected = guide.load_state_dict(state, strict=False)
        missing = [k for k in missing if not k.startswith("context_")]
        if missing or unexpected:
            raise RuntimeError(
                f"the saved guide does not fit this configuration: missing {missing}, "
                f"unexpected {unexpected}"
            )
        guide.loss_history = list(saved.get("loss", []))
        guide.eval()
        return guide


def model_sites(layout: Any) -> list[list]:
    """``[name, observed]`` of every sample site of the model a guide was built from, in
    trace order: its discrete latent sites, its data and its ``pyro.factor`` sites (a factor
    added or removed changes the factor graph a ``"graph"`` guide passes messages along)."""
    return [[str(entry[0]), bool(entry[1])] for entry in layout.signature]


def site_shapes(layout: Any) -> dict[str, list[list[int]]]:
    """``{name: [batch shape, event shape]}`` of the model's latent sites
    (:meth:`~pyro_autospec.model.SiteLayout.latent_shapes`, as plain lists)."""
    return {name: [list(b), list(e)] for name, (b, e) in layout.latent_shapes().items()}


def _check_shapes(saved: Any, layout: Any, path: Any) -> None:
    """Refuse a file saved for sites of other shapes than ``layout``'s (the same names, other
    plate sizes: the coordinates and the factor graph differ). Files of earlier versions hold
    no shapes, and are not checked."""
    if saved is None:
        return
    ours = site_shapes(layout)
    for name, shapes in ours.items():
        theirs = saved.get(name)
        if theirs is None or [list(part) for part in theirs] == shapes:
            continue
        raise ValueError(
            f"AnyOrderGuide.load: {path!r} holds a guide saved for discrete site '{name}' of "
            f"batch shape {tuple(theirs[0])} and event shape {tuple(theirs[1])}; this model's "
            f"'{name}' has batch shape {tuple(shapes[0])} and event shape {tuple(shapes[1])}. "
            "A guide's coordinates and factor graph follow its sites' shapes (the data's plate "
            "sizes), so it would answer for other coordinates. Load it with data of the saved "
            "shapes, or build and train a guide for these: AnyOrderGuide(model, model_args)."
        )


def _check_sites(saved: Any, layout: Any, path: Any) -> None:
    """Refuse a file saved for a model with other sample sites than ``layout``'s model
    (files of earlier versions hold none, and are not checked)."""
    if saved is None:
        return
    ours = model_sites(layout)
    if [list(site) for site in saved] == ours:
        return
    theirs = {name for name, _ in saved}
    names = {name for name, _ in ours}

    def listed(found: set) -> str:
        shown = sorted(found)[:8]
        return ", ".join(shown) + (f" and {len(found) - 8} more" if len(found) > 8 else "")

    differences = []
    if names - theirs:
        differences.append(f"this model has {listed(names - theirs)}, the saved one had not")
    if theirs - names:
        differences.append(f"the saved model had {listed(theirs - names)}, this one has not")
    if not differences:
        differences.append("the same names, in another order or observed in one only")
    raise ValueError(
        f"AnyOrderGuide.load: {path!r} holds a guide saved for a model with other sample "
        f"sites than this one: {'; '.join(differences)}. A guide's potentials and its factor "
        "graph come from the model it was built for, and a guide loaded for another would "
        "answer for that model, silently. Load it with the model it was saved for, or build "
        "and train a guide for this model: AnyOrderGuide(model, model_args)."
    )


def _check_bare(path: Any, architecture: str, state: dict) -> None:
    """Refuse to load without a model a guide whose network reads the model's data."""
    unary = state.get("context_unary")
    if architecture == "graph":
        reads, source = "the model's factor graph and the potentials of a data set", "the model"
    elif isinstance(unary, torch.Tensor) and bool((unary != 0).any()):
        reads = "the potentials of a data set (the saved ones are not all zero)"
        source = "the model (or the SiteLayout the guide was built from)"
    else:
        return
    raise ValueError(
        f"AnyOrderGuide.load: {path!r} holds a guide (architecture {architecture!r}) built from "
        f"a Pyro model: its network reads {reads}, which only the model can give, and loaded "
        f"without it the guide would answer for no data. Pass {source} and its arguments: "
        f"AnyOrderGuide.load(path, model, model_args)"
    )
