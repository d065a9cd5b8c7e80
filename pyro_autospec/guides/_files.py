"""Guide files: saved as plain data, loaded without running code from the file.

``torch.load(weights_only=False)`` unpickles arbitrary objects, so loading a guide file
someone sent could run any code it carries. Guides are saved as dicts, lists, tensors, str,
int, float, bool and None only, and loaded with ``weights_only=True``, which refuses
anything else before it is built.

A file also carries a SHA-256 checksum of everything else in it (:func:`checksum`), written
by :func:`save_plain` and checked by :func:`load_plain`: torch's zip reader does not check
its own CRCs, so without it a byte changed inside the weights would load as another network.
A file without the entry is refused too: deleting it would otherwise turn the check off.
"""

from __future__ import annotations

import hashlib
import numbers
import pickle
import re
import struct
import warnings
from typing import Any

import torch
from torch import nn

from pyro_autospec._warnings import user_stacklevel

__all__ = ["checksum", "load_plain", "match_dtypes", "not_a_guide", "plain", "save_plain"]

#: The entry of a guide file that holds its :func:`checksum`.
CHECKSUM_KEY = "checksum"


def plain(value: Any) -> Any:
    """``value`` with NumPy scalars as Python numbers and tuples as lists (recursively).

    Examples
    --------
    >>> import numpy as np
    >>> plain({"a": (np.int64(2), np.float32(0.5)), "b": None})
    {'a': [2, 0.5], 'b': None}
    """
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if value is None or isinstance(value, (bool, str, torch.Tensor)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if hasattr(value, "item") and callable(value.item):  # a NumPy scalar
        return plain(value.item())
    raise TypeError(f"cannot save {type(value).__name__} in a guide file (plain data only)")


def _digest(value: Any, sha: Any) -> None:
    """Feed ``value`` to ``sha`` in a canonical encoding: every item tagged and sized, dict
    keys sorted, tensors as dtype, shape and their elements' bytes in C order."""
    if isinstance(value, dict):
        sha.update(b"d%d;" % len(value))
        for key in sorted(value, key=str):
            _digest(str(key), sha)
            _digest(value[key], sha)
    elif isinstance(value, (list, tuple)):
        sha.update(b"l%d;" % len(value))
        for item in value:
            _digest(item, sha)
    elif isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().contiguous().reshape(-1)
        data = tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b""
        head = f"t{value.dtype};{tuple(value.shape)};{len(data)};".encode()
        sha.update(head + data)
    elif isinstance(value, str):
        data = value.encode("utf-8")
        sha.update(b"s%d;" % len(data) + data)
    elif value is None:
        sha.update(b"n;")
    elif isinstance(value, bool):
        sha.update(b"b1;" if value else b"b0;")
    elif isinstance(value, int):
        sha.update(b"i%d;" % value)
    elif isinstance(value, float):
        sha.update(b"f" + struct.pack("<d", value))
    else:
        raise TypeError(f"a guide file holds no {type(value).__name__}")


def checksum(content: dict) -> str:
    """``"sha256:<hex>"`` over every entry of a guide file but the checksum itself.

    The digest covers the config, the weights (each tensor's name, dtype, shape and bytes),
    the edges and the loss history, in a fixed order, so that it is the same on every
    machine and after ``torch.load(map_location=...)``.

    Examples
    --------
    >>> import torch
    >>> a = checksum({"config": {"n": 2}, "state_dict": {"w": torch.ones(2)}})
    >>> a.startswith("sha256:") and len(a) == 7 + 64
    True
    >>> a == checksum({"state_dict": {"w": torch.ones(2)}, "config": {"n": 2}})
    True
    >>> a == checksum({"config": {"n": 2}, "state_dict": {"w": torch.tensor([1.0, 1.5])}})
    False
    """
    sha = hashlib.sha256()
    _digest({k: v for k, v in content.items() if k != CHECKSUM_KEY}, sha)
    return "sha256:" + sha.hexdigest()


def save_plain(content: dict, path: Any) -> None:
    """``torch.save`` ``content`` (plain data and tensors) with its :func:`checksum`."""
    torch.save({**content, CHECKSUM_KEY: checksum(content)}, path)


def _starts_as_zip(path: Any) -> bool | None:
    """Whether the file ``path`` (a path or a seekable binary file) starts as ``torch.save``'s
    zip archives do; ``None`` if it cannot be read here (``torch.load`` then says why)."""
    try:
        if hasattr(path, "read"):
            where = path.tell()
            head = path.read(4)
            path.seek(where)
        else:
            with open(path, "rb") as file:
                head = file.read(4)
    except (OSError, TypeError, ValueError, AttributeError):
        return None
    if not isinstance(head, bytes):
        return None
    return head == b"PK\x03\x04"


#: The first torch whose ``torch.load(weights_only=True)`` is not known to run code from a
#: crafted file (CVE-2025-32434 concerns torch 2.5.1 and earlier).
SAFE_TORCH = (2, 6)


def _warn_old_torch(what: str) -> None:
    """Warn that loading runs on a torch whose ``weights_only`` loading can run code."""
    release = tuple(int(part) for part in re.findall(r"\d+", torch.__version__)[:2])
    if release < SAFE_TORCH:
        warnings.warn(
            f"{what}.load on torch {torch.__version__}: torch.load(weights_only=True), which "
            f"guide files are loaded with, can run code from a crafted file before torch "
            f"2.6 (CVE-2025-32434). Load only files you trust, or upgrade torch.",
            UserWarning,
            stacklevel=user_stacklevel(),
        )


def not_a_guide(what: str, path: Any) -> str:
    """The start of the messages that refuse a file (``what``: the guide class)."""
    return f"{what}.load: {path!r} is not a file written by {what}.save"


def load_plain(
    path: Any, map_location: Any, what: str, config_keys: tuple[str, ...], required=()
) -> dict:
    """``torch.load(path, weights_only=True)``, with a clear error when the file is refused.

    Parameters
    ----------
    path : str or file
    map_location : optional
        Passed to ``torch.load``.
    what : str
        The guide class, for messages.
    config_keys : tuple of str
        The keys a saved ``config`` may hold (what ``save`` writes).
    required : tuple of str
        The keys it must hold (files of earlier versions may lack the others).

    Raises
    ------
    pickle.UnpicklingError
        The file holds objects other than tensors and plain data: it was not written by
        ``what``'s ``save`` (or was changed since), and loading it could run code.
    ValueError
        The file is damaged (truncated, bytes changed: its checksum does not match) or holds
        other data than a guide.

    Notes
    -----
    The file's ``"checksum"`` entry must be there and match its contents (:func:`checksum`).
    """
    refused = not_a_guide(what, path)
    _warn_old_torch(what)
    if _starts_as_zip(path) is False:  # a text file, JSON, an old pickle: torch fails oddly
        raise ValueError(
            f"{refused}: it is not a file written by torch.save (which starts as a zip "
            f"archive); {what}.save writes one"
        )
    try:
        saved = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        raise pickle.UnpicklingError(
            f"{what}.load refused {path!r}: the file holds objects other than tensors and "
            f"plain data (dict, list, str, int, float, bool, None), which only a file that was "
            f"not written by {what}.save can hold, and unpickling them could run code from the "
            f"file. It was loaded with torch.load(weights_only=True), which builds nothing "
            f"else. If you trust the file, re-save its weights as a plain dict. (torch: "
            f"{str(error).splitlines()[0] if str(error) else type(error).__name__})"
        ) from None
    except (FileNotFoundError, PermissionError, IsADirectoryError):
        raise
    except (
        EOFError,
        OSError,
        RuntimeError,
        ValueError,
        UnicodeDecodeError,
        IndexError,
        KeyError,
        TypeError,
        AttributeError,
        struct.error,
    ) as error:
        # a truncated or changed file: torch's zip and pickle readers (weights_only's
        # unpickler popping an empty stack on a changed opcode) fail in many ways
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ValueError(
            f"{refused}, or it is damaged (truncated or changed since): torch.load failed "
            f"with {type(error).__name__}: {first}"
        ) from None
    if not isinstance(saved, dict) or not {"state_dict", "config"} <= set(saved):
        raise ValueError(f"{refused} (expected a dict with 'config' and 'state_dict')")
    if CHECKSUM_KEY not in saved:
        raise ValueError(
            f"{refused}, or it is damaged: it holds no {CHECKSUM_KEY!r} entry, which "
            f"{what}.save writes so that a changed file is refused rather than loaded as "
            f"another network. A file saved by pyro-autospec before guide files carried one "
            f"(or weights you trust) can be saved again: build the guide with the same "
            f"arguments, load the weights with guide.load_state_dict(torch.load(path, "
            f"weights_only=True)['state_dict']), and call guide.save"
        )
    try:
        found = checksum(saved)
    except TypeError as error:
        raise ValueError(f"{refused}: {error}") from None
    if saved[CHECKSUM_KEY] != found:
        raise ValueError(
            f"{refused}, or it is damaged (changed since it was saved): its contents do "
            f"not match the SHA-256 checksum {what}.save wrote into it, so the guide it "
            f"would load is not the one saved. Save the guide again, or use an intact copy "
            f"of the file"
        )
    config, state = saved["config"], saved["state_dict"]
    if (
        not isinstance(config, dict)
        or not set(required) <= set(config)
        or not set(config) <= set(config_keys)
    ):
        keys = sorted(map(str, config)) if isinstance(config, dict) else type(config).__name__
        optional = sorted(set(config_keys) - set(required))
        raise ValueError(
            f"{refused}: its config holds {keys}; a guide's holds {sorted(required)}"
            + (f" and some of {optional}" if optional else "")
        )
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{refused}: its state_dict is not a dict of tensors")
    loss = saved.get("loss", [])
    if not isinstance(loss, list) or not all(
        isinstance(x, (int, float)) and not isinstance(x, bool) for x in loss
    ):
        raise ValueError(f"{refused}: its loss history is not a list of numbers")
    return saved


def match_dtypes(module: nn.Module, state: dict, what: str, path: Any) -> None:
    """Give each tensor of ``module`` named in ``state`` the floating dtype saved there.

    ``load_state_dict`` copies a saved tensor into the module's own, casting it: a guide saved
    in float64 would load as a float32 guide, silently rounded. Called before it, this makes
    the loaded guide compute in the dtypes the saved one did. Names ``module`` lacks are left
    to ``load_state_dict`` to report.

    Raises
    ------
    ValueError
        A saved tensor is floating where the module's is not, or an integer or bool tensor
        has another dtype: the file is not one ``what.save`` wrote.

    Examples
    --------
    >>> import torch
    >>> saved = torch.nn.Linear(2, 1).double().state_dict()
    >>> fresh = torch.nn.Linear(2, 1)
    >>> match_dtypes(fresh, saved, "Guide", "guide.pt")
    >>> _ = fresh.load_state_dict(saved)
    >>> fresh.weight.dtype, torch.equal(fresh.weight, saved["weight"])
    (torch.float64, True)
    """
    tensors = dict(module.named_parameters())
    tensors.update(module.named_buffers())
    for name, value in state.items():
        current = tensors.get(name)
        if current is None or current.dtype == value.dtype:
            continue
        if not (current.is_floating_point() and value.is_floating_point()):
            raise ValueError(
                f"{not_a_guide(what, path)}: its {name} is {value.dtype}, where a guide's is "
                f"{current.dtype}"
            )
        with torch.no_grad():
            current.data = current.data.to(value.dtype)
