"""The outbox: what must be told to whom about each review, and whether it was.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from nodbot.core.sqlstore.schema import UTCDateTime

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

SERIAL = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
UNANNOUNCED = sa.text("announced < 2")
DUE = sa.text("status = 'due'")


def upgrade() -> None:
    with op.batch_alter_table("approvals") as table:
        table.add_column(sa.Column("announced", sa.Integer, nullable=False, server_default="0"))
    # Reviews that existed before the outbox are not announced now, long after the fact.
    op.execute("UPDATE approvals SET announced = 2")
    op.create_index(
        "approvals_unannounced",
        "approvals",
        ["seq"],
        sqlite_where=UNANNOUNCED,
        postgresql_where=UNANNOUNCED,
    )
    op.create_table(
        "deliveries",
        sa.Column("seq", SERIAL, primary_key=True, autoincrement=True),
        sa.Column("approval_id", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("target", sa.String(255), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("due_at", UTCDateTime, nullable=False),
        sa.Column("created_at", UTCDateTime, nullable=False),
        sa.Column("sent_at", UTCDateTime),
        sa.Column("ref", sa.Text),
        sa.Column("error", sa.Text),
        sa.Column("claimed_by", sa.String(255)),
        sa.Column("lease_until", UTCDateTime),
        sa.UniqueConstraint("approval_id", "kind", "target", name="deliveries_once"),
    )
    op.create_index(
        "deliveries_due", "deliveries", ["due_at"], sqlite_where=DUE, postgresql_where=DUE
    )


def downgrade() -> None:
    op.drop_index("deliveries_due", "deliveries")
    op.drop_table("deliveries")
    op.drop_index("approvals_unannounced", "approvals")
    with op.batch_alter_table("approvals") as table:
        table.drop_column("announced")
