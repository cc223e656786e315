"""pai submit, jobs, status, stop, wait, config: a user's jobs."""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import click
import yaml
from rich.text import Text

from pai_cli.api import ApiError, Client, job_path, jobs_path
from pai_cli.commands import fs
from pai_cli.formatting import elapsed, now_ms
from pai_cli.jobfile import JobFileError, apply_overrides, parse_job_config, read_source
from pai_cli.session import (
    CliError,
    Session,
    console,
    output_option,
    pass_session,
    print_json,
    user_option,
)
from pai_cli.views import job_view, jobs_table
from pai_cli.waiting import (
    EXIT_STOPPED,
    EXIT_TIMEOUT,
    WaitTimeout,
    exit_code_for,
    final_line,
    wait_until_final,
)

JOB_STATES = ("WAITING", "RUNNING", "STOPPING", "SUCCEEDED", "FAILED", "STOPPED")
# The fields `GET /api/v1/jobs?sort=` sorts the whole list by (shared/domain/jobsort.py SORTS)
JOB_SORTS = ("submitTime", "name", "username", "virtualCluster", "state", "gpus", "retries",
             "completedTime", "duration")
GPU_LOOKUPS = 8  # parallel config reads when the job list carries no GPU counts

timeout_option = click.option("--timeout", type=click.FloatRange(0), metavar="SECONDS",
                              help=f"Give up waiting after this long (exit {EXIT_TIMEOUT}).")


def follow_job(client: Client, owner: str, name: str, timeout: float | None) -> dict[str, Any]:
    """Wait for the job's end, with a spinner when a person is watching; the detail."""
    def fetch() -> dict[str, Any]:
        detail: dict[str, Any] = client.call("GET", job_path(owner, name))
        return detail

    out = console()
    try:
        if not out.is_terminal:
            return wait_until_final(fetch, timeout=timeout)
        with out.status(Text(f"waiting for {name}")) as spinner:
            def show(detail: dict[str, Any]) -> None:
                status = detail["jobStatus"]
                took = elapsed(status.get("createdTime"), status.get("completedTime"))
                why = status.get("waitingReason") if status.get("state") == "WAITING" else ""
                spinner.update(Text(f"{name}: {status['state']} ({took})"
                                    + (f" - {why}" if why else "")))
            return wait_until_final(fetch, on_poll=show, timeout=timeout)
    except WaitTimeout as error:
        raise CliError(f"job {name} is still {error.status.get('state')} after "
                       f"{timeout:g} s", exit_code=EXIT_TIMEOUT) from None
    except KeyboardInterrupt:
        click.echo(f"stopped waiting; job {name} goes on (pai stop {name} ends it)", err=True)
        sys.exit(EXIT_STOPPED)


def _finish(name: str, detail: dict[str, Any]) -> int:
    status = detail["jobStatus"]
    click.echo(final_line(name, status), err=status.get("state") != "SUCCEEDED")
    return exit_code_for(status)


@click.command()
@click.argument("job_file", metavar="JOB_FILE")
@click.option("--name", "new_name", metavar="NAME", help="Submit under this jobName.")
@click.option("--vc", metavar="VC", help="Submit to this virtual cluster.")
@click.option("--dry-run", is_flag=True, help="Only check the config; submit nothing.")
@click.option("--upload-code", "code", metavar="DIR",
              type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Send DIR to <your folder>/code/<jobName> first and submit with that "
                   "as codeDir (the tasks' working directory).")
@click.option("--wait", is_flag=True,
              help="Follow the job and exit with its code: 0 SUCCEEDED, the app's exit "
                   "code when FAILED, 130 when STOPPED.")
@timeout_option
@user_option
@output_option()
@pass_session
def submit(session: Session, job_file: str, new_name: str | None, vc: str | None,
           dry_run: bool, code: Path | None, wait: bool, timeout: float | None,
           user: str | None, output: str) -> None:
    """Submit the job config in JOB_FILE.

    JOB_FILE is JSON (OpenPAI's // and /* */ comments allowed) or YAML (.yaml,
    .yml); - reads standard input."""
    try:
        source, text = read_source(job_file, sys.stdin)
        config = apply_overrides(parse_job_config(source, text), name=new_name, vc=vc)
    except JobFileError as error:
        raise CliError(str(error)) from None
    client, owner = session.client(), session.owner(user)
    if code is not None:
        config["codeDir"] = fs.code_dir_for(session, config, code)
        # The config is checked before a byte is sent, and the code is there
        # before the job can start.
        client.call("POST", jobs_path(owner), body=config, params={"dryRun": "true"})
        if not dry_run:
            fs.upload_code(session, code, config["codeDir"])
            if output == "table":
                click.echo(f"sent {code} to {config['codeDir']}", err=True)
    answer = client.call("POST", jobs_path(owner), body=config,
                         params={"dryRun": "true"} if dry_run else None)
    ignored = answer.get("ignoredFields") or []
    if ignored and output == "table":
        click.echo(f"note: accepted but not acted on: {', '.join(ignored)}", err=True)
    for note in answer.get("notes") or [] if output == "table" else []:
        click.echo(f"note: {note}", err=True)
    if dry_run:
        if output == "json":
            print_json(answer)
        else:
            click.echo(f"job config {answer['config'].get('jobName')} is valid "
                       "(dry run: nothing submitted)")
        return
    name = answer["name"]
    answer["url"] = client.url(answer.get("url") or job_path(owner, name))
    if output == "table":
        click.echo(f"submitted job {name} ({answer.get('state')})")
        click.echo(answer["url"])
    if not wait:
        if output == "json":
            print_json(answer)
        return
    detail = follow_job(client, owner, name, timeout)
    if output == "json":
        print_json({**answer, "jobStatus": detail["jobStatus"]})
        sys.exit(exit_code_for(detail["jobStatus"]))
    sys.exit(_finish(name, detail))


