"""`pai fs` and `pai submit --upload-code`, in-process, against the real API
served over HTTP on a real Redis: the CLI's own WebHDFS client does the
transfers, and what lands is read straight from the storage root."""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from click.testing import CliRunner, Result

from pai_cli.logins import Cluster, Logins, save
from pai_cli.main import cli
from shared.infra.config import Settings
from tests.support.api import DAY_S
from tests.support.webhdfs import Pai, pai_served

pytestmark = pytest.mark.redis


@pytest.fixture
def pai(settings: Settings, tmp_path: Path) -> Iterator[Pai]:
    root = tmp_path / "storage"
    root.mkdir()
    with pai_served(Settings(**{**settings.__dict__, "storage_roots": (str(root),)}),
                    root) as served:
        yield served


@pytest.fixture
def alice(pai: Pai, tmp_path: Path) -> Path:
    """A CLI config logged in as alice."""
    config = tmp_path / "alice.yaml"
    logins = Logins()
    logins.put(Cluster("test", pai.url, "alice", pai.token("alice"), False,
                       int(time.time() * 1000) + DAY_S * 1000))
    save(config, logins)
    return config


@pytest.fixture
def home(pai: Pai) -> Path:
    return pai.root / "alice"


def run(config: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, list(args), env={"PAI_CONFIG": str(config),
                                                     "PAI_CLUSTER": None, "COLUMNS": "200"})


def ok(config: Path, *args: str) -> Result:
    result = run(config, *args)
    assert result.exit_code == 0, result.output
    return result


def test_put_and_get_a_file(alice: Path, home: Path, tmp_path: Path) -> None:
    source = tmp_path / "weights.bin"
    source.write_bytes(os.urandom(3 * 1024 * 1024 + 7))
    ok(alice, "fs", "mkdir", "models")
    ok(alice, "fs", "put", str(source), "models")  # into the folder
    assert (home / "models" / "weights.bin").read_bytes() == source.read_bytes()
    back = tmp_path / "back.bin"
    ok(alice, "fs", "get", "models/weights.bin", str(back))
    assert back.read_bytes() == source.read_bytes()


def test_put_and_get_a_folder_recursively(alice: Path, home: Path, tmp_path: Path) -> None:
    local = tmp_path / "project"
    (local / "src" / "deep").mkdir(parents=True)
    (local / "empty").mkdir()
    (local / "train.py").write_text("print(1)\n")
    (local / "src" / "deep" / "model.py").write_text("M = 1\n")
    refused = run(alice, "fs", "put", str(local), "project")
    assert refused.exit_code == 1 and "pass -r" in refused.output
    ok(alice, "fs", "put", "-r", str(local), "project")
    assert (home / "project" / "src" / "deep" / "model.py").read_text() == "M = 1\n"
    assert (home / "project" / "empty").is_dir()
    ok(alice, "fs", "get", "-r", "project", str(tmp_path / "copy"))
    assert (tmp_path / "copy" / "src" / "deep" / "model.py").read_text() == "M = 1\n"
    assert (tmp_path / "copy" / "empty").is_dir()


def test_ls_mv_rm(alice: Path, home: Path) -> None:
    (home / "runs" / "a").mkdir(parents=True)
    (home / "runs" / "a" / "log.txt").write_text("x")
    listed = ok(alice, "fs", "ls", "runs", "-o", "json")
    assert [e["name"] for e in json.loads(listed.output)] == ["a"]
    assert "a/" in ok(alice, "fs", "ls", "runs").output
    ok(alice, "fs", "mv", "runs/a", "runs/b")
    assert (home / "runs" / "b" / "log.txt").exists()
    refused = run(alice, "fs", "rm", "runs/b")
    assert refused.exit_code == 1 and "PathIsNotEmptyDirectoryException" in refused.output
    ok(alice, "fs", "rm", "-r", "runs/b")
    assert not (home / "runs" / "b").exists()
    missing = run(alice, "fs", "rm", "runs/b")
    assert missing.exit_code == 1 and "not there" in missing.output


def test_put_refuses_to_replace_unless_asked(alice: Path, home: Path, tmp_path: Path) -> None:
    home.mkdir()
    (home / "f.txt").write_text("old")
    source = tmp_path / "f.txt"
    source.write_text("new")
    refused = run(alice, "fs", "put", str(source), "f.txt")
    assert refused.exit_code == 1 and "--overwrite" in refused.output
    assert (home / "f.txt").read_text() == "old"
    ok(alice, "fs", "put", "-f", str(source), "f.txt")
    assert (home / "f.txt").read_text() == "new"


