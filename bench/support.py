"""What the benchmarks share: loopback checks and throw-away PostgreSQL databases."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import secrets
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

__all__ = ["POSTGRES_VARIABLE", "fresh_postgres", "is_loopback", "postgres_server"]

POSTGRES_VARIABLE = "NODBOT_BENCH_POSTGRES_URL"
_DEFAULT_SERVER = "postgresql://postgres@127.0.0.1:5432/postgres"


def is_loopback(host: str | None) -> bool:
    """Whether `host` names this machine (a loopback address or `localhost`)."""
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def postgres_server() -> str:
    """The PostgreSQL server the benchmarks use: `$NODBOT_BENCH_POSTGRES_URL`, by default
    the local one."""
    return os.environ.get(POSTGRES_VARIABLE, _DEFAULT_SERVER)


@contextlib.asynccontextmanager
async def fresh_postgres(server_url: str) -> AsyncIterator[str | None]:
    """The URL of a new, empty database on `server_url`, dropped at the end even on error;
    None (after saying why) when the server is not on loopback or cannot be reached."""
    import asyncpg

    parts = urlsplit(server_url)
    if not is_loopback(parts.hostname):
        print(f"postgresql: skipped, {parts.hostname!r} is not a loopback address")
        yield None
        return
    try:
        admin = await asyncpg.connect(server_url, timeout=5)
    except (TimeoutError, OSError, asyncpg.PostgresError) as exc:
        print(f"postgresql: unreachable at {parts.hostname}:{parts.port or 5432} ({exc})")
        yield None
        return
    name = f"nodbot_bench_{secrets.token_hex(6)}"
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield urlunsplit(("postgresql", parts.netloc, f"/{name}", "", ""))
        finally:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()
