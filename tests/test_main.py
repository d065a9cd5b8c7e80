"""The command line (``pyro-autospec``): usage, version and exit codes, as argparse has them."""

from __future__ import annotations

from importlib.metadata import version

from pyro_autospec.__main__ import main


def test_help_prints_usage_and_succeeds(capsys):
    assert main(["--help"]) == 0
    assert "usage: pyro-autospec COMMAND" in capsys.readouterr().out


def test_no_command_is_a_usage_error(capsys):
    assert main([]) == 2
    err = capsys.readouterr().err
    assert "a command is required" in err and "usage: pyro-autospec COMMAND" in err


def test_unknown_command_is_a_usage_error(capsys):
    assert main(["sample"]) == 2
    assert "unknown command 'sample'" in capsys.readouterr().err


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"pyro-autospec {version('pyro-autospec')}"
