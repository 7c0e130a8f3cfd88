"""The test harness itself: the network guard and the per-test PostgreSQL database."""

from __future__ import annotations

import socket

import pytest


def test_network_guard_refuses_non_loopback_hosts() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.1)
        with pytest.raises(AssertionError, match="non-loopback"):
            sock.connect(("192.0.2.1", 80))  # TEST-NET-1: never routable


def test_network_guard_allows_loopback() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        with socket.create_connection(server.getsockname(), timeout=1):
            pass


@pytest.mark.postgres
async def test_postgres_database_is_fresh_per_test(postgres_url: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(postgres_url)
    try:
        tables = await conn.fetchval(
            "select count(*) from information_schema.tables where table_schema = 'public'"
        )
        assert tables == 0
        await conn.execute("create table leftover (id int)")
        database = await conn.fetchval("select current_database()")
    finally:
        await conn.close()
    assert database.startswith("nodbot_test_")
