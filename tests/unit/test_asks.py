"""What a job asks the scheduler for (shared/domain/asks.py): the text on its
record reads back as the ask its config gives, and anything else is refused."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.scheduler.core import job_request
from shared.domain.asks import Ask, RoleAsk
from shared.domain.models import JobSpec


def spec(**extra: Any) -> JobSpec:
    roles = extra.pop("taskRoles", [{"name": "main", "taskNumber": 2, "cpuNumber": 4,
                                     "memoryMB": 8000, "gpuNumber": 1, "command": "true"}])
    return JobSpec.from_config({"jobName": "j", "image": "busybox", "taskRoles": roles, **extra})


CONFIGS = [
    {},
    {"virtualCluster": "research", "jobPriorityClass": "prod", "gpuType": "h100"},
    {"extras": {"gangAllocation": False, "hivedScheduler": {"jobPriorityClass": "oppo"}}},
    {"taskRoles": [
        {"name": "ps", "taskNumber": 1, "cpuNumber": 2, "memoryMB": 1000, "gpuNumber": 0,
         "command": "true", "portList": [{"label": "grpc", "beginAt": 9000, "portNumber": 2}]},
        {"name": "wörker", "taskNumber": 4, "cpuNumber": 8, "memoryMB": 64000, "gpuNumber": 8,
         "command": "true"}]},
    {"extras": {"com.microsoft.pai.runtimeplugin": [{"plugin": "ssh"}]}},
]


@pytest.mark.parametrize("extra", CONFIGS)
def test_the_text_on_the_record_reads_back_as_the_configs_ask(extra: dict[str, Any]) -> None:
    asked = Ask.of(spec(**extra))
    read = Ask.from_text(asked.to_text())
    assert read == asked
    assert job_request("alice~j", 3, 1, read, 7) == job_request("alice~j", 3, 1, asked, 7)


def test_the_ask_holds_what_the_request_needs() -> None:
    ask = Ask.of(spec(**CONFIGS[3], virtualCluster="research", gpuType="h100"))
    request = job_request("alice~j", 3, 1, ask, 7, waiting={"ps:0", "wörker:2"})
    assert [(t.role, t.index, t.cpus, t.memory_mb, t.gpus) for t in request.tasks] == [
        ("ps", 0, 2, 1000, 0), ("wörker", 2, 8, 64000, 8)]
    assert [(p.label, p.count, p.begin_at) for p in request.tasks[0].ports] == [
        ("grpc", 2, 9000)]
    assert (request.vc, request.gpu_type, request.seq, request.gang) == \
        ("research", "h100", 7, True)


names = st.text(min_size=1, max_size=12)
counts = st.integers(min_value=0, max_value=10**6)


@given(st.lists(st.tuples(names, st.integers(1, 64), counts, counts, st.integers(0, 16),
                          st.lists(st.tuples(names, counts, st.integers(1, 8)), max_size=3)),
                min_size=1, max_size=4),
       names, names, st.none() | names, st.booleans())
def test_any_ask_reads_back_as_written(roles: list[Any], vc: str, priority: str,
                                       gpu_type: str | None, gang: bool) -> None:
    ask = Ask(tuple(RoleAsk(n, t, c, m, g, tuple(p)) for n, t, c, m, g, p in roles),
              vc, priority, gpu_type, gang)
    assert Ask.from_text(ask.to_text()) == ask


@pytest.mark.parametrize("text", [
    "",
    "not json",
    "[]",
    "{}",
    '[2,"default","test",null,true,[]]',  # another format
    '[1,"default","test",null,true]',  # a part missing
    '[1,"default","test",null,"yes",[]]',
    '[1,7,"test",null,true,[]]',
    '[1,"default","test",null,true,[["main","1",4,8000,1,[]]]]',
    '[1,"default","test",null,true,[["main",true,4,8000,1,[]]]]',
    '[1,"default","test",null,true,[["main",1,4,8000,1.5,[]]]]',
    '[1,"default","test",null,true,[["main",1,4,8000,1,[["http",0]]]]]',
    '[1,"default","test",null,true,[["main",1,4,8000,1,[[7,0,1]]]]]',
    '[1,"default","test",null,true,[["main",1,4,8000,1]]]',
    '[1,"default","test",null,true,{"main":1}]',
])
def test_anything_else_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a job's ask"):
        Ask.from_text(text)
