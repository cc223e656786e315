"""Every `PAI_*` setting, declared once and read from the environment here.

Each field of `Settings` is declared with `setting(...)`: its environment
variable, default, type (a reader of shared/infra/settingtypes.py), one
line of doc, and which deployments pass it on (Compose, Kubernetes).
`load_settings` reads the environment by these declarations alone; the
README's table of settings is printed from them
(`python -m shared.infra.config --markdown`, `--update README.md`) and
tests/unit/test_settings_declared.py holds the README, `.env.example`,
docker-compose.yml and k8s/ to them.

Services call `load_settings()` once at start-up and pass the result down;
nothing else reads `os.environ` for platform settings.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from shared.domain.storage import default_log_dir
from shared.infra import settingtypes as types
from shared.infra.redisurl import parse_sentinel_url, with_login
from shared.infra.settingtypes import ConfigError

__all__ = ["DEFAULT_REDIS_URL", "DEFAULT_SECRET", "MAX_EXEC_TIMEOUT_SECONDS", "SETTINGS",
           "ConfigError", "Declaration", "Settings", "load_settings", "parse_sentinel_url",
           "settings_table", "usage_retention_days"]

DEFAULT_SECRET = "pai-dev-secret-change-me-before-production"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_ADMIN_PASSWORD = "admin-password"
# shared/state/execs.py's ceiling of an exec's timeout (an import would be a cycle).
MAX_EXEC_TIMEOUT_SECONDS = 3600
# A usage day must outlive the longest budget period (a month), or a budget
# would not see its whole period.
MIN_USAGE_RETENTION_DAYS = 32

COMPOSE, K8S = "Compose", "k8s"
BOTH = (COMPOSE, K8S)
SETTING = "pai.setting"  # the metadata key of a field's declaration
Reader = Callable[[str, str], Any]
T = TypeVar("T")


@dataclass(frozen=True)
class Declaration:
    """One setting as data. `read` turns the variable's text (never blank)
    into the value, None meaning the default; `shown` is the default as the
    docs say it where the value alone would not; `blank_is_set` makes a
    blank value a value (PAI_DEV_MODE="" is off), not the default; a
    `derived` setting is read with another, in `_derive`; `passed_by` names
    the deployments whose files set it (checked by a test)."""

    env: str
    read: Reader
    doc: str
    shown: str = ""
    blank_is_set: bool = False
    derived: bool = False
    passed_by: tuple[str, ...] = ()
    attribute: str = ""  # the Settings field; "" for one that feeds another
    default: Any = None


def declare(env: str, read: Reader, doc: str, *, shown: str = "", blank_is_set: bool = False,
            derived: bool = False, passed_by: tuple[str, ...] = ()) -> dict[str, Declaration]:
    """A field's metadata declaring it (`setting` for fields with a plain default)."""
    return {SETTING: Declaration(env, read, doc, shown, blank_is_set, derived, passed_by)}


def setting(env: str, default: T, read: Reader, doc: str, *, shown: str = "",
            blank_is_set: bool = False, derived: bool = False,
            passed_by: tuple[str, ...] = (), secret: bool = False) -> T:
    """A `Settings` field read from `env` (a `secret` one is left out of repr)."""
    return field(default=default, repr=not secret,
                 metadata=declare(env, read, doc, shown=shown, blank_is_set=blank_is_set,
                                  derived=derived, passed_by=passed_by))


def _usage_days(name: str, raw: str) -> int:
    days = types.whole(name, raw)
    if 0 < days < MIN_USAGE_RETENTION_DAYS:
        raise ConfigError(f"{name} must be 0 (for ever) or at least "
                          f"{MIN_USAGE_RETENTION_DAYS} (a budget's longest period), got {days}")
    return days


