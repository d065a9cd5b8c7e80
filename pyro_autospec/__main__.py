"""Command line: ``pyro-autospec demo`` or ``python -m pyro_autospec demo``."""

from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError, version

from pyro_autospec.demo import main as demo

USAGE = """usage: pyro-autospec COMMAND [options]

commands:
  demo      a Pyro model through AutoSpec, beside Pyro's infer_discrete in ArviZ,
            checked against exact answers, and the engine race (rounds, rows,
            wall time of autospeculation and sequential sampling); 'demo --smoke'
            runs it at tiny sizes

options:
  -h, --help     show this message
  --version      show the installed version

Run 'pyro-autospec demo --help' for the options of a command."""


def _version() -> str:
    try:
        return version("pyro-autospec")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    if argv and argv[0] == "--version":
        print(f"pyro-autospec {_version()}")
        return 0
    if not argv:  # a command is required, as argparse has it
        print(f"pyro-autospec: a command is required\n\n{USAGE}", file=sys.stderr)
        return 2
    command, rest = argv[0], argv[1:]
    if command == "demo":
        demo(rest)
        return 0
    print(f"pyro-autospec: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
