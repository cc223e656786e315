"""The portal's pages: the API's own views, called in-process, laid out as HTML.

Every read and every write goes through `call`: one API request (GET
/api/v1/jobs, PUT .../executionType, POST /api/v1/token, ...) run through
the app's whole request pipeline with the session's bearer token, so the
token check, the view, its schema and its error answer are the REST API's
own. The portal authorizes nothing itself and validates nothing itself: a
user sees and does in a browser exactly what the API lets them. The one
route it serves without a sub-request is a task's log, which streams: it
calls the API's view function directly, as the session's user.

The session is Flask's signed cookie (HttpOnly, SameSite=Lax, Secure behind
https: PAI_PORTAL_SECURE_COOKIE) holding the bearer token the login got;
logging out revokes that token. Every POST carries the session's CSRF token.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import yaml
from flask import (
    Blueprint,
    Flask,
    Request,
    current_app,
    flash,
    g,
    redirect,
    render_template,
    request,
    session,
    url_for,
)
from flask.sessions import SecureCookieSession, SecureCookieSessionInterface
from flask.typing import ResponseReturnValue

from services.api import auth, tasklogs
from services.api.errors import ApiError
from services.api.queries import query_of, takes_query
from services.portal import pages
from shared.domain.states import JobState
from shared.domain.storage import UNMOUNTED_KEY
from shared.infra.clock import now_ms
from shared.infra.config import Settings

bp = Blueprint("portal", __name__, template_folder="templates", static_folder="static",
               static_url_path="/portal/static")

# A portal login's token lives a working day; the API's default is a week.
SESSION_TOKEN_SECONDS = 12 * 3600
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "X-CSRF-Token"
OPEN_ENDPOINTS = {"portal.login", "portal.static"}
RECENT_JOBS = 10
WAITING_SHOWN = 5
# The editor's examples, from the repository's examples/ (or the image's copy).
EXAMPLES = {"hello-world": "hello-world.json", "v2-two-roles": "v2-two-roles.yaml"}
DEFAULT_EXAMPLE = "hello-world"


class CookieSessions(SecureCookieSessionInterface):
    """Flask's signed cookie sessions, with a request that carries no
    session cookie (every API call with a bearer token) given its new empty
    session without building the cookie's signer first: that was 14 µs of
    every such request (docs/performance-log.md, 2026-11-29)."""

    def open_session(self, app: Flask, request: Request) -> SecureCookieSession | None:
        if app.secret_key and self.get_cookie_name(app) not in request.cookies:
            return self.session_class()
        return super().open_session(app, request)


def init_app(app: Flask, settings: Settings) -> None:
    """Register the portal; its session key is derived from PAI_SECRET_KEY
    (never the token-signing key itself)."""
    app.secret_key = hmac.new(settings.secret_key.encode(), b"pai-portal-session",
                              hashlib.sha256).hexdigest()
    app.session_interface = CookieSessions()
    app.config.update(SESSION_COOKIE_NAME="pai_portal", SESSION_COOKIE_HTTPONLY=True,
                      SESSION_COOKIE_SAMESITE="Lax",
                      SESSION_COOKIE_SECURE=settings.portal_secure_cookie)
    app.jinja_env.filters["when"] = _when
    app.jinja_env.globals["idle_minutes"] = pages.idle_minutes
    app.jinja_env.globals["proxy_url"] = lambda *parts: pages.proxy_url(
        request.script_root, *parts)
    app.jinja_env.globals["run_time"] = pages.run_time
    app.jinja_env.globals["chart_refresh_seconds"] = pages.CHART_REFRESH_SECONDS
    from services.portal import files  # noqa: F401  (its routes are this blueprint's)

    app.register_blueprint(bp)


# ------------------------------------------------------------ the API, in-process


@dataclass(frozen=True)
class Answer:
    status: int
    body: Any

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def message(self) -> str:
        return pages.error_message(self.body, self.status)


def call(method: str, path: str, *, query: dict[str, Any] | None = None,
         json_body: Any = None, data: str | bytes | None = None,
         content_type: str | None = None, token: str | None = None) -> Answer:
    """One API request, in this process, as the session's user (or with
    `token`; "" for none), from the browser's address."""
    app: Flask = current_app._get_current_object()  # type: ignore[attr-defined]
    bearer = session.get("token") if token is None else token
    headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
    forwarded = request.headers.get("X-Forwarded-For")
    if forwarded:  # the login throttle counts the browser, as the API would
        headers["X-Forwarded-For"] = forwarded
    # A fresh app context: the API request gets its own `g`, as over HTTP.
    with app.app_context(), app.test_request_context(
            path, method=method, query_string=query, json=json_body, data=data,
            content_type=content_type, headers=headers,
            environ_base={"REMOTE_ADDR": request.remote_addr or ""}):
        response = app.full_dispatch_request()
    body = response.get_json(silent=True) if response.is_json \
        else response.get_data(as_text=True)
    return Answer(response.status_code, body)


