"""A local plan run on this machine's Docker engine, as a node would run it.

Each container is made by the launcher's own `DockerRuntime.start`: the same
image pull, storage checks and mounts, limits, confinement (dropped
capabilities, no-new-privileges, pids limit, an init) and host network.
Their output is printed as it comes (each line after its task's name when
there are several); each exit is judged by the monitor's completion rules
(`evaluate_completion`), and once the attempt ends the tasks still running
are stopped as a node stops them. The exit status is the job's: 0 when it
succeeded, else the failing task's exit code (1 when it has none in 1-255),
130 after Ctrl-C. Every container of the run is removed at the end.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator

import docker
from docker.errors import APIError, DockerException, NotFound

from services.launcher.mounts import TaskSetupError
from services.launcher.runtime import DockerRuntime, ImageUnavailable
from services.localrun.plan import LOCAL_IP, LocalPlan, LocalTask
from shared.domain.completion import evaluate_completion
from shared.domain.models import Node
from shared.domain.states import JobState, TaskState
from shared.infra.config import Settings
from shared.node.containers import TaskRef

LOCAL_LABEL = "pai.local"  # the run id, on every container of a local run
LOCAL_PORTS = (1024, 65535)
STOP_SECONDS = 10
EXIT_INTERRUPTED = 130
LOG_JOIN_SECONDS = 10.0


class LocalRunError(Exception):
    """A task could not start (image, storage, Docker): the message says why."""


def task_ref(plan: LocalPlan, planned: LocalTask) -> TaskRef:
    return TaskRef(plan.job_id, 0, planned.task.role, planned.task.index)


def container_name(plan: LocalPlan, planned: LocalTask) -> str:
    return task_ref(plan, planned).container_name


def local_node(plan: LocalPlan) -> Node:
    cpus = os.cpu_count() or 1
    return Node(name=f"local-{plan.run_id}", ip=LOCAL_IP, cpus=cpus, memory_mb=0,
                port_range=LOCAL_PORTS, real_cpus=cpus)


def exit_status(state: JobState, exit_code: int) -> int:
    """The command's exit status for the job's end, as `pai submit --wait` gives it."""
    if state == JobState.SUCCEEDED:
        return 0
    return exit_code if 1 <= exit_code <= 255 else 1


class LocalRun:
    """One run of a plan; `run()` returns the exit status."""

    def __init__(self, plan: LocalPlan, client: docker.DockerClient,
                 out: Callable[[str], None]) -> None:
        self.plan, self.client, self.out = plan, client, out
        self.runtime = DockerRuntime(
            client, Settings(storage_roots=(plan.storage_root,), port_range=LOCAL_PORTS),
            extra_labels={LOCAL_LABEL: plan.run_id})
        self.node = local_node(plan)
        self.tasks = {(t.task.role, t.task.index): t.task for t in plan.tasks}
        self.started: dict[tuple[str, int], str] = {}
        self.exits: queue.Queue[tuple[tuple[str, int], int]] = queue.Queue()
        self.printing = threading.Lock()
        self.followers: list[threading.Thread] = []

    def run(self) -> int:
        try:
            for planned in self.plan.tasks:
                self._start(planned)
            return self._until_the_end()
        except KeyboardInterrupt:
            self.out("interrupted: stopping the job's containers")
            self._stop_running()
            return EXIT_INTERRUPTED
        finally:
            self._remove_all()

    def _start(self, planned: LocalTask) -> None:
        try:
            container_id = self.runtime.start(
                task_ref(self.plan, planned), self.plan.spec, self.plan.username,
                self.plan.spec.virtual_cluster, planned.task, planned.environment, self.node)
        except (ImageUnavailable, TaskSetupError) as error:
            raise LocalRunError(f"{planned.label} did not start: {error}") from None
        key = (planned.task.role, planned.task.index)
        self.started[key] = container_id
        prefix = f"[{planned.label}] " if len(self.plan.tasks) > 1 else ""
        for target in (self._follow, self._wait):
            thread = threading.Thread(target=target, args=(key, container_id, prefix),
                                      daemon=True, name=f"local-{planned.label}")
            thread.start()
            if target == self._follow:
                self.followers.append(thread)

    def _follow(self, key: tuple[str, int], container_id: str, prefix: str) -> None:
        for line in _lines(self.client, container_id):
            with self.printing:
                self.out(prefix + line)

    def _wait(self, key: tuple[str, int], container_id: str, prefix: str) -> None:
        try:
            code = int(self.client.api.wait(container_id).get("StatusCode", -1))
        except (NotFound, APIError, DockerException):
            code = -1
        self.exits.put((key, code))

    def _until_the_end(self) -> int:
        """Judge each exit as the monitor would; stop the rest at the end."""
        while True:
            key, code = self.exits.get()
            task = self.tasks[key]
            self.tasks[key] = dataclasses.replace(
                task, exit_code=code, completed_ms=int(time.time() * 1000),
                state=TaskState.SUCCEEDED if code == 0 else TaskState.FAILED,
                diagnostics="" if code == 0 else f"exit code {code}")
            outcome = evaluate_completion(self.plan.spec, self.tasks.values())
            if outcome is None:
                continue
            self._stop_running()
            for thread in self.followers:
                thread.join(LOG_JOIN_SECONDS)
            self.out(f"{self.plan.spec.name}: {outcome.state.value} ({outcome.reason})")
            return exit_status(outcome.state, outcome.exit_code)

    def _stop_running(self) -> None:
        for (role, index), task in self.tasks.items():
            if not task.state.is_final and (role, index) in self.started:
                self.runtime.stop(TaskRef(self.plan.job_id, 0, role, index),
                                  timeout=STOP_SECONDS)

    def _remove_all(self) -> None:
        for container_id in self.started.values():
            try:
                self.client.api.remove_container(container_id, force=True)
            except NotFound:
                pass
            except (APIError, DockerException) as error:
                self.out(f"could not remove container {container_id[:12]}: {error}")


def _lines(client: docker.DockerClient, container_id: str) -> Iterator[str]:
    """The container's output (stdout and stderr), line by line, to its end."""
    pending = b""
    try:
        for chunk in client.api.logs(container_id, stream=True, follow=True):
            pending += chunk
            *whole, pending = pending.split(b"\n")
            for line in whole:
                yield line.rstrip(b"\r").decode("utf-8", "replace")
    except (NotFound, APIError, DockerException):
        pass
    if pending:
        yield pending.decode("utf-8", "replace")


