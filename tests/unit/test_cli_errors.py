"""How the CLI reports failures: one line (plus one per field error), no tracebacks."""

from __future__ import annotations

from pathlib import Path

import pytest

from pai_cli.api import ApiError, Unreachable, check_url, error_from, job_path
from pai_cli.logins import Cluster
from pai_cli.main import error_lines
from pai_cli.session import CliError, Session


def test_a_config_error_lists_every_field() -> None:
    error = error_from(400, b'{"code": "InvalidJobConfigError", "message": "bad config", '
                             b'"fields": {"taskRoles.0.memoryMB": ["Must be >= 100."], '
                             b'"jobName": ["Missing.", "Too short."]}}')
    assert error_lines(error, None) == ([
        "error: InvalidJobConfigError: bad config",
        "  taskRoles.0.memoryMB: Must be >= 100.",
        "  jobName: Missing.",
        "  jobName: Too short.",
    ], 1)


def test_a_non_json_error_keeps_its_first_line() -> None:
    error = error_from(502, b"<html>Bad Gateway</html>\nmore")
    assert (error.status, error.code, error.message) == (502, "HTTP 502",
                                                         "<html>Bad Gateway</html>")


def test_401_means_the_login_expired_once_a_cluster_is_in_use() -> None:
    session = Session(config_path=Path("/none"))
    session.active = Cluster("lab", "http://lab:9186", "alice", "t")
    revoked = ApiError(401, "UnauthorizedUserError", "the token was revoked; log in again")
    assert error_lines(revoked, session) == ([
        "error: your login to lab has expired; run pai login --cluster lab "
        "--username alice http://lab:9186"], 1)
    wrong_password = ApiError(401, "IncorrectPasswordError", "the password is incorrect")
    assert error_lines(wrong_password, session)[0] == [
        "error: IncorrectPasswordError: the password is incorrect"]


def test_other_failures() -> None:
    assert error_lines(Unreachable("cannot reach http://x: connection refused"), None) == (
        ["error: cannot reach http://x: connection refused"], 1)
    assert error_lines(CliError("slow", exit_code=124), None) == (["error: slow"], 124)


@pytest.mark.parametrize(("given", "stored"), [
    ("http://127.0.0.1:9186", "http://127.0.0.1:9186"),
    ("http://127.0.0.1:9186/", "http://127.0.0.1:9186"),
    ("pai.example.com:9186", "http://pai.example.com:9186"),
    ("https://example.com/pai/", "https://example.com/pai"),
])
def test_check_url(given: str, stored: str) -> None:
    assert check_url(given) == stored


def test_check_url_refuses_other_schemes() -> None:
    with pytest.raises(ValueError, match="not an http"):
        check_url("ftp://x")


def test_job_paths_are_quoted() -> None:
    assert job_path("alice", "a~b", "tasks", "main", "0", "log") == \
        "/api/v1/user/alice/jobs/a~b/tasks/main/0/log"
    assert job_path("al ice", "x/y") == "/api/v1/user/al%20ice/jobs/x%2Fy"
