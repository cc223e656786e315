"""WebHDFS, the REST protocol of Hadoop's file system, as pai speaks it. No IO.

pai serves its storage roots over WebHDFS (services/api/webhdfs.py), so the
tools OpenPAI users already point at a cluster (HdfsCLI, fsspec's `webhdfs`,
`curl`) put data in and take outputs out. This module holds what is pure in
that: which operations there are and what each needs, how a parameter is
read, what a `FileStatus` or a `ContentSummary` looks like, and the
`RemoteException` body with the HTTP status Hadoop gives each exception
(its `ExceptionHandler`: a missing file is 404, an `IOException` 403, a bad
argument 400), because clients turn those names into their own errors
(fsspec: `FileNotFoundException` becomes `FileNotFoundError`,
`AccessControlException` a `PermissionError`).

pai behaves like Hadoop's HttpFS gateway rather than a name node: OPEN
answers with the bytes itself, and CREATE and APPEND keep WebHDFS's two
steps, the first answering 307 with a `Location` back to pai with
`data=true`, where the second sends the bytes (docs/storage.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from shared.domain.storage import Access

PREFIX = "/webhdfs/v1"
# What FileStatus reports for fields that mean something on HDFS only.
BLOCK_SIZE = 128 * 1024 * 1024
REPLICATION = 1
GROUP = "pai"
DEFAULT_FILE_MODE = 0o644
DEFAULT_DIR_MODE = 0o755
MAX_MODE = 0o777

_JAVA_CLASSES = {
    "FileNotFoundException": "java.io.FileNotFoundException",
    "AccessControlException": "org.apache.hadoop.security.AccessControlException",
    "SecurityException": "java.lang.SecurityException",
    "FileAlreadyExistsException": "org.apache.hadoop.fs.FileAlreadyExistsException",
    "PathIsNotEmptyDirectoryException": "org.apache.hadoop.fs.PathIsNotEmptyDirectoryException",
    "AlreadyBeingCreatedException":
        "org.apache.hadoop.hdfs.protocol.AlreadyBeingCreatedException",
    "IllegalArgumentException": "java.lang.IllegalArgumentException",
    "UnsupportedOperationException": "java.lang.UnsupportedOperationException",
    "IOException": "java.io.IOException",
    "RetriableException": "org.apache.hadoop.ipc.RetriableException",
}
# Hadoop's ExceptionHandler: SecurityException and IOException (every file
# system error) 403, FileNotFoundException 404, bad arguments 400. A missing
# or bad login is 401 here, which HdfsCLI reports as an authentication failure.
_STATUS = {
    "FileNotFoundException": 404,
    "IllegalArgumentException": 400,
    "UnsupportedOperationException": 400,
    "RetriableException": 503,
}


class WebHdfsError(Exception):
    """A refusal as WebHDFS states it: a Java exception's name and a message."""

    def __init__(self, exception: str, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.exception, self.message = exception, message
        self.status = status if status is not None else _STATUS.get(exception, 403)

    def body(self) -> dict[str, Any]:
        return {"RemoteException": {
            "exception": self.exception,
            "javaClassName": _JAVA_CLASSES.get(self.exception, "java.io.IOException"),
            "message": self.message,
        }}


def bad_argument(message: str) -> WebHdfsError:
    return WebHdfsError("IllegalArgumentException", message)


def unauthorized(message: str) -> WebHdfsError:
    return WebHdfsError("SecurityException", message, 401)


def forbidden(message: str) -> WebHdfsError:
    return WebHdfsError("AccessControlException", message)


def not_found(path: str) -> WebHdfsError:
    return WebHdfsError("FileNotFoundException", f"File does not exist: {path}")


# ---------------------------------------------------------------- operations


class Step(StrEnum):
    """How an operation's bytes travel."""

    ONE = "one"  # the answer is the whole exchange
    TWO = "two"  # 307 to pai with data=true, where the client sends the bytes


@dataclass(frozen=True)
class Operation:
    name: str
    method: str
    needs: Access  # on the path; RENAME needs WRITE on its destination too
    step: Step = Step.ONE


OPERATIONS = {op.name: op for op in (
    Operation("OPEN", "GET", Access.READ),
    Operation("GETFILESTATUS", "GET", Access.READ),
    Operation("LISTSTATUS", "GET", Access.READ),
    Operation("GETCONTENTSUMMARY", "GET", Access.READ),
    Operation("GETHOMEDIRECTORY", "GET", Access.NONE),
    Operation("MKDIRS", "PUT", Access.WRITE),
    Operation("CREATE", "PUT", Access.WRITE, Step.TWO),
    Operation("RENAME", "PUT", Access.WRITE),
    Operation("APPEND", "POST", Access.WRITE, Step.TWO),
    Operation("DELETE", "DELETE", Access.WRITE),
)}
# Hadoop's other operations: named as unsupported rather than as unknown.
UNSUPPORTED = frozenset({
    "GETFILECHECKSUM", "GETACLSTATUS", "GETXATTRS", "LISTXATTRS", "CHECKACCESS",
    "GETALLSTORAGEPOLICY", "GETSTORAGEPOLICY", "GETSNAPSHOTDIFF", "GETTRASHROOT",
    "LISTSTATUS_BATCH", "GETDELEGATIONTOKEN", "GETQUOTAUSAGE", "GETFILEBLOCKLOCATIONS",
    "SETPERMISSION", "SETOWNER", "SETREPLICATION", "SETTIMES", "CREATESYMLINK",
    "RENEWDELEGATIONTOKEN", "CANCELDELEGATIONTOKEN", "MODIFYACLENTRIES",
    "REMOVEACLENTRIES", "REMOVEDEFAULTACL", "REMOVEACL", "SETACL", "SETXATTR",
    "REMOVEXATTR", "CREATESNAPSHOT", "RENAMESNAPSHOT", "DELETESNAPSHOT",
    "ALLOWSNAPSHOT", "DISALLOWSNAPSHOT", "SETSTORAGEPOLICY", "UNSETSTORAGEPOLICY",
    "CONCAT", "TRUNCATE", "SETQUOTA", "SETQUOTABYSTORAGETYPE",
})


def operation(raw: str | None, method: str) -> Operation:
    """The operation `op=` names, sent with `method`; WebHdfsError otherwise."""
    name = (raw or "").upper()
    if not name:
        raise bad_argument('the "op" parameter is missing')
    found = OPERATIONS.get(name)
    if found is None:
        if name in UNSUPPORTED:
            raise WebHdfsError("UnsupportedOperationException",
                               f"pai's WebHDFS does not support op={name}")
        raise bad_argument(f'Invalid value for webhdfs parameter "op": '
                           f"no operation named {raw[:64] if raw else ''}")
    if found.method != method:
        raise bad_argument(f'Invalid value for webhdfs parameter "op": {name} is not a '
                           f"{method} operation (send it with {found.method})")
    return found


# ---------------------------------------------------------------- parameters


def boolean(params: dict[str, str], name: str, default: bool = False) -> bool:
    raw = params.get(name)
    if raw is None or raw == "":
        return default
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    raise bad_argument(f'Invalid value for webhdfs parameter "{name}": {raw[:64]!r} '
                       f"is not true or false")


def whole_number(params: dict[str, str], name: str) -> int | None:
    """A non-negative integer parameter, or None when it is absent."""
    raw = params.get(name)
    if raw is None or raw == "" or raw == "null":
        return None
    if not raw.isdigit() or len(raw) > 19:
        raise bad_argument(f'Invalid value for webhdfs parameter "{name}": {raw[:64]!r} '
                           f"is not a whole number")
    return int(raw)


def permission(params: dict[str, str], default: int) -> int:
    """`permission=755`: octal, at most 777 (no setuid, setgid or sticky bit)."""
    raw = params.get("permission")
    if raw is None or raw == "" or raw == "null":
        return default
    try:
        mode = int(raw, 8)
    except ValueError:
        mode = -1
    if not 0 <= mode <= MAX_MODE or len(raw) > 4:
        raise bad_argument(f'Invalid value for webhdfs parameter "permission": {raw[:64]!r} '
                           f"is not an octal mode from 0 to 777")
    return mode


# ---------------------------------------------------------------- answers


class Kind(StrEnum):
    FILE = "FILE"
    DIRECTORY = "DIRECTORY"
    SYMLINK = "SYMLINK"


@dataclass(frozen=True)
class FileInfo:
    """What the file system says of one name (its link itself, never followed)."""

    name: str
    kind: Kind
    length: int
    modified_ms: int
    accessed_ms: int
    mode: int
    inode: int
    children: int | None = None  # a folder's entries, when counted


def file_status(info: FileInfo, owner: str, suffix: str) -> dict[str, Any]:
    """A WebHDFS `FileStatus`; `suffix` is the name within a listing ("" alone)."""
    status: dict[str, Any] = {
        "pathSuffix": suffix,
        "type": info.kind.value,
        "length": info.length if info.kind == Kind.FILE else 0,
        "owner": owner,
        "group": GROUP,
        "permission": format(info.mode & 0o777, "o"),
        "accessTime": info.accessed_ms,
        "modificationTime": info.modified_ms,
        "blockSize": BLOCK_SIZE if info.kind == Kind.FILE else 0,
        "replication": REPLICATION if info.kind == Kind.FILE else 0,
        "fileId": info.inode,
        "storagePolicy": 0,
    }
    if info.children is not None:
        status["childrenNum"] = info.children
    return status


@dataclass(frozen=True)
class Summary:
    directories: int
    files: int
    length: int


def content_summary(summary: Summary) -> dict[str, Any]:
    """A WebHDFS `ContentSummary`: pai keeps no quotas, so they are -1."""
    return {"ContentSummary": {
        "directoryCount": summary.directories, "fileCount": summary.files,
        "length": summary.length, "quota": -1, "spaceConsumed": summary.length,
        "spaceQuota": -1, "typeQuota": {},
    }}


def owner_of(parts: tuple[str, ...]) -> str:
    """Whose a path is, as FileStatus says: the folder below its root (a
    user's own folder, or a share's top folder); the root itself is root's."""
    return parts[0] if parts else "root"
