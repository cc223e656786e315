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
    {"ssh": {"jobssh": True}, "preemptionGracePeriodSec": 45},
]


@pytest.mark.parametrize("extra", CONFIGS)
def test_the_text_on_the_record_reads_back_as_the_configs_ask(extra: dict[str, Any]) -> None:
    asked = Ask.of(spec(**extra))
    read = Ask.from_text(asked.to_text())
    assert read == asked
    assert job_request("alice~j", 3, 1, read, 7) == job_request("alice~j", 3, 1, asked, 7)


@pytest.mark.parametrize("extra", CONFIGS)
def test_a_request_made_like_another_of_its_ask_is_the_one_made_alone(
        extra: dict[str, Any]) -> None:
    ask = Ask.of(spec(**extra))
    first = job_request("alice~a", 1, 0, ask, 3)
    alone = job_request("bob~b", 5, 2, ask, 9)
    shared = job_request("bob~b", 5, 2, ask, 9, like=first)
    assert shared == alone and shared.tasks is first.tasks
    assert (shared.gpus, shared.shape, shared.fit_key) == (alone.gpus, alone.shape, alone.fit_key)
    # a partly placed job asks for its waiting tasks only, whatever it is like
    some = job_request("bob~b", 5, 2, ask, 9, waiting={"main:1"}, like=first)
    assert some == job_request("bob~b", 5, 2, ask, 9, waiting={"main:1"}) != alone


def test_an_ssh_job_asks_each_role_for_its_ssh_port_and_says_its_grace() -> None:
    ask = Ask.of(spec(**CONFIGS[4]))
    assert ask.roles[0].ports == (("ssh", 0, 1),) and ask.grace_seconds == 45
    assert Ask.from_text(ask.to_text()) == ask


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
       names, st.sampled_from(["test", "prod", "oppo", "PROD"]), st.none() | names,
       st.booleans(), st.none() | counts)
def test_any_ask_reads_back_as_written(roles: list[Any], vc: str, priority: str,
                                       gpu_type: str | None, gang: bool,
                                       grace: int | None) -> None:
    ask = Ask(tuple(RoleAsk(n, t, c, m, g, tuple(p)) for n, t, c, m, g, p in roles),
              vc, priority, gpu_type, gang, grace)
    assert Ask.from_text(ask.to_text()) == ask


GOOD = '[1,"default","test",null,true,[["main",1,4,8000,1,[["http",0,1]]]],null]'


def test_the_good_text_is_an_ask() -> None:
    assert Ask.from_text(GOOD).roles[0].ports == (("http", 0, 1),)


@pytest.mark.parametrize("text", [
    "",
    "not json",
    "[]",
    "{}",
    "[" * 100_000 + "]" * 100_000,  # deeper than the parser goes
    GOOD.replace("[1,", "[2,", 1),  # another format
    GOOD.replace("[1,", "[true,", 1),
    GOOD.replace(",null]", "]"),  # a part missing
    GOOD.replace("true", '"yes"'),
    GOOD.replace('"default"', "7"),
    GOOD.replace('"test"', '"bogus"'),  # no such priority class
    GOOD.replace('[["main",1,4,8000,1,[["http",0,1]]]]', "[]"),  # no role
    GOOD.replace('"main",1,', '"main","1",'),
    GOOD.replace('"main",1,', '"main",true,'),
    GOOD.replace('"main",1,', '"main",0,'),  # no task
    GOOD.replace(",8000,", ",-8000,"),
    GOOD.replace("8000,1,", "8000,1.5,"),
    GOOD.replace('["http",0,1]', '["http",0]'),
    GOOD.replace('["http",0,1]', '["http",0,0]'),
    GOOD.replace('["http",0,1]', '[7,0,1]'),
    GOOD.replace(",null]", ",-1]"),  # a grace below none
    GOOD.replace(',[["http",0,1]]]]', "]]"),
    GOOD.replace('[["main",1,4,8000,1,[["http",0,1]]]]', '{"main":1}'),
])
def test_anything_else_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a job's ask"):
        Ask.from_text(text)


def test_the_text_is_ascii_whatever_the_config_holds() -> None:
    ask = Ask.of(spec(gpuType="h100-\ud800", virtualCluster="équipe"))
    text = ask.to_text()
    assert text.isascii() and text.encode("utf-8")  # Redis takes it (a lone surrogate)
    assert Ask.from_text(text) == ask
