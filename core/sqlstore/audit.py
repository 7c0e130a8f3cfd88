"""The audit trail of a SQL store: `verify` walks every review's hash chain, `export` reads
every event out.

```python
report = await verify("sqlite:///nodbot.db", key=os.environ.get("NODBOT_AUDIT_KEY"))
print(report.summary())                     # ok: 812 events in 140 reviews
for problem in report.problems:             # or each problem, naming review and event:
    print(problem)                          # apr_1: event 7 (n=3, decided): hash does not ...
```

What `verify` finds, per review (the chain is defined in `core.audit`):

- an event whose hash does not match its contents (changed after it was written);
- an event whose `prev` is not the hash of the event before it, a gap in `n`, or two events
  in one place (an event removed or inserted);
- an event without a hash or a place (written outside nodbot);
- an approval that is decided, consumed or finished, or has votes or deliveries, without the
  events that say so (the end of its chain removed); an approval without any event; events
  of an approval that is not there.

What it cannot find: the last events of a review removed when nothing else records them (a
`refused` attempt, say), or a chain rewritten whole by someone who can compute the hashes:
anyone with write access when the store has no audit key. An export kept elsewhere anchors
what a later verify should still find.

Both read one consistent snapshot and take no write lock, so they may run beside the bot.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sqlalchemy import Row, event, func, select
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from nodbot.core.audit import EventHasher, moment_text
from nodbot.core.errors import StoreUnavailableError
from nodbot.core.sqlstore.engine import normalize_url, open_engine, redact, translate_errors
from nodbot.core.sqlstore.migrate import ensure_schema
from nodbot.core.sqlstore.schema import approvals, deliveries, events, votes

__all__ = ["AuditProblem", "AuditReport", "export", "verify"]

_EVENT_COLUMNS = (
    "seq",
    "approval_id",
    "n",
    "kind",
    "at",
    "actor",
    "person",
    "channel",
    "detail",
    "prev",
    "hash",
)


@dataclass(frozen=True)
class AuditProblem:
    """One thing wrong with the audit trail, named by review and, where there is one, event."""

    approval_id: str
    message: str
    """What is wrong and what it means, e.g. `hash does not match its contents (...)`."""
    seq: int | None = None
    """The event's `seq` (its place in the whole log), when the problem is one event's."""
    n: int | None = None
    """The event's place in its review's chain (None when it has none)."""
    kind: str | None = None
    """The event's kind."""

    def __str__(self) -> str:
        if self.seq is None:
            return f"{self.approval_id}: {self.message}"
        place = "no n" if self.n is None else f"n={self.n}"
        return f"{self.approval_id}: event {self.seq} ({place}, {self.kind}): {self.message}"


@dataclass(frozen=True)
class AuditReport:
    """What `verify` found."""

    events: int
    """How many events were checked."""
    reviews: int
    """How many reviews (approval ids) they belong to, or have no events at all."""
    problems: tuple[AuditProblem, ...]
    """Every problem, review by review, in chain order."""
    keyed: bool
    """Whether the hashes were checked as HMACs with a key."""

    @property
    def ok(self) -> bool:
        """Whether nothing is wrong."""
        return not self.problems

    def summary(self) -> str:
        """`ok: N events in M reviews`, or how many problems there are."""
        counted = f"{_plural(self.events, 'event')} in {_plural(self.reviews, 'review')}"
        if self.ok:
            return f"ok: {counted}"
        return f"{_plural(len(self.problems), 'problem')} in {counted}"


@dataclass(frozen=True)
class _Facts:
    """What the other tables say a review's chain must hold."""

    decided: bool
    consumed: bool
    finished: bool
    votes: int = 0
    sent: int = 0
    failed: int = 0


