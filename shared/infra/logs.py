"""One logging setup for every service, so `.run/*.log` read alike: the level
from PAI_LOG_LEVEL, and plain lines or, with PAI_LOG_FORMAT=json, one JSON
object per line for log collectors (Loki, Elasticsearch, Cloud Logging).

The setup is one `logging.config` dictionary (`logging_config`): the services
apply it, and the API hands the same dictionary to gunicorn (`logconfig_dict`),
whose error and access loggers would otherwise keep handlers and a format of
their own and ignore PAI_LOG_FORMAT."""

from __future__ import annotations

import json
import logging
import logging.config
from typing import Any

# gunicorn's own loggers: routed through the root handler, at the same level.
GUNICORN_LOGGERS = ("gunicorn.error", "gunicorn.access")
# Celery's two lines for every message a worker handles ("received", "succeeded
# in 0.003 s"): below DEBUG they say nothing the services' own lines do not, and
# writing them was a tenth of a launcher's CPU per task start. A task that
# fails is still logged, at ERROR.
CELERY_PER_MESSAGE_LOGGERS = ("celery.worker.strategy", "celery.app.trace")


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


def logging_config(service: str, level: str = "INFO", fmt: str = "text") -> dict[str, Any]:
    """The root logger at `level`, writing to stderr in `fmt` ("text" or "json");
    gunicorn's loggers hand their records to it, at the same level."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"pai": {"()": formatter, "service": service, "fmt": fmt}},
        "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "pai",
                                "stream": "ext://sys.stderr"}},
        "root": {"level": level, "handlers": ["stderr"]},
        "loggers": {
            **{name: {"level": level, "handlers": [], "propagate": True}
               for name in GUNICORN_LOGGERS},
            **{name: {"level": _celery_level(level), "handlers": [], "propagate": True}
               for name in CELERY_PER_MESSAGE_LOGGERS},
        },
    }


def _celery_level(level: str) -> str:
    """`level` at DEBUG and above WARNING, else WARNING."""
    number = logging.getLevelName(level)
    if not isinstance(number, int) or logging.DEBUG < number < logging.WARNING:
        return "WARNING"
    return level


def setup_logging(service: str, level: str = "INFO", fmt: str = "text") -> None:
    """Apply `logging_config`: every service's run.py calls this first.

    The Celery workers (scheduler, launcher) would then set the root level
    from their --loglevel and give `celery.task` a handler in Celery's own
    format; a receiver of Celery's `setup_logging` signal tells a worker that
    logging is already set up, so this setup stays the only one."""
    logging.config.dictConfig(logging_config(service, level, fmt))
    from celery import signals  # here: the API imports it only after gevent's patching

    signals.setup_logging.connect(leave_logging_alone, weak=False, dispatch_uid=__name__)


def leave_logging_alone(**_: Any) -> None:
    """Celery's `setup_logging` receiver: with one connected, Celery configures
    no logger of its own."""
