"""Helpers shared by tests: a fresh PostgreSQL database per test, and waiting for an outcome."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
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


def _ephemeral_ports() -> range:
    """The ports the kernel hands out to outgoing connections and to binds of port 0."""
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        low, high = (int(n) for n in text.split())
    except (OSError, ValueError):
        low, high = 32768, 60999  # Linux's default
    return range(low, high + 1)


def free_port() -> int:
    """A loopback TCP port free now, for a server a test starts in another process.

    Taken outside the kernel's ephemeral range: a port that binding port 0 gives back is one
    the next outgoing connection of any process (this one's HTTP and database clients
    included) may take as its own before the server binds it, and then the server cannot
    listen ("address already in use")."""
    ephemeral = _ephemeral_ports()
    for _ in range(200):
        port = random.randrange(20000, 65536)
        if port in ephemeral:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free loopback port outside the ephemeral range")
