"""The Docker side of a task: create and start its container, find it, stop it.

A container is named after its task (`containers.container_name`), so every
call is idempotent: a repeated start returns the container the first one
made, and two racing starts end with one container.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import docker
from docker.errors import APIError, ImageNotFound, NotFound
from docker.models.containers import Container
from docker.types import DeviceRequest, Mount
from docker.utils import socket as docker_socket

from services.launcher.mounts import TaskSetupError, plan_storage
from services.launcher.prerequisites import Runner, install_runner, runner_for
from shared.domain import ssh
from shared.domain.capabilities import dropped_capabilities
from shared.domain.models import JobSpec, Node, Task
from shared.infra.config import Settings
from shared.node import execs as node_execs
from shared.node.containers import LABEL_PREREQUISITES, TaskRef, made_for, task_labels
from shared.node.engine import EngineCalls
from shared.node.notices import warn_and_signal
from shared.state import execs

log = logging.getLogger("pai.launcher")

ENTRYPOINT = ["/bin/sh", "-c"]
NAME_CONFLICT = 409
NO_NEW_PRIVILEGES = "no-new-privileges"
# An exec's output is read in chunks of READ_BYTES, waking at least every
# POLL_SECONDS to check its deadline; its exit code is waited for at most
# shared/node/execs.py's EXIT_WAIT_SECONDS after its output ends (or after it
# was killed).
READ_BYTES = 64 * 1024
POLL_SECONDS = 1.0
MAX_KILLED = 4096  # processes one timed-out exec may have started (the pids limit's default)


class ImageUnavailable(Exception):
    """The job's image is not on the node and cannot be pulled."""


