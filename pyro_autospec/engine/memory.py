"""Refusing, before anything of its size is allocated, a run this machine cannot hold.

A sampler keeps some bytes for every draw until the run ends (its outputs: the samples, and
the whole paths of a diffusion where they are kept) and more for each draw in flight (its
order and partial sample, or its windows of steps). :func:`check_memory` adds them up against
the machine's physical memory, and the entries of the largest array against what a torch
tensor indexes, and raises a :class:`MemoryError` that says what the run needs, what fits and
which argument to lower, where NumPy's or torch's own error, or the kernel's OOM killer, says
neither. :func:`check_output_size` is its form for the ``[N, n]`` outputs of
:func:`~pyro_autospec.engine.any_order.sample_any_order`; the diffusions describe their own
(:func:`~pyro_autospec.engine.diffusion.sample_sde`).

This module does not import Pyro.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["Footprint", "check_memory", "check_output_size", "format_bytes", "machine_memory"]

#: The largest number of entries a torch tensor indexes (int64 element offsets).
MAX_ENTRIES = 2**62

#: What to do when the outputs fit but the draws in flight beside them do not.
FLIGHT_ADVICE = (
    "Most of it is the state of the draws in flight: set max_concurrent_draws (e.g. 256) so "
    "that new draws start as earlier ones finish."
)


def machine_memory() -> int | None:
    """Bytes of physical memory of this machine (``None`` where the OS does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def format_bytes(count: float) -> str:
    """``count`` bytes in binary units, to three significant digits.

    Examples
    --------
    >>> format_bytes(512), format_bytes(3 * 2**30), format_bytes(2**60)
    ('512 B', '3 GiB', '1.02e+03 PiB')
    """
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if count < 1024 or unit == "PiB":
            return f"{count:.3g} {unit}" if unit != "B" else f"{int(count)} B"
        count /= 1024
    return f"{count:.3g} PiB"  # pragma: no cover


@dataclass(frozen=True)
class Footprint:
    """The bytes and entries a run holds, which :func:`check_memory` weighs.

    ``num_samples`` draws keep ``bytes_per_draw`` bytes each until the run ends, and each of
    the ``in_flight`` draws in flight holds ``bytes_per_flight`` more; the run's largest array
    has ``largest`` entries.

    Attributes
    ----------
    num_samples, bytes_per_draw : int
        The draws of the run and the bytes each keeps to the end (its outputs).
    in_flight, bytes_per_flight : int
        The draws in flight at once and the bytes each holds while in flight.
    largest : int
        Entries of the run's largest array.
    """

    num_samples: int
    bytes_per_draw: int
    in_flight: int = 0
    bytes_per_flight: int = 0
    largest: int = 0


def check_memory(
    footprint: Footprint,
    *,
    request: str,
    holds: str,
    exact: bool = True,
    also: str = "",
) -> None:
    """Refuse, before allocating anything, a run that cannot fit in this machine's memory.

    The draws' outputs and the draws in flight of ``footprint`` together must fit in the
    machine's physical memory, and its largest array's entries in a torch tensor.

    Parameters
    ----------
    footprint : Footprint
        The draws, the bytes each keeps and holds in flight, and the largest array's entries.
    request : str
        What was asked, the subject of the message: ``"num_samples=10 draws of n=4
        coordinates"``.
    holds : str
        What the bytes are, for the message.
    exact : bool
        Whether the draws are exact, which the advice to split the run into calls says.
    also : str
        Advice added when the outputs themselves do not fit (an argument that keeps less).
        When only the draws in flight do not fit, the advice is :data:`FLIGHT_ADVICE`.

    Raises
    ------
    MemoryError
        Naming the request, the bytes it needs, the machine's memory, about how many draws
        fit in half of it, and the argument to lower.

    Examples
    --------
    >>> check_memory(Footprint(1000, 64), request="num_samples=1000 draws", holds="the samples")
    >>> check_memory(
    ...     Footprint(10**15, 64), request="num_samples=10**15 draws", holds="the samples"
    ... )
    Traceback (most recent call last):
    ...
    MemoryError: num_samples=10**15 draws need 56.8 PiB (the samples); this machine has ...
    """
    num_samples, bytes_per_draw = int(footprint.num_samples), int(footprint.bytes_per_draw)
    output = num_samples * bytes_per_draw
    flight = int(footprint.in_flight) * int(footprint.bytes_per_flight)
    needed = output + flight
    memory = machine_memory()
    too_many = int(footprint.largest) > MAX_ENTRIES
    if not too_many and (memory is None or needed <= memory):
        return
    limit = (
        "more entries than a torch tensor can hold"
        if too_many
        else f"this machine has {format_bytes(memory)} of memory"
    )
    if not too_many and memory is not None and output <= memory:
        advice = FLIGHT_ADVICE
    else:
        fits = max(1, (memory or 2**40) // 2 // max(1, bytes_per_draw))
        calls = "exact and independent" if exact else "independent"
        advice = (
            f"Ask for fewer draws per call (about {fits} fit in half of this machine's memory) "
            f"and run several calls with different seeds: the draws of every call are {calls}."
        )
        if also:
            advice += f" {also}"
        if flight > output:
            advice += " Set max_concurrent_draws (e.g. 256) too, to bound the draws in flight."
    raise MemoryError(f"{request} need {format_bytes(needed)} ({holds}); {limit}. {advice}")


def check_output_size(
    num_samples: int,
    n: int,
    *,
    in_flight: int = 0,
    bytes_per_flight: int = 0,
    what: str = "the samples",
) -> None:
    """Refuse, before allocating anything, a run whose outputs cannot exist on this machine.

    ``num_samples`` rows of ``n`` int64 entries (the samples, or the orders), 64 bytes per
    draw of bookkeeping (keys, log probabilities, counts), and ``bytes_per_flight`` bytes per
    coordinate of each of ``in_flight`` draws in flight, against torch's largest tensor and the
    machine's physical memory (:func:`check_memory`).

    Raises
    ------
    MemoryError
        Naming ``num_samples``, ``n``, the bytes needed and what to do instead.

    Examples
    --------
    >>> check_output_size(1000, 1024)  # 8 MB: fine
    >>> check_output_size(10**12, 1024)
    Traceback (most recent call last):
    ...
    MemoryError: num_samples=1000000000000 draws of n=1024 coordinates need 7.33 PiB ...
    """
    num_samples, n = int(num_samples), int(n)
    holds = f"{what}: {num_samples} x {n} int64 entries, plus the state of the draws in flight"
    check_memory(
        Footprint(
            num_samples,
            8 * n + 64,
            in_flight=in_flight,
            bytes_per_flight=n * int(bytes_per_flight),
            largest=num_samples * n,
        ),
        request=f"num_samples={num_samples} draws of n={n} coordinates",
        holds=holds,
    )
