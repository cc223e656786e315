"""The literal Redis key strings: renaming one must be a conscious act."""

from __future__ import annotations

import inspect
from collections.abc import Callable

import pytest

from shared.state import keys

JOB = "alice~mnist"

LITERAL_KEYS = [
    pytest.param(keys.PREFIX, "pai:", id="PREFIX"),
    pytest.param(keys.JOBS, "pai:jobs", id="JOBS"),
    pytest.param(keys.JOB_CHANGES, "pai:jobs:changes", id="JOB_CHANGES"),
    pytest.param(keys.QUEUE, "pai:queue", id="QUEUE"),
    pytest.param(keys.QUEUE_SEQ, "pai:queue:seq", id="QUEUE_SEQ"),
    pytest.param(keys.LAUNCHING, "pai:launching", id="LAUNCHING"),
    pytest.param(keys.SCHEDULER_LOCK, "pai:lock:scheduler", id="SCHEDULER_LOCK"),
    pytest.param(keys.SCHEDULERS, "pai:schedulers", id="SCHEDULERS"),
    pytest.param(keys.PASS_REQUESTED, "pai:scheduler:pass-requested", id="PASS_REQUESTED"),
    pytest.param(keys.SCHEDULER_DIRTY, "pai:scheduler:dirty", id="SCHEDULER_DIRTY"),
    pytest.param(keys.SCHEDULER_WAKE, "pai:scheduler:wake", id="SCHEDULER_WAKE"),
    pytest.param(keys.LAST_PASSER, "pai:scheduler:last-passer", id="LAST_PASSER"),
    pytest.param(keys.RETENTION_PENDING, "pai:retention:pending", id="RETENTION_PENDING"),
    pytest.param(keys.RETENTION_CURSOR, "pai:retention:cursor", id="RETENTION_CURSOR"),
    pytest.param(keys.NODES, "pai:nodes", id="NODES"),
    pytest.param(keys.NODES_LOST, "pai:nodes-lost", id="NODES_LOST"),
    pytest.param(keys.NODES_VERSION, "pai:nodes-version", id="NODES_VERSION"),
    pytest.param(keys.NODE_FLAGS, "pai:node-flags", id="NODE_FLAGS"),
    pytest.param(keys.CONTROL_PLANE, "pai:control-plane", id="CONTROL_PLANE"),
    pytest.param(keys.CLUSTER_ID, "pai:cluster-id", id="CLUSTER_ID"),
    pytest.param(keys.USERS, "pai:users", id="USERS"),
    pytest.param(keys.VCS, "pai:vcs", id="VCS"),
    pytest.param(keys.STORAGE_SHARES, "pai:storage:shares", id="STORAGE_SHARES"),
    pytest.param(keys.job(JOB), "pai:job:alice~mnist", id="job"),
    pytest.param(keys.job_config(JOB), "pai:job:alice~mnist:config", id="job_config"),
    pytest.param(keys.job_tasks(JOB, 0), "pai:job:alice~mnist:attempt:0:tasks",
                 id="job_tasks attempt 0"),
    pytest.param(keys.job_tasks(JOB, 12), "pai:job:alice~mnist:attempt:12:tasks",
                 id="job_tasks attempt 12"),
    pytest.param(keys.job_attempts(JOB), "pai:job:alice~mnist:attempts", id="job_attempts"),
    pytest.param(keys.job_events(JOB), "pai:job:alice~mnist:events", id="job_events"),
    pytest.param(keys.job_archive(JOB), "pai:job:alice~mnist:archive", id="job_archive"),
    pytest.param(keys.job_ssh_key(JOB), "pai:job:alice~mnist:ssh-key", id="job_ssh_key"),
    pytest.param(keys.job_checkpoints(JOB), "pai:job:alice~mnist:checkpoints",
                 id="job_checkpoints"),
    pytest.param(keys.job_proxy_token(JOB), "pai:job:alice~mnist:proxy-token",
                 id="job_proxy_token"),
    pytest.param(keys.proxy_leases("alice"), "pai:proxies:alice", id="proxy_leases"),
    pytest.param(keys.task_log(JOB, 1, "worker", 3), "pai:log:alice~mnist:1:worker:3",
                 id="task_log"),
    pytest.param(keys.user_jobs("alice"), "pai:user:alice:jobs", id="user_jobs"),
    pytest.param(keys.vc_jobs("default"), "pai:vc:default:jobs", id="vc_jobs"),
    pytest.param(keys.vc_queue("default"), "pai:vc:default:queue", id="vc_queue"),
    pytest.param(keys.state_jobs("RUNNING"), "pai:state:RUNNING:jobs", id="state_jobs"),
    pytest.param(keys.node("gpu-01"), "pai:node:gpu-01", id="node"),
    pytest.param(keys.node_alloc("gpu-01"), "pai:node:gpu-01:alloc", id="node_alloc"),
    pytest.param(keys.node_lease("gpu-01"), "pai:node:gpu-01:lease", id="node_lease"),
    pytest.param(keys.node_starts("gpu-01"), "pai:node:gpu-01:starts", id="node_starts"),
    pytest.param(keys.node_calls("gpu-01"), "pai:node:gpu-01:calls", id="node_calls"),
    pytest.param(keys.user("alice"), "pai:user:alice", id="user"),
    pytest.param(keys.user_token_epoch("alice"), "pai:user:alice:token-epoch",
                 id="user_token_epoch"),
    pytest.param(keys.vc("default"), "pai:vc:default", id="vc"),
    pytest.param(keys.vc_user_budgets("default"), "pai:vc:default:user-budgets",
                 id="vc_user_budgets"),
    pytest.param(keys.revoked_token("abc"), "pai:token:revoked:abc", id="revoked_token"),
    pytest.param(keys.login_failures("ip", "10.0.0.1"), "pai:login-failures:ip:10.0.0.1",
                 id="login_failures"),
    pytest.param(keys.follow_leases("alice"), "pai:follows:alice", id="follow_leases"),
    pytest.param(keys.exec_leases("alice"), "pai:execs:alice", id="exec_leases"),
    pytest.param(keys.exec_request("r1"), "pai:exec:r1", id="exec_request"),
    pytest.param(keys.exec_result("r1"), "pai:exec:r1:result", id="exec_result"),
    pytest.param(keys.exec_tty_leases("alice"), "pai:exec-ttys:alice", id="exec_tty_leases"),
    pytest.param(keys.exec_session("s1"), "pai:exec-tty:s1", id="exec_session"),
    pytest.param(keys.exec_session_input("s1"), "pai:exec-tty:s1:in", id="exec_session_input"),
    pytest.param(keys.exec_session_output("s1"), "pai:exec-tty:s1:out",
                 id="exec_session_output"),
    pytest.param(keys.GPU_FAULTS, "pai:gpu-faults", id="GPU_FAULTS"),
    pytest.param(keys.gpu_fault_injections("gpu-01"), "pai:node:gpu-01:gpu-fault-injections",
                 id="gpu_fault_injections"),
    pytest.param(keys.usage_day("2026-11-25"), "pai:usage:day:2026-11-25", id="usage_day"),
    pytest.param(keys.USAGE_RETENTION, "pai:usage:retention", id="USAGE_RETENTION"),
    pytest.param(keys.USAGE_KEYS, "pai:usage:*", id="USAGE_KEYS"),
    pytest.param(keys.usage_records("2026-11-25"), "pai:usage:records:2026-11-25",
                 id="usage_records"),
    pytest.param(keys.task_samples(JOB, 1, "worker", 3), "pai:samples:alice~mnist:1:worker:3",
                 id="task_samples"),
    pytest.param(keys.idle_tasks("gpu-01"), "pai:node:gpu-01:idle-tasks", id="idle_tasks"),
    pytest.param(keys.virtual_gpu_utilization("gpu-01"),
                 "pai:node:gpu-01:virtual-gpu-utilization", id="virtual_gpu_utilization"),
    pytest.param(keys.recorded_metric("pai_task_exits"), "pai:metric:pai_task_exits",
                 id="recorded_metric"),
]


