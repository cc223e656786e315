"""The types of the `PAI_*` settings: each a function from the variable's
name and text (never blank: a blank or unset variable is the setting's
default, shared/infra/config.py `load_settings`) to its value, or a
ConfigError that names the variable and says what it must be.

A reader may answer None for "the default": `count` does, so that `0` is
the default where no count of zero means anything (a port, a pool size).
"""

from __future__ import annotations

import os

from shared.domain.priority import MAX_LAS_QUEUE


class ConfigError(ValueError):
    """A setting is missing or malformed; the message names it."""


TRUE_WORDS = frozenset({"1", "true", "yes", "on"})


def text(name: str, raw: str) -> str:
    """As written (a password keeps its spaces)."""
    return raw


def trimmed(name: str, raw: str) -> str:
    return raw.strip()


def flag(name: str, raw: str) -> bool:
    """1, true, yes or on (any case) is on; anything else is off."""
    return raw.strip().lower() in TRUE_WORDS


def whole(name: str, raw: str) -> int:
    """A whole number, zero or more."""
    try:
        value = int(raw.strip())
    except ValueError:
        raise ConfigError(f"{name} must be an integer, got {raw!r}") from None
    if value < 0:
        raise ConfigError(f"{name} must not be negative, got {value}")
    return value


def count(name: str, raw: str) -> int | None:
    """A whole number of which 0, like blank, means the default."""
    return whole(name, raw) or None


def _number(name: str, raw: str, what: str) -> float:
    try:
        return float(raw.strip())
    except ValueError:
        raise ConfigError(f"{name} must be {what}, got {raw!r}") from None


def seconds(name: str, raw: str) -> float:
    """A positive number of seconds (fractions allowed)."""
    value = _number(name, raw, "a number of seconds")
    if not value > 0:  # NaN too
        raise ConfigError(f"{name} must be positive, got {raw!r}")
    return value


def seconds_or_zero(name: str, raw: str) -> float:
    """Zero (never waits) or a positive number of seconds."""
    value = _number(name, raw, "a number of seconds")
    if not value >= 0:  # NaN too
        raise ConfigError(f"{name} must be 0 or positive, got {raw!r}")
    return value


def percent(name: str, raw: str) -> float:
    value = _number(name, raw, "a percent")
    if not 0 < value <= 100:
        raise ConfigError(f"{name} must be above 0 and at most 100, got {raw!r}")
    return value


def http_url(name: str, raw: str) -> str:
    """An http(s) base URL, its trailing slash dropped."""
    value = raw.strip().rstrip("/")
    if value and (not value.startswith(("http://", "https://")) or len(value) <= 8):
        raise ConfigError(f"{name} must be an http:// or https:// URL, not {value!r}")
    return value


SIZE_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1024, "m": 1000**2, "mb": 1024**2,
              "g": 1000**3, "gb": 1024**3}


def parse_size(name: str, raw: str) -> int:
    """A byte count as Redis's own config spells it (`4gb`, `512mb`, `100000`),
    so PAI_REDIS_MAXMEMORY can be handed to redis-server unchanged."""
    written = raw.strip().lower()
    number = written.rstrip("bkmg")
    unit = written[len(number):]
    if not number.isdigit() or unit not in SIZE_UNITS:
        raise ConfigError(f"{name} must be a size like 4gb, 512mb or 1048576, got {raw!r}")
    return int(number) * SIZE_UNITS[unit]


def port_range(name: str, raw: str) -> tuple[int, int]:
    """`low-high`, both ports, low first."""
    try:
        low_text, high_text = raw.split("-", 1)
        low, high = int(low_text), int(high_text)
    except ValueError:
        raise ConfigError(f"{name} must look like 15000-40000, got {raw!r}") from None
    if not 1 <= low <= high <= 65535:
        raise ConfigError(f"{name} {raw!r} is not a valid port range")
    return low, high


def absolute_paths(name: str, raw: str) -> tuple[str, ...]:
    """Comma-separated absolute paths (`file://` URIs too), normalized."""
    paths = tuple(os.path.normpath(part.strip().removeprefix("file://"))
                  for part in raw.split(",") if part.strip())
    for path in paths:
        if not os.path.isabs(path):
            raise ConfigError(f"{name} entries must be absolute paths, got {path!r}")
    return paths


def absolute_path(name: str, raw: str) -> str:
    path = raw.strip()
    if not os.path.isabs(path):
        raise ConfigError(f"{name} must be an absolute path, got {path!r}")
    return os.path.normpath(path)


def thresholds(name: str, raw: str) -> tuple[int, ...]:
    """Comma-separated, strictly increasing positive whole numbers ("": none,
    one queue for all)."""
    try:
        values = tuple(int(part) for part in raw.split(",") if part.strip())
    except ValueError:
        raise ConfigError(f"{name} must be whole numbers separated by commas, "
                          f"got {raw!r}") from None
    if any(v <= 0 for v in values) or list(values) != sorted(set(values)):
        raise ConfigError(f"{name} must be positive and increasing, got {raw!r}")
    if len(values) > MAX_LAS_QUEUE:
        raise ConfigError(f"{name} takes at most {MAX_LAS_QUEUE} thresholds, got {len(values)}")
    return values


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def log_level(name: str, raw: str) -> str:
    """A level in capitals, WARN spelled WARNING: Celery's --loglevel (which
    the workers pass on) knows only the long name."""
    level = raw.strip().upper()
    level = "WARNING" if level == "WARN" else level
    if level not in LOG_LEVELS:
        raise ConfigError(f"{name} is DEBUG, INFO, WARNING, ERROR or CRITICAL, not {level!r}")
    return level


def engine_files(name: str, raw: str) -> str:
    """`auto`, `off`, or an absolute folder."""
    value = raw.strip()
    if value.lower() in ("auto", "off"):
        return value.lower()
    return absolute_path(name, value)


def log_format(name: str, raw: str) -> str:
    value = raw.strip().lower()
    if value not in ("text", "json"):
        raise ConfigError(f"{name} is text or json, not {value!r}")
    return value


def gpu_groups(raw: str, gpus: int | None) -> tuple[tuple[int, int], ...]:
    """PAI_NODE_GPU_GROUPS: comma-separated index ranges ("0-3,4-7", a single
    index is a group of one), each a topology group of the `gpus` declared
    GPUs (PAI_NODE_VIRTUAL_GPUS, so read after it)."""
    if not raw.strip():
        return ()
    if gpus is None:
        raise ConfigError("PAI_NODE_GPU_GROUPS groups declared GPUs: set PAI_NODE_VIRTUAL_GPUS "
                          "too (real GPUs report their topology through NVML)")
    groups: list[tuple[int, int]] = []
    for part in raw.split(","):
        low_text, _, high_text = part.strip().partition("-")
        try:
            low, high = int(low_text), int(high_text or low_text)
        except ValueError:
            raise ConfigError(f"PAI_NODE_GPU_GROUPS must look like 0-3,4-7, got {raw!r}") \
                from None
        if not 0 <= low <= high < gpus:
            raise ConfigError(f"PAI_NODE_GPU_GROUPS: {part.strip()!r} is not a range of GPU "
                              f"indices 0-{gpus - 1} (PAI_NODE_VIRTUAL_GPUS={gpus})")
        if any(low <= other_high and other_low <= high for other_low, other_high in groups):
            raise ConfigError(f"PAI_NODE_GPU_GROUPS: {part.strip()!r} overlaps another group "
                              f"in {raw!r}")
        groups.append((low, high))
    return tuple(groups)
