"""Where a task's full log file goes: the job's outputDir, through its bind mount."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from services.monitor.logfile import TaskLogFile, log_file_path, output_dir_on_host
from shared.containers import TaskRef

OUTPUT = {"Type": "bind", "Source": "/srv/real/alice/out", "Destination": "/srv/pai/alice/out",
          "RW": True}
DATA = {"Type": "bind", "Source": "/srv/real/data", "Destination": "/srv/pai/data", "RW": False}


def test_the_log_file_is_per_attempt_role_and_index() -> None:
    assert log_file_path("/out", TaskRef("alice~job", 2, "worker", 3)) == \
        "/out/logs/2/worker-3.log"


@pytest.mark.parametrize(("config", "mounts", "expected"), [
    pytest.param({"outputDir": "/srv/pai/alice/out"}, [DATA, OUTPUT], "/srv/real/alice/out",
                 id="the writable mount at outputDir: its host source"),
    pytest.param({"outputDir": "file:///srv/pai/alice/out/"}, [OUTPUT], "/srv/real/alice/out",
                 id="a file:// URI with a trailing slash"),
    pytest.param({"outputDir": "/srv/pai/data"}, [DATA], None, id="mounted read-only: none"),
    pytest.param({"outputDir": "hdfs://nn/out"}, [OUTPUT], None, id="hdfs: the job's business"),
    pytest.param({}, [OUTPUT], None, id="no outputDir"),
    pytest.param(None, [OUTPUT], None, id="no config"),
    pytest.param({"outputDir": "/srv/pai/alice/out"}, [], None, id="not mounted"),
])
def test_the_output_dir_is_found_through_the_containers_mounts(
        config: dict[str, Any] | None, mounts: list[dict[str, Any]],
        expected: str | None) -> None:
    assert output_dir_on_host(config, mounts) == expected


def test_lines_are_appended_batch_after_batch(tmp_path: Path) -> None:
    log = TaskLogFile(str(tmp_path / "logs" / "0" / "main-0.log"))

    log.append(["one", "two"])
    log.append(["three"])

    assert (tmp_path / "logs" / "0" / "main-0.log").read_text() == "one\ntwo\nthree\n"


def test_a_file_that_cannot_be_written_is_given_up_once(tmp_path: Path) -> None:
    blocker = tmp_path / "logs"
    blocker.write_text("a file where the folder should be")
    log = TaskLogFile(str(blocker / "0" / "main-0.log"))

    log.append(["lost to the file, kept in Redis"])
    log.append(["again"])

    assert log.failed