def test_an_interrupted_put_is_resumed_by_appending(pai: Pai, alice: Path, home: Path,
                                                    tmp_path: Path) -> None:
    """A put cut off mid-body leaves the bytes that arrived; `--resume`
    checks they are the local file's start and appends the rest."""
    source = tmp_path / "data.bin"
    source.write_bytes(os.urandom(6 * 1024 * 1024))
    data = source.read_bytes()

    def cut_off() -> Iterator[bytes]:
        for start in range(0, 4 * 1024 * 1024, 256 * 1024):
            yield data[start:start + 256 * 1024]
        raise ConnectionAbortedError("the laptop went to sleep")

    with pytest.raises((requests.RequestException, ConnectionAbortedError)):
        pai.session("alice").put(pai.webhdfs(f"{home}/data.bin"),
                                 params={"op": "CREATE", "data": "true"}, data=cut_off())
    kept = _once_the_upload_let_go(home / "data.bin")
    assert 0 < kept < len(data)
    refused = run(alice, "fs", "put", str(source), "data.bin")
    assert refused.exit_code == 1 and "--resume" in refused.output
    ok(alice, "fs", "put", "--resume", str(source), "data.bin")
    assert (home / "data.bin").read_bytes() == data
    ok(alice, "fs", "put", "--resume", str(source), "data.bin")  # whole already: nothing sent
    assert (home / "data.bin").read_bytes() == data


def _once_the_upload_let_go(path: Path, seconds: float = 30) -> int:
    """The file's size once the server's upload closed it (its lock is free)."""
    deadline = time.monotonic() + seconds
    while True:
        assert time.monotonic() < deadline, f"the upload never made and let go of {path}"
        try:
            with open(path, "rb") as held:
                fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
                size = os.fstat(held.fileno()).st_size
        except (FileNotFoundError, BlockingIOError):
            continue
        if size:  # 0: made, not locked yet (the server locks before it writes)
            return size


def test_resume_refuses_another_files_bytes(alice: Path, home: Path, tmp_path: Path) -> None:
    home.mkdir()
    (home / "data.bin").write_bytes(b"something else")
    source = tmp_path / "data.bin"
    source.write_bytes(b"0123456789" * 100)
    refused = run(alice, "fs", "put", "--resume", str(source), "data.bin")
    assert refused.exit_code == 1 and "not the start of" in refused.output
    assert (home / "data.bin").read_bytes() == b"something else"


def test_refusals_are_one_line_errors(pai: Pai, alice: Path) -> None:
    bobs = pai.root / "bob"
    bobs.mkdir()
    refused = run(alice, "fs", "ls", str(bobs))
    assert refused.exit_code == 1
    assert refused.output.startswith("error: AccessControlException: Permission denied")
    missing = run(alice, "fs", "get", "nothing-here")
    assert missing.exit_code == 1 and "no such file" in missing.output


def test_submit_uploads_the_code_and_sets_code_dir(pai: Pai, alice: Path, home: Path,
                                                   tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("print('training')\n")
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"jobName": "mnist", "image": "busybox", "taskRoles": [{
        "name": "main", "taskNumber": 1, "cpuNumber": 1, "memoryMB": 128,
        "command": "python train.py"}]}))
    ok(alice, "submit", str(job), "--upload-code", str(code))
    assert (home / "code" / "mnist" / "train.py").read_text() == "print('training')\n"
    stored = pai.session("alice").get(f"{pai.url}/api/v1/user/alice/jobs/mnist/config").json()
    assert stored["codeDir"] == str(home / "code" / "mnist")


def test_submit_checks_the_config_before_sending_any_code(alice: Path, home: Path,
                                                          tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("x")
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"jobName": "bad", "image": "busybox", "taskRoles": []}))
    refused = run(alice, "submit", str(job), "--upload-code", str(code))
    assert refused.exit_code == 1 and "taskRoles" in refused.output
    assert not (home / "code").exists()


def test_submit_upload_code_refuses_protocol_v2(alice: Path, home: Path,
                                                tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    job = tmp_path / "job.yaml"
    job.write_text("protocolVersion: 2\nname: v2\ntype: job\n")
    refused = run(alice, "submit", str(job), "--upload-code", str(code))
    assert refused.exit_code == 1 and "protocol v2" in refused.output
    assert not (home / "code").exists()
