"""The launcher on a real Redis and a real Docker engine.

Redis state is prepared as the API and scheduler leave it (submit_job, then
commit_placement); the launcher is driven through its plain methods, and the
containers it makes are inspected on the engine.
"""

from __future__ import annotations

import base64
import http.server
import io
import json
import signal
import tarfile
import threading
import uuid
from collections.abc import Iterator
from dataclasses import replace
from typing import Any
from urllib.parse import unquote, urlsplit

import docker
import pytest
import redis
from docker.models.containers import Container

from services.launcher.run import watch_storage
from services.launcher.runtime import DockerRuntime
from services.launcher.service import EXIT_IMAGE_UNAVAILABLE, EXIT_SETUP_FAILED, Launcher
from shared.domain.capabilities import DROPPED
from shared.domain.completion import NON_RETRYABLE_PREFIX
from shared.domain.lease import Claim
from shared.domain.models import Node
from shared.domain.states import JobState, TaskState
from shared.infra.clock import now_ms
from shared.infra.config import Settings
from shared.infra.messaging import SCHEDULER_QUEUE
from shared.node.containers import LABEL_JOB, LABEL_NODE, TaskRef, container_name
from shared.state import leases, storageid
from shared.state.accounts import Accounts, VirtualCluster
from shared.state.leases import Role
from shared.state.lifecycle import delete_job, mark_preempted, request_stop
from shared.state.nodeagent import new_holder
from shared.state.store import Store
from shared.state.taskexits import record_task_exit
from tests.support.launcher_rig import USER, WAIT_SECONDS, Rig
from tests.support.launcher_rig import rig as rig  # the fixture
from tests.support.polling import wait_for

pytestmark = [pytest.mark.docker, pytest.mark.redis]

MISSING_IMAGE = "127.0.0.1:1/pai-test/missing:never"  # a registry that refuses at once


def status_of(container: Container) -> str:
    container.reload()
    return str(container.status)


def env_of(container: Container) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in container.attrs["Config"]["Env"])
    return {name: value for name, value in pairs}


def scheduler_messages(client: redis.Redis) -> list[tuple[str, list[Any]]]:
    """(task name, args) of what waits in the scheduler's queue (a Redis list)."""
    messages = []
    for raw in client.lrange(SCHEDULER_QUEUE, 0, -1):
        message = json.loads(raw)
        body = message["body"]
        if message["properties"].get("body_encoding") == "base64":
            body = base64.b64decode(body).decode()
        args = json.loads(body)[0]
        messages.append((message["headers"]["task"], args))
    return sorted(messages)


# ------------------------------------------------------------------- starting


def test_start_task_creates_the_container_as_the_design_says(rig: Rig) -> None:
    job = rig.submit(rig.config(role={"portList": [{"label": "http", "portNumber": 1}]}))
    rig.launcher.start_task(job.id, 0, "main", 0)

    container = rig.container(job)
    assert container is not None
    assert container.name == container_name(job.id, 0, "main", 0)
    wait_for(lambda: status_of(container) == "running", "the container to run")
    assert {"pai.job": job.id, "pai.attempt": "0", "pai.role": "main", "pai.index": "0",
            "pai.node": rig.node.name, "pai.user": USER,
            "pai.vc": "default"}.items() <= container.labels.items()
    host = container.attrs["HostConfig"]
    assert host["NetworkMode"] == "host"
    assert host["NanoCpus"] == 1_000_000_000
    assert host["Memory"] == 256 * 1024 * 1024
    assert host["ShmSize"] == 32 * 1024 * 1024
    assert host["Privileged"] is False
    assert not host.get("DeviceRequests")
    # No Docker socket, no host path but the job's default output folder.
    output = rig.storage / USER / job.name / "output"
    assert [(m["Source"], m["Destination"], m["RW"]) for m in container.attrs["Mounts"]] == [
        (str(output), str(output), True)]
    assert container.attrs["Config"]["Entrypoint"] == ["/bin/sh", "-c"]
    assert container.attrs["Config"]["Cmd"] == ["sleep 300"]
    env = env_of(container)
    assert env["PAI_JOB_NAME"] == job.name
    assert env["PAI_USER_NAME"] == USER
    assert env["PAI_CURRENT_CONTAINER_IP"] == "127.0.0.1"
    assert env["PAI_CURRENT_CONTAINER_PORT"] == "20000"
    assert env["PAI_CONTAINER_HOST_http_PORT_LIST"] == "20001"
    assert env["PAI_TASK_ROLE_0_HOST_LIST"] == "127.0.0.1:20000"
    assert env["NVIDIA_VISIBLE_DEVICES"] == "none"
    assert env["CUDA_VISIBLE_DEVICES"] == ""


