"""Accounts on a real Redis: users, virtual clusters and token revocation."""

from __future__ import annotations

import redis

from shared.state.accounts import Accounts, VirtualCluster
from shared.state.store import Store


def test_deleting_a_vc_takes_it_from_its_users(redis_client: redis.Redis) -> None:
    accounts = Accounts(Store(redis_client))
    accounts.put_vc(VirtualCluster("research", 4))
    accounts.create_user("alice", "pw-123456", virtual_clusters=["default", "research"])

    accounts.delete_vc("research")
    accounts.put_vc(VirtualCluster("research", 4))  # the same name, made anew

    alice = accounts.get_user("alice")
    assert alice is not None and alice.virtual_clusters == ["default"]
    assert not alice.may_use("research")


def test_revoking_all_tokens_spares_later_logins(redis_client: redis.Redis) -> None:
    accounts = Accounts(Store(redis_client))
    accounts.create_user("alice", "pw-123456")
    accounts.revoke_all_tokens("alice")
    epoch = int(redis_client.get("pai:user:alice:token-epoch") or 0)
    assert accounts.user_for_token("alice", "old", epoch) is None
    later = accounts.user_for_token("alice", "new", epoch + 1)
    assert later is not None and later.username == "alice"
    accounts.revoke_token("new", expires_ms=epoch + 60_000)
    assert accounts.user_for_token("alice", "new", epoch + 1) is None
    assert accounts.user_for_token("nobody", "x", epoch + 1) is None
