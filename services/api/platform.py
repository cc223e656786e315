"""What every view needs (settings, store, messenger), bound to the app."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from flask import Flask, current_app

from shared.infra.config import Settings
from shared.infra.messaging import Messenger
from shared.state.store import Store


@dataclass
class Platform:
    settings: Settings
    store: Store
    messenger: Messenger


def platform() -> Platform:
    found: Platform = current_app.extensions["pai"]
    return found


T = TypeVar("T")
_extension_lock = threading.Lock()


def extension_of(app: Flask, name: str, create: Callable[[], T]) -> T:
    """The app's one `name` object (per process, as the app is), made by
    `create` on first use; a lock, as threads and greenlets may ask at once."""
    with _extension_lock:
        found: Any = app.extensions.get(name)
        if found is None:
            found = app.extensions[name] = create()
        return found
