"""The portal's pure parts: paging, sorting, safe redirects, clones and error
fields, from the API's answers to what a page shows. No IO: table-tested in
tests/integration/test_portal_pages.py (pure, beside the portal's other tests)."""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import yaml

PAGE_SIZES = (20, 50, 100)
DEFAULT_PAGE_SIZE = 20
MAX_PAGE = 10**6  # past any real job count: the API's own offset bound stays far away

# Columns the job table sorts by, and how (rows are the API's JobSummary).
SORT_ACROSS_PAGES = "created"  # the API's own order (submit time), over every page
JOB_SORTS: dict[str, Callable[[Mapping[str, Any]], Any]] = {
    "name": lambda row: row["name"],
    "user": lambda row: row["username"],
    "state": lambda row: row["state"],
    "vc": lambda row: row["virtualCluster"],
    "gpus": lambda row: row["gpus"] or 0,
    "created": lambda row: row["createdTime"] or 0,
}


@dataclass(frozen=True)
class Paging:
    page: int  # 1-based
    size: int
    total: int = 0

    @property
    def offset(self) -> int:
        return (self.page - 1) * self.size

    @property
    def pages(self) -> int:
        return max(1, -(-self.total // self.size))

    @property
    def has_previous(self) -> bool:
        return self.page > 1

    @property
    def has_next(self) -> bool:
        return self.page < self.pages


def _whole(text: str | None, default: int, low: int, high: int) -> int:
    try:
        value = int(text) if text is not None else default
    except ValueError:
        return default
    return min(high, max(low, value))


def paging_of(args: Mapping[str, str]) -> Paging:
    """The page asked for by `?page=&size=`: anything out of range is clamped,
    anything not a number is the default (a bookmark never breaks the page)."""
    size = _whole(args.get("size"), DEFAULT_PAGE_SIZE, 1, max(PAGE_SIZES))
    return Paging(_whole(args.get("page"), 1, 1, MAX_PAGE), size)


def sorted_rows(rows: list[dict[str, Any]], sort: str | None,
                descending: bool) -> list[dict[str, Any]]:
    """The page's rows by a known column, or as the API gave them (newest first)."""
    key = JOB_SORTS.get(sort or "")
    if key is None:
        return rows
    return sorted(rows, key=key, reverse=descending)


def local_target(target: str | None, default: str = "/") -> str:
    """Where to go after a form: only a path on this site, never another
    host (`//evil`, `https://evil`, `/\\evil`), else `default`."""
    if not target or not target.startswith("/") or target.startswith(("//", "/\\")):
        return default
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or any(c in target for c in "\r\n\t\\"):
        return default
    return target


def clone_text(config: Mapping[str, Any], token: str | None = None) -> str:
    """A job's config as the editor shows it to clone: a new name (the old one
    is taken), v1 as JSON, protocol v2 as YAML."""
    suffix = token or secrets.token_hex(2)
    copied = dict(config)
    if copied.get("protocolVersion") in (2, "2"):
        copied["name"] = f"{copied.get('name', 'job')}-{suffix}"
        return yaml.safe_dump(copied, sort_keys=False)
    copied["jobName"] = f"{copied.get('jobName', 'job')}-{suffix}"
    return json.dumps(copied, indent=2)


def error_fields(body: Any) -> list[tuple[str, list[str]]]:
    """The API's error `fields` ({path: [messages]}) as rows, by path."""
    fields = body.get("fields") if isinstance(body, dict) else None
    if not isinstance(fields, dict):
        return []
    rows = []
    for path, messages in sorted(fields.items()):
        shown = messages if isinstance(messages, list) else [messages]
        rows.append((str(path), [str(m) for m in shown]))
    return rows


def error_message(body: Any, status: int) -> str:
    """The API's error sentence, or what the status means when it gave none."""
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return body["message"]
    return f"the request failed ({status})"


def job_ref(text: str) -> tuple[str, str] | None:
    """`user/name` (a batch form's checkbox value) as its parts, or None."""
    user, sep, name = text.partition("/")
    if not sep or not user or not name or "/" in name:
        return None
    return user, name


def oldest_offset(total: int, count: int) -> int:
    """The offset of the `count` oldest jobs in a newest-first list of `total`."""
    return max(0, total - count)


def vc_rows(vcs: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The API's virtual clusters as the home and VC tables show them, by name."""
    rows = []
    for name in sorted(vcs):
        vc = vcs[name]
        used = int(vc["resourcesUsed"]["GPUs"])
        rows.append({"name": name, "guaranteed": vc["gpuGuaranteed"], "used": used,
                     "borrowed": vc["gpuBorrowed"], "free": vc["gpuFree"],
                     "borrowing": vc["borrowing"], "waiting": vc["waitingJobs"],
                     "running": vc["runningJobs"], "description": vc.get("description") or ""})
    return rows
