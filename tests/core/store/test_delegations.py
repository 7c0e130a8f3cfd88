"""Delegations on every store (`store.delegations`): live from their start until their end or
until ended, listed newest first, kept for the record after; on a SQL store, seen by another
store on the same database at once and after a restart."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from nodbot.core import ApprovalStore
from nodbot.core.delegations import DelegationNotFound, Delegations
from nodbot.core.sqlstore import SqlApprovalStore
from nodbot.core.store import utc_now
from tests.core.store.conftest import database_url


async def test_a_delegation_is_live_from_its_start_until_its_end(store: ApprovalStore) -> None:
    kept: Delegations = store.delegations  # type: ignore[attr-defined]
    assert isinstance(kept, Delegations)
    now = utc_now()
    back = now + timedelta(days=3)
    away = await kept.add(
        delegator="ana@example.com",
        delegate="bob@example.com",
        since=now - timedelta(minutes=1),
        until=back,
        reason="holiday",
        created_by="cli:ops",
    )
    later = await kept.add(
        delegator="cy@example.com",
        delegate="bob@example.com",
        since=now + timedelta(days=1),
        until=now + timedelta(days=2),
    )
    await kept.add(
        delegator="dee@example.com",
        delegate="bob@example.com",
        since=now - timedelta(days=2),
        until=now - timedelta(days=1),  # past
    )
    assert [d.delegation_id for d in await kept.live(now)] == [away.delegation_id]
    at_later = now + timedelta(days=1, hours=1)
    assert {d.delegator for d in await kept.live(at_later)} == {"ana@example.com", "cy@example.com"}
    assert await kept.live(back) == []  # `until` is the first moment it no longer holds
    found = (await kept.live(now))[0]
    assert (found.delegator, found.delegate, found.reason, found.created_by) == (
        "ana@example.com",
        "bob@example.com",
        "holiday",
        "cli:ops",
    )
    assert found.until == back and found.until.tzinfo is not None
    # Listed: those not over (live now or to come), newest first; all with live=False.
    assert [d.delegator for d in await kept.list()] == ["cy@example.com", "ana@example.com"]
    assert len(await kept.list(live=False)) == 3
    ended = await kept.end(away.delegation_id, by="inbox:ana@example.com")
    assert ended.ended_at is not None and ended.ended_by == "inbox:ana@example.com"
    assert await kept.live(now + timedelta(seconds=1)) == []
    again = await kept.end(away.delegation_id, by="someone else")
    assert again.ended_at == ended.ended_at and again.ended_by == "inbox:ana@example.com"
    assert [d.delegation_id for d in await kept.list()] == [later.delegation_id]
    with pytest.raises(DelegationNotFound):
        await kept.end("dlg_unknown")


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
)
async def test_a_delegation_is_seen_by_another_store_and_after_a_restart(
    backend: str, tmp_path: Path
) -> None:
    async with database_url(backend, tmp_path) as url:
        one, two = SqlApprovalStore(url), SqlApprovalStore(url)
        try:
            now = datetime.now(UTC)
            made = await one.delegations.add(
                delegator="ana@example.com",
                delegate="bob@example.com",
                since=now,
                until=now + timedelta(days=1),
            )
            seen = await two.delegations.live(now + timedelta(seconds=1))
            assert [d.delegation_id for d in seen] == [made.delegation_id]
            await two.delegations.end(made.delegation_id, by="cli:ops")
            assert await one.delegations.live(utc_now() + timedelta(seconds=1)) == []
        finally:
            await one.close()
            await two.close()
        again = SqlApprovalStore(url)
        try:
            (kept,) = await again.delegations.list(live=False)
            assert (kept.delegation_id, kept.ended_by) == (made.delegation_id, "cli:ops")
        finally:
            await again.close()
