"""An exec's exit code, once Docker has it.

Docker closes an exec's output when its process ends, but records the exit
code a moment later: an inspect in between says `Running: true` and
`ExitCode: null` (moby's exec and the SDK's `exec_run` both show it). Whoever
reads the code right after the output ends polls for it here, within a
bound, rather than taking that null for a failure.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Protocol

EXIT_WAIT_SECONDS = 5.0  # past the end of the output; far beyond a healthy engine's delay
POLL_SECONDS = 0.05


class Inspects(Protocol):
    """What answers an exec's inspect: the SDK's APIClient, or the launcher's
    EngineCalls (shared/node/engine.py)."""

    def exec_inspect(self, exec_id: str) -> Mapping[str, Any]: ...


def exit_code(api: Inspects, exec_id: str, within: float = EXIT_WAIT_SECONDS) -> int | None:
    """The exec's exit code once Docker records it; None if it has not
    within `within` seconds (the exec still runs, or the engine is stuck)."""
    deadline = time.monotonic() + within
    while True:
        info = api.exec_inspect(exec_id)
        code = info.get("ExitCode")
        if not info.get("Running") and code is not None:
            return int(code)
        if time.monotonic() >= deadline:
            return None
        time.sleep(POLL_SECONDS)
