"""The environment of a task's container (docs/design.md, "Inside a job
container"). No IO.

Every variable is computed from the job's spec and the placed tasks of one
attempt, so peers find each other (`PAI_TASK_ROLE_0_HOST_LIST`, ...) without
asking the platform at run time.

Choices where OpenPAI leaves room:

- Role names and port labels may hold `.` and `~`, which a shell cannot use in
  a variable name. In the *names* of role- and label-keyed variables every
  character outside `[A-Za-z0-9_]` becomes `_` (`PAI_RESOURCE_my_role` for
  role `my.role`); *values* keep the exact names (`PAI_TASK_ROLE_LIST`,
  `PAI_CURRENT_TASK_ROLE_NAME`).
- When two variables end up with the same name (roles `a.b` and `a_b`, or a
  role named `1` whose by-name host list meets role number 1's), the first
  one written keeps it. The order is: GPU variables, this task's variables,
  host lists by role number, then per role and per task in config order, and
  the job's `jobEnvs` last: so a `jobEnvs` entry can never replace a platform
  variable (a job must not widen its own `NVIDIA_VISIBLE_DEVICES`).
- `PAI_MIN_FAILED_TASK_COUNT_<role>` / `PAI_MIN_SUCCEEDED_TASK_COUNT_<role>`
  give the effective values, as OpenPAI's runtime did: an unset
  minFailedTaskCount is `1` (one failure fails the attempt) and an unset
  minSucceededTaskCount is `-1` (never reached).
- GPU indices are the node's. On a node with the NVIDIA runtime the container
  sees only its own GPUs, renumbered from 0, so `CUDA_VISIBLE_DEVICES` counts
  from 0 there (`renumbered_gpus=True`) while `NVIDIA_VISIBLE_DEVICES` names
  the node's devices; without the runtime (virtual GPUs) both carry the node's
  indices.
- A job without gang allocation (`extras.gangAllocation: false`) starts its
  tasks as they are placed: its host lists name the peers placed by the
  time the task starts, and a peer not placed yet has no
  `PAI_HOST_IP_<role>_<i>` nor port lists (OpenPAI's runtime, too, saw only
  the peers that existed).
- Besides the seed's table, what OpenPAI's runtime and REST server set and
  its examples read: `PAI_TASK_INDEX` (its DDP examples take the rank from
  it), `PAI_<role>_<idx>_<label>_PORT` (the same ports as
  `PAI_PORT_LIST_<role>_<idx>_<label>`: its DDP examples find the master's
  port in `PAI_worker_0_SynPort_PORT`), `PAI_FRAMEWORK_NAME`
  (`<user>~<job>`), `PAI_VIRTUAL_CLUSTER`, `PAI_JOB_TASK_COUNT`,
  `PAI_JOB_TASK_ROLE_COUNT`, `PAI_JOB_TASK_ROLE_LIST`,
  `PAI_CONTAINER_HOST_IP`, `PAI_CONTAINER_HOST_PORT`,
  `PAI_CONTAINER_HOST_PORT_LIST` (`label:ports;` for each label) and
  `PAI_TASK_ROLE_INSTANCES` (`role:index`, comma separated). OpenPAI's
  default port label is `http`; pai's is `default`, and a `portList` label
  `http` is the job's own.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from shared.domain.models import JobSpec, Task
from shared.domain.notice import PREEMPTION_FILE
from shared.domain.ssh import PORT_LABEL as SSH_PORT_LABEL
from shared.domain.ssh import PORT_VARIABLE as SSH_PORT_VARIABLE

DEFAULT_PORT_LABEL = "default"
NO_GPUS_NVIDIA = "none"  # the NVIDIA runtime then mounts no GPU at all
NO_GPUS_CUDA = ""  # CUDA then sees no device

_NOT_IN_NAME = re.compile(r"[^A-Za-z0-9_]")


class IncompletePlacement(ValueError):
    """A task of the attempt has no node IP or default port: a platform bug,
    since a gang's placement is all-or-nothing."""


def env_name_part(name: str) -> str:
    """`name` as it appears inside a variable name (see the module notes)."""
    return _NOT_IN_NAME.sub("_", name)


def env_value(value: Any) -> str:
    """A `jobEnvs` value as its string: JSON spelling for booleans."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _joined(values: Iterable[int | str]) -> str:
    return ",".join(str(v) for v in values)


def _host_port(task: Task) -> str:
    if not task.ip or task.default_port is None:
        raise IncompletePlacement(f"task {task.role}[{task.index}] has no IP or default port")
    return f"{task.ip}:{task.default_port}"


def _port_lists(task: Task) -> dict[str, list[int]]:
    """The task's ports by label, `default` first."""
    ports = {DEFAULT_PORT_LABEL: list(task.ports.get(DEFAULT_PORT_LABEL, []))}
    ports.update({label: list(p) for label, p in task.ports.items()
                  if label != DEFAULT_PORT_LABEL})
    return ports


