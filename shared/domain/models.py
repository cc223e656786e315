"""Domain records: what a job, attempt, task, node and allocation are.

Plain typed dataclasses with `to_dict` / `from_dict` for their JSON form in
Redis. No IO here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from shared.domain.prerequisites import Prerequisite
from shared.domain.ssh import PORT_LABEL as SSH_PORT_LABEL
from shared.domain.ssh import SshAccess, access_of, barrier_roles
from shared.domain.states import JobState, TaskState


def job_id_of(username: str, job_name: str) -> str:
    """A job's id: user names never contain `~`, so the first one splits it."""
    return f"{username}~{job_name}"


def split_job_id(job_id: str) -> tuple[str, str]:
    username, _, name = job_id.partition("~")
    return username, name


def task_key(role: str, index: int) -> str:
    return f"{role}:{index}"


def attempt_task_key(job_id: str, attempt: int, role: str, index: int) -> str:
    """One task of one attempt, as allocations and launch leases name it."""
    return f"{job_id}:{attempt}:{role}:{index}"


def parse_attempt_task_key(key: str) -> tuple[str, int, str, int]:
    job_id, attempt, role, index = key.rsplit(":", 3)
    return job_id, int(attempt), role, int(index)


# ---------------------------------------------------------------- the config


@dataclass(frozen=True)
class PortSpec:
    label: str
    begin_at: int
    port_number: int


@dataclass(frozen=True)
class TaskRoleSpec:
    name: str
    task_number: int
    cpu_number: int
    memory_mb: int
    gpu_number: int
    command: str
    shm_mb: int = 64
    ports: tuple[PortSpec, ...] = ()
    min_failed_task_count: int | None = None
    min_succeeded_task_count: int | None = None
    # A failed task of this role is started again by itself (same node,
    # GPUs and ports) this many times before its failure counts
    task_retry_count: int = 0
    # data, output and script prerequisites run around the command
    # (shared/domain/prerequisites.py)
    prerequisites: tuple[Prerequisite, ...] = ()


@dataclass(frozen=True)
class JobSpec:
    """The normalized job config a job runs from (camelCase keys in its dict)."""

    name: str
    image: str
    task_roles: tuple[TaskRoleSpec, ...]
    virtual_cluster: str = "default"
    retry_count: int = 0
    kill_all_on_completed_task_number: int = 0
    data_dir: str = ""
    output_dir: str = ""
    code_dir: str = ""
    job_envs: dict[str, Any] = field(default_factory=dict)
    gpu_type: str | None = None
    priority_class: str = "test"  # shared/domain/priority.py
    # How long a preempted task has between SIGTERM and SIGKILL (None: the
    # platform's default; never above the admin's maximum)
    preemption_grace_seconds: int | None = None
    # Added to the container only if the VC's allow-list names them (shared/domain/capabilities.py).
    capabilities: tuple[str, ...] = ()
    # Dirs outside every storage root (shared/domain/storage.py): in the env, never mounted
    unmounted_dirs: tuple[str, ...] = ()
    # extras.gangAllocation (OpenPAI): False lets the scheduler start the
    # tasks as resources allow instead of all at once
    gang_allocation: bool = True
    # imageAuth: a registry login (username, password, registryuri) for the pull
    image_auth: dict[str, str] | None = None
    # SSH into the tasks (shared/domain/ssh.py): every role then has an `ssh` port
    ssh: SshAccess | None = None
    # OpenPAI's sshbarrier: the roles whose tasks' sshd each task waits for
    # before its commands (None: no barrier)
    ssh_barrier_roles: tuple[str, ...] | None = None

    @property
    def total_tasks(self) -> int:
        return sum(r.task_number for r in self.task_roles)

    def role(self, name: str) -> TaskRoleSpec:
        for role in self.task_roles:
            if role.name == name:
                return role
        raise KeyError(name)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> JobSpec:
        access = access_of(config)
        # An SSH job's tasks get their `ssh` port as if each role had asked for it.
        ssh_ports = (PortSpec(SSH_PORT_LABEL, 0, 1),) if access else ()
        roles = tuple(
            TaskRoleSpec(
                name=r["name"],
                task_number=int(r["taskNumber"]),
                cpu_number=int(r["cpuNumber"]),
                memory_mb=int(r["memoryMB"]),
                gpu_number=int(r.get("gpuNumber", 0)),
                command=r["command"],
                shm_mb=int(r.get("shmMB", 64)),
                ports=tuple(
                    PortSpec(p["label"], int(p.get("beginAt", 0)), int(p["portNumber"]))
                    for p in r.get("portList") or ()) + ssh_ports,
                min_failed_task_count=r.get("minFailedTaskCount"),
                min_succeeded_task_count=r.get("minSucceededTaskCount"),
                task_retry_count=int(r.get("taskRetryCount") or 0),
                prerequisites=tuple(Prerequisite.from_dict(p)
                                    for p in r.get("prerequisites") or ()),
            )
            for r in config["taskRoles"]
        )
        return cls(
            name=config["jobName"],
            image=config["image"],
            task_roles=roles,
            virtual_cluster=config.get("virtualCluster") or "default",
            retry_count=int(config.get("retryCount") or 0),
            kill_all_on_completed_task_number=int(config.get("killAllOnCompletedTaskNumber") or 0),
            data_dir=config.get("dataDir") or "",
            output_dir=config.get("outputDir") or "",
            code_dir=config.get("codeDir") or "",
            job_envs=dict(config.get("jobEnvs") or {}),
            gpu_type=config.get("gpuType"),
            priority_class=_priority_class(config),
            preemption_grace_seconds=config.get("preemptionGracePeriodSec"),
            capabilities=tuple((config.get("extras") or {}).get("capabilities") or ()),
            unmounted_dirs=tuple(config.get("unmountedDirs") or ()),
            gang_allocation=(config.get("extras") or {}).get("gangAllocation") is not False,
            image_auth=dict(config["imageAuth"]) if config.get("imageAuth") else None,
            ssh=access,
            ssh_barrier_roles=_barrier(config),
        )


