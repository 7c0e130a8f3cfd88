"""Approvals and their append-only events.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from nodbot.core.sqlstore.schema import UTCDateTime

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

SERIAL = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
UNFINISHED = sa.text("finished_at IS NULL")

SQLITE_APPEND_ONLY = [
    """CREATE TRIGGER events_no_update BEFORE UPDATE ON events
       BEGIN SELECT RAISE(ABORT, 'events are append-only'); END""",
    """CREATE TRIGGER events_no_delete BEFORE DELETE ON events
       BEGIN SELECT RAISE(ABORT, 'events are append-only'); END""",
]
POSTGRESQL_APPEND_ONLY = [
    """CREATE FUNCTION nodbot_events_append_only() RETURNS trigger LANGUAGE plpgsql AS
       $$ BEGIN RAISE EXCEPTION 'events are append-only'; END $$""",
    """CREATE TRIGGER events_no_change BEFORE UPDATE OR DELETE ON events
       FOR EACH ROW EXECUTE FUNCTION nodbot_events_append_only()""",
    """CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON events
       FOR EACH STATEMENT EXECUTE FUNCTION nodbot_events_append_only()""",
]


def upgrade() -> None:
    op.create_table(
        "approvals",
        sa.Column("seq", SERIAL, primary_key=True, autoincrement=True),
        sa.Column("approval_id", sa.String(64), nullable=False, unique=True),
        sa.Column("run_id", sa.String(255), nullable=False),
        sa.Column("call_id", sa.String(255), nullable=False),
        sa.Column("tool", sa.String(255), nullable=False),
        sa.Column("arguments", sa.Text, nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("requested_by", sa.String(255)),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("decision", sa.Text),
        sa.Column("created_at", UTCDateTime, nullable=False),
        sa.Column("decided_at", UTCDateTime),
        sa.Column("consumed_at", UTCDateTime),
        sa.Column("finished_at", UTCDateTime),
        sa.Column("outcome", sa.String(64)),
    )
    op.create_index(
        "approvals_active_call",
        "approvals",
        ["run_id", "call_id"],
        unique=True,
        sqlite_where=UNFINISHED,
        postgresql_where=UNFINISHED,
    )
    op.create_index("approvals_call", "approvals", ["run_id", "call_id", "seq"])
    op.create_index("approvals_status", "approvals", ["status", "seq"])

    op.create_table(
        "events",
        sa.Column("seq", SERIAL, primary_key=True, autoincrement=True),
        sa.Column("approval_id", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("at", UTCDateTime, nullable=False),
        sa.Column("actor", sa.String(255)),
        sa.Column("channel", sa.String(64)),
        sa.Column("detail", sa.Text, nullable=False),
    )
    op.create_index("events_approval", "events", ["approval_id", "seq"])
    dialect = op.get_bind().dialect.name
    for statement in SQLITE_APPEND_ONLY if dialect == "sqlite" else POSTGRESQL_APPEND_ONLY:
        op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TABLE events")
        op.execute("DROP FUNCTION nodbot_events_append_only()")
    else:
        op.drop_table("events")
    op.drop_table("approvals")