class DockerRuntime:
    def __init__(
        self, client: docker.DockerClient, settings: Settings, *,
        extra_labels: Mapping[str, str] | None = None,
    ) -> None:
        self.client = client
        self.engine = EngineCalls(client)  # create, start, remove, exec: the hot calls
        self.settings = settings
        self.extra_labels = dict(extra_labels or {})

    # ------------------------------------------------------------------ find

    def find(self, ref: TaskRef) -> Container | None:
        """The task's container; one of the same name made for an earlier
        submission of the job's name (a node cut off while that job ended)
        is stale: it is removed, never taken for this task's."""
        try:
            container = self.client.containers.get(ref.container_name)
        except NotFound:
            return None
        if made_for(container.labels, ref):
            return container
        log.warning("removing container %s: it was made for an earlier submission of %s",
                    container.name, ref.job_id)
        self._remove(container)
        return None

    # ----------------------------------------------------------------- start

    def start(
        self, ref: TaskRef, spec: JobSpec, username: str, vc: str, task: Task,
        env: Mapping[str, str], node: Node,
        prepare: Callable[[str], None] | None = None,
    ) -> str:
        """Create and start the task's container, or return the one there is;
        `prepare` (if any) gets the container's id after it is created and
        before it starts (a repeated launch: before a created one starts).

        It creates first and looks for an existing container only when the
        name is taken (a repeated launch): a launch costs Docker two calls
        (create, start) instead of four (look up, create, inspect, start).

        Raises ImageUnavailable, or TaskSetupError for what the user can fix
        (a missing dataDir, a container Docker refuses to create or start).
        """
        try:
            storage = plan_storage(spec, self.settings.storage_roots, node.name,
                                   reserved=self.settings.platform_dirs)
            runner = runner_for(spec, ref.role, self.settings.storage_roots, node.name,
                                hdfs_webhdfs_url=self.settings.hdfs_webhdfs_url,
                                reserved=self.settings.platform_dirs)
        except TaskSetupError:
            existing = self.find(ref)  # launched before the storage went away
            if existing is not None:
                return self._started(existing, prepare)
            raise
        role = spec.role(ref.role)
        mounts = storage.mounts + (runner.mounts if runner else ())
        labels = task_labels(ref, node=node.name, username=username, vc=vc)
        if runner is not None:
            labels[LABEL_PREREQUISITES] = runner.label
            prepare = self._with_runner(runner, prepare)
        host_config = self.client.api.create_host_config(
            network_mode="host",
            nano_cpus=min(role.cpu_number, node.real_cpus or role.cpu_number) * 10**9,
            mem_limit=f"{role.memory_mb}m",
            memswap_limit=f"{role.memory_mb}m",  # equal to memory: no swap at all
            shm_size=f"{role.shm_mb}m" if role.shm_mb else None,
            mounts=[Mount(m.target, m.source, type="bind", read_only=m.read_only)
                    for m in mounts],
            device_requests=self._device_requests(task, node),
            **self._confinement(spec),
        )
        options: dict[str, Any] = {
            "name": ref.container_name,
            "entrypoint": ENTRYPOINT,
            "labels": {**self.extra_labels, **labels},
            "environment": dict(env),
            "working_dir": storage.working_dir,
            "host_config": host_config,
        }
        try:
            command = runner.command if runner is not None else role.command
            container_id = self._create_or_find(spec, command, options, ref)
        except APIError as error:
            raise TaskSetupError(f"Docker refused the container: {_explain(error)}") from None
        if not isinstance(container_id, str):
            return self._started(container_id, prepare)
        log.debug("created %s for %s", ref.container_name, ref)  # "started" follows at INFO
        return self._start_created(container_id, prepare)

    def _create_or_find(self, spec: JobSpec, command: str, options: dict[str, Any],
                        ref: TaskRef) -> str | Container:
        """The new container's id, or the task's container a repeated (or
        concurrent) launch made; a stale one in the way is removed first."""
        for _ in range(2):
            try:
                return self._create(spec.image, [command], options, spec.image_auth)
            except APIError as error:
                if error.status_code != NAME_CONFLICT:
                    raise
                existing = self.find(ref)
                if existing is not None:
                    return existing
        raise TaskSetupError(f"container {ref.container_name} keeps being made by another")

    def _with_runner(self, runner: Runner, prepare: Callable[[str], None] | None
                     ) -> Callable[[str], None]:
        """`prepare`, after the runner's files are in the created container."""
        def both(container_id: str) -> None:
            install_runner(self.client.api, container_id, runner)
            if prepare is not None:
                prepare(container_id)
        return both

    def _create(self, image: str, command: list[str], options: dict[str, Any],
                auth: Mapping[str, str] | None = None) -> str:
        """Create; a missing image is pulled once (not looked up first: the
        common case, an image already here, costs no extra round trip), with
        the job's registry login when it has one."""
        try:
            return self.engine.create_container(image, command, **options)
        except ImageNotFound:
            self.pull(image, auth)
        try:
            return self.engine.create_container(image, command, **options)
        except ImageNotFound:
            raise ImageUnavailable(f"image {image} vanished right after its pull") from None

    def _started(self, container: Container,
                 prepare: Callable[[str], None] | None = None) -> str:
        """Start a container that was created but never started; its id."""
        if container.status != "created":
            return str(container.id)
        return self._start_created(str(container.id), prepare)

    def _start_created(self, container_id: str,
                       prepare: Callable[[str], None] | None = None) -> str:
        try:
            if prepare is not None:
                prepare(container_id)
            self.engine.start(container_id)
        except NotFound:
            return container_id  # removed meanwhile: its exit was handled elsewhere
        except APIError as error:
            # e.g. the image has no /bin/sh: it will never start, so do not leave it.
            self._remove(container_id)
            raise TaskSetupError(f"the container did not start: {_explain(error)}") from None
        return container_id

    def _confinement(self, spec: JobSpec) -> dict[str, Any]:
        """What keeps job code (untrusted, on the host's network) off the host.

        - never privileged, and `no-new-privileges`: no setuid binary or file
          capability raises a process above what the container started with;
        - the capabilities of shared/domain/capabilities.py DROPPED removed from
          Docker's default set (NET_RAW, MKNOD, SYS_CHROOT, AUDIT_WRITE,
          SETFCAP, SETPCAP, NET_BIND_SERVICE; each with its reason there),
          keeping CHOWN, DAC_OVERRIDE, FOWNER, FSETID, KILL, SETUID, SETGID so
          images that start as root and drop to a user still work;
        - the job's `extras.capabilities` added back: the API admitted them
          only because the VC's admin-set allow-list names them;
        - SYS_CHROOT back for a job that asked for SSH: the image's sshd
          chroots its pre-authentication child (shared/domain/ssh.py);
        - a pids limit, so a fork bomb stops inside its container;
        - `--init`: PID 1 forwards the stop signal and reaps zombies.
        """
        requested = set(spec.capabilities)
        if spec.ssh is not None:  # sshd's privilege separation chroots (shared/domain/ssh.py)
            requested |= set(ssh.CAPABILITIES)
        return {
            "privileged": False,
            "security_opt": [NO_NEW_PRIVILEGES],
            "cap_drop": [c for c in dropped_capabilities(self.settings.port_range)
                         if c not in requested],
            "cap_add": sorted(requested) or None,
            "pids_limit": self.settings.container_pids_limit,
            "init": True,
        }

    def _device_requests(self, task: Task, node: Node) -> list[DeviceRequest]:
        if not node.nvidia_runtime or not task.gpus:
            return []
        return [DeviceRequest(device_ids=[str(i) for i in task.gpus], capabilities=[["gpu"]])]

    def pull(self, image: str, auth: Mapping[str, str] | None = None) -> None:
        """Pull the image once, logged in to its registry as `auth` says (the
        job's `imageAuth`: never logged); ImageUnavailable if that fails."""
        log.info("pulling image %s%s", image, " with the job's registry login" if auth else "")
        login = None
        if auth:
            login = {"username": auth["username"], "password": auth.get("password", "")}
            if auth.get("registryuri"):
                login["serveraddress"] = auth["registryuri"]
        try:
            self.client.images.pull(image, auth_config=login)
        except APIError as error:
            raise ImageUnavailable(f"image {image} cannot be pulled: {_explain(error)}") from None

    # ------------------------------------------------------------------ stop

    def _ever_started(self, ref: TaskRef) -> Container | None:
        """The task's container if it ever started; one only created is
        removed (it never ran: the caller settles the task)."""
        container = self.find(ref)
        if container is not None and container.status == "created":
            self._remove(container)
            return None
        return container

    def stop(self, ref: TaskRef, timeout: int = 10) -> bool:
        """Stop the task's container: True when one had started (its exit is
        then seen by the monitor); False when there is none, or it never
        started (it is removed, and the caller settles the task)."""
        container = self._ever_started(ref)
        if container is None:
            return False
        with contextlib.suppress(NotFound):  # gone meanwhile: the monitor saw it exit
            container.stop(timeout=timeout)
        return True

    def warn(self, ref: TaskRef, path: str, text: str) -> bool:
        """Write `text` at `path` in the task's running container, then send it
        SIGTERM (its init passes it on). False when no container started (one
        only created is removed; the caller settles the task)."""
        container = self._ever_started(ref)
        if container is None:
            return False
        warn_and_signal(container, path, text)
        return True

    # ------------------------------------------------------------------ exec

    def exec_in(self, container_id: str, argv: list[str], timeout: float,
                max_output: int = execs.MAX_OUTPUT_BYTES) -> ExecOutput:
        """Run `argv` in the running container, as its user with its
        environment, stdout and stderr read as they come (at most
        `max_output` bytes kept). Past `timeout` the command is killed (see
        `_kill_exec`). APIError / NotFound when Docker refuses (the container
        stopped)."""
        exec_id = self.engine.exec_create(container_id, argv, stdout=True, stderr=True,
                                          stdin=False, tty=False)
        sock, early = self.engine.exec_attach(exec_id)
        cap = execs.OutputCap(max_output)
        deadline = time.monotonic() + timeout
        timed_out = False
        frames, pending = execs.demux(early)  # output that came with the engine's answer
        for _, payload in frames:
            cap.feed(payload)
        try:
            poller = select.poll()
            poller.register(sock, select.POLLIN | select.POLLPRI | select.POLLHUP)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    timed_out = True
                    break
                if not poller.poll(min(left, POLL_SECONDS) * 1000):
                    continue
                chunk = docker_socket.read(sock, READ_BYTES)
                if not chunk:
                    break  # the command closed its output: it ended
                frames, pending = execs.demux(pending + chunk)
                for _, payload in frames:
                    cap.feed(payload)
        finally:
            close_exec_socket(sock)
        if timed_out:
            self._kill_exec(exec_id)
        return ExecOutput(self.exit_code(exec_id), cap.text(), cap.truncated, timed_out)

    def exit_code(self, exec_id: str) -> int | None:
        """The exec's exit code once Docker has it (it follows the end of the
        output closely); None if it does not within node_execs.EXIT_WAIT_SECONDS."""
        return node_execs.exit_code(self.engine, exec_id)

    def _kill_exec(self, exec_id: str) -> None:
        """SIGKILL the exec'd process and what it started. Docker has no call
        for it: its host PID comes from exec_inspect, and each process is
        killed only when /proc/<pid>/cgroup puts it in the exec's container
        (a PID reused by another process since is left alone). The launcher
        needs the host's PID namespace for this (docs/debugging.md)."""
        info = self.client.api.exec_inspect(exec_id)
        pid, container_id = int(info.get("Pid") or 0), str(info.get("ContainerID") or "")
        if not info.get("Running") or pid <= 0:
            return
        killed = 0
        for target in [pid, *_descendants(pid)]:
            try:
                with open(f"/proc/{target}/cgroup") as cgroup:
                    inside = execs.in_container(cgroup.read(), container_id)
                if inside:
                    os.kill(target, signal.SIGKILL)
                    killed += 1
            except (FileNotFoundError, ProcessLookupError):
                continue  # it ended meanwhile
            except OSError as error:
                log.warning("cannot kill exec process %d of %s: %s", target, container_id[:12],
                            error)
        if not killed:
            log.warning("exec %s of container %s outlived its timeout and could not be killed "
                        "(is the launcher in the host's PID namespace?)", exec_id[:12],
                        container_id[:12])

    def _remove(self, container: Container | str) -> None:
        container_id = container if isinstance(container, str) else str(container.id)
        try:
            self.engine.remove_container(container_id, force=True)
        except NotFound:
            pass
        except APIError as error:
            log.warning("could not remove container %s: %s", container_id[:12],
                        _explain(error))


