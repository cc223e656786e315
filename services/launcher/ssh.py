"""SSH in a task's container: its authorized keys, and the image's sshd.

For a job that asked for SSH (shared/domain/ssh.py), the launcher

1. writes /root/.ssh/authorized_keys (0600, in /root/.ssh 0700, owned by
   root) into the container after Docker created it and before it starts
   (`install_keys`, Docker's archive upload): the job's code has not run
   yet, so nothing it does can make the path point elsewhere, and the file
   is the container's own (no host path is mounted for it);
2. once the container runs, starts the image's /usr/sbin/sshd as root on
   the task's `ssh` port (`start_sshd`, one Docker exec): host keys made in
   the container (`ssh-keygen -A`) when the image has none, password logins
   off, root by key only, and PAM off (pam_loginuid needs a capability no
   job container has; the keys are the only way in).

An image without sshd runs on: the task's log says SSH is not available
(a line written to the container's standard output, which the monitor ships
like the job's own), and the job's events record it.
"""

from __future__ import annotations

import io
import logging
import tarfile
import time
from dataclasses import dataclass

from docker import APIClient
from docker.errors import APIError, NotFound

from shared.domain import ssh
from shared.node import execs

log = logging.getLogger("pai.launcher")

SSHD = "/usr/sbin/sshd"  # sshd re-executes itself, so it must be named by absolute path
NO_SSHD_EXIT = 127
LOG_PREFIX = "[pai]"

# `say` writes to the container's standard output (PID 1's, the init
# process Docker's --init runs), so the line lands in the task's log.
_SCRIPT = """\
say() {{ echo "{prefix} $*" >/proc/1/fd/1 2>/dev/null || :; echo "{prefix} $*"; }}
if [ ! -x {sshd} ]; then
  say "SSH is not available in this task: its image has no {sshd} (install openssh-server)"
  exit {missing}
fi
if [ -s {pid} ] && kill -0 "$(cat {pid})" 2>/dev/null; then
  echo "{prefix} sshd runs already"; exit 0  # a start message delivered again
fi
rm -f {pid}
mkdir -p /run/sshd && chmod 0755 /run/sshd || exit 1
ssh-keygen -A >/dev/null || {{ say "SSH is not available: ssh-keygen -A failed"; exit 1; }}
{sshd} -p {port} -o PidFile={pid} -o PasswordAuthentication=no \
  -o KbdInteractiveAuthentication=no -o PermitRootLogin=prohibit-password -o UsePAM=no \
  || {{ say "SSH is not available: sshd did not start"; exit 1; }}
# sshd goes to the background before it listens, and writes its pid file once it does
waited=0
until [ -s {pid} ]; do
  waited=$((waited + 1))
  if [ "$waited" -gt {polls} ]; then
    say "SSH is not available: sshd did not listen on port {port} (is it taken?)"; exit 1
  fi
  sleep 0.1
done
say "sshd listens on port {port} (root, by key only)"
"""
PID_FILE = "/run/sshd.pid"
LISTEN_POLLS = 100  # of 0.1 s: how long sshd may take to listen


def sshd_script(port: int) -> str:
    """The shell script one exec runs to start sshd on `port`."""
    return _SCRIPT.format(prefix=LOG_PREFIX, sshd=SSHD, missing=NO_SSHD_EXIT, port=int(port),
                          pid=PID_FILE, polls=LISTEN_POLLS)


def keys_archive(authorized_keys: str, mtime: float | None = None) -> bytes:
    """A tar of /root/.ssh (0700) and its authorized_keys (0600), root-owned,
    for Docker's archive upload at `/`. /root itself is left as the image
    has it."""
    data = authorized_keys.encode()
    stamp = int(time.time() if mtime is None else mtime)
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        folder = tarfile.TarInfo("root/.ssh")
        folder.type, folder.mode, folder.mtime = tarfile.DIRTYPE, 0o700, stamp
        tar.addfile(folder)
        info = tarfile.TarInfo(ssh.AUTHORIZED_KEYS.lstrip("/"))
        info.size, info.mode, info.mtime = len(data), 0o600, stamp
        tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


@dataclass(frozen=True)
class SshdOutcome:
    started: bool
    message: str


def install_keys(api: APIClient, container_id: str, authorized_keys: str) -> None:
    """Upload the authorized keys into a created (not yet started) container.
    Docker's errors propagate: a task of an SSH job that cannot get its keys
    does not start as if it had them."""
    api.put_archive(container_id, "/", keys_archive(authorized_keys))


def start_sshd(api: APIClient, container_id: str, port: int) -> SshdOutcome:
    """Start the image's sshd in the running container on `port`."""
    try:
        exec_id = api.exec_create(container_id, ["/bin/sh", "-c", sshd_script(port)],
                                  user="0", stdout=True, stderr=True)["Id"]
        output = api.exec_start(exec_id)
        code = execs.exit_code(api, exec_id)
    except (NotFound, APIError) as error:
        return SshdOutcome(False, f"sshd not started: the container does not run ({error})")
    text = (output or b"").decode(errors="replace").strip()
    last = text.splitlines()[-1] if text else ""
    message = last.removeprefix(LOG_PREFIX).strip() or f"the sshd script exited {code}"
    return SshdOutcome(code == 0, message)