def test_a_container_of_an_earlier_submission_is_removed_not_adopted(rig: Rig) -> None:
    """The attack: `reuse` was cut off with its node, ended, was deleted and
    submitted again; its old container still runs here under the name the
    new submission's task would have. Starting the new task removes the old
    container and makes its own, labelled with the new submission."""
    config = rig.config(jobName="reuse")
    old = rig.submit(config)
    rig.launcher.start_task(old.id, 0, "main", 0)
    stale = rig.container(old)
    assert stale is not None and stale.labels["pai.submission"] == old.submission
    assert request_stop(rig.store, old.id).state == JobState.STOPPING
    assert record_task_exit(rig.store, old.id, 0, "main", 0, exit_code=143) is not None
    assert rig.store.get_allocations(rig.store.r, rig.node.name) == {}  # freed by the exit
    assert delete_job(rig.store, old.id)  # the old container was never told: cut off
    new = rig.submit(config)
    assert new.id == old.id and new.submission != old.submission

    rig.launcher.start_task(new.id, 0, "main", 0)

    current = rig.container(new)
    assert current is not None and current.id != stale.id
    assert current.labels["pai.submission"] == new.submission
    assert [c.id for c in rig.containers_of(new)] == [current.id]


def test_no_container_starts_while_the_nodes_storage_is_not_the_shared_one(rig: Rig) -> None:
    """The node lost its NFS mount (its storage check says so): the task is
    not started, so its output cannot land on the node's own disk; it fails
    as the platform's fault, to run elsewhere uncharged, and the node is
    kept from new work before the retry's pass can place the job there
    again."""
    rig.launcher.storage_problem = lambda: (
        f"storage {rig.storage} has no .pai-cluster file: the cluster's shared storage is "
        "not mounted there")
    holder = new_holder(rig.node.name, "engine-of-the-rig", Role.MONITOR)
    assert leases.claim(rig.store, holder, ip="127.0.0.1", peer="", lease_ms=30_000,
                        grace_ms=10_000, renew_ms=5_000, live_ms=60_000).claim == Claim.TAKEN
    job = rig.submit(rig.config())
    rig.launcher.start_task(job.id, 0, "main", 0)
    lease = leases.read_lease(rig.store.r, rig.node.name)
    assert lease is not None and "shared storage is not mounted" in lease.marked
    assert lease.marked_until_ms > leases.redis_now_ms(rig.store.r)
    assert rig.containers_of(job) == []
    assert not (rig.storage / USER / job.name).exists()
    task = rig.task(job)
    assert (task.state, task.platform_failure) == (TaskState.FAILED, True)
    assert "shared storage is not mounted" in task.diagnostics
    assert rig.job(job).retries == 0


def test_a_storage_check_that_failed_is_asked_again_before_a_start_is_refused(
        rig: Rig) -> None:
    """The node's launcher came up before the control plane wrote the
    storage's identity (every service of a box started at once): its first
    check failed. A start once the identity is there is not refused on that
    stale answer, though the check's own loop has not looked again yet."""
    stop = threading.Event()
    try:
        watch_storage(rig.settings, rig.launcher, stop)
        assert "no .pai-cluster file" in rig.launcher.storage_problem()
        assert storageid.ensure_storage(rig.store, rig.settings.storage_roots,
                                        rig.settings.task_log_dir, None) == []
        job = rig.submit(rig.config())
        rig.launcher.start_task(job.id, 0, "main", 0)
        assert rig.container(job) is not None
        assert rig.task(job).state != TaskState.FAILED
    finally:
        stop.set()


def test_a_repeated_start_finds_the_same_container(rig: Rig) -> None:
    job = rig.submit(rig.config())
    rig.launcher.start_task(job.id, 0, "main", 0)
    first = rig.container(job)
    rig.launcher.start_task(job.id, 0, "main", 0)
    assert first is not None
    assert [c.id for c in rig.containers_of(job)] == [first.id]


def test_racing_starts_make_one_container(rig: Rig) -> None:
    job = rig.submit(rig.config())
    threads = [threading.Thread(target=rig.launcher.start_task, args=(job.id, 0, "main", 0))
               for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_SECONDS)
    containers = rig.containers_of(job)
    assert len(containers) == 1
    wait_for(lambda: status_of(containers[0]) == "running", "the one container to run")


