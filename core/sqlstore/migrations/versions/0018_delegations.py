"""Delegations: a reviewer's reviews handed to another person for a period (out of office).

`nodbot delegate` and the inbox's settings page write one row each; every process on the
database reads them when a delegate decides, so a delegation made through one replica holds
on every other at once, and after a restart. Ended and past ones are kept for the record.
Nothing before this revision had one: the table starts empty.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-12
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from nodbot.core.sqlstore.schema import UTCDateTime

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "delegations",
        sa.Column("delegation_id", sa.String(64), primary_key=True),
        sa.Column("delegator", sa.String(320), nullable=False),
        sa.Column("delegate", sa.String(320), nullable=False),
        sa.Column("since", UTCDateTime, nullable=False),
        sa.Column("until", UTCDateTime, nullable=False),
        sa.Column("reason", sa.Text),
        sa.Column("created_by", sa.String(320)),
        sa.Column("created_at", UTCDateTime, nullable=False),
        sa.Column("ended_at", UTCDateTime),
        sa.Column("ended_by", sa.String(320)),
    )
    op.create_index("delegations_until", "delegations", ["until"])


def downgrade() -> None:
    op.drop_index("delegations_until", "delegations")
    op.drop_table("delegations")
