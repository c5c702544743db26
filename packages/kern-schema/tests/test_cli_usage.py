"""`kern-schema` without a command lists the commands instead of argparse's terse error."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kern_schema.cli import COMMANDS, main


def test_no_command_lists_each_command_with_a_description(capsys):
    with pytest.raises(SystemExit) as e:
        main([])
    assert e.value.code == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err.startswith("usage: kern-schema")
    for cmd, desc in COMMANDS.items():
        assert f"  {cmd:<12}  {desc}" in out.err
    assert "required" not in out.err and "kern-schema COMMAND --help" in out.err


def test_console_script_without_a_command():
    p = subprocess.run([sys.executable, "-m", "kern_schema.cli"], capture_output=True, text=True)
    assert p.returncode == 2 and "json-schema" in p.stderr and p.stdout == ""


def test_help_names_the_command(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    assert "json-schema" in capsys.readouterr().out
