"""Sphinx directive ``.. public-api:: module``: autodoc of every name in ``module.__all__``.

The list of names comes from the module itself (``tools/public_api.py``), so a new public name
appears on the API pages without editing the docs. A name exported by several public modules
is documented once, where :func:`public_api.home_modules` puts it; the other modules link to it.
"""

from __future__ import annotations

import importlib
import inspect

import public_api
from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective


class PublicAPIDirective(SphinxDirective):
    """Document every public name of one module (autodoc), and list its re-exports."""

    required_arguments = 1
    has_content = False

    def run(self) -> list[nodes.Node]:
        module_name = self.arguments[0]
        module = importlib.import_module(module_name)
        homes = public_api.home_modules()
        lines: list[str] = []
        reexported: list[tuple[str, str, str]] = []
        for name in public_api.public_names()[module_name]:
            obj = getattr(module, name)
            role, directive = _kinds(obj)
            home = homes[id(obj)]
            if home != module_name:
                reexported.append((name, home, role))
                continue
            lines += [f".. {directive}:: {module_name}.{name}"]
            if directive in ("autoclass", "autoexception"):
                lines += ["   :members:", "   :show-inheritance:"]
                hidden = _hidden_bases(obj, homes)
                if hidden:  # a private mixin's members are the class's own
                    outside = sorted({c.__name__ for c in obj.__mro__[1:] if c not in hidden})
                    lines += [f"   :inherited-members: {', '.join(outside)}"]
            lines += [""]
        if reexported:
            lines += ["", "Also exported here, documented where they are defined:", ""]
            for name, home, role in reexported:
                lines += [f"* :py:{role}:`{home}.{name}`"]
            lines += [""]
        return self.parse_text_to_nodes("\n".join(lines))


def _hidden_bases(cls: type, homes: dict[int, str]) -> set[type]:
    """The bases of ``cls`` that only split its code (mixins of this library that are not
    public): their members are documented as the class's, and they are not shown as bases."""
    return {
        base
        for base in cls.__mro__[1:]
        if getattr(base, "__module__", "").startswith("pyro_autospec") and id(base) not in homes
    }


def _drop_hidden_bases(app, name, obj, options, bases: list) -> None:
    if inspect.isclass(obj):
        hidden = _hidden_bases(obj, public_api.home_modules())
        bases[:] = [base for base in bases if base not in hidden]


def _kinds(obj: object) -> tuple[str, str]:
    """The cross-reference role and the autodoc directive for one public object."""
    if inspect.isclass(obj):
        if issubclass(obj, BaseException):
            return "exc", "autoexception"
        return "class", "autoclass"
    if callable(obj):
        return "func", "autofunction"
    return "data", "autodata"


def setup(app: Sphinx) -> dict:
    app.add_directive("public-api", PublicAPIDirective)
    app.connect("autodoc-process-bases", _drop_hidden_bases)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
