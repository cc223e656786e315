"""Every Redis key the platform uses, built here and nowhere else.

One prefix, colons between parts, plural names for index sets. A unit test
pins the literal strings so a rename is a conscious act.
"""

from __future__ import annotations

PREFIX = "pai:"

# -- jobs ---------------------------------------------------------------
JOBS = PREFIX + "jobs"  # zset job id -> created ms: every job, newest last
# stream, capped: every write of a job's sort fields, in commit order (shared/state/jobfeed.py)
JOB_CHANGES = PREFIX + "jobs:changes"
QUEUE = PREFIX + "queue"  # zset job id -> queue sequence: jobs waiting to be placed
QUEUE_SEQ = PREFIX + "queue:seq"  # counter giving each queued attempt its place
LAUNCHING = PREFIX + "launching"  # zset "job:attempt:role:index" -> launch deadline ms
SCHEDULER_LOCK = PREFIX + "lock:scheduler"
SCHEDULERS = PREFIX + "schedulers"  # zset scheduler replica -> last heartbeat ms
# set while a pass request is on its way: later submits need not send one
PASS_REQUESTED = PREFIX + "scheduler:pass-requested"
# list of at most one entry: the schedulers' doorbell (shared/state/passwake.py)
SCHEDULER_WAKE = PREFIX + "scheduler:wake"
# set when a pass is asked for while another holds the lock (services/scheduler/gate.py)
SCHEDULER_DIRTY = PREFIX + "scheduler:dirty"
# string: the reader of the latest pass's snapshot, so a scheduler replica
# tells whether another passed since its own last pass (services/scheduler/reading.py)
LAST_PASSER = PREFIX + "scheduler:last-passer"
# zset job id -> completed ms: finished jobs whose record is not compacted yet
RETENTION_PENDING = PREFIX + "retention:pending"
# hash final state -> rank: where the retention sweep's repair walk resumes
RETENTION_CURSOR = PREFIX + "retention:cursor"


def job(job_id: str) -> str:
    """Hash: the job record (see models.Job)."""
    return f"{PREFIX}job:{job_id}"


def job_config(job_id: str) -> str:
    """String: the normalized config JSON the job runs from."""
    return f"{PREFIX}job:{job_id}:config"


def job_tasks(job_id: str, attempt: int) -> str:
    """Hash: "role:index" -> task JSON, for one attempt."""
    return f"{PREFIX}job:{job_id}:attempt:{attempt}:tasks"


def job_attempts(job_id: str) -> str:
    """Hash: attempt index -> attempt JSON."""
    return f"{PREFIX}job:{job_id}:attempts"


def job_events(job_id: str) -> str:
    """Stream: what happened to the job, in order."""
    return f"{PREFIX}job:{job_id}:events"


def job_ssh_key(job_id: str) -> str:
    """String: the private key of a job that asked for SSH (shared/domain/ssh.py);
    read only by GET .../ssh, never shown anywhere else."""
    return f"{PREFIX}job:{job_id}:ssh-key"


def job_archive(job_id: str) -> str:
    """String (binary): a finished job's compacted config, attempts, last
    tasks and event summary (shared/domain/archive.py)."""
    return f"{PREFIX}job:{job_id}:archive"


def job_proxy_token(job_id: str) -> str:
    """String: the secret the task port proxy sends a job's servers
    (shared/state/proxytokens.py); the job's tasks have it as PAI_PROXY_TOKEN."""
    return f"{PREFIX}job:{job_id}:proxy-token"


def job_checkpoints(job_id: str) -> str:
    """Hash: attempt index -> the last checkpoint step the job reported in
    that attempt (shared/state/checkpoints.py)."""
    return f"{PREFIX}job:{job_id}:checkpoints"


def task_log(job_id: str, attempt: int, role: str, index: int) -> str:
    """Stream: one task attempt's stdout+stderr lines, bounded."""
    return f"{PREFIX}log:{job_id}:{attempt}:{role}:{index}"


