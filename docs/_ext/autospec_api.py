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
            lines += [""]
        if reexported:
            lines += ["", "Also exported here, documented where they are defined:", ""]
            for name, home, role in reexported:
                lines += [f"* :py:{role}:`{home}.{name}`"]
            lines += [""]
        return self.parse_text_to_nodes("\n".join(lines))


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
    return {"parallel_read_safe": True, "parallel_write_safe": True}