def test_the_command_sees_its_environment_and_storage(rig: Rig) -> None:
    user_dir = rig.storage / USER
    (user_dir / "data").mkdir(parents=True)
    (user_dir / "data" / "input.txt").write_text("42\n")
    (user_dir / "code").mkdir()
    (user_dir / "code" / "train.sh").write_text("echo trained on $(cat $PAI_DATA_DIR/input.txt)\n")
    config = rig.config(
        command='pwd > $PAI_OUTPUT_DIR/pwd; sh train.sh > "$PAI_OUTPUT_DIR/result"; '
                'touch $PAI_DATA_DIR/x 2>/dev/null && echo writable > $PAI_OUTPUT_DIR/data; '
                'env > $PAI_OUTPUT_DIR/env',
        dataDir="$PAI_DEFAULT_FS_URI/$PAI_USER_NAME/data",
        codeDir="$PAI_DEFAULT_FS_URI/$PAI_USER_NAME/code")
    job = rig.submit(config)
    rig.launcher.start_task(job.id, 0, "main", 0)
    container = rig.container(job)
    assert container is not None
    assert container.wait(timeout=WAIT_SECONDS)["StatusCode"] == 0, container.logs()

    output = rig.storage / USER / job.name / "output"  # the API's default outputDir
    assert (output / "pwd").read_text() == "/pai/code\n"
    assert (output / "result").read_text() == "trained on 42\n"
    assert not (output / "data").exists(), "dataDir must be read-only"
    assert f"PAI_OUTPUT_DIR={output}\n" in (output / "env").read_text()
    targets = {m["Destination"]: m["RW"] for m in container.attrs["Mounts"]}
    assert targets == {str(user_dir / "data"): False, str(user_dir / "code"): False,
                       "/pai/code": False, str(output): True}


def test_a_gpu_task_gets_its_gpus_in_the_environment_only(rig: Rig) -> None:
    job = rig.submit(rig.config(role={"gpuNumber": 1}), gpus={("main", 0): (1,)})
    rig.launcher.start_task(job.id, 0, "main", 0)
    container = rig.container(job)
    assert container is not None
    env = env_of(container)
    assert (env["NVIDIA_VISIBLE_DEVICES"], env["CUDA_VISIBLE_DEVICES"]) == ("1", "1")
    assert not container.attrs["HostConfig"].get("DeviceRequests")  # virtual GPUs


def test_cpu_limit_is_capped_at_the_real_cpus(rig: Rig) -> None:
    wanted = rig.node.real_cpus + 3
    job = rig.submit(rig.config(role={"cpuNumber": wanted}), validate=False)
    rig.launcher.start_task(job.id, 0, "main", 0)
    container = rig.container(job)
    assert container is not None
    assert container.attrs["HostConfig"]["NanoCpus"] == rig.node.real_cpus * 1_000_000_000
    assert env_of(container)["PAI_TASK_CPU_NUM"] == str(wanted)


@pytest.mark.parametrize("why", ["another node", "old attempt", "not launching"])
def test_start_task_leaves_tasks_that_are_not_its_own(rig: Rig, why: str) -> None:
    job = rig.submit(rig.config(), node="elsewhere" if why == "another node" else None)
    attempt = 0
    if why == "old attempt":
        attempt = 1
    if why == "not launching":
        request_stop(rig.store, job.id)
    rig.launcher.start_task(job.id, attempt, "main", 0)
    assert rig.containers_of(job) == []


# --------------------------------------------------------------- confinement

# Bit numbers of linux/capability.h: what /proc/<pid>/status shows as masks.
CAPABILITY_BITS = {
    "CHOWN": 0, "DAC_OVERRIDE": 1, "FOWNER": 3, "FSETID": 4, "KILL": 5, "SETGID": 6,
    "SETUID": 7, "SETPCAP": 8, "NET_BIND_SERVICE": 10, "NET_RAW": 13, "IPC_LOCK": 14,
    "SYS_CHROOT": 18, "SYS_PTRACE": 19, "MKNOD": 27, "AUDIT_WRITE": 29, "SETFCAP": 31,
}


