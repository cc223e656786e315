"""Test hosts on one machine: Linux network namespaces on a bridge.

Each host is a network namespace with its own address on a /24 used only
here, joined to a bridge in this machine's namespace (which holds the
range's first address, so the test itself reaches every host). A node host
runs its own Docker engine inside its namespace (started with `nsenter
--net`, not `ip netns exec`, which remounts /sys and breaks the engine's
cgroups; no bridge and no iptables of its own: jobs use host networking,
which is then the node's namespace). Faults are iptables rules inside a
host's namespace. Everything made here is named with the run's tag and torn
down by `Hosts.close`, engines by their PID. A run killed before its
teardown (a CI timeout, a machine restart) is swept by the next one: each run
holds a lock file named by its tag for as long as it lives, listing its
engines' folders, and `sweep_abandoned` tears down what a tag whose lock
nobody holds made (the processes in its namespaces, which it started, are
ended by PID).
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import docker

ENGINE_WAIT_SECONDS = 60
# Candidate ranges, used only inside the test hosts; the first one no route
# of this machine covers is taken.
RANGES = ("10.213.77.0/24", "10.213.78.0/24", "10.231.41.0/24", "172.30.213.0/24")
LOCKS = Path("/run/pai-test-hosts")  # a lock file a run, named by its tag
TEST_IMAGE_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "build-test-image.sh"


class HostsUnavailable(RuntimeError):
    """This machine cannot make test hosts (not root, no iproute2 or iptables)."""


def sh(*argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), check=check, capture_output=True, text=True,
                          timeout=timeout)


def can_make_hosts() -> str | None:
    """Why this machine cannot make test hosts, or None."""
    if os.geteuid() != 0:
        return "making network namespaces needs root"
    for tool in ("ip", "iptables", "nsenter", "dockerd"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None


def free_range() -> ipaddress.IPv4Network:
    routes = sh("ip", "-4", "route", "show").stdout
    taken = []
    for line in routes.splitlines():
        with contextlib.suppress(ValueError):
            taken.append(ipaddress.ip_network(line.split()[0], strict=False))
    for candidate in RANGES:
        network = ipaddress.IPv4Network(candidate)
        if not any(network.overlaps(t) for t in taken if t.prefixlen > 0):
            return network
    raise HostsUnavailable("every candidate address range is in use on this machine")


@dataclass
class Host:
    """One test host: a network namespace with an address."""

    name: str  # short: n1, cp
    netns: str
    ip: str
    veth: str
    rules: list[list[str]] = field(default_factory=list)  # iptables rules added, to remove

    @property
    def netns_path(self) -> str:
        return f"/var/run/netns/{self.netns}"

    def nsenter(self, *argv: str) -> list[str]:
        return ["nsenter", f"--net={self.netns_path}", *argv]

    def iptables(self, *rule: str) -> None:
        """Insert a rule (as for `iptables -I`), remembered for `clear_rules`."""
        sh(*self.nsenter("iptables", "-w", "-I", *rule))
        self.rules.append(list(rule))

    def clear_rules(self) -> None:
        for rule in reversed(self.rules):
            sh(*self.nsenter("iptables", "-w", "-D", *rule), check=False)
        self.rules.clear()


@dataclass
class Engine:
    """A Docker engine started inside a host's namespace."""

    host: Host
    folder: Path
    pid: int

    @property
    def socket(self) -> str:
        return f"unix://{self.folder}/docker.sock"

    def client(self, timeout: int = 30) -> docker.DockerClient:
        return docker.DockerClient(base_url=self.socket, timeout=timeout)

    def freeze(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.kill(self.pid, signal.SIGCONT)


class Hosts:
    def __init__(self, work: Path) -> None:
        reason = can_make_hosts()
        if reason:
            raise HostsUnavailable(reason)
        self.swept = sweep_abandoned()
        self.tag = uuid.uuid4().hex[:4]
        self._lock = _hold_lock(self.tag)
        self.work = work
        self.network = free_range()
        addresses = list(self.network.hosts())
        self.gateway = str(addresses[0])
        self._next = 1
        self._addresses = addresses
        self.bridge = f"pt{self.tag}br"
        self.hosts: dict[str, Host] = {}
        self.engines: dict[str, Engine] = {}
        self._forward: list[str] = ["FORWARD", "-i", self.bridge, "-o", self.bridge,
                                    "-j", "ACCEPT"]
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        sh("ip", "addr", "add", f"{self.gateway}/{self.network.prefixlen}", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")
        # Bridged traffic meets FORWARD when br_netfilter is loaded (Docker's
        # engines set its policy to DROP): let the hosts' traffic through.
        sh("iptables", "-w", "-I", *self._forward)

    def add(self, name: str) -> Host:
        netns, veth = f"pt{self.tag}{name}", f"pt{self.tag}{name}"
        ip = str(self._addresses[self._next])
        self._next += 1
        sh("ip", "netns", "add", netns)
        sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns)
        sh("ip", "link", "set", veth, "master", self.bridge, "up")
        sh("ip", "-n", netns, "addr", "add", f"{ip}/{self.network.prefixlen}", "dev", "eth0")
        sh("ip", "-n", netns, "link", "set", "eth0", "up")
        sh("ip", "-n", netns, "link", "set", "lo", "up")
        self.hosts[name] = Host(name, netns, ip, veth)
        return self.hosts[name]

    def start_engine(self, host: Host) -> Engine:
        """A private dockerd in the host's namespace, with the test image."""
        folder = self.work / f"engine-{host.name}"
        folder.mkdir(parents=True)
        log = open(folder / "dockerd.log", "ab")  # noqa: SIM115 (the engine owns it)
        proc = subprocess.Popen(
            host.nsenter("dockerd", "--data-root", str(folder / "data"),
                         "--exec-root", str(folder / "exec"),
                         "--pidfile", str(folder / "docker.pid"),
                         "--host", f"unix://{folder}/docker.sock",
                         "--bridge=none", "--iptables=false", "--ip-forward=false",
                         "--ip-masq=false", "--shutdown-timeout", "5"),
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)
        log.close()
        engine = Engine(host, folder, proc.pid)
        self.engines[host.name] = engine
        os.write(self._lock, f"{folder}\n".encode())  # for a sweep, should this run die
        deadline = time.monotonic() + ENGINE_WAIT_SECONDS
        while True:
            with contextlib.suppress(Exception):
                client = engine.client(timeout=5)
                client.ping()
                client.close()
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = (folder / "dockerd.log").read_text(errors="replace")[-2000:]
                raise HostsUnavailable(f"dockerd on {host.name} did not start:\n{tail}")
            time.sleep(0.5)
        subprocess.run([str(TEST_IMAGE_SCRIPT)], check=True, capture_output=True,
                       env={**os.environ, "DOCKER_HOST": engine.socket}, timeout=300)
        return engine

    # ------------------------------------------------------------- faults

    def cut(self, host: Host, peer: str) -> None:
        """Drop every packet between `host` and the address `peer`."""
        host.iptables("INPUT", "-s", peer, "-j", "DROP")
        host.iptables("OUTPUT", "-d", peer, "-j", "DROP")

    def lossy(self, host: Host, probability: float) -> None:
        """Drop this share of every packet the host sends or receives."""
        for chain in ("INPUT", "OUTPUT"):
            host.iptables(chain, "-i" if chain == "INPUT" else "-o", "eth0", "-m", "statistic",
                          "--mode", "random", "--probability", f"{probability:.3f}",
                          "-j", "DROP")

    def heal(self, hosts: Sequence[Host] | None = None) -> None:
        for host in hosts if hosts is not None else list(self.hosts.values()):
            host.clear_rules()

    # ------------------------------------------------------------ teardown

    def close(self) -> list[str]:
        """Tear down everything made here; what could not be (for the test to report)."""
        left: list[str] = []
        for engine in self.engines.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(engine.pid, signal.SIGCONT)
                os.kill(engine.pid, signal.SIGTERM)
        for engine in self.engines.values():
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and _alive(engine.pid):
                time.sleep(0.2)
            if _alive(engine.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(engine.pid, signal.SIGKILL)
        for engine in self.engines.values():
            _unmount_under(engine.folder)
        for host in self.hosts.values():
            host.clear_rules()
            sh("ip", "link", "del", host.veth, check=False)
            sh("ip", "netns", "del", host.netns, check=False)
        sh("ip", "link", "del", self.bridge, check=False)
        sh("iptables", "-w", "-D", *self._forward, check=False)
        listed = sh("ip", "netns", "list", check=False).stdout + \
            sh("ip", "link", "show", check=False).stdout
        left += [f"left behind: {word}" for word in listed.split()
                 if word.startswith(f"pt{self.tag}")]
        if not left:
            (LOCKS / self.tag).unlink(missing_ok=True)
        os.close(self._lock)
        return left


def _hold_lock(tag: str) -> int:
    """This run's lock file, held (flock) until the process ends, however it ends."""
    LOCKS.mkdir(mode=0o700, exist_ok=True)
    fd = os.open(LOCKS / tag, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def sweep_abandoned() -> list[str]:
    """Tear down what runs that died before their teardown made; what was swept."""
    if not LOCKS.is_dir():
        return []
    swept: list[str] = []
    for lock in sorted(LOCKS.iterdir()):
        fd = os.open(lock, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # a live run holds it
        finally:
            os.close(fd)
        swept += _tear_down_tag(lock.name, [Path(line) for line in
                                            lock.read_text().splitlines() if line])
        lock.unlink(missing_ok=True)
    return swept


def _tear_down_tag(tag: str, engine_folders: list[Path]) -> list[str]:
    prefix = f"pt{tag}"
    namespaces = [line.split()[0] for line in sh("ip", "netns", "list", check=False).stdout
                  .splitlines() if line.startswith(prefix)]
    for netns in namespaces:  # everything in them was started by that run
        for pid in sh("ip", "netns", "pids", netns, check=False).stdout.split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGCONT)  # a frozen engine
                os.kill(int(pid), signal.SIGKILL)
    for folder in engine_folders:
        _unmount_under(folder)
    names = [line.split()[1].split("@")[0].rstrip(":") for line in
             sh("ip", "-o", "link", "show", check=False).stdout.splitlines()]
    links = [name for name in names if name.startswith(prefix)]
    for link in links:
        sh("ip", "link", "del", link, check=False)
    for netns in namespaces:
        sh("ip", "netns", "del", netns, check=False)
    sh("iptables", "-w", "-D", "FORWARD", "-i", f"{prefix}br", "-o", f"{prefix}br",
       "-j", "ACCEPT", check=False)
    return namespaces + links


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except OSError:
        return False


def _unmount_under(folder: Path) -> None:
    """What a dead engine left mounted below its folder (netns, overlays)."""
    with open("/proc/mounts") as mounts:
        points = [line.split()[1] for line in mounts if line.split()[1].startswith(str(folder))]
    for point in sorted(points, key=len, reverse=True):
        sh("umount", "-l", point, check=False)
