"""Counter-based randomness keyed by (seed, draw, block, thread).

Every random number the samplers use is a pure function of a 64-bit *key* and a counter, never
of a generator's position in a stream. A draw, a block and a thread have keys derived from
their parents' by hashing, so the output of a run depends only on the seed and the oracle:
not on which draws share a batch, how rounds are chunked, the rows-per-round cap, the thread
schedule, the device, or how many processes share the work. Both engines (``"fast"`` and
``"reference"``) derive the same keys and read the same numbers, so they agree draw for draw.

The hash is SplitMix64 [1]_: ``bits(key, i) = fmix64(key + (i + 1) * gamma)`` (the ``i``-th
output of a SplitMix64 generator seeded with ``key``) and ``stream(key, tag) = key ^ c_tag``
separates purposes (a bijection of the key: streams of one key start far apart in the
SplitMix64 sequence). Keys of children are outputs of their parent's stream:
``child(key, tag, i) = bits(stream(key, tag), i)``. Keys are themselves outputs of ``fmix64``,
so every derived number goes through at least one full avalanche. The arithmetic runs on int64
tensors with wrapping multiplication and logical shifts, identically on every device.

Uniforms are ``((bits >> 11) + 0.5) / 2^53``: 53 random bits, strictly inside (0, 1), so
``log(u)`` and ``log(-log(u))`` are always finite. Gumbel noise is ``-log(-log(u))`` and
normal noise ``ndtri(u)``, both in float64.

References
----------
.. [1] G. L. Steele, D. Lea, C. H. Flood. Fast splittable pseudorandom number generators.
   OOPSLA 2014.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = [
    "SEED_LIMIT",
    "Tag",
    "bits",
    "check_seed",
    "child",
    "derive_seed",
    "draw_keys",
    "gumbel",
    "host_bits",
    "host_child",
    "host_gumbel",
    "host_log_uniform",
    "host_normal",
    "host_uniform",
    "int_bits",
    "int_child",
    "int_uniform",
    "log",
    "normal",
    "seed_key",
    "seed_value",
    "signed",
    "stream",
    "uniform",
]

_GAMMA = -7046029254386353131  # 0x9E3779B97F4A7C15 as a signed int64
_M1 = -4658895280553007687  # 0xBF58476D1CE4E5B9
_M2 = -7723592293110705685  # 0x94D049BB133111EB

#: Largest number of keyed noise entries a sampler's lockstep loop draws in one call (the noise
#: of many steps at once: fewer calls, bounded memory, the same numbers).
NOISE_ENTRIES = 1 << 21


class Tag:
    """Purposes of derived keys and streams (distinct constants, so streams never overlap)."""

    DRAW = 0x1D2A3F4B5C6D7E8F  # key of draw s: child(seed, DRAW, s)
    LEAF = 0x2B3C4D5E6F708192  # key of the block starting at position a: child(draw, LEAF, a)
    THREAD = 0x3C4D5E6F708192A3  # key of residual try i of a block: child(block, THREAD, i)
    CHILD = 0x4D5E6F708192A3B4  # left (0) and right (1) half of a try: child(try, CHILD, side)
    ORDER = 0x5E6F708192A3B4C5  # random visiting order of a draw
    DRAFT = 0x6F708192A3B4C5D6  # draft noise of a block (and the draw of a one-coordinate block)
    ACCEPT = 0x708192A3B4C5D6E7  # acceptance uniforms
    RESAMPLE = 0x8192A3B4C5D6E7F8  # resampling after a token-level rejection
    NOISE = 0x12A3B4C5D6E7F809  # fixed per-draw noise (AGR24's Gumbels, Picard's increments)


def _shr(x: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 bit patterns."""
    return (x >> k) & ((1 << (64 - k)) - 1)


_U30, _U27, _U31 = np.uint64(30), np.uint64(27), np.uint64(31)
_UM1, _UM2 = np.uint64(_M1 & (2**64 - 1)), np.uint64(_M2 & (2**64 - 1))
_UGAMMA, _U1 = np.uint64(_GAMMA & (2**64 - 1)), np.uint64(1)


