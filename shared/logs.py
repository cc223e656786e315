"""One logging setup for every service, so `.run/*.log` read alike: the level
from PAI_LOG_LEVEL, and plain lines or, with PAI_LOG_FORMAT=json, one JSON
object per line for log collectors (Loki, Elasticsearch, Cloud Logging)."""

from __future__ import annotations

import json
import logging
import sys


class JsonLines(logging.Formatter):
    """A record as one JSON object: time, service, level, logger, message
    (and the traceback, if any). A message's newlines stay inside the string,
    so one record is always one line."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        entry = {"time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}",
                 "service": self.service, "level": record.levelname, "logger": record.name,
                 "message": record.getMessage()}
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def formatter(service: str, fmt: str = "text") -> logging.Formatter:
    if fmt == "json":
        return JsonLines(service)
    return logging.Formatter(f"%(asctime)s {service} %(levelname)s %(name)s: %(message)s")


def setup_logging(service: str, level: str = "INFO", fmt: str = "text") -> None:
    """The root logger at `level`, writing to stderr in `fmt` ("text" or "json")."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(service, fmt))
    logging.basicConfig(level=level, handlers=[handler])
