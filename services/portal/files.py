"""The portal's storage browser: your folders and the folders shared with you.

Browse, download, upload (drag and drop, or a file picker; large files go
in parts of PART_BYTES, each its own request, so a dropped connection costs
one part and no request holds a worker for the whole file), make folders
and delete. Every action is the WebHDFS door's own (services/api/webhdfs.py,
`checked`), run as the session's user, so the portal grants nothing the
API would not: a share is browsed read-only, another user's folder not at
all. Uploads need the page's script; browsing, downloading, making folders
and deleting work without it.
"""

from __future__ import annotations

import posixpath
from typing import Any

from flask import abort, flash, g, jsonify, redirect, render_template, request, url_for
from flask.typing import ResponseReturnValue

from services.api import webhdfs
from services.api.platform import platform
from services.portal.views import bp, call
from shared.domain import storage
from shared.domain.webhdfs import Kind, WebHdfsError

PART_BYTES = 8 * 1024 * 1024  # one upload request's body, at most


def _home(username: str) -> str | None:
    roots = platform().settings.storage_roots
    return storage.user_folder(roots[0], username) if roots else None


def _browse(path: str) -> str:
    return url_for("portal.storage_page", path=path)


def places(username: str) -> list[dict[str, Any]]:
    """Where a user starts browsing: their folder in each root, then each
    share granted to them (the API's list), each with whether it is theirs to change."""
    roots = platform().settings.storage_roots
    found = [{"name": f"your folder in {root}", "path": storage.user_folder(root, username),
              "writable": True} for root in roots]
    shares = call("GET", "/api/v1/storage/shares")
    if shares.ok:
        found += [{"name": f"share {s['name']}", "path": s["path"], "writable": False}
                  for s in shares.body]
    return found


def _writable(path: str) -> bool:
    """Whether to offer upload and delete here (the API decides regardless)."""
    user = g.portal_user
    if user.admin:
        return True
    try:
        where = storage.resolve(path, platform().settings.storage_roots)
    except storage.StoragePathError:
        return False
    return where is not None and storage.in_own_folder(where, user.username)


@bp.get("/storage")
def storage_page() -> ResponseReturnValue:
    path = request.args.get("path", "").strip() or _home(g.portal_user.username)
    if path is None:
        return render_template("error.html", status=404,
                               message="this cluster has no storage roots"), 404
    entries: list[Any] = []
    error = None
    try:
        entries = webhdfs.folder_listing(g.portal_user, path)
    except WebHdfsError as refused:
        missing = refused.exception == "FileNotFoundException"
        error = "nothing here yet: upload a file or make a folder" \
            if missing and path == _home(g.portal_user.username) else refused.message
    rows = [{"name": e.name, "path": posixpath.join(path, e.name), "folder":
             e.kind == Kind.DIRECTORY, "link": e.kind == Kind.SYMLINK, "size": e.length,
             "modified": e.modified_ms} for e in entries if e.name]
    parent = posixpath.dirname(path.rstrip("/")) or "/"
    return render_template("storage.html", path=path, rows=rows, error=error,
                           parent=parent if parent != path else None,
                           places=places(g.portal_user.username),
                           writable=_writable(path), part_bytes=PART_BYTES)


@bp.get("/storage/download")
def storage_download() -> ResponseReturnValue:
    try:
        return webhdfs.download(g.portal_user, request.args.get("path", ""))
    except WebHdfsError as refused:
        return render_template("error.html", status=refused.status,
                               message=refused.message), refused.status


@bp.post("/storage/upload")
def storage_upload() -> ResponseReturnValue:
    """One part of an upload: `path` the file, `offset` where the part starts."""
    try:
        offset = int(request.args.get("offset", ""))
    except ValueError:
        abort(400)
    try:
        length = webhdfs.upload_part(g.portal_user, request.args.get("path", ""), offset)
    except WebHdfsError as refused:
        return jsonify({"message": refused.message}), refused.status
    return jsonify({"length": length})


@bp.post("/storage/mkdir")
def storage_mkdir() -> ResponseReturnValue:
    folder = request.form.get("path", "")
    name = request.form.get("name", "").strip()
    if not name or "/" in name or name in (".", ".."):
        flash("A folder name is one name, without '/'.", "error")
        return redirect(_browse(folder))
    try:
        webhdfs.make_folder(g.portal_user, posixpath.join(folder, name))
        flash(f"Made folder {name}.")
    except WebHdfsError as refused:
        flash(refused.message, "error")
    return redirect(_browse(folder))


@bp.post("/storage/delete")
def storage_delete() -> ResponseReturnValue:
    path = request.form.get("path", "")
    parent = posixpath.dirname(path.rstrip("/")) or "/"
    try:
        gone = webhdfs.remove(g.portal_user, path)
        flash(f"Deleted {posixpath.basename(path)}." if gone else f"{path} was not there.")
    except WebHdfsError as refused:
        flash(refused.message, "error")
    return redirect(_browse(parent))
