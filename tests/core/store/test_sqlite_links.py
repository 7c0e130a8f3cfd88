"""The SQLite backend chains a review's next event to the link it last committed for it,
without reading it again; a link another writer chained to since, or one whose transaction
was rolled back, is never chained to (invariant 6)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodbot.core import (
    Decision,
    InvalidDecisionError,
    SqlApprovalStore,
)
from nodbot.core.sqlstore.audit import verify
from tests.core.store.conftest import ask, traced

LAST_LINK_READ = "SELECT n, hash FROM events"


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'links.db'}"


async def chain_of(url: str, approval_id: str) -> list[tuple[int, str]]:
    async with SqlApprovalStore(url) as store:
        return [(event.seq, event.kind) for event in await store.events(approval_id)]


async def test_a_cycle_reads_no_link_of_its_own_review(url: str) -> None:
    async with SqlApprovalStore(url) as store:
        claimed = await store.claim(ask("c1"))
        sent = traced(store)
        approval_id = claimed.record.approval_id
        await store.decide(approval_id, Decision(approved=True, decided_by="ana"))
        assert (await store.claim(ask("c1"), actor="worker")).outcome == "taken"
        await store.finish(approval_id, outcome="ok")
    assert [s for s in sent if s.startswith(LAST_LINK_READ)] == []
    assert (await verify(url)).ok


async def test_a_link_another_connection_chained_to_since_is_read_again(url: str) -> None:
    async with SqlApprovalStore(url) as one, SqlApprovalStore(url) as other:
        approval_id = (await one.create(ask("c1", approvals_required=3))).approval_id
        # `one` remembers the `created` link; `other` chains three events after it.
        for voter in ("ana", "bob"):
            await other.vote(approval_id, Decision(approved=True, decided_by=voter), channel="api")
        await other.refuse(approval_id, actor="eve", channel="api", reason="no")
        sent = traced(one)
        await one.vote(approval_id, Decision(approved=True, decided_by="cy"), channel="api")
        await one.refuse(approval_id, actor="eve", channel="api", reason="again")
    # The vote met the place taken and read the last link; the refusal after it did not.
    assert len([s for s in sent if s.startswith(LAST_LINK_READ)]) == 1
    assert [kind for _, kind in await chain_of(url, approval_id)] == [
        "created",
        "voted",
        "voted",
        "refused",
        "voted",
        "decided",
        "refused",
    ]
    assert (await verify(url)).ok


async def test_a_link_of_a_transaction_taken_back_is_not_chained_to(url: str) -> None:
    async with SqlApprovalStore(url) as store:
        approval_id = (await store.create(ask("c1", approvals_required=2))).approval_id
        await store.vote(approval_id, Decision(approved=True, decided_by="ana"), channel="api")
        # Refused inside the vote's transaction, after its `voted` event was chained.
        edit = Decision(approved=True, decided_by="bob", edited_args={"amount": 1.0})
        with pytest.raises(InvalidDecisionError):
            await store.vote(approval_id, edit, channel="api")
        await store.refuse(approval_id, actor="eve", channel="api", reason="no")
    kinds = [kind for _, kind in await chain_of(url, approval_id)]
    assert kinds == ["created", "voted", "refused"]
    assert (await verify(url)).ok