@dataclass(frozen=True)
class Settings:
    """The platform's settings, each declared where it is defined (see the
    module's doc). Tests build one directly: `Settings(redis_url=...)`."""

    # ---------------------------------------------------------------- Redis
    redis_url: str = setting(
        "PAI_REDIS_URL", DEFAULT_REDIS_URL, types.text,
        "Redis, the system of record and the message broker; "
        "`redis+sentinel://h1:26379,h2,h3/<primary>[/<db>]` follows the primary a group of Redis "
        "Sentinels names ([docs/high-availability.md](docs/high-availability.md))",
        shown="`redis://127.0.0.1:6379/0` (`make up`: its private server, with its generated "
              "password)", passed_by=BOTH, secret=True)  # carries the password once loaded
    redis_maxmemory_bytes: int = setting(
        "PAI_REDIS_MAXMEMORY", 2 * 1024**3, types.parse_size,
        "Redis's `maxmemory` (`noeviction`; redis-server gets the same value), and what the "
        "`PaiRedisMemoryHigh` alert measures against", shown="`2gb`", passed_by=BOTH)

    # ------------------------------------------------------- dev mode, admin
    dev_mode: bool = setting(
        "PAI_DEV_MODE", True, types.flag,
        "`0` outside a trial: then `PAI_SECRET_KEY` and `PAI_ADMIN_PASSWORD` are required",
        blank_is_set=True, passed_by=BOTH)
    secret_key: str = setting(
        "PAI_SECRET_KEY", DEFAULT_SECRET, types.text,
        "signs login tokens; at least 32 characters outside dev mode",
        shown="a public dev key", passed_by=BOTH, secret=True)
    admin_user: str = setting("PAI_ADMIN_USER", "admin", types.text,
                              "the bootstrap admin", passed_by=BOTH)
    admin_password: str = setting(
        "PAI_ADMIN_PASSWORD", DEFAULT_ADMIN_PASSWORD, types.text,
        "the bootstrap admin's password (the default is refused outside dev mode)",
        passed_by=BOTH, secret=True)

    # ------------------------------------------------------------------ API
    api_host: str = setting("PAI_API_HOST", "127.0.0.1", types.text,
                            "where the api listens", shown="`127.0.0.1` (image: `0.0.0.0`)",
                            passed_by=BOTH)
    api_port: int = setting("PAI_API_PORT", 9186, types.count, "the api's port", passed_by=BOTH)
    api_workers: int = setting(
        "PAI_API_WORKERS", 2, types.count,
        "api processes (gevent workers); one per CPU core the API may use "
        "(docs/performance.md)")
    api_worker_connections: int = setting(
        "PAI_API_WORKER_CONNECTIONS", 1000, types.count,
        "connections per api process (gevent); follows use at most half")
    api_follows_per_user: int = setting(
        "PAI_API_FOLLOWS_PER_USER", 8, types.count,
        "log follows one user may hold open at once, across every api process (429 beyond)")
    api_read_timeout_seconds: float = setting(
        "PAI_API_READ_TIMEOUT_SECONDS", 10.0, types.seconds,
        "a client's request headers must arrive within this, and its body within as long "
        "again (408)")
    api_trust_forwarded_for: bool = setting(
        "PAI_API_TRUST_FORWARDED_FOR", False, types.flag,
        "count logins by the first `X-Forwarded-For` address (only behind your own proxy)")
    # Login throttling (docs/security.md)
    login_failures_per_user: int = setting(
        "PAI_LOGIN_FAILURES_PER_USER", 10, types.count,
        "failed logins one user name may make per window; beyond, 429 with `Retry-After` "
        "(docs/security.md)")
    login_failures_per_ip: int = setting(
        "PAI_LOGIN_FAILURES_PER_IP", 50, types.count,
        "failed logins one client address may make per window; beyond, 429 with `Retry-After`")
    login_window_seconds: float = setting("PAI_LOGIN_WINDOW_SECONDS", 900.0, types.seconds,
                                          "the login throttling window")
    # A task's labelled ports through the API (services/api/proxy.py)
    proxy_per_user: int = setting(
        "PAI_PROXY_PER_USER", 32, types.count,
        "connections one user may hold open through the task port proxy at once, across "
        "every api process (429 beyond; docs/debugging.md)", passed_by=(COMPOSE,))
    proxy_idle_seconds: float = setting(
        "PAI_PROXY_IDLE_SECONDS", 3600.0, types.seconds,
        "how long a proxied answer or WebSocket may go without a byte either way, or wait for "
        "the task's server to answer", passed_by=(COMPOSE,))
    portal_secure_cookie: bool = setting(
        "PAI_PORTAL_SECURE_COOKIE", False, types.flag,
        "the web portal's session cookie is `Secure` (set it when users reach the api over "
        "https; docs/portal.md)")
    # The job page's charts (services/api/jobmetrics.py)
    prometheus_url: str = setting(
        "PAI_PROMETHEUS_URL", "", types.http_url,
        "a Prometheus that scrapes the node agents: the portal's job charts read its "
        "`query_range` (empty or failing: the monitor's samples)",
        shown="empty (Compose: its Prometheus)", passed_by=BOTH)
    prometheus_timeout_seconds: float = setting(
        "PAI_PROMETHEUS_TIMEOUT_SECONDS", 3.0, types.seconds,
        "the time the API gives Prometheus for one job's chart queries")
    # Exec into a running task (docs/debugging.md)
    exec_per_user: int = setting(
        "PAI_EXEC_PER_USER", 4, types.count,
        "commands one user may run in tasks at once (429 beyond; docs/debugging.md)")
    exec_slots_per_node: int = setting("PAI_EXEC_SLOTS_PER_NODE", 8, types.count,
                                       "commands a node runs at once (503 beyond)")
    exec_max_timeout_seconds: int = setting(
        "PAI_EXEC_MAX_TIMEOUT_SECONDS", 600, types.count,
        f"the longest `timeoutSec` an exec may ask for (at most {MAX_EXEC_TIMEOUT_SECONDS})")
    exec_answer_margin_seconds: float = setting(
        "PAI_EXEC_ANSWER_MARGIN_SECONDS", 10.0, types.seconds,
        "how long past a command's timeout the API waits for its node to answer (then 504)")
    exec_tty_per_user: int = setting(
        "PAI_EXEC_TTY_PER_USER", 4, types.count,
        "terminal sessions (`pai exec -it`) one user may hold open (429 beyond)")
    exec_tty_slots_per_node: int = setting(
        "PAI_EXEC_TTY_SLOTS_PER_NODE", 8, types.count,
        "terminal sessions a node serves at once, apart from the execs above")
    exec_idle_seconds: float = setting(
        "PAI_EXEC_IDLE_SECONDS", 900.0, types.seconds,
        "a terminal session with no byte either way for this long is closed")
    exec_max_session_seconds: float = setting("PAI_EXEC_MAX_SESSION_SECONDS", 12 * 3600.0,
                                              types.seconds, "a terminal session's longest length")

    # ------------------------------------------------------------ scheduler
    # Least attained service within a class (docs/scheduling.md, "Order within a class")
    las_thresholds_gpu_seconds: tuple[int, ...] = setting(
        "PAI_SCHEDULER_LAS_THRESHOLDS", (3600, 36000), types.thresholds,
        "GPU-seconds of attained service that move a job to the next least-attained-service "
        "queue within its class (empty: one queue, class then submit order; at most 15; "
        "docs/scheduling.md)", blank_is_set=True)
    las_starve_seconds: float = setting(
        "PAI_SCHEDULER_LAS_STARVE_SECONDS", 7200.0, types.seconds,
        "each such wait lifts a queued job one queue back, so nothing starves")
    las_preempt: bool = setting(
        "PAI_SCHEDULER_LAS_PREEMPT", True, types.flag,
        "a guaranteed job may preempt first-attempt work of its own VC and class that has "
        "attained more (0: never)")
    new_work_pass_seconds: float = setting(
        "PAI_SCHEDULER_NEW_WORK_SECONDS", 0.1, types.seconds_or_zero,
        "when the last pass left jobs waiting, a pass asked for only by new submits waits "
        "until this long after it, and takes every job queued meanwhile (0: at once; "
        "[scheduling](docs/scheduling.md))")
    heartbeat_seconds: float = setting(
        "PAI_HEARTBEAT_SECONDS", 5.0, types.seconds,
        "how often a node agent renews its lease ([docs/multi-node.md](docs/multi-node.md))")
    node_lost_seconds: float = setting(
        "PAI_NODE_LOST_SECONDS", 60.0, types.seconds,
        "the least silence after which the control plane declares a node lost (never before "
        "its lease + fence grace + 10 s): its tasks fail as a platform failure and their jobs "
        "are retried elsewhere, uncharged")
    launch_timeout_seconds: float = setting(
        "PAI_LAUNCH_TIMEOUT_SECONDS", 120.0, types.seconds,
        "a launch its node has not started by then is sent again")
    preemption_grace_seconds: float = setting(
        "PAI_PREEMPTION_GRACE_SECONDS", 30.0, types.seconds,
        "a preempted job's time between SIGTERM and SIGKILL, unless it asks for another "
        "(`preemptionGracePeriodSec`; [scheduling](docs/scheduling.md))")
    preemption_max_grace_seconds: float = setting(
        "PAI_PREEMPTION_MAX_GRACE_SECONDS", 300.0, types.seconds,
        "the longest grace a job may ask for")

    # ----------------------------------------------------------------- node
    node_name: str = field(default_factory=socket.gethostname, metadata=declare(
        "PAI_NODE_NAME", types.text,
        "this node's name (node agent); held with a lease: a second machine with the same "
        "name is refused ([docs/multi-node.md](docs/multi-node.md))", shown="host name",
        passed_by=BOTH))
    node_ip: str = setting(
        "PAI_NODE_IP", "", types.text,
        "the IP other tasks reach this node's tasks at; a loopback address is refused when the "
        "control plane is on another machine (shared/infra/nodeaddress.py)",
        shown="the address of the route to the control plane (`make up`: `127.0.0.1`)",
        passed_by=BOTH)
    single_machine: bool = setting(
        "PAI_SINGLE_MACHINE", False, types.flag,
        "the whole cluster is this one machine: a loopback `PAI_NODE_IP` is right though "
        "Redis is at a container's address", shown="`0` (Compose: `1`)", passed_by=(COMPOSE,))
    # Node leases and fencing (shared/domain/lease.py, docs/multi-node.md)
    node_lease_seconds: float = setting(
        "PAI_NODE_LEASE_SECONDS", 30.0, types.seconds,
        "a node agent that has not renewed its lease for this long stops its job containers "
        "(unless most nodes are cut off alike: the control plane's outage)")
    node_fence_grace_seconds: float = setting(
        "PAI_NODE_FENCE_GRACE_SECONDS", 10.0, types.seconds,
        "a fenced container's time between SIGTERM and SIGKILL")
    node_settle_seconds: float = setting(
        "PAI_NODE_SETTLE_SECONDS", 30.0, types.seconds,
        "a node back from a problem (lost, fenced, engine or storage trouble) stays healthy "
        "this long before it takes work again")
    node_peer_port: int = setting(
        "PAI_NODE_PEER_PORT", 9188, types.whole,
        "where a node's monitor answers its peers' \"do you reach the control plane?\" "
        "(signed; on `PAI_MONITOR_HOST`; `0`: any free port)", passed_by=(K8S,))
    node_state_dir: str = setting(
        "PAI_NODE_STATE_DIR", "/var/lib/pai", types.absolute_path,
        "the node agent's own files on the node's disk: the fence journal",
        shown="`/var/lib/pai` (`make up`: `.run/node`)", passed_by=BOTH)
    node_virtual_gpus: int | None = setting(
        "PAI_NODE_VIRTUAL_GPUS", None, types.whole,
        "declare GPUs on a node without NVML, for testing (environment variables only)",
        passed_by=(COMPOSE,))
    node_gpu_model: str = setting(
        "PAI_NODE_GPU_MODEL", "virtual", types.trimmed,
        "the model the declared GPUs report (a job's `gpuType` matches it); real GPUs report "
        "theirs from NVML", passed_by=(COMPOSE,))
    node_gpu_groups: tuple[tuple[int, int], ...] = setting(
        "PAI_NODE_GPU_GROUPS", (), types.text,
        "topology groups of the declared GPUs as index ranges, `0-3,4-7`; the scheduler keeps "
        "a task's GPUs in one group where it can. Real GPUs are grouped from NVML: GPUs "
        "joined by NVLink or sharing a PCIe switch ([docs/nodes.md](docs/nodes.md))",
        shown="unset (groups unknown)", derived=True, passed_by=(COMPOSE,))
    node_cpus: int | None = setting("PAI_NODE_CPUS", None, types.whole,
                                    "declare another CPU count, as Slurm's overrides",
                                    shown="the real figure", passed_by=(COMPOSE,))
    node_memory_mb: int | None = setting("PAI_NODE_MEMORY_MB", None, types.whole,
                                         "declare another memory size, as Slurm's overrides",
                                         shown="the real figure", passed_by=(COMPOSE,))
    port_range: tuple[int, int] = setting("PAI_PORT_RANGE", (15000, 40000), types.port_range,
                                          "ports given to tasks", shown="`15000-40000`",
                                          passed_by=BOTH)
    docker_host: str | None = setting("PAI_DOCKER_HOST", None, types.text,
                                      "the Docker engine of this node",
                                      shown="`DOCKER_HOST`", passed_by=BOTH)
    # Processes (threads count) one job container may hold: a fork bomb in a
    # job stops there instead of exhausting the node's PID space.
    container_pids_limit: int = setting("PAI_CONTAINER_PIDS_LIMIT", 4096, types.whole,
                                        "processes and threads one task container may hold")
    monitor_host: str = setting("PAI_MONITOR_HOST", "", types.text,
                                "where the node's metrics exporter (and its answers to its "
                                "peers) listen", shown="`PAI_NODE_IP`", passed_by=BOTH)
    monitor_port: int = setting("PAI_MONITOR_PORT", 9187, types.count,
                                "the node's metrics exporter's port", passed_by=BOTH)
    monitor_sample_seconds: float = setting(
        "PAI_MONITOR_SAMPLE_SECONDS", 10.0, types.seconds,
        "how often the node's GPUs and containers are sampled")
    gpu_health_seconds: float = setting(
        "PAI_GPU_HEALTH_SECONDS", 5.0, types.seconds,
        "how often the monitor checks its GPUs' health (docs/monitoring.md, \"GPU health\")")
    task_sample_seconds: float = setting(
        "PAI_TASK_SAMPLE_SECONDS", 15.0, types.seconds,
        "how often each running task's use is kept in Redis "
        "([accounting](docs/accounting.md), \"Idle GPUs\")")
    task_sample_keep_seconds: float = setting(
        "PAI_TASK_SAMPLE_KEEP_SECONDS", 2 * 86400.0, types.seconds,
        "how long a task attempt's samples are kept at most")
    # Idle GPUs (shared/state/idle.py)
    idle_gpu_percent: float = setting(
        "PAI_IDLE_GPU_PERCENT", 5.0, types.percent,
        "a task whose GPUs all stay below this percent for `PAI_IDLE_GPU_SECONDS` is flagged "
        "idle")
    idle_gpu_seconds: float = setting("PAI_IDLE_GPU_SECONDS", 1800.0, types.seconds,
                                      "the window of the idle flag")
    idle_gpu_grace_seconds: float = setting(
        "PAI_IDLE_GPU_GRACE_SECONDS", 1800.0, types.seconds,
        "in a VC whose `idleGpuAction` is `stop`, an idle task's job is stopped after this")

    # -------------------------------------------------------- storage, logs
    storage_roots: tuple[str, ...] = setting(
        "PAI_STORAGE_ROOTS", (), types.absolute_paths,
        "comma-separated roots that `dataDir`/`outputDir`/`codeDir` must lie under (each "
        "user's in `<root>/<user>/`, or in a share)",
        shown="none (`make up`: `.run/storage`; Compose: `/srv/pai/storage`)", passed_by=BOTH)
    # The cluster's HDFS over WebHDFS (http://namenode:9870)
    hdfs_webhdfs_url: str = setting(
        "PAI_HDFS_WEBHDFS_URL", "", types.http_url,
        "the cluster's HDFS over WebHDFS: `hdfs://` URIs of data and output prerequisites, and "
        "an `hdfs://` codeDir, go through it (empty: refused at submit; docs/storage.md)",
        shown="empty", passed_by=BOTH)
    log_dir: str = setting(
        "PAI_LOG_DIR", "", types.absolute_path,
        "the platform's own tree of full task logs (no job may mount it); set it where the "
        "node's root may write when the storage squashes root",
        shown="`<first storage root>/.pai-logs`")
    log_group: int | None = setting(
        "PAI_LOG_GROUP", None, types.whole,
        "numeric group the log tree belongs to (folders `2770`, files `0660`), so the api and "
        "scheduler, run unprivileged, read and file task logs the node agent writes as root; "
        "unset: the tree is root's (`0750`/`0640`). docs/operations.md, \"Retention\"",
        shown="unset (Compose, Kubernetes: `10001`, the image's group `pai`)", passed_by=BOTH)
    log_engine_files: str = setting(
        "PAI_LOG_ENGINE_FILES", "auto", types.engine_files,
        "where a node's monitor reads task output: `auto`, the engine's own json-file logs "
        "(`<DockerRootDir>/containers`) where its driver is json-file and the folder is "
        "readable, else through the engine; `off`, always through the engine; or the folder "
        "as this agent sees it (a container with the host's folder mounted: the Kubernetes "
        "DaemonSet mounts `/var/lib/docker/containers`)", passed_by=(K8S,))
    log_max_lines: int = setting("PAI_LOG_MAX_LINES", 100_000, types.count,
                                 "lines kept per task log in Redis while its job is live")
    log_max_bytes_per_task: int = setting(
        "PAI_LOG_MAX_BYTES_PER_TASK", 1024**3, types.parse_size,
        "a task attempt's log file stops there, with one line saying so", shown="`1gb`",
        passed_by=(COMPOSE,))
    log_level: str = setting("PAI_LOG_LEVEL", "INFO", types.log_level,
                             "every service's log level (DEBUG, INFO, WARNING, ERROR)",
                             passed_by=BOTH)
    log_format: str = setting(
        "PAI_LOG_FORMAT", "text", types.log_format,
        "`json`: one JSON object per log line (time, service, level, logger, message) for "
        "log collectors")

    # ------------------------------------------------------------ retention
    # docs/operations.md, "Retention"
    retention_days: int = setting(
        "PAI_RETENTION_DAYS", 90, types.whole,
        "finished jobs go after this many days (`0`: never; "
        "[docs/operations.md](docs/operations.md#retention))", passed_by=(COMPOSE,))
    retention_compact_after_seconds: float = setting(
        "PAI_RETENTION_COMPACT_AFTER_SECONDS", 600.0, types.seconds,
        "this long after a job finished its logs move to files and its record is compacted")
    retention_batch: int = setting("PAI_RETENTION_BATCH", 200, types.count,
                                   "jobs per retention sweep step")
    # Usage day roll-ups and records (shared/state/usage.py); see usage_retention_days.
    usage_retention_days: int = setting(
        "PAI_USAGE_RETENTION_DAYS", 400, _usage_days,
        "days each usage day roll-up is kept (0: for ever; at least "
        f"{MIN_USAGE_RETENTION_DAYS} so a monthly budget stays readable; docs/accounting.md)")

    def preemption_grace_ms(self, requested_seconds: int | None) -> int:
        """A job's grace when preempted: what it asked for (else the default),
        never above the admin's maximum."""
        seconds = self.preemption_grace_seconds if requested_seconds is None \
            else requested_seconds
        return int(min(seconds, self.preemption_max_grace_seconds) * 1000)

    @property
    def task_log_dir(self) -> str | None:
        """Where the monitor writes full task logs; None: Redis only."""
        return self.log_dir or default_log_dir(self.storage_roots)

    @property
    def platform_dirs(self) -> tuple[str, ...]:
        """Folders of the platform that no job may mount, admins' jobs included."""
        return (self.task_log_dir,) if self.task_log_dir else ()

    @property
    def default_fs_uri(self) -> str:
        """The first storage root, as OpenPAI's `$PAI_DEFAULT_FS_URI`."""
        return self.storage_roots[0] if self.storage_roots else ""


