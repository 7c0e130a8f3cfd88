"""The audit trail of the SQL stores (invariant 6): every event is hash-chained per review,
and `verify` finds a row changed, removed or inserted behind nodbot's back, naming the
review and the event. The attacks are made as someone with access to the database would:
plain SQL, append-only triggers lifted first."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from sqlalchemy import Connection

from nodbot.core import (
    ApprovalAlreadyDecided,
    ApprovalAlreadyVoted,
    ApprovalRecord,
    ApprovalRequest,
    ApprovalStore,
    Decision,
    DeferredApproval,
    Executor,
    InvalidDecisionError,
    NewDelivery,
    SqlApprovalStore,
    StoreSchemaError,
    ToolCall,
    ToolDecision,
    ToolRegistry,
    arguments_digest,
)
from nodbot.core.audit import EventHasher
from nodbot.core.sqlstore.audit import verify
from nodbot.core.sqlstore.engine import normalize_url, open_engine
from nodbot.core.sqlstore.migrate import _config
from nodbot.core.sqlstore.postgres import chain_settings
from tests.core.store.conftest import database_url

SQL_BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
KEY = "the audit key, long enough to count"


@pytest.fixture(params=SQL_BACKENDS)
async def url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """The URL of an empty database of each SQL backend."""
    async with database_url(request.param, tmp_path) as found:
        yield found


def ask(call_id: str, **changes: Any) -> ApprovalRequest:
    arguments = {"order_id": "o-7", "amount": 500.0}
    request = ApprovalRequest(
        "run_1", call_id, "refund", arguments, arguments_digest(arguments), requested_by="carol"
    )
    return replace(request, **changes)


@dataclass(frozen=True)
class Story:
    """The reviews of `history`, by what happened to them."""

    single: str
    quorum: str
    denied: str
    expired: str
    pending: str


async def history(store: SqlApprovalStore) -> Story:
    """A realistic history: refusals, votes, a quorum, decisions, consumes, finishes,
    deliveries made and given up, a timeout, and a review still pending."""
    single = (await store.create(ask("c1"))).approval_id
    await store.refuse(
        single,
        actor="U0999",
        channel="slack",
        reason="not a reviewer",
        person="slack:U0999",
        evidence={"user": "U0999", "team": "T1", "action_ts": "1.2"},
    )
    targets = [NewDelivery("request", "webhook:ops"), NewDelivery("request", "webhook:gone")]
    await store.announce(single, "request", targets)
    for delivery in await store.claim_deliveries(worker="w1"):
        if delivery.target == "webhook:ops":
            await store.delivered(delivery.delivery_id, worker="w1", ref={"ts": "1.5"})
        else:
            await store.delivery_failed(
                delivery.delivery_id, worker="w1", error="HTTP 410", retry_at=None
            )
    edit = Decision(
        approved=True, edited_args={"amount": 400.0}, reason="trimmed 🙂", decided_by="Zoë"
    )
    await store.vote(single, edit, channel="web", person="person:zoe", evidence={"session": "s-1"})
    assert (await store.claim(ask("c1"), actor="worker-1")).outcome == "taken"
    assert (await store.claim(ask("c1"), actor="worker-2")).outcome == "in_use"
    await store.finish(single, outcome="ok")

    quorum = (await store.create(ask("c2", approvals_required=2))).approval_id
    await store.vote(
        quorum,
        Decision(approved=True, decided_by="U0123"),
        channel="slack",
        person="person:ana",
        evidence={"user": "U0123"},
    )
    with pytest.raises(ApprovalAlreadyVoted):
        await store.vote(
            quorum,
            Decision(approved=True, decided_by="ana@example.com"),
            channel="web",
            person="person:ana",
        )
    bob = Decision(approved=True, decided_by="bob")
    await store.vote(quorum, bob, channel="api", person="person:bob", evidence={"token": "bob"})
    await store.consume(quorum, actor="worker-1")
    await store.finish(quorum, outcome="ok")

    denied = (await store.create(ask("c3"))).approval_id
    deny = Decision(approved=False, reason="no", decided_by="bob")
    await store.decide(denied, deny, channel="cli", person="person:bob", evidence={"os_user": "b"})
    with pytest.raises(ApprovalAlreadyDecided):
        await store.decide(denied, Decision(approved=True, decided_by="ana"), channel="api")
    assert (await store.claim(ask("c3"))).record.finished

    past = datetime.now(UTC) - timedelta(seconds=5)
    expired = (await store.create(ask("c4", deadline=past))).approval_id
    assert [r.approval_id for r in await store.expire_due()] == [expired]
    pending = (await store.create(ask("c5"))).approval_id
    return Story(single, quorum, denied, expired, pending)


async def recorded(url: str, key: str | None = None) -> Story:
    async with SqlApprovalStore(url, audit_key=key) as store:
        return await history(store)


class Database:
    """Plain SQL on the store's database, from outside nodbot (`?` placeholders)."""

    def __init__(self, url: str, **settings: str) -> None:
        self.url = normalize_url(url)
        self.settings = settings
        self.sqlite: sqlite3.Connection | None = None
        self.postgres: asyncpg.Connection | None = None

    async def __aenter__(self) -> Database:
        if self.url.get_backend_name() == "sqlite":
            self.sqlite = sqlite3.connect(self.url.database or "", isolation_level=None)
        else:
            dsn = self.url.set(drivername="postgresql").render_as_string(hide_password=False)
            self.postgres = await asyncpg.connect(dsn, server_settings=self.settings)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self.sqlite is not None:
            self.sqlite.close()
        if self.postgres is not None:
            await self.postgres.close()

    async def fetch(self, query: str, *parameters: Any) -> list[tuple[Any, ...]]:
        if self.sqlite is not None:
            values = [_sqlite_value(value) for value in parameters]
            return [tuple(row) for row in self.sqlite.execute(query, values).fetchall()]
        assert self.postgres is not None
        numbered = query
        for index in range(1, len(parameters) + 1):
            numbered = numbered.replace("?", f"${index}", 1)
        return [tuple(row) for row in await self.postgres.fetch(numbered, *parameters)]

    async def lift_append_only(self) -> None:
        """What an attacker with the database's keys does first."""
        if self.sqlite is not None:
            self.sqlite.execute("DROP TRIGGER events_no_update")
            self.sqlite.execute("DROP TRIGGER events_no_delete")
        else:
            await self.fetch("ALTER TABLE events DISABLE TRIGGER events_no_change")

    async def events(self, approval_id: str) -> list[tuple[Any, ...]]:
        """(seq, n, kind, hash) of a review's events, in chain order."""
        return await self.fetch(
            "SELECT seq, n, kind, hash FROM events WHERE approval_id = ? ORDER BY n, seq",
            approval_id,
        )

    async def insert_event(self, approval_id: str, kind: str, **chain: Any) -> None:
        columns = ["approval_id", "kind", "at", "actor", "channel", "detail", *chain]
        values = [approval_id, kind, datetime.now(UTC), "mallory", "api", "{}", *chain.values()]
        marks = ", ".join("?" for _ in columns)
        await self.fetch(f"INSERT INTO events ({', '.join(columns)}) VALUES ({marks})", *values)


