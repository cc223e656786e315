"""How a Redis command is put on the wire: hiredis's packer, called directly.

redis-py packs each command with hiredis, but first rebuilds the command's
arguments: the name encoded and split on spaces (for names of two words,
`CLIENT KILL`), then every argument checked for a bytearray or memoryview in
a generator. For the fifteen commands of one of the platform's transactions
that rebuild was 8 % of the transaction's CPU in the client (an exit's
`record_task_exit`, 0.85 against 0.78 ms, docs/performance-log.md).

`FastPacker` hands the arguments to hiredis as they are when the name is
one word of letters, which hiredis packs to the same bytes; anything else (a
name of two words, with other characters or in bytes, an argument hiredis
refuses) goes through
redis-py's own packing, which gives its answer and its errors. Every Redis
client of the services packs this way (`options`); hiredis is a pinned
dependency, as redis-py's own packing of the same commands needs it.
"""

from __future__ import annotations

from typing import Any

import hiredis
from redis.connection import HiredisRespSerializer


class FastPacker(HiredisRespSerializer):
    def pack(self, *args: Any) -> list[bytes]:
        name = args[0]
        if isinstance(name, str) and name.isalpha():  # one word: nothing to split
            try:
                return [hiredis.pack_command(args)]
            except TypeError:  # a type hiredis does not take: redis-py decides
                pass
        packed: list[bytes] = super().pack(*args)
        return packed


PACKER = FastPacker()


def options() -> dict[str, Any]:
    """redis-py connection arguments (a client or a pool) for the packer."""
    return {"command_packer": PACKER}
