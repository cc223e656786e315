"""The REST API, over the standard library's urllib (no extra dependency).

Every failure becomes one of two exceptions the command layer turns into a
one-line message: `ApiError` (the server answered with an error) or
`Unreachable` (it did not answer at all).
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from http.client import HTTPException, HTTPResponse
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from pai_cli.sse import Event, parse_events

TIMEOUT_S = 30.0
USER_AGENT = "pai-cli/0.1"


@dataclass
class ApiError(Exception):
    status: int
    code: str
    message: str
    fields: dict[str, list[str]] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class Unreachable(Exception):
    """No HTTP answer: refused, timed out, name unknown, connection dropped."""


def _reason(error: BaseException) -> str:
    if isinstance(error, urllib.error.URLError) and not isinstance(error.reason, str):
        return _reason(error.reason)
    if isinstance(error, ConnectionRefusedError):
        return "connection refused"
    if isinstance(error, TimeoutError | socket.timeout):
        return "timed out"
    if isinstance(error, socket.gaierror):
        return "unknown host"
    text = getattr(error, "strerror", None) or getattr(error, "reason", None) or str(error)
    return str(text).splitlines()[0] if str(text) else type(error).__name__


def error_from(status: int, body: bytes) -> ApiError:
    """The server's {"code", "message", "fields"}, or the best we can say."""
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if isinstance(data, dict) and isinstance(data.get("code"), str):
        raw_fields = data.get("fields")
        fields: dict[str, list[str]] = {}
        if isinstance(raw_fields, dict):
            for path, messages in raw_fields.items():
                items = messages if isinstance(messages, list) else [messages]
                fields[str(path)] = [str(m) for m in items]
        return ApiError(status, data["code"], str(data.get("message", "")), fields)
    text = body.decode("utf-8", "replace").strip().splitlines()
    return ApiError(status, f"HTTP {status}", text[0][:200] if text else "no details")


class Client:
    """One cluster's API: `base` is its URL (no /api/v1), `token` the login."""

    def __init__(self, base: str, token: str = "", timeout: float = TIMEOUT_S) -> None:
        self.base = base.rstrip("/")
        self.token = token
        self.timeout = timeout

    def url(self, path: str, params: Mapping[str, Any] | None = None) -> str:
        query = {k: v for k, v in (params or {}).items() if v is not None}
        return self.base + path + (f"?{urlencode(query)}" if query else "")

    def _open(self, method: str, path: str, *, params: Mapping[str, Any] | None = None,
              body: Any = None, timeout: float | None = None,
              accept: str = "application/json") -> HTTPResponse:
        data = None if body is None else json.dumps(body, default=str).encode()
        headers = {"Accept": accept, "User-Agent": USER_AGENT}
        if data is not None:
            headers["Content-Type"] = "application/json"
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(self.url(path, params), data=data, method=method,
                                         headers=headers)
        try:
            response: HTTPResponse = urllib.request.urlopen(request, timeout=timeout)
        except urllib.error.HTTPError as error:
            with error:
                raise error_from(error.code, error.read()) from None
        except (urllib.error.URLError, OSError, HTTPException) as error:
            raise Unreachable(f"cannot reach {self.base}: {_reason(error)}") from None
        return response

    def call(self, method: str, path: str, *, params: Mapping[str, Any] | None = None,
             body: Any = None) -> Any:
        """One JSON request; the decoded JSON answer (text if it is not JSON)."""
        try:
            with self._open(method, path, params=params, body=body,
                            timeout=self.timeout) as response:
                raw = response.read()
                kind = response.headers.get_content_type()
        except (OSError, HTTPException) as error:
            raise Unreachable(f"lost the connection to {self.base}: {_reason(error)}") \
                from None
        if kind == "application/json":
            try:
                return json.loads(raw)
            except ValueError:
                raise ApiError(0, "BadResponse", f"{self.base} sent invalid JSON") from None
        return raw.decode("utf-8", "replace")

    def events(self, path: str, params: Mapping[str, Any] | None = None) -> Iterator[Event]:
        """Server-sent events from `path`, as they arrive, until the server ends.

        No read timeout: a quiet log is not a dead server."""
        response = self._open("GET", path, params=params, timeout=None,
                              accept="text/event-stream")
        try:
            with response:
                lines = (raw.decode("utf-8", "replace") for raw in response)
                yield from parse_events(lines)
        except (OSError, HTTPException) as error:
            raise Unreachable(f"lost the connection to {self.base}: {_reason(error)}") \
                from None


def jobs_path(username: str) -> str:
    return f"/api/v1/user/{quote(username, safe='')}/jobs"


def job_path(username: str, name: str, *rest: str) -> str:
    return "/".join([jobs_path(username), *(quote(p, safe="") for p in (name, *rest))])


def node_path(name: str) -> str:
    return f"/api/v1/nodes/{quote(name, safe='')}"


def check_url(url: str) -> str:
    """A cluster URL as the CLI stores it: scheme and host, no trailing slash."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"{url} is not an http(s) URL")
    return f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"
