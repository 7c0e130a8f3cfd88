"""The audit chain's message and hashes (core/audit.py): one definition, held to its text."""

from __future__ import annotations

import hashlib
import hmac
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from nodbot.core.audit import EventHasher, chain_key, hmac_pads, message, moment_text

AT = datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC)


def fields(**changes: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "prev": None,
        "n": 1,
        "approval_id": "apr_1",
        "kind": "created",
        "at": AT,
        "actor": "ana",
        "person": None,
        "channel": "slack",
        "detail": "{}",
    }
    return {**values, **changes}


def test_the_message_is_the_documented_text() -> None:
    assert message(**fields()) == (
        b"nodbot-event-v1\n~\n1:1\n5:apr_1\n7:created\n26:2026-01-02T03:04:05.000006\n"
        b"3:ana\n~\n5:slack\n2:{}"
    )


def test_lengths_count_characters_and_null_is_not_a_value() -> None:
    text = message(**fields(actor="Zoë 🙂", person="~"))
    assert "\n5:Zoë 🙂\n1:~\n".encode() in text
    assert message(**fields(actor=None)) != message(**fields(actor="~"))
    # A value cannot pass for two: the lengths keep the fields apart.
    shifted = fields(actor="ana\n5:slack", channel=None)
    assert message(**shifted) != message(**fields())


def test_times_are_written_in_utc_and_a_naive_time_is_utc() -> None:
    elsewhere = AT.astimezone(timezone(timedelta(hours=-5)))
    assert moment_text(elsewhere) == moment_text(AT) == "2026-01-02T03:04:05.000006"
    assert moment_text(AT.replace(tzinfo=None)) == moment_text(AT)
    assert moment_text(datetime(2026, 1, 2, tzinfo=UTC)) == "2026-01-02T00:00:00.000000"


def test_without_a_key_the_hash_is_sha256_of_the_message() -> None:
    data = message(**fields())
    hasher = EventHasher()
    assert not hasher.keyed
    assert hasher.hash(**fields()) == hashlib.sha256(data).hexdigest()


def test_with_a_key_the_hash_is_an_hmac_with_the_keys_sha256() -> None:
    data = message(**fields())
    hasher = EventHasher("a key of sixteen+ characters")
    expected = hmac.new(
        hashlib.sha256(b"a key of sixteen+ characters").digest(), data, hashlib.sha256
    ).hexdigest()
    assert hasher.keyed and hasher.hash(**fields()) == expected
    assert EventHasher("another key, also long").hash(**fields()) != expected


def test_the_pads_make_the_same_hmac_with_plain_sha256() -> None:
    """What the PostgreSQL trigger computes: sha256(okey || sha256(ikey || message))."""
    secret = "a key of sixteen+ characters"
    inner, outer = (bytes.fromhex(pad) for pad in hmac_pads(secret))
    assert len(inner) == len(outer) == 64
    data = message(**fields(detail='{"reason":"nö"}'))
    by_pads = hashlib.sha256(outer + hashlib.sha256(inner + data).digest()).hexdigest()
    assert by_pads == hmac.new(chain_key(secret), data, hashlib.sha256).hexdigest()


def test_a_time_formatted_already_hashes_as_the_time_itself() -> None:
    values = fields(prev="ab" * 32, n=7, person="ana@example.com", actor=None)
    at_text = moment_text(values["at"])
    ordered = [values[name] for name in ("prev", "n", "approval_id", "kind")]
    rest = [values[name] for name in ("actor", "person", "channel", "detail")]
    for hasher in (EventHasher(), EventHasher("the audit key")):
        assert hasher.hash_at_text(*ordered, at_text, *rest) == hasher.hash(**values)
        later = moment_text(values["at"] + timedelta(microseconds=1))
        assert hasher.hash_at_text(*ordered, later, *rest) != hasher.hash(**values)
