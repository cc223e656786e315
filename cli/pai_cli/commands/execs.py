"""pai exec: run a command in a running task's container, print what it printed."""

from __future__ import annotations

import sys
from typing import Any

import click

from pai_cli.api import job_path
from pai_cli.commands.logs import _pick_task
from pai_cli.session import CliError, Session, pass_session, user_option
from pai_cli.terminal import run_terminal

DEFAULT_TIMEOUT_S = 30
# The API answers within the command's timeout plus its node's margin; the
# client waits that long and then some before it calls the server gone.
ANSWER_GRACE_S = 60
EXIT_TIMED_OUT = 124  # as coreutils' timeout(1)
EXIT_NO_STATUS = 1  # the command ran but its exit status could not be read
ARGV_KEY = "pai.exec.argv"


class _ExecCommand(click.Command):
    """Everything after the first `--` is the command to run, untouched by
    click: its options (`ls -l`) are not pai's."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            split = args.index("--")
            args, ctx.meta[ARGV_KEY] = args[:split], args[split + 1:]
        else:
            ctx.meta[ARGV_KEY] = []
        return super().parse_args(ctx, args)


@click.command("exec", cls=_ExecCommand,
               context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("name")
@click.argument("role", required=False)
@click.argument("index", required=False, type=click.IntRange(0), default=0)
@click.option("--timeout", "timeout", type=click.IntRange(1), default=DEFAULT_TIMEOUT_S,
              show_default=True, help="Kill the command after this many seconds (not with -it).")
@click.option("--stdin", "-i", "interactive", is_flag=True,
              help="Interactive: keep standard input open (with -t).")
@click.option("--tty", "-t", "use_tty", is_flag=True,
              help="A terminal: run a shell or full-screen program (with -i).")
@user_option
@pass_session
def exec_command(session: Session, name: str, role: str | None, index: int, timeout: int,
                 interactive: bool, use_tty: bool, user: str | None) -> None:
    """Run a command in a running task and print its output: NAME [ROLE] [INDEX] -- COMMAND...

    \b
    Default: task 0 of the first role. The command runs as the container's
    user, with its environment; it is not a shell unless you run one:
        pai exec mnist -- nvidia-smi
        pai exec mnist worker 1 -- sh -c 'ls $PAI_OUTPUT_DIR | head'
    pai exits with the command's exit code (124 when it was killed at --timeout).
    \b
    With -it, a terminal in the task (the image's /bin/sh without a command):
        pai exec -it mnist -- bash
    """
    argv = click.get_current_context().meta.get(ARGV_KEY) or []
    if interactive != use_tty:
        raise CliError("an interactive session needs both -i and -t: pai exec -it NAME -- bash",
                       exit_code=2)
    if not argv and not use_tty:
        raise CliError("give the command after --, e.g. pai exec NAME -- ls -l", exit_code=2)
    client, owner = session.client(), session.owner(user)
    detail = client.call("GET", job_path(owner, name))
    role = _pick_task(detail, role, index)
    if use_tty:
        sys.exit(run_terminal(client.base, client.token,
                              job_path(owner, name, "tasks", role, str(index), "exec"), argv))
    client.timeout = max(client.timeout, timeout + ANSWER_GRACE_S)
    answer: dict[str, Any] = client.call(
        "POST", job_path(owner, name, "tasks", role, str(index), "exec"),
        body={"command": argv, "timeoutSec": timeout})
    click.echo(answer.get("output", ""), nl=False)
    sys.stdout.flush()
    if answer.get("truncated"):
        click.echo("[pai: the output was cut at 1 MiB]", err=True)
    if answer.get("timedOut"):
        click.echo(f"[pai: the command was killed after {timeout} s]", err=True)
        sys.exit(EXIT_TIMED_OUT)
    code = answer.get("exitCode")
    sys.exit(code if isinstance(code, int) and 0 <= code <= 255 else EXIT_NO_STATUS)
