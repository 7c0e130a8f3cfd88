"""The deadline index holds only the pending reviews that have a deadline.

Before, every pending review was in `approvals_deadline`, its deadline NULL when it had none:
each review made without one wrote an entry there on creation and removed it on its
decision, for a timer that never looks at it (`expire_due` asks for `deadline <= now`, which
a NULL never is, and which implies `deadline IS NOT NULL`, so the index still serves it).

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

TIMED = sa.text("status = 'pending' AND deadline IS NOT NULL")
PENDING = sa.text("status = 'pending'")


def upgrade() -> None:
    op.drop_index("approvals_deadline", "approvals")
    op.create_index(
        "approvals_deadline", "approvals", ["deadline"], sqlite_where=TIMED, postgresql_where=TIMED
    )


def downgrade() -> None:
    op.drop_index("approvals_deadline", "approvals")
    op.create_index(
        "approvals_deadline",
        "approvals",
        ["deadline"],
        sqlite_where=PENDING,
        postgresql_where=PENDING,
    )
