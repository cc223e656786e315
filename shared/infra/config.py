"""Every `PAI_*` setting, read from the environment in this one place.

Services call `load_settings()` once at start-up and pass the result down;
nothing else reads `os.environ` for platform settings.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from shared.domain.priority import MAX_LAS_QUEUE
from shared.domain.storage import default_log_dir

DEFAULT_SECRET = "pai-dev-secret-change-me-before-production"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_ADMIN_PASSWORD = "admin-password"
SENTINEL_SCHEME = "redis+sentinel"
DEFAULT_SENTINEL_PORT = 26379


# shared/state/execs.py's ceiling of an exec's timeout (an import would be a cycle).
MAX_EXEC_TIMEOUT_SECONDS = 3600


class ConfigError(ValueError):
    """A setting is missing or malformed; the message names it."""


def _int(env: Mapping[str, str], name: str, default: int | None) -> int | None:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be an integer, got {raw!r}") from None
    if value < 0:
        raise ConfigError(f"{name} must not be negative, got {value}")
    return value


# A usage day must outlive the longest budget period (a month), or a budget
# would not see its whole period.
MIN_USAGE_RETENTION_DAYS = 32


def usage_retention_days(env: Mapping[str, str] | None = None) -> int:
    """PAI_USAGE_RETENTION_DAYS (default 400: last calendar year's usage is
    still whole through January, for yearly chargeback); 0 keeps usage for
    ever. Read by the usage write itself (shared/state/usage.py), which runs deep
    in shared/state/lifecycle.py where no Settings reach, so it has its own reader."""
    env = os.environ if env is None else env
    days = _int(env, "PAI_USAGE_RETENTION_DAYS", 400) or 0
    if 0 < days < MIN_USAGE_RETENTION_DAYS:
        raise ConfigError(f"PAI_USAGE_RETENTION_DAYS must be 0 (for ever) or at least "
                          f"{MIN_USAGE_RETENTION_DAYS} (a budget's longest period), got {days}")
    return days


def _number(env: Mapping[str, str], name: str, default: float, what: str,
            valid: Callable[[float], bool], rule: str) -> float:
    """A float setting (`default` when unset), refused unless `valid`."""
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be {what}, got {raw!r}") from None
    if not valid(value):
        raise ConfigError(f"{name} must be {rule}, got {raw!r}")
    return value


def _http_url(env: Mapping[str, str], name: str) -> str:
    """An http(s) base URL without its trailing slash, or "" when unset."""
    value = env.get(name, "").strip().rstrip("/")
    if value and (not value.startswith(("http://", "https://")) or len(value) <= 8):
        raise ConfigError(f"{name} must be an http:// or https:// URL, not {value!r}")
    return value


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    return _number(env, name, default, "a number of seconds", lambda v: v > 0, "positive")


def _percent(env: Mapping[str, str], name: str, default: float) -> float:
    return _number(env, name, default, "a percent", lambda v: 0 < v <= 100,
                   "above 0 and at most 100")


SIZE_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1024, "m": 1000**2, "mb": 1024**2,
              "g": 1000**3, "gb": 1024**3}


def parse_size(name: str, raw: str) -> int:
    """A byte count as Redis's own config spells it (`4gb`, `512mb`, `100000`),
    so PAI_REDIS_MAXMEMORY can be handed to redis-server unchanged."""
    text = raw.strip().lower()
    number = text.rstrip("bkmg")
    unit = text[len(number):]
    if not number.isdigit() or unit not in SIZE_UNITS:
        raise ConfigError(f"{name} must be a size like 4gb, 512mb or 1048576, got {raw!r}")
    return int(number) * SIZE_UNITS[unit]


def _port_range(raw: str) -> tuple[int, int]:
    try:
        low_text, high_text = raw.split("-", 1)
        low, high = int(low_text), int(high_text)
    except ValueError:
        raise ConfigError(f"PAI_PORT_RANGE must look like 15000-40000, got {raw!r}") from None
    if not 1 <= low <= high <= 65535:
        raise ConfigError(f"PAI_PORT_RANGE {raw!r} is not a valid port range")
    return low, high


def _gpu_groups(raw: str, gpus: int | None) -> tuple[tuple[int, int], ...]:
    """PAI_NODE_GPU_GROUPS: comma-separated index ranges ("0-3,4-7", a single
    index is a group of one), each a topology group of the declared GPUs."""
    if not raw.strip():
        return ()
    if gpus is None:
        raise ConfigError("PAI_NODE_GPU_GROUPS groups declared GPUs: set PAI_NODE_VIRTUAL_GPUS "
                          "too (real GPUs report their topology through NVML)")
    groups: list[tuple[int, int]] = []
    for part in raw.split(","):
        low_text, _, high_text = part.strip().partition("-")
        try:
            low, high = int(low_text), int(high_text or low_text)
        except ValueError:
            raise ConfigError(f"PAI_NODE_GPU_GROUPS must look like 0-3,4-7, got {raw!r}") \
                from None
        if not 0 <= low <= high < gpus:
            raise ConfigError(f"PAI_NODE_GPU_GROUPS: {part.strip()!r} is not a range of GPU "
                              f"indices 0-{gpus - 1} (PAI_NODE_VIRTUAL_GPUS={gpus})")
        if any(low <= other_high and other_low <= high for other_low, other_high in groups):
            raise ConfigError(f"PAI_NODE_GPU_GROUPS: {part.strip()!r} overlaps another group "
                              f"in {raw!r}")
        groups.append((low, high))
    return tuple(groups)


def _gpu_model(env: Mapping[str, str], gpus: int | None) -> str:
    model = env.get("PAI_NODE_GPU_MODEL", "").strip()
    if model and gpus is None:
        raise ConfigError("PAI_NODE_GPU_MODEL names declared GPUs: set PAI_NODE_VIRTUAL_GPUS "
                          "too (real GPUs report their model through NVML)")
    return model or "virtual"


def _thresholds(env: Mapping[str, str], name: str,
                default: tuple[int, ...]) -> tuple[int, ...]:
    """Comma-separated, strictly increasing positive whole numbers ("": none,
    one queue for all)."""
    if name not in env:
        return default
    raw = env[name]
    try:
        values = tuple(int(part) for part in raw.split(",") if part.strip())
    except ValueError:
        raise ConfigError(f"{name} must be whole numbers separated by commas, "
                          f"got {raw!r}") from None
    if any(v <= 0 for v in values) or list(values) != sorted(set(values)):
        raise ConfigError(f"{name} must be positive and increasing, got {raw!r}")
    if len(values) > MAX_LAS_QUEUE:
        raise ConfigError(f"{name} takes at most {MAX_LAS_QUEUE} thresholds, got {len(values)}")
    return values


def _bool(env: Mapping[str, str], name: str) -> bool:
    return env.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def _log_level(env: Mapping[str, str], default: str) -> str:
    """PAI_LOG_LEVEL in capitals, WARN spelled WARNING: Celery's --loglevel
    (which the workers pass on) knows only the long name."""
    level = (env.get("PAI_LOG_LEVEL") or default).strip().upper()
    return "WARNING" if level == "WARN" else level


def _redis_url(env: Mapping[str, str], default: str) -> str:
    """PAI_REDIS_URL, with the password of PAI_REDIS_PASSWORD (Kubernetes: from
    a Secret) or PAI_REDIS_PASSWORD_FILE (Compose: a generated file) put in it,
    user `pai` unless the URL names one: a URL with a password in it is easy
    to leak into a manifest or a shell history."""
    url = env.get("PAI_REDIS_URL") or default
    password = env.get("PAI_REDIS_PASSWORD") or ""
    password_file = env.get("PAI_REDIS_PASSWORD_FILE")
    if password:
        return _with_password(url, password)
    if not password_file:
        return url
    try:
        with open(password_file, encoding="utf-8") as f:
            password = f.read().strip()
    except OSError as error:
        raise ConfigError(f"PAI_REDIS_PASSWORD_FILE: cannot read {password_file}: "
                          f"{error.strerror}") from None
    if not password:
        raise ConfigError(f"PAI_REDIS_PASSWORD_FILE: {password_file} is empty")
    return _with_password(url, password)


def _with_password(url: str, password: str) -> str:
    """The URL with `password` (and user `pai` unless it names one) in it. The
    host part is kept as written: a Sentinel URL lists several hosts."""
    parts = urlsplit(url)
    hosts = parts.netloc.rpartition("@")[2] or "127.0.0.1"
    netloc = f"{quote(parts.username or 'pai', safe='')}:{quote(password, safe='')}@{hosts}"
    return urlunsplit(parts._replace(netloc=netloc))


@dataclass(frozen=True)
class SentinelTarget:
    """Where a Sentinel-watched Redis is: the sentinels to ask, the name they
    know the primary by, the database, and the login that both the sentinels
    and the Redis servers take (the platform's ACL user on each)."""

    sentinels: tuple[tuple[str, int], ...]
    master: str
    db: int = 0
    username: str | None = field(default=None, repr=False)
    password: str | None = field(default=None, repr=False)


def parse_sentinel_url(url: str) -> SentinelTarget | None:
    """PAI_REDIS_URL as `redis+sentinel://[user:password@]host[:port],host[:port]
    /<master>[/<db>]` (sentinel port 26379 unless given); None for any other
    URL, which redis-py reads as a single server. ConfigError names what is
    wrong, so a typo stops start-up instead of sending every service to the
    wrong server."""
    parts = urlsplit(url)
    if parts.scheme != SENTINEL_SCHEME:
        return None
    userinfo, _, hosts = parts.netloc.rpartition("@")
    username, _, password = userinfo.partition(":") if userinfo else ("", "", "")
    sentinels = tuple(_sentinel_address(entry) for entry in hosts.split(","))
    path = [unquote(p) for p in parts.path.split("/")[1:]]
    if not path or not path[0]:
        raise ConfigError(f"PAI_REDIS_URL: name the primary the sentinels watch, as in "
                          f"{SENTINEL_SCHEME}://h1:26379,h2:26379/mymaster/0")
    if len(path) > 2 or (len(path) == 2 and path[1] and not path[1].isdigit()):
        raise ConfigError(f"PAI_REDIS_URL: after the primary's name comes only the database "
                          f"number (/{path[0]}/0), not {'/'.join(path[1:])!r}")
    if parts.query or parts.fragment:
        raise ConfigError("PAI_REDIS_URL: a Sentinel URL takes no ?options or #fragment")
    return SentinelTarget(sentinels=sentinels, master=path[0],
                          db=int(path[1]) if len(path) == 2 and path[1] else 0,
                          username=unquote(username) or None,
                          password=unquote(password) or None)


def _sentinel_address(entry: str) -> tuple[str, int]:
    host, colon, port_text = entry.strip().rpartition(":")
    if not colon:
        host, port_text = port_text, str(DEFAULT_SENTINEL_PORT)
    host = host.strip("[]")
    if not host or not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ConfigError(f"PAI_REDIS_URL: {entry.strip()!r} is not a sentinel address "
                          f"(host or host:port, comma-separated)")
    return host, int(port_text)


def _log_dir(env: Mapping[str, str]) -> str:
    raw = env.get("PAI_LOG_DIR", "").strip()
    if raw and not os.path.isabs(raw):
        raise ConfigError(f"PAI_LOG_DIR must be an absolute path, got {raw!r}")
    return os.path.normpath(raw) if raw else ""


@dataclass(frozen=True)
class Settings:
    # May carry the Redis password: kept out of the dataclass repr so a
    # logged Settings never shows it.
    redis_url: str = field(default=DEFAULT_REDIS_URL, repr=False)
    api_host: str = "127.0.0.1"
    api_port: int = 9186
    secret_key: str = DEFAULT_SECRET
    dev_mode: bool = True
    admin_user: str = "admin"
    admin_password: str = DEFAULT_ADMIN_PASSWORD
    node_name: str = field(default_factory=socket.gethostname)
    node_ip: str = "127.0.0.1"
    node_virtual_gpus: int | None = None
    # What the declared GPUs call themselves (a job's gpuType matches it) and
    # their topology groups as index ranges, inclusive; ungrouped: unknown.
    node_gpu_model: str = "virtual"
    node_gpu_groups: tuple[tuple[int, int], ...] = ()
    node_cpus: int | None = None
    node_memory_mb: int | None = None
    storage_roots: tuple[str, ...] = ()
    port_range: tuple[int, int] = (15000, 40000)
    docker_host: str | None = None
    monitor_port: int = 9187
    # The node exporter listens where Prometheus reaches the node: its IP.
    monitor_host: str = "127.0.0.1"
    monitor_sample_seconds: float = 10.0
    # How often the monitor reads its GPUs' health (shared/domain/gpuhealth.py).
    gpu_health_seconds: float = 5.0
    # Per-task utilisation samples kept in Redis (shared/state/tasksamples.py):
    # one every this many seconds, for at most so long per task attempt.
    task_sample_seconds: float = 15.0
    task_sample_keep_seconds: float = 2 * 86400.0
    # Prometheus, when one scrapes the monitors: the job page's charts read it
    # (services/api/jobmetrics.py); "" means the monitor's samples only.
    prometheus_url: str = ""
    prometheus_timeout_seconds: float = 3.0
    # The cluster's HDFS over WebHDFS (http://namenode:9870): hdfs:// URIs of
    # data and output prerequisites go through it (shared/domain/prerequisites.py);
    # "" refuses them at submit.
    hdfs_webhdfs_url: str = ""
    # Idle GPUs (shared/state/idle.py): every GPU of a task below this percent for
    # this long flags it; a VC set to `stop` stops it after the grace.
    idle_gpu_percent: float = 5.0
    idle_gpu_seconds: float = 1800.0
    idle_gpu_grace_seconds: float = 1800.0
    heartbeat_seconds: float = 5.0
    node_lost_seconds: float = 60.0
    launch_timeout_seconds: float = 120.0
    # A preempted job's grace between SIGTERM and SIGKILL, unless it asks for
    # another (`preemptionGracePeriodSec`), which is held to the maximum.
    preemption_grace_seconds: float = 30.0
    preemption_max_grace_seconds: float = 300.0

    def preemption_grace_ms(self, requested_seconds: int | None) -> int:
        """A job's grace when preempted: what it asked for (else the default),
        never above the admin's maximum."""
        seconds = self.preemption_grace_seconds if requested_seconds is None \
            else requested_seconds
        return int(min(seconds, self.preemption_max_grace_seconds) * 1000)
    log_max_lines: int = 100_000
    log_level: str = "INFO"
    log_format: str = "text"  # PAI_LOG_FORMAT: text | json (one object per line)
    # Processes (threads count) one job container may hold: a fork bomb in a
    # job stops there instead of exhausting the node's PID space.
    container_pids_limit: int = 4096
    # PAI_LOG_DIR: the platform's own tree of full task logs; empty means
    # `<first storage root>/.pai-logs` (see task_log_dir).
    log_dir: str = ""
    # PAI_LOG_GROUP: a numeric group id the log tree belongs to (folders 2770,
    # files 0660) so the unprivileged api and scheduler read and file logs in
    # it; None: root's own (0750, 0640). shared/state/logfiles.py `TreeModes`.
    log_group: int | None = None

    @property
    def task_log_dir(self) -> str | None:
        """Where the monitor writes full task logs; None: Redis only."""
        return self.log_dir or default_log_dir(self.storage_roots)

    @property
    def platform_dirs(self) -> tuple[str, ...]:
        """Folders of the platform that no job may mount, admins' jobs included."""
        return (self.task_log_dir,) if self.task_log_dir else ()
    # Retention (docs/operations.md, "Retention"): finished jobs older than
    # this many days go with every key they had (0: kept for ever); this long
    # after a job finished, its log streams leave Redis for the files of the
    # log tree and its record is compacted; at most this many jobs per sweep.
    retention_days: int = 90
    retention_compact_after_seconds: float = 600.0
    retention_batch: int = 200
    # Usage day roll-ups and records (shared/state/usage.py) expire this many days
    # after their day ended (0: kept for ever); see usage_retention_days.
    usage_retention_days: int = 400
    # A task attempt's log file stops growing here, with one line saying so (0: no cap).
    log_max_bytes_per_task: int = 1024**3
    # Redis's maxmemory as the operator set it (redis-server gets the same
    # value): the API exports it beside the memory used, for the alert.
    redis_maxmemory_bytes: int = 2 * 1024**3
    # The API's capacity (docs/performance.md): log follows one user may hold
    # at once across every API process, the seconds a client has to send its
    # request headers (and then its body), and connections per API process.
    api_follows_per_user: int = 8
    api_read_timeout_seconds: float = 10.0
    # Login throttling (docs/security.md): failed logins allowed per user name
    # and per client address within the window, and whether X-Forwarded-For
    # names the client (only behind a proxy the operator runs).
    login_failures_per_user: int = 10
    login_failures_per_ip: int = 50
    login_window_seconds: float = 900.0
    api_trust_forwarded_for: bool = False
    api_worker_connections: int = 1000
    # Exec into a running task (docs/debugging.md): the longest timeout a
    # command may ask for, execs one user may run at once, execs one node
    # runs at once, and how long past a command's timeout the API waits for
    # its node to answer before it says 504.
    exec_max_timeout_seconds: int = 600
    exec_per_user: int = 4
    exec_slots_per_node: int = 8
    exec_answer_margin_seconds: float = 10.0
    # Interactive exec (a terminal over a WebSocket, docs/debugging.md):
    # sessions one user may hold open at once, sessions one node serves at
    # once (apart from the execs above), how long a session may go without a
    # byte either way, and its longest length.
    exec_tty_per_user: int = 4
    exec_tty_slots_per_node: int = 8
    exec_idle_seconds: float = 900.0
    exec_max_session_seconds: float = 12 * 3600.0
    # The web portal's session cookie carries Secure: set it when users reach
    # the API over https (a proxy of the operator's), docs/portal.md.
    portal_secure_cookie: bool = False
    # Least attained service within a priority class (docs/scheduling.md,
    # "Order within a class"): the GPU-seconds a job's attained service must
    # reach to drop to the next queue, how long a wait lifts a job one queue
    # back, and whether a job still in a higher queue may preempt its own
    # VC's running work of its class that has dropped lower.
    las_thresholds_gpu_seconds: tuple[int, ...] = (3600, 36000)
    las_starve_seconds: float = 7200.0
    las_preempt: bool = True
    api_workers: int = 2  # PAI_API_WORKERS: gunicorn processes (docs/performance.md)

    @property
    def default_fs_uri(self) -> str:
        """The first storage root, as OpenPAI's `$PAI_DEFAULT_FS_URI`."""
        return self.storage_roots[0] if self.storage_roots else ""


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    env = os.environ if env is None else env
    defaults = Settings()
    roots_raw = env.get("PAI_STORAGE_ROOTS", "")
    roots = tuple(
        os.path.normpath(r.strip().removeprefix("file://"))
        for r in roots_raw.split(",") if r.strip()
    )
    for root in roots:
        if not os.path.isabs(root):
            raise ConfigError(f"PAI_STORAGE_ROOTS entries must be absolute paths, got {root!r}")
    dev_mode = _bool(env, "PAI_DEV_MODE") if "PAI_DEV_MODE" in env else True
    virtual_gpus = _int(env, "PAI_NODE_VIRTUAL_GPUS", None)
    settings = Settings(
        redis_url=_redis_url(env, defaults.redis_url),
        api_host=env.get("PAI_API_HOST") or defaults.api_host,
        api_port=_int(env, "PAI_API_PORT", defaults.api_port) or defaults.api_port,
        secret_key=env.get("PAI_SECRET_KEY") or DEFAULT_SECRET,
        dev_mode=dev_mode,
        admin_user=env.get("PAI_ADMIN_USER") or defaults.admin_user,
        admin_password=env.get("PAI_ADMIN_PASSWORD") or defaults.admin_password,
        node_name=env.get("PAI_NODE_NAME") or defaults.node_name,
        node_ip=env.get("PAI_NODE_IP") or defaults.node_ip,
        node_virtual_gpus=virtual_gpus,
        node_gpu_model=_gpu_model(env, virtual_gpus),
        node_gpu_groups=_gpu_groups(env.get("PAI_NODE_GPU_GROUPS", ""), virtual_gpus),
        node_cpus=_int(env, "PAI_NODE_CPUS", None),
        node_memory_mb=_int(env, "PAI_NODE_MEMORY_MB", None),
        storage_roots=roots,
        port_range=_port_range(env["PAI_PORT_RANGE"]) if env.get("PAI_PORT_RANGE")
        else defaults.port_range,
        docker_host=env.get("PAI_DOCKER_HOST") or env.get("DOCKER_HOST") or None,
        monitor_port=_int(env, "PAI_MONITOR_PORT", defaults.monitor_port) or defaults.monitor_port,
        monitor_host=env.get("PAI_MONITOR_HOST") or env.get("PAI_NODE_IP")
        or defaults.monitor_host,
        monitor_sample_seconds=_seconds(env, "PAI_MONITOR_SAMPLE_SECONDS",
                                        defaults.monitor_sample_seconds),
        gpu_health_seconds=_seconds(env, "PAI_GPU_HEALTH_SECONDS", defaults.gpu_health_seconds),
        task_sample_seconds=_seconds(env, "PAI_TASK_SAMPLE_SECONDS", defaults.task_sample_seconds),
        task_sample_keep_seconds=_seconds(env, "PAI_TASK_SAMPLE_KEEP_SECONDS",
                                          defaults.task_sample_keep_seconds),
        prometheus_url=_http_url(env, "PAI_PROMETHEUS_URL"),
        hdfs_webhdfs_url=_http_url(env, "PAI_HDFS_WEBHDFS_URL"),
        prometheus_timeout_seconds=_seconds(env, "PAI_PROMETHEUS_TIMEOUT_SECONDS",
                                            defaults.prometheus_timeout_seconds),
        idle_gpu_percent=_percent(env, "PAI_IDLE_GPU_PERCENT", defaults.idle_gpu_percent),
        idle_gpu_seconds=_seconds(env, "PAI_IDLE_GPU_SECONDS", defaults.idle_gpu_seconds),
        idle_gpu_grace_seconds=_seconds(env, "PAI_IDLE_GPU_GRACE_SECONDS",
                                        defaults.idle_gpu_grace_seconds),
        heartbeat_seconds=_seconds(env, "PAI_HEARTBEAT_SECONDS", defaults.heartbeat_seconds),
        node_lost_seconds=_seconds(env, "PAI_NODE_LOST_SECONDS", defaults.node_lost_seconds),
        launch_timeout_seconds=_seconds(env, "PAI_LAUNCH_TIMEOUT_SECONDS",
                                        defaults.launch_timeout_seconds),
        preemption_grace_seconds=_seconds(env, "PAI_PREEMPTION_GRACE_SECONDS",
                                          defaults.preemption_grace_seconds),
        preemption_max_grace_seconds=_seconds(env, "PAI_PREEMPTION_MAX_GRACE_SECONDS",
                                              defaults.preemption_max_grace_seconds),
        log_max_lines=_int(env, "PAI_LOG_MAX_LINES", defaults.log_max_lines)
        or defaults.log_max_lines,
        log_level=_log_level(env, defaults.log_level),
        log_format=(env.get("PAI_LOG_FORMAT") or defaults.log_format).lower(),
        container_pids_limit=_int(env, "PAI_CONTAINER_PIDS_LIMIT",
                                  defaults.container_pids_limit) or 0,
        log_dir=_log_dir(env),
        log_group=_int(env, "PAI_LOG_GROUP", None),
        api_follows_per_user=_int(env, "PAI_API_FOLLOWS_PER_USER",
                                  defaults.api_follows_per_user)
        or defaults.api_follows_per_user,
        api_read_timeout_seconds=_seconds(env, "PAI_API_READ_TIMEOUT_SECONDS",
                                          defaults.api_read_timeout_seconds),
        login_failures_per_user=_int(env, "PAI_LOGIN_FAILURES_PER_USER",
                                     defaults.login_failures_per_user)
        or defaults.login_failures_per_user,
        login_failures_per_ip=_int(env, "PAI_LOGIN_FAILURES_PER_IP",
                                   defaults.login_failures_per_ip)
        or defaults.login_failures_per_ip,
        login_window_seconds=_seconds(env, "PAI_LOGIN_WINDOW_SECONDS",
                                      defaults.login_window_seconds),
        api_trust_forwarded_for=_bool(env, "PAI_API_TRUST_FORWARDED_FOR"),
        portal_secure_cookie=_bool(env, "PAI_PORTAL_SECURE_COOKIE"),
        retention_days=_int(env, "PAI_RETENTION_DAYS", defaults.retention_days) or 0,
        retention_compact_after_seconds=_seconds(env, "PAI_RETENTION_COMPACT_AFTER_SECONDS",
                                                 defaults.retention_compact_after_seconds),
        retention_batch=_int(env, "PAI_RETENTION_BATCH", defaults.retention_batch)
        or defaults.retention_batch,
        usage_retention_days=usage_retention_days(env),
        log_max_bytes_per_task=parse_size("PAI_LOG_MAX_BYTES_PER_TASK",
                                          env["PAI_LOG_MAX_BYTES_PER_TASK"])
        if env.get("PAI_LOG_MAX_BYTES_PER_TASK", "").strip()
        else defaults.log_max_bytes_per_task,
        redis_maxmemory_bytes=parse_size("PAI_REDIS_MAXMEMORY", env["PAI_REDIS_MAXMEMORY"])
        if env.get("PAI_REDIS_MAXMEMORY", "").strip() else defaults.redis_maxmemory_bytes,
        api_worker_connections=_int(env, "PAI_API_WORKER_CONNECTIONS",
                                    defaults.api_worker_connections)
        or defaults.api_worker_connections,
        exec_max_timeout_seconds=_int(env, "PAI_EXEC_MAX_TIMEOUT_SECONDS",
                                      defaults.exec_max_timeout_seconds)
        or defaults.exec_max_timeout_seconds,
        exec_per_user=_int(env, "PAI_EXEC_PER_USER", defaults.exec_per_user)
        or defaults.exec_per_user,
        exec_slots_per_node=_int(env, "PAI_EXEC_SLOTS_PER_NODE", defaults.exec_slots_per_node)
        or defaults.exec_slots_per_node,
        exec_answer_margin_seconds=_seconds(env, "PAI_EXEC_ANSWER_MARGIN_SECONDS",
                                            defaults.exec_answer_margin_seconds),
        exec_tty_per_user=_int(env, "PAI_EXEC_TTY_PER_USER", defaults.exec_tty_per_user)
        or defaults.exec_tty_per_user,
        exec_tty_slots_per_node=_int(env, "PAI_EXEC_TTY_SLOTS_PER_NODE",
                                     defaults.exec_tty_slots_per_node)
        or defaults.exec_tty_slots_per_node,
        exec_idle_seconds=_seconds(env, "PAI_EXEC_IDLE_SECONDS", defaults.exec_idle_seconds),
        exec_max_session_seconds=_seconds(env, "PAI_EXEC_MAX_SESSION_SECONDS",
                                          defaults.exec_max_session_seconds),
        las_thresholds_gpu_seconds=_thresholds(env, "PAI_SCHEDULER_LAS_THRESHOLDS",
                                               defaults.las_thresholds_gpu_seconds),
        las_starve_seconds=_seconds(env, "PAI_SCHEDULER_LAS_STARVE_SECONDS",
                                    defaults.las_starve_seconds),
        las_preempt=_bool(env, "PAI_SCHEDULER_LAS_PREEMPT")
        if env.get("PAI_SCHEDULER_LAS_PREEMPT", "").strip() else defaults.las_preempt,
        api_workers=_int(env, "PAI_API_WORKERS", defaults.api_workers) or defaults.api_workers,
    )
    parse_sentinel_url(settings.redis_url)  # a malformed Sentinel URL stops start-up here
    if settings.log_format not in ("text", "json"):
        raise ConfigError(f"PAI_LOG_FORMAT is text or json, not {settings.log_format!r}")
    if settings.log_level not in ("DEBUG", "INFO", "WARN", "WARNING", "ERROR", "CRITICAL"):
        raise ConfigError(f"PAI_LOG_LEVEL is DEBUG, INFO, WARNING, ERROR or CRITICAL, "
                          f"not {settings.log_level!r}")
    if settings.exec_max_timeout_seconds > MAX_EXEC_TIMEOUT_SECONDS:
        raise ConfigError(f"PAI_EXEC_MAX_TIMEOUT_SECONDS is at most {MAX_EXEC_TIMEOUT_SECONDS}")
    if settings.container_pids_limit < 1:
        raise ConfigError("PAI_CONTAINER_PIDS_LIMIT must be at least 1 (a container needs "
                          "its own process)")
    if not settings.dev_mode and settings.secret_key == DEFAULT_SECRET:
        raise ConfigError("PAI_SECRET_KEY must be set to a secret of your own outside dev mode")
    if not settings.dev_mode and len(settings.secret_key) < 32:
        raise ConfigError("PAI_SECRET_KEY must be at least 32 characters outside dev mode")
    if not settings.dev_mode and settings.admin_password == DEFAULT_ADMIN_PASSWORD:
        raise ConfigError("PAI_ADMIN_PASSWORD must be set outside dev mode: the first admin "
                          "would otherwise get the public default password")
    return settings
