"""The audit trail: who (person) acted, and a hash chain per review over its events.

Adds `person`, `n`, `prev` and `hash` to `events`, chains the events already there (per
review, in the order they were written, with the store's audit key if it has one), and on
PostgreSQL the trigger that chains every event inserted after (see core/audit.py).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op

from nodbot.core.audit import EventHasher
from nodbot.core.sqlstore.schema import UTCDateTime

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

CHAIN_LOCK_CLASS = 0x6E6F6462
"""The first key of the advisory lock the trigger takes per review (the second is the hash of
its approval id); a lock space of its own, apart from the migrations' single-key lock."""


def _field(value: str) -> str:
    """The SQL of one field of the message: `~` for NULL, else `<length in characters>:<value>`.
    Written out in place: a helper SQL function called nine times per row cost a few hundred
    microseconds per event (its plan is made again in each transaction)."""
    return f"CASE WHEN {value} IS NULL THEN '~' ELSE length({value}) || ':' || {value} END"


_MESSAGE_FIELDS = ",\n            ".join(
    _field(value)
    for value in (
        "NEW.prev",
        "n_text",
        "NEW.approval_id",
        "NEW.kind",
        "at_text",
        "NEW.actor",
        "NEW.person",
        "NEW.channel",
        "NEW.detail",
    )
)

# Sessions of nodbot's store set nodbot.audit = 'v1' (and, with an audit key, the HMAC pads
# nodbot.audit_ikey / nodbot.audit_okey): their rows are chained here, whatever they say.
# Any other session's row keeps the n, prev and hash it was given (a data-only restore keeps
# its chain) and gets the next place when it was given none, with no hash: verify reports it.
# The advisory lock makes the writers of one review take turns until they commit, and each
# statement of this (volatile) function sees what was committed before it got the lock, and
# the rows the same outer statement inserted before this one.
POSTGRESQL_CHAIN = f"""
CREATE FUNCTION nodbot_events_chain() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    chained boolean := coalesce(current_setting('nodbot.audit', true), '') = 'v1';
    ikey text;
    okey text;
    last_n integer;
    last_hash text;
    n_text text;
    at_text text;
    message bytea;
BEGIN
    IF NOT chained AND NEW.n IS NOT NULL THEN
        RETURN NEW;
    END IF;
    PERFORM pg_advisory_xact_lock({CHAIN_LOCK_CLASS}, hashtext(NEW.approval_id));
    SELECT n, hash INTO last_n, last_hash FROM events
    WHERE approval_id = NEW.approval_id AND n IS NOT NULL
    ORDER BY n DESC LIMIT 1;
    NEW.n := coalesce(last_n, 0) + 1;
    NEW.prev := last_hash;
    IF NOT chained THEN
        RETURN NEW;
    END IF;
    n_text := NEW.n::text;
    at_text := to_char(NEW.at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US');
    message := convert_to(
        'nodbot-event-v1' || chr(10) || concat_ws(chr(10),
            {_MESSAGE_FIELDS}),
        'UTF8');
    ikey := coalesce(current_setting('nodbot.audit_ikey', true), '');
    IF ikey = '' THEN
        NEW.hash := encode(sha256(message), 'hex');
    ELSE
        okey := coalesce(current_setting('nodbot.audit_okey', true), '');
        NEW.hash := encode(
            sha256(decode(okey, 'hex') || sha256(decode(ikey, 'hex') || message)), 'hex');
    END IF;
    RETURN NEW;
END $$"""
POSTGRESQL_TRIGGER = """
CREATE TRIGGER events_chain BEFORE INSERT ON events
FOR EACH ROW EXECUTE FUNCTION nodbot_events_chain()"""

# The append-only triggers of 0001, lifted while the existing rows get their chain.
SQLITE_NO_UPDATE = """CREATE TRIGGER events_no_update BEFORE UPDATE ON events
       BEGIN SELECT RAISE(ABORT, 'events are append-only'); END"""

_EVENTS = sa.table(
    "events",
    sa.column("seq", sa.Integer),
    sa.column("approval_id", sa.String),
    sa.column("kind", sa.String),
    sa.column("at", UTCDateTime),
    sa.column("actor", sa.String),
    sa.column("person", sa.String),
    sa.column("channel", sa.String),
    sa.column("detail", sa.Text),
    sa.column("n", sa.Integer),
    sa.column("prev", sa.String),
    sa.column("hash", sa.String),
)


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    # Nullable columns: SQLite adds them in place (no copy of the table, whose triggers stay).
    op.add_column("events", sa.Column("person", sa.String(255)))
    op.add_column("events", sa.Column("n", sa.Integer))
    op.add_column("events", sa.Column("prev", sa.String(64)))
    op.add_column("events", sa.Column("hash", sa.String(64)))
    if dialect == "sqlite":
        op.execute("DROP TRIGGER events_no_update")
    else:
        op.execute("ALTER TABLE events DISABLE TRIGGER events_no_change")
    _chain_existing_events(EventHasher(context.config.attributes.get("audit_key")))
    if dialect == "sqlite":
        op.execute(SQLITE_NO_UPDATE)
    else:
        op.execute("ALTER TABLE events ENABLE TRIGGER events_no_change")
        op.execute(POSTGRESQL_CHAIN)
        op.execute(POSTGRESQL_TRIGGER)
    op.drop_index("events_approval", "events")
    op.create_index("events_chain", "events", ["approval_id", "n"], unique=True)


def _chain_existing_events(hasher: EventHasher) -> None:
    """Give every event its place in its review's chain, in the order they were written."""
    bind = op.get_bind()
    last: dict[str, tuple[int, str]] = {}
    links = []
    for row in bind.execute(sa.select(_EVENTS).order_by(_EVENTS.c.seq)):
        n, prev = last.get(row.approval_id, (0, None))
        digest = hasher.hash(
            prev=prev,
            n=n + 1,
            approval_id=row.approval_id,
            kind=row.kind,
            at=row.at,
            actor=row.actor,
            person=row.person,
            channel=row.channel,
            detail=row.detail,
        )
        last[row.approval_id] = (n + 1, digest)
        links.append({"key": row.seq, "n": n + 1, "prev": prev, "hash": digest})
    if links:
        bind.execute(
            _EVENTS.update()
            .where(_EVENTS.c.seq == sa.bindparam("key"))
            .values(n=sa.bindparam("n"), prev=sa.bindparam("prev"), hash=sa.bindparam("hash")),
            links,
        )


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    op.drop_index("events_chain", "events")
    op.create_index("events_approval", "events", ["approval_id", "seq"])
    if dialect == "postgresql":
        op.execute("DROP TRIGGER events_chain ON events")
        op.execute("DROP FUNCTION nodbot_events_chain()")
    # Plain ALTER TABLE (SQLite 3.35+): a batch copy of the table would lose its triggers.
    for column in ("hash", "prev", "n", "person"):
        op.execute(f"ALTER TABLE events DROP COLUMN {column}")
