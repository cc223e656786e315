"""`pai-api`: the API under gunicorn, bound to PAI_API_HOST:PAI_API_PORT."""

from __future__ import annotations

from typing import Any

from gunicorn.app.base import BaseApplication

from services.api.app import create_app
from shared.config import load_settings
from shared.logs import setup_logging


class _Gunicorn(BaseApplication):
    def __init__(self, options: dict[str, Any]) -> None:
        self.options = options
        super().__init__()

    def load_config(self) -> None:
        for key, value in self.options.items():
            self.cfg.set(key, value)

    def load(self) -> Any:
        return create_app()


def main() -> None:
    settings = load_settings()
    setup_logging("api", settings.log_level)
    _Gunicorn({
        "bind": f"{settings.api_host}:{settings.api_port}",
        "workers": 2,
        "worker_class": "gthread",
        "threads": 16,
        "timeout": 0,  # log follows are long-lived streams
        "graceful_timeout": 5,
        "accesslog": "-",
        "loglevel": settings.log_level.lower(),
        # gunicorn's control socket would live under $HOME, which a service
        # user often lacks; nothing here uses it.
        "control_socket_disable": True,
    }).run()


if __name__ == "__main__":
    main()
