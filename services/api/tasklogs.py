"""A task's log: its last lines, or followed as server-sent events while the
task runs; from Redis while the job is live, from the log tree's file once
its finished job was compacted (shared/state/retention.py). Who may read it
is who may read the job's config (services/api/jobs.py `task_asked`).
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Iterator

from flask import Blueprint, Response, current_app, request, stream_with_context

from services.api import sse
from services.api.auth import current_user
from services.api.errors import ApiError
from services.api.follows import RENEW_SECONDS, Follows, Held, follows_of
from services.api.jobs import task_asked
from services.api.loghub import TaskLog
from services.api.platform import platform
from services.api.queries import TaskLogQuerySchema, takes_query
from services.api.schemas import MAX_TAIL
from shared.domain.models import Job
from shared.domain.storage import task_log_parts
from shared.state import logfiles, logstream

bp = Blueprint("tasklogs", __name__, url_prefix="/api/v1")

FOLLOW_MAX_SECONDS = 24 * 3600
KEEPALIVE_SECONDS = 15


@bp.get("/user/<username>/jobs/<name>/tasks/<role>/<int:index>/log")
@takes_query(TaskLogQuerySchema())
def task_log(username: str, name: str, role: str, index: int) -> Response:
    """A task's log: the last lines as text, or followed as server-sent events.
    ---
    get:
      errors: [400, 403, 404]
      responses:
        200:
          content:
            text/plain: {schema: {type: string}}
            text/event-stream: {schema: {type: string}}
    """
    job, query, attempt = task_asked(username, name, role, index, action="read the logs")
    tail = query["tail"]
    log_dir = _filed_in(job, attempt, role, index)
    if log_dir is not None:
        return _filed_log(log_dir, job.id, attempt, role, index, tail, query["follow"])
    if query["follow"]:
        resume = request.headers.get("Last-Event-ID") or None
        if resume is not None and sse.parse_stream_id(resume) is None:
            raise ApiError("BadRequestError", "Last-Event-ID is a log line id like 0-1234")
        return _follow_response(job.id, attempt, role, index, tail, resume)
    text = platform().store.tail_text(job.id, attempt, role, index, tail)
    marker = _dropped_marker(job.id, attempt, role, index, tail)
    return Response(marker + "\n" + text if marker else text, mimetype="text/plain")


def _filed_in(job: Job, attempt: int, role: str, index: int) -> str | None:
    """The log tree, when this task's log has left Redis for its file there
    (its job finished and was compacted: shared/state/retention.py)."""
    store, log_dir = platform().store, platform().settings.task_log_dir
    if not log_dir or not job.state.is_final:
        return None
    archive = store.read_archive(store.r, job.id)
    return log_dir if archive is not None and archive.log_is_filed(attempt, role, index) \
        else None


def _filed_log(log_dir: str, job_id: str, attempt: int, role: str, index: int,
               tail: int, follow: bool) -> Response:
    """A finished task's log from its file, in the shapes the stream gives:
    the last `tail` lines as text, or followed (the tail, then the end: the
    task has ended). A follow's event ids are line numbers (`0-<n>`), so a
    client resuming with Last-Event-ID gets the lines after the one it saw.
    The file says itself where lines were dropped or cut."""
    parts = task_log_parts(job_id, attempt, role, index)
    try:
        if not follow:
            text = "".join(line + "\n" for line in logfiles.tail(log_dir, parts, tail))
            return Response(text, mimetype="text/plain")
        resume = request.headers.get("Last-Event-ID") or None
        if resume is not None and sse.parse_stream_id(resume) is None:
            raise ApiError("BadRequestError", "Last-Event-ID is a log line id like 0-1234")
        ms, _, number = (resume or "").partition("-")
        after = int(number) if resume is not None and int(ms) == 0 else None
        lines = list(itertools.islice(logfiles.numbered_tail(log_dir, parts, tail, after),
                                      MAX_TAIL))
    except OSError as error:
        raise ApiError("LogUnavailableError",
                       f"the log file of {role}[{index}] cannot be read: {error.strerror}",
                       503) from None
    frames = [sse.frame(line, event_id=f"0-{n}") for n, line in lines]
    if not frames:
        frames = [sse.comment("following")]
    return Response([*frames, sse.frame("", event="end")], mimetype="text/event-stream",
                    headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _dropped_marker(job_id: str, attempt: int, role: str, index: int, tail: int) -> str | None:
    """The line that says the log's start was dropped, when the lines asked for
    reach back past what the bounded stream keeps."""
    pai = platform()
    kept, added = pai.store.log_extent(job_id, attempt, role, index)
    if added <= kept or tail <= kept:
        return None
    return (f"[pai: {added - kept} earlier lines dropped; the log keeps the last "
            f"{pai.settings.log_max_lines} lines]")


def _follow_response(job_id: str, attempt: int, role: str, index: int, tail: int,
                     resume: str | None) -> Response:
    """The follow stream, once the caller holds a follow lease (else 429/503).

    The lease goes back before the end event, and when the response closes
    (the server found the client gone): services/api/follows.py.
    """
    follows = follows_of(current_app, platform().settings)
    held = follows.hold(current_user().username)  # or FollowRefused, as any ApiError
    try:
        response = Response(
            stream_with_context(_follow(follows, job_id, attempt, role, index, tail, resume,
                                        held)),
            mimetype="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        response.call_on_close(held.close)
    except BaseException:
        held.close()
        raise
    return response


def _follow(follows: Follows, job_id: str, attempt: int, role: str, index: int, tail: int,
            resume_after: str | None, held: Held) -> Iterator[str]:
    """Server-sent events: the last lines, then new ones until the task ends.

    Each line carries its stream id, so a client that reconnects with
    Last-Event-ID resumes after the last line it saw; a comment every
    KEEPALIVE_SECONDS tells a quiet log from a dead server. Frames come from
    services/api/sse.py, so no line a job prints can start a field or an
    event. New lines come from the process's one reader of this log
    (services/api/loghub.py); this follow joins it before reading its own
    start, and skips what it has sent. It renews its lease as it goes; a
    follow whose lease is gone ends without the end event, so its client
    reconnects and resumes.
    """
    store, hub = follows.store, follows.hub
    feed = hub.join(TaskLog(job_id, attempt, role, index))
    try:
        with feed.cond:
            position = feed.end
        last = resume_after or store.last_log_id(job_id, attempt, role, index)
        sent = False
        if resume_after is None:
            marker = _dropped_marker(job_id, attempt, role, index, tail) if tail else None
            if marker:
                sent = True
                yield sse.frame(marker)
            for entry_id, line in store.read_log(job_id, attempt, role, index, tail=tail):
                sent = True
                last = max(last, entry_id, key=logstream.position)
                yield sse.frame(line, event_id=entry_id)
        if not sent:  # the answer's headers leave with its first bytes: do not wait
            yield sse.comment("following")
        catch_up = True
        deadline = time.monotonic() + FOLLOW_MAX_SECONDS
        quiet_since = time.monotonic()
        # Follows that start together would renew together, all on one user's
        # key: a random first renewal spreads them out.
        renewed = quiet_since - random.uniform(0, RENEW_SECONDS)
        while time.monotonic() < deadline:
            if time.monotonic() - renewed >= RENEW_SECONDS:
                if not held.renew():
                    return
                renewed = time.monotonic()
            with feed.cond:
                if feed.end <= position and not feed.settled and not catch_up:
                    # The reader wakes us for lines and the end; we wake ourselves
                    # only for what is due: the next renewal or keep-alive.
                    now = time.monotonic()
                    feed.cond.wait(timeout=max(0.05, min(renewed + RENEW_SECONDS,
                                                         quiet_since + KEEPALIVE_SECONDS) - now))
                batch, position, dropped = feed.since(position)
                settled = feed.settled
            frames = []
            if catch_up or dropped:  # from Redis: what the feed does not hold for us
                catch_up = False
                frames = [(entry_id, sse.frame(line, event_id=entry_id)) for entry_id, line
                          in store.read_log(job_id, attempt, role, index, after=last)]
            for entry_id, frame in frames + batch:
                if logstream.position(entry_id) > logstream.position(last):
                    last = entry_id
                    quiet_since = time.monotonic()
                    yield frame
            if settled:
                break
            if time.monotonic() - quiet_since >= KEEPALIVE_SECONDS:
                quiet_since = time.monotonic()
                yield sse.comment("keep-alive")
    finally:
        hub.leave(feed)
    held.close()  # before the end event: its client may follow the next log at once
    yield sse.frame("", event="end")