@pytest.mark.parametrize(("actual", "expected"), LITERAL_KEYS)
def test_literal_key(actual: str, expected: str) -> None:
    assert actual == expected


def test_state_key_from_an_enum_uses_its_value() -> None:
    from shared.domain.states import JobState

    assert keys.state_jobs(JobState.WAITING) == "pai:state:WAITING:jobs"


def _key_builders() -> dict[str, Callable[..., str]]:
    return {name: fn for name, fn in vars(keys).items()
            if inspect.isfunction(fn) and fn.__module__ == keys.__name__}


def _constants() -> dict[str, str]:
    return {name: value for name, value in vars(keys).items()
            if name.isupper() and isinstance(value, str)}


def _sample_args(fn: Callable[..., str]) -> list[object]:
    args: list[object] = []
    for param in inspect.signature(fn).parameters.values():
        args.append(1 if param.annotation in (int, "int") else "x")
    return args


def test_every_key_builder_is_pinned_above() -> None:
    pinned = {p.id.split(" ")[0] for p in LITERAL_KEYS}  # type: ignore[union-attr]
    assert set(_key_builders()) <= pinned
    assert set(_constants()) <= pinned


@pytest.mark.parametrize("name", sorted(_constants()))
def test_every_constant_key_starts_with_the_prefix(name: str) -> None:
    assert _constants()[name].startswith("pai:")


@pytest.mark.parametrize("name", sorted(_key_builders()))
def test_every_built_key_starts_with_the_prefix(name: str) -> None:
    fn = _key_builders()[name]
    assert fn(*_sample_args(fn)).startswith("pai:")


def test_keys_of_different_jobs_do_not_collide() -> None:
    a = {keys.job("alice~a"), keys.job_config("alice~a"), keys.job_attempts("alice~a"),
         keys.job_events("alice~a"), keys.job_tasks("alice~a", 0)}
    b = {keys.job("bob~a"), keys.job_config("bob~a"), keys.job_attempts("bob~a"),
         keys.job_events("bob~a"), keys.job_tasks("bob~a", 0)}
    assert len(a) == 5
    assert not a & b
