"""The launcher's Celery tasks: thin wrappers that parse ids and call Launcher.

Starts, execs and terminal sessions do not come this way: the launcher takes
them from its node's streams (services/launcher/starts.py and calls.py)."""

from __future__ import annotations

from collections.abc import Mapping

from celery import Celery

from services.launcher.inventory import discover_node
from services.launcher.runtime import DockerRuntime
from services.launcher.service import Launcher
from shared.infra import messaging
from shared.infra.config import Settings
from shared.infra.messaging import Messenger, make_celery
from shared.node.containers import docker_client
from shared.state.store import Store


def create_launcher_app(
    settings: Settings, *, extra_labels: Mapping[str, str] | None = None,
) -> tuple[Celery, Launcher]:
    """The app for queue `launcher.<node>` and the Launcher its tasks call.

    Discovers the node (NVML, Docker) now, so a node that cannot reach its
    Docker engine fails at start-up rather than on its first task.
    """
    app = make_celery(settings, "pai-launcher")
    # shared=False: Celery would otherwise hand these tasks, bound to this
    # Launcher, to every app made later in the process (tests make several).
    client = docker_client(settings)
    node = discover_node(settings, client)
    launcher = Launcher(settings, Store.from_url(settings.redis_url), Messenger(app),
                        DockerRuntime(client, settings, extra_labels=extra_labels), node)

    @app.task(name=messaging.PREEMPT_TASK, shared=False)
    def preempt_task(job_id: str, attempt: int, role: str, index: int) -> None:
        launcher.preempt_task(str(job_id), int(attempt), str(role), int(index))

    @app.task(name=messaging.STOP_TASK, shared=False)
    def stop_task(job_id: str, attempt: int, role: str, index: int) -> None:
        launcher.stop_task(str(job_id), int(attempt), str(role), int(index))

    return app, launcher