# Settings that feed another rather than being one: the Redis login goes
# into PAI_REDIS_URL (shared/infra/redisurl.py `with_login`).
REDIS_LOGIN = (
    Declaration(
        "PAI_REDIS_PASSWORD", types.text,
        "the password of Redis's user `pai`, put into `PAI_REDIS_URL` (user `pai` unless the "
        "URL names one). Redis always requires it: `make up`, Compose and k8s run Redis from "
        "the ACL of `shared/infra/redisacl.py` (no login without a password; no `CONFIG`, "
        "`KEYS`, `FLUSHALL`... for the platform; docs/security.md)", shown="unset",
        passed_by=(K8S,)),
    Declaration(
        "PAI_REDIS_PASSWORD_FILE", types.text,
        "a file holding that password, read at start-up (Compose: a generated file)",
        shown="unset", passed_by=(COMPOSE,)),
)


def _declared() -> tuple[Declaration, ...]:
    """Every declaration, in the order of the fields, the Redis login after the URL."""
    found: list[Declaration] = []
    for f in dataclasses.fields(Settings):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING \
            else f.default
        found.append(dataclasses.replace(f.metadata[SETTING], attribute=f.name,
                                         default=default))
        if f.name == "redis_url":
            found.extend(REDIS_LOGIN)
    return tuple(found)


