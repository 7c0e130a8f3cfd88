"""Remembered approvals on every store (`store.remembered`): kept until they expire or are
forgotten, found by scope only while live, listed newest first."""

from __future__ import annotations

from datetime import timedelta

import pytest

from nodbot.core import ApprovalStore
from nodbot.core.remembered import RememberedApprovals, RememberedNotFound, remember_scope
from nodbot.core.store import utc_now


async def test_remembered_approvals_live_until_expired_or_forgotten(store: ApprovalStore) -> None:
    kept: RememberedApprovals = store.remembered  # type: ignore[attr-defined]
    scope = remember_scope("send_email", "rule-digest", {"to": "ana@example.com"})
    assert await kept.find(scope) is None
    now = utc_now()
    first = await kept.remember(
        scope=scope,
        tool="send_email",
        arguments={"to": "ana@example.com"},
        rule="rule-digest",
        decided_by="lead@example.com",
        person="person:lead",
        approval_id="apr_01",
        until=now + timedelta(hours=1),
    )
    await kept.remember(
        scope=remember_scope("send_email", "rule-digest", {"to": "bo@example.com"}),
        tool="send_email",
        arguments={"to": "bo@example.com"},
        rule="rule-digest",
        decided_by="lead@example.com",
        person=None,
        approval_id="apr_02",
        until=now - timedelta(seconds=1),  # expired already
    )
    found = await kept.find(scope)
    assert found is not None and found.remember_id == first.remember_id
    assert (found.decided_by, found.person, found.approval_id) == (
        "lead@example.com",
        "person:lead",
        "apr_01",
    )
    assert found.arguments == {"to": "ana@example.com"}
    assert [k.approval_id for k in await kept.list()] == ["apr_01"]
    assert [k.approval_id for k in await kept.list(live=False)] == ["apr_02", "apr_01"]
    gone = await kept.forget(first.remember_id, by="cli:ops")
    assert gone.forgotten_at is not None and gone.forgotten_by == "cli:ops"
    assert await kept.find(scope) is None
    assert await kept.list() == []
    with pytest.raises(RememberedNotFound):
        await kept.forget("rem_unknown")


def test_the_scope_is_the_tool_the_rule_and_the_arguments() -> None:
    base = remember_scope("send_email", "r1", {"to": "a"})
    assert base == remember_scope("send_email", "r1", {"to": "a"})
    assert base != remember_scope("send_email", "r2", {"to": "a"})
    assert base != remember_scope("refund", "r1", {"to": "a"})
    assert base != remember_scope("send_email", "r1", {"to": "b"})
