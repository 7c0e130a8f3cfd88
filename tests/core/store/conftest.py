"""The conformance suite runs once per backend: every `ApprovalStore` must pass all of it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from nodbot.core import ApprovalRequest, ApprovalStore, MemoryApprovalStore, arguments_digest
from nodbot.core.sqlstore import SqlApprovalStore
from tests.support import postgres_database

BACKENDS = ["memory", "sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]


def ask(call_id: str, amount: float = 500.0, **extra: object) -> ApprovalRequest:
    """A request of run_1 to refund `amount` on order o-7 (`extra`: the request's other
    fields, such as `approvals_required`)."""
    arguments = {"order_id": "o-7", "amount": amount}
    return ApprovalRequest(
        "run_1",
        call_id,
        "refund",
        arguments,
        arguments_digest(arguments),
        **extra,  # type: ignore[arg-type]
    )


@contextlib.asynccontextmanager
async def database_url(backend: str, tmp_path: Path) -> AsyncIterator[str]:
    """A URL of an empty database of `backend` ("sqlite" or "postgresql")."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'nodbot.db'}"
    else:
        async with postgres_database() as url:
            yield url


@pytest.fixture(params=BACKENDS)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ApprovalStore]:
    """A fresh, empty store of each backend."""
    if request.param == "memory":
        yield MemoryApprovalStore()
        return
    async with database_url(request.param, tmp_path) as url:
        sql = SqlApprovalStore(url)
        try:
            yield await sql.open()
        finally:
            await sql.close()


def traced(store: SqlApprovalStore) -> list[str]:
    """The statements a SQLite `store`'s connection sends from now on."""
    sent: list[str] = []
    store._backend._db.set_trace_callback(sent.append)  # type: ignore[union-attr]
    return sent
