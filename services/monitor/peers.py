"""Nodes asking each other whether the control plane answers them.

A node that has lost the control plane for its whole lease asks its peers
(shared/domain/lease.py, `fence_action`): one peer in contact means the
fault is this node's, and it fences; most of the cluster cut off alike
means the control plane is down, and it holds.

Each monitor answers `GET /contact?nonce=N` on its peer port with its own
silence, signed with a key only the platform's services know (derived from
the Redis password, which no job container ever receives), so that a job on
the host network cannot answer in a node's name and keep a cut-off node
from fencing. The answer comes from memory: it never waits on Redis or
Docker.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from shared.domain.lease import PeerReport

log = logging.getLogger(__name__)

ASK_TIMEOUT_SECONDS = 2.0
MAX_NONCE = 64
# Peers are asked directly, never through a proxy named in the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def peer_key(redis_url: str) -> bytes:
    """The signing key: a digest of the platform's Redis URL (its password
    with it). Jobs never see that URL (docs/security.md)."""
    return hashlib.sha256(b"pai-peer-contact\0" + redis_url.encode()).digest()


def sign(key: bytes, node: str, silence_ms: int, quiet_ms: int, nonce: str) -> str:
    message = f"{node}\0{silence_ms}\0{quiet_ms}\0{nonce}".encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def answer(key: bytes, node: str, silence_ms: int, quiet_ms: int, nonce: str) -> dict[str, Any]:
    return {"node": node, "silenceMs": silence_ms, "quietAfterMs": quiet_ms, "nonce": nonce,
            "mac": sign(key, node, silence_ms, quiet_ms, nonce)}


def verify(key: bytes, expected_node: str, nonce: str, body: Any) -> PeerReport | None:
    """The peer's report if the body is its signed answer to `nonce`, else None."""
    try:
        node, silence, quiet = body["node"], int(body["silenceMs"]), int(body["quietAfterMs"])
        mac, echoed = str(body["mac"]), str(body["nonce"])
    except (KeyError, TypeError, ValueError):
        return None
    if node != expected_node or echoed != nonce:
        return None
    if not hmac.compare_digest(mac, sign(key, node, silence, quiet, nonce)):
        return None
    return PeerReport(node, silence, quiet)


class PeerServer:
    """The node's answer to its peers, on its own port (PAI_NODE_PEER_PORT)."""

    def __init__(self, host: str, port: int, node: str, key: bytes,
                 silence: Callable[[], tuple[int, int]], *, advertised: str = "") -> None:
        """Listen on `host`:`port` (0: any free port); peers are told to ask
        at `advertised` (the node's IP; default `host`) on the port it got.
        `silence` gives (this node's silence, its quiet-after) in ms."""
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urlsplit(self.path)
                nonce = (parse_qs(url.query).get("nonce") or [""])[0][:MAX_NONCE]
                if url.path != "/contact" or not nonce:
                    self.send_error(404)
                    return
                quiet, after = silence()
                body = json.dumps(answer(key, node, quiet, after, nonce)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("peer request: " + format, *args)

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.address = f"{advertised or host}:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True,
                                        name="pai-monitor-peers")
        outer._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def ask(key: bytes, node: str, address: str, timeout: float = ASK_TIMEOUT_SECONDS
        ) -> PeerReport:
    """One peer's report; silence None when it does not answer credibly."""
    nonce = secrets.token_hex(16)
    try:
        with _OPENER.open(f"http://{address}/contact?nonce={nonce}",
                          timeout=timeout) as reply:
            body = json.loads(reply.read(4096))
    except (OSError, ValueError, urllib.error.URLError) as error:
        log.debug("peer %s (%s) did not answer: %s", node, address, error)
        return PeerReport(node, None)
    report = verify(key, node, nonce, body)
    if report is None:
        log.warning("peer %s (%s) answered without a valid signature: ignored", node, address)
        return PeerReport(node, None)
    return report


def ask_all(key: bytes, peers: Sequence[tuple[str, str]]) -> list[PeerReport]:
    """Every peer's report, asked at once."""
    if not peers:
        return []
    with ThreadPoolExecutor(min(len(peers), 16), thread_name_prefix="peer-ask") as pool:
        return list(pool.map(lambda p: ask(key, p[0], p[1]), peers))
