"""Listeners: the sessions that listen for the notices of decisions, so that a decision is
noticed only when another process listens.

A NOTIFY in a transaction takes a lock, one for the whole server, at its commit and holds it
until the commit is durable: every deciding transaction took turns with its fsync, where
writers otherwise share one (8 sessions updating a row each at once: 2,593 transactions/s with
the NOTIFY inside, 5,477/s without, 10,673/s of NOTIFY alone, which needs no fsync). Now each
listening session says so here (its backend's pid, and the store it listens for); a decision
tells the processes of other stores, after its commit, in a transaction of its own, and tells
nobody when no other store listens; a wait in the deciding store is woken in its process.
A row whose session has gone is cleared by the next listener to start. The table exists on
SQLite too (one schema), where nothing listens and it stays empty.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from nodbot.core.sqlstore.schema import UTCDateTime

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "listeners",
        sa.Column("pid", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("store", sa.String(64), nullable=False),
        sa.Column("since", UTCDateTime, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("listeners")
