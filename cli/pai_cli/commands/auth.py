"""pai login, pai logout, pai use: the clusters this user talks to."""

from __future__ import annotations

import getpass
import sys

import click
from rich.table import Table
from rich.text import Text

from pai_cli.api import ApiError, Client, Unreachable, check_url
from pai_cli.formatting import format_time, now_ms
from pai_cli.logins import Cluster
from pai_cli.session import CliError, Session, console, pass_session


def _read_password(password_stdin: bool) -> str:
    if password_stdin:
        line = sys.stdin.readline()
        password = line.rstrip("\r\n")
        if not password:
            raise CliError("--password-stdin: standard input held no password")
        return password
    password = click.prompt("Password", hide_input=True)
    return str(password)


@click.command()
@click.argument("url", required=False)
@click.option("--cluster", "cluster_name", metavar="NAME",
              help="Name to store this login under (default: the URL's host:port).")
@click.option("--username", "-u", help="Log in as this user (else asked).")
@click.option("--password-stdin", is_flag=True,
              help="Read the password from the first line of standard input (for scripts).")
@click.option("--expiration", type=click.IntRange(60), metavar="SECONDS",
              help="How long the token lives (default: the server's, 7 days).")
@pass_session
def login(session: Session, url: str | None, cluster_name: str | None, username: str | None,
          password_stdin: bool, expiration: int | None) -> None:
    """Log in to the cluster at URL and make it the current one.

    Without URL, logs in again to the named (or current) cluster."""
    found = session.load()
    name = cluster_name or session.cluster_name
    if url is None:
        known = found.get(name)
        url, name = known.url, known.name
    else:
        try:
            url = check_url(url)
        except ValueError as error:
            raise click.BadParameter(str(error), param_hint="URL") from None
        name = name or found.name_for(url)
    previous = found.clusters.get(name)
    if username is None:
        if password_stdin:
            raise click.UsageError("--password-stdin needs --username")
        default = previous.username if previous and previous.username else getpass.getuser()
        username = str(click.prompt("Username", default=default))
    password = _read_password(password_stdin)
    body: dict[str, object] = {"username": username, "password": password}
    if expiration:
        body["expiration"] = expiration
    answer = Client(url).call("POST", "/api/v1/token", body=body)
    cluster = Cluster(name=name, url=url, username=answer["user"], token=answer["token"],
                      admin=bool(answer.get("admin")), expires=answer.get("expires"))
    found.put(cluster)
    session.save(found)
    role = " (admin)" if cluster.admin else ""
    until = f"; the login lasts until {format_time(cluster.expires)}" if cluster.expires else ""
    click.echo(f"logged in to {name} ({url}) as {cluster.username}{role}{until}")


@click.command()
@click.option("--cluster", "cluster_name", metavar="NAME",
              help="The cluster to log out of (default: the current one).")
@click.option("--forget", is_flag=True, help="Also remove the cluster from the config file.")
@pass_session
def logout(session: Session, cluster_name: str | None, forget: bool) -> None:
    """Log out: revoke the token and forget it locally."""
    found = session.load()
    cluster = found.get(cluster_name or session.cluster_name)
    if cluster.token and not cluster.expired(now_ms()):
        try:
            Client(cluster.url, cluster.token).call("DELETE", "/api/v1/token")
        except ApiError as error:
            if error.status != 401:  # already expired or revoked: nothing to revoke
                raise
        except Unreachable as error:
            click.echo(f"warning: the token was not revoked on the server ({error}); "
                       "it stays valid until it expires", err=True)
    if forget:
        del found.clusters[cluster.name]
        if found.current == cluster.name:
            found.current = next(iter(sorted(found.clusters)), None)
    else:
        cluster.token, cluster.expires, cluster.admin = "", None, False
    session.save(found)
    click.echo(f"logged out of {cluster.name}")


@click.command()
@click.argument("name", required=False)
@pass_session
def use(session: Session, name: str | None) -> None:
    """Switch to cluster NAME; without NAME, list the clusters."""
    found = session.load()
    if name is not None:
        cluster = found.use(name)
        session.save(found)
        click.echo(f"now using {cluster.name} ({cluster.url})")
        return
    if not found.clusters:
        raise CliError("no clusters yet; run: pai login URL")
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("", "NAME", "URL", "USER", "LOGIN"):
        table.add_column(column)
    now = now_ms()
    for cluster in found.clusters.values():
        if not cluster.token:
            state = "logged out"
        elif cluster.expired(now):
            state = "expired"
        else:
            state = f"until {format_time(cluster.expires)}" if cluster.expires else "yes"
        table.add_row("*" if cluster.name == found.current else "", Text(cluster.name),
                      Text(cluster.url), Text(cluster.username or "-"), Text(state))
    console().print(table)
