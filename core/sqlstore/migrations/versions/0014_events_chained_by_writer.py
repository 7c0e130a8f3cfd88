"""PostgreSQL: an event that comes chained (its hash given) is kept as its writer chained it.

The events_chain trigger of 0007 hashed every event of nodbot's sessions on the server: about
60 µs of the server's CPU an event, a fifth of an approval cycle's. nodbot's store now chains
the events of its busiest statements itself, as the SQLite backend always did: it knows the
review's last link from its own last statement, takes the review's advisory lock as the
trigger does, and gives n, prev and hash; a place another writer took meanwhile is refused by
the unique index on (approval_id, n), and the statement is made again with the chain left to
the trigger. The trigger now runs only for rows inserted without a hash (`WHEN`, evaluated
without calling the function), and does for them what it did before. Nothing changes for
SQLite, whose store has always chained its own events.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-03
"""

from __future__ import annotations

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

UNCHAINED_ONLY = """
CREATE TRIGGER events_chain BEFORE INSERT ON events
FOR EACH ROW WHEN (NEW.hash IS NULL) EXECUTE FUNCTION nodbot_events_chain()"""
EVERY_ROW = """
CREATE TRIGGER events_chain BEFORE INSERT ON events
FOR EACH ROW EXECUTE FUNCTION nodbot_events_chain()"""


def _postgresql() -> bool:
    return bool(op.get_bind().dialect.name == "postgresql")


def upgrade() -> None:
    if _postgresql():
        op.execute("DROP TRIGGER events_chain ON events")
        op.execute(UNCHAINED_ONLY)


def downgrade() -> None:
    if _postgresql():
        op.execute("DROP TRIGGER events_chain ON events")
        op.execute(EVERY_ROW)
