"""The one logging setup (shared/infra/logs.py) and its settings."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from datetime import timedelta
from types import SimpleNamespace

import pytest
from celery import Celery, signals
from celery.app.log import Logging as CeleryLogging
from celery.bin.base import LOG_LEVEL
from gunicorn.config import Config
from gunicorn.glogging import Logger

from services.api.serving import RedactingLogger, gunicorn_options, redact_query
from shared.infra.config import ConfigError, load_settings
from shared.infra.logs import GUNICORN_LOGGERS, formatter, leave_logging_alone, setup_logging


def record(message: str, exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError("boom")
        except ValueError:
            exc_info = sys.exc_info()
    return logging.LogRecord("pai.test", logging.WARNING, __file__, 1, message, None, exc_info)


def test_json_lines_are_one_object_per_record_even_with_newlines() -> None:
    line = formatter("monitor", "json").format(record("two\nlines", exc=True))
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["service"] == "monitor" and entry["level"] == "WARNING"
    assert entry["logger"] == "pai.test" and entry["message"] == "two\nlines"
    assert "ValueError: boom" in entry["exception"]


def test_text_lines_name_the_service() -> None:
    assert " scheduler WARNING pai.test: hello" in formatter("scheduler").format(record("hello"))


@pytest.mark.parametrize(("env", "level", "fmt"), [
    ({}, "INFO", "text"),
    ({"PAI_LOG_LEVEL": "debug", "PAI_LOG_FORMAT": "JSON"}, "DEBUG", "json"),
    ({"PAI_LOG_LEVEL": " warn "}, "WARNING", "text"),
], ids=["defaults", "case-folded", "warn-is-warning"])
def test_log_settings(env: dict[str, str], level: str, fmt: str) -> None:
    settings = load_settings(env)
    assert (settings.log_level, settings.log_format) == (level, fmt)


@pytest.mark.parametrize("env", [{"PAI_LOG_FORMAT": "xml"}, {"PAI_LOG_LEVEL": "loud"}],
                         ids=["format", "level"])
def test_bad_log_settings_stop_start_up(env: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="PAI_LOG_"):
        load_settings(env)


@pytest.mark.parametrize("level", ["debug", "info", "warn", "warning", "error", "critical"])
def test_every_accepted_level_is_one_celery_workers_accept(level: str) -> None:
    """The scheduler and launcher pass PAI_LOG_LEVEL to Celery's --loglevel,
    which refuses what it does not know (WARN): a level the settings accept
    must not stop a worker at start-up."""
    LOG_LEVEL.convert(load_settings({"PAI_LOG_LEVEL": level}).log_level, None, None)


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """These tests configure the process's loggers (and Celery's logging
    signal): put them back afterwards."""
    loggers = [logging.getLogger(), *(logging.getLogger(name)
                                      for name in (*GUNICORN_LOGGERS, "celery.task"))]
    saved = [(logger, logger.level, list(logger.handlers), logger.propagate)
             for logger in loggers]
    already_setup = CeleryLogging._setup
    yield
    CeleryLogging._setup = already_setup
    signals.setup_logging.disconnect(leave_logging_alone, dispatch_uid="shared.infra.logs")
    for logger, level, handlers, propagate in saved:
        logger.setLevel(level)
        logger.handlers[:] = handlers
        logger.propagate = propagate


@pytest.mark.usefixtures("restore_logging")
def test_a_celery_worker_keeps_the_one_setup() -> None:
    """What a worker does at start (`--loglevel INFO`) changes neither the
    root level, nor its handler, nor adds a Celery-format task handler."""
    setup_logging("launcher", "WARNING", "json")
    root = logging.getLogger()
    handlers = list(root.handlers)
    # Compared with before, not with none: a worker started earlier in this
    # process (another test's) may have left celery.task handlers of its own.
    task_handlers = list(logging.getLogger("celery.task").handlers)
    CeleryLogging._setup = False
    Celery("probe", set_as_current=False).log.setup(loglevel="INFO")
    assert root.level == logging.WARNING and root.handlers == handlers
    assert logging.getLogger("celery.task").handlers == task_handlers


def emitted(err: str) -> list[str]:
    return [line for line in err.splitlines() if line]


@pytest.mark.parametrize(("level", "shown"), [
    ("DEBUG", ["debug", "info", "warning"]),
    ("INFO", ["info", "warning"]),
    ("WARNING", ["warning"]),
    ("WARN", ["warning"]),
    ("ERROR", []),
], ids=["debug", "info", "warning", "warn", "error"])
@pytest.mark.usefixtures("restore_logging")
def test_the_level_decides_what_every_logger_writes(
        level: str, shown: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    setup_logging("scheduler", level, "json")
    for name in ("pai.scheduler", "gunicorn.error", "gunicorn.access"):
        log = logging.getLogger(name)
        log.debug("debug")
        log.info("info")
        log.warning("warning")
    entries = [json.loads(line) for line in emitted(capsys.readouterr().err)]
    for name in ("pai.scheduler", "gunicorn.error", "gunicorn.access"):
        assert [e["message"] for e in entries if e["logger"] == name] == shown, name


@pytest.mark.parametrize(("level", "shown"), [
    ("DEBUG", ["debug", "info", "warning", "error"]),
    ("INFO", ["warning", "error"]),
    ("WARNING", ["warning", "error"]),
    ("ERROR", ["error"]),
], ids=["debug", "info", "warning", "error"])
@pytest.mark.usefixtures("restore_logging")
def test_celerys_lines_for_every_message_show_only_at_debug(
        level: str, shown: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """"Task ... received" and "... succeeded in 0.003 s" come at INFO for
    every message; a failed task still comes at ERROR."""
    setup_logging("launcher", level, "json")
    for name in ("celery.worker.strategy", "celery.app.trace"):
        log = logging.getLogger(name)
        log.debug("debug")
        log.info("info")
        log.warning("warning")
        log.error("error")
    entries = [json.loads(line) for line in emitted(capsys.readouterr().err)]
    for name in ("celery.worker.strategy", "celery.app.trace"):
        assert [e["message"] for e in entries if e["logger"] == name] == shown, name


@pytest.mark.parametrize("fmt", ["text", "json"])
@pytest.mark.usefixtures("restore_logging")
def test_gunicorn_writes_through_the_one_setup(
        fmt: str, capsys: pytest.CaptureFixture[str]) -> None:
    """gunicorn's own Logger, configured with the API's options, keeps no
    handler of its own: its error and access lines come out in the services'
    format (one JSON object per line with PAI_LOG_FORMAT=json)."""
    settings = load_settings({"PAI_LOG_FORMAT": fmt, "PAI_LOG_LEVEL": "info"})
    setup_logging("api", settings.log_level, settings.log_format)
    cfg = Config()
    for key, value in gunicorn_options(settings).items():
        cfg.set(key, value)
    log = Logger(cfg)
    capsys.readouterr()
    log.info("Booting worker with pid: %s", 42)
    log.access_log.info('127.0.0.1 - - "GET /healthz HTTP/1.1" 200')
    assert not log.error_log.handlers and not log.access_log.handlers
    lines = emitted(capsys.readouterr().err)
    assert len(lines) == 2
    if fmt == "json":
        entries = [json.loads(line) for line in lines]
        assert [(e["service"], e["logger"]) for e in entries] == \
            [("api", "gunicorn.error"), ("api", "gunicorn.access")]
        assert entries[0]["message"] == "Booting worker with pid: 42"
    else:
        assert " api INFO gunicorn.error: Booting worker with pid: 42" in lines[0]
        assert " api INFO gunicorn.access: 127.0.0.1" in lines[1]


@pytest.mark.parametrize(("line", "shown"), [
    ("GET /webhdfs/v1/r/a?op=OPEN&delegation=eyJ.abc.def HTTP/1.1",
     "GET /webhdfs/v1/r/a?op=OPEN&delegation=REDACTED HTTP/1.1"),
    ("delegation=eyJ.x&op=LISTSTATUS", "delegation=REDACTED&op=LISTSTATUS"),
    ("PUT /w?DELEGATION=t&data=true HTTP/1.1", "PUT /w?DELEGATION=REDACTED&data=true HTTP/1.1"),
    ("GET /api/v1/jobs?username=alice HTTP/1.1", "GET /api/v1/jobs?username=alice HTTP/1.1"),
    ("GET /x?notdelegation=keep HTTP/1.1", "GET /x?notdelegation=keep HTTP/1.1"),
])
def test_access_log_hides_tokens_in_urls(line: str, shown: str) -> None:
    """WebHDFS clients send the login as `delegation=`: the access log must
    not hand it to whoever reads the logs."""
    assert redact_query(line) == shown


def test_the_api_logs_through_the_redacting_logger() -> None:
    settings = load_settings({})
    cfg = Config()
    for key, value in gunicorn_options(settings).items():
        cfg.set(key, value)
    assert issubclass(cfg.logger_class, RedactingLogger)
    response = SimpleNamespace(status="200 OK", headers=[], sent=0)
    environ = {"REQUEST_METHOD": "GET", "RAW_URI": "/webhdfs/v1/a?delegation=eyJ.x.y&op=OPEN",
               "SERVER_PROTOCOL": "HTTP/1.1", "QUERY_STRING": "delegation=eyJ.x.y&op=OPEN"}
    atoms = RedactingLogger(cfg).atoms(response, [], environ, timedelta(seconds=1))
    assert "eyJ" not in atoms["r"] and "eyJ" not in atoms["q"]
    assert atoms["r"] == "GET /webhdfs/v1/a?delegation=REDACTED&op=OPEN HTTP/1.1"