SETTINGS = _declared()
_BY_ATTRIBUTE = {d.attribute: d for d in SETTINGS if d.attribute}
_UNSET = object()


def _read(declaration: Declaration, env: Mapping[str, str]) -> Any:
    """The setting's value from `env`, or _UNSET for its default."""
    raw = env.get(declaration.env)
    if raw is None or (not raw.strip() and not declaration.blank_is_set):
        return _UNSET
    value = declaration.read(declaration.env, raw)
    return _UNSET if value is None else value


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    """The settings `env` (else the process's environment) gives, by the
    declarations; ConfigError names the first one that is wrong."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    for declaration in SETTINGS:
        if declaration.attribute and not declaration.derived:
            value = _read(declaration, env)
            if value is not _UNSET:
                values[declaration.attribute] = value
    _derive(env, values)
    settings = Settings(**values)
    _check(settings)
    return settings


def _derive(env: Mapping[str, str], values: dict[str, Any]) -> None:
    """The settings read with another: the Redis login into the URL, the
    exporter's address from the node's, DOCKER_HOST under PAI_DOCKER_HOST,
    and what describes declared GPUs only with PAI_NODE_VIRTUAL_GPUS."""
    values["redis_url"] = with_login(values.get("redis_url", DEFAULT_REDIS_URL), env)
    # Unset, a node's IP is found at its start (shared/infra/nodeaddress.py),
    # and its exporter listens there: "" for both until then.
    values.setdefault("monitor_host", values.get("node_ip", ""))
    if "docker_host" not in values and env.get("DOCKER_HOST"):
        values["docker_host"] = env["DOCKER_HOST"]
    gpus = values.get("node_virtual_gpus")
    if "node_gpu_model" in values and gpus is None:
        raise ConfigError("PAI_NODE_GPU_MODEL names declared GPUs: set PAI_NODE_VIRTUAL_GPUS "
                          "too (real GPUs report their model through NVML)")
    values["node_gpu_groups"] = types.gpu_groups(env.get("PAI_NODE_GPU_GROUPS", ""), gpus)


def _check(settings: Settings) -> None:
    """What no single setting says alone: a usable Sentinel URL, limits, and
    no public secret or password outside dev mode."""
    parse_sentinel_url(settings.redis_url)  # a malformed Sentinel URL stops start-up here
    if settings.exec_max_timeout_seconds > MAX_EXEC_TIMEOUT_SECONDS:
        raise ConfigError(f"PAI_EXEC_MAX_TIMEOUT_SECONDS is at most {MAX_EXEC_TIMEOUT_SECONDS}")
    if settings.node_lease_seconds < 2 * settings.heartbeat_seconds:
        raise ConfigError("PAI_NODE_LEASE_SECONDS must be at least twice PAI_HEARTBEAT_SECONDS "
                          "(a lease has to survive a missed renewal)")
    if settings.container_pids_limit < 1:
        raise ConfigError("PAI_CONTAINER_PIDS_LIMIT must be at least 1 (a container needs "
                          "its own process)")
    if settings.dev_mode:
        return
    if settings.secret_key == DEFAULT_SECRET:
        raise ConfigError("PAI_SECRET_KEY must be set to a secret of your own outside dev mode")
    if len(settings.secret_key) < 32:
        raise ConfigError("PAI_SECRET_KEY must be at least 32 characters outside dev mode")
    if settings.admin_password == DEFAULT_ADMIN_PASSWORD:
        raise ConfigError("PAI_ADMIN_PASSWORD must be set outside dev mode: the first admin "
                          "would otherwise get the public default password")


def usage_retention_days(env: Mapping[str, str] | None = None) -> int:
    """PAI_USAGE_RETENTION_DAYS (default 400: last calendar year's usage is
    still whole through January, for yearly chargeback); 0 keeps usage for
    ever. Read by the usage write itself (shared/state/usage.py), which runs
    deep in shared/state/taskexits.py where no Settings reach, so it reads
    this one setting alone, by its declaration."""
    declaration = _BY_ATTRIBUTE["usage_retention_days"]
    value = _read(declaration, os.environ if env is None else env)
    return int(declaration.default if value is _UNSET else value)


# ------------------------------------------------------------ the docs


def shown_default(declaration: Declaration) -> str:
    """The default as the README's table says it."""
    if declaration.shown:
        return declaration.shown
    value = declaration.default
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "`1`" if value else "`0`"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, tuple):
        value = ",".join(str(part) for part in value)
    return f"`{value}`" if value != "" else "empty"


