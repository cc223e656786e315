"""WebHDFS over the storage roots: `/webhdfs/v1/<absolute storage path>?op=...`.

The path is the one a job names in `dataDir` / `outputDir` (a root
`/nfs/pai` serves `/webhdfs/v1/nfs/pai/alice/data`), and the caller may do
with it exactly what a job of theirs may do with a mount of it
(shared/domain/storage.py `access_to`): read and write their own folder,
read the folders shared with them, and, as an admin, anything under a root
but the platform's own trees. The same routes answer under `/rest-server`.

Who calls: a pai login token, as `Authorization: Bearer <token>` or as
WebHDFS's `delegation=<token>` (HdfsCLI's TokenClient, fsspec's `token=`).
`user.name` and `doas` are accepted only when they name that same login: a
WebHDFS "simple" identity that nothing proves is no login here.

The operations, their parameters and answers are shared/domain/webhdfs.py's;
the file system work, which follows no link a job planted, is
shared/infra/storagefs.py's. Bytes stream both ways in chunks, so a 2 GB
upload or download costs the worker a chunk of memory, not 2 GB
(docs/storage.md has the figures).
"""

from __future__ import annotations

import errno
import logging
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any
from urllib.parse import urlencode

from flask import Blueprint, Response, g, jsonify, request
from werkzeug.exceptions import HTTPException
from werkzeug.wsgi import wrap_file

from services.api import auth
from services.api.errors import ApiError
from services.api.platform import platform
from services.api.serving import allow_long_body
from services.api.storage import load_shares
from shared.domain import storage, webhdfs
from shared.domain.storage import Access, Caller, StoragePath, StoragePathError
from shared.domain.webhdfs import (
    DEFAULT_DIR_MODE,
    DEFAULT_FILE_MODE,
    Step,
    WebHdfsError,
    bad_argument,
    forbidden,
    not_found,
    unauthorized,
)
from shared.infra import storagefs
from shared.infra.safefs import UnsafePath
from shared.state.accounts import User

log = logging.getLogger("pai.api")
bp = Blueprint("webhdfs", __name__)

CHUNK_BYTES = 1024 * 1024  # what one read or write of a transfer holds in memory
METHODS = ["GET", "PUT", "POST", "DELETE"]


@bp.errorhandler(WebHdfsError)
def _refused(error: WebHdfsError) -> tuple[Response, int]:
    return jsonify(error.body()), error.status


@bp.errorhandler(ApiError)
def _api_refused(error: ApiError) -> tuple[Response, int]:
    exception = "SecurityException" if error.status == 401 else "IOException"
    return _refused(WebHdfsError(exception, error.message, error.status))


@bp.errorhandler(HTTPException)
def _http_refused(error: HTTPException) -> tuple[Response, int]:
    status = error.code or 500
    exception = "IllegalArgumentException" if status < 500 else "IOException"
    return _refused(WebHdfsError(exception, error.description or error.name, status))


# ---------------------------------------------------------------- who calls


def caller(params: dict[str, str]) -> User:
    """The login behind the request: a bearer header or `delegation=`."""
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    token = token.strip() if scheme.lower() == "bearer" else ""
    token = token or params.get("delegation", "").strip()
    if not token:
        hint = " (user.name alone proves nothing)" if params.get("user.name") else ""
        raise unauthorized("log in first: send Authorization: Bearer <token> or "
                           f"delegation=<token> (POST /api/v1/token gives one){hint}")
    claims = auth._claims(token)  # ApiError 401: expired, or not valid
    user = auth.accounts().user_for_token(claims["sub"], claims["jti"],
                                          int(claims["iat_ms"]), claims.get("uid"))
    if user is None:
        raise unauthorized("the token was revoked; log in again")
    for name in ("user.name", "doas"):
        named = params.get(name)
        if named and named.lower() != user.username:
            raise forbidden(f"{name}={named[:64]} is not your login {user.username}: "
                            f"pai's WebHDFS acts as the token's user only")
    g.user = user
    return user


def _who(user: User, where: StoragePath) -> Caller:
    """The caller as the access rule sees them; shares are read only when
    they can matter (not an admin, not in the caller's own folder)."""
    needs_shares = not user.admin and not storage.in_own_folder(where, user.username)
    shares = load_shares(platform().store) if needs_shares else ()
    return Caller(user.username, tuple(user.virtual_clusters), user.admin, shares)


