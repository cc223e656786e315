"""The one logging setup (shared/logs.py) and its settings."""

from __future__ import annotations

import json
import logging
import sys

import pytest

from shared.config import ConfigError, load_settings
from shared.logs import formatter


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
], ids=["defaults", "case-folded"])
def test_log_settings(env: dict[str, str], level: str, fmt: str) -> None:
    settings = load_settings(env)
    assert (settings.log_level, settings.log_format) == (level, fmt)


@pytest.mark.parametrize("env", [{"PAI_LOG_FORMAT": "xml"}, {"PAI_LOG_LEVEL": "loud"}],
                         ids=["format", "level"])
def test_bad_log_settings_stop_start_up(env: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="PAI_LOG_"):
        load_settings(env)
