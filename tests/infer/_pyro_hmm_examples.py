"""Models ``model_1``, ``model_2`` and ``model_3`` of Pyro's ``examples/hmm.py``, verbatim.

Shared by the handler tests (``tests/infer/test_handlers.py``, checked against brute force) and
the Pyro-models benchmark (``benchmarks/pyro_models.py``), so both run the code Pyro users run.
"""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import torch
from pyro import poutine

__all__ = ["model_1", "model_2", "model_3"]


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
