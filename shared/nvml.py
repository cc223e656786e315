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
import logging
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any

import pynvml

from shared.models import Gpu

log = logging.getLogger(__name__)

MIB = 1024 * 1024


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

    def identity(self, index: int, handle: Any) -> Gpu:
        """What the scheduler knows of a device: index, UUID, model, memory."""
        return Gpu(index=index, uuid=text(self.lib.nvmlDeviceGetUUID(handle)),
                   model=text(self.lib.nvmlDeviceGetName(handle)),
                   memory_mb=int(self.lib.nvmlDeviceGetMemoryInfo(handle).total) // MIB)

    def gpus(self) -> list[Gpu]:
        """Every device's identity; none without NVML, or if NVML fails while
        listing them (the node then offers no GPUs rather than wrong ones)."""
        try:
            return [self.identity(index, handle) for index, handle in self.devices()]
        except self.error as error:
            log.warning("NVML failed while listing GPUs (%s): reporting none", error)
            return []
