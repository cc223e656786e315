"""`pai exec`'s command line: everything after `--` is the command, untouched."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from pai_cli.commands.execs import ARGV_KEY, exec_command
from pai_cli.main import cli
from pai_cli.terminal import websocket_url


@pytest.mark.parametrize(("args", "params", "argv"), [
    (["job", "--", "ls", "-l"], {"name": "job", "role": None, "index": 0}, ["ls", "-l"]),
    (["job", "worker", "2", "--", "nvidia-smi"],
     {"name": "job", "role": "worker", "index": 2}, ["nvidia-smi"]),
    (["--timeout", "5", "job", "--", "sh", "-c", "a -- b", "--", "--help"],
     {"name": "job", "role": None, "index": 0, "timeout": 5},
     ["sh", "-c", "a -- b", "--", "--help"]),
    (["job", "--"], {"name": "job"}, []),
])
def test_the_command_is_what_follows_the_first_double_dash(
        args: list[str], params: dict[str, object], argv: list[str]) -> None:
    ctx = exec_command.make_context("exec", list(args))
    assert ctx.meta[ARGV_KEY] == argv
    assert params.items() <= ctx.params.items()


@pytest.mark.parametrize("args", [["exec", "job"], ["exec", "job", "main", "0"],
                                  ["exec", "job", "--"]])
def test_no_command_is_a_usage_error(args: list[str], tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, args, env={"PAI_CONFIG": str(tmp_path / "none.yaml")})
    assert result.exit_code == 2
    assert "give the command after --" in result.stderr


def test_a_negative_index_is_refused() -> None:
    with pytest.raises(click.UsageError):
        exec_command.make_context("exec", ["job", "main", "-1", "--", "true"])


@pytest.mark.parametrize(("args", "interactive", "use_tty", "argv"), [
    (["-it", "job", "--", "bash"], True, True, ["bash"]),
    (["-i", "-t", "job", "worker", "1"], True, True, []),
    (["--stdin", "--tty", "job"], True, True, []),
    (["job", "--", "ls"], False, False, ["ls"]),
])
def test_interactive_flags(args: list[str], interactive: bool, use_tty: bool,
                           argv: list[str]) -> None:
    ctx = exec_command.make_context("exec", list(args))
    assert (ctx.params["interactive"], ctx.params["use_tty"]) == (interactive, use_tty)
    assert ctx.meta[ARGV_KEY] == argv


@pytest.mark.parametrize("args", [["exec", "-i", "job", "--", "sh"],
                                  ["exec", "-t", "job", "--", "sh"]])
def test_an_interactive_session_needs_both_flags(args: list[str], tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, args, env={"PAI_CONFIG": str(tmp_path / "none.yaml")})
    assert result.exit_code == 2
    assert "needs both -i and -t" in result.stderr


@pytest.mark.parametrize(("base", "url"), [
    ("http://pai.example:9186", "ws://pai.example:9186/api/v1/x/exec?tty=1"),
    ("https://pai.example/rest-server/", "wss://pai.example/rest-server/api/v1/x/exec?tty=1"),
])
def test_the_websocket_url(base: str, url: str) -> None:
    assert websocket_url(base, "/api/v1/x/exec") == url
