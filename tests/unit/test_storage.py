"""The storage resolver: the form of a path, its root, and who may mount it (no IO)."""

from __future__ import annotations

import posixpath

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.launcher.mounts import TaskSetupError, host_path
from shared.domain.jobspec import _resolve_dir
from shared.domain.storage import (
    Access,
    Caller,
    Share,
    StoragePath,
    StoragePathError,
    access_to,
    default_log_dir,
    in_own_folder,
    is_under,
    normalize,
    refusal,
    refusals,
    resolve,
    share_path_problem,
    task_log_parts,
)

ROOTS = ["/nfs", "/data/"]
LOGS = "/nfs/.pai-logs"
SHARES = (
    Share("imagenet", "/nfs/datasets/imagenet", users=("bob",)),
    Share("team", "/data/team", virtual_clusters=("vision",)),
)
BOB = Caller("bob", ("default",), shares=SHARES)
VISION_BOB = Caller("bob", ("default", "vision"), shares=SHARES)
ADMIN = Caller("root", (), admin=True, shares=SHARES)


@pytest.mark.parametrize(("value", "expected"), [
    pytest.param("", None, id="unset: nothing to mount"),
    pytest.param("hdfs://nn:9000/x", None, id="hdfs: the job's business"),
    pytest.param("/nfs/bob/out", StoragePath("/nfs/bob/out", "/nfs"), id="plain"),
    pytest.param("file:///nfs/bob", StoragePath("/nfs/bob", "/nfs"), id="file URI"),
    pytest.param("//nfs//bob/./out/", StoragePath("/nfs/bob/out", "/nfs"),
                 id="double slashes, dot and trailing slash"),
    pytest.param("/nfs/bob/.", StoragePath("/nfs/bob", "/nfs"), id="trailing dot"),
    pytest.param("/nfs", StoragePath("/nfs", "/nfs"), id="the root itself"),
    pytest.param("/data/x", StoragePath("/data/x", "/data"), id="root given with a slash"),
])
def test_resolve(value: str, expected: StoragePath | None) -> None:
    assert resolve(value, ROOTS) == expected


@pytest.mark.parametrize(("value", "message"), [
    pytest.param("/etc/passwd", "must be under one of the storage roots", id="outside"),
    pytest.param("/nfsx/bob", "must be under one of the storage roots", id="root as prefix"),
    pytest.param("/nfs/bob/../alice", "'..' segment", id="dot-dot"),
    pytest.param("/nfs/..", "'..' segment", id="dot-dot at the end"),
    pytest.param("nfs/bob", "absolute", id="relative"),
    pytest.param("/nfs/b\x00ob", "NUL", id="NUL"),
])
def test_resolve_refuses(value: str, message: str) -> None:
    with pytest.raises(StoragePathError, match=message):
        resolve(value, ROOTS)


def test_without_roots_every_path_is_refused() -> None:
    with pytest.raises(StoragePathError, match="no storage roots"):
        resolve("/nfs/bob", [])


def test_nested_roots_answer_with_the_nearest() -> None:
    assert resolve("/nfs/inner/x", ["/nfs", "/nfs/inner"]) == StoragePath("/nfs/inner/x",
                                                                           "/nfs/inner")


@pytest.mark.parametrize(("path", "folder", "expected"), [
    ("/a/b", "/a/b", True), ("/a/b/c", "/a/b", True), ("/a/bc", "/a/b", False),
    ("/a", "/a/b", False), ("/x", "/", True),
])
def test_is_under(path: str, folder: str, expected: bool) -> None:
    assert is_under(path, folder) is expected


def test_parts_are_the_components_below_the_root() -> None:
    assert StoragePath("/nfs/bob/j/out", "/nfs").parts == ("bob", "j", "out")
    assert StoragePath("/nfs", "/nfs").parts == ()
    assert StoragePath("/x/y", "/").parts == ("x", "y")


