"""The API's app factory: defaults, then the environment, then the caller's."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from flask import Flask
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from services.api import (
    auth,
    cluster,
    execs,
    exectty,
    jobs,
    metrics,
    openapi,
    proxy,
    storage,
    tasklogs,
    usage,
    users,
    vcs,
    webhdfs,
)
from services.api import ssh as ssh_api
from services.api.errors import register_error_handlers
from services.api.platform import Platform
from services.portal import views as portal
from shared.infra.config import Settings, load_settings
from shared.infra.messaging import Messenger, make_celery
from shared.state import clock, storageid
from shared.state.accounts import Accounts
from shared.state.store import Store

MAX_BODY_BYTES = 1024 * 1024
log = logging.getLogger("pai.api")
BLUEPRINTS = (auth.bp, users.bp, jobs.bp, jobs.bp_v2, tasklogs.bp, vcs.bp, cluster.bp, openapi.bp,
              storage.bp, execs.bp, usage.bp, exectty.bp, ssh_api.bp, proxy.bp, webhdfs.bp)


def create_app(settings: Settings | None = None) -> Flask:
    settings = settings or load_settings()
    app = Flask("pai")
    app.config.update(MAX_CONTENT_LENGTH=MAX_BODY_BYTES, JSON_SORT_KEYS=False)
    app.json.sort_keys = False  # type: ignore[attr-defined]
    store = Store.from_url(settings.redis_url)
    app.extensions["pai"] = Platform(
        settings=settings,
        store=store,
        messenger=Messenger(make_celery(settings, "pai-api")),
    )
    register_error_handlers(app)
    metrics.init_app(app, store, settings)  # first: it times the requests auth refuses
    app.url_value_preprocessor(_fold_account_names)
    app.before_request(auth.authenticate)
    for blueprint in BLUEPRINTS:
        app.register_blueprint(blueprint)
    portal.init_app(app, settings)  # the web portal: pages over these same views
    _bootstrap_when_reachable(app, settings)
    app.wsgi_app = _OpenPaiPrefix(app.wsgi_app)  # type: ignore[method-assign]
    return app


class _OpenPaiPrefix:
    """Serves the API under `/rest-server/` as well as at `/`: OpenPAI put its
    REST server behind that prefix, and its clients (SDK, VS Code extension,
    users' scripts) address `<cluster>/rest-server/api/...` unchanged. The
    prefix moves to SCRIPT_NAME, so every route, auth rule and metric is the
    same request either way."""

    PREFIX = "/rest-server"

    def __init__(self, wsgi_app: Any) -> None:
        self.wsgi_app = wsgi_app

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        path: str = environ.get("PATH_INFO", "")
        if path == self.PREFIX or path.startswith(self.PREFIX + "/"):
            environ["SCRIPT_NAME"] = environ.get("SCRIPT_NAME", "") + self.PREFIX
            environ["PATH_INFO"] = path[len(self.PREFIX):] or "/"
        return self.wsgi_app(environ, start_response)


def _bootstrap_when_reachable(app: Flask, settings: Settings) -> None:
    """The `default` VC and the first admin, before any request is served.

    An API process that starts while Redis is down (restarting, failing
    over) must still start: it answers 503 until Redis is back, then makes
    them on its first request (bootstrap is idempotent)."""
    store = app.extensions["pai"].store
    accounts = Accounts(store)
    done = threading.Event()
    synced = [0.0]

    def bootstrap() -> None:
        if not done.is_set():
            accounts.bootstrap(settings.admin_user, settings.admin_password)
            # the shared storage's identity, which every node agent checks
            storageid.ensure_storage(store, settings.storage_roots, settings.task_log_dir,
                                     settings.log_group)
            done.set()
        if time.monotonic() - synced[0] >= clock.SYNC_SECONDS:  # one clock with the nodes
            synced[0] = time.monotonic()
            clock.sync_quietly(store.r)

    try:
        bootstrap()
    except (RedisConnectionError, RedisTimeoutError) as error:
        log.warning("Redis is unreachable at start-up (%s): the first request after it "
                    "is back bootstraps the platform", error)
    app.before_request(bootstrap)


def _fold_account_names(endpoint: str | None, values: dict[str, Any] | None) -> None:
    """User and VC names in URLs are case-insensitive (shared/domain/names.py): every
    view sees the stored, lowercase form, so `/user/Alice/...` is alice's."""
    if not values:
        return
    if isinstance(values.get("username"), str):
        values["username"] = values["username"].lower()
    if (endpoint or "").startswith("vcs.") and isinstance(values.get("name"), str):
        values["name"] = values["name"].lower()