def allowed(user: User, where: StoragePath, needs: Access) -> None:
    """WebHdfsError unless `user` may do what `needs` says with `where`."""
    reserved = platform().settings.platform_dirs
    have = storage.access_to(where, _who(user, where), reserved)
    if have >= needs:
        return
    own = storage.user_folder(where.root, user.username)
    if have == Access.READ:
        raise forbidden(f"Permission denied: {where.path} is read-only to you")
    raise forbidden(f"Permission denied: {where.path} is neither in your folder {own}/ "
                    f"nor in a folder shared with you")


def resolve(path: str) -> StoragePath:
    """The storage path a request names; 404 outside every root."""
    roots = platform().settings.storage_roots
    try:
        where = storage.resolve(path, roots) if roots else None
    except StoragePathError as error:
        if ".." in path.split("/") or "\x00" in path:
            raise bad_argument(f"Invalid path name {path[:200]!r}: {error}") from None
        raise WebHdfsError("FileNotFoundException",
                           f"{path[:200]} is in no storage root of pai "
                           f"({', '.join(roots)})") from None
    if where is None:
        raise WebHdfsError("FileNotFoundException", "pai has no storage roots configured")
    return where


# ---------------------------------------------------------------- errors


@contextmanager
def file_errors(path: str) -> Iterator[None]:
    """The file system's refusals as WebHDFS states them."""
    try:
        yield
    except storagefs.Busy as error:
        raise WebHdfsError("AlreadyBeingCreatedException", f"{path}: {error.strerror}") \
            from None
    except UnsafePath as error:
        raise forbidden(f"Permission denied: {path}: {error.strerror} "
                        f"(pai follows no symbolic link)") from None
    except FileNotFoundError:
        raise not_found(path) from None
    except FileExistsError:
        raise WebHdfsError("FileAlreadyExistsException", f"{path} already exists") from None
    except UnicodeError:
        raise bad_argument(f"Invalid path name {path[:200]!r}") from None
    except OSError as error:
        raise _os_refusal(path, error) from None


def _os_refusal(path: str, error: OSError) -> WebHdfsError:
    reason = error.strerror or str(error)
    if error.errno == errno.ENOTEMPTY:
        return WebHdfsError("PathIsNotEmptyDirectoryException",
                            f"{path} is non empty': Directory is not empty")
    if error.errno in (errno.ENAMETOOLONG, errno.EINVAL):
        return bad_argument(f"{path}: {reason}")
    if error.errno == errno.EACCES:
        # The rule let the caller; the API's own process may not (an
        # unprivileged API on storage jobs made as root).
        return forbidden(f"Permission denied: {path}: the pai API's process may not do "
                         f"this on the storage (docs/storage.md, Deploying)")
    if error.errno in (errno.EPERM, errno.EROFS):
        return forbidden(f"Permission denied: {path}: {reason}")
    log.warning("WebHDFS on %s: %s", path, error)
    return WebHdfsError("IOException", f"{path}: {reason}")


# ---------------------------------------------------------------- the route


def _params() -> dict[str, str]:
    """Query parameters, names in lower case (Hadoop reads them so)."""
    return {key.lower(): value for key, value in request.args.items()}


@bp.route(f"{webhdfs.PREFIX}/", defaults={"path": ""}, methods=METHODS, strict_slashes=False)
@bp.route(f"{webhdfs.PREFIX}/<path:path>", methods=METHODS)
def serve(path: str) -> Any:
    """One WebHDFS call: the operation, the login, the path and its access,
    then the operation itself."""
    params = _params()
    op = webhdfs.operation(params.get("op"), request.method)
    user = caller(params)
    if op.name == "GETHOMEDIRECTORY":
        return {"Path": home_of(user)}
    where = resolve("/" + path)
    allowed(user, where, op.needs)
    if op.step == Step.TWO and not webhdfs.boolean(params, "data"):
        return _first_step(op.name, where, params)
    with file_errors(where.path):
        return HANDLERS[op.name](where, params, user)


def home_of(user: User) -> str:
    roots = platform().settings.storage_roots
    if not roots:
        raise WebHdfsError("FileNotFoundException", "pai has no storage roots configured")
    return storage.user_folder(roots[0], user.username)


# ---------------------------------------------------------------- reads


def _status(where: StoragePath, params: dict[str, str], user: User) -> Any:
    info = storagefs.status(where.root, where.parts)
    return {"FileStatus": webhdfs.file_status(info, webhdfs.owner_of(where.parts), "")}