def _sqlite_value(value: Any) -> Any:
    if isinstance(value, datetime):  # as the store writes times on SQLite
        return value.astimezone(UTC).isoformat(" ", "microseconds")[:26]
    return value


def event_named(approval_id: str, found: tuple[Any, ...]) -> str:
    seq, n, kind, _ = found
    return f"{approval_id}: event {seq} (n={n}, {kind})"


async def problems(url: str, key: str | None = None) -> list[str]:
    report = await verify(url, key)
    assert not report.ok
    return [str(problem) for problem in report.problems]


# --- an untouched history -----------------------------------------------------------------


async def test_an_untouched_history_verifies(url: str) -> None:
    async with SqlApprovalStore(url) as store:
        story = await history(store)
        everything = await store.events()
    report = await verify(url)
    assert report.ok, report.problems
    assert report.summary() == f"ok: {len(everything)} events in 5 reviews"
    assert len(everything) == 24  # 9 + 7 + 5 + 2 + 1: every step above made its event
    async with Database(url) as db:
        for approval_id in vars(story).values():
            chain = await db.fetch(
                "SELECT n, prev, hash FROM events WHERE approval_id = ? ORDER BY seq", approval_id
            )
            assert [n for n, _, _ in chain] == list(range(1, len(chain) + 1))
            assert [prev for _, prev, _ in chain] == [None] + [h for _, _, h in chain[:-1]]


