"""The environment of a task's container (DESIGN.md section 5). No IO.

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
from collections.abc import Iterable, Sequence
from typing import Any

from shared.domain.models import JobSpec, Task
from shared.domain.ssh import PORT_LABEL as SSH_PORT_LABEL
from shared.domain.ssh import PORT_VARIABLE as SSH_PORT_VARIABLE

DEFAULT_PORT_LABEL = "default"
NO_GPUS_NVIDIA = "none"  # the NVIDIA runtime then mounts no GPU at all
NO_GPUS_CUDA = ""  # CUDA then sees no device

# Where a preempted task finds its notice (PAI_PREEMPTED=1 and more, one
# VAR=value per line), written by the launcher before the SIGTERM.
PREEMPTION_FILE = "/pai/preempted"

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
    """Every variable of DESIGN.md section 5 for task `role`[`index`].

    `tasks` are the attempt's tasks, all placed (node IP and ports set);
    `proxy_token` the job's secret with the task port proxy
    (shared/state/proxytokens.py), if it has one.
    Raises KeyError when the task is not among them, IncompletePlacement when
    a task lacks its IP or default port.
    """
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
    role_spec = spec.role(role)
    role_no = [r.name for r in spec.task_roles].index(role)
    _host_port(current)  # raises early if this task itself is not placed
    if not spec.gang_allocation:  # peers not placed yet are left out of the lists
        by_role = {name: [t for t in members if t.ip and t.default_port is not None]
                   for name, members in by_role.items()}

    env: dict[str, str] = {}

    def put(name: str, value: Any) -> None:
        env.setdefault(name, value if isinstance(value, str) else str(value))

    for name, value in gpu_environment(current.gpus, renumbered_gpus=renumbered_gpus).items():
        put(name, value)

    # The job and this task (the seed's table, then OpenPAI's later names).
    put("PAI_JOB_NAME", spec.name)
    put("PAI_FRAMEWORK_NAME", f"{username}~{spec.name}")
    put("PAI_VIRTUAL_CLUSTER", spec.virtual_cluster)
    # Which attempt of the job this is (0 first): a job that resumes from a
    # checkpoint, or marks its own runs, tells a retry from the first run.
    put("PAI_JOB_ATTEMPT_ID", attempt)
    put("PAI_USER_NAME", username)
    put("PAI_USERNAME", username)
    put("PAI_DEFAULT_FS_URI", default_fs_uri)
    put("PAI_DATA_DIR", spec.data_dir)
    put("PAI_OUTPUT_DIR", spec.output_dir)
    put("PAI_CODE_DIR", spec.code_dir)
    put("PAI_TASK_ROLE_NAME", role)
    put("PAI_TASK_ROLE_NUM", role_spec.task_number)
    put("PAI_TASK_CPU_NUM", role_spec.cpu_number)
    put("PAI_TASK_MEM_MB", role_spec.memory_mb)
    put("PAI_TASK_GPU_NUM", role_spec.gpu_number)
    put("PAI_TASK_ROLE_INDEX", index)
    put("PAI_TASK_ROLE_NO", role_no)
    put("PAI_TASK_INDEX", index)
    put("PAI_TASKS_NUM", spec.total_tasks)
    put("PAI_JOB_TASK_COUNT", spec.total_tasks)
    put("PAI_TASK_ROLES_NUM", len(spec.task_roles))
    put("PAI_JOB_TASK_ROLE_COUNT", len(spec.task_roles))
    put("PAI_KILL_ALL_ON_COMPLETED_TASK_NUM", spec.kill_all_on_completed_task_number)
    put("PAI_CURRENT_CONTAINER_IP", current.ip or "")
    put("PAI_CURRENT_CONTAINER_PORT", current.default_port)
    put("PAI_CONTAINER_HOST_IP", current.ip or "")
    put("PAI_CONTAINER_HOST_PORT", current.default_port)
    put("PAI_CURRENT_TASK_ROLE_NAME", role)
    put("PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX", index)
    for label, ports in _port_lists(current).items():
        put(f"PAI_CONTAINER_HOST_{env_name_part(label)}_PORT_LIST", _joined(ports))
    put("PAI_CONTAINER_HOST_PORT_LIST",
        "".join(f"{label}:{_joined(ports)};" for label, ports in _port_lists(current).items()))
    if current.ports.get(SSH_PORT_LABEL):  # an SSH job (shared/domain/ssh.py), as OpenPAI names it
        put(SSH_PORT_VARIABLE, current.ports[SSH_PORT_LABEL][0])
    put("PAI_TASK_ROLE_COUNT", len(spec.task_roles))
    put("PAI_TASK_ROLE_LIST", ",".join(r.name for r in spec.task_roles))
    put("PAI_JOB_TASK_ROLE_LIST", ",".join(r.name for r in spec.task_roles))
    put("PAI_TASK_ROLE_INSTANCES", ",".join(f"{r.name}:{t.index}" for r in spec.task_roles
                                             for t in by_role[r.name]))

    # Peers: the seed's by-number host lists first, as its examples rely on them.
    for number, r in enumerate(spec.task_roles):
        put(f"PAI_TASK_ROLE_{number}_HOST_LIST", _joined(_host_port(t) for t in by_role[r.name]))
    for r in spec.task_roles:
        name = env_name_part(r.name)
        members = by_role[r.name]
        put(f"PAI_TASK_ROLE_{name}_HOST_LIST", _joined(_host_port(t) for t in members))
        put(f"PAI_TASK_ROLE_TASK_COUNT_{name}", r.task_number)
        put(f"PAI_RESOURCE_{name}", _joined((r.gpu_number, r.cpu_number, r.memory_mb, r.shm_mb)))
        put(f"PAI_MIN_FAILED_TASK_COUNT_{name}", r.min_failed_task_count or 1)
        put(f"PAI_MIN_SUCCEEDED_TASK_COUNT_{name}", r.min_succeeded_task_count or -1)
        for task in members:
            put(f"PAI_HOST_IP_{name}_{task.index}", task.ip or "")
            for label, ports in _port_lists(task).items():
                put(f"PAI_PORT_LIST_{name}_{task.index}_{env_name_part(label)}", _joined(ports))
                put(f"PAI_{name}_{task.index}_{env_name_part(label)}_PORT", _joined(ports))

    put("PAI_PREEMPTION_FILE", PREEMPTION_FILE)
    # Where the API serves this task's labelled ports (services/api/proxy.py),
    # `<PAI_PROXY_PATH>/<label>/`: a notebook or dashboard serves under it
    # (Jupyter's base_url), and lets in only requests carrying the token.
    put("PAI_PROXY_PATH", proxy_path(username, spec.name, role, index))
    if proxy_token:
        put("PAI_PROXY_TOKEN", proxy_token)

    for key, value in spec.job_envs.items():
        put(str(key), env_value(value))
    return env


def proxy_path(username: str, job_name: str, role: str, index: int) -> str:
    """The API path under which the proxy serves task `role`[`index`]'s
    labelled ports (without its `/<label>/`)."""
    return f"/api/v1/user/{username}/jobs/{job_name}/tasks/{role}/{index}/proxy"


def preemption_notice(by: str, deadline_ms: int) -> str:
    """The preemption file's text: a job sourcing it, or grepping for
    PAI_PREEMPTED=1, learns it must save its state before the deadline."""
    return (f"PAI_PREEMPTED=1\nPAI_PREEMPTED_BY={by}\n"
            f"PAI_PREEMPTION_DEADLINE={deadline_ms // 1000}\n")
