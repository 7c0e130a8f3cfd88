"""Helpers shared by tests: a fresh PostgreSQL database per test, and waiting for an outcome."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from urllib.parse import urlsplit, urlunsplit

import pytest

POSTGRES_URL_VARIABLE = "NODBOT_TEST_POSTGRES_URL"


def postgres_server_url() -> str | None:
    """The URL of the test server, or None. Under CI a missing URL is an error, not a skip."""
    url = os.environ.get(POSTGRES_URL_VARIABLE)
    if not url and os.environ.get("CI"):
        pytest.fail(f"CI is set but {POSTGRES_URL_VARIABLE} is not: PostgreSQL tests must run")
    return url or None


@contextlib.asynccontextmanager
async def postgres_database() -> AsyncIterator[str]:
    """Create an empty database on the test server, yield its URL, and drop it after.

    Skips the test (fails it under CI) when no server is configured.
    """
    server = postgres_server_url()
    if server is None:
        pytest.skip(f"PostgreSQL tests need {POSTGRES_URL_VARIABLE} (see docs/development.md)")
    import asyncpg  # only PostgreSQL tests need the driver

    name = f"nodbot_test_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(server)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        yield urlunsplit(urlsplit(server)._replace(path="/" + name))
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


async def eventually(
    check: Callable[[], Awaitable[bool]], what: str, *, within: float = 10.0, every: float = 0.02
) -> None:
    """Until `check()` holds; an `AssertionError` naming `what` after `within` seconds.

    For what happens after the answer to a request (a Slack click is handled after Bolt's
    `ack`, a delivery after the run): wait for that outcome itself, not for a while, and not
    for something that was true before (the record of a click exists before the click).
    """
    deadline = time.monotonic() + within
    while not await check():
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} did not happen within {within} s")
        await asyncio.sleep(every)
