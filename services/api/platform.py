"""What every view needs (settings, store, messenger), bound to the app."""

from __future__ import annotations

from dataclasses import dataclass

from flask import current_app

from shared.config import Settings
from shared.messaging import Messenger
from shared.store import Store


@dataclass
class Platform:
    settings: Settings
    store: Store
    messenger: Messenger


def platform() -> Platform:
    found: Platform = current_app.extensions["pai"]
    return found
