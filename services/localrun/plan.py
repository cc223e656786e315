"""What `pai run --local` would start: a job's tasks on this machine, planned
with the platform's own code. No Docker here.

The config is validated exactly as the API validates a submit (v1, or
protocol v2 converted), and each task's environment is the launcher's
(`task_environment`): every task is placed on this machine at 127.0.0.1,
with free ports of this machine for its own port and its `portList`
labels, so peers find each other through the same PAI_* variables as on a
cluster. One local storage root stands for the cluster's
(`$PAI_DEFAULT_FS_URI`): the job's folders must lie under it as on the
cluster (`<root>/<user>/...`), and a job without `outputDir` gets
`<root>/<user>/<job>/output`.

What differs from a cluster, and is said in the plan's notes: no GPUs (a
task sees none; PAI_TASK_GPU_NUM still says what it asked), no retries, no
queue, and ports from this machine's free ones.
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from services.launcher.environment import task_environment
from services.launcher.mounts import CODE_MOUNT, host_path
from shared.domain import storage
from shared.domain.jobspec import InvalidJobConfig, ValidatedConfig, validate_job_config
from shared.domain.jobspec_v2 import ConvertedConfig, convert_v2, is_v2
from shared.domain.models import JobSpec, Task
from shared.domain.states import TaskState

LOCAL_IP = "127.0.0.1"


@dataclass(frozen=True)
class LocalTask:
    """One task's container, as the launcher would make it here."""

    task: Task
    environment: dict[str, str]

    @property
    def label(self) -> str:
        return f"{self.task.role}[{self.task.index}]"


@dataclass(frozen=True)
class LocalPlan:
    spec: JobSpec
    username: str
    storage_root: str
    run_id: str
    tasks: tuple[LocalTask, ...]
    ignored: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def job_id(self) -> str:
        """The id its containers are named and labelled by: the job's own,
        marked local and made unique, so a local run never meets a cluster
        task's container on a shared engine."""
        return f"{self.username}~{self.spec.name}-local-{self.run_id}"


def free_ports() -> Callable[[], int]:
    """A source of ports nobody listens on at 127.0.0.1 now, never the same
    one twice (the system may hand a closed probe's port out again)."""
    given: set[int] = set()

    def port() -> int:
        while True:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind((LOCAL_IP, 0))
                found: int = sock.getsockname()[1]
            if found not in given:
                given.add(found)
                return found

    return port


def validated_config(raw: Any, username: str, storage_root: str
                     ) -> ValidatedConfig | ConvertedConfig:
    """The API's validation of a submit, and its storage rule for a user who
    is not an admin (outputDir in `<root>/<user>/`, dataDir and codeDir
    there too: a local run has no shares); InvalidJobConfig naming each field."""
    if is_v2(raw):
        validated: ValidatedConfig | ConvertedConfig = convert_v2(
            raw, username=username, storage_roots=[storage_root])
    else:
        validated = validate_job_config(raw, username=username, storage_roots=[storage_root])
    refused = storage.refusals(validated.config, [storage_root], storage.Caller(username))
    if refused:
        raise InvalidJobConfig(
            f"the job may not mount {', '.join(sorted(refused))}: outputDir must be in your "
            f"own folder <root>/{username}/, dataDir and codeDir there too", refused)
    return validated


def placed_tasks(spec: JobSpec, ports: Callable[[], int]) -> list[Task]:
    """Every task of the job on this machine, each port from `ports()`."""
    tasks: list[Task] = []
    for role in spec.task_roles:
        for index in range(role.task_number):
            task_ports = {"default": [ports()]}
            for wanted in role.ports:
                task_ports[wanted.label] = [ports() for _ in range(wanted.port_number)]
            tasks.append(Task(role=role.name, index=index, state=TaskState.LAUNCHING,
                              node="local", ip=LOCAL_IP, gpus=[], ports=task_ports))
    return tasks


def plan_run(raw: Mapping[str, Any], *, username: str, storage_root: str,
             ports: Callable[[], int] | None = None, run_id: str | None = None) -> LocalPlan:
    """The containers of a local run of `raw`, or InvalidJobConfig."""
    validated = validated_config(dict(raw), username, storage_root)
    spec = JobSpec.from_config(validated.config)
    tasks = placed_tasks(spec, ports or free_ports())
    planned = tuple(LocalTask(task, _local_environment(spec, username, tasks, task,
                                                       storage_root))
                    for task in tasks)
    notes = list(validated.notes)
    gpus = sum(r.gpu_number * r.task_number for r in spec.task_roles)
    if gpus:
        notes.append(f"the job asks {gpus} GPU(s); a local run gives its tasks none "
                     "(NVIDIA_VISIBLE_DEVICES=none), PAI_TASK_GPU_NUM still says what it asked")
    if spec.retry_count:
        notes.append("a local run does not retry (retryCount is the cluster's)")
    return LocalPlan(spec, username, storage_root, run_id or uuid.uuid4().hex[:8], planned,
                     list(validated.ignored), notes)


def planned_mounts(spec: JobSpec, storage_root: str) -> list[dict[str, Any]]:
    """The bind mounts the launcher would make, from the paths alone (a dry
    run looks at nothing on disk; the run itself checks and creates)."""
    mounts: list[dict[str, Any]] = []
    for name, value, read_only in (("dataDir", spec.data_dir, True),
                                   ("codeDir", spec.code_dir, True),
                                   ("outputDir", spec.output_dir, False)):
        where = host_path(name, value, [storage_root], spec.unmounted_dirs) if value else None
        if where is None:
            continue
        mounts.append({"source": where.path, "target": where.path, "readOnly": read_only})
        if name == "codeDir":
            mounts.append({"source": where.path, "target": CODE_MOUNT, "readOnly": True})
    return mounts


def _local_environment(spec: JobSpec, username: str, tasks: list[Task], task: Task,
                       storage_root: str) -> dict[str, str]:
    """The launcher's environment for `task`; without the proxy's path, as
    no proxy serves a local run."""
    env = task_environment(spec, username, tasks, task.role, task.index,
                           default_fs_uri=storage_root)
    env.pop("PAI_PROXY_PATH", None)
    return env


def describe(plan: LocalPlan, container_name: Callable[[LocalTask], str]) -> dict[str, Any]:
    """The plan as `--dry-run` prints it: each container's name, image,
    command, limits, ports, mounts and environment."""
    mounts = planned_mounts(plan.spec, plan.storage_root)
    containers = []
    for planned in plan.tasks:
        role = plan.spec.role(planned.task.role)
        containers.append({
            "name": container_name(planned), "task": planned.label, "image": plan.spec.image,
            "command": ["/bin/sh", "-c", role.command], "network": "host",
            "cpus": role.cpu_number, "memoryMB": role.memory_mb, "shmMB": role.shm_mb,
            "ports": dict(planned.task.ports), "mounts": [dict(m) for m in mounts],
            **({"workingDir": CODE_MOUNT} if any(m["target"] == CODE_MOUNT for m in mounts)
               else {}),
            "environment": dict(sorted(planned.environment.items())),
        })
    described: dict[str, Any] = {"job": plan.spec.name, "user": plan.username,
                                 "storageRoot": plan.storage_root, "containers": containers}
    if plan.ignored:
        described["ignoredFields"] = plan.ignored
    if plan.notes:
        described["notes"] = plan.notes
    return described
