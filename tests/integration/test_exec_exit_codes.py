"""An exec's exit code is read once Docker records it (shared/node/execs.py).

Docker may answer an inspect right after the exec's output ends with
`Running: true, ExitCode: null`; read then, a `touch` that succeeded looked
like a failure. These run on the real engine.
"""

from __future__ import annotations

from collections.abc import Iterator

import docker
import pytest
from docker.models.containers import Container

from shared.node import execs

pytestmark = pytest.mark.docker


@pytest.fixture
def container(docker_client: docker.DockerClient, test_image: str,
              test_labels: dict[str, str]) -> Iterator[Container]:
    running = docker_client.containers.run(test_image, ["sleep", "600"], detach=True,
                                           labels=test_labels, network_mode="none")
    try:
        yield running
    finally:
        running.remove(force=True)


def started(container: Container, argv: list[str]) -> str:
    api = container.client.api
    exec_id = api.exec_create(container.id, argv)["Id"]
    api.exec_start(exec_id, detach=True)
    return exec_id


@pytest.mark.parametrize("code", [0, 3])
def test_each_finished_exec_gives_its_own_code(container: Container, code: int) -> None:
    api = container.client.api
    for _ in range(20):  # each read follows the end of the output at once
        exec_id = api.exec_create(container.id, ["sh", "-c", f"exit {code}"])["Id"]
        api.exec_start(exec_id)
        assert execs.exit_code(api, exec_id) == code


def test_an_exec_still_running_has_no_code_yet(container: Container) -> None:
    exec_id = started(container, ["sleep", "600"])
    assert execs.exit_code(container.client.api, exec_id, within=0.2) is None


def test_an_exec_that_ends_while_waited_on_gives_its_code(container: Container) -> None:
    exec_id = started(container, ["sh", "-c", "sleep 0.3; exit 7"])
    assert execs.exit_code(container.client.api, exec_id) == 7
