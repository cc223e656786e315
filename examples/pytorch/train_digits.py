"""Train a small convolutional network on scikit-learn's handwritten digits.

The dataset (1,797 8x8 images) ships inside scikit-learn, so nothing is
downloaded when the job runs. One task trains alone; several tasks of one role
train together with PyTorch's DistributedDataParallel over gloo, finding each
other from the platform's environment exactly as OpenPAI's DDP examples do:
rank from `PAI_TASK_INDEX`, the master at `PAI_HOST_IP_<role>_0` and
`PAI_<role>_0_<label>_PORT` (a `portList` label, `SynPort` by default).

Preemption-aware: a checkpoint is written every `--checkpoint-every` steps and
whenever the platform says the task must stop (SIGTERM, or the notice file
`PAI_PREEMPTION_FILE`); a new run (`PAI_JOB_ATTEMPT_ID` says which) resumes
from the newest checkpoint in the output folder. The batch of step s depends
on s alone, so a resumed run trains on exactly what an uninterrupted one
would. After each checkpoint the task prints `PAI_CHECKPOINT_STEP=<step>` on a
line of its own, which the platform shows as the attempt's checkpoint step.

At the end it evaluates on a held-out fifth of the data, writes the model
(`model.pt`) and `metrics.json` to the output folder (`PAI_OUTPUT_DIR`), and
exits 1 if the accuracy is below `--target-accuracy`.

It trains on the GPU when the task has one (`--device auto`, the default:
CUDA when PyTorch sees a device, which in a task means the platform gave it
GPUs), with NCCL between the tasks of a DDP job; otherwise on the CPU over
gloo. `--device cpu` or `--device cuda` forces either.

    exec python3 train_digits.py --steps 1500 --target-accuracy 0.95

(`exec`: the platform's SIGTERM goes to the task's shell, which would die of
it and take the container along before a checkpoint is saved; with `exec`
this process gets it.)
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import signal
import socket
import struct
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

CHECKPOINT_PREFIX = "step-"
CHECKPOINTS_KEPT = 2
EXIT_STOPPED = 143  # what a process ended by SIGTERM reports
SIOCGIFADDR = 0x8915


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1500, help="optimizer steps in all")
    parser.add_argument("--batch-size", type=int, default=64, help="per task")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--width", type=int, default=16, help="channels of the conv layers")
    parser.add_argument("--checkpoint-every", type=int, default=100, help="steps")
    parser.add_argument("--log-every", type=int, default=100, help="steps")
    parser.add_argument("--target-accuracy", type=float, default=0.95)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="auto: CUDA when PyTorch sees a GPU, else the CPU")
    parser.add_argument("--port-label", default="SynPort",
                        help="the portList label of the DDP master's port")
    parser.add_argument("--output", default=os.environ.get("PAI_OUTPUT_DIR") or "output",
                        help="checkpoints, model.pt and metrics.json (default PAI_OUTPUT_DIR)")
    return parser.parse_args(argv)


# ------------------------------------------------------------------ the data


@dataclass(frozen=True)
class Digits:
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor


def pick_device(choice: str) -> torch.device:
    """`auto` is CUDA where PyTorch sees a device: a task sees only the GPUs
    the platform gave it, so its first is cuda:0."""
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda, but PyTorch sees no GPU (did the job ask for gpu > 0?)")
    return torch.device(choice)


def load_data(seed: int, device: torch.device) -> Digits:
    """scikit-learn's digits as 1x8x8 images scaled to [0, 1], 80/20 split,
    on the training device (all 1,797 of them fit anywhere)."""
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(digits.target, dtype=torch.long)
    train_i, test_i = train_test_split(range(len(labels)), test_size=0.2,
                                       random_state=seed, stratify=digits.target)
    return Digits(images[train_i].to(device), labels[train_i].to(device),
                  images[test_i].to(device), labels[test_i].to(device))


def batch_indices(step: int, seed: int, size: int, total: int) -> torch.Tensor:
    """The global batch of `step`: the same whoever trains it and whenever."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
    return torch.randint(0, total, (size,), generator=generator)


def make_model(width: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, width, 3, padding=1), nn.ReLU(),
        nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(2 * width * 4 * 4, 128), nn.ReLU(),
        nn.Linear(128, 10),
    )


