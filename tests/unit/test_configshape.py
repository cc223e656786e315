"""A config validated once per shape (shared/domain/configshape.py) gives
exactly what validating it gives, whatever its name, folders or errors."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.domain.configshape import SENTINEL, ShapeCache
from shared.domain.jobspec import InvalidJobConfig, validate_job_config

ROOTS = ("/srv/pai",)
_NAMES = st.sampled_from(["a", "mnist-1", "x.y", "under_score", "ti~lde", ".hidden", ".",
                          "..", "bad/name", "", "n" * 255, "n" * 256, "Upper-Case"])
_DIRS = st.sampled_from([None, "/srv/pai/alice/out", "/srv/pai/alice/$PAI_JOB_NAME",
                         "$PAI_DEFAULT_FS_URI/$PAI_USERNAME/${PAI_JOB_NAME}/x",
                         "/srv/pai/alice/../bob", "/tmp/data", "relative", "hdfs://x/y"])


def _config(name: Any, output: str | None, data: str | None, memory: int,
            envs: dict[str, str]) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "jobName": name, "image": "busybox", "jobEnvs": envs,
        "taskRoles": [{"name": "main", "taskNumber": 1, "cpuNumber": 1, "memoryMB": memory,
                       "gpuNumber": 1, "command": "python train.py"}]}
    for key, value in (("outputDir", output), ("dataDir", data)):
        if value is not None:
            raw[key] = value
    return raw


def _outcome(validate: Any, raw: dict[str, Any]) -> Any:
    try:
        got = validate(raw, username="alice", storage_roots=ROOTS)
    except InvalidJobConfig as error:
        return ("rejected", error.message, error.fields)
    return ("valid", got.config, got.ignored, got.notes)


@settings(max_examples=200)
@given(st.lists(st.tuples(_NAMES, _DIRS, _DIRS, st.sampled_from([50, 256]),
                          st.sampled_from([{}, {"isDebug": "true"}, {"K": SENTINEL}])),
                min_size=1, max_size=12))
def test_each_submit_is_validated_as_itself(
        submits: list[tuple[Any, str | None, str | None, int, dict[str, str]]]) -> None:
    shapes = ShapeCache()
    for submit in submits:
        raw = _config(*submit)
        assert _outcome(shapes.validate, raw) == _outcome(validate_job_config, raw)


def test_a_repeated_shape_is_validated_once_and_copied() -> None:
    shapes = ShapeCache()
    first = shapes.validate(_config("one", None, None, 256, {}), username="alice",
                            storage_roots=ROOTS)
    second = shapes.validate(_config("two", None, None, 256, {}), username="alice",
                             storage_roots=ROOTS)
    assert shapes.hits == 1
    assert second.config["jobName"] == "two"
    assert second.config["outputDir"] == "/srv/pai/alice/two/output"
    second.config["taskRoles"][0]["memoryMB"] = 1  # a copy: the next one is untouched
    third = shapes.validate(_config("three", None, None, 256, {}), username="alice",
                            storage_roots=ROOTS)
    assert third.config["taskRoles"][0]["memoryMB"] == 256
    assert first.config["outputDir"] == "/srv/pai/alice/one/output"


@pytest.mark.parametrize("raw", [
    _config("a", "/srv/pai/alice/$PAI_JOB_NAME", None, 256, {}),
    _config("a", None, None, 256, {"K": SENTINEL}),
    _config(".", None, None, 256, {}),
    _config(7, None, None, 256, {}),
], ids=["names its name in a path", "holds the sentinel", "an invalid name", "a number"])
def test_configs_the_name_may_matter_to_are_validated_each_time(raw: dict[str, Any]) -> None:
    shapes = ShapeCache()
    for _ in range(2):
        _outcome(shapes.validate, raw)
    assert shapes.hits == 0


def test_other_users_and_settings_are_other_shapes() -> None:
    shapes = ShapeCache(size=2)
    for user in ("alice", "bob", "carol", "alice"):
        got = shapes.validate(_config("a", None, None, 256, {}), username=user,
                              storage_roots=ROOTS)
        assert got.config["outputDir"] == f"/srv/pai/{user}/a/output"
    assert shapes.hits == 0  # alice's shape was dropped for carol's (two kept)