def run_to_exit(rig: Rig, command: str, **overrides: Any) -> tuple[Container, str]:
    """Launch a job as the launcher does; its container and output once it exited."""
    job = rig.submit(rig.config(command=command, **overrides))
    rig.launcher.start_task(job.id, 0, "main", 0)
    container = rig.container(job)
    assert container is not None
    container.wait(timeout=WAIT_SECONDS)
    return container, container.logs().decode()


def capabilities_in(status: str, field: str) -> set[str]:
    """Decode a /proc/self/status capability mask (CapEff, CapBnd) into names."""
    line = next(ln for ln in status.splitlines() if ln.startswith(f"{field}:"))
    mask = int(line.split()[1], 16)
    return {name for name, bit in CAPABILITY_BITS.items() if mask >> bit & 1}


def with_pids_limit(rig: Rig, limit: int) -> None:
    settings = replace(rig.settings, container_pids_limit=limit)
    rig.launcher.runtime = DockerRuntime(rig.docker, settings,
                                         extra_labels=rig.launcher.runtime.extra_labels)


def test_a_job_container_is_confined_as_the_threat_model_says(rig: Rig) -> None:
    """Threat: job code gains privileges (setuid, capabilities), swaps the node to
    death or forks without bound. Every job container is created unprivileged,
    with no-new-privileges, the documented capabilities dropped, a pids limit,
    swap equal to memory and an init process."""
    job = rig.submit(rig.config())
    rig.launcher.start_task(job.id, 0, "main", 0)
    container = rig.container(job)
    assert container is not None
    host = container.attrs["HostConfig"]
    assert set(host["CapDrop"]) == set(DROPPED)
    assert {"NET_RAW", "MKNOD", "SYS_CHROOT", "AUDIT_WRITE", "SETFCAP"} <= set(DROPPED)
    assert not host.get("CapAdd")
    assert host["SecurityOpt"] == ["no-new-privileges"]
    assert host["PidsLimit"] == Settings().container_pids_limit == 4096
    assert host["MemorySwap"] == host["Memory"] == 256 * 1024 * 1024
    assert host["Init"] is True
    assert host["Privileged"] is False


def test_a_job_has_no_raw_sockets_and_cannot_gain_privileges(rig: Rig) -> None:
    """Threat: a job on the host's network sniffs or spoofs the node's traffic
    through raw or packet sockets, or regains a dropped capability later. Its
    processes hold none of the dropped capabilities (nor can they get them back:
    the bounding set lacks them, NoNewPrivs is set), and raw sockets fail."""
    _, output = run_to_exit(
        rig, "grep -E '^(Cap|NoNewPrivs)' /proc/self/status; "
             "arping -c 1 -w 1 -I lo 127.0.0.1 2>&1; echo arping-exit=$?; "
             "ping -c 1 -W 1 127.0.0.1 2>&1; echo ping-exit=$?; "
             "cat /proc/sys/net/ipv4/ping_group_range")
    effective, bounding = capabilities_in(output, "CapEff"), capabilities_in(output, "CapBnd")
    assert effective == bounding == {"CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL",
                                     "SETGID", "SETUID"}, output
    assert "NoNewPrivs:\t1" in output
    assert "arping: socket: Operation not permitted" in output and "arping-exit=1" in output
    low, high = (int(n) for n in output.strip().splitlines()[-1].split())
    if not low <= 0 <= high:  # the host allows no unprivileged ICMP sockets either
        assert "ping-exit=1" in output, output


def test_a_fork_bomb_stops_at_the_pids_limit(rig: Rig) -> None:
    """Threat: a job forks until the node has no PIDs left for anyone. The
    bomb's forks start failing at the container's limit; the processes the
    container holds, counted on the host side, never exceed it."""
    with_pids_limit(rig, 64)
    job = rig.submit(rig.config(
        command="(i=0; while [ $i -lt 500 ]; do sleep 300 & i=$((i+1)); done); "
                "echo bomb-stopped; exec sleep 300"))
    rig.launcher.start_task(job.id, 0, "main", 0)
    container = rig.container(job)
    assert container is not None
    wait_for(lambda: b"bomb-stopped" in container.logs(), "the fork bomb to stop")
    assert b"can't fork" in container.logs()
    assert container.attrs["HostConfig"]["PidsLimit"] == 64
    processes = container.top()["Processes"]
    assert 32 < len(processes) <= 64, len(processes)


