"""NVML, the one way the node's services reach the GPU driver: the launcher
lists the GPUs it offers the scheduler, the monitor samples them for
Prometheus.

A node without NVML (no driver, no GPU: `NVMLError_LibraryNotFound`) is a
normal node with no GPUs of its own, never an error; a device that does not
support a reading gives None for it. The library is passed in (`pynvml` from
nvidia-ml-py by default) so the mapping can be tested without a driver.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterator, Sequence
from types import TracebackType
from typing import Any

import pynvml

from shared.domain.gpuhealth import GpuReading
from shared.domain.models import Gpu

log = logging.getLogger(__name__)

MIB = 1024 * 1024

# Where two GPUs' common ancestor (nvmlGpuTopologyLevel_t) is no farther than
# a PCIe switch they talk peer to peer without crossing a host bridge: the
# same board, one switch, or several switches. A job spread over such GPUs
# (or over GPUs joined by NVLink) runs as if on one island.
NEAR_LEVELS = frozenset({pynvml.NVML_TOPOLOGY_INTERNAL, pynvml.NVML_TOPOLOGY_SINGLE,
                         pynvml.NVML_TOPOLOGY_MULTIPLE})


def topology_groups(indices: Sequence[int],
                    near: Callable[[int, int], bool | None]) -> dict[int, int] | None:
    """GPU index -> topology group: the connected components of "near".

    NVLink and switches are not always transitive in what NVML reports (A-B
    over NVLink, B-C on one switch), yet a scheduler wants islands, so any
    chain of near pairs is one group. Groups are numbered by their lowest
    index, so the same machine always reports the same numbers. `near` says
    None when it cannot tell for a pair; if it can tell for no pair at all
    the topology is unknown (None), not "every GPU alone".
    """
    parent = {index: index for index in indices}

    def root(index: int) -> int:
        while parent[index] != index:
            parent[index] = parent[parent[index]]
            index = parent[index]
        return index

    pairs = [(a, b) for n, a in enumerate(indices) for b in indices[n + 1:]]
    answers = [(a, b, near(a, b)) for a, b in pairs]
    if pairs and all(answer is None for _, _, answer in answers):
        return None
    for a, b, answer in answers:
        if answer:
            parent[max(root(a), root(b))] = min(root(a), root(b))
    numbers: dict[int, int] = {}
    for index in sorted(indices):
        numbers.setdefault(root(index), len(numbers))
    return {index: numbers[root(index)] for index in indices}


def text(value: str | bytes) -> str:
    """Older NVML bindings return bytes, newer ones str."""
    return value.decode(errors="replace") if isinstance(value, bytes) else value


class Nvml:
    """An NVML session: `open` once (False where there is no NVML), `close` at the end.

    Also a context manager, for a one-off reading (the launcher's inventory).
    """

    def __init__(self, lib: Any = pynvml) -> None:
        self.lib = lib
        self.available = False

    @property
    def error(self) -> type[Exception]:
        """The library's error class: what every call below may raise."""
        error: type[Exception] = self.lib.NVMLError
        return error

    def open(self) -> bool:
        try:
            self.lib.nvmlInit()
        except self.error as error:
            log.info("no NVML on this node (%s): it has no GPUs of its own", error)
            return False
        self.available = True
        return True

    def close(self) -> None:
        if self.available:
            with contextlib.suppress(self.error):
                self.lib.nvmlShutdown()
            self.available = False

    def __enter__(self) -> Nvml:
        self.open()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    def devices(self) -> Iterator[tuple[int, Any]]:
        """(index, handle) of every device, by index; none without NVML."""
        if not self.available:
            return
        for index in range(self.lib.nvmlDeviceGetCount()):
            yield index, self.lib.nvmlDeviceGetHandleByIndex(index)

    def maybe(self, read: Callable[[], Any]) -> Any:
        """A reading, or None where the device does not support it."""
        try:
            return read()
        except self.error:
            return None

    def optional(self, function: str, *args: Any) -> Any:
        """A call an older driver or binding may lack: None where it is
        missing or the device does not support it."""
        call = getattr(self.lib, function, None)
        return None if call is None else self.maybe(lambda: call(*args))

    def near(self, a: Any, b: Any) -> bool | None:
        """Whether two devices share an NVLink or a PCIe switch; None if NVML
        cannot say (no topology support, as in some virtual machines)."""
        level = self.optional("nvmlDeviceGetTopologyCommonAncestor", a, b)
        nvlink = self.optional("nvmlDeviceGetP2PStatus", a, b,
                               pynvml.NVML_P2P_CAPS_INDEX_NVLINK)
        if level is None and nvlink is None:
            return None
        return level in NEAR_LEVELS or nvlink == pynvml.NVML_P2P_STATUS_OK

    def identity(self, index: int, handle: Any) -> Gpu:
        """What the scheduler knows of a device: index, UUID, model, memory."""
        return Gpu(index=index, uuid=text(self.lib.nvmlDeviceGetUUID(handle)),
                   model=text(self.lib.nvmlDeviceGetName(handle)),
                   memory_mb=int(self.lib.nvmlDeviceGetMemoryInfo(handle).total) // MIB)

    def gpus(self) -> list[Gpu]:
        """Every device's identity and topology group; none without NVML, or
        if NVML fails while listing them (the node then offers no GPUs rather
        than wrong ones). Topology NVML cannot tell leaves the groups None."""
        try:
            handles = dict(self.devices())
            gpus = [self.identity(index, handle) for index, handle in handles.items()]
        except self.error as error:
            log.warning("NVML failed while listing GPUs (%s): reporting none", error)
            return []
        groups = topology_groups(list(handles), lambda a, b: self.near(handles[a], handles[b]))
        if groups is None:
            return gpus
        return [dataclasses.replace(gpu, group=groups[gpu.index]) for gpu in gpus]

    # ------------------------------------------------------------ health

    def health(self, handle: Any) -> GpuReading:
        """The device's health counters; a reading it does not support is None."""
        remapped = self.optional("nvmlDeviceGetRemappedRows", handle)
        pending = self.optional("nvmlDeviceGetRetiredPagesPendingStatus", handle)
        return GpuReading(
            uncorrected_ecc=self.optional(
                "nvmlDeviceGetTotalEccErrors", handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                pynvml.NVML_VOLATILE_ECC),
            retired_pages_pending=None if pending is None
            else pending == pynvml.NVML_FEATURE_ENABLED,
            remap_pending=None if remapped is None else bool(remapped[2]),
            remap_failed=None if remapped is None else bool(remapped[3]),
            throttle_reasons=self.optional("nvmlDeviceGetCurrentClocksThrottleReasons", handle))

    def watch_xids(self) -> Any:
        """An event set every device reports its critical XID errors to, or
        None where NVML cannot (no NVML, or a driver without events)."""
        if not self.available:
            return None
        try:
            events = self.lib.nvmlEventSetCreate()
            for _, handle in self.devices():
                self.optional("nvmlDeviceRegisterEvents", handle,
                              pynvml.nvmlEventTypeXidCriticalError, events)
        except self.error as error:
            log.warning("NVML cannot watch XID errors (%s): ECC and pages only", error)
            return None
        return events

    def xids(self, events: Any, limit: int = 100) -> list[tuple[int, int]]:
        """(GPU index, XID) of the events waiting in `events`, without waiting."""
        if events is None:
            return []
        index_of = {self.lib.nvmlDeviceGetUUID(h): i for i, h in self.devices()}
        found = []
        for _ in range(limit):
            try:
                data = self.lib.nvmlEventSetWait(events, 0)
            except self.error:  # NVML_ERROR_TIMEOUT: nothing (more) waiting
                break
            index = index_of.get(self.lib.nvmlDeviceGetUUID(data.device))
            if index is not None:
                found.append((index, int(data.eventData)))
        return found