def _job_path(username: str, name: str, tail: str = "") -> str:
    return f"/api/v1/user/{quote(username, safe='')}/jobs/{quote(name, safe='')}{tail}"


# ------------------------------------------------------------ session and CSRF


def csrf_token() -> str:
    token = session.get("csrf")
    if not isinstance(token, str):
        token = session["csrf"] = secrets.token_urlsafe(32)
    return token


@bp.app_context_processor
def _globals() -> dict[str, Any]:
    return {"csrf_token": csrf_token, "CSRF_FIELD": CSRF_FIELD,
            "me": g.get("portal_user")}


def _session_user() -> Any:
    """The session token's user, checked as the API checks a bearer token
    (signature, expiry, revocation, the same user id), or None."""
    token = session.get("token")
    if not isinstance(token, str):
        return None
    try:
        claims = auth._claims(token)
    except ApiError:
        return None
    user = auth.accounts().user_for_token(claims["sub"], claims["jti"], int(claims["iat_ms"]),
                                          claims.get("uid"))
    if user is None:
        return None
    g.user, g.claims = user, claims  # the API's views read the caller here
    return user


@bp.before_request
def _guard() -> ResponseReturnValue | None:
    if request.method == "POST":
        # A form carries the token as a field; a script's request (an upload
        # part, whose body is the file's bytes) as a header.
        sent = request.headers.get(CSRF_HEADER) or request.form.get(CSRF_FIELD, "")
        expected = session.get("csrf")
        if not isinstance(expected, str) or not hmac.compare_digest(sent, expected):
            return render_template("error.html", status=400, message=(
                "the form carried no valid CSRF token; reload the page and try again")), 400
    if request.endpoint in OPEN_ENDPOINTS:
        return None
    user = _session_user()
    if user is None:
        session.pop("token", None)
        if request.endpoint == "portal.task_log":
            return ApiError("UnauthorizedUserError", "log in to the portal first", 401).response()
        return redirect(url_for("portal.login", next=request.full_path.rstrip("?")))
    g.portal_user = user
    return None


@bp.after_request
def _no_store(response: Any) -> Any:
    """Pages show one user's view: never kept by a shared cache."""
    response.headers.setdefault("Cache-Control", "no-store")
    response.headers.setdefault("X-Frame-Options", "DENY")
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    # Scripts and styles are the portal's own files: nothing inline, nothing
    # from another origin runs, whatever a job's name or log holds.
    response.headers.setdefault("Content-Security-Policy",
                                "default-src 'self'; frame-ancestors 'none'; form-action 'self'")
    return response


@bp.route("/login", methods=["GET", "POST"])
def login() -> ResponseReturnValue:
    target = pages.local_target(request.values.get("next"))
    if request.method == "GET":
        if _session_user() is not None:
            return redirect(target)
        return render_template("login.html", next=target, error=None, username="")
    username = request.form.get("username", "")
    answer = call("POST", "/api/v1/token", token="", content_type=(
        "application/x-www-form-urlencoded"), data=_form_encoded({
            "username": username, "password": request.form.get("password", ""),
            "expiration": str(SESSION_TOKEN_SECONDS)}))
    if not answer.ok:
        return render_template("login.html", next=target, error=answer.message,
                               username=username), answer.status
    session.clear()  # a new session for the new login (and a new CSRF token)
    session["token"] = answer.body["token"]
    session["csrf"] = secrets.token_urlsafe(32)
    return redirect(target)


def _form_encoded(fields: dict[str, str]) -> str:
    return "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in fields.items())


@bp.post("/logout")
def logout() -> ResponseReturnValue:
    call("DELETE", "/api/v1/token")  # the token is revoked: a copied cookie is dead too
    session.clear()
    flash("You are logged out.")
    return redirect(url_for("portal.login"))


# ------------------------------------------------------------ pages


def _when(ms: Any) -> str:
    if not isinstance(ms, int) or ms <= 0:
        return ""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _count(state: str) -> int:
    answer = call("GET", "/api/v1/jobs", query={"state": state, "limit": 1,
                                                "withTotalCount": "true"})
    return int(answer.body["totalCount"]) if answer.ok else 0