def test_a_capability_the_vc_allowed_is_added(rig: Rig) -> None:
    """Threat: the way back to a capability bypasses the admin. Only what the
    job asks for in extras.capabilities (admitted by the API against its VC's
    allow-list) is added, and nothing else comes back with it."""
    Accounts(rig.store).put_vc(VirtualCluster("default", allowed_capabilities=["IPC_LOCK"]))
    container, output = run_to_exit(rig, "grep CapEff /proc/self/status",
                                    extras={"capabilities": ["IPC_LOCK"]})
    host = container.attrs["HostConfig"]
    assert host["CapAdd"] == ["IPC_LOCK"]
    assert "IPC_LOCK" not in host["CapDrop"] and "NET_RAW" in host["CapDrop"]
    assert capabilities_in(output, "CapEff") == {"CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID",
                                                 "KILL", "SETGID", "SETUID", "IPC_LOCK"}


def test_a_capability_revoked_after_submit_is_not_granted_at_launch(rig: Rig) -> None:
    """Threat: a job admitted while its VC allowed a capability still gets it
    after the admin took it back. The launcher checks the allow-list again:
    the task fails (not retried) and no container is made."""
    job = rig.submit(rig.config(extras={"capabilities": ["SYS_PTRACE"]}, retryCount=2))
    rig.launcher.start_task(job.id, 0, "main", 0)

    assert rig.containers_of(job) == []
    task = rig.task(job)
    assert (task.state, task.exit_code) == (TaskState.FAILED, EXIT_SETUP_FAILED)
    assert task.diagnostics == (f"{NON_RETRYABLE_PREFIX} virtual cluster default no longer "
                                "allows SYS_PTRACE")
    assert rig.job(job).state == JobState.FAILED


# ------------------------------------------------------------------- failing


def test_an_image_that_cannot_be_pulled_fails_the_job_without_retry(
        rig: Rig, redis_client: redis.Redis) -> None:
    job = rig.submit(rig.config(image=MISSING_IMAGE, retryCount=2))
    rig.launcher.start_task(job.id, 0, "main", 0)

    task = rig.task(job)
    assert task.state == TaskState.FAILED
    assert task.exit_code == EXIT_IMAGE_UNAVAILABLE
    assert task.diagnostics.startswith(f"{NON_RETRYABLE_PREFIX} image {MISSING_IMAGE} "
                                       "cannot be pulled")
    final = rig.job(job)
    assert (final.state, final.retries, final.attempt) == (JobState.FAILED, 0, 0)
    assert MISSING_IMAGE in final.exit_diagnostics
    assert rig.containers_of(job) == []
    assert scheduler_messages(redis_client) == [("pai.scheduler.attempt_ended", [job.id, 0])]


@pytest.mark.parametrize(("data_dir", "reason"), [
    pytest.param("/etc", "dataDir '/etc' must be under one of the storage roots",
                 id="outside the roots"),
    pytest.param("{root}/nothing", "dataDir {root}/nothing does not exist on node {node}",
                 id="missing"),
])
def test_bad_data_dir_fails_the_task_with_its_reason(rig: Rig, data_dir: str,
                                                     reason: str) -> None:
    fields = {"root": rig.storage, "node": rig.node.name}
    job = rig.submit(rig.config(dataDir=data_dir.format(**fields)), validate=False)
    rig.launcher.start_task(job.id, 0, "main", 0)
    task = rig.task(job)
    assert (task.state, task.exit_code) == (TaskState.FAILED, EXIT_SETUP_FAILED)
    assert reason.format(**fields) in task.diagnostics
    assert rig.job(job).state == JobState.FAILED
    assert rig.containers_of(job) == []


def test_a_bad_data_dir_counts_against_retries(rig: Rig) -> None:
    job = rig.submit(rig.config(dataDir=f"{rig.storage}/nothing", retryCount=1),
                     validate=False)
    rig.launcher.start_task(job.id, 0, "main", 0)
    retried = rig.job(job)
    assert (retried.state, retried.attempt, retried.retries) == (JobState.WAITING, 1, 1)


@pytest.fixture
def shell_less_image(docker_client: docker.DockerClient) -> Iterator[str]:
    """An image holding one text file: no /bin/sh to run a command with."""
    image = f"pai-test/no-shell:{uuid.uuid4().hex[:8]}"
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        info = tarfile.TarInfo("README")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"hi\n"))
    docker_client.api.import_image_from_data(layer.getvalue(), repository=image)
    try:
        yield image
    finally:
        docker_client.images.remove(image, force=True)


