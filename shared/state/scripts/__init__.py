"""Every Lua script the platform runs in Redis, and the one way they are run.

A script runs atomically (nothing else runs in Redis meanwhile), so a check
and the write it guards are one step and one round trip. Each is declared
once, in this package's module of its concept, with what its KEYS and ARGV
hold, in order (a last name ending in "..." stands for as many more as the
caller passes), and `run` holds every call to its declaration. No state
name is spelled in Lua: the states a script compares with come in ARGV,
from shared/domain/states.py.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import NoScriptError

MORE = "..."  # a name ending so stands for the rest: as many as the caller passes


@dataclass(frozen=True)
class Script:
    """One Lua script: its name, the names of its KEYS and ARGV, its source."""

    name: str
    keys: tuple[str, ...]
    args: tuple[str, ...]
    source: str
    sha: str = field(init=False, repr=False)  # what Redis calls it by (EVALSHA)

    def __post_init__(self) -> None:
        sha = hashlib.sha1(self.source.encode(), usedforsecurity=False).hexdigest()
        object.__setattr__(self, "sha", sha)

    def check(self, script_keys: Sequence[Any], args: Sequence[Any]) -> None:
        """ValueError unless the call passes what the script declares."""
        for what, declared, given in (("KEYS", self.keys, script_keys), ("ARGV", self.args, args)):
            if not _fits(declared, len(given)):
                raise ValueError(f"script {self.name} takes {len(declared)} {what} "
                                 f"({', '.join(declared)}), not {len(given)}")


def _fits(declared: tuple[str, ...], count: int) -> bool:
    if declared and declared[-1].endswith(MORE):
        return count >= len(declared) - 1
    return count == len(declared)


def run(target: Any, script: Script, script_keys: Sequence[Any], args: Sequence[Any]) -> Any:
    """Run `script` with its KEYS and ARGV on `target`, a client or a pipeline.

    On a client: EVALSHA, and a Redis that has not seen the script (a
    restart, a new primary) is given it and asked again. On a pipeline
    (anything with a command stack: a wrapped one too): EVAL, queued with its
    source, so the pipeline stays one round trip (redis-py's Script would
    add a SCRIPT EXISTS before it); Redis keeps what it compiled.
    """
    script.check(script_keys, args)
    if hasattr(target, "command_stack"):
        return target.eval(script.source, len(script_keys), *script_keys, *args)
    try:
        return target.evalsha(script.sha, len(script_keys), *script_keys, *args)
    except NoScriptError:
        target.script_load(script.source)
        return target.evalsha(script.sha, len(script_keys), *script_keys, *args)


# The scripts, by concept: imported after Script, which each module uses.
from shared.state.scripts.follows import (  # noqa: E402
    ACQUIRE_FOLLOW,
    RENEW_FOLLOW,
)
from shared.state.scripts.gated import LEASED_WRITE  # noqa: E402
from shared.state.scripts.hashes import HSET_IF_EXISTS  # noqa: E402
from shared.state.scripts.jobs import (  # noqa: E402
    CREATE_JOB,
    DISCARD_SSH_KEY,
    KEEP_HIGHER_STEP,
    RECORD_USAGE_ONCE,
    SET_MODES,
    SET_WAITING,
)
from shared.state.scripts.logs import APPEND_LOG_LINES  # noqa: E402
from shared.state.scripts.nodes import (  # noqa: E402
    CLAIM_NODE,
    MARK_NODE_LOST,
    REGISTER_NODE,
    RELEASE_ALLOCATION,
    RELEASE_NODE_ROLE,
    RENEW_NODE,
)
from shared.state.scripts.reads import (  # noqa: E402
    EXISTING,
    HGETALL_MANY,
    HMGET_COLUMNS,
    HMGET_JOINED,
    HMGET_STAMPED,
    QUEUED_RECORDS,
    READ_JOB_CHANGES,
    READ_JOB_VIEW,
)
from shared.state.scripts.scheduler import (  # noqa: E402
    BEGIN_PASS,
    COMMIT_PLACEMENTS,
    END_PASS,
)
from shared.state.scripts.terminals import (  # noqa: E402
    CLAIM_EXEC,
    END_TERMINAL,
    PUSH_TERMINAL_INPUT,
    PUT_TERMINAL_OUTPUT,
)

ALL: tuple[Script, ...] = (
    CREATE_JOB,
    SET_WAITING,
    SET_MODES,
    KEEP_HIGHER_STEP,
    DISCARD_SSH_KEY,
    RECORD_USAGE_ONCE,
    HMGET_JOINED,
    HMGET_STAMPED,
    HMGET_COLUMNS,
    HGETALL_MANY,
    EXISTING,
    QUEUED_RECORDS,
    READ_JOB_CHANGES,
    READ_JOB_VIEW,
    COMMIT_PLACEMENTS,
    BEGIN_PASS,
    END_PASS,
    REGISTER_NODE,
    RELEASE_ALLOCATION,
    CLAIM_NODE,
    RENEW_NODE,
    MARK_NODE_LOST,
    RELEASE_NODE_ROLE,
    CLAIM_EXEC,
    PUSH_TERMINAL_INPUT,
    PUT_TERMINAL_OUTPUT,
    END_TERMINAL,
    ACQUIRE_FOLLOW,
    RENEW_FOLLOW,
    LEASED_WRITE,
    HSET_IF_EXISTS,
    APPEND_LOG_LINES,
)
