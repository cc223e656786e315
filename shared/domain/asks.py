"""What a job asks the scheduler for, as its record keeps it.

A submission's config never changes, and of it a scheduling pass needs only
what each task asks (CPUs, memory, GPUs, ports), the virtual cluster, the
priority class, the GPU type, whether the tasks go as a gang, and how long a
preempted task has to stop (the running jobs' read). The submit
writes that on the job's record (its `ask` field, `Ask.to_text`), so a
scheduler that meets a long queue for the first time reads a few fields of
each record instead of parsing each config (`JobSpec.from_config`). A record
without one (written before the field, or by hand) has its config parsed, and
both ways give the same `Ask` (`Ask.of`): the tests hold them so.

The text is compact ASCII JSON led by its format's number; text of another
format, or not an ask a submit could have written (at least one role, its
counts whole and none negative, a task and a port at least, a known
priority class), is refused (ValueError) and the config read instead. No IO
here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from shared.domain.models import JobSpec
from shared.domain.priority import PriorityClass

FORMAT = 1
# made once: json.dumps with these options would make one a call, and a
# submit writes an ask. ASCII: a user's string may hold a lone surrogate,
# which no encoding to UTF-8 takes (the config is stored in ASCII too).
_ENCODER = json.JSONEncoder(separators=(",", ":"))


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
    grace_seconds: int | None = None  # preemptionGracePeriodSec (None: the platform's)

    @classmethod
    def of(cls, spec: JobSpec) -> Ask:
        return cls(
            tuple(RoleAsk(r.name, r.task_number, r.cpu_number, r.memory_mb, r.gpu_number,
                          tuple((p.label, p.begin_at, p.port_number) for p in r.ports))
                  for r in spec.task_roles),
            spec.virtual_cluster, spec.priority_class, spec.gpu_type or None,
            spec.gang_allocation, spec.preemption_grace_seconds)

    def to_text(self) -> str:
        return _ENCODER.encode(
            [FORMAT, self.vc, self.priority_class, self.gpu_type, self.gang,
             [[r.name, r.tasks, r.cpus, r.memory_mb, r.gpus, [list(p) for p in r.ports]]
              for r in self.roles], self.grace_seconds])

    @classmethod
    def from_text(cls, text: str) -> Ask:
        """The ask `to_text` wrote; ValueError for anything else."""
        try:
            form, vc, priority_class, gpu_type, gang, roles, grace = json.loads(text)
            if type(form) is not int or form != FORMAT:
                raise ValueError(f"an ask of format {form!r}, not {FORMAT}")
            ask = cls(tuple(_role(*role) for role in roles), vc, priority_class, gpu_type, gang,
                      grace)
        except (TypeError, ValueError, RecursionError) as error:  # JSONDecodeError: ValueError
            raise ValueError(f"not a job's ask: {error}") from None
        if not (isinstance(ask.vc, str) and isinstance(ask.priority_class, str)
                and (ask.gpu_type is None or isinstance(ask.gpu_type, str))
                and isinstance(ask.gang, bool)
                and (ask.grace_seconds is None or _whole(ask.grace_seconds, 0))):
            raise ValueError("not a job's ask: a field of the wrong type")
        if not ask.roles:
            raise ValueError("not a job's ask: no task role")
        try:
            PriorityClass.parse(ask.priority_class)
        except KeyError:
            raise ValueError(f"not a job's ask: no priority class {ask.priority_class!r}") \
                from None
        return ask


def _role(name: Any, tasks: Any, cpus: Any, memory_mb: Any, gpus: Any, ports: Any) -> RoleAsk:
    if not isinstance(name, str) or not _whole(tasks, 1) \
            or not all(_whole(n, 0) for n in (cpus, memory_mb, gpus)):
        raise ValueError("a role's name or counts of the wrong type or below their least")
    return RoleAsk(name, tasks, cpus, memory_mb, gpus, tuple(_port(*port) for port in ports))


def _port(label: Any, begin_at: Any, count: Any) -> tuple[str, int, int]:
    if not isinstance(label, str) or not _whole(begin_at, 0) or not _whole(count, 1):
        raise ValueError("a port request of the wrong type or below its least")
    return label, begin_at, count


def _whole(value: Any, least: int) -> bool:
    """A JSON whole number (not a bool) of at least `least`."""
    return type(value) is int and value >= least