def gpu_environment(gpus: Sequence[int], *, renumbered_gpus: bool = False) -> dict[str, str]:
    """`NVIDIA_VISIBLE_DEVICES` / `CUDA_VISIBLE_DEVICES` for a task's GPUs."""
    if not gpus:
        return {"NVIDIA_VISIBLE_DEVICES": NO_GPUS_NVIDIA, "CUDA_VISIBLE_DEVICES": NO_GPUS_CUDA}
    cuda = range(len(gpus)) if renumbered_gpus else gpus
    return {"NVIDIA_VISIBLE_DEVICES": _joined(gpus), "CUDA_VISIBLE_DEVICES": _joined(cuda)}


def task_environment(
    spec: JobSpec, username: str, tasks: Sequence[Task], role: str, index: int, *,
    default_fs_uri: str, renumbered_gpus: bool = False, attempt: int = 0,
    proxy_token: str = "",
) -> dict[str, str]:
    """Every variable of docs/design.md, "Inside a job container", for task `role`[`index`].

    `tasks` are the attempt's tasks, all placed (node IP and ports set);
    `proxy_token` the job's secret with the task port proxy
    (shared/state/proxytokens.py), if it has one.
    Raises KeyError when the task is not among them, IncompletePlacement when
    a task lacks its IP or default port. Where two sources name one variable
    the first wins: the GPUs, the task's own, its peers', then the job's
    `jobEnvs`, which may add variables but change none of the platform's.
    """
    by_role, current = _placed_roles(spec, tasks, role, index)
    env: dict[str, str] = {}
    sources: list[Iterable[tuple[str, Any]]] = [
        gpu_environment(current.gpus, renumbered_gpus=renumbered_gpus).items(),
        _own_variables(spec, username, current, attempt, default_fs_uri),
        _peer_variables(spec, by_role),
        [("PAI_PREEMPTION_FILE", PREEMPTION_FILE)],
        _proxy_variables(spec, username, current, proxy_token),
        ((str(key), env_value(value)) for key, value in spec.job_envs.items()),
    ]
    for pairs in sources:
        for name, value in pairs:
            env.setdefault(name, value if isinstance(value, str) else str(value))
    return env


def _placed_roles(spec: JobSpec, tasks: Sequence[Task], role: str,
                  index: int) -> tuple[dict[str, list[Task]], Task]:
    """The attempt's tasks by role, in index order, and task `role`[`index`]:
    every role complete, the task itself placed (for a job without gang
    allocation, peers not placed yet are left out)."""
    by_role: dict[str, list[Task]] = {r.name: [] for r in spec.task_roles}
    for task in tasks:
        by_role.setdefault(task.role, []).append(task)
    for members in by_role.values():
        members.sort(key=lambda t: t.index)
    current = next((t for t in by_role.get(role, []) if t.index == index), None)
    if current is None:
        raise KeyError(f"task {role}[{index}] is not among the attempt's tasks")
    for r in spec.task_roles:
        if len(by_role[r.name]) != r.task_number:
            raise IncompletePlacement(
                f"role {r.name} has {len(by_role[r.name])} of its {r.task_number} tasks")
    _host_port(current)  # raises early if this task itself is not placed
    if not spec.gang_allocation:
        by_role = {name: [t for t in members if t.ip and t.default_port is not None]
                   for name, members in by_role.items()}
    return by_role, current