@pytest.mark.parametrize(("field", "value", "caller", "allowed"), [
    pytest.param("outputDir", "/nfs/bob/j/out", BOB, True, id="output in own folder"),
    pytest.param("outputDir", "/nfs/bob", BOB, True, id="output: the own folder itself"),
    pytest.param("outputDir", "/data/bob/x", BOB, True, id="own folder in another root"),
    pytest.param("outputDir", "/nfs/alice/out", BOB, False, id="output in another's folder"),
    pytest.param("outputDir", "/nfs", BOB, False, id="output: the bare root"),
    pytest.param("outputDir", "/nfs/bobby/out", BOB, False, id="a folder named like own"),
    pytest.param("outputDir", "/nfs/datasets/imagenet", BOB, False,
                 id="output never under a share"),
    pytest.param("dataDir", "/nfs/alice/data", BOB, False, id="data in another's folder"),
    pytest.param("dataDir", "/nfs", BOB, False, id="data: the bare root"),
    pytest.param("codeDir", "/nfs/bob/code", BOB, True, id="code in own folder"),
    pytest.param("dataDir", "/nfs/datasets/imagenet/train", BOB, True,
                 id="data under a share for the user"),
    pytest.param("dataDir", "/nfs/datasets", BOB, False, id="data above a share"),
    pytest.param("dataDir", "/data/team/x", BOB, False, id="share of a VC the user is not in"),
    pytest.param("codeDir", "/data/team/x", VISION_BOB, True, id="share of the user's VC"),
    pytest.param("outputDir", "/nfs/alice/out", ADMIN, True, id="admin: any folder"),
    pytest.param("outputDir", "/data", ADMIN, True, id="admin: even a root"),
    pytest.param("outputDir", "/nfs/.pai-logs/x", ADMIN, False,
                 id="admin: never inside the log tree"),
    pytest.param("dataDir", "/nfs", ADMIN, False, id="admin: never around the log tree"),
])
def test_who_may_mount_what(field: str, value: str, caller: Caller, allowed: bool) -> None:
    where = resolve(value, ROOTS)
    assert where is not None
    assert (refusal(field, where, caller, [LOGS]) is None) is allowed


@pytest.mark.parametrize(("value", "caller", "expected"), [
    pytest.param("/nfs/bob/x", BOB, Access.WRITE, id="own folder: read-write"),
    pytest.param("/nfs/bob", BOB, Access.WRITE, id="the own folder itself"),
    pytest.param("/nfs/alice/x", BOB, Access.NONE, id="another's folder: nothing"),
    pytest.param("/nfs", BOB, Access.NONE, id="a bare root: nothing"),
    pytest.param("/nfs/datasets/imagenet/a", BOB, Access.READ, id="a share: read-only"),
    pytest.param("/nfs/datasets", BOB, Access.NONE, id="above a share: nothing"),
    pytest.param("/data/team", BOB, Access.NONE, id="a VC's share, not in the VC"),
    pytest.param("/data/team/y", VISION_BOB, Access.READ, id="a VC's share, in the VC"),
    pytest.param("/nfs/alice", ADMIN, Access.WRITE, id="admin: any folder"),
    pytest.param("/data", ADMIN, Access.WRITE, id="admin: a root without the log tree"),
    pytest.param("/nfs", ADMIN, Access.READ, id="admin: the root holding logs is read-only"),
    pytest.param("/nfs/.pai-logs", ADMIN, Access.NONE, id="admin: never the log tree"),
    pytest.param("/nfs/.pai-logs/j/0/a-0.log", ADMIN, Access.NONE, id="admin: never a log"),
])
def test_what_a_caller_may_do_with_a_path(value: str, caller: Caller,
                                          expected: Access) -> None:
    where = resolve(value, ROOTS)
    assert where is not None
    assert access_to(where, caller, [LOGS]) == expected


