"""Fixtures shared by every test: the loopback-only network guard and PostgreSQL databases."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.support import postgres_database


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


@pytest.fixture
async def postgres_url() -> AsyncIterator[str]:
    """A fresh, empty PostgreSQL database for one test, dropped after it."""
    async with postgres_database() as url:
        yield url