async def test_a_keyed_history_verifies_only_with_its_key(url: str) -> None:
    await recorded(url, KEY)
    assert (await verify(url, KEY)).ok
    for wrong in (None, "another key, just as long"):
        report = await verify(url, wrong)
        assert report.problems and all(
            p.message == "hash does not match its contents (changed after it was written)"
            for p in report.problems
        )


async def test_events_record_person_evidence_action_and_digest(url: str) -> None:
    async with SqlApprovalStore(url) as store:
        story = await history(store)
        single = await store.events(story.single)
        quorum = await store.events(story.quorum)
        denied = await store.events(story.denied)
    digest = ask("c1").digest
    refused, voted, decided = (
        next(e for e in single if e.kind == kind) for kind in ("refused", "voted", "decided")
    )
    assert (refused.actor, refused.person) == ("U0999", "slack:U0999")
    assert refused.detail == {
        "reason": "not a reviewer",
        "evidence": {"user": "U0999", "team": "T1", "action_ts": "1.2"},
    }
    assert (voted.actor, voted.person, voted.channel) == ("Zoë", "person:zoe", "web")
    assert voted.detail == {
        "action": "edit",
        "reason": "trimmed 🙂",
        "edited_args": {"amount": 400.0},
        "digest": digest,
        "evidence": {"session": "s-1"},
    }
    assert decided.detail == {**voted.detail, "status": "approved"}
    assert (decided.actor, decided.person) == ("Zoë", "person:zoe")

    votes = [e for e in quorum if e.kind == "voted"]
    assert [(e.actor, e.person) for e in votes] == [("U0123", "person:ana"), ("bob", "person:bob")]
    [twice] = [e for e in quorum if e.kind == "refused"]
    assert (twice.actor, twice.person, twice.detail) == (
        "ana@example.com",
        "person:ana",
        {"reason": "already voted"},
    )
    [made] = [e for e in quorum if e.kind == "decided"]
    assert (made.actor, made.person) == ("U0123, bob", None)
    assert made.detail["voters"] == ["person:ana", "person:bob"]
    assert (made.detail["action"], made.detail["status"]) == ("approve", "approved")
    assert made.detail["evidence"] == {"token": "bob"}

    [no] = [e for e in denied if e.kind == "decided"]
    assert (no.person, no.detail["action"], no.detail["reason"]) == ("person:bob", "deny", "no")
    assert no.detail["evidence"] == {"os_user": "b"} and no.detail["digest"] == digest
    [late] = [e for e in denied if e.kind == "refused"]
    assert late.detail == {"reason": "already decided"}


async def test_concurrent_writers_of_one_review_keep_one_chain(url: str) -> None:
    async with SqlApprovalStore(url) as one, SqlApprovalStore(url) as other:
        approval_id = (await one.create(ask("c1", approvals_required=30))).approval_id
        refusals = [
            store.refuse(approval_id, actor=f"u{i}", channel="api", reason="no")
            for i in range(20)
            for store in (one, other)
        ]
        ballots = [
            store.vote(approval_id, Decision(approved=True, decided_by=f"v{i}"), channel="api")
            for i, store in enumerate([one, other] * 10)
        ]
        await asyncio.gather(*refusals, *ballots)
    assert (await verify(url)).ok
    async with Database(url) as db:
        chain = await db.events(approval_id)
    assert [n for _, n, _, _ in chain] == list(range(1, 62))