def _gpu_counts(client: Client, rows: list[dict[str, Any]]) -> dict[str, int | None]:
    """GPUs each listed job asks for: the row's `gpus` when the API sends it, else
    from the job's config (fetched for the shown rows only, in parallel)."""
    counts: dict[str, int | None] = {r["name"]: r["gpus"] for r in rows if "gpus" in r}
    missing = [r for r in rows if "gpus" not in r]

    def lookup(row: dict[str, Any]) -> int | None:
        try:
            config = client.call("GET", job_path(row["username"], row["name"], "config"))
        except ApiError:
            return None  # another user's job: its config is not ours to read
        roles = config.get("taskRoles") or [] if isinstance(config, dict) else []
        return sum(int(r.get("gpuNumber") or 0) * int(r.get("taskNumber") or 1)
                   for r in roles)

    if missing:
        with ThreadPoolExecutor(max_workers=min(GPU_LOOKUPS, len(missing))) as pool:
            for row, count in zip(missing, pool.map(lookup, missing), strict=True):
                counts[row["name"]] = count
    return counts


@click.command("jobs")
@click.option("--user", "-u", "user", metavar="USER", help="List USER's jobs.")
@click.option("--all", "all_users", is_flag=True, help="List every user's jobs.")
@click.option("--state", type=click.Choice(JOB_STATES, case_sensitive=False),
              help="Only jobs in this state.")
@click.option("--vc", metavar="VC", help="Only jobs in this virtual cluster.")
@click.option("--keyword", metavar="TEXT", help="Only jobs whose name contains TEXT.")
@click.option("--waiting", is_flag=True,
              help="Only waiting jobs, each with why it waits (`pai status` tells more).")
@click.option("--limit", "-n", type=click.IntRange(1, 1000), default=20, show_default=True,
              help="Show at most this many, newest first.")
@click.option("--sort", type=click.Choice(JOB_SORTS), default="submitTime", show_default=True,
              help="Sort every matching job by this field (equal ones newest first).")
@click.option("--asc", "ascending", is_flag=True,
              help="Smallest (oldest, A to Z) first; the default is the other way.")
@output_option()
@pass_session
def list_jobs(session: Session, user: str | None, all_users: bool, state: str | None,
              vc: str | None, keyword: str | None, waiting: bool, limit: int, sort: str,
              ascending: bool, output: str) -> None:
    """List jobs, newest first or by --sort (default: the logged-in user's)."""
    if user and all_users:
        raise click.UsageError("--user and --all exclude each other")
    if waiting and state and state.upper() != "WAITING":
        raise click.UsageError("--waiting and --state exclude each other")
    state = "WAITING" if waiting else state
    client = session.client()
    params = {"username": None if all_users else session.owner(user), "vc": vc,
              "state": state.upper() if state else None, "keyword": keyword,
              "limit": limit, "withTotalCount": "true", "sort": sort,
              "order": "asc" if ascending else "desc"}
    answer = client.call("GET", "/api/v1/jobs", params=params)
    rows: list[dict[str, Any]] = answer["data"] if isinstance(answer, dict) else answer
    total = answer.get("totalCount") if isinstance(answer, dict) else None
    if output == "json":
        print_json(rows)
        return
    out = console()
    if not rows:
        out.print("no jobs")
        return
    out.print(jobs_table(rows, _gpu_counts(client, rows), now_ms(), waiting=waiting))
    if isinstance(total, int) and total > len(rows):
        out.print(f"{len(rows)} of {total} jobs; --limit shows more", style="dim",
                  highlight=False)


@click.command()
@click.argument("name")
@user_option
@output_option()
@pass_session
def status(session: Session, name: str, user: str | None, output: str) -> None:
    """Show a job: its state, why it waits, its attempts and tasks."""
    detail = session.client().call("GET", job_path(session.owner(user), name))
    if output == "json":
        print_json(detail)
    else:
        console().print(job_view(detail, now_ms()))


@click.command()
@click.argument("name")
@click.option("--wait", is_flag=True, help="Wait until every container is gone.")
@timeout_option
@user_option
@pass_session
def stop(session: Session, name: str, wait: bool, timeout: float | None,
         user: str | None) -> None:
    """Stop a job (it is never retried)."""
    client, owner = session.client(), session.owner(user)
    answer = client.call("PUT", job_path(owner, name, "executionType"), body={"value": "STOP"})
    click.echo(f"stop requested for job {name} (now {answer.get('state')})")
    if wait:
        click.echo(final_line(name, follow_job(client, owner, name, timeout)["jobStatus"]))


@click.command()
@click.argument("name")
@timeout_option
@user_option
@output_option()
@pass_session
def wait(session: Session, name: str, timeout: float | None, user: str | None,
         output: str) -> None:
    """Wait for a job to end and exit with its code.

    0 when SUCCEEDED, the app's exit code when FAILED (1 if it has none), 130 when
    STOPPED."""
    detail = follow_job(session.client(), session.owner(user), name, timeout)
    if output == "json":
        print_json(detail)
        sys.exit(exit_code_for(detail["jobStatus"]))
    sys.exit(_finish(name, detail))


@click.command("config")
@click.argument("name")
@user_option
@output_option("json", "yaml")
@pass_session
def show_config(session: Session, name: str, user: str | None, output: str) -> None:
    """Print the config a job was submitted with (as stored)."""
    config = session.client().call("GET", job_path(session.owner(user), name, "config"))
    if output == "yaml":
        click.echo(yaml.safe_dump(config, sort_keys=False, allow_unicode=True), nl=False)
    else:
        print_json(config)
