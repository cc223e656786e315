"""Settings from the environment (shared/infra/config.py), given as mappings."""

from __future__ import annotations

import re

import pytest

from shared.infra.config import (
    DEFAULT_REDIS_URL,
    DEFAULT_SECRET,
    ConfigError,
    Settings,
    load_settings,
    parse_sentinel_url,
)
from shared.infra.redisurl import SentinelTarget


def test_defaults_with_an_empty_environment() -> None:
    settings = load_settings({})
    assert settings.redis_url == DEFAULT_REDIS_URL == "redis://127.0.0.1:6379/0"
    assert (settings.api_host, settings.api_port) == ("127.0.0.1", 9186)
    assert settings.secret_key == DEFAULT_SECRET
    assert settings.dev_mode is True
    assert settings.node_ip == ""  # found at a node agent's start (shared/infra/nodeaddress.py)
    assert settings.node_name  # the host name
    assert settings.node_virtual_gpus is None
    assert settings.node_cpus is None
    assert settings.node_memory_mb is None
    assert settings.storage_roots == ()
    assert settings.default_fs_uri == ""
    assert settings.port_range == (15000, 40000)
    assert settings.docker_host is None
    assert settings.log_max_lines == 100_000
    assert settings.api_follows_per_user == 8
    assert settings.api_read_timeout_seconds == 10.0
    assert settings.api_worker_connections == 1000


