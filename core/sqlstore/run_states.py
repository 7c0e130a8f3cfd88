"""Hosted agents' states in a SQL store (`SqlApprovalStore.run_states`): the `run_states`
table, one row per run of an agent of another framework (`core.bridges.hosted`).

A module of its own beside the store, as `sessions.py` is, with an engine of its own made on
first use once the store has checked the schema.
"""

from __future__ import annotations

from sqlalchemy import delete, insert, select, update

from nodbot.core.sqlstore.beside import BesideTheStore
from nodbot.core.sqlstore.engine import translate_errors
from nodbot.core.sqlstore.schema import run_states

__all__ = ["SqlRunStates"]


class SqlRunStates(BesideTheStore):
    """`core.bridges.hosted.RunStates` in the `run_states` table of the database at `url`."""

    async def get(self, run_id: str) -> str | None:
        engine = await self._opened()
        query = select(run_states.c.state).where(run_states.c.run_id == run_id)
        with translate_errors(self._url):
            async with engine.connect() as connection:
                found = await connection.scalar(query)
        return None if found is None else str(found)

    async def put(self, run_id: str, state: str) -> None:
        engine = await self._opened()
        now = self._clock()
        table = run_states.c
        with translate_errors(self._url):
            async with engine.begin() as connection:
                changed = await connection.execute(
                    update(run_states)
                    .where(table.run_id == run_id)
                    .values(state=state, updated_at=now)
                )
                if changed.rowcount == 0:
                    row = {"run_id": run_id, "state": state, "updated_at": now}
                    await connection.execute(insert(run_states).values(row))

    async def drop(self, run_id: str) -> None:
        engine = await self._opened()
        with translate_errors(self._url):
            async with engine.begin() as connection:
                await connection.execute(delete(run_states).where(run_states.c.run_id == run_id))
