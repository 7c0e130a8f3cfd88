"""The private Dovecot of tests/fakes/imap.py: mail in and out over real IMAP on 127.0.0.1."""

from __future__ import annotations

import asyncio
import dataclasses
import imaplib
import pathlib
from collections.abc import AsyncIterator

import pytest

from tests.fakes import imap as imap_fake
from tests.fakes.imap import ImapServer, Stored, dovecot

MESSAGE = (
    b"From: Alice <alice@example.com>\r\n"
    b"To: bot@example.com\r\n"
    b"Subject: Approve deploy\r\n"
    b"Message-ID: <1@example.com>\r\n"
    b"\r\n"
    b"approve\r\n"
)


@pytest.fixture
async def imap(tmp_path: pathlib.Path) -> AsyncIterator[ImapServer]:
    async with dovecot(tmp_path) as server:
        yield server


async def test_an_appended_message_reads_back_unchanged_and_unseen(imap: ImapServer) -> None:
    await imap.append(MESSAGE)

    [stored] = await imap.messages()
    assert stored.raw == MESSAGE
    assert stored.flags == frozenset()
    assert (await imap.messages())[0].flags == frozenset()  # reading did not set \Seen
    assert await imap.messages("Processed") == []


async def test_append_keeps_the_flags_given(imap: ImapServer) -> None:
    await imap.append(MESSAGE, flags=["\\Seen"])

    [stored] = await imap.messages()
    assert stored.flags == frozenset({"\\Seen"})


def _move_first_to_processed(server: ImapServer) -> list[str]:
    client = server.connect()
    try:
        status, capabilities = client.capability()
        assert status == "OK"
        status, _ = client.select("INBOX")
        assert status == "OK"
        status, uids = client.uid("SEARCH", "ALL")
        assert status == "OK" and uids[0]
        first = uids[0].split()[0].decode()
        status, _ = client.uid("MOVE", first, "Processed")
        assert status == "OK"
    finally:
        client.logout()
    listed: bytes = capabilities[0]
    return listed.decode().split()


async def test_a_client_moves_a_message_to_processed(imap: ImapServer) -> None:
    await imap.append(MESSAGE)

    capabilities = await asyncio.to_thread(_move_first_to_processed, imap)

    assert {"IDLE", "MOVE"} <= set(capabilities)
    [moved] = await imap.wait_until("Processed", lambda stored: len(stored) == 1)
    assert moved.raw == MESSAGE
    assert await imap.messages("INBOX") == []


def _idle_until_new_mail(server: ImapServer) -> list[bytes]:
    """IDLE in INBOX, append a message from another connection, read until it is announced."""
    client = server.connect()
    try:
        client.sock.settimeout(10)
        status, _ = client.select("INBOX")
        assert status == "OK"
        client.send(b"I1 IDLE\r\n")
        assert client.readline().startswith(b"+ ")
        other = server.connect()
        try:
            status, _ = other.append("INBOX", None, None, MESSAGE)
            assert status == "OK"
        finally:
            other.logout()
        lines = [client.readline()]
        while not lines[-1].endswith(b" EXISTS\r\n"):
            lines.append(client.readline())
        client.send(b"DONE\r\n")
        while not lines[-1].startswith(b"I1 "):
            lines.append(client.readline())
    finally:
        client.logout()
    return lines


async def test_an_idling_client_hears_of_new_mail(imap: ImapServer) -> None:
    lines = await asyncio.to_thread(_idle_until_new_mail, imap)

    assert b"* 1 EXISTS\r\n" in lines
    assert lines[-1].startswith(b"I1 OK")


async def test_a_wrong_password_is_refused(imap: ImapServer) -> None:
    wrong = dataclasses.replace(imap, password="not-the-password")

    with pytest.raises(imaplib.IMAP4.error, match="AUTHENTICATIONFAILED"):
        await asyncio.to_thread(wrong.connect)

    client = await asyncio.to_thread(imap.connect)  # the right one still works
    await asyncio.to_thread(client.logout)


async def test_wait_until_names_what_it_waited_for(imap: ImapServer) -> None:
    def two_messages(stored: list[Stored]) -> bool:
        return len(stored) == 2

    await imap.append(MESSAGE)

    with pytest.raises(TimeoutError, match=r"INBOX: .*two_messages did not hold within 0.2 s"):
        await imap.wait_until("INBOX", two_messages, timeout=0.2)


def test_a_missing_dovecot_skips_but_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")
    monkeypatch.setattr(imap_fake, "DOVECOT_PATHS", ())
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="apt-get install dovecot-imapd"):
        imap_fake.dovecot_binary()

    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI is set but Dovecot is not installed"):
        imap_fake.dovecot_binary()


async def test_each_server_is_private(tmp_path: pathlib.Path) -> None:
    async with (
        dovecot(tmp_path / "one") as one,
        dovecot(tmp_path / "two") as two,
    ):
        await one.append(MESSAGE)

        assert one.port != two.port
        assert len(await one.messages()) == 1
        assert await two.messages() == []
