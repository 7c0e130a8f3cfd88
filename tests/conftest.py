"""Fixtures shared by every test: the loopback-only network guard and PostgreSQL databases."""

from __future__ import annotations

import ipaddress
import os
import socket
import uuid
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

POSTGRES_URL_VARIABLE = "NODBOT_TEST_POSTGRES_URL"


def _is_loopback(address: Any) -> bool:
    if not isinstance(address, tuple) or not address:
        return True  # AF_UNIX paths and the like never leave the machine
    host = address[0]
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False  # a name other than localhost would need a lookup: refuse it


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail any test that tries to reach a host other than this machine."""
    real_connect = socket.socket.connect
    real_connect_ex = socket.socket.connect_ex

    def guard(address: Any) -> None:
        if not _is_loopback(address):
            raise AssertionError(f"test tried to reach a non-loopback address: {address!r}")

    def connect(self: socket.socket, address: Any) -> None:
        guard(address)
        real_connect(self, address)

    def connect_ex(self: socket.socket, address: Any) -> int:
        guard(address)
        return real_connect_ex(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)


def postgres_server_url() -> str | None:
    """The URL of the test server, or None. Under CI a missing URL is an error, not a skip."""
    url = os.environ.get(POSTGRES_URL_VARIABLE)
    if not url and os.environ.get("CI"):
        pytest.fail(f"CI is set but {POSTGRES_URL_VARIABLE} is not: PostgreSQL tests must run")
    return url or None


def _with_database(url: str, database: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + database))


@pytest.fixture
async def postgres_url() -> AsyncIterator[str]:
    """A fresh, empty PostgreSQL database for one test, dropped after it."""
    server = postgres_server_url()
    if server is None:
        pytest.skip(f"PostgreSQL tests need {POSTGRES_URL_VARIABLE} (see README, Tests)")
    import asyncpg  # only PostgreSQL tests need the driver

    name = f"nodbot_test_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(server)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        yield _with_database(server, name)
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