@dataclass(frozen=True)
class ExecOutput:
    exit_code: int | None
    output: str
    truncated: bool
    timed_out: bool


def close_exec_socket(sock: Any) -> None:
    """Hang up an exec's attach socket for good. docker-py's `socket=True`
    answer is a SocketIO over the connection's socket, which its HTTP response
    keeps open: closing the SocketIO alone leaves the engine attached until the
    response is collected, and an engine still attached to an exec's output
    takes 20 s to stop its container (it waits 10 s for the exit, then 10 more
    after a direct SIGKILL)."""
    raw = getattr(sock, "_sock", sock)
    with contextlib.suppress(OSError):
        raw.shutdown(socket.SHUT_RDWR)
    for closing in (sock, raw):
        with contextlib.suppress(OSError):
            closing.close()


def _descendants(pid: int) -> list[int]:
    """Every process below `pid`, from /proc's parent links (children first
    found, then theirs)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                text = stat.read()
        except OSError:
            continue
        # the command name, in parentheses, may hold spaces: the fields follow its last ')'
        rest = text[text.rfind(")") + 2:].split()
        if len(rest) > 1:
            children.setdefault(int(rest[1]), []).append(int(entry))
    found: list[int] = []
    queue = [pid]
    while queue and len(found) < MAX_KILLED:
        for child in children.get(queue.pop(0), []):
            found.append(child)
            queue.append(child)
    return found


def _explain(error: APIError) -> str:
    return str(error.explanation or error)
