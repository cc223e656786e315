"""pai logs: a task's log, its last lines or followed as it grows."""

from __future__ import annotations

import sys
from typing import Any

import click

from pai_cli.api import job_path
from pai_cli.session import CliError, Session, pass_session, user_option
from pai_cli.waiting import EXIT_STOPPED


def _pick_task(detail: dict[str, Any], role: str | None, index: int) -> str:
    """The role to read (the first one by default), checked against the job."""
    roles = detail.get("taskRoles") or {}
    if not roles:
        raise CliError(f"job {detail['name']} has no task roles")
    chosen = role or next(iter(roles))
    if chosen not in roles:
        raise CliError(f"job {detail['name']} has no role {chosen} "
                       f"(roles: {', '.join(roles)})")
    count = len(roles[chosen].get("taskStatuses") or [])
    if count and not 0 <= index < count:
        raise CliError(f"role {chosen} has tasks 0..{count - 1}")
    return chosen


@click.command()
@click.argument("name")
@click.option("--role", "-r", metavar="ROLE", help="The task role (default: the first).")
@click.option("--index", "-i", type=click.IntRange(0), default=0, show_default=True,
              help="The task's index in its role.")
@click.option("--attempt", "-a", type=click.IntRange(0), metavar="N",
              help="An earlier attempt's log (default: the current attempt).")
@click.option("--tail", "-t", type=click.IntRange(0), default=1000, show_default=True,
              help="How many of the last lines to show.")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new lines until the task ends.")
@user_option
@pass_session
def logs(session: Session, name: str, role: str | None, index: int, attempt: int | None,
         tail: int, follow: bool, user: str | None) -> None:
    """Print or follow a task's log.

    Default: task 0 of the first role, in the current attempt."""
    client, owner = session.client(), session.owner(user)
    detail = client.call("GET", job_path(owner, name))
    role = _pick_task(detail, role, index)
    path = job_path(owner, name, "tasks", role, str(index), "log")
    params: dict[str, Any] = {"attempt": attempt, "tail": tail}
    if not follow:
        text = client.call("GET", path, params=params)
        click.echo(text if isinstance(text, str) else str(text), nl=False)
        return
    try:
        for event in client.events(path, {**params, "follow": "1"}):
            if event.event == "end":
                break
            if event.event == "message":
                click.echo(event.data)
                sys.stdout.flush()
    except KeyboardInterrupt:
        sys.exit(EXIT_STOPPED)
