"""The Docker side of a task: create and start its container, find it, stop it.

A container is named after its task (`containers.container_name`), so every
call is idempotent: a repeated start returns the container the first one
made, and two racing starts end with one container.
"""

from __future__ import annotations

import contextlib
import io
import logging
import tarfile
import time
from collections.abc import Mapping
from typing import Any

import docker
from docker.errors import APIError, ImageNotFound, NotFound
from docker.models.containers import Container
from docker.types import DeviceRequest, Mount

from services.launcher.mounts import TaskSetupError, plan_storage
from shared.capabilities import dropped_capabilities
from shared.config import Settings
from shared.containers import TaskRef, task_labels
from shared.models import JobSpec, Node, Task

log = logging.getLogger("pai.launcher")

ENTRYPOINT = ["/bin/sh", "-c"]
NAME_CONFLICT = 409
NO_NEW_PRIVILEGES = "no-new-privileges"


class ImageUnavailable(Exception):
    """The job's image is not on the node and cannot be pulled."""


class DockerRuntime:
    def __init__(
        self, client: docker.DockerClient, settings: Settings, *,
        extra_labels: Mapping[str, str] | None = None,
    ) -> None:
        self.client = client
        self.settings = settings
        self.extra_labels = dict(extra_labels or {})

    # ------------------------------------------------------------------ find

    def find(self, ref: TaskRef) -> Container | None:
        try:
            return self.client.containers.get(ref.container_name)
        except NotFound:
            return None

    # ----------------------------------------------------------------- start

    def start(
        self, ref: TaskRef, spec: JobSpec, username: str, vc: str, task: Task,
        env: Mapping[str, str], node: Node,
    ) -> str:
        """Create and start the task's container, or return the one there is.

        It creates first and looks for an existing container only when the
        name is taken (a repeated launch): a launch costs Docker two calls
        (create, start) instead of four (look up, create, inspect, start).

        Raises ImageUnavailable, or TaskSetupError for what the user can fix
        (a missing dataDir, a container Docker refuses to create or start).
        """
        try:
            storage = plan_storage(spec, self.settings.storage_roots, node.name,
                                   reserved=self.settings.platform_dirs)
        except TaskSetupError:
            existing = self.find(ref)  # launched before the storage went away
            if existing is not None:
                return self._started(existing)
            raise
        role = spec.role(ref.role)
        host_config = self.client.api.create_host_config(
            network_mode="host",
            nano_cpus=min(role.cpu_number, node.real_cpus or role.cpu_number) * 10**9,
            mem_limit=f"{role.memory_mb}m",
            memswap_limit=f"{role.memory_mb}m",  # equal to memory: no swap at all
            shm_size=f"{role.shm_mb}m" if role.shm_mb else None,
            mounts=[Mount(m.target, m.source, type="bind", read_only=m.read_only)
                    for m in storage.mounts],
            device_requests=self._device_requests(task, node),
            **self._confinement(spec),
        )
        options: dict[str, Any] = {
            "name": ref.container_name,
            "entrypoint": ENTRYPOINT,
            "labels": {**self.extra_labels,
                       **task_labels(ref, node=node.name, username=username, vc=vc)},
            "environment": dict(env),
            "working_dir": storage.working_dir,
            "host_config": host_config,
        }
        try:
            container_id = self._create(spec.image, [role.command], options)
        except APIError as error:
            if error.status_code == NAME_CONFLICT:
                existing = self.find(ref)  # a repeated or concurrent launch made it
                if existing is not None:
                    return self._started(existing)
            raise TaskSetupError(f"Docker refused the container: {_explain(error)}") from None
        log.info("created %s for %s", ref.container_name, ref)
        return self._start_created(container_id)

    def _create(self, image: str, command: list[str], options: dict[str, Any]) -> str:
        """Create; a missing image is pulled once (not looked up first: the
        common case, an image already here, costs no extra round trip)."""
        try:
            return str(self.client.api.create_container(image, command, **options)["Id"])
        except ImageNotFound:
            self.pull(image)
        try:
            return str(self.client.api.create_container(image, command, **options)["Id"])
        except ImageNotFound:
            raise ImageUnavailable(f"image {image} vanished right after its pull") from None

    def _started(self, container: Container) -> str:
        """Start a container that was created but never started; its id."""
        if container.status != "created":
            return str(container.id)
        return self._start_created(str(container.id))

    def _start_created(self, container_id: str) -> str:
        try:
            self.client.api.start(container_id)
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
        - the capabilities of shared/capabilities.py DROPPED removed from
          Docker's default set (NET_RAW, MKNOD, SYS_CHROOT, AUDIT_WRITE,
          SETFCAP, SETPCAP, NET_BIND_SERVICE; each with its reason there),
          keeping CHOWN, DAC_OVERRIDE, FOWNER, FSETID, KILL, SETUID, SETGID so
          images that start as root and drop to a user still work;
        - the job's `extras.capabilities` added back: the API admitted them
          only because the VC's admin-set allow-list names them;
        - a pids limit, so a fork bomb stops inside its container;
        - `--init`: PID 1 forwards the stop signal and reaps zombies.
        """
        requested = set(spec.capabilities)
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

    def pull(self, image: str) -> None:
        """Pull the image once; ImageUnavailable if that fails."""
        log.info("pulling image %s", image)
        try:
            self.client.images.pull(image)
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
        folder, _, name = path.rpartition("/")
        data = text.encode()
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w") as tar:
            info = tarfile.TarInfo(f"{folder.strip('/')}/{name}")
            info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
            tar.addfile(info, io.BytesIO(data))
        try:
            container.put_archive("/", archive.getvalue())
        except NotFound:
            return True  # gone meanwhile: the monitor saw it exit
        except APIError as error:  # the job made the path unwritable: it still gets the signal
            log.warning("cannot write %s in %s: %s", path, container.name, _explain(error))
        with contextlib.suppress(NotFound, APIError):  # exited meanwhile
            container.kill(signal="SIGTERM")
        return True

    def _remove(self, container: Container | str) -> None:
        container_id = container if isinstance(container, str) else str(container.id)
        try:
            self.client.api.remove_container(container_id, force=True)
        except NotFound:
            pass
        except APIError as error:
            log.warning("could not remove container %s: %s", container_id[:12],
                        _explain(error))


def _explain(error: APIError) -> str:
    return str(error.explanation or error)
