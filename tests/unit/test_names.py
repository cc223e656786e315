import pytest

from shared.domain.names import canonical_name


@pytest.mark.parametrize(("raw", "stored"), [
    ("alice", "alice"),
    ("ADMIN", "admin"),
    ("Team-A.v2_x", "team-a.v2_x"),
    ("a" * 64, "a" * 64),
], ids=["plain", "upper-folds", "punctuation", "longest"])
def test_canonical_name_folds_case(raw: str, stored: str) -> None:
    assert canonical_name(raw) == stored


@pytest.mark.parametrize("raw", [
    "", ".", "..", ".hidden", "-dash", "_under", "a/b", "a:b", "a~b", "a b", "a\n",
    "a" * 65, "é",
], ids=["empty", "dot", "dotdot", "leading-dot", "leading-dash", "leading-underscore",
        "slash", "colon", "tilde", "space", "newline", "too-long", "non-ascii"])
def test_canonical_name_rejects(raw: str) -> None:
    with pytest.raises(ValueError, match="Must be"):
        canonical_name(raw)
