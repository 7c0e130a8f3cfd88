"""Ended web inbox sessions stay ended: a sign-out, or `nodbot sessions revoke --principal`,
is kept in the store, so it holds after `nodbot serve` restarts (same file, same
`web.secret`) and on every replica over the same store; and a session whose revocations
cannot be checked is not trusted (a 503), never let through.

The store's part runs on memory, SQLite and PostgreSQL; the bot's part on real `nodbot
serve` processes where a restart is involved, and on two in-process bots for the replicas.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sqlite3
import subprocess
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import asyncpg
import httpx
import pytest

from nodbot.bot.config import load_config
from nodbot.bot.serve import serving
from nodbot.bot.web import sign_in_link
from nodbot.core import MemoryApprovalStore, SqlApprovalStore
from tests.bot.processes import nodbot_serve
from tests.bot.test_cli import nodbot
from tests.core.store.conftest import BACKENDS, database_url

if TYPE_CHECKING:
    from nodbot.core.store import SessionRevocations

ROOT = Path(__file__).resolve().parents[2]
SECRET = "web-secret-for-tests-0000"
LEAD = "lead@example.com"
OTHER = "ana@example.com"
SQL_BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)


# --- the store ------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def revocations_of(backend: str, tmp_path: Path) -> AsyncIterator[SessionRevocations]:
    if backend == "memory":
        yield MemoryApprovalStore().sessions
        return
    async with database_url(backend, tmp_path) as url, SqlApprovalStore(url) as store:
        yield store.sessions


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_revoked_session_is_revoked_and_no_other(backend: str, tmp_path: Path) -> None:
    async with revocations_of(backend, tmp_path) as sessions:
        assert not await sessions.session_revoked("s1", LEAD, T0)
        await sessions.revoke_session("s1", until=T0 + 2 * HOUR, at=T0 + HOUR)
        assert await sessions.session_revoked("s1", LEAD, T0)
        assert not await sessions.session_revoked("s2", LEAD, T0)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_revoking_a_principal_ends_its_sessions_issued_until_then(
    backend: str, tmp_path: Path
) -> None:
    async with revocations_of(backend, tmp_path) as sessions:
        await sessions.revoke_principal("Lead@Example.com", until=T0 + 3 * HOUR, at=T0 + HOUR)
        assert await sessions.session_revoked("before", LEAD, T0)
        assert await sessions.session_revoked("at", LEAD, T0 + HOUR)
        assert await sessions.session_revoked("older-cookie", LEAD, None)  # no issue time
        assert not await sessions.session_revoked("after", LEAD, T0 + HOUR + timedelta(0, 1))
        assert not await sessions.session_revoked("someone-else", OTHER, T0)
        assert not await sessions.session_revoked("someone-else", OTHER, None)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_expired_revocations_are_pruned_when_one_is_added(
    backend: str, tmp_path: Path
) -> None:
    async with revocations_of(backend, tmp_path) as sessions:
        await sessions.revoke_session("s1", until=T0 + HOUR, at=T0)
        await sessions.revoke_principal(LEAD, until=T0 + HOUR, at=T0)
        await sessions.revoke_session("s2", until=T0 + 3 * HOUR, at=T0 + 2 * HOUR)
        # Both were past their expiry (the sessions they ended too) when s2 was added.
        assert not await sessions.session_revoked("s1", OTHER, T0)
        assert not await sessions.session_revoked("s3", LEAD, None)
        assert await sessions.session_revoked("s2", OTHER, T0)
    if backend == "sqlite":
        with contextlib.closing(sqlite3.connect(tmp_path / "nodbot.db")) as db:
            assert db.execute("SELECT subject FROM revocations").fetchall() == [("s2",)]


@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_revocations_outlive_the_store_that_made_them(backend: str, tmp_path: Path) -> None:
    async with database_url(backend, tmp_path) as url:
        async with SqlApprovalStore(url) as store:
            await store.sessions.revoke_session("s1", until=T0 + HOUR, at=T0)
        async with SqlApprovalStore(url) as store:
            assert await store.sessions.session_revoked("s1", LEAD, T0)


# --- the bot --------------------------------------------------------------------------------


def write_config(tmp_path: Path, url: str, name: str = "nodbot") -> Path:
    path = tmp_path / f"{name}.yml"
    path.write_text(
        f"""
store: {{url: "{url}"}}
server: {{host: 127.0.0.1, port: 0}}
web:
  secret: {SECRET}
  session_ttl: 2h
"""
    )
    return path


async def sign_in(config: Path, base: str, principal: str) -> str:
    """The session cookie of `principal`, signed in through a link as `nodbot inbox-link`
    makes it, at the bot at `base`."""
    link = sign_in_link(load_config(config), principal, base=base)
    async with httpx.AsyncClient() as browser:
        answer = await browser.get(link)
    assert answer.status_code == 303, answer.text
    return answer.cookies["nodbot_session"]


async def visit(base: str, cookie: str, path: str = "/inbox") -> httpx.Response:
    """`path` at the bot at `base`, with the session cookie `cookie`, as a browser sends it."""
    async with httpx.AsyncClient(base_url=base) as browser:
        return await browser.get(path, headers={"Cookie": f"nodbot_session={cookie}"})


async def sign_out(base: str, cookie: str) -> httpx.Response:
    """Press the inbox's Sign out button."""
    page = await visit(base, cookie)
    assert page.status_code == 200, page.text
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert found, "the inbox has no sign-out form"
    async with httpx.AsyncClient(base_url=base) as browser:
        return await browser.post(
            "/inbox/logout",
            data={"csrf": found.group(1)},
            headers={"Cookie": f"nodbot_session={cookie}"},
        )


