"""The SMTP / LMTP door of inbound email: the bot listens on `email.inbound.listen` for a mail
server to hand it replies (a Postfix `transport` to `lmtp:inet:127.0.0.1:2525`, say), with
aiosmtpd in the bot's own event loop.

Only mail for the `reply_to` mailbox is taken: a recipient of any other address is refused at
RCPT (550), so the listener is never a relay. A message is answered only once it has been
processed: 250 once `Inbound.ingest` has decided it, refused it or dropped it (each of those
is final, and a repeat of it decides nothing), 451 when the store could not be used, so the
mail server keeps the message and tries again later: nothing accepted is lost. Messages are
at most `limits.EMAIL_BODY` bytes (552 otherwise). One over a limit of its shape (more than
`limits.EMAIL_PARTS` MIME parts, nested deeper than `EMAIL_DEPTH`, too many header fields:
`reading.parse`) is answered `550 5.3.4` and the limit, once `ingest` has refused it (and
answered its verified reviewer) or dropped it. A message whose processing raises anything
else (a bug) gets 451 too, and a log line with its Message-ID: it is not acknowledged, since
it may be a genuine decision, and the mail server's retries end in a bounce to its sender.
In LMTP each accepted recipient gets its own status line, as RFC 2033 asks.

aiosmtpd reads DATA line by line in the event loop, holding it for as long as the bytes of
one read of the socket last: each connection's kernel receive buffer is kept at
`RECEIVE_BUFFER` bytes, so that one read of a message of short lines holds the loop for a few
ms (a 25,000-part message, 879 KB, held it for 100 ms at a time with Linux's default). The
smaller TCP window costs nothing worth noting between a mail server and the bot on one
network.
"""

from __future__ import annotations

import asyncio
import logging
import socket

from aiosmtpd.lmtp import LMTP
from aiosmtpd.smtp import SMTP, Envelope, Session

from nodbot.bot.config.models import InboundConfig
from nodbot.bot.email.inbound import Inbound
from nodbot.bot.http.limits import EMAIL_BODY
from nodbot.core import StoreError

__all__ = ["MailListener"]

log = logging.getLogger(__name__)

RECEIVE_BUFFER = 32 * 1024
"""Bytes the kernel buffers for one connection to the listener (it doubles them, for its own
bookkeeping): each read of the socket is at most that much (see the module)."""


class MailListener:
    """Listens for replies handed over by SMTP or LMTP and ingests each (see the module)."""

    def __init__(self, inbound: Inbound, config: InboundConfig) -> None:
        if config.listen is None:
            raise ValueError("email.inbound.listen is not set")
        host, _, port = config.listen.rpartition(":")
        self.host = host.strip("[]")
        self.port = int(port)
        self.protocol = config.protocol
        self.inbound = inbound
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        """Listen (port 0 picks a free one: see `bound_port`). Raises `OSError` naming the
        address and the setting it came from."""
        loop = asyncio.get_running_loop()
        kind = LMTP if self.protocol == "lmtp" else SMTP
        handler = _Handler(self.inbound, lmtp=self.protocol == "lmtp")

        def session() -> SMTP:
            return kind(
                handler,
                data_size_limit=EMAIL_BODY,
                hostname="nodbot",
                ident="nodbot",
                timeout=60,
                enable_SMTPUTF8=True,
            )

        try:
            self._server = await loop.create_server(session, self.host, self.port)
            for sock in self._server.sockets:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
        except OSError as exc:
            raise OSError(
                exc.errno,
                f"email.inbound.listen {self.host}:{self.port} cannot be listened on: "
                f"{exc.strerror or exc}",
            ) from None
        log.info(
            "email listener started",
            extra={"protocol": self.protocol, "listen": f"{self.host}:{self.bound_port}"},
        )

    @property
    def serving(self) -> bool:
        """Whether it listens now (`nodbot serve` listens again when it stops)."""
        return self._server is not None and self._server.is_serving()

    @property
    def bound_port(self) -> int:
        assert self._server is not None, "not started"
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None


class _Handler:
    """aiosmtpd's hooks: who may be mailed, and what becomes of each message."""

    def __init__(self, inbound: Inbound, *, lmtp: bool) -> None:
        self.inbound = inbound
        self.lmtp = lmtp

    async def handle_RCPT(
        self,
        server: SMTP,
        session: Session,
        envelope: Envelope,
        address: str,
        rcpt_options: list[str],
    ) -> str:
        if not self.inbound.is_reply_address(address):
            return "550 5.1.1 this server takes replies to nodbot's reviews only"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        raw = envelope.original_content or envelope.content
        assert isinstance(raw, bytes)  # decode_data is off
        try:
            outcome = await self.inbound.ingest(raw, recipients=list(envelope.rcpt_tos))
        except StoreError as exc:
            log.warning("email reply not processed: the store failed", extra={"error": str(exc)})
            status = "451 4.3.0 the store is unavailable; try again later"
        except Exception:  # the message is the mail server's to keep: say try again
            log.exception(
                "email reply not processed", extra={"message_id": self.inbound.message_id_in(raw)}
            )
            status = "451 4.3.0 the message could not be processed; try again later"
        else:
            if outcome.too_complex is not None:
                status = f"550 5.3.4 {outcome.too_complex}"
            else:
                status = f"250 2.0.0 {outcome.status}"
        if self.lmtp:
            return "\r\n".join([status] * max(1, len(envelope.rcpt_tos)))
        return status

    async def handle_exception(self, error: Exception) -> str:
        log.warning("email listener session failed", extra={"error": repr(error)})
        return "421 4.3.0 closing: an error occurred"
