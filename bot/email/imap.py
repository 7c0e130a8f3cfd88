"""The IMAP door of inbound email: replies are read from a mailbox (`email.inbound.imap`) with
aioimaplib, in the bot's event loop.

The reader signs in, selects `mailbox` and, in a loop, reads every message not yet
processed, oldest first, then waits: with IDLE where the server has it (woken by the server
when mail arrives, and at most every `poll` seconds anyway), else `poll` seconds.

Not yet processed means still in `mailbox` when there is a `processed_mailbox` (each
processed message is moved there: MOVE, else COPY, flag deleted and expunge), or without the
seen flag otherwise (each processed message is flagged seen). A message is fetched with
`BODY.PEEK[]`, which leaves its flags alone, and marked only after `Inbound.ingest` has
returned: a reader stopped in between (a crash, SIGKILL) reads it again after the restart,
and the repeat decides nothing twice (its Message-ID was recorded as processed in the
transaction that recorded what it did, see `inbound`; one stopped before that transaction
committed processes it as new). A message the store could not take (`StoreError`) is left
unmarked and tried again on the next round; one over `limits.EMAIL_BODY` bytes is marked
unread, with a log line; one over a limit of its shape (`reading.parse`: parts, nesting,
header fields) is refused or dropped by `ingest` and marked as any other. A connection that
fails is made again after a backoff (1 s doubling to 60 s), and `/healthz` says so while it
fails.

One message cannot stop the reader: when its processing raises anything else (a bug it
meets), it is quarantined, logged as an error with its UID and Message-ID, and the reader
goes on with the next one. A quarantined message is flagged seen and `$NodbotQuarantined`
where the server keeps keywords (`\\*` in its PERMANENTFLAGS, as Dovecot's), and every
search skips that keyword (`UNKEYWORD $NodbotQuarantined`), so it is not read again, after a
restart either; taking the keyword off has it read again. Elsewhere it is flagged seen and
skipped by this process only.

IMAP is spoken over TLS from the start (`tls: tls`, port 993, RFC 8314) or in plain text on
a trusted network (`tls: none`); STARTTLS is refused by the configuration (the client library
has no STARTTLS).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import ssl
from collections.abc import Callable
from typing import Any

import aioimaplib

from nodbot.bot.config.models import ImapConfig
from nodbot.bot.email.inbound import Inbound
from nodbot.bot.http.limits import EMAIL_BODY
from nodbot.core import StoreError
from nodbot.core.waiting import set_within

__all__ = ["ImapError", "ImapReader"]

log = logging.getLogger(__name__)

IDLE_RENEW = 29 * 60
"""Seconds an IDLE lasts at most (servers end it after 30 minutes, RFC 2177)."""
MAX_BACKOFF = 60.0
QUARANTINED = "$NodbotQuarantined"
"""The keyword of a message whose processing failed (see the module); the reader skips it."""
_SIZE = re.compile(rb"UID (\d+) RFC822\.SIZE (\d+)|RFC822\.SIZE (\d+) UID (\d+)")
_PERMANENT_FLAGS = re.compile(rb"\[PERMANENTFLAGS \(([^)]*)\)\]")


class ImapError(Exception):
    """The mailbox server refused a command or could not be reached; the message says which."""


class ImapReader:
    """Reads replies from one mailbox and ingests each once (see the module)."""

    def __init__(
        self,
        inbound: Inbound,
        config: ImapConfig,
        *,
        on_problem: Callable[[str | None], None] | None = None,
    ) -> None:
        self.inbound = inbound
        self.config = config
        self.on_problem = on_problem
        """Told why the mailbox cannot be read while it cannot, and None once it can."""
        self.processed = 0
        """Messages ingested by this reader (for tests and /metrics)."""
        self.quarantined = 0
        """Messages whose processing failed, set aside by this reader."""
        self._imap: Any = None
        self._keywords = True
        """The server keeps keywords such as `QUARANTINED` (its PERMANENTFLAGS)."""
        self._set_aside: set[int] = set()
        """UIDs quarantined in memory only, where the server keeps no keywords."""

    async def run(self, stop: asyncio.Event) -> None:
        """Read the mailbox until `stop` is set, connecting again after failures."""
        failures = 0
        while not stop.is_set():
            try:
                await self._connect()
                self._problem(None)
                failures = 0
                while not stop.is_set():
                    if await self.read_new() == 0:
                        await self._wait(stop)
                    _keep_cancel()
            except (ImapError, aioimaplib.AioImapException, OSError, TimeoutError) as exc:
                failures += 1
                reason = f"{type(exc).__name__}: {exc}".rstrip(": ")
                self._problem(f"{self.config.host}:{self._port}: {reason}")
                log.warning("email mailbox unreadable", extra={"error": reason})
                await self._disconnect()
                delay = min(MAX_BACKOFF, 2.0 ** (failures - 1))
                await set_within(stop, delay)
            except StoreError as exc:
                # Left unmarked: read again once the store is back.
                log.warning(
                    "email reply not processed: the store failed", extra={"error": str(exc)}
                )
                await self._disconnect()
                await set_within(stop, 1.0)
        await self._disconnect()

    async def read_new(self) -> int:
        """Ingest every message not processed yet, oldest first; how many were (or were
        quarantined). Raises `StoreError` (the message is left for the next round), and
        `ImapError` and the client's errors when the mailbox fails."""
        imap = self._imap
        criteria = ("ALL",) if self.config.processed_mailbox else ("UNSEEN",)
        search = imap.uid_search(*criteria, "UNDELETED", "UNKEYWORD", QUARANTINED, charset=None)
        found = await self._ok(search, "SEARCH")
        uids = sorted(int(uid) for line in found[:-1] for uid in line.split() if uid.isdigit())
        done = 0
        for uid in (uid for uid in uids if uid not in self._set_aside):
            raw = await self._fetch(uid)
            if raw is not None:
                try:
                    outcome = await self.inbound.ingest(raw)
                except StoreError:
                    raise  # left unmarked: read again once the store is back
                except Exception as exc:  # a bug met by this message: the next ones go on
                    await self._quarantine(uid, raw, exc)
                    done += 1
                    continue
                log.info(
                    "email reply read from the mailbox",
                    extra={"uid": uid, "status": outcome.status, "reason": outcome.reason},
                )
            await self._mark(uid)
            self.processed += 1
            done += 1
        return done

    async def _quarantine(self, uid: int, raw: bytes, error: Exception) -> None:
        """Set aside the message `uid`, whose processing raised `error`: flagged seen and
        `QUARANTINED`, or, on a server that keeps no keywords, seen and remembered here."""
        log.error(
            "email message quarantined: processing it failed",
            exc_info=error,
            extra={
                "uid": uid,
                "message_id": self.inbound.message_id_in(raw),
                "error": repr(error)[:500],
            },
        )
        flags = rf"(\Seen {QUARANTINED})" if self._keywords else r"(\Seen)"
        if not self._keywords:
            self._set_aside.add(uid)
        await self._ok(self._imap.uid("store", str(uid), "+FLAGS.SILENT", flags), "STORE")
        self.quarantined += 1

    # --- the connection --------------------------------------------------------------------

    @property
    def _port(self) -> int:
        return self.config.port or (993 if self.config.tls == "tls" else 143)

    async def _connect(self) -> None:
        config = self.config
        timeout = config.timeout
        if config.tls == "tls":
            imap = aioimaplib.IMAP4_SSL(
                config.host, self._port, timeout=timeout, ssl_context=ssl.create_default_context()
            )
        else:
            imap = aioimaplib.IMAP4(config.host, self._port, timeout=timeout)
        self._imap = imap
        await imap.wait_hello_from_server()
        if config.username is not None and config.password is not None:
            await self._ok(imap.login(config.username, config.password.get_secret_value()), "LOGIN")
        selected = await self._ok(imap.select(config.mailbox), f"SELECT {config.mailbox}")
        self._keywords = _keeps_keywords(selected)

    async def _disconnect(self) -> None:
        imap, self._imap = self._imap, None
        if imap is None:
            return
        with contextlib.suppress(Exception):
            if imap.has_pending_idle():
                imap.idle_done()
            async with asyncio.timeout(2):
                await imap.logout()

    async def _wait(self, stop: asyncio.Event) -> None:
        """Until the server says the mailbox changed, `poll` passes, or `stop` is set."""
        imap = self._imap
        poll = self.config.poll
        stopping = asyncio.ensure_future(stop.wait())
        try:
            if not imap.has_capability("IDLE"):
                await asyncio.wait({stopping}, timeout=poll)
                return
            idle = await imap.idle_start(timeout=min(poll, IDLE_RENEW))
            pushed = asyncio.ensure_future(imap.wait_server_push(timeout=poll + 5))
            await asyncio.wait({stopping, pushed}, return_when=asyncio.FIRST_COMPLETED)
            pushed.cancel()
            imap.idle_done()
            async with asyncio.timeout(self.config.timeout):
                await idle
        finally:
            stopping.cancel()

    # --- commands --------------------------------------------------------------------------

    async def _ok(self, command: Any, what: str) -> list[bytes]:
        async with asyncio.timeout(self.config.timeout):
            response = await command
        _keep_cancel()
        if response.result != "OK":
            said = b" ".join(bytes(line) for line in response.lines[-1:]).decode(errors="replace")
            raise ImapError(f"{what} was refused: {said}")
        return [bytes(line) for line in response.lines]

    async def _fetch(self, uid: int) -> bytes | None:
        """The message of `uid`, None when it is too big to read (or gone)."""
        imap = self._imap
        sized = await self._ok(imap.uid("fetch", str(uid), "(RFC822.SIZE)"), "FETCH")
        size = _size(sized)
        if size is None:
            return None  # expunged by someone else meanwhile
        if size > EMAIL_BODY:
            log.warning("email reply too big to read", extra={"uid": uid, "bytes": size})
            return None
        lines = await self._ok(imap.uid("fetch", str(uid), "(BODY.PEEK[])"), "FETCH")
        # [b'N FETCH (UID n BODY[] {size}', literal, b')', b'Fetch completed']
        for index, line in enumerate(lines[:-1]):
            if line.endswith(b"}") and b"BODY[]" in line and index + 1 < len(lines):
                return lines[index + 1]
        return None

    async def _mark(self, uid: int) -> None:
        imap, target = self._imap, self.config.processed_mailbox
        if target is None:
            await self._ok(imap.uid("store", str(uid), "+FLAGS.SILENT", r"(\Seen)"), "STORE")
        elif imap.has_capability("MOVE"):
            await self._ok(imap.uid("move", str(uid), _quoted(target)), f"MOVE to {target}")
        else:
            await self._ok(imap.uid("copy", str(uid), _quoted(target)), f"COPY to {target}")
            flag = imap.uid("store", str(uid), "+FLAGS.SILENT", r"(\Deleted)")
            await self._ok(flag, "STORE")
            if imap.has_capability("UIDPLUS"):
                await self._ok(imap.uid("expunge", str(uid)), "EXPUNGE")
            # Without UIDPLUS the deleted copy stays until the server expunges it; the search
            # skips it (UNDELETED).

    def _problem(self, reason: str | None) -> None:
        if self.on_problem is not None:
            self.on_problem(reason)


def _keep_cancel() -> None:
    """Raise the cancel aioimaplib dropped, if it did. It wraps each command in
    `asyncio.wait_for`, which on Python 3.11 returns an answer that arrives just as the
    reader's task is cancelled and loses the cancel; the task still counts it
    (`Task.cancelling()`, which only an `uncancel` takes back), so a reader that was stopped
    or killed stops at its next command or turn instead of reading on."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def _keeps_keywords(selected: list[bytes]) -> bool:
    """Whether the server keeps new keywords on the selected mailbox's messages: its
    PERMANENTFLAGS has `\\*` (or `QUARANTINED` itself), or it sent none (RFC 3501: then
    every flag is kept)."""
    for line in selected:
        found = _PERMANENT_FLAGS.search(line)
        if found is not None:
            flags = found.group(1).split()
            return b"\\*" in flags or QUARANTINED.encode() in flags
    return True


def _size(lines: list[bytes]) -> int | None:
    for line in lines:
        found = _SIZE.search(line)
        if found is not None:
            return int(found.group(2) or found.group(3))
    return None


def _quoted(mailbox: str) -> str:
    escaped = mailbox.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'
