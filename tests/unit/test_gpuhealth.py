"""GPU health rules (shared/domain/gpuhealth.py) and the NVML readings behind them.

NVML is absent here (the real library raises NVMLError_LibraryNotFound): the
health watch then reads nothing and only the injection hook marks GPUs; the
mapping of NVML's calls is tested on a stand-in with NVML's call names.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from services.monitor.gpuhealth import GpuHealthWatch
from shared.domain.gpuhealth import (
    HW_POWER_BRAKE_SLOWDOWN,
    HW_THERMAL_SLOWDOWN,
    GpuFault,
    GpuReading,
    faulty_in,
    healthy_view,
    parse_faults,
    reading_faults,
    xid_fault,
)
from shared.domain.models import Gpu, Node, TaskPlacement
from shared.node.nvml import Nvml

R = GpuReading


@pytest.mark.parametrize(("previous", "current", "reasons"), [
    pytest.param(None, R(), [], id="nothing supported: healthy"),
    pytest.param(None, R(0, False, False, False, 0), [], id="all clear"),
    pytest.param(None, R(uncorrected_ecc=2), ["2 uncorrected ECC error(s)"],
                 id="ECC errors on the first reading"),
    pytest.param(R(uncorrected_ecc=2), R(uncorrected_ecc=2), [],
                 id="the same ECC count again: nothing new (a clear stays cleared)"),
    pytest.param(R(uncorrected_ecc=2), R(uncorrected_ecc=5), ["3 uncorrected ECC error(s)"],
                 id="ECC count grew"),
    pytest.param(None, R(retired_pages_pending=True),
                 ["retired memory pages pending (the GPU needs a reset)"], id="pages pending"),
    pytest.param(None, R(remap_pending=True),
                 ["row remapping pending (the GPU needs a reset)"], id="remap pending"),
    pytest.param(None, R(remap_pending=True, remap_failed=True), ["row remapping failed"],
                 id="remap failed says only that"),
    pytest.param(None, R(throttle_reasons=HW_THERMAL_SLOWDOWN | 0x1),
                 ["hardware thermal slowdown"], id="thermal slowdown"),
    pytest.param(None, R(throttle_reasons=HW_POWER_BRAKE_SLOWDOWN),
                 ["hardware power-brake slowdown"], id="power brake"),
    pytest.param(None, R(throttle_reasons=0x1 | 0x4), [],
                 id="idle and software power cap throttling are normal"),
])
def test_reading_faults(previous: GpuReading | None, current: GpuReading,
                        reasons: list[str]) -> None:
    assert reading_faults(previous, current) == reasons


@pytest.mark.parametrize(("xid", "reason"), [
    (79, "XID 79"), (48, "XID 48"), (63, "XID 63"),
    (13, None), (31, None), (43, None), (45, None), (68, None),  # the job's own fault
])
def test_xid_fault(xid: int, reason: str | None) -> None:
    assert xid_fault(xid) == reason


FAULT = GpuFault("n1", 2, "XID 79", 1000)


def test_the_scheduler_sees_a_node_without_its_unhealthy_gpus() -> None:
    node = Node("n1", "10.0.0.1", 8, 1000, gpus=[Gpu(i) for i in range(4)])
    faults = {"n1": {2: FAULT}}
    assert [g.index for g in healthy_view(node, faults).gpus] == [0, 1, 3]
    assert healthy_view(node, {"n2": {0: FAULT}}) is node
    on = [TaskPlacement("main", 0, "n1", "10.0.0.1", (1, 2), 1, 1, {}),
          TaskPlacement("main", 1, "n2", "10.0.0.2", (2,), 1, 1, {})]
    assert faulty_in(on, faults) == [("n1", 2)]
    assert faulty_in(on[1:], faults) == []


def test_faults_round_trip_and_junk_is_skipped() -> None:
    assert parse_faults({"n1:2": FAULT.to_json(), "n1:3": "not json", "x": '{"node": 1}'}) == {
        "n1": {2: FAULT}}


# ------------------------------------------------------------------ NVML


class StandInError(Exception):
    pass


def stand_in(*, ecc: int | None = 0, pending: int | None = 0,
             remapped: tuple[int, int, int, int] | None = (0, 0, 0, 0),
             throttle: int | None = 0, xids: list[tuple[str, int]] | None = None) -> Any:
    """NVML over two devices (by UUID); None: the call is unsupported."""
    waiting = list(xids or [])

    def supported(value: Any) -> Any:
        if value is None:
            raise StandInError("not supported")
        return value

    def wait(_events: Any, _timeout: int) -> Any:
        if not waiting:
            raise StandInError("timeout")
        uuid, xid = waiting.pop(0)
        return SimpleNamespace(device=uuid, eventData=xid)

    return SimpleNamespace(
        NVMLError=StandInError, nvmlInit=lambda: None, nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: 2, nvmlDeviceGetHandleByIndex=lambda i: f"GPU-{i}",
        nvmlDeviceGetUUID=lambda handle: handle,
        nvmlDeviceGetTotalEccErrors=lambda h, kind, counter: supported(ecc),
        nvmlDeviceGetRetiredPagesPendingStatus=lambda h: supported(pending),
        nvmlDeviceGetRemappedRows=lambda h: supported(remapped),
        nvmlDeviceGetCurrentClocksThrottleReasons=lambda h: supported(throttle),
        nvmlEventSetCreate=lambda: "events", nvmlDeviceRegisterEvents=lambda h, kind, s: None,
        nvmlEventSetWait=wait,
    )


def test_nvml_health_readings_map_to_a_reading() -> None:
    nvml = Nvml(stand_in(ecc=3, pending=pynvml.NVML_FEATURE_ENABLED, remapped=(1, 0, 1, 0),
                         throttle=HW_THERMAL_SLOWDOWN))
    assert nvml.open()
    assert nvml.health("GPU-0") == GpuReading(3, True, True, False, HW_THERMAL_SLOWDOWN)
    unsupported = Nvml(stand_in(ecc=None, pending=None, remapped=None, throttle=None))
    assert unsupported.open() and unsupported.health("GPU-0") == GpuReading()


def test_xid_events_are_read_by_device_without_waiting() -> None:
    nvml = Nvml(stand_in(xids=[("GPU-1", 79), ("GPU-0", 13), ("GPU-9", 48)]))
    assert nvml.open()
    events = nvml.watch_xids()
    assert nvml.xids(events) == [(1, 79), (0, 13)]  # an unknown device's event is dropped
    assert nvml.xids(events) == []
    assert Nvml(pynvml).xids(None) == []


class NoRedis:
    """The injection hook's list, empty (the watch's NVML side is what is tested)."""

    def lpop(self, _key: str, _count: int) -> None:
        return None


def test_the_watch_judges_xids_and_readings_and_skips_application_xids() -> None:
    lib = stand_in(ecc=0, xids=[("GPU-1", 79), ("GPU-0", 13)])
    watch = GpuHealthWatch(SimpleNamespace(r=NoRedis()), "n1",  # type: ignore[arg-type]
                           lambda ref: None, lambda ref, ended: None, Nvml(lib))
    watch.start()
    assert watch.observe() == [(1, "XID 79", "nvml")]
    lib.nvmlDeviceGetTotalEccErrors = lambda h, kind, counter: 1 if h == "GPU-0" else 0
    assert watch.observe() == [(0, "1 uncorrected ECC error(s)", "nvml")]
    assert watch.observe() == []  # the same count: nothing new


def test_without_nvml_the_watch_reads_no_device() -> None:
    watch = GpuHealthWatch(SimpleNamespace(r=NoRedis()), "n1",  # type: ignore[arg-type]
                           lambda ref: None, lambda ref, ended: None, Nvml(pynvml))
    watch.start()  # NVMLError_LibraryNotFound here: no GPUs of its own, no error
    assert not watch.nvml.available and watch.observe() == []
