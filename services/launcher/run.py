"""`pai-launcher`: this node's Celery worker on queue `launcher.<node>`, plus
the heartbeat thread that keeps the node's lease."""

from __future__ import annotations

from services.launcher.worker import create_launcher_app
from shared.infra.config import load_settings
from shared.infra.logs import setup_logging
from shared.infra.messaging import launcher_queue
from shared.infra.supervise import serve, work_beside

# Container creation blocks on Docker (and image pulls); threads let one slow
# pull not hold up the node's other launches.
CONCURRENCY = 8


def worker_argv(node: str, log_level: str = "INFO") -> list[str]:
    return [
        "worker", "-Q", launcher_queue(node), "--pool", "threads",
        "--concurrency", str(CONCURRENCY), "-n", f"launcher@{node}",
        "--without-gossip", "--without-mingle", "--without-heartbeat", "--loglevel", log_level,
    ]


def worker() -> None:
    settings = load_settings()
    setup_logging("launcher", settings.log_level, settings.log_format)
    app, launcher = create_launcher_app(settings)
    work_beside(app, worker_argv(settings.node_name, settings.log_level),
                launcher.heartbeat_loop, "heartbeat")


def main() -> None:
    """`pai-launcher`: the worker under a supervisor that starts it again if it
    crashes (shared/infra/supervise.py)."""
    serve("launcher", "services.launcher.run", worker)


if __name__ == "__main__":
    main()