def test_an_image_without_a_shell_exits_127(rig: Rig, shell_less_image: str) -> None:
    """The init process starts and reports the missing shell as a command not
    found; the monitor then fails the task from that exit code."""
    job = rig.submit(rig.config(image=shell_less_image))
    rig.launcher.start_task(job.id, 0, "main", 0)
    container = rig.container(job)
    assert container is not None
    assert container.wait(timeout=WAIT_SECONDS)["StatusCode"] == 127


def test_a_created_container_that_cannot_start_is_removed_and_fails_the_task(
        rig: Rig, shell_less_image: str) -> None:
    """A launcher that died between create and start left a container behind;
    the next start_task tries it, and when Docker cannot start it, says why."""
    job = rig.submit(rig.config(image=shell_less_image))
    rig.docker.containers.create(shell_less_image, ["true"], entrypoint=["/bin/sh", "-c"],
                                 name=container_name(job.id, 0, "main", 0),
                                 labels={LABEL_NODE: rig.node.name, LABEL_JOB: job.id})
    rig.launcher.start_task(job.id, 0, "main", 0)
    task = rig.task(job)
    assert (task.state, task.exit_code) == (TaskState.FAILED, EXIT_SETUP_FAILED)
    assert task.diagnostics.startswith("the container did not start: ")
    assert "/bin/sh" in task.diagnostics
    assert rig.containers_of(job) == []


# ------------------------------------------------------------------- stopping


def test_stop_task_stops_the_container(rig: Rig) -> None:
    job = rig.submit(rig.config())
    rig.launcher.start_task(job.id, 0, "main", 0)
    container = rig.container(job)
    assert container is not None
    wait_for(lambda: status_of(container) == "running", "the container to run")
    rig.launcher.stop_task(job.id, 0, "main", 0)
    assert status_of(container) == "exited"
    # 128 + SIGTERM: the stop signal reached the command (after a SIGKILL at
    # the end of the grace period it would be 128 + 9).
    assert container.attrs["State"]["ExitCode"] == 128 + signal.SIGTERM
    # The monitor records the exit it observes; the launcher leaves the task alone.
    assert rig.task(job).state == TaskState.LAUNCHING


def test_stop_before_the_container_exists_settles_the_task(
        rig: Rig, redis_client: redis.Redis) -> None:
    job = rig.submit(rig.config())
    request_stop(rig.store, job.id)
    rig.launcher.stop_task(job.id, 0, "main", 0)
    task = rig.task(job)
    assert (task.state, task.diagnostics) == (TaskState.STOPPED,
                                              "stopped before its container started")
    assert rig.job(job).state == JobState.STOPPED
    assert scheduler_messages(redis_client) == [("pai.scheduler.attempt_ended", [job.id, 0])]
    rig.launcher.stop_task(job.id, 0, "main", 0)  # again: nothing more happens
    assert len(scheduler_messages(redis_client)) == 1


def test_stop_of_a_created_container_removes_it_and_settles_the_task(rig: Rig) -> None:
    job = rig.submit(rig.config())
    ref = TaskRef(job.id, 0, "main", 0)
    rig.docker.containers.create(rig.image, ["sleep", "300"], name=ref.container_name,
                                 labels={LABEL_NODE: rig.node.name})
    request_stop(rig.store, job.id)
    rig.launcher.stop_task(job.id, 0, "main", 0)
    assert rig.container(job) is None
    assert rig.task(job).state == TaskState.STOPPED


# ---------------------------------------------------------------- preemption

TRAPS_TERM = ('trap \'cat "$PAI_PREEMPTION_FILE"; exit 7\' TERM; '
              'while true; do sleep 0.2; done')


def test_a_preempted_task_reads_its_notice_and_gets_sigterm(rig: Rig) -> None:
    job = rig.submit(rig.config(command=TRAPS_TERM))
    rig.launcher.start_task(job.id, 0, "main", 0)
    container = rig.container(job)
    assert container is not None
    wait_for(lambda: status_of(container) == "running", "the container to run")
    assert mark_preempted(rig.store, job.id, attempt=0, by="bob~owner",
                          deadline_ms=now_ms() + 30_000) is not None

    rig.launcher.preempt_task(job.id, 0, "main", 0)

    assert container.wait(timeout=WAIT_SECONDS)["StatusCode"] == 7  # its own handler ran
    notice = container.logs().decode()
    assert "PAI_PREEMPTED=1" in notice and "PAI_PREEMPTED_BY=bob~owner" in notice