async def test_concurrent_votes_on_a_review_of_one_approval_decide_it_once(url: str) -> None:
    """A vote on a review that needs one approval decides it in one statement: of votes
    racing from two stores, one decides, the others are refused, and the chain holds."""
    async with SqlApprovalStore(url) as one, SqlApprovalStore(url) as other:
        approval_id = (await one.create(ask("c1"))).approval_id
        ballots = [
            store.vote(approval_id, Decision(approved=True, decided_by=f"v{i}"), channel="api")
            for i, store in enumerate([one, other] * 5)
        ]
        outcomes = await asyncio.gather(*ballots, return_exceptions=True)
        record = await one.get(approval_id)
        kinds = [event.kind for event in await one.events(approval_id)]
    decided = [o for o in outcomes if isinstance(o, ApprovalRecord)]
    assert len(decided) == 1
    assert all(isinstance(o, ApprovalAlreadyDecided) for o in outcomes if o is not decided[0])
    assert record.decision == decided[0].decision
    assert kinds == ["created", "voted", "decided", *["refused"] * 9]
    assert (await verify(url)).ok


async def test_a_vote_taken_back_leaves_no_link_behind(url: str) -> None:
    # The edit is refused inside the vote's transaction, after its `voted` event was chained:
    # the next event links to the last one committed, not to the one taken back.
    async with SqlApprovalStore(url) as store:
        approval_id = (await store.create(ask("c1", approvals_required=2))).approval_id
        edit = Decision(approved=True, decided_by="ana", edited_args={"amount": 1.0})
        with pytest.raises(InvalidDecisionError):
            await store.vote(approval_id, edit, channel="api")
        await store.vote(approval_id, Decision(approved=True, decided_by="bob"), channel="api")
        await store.refuse(approval_id, actor="eve", channel="api", reason="no")
        assert [e.kind for e in await store.events(approval_id)] == ["created", "voted", "refused"]
    assert (await verify(url)).ok


# --- attacks ----------------------------------------------------------------------------


async def test_a_changed_row_is_named(url: str) -> None:
    story = await recorded(url)
    async with Database(url) as db:
        [decided] = [e for e in await db.events(story.denied) if e[2] == "decided"]
        await db.lift_append_only()
        await db.fetch(
            "UPDATE events SET detail = replace(detail, 'denied', 'approved') WHERE seq = ?",
            decided[0],
        )
        await db.fetch("UPDATE events SET actor = 'ana' WHERE seq = ?", decided[0])
    assert await problems(url) == [
        f"{event_named(story.denied, decided)}: hash does not match its contents "
        "(changed after it was written)"
    ]


async def test_a_row_removed_from_the_middle_is_named(url: str) -> None:
    story = await recorded(url)
    async with Database(url) as db:
        chain = await db.events(story.quorum)
        first_vote = next(i for i, e in enumerate(chain) if e[2] == "voted")
        await db.lift_append_only()
        await db.fetch("DELETE FROM events WHERE seq = ?", chain[first_vote][0])
    gone, after = chain[first_vote][1], chain[first_vote + 1]
    assert await problems(url) == [
        f"{event_named(story.quorum, after)}: the events n={gone} are missing "
        f"(it follows n={gone - 1}): removed",
        f"{story.quorum}: the approval has 2 votes but its chain holds 1 voted event "
        f"(its chain ends at event {chain[-1][0]} (n={chain[-1][1]}, finished)): removed",
    ]