def accuracy(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> float:
    model.eval()
    with torch.no_grad():
        predicted = model(images).argmax(dim=1)
    model.train()
    return float((predicted == labels).float().mean())


# -------------------------------------------------------------- the platform


@dataclass(frozen=True)
class Placement:
    """Where this task stands among its role's tasks."""

    rank: int
    world_size: int
    master_addr: str
    master_port: int | None


def placement(port_label: str) -> Placement:
    """Rank and master from the PAI_* environment (OpenPAI's names); a
    single task (or a run outside the platform) trains alone."""
    role = os.environ.get("PAI_CURRENT_TASK_ROLE_NAME", "")
    part = "".join(c if c.isalnum() or c == "_" else "_" for c in role)
    world = int(os.environ.get(f"PAI_TASK_ROLE_TASK_COUNT_{part}", "1"))
    if world <= 1:
        return Placement(0, 1, "127.0.0.1", None)
    rank = int(os.environ["PAI_TASK_INDEX"])
    addr = os.environ[f"PAI_HOST_IP_{part}_0"]
    ports = os.environ.get(f"PAI_{part}_0_{port_label}_PORT")
    if not ports:
        sys.exit(f"a {world}-task DDP job needs a portList label {port_label!r} "
                 f"(PAI_{part}_0_{port_label}_PORT is not set)")
    return Placement(rank, world, addr, int(ports.split(",")[0]))


def interface_of(ip: str) -> str | None:
    """The network interface holding `ip`: gloo binds to it (tasks share the
    host's network, where the host name may resolve elsewhere)."""
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            try:
                packed = fcntl.ioctl(probe.fileno(), SIOCGIFADDR,
                                     struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
        if socket.inet_ntoa(packed[20:24]) == ip:
            return name
    return None


def join_group(where: Placement, device: torch.device) -> None:
    os.environ.setdefault("MASTER_ADDR", where.master_addr)
    os.environ.setdefault("MASTER_PORT", str(where.master_port))
    own_ip = os.environ.get("PAI_CURRENT_CONTAINER_IP", "")
    interface = interface_of(own_ip) if own_ip else None
    backend = "nccl" if device.type == "cuda" else "gloo"
    if interface:  # NCCL's bootstrap, like gloo, may otherwise take another interface
        os.environ.setdefault("GLOO_SOCKET_IFNAME", interface)
        os.environ.setdefault("NCCL_SOCKET_IFNAME", interface)
    print(f"rank {where.rank} of {where.world_size}: master "
          f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
          f"{f', {backend} on {interface}' if interface else ''}", flush=True)
    dist.init_process_group(backend, init_method="env://", rank=where.rank,
                            world_size=where.world_size)


class StopNotice:
    """Set by SIGTERM, or by the platform's preemption notice file appearing
    (the signal may not reach a process started under a shell)."""

    def __init__(self) -> None:
        self.signalled = False
        self.notice_file = os.environ.get("PAI_PREEMPTION_FILE", "")
        # A file left from an earlier run in the same container is not news.
        self.stale = bool(self.notice_file) and os.path.exists(self.notice_file)
        signal.signal(signal.SIGTERM, self._on_signal)

    def _on_signal(self, signum: int, frame: object) -> None:
        self.signalled = True

    def asked(self) -> bool:
        if self.signalled:
            return True
        return bool(self.notice_file) and not self.stale and os.path.exists(self.notice_file)

    def reason(self) -> str:
        if self.notice_file and os.path.exists(self.notice_file) and not self.stale:
            with open(self.notice_file, encoding="utf-8", errors="replace") as notice:
                fields = dict(line.strip().split("=", 1) for line in notice if "=" in line)
            return f"preempted by {fields.get('PAI_PREEMPTED_BY', '?')}"
        return "SIGTERM"


# ------------------------------------------------------------- checkpoints


def checkpoints(folder: Path) -> Iterator[tuple[int, Path]]:
    for path in folder.glob(f"{CHECKPOINT_PREFIX}*.pt"):
        with contextlib.suppress(ValueError):
            yield int(path.stem[len(CHECKPOINT_PREFIX):]), path


def newest_checkpoint(folder: Path) -> dict[str, object] | None:
    """The newest checkpoint that loads (a torn one is skipped)."""
    for step, path in sorted(checkpoints(folder), reverse=True):
        try:
            state: dict[str, object] = torch.load(path, map_location="cpu")
        except Exception as error:  # a torn file: take the one before
            print(f"checkpoint {path.name} does not load ({error}); trying an older one")
            continue
        if state.get("step") == step:
            return state
    return None


def save_checkpoint(folder: Path, step: int, model: nn.Module,
                    optimizer: torch.optim.Optimizer) -> None:
    """Written whole under a temporary name, then renamed: a kill mid-write
    leaves the previous checkpoint as the newest."""
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / f"{CHECKPOINT_PREFIX}{step:09d}.pt"
    partial = final.with_suffix(".partial")
    torch.save({"step": step, "model": model.state_dict(),
                "optimizer": optimizer.state_dict()}, partial)
    with open(partial, "rb") as written:
        os.fsync(written.fileno())
    os.replace(partial, final)
    for _, old in sorted(checkpoints(folder), reverse=True)[CHECKPOINTS_KEPT:]:
        old.unlink(missing_ok=True)
    print(f"PAI_CHECKPOINT_STEP={step}", flush=True)


# ----------------------------------------------------------------- training


@dataclass
class Run:
    args: argparse.Namespace
    where: Placement
    device: torch.device
    data: Digits
    model: nn.Module
    optimizer: torch.optim.Optimizer
    folder: Path
    first_step: int = 0


def train(run: Run, stop: StopNotice) -> tuple[int, bool, float]:
    """Train from run.first_step; (the steps done, whether told to stop,
    seconds spent in training steps)."""
    args, where, data = run.args, run.where, run.data
    loss_fn = nn.CrossEntropyLoss()
    step, stopped, busy = run.first_step, False, 0.0
    while step < args.steps:
        if agreed_to_stop(stop.asked(), where, run.device):
            stopped = True
            break
        began = time.perf_counter()
        batch = batch_indices(step, args.seed, args.batch_size * where.world_size,
                              len(data.train_y))[where.rank::where.world_size].to(run.device)
        run.optimizer.zero_grad()
        loss = loss_fn(run.model(data.train_x[batch]), data.train_y[batch])
        loss.backward()
        run.optimizer.step()
        busy += time.perf_counter() - began
        step += 1
        if step % args.log_every == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
        if step % args.checkpoint_every == 0 and step < args.steps and where.rank == 0:
            save_checkpoint(run.folder, step, module_of(run.model), run.optimizer)
    return step, stopped, busy


def agreed_to_stop(asked: bool, where: Placement, device: torch.device) -> bool:
    """Every rank stops at the same step, or the others would wait forever
    in their next all-reduce."""
    if where.world_size == 1:
        return asked
    flag = torch.tensor([1 if asked else 0], device=device)  # NCCL reduces on the GPU
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def module_of(model: nn.Module) -> nn.Module:
    inner = getattr(model, "module", model)
    assert isinstance(inner, nn.Module)
    return inner


def start(args: argparse.Namespace, where: Placement, device: torch.device) -> Run:
    torch.manual_seed(args.seed)
    threads = os.environ.get("PAI_TASK_CPU_NUM")
    if threads:
        torch.set_num_threads(max(1, int(threads)))
    model = make_model(args.width).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    folder = Path(args.output) / "checkpoints"
    run = Run(args, where, device, load_data(args.seed, device), model, optimizer, folder)
    state = newest_checkpoint(folder)
    attempt = os.environ.get("PAI_JOB_ATTEMPT_ID", "0")
    if state is not None:
        model.load_state_dict(state["model"])  # type: ignore[arg-type]
        optimizer.load_state_dict(state["optimizer"])  # type: ignore[arg-type]
        run.first_step = int(state["step"])  # type: ignore[call-overload]
        print(f"attempt {attempt}: resuming from step {run.first_step}", flush=True)
    else:
        print(f"attempt {attempt}: starting at step 0", flush=True)
    print(f"training on {device}"
          f"{f' ({torch.cuda.get_device_name(device)})' if device.type == 'cuda' else ''}",
          flush=True)
    if where.world_size > 1:
        ids = [device.index or 0] if device.type == "cuda" else None
        run.model = nn.parallel.DistributedDataParallel(model, device_ids=ids)
    return run


def finish(run: Run, steps_done: int, busy: float) -> int:
    """Evaluate, write the model and metrics (rank 0), and the exit status."""
    trained = steps_done - run.first_step
    ms_per_step = 1000 * busy / trained if trained else 0.0
    model = module_of(run.model)
    test_accuracy = accuracy(model, run.data.test_x, run.data.test_y)
    parameter_sum = float(sum(p.detach().double().sum() for p in model.parameters()))
    # Every rank prints the sum: equal sums show the ranks trained one model.
    print(f"trained steps {run.first_step}..{steps_done} ({ms_per_step:.2f} ms/step); "
          f"test accuracy {test_accuracy:.4f}; parameter sum {parameter_sum:.6f}", flush=True)
    if run.where.rank == 0:
        out = Path(run.args.output)
        out.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), out / "model.pt")
        (out / "metrics.json").write_text(json.dumps({
            "steps": steps_done, "accuracy": test_accuracy, "msPerStep": ms_per_step,
            "worldSize": run.where.world_size, "device": run.device.type,
            "parameterSum": parameter_sum,
        }, indent=2) + "\n")
    if test_accuracy < run.args.target_accuracy:
        print(f"accuracy {test_accuracy:.4f} is below the target "
              f"{run.args.target_accuracy}", flush=True)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stop = StopNotice()
    where = placement(args.port_label)
    device = pick_device(args.device)
    if where.world_size > 1:
        join_group(where, device)
    run = start(args, where, device)
    steps_done, stopped, busy = train(run, stop)
    if stopped:
        print(f"stopping at step {steps_done} ({stop.reason()})", flush=True)
        if where.rank == 0 and steps_done > run.first_step:
            save_checkpoint(run.folder, steps_done, module_of(run.model), run.optimizer)
        return EXIT_STOPPED
    status = finish(run, steps_done, busy)
    if where.world_size > 1:
        dist.destroy_process_group()
    return status


if __name__ == "__main__":
    sys.exit(main())
