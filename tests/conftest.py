"""Fixtures shared by every test: the loopback-only network guard and PostgreSQL databases."""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections.abc import AsyncIterator, Iterator
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


class _Unobserved(logging.Handler):
    """Keeps asyncio's reports of tasks that ended in an exception nobody looked at."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.reports: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "exception was never retrieved" in message:
            self.reports.append(f"{message}: {record.__dict__.get('exception', '')!r}")


@pytest.fixture(autouse=True)
def no_unobserved_task_failures() -> Iterator[None]:
    """Fail any test during which asyncio reported a task, or a future, whose exception
    nobody retrieved: a failure of the bot's must be handled, not lost in a task. (Reported
    when the task is collected, which can be after the test that made it: the report names
    the task, whatever test it fails.)"""
    handler = _Unobserved()
    logger = logging.getLogger("asyncio")
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
    assert handler.reports == [], handler.reports


@pytest.fixture
async def postgres_url() -> AsyncIterator[str]:
    """A fresh, empty PostgreSQL database for one test, dropped after it."""
    async with postgres_database() as url:
        yield url