def test_a_preempt_message_for_a_job_not_preempted_does_nothing(rig: Rig) -> None:
    """Threat: a forged or stale preempt message (another user's job id in the
    launcher's queue) must not signal a job the scheduler did not preempt."""
    job = rig.submit(rig.config(command=TRAPS_TERM))
    rig.launcher.start_task(job.id, 0, "main", 0)
    container = rig.container(job)
    assert container is not None
    wait_for(lambda: status_of(container) == "running", "the container to run")

    rig.launcher.preempt_task(job.id, 0, "main", 0)

    assert status_of(container) == "running"


def test_a_task_preempted_before_its_container_started_is_settled(rig: Rig) -> None:
    job = rig.submit(rig.config())
    assert mark_preempted(rig.store, job.id, attempt=0, by="bob~owner",
                          deadline_ms=now_ms() + 30_000) is not None
    rig.launcher.preempt_task(job.id, 0, "main", 0)
    assert rig.task(job).state == TaskState.STOPPED
    after = rig.job(job)
    assert (after.state, after.attempt, after.preemptions) == (JobState.WAITING, 1, 1)


# ------------------------------------------------------------------ heartbeat


def test_heartbeat_registers_the_node_and_renews_its_lease(rig: Rig) -> None:
    stop = threading.Event()
    thread = threading.Thread(target=rig.launcher.heartbeat_loop, args=(stop,))
    thread.start()
    try:
        nodes = wait_for(rig.store.get_nodes, "the node to register")
        assert [n.name for n in nodes] == [rig.node.name]
        assert len(nodes[0].gpus) == 2 and nodes[0].real_cpus >= 1
        first = rig.store.node_heartbeats()[rig.node.name]
        wait_for(lambda: rig.store.node_heartbeats()[rig.node.name] > first,
                 "a later heartbeat")
    finally:
        stop.set()
        thread.join(5)
    assert not thread.is_alive()


class FailureCountingStore(Store):
    """A Store on a Redis that refuses every connection, counting the node
    writes that failed: the heartbeat loop's attempts, observed."""

    def __init__(self, client: redis.Redis) -> None:
        super().__init__(client)
        self.failures = 0

    def register_node(self, node: Node) -> None:
        try:
            super().register_node(node)
        except redis.RedisError:
            self.failures += 1
            raise

    def heartbeat(self, name: str) -> None:
        try:
            super().heartbeat(name)
        except redis.RedisError:
            self.failures += 1
            raise


def test_heartbeat_survives_redis_errors(rig: Rig) -> None:
    broken = FailureCountingStore(
        redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.1))
    launcher = Launcher(rig.settings, broken, rig.launcher.messenger, rig.launcher.runtime,
                        rig.node)
    stop = threading.Event()
    thread = threading.Thread(target=launcher.heartbeat_loop, args=(stop,))
    thread.start()
    try:
        wait_for(lambda: broken.failures >= 3, "three failed heartbeats")
        assert thread.is_alive(), "a Redis error ended the heartbeat loop"
    finally:
        stop.set()
    thread.join(5)
    assert not thread.is_alive()


# A job's view of Redis: one connection that sends, as RESP arrays, a PING and
# a CONFIG GET without logging in, then AUTH with every value in its own
# environment, as the password of each user name Redis could have.
REDIS_PROBE = r"""
resp() { printf '*%d\r\n' $#; for a in "$@"; do printf '$%d\r\n%s\r\n' ${#a} "$a"; done; }
{
  resp PING
  resp CONFIG GET dir
  env | while IFS= read -r line; do
    value=${line#*=}
    [ -n "$value" ] || continue
    resp AUTH "$value"
    for user in default pai; do resp AUTH "$user" "$value"; done
  done
  resp GET pai:probe
} > /tmp/probe
echo "attempts=$(grep -c '^\*' /tmp/probe)"
nc -w 3 127.0.0.1 PORT < /tmp/probe | tr -d '\r'
echo probe-done
"""