async def verify(url: str | URL, key: str | None = None) -> AuditReport:
    """Check every review's chain in the store at `url`, with the store's audit `key` (None
    when it has none). Raises `StoreSchemaError` when the database is not at this nodbot's
    schema (nothing is migrated), `StoreUnavailableError` when it cannot be read."""
    hasher, plain = EventHasher(key or None), EventHasher()
    found: list[AuditProblem] = []
    counted = reviews = 0
    async with _snapshot(url) as connection:
        facts = await _facts(connection)
        result = await connection.stream(
            select(events).order_by(events.c.approval_id, events.c.n, events.c.seq)
        )
        async for approval_id, rows in _by_review(result):
            counted += len(rows)
            reviews += 1
            found += _check_chain(approval_id, rows, hasher, plain)
            found += _check_facts(approval_id, rows, facts.pop(approval_id, None))
    for approval_id in facts:
        found.append(AuditProblem(approval_id, "has no events (its whole chain was removed)"))
    return AuditReport(counted, reviews + len(facts), tuple(found), hasher.keyed)


async def export(url: str | URL) -> AsyncIterator[dict[str, Any]]:
    """Every event of the store at `url`, oldest first, with every column: `at` in the form
    the hash is made of (UTC, `YYYY-MM-DDTHH:MM:SS.ffffff`) and `detail` as the stored JSON
    text, so that the chains can be checked again from the export alone. Raises as `verify`."""
    async with _snapshot(url) as connection:
        result = await connection.stream(select(events).order_by(events.c.seq))
        async for row in result:
            values = {name: getattr(row, name) for name in _EVENT_COLUMNS}
            values["at"] = moment_text(row.at)
            yield values


@contextlib.asynccontextmanager
async def _snapshot(url: str | URL) -> AsyncIterator[AsyncConnection]:
    """A read-only connection on one snapshot of the database, after checking its schema."""
    parsed = normalize_url(url)
    if parsed.get_backend_name() == "sqlite":
        _check_exists(parsed)
    migrator = open_engine(parsed)
    try:
        await ensure_schema(migrator, parsed, auto_migrate=False)
    finally:
        await migrator.dispose()
    reader = _reader(parsed)
    try:
        with translate_errors(parsed):
            async with reader.connect() as connection:
                yield connection
    finally:
        await reader.dispose()


def _check_exists(url: URL) -> None:
    """Refuse a SQLite file that is not there (opening it would make an empty one)."""
    database = (url.database or "").removeprefix("file:").split("?", 1)[0]
    if not Path(database).is_file():
        shown = redact(url)
        raise StoreUnavailableError(f"there is no database at {database}", url=shown)


def _reader(url: URL) -> AsyncEngine:
    """An engine whose transactions read one snapshot without taking a write lock: a
    deferred BEGIN on SQLite (WAL: writers go on meanwhile), REPEATABLE READ, READ ONLY on
    PostgreSQL."""
    if url.get_backend_name() != "sqlite":
        return create_async_engine(
            url,
            isolation_level="REPEATABLE READ",
            execution_options={"postgresql_readonly": True},
        )
    engine = create_async_engine(url)

    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # BEGIN is emitted in _on_begin

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN")

    return engine


async def _facts(connection: AsyncConnection) -> dict[str, _Facts]:
    """Per review, what the approvals, votes and deliveries tables say happened."""
    found: dict[str, _Facts] = {}
    rows = await connection.execute(
        select(
            approvals.c.approval_id,
            approvals.c.decided_at,
            approvals.c.consumed_at,
            approvals.c.finished_at,
        )
    )
    for approval_id, decided_at, consumed_at, finished_at in rows:
        found[approval_id] = _Facts(
            decided_at is not None, consumed_at is not None, finished_at is not None
        )
    counts = await connection.execute(
        select(votes.c.approval_id, func.count()).group_by(votes.c.approval_id)
    )
    for approval_id, number in counts:
        if approval_id in found:
            found[approval_id] = replace(found[approval_id], votes=number)
    settled = await connection.execute(
        select(deliveries.c.approval_id, deliveries.c.status, func.count())
        .where(deliveries.c.status.in_(("sent", "failed")))
        .group_by(deliveries.c.approval_id, deliveries.c.status)
    )
    for approval_id, status, number in settled:
        if approval_id in found:
            if status == "sent":
                found[approval_id] = replace(found[approval_id], sent=number)
            else:
                found[approval_id] = replace(found[approval_id], failed=number)
    return found


