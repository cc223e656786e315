"""Storage shares, and the storage check every submit passes.

A user's jobs may mount their own folder `<root>/<user>/` (outputDir only
there) and, read-only, folders an admin shared with them or with one of
their virtual clusters. Admins manage those shares here:
`GET/PUT/DELETE /api/v1/storage/shares/<name>` with
`{"path": ..., "users": [...], "virtualClusters": [...]}`. The rules
themselves are shared/domain/storage.py's; this module reads and writes the
shares (one Redis hash, written compare-and-set) and turns a refusal into
a 403 naming each field.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint
from marshmallow import RAISE, Schema, ValidationError, fields, validate

from services.api.auth import admin_only, current_user
from services.api.bodies import load_body, takes
from services.api.errors import ApiError
from services.api.platform import platform
from shared.domain import storage
from shared.domain.jobspec import MAX_PATH_CHARS
from shared.domain.names import NAME_PATTERN, canonical_name
from shared.domain.storage import Caller, Share
from shared.state import keys
from shared.state.accounts import User
from shared.state.store import Pipe, Store

bp = Blueprint("storage", __name__, url_prefix="/api/v1/storage")

MAX_SHARE_MEMBERS = 1000


def _canonical(value: str) -> str:
    try:
        return canonical_name(value)
    except ValueError as error:
        raise ValidationError(str(error)) from None


class _Name(fields.String):
    """A user or VC name, loaded in its canonical (lowercase) form."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> str:
        return _canonical(super()._deserialize(value, attr, data, **kwargs))


def _members(description: str) -> fields.List:
    return fields.List(_Name(metadata={"description": "a name; stored in lowercase"}),
                       load_default=list,
                       validate=validate.Length(max=MAX_SHARE_MEMBERS),
                       metadata={"description": description})


class StorageSharePutSchema(Schema):
    """What an admin sends to create or change a share."""

    class Meta:
        unknown = RAISE

    path = fields.String(required=True, validate=validate.Length(min=1, max=MAX_PATH_CHARS),
                         metadata={"description": "a folder strictly inside a storage root"})
    users = _members("users who may mount the folder (read-only)")
    virtualClusters = _members("virtual clusters whose users may mount it (read-only)")


class StorageShareSchema(Schema):
    name = fields.String(required=True, metadata={"pattern": NAME_PATTERN})
    path = fields.String(required=True)
    users = fields.List(fields.String(), required=True)
    virtualClusters = fields.List(fields.String(), required=True)


_PUT = StorageSharePutSchema()


# ---------------------------------------------------------------- records


def load_shares(store: Store) -> tuple[Share, ...]:
    """Every share, from the one hash that holds them (name -> JSON)."""
    return tuple(Share.from_json(name, raw)
                 for name, raw in sorted(store.read_hashes([keys.STORAGE_SHARES])[0].items()))


def _put_share(store: Store, share: Share) -> bool:
    """Write the share; True if it existed before."""

    def write(pipe: Pipe) -> bool:
        existed = bool(pipe.hexists(keys.STORAGE_SHARES, share.name))
        pipe.multi()
        pipe.hset(keys.STORAGE_SHARES, share.name, share.to_json())
        return existed

    return store.transact(write, keys.STORAGE_SHARES)


def _delete_share(store: Store, name: str) -> bool:
    """Remove the share; False if there was none."""

    def remove(pipe: Pipe) -> bool:
        if not pipe.hexists(keys.STORAGE_SHARES, name):
            return False
        pipe.multi()
        pipe.hdel(keys.STORAGE_SHARES, name)
        return True

    return store.transact(remove, keys.STORAGE_SHARES)


# ---------------------------------------------------------------- the submit check


def check_job_storage(config: dict[str, Any], caller: User) -> None:
    """403 naming every storage field of a validated config that `caller` may
    not mount. Admins may name any folder under a storage root (as a Slurm
    or OpenPAI admin may), never the platform's own log tree."""
    pai = platform()
    # Shares matter only for a non-admin's read-only folders: a job naming
    # none (most) costs no read of them.
    wants_shares = not caller.admin and (
        any(config.get(k) for k in storage.READ_ONLY_FIELDS)
        or bool(storage.prerequisite_paths(config, pai.settings.storage_roots)))
    shares = load_shares(pai.store) if wants_shares else ()
    who = Caller(caller.username, tuple(caller.virtual_clusters), caller.admin, shares)
    found = storage.refusals(config, pai.settings.storage_roots, who,
                             pai.settings.platform_dirs)
    if found:
        names = ", ".join(sorted(found))
        raise ApiError("ForbiddenStorageError",
                       f"the job may not mount {names}: outputDir must be in your own folder "
                       f"<root>/{caller.username}/, dataDir and codeDir there or in a folder "
                       f"shared with you", 403, fields=found)


# ---------------------------------------------------------------- views


def _name_or_404(name: str) -> str:
    try:
        return canonical_name(name)
    except ValueError:
        raise ApiError("NoStorageShareError", f"storage share {name} does not exist",
                       404) from None


def _visible(share: Share, user: User) -> bool:
    return user.admin or share.grants(user.username, user.virtual_clusters)


@bp.get("/shares")
def list_shares() -> list[dict[str, Any]]:
    """The storage shares: all of them for an admin, those granted to you otherwise.
    ---
    get:
      responses: {200: [StorageShareSchema]}
    """
    user = current_user()
    return [s.view() for s in load_shares(platform().store) if _visible(s, user)]


@bp.get("/shares/<name>")
def get_share(name: str) -> dict[str, Any]:
    """One storage share (admins, or a user it is granted to).
    ---
    get:
      errors: [404]
      responses: {200: StorageShareSchema}
    """
    wanted = _name_or_404(name)
    for share in load_shares(platform().store):
        if share.name == wanted and _visible(share, current_user()):
            return share.view()
    raise ApiError("NoStorageShareError", f"storage share {name} does not exist", 404)


@bp.put("/shares/<name>")
@admin_only
@takes(_PUT)
def put_share(name: str) -> tuple[dict[str, Any], int]:
    """Create or change a storage share (admin only); its users mount it read-only.
    ---
    put:
      upserts: StorageShareSchema
    """
    try:
        share_name = canonical_name(name)
    except ValueError as error:
        raise ApiError("BadRequestError", f"share name: {error}") from None
    loaded = load_body()
    pai = platform()
    problem = storage.share_path_problem(loaded["path"], pai.settings.storage_roots,
                                         pai.settings.platform_dirs)
    if problem:
        raise ApiError("BadRequestError", f"path {problem}", 400, fields={"path": [problem]})
    where = storage.resolve(loaded["path"], pai.settings.storage_roots)
    assert where is not None  # share_path_problem said so
    share = Share(share_name, where.path, tuple(sorted(set(loaded["users"]))),
                  tuple(sorted(set(loaded["virtualClusters"]))))
    existed = _put_share(pai.store, share)
    return share.view(), 200 if existed else 201


@bp.delete("/shares/<name>")
@admin_only
def delete_share(name: str) -> dict[str, Any]:
    """Delete a storage share (admin only); running jobs keep their mounts.
    ---
    delete:
      errors: [404]
      responses: {200: Message}
    """
    if not _delete_share(platform().store, _name_or_404(name)):
        raise ApiError("NoStorageShareError", f"storage share {name} does not exist", 404)
    return {"message": f"storage share {name} deleted"}

