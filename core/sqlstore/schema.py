"""The tables of the SQL approval store. Migrations (in `migrations/versions/`) create them;
this module describes them for queries and must match the newest migration."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Dialect,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    TypeDecorator,
    UniqueConstraint,
    text,
)

__all__ = [
    "UTCDateTime",
    "approvals",
    "delegations",
    "deliveries",
    "events",
    "idempotency_keys",
    "listeners",
    "metadata",
    "processed_messages",
    "remembered",
    "revocations",
    "run_states",
    "runs",
    "votes",
]

metadata = MetaData()

# SQLite has no 64-bit identity type of its own, and only INTEGER PRIMARY KEY autoincrements.
Serial = BigInteger().with_variant(Integer(), "sqlite")


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC datetime on every backend (SQLite keeps no zone: it is UTC)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        assert isinstance(value, datetime)
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


approvals = Table(
    "approvals",
    metadata,
    Column("seq", Serial, primary_key=True, autoincrement=True),
    Column("approval_id", String(64), nullable=False, unique=True),
    Column("run_id", String(255), nullable=False),
    Column("call_id", String(255), nullable=False),
    Column("tool", String(255), nullable=False),
    Column("arguments", Text, nullable=False),  # canonical JSON
    Column("digest", String(64), nullable=False),
    Column("requested_by", String(255)),
    Column("status", String(16), nullable=False),  # pending | approved | denied
    Column("decision", Text),  # the Decision as JSON
    Column("created_at", UTCDateTime, nullable=False),
    Column("decided_at", UTCDateTime),
    Column("consumed_at", UTCDateTime),
    Column("finished_at", UTCDateTime),
    Column("outcome", String(64)),
    Column("deadline", UTCDateTime),
    Column("on_timeout", String(8), nullable=False, server_default="deny"),
    Column("policy", Text, nullable=False, server_default="{}"),  # the rules' say, as JSON
    Column("approvals_required", Integer, nullable=False, server_default="1"),
    # How far the outbox has told the review's channels: 0 nothing yet, 1 the request,
    # 2 the outcome too.
    Column("announced", Integer, nullable=False, server_default="0"),
)

# One active (unfinished) record per call: what makes create() an atomic create-if-absent.
Index(
    "approvals_active_call",
    approvals.c.run_id,
    approvals.c.call_id,
    unique=True,
    sqlite_where=approvals.c.finished_at.is_(None),
    postgresql_where=approvals.c.finished_at.is_(None),
)
# find(): the newest record of a call. Also serves list(run_id=...): a run has few records,
# so a run's rows are filtered by status rather than kept in one more index on every write.
Index("approvals_call", approvals.c.run_id, approvals.c.call_id, approvals.c.seq)
# list(status=...) across runs, in creation order.
Index("approvals_status", approvals.c.status, approvals.c.seq)
# expire_due(): pending reviews by deadline; only those that have one (migration 0013), so
# that a review made without a deadline writes nothing here, made or decided.
_TIMED = text("status = 'pending' AND deadline IS NOT NULL")
Index("approvals_deadline", approvals.c.deadline, sqlite_where=_TIMED, postgresql_where=_TIMED)

# The outbox's work list: reviews whose request, or outcome once decided, is still to be
# announced. Exactly the list, so that reviews announced and still open are not in it (they
# were, until migration 0008, and each step read past every one of them).
_UNANNOUNCED = text("announced < 2 AND (announced = 0 OR decided_at IS NOT NULL)")
Index(
    "approvals_unannounced",
    approvals.c.seq,
    sqlite_where=_UNANNOUNCED,
    postgresql_where=_UNANNOUNCED,
)

events = Table(
    "events",
    metadata,
    Column("seq", Serial, primary_key=True, autoincrement=True),
    Column("approval_id", String(64), nullable=False),
    Column("kind", String(16), nullable=False),
    Column("at", UTCDateTime, nullable=False),
    Column("actor", String(255)),
    Column("channel", String(64)),
    Column("detail", Text, nullable=False),  # JSON object
    Column("person", String(255)),  # who the actor's handle resolved to
    # The review's hash chain (see core/audit.py): position, the previous event's hash, and
    # this event's. NULL only in rows written outside nodbot, which `nodbot audit verify` reports.
    Column("n", Integer),
    Column("prev", String(64)),
    Column("hash", String(64)),
)
# A review's chain in order: the last link read before each insert, and events(approval_id).
Index("events_chain", events.c.approval_id, events.c.n, unique=True)

runs = Table(
    "runs",
    metadata,
    Column("seq", Serial, primary_key=True, autoincrement=True),
    Column("run_id", String(255), nullable=False, unique=True),
    Column("agent", String(255), nullable=False),
    Column("status", String(16), nullable=False),  # running | waiting | finished | failed
    Column("messages", Text, nullable=False),  # the conversation as JSON
    Column("version", Integer, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    Column("requested_by", String(255)),
    Column("final_text", Text),
    Column("error", Text),
    Column("claimed_by", String(255)),
    Column("lease_until", UTCDateTime),
    # Who started it, when another than `requested_by` (a token with runs:write-as).
    Column("started_by", String(255)),
    # How many of the run's reviews are pending, kept by the statements that create and
    # decide them, so that a waiting run is ready when it is 0 (read nowhere else).
    Column("pending", Integer, nullable=False, server_default="0"),
)
# claim_ready(): the runs it may claim, oldest first (those of the running ones whose lease
# ran out), whatever the number of runs waiting for review.
_CLAIMABLE = text("status = 'running' OR (status = 'waiting' AND pending = 0)")
Index("runs_claimable", runs.c.seq, sqlite_where=_CLAIMABLE, postgresql_where=_CLAIMABLE)

votes = Table(
    "votes",
    metadata,
    Column("seq", Serial, primary_key=True, autoincrement=True),
    Column("approval_id", String(64), nullable=False),
    Column("voter", String(255), nullable=False),
    Column("decision", Text, nullable=False),  # the voter's Decision as JSON
    Column("at", UTCDateTime, nullable=False),
    UniqueConstraint("approval_id", "voter", name="votes_one_per_voter"),
)

deliveries = Table(
    "deliveries",
    metadata,
    Column("seq", Serial, primary_key=True, autoincrement=True),
    Column("approval_id", String(64), nullable=False),
    Column("kind", String(16), nullable=False),  # request | escalation | outcome
    Column("target", String(255), nullable=False),  # channel:address, e.g. webhook:ops
    Column("status", String(16), nullable=False),  # due | sent | failed
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("due_at", UTCDateTime, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("sent_at", UTCDateTime),
    Column("ref", Text),  # the channel's reference to what it posted, as JSON
    Column("error", Text),  # why the last attempt failed
    Column("claimed_by", String(255)),
    Column("lease_until", UTCDateTime),
    # Each review tells each target each thing once, however many replicas fan it out.
    UniqueConstraint("approval_id", "kind", "target", name="deliveries_once"),
)
# claim_deliveries(): what is due, soonest first.
Index(
    "deliveries_due",
    deliveries.c.due_at,
    sqlite_where=deliveries.c.status == "due",
    postgresql_where=deliveries.c.status == "due",
)

# The web inbox's ended sessions (core/sqlstore/sessions.py): one session (`kind` session,
# `subject` its id), or every session of a person issued at or before `issued_before`
# (`kind` principal, `subject` the principal in lower case). A row is kept until
# `expires_at`, when every session it ends has expired anyway, and pruned after.
revocations = Table(
    "revocations",
    metadata,
    Column("seq", Serial, primary_key=True, autoincrement=True),
    Column("kind", String(16), nullable=False),  # session | principal
    Column("subject", String(255), nullable=False),
    Column("issued_before", UTCDateTime),  # principal: sessions issued at or before it
    Column("expires_at", UTCDateTime, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
)
# session_revoked(): the revocations of one session id and of one principal, on every request.
Index("revocations_subject", revocations.c.kind, revocations.c.subject)
# The pruning of those that have expired, on every insert.
Index("revocations_expiry", revocations.c.expires_at)

remembered = Table(
    "remembered",
    metadata,
    Column("remember_id", String(64), primary_key=True),
    Column("scope", String(64), nullable=False),  # remember_scope(): tool, rule, arguments
    Column("tool", String(255), nullable=False),
    Column("arguments", Text, nullable=False),  # the arguments it covers, canonical JSON
    Column("rule", String(64), nullable=False),  # the digest of the rule's text
    Column("decided_by", String(320), nullable=False),
    Column("person", String(320)),
    Column("approval_id", String(64), nullable=False),  # the review it was made in
    Column("created_at", UTCDateTime, nullable=False),
    Column("expires_at", UTCDateTime, nullable=False),
    Column("forgotten_at", UTCDateTime),
    Column("forgotten_by", String(320)),
)
# find(): the live approvals of one scope, for each call a remembering rule covers.
Index("remembered_scope", remembered.c.scope, remembered.c.expires_at)

# Reviewers' reviews handed to another person for a period (core/sqlstore/delegations.py,
# migration 0018): read by every process on the database at each decision a delegate makes.
delegations = Table(
    "delegations",
    metadata,
    Column("delegation_id", String(64), primary_key=True),
    Column("delegator", String(320), nullable=False),  # whose reviews: a handle, normalized
    Column("delegate", String(320), nullable=False),  # who decides them meanwhile
    Column("since", UTCDateTime, nullable=False),
    Column("until", UTCDateTime, nullable=False),
    Column("reason", Text),
    Column("created_by", String(320)),
    Column("created_at", UTCDateTime, nullable=False),
    Column("ended_at", UTCDateTime),
    Column("ended_by", String(320)),
)
# live(): those not past, at each decision a delegate makes.
Index("delegations_until", delegations.c.until)

run_states = Table(
    "run_states",
    metadata,
    Column("run_id", String(64), primary_key=True),
    Column("state", Text, nullable=False),  # a hosted agent's framework state, as text
    Column("updated_at", UTCDateTime, nullable=False),
)

# The sessions that listen for the notices of decisions (PostgreSQL; see
# core/sqlstore/notices.py): a decision is noticed, after its commit, only when a session of
# another store is here. A row whose session has gone is cleared by the next listener to start.
listeners = Table(
    "listeners",
    metadata,
    Column("pid", Integer, primary_key=True, autoincrement=False),  # the session's backend
    Column("store", String(64), nullable=False),  # which store instance listens
    Column("since", UTCDateTime, nullable=False),
)

# The messages reviewers acted by (email replies), each processed once, whatever review it
# names (migration 0016): the insert of its id, in the transaction of the act, is the check.
processed_messages = Table(
    "processed_messages",
    metadata,
    Column("message_id", String(998), primary_key=True),  # the Message-ID, as written
    Column("approval_id", String(64), nullable=False),  # the review it was processed on first
    Column("at", UTCDateTime, nullable=False),
)

# The `Idempotency-Key` of each API request that made a run or an approval, or answered with
# one (`POST /runs`, `POST /approvals`; migration 0017), per token, route and key: written in
# the transaction that writes what it names, so that a repeat finds both or neither. Kept at
# least a day (`KEYS_KEPT` in store.py), then pruned by a later keyed write.
idempotency_keys = Table(
    "idempotency_keys",
    metadata,
    Column("token_name", String(320), primary_key=True),  # the API token's name
    Column("route", String(32), primary_key=True),  # POST /runs | POST /approvals
    Column("key", String(200), primary_key=True),  # as the client sent it
    Column("body_digest", String(64), nullable=False),  # SHA-256 of the canonical body
    Column("target_id", String(64), nullable=False),  # the run id or the approval id
    Column("created_at", UTCDateTime, nullable=False),
)
# The pruning of keys past their time.
Index("idempotency_keys_age", idempotency_keys.c.created_at)