async def test_the_last_row_removed_is_named(url: str) -> None:
    story = await recorded(url)
    async with Database(url) as db:
        chain = await db.events(story.single)
        assert chain[-1][2] == "finished"
        await db.lift_append_only()
        await db.fetch("DELETE FROM events WHERE seq = ?", chain[-1][0])
    seq, n, kind, _ = chain[-2]
    assert await problems(url) == [
        f"{story.single}: the approval is finished but its chain holds 0 finished events "
        f"(its chain ends at event {seq} (n={n}, {kind})): removed"
    ]


async def test_a_review_whose_every_row_was_removed_is_named(url: str) -> None:
    story = await recorded(url)
    async with Database(url) as db:
        await db.lift_append_only()
        await db.fetch("DELETE FROM events WHERE approval_id = ?", story.pending)
    assert await problems(url) == [f"{story.pending}: has no events (its whole chain was removed)"]


async def test_a_row_inserted_with_plain_sql_is_named(url: str) -> None:
    story = await recorded(url)
    async with Database(url) as db:
        await db.insert_event(story.pending, "decided")
        [inserted] = await db.fetch("SELECT seq, n, kind, hash FROM events WHERE actor = 'mallory'")
    if normalize_url(url).get_backend_name() == "sqlite":
        # Nothing gives it a place: the chain columns are left empty.
        expected = f"{story.pending}: event {inserted[0]} (no n, decided): has no place in the "
        expected += "chain (no n): written outside nodbot"
    else:
        # The trigger places it, but only nodbot's sessions get a hash.
        assert inserted[1] == 2 and inserted[3] is None
        expected = f"{event_named(story.pending, inserted)}: has no hash: written outside nodbot"
    assert await problems(url) == [expected]


async def test_a_row_inserted_in_the_middle_with_a_right_hash_is_named(url: str) -> None:
    """Without a key the attacker can hash a row right, but not give it a place: the place
    it takes is another event's, whose link it breaks."""
    story = await recorded(url)
    async with Database(url) as db:
        first, second = (await db.events(story.single))[:2]
        [(prev,)] = await db.fetch("SELECT hash FROM events WHERE seq = ?", first[0])
        at = datetime.now(UTC)
        forged = EventHasher().hash(
            prev=prev,
            n=2,
            approval_id=story.single,
            kind="refused",
            at=at,
            actor="mallory",
            person=None,
            channel="api",
            detail="{}",
        )
        await db.fetch("DROP INDEX events_chain")
        await db.fetch(
            "INSERT INTO events (approval_id, kind, at, actor, channel, detail, n, prev, hash) "
            "VALUES (?, 'refused', ?, 'mallory', 'api', '{}', 2, ?, ?)",
            *(story.single, at, prev, forged),
        )
        [(seq,)] = await db.fetch("SELECT seq FROM events WHERE actor = 'mallory'")
    assert await problems(url) == [
        f"{story.single}: event {seq} (n=2, refused): has the same place as event "
        f"{second[0]}: one of them was inserted"
    ]


async def test_with_a_key_a_row_of_someone_without_it_is_named(url: str) -> None:
    story = await recorded(url, KEY)
    async with Database(url, **chain_settings(None)) as db:
        # Someone who knows the format (and, on PostgreSQL, sets nodbot.audit) but not the key.
        if db.sqlite is not None:
            [(n, prev)] = await db.fetch(
                "SELECT n, hash FROM events WHERE approval_id = ? ORDER BY n DESC LIMIT 1",
                story.pending,
            )
            at = datetime.now(UTC)
            fields = {"n": n + 1, "prev": prev, "approval_id": story.pending, "kind": "decided"}
            text = {"at": at, "actor": "mallory", "person": None, "channel": "api", "detail": "{}"}
            forged = EventHasher().hash(**fields, **text)
            await db.fetch(
                "INSERT INTO events (approval_id, kind, at, actor, channel, detail, n, prev, hash)"
                " VALUES (?, 'decided', ?, 'mallory', 'api', '{}', ?, ?, ?)",
                *(story.pending, at, n + 1, prev, forged),
            )
        else:
            await db.insert_event(story.pending, "decided")
        [inserted] = await db.fetch("SELECT seq, n, kind, hash FROM events WHERE actor = 'mallory'")
    assert await problems(url, KEY) == [
        f"{event_named(story.pending, inserted)}: hash is a plain SHA-256, not made with the "
        "audit key: written by someone who knows the format but not the key, or by a store "
        "without the key"
    ]


