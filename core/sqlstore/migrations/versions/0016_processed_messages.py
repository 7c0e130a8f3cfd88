"""Processed messages: the Message-ID of every email reply a reviewer acted by, processed
once whatever review it names.

Until now the events were the record (a review's `refused`, `voted` or `decided` event whose
evidence carries the Message-ID), so a copy of a reply aimed at another review was not
recognised. The primary key is the check: the act by a message inserts its id in its own
transaction. The ids already in email events are taken in (the review of the first event of
each), so that a reply processed before the upgrade stays processed; an event whose detail
is not JSON is left out.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-04
"""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from alembic import op

from nodbot.core.sqlstore.schema import UTCDateTime

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

MESSAGE_ID_BYTES = 998


def upgrade() -> None:
    table = op.create_table(
        "processed_messages",
        sa.Column("message_id", sa.String(998), primary_key=True),
        sa.Column("approval_id", sa.String(64), nullable=False),
        sa.Column("at", UTCDateTime, nullable=False),
    )
    events = sa.text(
        "SELECT approval_id, at, detail FROM events WHERE channel = 'email' "
        "AND kind IN ('refused', 'voted', 'decided') AND detail LIKE '%message_id%' "
        "ORDER BY seq"
    ).columns(sa.column("approval_id"), sa.column("at", UTCDateTime), sa.column("detail"))
    rows = op.get_bind().execute(events)
    first: dict[str, dict[str, Any]] = {}
    for approval_id, at, detail in rows:
        message_id = _message_id(detail)
        if message_id is not None and message_id not in first:
            first[message_id] = {"message_id": message_id, "approval_id": approval_id, "at": at}
    if first:
        op.bulk_insert(table, list(first.values()))


def _message_id(detail: str) -> str | None:
    """The Message-ID an event's detail names as its evidence, if any (and short enough)."""
    try:
        evidence = json.loads(detail).get("evidence")
    except (ValueError, AttributeError):
        return None
    found = evidence.get("message_id") if isinstance(evidence, dict) else None
    if not isinstance(found, str) or not found:
        return None
    return found if len(found.encode()) <= MESSAGE_ID_BYTES else None


def downgrade() -> None:
    op.drop_table("processed_messages")
