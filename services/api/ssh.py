"""SSH into a job's tasks: OpenPAI's `GET .../ssh`, and the key files it names.

Only the job's owner and admins read it (others: 403, or 404 where the job
is not theirs to see), as for the job's config. Every answer that carries
the job's private key is audited: an `ssh-key-read` event on the job's
stream (who read it), a line in the service log, and the counter
pai_task_ssh_key_reads_total{user}, written together. The key itself is
never logged, nor put in the event.
"""

from __future__ import annotations

import logging
from typing import Any

from flask import Blueprint, Response

from services.api.auth import current_user
from services.api.errors import ApiError
from services.api.jobs import get_job_or_404
from services.api.platform import platform
from shared.domain import ssh
from shared.domain.models import Job, JobSpec, Task
from shared.domain.states import TaskState
from shared.state import sshkeys, telemetry
from shared.state.store import Store

bp = Blueprint("ssh", __name__, url_prefix="/api/v1")
log = logging.getLogger("pai.api")

PUBLIC_SUFFIX = ".pub"


def containers(tasks: list[Task]) -> list[dict[str, str]]:
    """The running tasks' sshd addresses, by role then index (OpenPAI's `containers`)."""
    found = []
    for task in sorted(tasks, key=lambda t: (t.role, t.index)):
        ports = task.ports.get(ssh.PORT_LABEL) or []
        if task.state == TaskState.RUNNING and task.ip and ports:
            found.append({"id": f"{task.role}-{task.index}", "sshIp": task.ip,
                          "sshPort": str(ports[0])})
    return found


def key_pair(folder: str, job_name: str, pair: ssh.KeyPair) -> dict[str, str]:
    """OpenPAI's `keyPair`: its file names, served under `folder`, and the keys."""
    return {"folderPath": folder, "publicKeyFileName": f"{job_name}{PUBLIC_SUFFIX}",
            "privateKeyFileName": job_name,
            "privateKeyDirectDownloadLink": f"{folder}/{job_name}",
            "publicKey": pair.public_key, "privateKey": pair.private_key}


def _ssh_job(username: str, name: str) -> tuple[Job, JobSpec]:
    job = get_job_or_404(username, name, owner_only=True, action="read the SSH access")
    config = platform().store.get_config(job.id)
    spec = JobSpec.from_config(config) if config is not None else None
    if spec is None or spec.ssh is None:
        raise ApiError("NoSshError", f"job {name} did not ask for SSH: submit it with "
                       "\"ssh\": true (v1) or the ssh runtime plugin (v2)", 404)
    return job, spec


def _key_pair(job: Job) -> ssh.KeyPair:
    pair = sshkeys.read_key(platform().store.r, job.id)
    if pair is None:  # finished and compacted: the key went with the job's other records
        raise ApiError("NoSshError", f"job {job.name} has no SSH key any more (it ended and "
                       "its records were compacted)", 404)
    return pair


def _audit(store: Store, job: Job, what: str) -> None:
    """Who read the job's private key: the event, the counter, the log line."""
    reader = current_user().username
    pipe = store.pipeline(atomic=True)
    store.add_event(pipe, job.id, "ssh-key-read", user=reader, via=what)
    telemetry.record(pipe, telemetry.TASK_SSH_KEY_READS, {"user": reader})
    pipe.execute()
    log.info("ssh key of job %s read by %s (%s)", job.id, reader, what)


@bp.get("/user/<username>/jobs/<name>/ssh")
def info(username: str, name: str) -> dict[str, Any]:
    """SSH into the job's running tasks: their addresses and the job's key pair
    (OpenPAI's shape); reading it is audited.
    ---
    get:
      errors: [403, 404]
      responses:
        200:
          content: {application/json: {schema: SshInfo}}
    """
    job, spec = _ssh_job(username, name)
    store = platform().store
    tasks = store.get_tasks(job.id, job.attempt)
    pair = None
    if spec.ssh is not None and spec.ssh.job_key:
        pair = key_pair(f"/api/v1/user/{job.username}/jobs/{job.name}/ssh", job.name,
                        _key_pair(job))
        _audit(store, job, "ssh")
    return {"containers": containers(tasks), "keyPair": pair}


@bp.get("/user/<username>/jobs/<name>/ssh/<filename>")
def key_file(username: str, name: str, filename: str) -> Response:
    """One of the job's key files named in keyPair (`<job>` the private key,
    `<job>.pub` the public one), as text; reading the private one is audited.
    ---
    get:
      errors: [403, 404]
      responses:
        200:
          content: {text/plain: {schema: {type: string}}}
    """
    job, spec = _ssh_job(username, name)
    if spec.ssh is None or not spec.ssh.job_key \
            or filename not in (job.name, job.name + PUBLIC_SUFFIX):
        raise ApiError("NoSshError", f"job {name} has no SSH key file {filename!r}", 404)
    pair = _key_pair(job)
    if filename == job.name:
        _audit(platform().store, job, "key file")
        return Response(pair.private_key, mimetype="text/plain")
    return Response(pair.public_key + "\n", mimetype="text/plain")
