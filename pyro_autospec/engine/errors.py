"""Errors raised when an oracle or an input would make a sample silently wrong."""

from __future__ import annotations

import dis
import functools
import types

import torch

__all__ = ["OracleError", "check_device", "check_eval_mode"]


class OracleError(ValueError):
    """An oracle returned something the exact sampler cannot use.

    Raised for rows conditioned on a possible assignment that contain NaN or ``+inf``, that do
    not sum to one, or that give zero mass to every value; for outputs of the wrong shape or
    dtype; for oracles whose ``num_coords`` / ``num_values`` / ``dim`` disagree with what
    they return; and, before sampling, for an oracle that answers with a network in training
    mode with dropout or batch norm (:func:`check_eval_mode`). The message names the row (or
    the layer) and the usual fix.
    """


#: How far :func:`check_eval_mode` looks for networks from the oracle (attributes of attributes,
#: items of lists and dicts), and how many objects it visits at most.
_SEARCH_DEPTH = 4
_SEARCH_VISITS = 2000
_LEAVES = (torch.Tensor, str, bytes, int, float, complex, bool, type, types.ModuleType)


def _children(name: str, value: object, root: bool) -> list[tuple[str, object]]:
    """What ``value`` may answer with, by name: the object of a bound method, the variables
    (closed over or global) a function reads, the items of a list, tuple or dict, an
    object's attributes and ``__slots__`` (read past any ``__getattr__``), and for the oracle
    itself (``root``) what its class holds and what its methods and properties read. Nothing
    for an object that cannot be read so (a proxy)."""
    try:
        return _readable_children(name, value, root)
    except Exception:  # noqa: BLE001 - what cannot be read is not searched
        return []


def _class_members(name: str, value: object) -> list[tuple[str, object]]:
    """What the oracle's class holds and what its methods read: class attributes (a network
    kept on the class) and the functions behind its methods (``__call__``, a drift's, among
    them), static and class methods and properties (whose closures and globals are searched
    next), along its own classes (not ``object``'s nor ``torch.nn.Module``'s)."""
    found = []
    for klass in type(value).__mro__:
        if klass is object or klass.__module__.startswith(("torch.", "builtins")):
            continue
        for key, member in vars(klass).items():
            if key.startswith("__") and key != "__call__":  # a drift's method is __call__
                continue
            if isinstance(member, (staticmethod, classmethod)):
                member = member.__func__
            elif isinstance(member, property):
                member = member.fget
            found.append((f"{name}.{key}", member))
    return found


def _slots(name: str, value: object) -> list[tuple[str, object]]:
    """The values of an object's ``__slots__`` (set ones only)."""
    found = []
    for klass in type(value).__mro__:
        slots = getattr(klass, "__slots__", ())
        for slot in (slots,) if isinstance(slots, str) else slots:
            try:
                found.append((f"{name}.{slot}", object.__getattribute__(value, slot)))
            except AttributeError:
                continue
    return found


@functools.lru_cache(maxsize=1024)
def _global_reads(code: types.CodeType) -> tuple[str, ...]:
    """The global names a function's code reads (``LOAD_GLOBAL``), its nested functions' and
    comprehensions' included; not ``co_names``, which also holds every attribute name
    (``self.net`` is no read of a global ``net``)."""
    names = dict.fromkeys(
        ins.argval for ins in dis.get_instructions(code) if ins.opname == "LOAD_GLOBAL"
    )
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names.update(dict.fromkeys(_global_reads(const)))
    return tuple(names)


def _readable_children(name: str, value: object, root: bool) -> list[tuple[str, object]]:
    if isinstance(value, types.MethodType):  # e.g. net.forward
        return [(f"{name}.__self__", value.__self__)]
    if isinstance(value, functools.partial):  # partial(run, net): the function and its arguments
        bound = [(f"{name}.args[{i}]", a) for i, a in enumerate(value.args[:100])]
        named = [(f"{name}.keywords[{k!r}]", v) for k, v in list(value.keywords.items())[:100]]
        return [(f"{name}.func", value.func), *bound, *named]
    if isinstance(value, types.FunctionType):
        code = value.__code__
        cells = zip(code.co_freevars, value.__closure__ or ())
        found = [(var, cell.cell_contents) for var, cell in cells if _full(cell)]
        scope = value.__globals__
        return found + [(var, scope[var]) for var in _global_reads(code) if var in scope]
    if isinstance(value, (list, tuple)):
        return [(f"{name}[{i}]", item) for i, item in enumerate(value[:100])]
    if isinstance(value, dict):
        items = list(value.items())[:100]
        return [(f"{name}[{k!r}]", v) for k, v in items if isinstance(k, (str, int))]
    if isinstance(value, torch.nn.Module) and not root or isinstance(value, _LEAVES):
        return []  # a module's own layers are its named_modules()
    # not through a __getattr__ the oracle may define
    try:
        attributes = dict(object.__getattribute__(value, "__dict__"))
    except AttributeError:  # __slots__ only, or a builtin
        attributes = {}
    if isinstance(value, torch.nn.Module):  # its layers live in _modules: named_modules()
        attributes = {k: v for k, v in attributes.items() if not k.startswith("_")}
    found = [(f"{name}.{k}", v) for k, v in attributes.items()] + _slots(name, value)
    return found + _class_members(name, value) if root else found


