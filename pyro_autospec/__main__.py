"""Command line: ``pyro-autospec demo`` or ``python -m pyro_autospec demo``."""

from __future__ import annotations

import sys

from pyro_autospec.demo import main as demo

USAGE = """usage: pyro-autospec COMMAND [options]

commands:
  demo      a Pyro model through AutoSpec, beside Pyro's infer_discrete in ArviZ,
            checked against exact answers, and the engine race (rounds, rows,
            wall time of autospeculation and sequential sampling); 'demo --smoke'
            runs it at tiny sizes

Run 'pyro-autospec demo --help' for the options of a command."""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    command, rest = argv[0], argv[1:]
    if command == "demo":
        demo(rest)
        return 0
    print(f"pyro-autospec: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
