"""The command packer every service's Redis client uses (shared/infra/packing.py):
byte for byte what redis-py's own hiredis packing sends, errors included."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.connection import HiredisRespSerializer

from shared.infra import packing
from shared.state.store import connect

REDIS_PYS = HiredisRespSerializer()
ARGUMENTS = st.one_of(
    st.text(), st.binary(), st.integers(), st.floats(allow_nan=True),
    st.binary().map(bytearray), st.binary().map(memoryview), st.booleans(), st.none())
NAMES = st.one_of(st.sampled_from(["SET", "HSET", "EVALSHA", "CLIENT SETNAME", "XINFO STREAM"]),
                  st.text(min_size=1), st.binary(min_size=1))


def packed(packer: Any, args: tuple[Any, ...]) -> tuple[str, Any]:
    try:
        return "packed", b"".join(packer.pack(*args))
    except Exception as error:  # the same class and words, or the test fails
        return "raised", (type(error), str(error))


@given(NAMES, st.lists(ARGUMENTS, max_size=12))
def test_every_command_is_packed_as_redis_py_packs_it(name: Any, rest: list[Any]) -> None:
    args = (name, *rest)
    assert packed(packing.PACKER, args) == packed(REDIS_PYS, args)


@pytest.mark.parametrize("args", [
    ("SET", "k", True), ("SET", "k", None), ("SET", "k", bytearray(b"x")),
    ("CLIENT SETNAME", "pai"), (b"GET", "k"), ("SET", "k", "é\0\r\n"), ("SET", "k", -0.0),
])
def test_what_hiredis_is_not_handed_as_it_is_goes_redis_pys_way(args: tuple[Any, ...]) -> None:
    assert packed(packing.PACKER, args) == packed(REDIS_PYS, args)


def test_the_services_clients_pack_with_it() -> None:
    """Both ways the services make a client: a plain URL and a sentinel one
    (neither connects until used)."""
    plain = connect("redis://127.0.0.1:1/0")
    assert plain.connection_pool.connection_kwargs["command_packer"] is packing.PACKER
    failover = connect("redis+sentinel://127.0.0.1:1/pai/0")
    assert failover.connection_pool.connection_kwargs["command_packer"] is packing.PACKER