@bp.get("/")
def home() -> ResponseReturnValue:
    me = g.portal_user.username
    counts = {state.value: _count(state.value) for state in JobState}
    vcs = call("GET", "/api/v1/virtual-clusters")
    mine = call("GET", "/api/v1/jobs", query={"username": me, "limit": RECENT_JOBS})
    waiting_total = counts[JobState.WAITING.value]
    waiting = call("GET", "/api/v1/jobs", query={
        "state": JobState.WAITING.value, "limit": WAITING_SHOWN,
        "offset": pages.oldest_offset(waiting_total, WAITING_SHOWN)})
    idle = call("GET", "/api/v1/idle-gpu-tasks")
    return render_template(
        "home.html", counts=counts,
        idle=idle.body if idle.ok else [], idle_error=None if idle.ok else idle.message,
        now=now_ms(),
        vcs=pages.vc_rows(vcs.body) if vcs.ok else [], vc_error=None if vcs.ok else vcs.message,
        mine=mine.body if mine.ok else [],
        waiting=list(reversed(waiting.body)) if waiting.ok else [])


@bp.get("/jobs")
def job_list() -> ResponseReturnValue:
    args = request.args
    filters = {"username": args.get("username", "").strip(), "vc": args.get("vc", "").strip(),
               "state": args.get("state", "").strip(), "keyword": args.get("keyword", "").strip()}
    paging = pages.paging_of(args)
    sort, descending = pages.sort_of(args)  # the API sorts the whole list, every page
    answer = call("GET", "/api/v1/jobs", query={
        **{k: v for k, v in filters.items() if v}, "offset": paging.offset,
        "limit": paging.size, "withTotalCount": "true", "sort": sort,
        "order": "desc" if descending else "asc"})
    rows: list[dict[str, Any]] = []
    error = None
    if answer.ok:
        paging = pages.Paging(paging.page, paging.size, int(answer.body["totalCount"]))
        rows = answer.body["data"]
    else:
        error = answer.message
    return render_template("jobs.html", rows=rows, error=error, filters=filters,
                           paging=paging, sort=sort, descending=descending, now=now_ms(),
                           states=[s.value for s in JobState], sizes=pages.PAGE_SIZES,
                           here=request.full_path.rstrip("?"))


def _stop(username: str, name: str) -> Answer:
    return call("PUT", _job_path(username, name, "/executionType"),
                json_body={"value": "STOP"})


@bp.post("/jobs/stop")
def stop_many() -> ResponseReturnValue:
    picked = request.form.getlist("job")
    if not picked:
        flash("No job was selected.", "error")
    for text in picked:
        ref = pages.job_ref(text)
        if ref is None:
            flash(f"{text}: not a job (user/name)", "error")
            continue
        answer = _stop(*ref)
        flash(f"{text}: stop requested" if answer.ok else f"{text}: {answer.message}",
              "info" if answer.ok else "error")
    return redirect(pages.local_target(request.form.get("next"), url_for("portal.job_list")))


@bp.get("/jobs/<username>/<name>")
def job_page(username: str, name: str) -> ResponseReturnValue:
    answer = call("GET", _job_path(username, name))
    if not answer.ok:
        return render_template("error.html", status=answer.status,
                               message=answer.message), answer.status
    config = call("GET", _job_path(username, name, "/config"))
    shown = None
    if config.ok:
        shown = yaml.safe_dump(config.body, sort_keys=False) \
            if config.body.get("protocolVersion") in (2, "2") \
            else json.dumps(config.body, indent=2)
    job = answer.body
    mine = g.portal_user.admin or g.portal_user.username == username
    debug = pages.debug_commands(job, username, g.portal_user.username,
                                 pages.asks_for_ssh(config.body if config.ok else None)) \
        if mine else []
    return render_template("job.html", job=job, username=username, status=job["jobStatus"],
                           debug=debug,
                           final=JobState(job["jobStatus"]["state"]).is_final,
                           config=shown, config_error=None if config.ok else config.message,
                           may_act=mine, name=name,
                           # the proxy lets a browser in as the job's owner only
                           may_open_ports=g.portal_user.username == username,
                           output_dir=_output_dir(config.body) if config.ok else None,
                           usage=_usage(username, name, job["jobStatus"]["attemptIndex"])
                           if mine else None,
                           chart_size=(pages.CHART_WIDTH, pages.CHART_HEIGHT))


def _output_dir(config: Any) -> str | None:
    """The job's outputDir when it is a folder of the storage (not an hdfs://
    URI nor a path outside every root), for a link to the storage browser."""
    found = config.get("outputDir") if isinstance(config, dict) else None
    unmounted = config.get(UNMOUNTED_KEY) or () if isinstance(config, dict) else ()
    if not isinstance(found, str) or not found.startswith("/") or "outputDir" in unmounted:
        return None
    return found


