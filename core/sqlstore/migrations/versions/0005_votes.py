"""Votes: a review may need several distinct approvals (any deny denies).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from nodbot.core.sqlstore.schema import UTCDateTime

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

SERIAL = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    with op.batch_alter_table("approvals") as table:
        table.add_column(
            sa.Column("approvals_required", sa.Integer, nullable=False, server_default="1")
        )
    op.create_table(
        "votes",
        sa.Column("seq", SERIAL, primary_key=True, autoincrement=True),
        sa.Column("approval_id", sa.String(64), nullable=False),
        sa.Column("voter", sa.String(255), nullable=False),
        sa.Column("decision", sa.Text, nullable=False),
        sa.Column("at", UTCDateTime, nullable=False),
        sa.UniqueConstraint("approval_id", "voter", name="votes_one_per_voter"),
    )


def downgrade() -> None:
    op.drop_table("votes")
    with op.batch_alter_table("approvals") as table:
        table.drop_column("approvals_required")