def _list(where: StoragePath, params: dict[str, str], user: User) -> Any:
    entries = storagefs.listing(where.root, where.parts)
    return {"FileStatuses": {"FileStatus": [
        webhdfs.file_status(e, webhdfs.owner_of((*where.parts, e.name) if e.name
                                                else where.parts), e.name)
        for e in entries]}}


def _summary(where: StoragePath, params: dict[str, str], user: User) -> Any:
    return webhdfs.content_summary(storagefs.summary(where.root, where.parts))


class _Window:
    """`length` bytes of an open file from its current position: what gunicorn
    hands to sendfile(2) (by `fileno`, up to Content-Length), and what any
    other server reads in chunks. Closing it closes the file."""

    def __init__(self, files: ExitStack, fd: int, length: int) -> None:
        self.files, self.fd, self.left = files, fd, length

    def fileno(self) -> int:
        return self.fd

    def read(self, size: int = CHUNK_BYTES) -> bytes:
        if self.left <= 0:
            return b""
        data = os.read(self.fd, min(size if size > 0 else CHUNK_BYTES, self.left))
        self.left -= len(data)
        return data

    def close(self) -> None:
        self.files.close()


def _open(where: StoragePath, params: dict[str, str], user: User) -> Response:
    offset = webhdfs.whole_number(params, "offset") or 0
    wanted = webhdfs.whole_number(params, "length")
    with ExitStack() as files:
        fd = files.enter_context(storagefs.reader(where.root, where.parts))
        size = os.fstat(fd).st_size
        if offset > size:
            raise WebHdfsError("IOException",
                               f"Offset={offset} out of the range [0, {size}]; "
                               f"the file {where.path} is shorter")
        length = size - offset if wanted is None else min(wanted, size - offset)
        os.lseek(fd, offset, os.SEEK_SET)
        window = _Window(files.pop_all(), fd, length)  # the response closes it
    response = Response(wrap_file(request.environ, window, CHUNK_BYTES),  # type: ignore[arg-type]
                        mimetype="application/octet-stream", direct_passthrough=True)
    response.content_length = length
    return response


# ---------------------------------------------------------------- writes


def _mkdirs(where: StoragePath, params: dict[str, str], user: User) -> Any:
    mode = webhdfs.permission(params, DEFAULT_DIR_MODE)
    storagefs.make_folders(where.root, where.parts, mode)
    return {"boolean": True}


def _first_step(op: str, where: StoragePath, params: dict[str, str]) -> Any:
    """CREATE and APPEND, step one: check what can be checked before any byte
    travels, then send the client back here with `data=true` (the same
    query, so its `delegation=` too), where it sends the bytes."""
    _check_write_params(params)
    with file_errors(where.path):
        if op == "APPEND":
            if storagefs.status(where.root, where.parts).kind != webhdfs.Kind.FILE:
                raise forbidden(f"Permission denied: {where.path} is not a plain file")
        elif not where.parts:
            raise forbidden("a storage root cannot be replaced by a file")
        else:
            _may_create(where, webhdfs.boolean(params, "overwrite"))
    location = f"{request.base_url}?{urlencode({**request.args.to_dict(), 'data': 'true'})}"
    if webhdfs.boolean(params, "noredirect"):
        return {"Location": location}
    return Response(status=307, headers={"Location": location})


def _check_write_params(params: dict[str, str]) -> None:
    for name in ("buffersize", "blocksize", "replication"):
        webhdfs.whole_number(params, name)  # accepted, meaningless here
    webhdfs.boolean(params, "overwrite")
    webhdfs.permission(params, DEFAULT_FILE_MODE)


def _may_create(where: StoragePath, overwrite: bool) -> None:
    try:
        info = storagefs.status(where.root, where.parts)
    except FileNotFoundError:
        return
    if info.kind == webhdfs.Kind.DIRECTORY:
        raise WebHdfsError("FileAlreadyExistsException", f"{where.path} is a directory")
    if not overwrite:
        raise WebHdfsError("FileAlreadyExistsException",
                           f"{where.path} already exists (overwrite=true replaces it)")


def _receive(fd: int) -> int:
    """Copy the request body into `fd`, a chunk at a time; the bytes written."""
    allow_long_body(request.environ)
    # The app's 1 MiB limit is for JSON bodies. (None would mean the app's
    # limit again: Flask reads an unset per-request limit so.)
    request.max_content_length = sys.maxsize
    stream, total = request.stream, 0
    while chunk := stream.read(CHUNK_BYTES):
        storagefs.write_all(fd, chunk)
        total += len(chunk)
    return total


