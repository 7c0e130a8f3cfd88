"""Worker steps that cost the same however many reviews are open.

A waiting run is ready when none of its reviews is pending: `runs.pending` counts them (the
statements that create and decide reviews keep it), and `runs_claimable` indexes exactly the
runs `claim_ready` may take, so that it no longer looks at the pending reviews of every
waiting run. `approvals_unannounced` shrinks to exactly the outbox's work list: reviews
announced and still open are left out of it.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

CLAIMABLE = sa.text("status = 'running' OR (status = 'waiting' AND pending = 0)")
UNANNOUNCED = sa.text("announced < 2 AND (announced = 0 OR decided_at IS NOT NULL)")
UNANNOUNCED_BEFORE = sa.text("announced < 2")


def upgrade() -> None:
    with op.batch_alter_table("runs") as table:
        table.add_column(sa.Column("pending", sa.Integer, nullable=False, server_default="0"))
    op.execute(
        "UPDATE runs SET pending = (SELECT count(*) FROM approvals "
        "WHERE approvals.run_id = runs.run_id AND approvals.status = 'pending')"
    )
    op.drop_index("runs_status", "runs")
    op.create_index(
        "runs_claimable", "runs", ["seq"], sqlite_where=CLAIMABLE, postgresql_where=CLAIMABLE
    )
    op.drop_index("approvals_unannounced", "approvals")
    op.create_index(
        "approvals_unannounced",
        "approvals",
        ["seq"],
        sqlite_where=UNANNOUNCED,
        postgresql_where=UNANNOUNCED,
    )


def downgrade() -> None:
    op.drop_index("approvals_unannounced", "approvals")
    op.create_index(
        "approvals_unannounced",
        "approvals",
        ["seq"],
        sqlite_where=UNANNOUNCED_BEFORE,
        postgresql_where=UNANNOUNCED_BEFORE,
    )
    op.drop_index("runs_claimable", "runs")
    op.create_index("runs_status", "runs", ["status", "seq"])
    with op.batch_alter_table("runs") as table:
        table.drop_column("pending")
