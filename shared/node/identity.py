"""This machine's identity as a node agent: its Docker engine's id.

The node's launcher and monitor talk to the same engine and so share it;
another machine's engine has another (each engine makes its id once, in its
data root). docs/multi-node.md: a machine cloned with its engine's data
root must have that id reset (remove the engine's `engine-id` file).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from docker.errors import DockerException
from requests.exceptions import RequestException

log = logging.getLogger(__name__)

ENGINE_WAIT_SECONDS = 2.0


def engine_identity(client: Any, stop: threading.Event) -> str | None:
    """The Docker engine's id, waiting for the engine to answer; None when
    stopped first."""
    while not stop.is_set():
        try:
            identity = str(client.info().get("ID") or "")
            if identity:
                return identity
            log.error("the Docker engine reports no ID: cannot tell this machine apart")
        except (DockerException, RequestException) as error:
            log.warning("waiting for the Docker engine: %s", error)
        stop.wait(ENGINE_WAIT_SECONDS)
    return None
