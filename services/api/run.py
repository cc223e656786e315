"""`pai-api`: the API under gunicorn's gevent worker, bound to PAI_API_HOST:PAI_API_PORT.

services/api/serving.py says why gevent and what bounds every client. gevent
patches the stdlib (sockets, ssl, threading) in place, which only works for
modules imported after it: so this module imports nothing at the top that
gevent patches, and `main` patches before it imports gunicorn, Redis or the app.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shared.infra.config import Settings


def main() -> None:
    from gevent import monkey

    monkey.patch_all()

    from services.api.app import create_app

    serve(create_app)


def serve(make_app: Callable[[Settings], Any]) -> None:
    """Serve `make_app(settings)` as pai-api is served: gunicorn with the
    settings' options, every request under the body deadline. Call it after
    gevent has patched the stdlib (as `main` does)."""
    from gunicorn.app.base import BaseApplication

    from services.api.serving import BodyDeadline, gunicorn_options
    from shared.infra.config import load_settings
    from shared.infra.logs import setup_logging

    settings = load_settings()
    setup_logging("api", settings.log_level, settings.log_format)

    class Gunicorn(BaseApplication):
        def load_config(self) -> None:
            for key, value in gunicorn_options(settings).items():
                self.cfg.set(key, value)

        def load(self) -> Any:
            return BodyDeadline(make_app(settings), settings.api_read_timeout_seconds)

    Gunicorn().run()


if __name__ == "__main__":
    main()
