"""The CLI's logins file: where it lives, its 0600 mode, and kubeconfig-like contexts."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
import yaml

from pai_cli.logins import Cluster, Logins, LoginsError, config_path, load, save


@pytest.mark.parametrize(("environ", "expected"), [
    pytest.param({"PAI_CONFIG": "/x/pai.yaml", "XDG_CONFIG_HOME": "/xdg"}, "/x/pai.yaml",
                 id="PAI_CONFIG wins"),
    pytest.param({"XDG_CONFIG_HOME": "/xdg"}, "/xdg/pai/config.yaml", id="XDG_CONFIG_HOME"),
    pytest.param({"XDG_CONFIG_HOME": "relative"}, "~/.config/pai/config.yaml",
                 id="a relative XDG_CONFIG_HOME is ignored, as the spec says"),
    pytest.param({}, "~/.config/pai/config.yaml", id="default"),
    pytest.param({"PAI_CONFIG": ""}, "~/.config/pai/config.yaml", id="empty PAI_CONFIG"),
])
def test_config_path(environ: dict[str, str], expected: str) -> None:
    assert config_path(environ) == Path(expected).expanduser()


def test_a_missing_file_is_no_logins(tmp_path: Path) -> None:
    found = load(tmp_path / "none.yaml")
    assert found == Logins()
    with pytest.raises(LoginsError, match="not logged in to any cluster"):
        found.get()


def test_save_is_private_and_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "new" / "pai" / "config.yaml"
    logins = Logins()
    logins.put(Cluster("prod", "https://pai.example.com", "alice", "tok", False, 1234))

    save(path, logins)

    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert load(path) == logins
    assert [p.name for p in path.parent.iterdir()] == ["config.yaml"]  # no temp file left


def test_save_tightens_a_file_someone_made_readable(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("current: null\n")
    path.chmod(0o644)
    save(path, Logins())
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_several_clusters_one_current() -> None:
    logins = Logins()
    logins.put(Cluster("a", "http://a:9186", token="1"))
    logins.put(Cluster("b", "http://b:9186", token="2"))
    assert logins.get().name == "b"
    assert logins.use("a").url == "http://a:9186"
    assert logins.get().name == "a"
    assert logins.get("b").token == "2"
    with pytest.raises(LoginsError, match=r"no cluster named c \(known: a, b\)"):
        logins.use("c")


def test_a_new_login_is_named_after_its_url_or_reuses_the_name() -> None:
    logins = Logins()
    assert logins.name_for("http://10.0.0.1:9186") == "10.0.0.1:9186"
    logins.put(Cluster("lab", "http://10.0.0.1:9186"))
    assert logins.name_for("http://10.0.0.1:9186") == "lab"


def test_expiry() -> None:
    cluster = Cluster("a", "http://a", token="t", expires=2000)
    assert not cluster.expired(1999)
    assert cluster.expired(2000)
    assert not Cluster("a", "http://a", token="t").expired(10**15)


def test_the_file_is_readable_yaml(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    logins = Logins()
    logins.put(Cluster("lab", "http://lab:9186", "bob", "tok", True, 99))
    save(path, logins)
    assert yaml.safe_load(path.read_text()) == {
        "current": "lab",
        "clusters": {"lab": {"url": "http://lab:9186", "username": "bob", "token": "tok",
                             "admin": True, "expires": 99}},
    }


@pytest.mark.parametrize(("text", "message"), [
    pytest.param("[1, 2]", "must hold a mapping", id="not a mapping"),
    pytest.param("clusters: {x: {}}", "cluster x needs a url", id="no url"),
    pytest.param("clusters: [1]", "clusters must be a mapping", id="clusters a list"),
    pytest.param("a: [", "is not valid YAML", id="broken YAML"),
])
def test_a_damaged_file_is_a_clear_error(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(LoginsError, match=message):
        load(path)


def test_a_current_that_names_nothing_is_dropped(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("current: gone\nclusters: {a: {url: 'http://a'}}\n")
    assert load(path).current is None
