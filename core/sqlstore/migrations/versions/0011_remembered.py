"""Remembered approvals: a reviewer's "approve, and remember" under a rule's `remember:`.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from nodbot.core.sqlstore.schema import UTCDateTime

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "remembered",
        sa.Column("remember_id", sa.String(64), primary_key=True),
        sa.Column("scope", sa.String(64), nullable=False),
        sa.Column("tool", sa.String(255), nullable=False),
        sa.Column("arguments", sa.Text, nullable=False),
        sa.Column("rule", sa.String(64), nullable=False),
        sa.Column("decided_by", sa.String(320), nullable=False),
        sa.Column("person", sa.String(320)),
        sa.Column("approval_id", sa.String(64), nullable=False),
        sa.Column("created_at", UTCDateTime, nullable=False),
        sa.Column("expires_at", UTCDateTime, nullable=False),
        sa.Column("forgotten_at", UTCDateTime),
        sa.Column("forgotten_by", sa.String(320)),
    )
    op.create_index("remembered_scope", "remembered", ["scope", "expires_at"])


def downgrade() -> None:
    op.drop_index("remembered_scope", "remembered")
    op.drop_table("remembered")