def _networks(oracle: object, reach: int = _SEARCH_DEPTH) -> dict[str, torch.nn.Module]:
    """The :class:`torch.nn.Module` s an oracle answers with, by name, nearest first: the
    oracle itself, and what :func:`_children` finds from it, up to ``reach`` steps
    away (``oracle.model.net``, ``oracle.nets[1]``, a network a function closes over)."""
    found: dict[str, torch.nn.Module] = {}
    seen: set[int] = set()
    level = [("oracle", oracle)]
    for depth in range(reach + 1):
        following = []
        for name, value in level:
            if id(value) in seen or len(seen) >= _SEARCH_VISITS:
                continue
            seen.add(id(value))
            try:
                if isinstance(value, torch.nn.Module):
                    found.setdefault(name, value)
            except Exception:  # noqa: BLE001 - a __class__ that raises: not a network
                continue
            if depth < reach:
                following += _children(name, value, root=depth == 0)
        level = following
    return found


def _full(cell) -> bool:
    try:
        cell.cell_contents  # noqa: B018 (raises on an empty cell)
    except ValueError:
        return False
    return True


def _random_in_training(layer: torch.nn.Module) -> bool:
    """Whether ``layer`` answers at random (dropout) or from its batch (batch norm) when in
    training mode."""
    if isinstance(layer, torch.nn.modules.dropout._DropoutNd):
        return layer.p > 0
    if isinstance(layer, torch.nn.modules.batchnorm._BatchNorm):
        return True
    rate = getattr(layer, "dropout", 0.0)  # MultiheadAttention, RNN, LSTM, GRU
    return isinstance(rate, float) and rate > 0


def check_eval_mode(oracle: object, reach: int = _SEARCH_DEPTH) -> None:
    """Raise if a network the oracle answers with is in training mode with a layer that makes
    its answers random (dropout) or dependent on the batch (batch norm).

    Such an oracle gives a different conditional each time it is asked the same question, so
    no sampler can be exact for it: the engine asks a row several times (draft, verification)
    and in batches of varying composition. The fix is ``net.eval()`` before sampling. Modules
    are found on the oracle itself and up to ``reach`` (four) steps from it: attributes and
    ``__slots__`` (of attributes), items of lists, tuples and dicts, the object of a bound
    method, the variables (closed over or global) a function reads, and what the oracle's
    class holds and its methods and properties read. The engine passes ``reach=1`` (the
    oracle and what it holds directly) for an oracle that declares ``consistent_queries``:
    it vouches for one answer per question, and may hold networks it never calls (a model
    whose factors it compiled once). A network called with ``training=True`` by hand
    (``F.dropout(x, training=True)``) cannot be seen and stays the caller's responsibility.

    Raises
    ------
    OracleError
        Naming the first such layer.

    Examples
    --------
    >>> net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.1))
    >>> check_eval_mode(lambda t, x: net(x))
    Traceback (most recent call last):
    ...
    pyro_autospec.engine.errors.OracleError: net[1] (Dropout) is in training mode: ...
    >>> _ = net.eval()
    >>> check_eval_mode(lambda t, x: net(x))
    """
    for name, network in _networks(oracle, reach).items():
        for path, layer in network.named_modules():
            if layer.training and _random_in_training(layer):
                parts = [p for p in path.split(".") if p]
                where = name + "".join(f"[{p}]" if p.isdigit() else f".{p}" for p in parts)
                raise OracleError(
                    f"{where} ({type(layer).__name__}) is in training mode: its answers are "
                    "random or depend on the batch, so no sampler can be exact for this "
                    f"oracle; call {name}.eval() before sampling (also if the oracle never "
                    "calls it: it is within the oracle's reach)"
                )


def check_device(device) -> torch.device:
    """``device`` as a :class:`torch.device`, refused where this PyTorch cannot run on it.

    Raises
    ------
    ValueError
        For a device that is not one, a ``meta`` device (its tensors hold no numbers to draw
        from), or a CUDA or MPS device this PyTorch build or machine does not have.

    Examples
    --------
    >>> check_device("cpu")
    device(type='cpu')
    >>> check_device("meta")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: device='meta': meta tensors hold no numbers, ...
    """
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(
            f"device={device!r} is not a torch device ('cpu', 'cuda', 'cuda:1', ...): {error}"
        ) from None
    if resolved.type == "meta":
        raise ValueError(
            f"device={device!r}: meta tensors hold no numbers, so nothing can be sampled on "
            f"them; pass device='cpu' or a GPU"
        )
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                f"device={device!r}, but this PyTorch sees no CUDA GPU (torch.cuda.is_available() "
                f"is False: a CPU build, or no driver): pass device='cpu', or install a CUDA build"
            )
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise ValueError(
                f"device={device!r}, but this machine has {torch.cuda.device_count()} CUDA "
                f"device(s)"
            )
    if resolved.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device={device!r}, but MPS is not available here: pass device='cpu'")
    return resolved
