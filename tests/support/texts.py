"""Texts a value must travel through Redis as it is: quotes, backslashes,
line ends, NUL, other scripts, and strings that read as numbers or JSON."""

from __future__ import annotations

AWKWARD_TEXTS = ["", "0", "007", "1e3", "-0.0", "12345678901234567890", 'say "hi"',
                 "back\\slash", "line\nend\r\n", "tab\tnul\x00", "gr\u00fc\u00dfe",
                 "\u65e5\u672c", "\U0001f680", "[1,2]", '{"a":null}', "null"]
