"""The one Redis ACL (shared/infra/redisacl.py) and how services get its password."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from shared.infra.config import ConfigError, load_settings
from shared.infra.redisacl import OPERATOR_USER, PLATFORM_USER, acl_text, ensure_credentials, main


def test_the_acl_locks_the_default_user_and_denies_dangerous_commands() -> None:
    lines = acl_text("p1", "p2").splitlines()
    assert lines == [f"user {OPERATOR_USER} on >p2 ~* &* +@all",
                     f"user {PLATFORM_USER} on >p1 ~* &* +@all -@dangerous"]
    assert OPERATOR_USER == "default"  # never `default off`: the AOF replays as `default`


@pytest.mark.parametrize("password", ["", "two words", "tab\there", "new\nline"],
                         ids=["empty", "space", "tab", "newline"])
def test_a_password_that_would_break_the_acl_file_is_refused(password: str) -> None:
    with pytest.raises(ValueError, match="whitespace"):
        acl_text(password, "ok")


def test_passwords_are_generated_once_private_and_kept(tmp_path: Path) -> None:
    first = ensure_credentials(tmp_path / "acl")
    again = ensure_credentials(tmp_path / "acl")
    assert first == again and len(first.password) == 64
    assert first.password != first.operator_password
    for name in ("redis-password", "redis-operator-password", "users.acl"):
        assert stat.S_IMODE((tmp_path / "acl" / name).stat().st_mode) == 0o600


def test_a_planted_link_is_not_followed_when_writing_a_password(tmp_path: Path) -> None:
    """Threat: a link where the password file goes makes the writer read
    another file into the ACL, or overwrite it."""
    target = tmp_path / "victim"
    target.write_text("untouched")
    (tmp_path / "acl").mkdir()
    (tmp_path / "acl" / "redis-password").symlink_to(target)
    with pytest.raises(OSError, match="symbolic link"):
        ensure_credentials(tmp_path / "acl")
    assert target.read_text() == "untouched"


def test_the_operators_secret_replaces_the_generated_password(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIS_PASSWORD", "from-secret")
    monkeypatch.delenv("REDIS_OPERATOR_PASSWORD", raising=False)
    assert main([str(tmp_path), "--from-env", "--shared-volume"]) == 0
    assert (tmp_path / "redis-password").read_text().strip() == "from-secret"
    assert ">from-secret " in (tmp_path / "users.acl").read_text()
    assert stat.S_IMODE((tmp_path / "users.acl").stat().st_mode) == 0o644
    monkeypatch.delenv("REDIS_PASSWORD")
    assert main([str(tmp_path), "--from-env"]) == 2


@pytest.mark.parametrize(("env", "url"), [
    ({}, "redis://127.0.0.1:6379/0"),
    ({"PAI_REDIS_URL": "redis://r:1/2", "PAI_REDIS_PASSWORD": "a b/c"},
     "redis://pai:a%20b%2Fc@r:1/2"),
    ({"PAI_REDIS_URL": "redis://ops@r/0", "PAI_REDIS_PASSWORD": "x"}, "redis://ops:x@r/0"),
], ids=["no-password", "password-quoted", "user-from-url"])
def test_the_password_setting_goes_into_the_url(env: dict[str, str], url: str) -> None:
    assert load_settings(env).redis_url == url


def test_the_password_file_goes_into_the_url_and_is_never_in_the_repr(tmp_path: Path) -> None:
    (tmp_path / "pw").write_text("s3cret\n")
    settings = load_settings({"PAI_REDIS_PASSWORD_FILE": str(tmp_path / "pw")})
    assert settings.redis_url == "redis://pai:s3cret@127.0.0.1:6379/0"
    assert "s3cret" not in repr(settings)


@pytest.mark.parametrize("content", [None, ""], ids=["missing", "empty"])
def test_an_unusable_password_file_stops_start_up(tmp_path: Path, content: str | None) -> None:
    if content is not None:
        (tmp_path / "pw").write_text(content)
    with pytest.raises(ConfigError, match="PAI_REDIS_PASSWORD_FILE"):
        load_settings({"PAI_REDIS_PASSWORD_FILE": str(tmp_path / "pw")})
