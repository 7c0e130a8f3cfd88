"""How the SQLite backend writes times: the text of the moment it is given, every time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from nodbot.core.sqlstore.sqlite import _text


def test_each_moment_is_written_as_its_own_utc_text() -> None:
    first = datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC)
    second = first + timedelta(seconds=1)
    elsewhere = first.astimezone(timezone(timedelta(hours=2)))
    # The last moment's text is kept for the next call with the same object: alternating
    # moments, and an equal moment in another zone, must each still give their own text.
    assert _text(first) == "2026-01-02 03:04:05.000006"
    assert _text(second) == "2026-01-02 03:04:06.000006"
    assert _text(first) == "2026-01-02 03:04:05.000006"
    assert _text(first) == "2026-01-02 03:04:05.000006"
    assert _text(elsewhere) == "2026-01-02 03:04:05.000006"
