"""This machine's identity as a node agent: its Docker engine's id and its
address on the cluster network, `<engine id>@<node IP>`.

The node's launcher and monitor talk to the same engine from the same
address, so they share it; another machine differs in one or both. The
engine's id alone is not enough: Docker 20.10 derives it from
/etc/docker/key.json, which machines cloned from one image share (and so do
engines started on one machine). A machine whose address changes (a new
DHCP lease) must wait for its old lease to run out before it holds its name
again.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from docker.errors import DockerException
from requests.exceptions import RequestException

log = logging.getLogger(__name__)

ENGINE_WAIT_SECONDS = 2.0


def engine_identity(client: Any, node_ip: str, stop: threading.Event) -> str | None:
    """The machine's identity, waiting for the engine to answer; None when
    stopped first."""
    while not stop.is_set():
        try:
            identity = str(client.info().get("ID") or "")
            if identity:
                return f"{identity}@{node_ip}"
            log.error("the Docker engine reports no ID: cannot tell this machine apart")
        except (DockerException, RequestException) as error:
            log.warning("waiting for the Docker engine: %s", error)
        stop.wait(ENGINE_WAIT_SECONDS)
    return None