@pytest.mark.postgres
async def test_postgresql_a_session_with_another_key_writes_rows_that_fail(
    tmp_path: Path,
) -> None:
    async with database_url("postgresql", tmp_path) as url:
        story = await recorded(url, KEY)
        async with Database(url, **chain_settings("a guessed key, long too")) as db:
            await db.insert_event(story.pending, "decided")
            [inserted] = await db.fetch(
                "SELECT seq, n, kind, hash FROM events WHERE actor = 'mallory'"
            )
        assert await problems(url, KEY) == [
            f"{event_named(story.pending, inserted)}: hash does not match its contents "
            "(changed after it was written)"
        ]


# --- the data there before the chain -------------------------------------------------------


async def at_revision(url: str, revision: str) -> None:
    """Migrate an empty database up to `revision` only."""
    from alembic import command

    def upgrade(connection: Connection) -> None:
        command.upgrade(_config(connection), revision)

    engine = open_engine(normalize_url(url))
    try:
        async with engine.begin() as connection:
            await connection.run_sync(upgrade)
    finally:
        await engine.dispose()


OLD_APPROVAL = (
    "INSERT INTO approvals (approval_id, run_id, call_id, tool, arguments, digest, "
    "requested_by, status, decision, created_at, decided_at, consumed_at, finished_at, outcome) "
    "VALUES (?, 'run_old', ?, 'refund', '{}', ?, 'carol', ?, ?, ?, ?, ?, ?, ?)"
)
OLD_EVENT = (
    "INSERT INTO events (approval_id, kind, at, actor, channel, detail) VALUES (?, ?, ?, ?, ?, ?)"
)


async def old_history(url: str) -> list[str]:
    """Two reviews written by a nodbot before the chain (schema 0006), their events
    interleaved."""
    await at_revision(url, "0006")
    at = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
    digest = arguments_digest({})
    decision = Decision(approved=True, decided_by="ana").model_dump_json()
    async with Database(url) as db:
        for name, finished in (("apr_old1", at), ("apr_old2", None)):
            done = [at, at, finished, "ok" if finished else None]
            await db.fetch(OLD_APPROVAL, name, name, digest, "approved", decision, at, *done)
        steps = [
            ("apr_old1", "created", "carol", None, "{}"),
            ("apr_old2", "created", "carol", None, "{}"),
            ("apr_old1", "decided", "ana", "slack", '{"status":"approved"}'),
            ("apr_old2", "decided", "ana", "api", '{"status":"approved"}'),
            ("apr_old1", "consumed", "worker-1", "executor", "{}"),
            ("apr_old2", "consumed", "worker-1", "executor", "{}"),
            ("apr_old2", "refused", "Zoë 🙂", "web", '{"reason":"not a reviewer"}'),
            ("apr_old1", "finished", None, "executor", '{"outcome":"ok"}'),
        ]
        for index, (approval_id, kind, actor, channel, text) in enumerate(steps):
            moment = at + timedelta(seconds=index, microseconds=index)
            await db.fetch(OLD_EVENT, approval_id, kind, moment, actor, channel, text)
    return ["apr_old1", "apr_old2"]


@pytest.mark.parametrize("key", [None, KEY])
async def test_events_written_before_the_chain_verify_after_the_upgrade(
    url: str, key: str | None
) -> None:
    await old_history(url)
    with pytest.raises(StoreSchemaError, match="0006"):
        await verify(url, key)  # verify never migrates
    async with SqlApprovalStore(url, audit_key=key) as store:  # the upgrade chains them
        await store.finish("apr_old2", outcome="ok")
    assert (await verify(url, key)).summary() == "ok: 9 events in 2 reviews"
    async with Database(url) as db:
        chain = await db.fetch(
            "SELECT n, kind FROM events WHERE approval_id = 'apr_old2' ORDER BY seq"
        )
    assert chain == [
        (1, "created"),
        (2, "decided"),
        (3, "consumed"),
        (4, "refused"),
        (5, "finished"),
    ]


