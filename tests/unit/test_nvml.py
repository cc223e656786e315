"""shared/node/nvml.py, the one NVML session type: the launcher's GPU list from it
(the monitor's samples are tested in test_metrics_node.py).

A machine without a driver is the real case here (nvidia-ml-py raises
NVMLError_LibraryNotFound); devices come from a stand-in with NVML's call
names, since no GPU is present to test the mapping on.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pynvml
import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.launcher.inventory import read_nvml_gpus
from services.monitor.sampling import NvmlReader
from shared.domain.models import Gpu
from shared.node.nvml import MIB, Nvml, text, topology_groups


class StandInError(Exception):
    pass


def stand_in(devices: list[tuple[str | bytes, str | bytes, int]], *,
             fail: str = "", calls: list[str] | None = None) -> Any:
    """NVML's calls over (uuid, name, memory bytes) devices; `fail` names the one that raises."""
    seen = calls if calls is not None else []

    def call(name: str, value: Any = None) -> Any:
        seen.append(name)
        if name == fail:
            raise StandInError(name)
        return value

    return SimpleNamespace(
        NVMLError=StandInError,
        nvmlInit=lambda: call("init"), nvmlShutdown=lambda: call("shutdown"),
        nvmlDeviceGetCount=lambda: call("count", len(devices)),
        nvmlDeviceGetHandleByIndex=lambda i: devices[i],
        nvmlDeviceGetUUID=lambda d: d[0], nvmlDeviceGetName=lambda d: d[1],
        nvmlDeviceGetMemoryInfo=lambda d: call("memory", SimpleNamespace(total=d[2], used=0)),
    )


TWO: list[tuple[str | bytes, str | bytes, int]] = [
    ("GPU-a", b"Tesla V100", 16 * 1024 * MIB), (b"GPU-b", "A100", 80 * 1024 * MIB + 5)]


def test_this_machine_has_no_nvml_and_so_no_gpus() -> None:
    """The real library without a driver: a node with no GPUs, not an error."""
    nvml = Nvml(pynvml)
    assert nvml.open() is False and not nvml.available
    assert list(nvml.devices()) == [] and nvml.gpus() == []
    assert read_nvml_gpus() == []
    reader = NvmlReader()
    assert reader.start() is False and reader.read() is None


def test_the_launcher_lists_every_device_by_index_and_closes_nvml() -> None:
    calls: list[str] = []
    assert read_nvml_gpus(Nvml(stand_in(TWO, calls=calls))) == [
        Gpu(0, "GPU-a", "Tesla V100", 16 * 1024), Gpu(1, "GPU-b", "A100", 80 * 1024)]
    assert (calls[0], calls[-1]) == ("init", "shutdown")


@pytest.mark.parametrize("fail", ["init", "count", "memory"])
def test_the_launcher_offers_no_gpus_when_nvml_fails(fail: str) -> None:
    """Better none than a wrong list: the scheduler would place on GPUs that are not there."""
    assert read_nvml_gpus(Nvml(stand_in(TWO, fail=fail))) == []


def test_a_failing_round_gives_the_monitor_no_gpu_series_not_an_exception() -> None:
    reader = NvmlReader(Nvml(stand_in(TWO, fail="count")))
    assert reader.start()
    assert reader.read() is None


def test_a_reading_the_device_does_not_support_is_none() -> None:
    nvml = Nvml(stand_in(TWO, fail="memory"))
    assert nvml.maybe(lambda: nvml.lib.nvmlDeviceGetMemoryInfo(TWO[0])) is None
    assert nvml.maybe(lambda: nvml.lib.nvmlDeviceGetName(TWO[0])) == b"Tesla V100"


@pytest.mark.parametrize(("raw", "shown"), [(b"A100", "A100"), ("A100", "A100"),
                                            (b"\xff", "\ufffd")])
def test_text_reads_old_and_new_bindings(raw: str | bytes, shown: str) -> None:
    assert text(raw) == shown


# ------------------------------------------------------------------ topology

SINGLE, MULTIPLE = pynvml.NVML_TOPOLOGY_SINGLE, pynvml.NVML_TOPOLOGY_MULTIPLE
HOSTBRIDGE, SYSTEM = pynvml.NVML_TOPOLOGY_HOSTBRIDGE, pynvml.NVML_TOPOLOGY_SYSTEM
INTERNAL, NODE = pynvml.NVML_TOPOLOGY_INTERNAL, pynvml.NVML_TOPOLOGY_NODE


def table_near(levels: dict[tuple[int, int], int | None],
               nvlink: frozenset[tuple[int, int]] | set[tuple[int, int]] = frozenset(),
               default: int | None = SYSTEM) -> Any:
    """"near" over a fake topology table, as the session judges a pair."""
    def near(a: int, b: int) -> bool | None:
        level = levels.get((a, b), levels.get((b, a), default))
        linked = (a, b) in nvlink or (b, a) in nvlink
        if level is None and not linked:
            return None
        return level in (INTERNAL, SINGLE, MULTIPLE) or linked
    return near


