"""What every command shares: the chosen cluster, its API client, and output.

Commands ask the session for a client; the session remembers which cluster
it handed out, so an HTTP 401 can be reported as "your login to <cluster>
has expired" with the exact command that renews it.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console

from pai_cli import logins
from pai_cli.api import Client
from pai_cli.formatting import now_ms

F = TypeVar("F", bound=Callable[..., Any])
WIDE_COLUMNS = 250  # tables piped to a file or grep are not cut at 80 columns


class CliError(Exception):
    """A failure to report as `error: <message>` (plus detail lines), exit 1."""

    def __init__(self, message: str, *details: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.message, self.details, self.exit_code = message, list(details), exit_code


def login_command(cluster: logins.Cluster) -> str:
    user = f" --username {cluster.username}" if cluster.username else ""
    return f"pai login --cluster {cluster.name}{user} {cluster.url}"


def expired_message(cluster: logins.Cluster) -> str:
    return f"your login to {cluster.name} has expired; run {login_command(cluster)}"


@dataclass
class Session:
    config_path: Path
    cluster_name: str | None = None
    user: str | None = None
    active: logins.Cluster | None = field(default=None, init=False)

    def load(self) -> logins.Logins:
        return logins.load(self.config_path)

    def save(self, found: logins.Logins) -> None:
        logins.save(self.config_path, found)

    def cluster(self) -> logins.Cluster:
        """The cluster this command talks to, with a live login."""
        cluster = self.load().get(self.cluster_name)
        self.active = cluster
        if not cluster.token:
            raise CliError(f"not logged in to {cluster.name}; run {login_command(cluster)}")
        if cluster.expired(now_ms()):
            raise CliError(expired_message(cluster))
        return cluster

    def client(self) -> Client:
        cluster = self.cluster()
        return Client(cluster.url, cluster.token)

    def owner(self, user: str | None) -> str:
        """Whose jobs a command means: --user, else the group's --user, else me."""
        return user or self.user or self.cluster().username


pass_session = click.make_pass_decorator(Session)


# ------------------------------------------------------------------ output


def console() -> Console:
    """stdout, coloured and as wide as the terminal; wide and plain when piped."""
    if sys.stdout.isatty() or os.environ.get("COLUMNS"):
        return Console(highlight=False)
    return Console(highlight=False, width=WIDE_COLUMNS)


def print_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, ensure_ascii=False))


def output_option(*choices: str) -> Callable[[F], F]:
    names = choices or ("table", "json")
    return click.option("-o", "--output", type=click.Choice(names), default=names[0],
                        show_default=True,
                        help="json prints the API's answer, for scripts.")


def user_option(func: F) -> F:
    return click.option("--user", "-u", "user", metavar="USER",
                        help="The job's owner, when not the logged-in user "
                             "(admins may act on anyone's jobs).")(func)
