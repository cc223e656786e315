"""Times, durations and sizes the way a person reads them in a table."""

from __future__ import annotations

import time
from datetime import datetime

NONE = "-"


def now_ms() -> int:
    return int(time.time() * 1000)


def format_time(epoch_ms: int | None, *, seconds: bool = True) -> str:
    """Local date and time (to the second, or the minute); '-' when unknown."""
    if not epoch_ms:
        return NONE
    pattern = "%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M"
    return datetime.fromtimestamp(epoch_ms / 1000).strftime(pattern)


def format_duration(seconds: float | None) -> str:
    """'0s', '45s', '3m05s', '2h03m', '4d02h': two units at most."""
    if seconds is None:
        return NONE
    total = max(0, int(seconds))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def elapsed(start_ms: int | None, end_ms: int | None, now: int | None = None) -> str:
    """How long from start to end (or to now while it goes on)."""
    if not start_ms:
        return NONE
    end = end_ms or (now if now is not None else now_ms())
    return format_duration((end - start_ms) / 1000)


def ago(epoch_ms: int | None, now: int | None = None) -> str:
    if not epoch_ms:
        return NONE
    return format_duration(((now if now is not None else now_ms()) - epoch_ms) / 1000) + " ago"


def format_mb(mb: int | None) -> str:
    if mb is None:
        return NONE
    return f"{mb / 1024:.1f}G" if mb >= 1024 else f"{mb}M"


def format_ports(ports: dict[str, object] | None) -> str:
    """{"default": 21000, "http": "21001,21002"} -> 'default=21000 http=21001,21002'."""
    if not ports:
        return NONE
    return " ".join(f"{label}={value}" for label, value in ports.items())


def format_gpus(gpus: list[int] | None) -> str:
    return ",".join(str(g) for g in gpus) if gpus else NONE