def assert_refused(answer: httpx.Response) -> None:
    """The answer to an ended session: sign in again."""
    assert answer.status_code == 401, answer.text
    assert "Please sign in" in answer.text
    assert "signed in as" not in answer.text


async def test_a_sign_out_holds_after_the_bot_restarts(tmp_path: Path) -> None:
    config = write_config(tmp_path, f"sqlite:///{tmp_path / 'nodbot.db'}")
    async with nodbot_serve(config) as bot:
        out = await sign_in(config, bot.url, LEAD)
        kept = await sign_in(config, bot.url, LEAD)
        signed_out = await sign_out(bot.url, out)
        assert signed_out.status_code == 303  # to /inbox/signed-out: a refresh posts nothing
        assert_refused(await visit(bot.url, out))
    async with nodbot_serve(config) as bot:
        assert_refused(await visit(bot.url, out))
        assert (await visit(bot.url, kept)).status_code == 200  # same secret: not signed out


@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_a_sign_out_on_one_replica_holds_on_the_other(backend: str, tmp_path: Path) -> None:
    async with (
        database_url(backend, tmp_path) as url,
        serving(str(write_config(tmp_path, url, "a"))) as a,
        serving(str(write_config(tmp_path, url, "b"))) as b,
    ):
        cookie = await sign_in(tmp_path / "a.yml", a.url, LEAD)
        assert (await visit(b.url, cookie)).status_code == 200
        assert (await sign_out(a.url, cookie)).status_code == 303
        assert_refused(await visit(b.url, cookie))
        assert_refused(await visit(a.url, cookie))


async def revoke(config: Path, principal: str) -> subprocess.CompletedProcess[str]:
    command = [nodbot(), "sessions", "revoke", "--principal", principal, "-c", str(config)]
    return await asyncio.to_thread(
        subprocess.run, command, cwd=ROOT, capture_output=True, text=True, timeout=60
    )


async def test_sessions_revoke_ends_every_session_of_the_principal_only(tmp_path: Path) -> None:
    config = write_config(tmp_path, f"sqlite:///{tmp_path / 'nodbot.db'}")
    async with nodbot_serve(config) as bot:
        leads = [await sign_in(config, bot.url, LEAD) for _ in range(2)]
        other = await sign_in(config, bot.url, OTHER)
        for cookie in [*leads, other]:
            assert (await visit(bot.url, cookie)).status_code == 200

        done = await revoke(config, LEAD.upper())  # a principal in any case
        assert done.returncode == 0, done.stderr
        assert f"ended every web inbox session of {LEAD.upper()}" in done.stdout

        for cookie in leads:
            assert_refused(await visit(bot.url, cookie))
        assert (await visit(bot.url, other)).status_code == 200
        # A new sign-in link still works: only the sessions made until then ended.
        again = await sign_in(config, bot.url, LEAD)
        assert (await visit(bot.url, again)).status_code == 200


def test_sessions_revoke_help_says_what_it_ends() -> None:
    shown = subprocess.run(
        [nodbot(), "sessions", "revoke", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "--principal NAME" in shown and "-c FILE, --config FILE" in shown
    assert "every bot" in " ".join(shown.split())


async def drop_revocations(backend: str, url: str, tmp_path: Path) -> None:
    """Take the revocations away from under the running bot: every other table works."""
    if backend == "sqlite":
        with contextlib.closing(sqlite3.connect(tmp_path / "nodbot.db")) as db:
            db.execute("DROP TABLE IF EXISTS revocations")
            db.commit()
        return
    connection = await asyncpg.connect(url)
    try:
        await connection.execute("DROP TABLE IF EXISTS revocations")
    finally:
        await connection.close()


@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_a_session_that_cannot_be_checked_is_not_trusted(
    backend: str, tmp_path: Path
) -> None:
    async with (
        database_url(backend, tmp_path) as url,
        serving(str(write_config(tmp_path, url))) as bot,
    ):
        cookie = await sign_in(tmp_path / "nodbot.yml", bot.url, LEAD)
        assert (await visit(bot.url, cookie)).status_code == 200
        page = await visit(bot.url, cookie)
        await drop_revocations(backend, url, tmp_path)
        async with httpx.AsyncClient(base_url=bot.url) as browser:
            headers = {"Cookie": f"nodbot_session={cookie}"}
            answers = [
                await browser.get("/inbox", headers=headers),
                await browser.get("/inbox/approvals/apr_x", headers=headers),
                await browser.post(
                    "/inbox/approvals/apr_x/decide", data={"action": "approve"}, headers=headers
                ),
                await browser.post("/inbox/logout", data={"csrf": "x"}, headers=headers),
            ]
        for answer in answers:
            assert answer.status_code == 503, answer.text
            text = " ".join(answer.text.split())
            assert "Inbox unavailable" in text and "Try again shortly." in text
            assert "signed in as" not in text and "set-cookie" not in answer.headers
        assert "signed in as" in page.text  # it was trusted while it could be checked
