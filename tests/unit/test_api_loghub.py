"""The shared feed of a followed log (services/api/loghub.py), without Redis."""

from __future__ import annotations

from services.api.loghub import FEED_LINES, Feed


def filled(lines: int) -> Feed:
    feed = Feed(last_id="0-0")
    for n in range(1, lines + 1):
        feed.add(f"{n}-0", f"frame {n}")
    return feed


def test_a_follower_takes_what_is_new_since_its_position() -> None:
    feed = filled(5)

    batch, position, dropped = feed.since(3)

    assert [entry_id for entry_id, _ in batch] == ["4-0", "5-0"]
    assert (position, dropped) == (5, False)
    assert feed.since(position) == ([], 5, False)


def test_a_feed_keeps_at_least_its_bound_and_says_when_a_follower_lags_past_it() -> None:
    feed = filled(2 * FEED_LINES + 1)

    assert FEED_LINES <= len(feed.entries) <= 2 * FEED_LINES
    assert feed.end == 2 * FEED_LINES + 1 and feed.last_id == f"{2 * FEED_LINES + 1}-0"
    batch, position, dropped = feed.since(0)
    assert dropped  # the follower must read the gap from Redis
    assert batch[-1][0] == feed.last_id and position == feed.end
