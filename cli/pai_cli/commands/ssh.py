"""pai ssh: log in to a running task of a job that asked for SSH.

It reads the job's SSH access (GET .../ssh: the task's node IP and ssh
port, the job's private key), writes the key to a file only the user may
read, and runs OpenSSH's client with it. Host keys are remembered per job,
in a known_hosts file of its own under the CLI's config folder, and a new
host key is accepted only the first time (StrictHostKeyChecking=accept-new).
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import click

from pai_cli.api import job_path
from pai_cli.commands.execs import ARGV_KEY, _ExecCommand
from pai_cli.commands.logs import _pick_task
from pai_cli.session import CliError, Session, pass_session, user_option

SSH_FOLDER = "ssh"  # under the config file's folder
_UNSAFE = re.compile(r"[^A-Za-z0-9._~-]")


def ssh_folder(config_path: Path) -> Path:
    """Where pai ssh keeps known_hosts files (and --print's keys): 0700."""
    folder = config_path.parent / SSH_FOLDER
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    folder.chmod(0o700)
    return folder


def job_file_stem(cluster: str, owner: str, name: str, created: Any) -> str:
    """One job's files: a job submitted again under its name is another job,
    with other host keys, so its creation time is part of the name."""
    return _UNSAFE.sub("_", f"{cluster}-{owner}~{name}-{created}")


def ssh_command(ssh: str, key: Path | None, known_hosts: Path, ip: str, port: str,
                remote: list[str]) -> list[str]:
    """The OpenSSH client's argv for a task: its port, the job's key (none
    when the job authorizes only the user's own), this job's known hosts."""
    argv = [ssh, "-p", str(port), "-o", "StrictHostKeyChecking=accept-new",
            "-o", f"UserKnownHostsFile={known_hosts}"]
    if key is not None:
        argv += ["-i", str(key), "-o", "IdentitiesOnly=yes"]
    argv.append(f"root@{ip}")
    if remote:
        argv += ["--", *remote]
    return argv


def write_key(path: Path, text: str) -> None:
    """The private key in a file created 0600 (never readable by others, not
    even for a moment)."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(descriptor, "w") as out:
        out.write(text if text.endswith("\n") else text + "\n")
    path.chmod(0o600)


def _container(answer: dict[str, Any], name: str, role: str, index: int) -> dict[str, Any]:
    wanted = f"{role}-{index}"
    for container in answer.get("containers") or []:
        if container.get("id") == wanted:
            return dict(container)
    running = ", ".join(c.get("id", "?") for c in answer.get("containers") or []) or "none"
    raise CliError(f"task {role}[{index}] of job {name} is not running (running: {running})")


@click.command("ssh", cls=_ExecCommand,
               context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("name")
@click.argument("role", required=False)
@click.argument("index", required=False, type=click.IntRange(0), default=0)
@click.option("--print", "print_only", is_flag=True,
              help="Print the ssh command instead of running it (the key is then kept in "
                   "the CLI's config folder).")
@user_option
@pass_session
def ssh_command_line(session: Session, name: str, role: str | None, index: int,
                     print_only: bool, user: str | None) -> None:
    """Log in to a running task with SSH: NAME [ROLE] [INDEX] [-- COMMAND...]

    \b
    The job must have asked for SSH ("ssh": true, or v2's ssh plugin) and its
    image must have sshd. Default: task 0 of the first role.
        pai ssh mnist
        pai ssh mnist worker 1 -- nvidia-smi
        pai ssh mnist --print
    """
    remote = click.get_current_context().meta.get(ARGV_KEY) or []
    client, owner = session.client(), session.owner(user)
    cluster = session.active.name if session.active else "cluster"
    detail = client.call("GET", job_path(owner, name))
    role = _pick_task(detail, role, index)
    answer: dict[str, Any] = client.call("GET", job_path(owner, name, "ssh"))
    container = _container(answer, name, role, index)
    ssh = shutil.which("ssh")
    if ssh is None:
        raise CliError("the OpenSSH client (ssh) is not installed")
    folder = ssh_folder(session.config_path)
    stem = job_file_stem(cluster, owner, name, (detail.get("jobStatus") or {}).get(
        "createdTime", ""))
    known_hosts = folder / f"{stem}.known_hosts"
    pair = answer.get("keyPair")
    private = pair.get("privateKey") if isinstance(pair, dict) else None
    if print_only:
        key = folder / f"{stem}.key" if private else None
        if key is not None and private:
            write_key(key, private)
        click.echo(shlex.join(ssh_command(ssh, key, known_hosts, container["sshIp"],
                                          container["sshPort"], remote)))
        return
    sys.exit(_run(ssh, folder, private, known_hosts, container, remote))


def _run(ssh: str, folder: Path, private: str | None, known_hosts: Path,
         container: dict[str, Any], remote: list[str]) -> int:
    """Run ssh with the key in a file of its own, removed when ssh ends; ssh's
    exit code. Ctrl-C belongs to the session, not to pai."""
    key: Path | None = None
    try:
        if private:
            descriptor, named = tempfile.mkstemp(prefix="key-", dir=folder)
            os.close(descriptor)
            key = Path(named)
            write_key(key, private)
        argv = ssh_command(ssh, key, known_hosts, container["sshIp"], container["sshPort"],
                           remote)
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            return subprocess.call(argv)
        finally:
            signal.signal(signal.SIGINT, previous)
    finally:
        if key is not None:
            with contextlib.suppress(FileNotFoundError):
                key.unlink()
