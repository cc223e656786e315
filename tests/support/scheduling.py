"""A scheduler on a real Redis, the nodes it places on and the configs it places."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from services.scheduler.service import Scheduler
from shared.domain.models import Gpu, Node
from shared.infra.config import Settings
from shared.infra.messaging import Messenger, make_celery
from shared.state.store import Store


@pytest.fixture
def store(redis_client: redis.Redis) -> Store:
    return Store(redis_client)


@pytest.fixture
def scheduler(redis_server: str, store: Store) -> Scheduler:
    settings = Settings(redis_url=redis_server, node_lost_seconds=30)
    return Scheduler(settings, store, Messenger(make_celery(settings)))


def add_node(store: Store, name: str = "n1", gpus: int = 8) -> None:
    store.register_node(Node(name, "127.0.0.1", cpus=16, memory_mb=32000,
                             gpus=[Gpu(i) for i in range(gpus)], port_range=(20000, 20100)))


def config(name: str, gpus: int = 1, tasks: int = 1, retry: int = 0) -> dict[str, Any]:
    return {"jobName": name, "image": "busybox", "retryCount": retry,
            "taskRoles": [{"name": "main", "taskNumber": tasks, "cpuNumber": 1,
                           "memoryMB": 128, "gpuNumber": gpus, "command": "true"}]}