async def _by_review(result: Any) -> AsyncIterator[tuple[str, list[Row[Any]]]]:
    """The streamed events, one review's at a time."""
    current: str | None = None
    rows: list[Row[Any]] = []
    async for row in result:
        if row.approval_id != current:
            if current is not None:
                yield current, rows
            current, rows = row.approval_id, []
        rows.append(row)
    if current is not None:
        yield current, rows


def _check_chain(
    approval_id: str, rows: Sequence[Row[Any]], hasher: EventHasher, plain: EventHasher
) -> list[AuditProblem]:
    """The problems of one review's chain: its rows, in any order."""
    found: list[AuditProblem] = []

    def problem(row: Row[Any], message: str) -> None:
        found.append(AuditProblem(approval_id, message, row.seq, row.n, row.kind))

    for row in rows:
        if row.n is None:
            problem(row, "has no place in the chain (no n): written outside nodbot")
    placed = sorted((row for row in rows if row.n is not None), key=lambda r: (r.n, r.seq))
    before: Row[Any] | None = None
    for row in placed:
        for message in _hash_problems(row, hasher, plain):
            problem(row, message)
        if before is not None and row.n == before.n:
            problem(row, f"has the same place as event {before.seq}: one of them was inserted")
            continue
        expected = 1 if before is None else before.n + 1
        if row.n != expected:
            missing = f"n={expected}" if row.n == expected + 1 else f"n={expected}..{row.n - 1}"
            after = "it is the first left" if before is None else f"it follows n={before.n}"
            problem(row, f"the events {missing} are missing ({after}): removed")
        elif before is None and row.prev is not None:
            problem(row, "is first in its chain but names a previous hash: events were removed")
        elif before is not None and row.prev != before.hash:
            problem(
                row,
                f"prev is not the hash of event {before.seq} (n={before.n}) before it: "
                "an event was removed, inserted or rewritten",
            )
        before = row
    return found


def _hash_problems(row: Row[Any], hasher: EventHasher, plain: EventHasher) -> Iterator[str]:
    if row.hash is None:
        yield "has no hash: written outside nodbot"
        return
    fields = {name: getattr(row, name) for name in _EVENT_COLUMNS if name not in ("seq", "hash")}
    if hasher.hash(**fields) == row.hash:
        return
    if hasher.keyed and plain.hash(**fields) == row.hash:
        yield (
            "hash is a plain SHA-256, not made with the audit key: written by someone who "
            "knows the format but not the key, or by a store without the key"
        )
    else:
        yield "hash does not match its contents (changed after it was written)"


_MUST_HAVE: tuple[tuple[str, str, Callable[[_Facts], int]], ...] = (
    ("decided", "decided", lambda facts: int(facts.decided)),
    ("consumed", "consumed", lambda facts: int(facts.consumed)),
    ("finished", "finished", lambda facts: int(facts.finished)),
    ("voted", "has {count} votes", lambda facts: facts.votes),
    ("delivered", "has {count} deliveries made", lambda facts: facts.sent),
    ("undelivered", "has {count} deliveries given up", lambda facts: facts.failed),
)


def _check_facts(
    approval_id: str, rows: Sequence[Row[Any]], facts: _Facts | None
) -> list[AuditProblem]:
    """What the review's other rows say happened, and its chain does not hold."""
    if facts is None:
        return [AuditProblem(approval_id, "has events but no approval row: it was removed")]
    last = max(rows, key=lambda row: (row.n is not None, row.n or 0, row.seq))
    end = f"its chain ends at event {last.seq} (n={last.n}, {last.kind})"
    kinds = [row.kind for row in rows]
    found = []
    if "created" not in kinds:
        found.append(AuditProblem(approval_id, f"has no created event ({end}): removed"))
    for kind, state, needed in _MUST_HAVE:
        count, held = needed(facts), kinds.count(kind)
        if held >= count:
            continue
        said = f"is {state}" if "{count}" not in state else state.format(count=count)
        message = (
            f"the approval {said} but its chain holds {held} {kind} event"
            f"{'' if held == 1 else 's'} ({end}): removed"
        )
        found.append(AuditProblem(approval_id, message))
    return found


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"
