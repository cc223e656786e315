"""SSH into a job's tasks, as OpenPAI's `ssh` runtime plugin offers it.

A job asks for SSH in its config: v1's top-level `"ssh": true`, or protocol
v2's `extras.com.microsoft.pai.runtimeplugin` plugin `ssh` with `jobssh`
(a key pair made for the job) and `userssh` (the user's own public key).
Both arrive here as one normalized field, `ssh` in the stored config
(`normalized`), read back by `access_of`.

The job's key pair is made at submit (`generate`: ed25519, the private key in
OpenSSH's format so `ssh -i` takes it). Its private key lives in Redis under
keys.job_ssh_key and nowhere else: not in the job record or config, not in
events or logs; only its owner (and admins) read it, through
`GET .../ssh`, and it goes with the job's other keys (shared/state/retention.py).
The launcher writes the public keys into each task's container as
/root/.ssh/authorized_keys before the container starts, and starts the
image's sshd on the task's `ssh` port (services/launcher/ssh.py).

No IO here: the Redis calls on the key (`store_key`, `discard_key`,
`read_key`, and `key_kept` around a submit's write) are shared/state/sshkeys.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

PORT_LABEL = "ssh"  # the port each task of an SSH job gets (portList label)
PORT_VARIABLE = "PAI_CONTAINER_SSH_PORT"  # OpenPAI's name for it in the container
V2_PLUGINS = "com.microsoft.pai.runtimeplugin"  # where v2 configs name runtime plugins
V2_PLUGIN = "ssh"
USER_KEY_TYPE = "custom"  # OpenPAI's only `userssh.type`: the key is in `value`
MAX_PUBLIC_KEY_CHARS = 16 * 1024  # an RSA key of 16384 bits is under 3 KiB
AUTHORIZED_KEYS = "/root/.ssh/authorized_keys"
# sshd's privilege separation chroots its pre-authentication child into
# /run/sshd: without SYS_CHROOT (dropped from every other job container,
# shared/domain/capabilities.py) every login fails. Nothing else is added.
CAPABILITIES = ("SYS_CHROOT",)
BARRIER_FIELDS = ("sshbarrier", "sshbarriertaskroles")

# An OpenSSH public key line: type, base64 blob, optional comment, one line.
# No options prefix (`command="..."`, `from=`): a user's key grants a login,
# never a forced command or anything authorized_keys options would do.
_KEY_LINE = re.compile(r"(?P<type>[a-z0-9@.-]{1,64}) (?P<blob>[A-Za-z0-9+/]+={0,3})"
                       r"(?: (?P<comment>[ -~]{0,1024}))?")


@dataclass(frozen=True)
class SshAccess:
    """What SSH a job asked for: the platform's key pair (`job_key`) and/or
    the user's own public key (`user_key`, one normalized line, or "")."""

    job_key: bool
    user_key: str = ""


@dataclass(frozen=True)
class KeyPair:
    private_key: str  # OpenSSH format ("-----BEGIN OPENSSH PRIVATE KEY-----")
    public_key: str  # one authorized_keys line


class InvalidSshRequest(ValueError):
    """An `ssh` config field pai cannot act on; the message says why."""


# ---------------------------------------------------------------- the config


def parse_public_key(text: Any) -> str:
    """`text` as one OpenSSH public key line cryptography loads, or
    InvalidSshRequest. Trailing whitespace is dropped; anything else
    (several lines, options, a private key pasted by mistake) is refused."""
    if not isinstance(text, str):
        raise InvalidSshRequest("Must be an OpenSSH public key (a string).")
    line = text.strip()
    if len(line) > MAX_PUBLIC_KEY_CHARS:
        raise InvalidSshRequest(f"At most {MAX_PUBLIC_KEY_CHARS} characters.")
    if "PRIVATE KEY" in line:
        raise InvalidSshRequest("This is a private key: give the public one (the .pub file).")
    if _KEY_LINE.fullmatch(line) is None:
        raise InvalidSshRequest("Must be one OpenSSH public key line: "
                                "'<type> <base64 key> [comment]'.")
    try:
        serialization.load_ssh_public_key(line.encode())
    except (ValueError, TypeError) as error:
        raise InvalidSshRequest(f"Not a public key OpenSSH accepts: {error}") from None
    except Exception as error:  # cryptography's UnsupportedAlgorithm, for an unknown type
        raise InvalidSshRequest(f"Unsupported public key: {error}") from None
    return line


