"""Models ``model_0`` to ``model_6`` of Pyro's ``examples/hmm.py`` (Apache-2.0), verbatim but
for what a test needs (noted where it is).

Shared by the handler tests (``tests/infer/test_handlers.py``, checked against brute force), the
sweep of Pyro's own models (``tests/infer/_pyro_suite_models.py``) and the Pyro-models benchmark
(``benchmarks/pyro_models.py``), so they all run the code Pyro users run.
"""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import torch
import torch.nn as nn
from pyro import poutine
from pyro.ops.indexing import Vindex
from torch.distributions import constraints

__all__ = ["model_0", "model_1", "model_2", "model_3", "model_4", "model_5", "model_6"]


def model_1(sequences, lengths, args, batch_size=None, include_prior=True):
    num_sequences, max_length, data_dim = map(int, sequences.shape)
    with poutine.mask(mask=include_prior):
        probs_x = pyro.sample(
            "probs_x", dist.Dirichlet(0.9 * torch.eye(args.hidden_dim) + 0.1).to_event(1)
        )
        probs_y = pyro.sample(
            "probs_y", dist.Beta(0.1, 0.9).expand([args.hidden_dim, data_dim]).to_event(2)
        )
    tones_plate = pyro.plate("tones", data_dim, dim=-1)
    with pyro.plate("sequences", num_sequences, batch_size, dim=-2) as batch:
        lengths = lengths[batch]
        x = 0
        for t in pyro.markov(range(max_length if args.jit else lengths.max())):
            with poutine.mask(mask=(t < lengths).unsqueeze(-1)):
                x = pyro.sample(
                    f"x_{t}", dist.Categorical(probs_x[x]), infer={"enumerate": "parallel"}
                )
                with tones_plate:
                    pyro.sample(
                        f"y_{t}",
                        dist.Bernoulli(probs_y[x.squeeze(-1)]),
                        obs=sequences[batch, t],
                    )


def model_2(sequences, lengths, args, batch_size=None, include_prior=True):
    num_sequences, max_length, data_dim = map(int, sequences.shape)
    with poutine.mask(mask=include_prior):
        probs_x = pyro.sample(
            "probs_x", dist.Dirichlet(0.9 * torch.eye(args.hidden_dim) + 0.1).to_event(1)
        )
        probs_y = pyro.sample(
            "probs_y", dist.Beta(0.1, 0.9).expand([args.hidden_dim, 2, data_dim]).to_event(3)
        )
    tones_plate = pyro.plate("tones", data_dim, dim=-1)
    with pyro.plate("sequences", num_sequences, batch_size, dim=-2) as batch:
        lengths = lengths[batch]
        x, y = 0, 0
        for t in pyro.markov(range(max_length if args.jit else lengths.max())):
            with poutine.mask(mask=(t < lengths).unsqueeze(-1)):
                x = pyro.sample(
                    f"x_{t}", dist.Categorical(probs_x[x]), infer={"enumerate": "parallel"}
                )
                with tones_plate as tones:
                    y = pyro.sample(
                        f"y_{t}",
                        dist.Bernoulli(probs_y[x, y, tones]),
                        obs=sequences[batch, t],
                    ).long()


def model_3(sequences, lengths, args, batch_size=None, include_prior=True):
    num_sequences, max_length, data_dim = map(int, sequences.shape)
    hidden_dim = int(args.hidden_dim**0.5)  # split between w and x
    with poutine.mask(mask=include_prior):
        probs_w = pyro.sample(
            "probs_w", dist.Dirichlet(0.9 * torch.eye(hidden_dim) + 0.1).to_event(1)
        )
        probs_x = pyro.sample(
            "probs_x", dist.Dirichlet(0.9 * torch.eye(hidden_dim) + 0.1).to_event(1)
        )
        probs_y = pyro.sample(
            "probs_y",
            dist.Beta(0.1, 0.9).expand([hidden_dim, hidden_dim, data_dim]).to_event(3),
        )
    tones_plate = pyro.plate("tones", data_dim, dim=-1)
    with pyro.plate("sequences", num_sequences, batch_size, dim=-2) as batch:
        lengths = lengths[batch]
        w, x = 0, 0
        for t in pyro.markov(range(max_length if args.jit else lengths.max())):
            with poutine.mask(mask=(t < lengths).unsqueeze(-1)):
                w = pyro.sample(
                    f"w_{t}", dist.Categorical(probs_w[w]), infer={"enumerate": "parallel"}
                )
                x = pyro.sample(
                    f"x_{t}", dist.Categorical(probs_x[x]), infer={"enumerate": "parallel"}
                )
                with tones_plate as tones:
                    pyro.sample(
                        f"y_{t}",
                        dist.Bernoulli(probs_y[w, x, tones]),
                        obs=sequences[batch, t],
                    )


