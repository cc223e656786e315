"""Following a job to its end, and the exit code a script sees for it."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

FINAL_STATES = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})
EXIT_STOPPED = 130  # as a shell reports a process ended by Ctrl-C
EXIT_TIMEOUT = 124  # as timeout(1) does
FIRST_POLL_S = 0.25
MAX_POLL_S = 2.0


class WaitTimeout(Exception):
    def __init__(self, status: Mapping[str, Any]) -> None:
        super().__init__("timed out")
        self.status = status


def exit_code_for(job_status: Mapping[str, Any]) -> int:
    """0 when SUCCEEDED, 130 when STOPPED, else the app's exit code (1 if none or 0)."""
    state = job_status.get("state")
    if state == "SUCCEEDED":
        return 0
    if state == "STOPPED":
        return EXIT_STOPPED
    code = job_status.get("appExitCode")
    if isinstance(code, int) and not isinstance(code, bool) and 1 <= code <= 255:
        return code
    return 1


def wait_until_final(fetch: Callable[[], dict[str, Any]], *,
                     on_poll: Callable[[dict[str, Any]], None] = lambda _: None,
                     timeout: float | None = None,
                     sleep: Callable[[float], None] = time.sleep,
                     clock: Callable[[], float] = time.monotonic) -> dict[str, Any]:
    """Poll `fetch` (a job detail) until the job is final; the last detail.

    Polls quickly at first (short jobs end in a second or two), then backs off."""
    deadline = None if timeout is None else clock() + timeout
    interval = FIRST_POLL_S
    while True:
        detail = fetch()
        on_poll(detail)
        if detail["jobStatus"]["state"] in FINAL_STATES:
            return detail
        if deadline is not None and clock() >= deadline:
            raise WaitTimeout(detail["jobStatus"])
        pause = interval if deadline is None else max(0.0, min(interval, deadline - clock()))
        sleep(pause)
        interval = min(MAX_POLL_S, interval * 1.5)


def final_line(name: str, job_status: Mapping[str, Any]) -> str:
    """'job hello SUCCEEDED', 'job x FAILED (exit code 3): <why>'."""
    state = job_status.get("state")
    line = f"job {name} {state}"
    if state == "FAILED":
        line += f" (exit code {job_status.get('appExitCode')})"
    why = job_status.get("appExitDiagnostics")
    if state != "SUCCEEDED" and why:
        line += f": {why}"
    return line
