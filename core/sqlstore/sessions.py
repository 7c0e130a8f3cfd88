"""The web inbox's ended sessions in a SQL store (`SqlApprovalStore.sessions`): the
`revocations` table, which every process on the database reads, so that a sign-out holds
after a restart and on every replica.

```python
await store.sessions.revoke_session(session_id, until=expires)      # a sign-out
await store.sessions.revoke_principal("ana@example.com", until=now + ttl)
if await store.sessions.session_revoked(session_id, principal, issued_at): ...
```

The check runs on every request of the inbox: one query on the `revocations_subject` index.
Each write first prunes what has expired (on `revocations_expiry`), so the table holds only
revocations of sessions that could still be used.

A module of its own beside the store, as `audit.py` is, with an engine of its own made on
first use once the store has checked the schema: the store's hot path goes straight to the
drivers (`sqlite.py`, `postgres.py`), which this leaves alone.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import and_, delete, insert, literal, or_, select, true

from nodbot.core.sqlstore.beside import BesideTheStore
from nodbot.core.sqlstore.engine import translate_errors
from nodbot.core.sqlstore.schema import revocations

__all__ = ["SqlSessionRevocations"]

_SESSION = "session"
_PRINCIPAL = "principal"


class SqlSessionRevocations(BesideTheStore):
    """`core.store.SessionRevocations` in the `revocations` table of the database at `url`.

    `ready` opens the store (checking or migrating its schema) before the first use; a write
    waits up to `lock_timeout` seconds for another SQLite writer. Every failure of the
    database is a `StoreUnavailableError`, which the inbox answers by trusting no session.
    """

    async def revoke_session(
        self, session_id: str, *, until: datetime, at: datetime | None = None
    ) -> None:
        await self._insert(_SESSION, session_id, None, until, at or self._clock())

    async def revoke_principal(
        self, principal: str, *, until: datetime, at: datetime | None = None
    ) -> None:
        now = at or self._clock()
        await self._insert(_PRINCIPAL, principal.lower(), now, until, now)

    async def session_revoked(
        self, session_id: str, principal: str, issued_at: datetime | None
    ) -> bool:
        table = revocations.c
        ended_by_principal = true() if issued_at is None else table.issued_before >= issued_at
        query = (
            select(literal(1))
            .where(
                or_(
                    and_(table.kind == _SESSION, table.subject == session_id),
                    and_(
                        table.kind == _PRINCIPAL,
                        table.subject == principal.lower(),
                        ended_by_principal,
                    ),
                )
            )
            .limit(1)
        )
        engine = await self._opened()
        with translate_errors(self._url):
            async with engine.connect() as connection:
                found = await connection.scalar(query)
        return found is not None

    async def _insert(
        self,
        kind: str,
        subject: str,
        issued_before: datetime | None,
        until: datetime,
        now: datetime,
    ) -> None:
        engine = await self._opened()
        row = {
            "kind": kind,
            "subject": subject,
            "issued_before": issued_before,
            "expires_at": until,
            "created_at": now,
        }
        with translate_errors(self._url):
            async with engine.begin() as connection:
                # Pruned here, where it costs one indexed DELETE of the few rows gone stale,
                # rather than by a worker of its own.
                await connection.execute(delete(revocations).where(revocations.c.expires_at <= now))
                await connection.execute(insert(revocations).values(row))
