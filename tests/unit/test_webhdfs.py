"""WebHDFS as pai speaks it (shared/domain/webhdfs.py): operations, parameters,
answers and refusals, as tables (no IO)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.domain.storage import Access
from shared.domain.webhdfs import (
    FileInfo,
    Kind,
    Step,
    Summary,
    WebHdfsError,
    boolean,
    content_summary,
    file_status,
    operation,
    owner_of,
    permission,
    whole_number,
)


@pytest.mark.parametrize(("op", "method", "needs", "step"), [
    pytest.param("OPEN", "GET", Access.READ, Step.ONE, id="OPEN reads, answers with bytes"),
    pytest.param("liststatus", "GET", Access.READ, Step.ONE, id="op names are case-blind"),
    pytest.param("GETCONTENTSUMMARY", "GET", Access.READ, Step.ONE, id="summary reads"),
    pytest.param("MKDIRS", "PUT", Access.WRITE, Step.ONE, id="MKDIRS writes"),
    pytest.param("CREATE", "PUT", Access.WRITE, Step.TWO, id="CREATE in two steps"),
    pytest.param("APPEND", "POST", Access.WRITE, Step.TWO, id="APPEND in two steps"),
    pytest.param("RENAME", "PUT", Access.WRITE, Step.ONE, id="RENAME writes"),
    pytest.param("DELETE", "DELETE", Access.WRITE, Step.ONE, id="DELETE writes"),
    pytest.param("GETHOMEDIRECTORY", "GET", Access.NONE, Step.ONE, id="home needs no path"),
])
def test_operations(op: str, method: str, needs: Access, step: Step) -> None:
    found = operation(op, method)
    assert (found.method, found.needs, found.step) == (method, needs, step)


@pytest.mark.parametrize(("op", "method", "exception", "status"), [
    pytest.param(None, "GET", "IllegalArgumentException", 400, id="no op"),
    pytest.param("FROB", "GET", "IllegalArgumentException", 400, id="no such op"),
    pytest.param("CREATE", "GET", "IllegalArgumentException", 400, id="CREATE is a PUT"),
    pytest.param("DELETE", "PUT", "IllegalArgumentException", 400, id="DELETE is a DELETE"),
    pytest.param("SETOWNER", "PUT", "UnsupportedOperationException", 400,
                 id="Hadoop's, not pai's"),
    pytest.param("GETFILECHECKSUM", "GET", "UnsupportedOperationException", 400,
                 id="no checksums"),
])
def test_operations_refused(op: str | None, method: str, exception: str, status: int) -> None:
    with pytest.raises(WebHdfsError) as refused:
        operation(op, method)
    assert (refused.value.exception, refused.value.status) == (exception, status)


@pytest.mark.parametrize(("exception", "status", "java"), [
    ("FileNotFoundException", 404, "java.io.FileNotFoundException"),
    ("AccessControlException", 403, "org.apache.hadoop.security.AccessControlException"),
    ("FileAlreadyExistsException", 403, "org.apache.hadoop.fs.FileAlreadyExistsException"),
    ("IOException", 403, "java.io.IOException"),
    ("IllegalArgumentException", 400, "java.lang.IllegalArgumentException"),
])
def test_remote_exceptions_carry_hadoops_status_and_class(exception: str, status: int,
                                                          java: str) -> None:
    error = WebHdfsError(exception, "why")
    assert error.status == status
    assert error.body() == {"RemoteException": {"exception": exception,
                                                 "javaClassName": java, "message": "why"}}


@pytest.mark.parametrize(("raw", "expected"), [
    (None, False), ("", False), ("true", True), ("TRUE", True), ("false", False)])
def test_boolean(raw: str | None, expected: bool) -> None:
    params = {} if raw is None else {"overwrite": raw}
    assert boolean(params, "overwrite") is expected


@pytest.mark.parametrize("raw", ["yes", "1", "tru"])
def test_boolean_refuses_other_words(raw: str) -> None:
    with pytest.raises(WebHdfsError, match="overwrite"):
        boolean({"overwrite": raw}, "overwrite")


@pytest.mark.parametrize(("raw", "expected"), [
    (None, None), ("", None), ("null", None), ("0", 0), ("4096", 4096)])
def test_whole_number(raw: str | None, expected: int | None) -> None:
    params = {} if raw is None else {"offset": raw}
    assert whole_number(params, "offset") == expected


@pytest.mark.parametrize("raw", ["-1", "1.5", "1e3", "x", "9" * 20])
def test_whole_number_refuses(raw: str) -> None:
    with pytest.raises(WebHdfsError):
        whole_number({"offset": raw}, "offset")


@pytest.mark.parametrize(("raw", "expected"), [
    (None, 0o644), ("755", 0o755), ("0700", 0o700), ("0", 0), ("777", 0o777)])
def test_permission_is_octal(raw: str | None, expected: int) -> None:
    params = {} if raw is None else {"permission": raw}
    assert permission(params, 0o644) == expected


@pytest.mark.parametrize("raw", ["1777", "4755", "888", "rwx", "-1", "00777"])
def test_permission_refuses_special_bits_and_non_octal(raw: str) -> None:
    with pytest.raises(WebHdfsError, match="permission"):
        permission({"permission": raw}, 0o644)


def test_file_status_of_a_file_and_a_folder() -> None:
    file = FileInfo("a.bin", Kind.FILE, 10, 2000, 1000, 0o100640, 7)
    status = file_status(file, "alice", "a.bin")
    assert status["type"] == "FILE" and status["length"] == 10
    assert status["permission"] == "640" and status["owner"] == "alice"
    assert status["replication"] == 1 and "childrenNum" not in status
    folder = FileInfo("d", Kind.DIRECTORY, 4096, 2000, 1000, 0o40755, 8, children=3)
    status = file_status(folder, "alice", "")
    assert (status["length"], status["childrenNum"], status["blockSize"]) == (0, 3, 0)


def test_content_summary_has_no_quotas() -> None:
    summary = content_summary(Summary(2, 3, 100))["ContentSummary"]
    assert (summary["directoryCount"], summary["fileCount"], summary["length"]) == (2, 3, 100)
    assert summary["quota"] == summary["spaceQuota"] == -1


def test_owner_is_the_folder_below_the_root() -> None:
    assert owner_of(("alice", "data")) == "alice"
    assert owner_of(()) == "root"


@given(st.integers(min_value=0, max_value=0o777))
def test_every_plain_mode_round_trips(mode: int) -> None:
    assert permission({"permission": format(mode, "o")}, 0) == mode