def model_0(sequences, lengths, args, batch_size=None, include_prior=True):
    assert not torch._C._get_tracing_state()
    num_sequences, max_length, data_dim = sequences.shape
    with poutine.mask(mask=include_prior):
        probs_x = pyro.sample(
            "probs_x", dist.Dirichlet(0.9 * torch.eye(args.hidden_dim) + 0.1).to_event(1)
        )
        probs_y = pyro.sample(
            "probs_y", dist.Beta(0.1, 0.9).expand([args.hidden_dim, data_dim]).to_event(2)
        )
    tones_plate = pyro.plate("tones", data_dim, dim=-1)
    for i in pyro.plate("sequences", len(sequences), batch_size):
        length = lengths[i]
        sequence = sequences[i, :length]
        x = 0
        for t in pyro.markov(range(length)):
            x = pyro.sample(
                f"x_{i}_{t}", dist.Categorical(probs_x[x]), infer={"enumerate": "parallel"}
            )
            with tones_plate:
                pyro.sample(
                    f"y_{i}_{t}",
                    dist.Bernoulli(probs_y[x.squeeze(-1)]),
                    obs=sequence[t],
                )


def model_4(sequences, lengths, args, batch_size=None, include_prior=True):
    num_sequences, max_length, data_dim = map(int, sequences.shape)
    assert lengths.shape == (num_sequences,)
    assert lengths.max() <= max_length
    hidden_dim = int(args.hidden_dim**0.5)  # split between w and x
    with poutine.mask(mask=include_prior):
        probs_w = pyro.sample(
            "probs_w", dist.Dirichlet(0.9 * torch.eye(hidden_dim) + 0.1).to_event(1)
        )
        probs_x = pyro.sample(
            "probs_x",
            dist.Dirichlet(0.9 * torch.eye(hidden_dim) + 0.1).expand_by([hidden_dim]).to_event(2),
        )
        probs_y = pyro.sample(
            "probs_y",
            dist.Beta(0.1, 0.9).expand([hidden_dim, hidden_dim, data_dim]).to_event(3),
        )
    tones_plate = pyro.plate("tones", data_dim, dim=-1)
    with pyro.plate("sequences", num_sequences, batch_size, dim=-2) as batch:
        lengths = lengths[batch]
        w = x = torch.tensor(0, dtype=torch.long)
        for t in pyro.markov(range(max_length if args.jit else lengths.max())):
            with poutine.mask(mask=(t < lengths).unsqueeze(-1)):
                w = pyro.sample(
                    f"w_{t}", dist.Categorical(probs_w[w]), infer={"enumerate": "parallel"}
                )
                x = pyro.sample(
                    f"x_{t}",
                    dist.Categorical(Vindex(probs_x)[w, x]),
                    infer={"enumerate": "parallel"},
                )
                with tones_plate as tones:
                    pyro.sample(
                        f"y_{t}",
                        dist.Bernoulli(probs_y[w, x, tones]),
                        obs=sequences[batch, t],
                    )


