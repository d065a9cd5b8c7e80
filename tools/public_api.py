"""The public API of pyro_autospec, read from every public module's ``__all__``.

One source for three users: the API pages of the documentation (``docs/_ext/public_api.py``
documents every name listed here), the notebooks' API fingerprint
(``tools/execute_tutorials.py`` stamps it, ``tests/test_tutorials.py`` compares it) and
``tests/test_docs.py`` (every name must appear on the API pages).

Run ``python tools/public_api.py`` to print the API and its fingerprint.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import re
from typing import Any

#: The public modules, in the order of the API pages. A name exported by several of them is
#: documented once, in the first subpackage that exports it (the top-level package last).
PUBLIC_MODULES = (
    "pyro_autospec",
    "pyro_autospec.engine",
    "pyro_autospec.oracles",
    "pyro_autospec.model",
    "pyro_autospec.infer",
    "pyro_autospec.guides",
    "pyro_autospec.diagnostics",
    "pyro_autospec.distributions",
)

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def public_names() -> dict[str, list[str]]:
    """``{module: names in its __all__, in order}`` for every public module."""
    names = {}
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        exported = getattr(module, "__all__", None)
        if not exported:
            raise RuntimeError(f"{module_name} has no __all__: list its public names there")
        names[module_name] = list(exported)
    return names


def home_modules() -> dict[int, str]:
    """``{id(object): module}``: where each public object is documented.

    The first subpackage of :data:`PUBLIC_MODULES` that exports it; the top-level package only
    for names that no subpackage exports.
    """
    homes: dict[int, str] = {}
    order = list(PUBLIC_MODULES[1:]) + [PUBLIC_MODULES[0]]
    for module_name in order:
        module = importlib.import_module(module_name)
        for name in public_names()[module_name]:
            homes.setdefault(id(getattr(module, name)), module_name)
    return homes


def _signature(obj: Any) -> str:
    try:
        text = str(inspect.signature(obj))
    except (TypeError, ValueError):
        text = "(...)"
    return _ADDRESS.sub("", text)


def _members(cls: type) -> list[str]:
    """Public members defined in this library (not inherited from torch or Pyro), described."""
    seen: dict[str, str] = {}
    for klass in cls.__mro__:
        if not getattr(klass, "__module__", "").startswith("pyro_autospec"):
            continue
        for name, value in vars(klass).items():
            if name.startswith("_") or name in seen:
                continue
            if isinstance(value, (staticmethod, classmethod)):
                seen[name] = f"{type(value).__name__} {name}{_signature(value.__func__)}"
            elif isinstance(value, property):
                seen[name] = f"property {name}"
            elif inspect.isfunction(value):
                seen[name] = f"method {name}{_signature(value)}"
            else:
                seen[name] = f"attribute {name}"
    return [seen[name] for name in sorted(seen)]


def describe(obj: Any) -> list[str]:
    """Lines that describe one public object: its kind and signature (and a class's members)."""
    if inspect.isclass(obj):
        return [f"class{_signature(obj)}"] + [f"  {line}" for line in _members(obj)]
    if callable(obj):
        return [f"function{_signature(obj)}"]
    return [f"{type(obj).__name__}"]


def api_lines() -> list[str]:
    """The public API as sorted text: every ``module.name``, its kind and its signature."""
    lines = []
    for module_name, names in public_names().items():
        module = importlib.import_module(module_name)
        for name in sorted(names):
            described = describe(getattr(module, name))
            lines.append(f"{module_name}.{name}: {described[0]}")
            lines.extend(described[1:])
    return lines


def fingerprint() -> str:
    """A short hash of :func:`api_lines`: it changes when a public name or signature changes."""
    text = "\n".join(api_lines())
    return hashlib.sha256(text.encode()).hexdigest()[:16]


if __name__ == "__main__":
    print("\n".join(api_lines()))
    print(f"fingerprint: {fingerprint()}")
