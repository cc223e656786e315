"""Storage paths: which root a path lies under, whose folder it is, who may mount it.

One resolver for the whole platform. The API calls it at submit to normalise
a job's `dataDir` / `outputDir` / `codeDir` and to decide whether the caller
may name them; the launcher calls it again on the node before it mounts
anything. Pure: no file system, no Redis, so the rules are tested as a table.

The rules (docs/job-config.md, "Folders and storage roots"):

- A path is absolute (or a `file://` URI), without NUL and without a `..`
  segment, and lies under one of the operator's storage roots. `//`, `.`
  and trailing slashes are normalised away before any comparison, so no
  spelling of a path reaches another folder. `hdfs://` URIs are the job's
  business: they are never mounted.
- A user's own folder is `<root>/<username>/`. `outputDir` (mounted
  read-write) must lie in it; `dataDir` and `codeDir` (read-only) in it or
  under a share an admin made for the user or for one of their VCs.
- Admins may name any path under a storage root, as a Slurm or OpenPAI
  admin can; no one, admins included, may mount the platform's own log tree
  (`PAI_LOG_DIR`) or a path that contains it.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

HDFS_PREFIX = "hdfs://"
FILE_PREFIX = "file://"
STORAGE_FIELDS = ("dataDir", "outputDir", "codeDir")
# The stored config's list of storage fields the API found outside every root
# (set only by validation, never by a user): the launcher mounts none of them,
# whatever its own roots say.
UNMOUNTED_KEY = "unmountedDirs"
READ_ONLY_FIELDS = ("dataDir", "codeDir")
# The default platform log tree, in the first storage root: no user name may
# start with a dot (shared/domain/names.py), so it is never anyone's own folder.
LOG_FOLDER = ".pai-logs"


class StoragePathError(ValueError):
    """A path of the wrong form (relative, `..`, outside every root): a 400."""


@dataclass(frozen=True)
class StoragePath:
    """A normalised absolute path and the storage root it lies under."""

    path: str
    root: str

    @property
    def parts(self) -> tuple[str, ...]:
        """The components below the root, in order (empty for the root itself)."""
        rest = self.path[len(self.root):] if self.root != "/" else self.path
        return tuple(part for part in rest.split("/") if part)


def normalize_root(root: str) -> str:
    """A root as the resolver compares it: absolute, no trailing slash."""
    return "/" + posixpath.normpath(root.removeprefix(FILE_PREFIX)).lstrip("/")


def normalize(value: str) -> str:
    """The one spelling of an absolute path; StoragePathError for a bad form.

    `..` is refused rather than folded: `/r/alice/../bob` must not become a
    question about `/r/bob` the user never typed. POSIX keeps a leading `//`
    through normpath, so it is stripped, or a root check would not see it.
    """
    path = value.removeprefix(FILE_PREFIX)
    if "\x00" in path:
        raise StoragePathError("must not contain NUL characters")
    if not path.startswith("/"):
        raise StoragePathError(
            f"{value!r} must be an absolute path, a file:// URI or an hdfs:// URI")
    if ".." in path.split("/"):
        raise StoragePathError(f"{value!r} must not contain a '..' segment")
    return "/" + posixpath.normpath(path).lstrip("/")


def is_under(path: str, folder: str) -> bool:
    """`path` is `folder` or inside it (both normalised); `/a/bc` is not under `/a/b`."""
    return folder == "/" or path == folder or path.startswith(folder + "/")


def resolve(value: str, roots: Sequence[str]) -> StoragePath | None:
    """The normalised path and its root; None for an unset or `hdfs://` value
    (nothing to mount). StoragePathError names what is wrong otherwise."""
    if not value or value.startswith(HDFS_PREFIX):
        return None
    path = normalize(value)
    if not roots:
        raise StoragePathError(
            "cannot be used: no storage roots are configured (PAI_STORAGE_ROOTS)")
    # The longest root wins, so nested roots answer with the nearest one.
    for root in sorted((normalize_root(r) for r in roots), key=len, reverse=True):
        if is_under(path, root):
            return StoragePath(path, root)
    raise StoragePathError(
        f"{path!r} must be under one of the storage roots: {', '.join(roots)}")


def outside_every_root(value: str, roots: Sequence[str]) -> bool:
    """Whether a job's dir is a plain absolute path under none of the roots.

    OpenPAI treated such paths (`/tmp/data`) as its distributed file system's
    and handed them to the job untouched; pai does the same: accepted, put in
    the job's environment, never mounted. A `file://` URI asks for a local
    mount, and a path with `..` or NUL is malformed: both stay refused."""
    if not value or value.startswith((HDFS_PREFIX, FILE_PREFIX)) or not roots:
        return False
    try:
        path = normalize(value)
    except StoragePathError:
        return False
    return not any(is_under(path, normalize_root(root)) for root in roots)


def user_folder(root: str, username: str) -> str:
    """`<root>/<username>`: the folder a user owns in a storage root."""
    return posixpath.join(normalize_root(root), username)


def in_own_folder(path: StoragePath, username: str) -> bool:
    return is_under(path.path, user_folder(path.root, username))


def default_log_dir(roots: Sequence[str]) -> str | None:
    """`<first root>/.pai-logs`, or None without storage roots."""
    return posixpath.join(normalize_root(roots[0]), LOG_FOLDER) if roots else None


def task_log_parts(job_id: str, attempt: int, role: str, index: int) -> tuple[str, ...]:
    """Where one task attempt's full log lies below the log tree:
    `<job id>/<attempt>/<role>-<index>.log`. The one place that says so."""
    return (job_id, str(attempt), f"{role}-{index}.log")


# ---------------------------------------------------------------- shares


@dataclass(frozen=True)
class Share:
    """A folder an admin lets some users and VCs read (mounted read-only)."""

    name: str
    path: str
    users: tuple[str, ...] = ()
    virtual_clusters: tuple[str, ...] = ()

    def grants(self, username: str, virtual_clusters: Iterable[str]) -> bool:
        return username in self.users or bool(set(self.virtual_clusters) & set(virtual_clusters))

    def to_json(self) -> str:
        return json.dumps({"path": self.path, "users": list(self.users),
                           "virtualClusters": list(self.virtual_clusters)},
                          separators=(",", ":"))

    @classmethod
    def from_json(cls, name: str, raw: str) -> Share:
        data: dict[str, Any] = json.loads(raw)
        return cls(name, data["path"], tuple(data.get("users", ())),
                   tuple(data.get("virtualClusters", ())))

    def view(self) -> dict[str, Any]:
        return {"name": self.name, "path": self.path, "users": list(self.users),
                "virtualClusters": list(self.virtual_clusters)}


def share_path_problem(value: str, roots: Sequence[str], reserved: Iterable[str]) -> str | None:
    """Why `value` cannot be shared, or None. A share lies strictly below a
    root (sharing a whole root would share every user's folder) and never
    overlaps the platform's own trees."""
    try:
        where = resolve(value, roots)
    except StoragePathError as error:
        return str(error)
    if where is None:
        return "must be a folder under a storage root, not an hdfs:// URI"
    if not where.parts:
        return f"{where.path!r} is a whole storage root; share a folder inside it"
    clash = reserved_clash(where.path, reserved)
    return clash


def reserved_clash(path: str, reserved: Iterable[str]) -> str | None:
    for folder in reserved:
        if is_under(path, folder) or is_under(folder, path):
            return f"{path!r} overlaps {folder}, which the platform keeps for itself"
    return None


# ---------------------------------------------------------------- who may


@dataclass(frozen=True)
class Caller:
    """Who names the paths: the submitting user, their VCs, whether admin."""

    username: str
    virtual_clusters: tuple[str, ...] = ()
    admin: bool = False
    shares: tuple[Share, ...] = field(default=())


class Access(IntEnum):
    """What a caller may do with a path: the same for a job's mount and for
    the storage's other doors (WebHDFS, `pai fs`, the portal)."""

    NONE = 0
    READ = 1
    WRITE = 2


def access_to(where: StoragePath, caller: Caller, reserved: Iterable[str] = ()) -> Access:
    """The one rule: admins may write anywhere under a root, a user in their
    own folder; a share is read-only to those it grants; the platform's own
    trees are no one's. A folder that holds one of those trees (a root that
    holds the log tree) is at most readable, so no rename or delete of it
    reaches the tree inside."""
    if any(is_under(where.path, folder) for folder in reserved):
        return Access.NONE
    holds_reserved = any(is_under(folder, where.path) for folder in reserved)
    if caller.admin or in_own_folder(where, caller.username):
        return Access.READ if holds_reserved else Access.WRITE
    if any(is_under(where.path, normalize_root(s.path))
           and s.grants(caller.username, caller.virtual_clusters) for s in caller.shares):
        return Access.NONE if holds_reserved else Access.READ
    return Access.NONE


def refusal(field_name: str, where: StoragePath, caller: Caller,
            reserved: Iterable[str] = ()) -> str | None:
    """Why `caller` may not mount `where` as `field_name`, or None if they may."""
    clash = reserved_clash(where.path, reserved)
    if clash:
        return clash
    needed = Access.READ if field_name in READ_ONLY_FIELDS else Access.WRITE
    if access_to(where, caller) >= needed:
        return None
    own = user_folder(where.root, caller.username)
    if field_name in READ_ONLY_FIELDS:
        return (f"{where.path!r} is neither in your folder {own}/ nor in a folder "
                f"shared with you or your virtual clusters")
    return f"{where.path!r} must be in your own folder {own}/"


def refusals(config: Mapping[str, Any], roots: Sequence[str], caller: Caller,
             reserved: Iterable[str] = ()) -> dict[str, list[str]]:
    """Every storage field of a (validated) job config `caller` may not use,
    with the reason, as `{field: [message]}` for a 403."""
    reserved = tuple(reserved)
    found: dict[str, list[str]] = {}
    unmounted = config.get(UNMOUNTED_KEY) or ()
    for key in STORAGE_FIELDS:
        if key in unmounted:
            continue  # outside every root: only a string in the job's environment
        try:
            where = resolve(config.get(key) or "", roots)
        except StoragePathError as error:
            found[key] = [str(error)]
            continue
        if where is None:
            continue
        reason = refusal(key, where, caller, reserved)
        if reason:
            found[key] = [reason]
    for path, field_name, use in prerequisite_paths(config, roots):
        reason = refusal(use, path, caller, reserved)
        if reason:
            found.setdefault(field_name, []).append(reason)
    return found


def prerequisite_paths(config: Mapping[str, Any], roots: Sequence[str]
                       ) -> list[tuple[StoragePath, str, str]]:
    """Each storage path a role's prerequisites name (a validated config's
    stored form), with the field it is reported under and the dir it acts as:
    an output one is written as an `outputDir`, the others read as a `dataDir`."""
    found = []
    for at, role in enumerate(config.get("taskRoles") or ()):
        for index, item in enumerate(role.get("prerequisites") or ()):
            if item.get("type") == "script":
                continue  # a script's uri is only rendered into commands, never reached
            for uri in item.get("uris") or ():
                if not isinstance(uri, str) or not uri.startswith(("/", FILE_PREFIX)):
                    continue
                try:
                    where = resolve(uri, roots)
                except StoragePathError:
                    continue  # validation named it
                if where is not None:
                    use = "outputDir" if item.get("type") == "output" else "dataDir"
                    found.append((where, f"taskRoles.{at}.prerequisites.{index}.uris", use))
    return found
