"""Training an :class:`~pyro_autospec.guides.AnyOrderGuide`: its losses and its trainers.

The methods here are the guide's own (:class:`AnyOrderGuide` derives from
:class:`GuideTraining`); they live apart from the network and its oracle queries
(:mod:`pyro_autospec.guides.any_order`) because they are a different job:

* the losses: :meth:`~GuideTraining.sequential_log_prob` (the chain-rule terms of a draw in
  an order) and :meth:`~GuideTraining.any_order_loss` (the any-order likelihood, one random
  order and cut per draw);
* the trainers, all through the one Adam loop :func:`~pyro_autospec.guides.training.train`:
  :meth:`~GuideTraining.fit_to_samples` (draws at hand), :meth:`~GuideTraining.fit_posterior`
  (the model's joint density only) and :meth:`~GuideTraining.fit_simulation` (amortised over
  simulated data sets).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from pyro_autospec.guides.networks import GuideContext
from pyro_autospec.guides.training import (
    fit_posterior,
    fit_posterior_datasets,
    seeded_generator,
    train,
)
from pyro_autospec.model import discover_sites
from pyro_autospec.model.simulation import factor_sites, simulate_discrete

__all__ = ["GuideTraining"]


class GuideTraining:
    """The losses and trainers of :class:`~pyro_autospec.guides.AnyOrderGuide` (a mixin: it
    reads the guide's network through ``log_rows`` and its model, layout and device)."""

    def _require_model(self, what: str) -> None:
        if self.model is None or self.structure is None:
            raise ValueError(
                f"{what} needs a guide built from a Pyro model: AnyOrderGuide(model, model_args)"
            )

    def _check_same_sites(self, args: tuple, kwargs: dict) -> None:
        layout = discover_sites(
            self.model, args, kwargs, max_plate_nesting=self.layout.max_plate_nesting
        )
        if (
            layout.num_coords != self.num_coords
            or layout.num_values != self.num_values
            or [s.name for s in layout.sites] != [s.name for s in self.layout.sites]
        ):
            raise ValueError(
                f"the model with these arguments has {layout.num_coords} coordinates and "
                f"{layout.num_values} values in sites {layout.names}; the guide was built for "
                f"{self.num_coords} and {self.num_values} in {self.layout.names}"
            )
        ours, built = layout.latent_shapes(), self.layout.latent_shapes()
        for name, (batch, event) in ours.items():
            if (batch, event) != built[name]:
                raise ValueError(
                    f"the model with these arguments has discrete site '{name}' of batch "
                    f"shape {tuple(batch)} and event shape {tuple(event)}; the guide was built "
                    f"for batch shape {tuple(built[name][0])} and event shape "
                    f"{tuple(built[name][1])}. A guide's coordinates and factor graph follow "
                    "its sites' shapes (the data's plate sizes): build and train a guide for "
                    "data of these shapes."
                )

    # ---------------------------------------------------------------------------------- losses
    def sequential_log_prob(
        self,
        values: torch.Tensor,
        orders: torch.Tensor,
        positions: torch.Tensor | None = None,
        *,
        context: GuideContext | None = None,
        index: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Chain-rule terms ``log q(x_{sigma_t} | x_{sigma_1..t-1})`` (differentiable).

        Parameters
        ----------
        values : LongTensor[N, n]
            Assignments (support indices).
        orders : LongTensor[N, n]
            ``orders[k, t]`` is the coordinate visited ``t``-th for assignment ``k``.
        positions : LongTensor[N, k], optional
            The positions ``t`` (0-based) to evaluate; default all ``n``.
        context, index : optional
            Data sets (default the guide's own) and the data set of each assignment.

        Returns
        -------
        Tensor[N, k]
            The chain-rule terms at those positions; with all positions, ``.sum(-1)`` is
            ``log q_sigma(x)``, the ``log_prob`` the engine returns for a draw in that order.

        Examples
        --------
        >>> import torch
        >>> from pyro_autospec.guides import AnyOrderGuide
        >>> guide = AnyOrderGuide(num_coords=3, num_values=2, hidden_dim=8)
        >>> x = torch.tensor([[0, 1, 1]]); order = torch.tensor([[2, 0, 1]])
        >>> guide.sequential_log_prob(x, order).shape
        torch.Size([1, 3])
        """
        values = values.to(self.device).long()
        orders = orders.to(self.device).long()
        num, n = values.shape
        if orders.shape != values.shape:
            raise ValueError(
                f"orders must have the shape of values {tuple(values.shape)}; got "
                f"{tuple(orders.shape)}"
            )
        if positions is None:
            positions = torch.arange(n, device=self.device).expand(num, n)
        positions = positions.to(self.device).long()
        k = positions.shape[1]
        ranks = torch.empty_like(orders)
        ranks.scatter_(1, orders, torch.arange(n, device=self.device).expand(num, n))
        mask = ranks.unsqueeze(1) < positions.unsqueeze(-1)  # [N, k, n]
        target = orders.gather(1, positions)  # [N, k]
        rows = self.log_rows(
            values.unsqueeze(1).expand(num, k, n).reshape(-1, n),
            mask.reshape(-1, n),
            context=context,
            index=None if index is None else torch.as_tensor(index).repeat_interleave(k),
            targets=target.reshape(-1, 1),
        ).reshape(num, k, -1)
        return rows.gather(2, values.gather(1, target).unsqueeze(-1)).squeeze(-1)

    def any_order_loss(
        self,
        values: torch.Tensor,
        weights: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        *,
        context: GuideContext | None = None,
        index: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The any-order negative log likelihood, one random order and cut per draw
        (the order-agnostic NADE objective of Uria, Murray and Larochelle, ICML 2014).

        For each draw a uniformly random order ``sigma`` and a cut ``t`` give the pinned set
        ``S = sigma_{1..t}``; the estimate ``-(n / (n - t)) sum_{i not in S} log q(x_i | x_S)``
        (every unpinned coordinate scored in the same pass, with the masked-diffusion weight
        ``n / (n - t)``) is unbiased for ``E_sigma[-log q_sigma(x)]``. The cuts of a batch are
        stratified: draw ``k`` of ``N`` gets ``t`` uniform in the ``k``-th of ``N`` equal
        slices of ``{0, ..., n - 1}`` (in a random assignment), which keeps the estimate
        unbiased and lowers its variance.

        Parameters
        ----------
        values : LongTensor[N, n]
        weights : Tensor[N], optional
            Per-draw weights (e.g. self-normalised importance weights); default ``1 / N``.
        generator : torch.Generator, optional
            For the orders and cuts.
        context, index : optional
            Data sets (default the guide's own) and the data set of each draw.

        Returns
        -------
        Tensor[]
            The weighted loss (differentiable).
        """
        values = values.to(self.device).long()
        num, n = values.shape
        ranks = torch.rand(num, n, generator=generator).argsort(-1).to(self.device)
        slot = torch.randperm(num, generator=generator).double()
        u = torch.rand(num, generator=generator, dtype=torch.float64)
        cut = ((slot + u) * n / num).floor().clamp(0, n - 1).long().unsqueeze(1).to(self.device)
        mask = ranks < cut
        log_rows = self.log_rows(values, mask, context=context, index=index)
        picked = log_rows.gather(-1, values.unsqueeze(-1)).squeeze(-1)
        picked = picked.masked_fill(mask, 0.0)
        per_draw = -(n / (n - cut.squeeze(1)).to(picked.dtype)) * picked.sum(-1)
        if weights is None:
            return per_draw.mean()
        return (weights.to(per_draw) * per_draw).sum()

    # -------------------------------------------------------------------------------- trainers
    def _coords(self, samples: torch.Tensor | Mapping[str, torch.Tensor]) -> torch.Tensor:
        if isinstance(samples, Mapping):
            if self.layout is None:
                raise ValueError("a dict of site values needs a guide built from a model")
            missing = [s for s in self.layout.names if s not in samples]
            if missing:
                raise ValueError(f"samples lacks the discrete site(s) {missing}")
            samples = self.layout.to_coords(samples)
        samples = torch.as_tensor(samples)
        if samples.dim() != 2 or samples.shape[1] != self.num_coords:
            raise ValueError(
                f"samples must be LongTensor[N, {self.num_coords}] (engine coordinates) or a dict "
                f"of site values; got shape {tuple(samples.shape)}"
            )
        if samples.is_floating_point():
            samples = samples.round().long()
        if bool((samples < 0).any()) or bool((samples >= self.num_values).any()):
            raise ValueError(f"sample values must lie in 0..{self.num_values - 1}")
        samples = samples.long()
        # a value outside its coordinate's support has log probability -inf under the guide:
        # an infinite loss, and NaN weights after the first step
        outside = self.outside_support.to(samples.device)
        hit = outside[torch.arange(self.num_coords, device=samples.device), samples]
        if bool(hit.any()):
            row, coord = (int(i) for i in hit.nonzero()[0])
            where = f"coordinate {coord}"
            if self.layout is not None:
                site, index = self.layout.coordinates[coord]
                where += f" (site '{site}', element {index})"
            raise ValueError(
                f"sample {row} gives {where} the value {int(samples[row, coord])}, outside its "
                f"support; engine coordinates are support indices of each site"
            )
        return samples

    def fit_to_samples(
        self,
        samples: torch.Tensor | Mapping[str, torch.Tensor],
        *,
        num_steps: int = 1000,
        batch_size: int = 128,
        lr: float = 1e-3,
        lr_decay: float = 1.0,
        weights: torch.Tensor | None = None,
        seed: int | None = None,
        disable_progbar: bool = False,
    ) -> list[float]:
        """Maximum likelihood in uniformly random orders, for draws you already have.

        Minimises :meth:`any_order_loss` (one network pass per draw) with the shared Adam
        loop (:func:`~pyro_autospec.guides.training.train`) on minibatches drawn from
        ``samples``, for the guide's own data set.

        Parameters
        ----------
        samples : LongTensor[N, n] or dict
            Engine coordinates, or ``{site: Tensor[N, *shape]}`` as ``AutoSpec.get_samples``
            or ``MCMC.get_samples`` return (mapped with ``layout.to_coords``).
        num_steps : int
            Adam steps.
        batch_size : int
            Draws per step (sampled with replacement, proportional to ``weights``).
        lr : float
            Adam learning rate.
        lr_decay : float
            Cosine decay of the rate to ``lr * lr_decay`` (``1.0``: constant).
        weights : Tensor[N], optional
            Non-negative weights of the draws (default uniform).
        seed : int, optional
            Seeds the minibatches, orders and cuts.
        disable_progbar : bool
            Hide the ``tqdm`` bar.

        Returns
        -------
        list of float
            The loss of every step (also appended to :attr:`loss_history`).

        Examples
        --------
        >>> import torch
        >>> from pyro_autospec.guides import AnyOrderGuide
        >>> guide = AnyOrderGuide(num_coords=3, num_values=2, hidden_dim=16)
        >>> data = torch.tensor([[0, 0, 0], [1, 1, 1]]).repeat(50, 1)
        >>> losses = guide.fit_to_samples(
        ...     data, num_steps=200, lr=1e-2, seed=0, disable_progbar=True
        ... )
        >>> losses[-1] < losses[0]
        True
        """
        samples = self._coords(samples).to(self.device)
        num = samples.shape[0]
        if weights is None:
            probs = torch.full((num,), 1.0 / num)
        else:
            probs = torch.as_tensor(weights, dtype=torch.float64).reshape(-1)
            if probs.shape[0] != num or bool((probs < 0).any()) or not probs.sum() > 0:
                raise ValueError("weights must be non-negative, one per draw, not all zero")
            probs = probs / probs.sum()
        gen = seeded_generator(seed)

        def step_loss(step: int):
            idx = torch.multinomial(probs, batch_size, replacement=True, generator=gen)
            loss = self.any_order_loss(samples[idx.to(samples.device)], generator=gen)
            return loss, loss.item()

        return train(
            self,
            step_loss,
            num_steps=int(num_steps),
            lr=lr,
            lr_decay=lr_decay,
            desc="fit_to_samples",
            disable_progbar=disable_progbar,
        )

    def fit_posterior(self, *args: Any, **kwargs: Any) -> list[float]:
        """Fit the guide to the model's posterior given the data; see
        :func:`pyro_autospec.guides.training.fit_posterior` for the options."""
        return fit_posterior(self, *args, **kwargs)

    def fit_simulation(
        self,
        num_simulations: int,
        *args: Any,
        objective: str = "auto",
        num_steps: int = 1000,
        batch_size: int = 128,
        lr: float = 1e-3,
        lr_decay: float = 0.1,
        num_particles: int = 64,
        datasets_per_step: int = 8,
        posterior_objective: str = "both",
        num_positions: int = 32,
        method: str = "sequential",
        max_seconds: float | None = None,
        seed: int | None = None,
        disable_progbar: bool = False,
        **kwargs: Any,
    ) -> list[float]:
        """Amortised training: ``q(x | data)`` for every data set of the model's shapes.

        ``num_simulations`` pairs ``(x, data)`` are drawn once from the model's prior
        predictive (the model run forward, observed sites sampled). A new data set then gets
        its draws from :meth:`oracle` with no retraining, corrected by ``AutoSpec(...,
        correction=...)``.

        Parameters
        ----------
        num_simulations : int
            Simulated data sets (a fixed training set).
        *args, **kwargs
            The model's arguments (default: those the guide was built with); observed values
            are ignored, sizes and covariates used. Keywords named here are options.
        objective : {"auto", "likelihood", "posterior"}
            ``"likelihood"``: the any-order likelihood of the simulated ``x`` given their data
            (:meth:`any_order_loss`, one pass per pair; the amortised forward KL
            ``E_data KL(p(x | data) || q(x | data))``). Valid only when forward simulation
            draws the model's joint, i.e. the model has no ``pyro.factor``. ``"posterior"``:
            only the simulated *data* are used; each step fits ``q(. | data_k)`` to the
            posterior of ``datasets_per_step`` of them with :func:`fit_posterior`'s
            estimator (valid for any model). ``"auto"``: ``"likelihood"`` unless the model
            has ``pyro.factor`` sites.
        num_steps, lr, lr_decay, max_seconds, seed, disable_progbar
            As in :func:`~pyro_autospec.guides.training.train`.
        batch_size : int
            Pairs per step (``"likelihood"``).
        num_particles, datasets_per_step, posterior_objective, num_positions, method
            Per step of ``"posterior"``: guide draws in all, data sets they are spread over,
            and :func:`fit_posterior`'s ``objective``, ``num_positions`` and ``method``.

        Returns
        -------
        list of float
            The loss of every step (also appended to :attr:`loss_history`).

        Examples
        --------
        >>> import torch, pyro, pyro.distributions as dist
        >>> from pyro_autospec.guides import AnyOrderGuide
        >>> def model(y):
        ...     with pyro.plate("p", 4):
        ...         z = pyro.sample("z", dist.Bernoulli(0.5))
        ...         pyro.sample("y", dist.Normal(2.0 * z - 1.0, 1.0), obs=y)
        >>> guide = AnyOrderGuide(model, (torch.zeros(4),), architecture="mlp", hidden_dim=16)
        >>> losses = guide.fit_simulation(256, num_steps=20, seed=0, disable_progbar=True)
        >>> len(losses)
        20
        """
        self._require_model("fit_simulation")
        if objective not in ("auto", "likelihood", "posterior"):
            raise ValueError(
                f"objective must be 'auto', 'likelihood' or 'posterior'; got {objective!r}"
            )
        if not args and not kwargs:
            args, kwargs = self.model_args, self.model_kwargs
        self._check_same_sites(args, kwargs)
        factors = factor_sites(self.model, args, kwargs)
        if objective == "auto":
            objective = "posterior" if factors else "likelihood"
        if objective == "likelihood" and factors:
            raise ValueError(
                f"objective='likelihood' needs draws of the model's joint, but forward "
                f"simulation ignores the pyro.factor site(s) {factors}; use "
                f"objective='posterior' (fits the posterior of each simulated data set)"
            )
        if not self.layout.observed:
            raise ValueError("the model has no observed sites: there is nothing to amortise over")
        coords, observed = simulate_discrete(
            self.model, args, kwargs, self.layout, int(num_simulations), seed=seed
        )
        if objective == "posterior":
            return fit_posterior_datasets(
                self,
                observed,
                num_steps=num_steps,
                num_particles=num_particles,
                datasets_per_step=datasets_per_step,
                num_positions=num_positions,
                objective=posterior_objective,
                lr=lr,
                lr_decay=lr_decay,
                method=method,
                max_seconds=max_seconds,
                seed=seed,
                disable_progbar=disable_progbar,
                model_args=args,
                model_kwargs=kwargs,
            )
        bank = self.context_for(observed, *args, **kwargs)
        coords = coords.to(self.device)
        gen = seeded_generator(seed)

        def step_loss(step: int):
            idx = torch.randint(0, coords.shape[0], (batch_size,), generator=gen)
            idx = idx.to(self.device)
            loss = self.any_order_loss(coords[idx], generator=gen, context=bank, index=idx)
            return loss, loss.item()

        return train(
            self,
            step_loss,
            num_steps=int(num_steps),
            lr=lr,
            lr_decay=lr_decay,
            max_seconds=max_seconds,
            desc="fit_simulation",
            disable_progbar=disable_progbar,
        )