def switches(*members: range) -> dict[tuple[int, int], int | None]:
    """Every pair within one of `members` on one PCIe switch."""
    return {(a, b): SINGLE for group in members for a in group for b in group if a < b}


@pytest.mark.parametrize(("indices", "near", "groups"), [
    pytest.param(range(8), table_near(switches(range(4), range(4, 8))),
                 {**dict.fromkeys(range(4), 0), **dict.fromkeys(range(4, 8), 1)},
                 id="two switches of four: two groups"),
    pytest.param(range(4), table_near({}, nvlink={(0, 1), (2, 3)}),
                 {0: 0, 1: 0, 2: 1, 3: 1}, id="NVLink pairs across host bridges"),
    pytest.param(range(4), table_near({(0, 1): INTERNAL, (1, 2): MULTIPLE, (2, 3): NODE}),
                 {0: 0, 1: 0, 2: 0, 3: 1}, id="a chain of near pairs is one group"),
    pytest.param(range(4), table_near({(0, 2): SINGLE, (1, 3): SINGLE}),
                 {0: 0, 2: 0, 1: 1, 3: 1}, id="numbered by lowest index, interleaved"),
    pytest.param(range(3), table_near({}, default=HOSTBRIDGE), {0: 0, 1: 1, 2: 2},
                 id="no switch shared: each GPU alone"),
    pytest.param(range(3), table_near({(0, 1): SINGLE, (1, 2): None}),
                 {0: 0, 1: 0, 2: 1}, id="a pair NVML cannot judge is not near"),
    pytest.param(range(3), table_near({}, default=None), None,
                 id="no pair judged: topology unknown"),
    pytest.param([5], table_near({}, default=None), {5: 0}, id="one GPU is its own group"),
    pytest.param([], table_near({}), {}, id="no GPUs"),
])
def test_topology_groups(indices: range, near: Any, groups: dict[int, int] | None) -> None:
    assert topology_groups(list(indices), near) == groups


@given(st.sets(st.tuples(st.integers(0, 7), st.integers(0, 7))))
def test_topology_groups_are_exactly_the_islands_of_near_pairs(
        links: set[tuple[int, int]]) -> None:
    groups = topology_groups(list(range(8)), table_near({}, nvlink=links))
    assert groups is not None
    assert all(groups[a] == groups[b] for a, b in links)
    # two GPUs share a group only through a chain of links
    reach = {i: {i} for i in range(8)}
    for _ in range(8):
        for a, b in links:
            reach[a] |= reach[b]
            reach[b] |= reach[a]
    assert all((groups[a] == groups[b]) == (b in reach[a]) for a in range(8) for b in range(8))
    assert sorted(set(groups.values())) == list(range(len(set(groups.values()))))


def with_topology(lib: Any, levels: dict[tuple[int, int], int], *,
                  fail: bool = False, p2p: bool = True) -> Any:
    """The stand-in, plus NVML's topology calls over device indices."""
    def ancestor(a: Any, b: Any) -> int:
        if fail:
            raise StandInError("topology")
        pair = (FOUR.index(a), FOUR.index(b))
        return levels.get(pair, levels.get(pair[::-1], SYSTEM))

    lib.nvmlDeviceGetTopologyCommonAncestor = ancestor
    if p2p:
        def status(a: Any, b: Any, index: int) -> int:
            raise StandInError("no NVLink")
        lib.nvmlDeviceGetP2PStatus = status
    return lib


FOUR: list[tuple[str | bytes, str | bytes, int]] = [
    (f"GPU-{i}", "H100", 80 * 1024 * MIB) for i in range(4)]


@pytest.mark.parametrize("p2p", [True, False], ids=["NVLink unsupported", "no P2P call"])
def test_the_session_groups_gpus_by_switch(p2p: bool) -> None:
    lib = with_topology(stand_in(FOUR), {(0, 1): SINGLE, (2, 3): MULTIPLE}, p2p=p2p)
    gpus = read_nvml_gpus(Nvml(lib))
    assert [(g.model, g.group) for g in gpus] == [("H100", 0), ("H100", 0), ("H100", 1),
                                                  ("H100", 1)]


def test_the_session_reports_unknown_groups_when_nvml_cannot_tell() -> None:
    """A GPU's list still comes; only its topology is unknown (None)."""
    gpus = read_nvml_gpus(Nvml(with_topology(stand_in(FOUR), {}, fail=True)))
    assert len(gpus) == 4 and {g.group for g in gpus} == {None}


def test_the_session_follows_nvlink() -> None:
    lib = with_topology(stand_in(FOUR), {})
    lib.nvmlDeviceGetP2PStatus = lambda a, b, index: (
        pynvml.NVML_P2P_STATUS_OK if {a[0], b[0]} == {"GPU-0", "GPU-3"}
        else pynvml.NVML_P2P_STATUS_NOT_SUPPORTED)
    assert [g.group for g in read_nvml_gpus(Nvml(lib))] == [0, 1, 2, 0]
