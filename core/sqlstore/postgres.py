"""The PostgreSQL backend: asyncpg, one round trip per operation.

Each operation is a single statement, so it is its own transaction: the conditional UPDATE
(or the INSERT ... ON CONFLICT) and the INSERT of its events are one data-modifying CTE.
Concurrent writers of one row queue on its row lock and re-check the condition, so exactly
one of them changes it. Only the rare paths (a refusal, a create that met an active record,
a claim whose light statement found no active record to take or show) take a second
statement, and an act by a message (`Act.once`), which is a transaction of a few: the
review locked, the message id inserted (`ON CONFLICT DO NOTHING`: a writer that meets one
not yet committed waits for it, then finds it there or not), then the act's own statement.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import secrets
from collections.abc import Awaitable, Callable, Iterator, Sequence
from datetime import datetime
from typing import Any, TypeAlias, TypeVar, cast

import asyncpg

from nodbot.core.audit import FORMAT, EventHasher, hmac_pads, moment_text
from nodbot.core.sqlstore.backend import (
    ALREADY_DECIDED,
    COLUMNS,
    DELIVERY_COLUMNS,
    NOT_DECIDED,
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
    created_event,
    detail,
    timeout_detail,
)
from nodbot.core.sqlstore.notices import Listener, Listening, Teller
from nodbot.core.sqlstore.pool import GuardedPool
from nodbot.core.store import ALREADY_VOTED, CONCURRENT_USE_REASON, TIMEOUT_DECIDER, ApprovalRequest
from nodbot.core.tools import canonical_json

__all__ = ["PostgresBackend"]

log = logging.getLogger(__name__)


# The chain (n, prev, hash) is filled in by the events_chain trigger (migration 0007)...
_EVENTS = "INSERT INTO events (approval_id, kind, at, actor, channel, detail, person)"
# ...unless the statement gives it (migration 0014): the busiest statements chain their events
# to the review's last link as this store last wrote it (see `ChainLinks`), under the
# advisory lock the trigger takes (so that the trigger, when it chains another event of the
# review meanwhile, reads the link after theirs). A place taken meanwhile by another writer
# is refused by the unique index events_chain; the statement is then made again with its
# chain values NULL, and the trigger chains its events.
_CHAINED = f"{_EVENTS[:-1]}, n, prev, hash)"
CHAIN_LOCK_CLASS = 0x6E6F6462
"""The first key of the review's advisory lock, the events_chain trigger's (migration 0007)."""
_LOCKED = f"pg_advisory_xact_lock({CHAIN_LOCK_CLASS}, hashtext(approval_id)) IS NOT NULL"
# The last link the statement chained (by the statement or by the trigger).
_LINK = (
    "(SELECT n FROM logged ORDER BY n DESC LIMIT 1) AS chain_n, "
    "(SELECT hash FROM logged ORDER BY n DESC LIMIT 1) AS chain_hash"
)
_SELECT_ONE = f"SELECT {COLUMNS} FROM approvals WHERE approval_id = $1"
# A consumed, unfinished review with no result kept yet (locked), and the result kept of one.
_KEEPABLE = """
SELECT 1 FROM approvals WHERE approval_id = $1 AND consumed_at IS NOT NULL
  AND finished_at IS NULL
  AND NOT EXISTS (SELECT 1 FROM events WHERE events.approval_id = $1 AND kind = 'kept')
