"""Run states: what an agent of another framework the bot hosts (`framework_agents:`) needs
to resume a run, kept between its steps.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from nodbot.core.sqlstore.schema import UTCDateTime

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "run_states",
        sa.Column("run_id", sa.String(64), primary_key=True),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("updated_at", UTCDateTime, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("run_states")
