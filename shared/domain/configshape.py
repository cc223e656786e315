"""A job config validated once per shape: the same config but for its name.

Clients submit many jobs that differ only in `jobName` (a sweep, a retry
loop, the benchmark's burst), and validating each (marshmallow, the paths,
the prerequisites) was the largest piece of a submit's own CPU after its one
Redis write. `validate_job_config` is a pure function of the config, the user
and the cluster's storage settings, and the name reaches its result in two
places only:

- `jobName` itself, held to its rule (`is_job_name`);
- the default `outputDir`, `<root>/<user>/<name>/output`, where a name with
  no `/` that is not `.` or `..` (what the rule allows, those two apart) is
  one plain path component, which normalising leaves as it is.

A third, `$PAI_JOB_NAME` in a folder or a prerequisite's URI, can make a path
valid for one name and not another: a config that mentions it anywhere is
validated afresh each time. So is one that is invalid (its errors are
reported from its own validation) and one that holds `SENTINEL`.

Otherwise the config is validated with `SENTINEL` as its name once (after
validating it as sent, which raises any error exactly), and each later
submit of the same shape by the same user gets that result with `SENTINEL`
replaced by its name: a value equal to validating it. Pure: tested against
`validate_job_config` itself in tests/unit/test_configshape.py.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from shared.domain.jobspec import ValidatedConfig, is_job_name, validate_job_config

# A valid job name no real config holds (one that does is not cached).
SENTINEL = "pai-shape-7f3c1e9a5b2d4086"
SHAPES_KEPT = 256  # shapes remembered per process, least recently used dropped
_NAME_IN_PATHS = "PAI_JOB_NAME"


class ShapeCache:
    """Validated configs by shape (see the module's doc), least recently used out."""

    def __init__(self, size: int = SHAPES_KEPT) -> None:
        self.size = size
        self._shapes: OrderedDict[tuple[str, ...], ValidatedConfig] = OrderedDict()
        self.hits = 0  # tests and the benchmark read it

    def validate(self, raw: Any, *, username: str, storage_roots: Sequence[str],
                 hdfs_webhdfs_url: str = "") -> ValidatedConfig:
        """`validate_job_config(raw, ...)`'s result, from the shape's when known."""
        key = _shape_key(raw, username, storage_roots, hdfs_webhdfs_url)
        if key is None:
            return validate_job_config(raw, username=username, storage_roots=storage_roots,
                                       hdfs_webhdfs_url=hdfs_webhdfs_url)
        template = self._shapes.get(key)
        if template is not None:
            self._shapes.move_to_end(key)
            self.hits += 1
            return _named(template, raw["jobName"])
        validated = validate_job_config(raw, username=username, storage_roots=storage_roots,
                                        hdfs_webhdfs_url=hdfs_webhdfs_url)
        self._shapes[key] = validate_job_config(
            {**raw, "jobName": SENTINEL}, username=username, storage_roots=storage_roots,
            hdfs_webhdfs_url=hdfs_webhdfs_url)
        if len(self._shapes) > self.size:
            self._shapes.popitem(last=False)
        return validated


def _shape_key(raw: Any, username: str, roots: Sequence[str],
               hdfs_webhdfs_url: str) -> tuple[str, ...] | None:
    """What a config's validation depends on but its name; None when its
    name may matter beyond the two places the module's doc names."""
    if not isinstance(raw, dict):
        return None
    name = raw.get("jobName")
    if not isinstance(name, str) or not is_job_name(name) or SENTINEL in username:
        return None
    try:
        shape = json.dumps({k: v for k, v in raw.items() if k != "jobName"},
                           sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError):
        return None
    if _NAME_IN_PATHS in shape or SENTINEL in shape:
        return None
    return (username, hdfs_webhdfs_url, *roots, shape)


def _named(template: ValidatedConfig, name: str) -> ValidatedConfig:
    return ValidatedConfig(config=_replaced(template.config, name),
                           ignored=list(template.ignored),
                           notes=[note.replace(SENTINEL, name) for note in template.notes])


def _replaced(value: Any, name: str) -> Any:
    """A deep copy with SENTINEL replaced by `name` in every string."""
    if isinstance(value, str):
        return value.replace(SENTINEL, name) if SENTINEL in value else value
    if isinstance(value, dict):
        return {k: _replaced(v, name) for k, v in value.items()}
    if isinstance(value, list):
        return [_replaced(v, name) for v in value]
    return value