def task_samples(job_id: str, attempt: int, role: str, index: int) -> str:
    """Stream: one task attempt's utilisation samples, capped (shared/state/tasksamples.py)."""
    return f"{PREFIX}samples:{job_id}:{attempt}:{role}:{index}"


def idle_tasks(node: str) -> str:
    """Hash: attempt task key -> ms since which its GPUs are idle (shared/state/idle.py),
    for the node's running tasks; its monitor rewrites it every sample."""
    return f"{PREFIX}node:{node}:idle-tasks"


def user_jobs(username: str) -> str:
    return f"{PREFIX}user:{username}:jobs"


def vc_jobs(vc: str) -> str:
    return f"{PREFIX}vc:{vc}:jobs"


def vc_queue(vc: str) -> str:
    """Zset: the VC's waiting jobs -> shared.domain.priority.queue_order (its queue,
    in order: a job's rank is its position)."""
    return f"{PREFIX}vc:{vc}:queue"


def state_jobs(state: str) -> str:
    return f"{PREFIX}state:{state}:jobs"


# -- nodes --------------------------------------------------------------
# zset node name -> the last renewal of its lease, stamped by Redis TIME
NODES = PREFIX + "nodes"
# set: the nodes declared lost and not back since; the nodes standing are
# NODES less these (what a node counts its cluster by when it is cut off)
NODES_LOST = PREFIX + "nodes-lost"
# Counts the changes of who the nodes are (a claim, a peer address, a node
# declared lost or back): a node reads its peers again only when it moved.
NODES_VERSION = PREFIX + "nodes-version"
# hash: the control plane's own outage as the scheduler last judged it
# (shared/domain/lease.py Outage: since, ended, checked)
CONTROL_PLANE = PREFIX + "control-plane"
# string: this cluster's id, written into every storage root and the log
# tree so that a node can tell its mount is the cluster's shared storage
CLUSTER_ID = PREFIX + "cluster-id"
# hash node name -> admin flags JSON (cluster.NodeFlags); absent: schedulable
NODE_FLAGS = PREFIX + "node-flags"


# hash "node:gpu index" -> fault JSON (gpuhealth.GpuFault); absent: healthy
GPU_FAULTS = PREFIX + "gpu-faults"


def gpu_fault_injections(name: str) -> str:
    """List: faults a test or drill injects into the node's virtual GPUs
    (shared/domain/gpuhealth.py); its monitor takes them on its next round."""
    return f"{PREFIX}node:{name}:gpu-fault-injections"


def virtual_gpu_utilization(name: str) -> str:
    """Hash, a test hook: GPU index -> utilisation percent the node's virtual
    GPUs report to its monitor (real GPUs report through NVML)."""
    return f"{PREFIX}node:{name}:virtual-gpu-utilization"


def node(name: str) -> str:
    """String: the node's inventory JSON (see models.Node)."""
    return f"{PREFIX}node:{name}"


def node_lease(name: str) -> str:
    """Hash: who holds the node's name and how it stands (shared/domain/lease.py
    Lease): its agent's engine, IP, terms, phase, problem and renewals."""
    return f"{PREFIX}node:{name}:lease"


def node_alloc(name: str) -> str:
    """Hash: allocation key -> allocation JSON for every task holding this node."""
    return f"{PREFIX}node:{name}:alloc"


def node_starts(name: str) -> str:
    """Stream: the starts the scheduler sent the node, read by its launcher
    in a consumer group (shared/state/starts.py)."""
    return f"{PREFIX}node:{name}:starts"


def node_calls(name: str) -> str:
    """Stream: the exec requests and terminal sessions the API sent the node,
    read by its launcher in a consumer group (shared/state/nodecalls.py)."""
    return f"{PREFIX}node:{name}:calls"


# -- users and virtual clusters ------------------------------------------
USERS = PREFIX + "users"
VCS = PREFIX + "vcs"