def test_refusals_name_every_field_and_pass_the_rest() -> None:
    config = {"outputDir": "/nfs/alice/out", "dataDir": "/nfs/bob/data",
              "codeDir": "/nfs/alice/code", "jobName": "x"}
    found = refusals(config, ROOTS, BOB, [LOGS])
    assert set(found) == {"outputDir", "codeDir"}
    assert "must be in your own folder /nfs/bob/" in found["outputDir"][0]
    assert "shared with you or your virtual clusters" in found["codeDir"][0]


def test_refusals_skip_hdfs_and_unset_fields() -> None:
    assert refusals({"dataDir": "hdfs://nn/x"}, ROOTS, BOB) == {}


@pytest.mark.parametrize(("path", "problem"), [
    pytest.param("/nfs/datasets", None, id="a folder in a root"),
    pytest.param("/nfs", "whole storage root", id="a whole root"),
    pytest.param("/etc", "storage roots", id="outside the roots"),
    pytest.param("/nfs/.pai-logs/j", "keeps for itself", id="inside the log tree"),
    pytest.param("hdfs://nn/x", "not an hdfs", id="hdfs"),
    pytest.param("/nfs/a/../b", "'..'", id="dot-dot"),
])
def test_what_an_admin_may_share(path: str, problem: str | None) -> None:
    found = share_path_problem(path, ROOTS, [LOGS])
    assert (found is None) if problem is None else (found is not None and problem in found)


def test_share_round_trips_through_json() -> None:
    share = Share("team", "/data/team", ("bob",), ("vision",))
    assert Share.from_json("team", share.to_json()) == share


def test_log_tree_default_and_scheme() -> None:
    assert default_log_dir(["/nfs/", "/data"]) == "/nfs/.pai-logs"
    assert default_log_dir([]) is None
    assert task_log_parts("bob~j", 2, "worker", 3) == ("bob~j", "2", "worker-3.log")


# ---------------------------------------------------------------- properties

_SEGMENT = st.sampled_from(["bob", "alice", ".", "..", "", "x", "bob.", "..bob", "-"])


@given(st.lists(_SEGMENT, min_size=0, max_size=8), st.booleans())
def test_no_spelling_of_a_path_escapes_the_own_folder(segments: list[str],
                                                      trailing: bool) -> None:
    """Threat: a user spells a path (`..`, `//`, `.`, trailing dots or slashes)
    so that the submit check sees their own folder while the mount, after the
    kernel resolves the spelling, lands in another user's folder or the root."""
    value = "/nfs/bob/" + "/".join(segments) + ("/" if trailing else "")
    try:
        where = resolve(value, ROOTS)
    except StoragePathError:
        return
    assert where is not None
    # What the kernel would open for the original spelling (no links involved).
    kernel = posixpath.normpath("/" + value.lstrip("/"))
    if refusal("outputDir", where, BOB) is None:
        assert in_own_folder(where, "bob")
        assert is_under(kernel, "/nfs/bob")
    assert where.path == kernel


@given(st.text(alphabet="/.abn\x00", max_size=30))
def test_normalize_is_idempotent_and_never_keeps_dot_segments(value: str) -> None:
    try:
        path = normalize(value)
    except StoragePathError:
        return
    assert normalize(path) == path
    assert path.startswith("/") and "//" not in path
    assert all(part not in (".", "..") for part in path.split("/"))


@given(st.lists(_SEGMENT, min_size=0, max_size=6), st.sampled_from(["", "file://", "//"]))
def test_the_api_and_the_launcher_resolve_alike(segments: list[str], prefix: str) -> None:
    """One resolver: what the API stores is what the launcher mounts, and what
    one refuses by its form the other refuses too."""
    value = prefix + "/nfs/" + "/".join(segments)
    stored, error = _resolve_dir(value, ROOTS)
    try:
        mounted = host_path("dataDir", value, ROOTS)
    except TaskSetupError:
        assert error is not None
        return
    assert error is None and mounted is not None
    assert mounted.path == stored
