"""A notice written into a running container (the preemption warning, the
fence's) on a real Docker engine: a job that polls for the file reads it
whole, and a later notice replaces an earlier one."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator

import docker
import pytest
from docker.models.containers import Container

from shared.node.notices import notice_archive, put_text
from tests.support.polling import wait_for

pytestmark = [pytest.mark.docker]

NOTICE = "/pai/preempted"
ROUNDS = 20
# Each notice is large (a real one is a few lines) so that copying its bytes
# takes long enough for a poller to see a file created but not yet filled.
LINES = 20_000
# Polls for the notice as fast as a shell can; for each one seen, prints its
# size in bytes and its last line, removes it and awaits the next.
POLLER = (f"i=0; while [ $i -lt {ROUNDS} ]; do "
          f"while [ ! -e {NOTICE} ]; do :; done; "
          f"echo \"seen $(wc -c < {NOTICE}) $(tail -n 1 {NOTICE})\"; rm -f {NOTICE}; "
          "i=$((i+1)); done")


@pytest.fixture
def container(docker_client: docker.DockerClient, test_image: str,
              test_labels: dict[str, str]) -> Iterator[Container]:
    made = docker_client.containers.run(test_image, ["sh", "-c", POLLER], detach=True,
                                        labels=test_labels)
    try:
        yield made
    finally:
        made.remove(force=True)


def notice_text(round_: int) -> str:
    return "".join(f"PAI_LINE_{n}={round_}\n" for n in range(LINES)) + f"PAI_END={round_}\n"


def as_seen(text: str) -> str:
    """What the poller prints for `text` read whole."""
    return f"seen {len(text.encode())} {text.splitlines()[-1]}"


def seen(container: Container) -> list[str]:
    """The poller's line for each notice, as it read it."""
    return [line for line in container.logs().decode().splitlines() if line.startswith("seen")]


def test_a_polling_job_reads_every_notice_whole(container: Container) -> None:
    for round_ in range(ROUNDS):
        assert put_text(container, NOTICE, notice_text(round_))
        wait_for(lambda r=round_: len(seen(container)) > r, f"notice {round_} read")
    assert seen(container) == [as_seen(notice_text(r)) for r in range(ROUNDS)]


def test_a_later_notice_replaces_an_earlier_one(docker_client: docker.DockerClient,
                                                test_image: str,
                                                test_labels: dict[str, str]) -> None:
    made = docker_client.containers.run(test_image, ["sleep", "60"], detach=True,
                                        labels=test_labels)
    try:
        assert put_text(made, NOTICE, "PAI_PREEMPTED_BY=bob~first\n")
        assert put_text(made, NOTICE, "PAI_PREEMPTED_BY=node fence\n")
        result = made.exec_run(["cat", NOTICE])
        assert result.exit_code == 0 and result.output == b"PAI_PREEMPTED_BY=node fence\n"
    finally:
        made.remove(force=True)


def test_a_gone_container_is_told_apart(docker_client: docker.DockerClient, test_image: str,
                                        test_labels: dict[str, str]) -> None:
    made = docker_client.containers.create(test_image, ["true"], labels=test_labels)
    made.remove(force=True)
    assert put_text(made, NOTICE, "PAI_PREEMPTED=1\n") is False


def test_the_archive_stages_the_text_before_the_name_appears() -> None:
    """The engine extracts entries in order, creating a file before copying
    its bytes: the name a job reads must come only as a link to bytes
    already written."""
    with tarfile.open(fileobj=io.BytesIO(notice_archive(NOTICE, "A=1\n"))) as tar:
        staged, final = tar.getmembers()
        assert staged.isfile() and staged.name == "pai/.preempted.next"
        assert tar.extractfile(staged).read() == b"A=1\n"  # type: ignore[union-attr]
        assert final.islnk() and final.name == "pai/preempted"
        assert final.linkname == staged.name
