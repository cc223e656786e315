"""A task's labelled ports through the API: notebooks and dashboards behind the platform.

`/api/v1/user/<u>/jobs/<job>/tasks/<role>/<i>/proxy/<label>/<path>` (and the
same under `/rest-server`) forwards HTTP, and WebSocket upgrades, to the
task's first port of `label` (its `portList` label, or `default`) on its
node, so a user reaches a notebook without network access to the nodes.

Who may: the job's owner and admins, with a bearer token; in a browser the
portal's session cookie logs the caller in instead (auth.SESSION_ENDPOINTS),
and then only the job's owner: the job's pages run on the platform's origin,
so an admin's session must never carry them (docs/security.md).

What the job's server sees: the request as the client sent it, with the
platform's credentials taken out (the bearer token, the portal's session
cookie) and the job's own secret put in (`Authorization: token
<PAI_PROXY_TOKEN>`, shared/state/proxytokens.py); its path is the canonical
`/api/v1/...` one, whichever prefix the client used, so a server told its
base path (`PAI_PROXY_PATH`) serves both; `X-Forwarded-For`, `-Proto`,
`-Prefix` say the rest. Its answer comes back as it is, except hop-by-hop
headers and any cookie named as the portal's session (a job must not set
or clear the platform's login).

Where it connects: the IP and port the platform gave the task (its task
record), a port inside its node's port range, nothing a request names.

Connections (services/api/serving.py's worker model): each proxied request
or WebSocket is a greenlet holding one of this process's proxy slots (503
when they are taken) and one of the user's leases (PAI_PROXY_PER_USER
across every api process, 429 beyond), renewed while bytes flow. An answer
streams through in pieces; a client that does not take a piece within
SEND_SECONDS is cut off, and so is a connection with no byte either way for
PAI_PROXY_IDLE_SECONDS. WebSockets are relayed byte for byte
(services/api/proxyrelay.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

import urllib3
from flask import Blueprint, Response, current_app, g, request
from urllib3.exceptions import HTTPError, NewConnectionError, ProtocolError, ReadTimeoutError
from urllib3.exceptions import TimeoutError as Urllib3Timeout

from services.api import proxyrelay
from services.api.auth import current_user
from services.api.errors import ApiError
from services.api.follows import RENEW_SECONDS, Caps, FollowLeases, Held, _ProcessSlots
from services.api.jobs import get_job_or_404
from services.api.platform import extension_of, platform
from services.launcher.environment import proxy_path
from shared.domain.models import split_job_id
from shared.domain.states import JobState, TaskState
from shared.state import keys, proxytokens

bp = Blueprint("proxy", __name__, url_prefix="/api/v1")
log = logging.getLogger("pai.api")

EXTENSION = "pai.proxy"
BASE = "/user/<username>/jobs/<name>/tasks/<role>/<int:index>/proxy/<label>"
METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
CONNECT_SECONDS = 5.0
SEND_SECONDS = 30.0
CHUNK_BYTES = 64 * 1024
# A proxied body streams through; this bounds one (an upload through a
# notebook), far above the API's own 1 MiB.
MAX_BODY_BYTES = 64 * 1024 * 1024
# The path's fixed parts: "", api, v1, user, U, jobs, N, tasks, R, I, proxy, L.
_FIXED_SEGMENTS = 12


@dataclass(frozen=True)
class Target:
    """Where a proxied request goes, and what it says there."""

    host: str
    port: int
    prefix: str  # the canonical path of the task's label, without a trailing /
    token: str | None  # the job's secret with its servers (proxytokens)


@dataclass
class _Proxy:
    """This process's proxy slots, the users' leases, and the connections to tasks."""

    caps: Caps
    pool: urllib3.PoolManager


def _proxy() -> _Proxy:
    def create() -> _Proxy:
        pai = platform()
        slots = max(1, pai.settings.api_worker_connections // 4)
        timeout = urllib3.Timeout(connect=CONNECT_SECONDS, read=pai.settings.proxy_idle_seconds)
        return _Proxy(Caps(FollowLeases(pai.store, pai.settings.proxy_per_user,
                                        key=keys.proxy_leases),
                           _ProcessSlots(slots), busy=_BUSY, capped=_CAPPED),
                      urllib3.PoolManager(num_pools=64, maxsize=8, block=False, retries=False,
                                          timeout=timeout))

    return extension_of(current_app, EXTENSION, create)


# A request without `Upgrade: websocket` never matches a websocket rule, and
# the other way round (Werkzeug's routing): each path has both.
@bp.route(BASE + "/", methods=["GET"], websocket=True, endpoint="http_root",
          defaults={"path": ""})
@bp.route(BASE + "/<path:path>", methods=["GET"], websocket=True, endpoint="http")
@bp.route(BASE + "/", methods=METHODS, endpoint="http_root", defaults={"path": ""})
@bp.route(BASE + "/<path:path>", methods=METHODS, endpoint="http")
def forward(username: str, name: str, role: str, index: int, label: str,
            path: str) -> Response:
    """HTTP or a WebSocket to a task's labelled port.
    ---
    get:
      summary: A task's labelled port (a notebook, a dashboard), proxied
      description: |
        Every method (also HEAD and OPTIONS) and WebSocket upgrades are
        forwarded to the task's first port of `label` (a `portList` label,
        or `default`) while the task runs: for the job's owner or an admin
        with a bearer token, or the job's owner logged in to the portal (its
        session cookie). The job's server gets `Authorization: token
        <PAI_PROXY_TOKEN>` instead of the caller's credentials, the path
        under `PAI_PROXY_PATH`, and answers as it likes.
      errors: &errors [403, 404, 409, 429, 503, 504]
      responses: &answers {200: {description: "the task's answer"},
                           502: {description: "nothing answers on the task's port"}}
    put: &proxied {summary: "A task's labelled port, proxied", errors: *errors,
                   responses: *answers}
    post: *proxied
    patch: *proxied
    delete: *proxied
    """
    target = _target(username, name, role, index, label)
    state = _proxy()
    caller = current_user().username
    if not proxyrelay.is_upgrade(request.environ):
        return _forward_http(state, target, caller)
    admission = _admit(state, caller)
    try:
        mode = proxyrelay.relay_upgrade(
            request.environ, (target.host, target.port), _upstream_target(target),
            _forward_headers(target), _renewer(admission), session_cookie=_session_cookie(),
            idle_seconds=platform().settings.proxy_idle_seconds, send_seconds=SEND_SECONDS)
    except proxyrelay.Unreachable as error:
        raise ApiError("BadGatewayError", f"nothing answers on the task's port "
                       f"({target.host}:{target.port}): {error}", 502) from None
    finally:
        admission.close()
    return proxyrelay.taken_over(mode)


_BUSY = "this API process proxies as many connections as it may"
_CAPPED = ("{user} already holds {cap} connections through the task port proxy, the most "
           "one user may at once; close one")


def _target(username: str, name: str, role: str, index: int, label: str) -> Target:
    """The running task's port of `label`, or the API's refusal."""
    job = get_job_or_404(username, name, owner_only=True, action="reach the tasks' ports")
    caller = current_user()
    if g.get("via_session") and (caller.username != job.username
                                 or (job.user_id and caller.uid != job.user_id)):
        raise ApiError("ForbiddenUserError", "in a browser only the job's owner may open its "
                       "tasks' ports (its pages would run with your portal login); use the "
                       "API with a token instead", 403)
    store = platform().store
    task = store.get_task(job.id, job.attempt, role, index)
    job_name = split_job_id(job.id)[1]
    if task is None:
        raise ApiError("NoTaskError", f"job {job_name} has no task {role}[{index}]", 404)
    if job.state != JobState.RUNNING or task.state != TaskState.RUNNING \
            or task.node is None or not task.ip:
        raise ApiError("ConflictJobError", f"task {role}[{index}] of job {job_name} is not "
                       f"running (the task is {task.state.value}, the job {job.state.value})",
                       409)
    ports = task.ports.get(label)
    if not ports:
        raise ApiError("NoPortError", f"task {role}[{index}] has no port labelled {label!r} "
                       f"(its labels: {', '.join(sorted(task.ports)) or 'none'})", 404)
    node = store.get_node(task.node)
    low, high = node.port_range if node is not None else (1, 0)
    if not low <= ports[0] <= high:  # never: the scheduler gives ports from the range
        log.error("refusing to proxy to %s:%d, outside node %s's port range", task.ip,
                  ports[0], task.node)
        raise ApiError("BadGatewayError", "the task's port is not one the platform gave", 502)
    return Target(task.ip, ports[0],
                  f"{proxy_path(job.username, job_name, role, index)}/{quote(label, safe='')}",
                  proxytokens.read_token(store.r, job.id))


def _renewer(held: Held) -> Callable[[], None]:
    """A call that renews the lease, at most every RENEW_SECONDS."""
    renewed = [time.monotonic()]

    def renew() -> None:
        now = time.monotonic()
        if now - renewed[0] >= RENEW_SECONDS:
            renewed[0] = now
            held.renew()

    return renew


def _session_cookie() -> str:
    return str(current_app.config.get("SESSION_COOKIE_NAME") or "session")


def _upstream_target(target: Target) -> str:
    """The path and query the task's server gets: the canonical prefix and
    the rest of the path exactly as the client sent it (still encoded)."""
    raw = request.environ.get("RAW_URI") or request.environ.get("REQUEST_URI") or ""
    split = urlsplit(raw)
    raw_path = split.path if raw else quote(request.path)
    script_root = request.script_root
    if script_root and raw_path.startswith(script_root + "/"):
        raw_path = raw_path[len(script_root):]
    parts = raw_path.split("/", _FIXED_SEGMENTS)
    rest = parts[_FIXED_SEGMENTS] if len(parts) > _FIXED_SEGMENTS else ""
    query = split.query if raw else request.query_string.decode("latin-1")
    return f"{target.prefix}/{rest}" + (f"?{query}" if query else "")


def _forward_headers(target: Target) -> list[tuple[str, str]]:
    """The client's headers for the task's server: the platform's
    credentials out, the job's secret and the forwarding headers in."""
    headers = proxyrelay.request_headers(request.headers.items(), _session_cookie())
    if target.token:
        headers.append(("Authorization", f"token {target.token}"))
    forwarded_for = request.headers.get("X-Forwarded-For")
    client = request.remote_addr or ""
    headers += [
        ("X-Forwarded-For", f"{forwarded_for}, {client}" if forwarded_for else client),
        ("X-Forwarded-Proto", request.scheme),
        ("X-Forwarded-Prefix", f"{request.script_root}{target.prefix}"),
    ]
    return headers


def _forward_http(state: _Proxy, target: Target, caller: str) -> Response:
    """One request to the task's server, its answer streamed back."""
    kept = _admit(state, caller)
    try:
        request.max_content_length = MAX_BODY_BYTES
        has_body = bool(request.content_length or request.headers.get("Transfer-Encoding"))
        upstream = state.pool.urlopen(
            request.method, f"http://{target.host}:{target.port}{_upstream_target(target)}",
            body=request.stream if has_body else None,
            headers=urllib3.HTTPHeaderDict(_forward_headers(target)),
            chunked=has_body and request.content_length is None,
            redirect=False, preload_content=False, decode_content=False,
            assert_same_host=False)
    except (NewConnectionError, ProtocolError) as error:
        kept.close()
        raise ApiError("BadGatewayError", f"nothing answers on the task's port "
                       f"({target.host}:{target.port}): {_reason(error)}", 502) from None
    except (ReadTimeoutError, Urllib3Timeout):
        kept.close()
        raise ApiError("GatewayTimeoutError", "the task's server did not answer in time",
                       504) from None
    except HTTPError as error:
        kept.close()
        raise ApiError("BadGatewayError", f"the task's server failed: {_reason(error)}",
                       502) from None
    except BaseException:
        kept.close()
        raise
    response = Response(_body(upstream, _renewer(kept)), status=upstream.status,
                        headers=proxyrelay.response_headers(upstream.headers.items(),
                                                            _session_cookie()))
    response.call_on_close(kept.close)  # (a direct_passthrough answer would never call it)
    proxyrelay.limit_sends(request.environ, SEND_SECONDS, response)
    return response


def _admit(state: _Proxy, caller: str) -> Held:
    """A slot and a lease, held until the connection ends (a streamed
    answer's close, a WebSocket's end), or the refusal: 503 when this process
    proxies as many connections as it may, 429 past the user's PAI_PROXY_PER_USER."""
    return state.caps.hold(caller)


def _body(upstream: Any, renew: Callable[[], None]) -> Iterator[bytes]:
    """The task's answer in pieces as they come; a break ends it there."""
    try:
        for chunk in upstream.stream(CHUNK_BYTES, decode_content=False):
            yield chunk
            renew()
    except (ProtocolError, ReadTimeoutError, OSError) as error:
        log.info("a proxied answer broke off: %s", _reason(error))
    finally:
        upstream.release_conn()


def _reason(error: Exception) -> str:
    reason = getattr(error, "reason", None) or error
    return str(reason).split(": ", 1)[-1][:200]
