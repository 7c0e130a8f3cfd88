"""The SQLite backend: the standard library's sqlite3, in the event loop's own thread.

Why not a driver thread: an SQLite transaction on a WAL file takes tens of microseconds,
less than handing it to another thread and back, and aiosqlite makes several such hand-offs
per query (measured: about 9 per read, 2-4 ms per store operation, against 0.05 ms here).
Each operation runs start to finish without yielding, so operations of one process never
interleave. Writers of other processes are waited for without blocking the loop: the write
lock is taken with `BEGIN IMMEDIATE` and, while another process holds it, retried after
short sleeps until the store's `lock_timeout` runs out.

WAL checkpoints are kept out of the loop, and the log small, by a `Checkpointer`
(`checkpoints.py`), which the commits of the loop's connection tell.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, TypeAlias, TypeVar

from nodbot.core.audit import EventHasher
from nodbot.core.sqlstore.backend import (
    ALREADY_DECIDED,
    COLUMN_NAMES,
    COLUMNS,
    DELIVERY_COLUMN_NAMES,
    DELIVERY_COLUMNS,
    RUN_COLUMN_NAMES,
    RUN_COLUMNS,
    Act,
    Announcing,
    Change,
    Claimed,
    EventRow,
    EventValues,
    KeyTaken,
    Once,
    Repeat,
    Row,
    VoteResult,
    claim_step,
    consume_refusal,
    consumed_events,
    created_event,
    delivered_event,
    detail,
    timeout_detail,
    undelivered_event,
)
from nodbot.core.sqlstore.checkpoints import WAL_LIMIT, Checkpointer
from nodbot.core.sqlstore.notices import Listening, NotListening
from nodbot.core.store import ALREADY_VOTED, TIMEOUT_DECIDER, ApprovalRequest

__all__ = ["SqliteBackend"]

T = TypeVar("T")

_TIMES = ("created_at", "decided_at", "consumed_at", "finished_at", "deadline")
_NEW = (  # created_at and deadline (8 and 9) are the times
    "approval_id",
    "run_id",
    "call_id",
    "tool",
    "arguments",
    "digest",
    "requested_by",
    "status",
    "created_at",
    "deadline",
    "on_timeout",
    "policy",
    "approvals_required",
)
_INSERT = (
    f"INSERT INTO approvals ({', '.join(_NEW)}) VALUES ({', '.join('?' for _ in _NEW)}) "
    "ON CONFLICT (run_id, call_id) WHERE finished_at IS NULL DO NOTHING"
)
_EVENT = (
    "INSERT INTO events (approval_id, kind, at, actor, person, channel, detail, n, prev, hash) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
# The review's last link, through the events_chain index.
_LAST_LINK = (
    "SELECT n, hash FROM events WHERE approval_id = ? AND n IS NOT NULL ORDER BY n DESC LIMIT 1"
)
_SELECT_ONE = f"SELECT {COLUMNS} FROM approvals WHERE approval_id = ?"
_SELECT_NEWEST = (
    f"SELECT {COLUMNS} FROM approvals WHERE run_id = ? AND call_id = ? ORDER BY seq DESC LIMIT 1"
)
_SELECT_ACTIVE = (
    f"SELECT {COLUMNS} FROM approvals WHERE run_id = ? AND call_id = ? AND finished_at IS NULL"
)


_CONSUME_SET = (
    # A denial runs nothing, so it is finished the moment it is taken.
    "consumed_at = ?, finished_at = CASE WHEN status = 'denied' THEN ? END, "
    "outcome = CASE WHEN status = 'denied' THEN 'denied' END"
)
_CONSUME_WHERE = "decided_at IS NOT NULL AND consumed_at IS NULL"
# A claim takes a decided record of the call as it found it (by status): an approval with
# `consumed_at` alone, since a SET that names `finished_at` rewrites the record's entry in the
# partial index approvals_active_call even when the value stays NULL (a page more a cycle).
_TAKE_WHERE = (
    "approval_id = ? AND run_id = ? AND call_id = ? AND tool = ? AND digest = ? "
    f"AND status = ? AND finished_at IS NULL AND {_CONSUME_WHERE}"
)
_TAKE_SET = {
    "approved": "consumed_at = ?",
    "denied": "consumed_at = ?, finished_at = ?, outcome = 'denied'",
}
_TAKE = {
    status: f"UPDATE approvals SET {assignments} WHERE {_TAKE_WHERE} RETURNING {COLUMNS}"
    for status, assignments in _TAKE_SET.items()
}
# The same for a caller that knows the record (`take_known`): nothing read back, not even a
# `RETURNING 1` (the cursor's rowcount says whether it was taken; a RETURNING clause costs
# the statement more than the rowcount does).
_TAKE_KNOWN = {
    status: f"UPDATE approvals SET {assignments} WHERE {_TAKE_WHERE}"
    for status, assignments in _TAKE_SET.items()
}
_FINISH_SET = "finished_at = ?, outcome = ?"
_FINISH_WHERE = "consumed_at IS NOT NULL AND finished_at IS NULL"
_FINISH = f"UPDATE approvals SET {_FINISH_SET} WHERE approval_id = ? AND {_FINISH_WHERE}"
_COUNTS = "SELECT status, count(*) FROM approvals GROUP BY status"
# A consumed, unfinished review with no result kept yet, and the result kept of one.
_KEEPABLE = (
    "SELECT 1 FROM approvals WHERE approval_id = ? AND consumed_at IS NOT NULL "
    "AND finished_at IS NULL AND NOT EXISTS "
    "(SELECT 1 FROM events WHERE events.approval_id = approvals.approval_id AND kind = 'kept')"
)
_KEPT = "SELECT detail FROM events WHERE approval_id = ? AND kind = 'kept' ORDER BY seq LIMIT 1"
_VOTES = "SELECT voter, decision FROM votes WHERE approval_id = ? ORDER BY seq"
# A vote on an undecided review that needs one approval decides it: no votes to read.
_SOLE_VOTE = (
    "UPDATE approvals SET decision = ?, status = ?, decided_at = ? "
    f"WHERE approval_id = ? AND decision IS NULL AND approvals_required = 1 RETURNING {COLUMNS}"
)
# The same with no outcome stage to come: the outcome is marked announced once the request
# is. A statement of its own: naming `announced` in the SET rewrites the review's entry in
# the partial index approvals_unannounced even when the value stays.
_SOLE_VOTE_TOLD = _SOLE_VOTE.replace(
    "decided_at = ? ",
    "decided_at = ?, announced = CASE WHEN announced = 1 THEN 2 ELSE announced END ",
    1,
)
# The same two for a caller that knows the record (`decide_known`): nothing read back (the
# rowcount says whether it was decided).
_SOLE_VOTE_KNOWN = _SOLE_VOTE.replace(f" RETURNING {COLUMNS}", "")
_SOLE_VOTE_TOLD_KNOWN = _SOLE_VOTE_TOLD.replace(f" RETURNING {COLUMNS}", "")
_DECIDE_KNOWN = (
    "UPDATE approvals SET decision = ?, status = ?, decided_at = ? "
    "WHERE approval_id = ? AND decision IS NULL"
)
_INSERT_VOTE = "INSERT INTO votes (approval_id, voter, decision, at) VALUES (?, ?, ?, ?)"
# The insert is the check: a message id processed before is there (see backend.py).
_PROCESS = (
    "INSERT INTO processed_messages (message_id, approval_id, at) VALUES (?, ?, ?) "
    "ON CONFLICT (message_id) DO NOTHING"
)
_PROCESSED_ON = "SELECT approval_id FROM processed_messages WHERE message_id = ?"
_EXPIRE = (
    "UPDATE approvals SET decision = CASE WHEN on_timeout = 'approve' THEN ? ELSE ? END, "
    "status = CASE WHEN on_timeout = 'approve' THEN 'approved' ELSE 'denied' END, "
    "decided_at = ? WHERE status = 'pending' AND seq IN ("
    "  SELECT seq FROM approvals INDEXED BY approvals_deadline"
    "  WHERE status = 'pending' AND deadline <= ?"
    "  ORDER BY deadline LIMIT ?"
    f") RETURNING {COLUMNS}"
)
_ANY_DUE = (
    "SELECT 1 FROM approvals INDEXED BY approvals_deadline"
    " WHERE status = 'pending' AND deadline <= ? LIMIT 1"
)
_RUN_TIMES = ("created_at", "updated_at", "lease_until")
# A run starts with the count of its reviews made before it (none, when it is created
# first, as the bot does), through the index of the run's records.
_INSERT_RUN = (
    f"INSERT INTO runs ({RUN_COLUMNS}, pending) "
    f"VALUES ({', '.join('?' for _ in RUN_COLUMN_NAMES)}, ("
    "SELECT count(*) FROM approvals INDEXED BY approvals_call"
    " WHERE run_id = ? AND status = 'pending')) "
    f"RETURNING {RUN_COLUMNS}"
)
# Each review made pending, or decided, moves its run's count (when the run is in `runs`).
_COUNT_PENDING = "UPDATE runs SET pending = pending + ? WHERE run_id = ?"
_SELECT_RUN = f"SELECT {RUN_COLUMNS} FROM runs WHERE run_id = ?"
_GET_RUN = f"SELECT {RUN_COLUMNS}, pending FROM runs WHERE run_id = ?"
# Idempotency keys (`idempotency_keys`): the insert does nothing when the key is there.
_KEY_COLUMNS = ("token_name", "route", "key", "body_digest", "target_id", "created_at")
_INSERT_KEY = (
    f"INSERT INTO idempotency_keys ({', '.join(_KEY_COLUMNS)}) VALUES (?, ?, ?, ?, ?, ?) "
    "ON CONFLICT DO NOTHING"
)
_FIND_KEY = (
    f"SELECT {', '.join(_KEY_COLUMNS)} FROM idempotency_keys "
    "WHERE token_name = ? AND route = ? AND key = ?"
)
_PRUNE_KEYS = "DELETE FROM idempotency_keys WHERE created_at < ?"
"""A run with how many of its reviews are pending (`RunRecord.pending`)."""
_SAVE_RUN = (
    "UPDATE runs SET status = ?, messages = ?, final_text = ?, error = ?, updated_at = ?, "
    "version = version + 1, claimed_by = NULL, lease_until = NULL "
    f"WHERE run_id = ? AND version = ? RETURNING {RUN_COLUMNS}, pending"
)
"""A step's save, answering the run with how many of its reviews are pending (as `_GET_RUN`):
whoever waits on the run is shown it without reading it again."""
_RENEW_CLAIM = (
    "UPDATE runs SET version = version + 1, updated_at = ?, lease_until = ? "
    f"WHERE run_id = ? AND version = ? AND lease_until > ? RETURNING {RUN_COLUMNS}"
)
# Waiting runs none of whose reviews is pending, and running ones whose lease ran out: the
# first condition is the runs_claimable index's own (the runs it holds), the second leaves
# out the running runs whose lease has not run out.
_READY = (
    "  SELECT seq FROM runs INDEXED BY runs_claimable"
    "  WHERE (status = 'running' OR (status = 'waiting' AND pending = 0))"
    "  AND (status = 'waiting' OR lease_until <= ?)"
)
_ANY_READY = f"{_READY} LIMIT 1"
_CLAIM_READY = (
    "UPDATE runs SET status = 'running', version = version + 1, updated_at = ?, "
    f"claimed_by = ?, lease_until = ? WHERE seq IN ({_READY}"
    "  ORDER BY seq LIMIT ?"
    f") RETURNING seq, {RUN_COLUMNS}"
)


_LAST_TEXT: tuple[datetime | None, str] = (None, "")
"""The moment `_text` formatted last, and its text: one operation formats its time for the
row, for each event and for each hash (a tuple, so that it is read and replaced whole)."""


def _text(moment: datetime) -> str:
    """The form SQLAlchemy writes DATETIME columns in on SQLite: naive UTC, ISO with a space
    (the `+00:00` that isoformat adds for UTC is cut off)."""
    global _LAST_TEXT
    last, text = _LAST_TEXT
    if moment is last:
        return text
    utc = moment if moment.tzinfo is UTC else moment.astimezone(UTC)
    text = utc.isoformat(" ", "microseconds")[:26]
    _LAST_TEXT = (moment, text)
    return text


def _insert_key(db: sqlite3.Connection, row: Row) -> None:
    """Insert the idempotency key `row` in the transaction of `db`. Raises `KeyTaken` when
    it is there already (the caller's transaction is then rolled back)."""
    values = [row[name] for name in _KEY_COLUMNS]
    values[-1] = _text(values[-1])
    if not db.execute(_INSERT_KEY, values).rowcount:
        raise KeyTaken(row["key"])


def _moment(text: str) -> datetime:
    return datetime.fromisoformat(text + "+00:00")


def _row(found: Sequence[Any] | None) -> Row | None:
    if found is None:
        return None
    row = dict(zip(COLUMN_NAMES, found, strict=True))
    for column in _TIMES:
        if row[column] is not None:
            row[column] = _moment(row[column])
    return row


def _run_row(found: Sequence[Any] | None) -> Row | None:
    if found is None:
        return None
    row = dict(zip(RUN_COLUMN_NAMES, found, strict=True))
    for column in _RUN_TIMES:
        if row[column] is not None:
            row[column] = _moment(row[column])
    return row


_DELIVERY_TIMES = ("due_at", "created_at", "sent_at", "lease_until")
_UNANNOUNCED = (
    f"SELECT {COLUMNS}, announced FROM approvals INDEXED BY approvals_unannounced "
    "WHERE announced < 2 AND (announced = 0 OR decided_at IS NOT NULL) ORDER BY seq LIMIT ?"
)
_INSERT_DELIVERY = (
    "INSERT INTO deliveries (approval_id, kind, target, status, attempts, due_at, created_at,"
    " claimed_by, lease_until) VALUES (?, ?, ?, 'due', 0, ?, ?, ?, ?)"
    f" ON CONFLICT (approval_id, kind, target) DO NOTHING RETURNING {DELIVERY_COLUMNS}"
)
_DUE = (
    "  SELECT seq FROM deliveries WHERE status = 'due' AND due_at <= ?"
    "  AND (lease_until IS NULL OR lease_until <= ?)"
)
_ANY_DELIVERY = f"{_DUE} LIMIT 1"
# The same with the deliveries a worker holds and lost track of (`Outbox.claim_deliveries`).
_DUE_OR_LOST = (
    "  SELECT seq FROM deliveries WHERE status = 'due' AND due_at <= ?"
    "  AND (lease_until IS NULL OR lease_until <= ? OR (claimed_by = ? AND lease_until <= ?"
    "  AND seq NOT IN (SELECT value FROM json_each(?))))"
)
_ANY_DELIVERY_OR_LOST = f"{_DUE_OR_LOST} LIMIT 1"
_CLAIM_DELIVERIES_OR_LOST = (
    f"UPDATE deliveries SET claimed_by = ?, lease_until = ? WHERE seq IN ({_DUE_OR_LOST}"
    "  ORDER BY due_at, seq LIMIT ?"
    f") RETURNING {DELIVERY_COLUMNS}"
)
_CLAIM_DELIVERIES = (
    f"UPDATE deliveries SET claimed_by = ?, lease_until = ? WHERE seq IN ({_DUE}"
    "  ORDER BY due_at, seq LIMIT ?"
    f") RETURNING {DELIVERY_COLUMNS}"
)
_SETTLE_DELIVERY = (
    "UPDATE deliveries SET status = ?, attempts = attempts + 1, sent_at = ?, "
    "ref = coalesce(?, ref), "
    "error = ?, due_at = coalesce(?, due_at), claimed_by = NULL, lease_until = NULL "
    f"WHERE seq = ? AND claimed_by = ? AND status = 'due' RETURNING {DELIVERY_COLUMNS}"
)
_SELECT_DELIVERY = f"SELECT {DELIVERY_COLUMNS} FROM deliveries WHERE seq = ?"
# Failed deliveries waiting for their next attempt made due now (`Outbox.retry_deliveries_now`).
_RETRY_NOW = (
    "UPDATE deliveries SET due_at = ? WHERE status = 'due' AND due_at > ? AND attempts > 0"
    "  AND (lease_until IS NULL OR lease_until <= ?)"
    "  AND target IN (SELECT value FROM json_each(?))"
)
# The progress of a delivery still held: its ref, and nothing else.
_DELIVERY_PROGRESS = (
    "UPDATE deliveries SET ref = ? WHERE seq = ? AND claimed_by = ? AND status = 'due' "
    f"RETURNING {DELIVERY_COLUMNS}"
)


def _delivery_row(found: Sequence[Any] | None) -> Row | None:
    if found is None:
        return None
    row = dict(zip(DELIVERY_COLUMN_NAMES, found, strict=True))
    for column in _DELIVERY_TIMES:
        if row[column] is not None:
            row[column] = _moment(row[column])
    return row


def _delivery_values(
    approval_id: str,
    deliveries: Sequence[Row],
    at: datetime,
    claim: tuple[str, datetime] | None,
) -> list[tuple[Any, ...]]:
    """The values of `_INSERT_DELIVERY` for each delivery a review wants (kind, target,
    due_at), announced at `at` (those due by then claimed by `claim`'s worker)."""
    now = _text(at)
    claimed = (None, None) if claim is None else (claim[0], _text(claim[1]))
    values = []
    for wanted in deliveries:
        due = wanted["due_at"] or at
        held = claimed if due <= at else (None, None)
        values.append((approval_id, wanted["kind"], wanted["target"], _text(due), now, *held))
    return values


def _announce(
    db: sqlite3.Connection, approval_id: str, stage: int, values: Sequence[tuple[Any, ...]]
) -> list[Row]:
    """Insert a review's deliveries (`_delivery_values`) not made before and raise its
    `announced` to `stage`; the rows inserted."""
    made = [_delivery_row(db.execute(_INSERT_DELIVERY, v).fetchone()) for v in values]
    db.execute(
        "UPDATE approvals SET announced = ? WHERE approval_id = ? AND announced < ?",
        (stage, approval_id, stage),
    )
    return [row for row in made if row is not None]


def _run_values(row: Row) -> tuple[Any, ...]:
    return tuple(
        _text(row[name]) if isinstance(row.get(name), datetime) else row.get(name)
        for name in RUN_COLUMN_NAMES
    )


def _new_values(row: Row) -> tuple[Any, ...]:
    """`_NEW`'s values of a new record, in its order, the times as the columns hold them."""
    deadline = row["deadline"]
    return (
        row["approval_id"],
        row["run_id"],
        row["call_id"],
        row["tool"],
        row["arguments"],
        row["digest"],
        row["requested_by"],
        row["status"],
        _text(row["created_at"]),
        None if deadline is None else _text(deadline),
        row["on_timeout"],
        row["policy"],
        row["approvals_required"],
    )


Link: TypeAlias = tuple[int, str | None]
"""A review's last event as the chain sees it: its `n` and `hash`."""
NO_LINK: Link = (0, None)
"""Before a review's first event."""
LINKS_KEPT = 4096
"""How many reviews' last links a connection remembers (see `SqliteBackend._append`)."""


def _keep_newest(remembered: dict[Any, Any]) -> None:
    """Forget the oldest entries of `remembered` (in insertion order) past `LINKS_KEPT`."""
    while len(remembered) > LINKS_KEPT:
        del remembered[next(iter(remembered))]


def _finished_event(outcome: str) -> EventValues:
    return EventValues("finished", None, "executor", detail("outcome", outcome))


def _execute_take(
    db: sqlite3.Connection,
    statements: dict[str, str],
    decided: tuple[str, str],
    request: ApprovalRequest,
    now: str,
) -> sqlite3.Cursor | None:
    """`statements[status]` run to consume `decided` (a record's id and status) for
    `request`: what it returns, and its `rowcount`, say whether it did (the record may not be
    so any more); None when there is no statement for that status."""
    approval_id, status = decided
    statement = statements.get(status)
    if statement is None:
        return None
    moments = (now,) if status == "approved" else (now, now)
    where = (approval_id, request.run_id, request.call_id, request.tool, request.digest)
    return db.execute(statement, (*moments, *where, status))


def _is_busy(error: sqlite3.OperationalError) -> bool:
    return "locked" in str(error) or "busy" in str(error)


class SqliteBackend:
    """Atomic store operations on one SQLite connection."""

    def __init__(
        self,
        target: str,
        *,
        uri: bool,
        busy_timeout: float,
        hasher: EventHasher,
        wal_limit: int = WAL_LIMIT,
    ) -> None:
        self._busy_timeout = busy_timeout
        self._hasher = hasher
        self._db = sqlite3.connect(target, uri=uri, isolation_level=None, check_same_thread=False)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA busy_timeout = 0")  # waiting is done in _patiently
        self._db.execute("PRAGMA synchronous = NORMAL")
        self._links: dict[str, Link] = {}
        """The last link of each review this connection chained to lately, as committed: the
        next event of the review is chained to it without reading it (see `_append`)."""
        self._written: dict[str, Link] = {}
        """The links the open transaction wrote: kept in `_links` once it commits."""
        self._decided: dict[tuple[str, str], tuple[str, str]] = {}
        """The reviews this connection decided lately, by their call (run id, call id): their
        id and status, so that the call's next claim takes the decision without reading the
        record first (see `claim`). A hint: a claim that finds the record changed since
        reads it, as when there is none."""
        self.checkpointer: Checkpointer | None = None
        """What checkpoints the file's log (a file in WAL mode, as the schema check set it;
        None for a database in memory)."""
        if target != ":memory:" and "mode=memory" not in target:
            self.checkpointer = Checkpointer(target, uri=uri, wal_limit=wal_limit)
            self._db.execute("PRAGMA wal_autocheckpoint = 0")  # see checkpoints.py
            self._db.execute(f"PRAGMA journal_size_limit = {int(wal_limit)}")

    def _append(
        self,
        db: sqlite3.Connection,
        approval_id: str,
        at: datetime,
        event: EventValues,
        *,
        after: Link | None = None,
    ) -> Link:
        """Append one event, chained to the review's last (every event goes through here),
        and return its link. `after` is the review's last link when the caller knows it (a
        new record has none: `NO_LINK`; a second event of the same transaction: what the
        first returned), saving the read of it. Called inside a write transaction, so no
        other writer can chain to the same link.

        Otherwise the link this connection last committed for the review is taken as the
        last, unread. Another process may have chained to it since: then the event's place
        is taken, the unique index on (approval_id, n) refuses the insert, and the event is
        chained again to the last link as read."""
        if after is not None:
            return self._insert_event(db, approval_id, at, event, after)
        known = self._written.get(approval_id) or self._links.get(approval_id)
        if known is not None:
            try:
                return self._insert_event(db, approval_id, at, event, known)
            except sqlite3.IntegrityError:
                pass  # chained to by another writer since: read the last link below
        last = db.execute(_LAST_LINK, (approval_id,)).fetchone()
        return self._insert_event(
            db, approval_id, at, event, NO_LINK if last is None else (last[0], last[1])
        )

    def _insert_event(
        self,
        db: sqlite3.Connection,
        approval_id: str,
        at: datetime,
        event: EventValues,
        after: Link,
    ) -> Link:
        """Insert `event` as the link after `after`; remembered as the review's last link
        once the transaction commits."""
        n, prev = after[0] + 1, after[1]
        kind, actor, channel, text, person = event
        stored = _text(at)  # the message has a T where the column has a space
        moment = f"{stored[:10]}T{stored[11:]}"
        digest = self._hasher.hash_at_text(
            prev, n, approval_id, kind, moment, actor, person, channel, text
        )
        values = (approval_id, kind, stored, actor, person, channel, text, n, prev, digest)
        db.execute(_EVENT, values)
        self._written[approval_id] = link = (n, digest)
        return link

    def _insert(
        self, db: sqlite3.Connection, row: Row, at: datetime, *, whole: bool = True
    ) -> Row | None:
        """Insert a new record with its `created` event and return it as stored (as `_row`
        reads it, without reading it; not `whole`: only its id and `created_at`); None if the
        call has an active one."""
        values = _new_values(row)
        if not db.execute(_INSERT, values).rowcount:
            return None
        self._append(db, row["approval_id"], at, created_event(row), after=NO_LINK)
        db.execute(_COUNT_PENDING, (1, row["run_id"]))
        if not whole:
            return {"approval_id": values[0], "created_at": _moment(values[8])}
        inserted = {name: row.get(name) for name in COLUMN_NAMES}  # the rest: NULL
        inserted["created_at"] = _moment(values[8])  # the times as the columns hold them
        inserted["deadline"] = None if values[9] is None else _moment(values[9])
        return inserted

    async def _patiently(self, attempt: Callable[[], T]) -> T:
        """`attempt()`, retried after short sleeps while another process holds a lock that
        it needs, until `busy_timeout` runs out. The event loop is never blocked waiting."""
        delay, deadline = 0.0005, time.monotonic() + self._busy_timeout
        while True:
            try:
                return attempt()
            except sqlite3.OperationalError as error:
                if not _is_busy(error) or time.monotonic() > deadline:
                    raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)

    async def _transaction(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """Run `work` in one write transaction; the write lock is taken first (IMMEDIATE),
        so `work` never waits for another writer half-way."""
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as error:
            if not _is_busy(error):
                raise
            await self._patiently(lambda: self._db.execute("BEGIN IMMEDIATE"))
        try:
            result = work(self._db)
            self._db.execute("COMMIT")
        except BaseException:
            self._written.clear()  # never committed: no event may be chained to them
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise
        if self._written:
            self._remember_links()
        if self.checkpointer is not None:
            self.checkpointer.wrote()
        return result

    def _remember_links(self) -> None:
        """Keep the links the transaction just committed, and at most `LINKS_KEPT` in all
        (the oldest remembered are forgotten first: their next event reads its link)."""
        self._links.update(self._written)
        self._written.clear()
        _keep_newest(self._links)

    def _note_decided(self, row: Row) -> None:
        """Remember that this connection decided the review `row` (see `_decided`)."""
        self._decided[row["run_id"], row["call_id"]] = (row["approval_id"], row["status"])
        _keep_newest(self._decided)

    async def _fetch_one(self, query: str, parameters: Sequence[Any]) -> Row | None:
        return _row(await self._patiently(lambda: self._db.execute(query, parameters).fetchone()))

    async def _fetch_all(self, query: str, parameters: Sequence[Any]) -> list[sqlite3.Row]:
        return await self._patiently(lambda: self._db.execute(query, parameters).fetchall())

    async def create(self, row: Row, event_at: datetime, key: Row | None = None) -> Row:
        call = (row["run_id"], row["call_id"])
        active = await self._fetch_one(_SELECT_ACTIVE, call)
        if active is not None:
            return active  # a resume: no write transaction needed

        def work(db: sqlite3.Connection) -> Row:
            inserted = self._insert(db, row, event_at)
            if inserted is not None and key is not None:
                _insert_key(db, key)  # KeyTaken rolls the record back
            # None: another process made the active record since the read above.
            return inserted or _row(db.execute(_SELECT_ACTIVE, call).fetchone()) or {}

        return await self._transaction(work)

    async def claim(
        self,
        request: ApprovalRequest,
        new_row: Callable[[], Row],
        event_at: datetime,
        actor: str | None,
    ) -> Claimed:
        key = (request.run_id, request.call_id)
        now = _text(event_at)

        def work(db: sqlite3.Connection) -> Claimed:
            # A call whose review this connection decided is taken at once: most likely its
            # record is still as the decision left it (else the take finds nothing, and the
            # claim goes on as any other).
            decided = self._decided.pop(key, None)
            if decided is not None:
                taken = self._take(db, decided, request, now)
                if taken is not None:
                    return self._taken(db, taken, event_at, actor)
            # Otherwise the call's review is made, unless it has an active record (the insert
            # does nothing then); that record is read and taken, or said why it cannot be.
            # The write lock is held throughout, so nothing changes between these statements.
            created = self._insert(db, new_row(), event_at, whole=False)
            if created is not None:  # the caller has the rest (see `Backend.claim`)
                return Claimed("pending", created, created=True)
            active = _row(db.execute(_SELECT_ACTIVE, key).fetchone())
            if active is None:  # cannot be: the lock is held and the insert found one
                raise AssertionError(f"call {key} has no active record after all")
            step = claim_step(active, request)
            if step == "take":
                found = (active["approval_id"], active["status"])
                taken = self._take(db, found, request, now)
                if taken is None:  # cannot be: the lock is held and it was decided, unused
                    raise AssertionError(f"approval {found[0]} was not taken")
                return self._taken(db, taken, event_at, actor)
            if step == "in_use":
                refusal = EventValues("refused", actor, "executor", consume_refusal(active))
                self._append(db, active["approval_id"], event_at, refusal)
            return Claimed(step, active)

        return await self._transaction(work)

    async def keep_results(self, kept: Sequence[tuple[str, str]], at: datetime) -> None:
        def work(db: sqlite3.Connection) -> None:
            for approval_id, result in kept:
                if db.execute(_KEEPABLE, (approval_id,)).fetchone() is not None:
                    self._append(db, approval_id, at, EventValues("kept", None, "executor", result))

        await self._transaction(work)

    async def kept_result(self, approval_id: str) -> str | None:
        found = await self._fetch_all(_KEPT, (approval_id,))
        return str(found[0][0]) if found else None

    async def take_known(
        self,
        approval_id: str,
        status: str,
        request: ApprovalRequest,
        at: datetime,
        actor: str | None,
    ) -> datetime | None:
        now = _text(at)

        def work(db: sqlite3.Connection) -> bool:
            self._decided.pop((request.run_id, request.call_id), None)  # taken here, or not
            taking = _execute_take(db, _TAKE_KNOWN, (approval_id, status), request, now)
            if taking is None or not taking.rowcount:
                return False
            link = None
            for event in consumed_events({"status": status}, actor):
                link = self._append(db, approval_id, at, event, after=link)
            return True

        return _moment(now) if await self._transaction(work) else None

    @staticmethod
    def _take(
        db: sqlite3.Connection, decided: tuple[str, str], request: ApprovalRequest, now: str
    ) -> Row | None:
        """Consume the call's active record `decided` (its id and status) if it is still
        decided and unused and was made for this tool and these arguments; None if not."""
        taking = _execute_take(db, _TAKE, decided, request, now)
        return None if taking is None else _row(taking.fetchone())

    def _taken(
        self, db: sqlite3.Connection, taken: Row, event_at: datetime, actor: str | None
    ) -> Claimed:
        """The claim that took `taken`, with its events appended."""
        link = None
        for event in consumed_events(taken, actor):
            link = self._append(db, taken["approval_id"], event_at, event, after=link)
        return Claimed("taken", taken)

    async def refuse(
        self, approval_id: str, at: datetime, event: EventValues, once: Once | None = None
    ) -> bool | Repeat:
        def work(db: sqlite3.Connection) -> bool | Repeat:
            if once is not None:
                processed = self._process(db, approval_id, once, at)
                if processed is None:
                    return False
                if isinstance(processed, Repeat):
                    return processed
                self._append(db, approval_id, at, event)
                return True
            if db.execute(
                "SELECT 1 FROM approvals WHERE approval_id = ?", (approval_id,)
            ).fetchone():
                self._append(db, approval_id, at, event)
                return True
            return False

        return await self._transaction(work)

    def _process(
        self, db: sqlite3.Connection, approval_id: str, once: Once, at: datetime
    ) -> Row | Repeat | None:
        """Inside a write transaction: record `once`'s message as processed by an act on the
        review; the review's row, or a `Repeat` (its `refused` event appended) when the
        message was processed before, or None when there is no such review."""
        row = _row(db.execute(_SELECT_ONE, (approval_id,)).fetchone())
        if row is None:
            return None
        if db.execute(_PROCESS, (once.message_id, approval_id, _text(at))).rowcount:
            return row
        first = db.execute(_PROCESSED_ON, (once.message_id,)).fetchone()[0]
        self._append(db, approval_id, at, once.refusal(first))
        return Repeat(once.message_id, first)

    async def get(self, approval_id: str) -> Row | None:
        return await self._fetch_one(_SELECT_ONE, (approval_id,))

    async def find(self, run_id: str, call_id: str) -> Row | None:
        return await self._fetch_one(_SELECT_NEWEST, (run_id, call_id))

    async def list_rows(
        self, run_id: str | None, status: str | None, limit: int | None, newest_first: bool
    ) -> list[Row]:
        where, parameters = [], []
        if run_id is not None:
            where.append("run_id = ?")
            parameters.append(run_id)
        if status is not None:
            where.append("status = ?")
            parameters.append(status)
        query = f"SELECT {COLUMNS} FROM approvals"
        if run_id is not None:
            # A run has few records: without statistics the planner may prefer the status
            # index, which for "pending" can mean scanning every pending record of every run.
            query += " INDEXED BY approvals_call"
        if where:
            query += " WHERE " + " AND ".join(where)
        query += " ORDER BY seq DESC" if newest_first else " ORDER BY seq"
        if limit is not None:
            query += f" LIMIT {int(limit)}"
        return [_row(found) or {} for found in await self._fetch_all(query, parameters)]

    async def decide(self, approval_id: str, act: Act, at: datetime) -> Change | Repeat:
        work = self._update_work(
            approval_id,
            "decision = ?, status = ?, decided_at = ?",
            "decision IS NULL",
            (act.decision.model_dump_json(), act.status, _text(at)),
            lambda row: [act.decided_event(row["digest"])],
            lambda row: act.refused(ALREADY_DECIDED, act.decision.decided_by),
            at,
            decides=True,
        )
        once = act.once
        if once is None:
            return await self._transaction(work)

        def work_once(db: sqlite3.Connection) -> Change | Repeat:
            processed = self._process(db, approval_id, once, at)
            if processed is None:
                return Change(None, None)
            return processed if isinstance(processed, Repeat) else work(db)

        return await self._transaction(work_once)

    async def decide_known(
        self, known: Row, act: Act, at: datetime, *, vote: bool = False, outcome_stage: bool = True
    ) -> datetime | None:
        approval_id, now = known["approval_id"], _text(at)
        if not vote:
            statement = _DECIDE_KNOWN
        else:
            statement = _SOLE_VOTE_KNOWN if outcome_stage else _SOLE_VOTE_TOLD_KNOWN
        parameters = (act.decision.model_dump_json(), act.status, now, approval_id)

        def work(db: sqlite3.Connection) -> bool:
            if not db.execute(statement, parameters).rowcount:
                return False
            link = None
            if vote:
                link = self._append(db, approval_id, at, act.voted_event(known["digest"]))
            decided = act.decided_event(known["digest"])
            self._append(db, approval_id, at, decided, after=link)
            db.execute(_COUNT_PENDING, (-1, known["run_id"]))
            self._note_decided({**known, "status": act.status})
            return True

        return _moment(now) if await self._transaction(work) else None

    async def vote(
        self, approval_id: str, act: Act, at: datetime, *, outcome_stage: bool = True
    ) -> VoteResult | Repeat:
        now = _text(at)
        ballot, voter = act.decision.model_dump_json(), act.voter
        actor = act.decision.decided_by or ""
        sole_vote = _SOLE_VOTE if outcome_stage else _SOLE_VOTE_TOLD
        once = act.once

        def work(db: sqlite3.Connection) -> VoteResult | Repeat:
            if once is not None:
                processed = self._process(db, approval_id, once, at)
                if processed is None:
                    return VoteResult("missing", None)
                if isinstance(processed, Repeat):
                    return processed
            sole = _row(db.execute(sole_vote, (ballot, act.status, now, approval_id)).fetchone())
            if sole is not None:  # it needed one approval: this vote decided it (see Act)
                link = self._append(db, approval_id, at, act.voted_event(sole["digest"]))
                decided = act.decided_event(sole["digest"])
                self._append(db, approval_id, at, decided, after=link)
                db.execute(_COUNT_PENDING, (-1, sole["run_id"]))
                self._note_decided(sole)
                return VoteResult("decided", sole)
            row = _row(db.execute(_SELECT_ONE, (approval_id,)).fetchone())
            if row is None:
                return VoteResult("missing", None)
            if row["decision"] is not None:
                self._append(db, approval_id, at, act.refused(ALREADY_DECIDED, actor))
                return VoteResult("decided_before", row)
            earlier = db.execute(_VOTES, (approval_id,)).fetchall()
            if any(found[0] == voter for found in earlier):
                self._append(db, approval_id, at, act.refused(ALREADY_VOTED, actor))
                return VoteResult("voted_before", row)
            db.execute(_INSERT_VOTE, (approval_id, voter, ballot, now))
            link = self._append(db, approval_id, at, act.voted_event(row["digest"]))
            voters = [found[0] for found in earlier] + [voter]
            counted = act.count([found[1] for found in earlier], voters, row)
            if counted is None:
                return VoteResult("recorded", row)
            changed = _row(
                db.execute(
                    "UPDATE approvals SET decision = ?, status = ?, decided_at = ? "
                    f"WHERE approval_id = ? AND decision IS NULL RETURNING {COLUMNS}",
                    (counted.decision, counted.status, now, approval_id),
                ).fetchone()
            )
            db.execute(_COUNT_PENDING, (-1, row["run_id"]))
            self._append(db, approval_id, at, counted.event, after=link)
            if changed is not None:
                self._note_decided(changed)
            return VoteResult("decided", changed)

        return await self._transaction(work)

    async def consume(self, approval_id: str, at: datetime, actor: str | None) -> Change:
        now = _text(at)
        return await self._update(
            approval_id,
            _CONSUME_SET,
            _CONSUME_WHERE,
            (now, now),
            lambda row: consumed_events(row, actor),
            lambda row: EventValues("refused", actor, "executor", consume_refusal(row)),
            at,
        )

    async def finish(self, approval_id: str, at: datetime, outcome: str) -> Change:
        return await self._update(
            approval_id,
            _FINISH_SET,
            _FINISH_WHERE,
            (_text(at), outcome),
            lambda row: [_finished_event(outcome)],
            lambda row: None,
            at,
        )

    async def finish_known(self, approval_id: str, at: datetime, outcome: str) -> datetime | None:
        stored = _text(at)

        def work(db: sqlite3.Connection) -> bool:
            if not db.execute(_FINISH, (stored, outcome, approval_id)).rowcount:
                return False
            self._append(db, approval_id, at, _finished_event(outcome))
            return True

        return _moment(stored) if await self._transaction(work) else None

    async def _update(
        self,
        approval_id: str,
        assignments: str,
        condition: str,
        parameters: tuple[Any, ...],
        events: Callable[[Row], Sequence[EventValues]],
        refusal: Callable[[Row], EventValues | None],
        at: datetime,
        *,
        decides: bool = False,
    ) -> Change:
        """Change the row if `condition` holds and append `events(row)`; otherwise append
        the `refused` event `refusal(existing)` gives, if any. A change that `decides` a
        pending review takes it off its run's count."""
        work = self._update_work(
            approval_id,
            assignments,
            condition,
            parameters,
            events,
            refusal,
            at,
            decides=decides,
        )
        return await self._transaction(work)

    def _update_work(
        self,
        approval_id: str,
        assignments: str,
        condition: str,
        parameters: tuple[Any, ...],
        events: Callable[[Row], Sequence[EventValues]],
        refusal: Callable[[Row], EventValues | None],
        at: datetime,
        *,
        decides: bool = False,
    ) -> Callable[[sqlite3.Connection], Change]:
        """The transaction's work of `_update`."""

        def work(db: sqlite3.Connection) -> Change:
            changed = _row(
                db.execute(
                    f"UPDATE approvals SET {assignments} WHERE approval_id = ? AND {condition} "
                    f"RETURNING {COLUMNS}",
                    (*parameters, approval_id),
                ).fetchone()
            )
            if changed is not None:
                link = None
                for event in events(changed):
                    link = self._append(db, approval_id, at, event, after=link)
                if decides:
                    db.execute(_COUNT_PENDING, (-1, changed["run_id"]))
                    self._note_decided(changed)
                return Change(changed, None)
            existing = _row(db.execute(_SELECT_ONE, (approval_id,)).fetchone())
            refused = refusal(existing) if existing is not None else None
            if refused is not None:
                self._append(db, approval_id, at, refused)
            return Change(None, existing)

        return work

    async def event_rows(self, approval_id: str | None) -> list[EventRow]:
        query = "SELECT seq, approval_id, kind, at, actor, channel, detail, person FROM events"
        parameters: tuple[str, ...] = ()
        if approval_id is not None:
            query += " WHERE approval_id = ?"
            parameters = (approval_id,)
        rows = await self._fetch_all(query + " ORDER BY seq", parameters)
        return [EventRow(r[0], r[1], r[2], _moment(r[3]), r[4], r[5], r[6], r[7]) for r in rows]

    async def expire_due(self, at: datetime, decisions: dict[str, str], limit: int) -> list[Row]:
        now = _text(at)
        parameters = (decisions["approve"], decisions["deny"], now, now, limit)
        # Asked at every step of every bot: a read first, so that nothing due costs no write lock.
        if not await self._fetch_all(_ANY_DUE, (now,)):
            return []

        def work(db: sqlite3.Connection) -> list[Row]:
            expired = [_row(found) or {} for found in db.execute(_EXPIRE, parameters).fetchall()]
            for row in expired:
                text = timeout_detail(row["on_timeout"]).text(row["digest"])
                event = EventValues("decided", TIMEOUT_DECIDER, "timer", text)
                self._append(db, row["approval_id"], at, event)
            runs = Counter(row["run_id"] for row in expired)
            db.executemany(_COUNT_PENDING, [(-n, run_id) for run_id, n in runs.items()])
            return expired

        return await self._transaction(work)

    async def insert_run(
        self,
        row: Row,
        reviews: Sequence[Row] = (),
        announcing: Announcing | None = None,
        key: Row | None = None,
    ) -> Row | None:
        values = (*_run_values(row), row["run_id"])
        announced = (
            []
            if announcing is None
            else [
                (
                    approval_id,
                    _delivery_values(approval_id, wanted, announcing.at, announcing.claim),
                )
                for approval_id, wanted in announcing.deliveries.items()
            ]
        )

        def work(db: sqlite3.Connection) -> Row | None:
            if key is not None:
                _insert_key(db, key)  # KeyTaken: nothing written
            try:
                inserted = _run_row(db.execute(_INSERT_RUN, values).fetchone())
            except sqlite3.IntegrityError:
                return None  # a run with this id exists
            for review in reviews:  # each counts itself in the run's pending
                self._insert(db, review, review["created_at"])
            if inserted is not None and announcing is not None:
                stage = announcing.stage
                inserted["deliveries"] = [
                    made
                    for approval_id, each in announced
                    for made in _announce(db, approval_id, stage, each)
                ]
            return inserted

        return await self._transaction(work)

    async def find_key(self, token_name: str, route: str, key: str) -> Row | None:
        found = await self._fetch_all(_FIND_KEY, (token_name, route, key))
        if not found:
            return None
        row = dict(zip(_KEY_COLUMNS, found[0], strict=True))
        return {**row, "created_at": _moment(row["created_at"])}

    async def insert_key(self, row: Row) -> None:
        await self._transaction(lambda db: _insert_key(db, row))

    async def prune_keys(self, before: datetime) -> None:
        await self._transaction(lambda db: db.execute(_PRUNE_KEYS, (_text(before),)))

    async def get_run(self, run_id: str) -> Row | None:
        def read() -> Sequence[Any] | None:
            found: Sequence[Any] | None = self._db.execute(_GET_RUN, (run_id,)).fetchone()
            return found

        found = await self._patiently(read)
        if found is None:
            return None
        row = _run_row(found[:-1])
        return None if row is None else {**row, "pending": found[-1]}

    async def save_run(
        self, run_id: str, version: int, values: Row, spent: Sequence[tuple[str, str]] = ()
    ) -> Change:
        at = values["updated_at"]
        parameters = (
            values["status"],
            values["messages"],
            values["final_text"],
            values["error"],
            _text(at),
            run_id,
            version,
        )

        def finish(db: sqlite3.Connection) -> None:
            for approval_id, outcome in spent:
                if db.execute(_FINISH, (_text(at), outcome, approval_id)).rowcount:
                    # (else: finished already, nothing to record)
                    self._append(db, approval_id, at, _finished_event(outcome))

        return await self._run_change(_SAVE_RUN, parameters, run_id, then=finish, counted=True)

    async def renew_claim(
        self, run_id: str, version: int, at: datetime, lease_until: datetime
    ) -> Change:
        parameters = (_text(at), _text(lease_until), run_id, version, _text(at))
        return await self._run_change(_RENEW_CLAIM, parameters, run_id)

    async def claim_ready(
        self, worker: str, at: datetime, lease_until: datetime, limit: int
    ) -> list[Row]:
        parameters = (_text(at), worker, _text(lease_until), _text(at), limit)
        # Asked at every step of the runs' lane: a read first, so that nothing ready costs no
        # write transaction.
        if not await self._fetch_all(_ANY_READY, (_text(at),)):
            return []

        def work(db: sqlite3.Connection) -> list[Sequence[Any]]:
            return sorted(db.execute(_CLAIM_READY, parameters).fetchall(), key=lambda r: r[0])

        return [_run_row(tuple(found)[1:]) or {} for found in await self._transaction(work)]

    async def _run_change(
        self,
        query: str,
        parameters: tuple[Any, ...],
        run_id: str,
        *,
        then: Callable[[sqlite3.Connection], None] | None = None,
        counted: bool = False,
    ) -> Change:
        """`query` changes the run, and then, if it did, `then` is done in the same
        transaction; `counted`: it returns the run's pending count after its columns
        (`_SAVE_RUN`)."""

        def work(db: sqlite3.Connection) -> Change:
            found = db.execute(query, parameters).fetchone()
            changed = _run_row(found[:-1] if counted and found is not None else found)
            if changed is not None:
                if counted:
                    changed["pending"] = found[-1]
                if then is not None:
                    then(db)
                return Change(changed, None)
            return Change(None, _run_row(self._fetch_run(db, run_id)))

        return await self._transaction(work)

    @staticmethod
    def _fetch_run(db: sqlite3.Connection, run_id: str) -> Sequence[Any] | None:
        found: Sequence[Any] | None = db.execute(_SELECT_RUN, (run_id,)).fetchone()
        return found

    async def unannounced(self, limit: int) -> list[Row]:
        found = await self._fetch_all(_UNANNOUNCED, (limit,))
        rows = []
        for raw in found:
            row = _row(tuple(raw)[:-1]) or {}
            row["announced"] = raw[-1]
            rows.append(row)
        return rows

    async def announce(
        self,
        approval_id: str,
        stage: int,
        deliveries: list[Row],
        at: datetime,
        claim: tuple[str, datetime] | None = None,
    ) -> list[Row]:
        values = _delivery_values(approval_id, deliveries, at, claim)
        return await self._transaction(lambda db: _announce(db, approval_id, stage, values))

    async def claim_deliveries(
        self,
        worker: str,
        at: datetime,
        lease_until: datetime,
        limit: int,
        lost: tuple[datetime, list[int]] | None = None,
    ) -> list[Row]:
        now = _text(at)
        due: tuple[Any, ...] = (now, now)
        claim, any_due = _CLAIM_DELIVERIES, _ANY_DELIVERY
        if lost is not None:
            due += (worker, _text(lost[0]), json.dumps(lost[1]))
            claim, any_due = _CLAIM_DELIVERIES_OR_LOST, _ANY_DELIVERY_OR_LOST
        parameters = (worker, _text(lease_until), *due, limit)
        # Every step of the outbox asks until nothing is left: a read first, so that the last
        # ask costs no write transaction.
        if not await self._fetch_all(any_due, due):
            return []

        def work(db: sqlite3.Connection) -> list[Row]:
            found = db.execute(claim, parameters).fetchall()
            rows = [_delivery_row(raw) or {} for raw in found]
            return sorted(rows, key=lambda row: (row["due_at"], row["seq"]))

        return await self._transaction(work)

    async def settle_delivery(
        self,
        delivery_id: int,
        worker: str,
        at: datetime,
        outcome: tuple[str, str | None, datetime | None],
    ) -> Change:
        kind, text, retry_at = outcome
        now = _text(at)
        values: tuple[Any, ...]
        if kind == "sent":
            values = ("sent", now, text, None, None)
        else:
            status = "due" if retry_at is not None else "failed"
            values = (status, None, None, text, None if retry_at is None else _text(retry_at))

        def work(db: sqlite3.Connection) -> Change:
            changed = _delivery_row(
                db.execute(_SETTLE_DELIVERY, (*values, delivery_id, worker)).fetchone()
            )
            if changed is None:
                return Change(
                    None, _delivery_row(db.execute(_SELECT_DELIVERY, (delivery_id,)).fetchone())
                )
            event = None
            if changed["status"] == "sent":
                event = delivered_event(changed, worker)
            elif changed["status"] == "failed":
                event = undelivered_event(changed, worker, text or "")
            if event is not None:
                self._append(db, changed["approval_id"], at, event)
            return Change(changed, None)

        return await self._transaction(work)

    async def delivery_progress(self, delivery_id: int, worker: str, ref: str) -> Change:
        def work(db: sqlite3.Connection) -> Change:
            found = db.execute(_DELIVERY_PROGRESS, (ref, delivery_id, worker)).fetchone()
            changed = _delivery_row(found)
            if changed is not None:
                return Change(changed, None)
            existing = db.execute(_SELECT_DELIVERY, (delivery_id,)).fetchone()
            return Change(None, _delivery_row(existing))

        return await self._transaction(work)

    async def retry_deliveries_now(self, targets: list[str], at: datetime) -> int:
        now = _text(at)
        parameters = (now, now, now, json.dumps(targets))
        return await self._transaction(lambda db: db.execute(_RETRY_NOW, parameters).rowcount)

    async def delivery_rows(self, approval_id: str) -> list[Row]:
        query = f"SELECT {DELIVERY_COLUMNS} FROM deliveries WHERE approval_id = ? ORDER BY seq"
        return [_delivery_row(raw) or {} for raw in await self._fetch_all(query, (approval_id,))]

    async def counts(self) -> dict[str, int]:
        rows = await self._fetch_all(_COUNTS, ())
        return {str(row[0]): int(row[1]) for row in rows}

    @property
    def backlogged(self) -> bool:
        return False  # one connection, used without waiting: operations run one by one

    async def listen(
        self, woken: Callable[[], None], moved: Callable[[str], None] | None = None
    ) -> Listening:
        # SQLite has no notices between processes: other processes' decisions and runs are
        # found by polling. This process's own decisions wake its workers directly.
        return NotListening()

    async def close(self) -> None:
        if self.checkpointer is not None:
            await self.checkpointer.close()
        self._db.close()
