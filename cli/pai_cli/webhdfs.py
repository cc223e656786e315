"""The cluster's storage over WebHDFS (`/webhdfs/v1/<path>`), for `pai fs`.

Over the standard library's http.client, so the CLI needs nothing more; the
login goes as a bearer header, never in a URL. Uploads follow WebHDFS's two
steps (a 307 to where the bytes go) and stream from the file with its
length, a chunk at a time; downloads stream to the file the same way. A
refusal arrives as WebHDFS's `RemoteException` and leaves as the CLI's
ApiError, its code the exception's name.
"""

from __future__ import annotations

import http.client
import json
import posixpath
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, Any
from urllib.parse import quote, urlencode, urlsplit

from pai_cli.api import USER_AGENT, ApiError, Unreachable, error_from

PREFIX = "/webhdfs/v1"
CHUNK = 1024 * 1024
TIMEOUT_S = 60.0
OnBytes = Callable[[int], None]  # called with the bytes just sent or received


@dataclass(frozen=True)
class Entry:
    """One FileStatus: `name` is the entry's within its folder ("" alone)."""

    name: str
    kind: str  # FILE, DIRECTORY or SYMLINK
    length: int
    modified_ms: int
    permission: str
    owner: str

    @classmethod
    def from_status(cls, status: dict[str, Any]) -> Entry:
        return cls(str(status.get("pathSuffix", "")), str(status.get("type", "")),
                   int(status.get("length", 0)), int(status.get("modificationTime", 0)),
                   str(status.get("permission", "")), str(status.get("owner", "")))

    @property
    def is_dir(self) -> bool:
        return self.kind == "DIRECTORY"


class _Counted:
    """A file's bytes for http.client, reporting each chunk it hands over."""

    def __init__(self, source: IO[bytes], progress: OnBytes | None) -> None:
        self.source, self.progress = source, progress

    def read(self, size: int = CHUNK) -> bytes:
        data = self.source.read(size)
        if data and self.progress:
            self.progress(len(data))
        return data


class WebHdfs:
    """One cluster's storage: `base` is the cluster URL, `token` the login."""

    def __init__(self, base: str, token: str, timeout: float = TIMEOUT_S) -> None:
        self.base, self.token, self.timeout = base.rstrip("/"), token, timeout
        self._home: str | None = None

    # ------------------------------------------------------------ requests

    def _target(self, path: str, params: dict[str, str]) -> str:
        prefix = urlsplit(self.base).path
        return f"{prefix}{PREFIX}{quote(path)}?{urlencode(params)}"

    def _connection(self, url: str) -> http.client.HTTPConnection:
        parts = urlsplit(url)
        kind = http.client.HTTPSConnection if parts.scheme == "https" \
            else http.client.HTTPConnection
        return kind(parts.netloc, timeout=self.timeout, blocksize=CHUNK)

    @contextmanager
    def _request(self, method: str, url: str, body: Any = None,
                 length: int | None = None) -> Iterator[http.client.HTTPResponse]:
        """One request to `url` (absolute, or a path on the cluster); the
        response, open, when it is 2xx or a redirect; ApiError otherwise."""
        if url.startswith("/"):
            url = urlsplit(self.base)._replace(path="", query="").geturl() + url
        headers = {"Authorization": f"Bearer {self.token}", "User-Agent": USER_AGENT}
        if length is not None:
            headers.update({"Content-Length": str(length),
                            "Content-Type": "application/octet-stream"})
        connection = self._connection(url)
        parts = urlsplit(url)
        try:
            connection.request(method, f"{parts.path}?{parts.query}", body=body,
                               headers=headers)
            response = connection.getresponse()
            if response.status >= 400:
                raise _refusal(response.status, response.read())
            yield response
        except (OSError, http.client.HTTPException) as error:
            raise Unreachable(f"the transfer with {self.base} failed: {error}") from None
        finally:
            connection.close()

    def _json(self, method: str, path: str, op: str, **params: str) -> Any:
        with self._request(method, self._target(path, {"op": op, **params})) as response:
            return json.loads(response.read() or b"null")

    # ------------------------------------------------------------ operations

    def home(self) -> str:
        if self._home is None:
            self._home = str(self._json("GET", "/", "GETHOMEDIRECTORY")["Path"])
        return self._home

    def absolute(self, path: str) -> str:
        """A remote path as the server takes it: relative ones are in the home folder."""
        path = path or "."
        joined = path if path.startswith("/") else posixpath.join(self.home(), path)
        return posixpath.normpath(joined)

    def status(self, path: str) -> Entry | None:
        """The path's status, or None when there is nothing there."""
        try:
            found = self._json("GET", path, "GETFILESTATUS")
        except ApiError as error:
            if error.code == "FileNotFoundException":
                return None
            raise
        return Entry.from_status(found["FileStatus"])

    def list(self, path: str) -> list[Entry]:
        found = self._json("GET", path, "LISTSTATUS")
        return [Entry.from_status(s) for s in found["FileStatuses"]["FileStatus"]]

    def mkdirs(self, path: str) -> None:
        self._json("PUT", path, "MKDIRS")

    def rename(self, source: str, target: str) -> bool:
        return bool(self._json("PUT", source, "RENAME", destination=target)["boolean"])

    def delete(self, path: str, recursive: bool) -> bool:
        return bool(self._json("DELETE", path, "DELETE",
                               recursive="true" if recursive else "false")["boolean"])

    def _two_steps(self, method: str, path: str, params: dict[str, str], source: IO[bytes],
                   length: int, progress: OnBytes | None) -> None:
        with self._request(method, self._target(path, params)) as first:
            first.read()
            location = first.getheader("Location")
        if first.status != 307 or not location:
            raise ApiError(first.status, "BadResponse",
                           f"{self.base} did not say where to send the bytes")
        with self._request(method, location, body=_Counted(source, progress),
                           length=length) as done:
            done.read()

    def create(self, path: str, source: IO[bytes], length: int, *, overwrite: bool,
               progress: OnBytes | None = None) -> None:
        self._two_steps("PUT", path, {"op": "CREATE", "overwrite": str(overwrite).lower()},
                        source, length, progress)

    def append(self, path: str, source: IO[bytes], length: int,
               progress: OnBytes | None = None) -> None:
        self._two_steps("POST", path, {"op": "APPEND"}, source, length, progress)

    def read(self, path: str, sink: IO[bytes], *, offset: int = 0, length: int | None = None,
             progress: OnBytes | None = None) -> int:
        """Copy the file (from `offset`, `length` bytes) into `sink`; the bytes copied."""
        params = {"op": "OPEN", "offset": str(offset)}
        if length is not None:
            params["length"] = str(length)
        copied = 0
        with self._request("GET", self._target(path, params)) as response:
            while chunk := response.read(CHUNK):
                sink.write(chunk)
                copied += len(chunk)
                if progress:
                    progress(len(chunk))
        return copied


def _refusal(status: int, body: bytes) -> ApiError:
    """A WebHDFS RemoteException as the CLI's ApiError; anything else (the
    API's own errors) is read as every API answer is."""
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if isinstance(data, dict) and isinstance(data.get("RemoteException"), dict):
        remote = data["RemoteException"]
        return ApiError(status, str(remote.get("exception", "RemoteException")),
                        str(remote.get("message", "")))
    return error_from(status, body)
