"""Revocations: the web inbox's ended sessions, kept in the store.

A sign-out, or `nodbot sessions revoke --principal`, was kept in the memory of the process
that made it: a restart forgot it and another replica never knew it. `revocations` holds
each, for every process on the database, until the sessions it ends have expired.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from nodbot.core.sqlstore.schema import UTCDateTime

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

SERIAL = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "revocations",
        sa.Column("seq", SERIAL, primary_key=True, autoincrement=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("subject", sa.String(255), nullable=False),
        sa.Column("issued_before", UTCDateTime),
        sa.Column("expires_at", UTCDateTime, nullable=False),
        sa.Column("created_at", UTCDateTime, nullable=False),
    )
    op.create_index("revocations_subject", "revocations", ["kind", "subject"])
    op.create_index("revocations_expiry", "revocations", ["expires_at"])


def downgrade() -> None:
    op.drop_index("revocations_expiry", "revocations")
    op.drop_index("revocations_subject", "revocations")
    op.drop_table("revocations")
