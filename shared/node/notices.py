"""Put a notice into a task's container and signal it: the launcher's
preemption warning and the monitor's fence both go this way."""

from __future__ import annotations

import contextlib
import io
import logging
import tarfile
import time
from typing import Any

from docker.errors import APIError, NotFound

log = logging.getLogger(__name__)


def put_text(container: Any, path: str, text: str) -> bool:
    """Write `text` at the absolute `path` in the container (its folder made as
    needed). False when the container is gone; an engine's refusal (the job
    made the path unwritable) is logged and is not the caller's failure."""
    folder, _, name = path.rpartition("/")
    data = text.encode()
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        info = tarfile.TarInfo(f"{folder.strip('/')}/{name}")
        info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
        tar.addfile(info, io.BytesIO(data))
    try:
        container.put_archive("/", archive.getvalue())
    except NotFound:
        return False
    except APIError as error:
        explanation = getattr(error, "explanation", None) or error
        log.warning("cannot write %s in %s: %s", path, container.name, explanation)
    return True


def warn_and_signal(container: Any, path: str, text: str, signal: str = "SIGTERM") -> bool:
    """The notice, then the signal (the container's init passes it on).
    False when the container was gone before the notice."""
    if not put_text(container, path, text):
        return False
    with contextlib.suppress(NotFound, APIError):  # exited meanwhile
        container.kill(signal=signal)
    return True