def user(username: str) -> str:
    return f"{PREFIX}user:{username}"


def user_token_epoch(username: str) -> str:
    """Tokens issued before this time are revoked."""
    return f"{PREFIX}user:{username}:token-epoch"


def login_failures(scope: str, who: str) -> str:
    """Counter with a TTL: failed logins for one user name (scope "user") or
    one client address (scope "ip") in the current throttling window."""
    return f"{PREFIX}login-failures:{scope}:{who}"


def revoked_token(token_id: str) -> str:
    """A logged-out token's id, kept until the token would have expired."""
    return f"{PREFIX}token:revoked:{token_id}"


def vc(name: str) -> str:
    return f"{PREFIX}vc:{name}"


def follow_leases(username: str) -> str:
    """Zset: lease id -> expiry ms, one per log follow the user holds open."""
    return f"{PREFIX}follows:{username}"


def proxy_leases(username: str) -> str:
    """Zset: lease id -> expiry ms, one per connection the user holds open
    through the task port proxy (services/api/proxy.py)."""
    return f"{PREFIX}proxies:{username}"


def exec_leases(username: str) -> str:
    """Zset: lease id -> expiry ms, one per exec the user has running."""
    return f"{PREFIX}execs:{username}"


def exec_request(request_id: str) -> str:
    """Hash with a TTL: one exec request for a node's launcher (shared/state/execs.py)."""
    return f"{PREFIX}exec:{request_id}"


def exec_result(request_id: str) -> str:
    """List with a TTL: the launcher's answer to one exec request, for the API's BLPOP."""
    return f"{PREFIX}exec:{request_id}:result"


def exec_tty_leases(username: str) -> str:
    """Zset: lease id -> expiry ms, one per interactive exec session the user holds open."""
    return f"{PREFIX}exec-ttys:{username}"


def exec_session(session_id: str) -> str:
    """Hash with a TTL the API renews: one interactive exec session
    (shared/state/execsessions.py)."""
    return f"{PREFIX}exec-tty:{session_id}"


def exec_session_input(session_id: str) -> str:
    """List with a TTL: a session's keystrokes and resizes, API -> launcher."""
    return f"{PREFIX}exec-tty:{session_id}:in"


def exec_session_output(session_id: str) -> str:
    """Stream with a TTL: a session's terminal output and its end, launcher -> API."""
    return f"{PREFIX}exec-tty:{session_id}:out"


# -- storage ----------------------------------------------------------------
STORAGE_SHARES = PREFIX + "storage:shares"  # hash share name -> share JSON (storage.Share)


# -- usage accounting (shared/state/usage.py) -----------------------------------


def usage_day(day: str) -> str:
    """Hash: [user, vc, job, resource] JSON -> resource-milliseconds used on
    that UTC day (YYYY-MM-DD)."""
    return f"{PREFIX}usage:day:{day}"


def usage_records(day: str) -> str:
    """Hash: interval key -> interval JSON, for the tasks placed on that UTC
    day: each task's recorded usage, and the guard that records it once."""
    return f"{PREFIX}usage:records:{day}"


# Hash: where the retention sweep's walk over the usage keys is (`cursor`),
# and the PAI_USAGE_RETENTION_DAYS its last whole walk enforced (`enforced`).
USAGE_RETENTION = PREFIX + "usage:retention"
USAGE_KEYS = PREFIX + "usage:*"  # SCAN pattern of every usage key


def vc_user_budgets(vc_name: str) -> str:
    """Hash: username -> GPU-hours per the VC's budgetPeriod, each user's own
    budget within the VC (shared/state/accounts.py)."""
    return f"{PREFIX}vc:{vc_name}:user-budgets"


# -- metrics --------------------------------------------------------------


def recorded_metric(name: str) -> str:
    """Hash: one counter's or histogram's values, a field per label set / bucket."""
    return f"{PREFIX}metric:{name}"
