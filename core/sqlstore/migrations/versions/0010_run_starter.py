"""Runs keep who started them, beside who they are requested by.

A token with `runs:write-as` starts runs for someone else (`requested_by`); the self-approval
check must then cover the starter too, on every channel, so the run keeps it.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("started_by", sa.String(255)))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("started_by")