def normalized(value: Any) -> dict[str, Any] | None:
    """The config's `ssh` field as it is stored: None (no SSH) for `false`,
    `{"jobssh": true}` for `true`, and for OpenPAI's plugin parameters
    `{"jobssh": bool, "userssh": {"type": "custom", "value": "<key>"}}` with
    the key checked. The stored form is itself valid input. InvalidSshRequest
    (its message naming the field) for anything else."""
    if value is True:
        return {"jobssh": True}
    if value is False or value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidSshRequest("Must be true, false, or an object with jobssh and userssh.")
    unknown = sorted(set(value) - {"jobssh", "userssh", *BARRIER_FIELDS})
    if unknown:
        raise InvalidSshRequest(f"Unknown field {unknown[0]!r}: only jobssh, userssh, "
                                f"sshbarrier and sshbarriertaskroles.")
    barrier = _barrier(value)
    job_key = value.get("jobssh", False)
    if not isinstance(job_key, bool):
        raise InvalidSshRequest("jobssh: must be true or false.")
    user = value.get("userssh") or {}
    if not isinstance(user, dict):
        raise InvalidSshRequest("userssh: must be an object {type: custom, value: <key>}.")
    unknown = sorted(set(user) - {"type", "value"})
    if unknown:
        raise InvalidSshRequest(f"userssh: unknown field {unknown[0]!r}.")
    user_key = ""
    if user.get("value"):
        if user.get("type", USER_KEY_TYPE) != USER_KEY_TYPE:
            raise InvalidSshRequest(f"userssh.type: must be {USER_KEY_TYPE!r}.")
        try:
            user_key = parse_public_key(user["value"])
        except InvalidSshRequest as error:
            raise InvalidSshRequest(f"userssh.value: {error}") from None
    if not job_key and not user_key:
        return None  # OpenPAI's portal sends the plugin with both off
    out: dict[str, Any] = {"jobssh": job_key}
    if user_key:
        out["userssh"] = {"type": USER_KEY_TYPE, "value": user_key}
    out.update(barrier)
    return out


def _barrier(value: dict[str, Any]) -> dict[str, Any]:
    """OpenPAI's `sshbarrier` (every task waits, before its commands, until
    the sshd of every task answers) and `sshbarriertaskroles` (only these
    roles' tasks are waited for), as stored."""
    wanted = value.get("sshbarrier", False)
    if not isinstance(wanted, bool):
        raise InvalidSshRequest("sshbarrier: must be true or false.")
    roles = value.get("sshbarriertaskroles")
    if roles is not None and (not isinstance(roles, list)
                              or not all(isinstance(r, str) for r in roles)):
        raise InvalidSshRequest("sshbarriertaskroles: must be a list of task role names.")
    if not wanted:
        return {}
    return {"sshbarrier": True, **({"sshbarriertaskroles": roles} if roles else {})}


def barrier_roles(config: dict[str, Any]) -> list[str] | None:
    """The task roles whose tasks' sshd every task waits for before its
    commands (all roles, unless `sshbarriertaskroles` names some); None: no barrier."""
    value = config.get("ssh")
    if not isinstance(value, dict) or not value.get("sshbarrier"):
        return None
    names = [r["name"] for r in config.get("taskRoles") or ()]
    wanted = value.get("sshbarriertaskroles")
    return [n for n in names if n in wanted] if wanted else names


def v2_plugin_parameters(plugins: Any) -> tuple[int, Any] | None:
    """The position and `parameters` of the first `ssh` plugin in a v2
    config's runtime plugin list; None when it names none."""
    if not isinstance(plugins, list):
        return None
    for position, plugin in enumerate(plugins):
        if isinstance(plugin, dict) and plugin.get("plugin") == V2_PLUGIN:
            return position, plugin.get("parameters") or {}
    return None


def access_of(config: dict[str, Any]) -> SshAccess | None:
    """What SSH a stored (normalized) config asks for; None: none."""
    value = config.get("ssh")
    if not isinstance(value, dict):
        return None
    user = value.get("userssh") or {}
    access = SshAccess(job_key=bool(value.get("jobssh")),
                       user_key=str(user.get("value") or "") if isinstance(user, dict) else "")
    return access if access.job_key or access.user_key else None


# ---------------------------------------------------------------- key pairs


def generate(comment: str) -> KeyPair:
    """A fresh ed25519 key pair; `comment` ends the public key line."""
    private = ed25519.Ed25519PrivateKey.generate()
    pem = private.private_bytes(serialization.Encoding.PEM,
                                serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption()).decode()
    return KeyPair(pem, _public_line(private, comment))


def _public_line(private: ed25519.Ed25519PrivateKey, comment: str) -> str:
    blob = private.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                             serialization.PublicFormat.OpenSSH).decode()
    clean = re.sub(r"[^ -~]", "", comment)[:200]
    return f"{blob} {clean}" if clean else blob


def key_comment(job_id: str) -> str:
    return f"pai-job:{job_id}"


def pair_of(private_key: str, comment: str) -> KeyPair:
    """The pair a stored private key belongs to (the public key is derived)."""
    loaded = serialization.load_ssh_private_key(private_key.encode(), password=None)
    if not isinstance(loaded, ed25519.Ed25519PrivateKey):
        raise ValueError("a job's SSH key is ed25519")
    return KeyPair(private_key, _public_line(loaded, comment))


def authorized_keys(access: SshAccess, job_public_key: str | None) -> str:
    """The container's /root/.ssh/authorized_keys: the job's key and the user's."""
    lines = []
    if access.job_key and job_public_key:
        lines.append(job_public_key)
    if access.user_key:
        lines.append(access.user_key)
    return "".join(f"{line}\n" for line in lines)
