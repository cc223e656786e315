"""Services touch Redis through the store's methods and the state layer's
functions, never by a command of their own on the store's client: no module
under services/ calls a method on `store.r` (`self.store.r.zrange(...)`,
`platform().store.r.ping()`, ...). Handing `store.r` to a shared/state
function is the state layer's business and stays allowed.

A test of the rule's own teeth feeds the checker sources that break it.
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _is_store_client(node: ast.expr) -> bool:
    """`store.r`, `self.store.r`, `platform().store.r`: the store's client."""
    if not (isinstance(node, ast.Attribute) and node.attr == "r"):
        return False
    owner = node.value
    return (isinstance(owner, ast.Name) and owner.id == "store") or (
        isinstance(owner, ast.Attribute) and owner.attr == "store")


def raw_calls(source: str) -> list[str]:
    """Each call of a method on the store's client, directly or through a
    name it was given (`r = self.store.r; r.get(...)`), as `line: text`."""
    tree = ast.parse(source)
    aliases = {target.id for node in ast.walk(tree) if isinstance(node, ast.Assign)
               and _is_store_client(node.value)
               for target in node.targets if isinstance(target, ast.Name)}
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        client = node.func.value
        if _is_store_client(client) or (isinstance(client, ast.Name) and client.id in aliases):
            found.append(f"{node.lineno}: {ast.unparse(node.func)}(...)")
    return found


def test_no_service_calls_the_stores_client() -> None:
    found = {str(path.relative_to(ROOT)): calls
             for path in sorted((ROOT / "services").rglob("*.py"))
             if (calls := raw_calls(path.read_text()))}
    assert not found, f"raw Redis commands in services (add a Store method): {found}"


def test_the_checker_finds_each_form() -> None:
    assert raw_calls("store.r.zrank(key, job)")
    assert raw_calls("self.store.r.pipeline(transaction=False)")
    assert raw_calls("platform().store.r.ping()")
    assert raw_calls("r = self.store.r\nr.memory_stats()")
    assert not raw_calls("r = self.store.r\nqueue_view(r, vcs)")
    assert not raw_calls("idle.flagged_tasks(store.r, job_id)")  # the state layer's
    assert not raw_calls("store.queue_position(job)")
    assert not raw_calls("self.r.get(key)")  # a client of the service's own