TABLE_BEGIN = "<!-- settings table: python -m shared.infra.config --update README.md -->"
TABLE_END = "<!-- end of the settings table -->"


def settings_table() -> str:
    """Every setting as the README's Markdown table."""
    rows = ["| variable | default | set by | meaning |", "|---|---|---|---|"]
    rows += [f"| `{d.env}` | {shown_default(d)} | {', '.join(d.passed_by)} | {d.doc} |"
             for d in SETTINGS]
    return "\n".join(rows) + "\n"


def with_table(document: str) -> str:
    """`document` with the text between its table markers replaced by the table."""
    head, begin, rest = document.partition(TABLE_BEGIN)
    _, end, tail = rest.partition(TABLE_END)
    if not begin or not end:
        raise ValueError(f"the document has no {TABLE_BEGIN!r} ... {TABLE_END!r} block")
    return f"{head}{TABLE_BEGIN}\n{settings_table()}{TABLE_END}{tail}"


def main(argv: list[str]) -> int:
    """`--markdown`: print the table; `--update FILE`: rewrite FILE's table."""
    if argv == ["--markdown"]:
        sys.stdout.write(settings_table())
        return 0
    if len(argv) == 2 and argv[0] == "--update":
        with open(argv[1], encoding="utf-8") as f:
            document = f.read()
        with open(argv[1], "w", encoding="utf-8") as f:
            f.write(with_table(document))
        return 0
    print("usage: python -m shared.infra.config --markdown | --update README.md",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
