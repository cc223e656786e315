"""A GPU node's own readings on the real driver: what the launcher offers the
scheduler, what the monitor samples and the health watch judges, while the
PyTorch example trains on the GPU.

- inventory: the launcher's `read_nvml_gpus` (model, memory, topology group)
  and how long the reading takes;
- samples: the monitor's `NvmlReader.read` (every Prometheus GPU series),
  idle and while `examples/pytorch/train_digits.py --device cuda` runs in a
  subprocess: the peaks of utilization, memory and power it saw, and whether
  the trainer's PID showed among the GPU's processes;
- health: rounds of the monitor's `GpuHealthWatch.check` against a throwaway
  Redis: time per round, faults found on a healthy GPU (none expected), which
  signals this driver supports, whether XID events can be watched; then an
  injected XID 79 must be marked on the next round;
- training: the example's own ms/step and accuracy on CUDA beside the CPU.

Without NVML (no driver, as on the CI machines) it reports `gpus 0` and
stops there. PAI_BENCH_GPU_STEPS sets the training steps (3,000).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import redis

from bench import Figures, Table, percentile, throwaway_redis, time_calls
from services.launcher.inventory import read_nvml_gpus
from services.monitor.gpuhealth import GpuHealthWatch
from services.monitor.sampling import NvmlReader
from shared.domain.gpuhealth import GpuReading
from shared.node.containers import TaskRef
from shared.node.nvml import Nvml
from shared.state import gpufaults
from shared.state.store import Store

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "pytorch" / "train_digits.py"
NODE = "bench-gpu-node"
HEALTH_ROUNDS = 50
SAMPLE_SECONDS = 0.1


def _inventory() -> tuple[Table, float]:
    """The launcher's GPUs, and the milliseconds reading them took."""
    start = time.perf_counter()
    gpus = read_nvml_gpus()
    ms = (time.perf_counter() - start) * 1000
    return {f"gpu {g.index}": {"model": g.model, "memory MiB": g.memory_mb,
                               "group": "?" if g.group is None else g.group}
            for g in gpus}, ms


def _health(url: str) -> Figures:
    store = Store(redis.Redis.from_url(url, decode_responses=True))
    stopped: list[TaskRef] = []
    watch = GpuHealthWatch(store, NODE, stop=stopped.append, tell=lambda ref, ended: None)
    watch.start()
    try:
        supported = _supported(watch.nvml)
        rounds = time_calls(watch.check, HEALTH_ROUNDS, warmup=1)
        healthy_marks = len(gpufaults.read_faults(store.r).get(NODE, {}))
        gpufaults.inject(store.r, NODE, 0, xid=79)
        marked = watch.check()
        return {"health round p50 ms": round(percentile(rounds, 0.5), 2),
                "health round max ms": round(max(rounds), 2),
                "faults on a healthy GPU": healthy_marks,
                "xid events watched": int(watch.watching_xids),
                "signals supported": supported or "none",
                "injected XID 79 marked": ", ".join(f.reason for f in marked) or "NOT MARKED"}
    finally:
        watch.close()
        store.r.close()


def _supported(nvml: Nvml) -> str:
    for _, handle in nvml.devices():
        reading: GpuReading = nvml.health(handle)
        return " ".join(name for name, value in dataclasses.asdict(reading).items()
                        if value is not None)
    return ""


def _train(device: str, steps: int, reader: NvmlReader | None) -> dict[str, float | int | str]:
    """The example on `device`; with a reader, the GPU's peaks while it ran."""
    peaks = {"util %": 0.0, "memory MiB": 0.0, "power W": 0.0}
    seen_pid = False
    with tempfile.TemporaryDirectory(prefix="pai-bench-gpu-") as out:
        proc = subprocess.Popen(
            [sys.executable, str(EXAMPLE), "--device", device, "--steps", str(steps),
             "--checkpoint-every", str(steps), "--output", out],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        log: list[str] = []
        drain = threading.Thread(target=lambda: log.extend(proc.stdout or ()), daemon=True)
        drain.start()
        while proc.poll() is None and reader is not None:
            for sample in reader.read() or ():
                peaks["util %"] = max(peaks["util %"], sample.utilization_percent or 0)
                peaks["memory MiB"] = max(peaks["memory MiB"],
                                          (sample.memory_used_bytes or 0) / 2**20)
                peaks["power W"] = max(peaks["power W"], sample.power_watts or 0)
                seen_pid = seen_pid or proc.pid in (sample.process_pids or ())
            time.sleep(SAMPLE_SECONDS)
        proc.wait()
        drain.join(timeout=10)
        metrics_file = Path(out) / "metrics.json"
        if proc.returncode != 0 or not metrics_file.exists():
            return {"error": f"exit {proc.returncode}: {''.join(log)[-300:]!r}"}
        metrics = json.loads(metrics_file.read_text())
    row: dict[str, float | int | str] = {"ms/step": round(metrics["msPerStep"], 3),
                                         "accuracy": round(metrics["accuracy"], 4)}
    if reader is not None:
        row.update({k: round(v, 1) for k, v in peaks.items()})
        row["trainer pid seen"] = int(seen_pid)
    return row


def run() -> Figures:
    inventory, inventory_ms = _inventory()
    if not inventory:
        return {"gpus": 0, "note": "no NVML on this machine: nothing to read"}
    figures: dict[str, object] = {"gpus": len(inventory), "inventory": inventory,
                                  "inventory read ms": round(inventory_ms, 1)}
    reader = NvmlReader()
    reader.start()
    try:
        figures["sample read p50 ms (idle)"] = round(
            percentile(time_calls(reader.read, 50), 0.5), 2)
        with throwaway_redis() as url:
            figures.update(_health(url))
        steps = int(os.environ.get("PAI_BENCH_GPU_STEPS", "3000"))
        figures["training"] = {"cuda": _train("cuda", steps, reader),
                               "cpu": _train("cpu", steps, None)}
    finally:
        reader.close()
    return figures  # type: ignore[return-value]
