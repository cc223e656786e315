"""shared/nvml.py, the one NVML session type: the launcher's GPU list from it
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

from services.launcher.inventory import read_nvml_gpus
from services.monitor.sampling import NvmlReader
from shared.models import Gpu
from shared.nvml import MIB, Nvml, text


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


TWO = [("GPU-a", b"Tesla V100", 16 * 1024 * MIB), (b"GPU-b", "A100", 80 * 1024 * MIB + 5)]


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
