"""Delegations in a SQL store (`SqlApprovalStore.delegations`): the `delegations` table, read
by every process on the database (`core.delegations`).

A module of its own beside the store, as `remembered.py` is, with an engine of its own made
on first use once the store has checked the schema.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from datetime import datetime
from typing import Any

from sqlalchemy import Row, insert, or_, select, update

from nodbot.core.delegations import Delegation, DelegationNotFound
from nodbot.core.sqlstore.beside import BesideTheStore
from nodbot.core.sqlstore.engine import translate_errors
from nodbot.core.sqlstore.schema import delegations

__all__ = ["SqlDelegations"]


class SqlDelegations(BesideTheStore):
    """`core.delegations.Delegations` in the `delegations` table of the database at `url`;
    `ready` opens the store (checking or migrating its schema) before the first use. Every
    failure of the database is a `StoreUnavailableError`: a delegate then may not decide
    (the caller fails closed)."""

    async def add(
        self,
        *,
        delegator: str,
        delegate: str,
        since: datetime,
        until: datetime,
        reason: str | None = None,
        created_by: str | None = None,
    ) -> Delegation:
        kept = Delegation.made(
            delegator=delegator,
            delegate=delegate,
            since=since,
            until=until,
            reason=reason,
            created_by=created_by,
            at=self._clock(),
        )
        row = asdict(kept)  # the table's columns are the record's fields
        engine = await self._opened()
        with translate_errors(self._url):
            async with engine.begin() as connection:
                await connection.execute(insert(delegations).values(row))
        return kept

    async def live(self, at: datetime) -> Sequence[Delegation]:
        table = delegations.c
        query = (
            select(delegations)
            .where(table.since <= at, table.until > at)
            .where(or_(table.ended_at.is_(None), table.ended_at > at))
            .order_by(table.created_at, table.delegation_id)
        )
        return [_record(row) for row in await self._rows(query)]

    async def list(self, *, live: bool = True) -> Sequence[Delegation]:
        table = delegations.c
        query = select(delegations).order_by(table.created_at.desc(), table.delegation_id.desc())
        if live:
            query = query.where(table.until > self._clock(), table.ended_at.is_(None))
        return [_record(row) for row in await self._rows(query)]

    async def end(self, delegation_id: str, *, by: str | None = None) -> Delegation:
        table = delegations.c
        engine = await self._opened()
        with translate_errors(self._url):
            async with engine.begin() as connection:
                await connection.execute(
                    update(delegations)
                    .where(table.delegation_id == delegation_id, table.ended_at.is_(None))
                    .values(ended_at=self._clock(), ended_by=by)
                )
                found = (
                    await connection.execute(
                        select(delegations).where(table.delegation_id == delegation_id)
                    )
                ).first()
        if found is None:
            raise DelegationNotFound(delegation_id)
        return _record(found)


def _record(row: Row[Any]) -> Delegation:
    return Delegation(**row._mapping)
