"""A job's SSH key pair in Redis: kept before the job is written, taken back
if the submit loses, read by the launcher and the API's `ssh` view.

The key lives under keys.job_ssh_key and nowhere else (shared/domain/ssh.py
says why: never in the job record or config, never shown back).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from shared.domain.ssh import KeyPair, SshAccess, generate, key_comment, pair_of
from shared.state import keys, scripts


def store_key(r: Any, job_id: str, pair: KeyPair) -> bool:
    """Keep the job's private key, written before the job itself so no
    launcher finds the job without it. SET NX: True when this call stored
    it; False when the job's key is there already (a submit sent again, or
    another job of that name, which keeps its own)."""
    return bool(r.set(keys.job_ssh_key(job_id), pair.private_key, nx=True))


def discard_key(r: Any, job_id: str, pair: KeyPair) -> None:
    """Undo `store_key` for a submit that stored no job (409, a changed VC)."""
    scripts.run(r, scripts.DISCARD_SSH_KEY, [keys.job_ssh_key(job_id)], [pair.private_key])


def read_key(r: Any, job_id: str) -> KeyPair | None:
    raw = r.get(keys.job_ssh_key(job_id))
    if not raw:
        return None
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    return pair_of(text, key_comment(job_id))


@contextmanager
def key_kept(r: Any, job_id: str, access: SshAccess | None) -> Iterator[None]:
    """Around a submit's write: a job that wants the platform's key pair has
    it stored first (`store_key`), and if the write fails (409, a changed VC,
    a lost connection) the key it stored is taken back (`discard_key`)."""
    if access is None or not access.job_key:
        yield
        return
    pair = generate(key_comment(job_id))
    stored = store_key(r, job_id, pair)
    try:
        yield
    except BaseException:
        if stored:
            discard_key(r, job_id, pair)
        raise
