"""Oracles as users write them, outside the package: for the exactness tests of
``tests/engine/test_user_oracles.py`` and the benchmark ``benchmarks/user_oracles.py``.

Each is a small class against the :class:`~pyro_autospec.engine.protocols.MarginalOracle` protocol
only (no helper of the package):

* :class:`RandomNADE`: an imperfect learned network, a one-hidden-layer order-agnostic NADE
  with random weights. Its conditionals are NOT the marginals of one joint: the law of its
  sequential sampler depends on the order. Chain queries in one pass (the first layer's input
  grows by one pinned coordinate per step: a cumulative sum).
* :class:`ProductMixture`: a consistent dense oracle, a mixture of ``K`` product distributions,
  exact conditionals by Bayes on the mixture weights, ``O(n K)`` per row.
* :class:`HandChain`: a binary Markov chain written by hand with ``log_marginals_at`` only (no
  chain queries): the engine expands every verification into single rows.
"""

from __future__ import annotations

import math

import torch

__all__ = ["RandomNADE", "ProductMixture", "HandChain", "NoAdjacentZeros", "chain_rule_log_prob"]


class RandomNADE:
    """A one-hidden-layer any-order network with random weights: an imperfect oracle.

    ``h = tanh(b + sum_{i in S} (E[i, x_i] + M[i]))`` over the pinned set ``S``, then
    ``logits[i] = V[i] h + c[i]`` and ``log_softmax`` per coordinate.

    Parameters
    ----------
    n, q : int
        Coordinates and values.
    hidden : int
        Width of the hidden layer.
    scale : float
        Multiplies every weight: smaller is smoother (rows nearer uniform, and nearer one
        another across orders, so the residuals after a rejection are small).
    seed : int
        Seeds the weights.
    chains : bool
        Answer chain queries natively (``log_marginals_chain`` and
        ``log_marginals_chain_then``, one pass each); ``False`` leaves only rows.
    device : str or torch.device

    Examples
    --------
    >>> net = RandomNADE(6, 3, hidden=8, seed=0)
    >>> values, mask = torch.zeros(2, 6, dtype=torch.long), torch.zeros(2, 6, dtype=torch.bool)
    >>> net.log_marginals(values, mask).shape
    torch.Size([2, 6, 3])
    """

    inference_safe = True

    def __init__(
        self,
        n: int,
        q: int,
        hidden: int = 64,
        scale: float = 1.0,
        seed: int = 0,
        chains: bool = True,
        device: str | torch.device = "cpu",
    ):
        g = torch.Generator().manual_seed(seed)
        self.num_coords, self.num_values, self.hidden = int(n), int(q), int(hidden)
        self.scale = float(scale)
        self.device = torch.device(device)
        # A pinned coordinate moves the pre-activation by E[i, x_i] + M[i]; with n / 2 pins
        # on average, N(0, 4 / n) entries keep it of order one (times scale).
        spread = scale * 2.0 / math.sqrt(n)
        self.embed = spread * torch.randn(n, q, hidden, generator=g)
        self.pin = spread * torch.randn(n, hidden, generator=g)
        self.bias = scale * torch.randn(hidden, generator=g)
        self.head = scale * 3.0 / math.sqrt(hidden) * torch.randn(n, q, hidden, generator=g)
        self.head_bias = scale * torch.randn(n, q, generator=g)
        for name in ("embed", "pin", "bias", "head", "head_bias"):
            setattr(self, name, getattr(self, name).to(self.device))
        # one matrix for the first layer: [one-hot pinned values, mask] -> hidden
        self.first = torch.cat([self.embed.reshape(n * q, hidden), self.pin], 0)
        if not chains:  # the protocol checks callable(getattr(oracle, name, None))
            self.log_marginals_chain = None
            self.log_marginals_chain_then = None

    def _pre(self, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Pre-activation of the prefix ``mask``: [B, hidden]."""
        b, n, q = values.shape[0], self.num_coords, self.num_values
        onehot = torch.nn.functional.one_hot(values.clamp(0, q - 1), q).to(self.first.dtype)
        onehot = onehot * mask.unsqueeze(-1)
        inputs = torch.cat([onehot.reshape(b, n * q), mask.to(self.first.dtype)], 1)
        return inputs @ self.first + self.bias

    def _heads(self, h: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """``h`` [B, k, hidden] (pre-activation), ``targets`` [B, k] -> log probs [B, k, q]."""
        logits = torch.einsum("bkh,bkqh->bkq", torch.tanh(h), self.head[targets])
        return torch.log_softmax(logits + self.head_bias[targets], dim=-1)

    def log_marginals(self, values, mask):
        h = torch.tanh(self._pre(values, mask))
        logits = torch.einsum("bh,iqh->biq", h, self.head) + self.head_bias
        return torch.log_softmax(logits, dim=-1)

    def log_marginals_at(self, values, mask, targets):
        return self._heads(self._pre(values, mask).unsqueeze(1), targets)

    def _steps(self, values, chain):
        """What pinning each chain coordinate adds to the pre-activation: [C, L, hidden]."""
        chain_values = values.gather(1, chain).clamp(0, self.num_values - 1)
        return self.embed[chain, chain_values] + self.pin[chain]

    def log_marginals_chain(self, values, mask, chain):
        steps = self._steps(values, chain)
        before = torch.cumsum(steps, dim=1) - steps  # row j pins chain[:j]
        return self._heads(self._pre(values, mask).unsqueeze(1) + before, chain)

    def log_marginals_chain_then(self, values, mask, chain, then):
        steps = self._steps(values, chain)
        total = torch.cumsum(steps, dim=1)
        pre = self._pre(values, mask).unsqueeze(1)
        out = self._heads(pre + total - steps, chain)
        # the row after pins the chain's coordinates once: a padded chain repeats its last one
        fresh = torch.ones_like(chain, dtype=torch.bool)
        fresh[:, 1:] = chain[:, 1:] != chain[:, :-1]
        pinned_chain = (steps * fresh.unsqueeze(-1)).sum(1, keepdim=True)
        after = self._heads((pre + pinned_chain).expand(-1, then.shape[1], -1), then)
        # a ``then`` coordinate pinned by the prefix or the chain: a point mass at its value
        pinned = mask.gather(1, then) | (then.unsqueeze(2) == chain.unsqueeze(1)).any(2)
        point = torch.nn.functional.one_hot(values.gather(1, then), self.num_values).bool()
        point = torch.zeros_like(after).masked_fill(~point, -math.inf)
        return out, torch.where(pinned.unsqueeze(-1), point, after)


class ProductMixture:
    """A mixture of ``K`` product distributions on ``[q]^n``: a consistent (exact) oracle.

    ``mu(x) = sum_k w_k prod_i theta_k[i, x_i]``; given pinned ``x_S`` the weights become
    ``w_k prod_{i in S} theta_k[i, x_i]`` (Bayes), so a row costs ``O(n K)``.

    Parameters
    ----------
    n, q, components : int
        Coordinates, values and ``K``.
    sharpness : float
        Standard deviation of each component's logits (larger: components further apart).
    seed : int
    device : str or torch.device

    Examples
    --------
    >>> mix = ProductMixture(5, 2, components=3, seed=0)
    >>> mix.log_joint(torch.zeros(1, 5, dtype=torch.long)).shape
    torch.Size([1])
    """

    inference_safe = True

    def __init__(
        self,
        n: int,
        q: int,
        components: int = 8,
        sharpness: float = 1.0,
        seed: int = 0,
        device: str | torch.device = "cpu",
    ):
        g = torch.Generator().manual_seed(seed)
        self.num_coords, self.num_values, self.components = int(n), int(q), int(components)
        self.device = torch.device(device)
        logits = sharpness * torch.randn(components, n, q, generator=g, dtype=torch.float64)
        self.log_theta = torch.log_softmax(logits, -1).to(self.device)  # [K, n, q]
        weights = torch.randn(components, generator=g, dtype=torch.float64)
        self.log_w = torch.log_softmax(weights, 0).to(self.device)  # [K]
        # [n * q, K] for the evidence of pinned values by one matrix product
        self._table = self.log_theta.permute(1, 2, 0).reshape(n * q, components)

    def _evidence(self, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``log w_k + sum_{i in S} log theta_k[i, x_i]``: [B, K]."""
        n, q = self.num_coords, self.num_values
        index = torch.arange(n, device=values.device) * q + values.clamp(0, q - 1)
        rows = self._table[index]  # [B, n, K]
        return self.log_w + (rows * mask.unsqueeze(-1)).sum(1)

    @staticmethod
    def _mix(post: torch.Tensor, log_theta: torch.Tensor) -> torch.Tensor:
        """``post`` [..., K] (unnormalised), ``log_theta`` [..., K, q] -> log probs [..., q]."""
        post = post - torch.logsumexp(post, -1, keepdim=True)
        return torch.logsumexp(post.unsqueeze(-1) + log_theta, -2)

    def log_marginals(self, values, mask):
        post = self._evidence(values, mask)  # [B, K]
        theta = self.log_theta.permute(1, 0, 2).unsqueeze(0)  # [1, n, K, q]
        return self._mix(post.unsqueeze(1), theta)

    def log_marginals_at(self, values, mask, targets):
        post = self._evidence(values, mask).unsqueeze(1)  # [B, 1, K]
        theta = self.log_theta.permute(1, 0, 2)[targets]  # [B, k, K, q]
        return self._mix(post, theta)

    def log_marginals_chain(self, values, mask, chain):
        post = self._evidence(values, mask).unsqueeze(1)  # [C, 1, K]
        theta = self.log_theta.permute(1, 0, 2)[chain]  # [C, L, K, q]
        index = chain * self.num_values + values.gather(1, chain).clamp(0, self.num_values - 1)
        picked = self._table[index]  # [C, L, K]: log theta_k[chain_j, x_{chain_j}]
        before = torch.cumsum(picked, 1) - picked  # row j pins chain[:j]
        return self._mix(post + before, theta)

    def log_joint(self, x: torch.Tensor) -> torch.Tensor:
        """``log mu(x)`` of full assignments ``x`` [B, n]: DoubleTensor[B]."""
        return torch.logsumexp(self._evidence(x, torch.ones_like(x, dtype=torch.bool)), -1)

    def sample(self, num: int, seed: int = 0) -> torch.Tensor:
        """``num`` exact draws (a component, then every coordinate): LongTensor[num, n]."""
        g = torch.Generator().manual_seed(seed)
        k = torch.multinomial(self.log_w.exp().cpu(), num, replacement=True, generator=g)
        probs = self.log_theta.exp().cpu()[k]  # [num, n, q]
        flat = torch.multinomial(probs.reshape(-1, self.num_values), 1, generator=g)
        return flat.reshape(num, self.num_coords)


class HandChain:
    """A binary Markov chain, stationary start, written by hand with ``log_marginals_at``
    only: what a user writes who has never heard of chain queries.

    ``P(x_t = v | pins) ∝ A_{t-l}[x_l, v] A_{r-t}[v, x_r]`` with ``l``, ``r`` the nearest
    pinned coordinates on either side and ``A_k[a, b] = (1 + lam^k (2 [a = b] - 1)) / 2``,
    ``lam = 2 stay - 1``; a missing side contributes nothing.

    Examples
    --------
    >>> chain = HandChain(8)
    >>> values, mask = torch.zeros(1, 8, dtype=torch.long), torch.zeros(1, 8, dtype=torch.bool)
    >>> chain.log_marginals_at(values, mask, torch.tensor([[3]])).exp()
    tensor([[[0.5000, 0.5000]]], dtype=torch.float64)
    """

    num_values = 2
    inference_safe = True

    def __init__(self, n: int, stay: float = 0.73, device: str | torch.device = "cpu"):
        self.num_coords = int(n)
        self.stay = float(stay)
        self.device = torch.device(device)

    def _factor(self, distance, pinned_value, exists, v):
        lam = 2.0 * self.stay - 1.0
        sign = torch.where(pinned_value == v, 1.0, -1.0).double()
        power = torch.pow(torch.tensor(lam, dtype=torch.float64), distance.double())
        return torch.where(exists, torch.log(0.5 * (1.0 + power * sign)), 0.0)

    def log_marginals_at(self, values, mask, targets):
        n = self.num_coords
        pos = torch.arange(n, device=values.device).expand_as(values)
        left = torch.cummax(torch.where(mask, pos, -1), 1).values  # last pin at or before
        right = torch.flip(torch.cummin(torch.flip(torch.where(mask, pos, n), [1]), 1).values, [1])
        lo = torch.where(targets > 0, left.gather(1, (targets - 1).clamp(min=0)), -1)
        hi = torch.where(targets < n - 1, right.gather(1, (targets + 1).clamp(max=n - 1)), n)
        x_lo = values.gather(1, lo.clamp(min=0))
        x_hi = values.gather(1, hi.clamp(max=n - 1))
        out = []
        for v in (0, 1):
            out.append(
                self._factor(targets - lo, x_lo, lo >= 0, v)
                + self._factor(hi - targets, x_hi, hi < n, v)
            )
        out = torch.stack(out, -1)
        return out - torch.logsumexp(out, -1, keepdim=True)

    def log_joint(self, x: torch.Tensor) -> torch.Tensor:
        """``log mu(x)`` of full assignments ``x`` [B, n]: DoubleTensor[B]."""
        same = (x[:, 1:] == x[:, :-1]).double()
        steps = same * math.log(self.stay) + (1 - same) * math.log(1 - self.stay)
        return math.log(0.5) + steps.sum(1)


class NoAdjacentZeros:
    """An imperfect network with a hard constraint, as a user might bolt one on: value 0 is
    impossible at a coordinate next to (index +- 1) a coordinate pinned to 0. Its rows are
    the network's renormalised over the allowed values; rows conditioned on a prefix that
    breaks the rule are still plain network rows (nothing flags them).

    Examples
    --------
    >>> net = NoAdjacentZeros(RandomNADE(4, 2, hidden=4, seed=0, chains=False))
    >>> values = torch.tensor([[0, 0, 1, 1]])
    >>> mask = torch.tensor([[True, False, False, False]])
    >>> net.log_marginals(values, mask)[0, 1, 0].item()
    -inf
    """

    inference_safe = True

    def __init__(self, net):
        self.net, self.num_coords, self.num_values = net, net.num_coords, net.num_values

    def log_marginals(self, values, mask):
        out = self.net.log_marginals(values, mask).clone()  # the network's float32
        zero = mask & (values == 0)
        banned = torch.nn.functional.pad(zero[:, :-1], (1, 0)) | torch.nn.functional.pad(
            zero[:, 1:], (0, 1)
        )
        out[..., 0] = torch.where(banned, -torch.inf, out[..., 0])
        return out.log_softmax(-1)

    def log_marginals_at(self, values, mask, targets):
        rows = self.log_marginals(values, mask)
        return rows.gather(1, targets.unsqueeze(-1).expand(-1, -1, self.num_values))


def chain_rule_log_prob(oracle, states: torch.Tensor, order) -> torch.Tensor:
    """``log q_sigma(x)`` of every state by the oracle's chain rule in ``order``, one targeted
    row per step (the sequential sampler's law): DoubleTensor[M]."""
    order = torch.as_tensor(order, dtype=torch.long)
    m, n = states.shape
    total = torch.zeros(m, dtype=torch.float64)
    mask = torch.zeros(m, n, dtype=torch.bool)
    for i in order.tolist():
        targets = torch.full((m, 1), i, dtype=torch.long)
        rows = oracle.log_marginals_at(states, mask, targets)[:, 0].double()
        rows = rows - torch.logsumexp(rows, -1, keepdim=True)
        total += rows.gather(1, states[:, i : i + 1])[:, 0]
        mask[:, i] = True
    return total