def _create(where: StoragePath, params: dict[str, str], user: User) -> Response:
    _check_write_params(params)
    if not where.parts:
        raise forbidden("a storage root cannot be replaced by a file")
    mode = webhdfs.permission(params, DEFAULT_FILE_MODE)
    with storagefs.creator(where.root, where.parts, mode=mode,
                           overwrite=webhdfs.boolean(params, "overwrite")) as fd:
        _receive(fd)
    return Response(status=201, headers={"Location": f"webhdfs://{request.host}{where.path}"})


def _append(where: StoragePath, params: dict[str, str], user: User) -> Response:
    _check_write_params(params)
    with storagefs.appender(where.root, where.parts) as fd:
        _receive(fd)
    return Response(status=200)


def _rename(where: StoragePath, params: dict[str, str], user: User) -> Any:
    destination = params.get("destination", "")
    if not destination.startswith("/"):
        raise bad_argument(f"destination {destination[:200]!r} must be an absolute path")
    target = resolve(destination)
    allowed(user, target, Access.WRITE)
    if not where.parts:
        raise forbidden("a storage root cannot be moved")
    if storage.is_under(target.path, where.path):
        raise bad_argument(f"{where.path} cannot be moved into itself ({target.path})")
    with file_errors(f"{where.path} -> {target.path}"):
        moved = storagefs.rename(where.root, where.parts, target.root, target.parts)
    return {"boolean": moved}


def _delete(where: StoragePath, params: dict[str, str], user: User) -> Any:
    recursive = webhdfs.boolean(params, "recursive")
    if not where.parts:
        raise forbidden("a storage root cannot be deleted")
    return {"boolean": storagefs.delete(where.root, where.parts, recursive=recursive)}


Handler = Callable[[StoragePath, dict[str, str], User], Any]
HANDLERS: dict[str, Handler] = {
    "GETFILESTATUS": _status, "LISTSTATUS": _list, "GETCONTENTSUMMARY": _summary,
    "OPEN": _open, "MKDIRS": _mkdirs, "CREATE": _create, "APPEND": _append,
    "RENAME": _rename, "DELETE": _delete,
}



# ---------------------------------------------------------------- as a user, in-process


def checked(user: User, path: str, needs: Access) -> StoragePath:
    """The storage path `user` names, if they may do what `needs` says with
    it: for other doors on the storage (the portal), with WebHDFS's rules and
    refusals (WebHdfsError)."""
    where = resolve(path)
    allowed(user, where, needs)
    return where


def folder_listing(user: User, path: str) -> list[webhdfs.FileInfo]:
    where = checked(user, path, Access.READ)
    with file_errors(where.path):
        return storagefs.listing(where.root, where.parts)


def download(user: User, path: str) -> Response:
    """The whole file as an attachment, streamed as OPEN streams it."""
    where = checked(user, path, Access.READ)
    with file_errors(where.path):
        response = _open(where, {}, user)
    name = where.parts[-1] if where.parts else "download"
    response.headers.set("Content-Disposition", "attachment", filename=name)
    return response


def upload_part(user: User, path: str, offset: int) -> int:
    """One part of a file sent in parts (the portal's uploads): the request
    body is written at `offset`, which must be where the file ends (0 makes
    the file anew). The file's length after it."""
    where = checked(user, path, Access.WRITE)
    if not where.parts:
        raise forbidden("a storage root cannot be replaced by a file")
    with file_errors(where.path):
        if offset == 0:
            with storagefs.creator(where.root, where.parts, mode=DEFAULT_FILE_MODE,
                                   overwrite=True) as fd:
                return _receive(fd)
        length = storagefs.status(where.root, where.parts).length
        if length != offset:
            raise WebHdfsError("IOException", f"{where.path} holds {length} bytes, not "
                               f"{offset}: send the part that starts there", 409)
        with storagefs.appender(where.root, where.parts) as fd:
            return offset + _receive(fd)


def remove(user: User, path: str) -> bool:
    where = checked(user, path, Access.WRITE)
    with file_errors(where.path):
        return bool(_delete(where, {"recursive": "true"}, user)["boolean"])


def make_folder(user: User, path: str) -> None:
    where = checked(user, path, Access.WRITE)
    with file_errors(where.path):
        storagefs.make_folders(where.root, where.parts)
