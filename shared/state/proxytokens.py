"""The secret between the task port proxy and a job's servers.

Jobs share their nodes' network, so a notebook a task serves on its port is
reachable by every other job on the cluster, not only through the API's
proxy (services/api/proxy.py), which lets in only the job's owner and
admins. Each job therefore gets a random secret: its tasks find it in
PAI_PROXY_TOKEN, and the proxy sends it with every request it forwards
(`Authorization: token <secret>`, the form Jupyter reads). A server that
asks for it (Jupyter's `--IdentityProvider.token=$PAI_PROXY_TOKEN`) answers
the proxy and nobody else on the network.

Made by the launcher when it first starts one of the job's tasks (SET NX
GET, one round trip: every task of the job gets the same one), read by the
API for each proxied request, removed with the job (retention.job_keys,
compaction).
"""

from __future__ import annotations

import secrets
from typing import Any

from shared.state import keys

TOKEN_BYTES = 24


def ensure_token(r: Any, job_id: str) -> str:
    """The job's secret, made now if it has none (idempotent), in one round
    trip: the secret there was, else the one this call set."""
    fresh = secrets.token_urlsafe(TOKEN_BYTES)
    return _text(r.set(keys.job_proxy_token(job_id), fresh, nx=True, get=True)) or fresh


def read_token(r: Any, job_id: str) -> str | None:
    return _text(r.get(keys.job_proxy_token(job_id)))


def _text(raw: Any) -> str | None:
    """A stored secret as text, whatever the client decodes (None: none)."""
    if not raw:
        return None
    return raw.decode() if isinstance(raw, bytes) else str(raw)