def _barrier(config: dict[str, Any]) -> tuple[str, ...] | None:
    roles = barrier_roles(config)
    return None if roles is None else tuple(roles)


def _priority_class(config: dict[str, Any]) -> str:
    """`jobPriorityClass` when the config sets it, else HiveD's
    `extras.hivedScheduler.jobPriorityClass`, else `test`."""
    hived = (config.get("extras") or {}).get("hivedScheduler")
    from_extras = hived.get("jobPriorityClass") if isinstance(hived, dict) else None
    return str(config.get("jobPriorityClass") or from_extras or "test")


# ---------------------------------------------------------------- the records


def _from_dict(cls: type, data: dict[str, Any]) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})


@dataclass
class Job:
    id: str
    username: str
    name: str
    virtual_cluster: str
    state: JobState = JobState.WAITING
    version: int = 0
    created_ms: int = 0
    completed_ms: int | None = None
    attempt: int = 0
    retries: int = 0
    platform_retries: int = 0
    execution_type: str = "START"
    exit_code: int | None = None
    exit_diagnostics: str = ""
    waiting_reason: str = ""
    queue_seq: int = 0
    gpus: int = 0  # GPUs the job holds when all its tasks run
    started_ms: int | None = None  # when the current attempt started running
    # The owner's immutable id (accounts.User.uid): a later user of the same
    # name is not this job's owner.
    user_id: str = ""
    priority: str = "test"  # its priority class (shared/domain/priority.py)
    # While placed: whether it runs on its VC's guarantee or on borrowed GPUs
    mode: str = ""
    # Set while the current attempt is being preempted: for which job, and
    # when its grace period ends (then it is stopped hard)
    preempted_by: str = ""
    preempt_deadline_ms: int | None = None
    preemptions: int = 0  # attempts ended by preemption (never charged)
    # An unlimited-retry job's back-off (shared/domain/completion.py): not placed before this
    retry_after_ms: int | None = None
    # Why it waits, as data (JSON of scheduler.policy.Waiting); "" while placed
    waiting: str = ""
    # This submission's own id: a job submitted again under the same name has
    # another, and its task containers are labelled with it, so a container
    # of an earlier submission (a node that was cut off) is never taken for
    # one of this one (shared/node/containers.py)
    submission: str = ""

    def to_fields(self) -> dict[str, str]:
        """The job's Redis hash fields (config is stored beside them)."""
        return {k: "" if v is None else str(v) for k, v in vars(self).items()}

    @classmethod
    def from_fields(cls, fields: dict[str, str]) -> Job:
        def opt_int(name: str) -> int | None:
            raw = fields.get(name, "")
            return int(raw) if raw not in ("", "None") else None

        return cls(
            id=fields["id"],
            username=fields.get("username") or split_job_id(fields["id"])[0],
            name=fields.get("name") or split_job_id(fields["id"])[1],
            virtual_cluster=fields.get("virtual_cluster", "default"),
            state=JobState(fields["state"]),
            version=int(fields.get("version", 0)),
            created_ms=int(fields.get("created_ms", 0)),
            completed_ms=opt_int("completed_ms"),
            attempt=int(fields.get("attempt", 0)),
            retries=int(fields.get("retries", 0)),
            platform_retries=int(fields.get("platform_retries", 0)),
            execution_type=fields.get("execution_type", "START"),
            exit_code=opt_int("exit_code"),
            exit_diagnostics=fields.get("exit_diagnostics", ""),
            waiting_reason=fields.get("waiting_reason", ""),
            queue_seq=int(fields.get("queue_seq", 0)),
            gpus=int(fields.get("gpus") or 0),
            retry_after_ms=opt_int("retry_after_ms"),
            started_ms=opt_int("started_ms"),
            user_id=fields.get("user_id", ""),
            priority=fields.get("priority") or "test",
            mode=fields.get("mode", ""),
            preempted_by=fields.get("preempted_by", ""),
            preempt_deadline_ms=opt_int("preempt_deadline_ms"),
            preemptions=int(fields.get("preemptions") or 0),
            waiting=fields.get("waiting", ""),
            submission=fields.get("submission", ""),
        )