def _own_variables(spec: JobSpec, username: str, current: Task, attempt: int,
                   default_fs_uri: str) -> Iterator[tuple[str, Any]]:
    """The job and this task: the seed's table, then OpenPAI's later names."""
    role, index = current.role, current.index
    role_spec = spec.role(role)
    yield "PAI_JOB_NAME", spec.name
    yield "PAI_FRAMEWORK_NAME", f"{username}~{spec.name}"
    yield "PAI_VIRTUAL_CLUSTER", spec.virtual_cluster
    # Which attempt of the job this is (0 first): a job that resumes from a
    # checkpoint, or marks its own runs, tells a retry from the first run.
    yield "PAI_JOB_ATTEMPT_ID", attempt
    yield "PAI_USER_NAME", username
    yield "PAI_USERNAME", username
    yield "PAI_DEFAULT_FS_URI", default_fs_uri
    yield "PAI_DATA_DIR", spec.data_dir
    yield "PAI_OUTPUT_DIR", spec.output_dir
    yield "PAI_CODE_DIR", spec.code_dir
    yield "PAI_TASK_ROLE_NAME", role
    yield "PAI_TASK_ROLE_NUM", role_spec.task_number
    yield "PAI_TASK_CPU_NUM", role_spec.cpu_number
    yield "PAI_TASK_MEM_MB", role_spec.memory_mb
    yield "PAI_TASK_GPU_NUM", role_spec.gpu_number
    yield "PAI_TASK_ROLE_INDEX", index
    yield "PAI_TASK_ROLE_NO", [r.name for r in spec.task_roles].index(role)
    yield "PAI_TASK_INDEX", index
    yield "PAI_TASKS_NUM", spec.total_tasks
    yield "PAI_JOB_TASK_COUNT", spec.total_tasks
    yield "PAI_TASK_ROLES_NUM", len(spec.task_roles)
    yield "PAI_JOB_TASK_ROLE_COUNT", len(spec.task_roles)
    yield "PAI_KILL_ALL_ON_COMPLETED_TASK_NUM", spec.kill_all_on_completed_task_number
    yield "PAI_CURRENT_CONTAINER_IP", current.ip or ""
    yield "PAI_CURRENT_CONTAINER_PORT", current.default_port
    yield "PAI_CONTAINER_HOST_IP", current.ip or ""
    yield "PAI_CONTAINER_HOST_PORT", current.default_port
    yield "PAI_CURRENT_TASK_ROLE_NAME", role
    yield "PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX", index
    for label, ports in _port_lists(current).items():
        yield f"PAI_CONTAINER_HOST_{env_name_part(label)}_PORT_LIST", _joined(ports)
    yield "PAI_CONTAINER_HOST_PORT_LIST", "".join(
        f"{label}:{_joined(ports)};" for label, ports in _port_lists(current).items())
    if current.ports.get(SSH_PORT_LABEL):  # an SSH job (shared/domain/ssh.py), as OpenPAI names it
        yield SSH_PORT_VARIABLE, current.ports[SSH_PORT_LABEL][0]
    yield "PAI_TASK_ROLE_COUNT", len(spec.task_roles)
    yield "PAI_TASK_ROLE_LIST", ",".join(r.name for r in spec.task_roles)
    yield "PAI_JOB_TASK_ROLE_LIST", ",".join(r.name for r in spec.task_roles)


def _peer_variables(spec: JobSpec,
                    by_role: dict[str, list[Task]]) -> Iterator[tuple[str, Any]]:
    """Where every task of the job is: the seed's by-number host lists first,
    as its examples rely on them, then by role name."""
    for number, r in enumerate(spec.task_roles):
        yield f"PAI_TASK_ROLE_{number}_HOST_LIST", _joined(_host_port(t) for t in by_role[r.name])
    for r in spec.task_roles:
        name = env_name_part(r.name)
        members = by_role[r.name]
        yield f"PAI_TASK_ROLE_{name}_HOST_LIST", _joined(_host_port(t) for t in members)
        yield f"PAI_TASK_ROLE_TASK_COUNT_{name}", r.task_number
        yield f"PAI_RESOURCE_{name}", _joined((r.gpu_number, r.cpu_number, r.memory_mb, r.shm_mb))
        yield f"PAI_MIN_FAILED_TASK_COUNT_{name}", r.min_failed_task_count or 1
        yield f"PAI_MIN_SUCCEEDED_TASK_COUNT_{name}", r.min_succeeded_task_count or -1
        for task in members:
            yield f"PAI_HOST_IP_{name}_{task.index}", task.ip or ""
            for label, ports in _port_lists(task).items():
                yield f"PAI_PORT_LIST_{name}_{task.index}_{env_name_part(label)}", _joined(ports)
                yield f"PAI_{name}_{task.index}_{env_name_part(label)}_PORT", _joined(ports)
    yield "PAI_TASK_ROLE_INSTANCES", ",".join(f"{r.name}:{t.index}" for r in spec.task_roles
                                               for t in by_role[r.name])


def _proxy_variables(spec: JobSpec, username: str, current: Task,
                     proxy_token: str) -> Iterator[tuple[str, Any]]:
    """Where the API serves this task's labelled ports (services/api/proxy.py),
    `<PAI_PROXY_PATH>/<label>/`: a notebook or dashboard serves under it
    (Jupyter's base_url), and lets in only requests carrying the token."""
    yield "PAI_PROXY_PATH", proxy_path(username, spec.name, current.role, current.index)
    if proxy_token:
        yield "PAI_PROXY_TOKEN", proxy_token


def proxy_path(username: str, job_name: str, role: str, index: int) -> str:
    """The API path under which the proxy serves task `role`[`index`]'s
    labelled ports (without its `/<label>/`)."""
    return f"/api/v1/user/{username}/jobs/{job_name}/tasks/{role}/{index}/proxy"