FOR UPDATE"""
_KEPT = "SELECT detail FROM events WHERE approval_id = $1 AND kind = 'kept' ORDER BY seq LIMIT 1"

_NEW_COLUMNS = (
    "approval_id, run_id, call_id, tool, arguments, digest, requested_by, status, created_at, "
    "deadline, on_timeout, policy, approvals_required"
)
"""The columns a new record is inserted with: $1-$9 and $11-$14 of `_new_arguments`."""

# Each review made pending, or decided, moves its run's count (when the run is in `runs`):
# increments and decrements, which concurrent writers of one run apply in turn on its row
# lock, each to the row as the one before left it.
_COUNT_CREATED = """counted AS (
    UPDATE runs SET pending = pending + 1 WHERE run_id = $2 AND EXISTS (SELECT 1 FROM inserted)
)"""
_COUNT_DECIDED = """counted AS (
    UPDATE runs SET pending = pending - 1 WHERE run_id = (SELECT run_id FROM changed)
)"""

_CREATE = f"""
WITH inserted AS (
    INSERT INTO approvals ({_NEW_COLUMNS})
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $11, $12, $13, $14)
    ON CONFLICT (run_id, call_id) WHERE finished_at IS NULL DO NOTHING
    RETURNING {COLUMNS}
), logged AS (
    {_CHAINED}
    SELECT approval_id, 'created', $10::timestamptz, requested_by, NULL, '{{}}', NULL,
           1, NULL, $15::text
    FROM inserted
    RETURNING n, hash
), {_COUNT_CREATED}
SELECT {COLUMNS}, {_LINK} FROM inserted
UNION ALL
SELECT {COLUMNS}, NULL, NULL FROM approvals
WHERE run_id = $2 AND call_id = $3 AND finished_at IS NULL
  AND NOT EXISTS (SELECT 1 FROM inserted)"""
# Idempotency keys (`idempotency_keys`). `_CREATE` with the request's key ($16-$19: token
# name, route, key, body digest) written for the record it makes, none for an active record
# it finds; a key stored already fails the whole statement, which then writes nothing.
_KEY_COLUMNS = "token_name, route, key, body_digest, target_id, created_at"
_KEY_NAMES = tuple(name.strip() for name in _KEY_COLUMNS.split(","))
_KEY_CONSTRAINT = "idempotency_keys_pkey"
_CREATE_KEYED = _CREATE.replace(
    f"), {_COUNT_CREATED}",
    f"""), keyed AS (
    INSERT INTO idempotency_keys ({_KEY_COLUMNS})
    SELECT $16::text, $17::text, $18::text, $19::text, approval_id, $10 FROM inserted
), {_COUNT_CREATED}""",
)
_INSERT_KEY = f"INSERT INTO idempotency_keys ({_KEY_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6)"
_FIND_KEY = f"""
SELECT {_KEY_COLUMNS} FROM idempotency_keys WHERE token_name = $1 AND route = $2 AND key = $3"""
_PRUNE_KEYS = "DELETE FROM idempotency_keys WHERE created_at < $1"


def _taking(run: int, call: int, tool: int, digest: int, at: int) -> str:
    """A claim's `taken` part: the call's decided record (parameters `$run`, `$call`, made
    for `$tool` and `$digest`) consumed at `$at`, and finished at once if it was denied."""
    return f"""taken AS (
    UPDATE approvals
    SET consumed_at = ${at},
        finished_at = CASE WHEN status = 'denied' THEN ${at}::timestamptz END,
        outcome = CASE WHEN status = 'denied' THEN 'denied' END
    WHERE run_id = ${run} AND call_id = ${call} AND finished_at IS NULL
      AND decided_at IS NOT NULL AND consumed_at IS NULL AND tool = ${tool}
      AND digest = ${digest}
    RETURNING {COLUMNS}
)"""


def _taken_events(at: int, actor: int, denied: int, review: int, first: int) -> str:
    """The events of what `_taking` took, at `$at` by `$actor` (`$denied` the detail of a
    denial's `finished`), chained by the statement when the record is the review `$review`:
    `$first` the first one's n, then its prev, then each one's hash."""
    prev, consumed, finished = first + 1, first + 2, first + 3
    return f"""SELECT approval_id, 'consumed', ${at}::timestamptz, ${actor}::text, 'executor',
           '{{}}', NULL,
           CASE WHEN approval_id = ${review} THEN ${first}::integer END,
           CASE WHEN approval_id = ${review} THEN ${prev}::text END,
           CASE WHEN approval_id = ${review} THEN ${consumed}::text END
    FROM taken WHERE {_LOCKED}
    UNION ALL
    SELECT approval_id, 'finished', ${at}::timestamptz, NULL, 'executor', ${denied}::text,
           NULL,
           CASE WHEN approval_id = ${review} THEN ${first}::integer + 1 END,
           CASE WHEN approval_id = ${review} THEN ${consumed}::text END,
           CASE WHEN approval_id = ${review} THEN ${finished}::text END
    FROM taken WHERE status = 'denied' AND {_LOCKED}"""


# A claim in one statement: take the call's decided record, or else create it, or else say
# what the active record is. All parts see one snapshot; a record another transaction made
# or changed meanwhile is settled by the caller (see PostgresBackend.claim).
_CLAIM = f"""
WITH {_taking(run=2, call=3, tool=4, digest=6, at=10)}, inserted AS (
    INSERT INTO approvals ({_NEW_COLUMNS})
    SELECT $1::text, $2::text, $3::text, $4::text, $5::text, $6::text, $7::text, $8::text,
           $9::timestamptz, $11::timestamptz, $12::text, $13::text, $14::integer
    WHERE NOT EXISTS (SELECT 1 FROM taken)
    ON CONFLICT (run_id, call_id) WHERE finished_at IS NULL DO NOTHING
    RETURNING {COLUMNS}
), logged AS (
    {_CHAINED}
    SELECT approval_id, 'created', $10::timestamptz, requested_by, NULL, '{{}}', NULL,
           CASE WHEN $17::text IS NOT NULL THEN 1 END, NULL, $17::text
    FROM inserted
    UNION ALL
    {_taken_events(at=10, actor=15, denied=16, review=18, first=19)}
    RETURNING n, hash
), {_COUNT_CREATED}
SELECT 'taken' AS claimed, {COLUMNS}, {_LINK} FROM taken
UNION ALL
SELECT 'created', {COLUMNS}, {_LINK} FROM inserted
UNION ALL
SELECT 'active', {COLUMNS}, NULL, NULL FROM approvals
WHERE run_id = $2 AND call_id = $3 AND finished_at IS NULL
  AND NOT EXISTS (SELECT 1 FROM taken) AND NOT EXISTS (SELECT 1 FROM inserted)"""

# A claim of a call this store claimed before, as the executor resumes it: take the decided
# record, or else say what the active record is, without `_CLAIM`'s create (a statement of
# fewer parts costs the server less to set up and run). No active record: claim in full.
_TAKE = f"""
WITH {_taking(run=1, call=2, tool=3, digest=4, at=5)}, logged AS (
    {_CHAINED}
    {_taken_events(at=5, actor=6, denied=7, review=8, first=9)}
    RETURNING n, hash
)
SELECT 'taken' AS claimed, {COLUMNS}, {_LINK} FROM taken
UNION ALL
SELECT 'active', {COLUMNS}, NULL, NULL FROM approvals
WHERE run_id = $1 AND call_id = $2 AND finished_at IS NULL AND NOT EXISTS (SELECT 1 FROM taken)"""

# The insert is the check: a message id processed before is there (see backend.py).
_PROCESS = """
INSERT INTO processed_messages (message_id, approval_id, at) VALUES ($1, $2, $3)
ON CONFLICT (message_id) DO NOTHING RETURNING 1"""
_PROCESSED_ON = "SELECT approval_id FROM processed_messages WHERE message_id = $1"

_ACTIVE = f"""
SELECT {COLUMNS} FROM approvals WHERE run_id = $1 AND call_id = $2 AND finished_at IS NULL"""

DECIDED_CHANNEL = "nodbot_decided"
"""Notified with the run id whenever an approval is decided, so that the bots of other
processes wake at once (see core/sqlstore/notices.py)."""
RUNS_CHANNEL = "nodbot_runs"
"""Notified with the run id whenever a step saves a run that stops there (it waits, finished
or failed), so that a wait for the run in another process (`GET /runs/{id}?wait`) answers at
once."""


def _heard(store: int) -> str:
    """A deciding statement's last column: whether a session of another store than the one
    named by parameter `$store` listens, so that the decision is to be noticed (after its
    commit, by `Teller`; never inside it, where NOTIFY would make deciders take turns with
    their fsyncs)."""
    return f"EXISTS (SELECT 1 FROM listeners WHERE store <> ${store}::text) AS heard"


_DECIDE = f"""
WITH changed AS (
    UPDATE approvals SET decision = $2, status = $3, decided_at = $4
    WHERE approval_id = $1 AND decision IS NULL
    RETURNING {COLUMNS}
), logged AS (
    {_CHAINED}
    SELECT approval_id, 'decided', $4::timestamptz, $5::text, $6::text,
           $7::text || digest || $8::text, $9::text,
           CASE WHEN digest = $10 THEN $11::integer END,
           CASE WHEN digest = $10 THEN $12::text END,
           CASE WHEN digest = $10 THEN $13::text END
    FROM changed WHERE {_LOCKED}
    RETURNING n, hash
), {_COUNT_DECIDED}
SELECT {COLUMNS}, {_LINK}, {_heard(14)} FROM changed"""

_CONSUME = f"""
WITH changed AS (
    UPDATE approvals
    SET consumed_at = $2,
        finished_at = CASE WHEN status = 'denied' THEN $2::timestamptz END,
        outcome = CASE WHEN status = 'denied' THEN 'denied' END
    WHERE approval_id = $1 AND decided_at IS NOT NULL AND consumed_at IS NULL
    RETURNING {COLUMNS}
), logged AS (
    {_CHAINED}
    SELECT approval_id, 'consumed', $2::timestamptz, $3::text, 'executor', '{{}}', NULL,
           $5::integer, $6::text, $7::text
    FROM changed WHERE {_LOCKED}
    UNION ALL
    SELECT approval_id, 'finished', $2::timestamptz, NULL, 'executor', $4::text, NULL,
           $5::integer + 1, $7::text, $8::text
    FROM changed WHERE status = 'denied' AND {_LOCKED}
    RETURNING n, hash
)
SELECT {COLUMNS}, {_LINK} FROM changed"""

_FINISH = f"""
WITH changed AS (
    UPDATE approvals SET finished_at = $2, outcome = $3
    WHERE approval_id = $1 AND consumed_at IS NOT NULL AND finished_at IS NULL
    RETURNING {COLUMNS}
), logged AS (
    {_CHAINED}
    SELECT approval_id, 'finished', $2::timestamptz, NULL, 'executor', $4::text, NULL,
           $5::integer, $6::text, $7::text
    FROM changed WHERE {_LOCKED}
    RETURNING n, hash
)
SELECT {COLUMNS}, {_LINK} FROM changed"""

# A vote on an undecided review that needs one approval decides it: one statement, with
# its `voted` and `decided` events in that order (see Act), and no votes to read.
_SOLE_VOTE = f"""
WITH changed AS (
    UPDATE approvals SET decision = $2, status = $3, decided_at = $4,
        announced = CASE WHEN NOT $18::boolean AND announced = 1 THEN 2 ELSE announced END
    WHERE approval_id = $1 AND decision IS NULL AND approvals_required = 1
    RETURNING {COLUMNS}
), logged AS (
    {_CHAINED}
    SELECT approval_id, 'voted', $4::timestamptz, $5::text, $6::text,
           $7::text || digest || $8::text, $9::text,
           CASE WHEN digest = $13 THEN $14::integer END,
           CASE WHEN digest = $13 THEN $15::text END,
           CASE WHEN digest = $13 THEN $16::text END
    FROM changed WHERE {_LOCKED}
    UNION ALL
    SELECT approval_id, 'decided', $4::timestamptz, $10::text, $6::text,
           $11::text || digest || $12::text, $9::text,
           CASE WHEN digest = $13 THEN $14::integer + 1 END,
           CASE WHEN digest = $13 THEN $16::text END,
           CASE WHEN digest = $13 THEN $17::text END
    FROM changed WHERE {_LOCKED}
    RETURNING n, hash
), {_COUNT_DECIDED}
SELECT {COLUMNS}, {_LINK}, {_heard(19)} FROM changed"""

# A refusal: the record as it is, and a `refused` event whose detail depends on its state.
_REFUSE = f"""
WITH existing AS ({_SELECT_ONE}), logged AS (
    {_EVENTS}
    SELECT approval_id, 'refused', $2::timestamptz, $3::text, $4::text,
           CASE WHEN decided_at IS NULL THEN $5::text ELSE $6::text END, $7::text
    FROM existing
)
SELECT {COLUMNS} FROM existing"""


# The statements that change the rows a CTE picked name them as `seq = ANY (ARRAY (...))`:
# always a look-up of each in the primary key, where a join may be planned as a hash of the
# whole table (as a cached generic plan of expire_due was, over every pending review).

# Timers of several replicas share the work: SKIP LOCKED hands each review to one of them,
# and the outer `status = 'pending'` re-checks a row a reviewer decided meanwhile.
_EXPIRE = f"""
WITH picked AS (
    SELECT seq FROM approvals WHERE status = 'pending' AND deadline <= $3::timestamptz
    ORDER BY deadline LIMIT $4
    FOR UPDATE SKIP LOCKED
), changed AS (
    UPDATE approvals
    SET decision = CASE WHEN on_timeout = 'approve' THEN $1 ELSE $2 END,
        status = CASE WHEN on_timeout = 'approve' THEN 'approved' ELSE 'denied' END,
        decided_at = $3::timestamptz
    WHERE approvals.seq = ANY (ARRAY (SELECT seq FROM picked)) AND approvals.status = 'pending'
    RETURNING {COLUMNS}
), logged AS (
    {_EVENTS}
    SELECT approval_id, 'decided', $3::timestamptz, $5::text, 'timer',
           CASE WHEN on_timeout = 'approve' THEN $6::text || digest || $7::text
                ELSE $8::text || digest || $9::text END,
           NULL
    FROM changed
), locked AS (
    -- The runs are locked in one order (seq), so that timers of two replicas that expire
    -- reviews of the same runs never wait for each other both ways.
    SELECT seq FROM runs WHERE run_id = ANY (ARRAY (SELECT run_id FROM changed))
    ORDER BY seq
    FOR UPDATE
), counted AS (
    UPDATE runs
    SET pending = pending - (SELECT count(*) FROM changed WHERE changed.run_id = runs.run_id)
    WHERE seq = ANY (ARRAY (SELECT seq FROM locked))
)
SELECT {COLUMNS}, {_heard(10)} FROM changed"""

# A run starts with the count of its reviews made before it (none, when it is created
# first, as the bot does).
_INSERT_RUN = f"""
INSERT INTO runs ({RUN_COLUMNS}, pending)
VALUES ({", ".join(f"${i}" for i in range(1, len(RUN_COLUMN_NAMES) + 1))}, (
    SELECT count(*) FROM approvals WHERE run_id = ${len(RUN_COLUMN_NAMES) + 1}
    AND status = 'pending'))
ON CONFLICT (run_id) DO NOTHING
RETURNING {RUN_COLUMNS}"""
# The same, with the run's idempotency key (after the run's values and its id: token name,
# route, key, body digest), which names the run: a key stored already fails the statement.
_INSERT_RUN_KEYED = f"""
WITH keyed AS (
    INSERT INTO idempotency_keys ({_KEY_COLUMNS})
    VALUES (${len(RUN_COLUMN_NAMES) + 2}::text, ${len(RUN_COLUMN_NAMES) + 3}::text,
            ${len(RUN_COLUMN_NAMES) + 4}::text, ${len(RUN_COLUMN_NAMES) + 5}::text,
            ${len(RUN_COLUMN_NAMES) + 1}, ${RUN_COLUMN_NAMES.index("created_at") + 1})
){_INSERT_RUN}"""
# A run and the reviews its first step opened, in one statement: the reviews' values are
# arrays, one per column of `_NEW_NAMES` (the n-th elements of each make a review), after the
# run's own values; every review is pending, so they are the run's pending count.
_NEW_NAMES = tuple(name.strip() for name in _NEW_COLUMNS.split(","))
_NEW_TYPES = {"created_at": "timestamptz", "deadline": "timestamptz", "approvals_required": "int"}
_RUN_PARAMETERS = ", ".join(f"${i}" for i in range(1, len(RUN_COLUMN_NAMES) + 1))
_REVIEW_ARRAYS = ", ".join(
    f"${len(RUN_COLUMN_NAMES) + 1 + i}::{_NEW_TYPES.get(name, 'text')}[]"
    for i, name in enumerate(_NEW_NAMES)
)
_INSERT_RUN_REVIEWED = f"""
WITH run AS (
    INSERT INTO runs ({RUN_COLUMNS}, pending)
    VALUES ({_RUN_PARAMETERS}, cardinality(${len(RUN_COLUMN_NAMES) + 1}::text[]))
    RETURNING {RUN_COLUMNS}
), inserted AS (
    INSERT INTO approvals ({_NEW_COLUMNS})
    SELECT * FROM unnest({_REVIEW_ARRAYS})
    RETURNING approval_id, requested_by, created_at
), logged AS (
    {_CHAINED}
    SELECT approval_id, 'created', created_at, requested_by, NULL, '{{}}', NULL, 1, NULL,
           (${len(RUN_COLUMN_NAMES) + len(_NEW_NAMES) + 1}::text[])[
               array_position(${len(RUN_COLUMN_NAMES) + 1}::text[], approval_id)]
    FROM inserted
)
SELECT {RUN_COLUMNS} FROM run"""
_GET_RUN = f"SELECT {RUN_COLUMNS}, pending FROM runs WHERE run_id = $1"
"""A run with how many of its reviews are pending (`RunRecord.pending`)."""
_SAVE_RUN = f"""
UPDATE runs SET status = $3, messages = $4, final_text = $5, error = $6, updated_at = $7,
    version = version + 1, claimed_by = NULL, lease_until = NULL
WHERE run_id = $1 AND version = $2
RETURNING {RUN_COLUMNS}, {_heard(8)}"""
# The same, with the approvals the run's step spent finished (each by its key, the arrays'
# n-th elements together), only when the run is saved: a late save (the run taken over)
# finishes nothing, and whoever resumes the run finishes them with its own save.
_SAVE_RUN_SPENT = f"""
WITH saved AS (
    {_SAVE_RUN.strip()}
), finished AS (
    UPDATE approvals
    SET finished_at = $7, outcome = ($10::text[])[array_position($9::text[], approval_id)]
    WHERE approval_id = ANY ($9::text[]) AND consumed_at IS NOT NULL AND finished_at IS NULL
      AND EXISTS (SELECT 1 FROM saved)
    RETURNING approval_id
), logged AS (
    {_EVENTS}
    SELECT approval_id, 'finished', $7::timestamptz, NULL, 'executor',
           ($11::text[])[array_position($9::text[], approval_id)], NULL
    FROM finished
)
SELECT * FROM saved"""
_RENEW_CLAIM = f"""
UPDATE runs SET version = version + 1, updated_at = $3, lease_until = $4
WHERE run_id = $1 AND version = $2 AND lease_until > $3
RETURNING {RUN_COLUMNS}"""
# Replicas claim concurrently: SKIP LOCKED hands each run to one of them, and a row another
# transaction changed since the snapshot is checked again as it is now. Waiting runs none of
# whose reviews is pending, and running ones whose lease ran out: the first condition is the
# runs_claimable index's own (the runs it holds), the second leaves out the running runs
# whose lease has not run out.
_CLAIM_READY = f"""
WITH picked AS (
    SELECT seq FROM runs
    WHERE (status = 'running' OR (status = 'waiting' AND pending = 0))
      AND (status = 'waiting' OR lease_until <= $1)
    ORDER BY seq LIMIT $4
    FOR UPDATE SKIP LOCKED
)
UPDATE runs SET status = 'running', version = version + 1, updated_at = $1,
    claimed_by = $2, lease_until = $3
WHERE seq = ANY (ARRAY (SELECT seq FROM picked))
RETURNING seq, {RUN_COLUMNS}"""


_UNANNOUNCED = f"""
SELECT {COLUMNS}, announced FROM approvals
WHERE announced < 2 AND (announced = 0 OR decided_at IS NOT NULL)
ORDER BY seq LIMIT $1"""
# Those due by $5 are made claimed by $7 until $8 (both NULL: unclaimed).
_INSERT_DELIVERIES = f"""
INSERT INTO deliveries (
    approval_id, kind, target, status, attempts, due_at, created_at, claimed_by, lease_until
)
SELECT $1, kind, target, 'due', 0, due_at, $5::timestamptz,
       CASE WHEN due_at <= $5::timestamptz THEN $7::text END,
       CASE WHEN due_at <= $5::timestamptz THEN $8::timestamptz END
FROM unnest($2::text[], $3::text[], $4::timestamptz[]) AS wanted (kind, target, due_at)
ON CONFLICT (approval_id, kind, target) DO NOTHING
RETURNING {DELIVERY_COLUMNS}"""
# A review's deliveries made and its stage marked announced, in one statement.
_ANNOUNCE = f"""
WITH made AS ({_INSERT_DELIVERIES}
), marked AS (
    UPDATE approvals SET announced = $6 WHERE approval_id = $1 AND announced < $6
)
SELECT {DELIVERY_COLUMNS} FROM made"""
# Replicas claim concurrently: SKIP LOCKED hands each delivery to one of them.
_CLAIM_DELIVERIES = f"""
WITH picked AS (
    SELECT seq FROM deliveries
    WHERE status = 'due' AND due_at <= $3 AND (lease_until IS NULL OR lease_until <= $3)
    ORDER BY due_at, seq LIMIT $4
    FOR UPDATE SKIP LOCKED
)
UPDATE deliveries SET claimed_by = $1, lease_until = $2
WHERE seq = ANY (ARRAY (SELECT seq FROM picked))
RETURNING {DELIVERY_COLUMNS}"""
# The same with the deliveries a worker holds and lost track of (`Outbox.claim_deliveries`):
# held by $1 until $5 or before, but the ids $6.
_CLAIM_DELIVERIES_OR_LOST = _CLAIM_DELIVERIES.replace(
    "(lease_until IS NULL OR lease_until <= $3)",
    "(lease_until IS NULL OR lease_until <= $3"
    " OR (claimed_by = $1 AND lease_until <= $5 AND seq <> ALL ($6::bigint[])))",
)
_SETTLE_DELIVERY = f"""
UPDATE deliveries SET status = $3, attempts = attempts + 1, sent_at = $4,
    ref = coalesce($5, ref),
    error = $6, due_at = coalesce($7, due_at), claimed_by = NULL, lease_until = NULL
WHERE seq = $1 AND claimed_by = $2 AND status = 'due'
RETURNING {DELIVERY_COLUMNS}"""
# Failed deliveries waiting for their next attempt made due now (`Outbox.retry_deliveries_now`).
_RETRY_NOW = """
UPDATE deliveries SET due_at = $2
WHERE status = 'due' AND due_at > $2 AND attempts > 0
    AND (lease_until IS NULL OR lease_until <= $2) AND target = ANY ($1::text[])"""
# The same with its event, in one statement: `delivered` once sent, `undelivered` once given
# up (its detail as `delivered_event` and `undelivered_event` write it; $9 the error as JSON).
_KIND_AND_TARGET = "'\"kind\":' || to_json(kind)::text || ',\"target\":' || to_json(target)::text"
_SETTLE_LOGGED = f"""
WITH changed AS ({_SETTLE_DELIVERY}
), logged AS (
    {_EVENTS}
    SELECT approval_id, CASE WHEN status = 'sent' THEN 'delivered' ELSE 'undelivered' END,
           $8::timestamptz, $2::text, split_part(target, ':', 1),
           CASE WHEN status = 'sent' THEN '{{' || {_KIND_AND_TARGET} || '}}'
                ELSE '{{"error":' || $9::text || ',' || {_KIND_AND_TARGET} || '}}' END,
           NULL
    FROM changed WHERE status IN ('sent', 'failed')
    RETURNING n, hash
)
SELECT {DELIVERY_COLUMNS}, {_LINK} FROM changed"""
# The progress of a delivery still held: its ref, and nothing else.
_DELIVERY_PROGRESS = f"""
UPDATE deliveries SET ref = $3 WHERE seq = $1 AND claimed_by = $2 AND status = 'due'
RETURNING {DELIVERY_COLUMNS}"""


def _new_arguments(row: Row, event_at: datetime) -> tuple[Any, ...]:
    """$1-$14 of `_CREATE` and `_CLAIM`: the new record's values, $10 the event's time."""
    return (
        row["approval_id"], row["run_id"], row["call_id"], row["tool"], row["arguments"],
        row["digest"], row["requested_by"], row["status"], row["created_at"], event_at,
        row["deadline"], row["on_timeout"], row["policy"], row["approvals_required"],
    )  # fmt: skip


def chain_settings(audit_key: str | None) -> dict[str, str]:
    """The settings of the store's sessions: `nodbot.audit` says their events are chained
    (the events_chain trigger reads it) and, with an audit key, `nodbot.audit_ikey` and
    `nodbot.audit_okey` carry the HMAC pads the trigger hashes with (see
    `core.audit.hmac_pads`): the key itself never reaches the database."""
    settings = {"nodbot.audit": FORMAT}
    if audit_key:
        settings["nodbot.audit_ikey"], settings["nodbot.audit_okey"] = hmac_pads(audit_key)
    return settings


T = TypeVar("T")


async def _keyed(key: Row | None, statement: Awaitable[T]) -> T:
    """What `statement` gives. Raises `KeyTaken` when it failed on the idempotency key `key`
    (stored already: the statement wrote nothing)."""
    try:
        return await statement
    except asyncpg.UniqueViolationError as exc:
        if key is None or exc.constraint_name != _KEY_CONSTRAINT:
            raise
        raise KeyTaken(key["key"]) from None


def _row(record: asyncpg.Record | None) -> Row | None:
    return None if record is None else dict(record)


def _linked(record: asyncpg.Record) -> tuple[Row, Link | None]:
    """A record of a statement that chains (its columns and the `_LINK` it ends with): the
    row, and the last link it chained (None when it chained nothing)."""
    row = dict(record)
    n, hash_ = row.pop("chain_n"), row.pop("chain_hash")
    return row, None if n is None or hash_ is None else (n, hash_)


Link: TypeAlias = tuple[int, str]
"""A review's last event as the chain sees it: its `n` and `hash`."""


class ChainLinks:
    """What this store's statements chain a review's next events to: the last link each
    review got from them lately (with the review's digest, which decisions' details hold),
    and the review each call was claimed as. Only links that statements returned, so
    committed, are kept; another writer may have chained to one since (the unique index
    then refuses the statement, and `forget` drops it)."""

    KEPT = 4096
    """Reviews (and calls, and deliveries) remembered at most; the oldest are forgotten
    first."""

    def __init__(self, hasher: EventHasher) -> None:
        self._hasher = hasher
        self._last: dict[str, tuple[int, str, str]] = {}
        self._calls: dict[tuple[str, str], str] = {}
        self._deliveries: dict[int, str] = {}
        self._writing: collections.Counter[str] = collections.Counter()

    def writing(self, approval_id: str | None) -> bool:
        """Whether a statement of this store that chains an event of the review is on its
        way: then the review's link is not known until it is back, and a statement made
        meanwhile leaves its chain to the trigger (which waits for that one's lock) rather
        than be refused."""
        return approval_id is not None and approval_id in self._writing

    @contextlib.contextmanager
    def write(self, approval_id: str | None) -> Iterator[None]:
        """While a statement that chains an event of the review is on its way."""
        if approval_id is None:
            yield
            return
        self._writing[approval_id] += 1
        try:
            yield
        finally:
            self._writing[approval_id] -= 1
            if not self._writing[approval_id]:
                del self._writing[approval_id]

    def note_deliveries(self, rows: Sequence[Row]) -> None:
        """Remember the review of each delivery (a settlement names only the delivery)."""
        for row in rows:
            self._deliveries[row["seq"]] = row["approval_id"]
        _keep_newest(self._deliveries, self.KEPT)

    def review_of_delivery(self, delivery_id: int) -> str | None:
        return self._deliveries.get(delivery_id)

    def learn(self, row: Row, link: Link | None) -> None:
        """Remember `link` as the last of the review `row` (as a statement returned both)."""
        if link is None:
            return
        approval_id = row["approval_id"]
        last = self._last.get(approval_id)
        if last is not None and last[0] >= link[0]:
            return  # a later link came back first (statements of two connections)
        self._last[approval_id] = (*link, row["digest"])
        self._calls[(row["run_id"], row["call_id"])] = approval_id
        _keep_newest(self._last, self.KEPT)
        _keep_newest(self._calls, self.KEPT)

    def advance(self, approval_id: str, link: Link | None) -> None:
        """Take `link` (a statement's, chained by the trigger) as the last of the review, if
        the review is remembered."""
        last = self._last.get(approval_id)
        if last is not None and link is not None and link[0] > last[0]:
            self._last[approval_id] = (*link, last[2])

    def forget(self, approval_id: str) -> None:
        self._last.pop(approval_id, None)

    def review_of(self, run_id: str, call_id: str) -> str | None:
        """The review the call was last claimed as here, if remembered."""
        return self._calls.get((run_id, call_id))

    def digest(self, approval_id: str) -> str | None:
        """The review's digest, if its last link is remembered."""
        last = self._last.get(approval_id)
        return None if last is None else last[2]

    def first(self, approval_id: str, at: datetime, event: EventValues) -> str:
        """The hash of a new review's first event."""
        kind, actor, channel, text, person = event
        moment = moment_text(at)
        return self._hasher.hash_at_text(
            None, 1, approval_id, kind, moment, actor, person, channel, text
        )

    def after(
        self, approval_id: str, at: datetime, events: Sequence[EventValues]
    ) -> tuple[int | None, str | None, list[str | None]]:
        """The chain of `events` (in order) after the review's last link: the first's n, its
        prev, and each one's hash; all None when no link is remembered (then the trigger
        chains them)."""
        last = self._last.get(approval_id)
        if last is None:
            return None, None, [None] * len(events)
        first, prev = last[0] + 1, last[1]
        hashes: list[str | None] = []
        moment = moment_text(at)
        for n, (kind, actor, channel, text, person) in enumerate(events, start=first):
            prev = self._hasher.hash_at_text(
                prev, n, approval_id, kind, moment, actor, person, channel, text
            )
            hashes.append(prev)
        return first, last[1], hashes


def _keep_newest(kept: dict[Any, Any], most: int) -> None:
    """Forget the oldest entries of `kept` beyond `most`."""
    while len(kept) > most:
        del kept[next(iter(kept))]


_UNCHAINED: tuple[None, None, list[None]] = (None, None, [None, None])
"""Chain values of two events that leave the chain to the trigger (`ChainLinks.after`'s
shape)."""


def _flat(chain: tuple[Any, ...]) -> tuple[Any, ...]:
    """Statement arguments with the hashes of a chain (its last item, a list) spread out."""
    return (*chain[:-1], *chain[-1])


_finished_denied = EventValues("finished", None, "executor", detail("outcome", "denied"))
"""The event that finishes a denial the moment it is consumed."""


async def _log(
    connection: asyncpg.Connection, approval_id: str, at: datetime, event: EventValues
) -> None:
    """Append `event` to the review inside the connection's transaction (chained by the
    trigger)."""
    await connection.execute(
        f"{_EVENTS} VALUES ($1, $2, $3, $4, $5, $6, $7)",
        approval_id, event.kind, at, event.actor, event.channel, event.detail, event.person,
    )  # fmt: skip


def _chain_refused(error: asyncpg.UniqueViolationError) -> bool:
    """Whether a statement chained to a link another writer had chained to first."""
    return error.constraint_name == "events_chain"


class PostgresBackend:
    """Atomic store operations on a pool of asyncpg connections."""

    def __init__(self, pool: GuardedPool, dsn: str, hasher: EventHasher | None = None) -> None:
        self._pool = pool
        self._dsn = dsn
        self._links = ChainLinks(hasher or EventHasher())
        # This store, as its listeners' rows name it: its decisions notice other stores only.
        self._store = secrets.token_hex(8)
        self._woken: list[Callable[[], None]] = []  # this store's listeners, woken here
        self._teller = Teller(self._notifier(DECIDED_CHANNEL), "decided runs")
        self._run_teller = Teller(self._notifier(RUNS_CHANNEL), "runs stopped")

    @classmethod
    async def connect(cls, dsn: str, *, audit_key: str | None = None) -> PostgresBackend:
        """Open a small pool on `dsn` (a plain `postgresql://` URL) whose sessions chain
        their events (see `chain_settings`)."""
        pool = await GuardedPool.connect(
            dsn, max_size=10, server_settings=chain_settings(audit_key)
        )
        return cls(pool, dsn, EventHasher(audit_key))

    async def counts(self) -> dict[str, int]:
        records = await self._pool.fetch(
            "SELECT status, count(*) AS number FROM approvals GROUP BY status"
        )
        return {record["status"]: record["number"] for record in records}

    @property
    def backlogged(self) -> bool:
        return self._pool.saturated

    async def listen(
        self, woken: Callable[[], None], moved: Callable[[str], None] | None = None
    ) -> Listening:
        """Call `woken()` whenever any process decides an approval: this store's decisions
        here, others' on their notices, on a connection made again whenever it is lost
        (`Listener`); and `moved(run_id)` whenever another store saves a run that stops
        (`RUNS_CHANNEL`). Returns what stops listening."""
        channels: dict[str, Callable[[str], None]] = {DECIDED_CHANNEL: lambda _: woken()}
        if moved is not None:
            channels[RUNS_CHANNEL] = moved
        listener = await Listener(self._dsn, channels, woken, store=self._store).start()
        self._woken.append(woken)
        return _Heard(listener, lambda: self._woken.remove(woken))

    async def _decided(self, rows: Sequence[Row]) -> None:
        """After a statement decided `rows` (each with its `heard`, removed here): wake this
        store's listeners, and notice the runs to other stores' when one listens."""
        heard = [row.pop("heard") for row in rows]
        if not rows:
            return
        for woken in list(self._woken):
            try:
                woken()
            except Exception:  # a listener's bug must not make a committed decision fail
                log.exception("a listener of this store's decisions failed")
        if any(heard):
            await self._teller.tell(row["run_id"] for row in rows)

    def _notifier(self, channel: str) -> Callable[[list[str]], Awaitable[None]]:
        """What sends, in one statement, a notice on `channel` of each run id it is given."""

        async def notify(run_ids: list[str]) -> None:
            await self._pool.execute(
                "SELECT pg_notify($1, run_id) FROM unnest($2::text[]) AS run_id",
                channel,
                run_ids,
            )

        return notify

    async def _one(self, query: str, *arguments: Any) -> Row | None:
        return _row(await self._pool.fetchrow(query, *arguments))

    def _learned(self, record: asyncpg.Record) -> Row:
        """The row of a statement that chains (see `_LINK`), its link remembered."""
        row, link = _linked(record)
        self._links.learn(row, link)
        return row

    def _taken_chain(self, approval_id: str, at: datetime, actor: str | None) -> tuple[Any, ...]:
        """The chain values of a take of the review (its `consumed` event, and the
        `finished` of a denial), spread as the statements that take it want them."""
        taken = (EventValues("consumed", actor, "executor", "{}"), _finished_denied)
        return _flat(self._links.after(approval_id, at, taken))

    async def _chained(
        self, query: str, approval_id: str | None, arguments: Callable[[bool], Sequence[Any]]
    ) -> Row | None:
        """The record of a statement that chains events of the review `approval_id`: made
        with `arguments(True)`, the chain values after the review's remembered link, and, if
        another writer took that place first, made again with `arguments(False)`, the chain
        left to the trigger; made so at once while another statement of this store chains
        an event of the review (see `ChainLinks.writing`)."""
        links = self._links
        remembered = not links.writing(approval_id)
        with links.write(approval_id):
            try:
                found = await self._pool.fetchrow(query, *arguments(remembered))
            except asyncpg.UniqueViolationError as error:
                if not remembered or not _chain_refused(error):
                    raise
                if approval_id is not None:
                    links.forget(approval_id)
                found = await self._pool.fetchrow(query, *arguments(False))
        return None if found is None else self._learned(found)

    async def create(self, row: Row, event_at: datetime, key: Row | None = None) -> Row:
        created = self._links.first(row["approval_id"], event_at, created_event(row))
        arguments: tuple[Any, ...] = (*_new_arguments(row, event_at), created)
        query = _CREATE
        if key is not None:
            query = _CREATE_KEYED
            arguments += (key["token_name"], key["route"], key["key"], key["body_digest"])
        # One statement inserts the record, or returns the active one when the insert met
        # it. An active record committed after the statement's snapshot is not visible to
        # it: then it is read on its own (and should it have finished since, insert again).
        found = await _keyed(key, self._pool.fetchrow(query, *arguments))
        while found is None:
            active = await self._one(_ACTIVE, row["run_id"], row["call_id"])
            if active is not None:
                return active
            found = await _keyed(key, self._pool.fetchrow(query, *arguments))
        return self._learned(found)

    async def claim(
        self,
        request: ApprovalRequest,
        new_row: Callable[[], Row],
        event_at: datetime,
        actor: str | None,
    ) -> Claimed:
        row = new_row()
        denied = detail("outcome", "denied")
        # A decided record of the call is taken with its events chained after the link of the
        # review this store last claimed the call as (if the record is that review). A call
        # claimed here before is seldom made a new record: that one is chained by the trigger.
        # Most claims need one part of `_CLAIM` only, and a statement of fewer parts costs the
        # server less to set up and run: a call this store has not claimed is most often new
        # (`_CREATE` makes it, or finds its active record); one it has claimed is most often
        # resumed (`_TAKE`). `_CLAIM` whole is the fallback, when the record either needs is
        # not there (or not visible to its snapshot yet). The price: a decided call resumed by
        # a store that has not claimed it (another replica's, or this one's after a restart
        # or beyond `ChainLinks.KEPT` calls) takes two statements, `_CREATE` then `consume`,
        # where `_CLAIM` took one. The server's CPU an approval cycle fell by about a sixth,
        # most of it from making new calls, the commonest claim, with `_CREATE`
        # (docs/benchmarks.md).
        known = self._links.review_of(request.run_id, request.call_id)
        created = None
        if known is None:
            created = self._links.first(row["approval_id"], event_at, created_event(row))
            record = await self._pool.fetchrow(_CREATE, *_new_arguments(row, event_at), created)
            if record is not None:
                made = record["chain_n"] is not None
                found = self._learned(record)
                if made:
                    return Claimed("pending", found, created=True)
                return await self._claimed("active", found, request, event_at, actor)
        else:
            seen = await self._take(request, row, event_at, actor, known)
            if seen is not None:
                return await self._claimed(seen.pop("claimed"), seen, request, event_at, actor)
        arguments = (*_new_arguments(row, event_at), actor, denied, created)

        def chained(remembered: bool) -> tuple[Any, ...]:
            if known is None or not remembered:
                return (*arguments, None, *_flat(_UNCHAINED))
            return (*arguments, known, *self._taken_chain(known, event_at, actor))

        active = await self._chained(_CLAIM, known, chained)
        while active is None:
            # The active record was made by a transaction that ended after this statement's
            # snapshot: claim again, now that it can be seen.
            active = await self._chained(_CLAIM, None, lambda remembered: chained(False))
        return await self._claimed(active.pop("claimed"), active, request, event_at, actor)

    async def _take(
        self, request: ApprovalRequest, row: Row, event_at: datetime, actor: str | None, known: str
    ) -> Row | None:
        """`_TAKE` of the call this store last claimed as the review `known`: the decided
        record taken, or the active one; None when the call has no active record."""
        arguments = (
            *(request.run_id, request.call_id, row["tool"], row["digest"], event_at, actor),
            detail("outcome", "denied"),
        )

        def chained(remembered: bool) -> tuple[Any, ...]:
            if not remembered:
                return (*arguments, None, *_flat(_UNCHAINED))
            return (*arguments, known, *self._taken_chain(known, event_at, actor))

        return await self._chained(_TAKE, known, chained)

    async def _claimed(
        self,
        claimed: str,
        active: Row,
        request: ApprovalRequest,
        event_at: datetime,
        actor: str | None,
    ) -> Claimed:
        """What a claim statement said of the call's record `active`: `claimed` it is
        `taken`, `created`, or `active` (then what it is to the request decides)."""
        if claimed == "taken":
            return Claimed("taken", active)
        if claimed == "created":
            return Claimed("pending", active, created=True)
        step = claim_step(active, request)
        if step == "pending" or step == "mismatch":
            return Claimed(step, active)
        # In use, or taken by another call since the snapshot: consume() refuses, and
        # records the refused attempt.
        change = await self.consume(active["approval_id"], event_at, actor)
        if change.changed is not None:
            return Claimed("taken", change.changed)
        return Claimed("in_use", change.existing or active)

    async def keep_results(self, kept: Sequence[tuple[str, str]], at: datetime) -> None:
        async with self._pool.acquire() as connection, connection.transaction():
            for approval_id, result in kept:
                # Locked, so that a finish (a save) or a second keeping waits for this one.
                if await connection.fetchval(_KEEPABLE, approval_id) is not None:
                    await _log(
                        connection, approval_id, at, EventValues("kept", None, "executor", result)
                    )

    async def kept_result(self, approval_id: str) -> str | None:
        found = await self._pool.fetchval(_KEPT, approval_id)
        return None if found is None else str(found)

    async def refuse(
        self, approval_id: str, at: datetime, event: EventValues, once: Once | None = None
    ) -> bool | Repeat:
        if once is not None:
            async with self._pool.acquire() as connection, connection.transaction():
                processed = await self._process(connection, approval_id, once, at)
                if processed is None:
                    return False
                if isinstance(processed, Repeat):
                    return processed
                await _log(connection, approval_id, at, event)
                return True
        inserted = await self._pool.fetchval(
            f"{_EVENTS} SELECT approval_id, 'refused', $2::timestamptz, $3::text, $4::text,"
            " $5::text, $6::text FROM approvals WHERE approval_id = $1 RETURNING 1",
            approval_id, at, event.actor, event.channel, event.detail, event.person,
        )  # fmt: skip
        return inserted is not None

    async def _process(
        self, connection: asyncpg.Connection, approval_id: str, once: Once, at: datetime
    ) -> Row | Repeat | None:
        """Inside a transaction: lock the review and record `once`'s message as processed
        by an act on it; the review's row, or a `Repeat` (its `refused` event appended) when
        the message was processed before, or None when there is no such review."""
        row = _row(await connection.fetchrow(f"{_SELECT_ONE} FOR UPDATE", approval_id))
        if row is None:
            return None
        if await connection.fetchval(_PROCESS, once.message_id, approval_id, at) is not None:
            return row
        first = await connection.fetchval(_PROCESSED_ON, once.message_id)
        await _log(connection, approval_id, at, once.refusal(first))
        return Repeat(once.message_id, first)

    async def get(self, approval_id: str) -> Row | None:
        return await self._one(_SELECT_ONE, approval_id)

    async def find(self, run_id: str, call_id: str) -> Row | None:
        return await self._one(
            f"SELECT {COLUMNS} FROM approvals WHERE run_id = $1 AND call_id = $2 "
            "ORDER BY seq DESC LIMIT 1",
            run_id,
            call_id,
        )

    async def list_rows(
        self, run_id: str | None, status: str | None, limit: int | None, newest_first: bool
    ) -> list[Row]:
        where, arguments = [], []
        for column, value in (("run_id", run_id), ("status", status)):
            if value is not None:
                arguments.append(value)
                where.append(f"{column} = ${len(arguments)}")
        query = f"SELECT {COLUMNS} FROM approvals"
        if where:
            query += " WHERE " + " AND ".join(where)
        query += " ORDER BY seq DESC" if newest_first else " ORDER BY seq"
        if limit is not None:
            query += f" LIMIT {int(limit)}"
        return [dict(record) for record in await self._pool.fetch(query, *arguments)]

    async def decide(self, approval_id: str, act: Act, at: datetime) -> Change | Repeat:
        bound = act.decided()
        decision, actor = act.decision.model_dump_json(), act.decision.decided_by
        arguments = (
            *(approval_id, decision, act.status, at, actor, act.channel),
            *(bound.before, bound.after, act.person),
        )

        def chained(remembered: bool) -> tuple[Any, ...]:
            digest = self._links.digest(approval_id) if remembered else None
            if digest is None:
                return (*arguments, None, None, None, None, self._store)
            event = EventValues("decided", actor, act.channel, bound.text(digest), act.person)
            first, prev, (hash_,) = self._links.after(approval_id, at, [event])
            return (*arguments, digest, first, prev, hash_, self._store)

        once = act.once
        if once is not None:
            return await self._decide_once(approval_id, act, at, once, chained(False))
        changed = await self._chained(_DECIDE, approval_id, chained)
        if changed is not None:
            await self._decided([changed])
            return Change(changed, None)
        refusal = act.refused(ALREADY_DECIDED, actor)
        existing = await self._one(
            _REFUSE,
            *(approval_id, at, actor, act.channel, refusal.detail, refusal.detail, act.person),
        )
        return Change(None, existing)

    async def _decide_once(
        self, approval_id: str, act: Act, at: datetime, once: Once, arguments: Sequence[Any]
    ) -> Change | Repeat:
        """`decide` by a message, in one transaction with its processing (`_DECIDE` made
        with `arguments`, its chain left to the trigger)."""
        async with self._pool.acquire() as connection, connection.transaction():
            processed = await self._process(connection, approval_id, once, at)
            if processed is None:
                return Change(None, None)
            if isinstance(processed, Repeat):
                return processed
            found = await connection.fetchrow(_DECIDE, *arguments)
            if found is None:
                refusal = act.refused(ALREADY_DECIDED, act.decision.decided_by)
                await _log(connection, approval_id, at, refusal)
                return Change(None, processed)
            changed = self._learned(found)
        await self._decided([changed])  # once the transaction has committed
        return Change(changed, None)

    async def vote(
        self, approval_id: str, act: Act, at: datetime, *, outcome_stage: bool = True
    ) -> VoteResult | Repeat:
        ballot = act.decision.model_dump_json()
        actor = act.decision.decided_by or ""
        voted, decided = act.voted(), act.decided()
        arguments = (
            *(approval_id, ballot, act.status, at, actor, act.channel),
            *(voted.before, voted.after, act.person),
            *(act.decision.decided_by, decided.before, decided.after),
        )

        def chained(remembered: bool) -> tuple[Any, ...]:
            digest = self._links.digest(approval_id) if remembered else None
            if digest is None:
                return (*arguments, None, *_flat(_UNCHAINED), outcome_stage, self._store)
            events = (
                EventValues("voted", actor, act.channel, voted.text(digest), act.person),
                EventValues(
                    "decided",
                    act.decision.decided_by,
                    act.channel,
                    decided.text(digest),
                    act.person,
                ),
            )
            after = self._links.after(approval_id, at, events)
            return (*arguments, digest, *_flat(after), outcome_stage, self._store)

        once = act.once
        if once is not None:
            return await self._vote_once(approval_id, act, at, once, chained(False))
        sole = await self._chained(_SOLE_VOTE, approval_id, chained)
        if sole is not None:
            await self._decided([sole])
            return VoteResult("decided", sole)
        counted = await self._count_vote(approval_id, act, at, ballot, actor)
        if counted.result == "decided" and counted.row is not None:
            await self._decided([counted.row])  # once the transaction has committed
        return counted

    async def _vote_once(
        self, approval_id: str, act: Act, at: datetime, once: Once, arguments: Sequence[Any]
    ) -> VoteResult | Repeat:
        """`vote` by a message, in one transaction with its processing: the sole vote that
        decides (`_SOLE_VOTE` made with `arguments`, its chain left to the trigger), else
        counted as `_count_vote` does."""
        async with self._pool.acquire() as connection, connection.transaction():
            processed = await self._process(connection, approval_id, once, at)
            if processed is None:
                return VoteResult("missing", None)
            if isinstance(processed, Repeat):
                return processed
            sole = await connection.fetchrow(_SOLE_VOTE, *arguments)
            if sole is not None:
                counted = VoteResult("decided", self._learned(sole))
            else:
                ballot, actor = act.decision.model_dump_json(), act.decision.decided_by or ""
                counted = await self._counted(connection, processed, act, at, ballot, actor)
        if counted.result == "decided" and counted.row is not None:
            await self._decided([counted.row])  # once the transaction has committed
        return counted

    async def _count_vote(
        self, approval_id: str, act: Act, at: datetime, ballot: str, actor: str
    ) -> VoteResult:
        """A vote (`ballot`, its Decision as JSON, by `actor`) on a review that needs several
        approvals, counted with the votes before it in one transaction."""
        async with self._pool.acquire() as connection, connection.transaction():
            # The row lock makes voters of one approval take turns: each sees the votes before.
            row = _row(await connection.fetchrow(f"{_SELECT_ONE} FOR UPDATE", approval_id))
            if row is None:
                return VoteResult("missing", None)
            return await self._counted(connection, row, act, at, ballot, actor)

    async def _counted(
        self,
        connection: asyncpg.Connection,
        row: Row,
        act: Act,
        at: datetime,
        ballot: str,
        actor: str,
    ) -> VoteResult:
        """The vote counted on `connection`, in its transaction, the review `row` locked."""
        approval_id, voter = row["approval_id"], act.voter
        if row["decision"] is not None:
            await _log(connection, approval_id, at, act.refused(ALREADY_DECIDED, actor))
            return VoteResult("decided_before", row)
        earlier = await connection.fetch(
            "SELECT voter, decision FROM votes WHERE approval_id = $1 ORDER BY seq", approval_id
        )
        if any(found["voter"] == voter for found in earlier):
            await _log(connection, approval_id, at, act.refused(ALREADY_VOTED, actor))
            return VoteResult("voted_before", row)
        await connection.execute(
            "INSERT INTO votes (approval_id, voter, decision, at) VALUES ($1, $2, $3, $4)",
            approval_id, voter, ballot, at,
        )  # fmt: skip
        await _log(connection, approval_id, at, act.voted_event(row["digest"]))
        voters = [found["voter"] for found in earlier] + [voter]
        counted = act.count([found["decision"] for found in earlier], voters, row)
        if counted is None:
            return VoteResult("recorded", row)
        changed = _row(
            await connection.fetchrow(
                "UPDATE approvals SET decision = $2, status = $3, decided_at = $4 "
                f"WHERE approval_id = $1 RETURNING {COLUMNS}, {_heard(5)}",
                *(approval_id, counted.decision, counted.status, at, self._store),
            )
        )
        await _log(connection, approval_id, at, counted.event)
        await connection.execute(
            "UPDATE runs SET pending = pending - 1 WHERE run_id = $1", row["run_id"]
        )
        return VoteResult("decided", changed)

    async def consume(self, approval_id: str, at: datetime, actor: str | None) -> Change:
        arguments = (approval_id, at, actor, detail("outcome", "denied"))

        def chained(remembered: bool) -> tuple[Any, ...]:
            if not remembered:
                return (*arguments, *_flat(_UNCHAINED))
            return (*arguments, *self._taken_chain(approval_id, at, actor))

        changed = await self._chained(_CONSUME, approval_id, chained)
        if changed is not None:
            return Change(changed, None)
        existing = await self._one(
            _REFUSE,
            approval_id,
            at,
            actor,
            "executor",
            detail("reason", NOT_DECIDED),
            detail("reason", CONCURRENT_USE_REASON),
            None,
        )
        return Change(None, existing)

    async def finish(self, approval_id: str, at: datetime, outcome: str) -> Change:
        finished = detail("outcome", outcome)
        arguments = (approval_id, at, outcome, finished)

        def chained(remembered: bool) -> tuple[Any, ...]:
            if not remembered:
                return (*arguments, None, None, None)
            event = EventValues("finished", None, "executor", finished)
            first, prev, (hash_,) = self._links.after(approval_id, at, [event])
            return (*arguments, first, prev, hash_)

        changed = await self._chained(_FINISH, approval_id, chained)
        if changed is not None:
            return Change(changed, None)
        return Change(None, await self.get(approval_id))

    async def decide_known(
        self, known: Row, act: Act, at: datetime, *, vote: bool = False, outcome_stage: bool = True
    ) -> datetime | None:
        return None  # `decide` and `vote` are one statement each anyway

    async def take_known(
        self,
        approval_id: str,
        status: str,
        request: ApprovalRequest,
        at: datetime,
        actor: str | None,
    ) -> datetime | None:
        return None  # a claim takes it with one statement anyway (see `claim`)

    async def finish_known(self, approval_id: str, at: datetime, outcome: str) -> datetime | None:
        change = await self.finish(approval_id, at, outcome)  # one statement either way
        return None if change.changed is None else cast(datetime, change.changed["finished_at"])

    async def event_rows(self, approval_id: str | None) -> list[EventRow]:
        query = "SELECT seq, approval_id, kind, at, actor, channel, detail, person FROM events"
        arguments: tuple[str, ...] = ()
        if approval_id is not None:
            query += " WHERE approval_id = $1"
            arguments = (approval_id,)
        records = await self._pool.fetch(query + " ORDER BY seq", *arguments)
        return [EventRow(*record) for record in records]

    async def expire_due(self, at: datetime, decisions: dict[str, str], limit: int) -> list[Row]:
        approve, deny = timeout_detail("approve"), timeout_detail("deny")
        records = await self._pool.fetch(
            _EXPIRE,
            *(decisions["approve"], decisions["deny"], at, limit, TIMEOUT_DECIDER),
            *(approve.before, approve.after, deny.before, deny.after, self._store),
        )
        rows = [dict(record) for record in records]
        await self._decided(rows)
        return rows

    async def insert_run(
        self,
        row: Row,
        reviews: Sequence[Row] = (),
        announcing: Announcing | None = None,
        key: Row | None = None,
    ) -> Row | None:
        # One statement: `announcing` is left to `announce` (no `deliveries` in the row).
        values = [row.get(name) for name in RUN_COLUMN_NAMES]
        if key is not None:
            if reviews:
                raise ValueError("a run is written with its idempotency key before any review")
            named = (key["token_name"], key["route"], key["key"], key["body_digest"])
            inserting = self._pool.fetchrow(_INSERT_RUN_KEYED, *values, row["run_id"], *named)
            return _row(await _keyed(key, inserting))
        if not reviews:
            return await self._one(_INSERT_RUN, *values, row["run_id"])
        columns = [[review[name] for review in reviews] for name in _NEW_NAMES]
        # Each review's first event, chained here: the reviews are new, nothing precedes it.
        created = [
            self._links.first(review["approval_id"], review["created_at"], created_event(review))
            for review in reviews
        ]
        try:
            inserted = await self._one(_INSERT_RUN_REVIEWED, *values, *columns, created)
        except asyncpg.UniqueViolationError as exc:
            if exc.constraint_name != "runs_run_id_key":
                raise
            return None  # a run with this id exists
        for review, hash_ in zip(reviews, created, strict=True):
            self._links.learn(review, (1, hash_))
        return inserted

    async def find_key(self, token_name: str, route: str, key: str) -> Row | None:
        return await self._one(_FIND_KEY, token_name, route, key)

    async def insert_key(self, row: Row) -> None:
        await _keyed(row, self._pool.execute(_INSERT_KEY, *(row[name] for name in _KEY_NAMES)))

    async def prune_keys(self, before: datetime) -> None:
        await self._pool.execute(_PRUNE_KEYS, before)

    async def get_run(self, run_id: str) -> Row | None:
        return await self._one(_GET_RUN, run_id)

    async def save_run(
        self, run_id: str, version: int, values: Row, spent: Sequence[tuple[str, str]] = ()
    ) -> Change:
        arguments: list[Any] = [
            run_id,
            version,
            values["status"],
            values["messages"],
            values["final_text"],
            values["error"],
            values["updated_at"],
            self._store,
        ]
        query = _SAVE_RUN
        if spent:
            query = _SAVE_RUN_SPENT
            ids, outcomes = [each[0] for each in spent], [each[1] for each in spent]
            arguments += [ids, outcomes, [detail("outcome", outcome) for outcome in outcomes]]
        changed = await self._one(query, *arguments)
        if not changed:
            return Change(None, await self.get_run(run_id))
        if changed.pop("heard") and changed["status"] != "running":
            await self._run_teller.tell([run_id])  # it stops here: waits elsewhere answer
        return Change(changed, None)

    async def renew_claim(
        self, run_id: str, version: int, at: datetime, lease_until: datetime
    ) -> Change:
        changed = await self._one(_RENEW_CLAIM, run_id, version, at, lease_until)
        return Change(changed, None) if changed else Change(None, await self.get_run(run_id))

    async def claim_ready(
        self, worker: str, at: datetime, lease_until: datetime, limit: int
    ) -> list[Row]:
        records = await self._pool.fetch(_CLAIM_READY, at, worker, lease_until, limit)
        ordered = sorted(records, key=lambda record: record["seq"])
        return [{name: record[name] for name in RUN_COLUMN_NAMES} for record in ordered]

    async def unannounced(self, limit: int) -> list[Row]:
        return [dict(record) for record in await self._pool.fetch(_UNANNOUNCED, limit)]

    async def announce(
        self,
        approval_id: str,
        stage: int,
        deliveries: list[Row],
        at: datetime,
        claim: tuple[str, datetime] | None = None,
    ) -> list[Row]:
        kinds = [d["kind"] for d in deliveries]
        targets = [d["target"] for d in deliveries]
        due = [d["due_at"] or at for d in deliveries]
        worker, lease_until = (None, None) if claim is None else claim
        made = await self._pool.fetch(
            _ANNOUNCE, approval_id, kinds, targets, due, at, stage, worker, lease_until
        )
        rows = sorted((dict(record) for record in made), key=lambda row: row["seq"])
        self._links.note_deliveries(rows)
        return rows

    async def claim_deliveries(
        self,
        worker: str,
        at: datetime,
        lease_until: datetime,
        limit: int,
        lost: tuple[datetime, list[int]] | None = None,
    ) -> list[Row]:
        if lost is None:
            records = await self._pool.fetch(_CLAIM_DELIVERIES, worker, lease_until, at, limit)
        else:
            records = await self._pool.fetch(
                _CLAIM_DELIVERIES_OR_LOST, worker, lease_until, at, limit, *lost
            )
        rows = sorted((dict(r) for r in records), key=lambda row: (row["due_at"], row["seq"]))
        self._links.note_deliveries(rows)
        return rows

    async def settle_delivery(
        self,
        delivery_id: int,
        worker: str,
        at: datetime,
        outcome: tuple[str, str | None, datetime | None],
    ) -> Change:
        kind, text, retry_at = outcome
        if kind == "sent":
            values: tuple[Any, ...] = ("sent", at, text, None, None)
        else:
            values = ("due" if retry_at is not None else "failed", None, None, text, retry_at)
        error = canonical_json(text or "")
        with self._links.write(self._links.review_of_delivery(delivery_id)):
            found = await self._pool.fetchrow(
                _SETTLE_LOGGED, delivery_id, worker, *values, at, error
            )
        if found is not None:
            changed, link = _linked(found)
            self._links.advance(changed["approval_id"], link)
            return Change(changed, None)
        existing = await self._one(
            f"SELECT {DELIVERY_COLUMNS} FROM deliveries WHERE seq = $1", delivery_id
        )
        return Change(None, existing)

    async def delivery_progress(self, delivery_id: int, worker: str, ref: str) -> Change:
        async with self._pool.acquire() as connection, connection.transaction():
            found = await connection.fetchrow(_DELIVERY_PROGRESS, delivery_id, worker, ref)
            if found is not None:
                return Change(dict(found), None)
            existing = await connection.fetchrow(
                f"SELECT {DELIVERY_COLUMNS} FROM deliveries WHERE seq = $1", delivery_id
            )
            return Change(None, _row(existing))

    async def retry_deliveries_now(self, targets: list[str], at: datetime) -> int:
        status = await self._pool.execute(_RETRY_NOW, targets, at)
        return int(status.rsplit(" ", 1)[-1])  # "UPDATE <count>"

    async def delivery_rows(self, approval_id: str) -> list[Row]:
        records = await self._pool.fetch(
            f"SELECT {DELIVERY_COLUMNS} FROM deliveries WHERE approval_id = $1 ORDER BY seq",
            approval_id,
        )
        return [dict(record) for record in records]

    async def close(self) -> None:
        await self._teller.drain()
        await self._run_teller.drain()
        await self._pool.close()


class _Heard(Listening):
    """A store's listening: its `Listener`, and its place among the store's listeners that
    the store's own decisions wake (`PostgresBackend.listen`)."""

    def __init__(self, listener: Listener, leave: Callable[[], None]) -> None:
        self._listener = listener
        self._leave = leave

    @property
    def connected(self) -> bool:  # type: ignore[override]
        return self._listener.connected

    @property
    def ended(self) -> bool:
        return self._listener.ended

    async def __call__(self) -> None:
        leave, self._leave = self._leave, lambda: None  # stopping twice leaves once
        leave()
        await self._listener()
