"""Where the CLI keeps its logins: clusters, their tokens, and the current one.

Like kubeconfig contexts: every cluster a user logged in to has a name, a URL
and a token, and one of them is current. The file holds bearer tokens, so it
is written with mode 0600 (in a 0700 folder) and replaced atomically, never
left half-written or briefly world-readable.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

CONFIG_ENV = "PAI_CONFIG"


class LoginsError(Exception):
    """The config file cannot be read, or names a cluster that is not in it."""


@dataclass
class Cluster:
    name: str
    url: str
    username: str = ""
    token: str = ""
    admin: bool = False
    expires: int | None = None  # epoch ms, as the API returns it

    def expired(self, now_ms: int) -> bool:
        return self.expires is not None and self.expires <= now_ms


@dataclass
class Logins:
    current: str | None = None
    clusters: dict[str, Cluster] = field(default_factory=dict)

    def get(self, name: str | None = None) -> Cluster:
        """The named cluster, or the current one."""
        wanted = name or self.current
        if wanted is None:
            raise LoginsError("not logged in to any cluster; run: pai login URL")
        if wanted not in self.clusters:
            known = ", ".join(sorted(self.clusters)) or "none"
            raise LoginsError(f"no cluster named {wanted} (known: {known}); "
                              f"run: pai login --cluster {wanted} URL")
        return self.clusters[wanted]

    def name_for(self, url: str) -> str:
        """A cluster name for a login to `url`: the one already used for that URL,
        else its host[:port]."""
        for cluster in self.clusters.values():
            if cluster.url == url:
                return cluster.name
        return urlsplit(url).netloc or url

    def put(self, cluster: Cluster, *, make_current: bool = True) -> None:
        self.clusters[cluster.name] = cluster
        if make_current or self.current not in self.clusters:
            self.current = cluster.name

    def use(self, name: str) -> Cluster:
        cluster = self.get(name)
        self.current = name
        return cluster

    def to_dict(self) -> dict[str, Any]:
        return {
            "current": self.current,
            "clusters": {name: {k: v for k, v in asdict(c).items() if k != "name"}
                         for name, c in sorted(self.clusters.items())},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Logins:
        clusters: dict[str, Cluster] = {}
        raw = data.get("clusters") or {}
        if not isinstance(raw, Mapping):
            raise LoginsError("clusters must be a mapping of name to cluster")
        for name, entry in raw.items():
            if not isinstance(entry, Mapping) or not isinstance(entry.get("url"), str):
                raise LoginsError(f"cluster {name} needs a url")
            expires = entry.get("expires")
            clusters[str(name)] = Cluster(
                name=str(name), url=entry["url"], username=str(entry.get("username") or ""),
                token=str(entry.get("token") or ""), admin=bool(entry.get("admin", False)),
                expires=int(expires) if isinstance(expires, int) else None)
        current = data.get("current")
        return cls(current=str(current) if current in clusters else None, clusters=clusters)


def config_path(environ: Mapping[str, str] | None = None) -> Path:
    """PAI_CONFIG, else $XDG_CONFIG_HOME/pai/config.yaml, else ~/.config/pai/config.yaml."""
    env = os.environ if environ is None else environ
    if env.get(CONFIG_ENV):
        return Path(env[CONFIG_ENV]).expanduser()
    base = env.get("XDG_CONFIG_HOME") or ""
    root = Path(base) if os.path.isabs(base) else Path.home() / ".config"
    return root / "pai" / "config.yaml"


def load(path: Path) -> Logins:
    """The logins in `path`; none when the file does not exist yet."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return Logins()
    except OSError as error:
        raise LoginsError(f"cannot read {path}: {error.strerror or error}") from None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as error:
        raise LoginsError(f"{path} is not valid YAML: {error}") from None
    if not isinstance(data, Mapping):
        raise LoginsError(f"{path} must hold a mapping")
    try:
        return Logins.from_dict(data)
    except LoginsError as error:
        raise LoginsError(f"{path}: {error}") from None


def save(path: Path, logins: Logins) -> None:
    """Write `logins` to `path` with mode 0600, atomically."""
    if not path.parent.exists():
        path.parent.mkdir(mode=0o700, parents=True)
    text = yaml.safe_dump(logins.to_dict(), sort_keys=False, default_flow_style=False)
    fd, tmp = tempfile.mkstemp(prefix=".config-", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp creates the file 0600 already; chmod in case of an odd umask.
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