def _fmix_torch(x: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finaliser on int64 bit patterns, in torch (any device)."""
    x = (x ^ _shr(x, 30)).mul_(_M1)
    x = (x ^ _shr(x, 27)).mul_(_M2)
    return x.bitwise_xor_(_shr(x, 31))


def _fmix_numpy(u: np.ndarray) -> np.ndarray:
    """The same finaliser on a uint64 array, in place (NumPy wraps and shifts logically)."""
    u ^= u >> _U30
    u *= _UM1
    u ^= u >> _U27
    u *= _UM2
    u ^= u >> _U31
    return u


def _fmix(x: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finaliser on int64 bit patterns (a new tensor).

    On a CPU the same arithmetic runs in NumPy's uint64: the same bits at a fraction of the
    dispatch cost of eleven small torch operations (a test checks the two agree).
    """
    if x.device.type == "cpu":
        return torch.from_numpy(_fmix_numpy(x.numpy().astype(np.uint64)).view(np.int64))
    return _fmix_torch(x)


def signed(value: int) -> int:
    """``value`` modulo ``2**64`` as a signed 64-bit int (what an int64 tensor holds)."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


def stream(key: torch.Tensor, tag: int | torch.Tensor) -> torch.Tensor:
    """The key of purpose ``tag`` (an int, or a LongTensor of tags) under ``key`` (broadcast)."""
    return key ^ (tag if isinstance(tag, torch.Tensor) else signed(tag))


def bits(key: torch.Tensor, counter: torch.Tensor | int) -> torch.Tensor:
    """64 pseudo-random bits (as int64) for every ``(key, counter)`` pair (broadcast)."""
    if key.device.type == "cpu":
        c = counter.numpy() if isinstance(counter, torch.Tensor) else counter
        return torch.from_numpy(host_bits(key.numpy(), c))
    return _fmix_torch(key + (torch.as_tensor(counter, device=key.device) + 1) * _GAMMA)


def child(key: torch.Tensor, tag: int | torch.Tensor, index: torch.Tensor | int) -> torch.Tensor:
    """Key of child ``index`` of purpose ``tag`` (broadcast over ``key``, ``tag`` and ``index``)."""
    return bits(stream(key, tag), index)


#: Int seeds are the integers in ``[0, SEED_LIMIT)``: the 64-bit keys, one per seed.
SEED_LIMIT = 1 << 64


def check_seed(seed: Any) -> int | None | torch.Generator | np.random.Generator:
    """The one check of a user's seed, shared by every entry point.

    ``AutoSpec``, ``AutoSpecKernel``, ``sample_any_order``, ``sample_diffusion`` and
    ``sample_sde`` all accept the same seeds: ``None`` (a fresh seed from torch's global
    generator, so ``torch.manual_seed`` and ``pyro.set_rng_seed`` repeat the run), a
    :class:`torch.Generator`, a :class:`numpy.random.Generator`, or an int (Python or NumPy,
    not a bool) in ``[0, 2**64)``: every such int is its own 64-bit key, so two different
    seeds never give the same run. Anything else raises; nothing is reduced modulo ``2**64``.

    Returns
    -------
    The seed, an int as a Python ``int``.

    Raises
    ------
    TypeError
        For a value that is not an int, a generator or None (a bool or a float included).
    ValueError
        For an int outside ``[0, 2**64)``.

    Examples
    --------
    >>> check_seed(2**64 - 1) == 2**64 - 1
    True
    >>> check_seed(-1)
    Traceback (most recent call last):
    ...
    ValueError: seed must be an int in [0, 2**64), a torch.Generator, a numpy.random.Generator ...
    """
    if seed is None or isinstance(seed, (torch.Generator, np.random.Generator)):
        return seed
    shown = repr(seed)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    message = (
        "seed must be an int in [0, 2**64), a torch.Generator, a numpy.random.Generator or "
        f"None; got {shown} ({type(seed).__name__})"
    )
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
        raise TypeError(message)
    if not 0 <= int(seed) < SEED_LIMIT:
        raise ValueError(message)
    return int(seed)


def derive_seed(seed: int, index: int) -> int:
    """Seed number ``index`` (an int in ``[0, 2**64)``) derived from a checked int ``seed``:
    an int in ``[0, 2**63)``.

    A hash of the pair (SplitMix64), for streams a run needs beside its own (another stage,
    a worker process): no arithmetic modulo a power of two, so nearby seeds and indices give
    unrelated seeds.

    Examples
    --------
    >>> derive_seed(0, 1) == derive_seed(0, 1) != derive_seed(0, 2)
    True
    """
    key = torch.tensor(seed_key(seed), dtype=torch.int64)
    return int(bits(key, signed(check_seed(int(index)))).item()) & ((1 << 63) - 1)


def seed_value(seed: int | None | torch.Generator | np.random.Generator) -> int:
    """The int seed a run uses: ``seed`` itself (checked), or an int in ``[0, 2**62)`` drawn
    from a generator, or from torch's global generator for ``None`` (advanced once, so
    ``torch.manual_seed`` repeats the run). A run records it: ``seed=`` that int repeats the
    run.

    Examples
    --------
    >>> seed_value(7)
    7
    >>> generator = torch.Generator().manual_seed(0)
    >>> seed_value(generator) == seed_value(torch.Generator().manual_seed(0))
    True
    """
    seed = check_seed(seed)
    if isinstance(seed, int):
        return seed
    if isinstance(seed, np.random.Generator):
        return int(seed.integers(0, 2**62))
    device = "cpu" if seed is None else seed.device  # None: the CPU's, what manual_seed sets
    return int(torch.randint(0, 2**62, (), generator=seed, device=device).item())


def seed_key(seed: int | None | torch.Generator | np.random.Generator) -> int:
    """The root key of a run from a seed: the key of :func:`seed_value`'s int (so a run's
    recorded seed gives its key again).

    Examples
    --------
    >>> seed_key(0) == seed_key(0) != seed_key(1)
    True
    """
    value = seed_value(seed)
    return int(_fmix(torch.tensor(signed(value) ^ 0x5DEECE66D, dtype=torch.int64)).item())


def draw_keys(root: int, draw_ids: torch.Tensor) -> torch.Tensor:
    """Keys of the draws ``draw_ids`` (LongTensor[D], global draw numbers) of a run.

    A draw's key depends on the run's root key and its number only, so any subset of a run's
    draws, computed anywhere (another batch, process or device), reproduces those draws.
    """
    return child(torch.tensor(root, dtype=torch.long, device=draw_ids.device), Tag.DRAW, draw_ids)


def _unit(b: torch.Tensor) -> torch.Tensor:
    return (_shr(b, 11).to(torch.float64) + 0.5) * (1.0 / (1 << 53))


def uniform(key: torch.Tensor, tag: int, counter: torch.Tensor | int) -> torch.Tensor:
    """Uniforms in (0, 1), float64, for ``(stream(key, tag), counter)`` (broadcast)."""
    if key.device.type == "cpu":
        c = counter.numpy() if isinstance(counter, torch.Tensor) else counter
        return torch.from_numpy(host_uniform(key.numpy(), tag, c))
    return _unit(bits(stream(key, tag), counter))


def log(x: torch.Tensor) -> torch.Tensor:
    """``log(x)`` of float64 numbers derived from keys (uniforms): NumPy's on a CPU, where the
    host control plane computes them (:func:`host_log_uniform`), torch's elsewhere, so that
    every engine on one machine reads the same bits."""
    if x.device.type == "cpu" and not x.requires_grad:
        return torch.from_numpy(np.asarray(np.log(x.numpy())))
    return torch.log(x)


def gumbel(key: torch.Tensor, tag: int, counter: torch.Tensor | int) -> torch.Tensor:
    """Standard Gumbel noise ``-log(-log(u))`` in float64 (broadcast)."""
    if key.device.type == "cpu":
        c = counter.numpy() if isinstance(counter, torch.Tensor) else counter
        return torch.from_numpy(host_gumbel(key.numpy(), tag, c))
    return -torch.log(-torch.log(uniform(key, tag, counter)))


# -- the same numbers on host arrays (the host control plane) ----------------------------------
def host_bits(key: np.ndarray, counter: np.ndarray | int) -> np.ndarray:
    """:func:`bits` on NumPy int64 arrays (broadcast): the same bits."""
    key = np.asarray(key, dtype=np.int64)
    counter = np.asarray(counter, dtype=np.int64)
    # on arrays of at least one dimension, uint64 arithmetic wraps without a warning (NumPy
    # warns on overflowing scalars only), so no error-state context is needed
    u = (
        np.atleast_1d(key).astype(np.uint64)
        + (np.atleast_1d(counter).astype(np.uint64) + _U1) * _UGAMMA
    )
    shape = u.shape if key.ndim or counter.ndim else ()
    return _fmix_numpy(np.ascontiguousarray(u)).view(np.int64).reshape(shape)


_MASK64 = (1 << 64) - 1


def int_bits(key: int, counter: int) -> int:
    """:func:`bits` of one ``(key, counter)`` pair in Python integers: the same bits (as a
    signed int64 value), without an array. The reference engine derives its keys with it.

    Examples
    --------
    >>> key = seed_key(7)
    >>> int_bits(key, 3) == int(host_bits(np.int64(key), 3))
    True
    """
    u = (key + (counter + 1) * _GAMMA) & _MASK64
    u = ((u ^ (u >> 30)) * _M1) & _MASK64
    u = ((u ^ (u >> 27)) * _M2) & _MASK64
    return signed(u ^ (u >> 31))


def int_child(key: int, tag: int, index: int) -> int:
    """:func:`child` of one key in Python integers."""
    return int_bits(key ^ signed(tag), index)


def int_uniform(key: int, tag: int, counter: int) -> float:
    """:func:`uniform` of one ``(key, counter)`` pair: the same float64 (the conversion
    ``((bits >> 11) + 0.5) / 2^53`` is exact in any float64 arithmetic)."""
    b = int_bits(key ^ signed(tag), counter) & _MASK64
    return ((b >> 11) + 0.5) * (1.0 / (1 << 53))


def host_child(key: np.ndarray, tag: int, index: np.ndarray | int) -> np.ndarray:
    """:func:`child` on NumPy int64 arrays (broadcast)."""
    return host_bits(np.asarray(key, dtype=np.int64) ^ np.int64(signed(tag)), index)


def host_uniform(key: np.ndarray, tag: int, counter: np.ndarray | int) -> np.ndarray:
    """:func:`uniform` on NumPy int64 arrays: float64 uniforms in (0, 1)."""
    b = host_bits(np.asarray(key, dtype=np.int64) ^ np.int64(signed(tag)), counter)
    u = ((b.view(np.uint64) >> np.uint64(11)).astype(np.float64) + 0.5) * (1.0 / (1 << 53))
    return np.asarray(u)


def host_log_uniform(key: np.ndarray, tag: int, counter: np.ndarray | int) -> np.ndarray:
    """``log`` of :func:`host_uniform` (what :func:`log` gives for :func:`uniform` on a CPU)."""
    return np.asarray(np.log(host_uniform(key, tag, counter)))


def host_gumbel(key: np.ndarray, tag: int, counter: np.ndarray | int) -> np.ndarray:
    """:func:`gumbel` on NumPy int64 arrays: ``-log(-log(u))``, float64."""
    return np.asarray(-np.log(-np.log(host_uniform(key, tag, counter))))


def host_normal(key: np.ndarray, tag: int, counter: np.ndarray | int) -> np.ndarray:
    """:func:`normal` on NumPy int64 arrays: ``ndtri(u)`` in float64 (torch's ``ndtri`` on the
    host's uniforms, what :func:`normal` gives on a CPU)."""
    return torch.special.ndtri(torch.from_numpy(host_uniform(key, tag, counter))).numpy()


def normal(key: torch.Tensor, tag: int, counter: torch.Tensor | int) -> torch.Tensor:
    """Standard normal noise ``ndtri(u)`` in float64 (broadcast)."""
    return torch.special.ndtri(uniform(key, tag, counter))
