"""Idempotency keys: the `Idempotency-Key` a client sends with `POST /runs` or `POST
/approvals`, per API token, route and key, with the digest of the body it came with and the
run or approval it named.

A key is written in the transaction that writes the run or the approval it names, so a
repeat of a request whose answer was lost (a timeout, a 503 during an outage) finds both or
neither: it answers with what the first made instead of making it again. The primary key is
the check. Nothing before this revision had a key: the table starts empty.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from nodbot.core.sqlstore.schema import UTCDateTime

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "idempotency_keys",
        sa.Column("token_name", sa.String(320), primary_key=True),
        sa.Column("route", sa.String(32), primary_key=True),
        sa.Column("key", sa.String(200), primary_key=True),
        sa.Column("body_digest", sa.String(64), nullable=False),
        sa.Column("target_id", sa.String(64), nullable=False),
        sa.Column("created_at", UTCDateTime, nullable=False),
    )
    op.create_index("idempotency_keys_age", "idempotency_keys", ["created_at"])


def downgrade() -> None:
    op.drop_index("idempotency_keys_age", "idempotency_keys")
    op.drop_table("idempotency_keys")