# --- every store, the memory one too ---------------------------------------------------


async def test_every_store_counts_a_person_once_and_records_the_evidence(
    store: ApprovalStore,
) -> None:
    approval_id = (await store.create(ask("c1", approvals_required=2))).approval_id
    slack = {"user": "U0123", "team": "T1", "action_ts": "1.2"}
    ana = Decision(approved=True, decided_by="U0123")
    await store.vote(approval_id, ana, channel="slack", person="person:ana", evidence=slack)
    same_person = Decision(approved=True, decided_by="ana@example.com")
    with pytest.raises(ApprovalAlreadyVoted, match="person:ana has already voted"):
        await store.vote(approval_id, same_person, channel="web", person="person:ana")
    await store.refuse(
        approval_id,
        actor="U0999",
        channel="slack",
        reason="not a reviewer",
        person="slack:U0999",
        evidence={"user": "U0999"},
    )
    bob = Decision(approved=True, decided_by="bob")
    record = await store.vote(approval_id, bob, channel="api", evidence={"token": "bob"})
    assert record.status == "approved" and record.decision is not None
    assert record.decision.decided_by == "U0123, bob"  # the handles, as before

    events = await store.events(approval_id)
    assert [(e.kind, e.actor, e.person) for e in events] == [
        ("created", "carol", None),
        ("voted", "U0123", "person:ana"),
        ("refused", "ana@example.com", "person:ana"),
        ("refused", "U0999", "slack:U0999"),
        ("voted", "bob", None),
        ("decided", "U0123, bob", None),
    ]
    digest = ask("c1").digest
    assert events[1].detail == {
        "action": "approve",
        "reason": None,
        "edited_args": None,
        "digest": digest,
        "evidence": slack,
    }
    assert events[3].detail == {"reason": "not a reviewer", "evidence": {"user": "U0999"}}
    assert events[4].detail["evidence"] == {"token": "bob"}
    assert events[5].detail == {
        "status": "approved",
        "action": "approve",
        "reason": "approved by U0123, bob",
        "edited_args": None,
        "digest": digest,
        "evidence": {"token": "bob"},
        "voters": ["person:ana", "bob"],  # a voter without a person is counted by handle
    }


async def test_the_executor_passes_person_and_evidence_to_the_vote(store: ApprovalStore) -> None:
    registry = ToolRegistry()

    @registry.tool(confirm=True)
    def refund(order_id: str, amount: float) -> str:
        return f"refunded {amount} on {order_id}"

    executor = Executor(registry, approval=DeferredApproval(store))
    call = ToolCall(name="refund", arguments={"order_id": "o-7", "amount": 500}, id="c1")
    paused = await executor.run_call(call, executor.context("run_1"))
    assert paused.error is not None
    approval_id = str(paused.error.details["approval_id"])
    edit = ToolDecision(action="edit", arguments={"amount": 50}, message="too much")
    await executor.decide(
        approval_id,
        edit,
        decided_by="U0123",
        channel="slack",
        person="person:ana",
        evidence={"user": "U0123", "team": "T1", "action_ts": "9.9"},
    )
    [decided] = [e for e in await store.events(approval_id) if e.kind == "decided"]
    assert (decided.actor, decided.person, decided.channel) == ("U0123", "person:ana", "slack")
    assert decided.detail["action"] == "edit" and decided.detail["reason"] == "too much"
    assert decided.detail["edited_args"] == {"amount": 50}
    assert decided.detail["digest"] == (await store.get(approval_id)).request.digest
    assert decided.detail["evidence"] == {"user": "U0123", "team": "T1", "action_ts": "9.9"}
