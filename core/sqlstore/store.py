"""`SqlApprovalStore`: the `ApprovalStore` on SQLAlchemy, for SQLite files and PostgreSQL.

Every operation is one transaction, and every rule is enforced by the database itself, never
by reading then writing: create-if-absent by a unique index on the active record of a call,
first-decision-wins and consume-once by conditional UPDATEs. Several processes may share the
database. Refused attempts are committed to the events table before the error is raised.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from typing import Any, TypeAlias

from sqlalchemy import Row, case, insert, select, update
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection

from core.calls import new_id
from core.decisions import Decision
from core.errors import (
    ApprovalAlreadyConsumed,
    ApprovalAlreadyDecided,
    ApprovalError,
    ApprovalNotDecided,
    ApprovalNotFound,
)
from core.sqlstore.engine import (
    normalize_url,
    open_engine,
    read_transaction,
    redact,
    translate_errors,
    write_transaction,
)
from core.sqlstore.migrate import ensure_schema
from core.sqlstore.schema import approvals, events
from core.store import (
    CONCURRENT_USE_REASON,
    ApprovalEvent,
    ApprovalRecord,
    ApprovalRequest,
    ApprovalStatus,
    EventKind,
    utc_now,
)
from core.tools import canonical_json

__all__ = ["SqlApprovalStore"]

Clock: TypeAlias = Callable[[], datetime]
_Records: TypeAlias = list[ApprovalRecord]
_Events: TypeAlias = list[ApprovalEvent]

_UNFINISHED = approvals.c.finished_at.is_(None)


class SqlApprovalStore:
    """An `ApprovalStore` in a SQL database.

    `url` is `sqlite:///path.db` (the embedded default), `postgresql://user:pass@host/db`, or
    a bare file path for SQLite. The schema is created or upgraded on first use; with
    `auto_migrate=False` a store refuses a database that is not up to date and names the
    command to run. Errors name the URL without its password.
    """

    def __init__(
        self, url: str | URL, *, auto_migrate: bool = True, clock: Clock = utc_now
    ) -> None:
        self.url = normalize_url(url)
        self.auto_migrate = auto_migrate
        self._clock = clock
        self._engine = open_engine(self.url)
        self._insert = (
            sqlite_insert if self.url.get_backend_name() == "sqlite" else postgresql_insert
        )
        self._ready = False
        self._ready_lock = asyncio.Lock()

    @property
    def display_url(self) -> str:
        """The URL with any password hidden, for logs and errors."""
        return redact(self.url)

    async def open(self) -> SqlApprovalStore:
        """Check the database now (otherwise done on first use); returns the store."""
        await self._ensure_ready()
        return self

    async def close(self) -> None:
        """Close every pooled connection."""
        await self._engine.dispose()

    async def __aenter__(self) -> SqlApprovalStore:
        return await self.open()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def create(self, request: ApprovalRequest) -> ApprovalRecord:
        values = {
            "approval_id": new_id("apr_"),
            "run_id": request.run_id,
            "call_id": request.call_id,
            "tool": request.tool,
            "arguments": canonical_json(request.arguments),
            "digest": request.digest,
            "requested_by": request.requested_by,
            "status": "pending",
            "created_at": self._clock(),
        }
        inserting = (
            self._insert(approvals)
            .values(values)
            .on_conflict_do_nothing(index_elements=["run_id", "call_id"], index_where=_UNFINISHED)
            .returning(*approvals.c)
        )
        active = select(approvals).where(
            approvals.c.run_id == request.run_id,
            approvals.c.call_id == request.call_id,
            _UNFINISHED,
        )
        while True:
            async with self._write() as connection:
                row = (await connection.execute(inserting)).first()
                if row is not None:
                    await self._log(connection, row.approval_id, "created", request.requested_by)
                else:
                    row = (await connection.execute(active)).first()
            if row is not None:
                return _record(row)
            # The active record finished between our insert and select (PostgreSQL only,
            # where the two see different snapshots): the next insert will succeed.

    async def get(self, approval_id: str) -> ApprovalRecord:
        async with self._read() as connection:
            row = await _select_one(connection, approval_id)
        if row is None:
            raise ApprovalNotFound(approval_id=approval_id)
        return _record(row)

    async def find(self, run_id: str, call_id: str) -> ApprovalRecord | None:
        query = (
            select(approvals)
            .where(approvals.c.run_id == run_id, approvals.c.call_id == call_id)
            .order_by(approvals.c.seq.desc())
            .limit(1)
        )
        async with self._read() as connection:
            row = (await connection.execute(query)).first()
        return None if row is None else _record(row)

    async def list(
        self,
        *,
        run_id: str | None = None,
        status: ApprovalStatus | None = None,
        limit: int | None = None,
    ) -> _Records:
        query = select(approvals).order_by(approvals.c.seq)
        if run_id is not None:
            query = query.where(approvals.c.run_id == run_id)
        if status is not None:
            query = query.where(approvals.c.status == status)
        if limit is not None:
            query = query.limit(limit)
        async with self._read() as connection:
            rows = (await connection.execute(query)).all()
        return [_record(row) for row in rows]

    async def decide(
        self, approval_id: str, decision: Decision, *, channel: str | None = None
    ) -> ApprovalRecord:
        status = "approved" if decision.approved else "denied"
        deciding = (
            update(approvals)
            .where(approvals.c.approval_id == approval_id, approvals.c.decision.is_(None))
            .values(decision=decision.model_dump_json(), status=status, decided_at=self._clock())
            .returning(*approvals.c)
        )
        async with self._write() as connection:
            row = (await connection.execute(deciding)).first()
            if row is not None:
                detail = {"status": status}
                await self._log(
                    connection, approval_id, "decided", decision.decided_by, channel, detail
                )
                return _record(row)
            existing = await _select_one(connection, approval_id)
            if existing is not None:
                reason = {"reason": "already decided"}
                await self._log(
                    connection, approval_id, "refused", decision.decided_by, channel, reason
                )
        if existing is None:
            raise ApprovalNotFound(approval_id=approval_id)
        earlier = _record(existing).decision
        raise ApprovalAlreadyDecided(
            approval_id=approval_id, decided_by=earlier.decided_by if earlier else None
        )

    async def consume(self, approval_id: str, *, actor: str | None = None) -> ApprovalRecord:
        now = self._clock()
        denied = approvals.c.status == "denied"
        consuming = (
            update(approvals)
            .where(
                approvals.c.approval_id == approval_id,
                approvals.c.decided_at.is_not(None),
                approvals.c.consumed_at.is_(None),
            )
            # A denial runs nothing, so it is finished the moment it is taken.
            .values(
                consumed_at=now,
                finished_at=case((denied, now), else_=None),
                outcome=case((denied, "denied"), else_=None),
            )
            .returning(*approvals.c)
        )
        async with self._write() as connection:
            row = (await connection.execute(consuming)).first()
            if row is not None:
                await self._log(connection, approval_id, "consumed", actor, "executor")
                if row.status == "denied":
                    await self._log(
                        connection, approval_id, "finished", None, "executor", {"outcome": "denied"}
                    )
                return _record(row)
            existing = await _select_one(connection, approval_id)
            if existing is not None:
                reason = "not decided" if existing.decided_at is None else CONCURRENT_USE_REASON
                await self._log(
                    connection, approval_id, "refused", actor, "executor", {"reason": reason}
                )
        if existing is None:
            raise ApprovalNotFound(approval_id=approval_id)
        if existing.decided_at is None:
            raise ApprovalNotDecided(approval_id=approval_id)
        raise ApprovalAlreadyConsumed(approval_id=approval_id)

    async def finish(self, approval_id: str, *, outcome: str) -> ApprovalRecord:
        finishing = (
            update(approvals)
            .where(
                approvals.c.approval_id == approval_id,
                approvals.c.consumed_at.is_not(None),
                _UNFINISHED,
            )
            .values(finished_at=self._clock(), outcome=outcome)
            .returning(*approvals.c)
        )
        async with self._write() as connection:
            row = (await connection.execute(finishing)).first()
            if row is not None:
                await self._log(
                    connection, approval_id, "finished", None, "executor", {"outcome": outcome}
                )
                return _record(row)
            existing = await _select_one(connection, approval_id)
        if existing is None:
            raise ApprovalNotFound(approval_id=approval_id)
        if existing.finished_at is not None:
            return _record(existing)  # finishing twice changes nothing
        raise ApprovalError(
            f"approval {approval_id} cannot finish: no call has consumed it",
            approval_id=approval_id,
        )

    async def events(self, approval_id: str | None = None) -> _Events:
        query = select(events).order_by(events.c.seq)
        if approval_id is not None:
            query = query.where(events.c.approval_id == approval_id)
        async with self._read() as connection:
            rows = (await connection.execute(query)).all()
        return [
            ApprovalEvent(
                seq=row.seq,
                approval_id=row.approval_id,
                kind=row.kind,
                at=row.at,
                actor=row.actor,
                channel=row.channel,
                detail=json.loads(row.detail),
            )
            for row in rows
        ]

    async def _ensure_ready(self) -> None:
        if self._ready:
            return
        async with self._ready_lock:
            if not self._ready:
                await ensure_schema(self._engine, self.url, auto_migrate=self.auto_migrate)
                self._ready = True

    @contextlib.asynccontextmanager
    async def _write(self) -> AsyncIterator[AsyncConnection]:
        await self._ensure_ready()
        with translate_errors(self.url):
            async with write_transaction(self._engine) as connection:
                yield connection

    @contextlib.asynccontextmanager
    async def _read(self) -> AsyncIterator[AsyncConnection]:
        await self._ensure_ready()
        with translate_errors(self.url):
            async with read_transaction(self._engine) as connection:
                yield connection

    async def _log(
        self,
        connection: AsyncConnection,
        approval_id: str,
        kind: EventKind,
        actor: str | None = None,
        channel: str | None = None,
        detail: dict[str, Any] | None = None,
    ) -> None:
        await connection.execute(
            insert(events).values(
                approval_id=approval_id,
                kind=kind,
                at=self._clock(),
                actor=actor,
                channel=channel,
                detail=canonical_json(detail or {}),
            )
        )


async def _select_one(connection: AsyncConnection, approval_id: str) -> Row[Any] | None:
    query = select(approvals).where(approvals.c.approval_id == approval_id)
    return (await connection.execute(query)).first()


def _record(row: Row[Any]) -> ApprovalRecord:
    return ApprovalRecord(
        approval_id=row.approval_id,
        request=ApprovalRequest(
            run_id=row.run_id,
            call_id=row.call_id,
            tool=row.tool,
            arguments=json.loads(row.arguments),
            digest=row.digest,
            requested_by=row.requested_by,
        ),
        created_at=row.created_at,
        decision=None if row.decision is None else Decision.model_validate_json(row.decision),
        decided_at=row.decided_at,
        consumed_at=row.consumed_at,
        finished_at=row.finished_at,
        outcome=row.outcome,
    )
