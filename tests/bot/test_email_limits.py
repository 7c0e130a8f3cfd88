"""One hostile email can neither stop a mailbox nor hold the event loop: a message over a
limit of its shape (`reading.parse`: MIME parts, nesting, header fields) is parsed no further
than the limit and refused or dropped through every door; a message whose processing fails
is quarantined by the IMAP reader, which goes on.

Real parts only: a real Dovecot (`tests/fakes/imap.py`), the bot's SMTP listener over
loopback, its HTTP API. The one stand-in is `FailingInbound`, a fault injector.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import smtplib
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from email import message_from_bytes
from email.message import EmailMessage
from email.policy import SMTP
from email.utils import make_msgid
from pathlib import Path
from typing import Any

import httpx
import pytest

from nodbot.bot.config.models import ImapConfig
from nodbot.bot.email.imap import QUARANTINED, ImapReader
from nodbot.bot.email.inbound import Inbound, Outcome
from nodbot.bot.email.reading import MessageTooComplex, parse, parse_head
from nodbot.bot.http.limits import (
    EMAIL_DEPTH,
    EMAIL_HEADER_BYTES,
    EMAIL_HEADER_COMMENTS,
    EMAIL_HEADERS,
    EMAIL_PARTS,
)
from tests.bot.test_email_imap import reading
from tests.bot.test_email_inbound import WEB_SECRET, Bot, email_bot, reply
from tests.bot.test_email_listener import listening, lmtp
from tests.fakes.imap import Stored, dovecot, dovecot_binary
from tests.support import eventually

ROOT = Path(__file__).resolve().parents[2]
DEEP = 3000
WIDE = 25_000
REFUSAL_CPU = 0.1
"""Seconds of CPU a refusal may take at most (about 20 ms measured for 25,000 parts, 5 ms
for 3,000 levels; the parse of either took 4 s, or raised RecursionError, before)."""
HEALTHZ_WITHIN = 0.1


@pytest.fixture(autouse=True)
def _in_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)


# --- hostile messages ---------------------------------------------------------------------------


def shaped(request: EmailMessage, *, sender: str, kind: str, message_id: str) -> bytes:
    """A reply to `request` as `reply` writes it (authenticated, threaded, its token in To),
    its body replaced by a hostile one: `deep`, 3,000 nested multiparts with "approve" at
    the bottom, or `wide`, 25,000 parts (about 879 KB) the first of which says "approve"."""
    written = message_from_bytes(reply(request, sender=sender, message_id=message_id), policy=SMTP)
    for name in ("Content-Type", "Content-Transfer-Encoding"):
        del written[name]
    head = "".join(f"{name}: {value}\r\n" for name, value in written.items()).encode()
    if kind == "deep":
        opening = b"".join(
            b"Content-Type: multipart/mixed; boundary=b%d\r\n\r\n--b%d\r\n" % (i, i)
            for i in range(DEEP)
        )
        closing = b"".join(b"\r\n--b%d--\r\n" % i for i in reversed(range(DEEP)))
        return head + opening + b"Content-Type: text/plain\r\n\r\napprove\r\n" + closing
    assert kind == "wide"
    first = b"--b\r\nContent-Type: text/plain\r\n\r\napprove\r\n"
    rest = b"--b\r\nContent-Type: text/plain\r\n\r\nx\r\n" * (WIDE - 1)
    return head + b"Content-Type: multipart/mixed; boundary=b\r\n\r\n" + first + rest + b"--b--\r\n"


def flooded(request: EmailMessage, *, sender: str, message_id: str) -> bytes:
    """A reply to `request` whose own header fields are far over `EMAIL_HEADERS`."""
    raw = reply(request, sender=sender, message_id=message_id)
    return b"X-Filler: y\r\n" * 60_000 + raw


def nested(levels: int) -> bytes:
    """A plain message whose MIME parts nest `levels` deep below it."""
    opening = b"".join(
        b"Content-Type: multipart/mixed; boundary=n%d\r\n\r\n--n%d\r\n" % (i, i)
        for i in range(levels)
    )
    closing = b"".join(b"\r\n--n%d--\r\n" % i for i in reversed(range(levels)))
    head = b"From: ana@example.com\r\nMessage-ID: <n@example.com>\r\n"
    return head + opening + b"Content-Type: text/plain\r\n\r\napprove\r\n" + closing


def parts(count: int) -> bytes:
    """A plain multipart message of `count` MIME parts, itself included."""
    body = b"--p\r\nContent-Type: text/plain\r\n\r\nx\r\n" * (count - 1)
    head = b"From: ana@example.com\r\nContent-Type: multipart/mixed; boundary=p\r\n\r\n"
    return head + body + b"--p--\r\n"


def refusal(raw: bytes) -> tuple[MessageTooComplex, float]:
    """Why `parse` refuses `raw`, and the CPU seconds it took (this thread's)."""
    started = time.thread_time()
    with pytest.raises(MessageTooComplex) as refused:
        parse(raw)
    return refused.value, time.thread_time() - started


def answers_to(bot: Bot, message_id: str) -> list[EmailMessage]:
    """The bot's answers so far to the message `message_id`."""
    return [r.message for r in bot.mail.received if r.message["In-Reply-To"] == message_id]


def holds(check: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    """`check` as `eventually` takes it."""

    async def checked() -> bool:
        return check()

    return checked


def refusals(approval: dict[str, Any], reason: str) -> list[dict[str, Any]]:
    """The `refused` events of `approval` whose reason contains `reason`."""
    return [
        e for e in approval["events"] if e["kind"] == "refused" and reason in e["detail"]["reason"]
    ]


# --- the limits, as the parser meets them -------------------------------------------------------


def test_a_message_over_a_limit_is_refused_while_it_is_parsed_and_fast() -> None:
    request = EmailMessage()
    request["Reply-To"], request["Subject"] = "approvals+x@example.com", "Review"
    request["Message-ID"] = "<r@example.com>"
    request.set_content("-- reply above this line --\nsend_note\n")
    wide = shaped(request, sender="ana@example.com", kind="wide", message_id="<w@example.com>")
    deep = shaped(request, sender="ana@example.com", kind="deep", message_id="<d@example.com>")
    assert 870 * 1024 < len(wide) < 890 * 1024
    refused, spent = refusal(wide)
    assert refused.reason == f"the message has more than {EMAIL_PARTS} MIME parts"
    assert not refused.head and spent < REFUSAL_CPU, spent
    refused, spent = refusal(deep)
    assert refused.reason == f"the message's MIME parts nest more than {EMAIL_DEPTH} levels deep"
    assert not refused.head and spent < REFUSAL_CPU, spent
    # Its own header fields are still read, in a moment.
    for raw in (wide, deep):
        started = time.thread_time()
        head = parse_head(raw)
        assert time.thread_time() - started < REFUSAL_CPU
        assert str(head["From"]) == "Someone <ana@example.com>"
        assert str(head["To"]) == "approvals+x@example.com"


def test_messages_at_the_limits_parse_and_one_past_them_does_not() -> None:
    assert len(list(parse(parts(EMAIL_PARTS)).iter_parts())) == EMAIL_PARTS - 1
    assert "MIME parts" in refusal(parts(EMAIL_PARTS + 1))[0].reason
    assert parse(nested(EMAIL_DEPTH)).get_body(("plain",)) is not None
    assert "nest more than" in refusal(nested(EMAIL_DEPTH + 1))[0].reason


@pytest.mark.parametrize(
    ("head", "why"),
    [
        (b"X-Filler: y\r\n" * (EMAIL_HEADERS + 1), f"more than {EMAIL_HEADERS} header fields"),
        # 40,000 addresses took 10 s of CPU to read; a few hundred nested comments raised
        # RecursionError when the From field was read.
        (b"To: " + b"u@example.com, " * 60_000 + b"\r\n", f"over {EMAIL_HEADER_BYTES // 1024} KB"),
        (
            b"From: " + b"(" * 3000 + b")" * 3000 + b" <a@b.c>\r\n",
            f"{EMAIL_HEADER_COMMENTS} comments",
        ),
    ],
)
def test_header_fields_over_a_limit_are_refused_before_they_are_read(head: bytes, why: str) -> None:
    raw = head + b"Message-ID: <h@example.com>\r\n\r\napprove\r\n"
    for read in (parse, parse_head):
        started = time.thread_time()
        with pytest.raises(MessageTooComplex) as refused:
            read(raw)
        assert why in refused.value.reason and refused.value.head
        assert time.thread_time() - started < REFUSAL_CPU


def test_fields_the_bot_never_parses_count_only_as_fields() -> None:
    raw = b"X-Note: " + b"(x) " * 20_000 + b"\r\nFrom: ana@example.com\r\n\r\napprove\r\n"
    assert len(raw) > 4 * EMAIL_HEADER_BYTES
    assert str(parse(raw)["From"]) == "ana@example.com"


# --- POST /email/inbound --------------------------------------------------------------------------


@pytest.fixture
async def bot(tmp_path: Path) -> AsyncIterator[Bot]:
    async with email_bot(tmp_path) as running:
        yield running


async def test_posting_the_deep_message_is_refused_with_202_and_answered_once(bot: Bot) -> None:
    approval_id, emailed = await bot.pending()
    request = emailed["ana@example.com"]
    message_id = make_msgid(domain="mail.example.com")
    deep = shaped(request, sender="ana@example.com", kind="deep", message_id=message_id)
    answer = await bot.post(deep)
    assert answer.status_code == 202, answer.text
    outcome = answer.json()
    why = f"the message's MIME parts nest more than {EMAIL_DEPTH} levels deep"
    assert outcome == {
        "status": "refused",
        "reason": why,
        "approval_id": approval_id,
        "message_id": message_id,
        "answered": True,
    }
    # Processed once: the same message again is refused as such, and not answered.
    again = (await bot.post(deep)).json()
    assert again["status"] == "refused" and "processed already" in again["reason"]
    assert again["answered"] is False
    approval = await bot.approval(approval_id)
    assert approval["status"] == "pending"
    [event] = refusals(approval, why)
    assert event["detail"]["evidence"]["message_id"] == message_id
    await bot.mail.wait_for(lambda: bool(answers_to(bot, message_id)))
    [sent] = answers_to(bot, message_id)
    assert sent["To"] == "ana@example.com" and why in sent.get_content()
    # A stranger's (the same token, not theirs): refused, recorded, unanswered.
    forged = shaped(request, sender="mallory@evil.example", kind="wide", message_id="<f@evil>")
    answer = await bot.post(forged)
    assert answer.status_code == 202, answer.text
    assert answer.json()["status"] == "refused" and answer.json()["answered"] is False
    # The real reply still decides.
    decided = await bot.post(reply(request, sender="ana@example.com"))
    assert decided.json()["status"] == "decided"
    assert (answers_to(bot, "<f@evil>")) == []


async def test_posting_a_header_flood_drops_it_with_202(
    bot: Bot, caplog: pytest.LogCaptureFixture
) -> None:
    approval_id, emailed = await bot.pending()
    raw = flooded(emailed["ana@example.com"], sender="ana@example.com", message_id="<h@x.y>")
    with caplog.at_level(logging.WARNING, logger="nodbot.bot.email.inbound"):
        answer = await bot.post(raw)
    assert answer.status_code == 202, answer.text
    outcome = answer.json()
    assert outcome["status"] == "dropped" and outcome["answered"] is False
    assert outcome["reason"] == f"the message has more than {EMAIL_HEADERS} header fields"
    assert outcome["message_id"] == "<h@x.y>"
    [logged] = [r for r in caplog.records if getattr(r, "message_id", None) == "<h@x.y>"]
    assert "dropped unread" in logged.getMessage()
    assert (await bot.approval(approval_id))["status"] == "pending"


# --- the SMTP listener --------------------------------------------------------------------------


def deliver(port: int, raw: bytes, sender: str, to: str) -> tuple[int, str]:
    """Hand `raw` to the listener with the standard library's client, as an MTA would (in a
    thread: the bot's event loop is this test's); the answer to DATA."""
    with smtplib.SMTP("127.0.0.1", port, timeout=30) as smtp:
        try:
            smtp.sendmail(sender, [to], raw)
        except smtplib.SMTPDataError as exc:
            said = exc.smtp_error
            return exc.smtp_code, said.decode() if isinstance(said, bytes) else said
    return 250, ""


class HealthPoller:
    """Asks `/healthz` in a loop from a thread of its own, timing each answer, until stopped."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.timings: list[tuple[float, float]] = []
        """(when it was asked, seconds the answer took), in order."""
        self.statuses: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="healthz-poller")

    def _poll(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as client:
            while not self._stop.is_set():
                started = time.perf_counter()
                answer = client.get("/healthz")
                self.timings.append((started, time.perf_counter() - started))
                self.statuses.add(answer.status_code)
                self._stop.wait(0.005)

    async def __aenter__(self) -> HealthPoller:
        self._thread.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        # Joined off the loop: the request in flight needs the loop to be answered.
        await asyncio.to_thread(self._thread.join)


@pytest.fixture
async def smtp_bot(tmp_path: Path) -> AsyncIterator[Bot]:
    async with email_bot(tmp_path, listening("smtp")) as running:
        yield running


async def test_25000_parts_over_smtp_get_550_while_healthz_answers(smtp_bot: Bot) -> None:
    approval_id, emailed = await smtp_bot.pending()
    request = emailed["ana@example.com"]
    wide = shaped(request, sender="ana@example.com", kind="wide", message_id="<wide@x.y>")
    port = smtp_bot.served.mail_port
    assert port is not None
    async with HealthPoller(smtp_bot.served.url) as poller:
        await eventually(holds(lambda: bool(poller.timings)), "a first /healthz answer")
        sending = time.perf_counter()
        code, said = await asyncio.to_thread(
            deliver, port, wide, "ana@example.com", str(request["Reply-To"])
        )
        sent = time.perf_counter()
        first = len(poller.timings)
        await eventually(holds(lambda: len(poller.timings) > first + 2), "more answers")
    assert (code, said) == (550, f"5.3.4 the message has more than {EMAIL_PARTS} MIME parts")
    during = [took for asked, took in poller.timings if sending <= asked <= sent]
    worst = max(took for _, took in poller.timings)
    print(f"/healthz: {len(during)} answers during the delivery, the slowest {worst:.3f} s")
    assert poller.statuses == {200}
    assert len(during) >= 3, during
    assert worst < HEALTHZ_WITHIN, poller.timings
    approval = await smtp_bot.approval(approval_id)
    assert approval["status"] == "pending"
    assert len(refusals(approval, "MIME parts")) == 1


async def test_lmtp_refuses_a_deep_message_for_each_recipient(tmp_path: Path) -> None:
    async with email_bot(tmp_path, listening("lmtp")) as bot:
        approval_id, emailed = await bot.pending()
        request = emailed["bo@example.com"]
        deep = shaped(request, sender="bo@example.com", kind="deep", message_id="<deep@x.y>")
        port = bot.served.mail_port
        assert port is not None
        said = await lmtp(
            port, deep, "bo@example.com", [str(request["Reply-To"]), "approvals@example.com"]
        )
        why = f"550 5.3.4 the message's MIME parts nest more than {EMAIL_DEPTH} levels deep"
        assert said[6:8] == [why, why], said
        assert (await bot.approval(approval_id))["status"] == "pending"


# --- the IMAP reader ---------------------------------------------------------------------------


def moved(count: int) -> Callable[[list[Stored]], bool]:
    def check(stored: list[Stored]) -> bool:
        return len(stored) == count

    check.__qualname__ = f"{count} messages"
    return check


async def test_a_deep_message_first_in_the_mailbox_stops_nothing_also_after_a_restart(
    tmp_path: Path,
) -> None:
    dovecot_binary()
    deep_id = make_msgid(domain="mail.example.com")
    async with dovecot(tmp_path / "imap") as imap:
        async with email_bot(tmp_path, reading(imap)) as bot:
            approval_id, emailed = await bot.pending()
            request = emailed["ana@example.com"]
            deep = shaped(request, sender="ana@example.com", kind="deep", message_id=deep_id)
            approve = reply(request, sender="ana@example.com")
            await imap.append(deep)
            await imap.append(approve)
            await imap.wait_until("Processed", moved(2))
            approval = await bot.approval(approval_id)
            assert approval["status"] == "approved"
            assert approval["decision"]["decided_by"] == "ana@example.com"
            [refused] = refusals(approval, f"nest more than {EMAIL_DEPTH} levels")
            assert refused["detail"]["evidence"]["message_id"] == deep_id
            await bot.mail.wait_for(lambda: bool(answers_to(bot, deep_id)))
            assert len(answers_to(bot, deep_id)) == 1
        # A reader stopped before it marked them (a crash, SIGKILL) finds both again.
        await imap.append(deep)
        await imap.append(approve)
        async with email_bot(tmp_path, reading(imap)) as restarted:
            await imap.wait_until("Processed", moved(4))
            assert await imap.messages("INBOX") == []
            approval = await restarted.approval(approval_id)
            assert approval["status"] == "approved"
            kinds = [e["kind"] for e in approval["events"]]
            assert kinds.count("decided") == 1
            assert len(refusals(approval, f"nest more than {EMAIL_DEPTH} levels")) == 1
            assert answers_to(restarted, deep_id) == []


class FailingInbound(Inbound):
    """A fault injector, not a fake: the real `Inbound`, except that `ingest` raises for the
    Message-IDs in `failing` (as a bug met by one message would), counting each try."""

    def __init__(self, *args: Any, failing: Sequence[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.failing = set(failing)
        self.tries: dict[str, int] = {}

    async def ingest(self, raw: bytes, *, recipients: Sequence[str] = ()) -> Outcome:
        message_id = self.message_id_in(raw)
        if message_id in self.failing:
            self.tries[message_id] = self.tries.get(message_id, 0) + 1
            raise RuntimeError(f"a bug met by {message_id}")
        return await super().ingest(raw, recipients=recipients)


def failing_inbound(bot: Bot, failing: Sequence[str]) -> FailingInbound:
    """The served bot's inbound email, with `failing` failing."""
    service = bot.served.service
    assert service.config.email is not None
    return FailingInbound(
        service.config.email,
        service.store,
        service.registry,
        secret=WEB_SECRET,
        authorize=service.authorize,
        on_decided=service.decided,
        failing=failing,
    )


@contextlib.asynccontextmanager
async def running(reader: ImapReader) -> AsyncIterator[asyncio.Task[None]]:
    stop = asyncio.Event()
    task = asyncio.create_task(reader.run(stop))
    try:
        yield task
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)


@pytest.mark.parametrize("processed", [True, False], ids=["moved", "flagged"])
async def test_a_message_whose_processing_fails_is_quarantined_and_the_next_decides(
    tmp_path: Path, processed: bool, caplog: pytest.LogCaptureFixture
) -> None:
    dovecot_binary()
    async with dovecot(tmp_path / "imap") as imap, email_bot(tmp_path) as bot:
        config = ImapConfig.model_validate(
            {
                "host": imap.host,
                "port": imap.port,
                "tls": "none",
                "username": imap.username,
                "password": imap.password,
                "poll": 1,
                "processed_mailbox": "Processed" if processed else None,
            }
        )
        approval_id, emailed = await bot.pending()
        request = emailed["ana@example.com"]
        poison = reply(request, sender="ana@example.com", message_id="<poison@x.y>")
        await imap.append(poison)
        await imap.append(reply(request, sender="ana@example.com", text="deny not now"))
        inbound = failing_inbound(bot, ["<poison@x.y>"])
        reader = ImapReader(inbound, config)
        with caplog.at_level(logging.ERROR, logger="nodbot.bot.email.imap"):
            async with running(reader) as task:
                await eventually(holds(lambda: reader.processed == 1), "the next message read")
                assert not task.done()
        assert inbound.tries == {"<poison@x.y>": 1} and reader.quarantined == 1
        approval = await bot.approval(approval_id)
        assert approval["status"] == "denied" and approval["decision"]["reason"] == "not now"
        [kept] = [m for m in await imap.messages("INBOX") if m.raw.find(b"<poison@x.y>") > 0]
        assert {r"\Seen", QUARANTINED} <= kept.flags
        [logged] = [r for r in caplog.records if r.getMessage().startswith("email message quar")]
        assert logged.levelname == "ERROR" and logged.exc_info is not None
        assert getattr(logged, "message_id", None) == "<poison@x.y>"
        assert getattr(logged, "uid", None) == kept.uid
        # A new reader (a restart) skips it: it reads the next message and not the poison.
        again = failing_inbound(bot, ["<poison@x.y>"])
        restarted = ImapReader(again, config)
        late = reply(emailed["bo@example.com"], sender="bo@example.com", message_id="<late@x.y>")
        await imap.append(late)
        async with running(restarted):
            await eventually(holds(lambda: restarted.processed == 1), "the late reply read")
        assert again.tries == {} and restarted.quarantined == 0
        approval = await bot.approval(approval_id)
        assert len(refusals(approval, "already decided")) == 1
