"""What a job asks the scheduler for, as its record keeps it.

A submission's config never changes, and of it a scheduling pass needs only
what each task asks (CPUs, memory, GPUs, ports), the virtual cluster, the
priority class, the GPU type and whether the tasks go as a gang. The submit
writes that on the job's record (its `ask` field, `Ask.to_text`), so a
scheduler that meets a long queue for the first time reads a few fields of
each record instead of parsing each config (`JobSpec.from_config`). A record
without one (written before the field, or by hand) has its config parsed, and
both ways give the same `Ask` (`Ask.of`): the tests hold them so.

The text is compact JSON led by its format's number; text of another format,
or not an ask at all, is refused (ValueError) and the config read instead.
No IO here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from shared.domain.models import JobSpec

FORMAT = 1
# made once: json.dumps with these options would make one a call, and a submit writes an ask
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


@dataclass(frozen=True)
class RoleAsk:
    """One task role's ask: each of its `tasks` tasks asks the same."""

    name: str
    tasks: int
    cpus: int
    memory_mb: int
    gpus: int
    ports: tuple[tuple[str, int, int], ...] = ()  # label, beginAt, how many


@dataclass(frozen=True)
class Ask:
    roles: tuple[RoleAsk, ...]
    vc: str = "default"
    priority_class: str = "test"
    gpu_type: str | None = None
    gang: bool = True

    @classmethod
    def of(cls, spec: JobSpec) -> Ask:
        return cls(
            tuple(RoleAsk(r.name, r.task_number, r.cpu_number, r.memory_mb, r.gpu_number,
                          tuple((p.label, p.begin_at, p.port_number) for p in r.ports))
                  for r in spec.task_roles),
            spec.virtual_cluster, spec.priority_class, spec.gpu_type or None,
            spec.gang_allocation)

    def to_text(self) -> str:
        return _ENCODER.encode(
            [FORMAT, self.vc, self.priority_class, self.gpu_type, self.gang,
             [[r.name, r.tasks, r.cpus, r.memory_mb, r.gpus, [list(p) for p in r.ports]]
              for r in self.roles]])

    @classmethod
    def from_text(cls, text: str) -> Ask:
        """The ask `to_text` wrote; ValueError for anything else."""
        try:
            form, vc, priority_class, gpu_type, gang, roles = json.loads(text)
            if form != FORMAT:
                raise ValueError(f"an ask of format {form!r}, not {FORMAT}")
            ask = cls(tuple(_role(*role) for role in roles), vc, priority_class, gpu_type, gang)
        except (TypeError, ValueError) as error:  # JSONDecodeError is a ValueError
            raise ValueError(f"not a job's ask: {error}") from None
        if not (isinstance(ask.vc, str) and isinstance(ask.priority_class, str)
                and (ask.gpu_type is None or isinstance(ask.gpu_type, str))
                and isinstance(ask.gang, bool)):
            raise ValueError("not a job's ask: a field of the wrong type")
        return ask


def _role(name: Any, tasks: Any, cpus: Any, memory_mb: Any, gpus: Any, ports: Any) -> RoleAsk:
    counts = (tasks, cpus, memory_mb, gpus)
    if not isinstance(name, str) or not all(_whole(n) for n in counts):
        raise ValueError("a role's name or counts of the wrong type")
    return RoleAsk(name, tasks, cpus, memory_mb, gpus, tuple(_port(*port) for port in ports))


def _port(label: Any, begin_at: Any, count: Any) -> tuple[str, int, int]:
    if not isinstance(label, str) or not _whole(begin_at) or not _whole(count):
        raise ValueError("a port request of the wrong type")
    return label, begin_at, count


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
