"""The one rule for names people choose for users and virtual clusters.

A name becomes a Redis key segment, a storage folder (`<root>/<user>/`), a
job id prefix and a URL segment, so it is held to the strictest of those:
lowercase ASCII letters, digits, `_`, `.` and `-`, starting with a letter or
digit (so never `.` or `..`), at most 64 characters. Names are compared
case-insensitively by storing only their canonical (lowercase) form: `ADMIN`
and `admin` are the same user.
"""

from __future__ import annotations

import re

NAME_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,63}$"
# What a request may send (any case; stored folded to NAME_PATTERN), for schemas.
INPUT_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
_NAME = re.compile(NAME_PATTERN)
NAME_RULE = ("1 to 64 characters: lowercase letters, digits, '_', '.' or '-', "
             "starting with a letter or digit")


def canonical_name(raw: str) -> str:
    """The stored form of a user or VC name typed in any case; ValueError
    (its message fit for a 400) when the name breaks the rule."""
    name = raw.lower()
    if _NAME.fullmatch(name) is None:
        raise ValueError(f"Must be {NAME_RULE}.")
    return name
