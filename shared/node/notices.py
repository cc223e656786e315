"""Put a notice into a task's container and signal it: the launcher's
preemption warning and the monitor's fence both go this way.

A job may poll for its notice, so the notice appears whole or not at all:
the engine extracts an archive entry by creating the file and then copying
its bytes in, so the text goes first under a hidden name (`.<name>.next`
beside it) and the real name is a hard link to it, the archive's second
entry. A reader sees no file, the last notice or the new one, never part of
one.
"""

from __future__ import annotations

import contextlib
import io
import logging
import tarfile
import time
from typing import Any

from docker.errors import APIError, NotFound

log = logging.getLogger(__name__)


def notice_archive(path: str, text: str) -> bytes:
    """A tar for `put_archive("/")` that writes `text` at the absolute `path`
    whole: the bytes under the hidden staging name, then `path` linked to it."""
    folder, _, name = path.rpartition("/")
    folder = folder.strip("/")
    staged = f"{folder}/.{name}.next" if folder else f".{name}.next"
    data = text.encode()
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        info = tarfile.TarInfo(staged)
        info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
        tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo(f"{folder}/{name}" if folder else name)
        link.type, link.linkname, link.mode, link.mtime = (tarfile.LNKTYPE, staged, 0o644,
                                                           info.mtime)
        tar.addfile(link)
    return archive.getvalue()


def put_text(container: Any, path: str, text: str) -> bool:
    """Write `text` at the absolute `path` in the container (its folder made as
    needed), whole (see the module's doc). False when the container is gone;
    an engine's refusal (the job made the path unwritable) is logged and is
    not the caller's failure."""
    try:
        container.put_archive("/", notice_archive(path, text))
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
