"""The node exporter's settings: where it listens and how often it samples."""

from __future__ import annotations

import pytest

from shared.infra.config import ConfigError, load_settings


def test_the_exporter_listens_on_the_node_ip_by_default() -> None:
    assert load_settings({}).monitor_host == ""  # the node's IP, found at its start
    settings = load_settings({"PAI_NODE_IP": "10.0.0.5"})
    assert (settings.monitor_host, settings.monitor_port) == ("10.0.0.5", 9187)


def test_the_exporter_address_and_sampling_interval_can_be_set() -> None:
    settings = load_settings({"PAI_NODE_IP": "10.0.0.5", "PAI_MONITOR_HOST": "0.0.0.0",
                              "PAI_MONITOR_PORT": "9300", "PAI_MONITOR_SAMPLE_SECONDS": "2.5"})
    assert (settings.monitor_host, settings.monitor_port) == ("0.0.0.0", 9300)
    assert settings.monitor_sample_seconds == 2.5
    assert load_settings({}).monitor_sample_seconds == 10.0


@pytest.mark.parametrize("raw", ["0", "-1", "soon"])
def test_a_sampling_interval_must_be_positive_seconds(raw: str) -> None:
    with pytest.raises(ConfigError, match="PAI_MONITOR_SAMPLE_SECONDS"):
        load_settings({"PAI_MONITOR_SAMPLE_SECONDS": raw})


def test_the_gpu_health_interval_can_be_set_and_must_be_positive() -> None:
    assert load_settings({}).gpu_health_seconds == 5.0
    assert load_settings({"PAI_GPU_HEALTH_SECONDS": "0.5"}).gpu_health_seconds == 0.5
    with pytest.raises(ConfigError, match="PAI_GPU_HEALTH_SECONDS"):
        load_settings({"PAI_GPU_HEALTH_SECONDS": "0"})