def _usage(username: str, name: str, attempt: int) -> pages.Usage | None:
    """The job's use over time: Prometheus' when configured, else the
    monitor's samples (the API decides and says which); None when the API
    refuses (not the owner or an admin)."""
    answer = call("GET", _job_path(username, name, "/metrics"), query={"attempt": attempt})
    return pages.usage_of(answer.body) if answer.ok else None


@bp.get("/jobs/<username>/<name>/usage")
def job_usage(username: str, name: str) -> ResponseReturnValue:
    """The charts alone, as the job page shows them: its script redraws them
    from here while the job runs."""
    job = call("GET", _job_path(username, name))
    if not job.ok:
        return render_template("error.html", status=job.status,
                               message=job.message), job.status
    usage = _usage(username, name, job.body["jobStatus"]["attemptIndex"])
    if usage is None:
        return render_template("error.html", status=403,
                               message=f"only {username} or an admin may see its use"), 403
    return render_template("_usage.html", usage=usage, username=username, name=name,
                           chart_size=(pages.CHART_WIDTH, pages.CHART_HEIGHT))


@bp.post("/jobs/<username>/<name>/stop")
def stop_one(username: str, name: str) -> ResponseReturnValue:
    answer = _stop(username, name)
    flash("Stop requested." if answer.ok else answer.message,
          "info" if answer.ok else "error")
    return redirect(url_for("portal.job_page", username=username, name=name))


@bp.get("/jobs/<username>/<name>/tasks/<role>/<int:index>/log")
@takes_query(query_of(tasklogs.task_log))  # it loads the declaration of the endpoint served
def task_log(username: str, name: str, role: str, index: int) -> ResponseReturnValue:
    """The API's log view itself (text, or followed as server-sent events),
    for the session's user: an EventSource cannot send a bearer token."""
    return tasklogs.task_log(username, name, role, index)


def _examples_dir() -> Path | None:
    for candidate in (Path(__file__).resolve().parents[2] / "examples",
                      Path(sys.prefix) / "examples"):
        if candidate.is_dir():
            return candidate
    return None


def _example(key: str) -> str:
    folder = _examples_dir()
    path = folder / EXAMPLES[key] if folder else None
    if path is None or not path.is_file():
        return ""
    return path.read_text(encoding="utf-8")


@bp.get("/submit")
def submit_page() -> ResponseReturnValue:
    text, source = "", ""
    clone = request.args.get("clone", "")
    if clone:
        ref = pages.job_ref(clone)
        answer = call("GET", _job_path(*ref, "/config")) if ref else None
        if answer is not None and answer.ok:
            text, source = pages.clone_text(answer.body), f"a copy of {clone}"
        else:
            flash(f"cannot clone {clone}: "
                  f"{answer.message if answer else 'not a job (user/name)'}", "error")
    if not text:
        key = request.args.get("example", DEFAULT_EXAMPLE)
        key = key if key in EXAMPLES else DEFAULT_EXAMPLE
        text = _example(key)
        source = f"the example {EXAMPLES[key]}" if text else \
            "nothing: this installation has no examples/ folder"
    return render_template("submit.html", text=text, source=source, examples=EXAMPLES,
                           result=None, error=None, fields=[])


@bp.post("/submit")
def submit() -> ResponseReturnValue:
    text = request.form.get("config", "")
    upload = request.files.get("file")
    if upload is not None and upload.filename:
        raw = upload.read()
        if raw.strip():
            text = raw.decode("utf-8", errors="replace")
    dry = request.form.get("action") == "dryrun"
    answer = call("POST", "/api/v1/jobs", data=text.encode("utf-8"), content_type="text/yaml",
                  query={"dryRun": "true"} if dry else None)
    if answer.status == 202:
        flash(f"Job {answer.body['name']} submitted.")
        return redirect(url_for("portal.job_page", username=answer.body["username"],
                                name=answer.body["name"]))
    if answer.ok:  # a dry run: the config as it would be stored
        shown = json.dumps(answer.body.get("config"), indent=2)
        return render_template("submit.html", text=text, source="your edit",
                               examples=EXAMPLES, result={**answer.body, "shown": shown},
                               error=None, fields=[])
    return render_template("submit.html", text=text, source="your edit", examples=EXAMPLES,
                           result=None, error=answer.message,
                           fields=pages.error_fields(answer.body)), answer.status


@bp.get("/nodes")
def nodes() -> ResponseReturnValue:
    answer = call("GET", "/api/v1/nodes")
    return render_template("nodes.html", nodes=answer.body if answer.ok else [],
                           error=None if answer.ok else answer.message)


@bp.get("/virtual-clusters")
def virtual_clusters() -> ResponseReturnValue:
    answer = call("GET", "/api/v1/virtual-clusters")
    return render_template("vcs.html", vcs=pages.vc_rows(answer.body) if answer.ok else [],
                           error=None if answer.ok else answer.message)