@dataclass
class Task:
    role: str
    index: int
    state: TaskState = TaskState.WAITING
    node: str | None = None
    ip: str | None = None
    gpus: list[int] = field(default_factory=list)
    ports: dict[str, list[int]] = field(default_factory=dict)
    container_id: str | None = None
    exit_code: int | None = None
    diagnostics: str = ""
    platform_failure: bool = False
    launched_ms: int | None = None
    started_ms: int | None = None
    completed_ms: int | None = None
    # When the task took its allocation; unlike launched_ms, a relaunch on the
    # same allocation (taskRetryCount) keeps it: usage is charged from here.
    placed_ms: int | None = None
    # Task retries so far (taskRetryCount): which container of the task is
    # the current one (shared/node/containers.py names each apart)
    retries: int = 0

    @property
    def key(self) -> str:
        return task_key(self.role, self.index)

    @property
    def default_port(self) -> int | None:
        ports = self.ports.get("default")
        return ports[0] if ports else None

    def to_dict(self) -> dict[str, Any]:
        """`dataclasses.asdict(self)`, without its generic deep copy (a monitor
        writes several tasks a job): the two containers are copied here."""
        data = dict(vars(self))
        data["gpus"] = list(self.gpus)
        data["ports"] = {name: list(ports) for name, ports in self.ports.items()}
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Task:
        task: Task = _from_dict(cls, data)
        task.state = TaskState(task.state)
        return task


@dataclass
class Attempt:
    index: int
    state: str = "RUNNING"  # RUNNING while live, then the job state it ended in
    created_ms: int = 0
    started_ms: int | None = None
    completed_ms: int | None = None
    exit_code: int | None = None
    reason: str = ""
    platform_failure: bool = False
    preempted_by: str = ""  # the job it made room for, when preempted

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))  # plain values only: asdict's deep copy would copy nothing

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Attempt:
        attempt: Attempt = _from_dict(cls, data)
        return attempt


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str = ""
    model: str = ""
    memory_mb: int = 0
    # GPUs of one node sharing an NVLink/switch domain have the same group
    # (from NVML's topology, or declared for virtual GPUs); None: unknown
    group: int | None = None


@dataclass
class Node:
    name: str
    ip: str
    cpus: int
    memory_mb: int
    gpus: list[Gpu] = field(default_factory=list)
    port_range: tuple[int, int] = (15000, 40000)
    real_cpus: int = 0
    nvidia_runtime: bool = False
    heartbeat_ms: int = 0
    # host:port of the node's metrics exporter (its monitor), which
    # Prometheus finds through the API's service discovery
    exporter: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Node:
        node: Node = _from_dict(cls, data)
        node.gpus = [Gpu(**g) if isinstance(g, dict) else g for g in node.gpus]
        node.port_range = (int(node.port_range[0]), int(node.port_range[1]))
        return node


@dataclass(frozen=True)
class Allocation:
    """What one task of one attempt holds on one node."""

    job_id: str
    attempt: int
    role: str
    index: int
    node: str
    gpus: tuple[int, ...]
    cpus: int
    memory_mb: int
    ports: tuple[int, ...]
    vc: str = "default"

    @property
    def key(self) -> str:
        return attempt_task_key(self.job_id, self.attempt, self.role, self.index)

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))  # frozen, tuples and plain values: nothing to copy deeply

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Allocation:
        return cls(
            job_id=data["job_id"], attempt=int(data["attempt"]), role=data["role"],
            index=int(data["index"]), node=data["node"], gpus=tuple(data["gpus"]),
            cpus=int(data["cpus"]), memory_mb=int(data["memory_mb"]),
            ports=tuple(data["ports"]), vc=data.get("vc", "default"),
        )


@dataclass(frozen=True)
class TaskPlacement:
    """Where the scheduler put one task: the node and what it holds there."""

    role: str
    index: int
    node: str
    ip: str
    gpus: tuple[int, ...]
    cpus: int
    memory_mb: int
    ports: dict[str, list[int]]

    @property
    def all_ports(self) -> tuple[int, ...]:
        return tuple(p for ports in self.ports.values() for p in ports)
