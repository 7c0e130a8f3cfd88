"""Remembered approvals in a SQL store (`SqlApprovalStore.remembered`): the `remembered`
table, read by every process on the database (`core.remembered`).

A module of its own beside the store, as `sessions.py` is, with an engine of its own made on
first use once the store has checked the schema.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Row, insert, select, update

from nodbot.core.remembered import RememberedApproval, RememberedNotFound
from nodbot.core.sqlstore.beside import BesideTheStore
from nodbot.core.sqlstore.engine import translate_errors
from nodbot.core.sqlstore.schema import remembered
from nodbot.core.tools import canonical_json

__all__ = ["SqlRememberedApprovals"]


class SqlRememberedApprovals(BesideTheStore):
    """`core.remembered.RememberedApprovals` in the `remembered` table of the database at
    `url`; `ready` opens the store (checking or migrating its schema) before the first use.
    Every failure of the database is a `StoreUnavailableError`: the rules then ask a
    reviewer, as if nothing were remembered."""

    async def remember(
        self,
        *,
        scope: str,
        tool: str,
        arguments: Mapping[str, Any],
        rule: str,
        decided_by: str,
        person: str | None,
        approval_id: str,
        until: datetime,
    ) -> RememberedApproval:
        kept = RememberedApproval.new(
            scope=scope,
            tool=tool,
            arguments=arguments,
            rule=rule,
            decided_by=decided_by,
            person=person,
            approval_id=approval_id,
            created_at=self._clock(),
            until=until,
        )
        row = {
            "remember_id": kept.remember_id,
            "scope": scope,
            "tool": tool,
            "arguments": canonical_json(kept.arguments),
            "rule": rule,
            "decided_by": decided_by,
            "person": person,
            "approval_id": approval_id,
            "created_at": kept.created_at,
            "expires_at": until,
        }
        engine = await self._opened()
        with translate_errors(self._url):
            async with engine.begin() as connection:
                await connection.execute(insert(remembered).values(row))
        return kept

    async def find(self, scope: str) -> RememberedApproval | None:
        table = remembered.c
        query = (
            select(remembered)
            .where(table.scope == scope, table.expires_at > self._clock())
            .where(table.forgotten_at.is_(None))
            .order_by(table.created_at.desc())
            .limit(1)
        )
        rows = await self._rows(query)
        return _record(rows[0]) if rows else None

    async def list(self, *, live: bool = True) -> Sequence[RememberedApproval]:
        table = remembered.c
        query = select(remembered).order_by(table.created_at.desc())
        if live:
            query = query.where(table.expires_at > self._clock(), table.forgotten_at.is_(None))
        return [_record(row) for row in await self._rows(query)]

    async def forget(self, remember_id: str, *, by: str | None = None) -> RememberedApproval:
        table = remembered.c
        engine = await self._opened()
        with translate_errors(self._url):
            async with engine.begin() as connection:
                await connection.execute(
                    update(remembered)
                    .where(table.remember_id == remember_id, table.forgotten_at.is_(None))
                    .values(forgotten_at=self._clock(), forgotten_by=by)
                )
                found = (
                    await connection.execute(
                        select(remembered).where(table.remember_id == remember_id)
                    )
                ).first()
        if found is None:
            raise RememberedNotFound(remember_id)
        return _record(found)


def _record(row: Row[Any]) -> RememberedApproval:
    values = row._mapping
    return RememberedApproval(
        remember_id=values["remember_id"],
        scope=values["scope"],
        tool=values["tool"],
        arguments=json.loads(values["arguments"]),
        rule=values["rule"],
        decided_by=values["decided_by"],
        person=values["person"],
        approval_id=values["approval_id"],
        created_at=values["created_at"],
        expires_at=values["expires_at"],
        forgotten_at=values["forgotten_at"],
        forgotten_by=values["forgotten_by"],
    )