def test_load_settings_without_a_mapping_reads_os_environ(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PAI_API_PORT", "9999")
    monkeypatch.setenv("PAI_DEV_MODE", "1")
    assert load_settings().api_port == 9999


def test_values_from_the_mapping_override_defaults() -> None:
    settings = load_settings({
        "PAI_REDIS_URL": "redis://redis.example:6380/2",
        "PAI_API_HOST": "0.0.0.0",
        "PAI_API_PORT": "8080",
        "PAI_ADMIN_USER": "root",
        "PAI_ADMIN_PASSWORD": "s3cret-pass",
        "PAI_NODE_NAME": "gpu-01",
        "PAI_NODE_IP": "10.0.0.5",
        "PAI_NODE_VIRTUAL_GPUS": "8",
        "PAI_NODE_CPUS": "32",
        "PAI_NODE_MEMORY_MB": "65536",
        "PAI_LOG_MAX_LINES": "500",
    })
    assert settings.redis_url == "redis://redis.example:6380/2"
    assert (settings.api_host, settings.api_port) == ("0.0.0.0", 8080)
    assert (settings.admin_user, settings.admin_password) == ("root", "s3cret-pass")
    assert (settings.node_name, settings.node_ip) == ("gpu-01", "10.0.0.5")
    assert (settings.node_virtual_gpus, settings.node_cpus, settings.node_memory_mb) == (
        8, 32, 65536)
    assert settings.log_max_lines == 500


def test_zero_virtual_gpus_is_kept_not_defaulted() -> None:
    assert load_settings({"PAI_NODE_VIRTUAL_GPUS": "0"}).node_virtual_gpus == 0


@pytest.mark.parametrize(("env", "model", "groups"), [
    pytest.param({}, "virtual", (), id="defaults"),
    pytest.param({"PAI_NODE_VIRTUAL_GPUS": "8", "PAI_NODE_GPU_MODEL": " A100 ",
                  "PAI_NODE_GPU_GROUPS": "0-3, 4-7"}, "A100", ((0, 3), (4, 7)),
                 id="model and two groups"),
    pytest.param({"PAI_NODE_VIRTUAL_GPUS": "4", "PAI_NODE_GPU_GROUPS": "2,0-1"}, "virtual",
                 ((2, 2), (0, 1)), id="a single index is a group of one"),
    pytest.param({"PAI_NODE_GPU_MODEL": "", "PAI_NODE_GPU_GROUPS": " "}, "virtual", (),
                 id="empty values are unset (as Compose passes them)"),
])
def test_declared_gpu_model_and_groups(env: dict[str, str], model: str,
                                       groups: tuple[tuple[int, int], ...]) -> None:
    settings = load_settings(env)
    assert (settings.node_gpu_model, settings.node_gpu_groups) == (model, groups)


@pytest.mark.parametrize(("env", "message"), [
    pytest.param({"PAI_NODE_GPU_GROUPS": "0-3"}, "set PAI_NODE_VIRTUAL_GPUS", id="no GPUs"),
    pytest.param({"PAI_NODE_GPU_MODEL": "A100"}, "set PAI_NODE_VIRTUAL_GPUS",
                 id="model without GPUs"),
    pytest.param({"PAI_NODE_VIRTUAL_GPUS": "8", "PAI_NODE_GPU_GROUPS": "0-3;4-7"},
                 "must look like 0-3,4-7", id="wrong separator"),
    pytest.param({"PAI_NODE_VIRTUAL_GPUS": "8", "PAI_NODE_GPU_GROUPS": "a-b"},
                 "must look like 0-3,4-7", id="not numbers"),
    pytest.param({"PAI_NODE_VIRTUAL_GPUS": "8", "PAI_NODE_GPU_GROUPS": "0-3,"},
                 "must look like 0-3,4-7", id="empty part"),
    pytest.param({"PAI_NODE_VIRTUAL_GPUS": "8", "PAI_NODE_GPU_GROUPS": "3-0"},
                 "'3-0' is not a range of GPU indices 0-7", id="backwards"),
    pytest.param({"PAI_NODE_VIRTUAL_GPUS": "8", "PAI_NODE_GPU_GROUPS": "4-8"},
                 "'4-8' is not a range of GPU indices 0-7", id="past the last GPU"),
    pytest.param({"PAI_NODE_VIRTUAL_GPUS": "8", "PAI_NODE_GPU_GROUPS": "-1-3"},
                 "must look like 0-3,4-7", id="negative"),
    pytest.param({"PAI_NODE_VIRTUAL_GPUS": "8", "PAI_NODE_GPU_GROUPS": "0-4,4-7"},
                 "'4-7' overlaps another group", id="overlap"),
    pytest.param({"PAI_NODE_VIRTUAL_GPUS": "0", "PAI_NODE_GPU_GROUPS": "0"},
                 "not a range of GPU indices", id="zero GPUs"),
])
def test_declared_gpu_groups_errors_name_the_setting(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match="PAI_NODE_GPU_") as error:
        load_settings(env)
    assert message in str(error.value)


@pytest.mark.parametrize(("env", "expected"), [
    pytest.param({"PAI_DOCKER_HOST": "unix:///a.sock", "DOCKER_HOST": "unix:///b.sock"},
                 "unix:///a.sock", id="PAI_DOCKER_HOST wins"),
    pytest.param({"DOCKER_HOST": "unix:///b.sock"}, "unix:///b.sock",
                 id="else DOCKER_HOST"),
    pytest.param({}, None, id="else None"),
])
def test_docker_host(env: dict[str, str], expected: str | None) -> None:
    assert load_settings(env).docker_host == expected


# ------------------------------------------------------------ port range


@pytest.mark.parametrize(("raw", "expected"), [
    pytest.param("15000-40000", (15000, 40000), id="the default shape"),
    pytest.param("20000-20000", (20000, 20000), id="a single port"),
    pytest.param("1-65535", (1, 65535), id="the whole range"),
    pytest.param(" 30000 - 31000 ", (30000, 31000), id="spaces around numbers"),
])
def test_port_range_parses(raw: str, expected: tuple[int, int]) -> None:
    assert load_settings({"PAI_PORT_RANGE": raw}).port_range == expected


@pytest.mark.parametrize("raw", [
    pytest.param("15000", id="no dash"),
    pytest.param("a-b", id="not numbers"),
    pytest.param("15000-", id="missing high"),
    pytest.param("15000:40000", id="colon instead of dash"),
    pytest.param("1-2-3", id="three parts"),
    pytest.param("40000-15000", id="low above high"),
    pytest.param("0-100", id="port zero"),
    pytest.param("60000-70000", id="above 65535"),
])
def test_port_range_errors_name_the_setting(raw: str) -> None:
    with pytest.raises(ConfigError, match="PAI_PORT_RANGE"):
        load_settings({"PAI_PORT_RANGE": raw})


# ---------------------------------------------------------- storage roots


@pytest.mark.parametrize(("raw", "expected"), [
    pytest.param("/data", ("/data",), id="one absolute path"),
    pytest.param("file:///data", ("/data",), id="file:// is stripped"),
    pytest.param("file:///mnt/a/, /mnt/b", ("/mnt/a", "/mnt/b"),
                 id="several, spaces and trailing slash"),
    pytest.param("/data,,", ("/data",), id="empty entries ignored"),
    pytest.param("", (), id="unset means none"),
])
def test_storage_roots(raw: str, expected: tuple[str, ...]) -> None:
    settings = load_settings({"PAI_STORAGE_ROOTS": raw})
    assert settings.storage_roots == expected
    assert settings.default_fs_uri == (expected[0] if expected else "")


@pytest.mark.parametrize("raw", [
    pytest.param("data", id="relative"),
    pytest.param("/ok,relative/dir", id="one relative among absolutes"),
    pytest.param("file://data", id="file:// with a relative path"),
])
def test_relative_storage_roots_are_rejected(raw: str) -> None:
    with pytest.raises(ConfigError, match="PAI_STORAGE_ROOTS"):
        load_settings({"PAI_STORAGE_ROOTS": raw})


@pytest.mark.parametrize(("env", "expected"), [
    pytest.param({"PAI_STORAGE_ROOTS": "/nfs,/data"}, "/nfs/.pai-logs",
                 id="default: in the first storage root"),
    pytest.param({"PAI_STORAGE_ROOTS": "/nfs", "PAI_LOG_DIR": "/var/lib/pai/logs/"},
                 "/var/lib/pai/logs", id="set explicitly"),
    pytest.param({}, None, id="no roots, no setting: Redis only"),
])
def test_task_log_dir(env: dict[str, str], expected: str | None) -> None:
    settings = load_settings(env)
    assert settings.task_log_dir == expected
    assert settings.platform_dirs == ((expected,) if expected else ())


def test_relative_log_dir_is_rejected() -> None:
    with pytest.raises(ConfigError, match="PAI_LOG_DIR"):
        load_settings({"PAI_LOG_DIR": "logs"})


# ------------------------------------------------------------- the secret


def test_default_secret_refused_outside_dev_mode() -> None:
    with pytest.raises(ConfigError, match="PAI_SECRET_KEY"):
        load_settings({"PAI_DEV_MODE": "0"})


def test_explicit_default_secret_refused_outside_dev_mode() -> None:
    with pytest.raises(ConfigError, match="PAI_SECRET_KEY"):
        load_settings({"PAI_DEV_MODE": "0", "PAI_SECRET_KEY": DEFAULT_SECRET})


def test_own_secret_accepted_outside_dev_mode() -> None:
    settings = load_settings({"PAI_DEV_MODE": "0", "PAI_ADMIN_PASSWORD": "s3cret-admin",
                              "PAI_SECRET_KEY": "a-real-secret-of-at-least-32-characters"})
    assert settings.dev_mode is False
    assert settings.secret_key == "a-real-secret-of-at-least-32-characters"


@pytest.mark.parametrize(("raw", "dev_mode"), [
    pytest.param("1", True, id="1"),
    pytest.param("true", True, id="true"),
    pytest.param("YES", True, id="YES"),
    pytest.param("on", True, id="on"),
    pytest.param("0", False, id="0"),
    pytest.param("false", False, id="false"),
    pytest.param("no", False, id="no"),
])
def test_dev_mode_flag(raw: str, dev_mode: bool) -> None:
    env = {"PAI_DEV_MODE": raw, "PAI_SECRET_KEY": "a-real-secret-of-at-least-32-characters",
           "PAI_ADMIN_PASSWORD": "s3cret-admin"}
    assert load_settings(env).dev_mode is dev_mode


def test_default_secret_allowed_in_dev_mode() -> None:
    assert load_settings({"PAI_DEV_MODE": "1"}).secret_key == DEFAULT_SECRET


# ------------------------------------------------------- integer settings

INT_SETTINGS = ["PAI_API_PORT", "PAI_NODE_VIRTUAL_GPUS", "PAI_NODE_CPUS",
                "PAI_NODE_MEMORY_MB", "PAI_MONITOR_PORT", "PAI_LOG_MAX_LINES",
                "PAI_API_FOLLOWS_PER_USER", "PAI_API_WORKER_CONNECTIONS",
                "PAI_API_WORKERS", "PAI_EXEC_TTY_PER_USER", "PAI_EXEC_TTY_SLOTS_PER_NODE"]


@pytest.mark.parametrize("name", INT_SETTINGS)
@pytest.mark.parametrize("raw", ["many", "1.5", "0x10"])
def test_non_integer_setting_error_names_the_variable(name: str, raw: str) -> None:
    with pytest.raises(ConfigError, match=name) as caught:
        load_settings({name: raw})
    assert repr(raw) in str(caught.value)


@pytest.mark.parametrize("name", INT_SETTINGS)
def test_negative_integer_setting_error_names_the_variable(name: str) -> None:
    with pytest.raises(ConfigError, match=name):
        load_settings({name: "-1"})


@pytest.mark.parametrize("name", ["PAI_HEARTBEAT_SECONDS", "PAI_NODE_LOST_SECONDS",
                                  "PAI_LAUNCH_TIMEOUT_SECONDS",
                                  "PAI_API_READ_TIMEOUT_SECONDS", "PAI_EXEC_IDLE_SECONDS",
                                  "PAI_EXEC_MAX_SESSION_SECONDS"])
def test_seconds_settings_parse(name: str) -> None:
    field = name.removeprefix("PAI_").lower()
    assert getattr(load_settings({name: "2.5"}), field) == 2.5


@pytest.mark.parametrize("name", ["PAI_HEARTBEAT_SECONDS", "PAI_NODE_LOST_SECONDS",
                                  "PAI_LAUNCH_TIMEOUT_SECONDS"])
def test_malformed_seconds_setting_error_names_the_variable(name: str) -> None:
    with pytest.raises(ConfigError, match=name):
        load_settings({name: "soon"})


@pytest.mark.parametrize("raw", ["0", "-1", "nan"])
def test_seconds_settings_must_be_positive(raw: str) -> None:
    with pytest.raises(ConfigError, match="PAI_HEARTBEAT_SECONDS"):
        load_settings({"PAI_HEARTBEAT_SECONDS": raw})


def test_interactive_exec_settings() -> None:
    settings = load_settings({"PAI_EXEC_TTY_PER_USER": "2", "PAI_EXEC_TTY_SLOTS_PER_NODE": "3"})
    assert (settings.exec_tty_per_user, settings.exec_tty_slots_per_node) == (2, 3)
    defaults = load_settings({})
    assert (defaults.exec_tty_per_user, defaults.exec_tty_slots_per_node,
            defaults.exec_idle_seconds, defaults.exec_max_session_seconds) == \
        (4, 8, 900.0, 43200.0)
    with pytest.raises(ConfigError, match="PAI_EXEC_IDLE_SECONDS"):
        load_settings({"PAI_EXEC_IDLE_SECONDS": "0"})


def test_settings_are_immutable() -> None:
    settings = Settings()
    with pytest.raises(AttributeError):
        settings.api_port = 1  # type: ignore[misc]


def test_short_secret_refused_outside_dev_mode() -> None:
    with pytest.raises(ConfigError, match="at least 32 characters"):
        load_settings({"PAI_DEV_MODE": "0", "PAI_SECRET_KEY": "short"})


def test_default_admin_password_refused_outside_dev_mode() -> None:
    with pytest.raises(ConfigError, match="PAI_ADMIN_PASSWORD"):
        load_settings({"PAI_DEV_MODE": "0",
                       "PAI_SECRET_KEY": "a-real-secret-of-at-least-32-characters"})


# ------------------------------------------------------------ Redis Sentinel


@pytest.mark.parametrize(("url", "target"), [
    pytest.param("redis+sentinel://s1:26380,s2,[::1]:26381/pai",
                 SentinelTarget((("s1", 26380), ("s2", 26379), ("::1", 26381)), "pai", 0),
                 id="three sentinels, default port, IPv6, database 0"),
    pytest.param("redis+sentinel://pai:p%40ss@s1:1/pai/3",
                 SentinelTarget((("s1", 1),), "pai", 3, "pai", "p@ss"),
                 id="login and database"),
    pytest.param("redis+sentinel://s1/pai/", SentinelTarget((("s1", 26379),), "pai", 0),
                 id="a trailing slash is database 0"),
])
def test_a_sentinel_url_names_sentinels_primary_and_database(
        url: str, target: SentinelTarget) -> None:
    assert parse_sentinel_url(url) == target


@pytest.mark.parametrize("url", ["redis://r:6379/0", "rediss://r/0", "unix:///run/redis.sock"],
                         ids=["redis", "rediss", "unix socket"])
def test_any_other_url_is_a_single_redis(url: str) -> None:
    assert parse_sentinel_url(url) is None


@pytest.mark.parametrize(("url", "message"), [
    pytest.param("redis+sentinel://s1:26379", "name the primary", id="no primary name"),
    pytest.param("redis+sentinel://s1:26379/", "name the primary", id="empty primary name"),
    pytest.param("redis+sentinel://s1:26379/pai/zero", "database number",
                 id="database not a number"),
    pytest.param("redis+sentinel://s1/pai/0/x", "database number", id="too many parts"),
    pytest.param("redis+sentinel://s1:port/pai", "not a sentinel address", id="port not a number"),
    pytest.param("redis+sentinel://s1:99999/pai", "not a sentinel address", id="port out of range"),
    pytest.param("redis+sentinel://s1,,s2/pai", "not a sentinel address", id="empty address"),
    pytest.param("redis+sentinel:///pai", "not a sentinel address", id="no sentinel"),
    pytest.param("redis+sentinel://s1/pai?ssl=1", "no ?options", id="query"),
])
def test_a_malformed_sentinel_url_stops_start_up_with_its_reason(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_settings({"PAI_REDIS_URL": url})


def test_the_password_setting_goes_into_a_sentinel_url_with_every_host_kept() -> None:
    settings = load_settings({"PAI_REDIS_URL": "redis+sentinel://s1:26379,s2:26380/pai/0",
                              "PAI_REDIS_PASSWORD": "se cret"})
    assert settings.redis_url == "redis+sentinel://pai:se%20cret@s1:26379,s2:26380/pai/0"
    target = parse_sentinel_url(settings.redis_url)
    assert target is not None
    assert (target.username, target.password) == ("pai", "se cret")
    assert "se cret" not in repr(target)


@pytest.mark.parametrize(("env", "expected"), [
    pytest.param({}, (15.0, 172800.0, 5.0, 1800.0, 1800.0), id="defaults"),
    pytest.param({"PAI_TASK_SAMPLE_SECONDS": "5", "PAI_TASK_SAMPLE_KEEP_SECONDS": "3600",
                  "PAI_IDLE_GPU_PERCENT": "1.5", "PAI_IDLE_GPU_SECONDS": "600",
                  "PAI_IDLE_GPU_GRACE_SECONDS": "60"}, (5.0, 3600.0, 1.5, 600.0, 60.0),
                 id="set"),
])
def test_task_sample_and_idle_gpu_settings(env: dict[str, str],
                                           expected: tuple[float, ...]) -> None:
    s = load_settings(env)
    assert (s.task_sample_seconds, s.task_sample_keep_seconds, s.idle_gpu_percent,
            s.idle_gpu_seconds, s.idle_gpu_grace_seconds) == expected


@pytest.mark.parametrize(("env", "message"), [
    ({"PAI_IDLE_GPU_PERCENT": "0"}, "PAI_IDLE_GPU_PERCENT must be above 0 and at most 100"),
    ({"PAI_IDLE_GPU_PERCENT": "101"}, "PAI_IDLE_GPU_PERCENT must be above 0 and at most 100"),
    ({"PAI_IDLE_GPU_PERCENT": "five"}, "PAI_IDLE_GPU_PERCENT must be a percent"),
    ({"PAI_TASK_SAMPLE_SECONDS": "0"}, "PAI_TASK_SAMPLE_SECONDS must be positive"),
    ({"PAI_IDLE_GPU_SECONDS": "-1"}, "PAI_IDLE_GPU_SECONDS must be positive"),
])
def test_bad_idle_gpu_settings_are_named(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_settings(env)
    assert message in str(error.value)


@pytest.mark.parametrize(("raw", "expected"), [
    pytest.param(None, 0.1, id="default"), pytest.param("0", 0.0, id="never-waits"),
    pytest.param("0.5", 0.5, id="set"),
])
def test_new_work_pass_seconds(raw: str | None, expected: float) -> None:
    env = {} if raw is None else {"PAI_SCHEDULER_NEW_WORK_SECONDS": raw}
    assert load_settings(env).new_work_pass_seconds == expected


@pytest.mark.parametrize("raw", ["-0.1", "nan", "soon"])
def test_a_bad_new_work_pass_seconds_is_named(raw: str) -> None:
    with pytest.raises(ConfigError, match="PAI_SCHEDULER_NEW_WORK_SECONDS must be"):
        load_settings({"PAI_SCHEDULER_NEW_WORK_SECONDS": raw})


# ------------------------------------------------------------ Prometheus for the charts


@pytest.mark.parametrize(("raw", "expected"), [
    pytest.param(None, "", id="unset: the monitor's samples"),
    pytest.param("", "", id="empty: the same"),
    pytest.param("http://prometheus:9090", "http://prometheus:9090", id="compose"),
    pytest.param("https://prom.example/sub/path/", "https://prom.example/sub/path",
                 id="a path, its slash dropped"),
])
def test_prometheus_url(raw: str | None, expected: str) -> None:
    env = {} if raw is None else {"PAI_PROMETHEUS_URL": raw}
    settings = load_settings(env)
    assert (settings.prometheus_url, settings.prometheus_timeout_seconds) == (expected, 3.0)


@pytest.mark.parametrize("raw", ["prometheus:9090", "ftp://p", "http://", "file:///etc"])
def test_prometheus_url_must_be_http(raw: str) -> None:
    with pytest.raises(ConfigError, match="PAI_PROMETHEUS_URL"):
        load_settings({"PAI_PROMETHEUS_URL": raw})
