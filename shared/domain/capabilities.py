"""Linux capabilities of job containers: what every job loses, what an admin may give back.

Job code is untrusted and shares the node's network namespace (host
networking), so a capability that is harmless in a private network namespace
can reach the host there. Docker's default set keeps fourteen capabilities;
a training job (read data, compute, write output, talk to its peers on its
own ports) needs only the few that let an image's entrypoint, running as
root, prepare its files and drop to a user of its own. Everything else is
dropped, and `no-new-privileges` keeps a setuid binary from bringing any of
it back.

What OpenPAI let a job ask for (IPC_LOCK for RDMA, a debugger's SYS_PTRACE)
is granted only when the job names it in `extras.capabilities` and an admin
has put it on the allow-list of the job's virtual cluster. Capabilities that
hand a job the host (SYS_ADMIN, NET_ADMIN in the host's network namespace,
SYS_MODULE, DAC_READ_SEARCH...) can never be allowed, not even by an admin.
"""

from __future__ import annotations

from collections.abc import Iterable

# Dropped from every job container, with the reason a job does not need it.
DROPPED: dict[str, str] = {
    "NET_RAW": "raw and packet sockets on the host's network: sniffing every job's and "
               "service's traffic, spoofing ARP/ICMP; training talks TCP/UDP",
    "MKNOD": "device nodes: a job gets its GPUs from the runtime, never makes devices",
    "SYS_CHROOT": "chroot is a step in known container escapes; training never chroots",
    "AUDIT_WRITE": "the kernel audit log is the host's (not namespaced): a job could forge "
                   "records in it",
    "SETFCAP": "file capabilities planted on shared storage would grant privileges to "
               "whoever runs the file outside the job",
    "SETPCAP": "moves capabilities between sets and bounding sets; nothing a job runs "
               "needs it once the set is fixed at start",
    "NET_BIND_SERVICE": "ports below 1024 on the host's network belong to the host's "
                        "services (ssh, DNS, HTTP): a job could impersonate them; jobs get "
                        "their ports from PAI_PORT_RANGE (kept when that range reaches "
                        "below 1024)",
}

# Kept from Docker's default set: what images that start as root and drop to
# a user (gosu, su-exec, entrypoints that chown their folders) need, and what
# root inside the container needs to use files of other uids in its mounts.
KEPT: dict[str, str] = {
    "CHOWN": "entrypoints chown their working folders before dropping to a user",
    "DAC_OVERRIDE": "root in the container reads and writes its mounts whoever owns them",
    "FOWNER": "chmod and utime on files the job's own user does not own",
    "FSETID": "keeps setgid folders working for group-shared outputs",
    "KILL": "signals processes of other uids inside the job (its own process tree)",
    "SETUID": "drop from root to the image's user (gosu, su-exec, su)",
    "SETGID": "drop from root to the image's group",
}

# Beyond the dropped ones, what an admin may allow per virtual cluster: the
# capabilities OpenPAI's jobs asked for that stay inside the job.
EXTRA_GRANTABLE: dict[str, str] = {
    "IPC_LOCK": "RDMA (InfiniBand, RoCE) pins memory; locked memory is still charged to "
                "the container's memory limit",
    "SYS_PTRACE": "debuggers and profilers (gdb, py-spy) on the job's own processes, "
                  "which live in the container's own PID namespace",
}

GRANTABLE: frozenset[str] = frozenset(DROPPED) | frozenset(EXTRA_GRANTABLE)
MAX_REQUESTED = len(GRANTABLE)
PRIVILEGED_PORTS_END = 1024


def dropped_capabilities(port_range: tuple[int, int]) -> list[str]:
    """What a job container loses; NET_BIND_SERVICE only when the operator's
    port range leaves every job port at 1024 or above."""
    keep_bind = port_range[0] < PRIVILEGED_PORTS_END
    return sorted(c for c in DROPPED if not (keep_bind and c == "NET_BIND_SERVICE"))


def capability_list_errors(value: object) -> list[str]:
    """Why `value` is not a list of capabilities a VC may allow or a job may
    ask for (empty when it is). Names are Docker's, without the CAP_ prefix."""
    if not isinstance(value, list):
        return ["Must be a list of capability names."]
    if len(value) > MAX_REQUESTED:
        return [f"At most {MAX_REQUESTED} capabilities."]
    errors = []
    for item in value:
        if not isinstance(item, str):
            errors.append("Every capability must be a string.")
        elif item not in GRANTABLE:
            errors.append(f"{item[:64]!r} cannot be granted to a job; one of: "
                          f"{', '.join(sorted(GRANTABLE))}.")
    return errors


def refused_capabilities(requested: Iterable[str], allowed: Iterable[str]) -> list[str]:
    """The requested capabilities the allow-list does not name."""
    permitted = set(allowed)
    return sorted({c for c in requested if c not in permitted})