def test_a_job_cannot_use_redis_with_anything_it_has(rig: Rig, redis_server: str) -> None:
    """Threat: job code on the host network talks to Redis (every token,
    every record, CONFIG SET dir onto the host). Without credentials Redis
    answers NOAUTH to everything; no value the job finds in its environment
    logs in as any user; the platform's password is in neither the job's
    environment nor its mounts."""
    url = urlsplit(redis_server)
    container, output = run_to_exit(rig, REDIS_PROBE.replace("PORT", str(url.port)))
    assert "probe-done" in output, output
    attempts = int(output.split("attempts=", 1)[1].split()[0])
    replies = [line for line in output.splitlines() if line[:1] in "+-:$*"]
    # Every command got its answer (so the probe reached Redis and the check
    # can fail), and every answer is a refusal.
    assert len(replies) == attempts > 4, output
    assert replies[0].startswith("-NOAUTH") and replies[1].startswith("-NOAUTH"), output
    assert replies[-1].startswith("-NOAUTH"), output
    assert all(reply.startswith("-WRONGPASS") for reply in replies[2:-1]), output
    password = unquote(url.password or "")
    assert password and password not in json.dumps(container.attrs), \
        "the Redis password reached the job's container"


@pytest.mark.parametrize("command", [
    ("CONFIG", "GET", "dir"), ("CONFIG", "SET", "dir", "/tmp"), ("FLUSHALL",), ("FLUSHDB",),
    ("KEYS", "*"), ("DEBUG", "SLEEP", "0"), ("SHUTDOWN",), ("REPLICAOF", "NO", "ONE"),
    ("MODULE", "LIST"), ("ACL", "LIST"), ("MONITOR",), ("SAVE",),
    ("MIGRATE", "h", "1", "k", "0", "1"),
], ids=lambda c: "-".join(c[:2]).lower())
def test_the_platforms_own_redis_user_cannot_reconfigure_redis(redis_server: str,
                                                               command: tuple[str, ...]) -> None:
    """Threat: a leaked platform password turns into control of the Redis host
    (CONFIG SET dir/dbfilename writes files as Redis's user) or wipes every
    record. The platform's user has none of the dangerous commands."""
    with redis.Redis.from_url(redis_server) as client:
        with pytest.raises(redis.exceptions.ResponseError, match=r"no permissions|not allowed"):
            client.execute_command(*command)
        assert client.ping()


class _Registry(http.server.BaseHTTPRequestHandler):
    """A registry that asks for a login and has no images: what the Docker
    engine sends it (the Authorization of each request) is what is tested."""

    seen: list[str | None]

    def do_GET(self) -> None:
        login = self.headers.get("Authorization")
        self.seen.append(login)
        status = 404 if login else 401
        self.send_response(status)
        self.send_header("Docker-Distribution-API-Version", "registry/2.0")
        self.send_header("WWW-Authenticate", 'Basic realm="pai-test"')
        self.send_header("Content-Type", "application/json")
        body = b'{"errors":[{"code":"UNAUTHORIZED","message":"login"}]}' if status == 401 \
            else b'{"errors":[{"code":"MANIFEST_UNKNOWN","message":"none here"}]}'
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_HEAD = do_GET

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def registry() -> Iterator[tuple[str, list[str | None]]]:
    """A private registry on 127.0.0.1 (Docker speaks plain HTTP to loopback
    registries); its address and the Authorization headers it was sent."""
    seen: list[str | None] = []
    handler = type("Registry", (_Registry,), {"seen": seen})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def test_the_jobs_registry_login_goes_with_the_pull_and_nowhere_else(
        rig: Rig, registry: tuple[str, list[str | None]]) -> None:
    address, seen = registry
    image = f"{address}/team/private:v1"
    job = rig.submit(rig.config(image=image, imageAuth={
        "username": "alice", "password": "s3cret-registry-pw", "registryuri": address}))
    rig.launcher.start_task(job.id, 0, "main", 0)

    expected = "Basic " + base64.b64encode(b"alice:s3cret-registry-pw").decode()
    assert expected in seen  # the engine logged in to the job's registry as the job said
    task = rig.task(job)
    assert task.exit_code == EXIT_IMAGE_UNAVAILABLE  # the registry has no such image
    assert "s3cret-registry-pw" not in task.diagnostics
    assert "s3cret-registry-pw" not in json.dumps(rig.store.get_events(job.id))


def test_without_a_login_the_pull_sends_none(
        rig: Rig, registry: tuple[str, list[str | None]]) -> None:
    address, seen = registry
    job = rig.submit(rig.config(image=f"{address}/team/private:v1"))
    rig.launcher.start_task(job.id, 0, "main", 0)

    assert seen and not any(seen)  # asked, and never answered with a login
    assert rig.task(job).exit_code == EXIT_IMAGE_UNAVAILABLE
