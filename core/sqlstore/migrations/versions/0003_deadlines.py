"""Deadlines: a review that nobody decides in time is decided by its timeout decision.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from nodbot.core.sqlstore.schema import UTCDateTime

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

PENDING = sa.text("status = 'pending'")


def upgrade() -> None:
    with op.batch_alter_table("approvals") as table:
        table.add_column(sa.Column("deadline", UTCDateTime))
        table.add_column(
            sa.Column("on_timeout", sa.String(8), nullable=False, server_default="deny")
        )
    op.create_index(
        "approvals_deadline",
        "approvals",
        ["deadline"],
        sqlite_where=PENDING,
        postgresql_where=PENDING,
    )


def downgrade() -> None:
    op.drop_index("approvals_deadline", "approvals")
    with op.batch_alter_table("approvals") as table:
        table.drop_column("on_timeout")
        table.drop_column("deadline")