class TonesGenerator(nn.Module):
    def __init__(self, args, data_dim):
        self.args = args
        self.data_dim = data_dim
        super().__init__()
        self.x_to_hidden = nn.Linear(args.hidden_dim, args.nn_dim)
        self.y_to_hidden = nn.Linear(args.nn_channels * data_dim, args.nn_dim)
        self.conv = nn.Conv1d(1, args.nn_channels, 3, padding=1)
        self.hidden_to_logits = nn.Linear(args.nn_dim, data_dim)
        self.relu = nn.ReLU()

    def forward(self, x, y):
        x_onehot = y.new_zeros(x.shape[:-1] + (self.args.hidden_dim,)).scatter_(-1, x, 1)
        y_conv = self.relu(self.conv(y.reshape(-1, 1, self.data_dim))).reshape(y.shape[:-1] + (-1,))
        h = self.relu(self.x_to_hidden(x_onehot) + self.y_to_hidden(y_conv))
        return self.hidden_to_logits(h)


_tones_generators: dict = {}


def model_5(sequences, lengths, args, batch_size=None, include_prior=True):
    num_sequences, max_length, data_dim = map(int, sequences.shape)
    assert lengths.shape == (num_sequences,)
    assert lengths.max() <= max_length
    # examples/hmm.py keeps one global instance; here one per data_dim, seeded
    if data_dim not in _tones_generators:
        with torch.random.fork_rng():
            torch.manual_seed(0)
            _tones_generators[data_dim] = TonesGenerator(args, data_dim)
    tones_generator = _tones_generators[data_dim]
    pyro.module("tones_generator", tones_generator)
    with poutine.mask(mask=include_prior):
        probs_x = pyro.sample(
            "probs_x", dist.Dirichlet(0.9 * torch.eye(args.hidden_dim) + 0.1).to_event(1)
        )
    with pyro.plate("sequences", num_sequences, batch_size, dim=-2) as batch:
        lengths = lengths[batch]
        x = 0
        y = torch.zeros(data_dim)
        for t in pyro.markov(range(max_length if args.jit else lengths.max())):
            with poutine.mask(mask=(t < lengths).unsqueeze(-1)):
                x = pyro.sample(
                    f"x_{t}", dist.Categorical(probs_x[x]), infer={"enumerate": "parallel"}
                )
                with pyro.plate(f"tones_{t}", data_dim, dim=-1):
                    y = pyro.sample(
                        f"y_{t}",
                        dist.Bernoulli(logits=tones_generator(x, y)),
                        obs=sequences[batch, t],
                    )


def model_6(sequences, lengths, args, batch_size=None, include_prior=False):
    num_sequences, max_length, data_dim = sequences.shape
    assert lengths.shape == (num_sequences,)
    assert lengths.max() <= max_length
    hidden_dim = args.hidden_dim
    if not args.raftery_parameterization:
        probs_x = pyro.param(
            "probs_x",
            torch.rand(hidden_dim, hidden_dim, hidden_dim),
            constraint=constraints.simplex,
        )
    else:
        probs_x1 = pyro.param(
            "probs_x1", torch.rand(hidden_dim, hidden_dim), constraint=constraints.simplex
        )
        probs_x2 = pyro.param(
            "probs_x2", torch.rand(hidden_dim, hidden_dim), constraint=constraints.simplex
        )
        mix_lambda = pyro.param(
            "mix_lambda", torch.tensor(0.5), constraint=constraints.unit_interval
        )
        probs_x = mix_lambda * probs_x1 + (1.0 - mix_lambda) * probs_x2.unsqueeze(-2)
    probs_y = pyro.param(
        "probs_y", torch.rand(hidden_dim, data_dim), constraint=constraints.unit_interval
    )
    tones_plate = pyro.plate("tones", data_dim, dim=-1)
    with pyro.plate("sequences", num_sequences, batch_size, dim=-2) as batch:
        lengths = lengths[batch]
        x_curr, x_prev = torch.tensor(0), torch.tensor(0)
        for t in pyro.markov(range(lengths.max()), history=2):
            with poutine.mask(mask=(t < lengths).unsqueeze(-1)):
                probs_x_t = Vindex(probs_x)[x_prev, x_curr]
                x_prev, x_curr = (
                    x_curr,
                    pyro.sample(
                        f"x_{t}", dist.Categorical(probs_x_t), infer={"enumerate": "parallel"}
                    ),
                )
                with tones_plate:
                    probs_y_t = probs_y[x_curr.squeeze(-1)]
                    pyro.sample(f"y_{t}", dist.Bernoulli(probs_y_t), obs=sequences[batch, t])
