"""Durable runs.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from nodbot.core.sqlstore.schema import UTCDateTime

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

SERIAL = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("seq", SERIAL, primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(255), nullable=False, unique=True),
        sa.Column("agent", sa.String(255), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("messages", sa.Text, nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("created_at", UTCDateTime, nullable=False),
        sa.Column("updated_at", UTCDateTime, nullable=False),
        sa.Column("requested_by", sa.String(255)),
        sa.Column("final_text", sa.Text),
        sa.Column("error", sa.Text),
        sa.Column("claimed_by", sa.String(255)),
        sa.Column("lease_until", UTCDateTime),
    )
    op.create_index("runs_status", "runs", ["status", "seq"])


def downgrade() -> None:
    op.drop_table("runs")
