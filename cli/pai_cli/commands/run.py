"""pai run --local: a job on this machine's Docker engine, without a platform.

The CLI alone (click, rich, PyYAML) talks to a cluster's API and nothing
else. A local run needs the platform's own job validation, task
environment, container settings and completion rules, and the Docker SDK:
they come with the server package (`services.localrun`), installed beside
the CLI (`pip install ./ "./cli[local]"` from a checkout; `make install` has
both). Without it this command says so; everything else works as before.
docs/cli.md says why.
"""

from __future__ import annotations

import getpass
import os
import sys
from pathlib import Path
from typing import Any

import click
import yaml

from pai_cli.jobfile import JobFileError, apply_overrides, parse_job_config, read_source
from pai_cli.session import CliError, print_json

INSTALL_HINT = ('install the platform\'s package beside the CLI: from a checkout of pai, '
                'pip install ./ "./cli[local]" (make install has both)')


def default_storage() -> Path:
    """Where a local run's storage root is unless --storage says: the user's data folder."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "pai" / "storage"


def _local() -> Any:
    """The server package's local runner, or a CliError naming what to install."""
    try:
        from services.localrun import plan, runner
    except ImportError as error:
        raise CliError(f"pai run --local needs the platform's own code ({error.name or error} "
                       "is missing)", INSTALL_HINT) from None
    return plan, runner


@click.command("run")
@click.argument("job_file", metavar="JOB_FILE")
@click.option("--local", "local", is_flag=True,
              help="Run it on this machine's Docker engine (the only way `pai run` runs).")
@click.option("--dry-run", is_flag=True,
              help="Validate and print the containers it would start; start nothing.")
@click.option("--name", "new_name", metavar="NAME", help="Run it under this jobName.")
@click.option("--user", "username", metavar="USER",
              help="The job's user (PAI_USER_NAME, <root>/<user>/ folders) "
                   "[default: your login name].")
@click.option("--storage", type=click.Path(file_okay=False, path_type=Path),
              help="The storage root standing for the cluster's ($PAI_DEFAULT_FS_URI) "
                   "[default: $XDG_DATA_HOME/pai/storage].")
@click.option("-o", "--output", type=click.Choice(["yaml", "json"]), default="yaml",
              show_default=True, help="How --dry-run prints the containers.")
def run_command(job_file: str, local: bool, dry_run: bool, new_name: str | None,
                username: str | None, storage: Path | None, output: str) -> None:
    """Run the job in JOB_FILE on this machine first, as the platform would.

    The same validation, image, command, PAI_* environment (every task at
    127.0.0.1 with ports of this machine), mounts, limits and exit code as
    on a cluster; its output is printed as it runs. JOB_FILE is JSON (with
    OpenPAI's comments) or YAML, as for `pai submit`; - reads standard input."""
    if not local:
        raise CliError("pai run runs a job on this machine: add --local "
                       "(pai submit sends it to a cluster)", exit_code=2)
    plan_module, runner = _local()
    try:
        source, text = read_source(job_file, sys.stdin)
        config = apply_overrides(parse_job_config(source, text), name=new_name, vc=None)
    except JobFileError as error:
        raise CliError(str(error)) from None
    root = (storage or default_storage()).expanduser().resolve()
    user = (username or getpass.getuser()).lower()
    plan = _plan(plan_module, config, user, root)
    for note in plan.notes:
        click.echo(f"note: {note}", err=True)
    if plan.ignored:
        click.echo(f"note: accepted but not acted on: {', '.join(plan.ignored)}", err=True)
    if dry_run:
        described = _described(plan_module, runner, plan)
        if output == "json":
            print_json(described)
        else:
            click.echo(yaml.safe_dump(described, sort_keys=False, width=100), nl=False)
        return
    root.mkdir(parents=True, exist_ok=True)
    sys.exit(_run(runner, plan))


def _plan(plan_module: Any, config: dict[str, Any], user: str, root: Path) -> Any:
    from shared.domain.jobspec import InvalidJobConfig

    try:
        return plan_module.plan_run(config, username=user, storage_root=str(root))
    except InvalidJobConfig as error:
        raise CliError(f"InvalidJobConfigError: {error.message}",
                       *(f"  {path}: {message}" for path, messages in error.fields.items()
                         for message in messages)) from None


def _described(plan_module: Any, runner: Any, plan: Any) -> dict[str, Any]:
    from services.launcher.mounts import TaskSetupError

    try:
        described: dict[str, Any] = plan_module.describe(
            plan, lambda planned: runner.container_name(plan, planned))
    except TaskSetupError as error:
        raise CliError(str(error)) from None
    return described


def _run(runner: Any, plan: Any) -> int:
    import docker
    from docker.errors import DockerException

    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except DockerException as error:
        raise CliError(f"no Docker engine answers ({error})",
                       "pai run --local starts the job's containers on this machine's "
                       "Docker engine (DOCKER_HOST, else /var/run/docker.sock)") from None
    click.echo(f"running {plan.spec.name} as {plan.username}: {len(plan.tasks)} task(s), "
               f"storage root {plan.storage_root}", err=True)
    try:
        status: int = runner.LocalRun(plan, client, click.echo).run()
    except runner.LocalRunError as error:
        raise CliError(str(error)) from None
    finally:
        client.close()
    return status
