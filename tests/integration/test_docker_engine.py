"""The Docker engine the suite runs on, driven through the SDK as the launcher will.

These pin down what the platform relies on: the local test image runs with
host networking, exit codes and logs come back, environment and labels reach
the container, and a stopped container reports the signal it died of.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import docker
import pytest
from docker.models.containers import Container

pytestmark = pytest.mark.docker

WAIT_SECONDS = 60


class _Runner:
    """Starts labelled, host-networked containers and removes them afterwards."""

    def __init__(self, client: docker.DockerClient, image: str, labels: dict[str, str]) -> None:
        self.client = client
        self.image = image
        self.labels = labels
        self.started: list[Container] = []

    def start(
        self,
        script: str,
        labels: dict[str, str] | None = None,
        environment: dict[str, str] | None = None,
    ) -> Container:
        container = self.client.containers.run(
            self.image,
            ["sh", "-c", script],
            detach=True,
            network_mode="host",
            labels={**self.labels, **(labels or {})},
            environment=environment or {},
        )
        self.started.append(container)
        return container

    def run_to_exit(
        self, script: str, environment: dict[str, str] | None = None
    ) -> tuple[int, str]:
        """Run `script` to its end; (exit code, stdout+stderr)."""
        container = self.start(script, environment=environment)
        status = container.wait(timeout=WAIT_SECONDS)
        return status["StatusCode"], container.logs().decode()

    def remove_all(self) -> None:
        for container in self.started:
            container.remove(force=True)


@pytest.fixture
def run_container(
    docker_client: docker.DockerClient, test_image: str, test_labels: dict[str, str]
) -> Iterator[_Runner]:
    runner = _Runner(docker_client, test_image, test_labels)
    yield runner
    runner.remove_all()


def test_engine_answers(docker_client: docker.DockerClient) -> None:
    assert docker_client.ping() is True
    assert docker_client.version()["ApiVersion"]


def test_exit_code_comes_back(run_container: _Runner) -> None:
    code, _ = run_container.run_to_exit("exit 3")
    assert code == 3


def test_success_and_output_come_back(run_container: _Runner) -> None:
    container = run_container.start("echo hello from pai; echo line two; echo to stderr >&2")
    assert container.wait(timeout=WAIT_SECONDS)["StatusCode"] == 0
    assert container.logs(stderr=False).decode() == "hello from pai\nline two\n"
    assert container.logs(stdout=False).decode() == "to stderr\n"


def test_environment_reaches_the_container(run_container: _Runner) -> None:
    code, logs = run_container.run_to_exit(
        'echo "$PAI_JOB_NAME/$PAI_TASK_INDEX"',
        environment={"PAI_JOB_NAME": "alice~hello", "PAI_TASK_INDEX": "2"},
    )
    assert (code, logs.strip()) == (0, "alice~hello/2")


def test_labels_are_set_and_filterable(
    docker_client: docker.DockerClient, run_container: _Runner, test_session_label: str
) -> None:
    container = run_container.start("exit 0", labels={"pai.job": "alice~labels"})
    container.wait(timeout=WAIT_SECONDS)
    found = docker_client.containers.list(
        all=True,
        filters={"label": ["pai.job=alice~labels", f"pai.test.session={test_session_label}"]},
    )
    assert [c.id for c in found] == [container.id]


def test_host_networking_reaches_a_port_on_loopback(run_container: _Runner) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        server.settimeout(WAIT_SECONDS)
        port = server.getsockname()[1]
        received: list[bytes] = []

        def accept_one() -> None:
            conn, _ = server.accept()
            with conn:
                received.append(conn.recv(100))

        acceptor = threading.Thread(target=accept_one)
        acceptor.start()
        code, logs = run_container.run_to_exit(f"echo ping-from-container | nc 127.0.0.1 {port}")
        acceptor.join(WAIT_SECONDS)
    assert code == 0, logs
    assert received == [b"ping-from-container\n"]


def test_stop_reports_the_signal(run_container: _Runner) -> None:
    container = run_container.start("trap 'exit 143' TERM; while true; do sleep 0.1; done")
    container.stop(timeout=10)
    assert container.wait(timeout=WAIT_SECONDS)["StatusCode"] == 143


def test_kill_reports_sigkill(run_container: _Runner) -> None:
    container = run_container.start("sleep 600")
    container.kill()
    assert container.wait(timeout=WAIT_SECONDS)["StatusCode"] == 137
