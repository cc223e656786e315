"""The `pai` command: a client of the platform's REST API.

Every failure ends as `error: ...` on standard error and exit code 1 (2 for
usage mistakes, as click does), never as a traceback.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from pai_cli.api import ApiError, Unreachable
from pai_cli.commands import auth, cluster, execs, fs, jobs, logs, run, ssh, usage
from pai_cli.jobfile import JobFileError
from pai_cli.logins import LoginsError, config_path
from pai_cli.session import CliError, Session, expired_message

LOGIN_ERRORS = {"IncorrectPasswordError", "NoUserError"}


def error_lines(error: Exception, session: Session | None) -> tuple[list[str], int]:
    """What to print for a failure, and the exit code."""
    if isinstance(error, ApiError):
        active = session.active if session is not None else None
        if error.status == 401 and active is not None and error.code not in LOGIN_ERRORS:
            return [f"error: {expired_message(active)}"], 1
        lines = [f"error: {error.code}: {error.message}"]
        lines += [f"  {path}: {message}"
                  for path, messages in error.fields.items() for message in messages]
        return lines, 1
    if isinstance(error, CliError):
        return [f"error: {error.message}", *error.details], error.exit_code
    return [f"error: {error}"], 1


class PaiGroup(click.Group):
    """Turns the client's exceptions into one-line messages; lists commands in
    the order a newcomer uses them, not alphabetically."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (ApiError, Unreachable, CliError, LoginsError, JobFileError) as error:
            session = ctx.obj if isinstance(ctx.obj, Session) else None
            lines, code = error_lines(error, session)
            for line in lines:
                click.echo(line, err=True)
            ctx.exit(code)


@click.group(cls=PaiGroup, context_settings={"help_option_names": ["-h", "--help"],
                                             "max_content_width": 100})
@click.option("--cluster", "-c", "cluster_name", metavar="NAME", envvar="PAI_CLUSTER",
              help="Talk to this cluster instead of the current one [env PAI_CLUSTER].")
@click.option("--user", "-u", metavar="USER",
              help="Act on USER's jobs (admins); each command's --user overrides it.")
@click.option("--config", "config_file", type=click.Path(dir_okay=False, path_type=Path),
              help="The config file [env PAI_CONFIG; default "
                   "$XDG_CONFIG_HOME/pai/config.yaml].")
@click.version_option(package_name="pai-cli", prog_name="pai")
@click.pass_context
def cli(ctx: click.Context, cluster_name: str | None, user: str | None,
        config_file: Path | None) -> None:
    """pai: submit and follow jobs on a pai GPU cluster.

    \b
    Start with:  pai login http://HOST:9186
    then:        pai submit job.json --wait
                 (pai run --local job.json: first on this machine)
                 pai jobs; pai status NAME; pai logs NAME -f
                 pai exec NAME -- COMMAND...
                 pai ssh NAME (a job submitted with "ssh": true)
                 pai fs ls; pai fs put -r DIR code/DIR (your storage)
    """
    ctx.obj = Session(config_path=config_file or config_path(os.environ),
                      cluster_name=cluster_name, user=user)


for command in (auth.login, auth.logout, auth.use, jobs.submit, run.run_command, jobs.list_jobs,
                jobs.status, logs.logs, execs.exec_command, jobs.stop, jobs.wait,
                jobs.show_config, cluster.nodes, cluster.vcs, usage.usage, fs.fs):
    cli.add_command(command)
cli.add_command(ssh.ssh_command_line)


def main(argv: list[str] | None = None) -> None:
    """The console script. (click itself ends quietly on a closed pipe: `pai jobs | head`.)"""
    cli.main(args=argv, prog_name="pai")


if __name__ == "__main__":
    main()
