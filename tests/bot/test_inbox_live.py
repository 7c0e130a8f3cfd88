"""The list's live updates and keys: a server-sent event stream (`GET /inbox/events`,
`bot.web.live`) and the list's small script, allowed by a nonce of the response's CSP.

A waiting page in headless Chromium (390 px wide) sees a new review without a reload; the
stream itself is read over HTTP with httpx; its bounds (one poll for every stream, caps, its
lifetime, `close`) with `LiveUpdates` over a memory store; and a served bot with an open
stream stops promptly."""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from nodbot.bot.serve import serving
from nodbot.bot.web.live import MAX_PER_REVIEWER, LiveUpdates, StreamRefused
from nodbot.bot.web.signing import Signer
from nodbot.core import ApprovalRecord, ApprovalStatus, MemoryApprovalStore
from tests.bot.test_web_inbox import CAROL, LEAD, SECRET, SLACK_LEAD, Inbox, served_inbox
from tests.core.store.conftest import ask
from tests.fakes.browser import Browser, Page, chromium, chromium_missing
from tests.support import eventually

PHONE = 390


@pytest.fixture
async def web(tmp_path: Path) -> AsyncIterator[Inbox]:
    async with served_inbox(tmp_path) as harness:
        yield harness


@pytest.fixture
async def browser(tmp_path: Path) -> AsyncIterator[Browser]:
    missing = chromium_missing()
    if missing is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but {missing}")
        pytest.skip(missing)
    async with chromium(tmp_path) as running:
        yield running


def version_of(page: httpx.Response) -> str:
    found = re.search(r'<div id="listing" data-version="([0-9a-f]{16})">', page.text)
    assert found, "the list carries no version"
    return found.group(1)


async def next_event(lines: AsyncIterator[str]) -> tuple[str, str]:
    """The next event of a stream (its name and data), past comments and `retry`."""
    name = data = ""
    async for line in lines:
        if line.startswith("event: "):
            name = line[len("event: ") :]
        elif line.startswith("data: "):
            data = line[len("data: ") :]
        elif line == "" and name:
            return name, data
    raise AssertionError("the stream ended before an event")


# --- in a browser ---------------------------------------------------------------------------


async def phone_on_the_list(web: Inbox, browser: Browser, principal: str = LEAD) -> Page:
    """A phone-sized tab signed in as `principal`, on the list, its live updates open."""
    page = await browser.page(width=PHONE, height=844)
    await page.goto(web.link(principal))
    assert await page.evaluate("location.pathname") == "/inbox"

    async def live() -> bool:
        said = await page.evaluate("document.getElementById('live').textContent")
        return str(said).startswith("Live:")

    await eventually(live, "the list's stream opening", within=20)
    return page


async def press(page: Page, key: str) -> None:
    """A key pressed and let go, as the keyboard sends it."""
    named = {"Enter": ("Enter", 13, "\r")}
    code, number, text = named.get(key, (f"Key{key.upper()}", ord(key.upper()), key))
    down = {"type": "keyDown", "key": key, "code": code, "windowsVirtualKeyCode": number}
    await page.send("Input.dispatchKeyEvent", {**down, "text": text})
    await page.send("Input.dispatchKeyEvent", {**down, "type": "keyUp"})


async def test_a_new_review_shows_on_a_waiting_phone_without_a_reload(
    web: Inbox, browser: Browser, tmp_path: Path
) -> None:
    _, _, first = await web.pending("refund", run_id="run_1")
    page = await phone_on_the_list(web, browser)
    await page.evaluate("window.stillTheSamePage = true")
    await page.evaluate(f"document.querySelector('input[value=\"{first}\"]').click()")
    _, _, another = await web.pending("refund", run_id="run_h")
    _, _, second = await web.pending("send_email", run_id="run_2", to="a@example.org",
                                     subject="Hi", body="Hello")  # fmt: skip

    async def shown() -> bool:
        found = await page.evaluate(
            f"!!document.querySelector('#listing tr[data-id=\"{second}\"]')"
        )
        return bool(found)

    await eventually(shown, "the new review on the waiting page", within=20)
    assert await page.evaluate("window.stillTheSamePage === true")  # no reload
    ticked = await page.evaluate("[...document.querySelectorAll('input[name=id]:checked')]"
                                 ".map(box => box.value)")  # fmt: skip
    assert ticked == [first]  # the reviewer's ticks are kept
    assert another in await page.evaluate("document.getElementById('listing').innerHTML")
    assert await page.evaluate("document.documentElement.scrollWidth") == PHONE
    await page.screenshot(tmp_path / f"live-list-{PHONE}px.png")


async def test_the_selection_form_shows_once_there_is_something_to_select(
    web: Inbox, browser: Browser
) -> None:
    page = await phone_on_the_list(web, browser)
    shown = "document.getElementById('bulk').getClientRects().length > 0"
    assert await page.evaluate(shown) is False  # nothing waits: no buttons to press
    _, _, approval_id = await web.pending("refund")

    async def offered() -> bool:
        return bool(await page.evaluate(shown))

    await eventually(offered, "the selection form, with the new review", within=20)
    assert await page.evaluate(f"!!document.querySelector('input[value=\"{approval_id}\"]')")


async def test_keys_move_tick_and_open_but_leave_typing_alone(web: Inbox, browser: Browser) -> None:
    ids = [(await web.pending("refund", run_id=f"run_{n}"))[2] for n in range(3)]
    page = await phone_on_the_list(web, browser)

    async def current() -> Any:
        return await page.evaluate(
            "[document.querySelector('tr.current')?.dataset.id, document.activeElement.tagName]"
        )

    await press(page, "j")
    assert await current() == [ids[0], "A"]
    await press(page, "j")
    await press(page, "j")
    await press(page, "k")
    assert await current() == [ids[1], "A"]
    await press(page, "x")
    ticked = "[...document.querySelectorAll('input[name=id]:checked')].map(box => box.value)"
    assert await page.evaluate(ticked) == [ids[1]]
    await press(page, "x")
    assert await page.evaluate(ticked) == []
    # Typing in a field: the keys are the reviewer's letters.
    await page.evaluate("document.getElementById('bulk-reason').focus()")
    for key in "jx":
        await press(page, key)
    assert await page.evaluate("document.getElementById('bulk-reason').value") == "jx"
    assert await page.evaluate("document.querySelector('tr.current').dataset.id") == ids[1]
    assert await page.evaluate(ticked) == []
    await page.evaluate("document.activeElement.blur()")
    loaded = browser.expect("Page.loadEventFired", session=page.session)
    await press(page, "o")
    async with asyncio.timeout(20):
        await loaded
    assert await page.evaluate("location.pathname") == f"/inbox/approvals/{ids[1]}"


async def test_on_a_review_a_and_d_focus_the_forms_and_submit_nothing(
    web: Inbox, browser: Browser
) -> None:
    _, _, approval_id = await web.pending("refund")
    page = await phone_on_the_list(web, browser)
    await page.goto(f"{web.url}/inbox/approvals/{approval_id}")
    await press(page, "a")
    focused = "[document.activeElement.closest('form')?.id, document.activeElement.id]"
    assert await page.evaluate(focused) == ["decide-approve", ""]
    await press(page, "d")
    assert await page.evaluate(focused) == ["decide-deny", "deny-reason"]
    await press(page, "d")  # typed into the reason now
    assert await page.evaluate("document.getElementById('deny-reason').value") == "d"
    assert await web.events(approval_id) == [("created", CAROL, None)]


async def test_with_scripts_off_the_list_reloads_itself(web: Inbox, browser: Browser) -> None:
    page = await browser.page(width=PHONE, height=844)
    await page.send("Emulation.setScriptExecutionDisabled", {"value": True})
    await page.goto(web.link(LEAD))
    refresh = "document.querySelector('meta[http-equiv=refresh]')?.content ?? null"
    assert await page.evaluate(refresh) == "30"
    scripted = await browser.page(width=PHONE, height=844)
    await scripted.goto(web.link(LEAD))
    assert await scripted.evaluate(refresh) is None  # with scripts, the stream does it


# --- over HTTP ------------------------------------------------------------------------------


async def test_the_csp_allows_only_the_pages_own_script_by_a_nonce(web: Inbox) -> None:
    _, _, approval_id = await web.pending()
    client = await web.signed_in(LEAD)
    first, second = await client.get("/inbox"), await client.get("/inbox")
    nonces = []
    for page in (first, second):
        policy = page.headers["content-security-policy"]
        assert policy.startswith("default-src 'none'; ")
        found = re.search(r"script-src 'nonce-([A-Za-z0-9_-]{22})'; connect-src 'self'; ", policy)
        assert found, policy
        assert re.findall(r"<script[^>]*>", page.text) == [f'<script nonce="{found.group(1)}">']
        assert "unsafe-inline" not in policy.split("style-src")[0]
        nonces.append(found.group(1))
    assert nonces[0] != nonces[1]  # one for each response
    assert '<noscript><meta http-equiv="refresh" content="30"></noscript>' in first.text
    review = await client.get(f"/inbox/approvals/{approval_id}")
    assert "connect-src" not in review.headers["content-security-policy"]  # it fetches nothing
    for plain in (await client.get("/inbox/remembered"), await client.get("/inbox/approvals/x")):
        assert plain.headers["content-security-policy"] == (
            "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
            "frame-ancestors 'none'; base-uri 'none'"
        )
        assert "<script" not in plain.text


async def test_the_stream_sends_the_version_at_once_then_each_change(web: Inbox) -> None:
    await web.pending("refund", run_id="run_1")
    client = await web.signed_in(SLACK_LEAD)
    page = await client.get("/inbox")
    async with client.stream("GET", "/inbox/events", timeout=30) as stream:
        assert stream.status_code == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        assert stream.headers["cache-control"] == "no-store"
        lines = stream.aiter_lines()
        assert await anext(lines) == "retry: 5000"
        assert await next_event(lines) == ("pending", version_of(page))
        _, _, second = await web.pending("refund", run_id="run_2")
        async with asyncio.timeout(20):
            name, version = await next_event(lines)
        assert name == "pending" and version != version_of(page)
        after = await client.get("/inbox")
        assert version == version_of(after) and second in after.text
        await stream.aclose()


async def test_the_stream_needs_a_session_for_the_whole_inbox(web: Inbox) -> None:
    _, _, approval_id = await web.pending()
    anonymous = await web.browser().get("/inbox/events")
    assert anonymous.status_code == 401
    signer = Signer(SECRET, clock=web.clock)
    token = signer.review_token(LEAD, approval_id, "approve", expires=int(web.clock.now) + 600)
    limited = web.browser()
    assert (await limited.get(f"/inbox/review?token={token}")).status_code == 303
    answer = await limited.get("/inbox/events")
    assert answer.status_code == 403 and "This link is for one review" in answer.text


async def test_one_reviewer_may_hold_only_so_many_streams(web: Inbox) -> None:
    client = await web.signed_in(LEAD)
    async with OpenStreams(client, MAX_PER_REVIEWER) as opened:
        assert [stream.status_code for stream in opened] == [200] * MAX_PER_REVIEWER
        refused = await client.get("/inbox/events")
        assert refused.status_code == 503
        assert f"you have {MAX_PER_REVIEWER} live lists open already" in refused.text
        other = await web.signed_in(SLACK_LEAD)
        async with other.stream("GET", "/inbox/events") as theirs:
            assert theirs.status_code == 200

    # The streams closed by their browser free their places.
    async def open_again() -> bool:
        async with client.stream("GET", "/inbox/events") as again:
            return again.status_code == 200

    await eventually(open_again, "a stream once the others closed", within=10)


class OpenStreams:
    """`count` streams of `/inbox/events` open at once (each past its first line), closed
    at the end."""

    def __init__(self, client: httpx.AsyncClient, count: int) -> None:
        self.client = client
        self.count = count
        self.managers: list[Any] = []
        self.lines: list[AsyncIterator[str]] = []  # a reader let go of closes its stream

    async def __aenter__(self) -> list[httpx.Response]:
        opened = []
        for _ in range(self.count):
            manager = self.client.stream("GET", "/inbox/events")
            response = await manager.__aenter__()
            self.managers.append(manager)
            opened.append(response)
            self.lines.append(response.aiter_lines())
            assert await anext(self.lines[-1]) == "retry: 5000"
        return opened

    async def __aexit__(self, *exc: object) -> None:
        for manager in self.managers:
            await manager.__aexit__(None, None, None)


async def test_a_served_bot_with_an_open_stream_stops_promptly(tmp_path: Path) -> None:
    path = tmp_path / "nodbot.yml"
    path.write_text(
        f'store: {{url: "sqlite:///{tmp_path / "nodbot.db"}"}}\n'
        "server: {host: 127.0.0.1, port: 0}\n"
    )
    # No read timeout of its own: the server, not the client, is to end the stream.
    async with (
        httpx.AsyncClient(timeout=httpx.Timeout(5, read=None)) as client,
        asyncio.timeout(60),
    ):
        async with serving(str(path), configure_logs=False) as served:
            signed = await client.get(served.sign_in_link(LEAD))
            assert signed.status_code == 303
            manager = client.stream("GET", f"{served.url}/inbox/events")
            stream = await manager.__aenter__()
            lines = stream.aiter_lines()
            assert await next_event(lines) == ("pending", (await version_at(served.url, client)))
            rest = asyncio.create_task(remaining(lines))
            stopping = time.monotonic()
        took = time.monotonic() - stopping
        async with asyncio.timeout(5):
            await rest  # the server ended the stream
        await manager.__aexit__(None, None, None)
    assert took < 10, f"the bot took {took:.1f} s to stop with a stream open"


async def version_at(url: str, client: httpx.AsyncClient) -> str:
    return version_of(await client.get(f"{url}/inbox"))


async def remaining(lines: AsyncIterator[str]) -> list[str]:
    return [line async for line in lines]


# --- the bounds, over a memory store --------------------------------------------------------


async def refunds_only(principal: str, record: ApprovalRecord) -> bool:
    """Who may decide what, in these tests: every reviewer the refunds, nobody else."""
    return record.request.tool == "refund"


async def collect(stream: AsyncIterator[str], within: float = 10) -> list[str]:
    async with asyncio.timeout(within):
        return [chunk async for chunk in stream]


async def test_a_review_the_reviewer_may_not_decide_leaves_their_version_alone() -> None:
    store = MemoryApprovalStore()
    live = LiveUpdates(store, refunds_only)
    before = await live.version(LEAD)
    await store.create(replace(ask("c1"), tool="ping"))
    assert await live.version(LEAD) == before
    await store.create(ask("c2"))
    assert await live.version(LEAD) != before


async def test_a_stream_ends_after_its_lifetime_with_heartbeats_meanwhile() -> None:
    live = LiveUpdates(MemoryApprovalStore(), refunds_only, lifetime=0.6, heartbeat=0.1)
    chunks = await collect(live.stream(LEAD))
    assert chunks[0] == "retry: 5000\n\n" and chunks[1].startswith("event: pending\ndata: ")
    assert chunks[2:] and set(chunks[2:]) == {": still here\n\n"}
    assert live.open_streams == 0


async def test_close_ends_every_stream_at_once_and_opens_no_more() -> None:
    live = LiveUpdates(MemoryApprovalStore(), refunds_only)
    streams = [live.stream(who) for who in (LEAD, SLACK_LEAD, LEAD)]
    for stream in streams:
        assert await anext(stream) == "retry: 5000\n\n"
        assert (await anext(stream)).startswith("event: pending")
    live.close()
    for stream in streams:
        assert await collect(stream, within=2) == []
    assert live.open_streams == 0
    with pytest.raises(StreamRefused, match="shutting down"):
        live.stream(LEAD)


async def test_streams_are_capped_in_all_and_by_reviewer() -> None:
    live = LiveUpdates(MemoryApprovalStore(), refunds_only, max_streams=2, per_reviewer=1)
    mine = live.stream(LEAD)
    with pytest.raises(StreamRefused, match="you have 1 live lists open already"):
        live.stream(LEAD.upper())
    theirs = live.stream(SLACK_LEAD)
    with pytest.raises(StreamRefused, match="2 live lists are open already"):
        live.stream("carol@example.com")
    for stream in (mine, theirs):
        await anext(stream)
        await stream.aclose()
    assert live.open_streams == 0
    await anext(live.stream(LEAD))
    live.close()


class CountedStore(MemoryApprovalStore):
    """A memory store that counts its `list` reads."""

    lists = 0

    async def list(
        self,
        *,
        run_id: str | None = None,
        status: ApprovalStatus | None = None,
        limit: int | None = None,
        newest_first: bool = False,
    ) -> list[ApprovalRecord]:
        self.lists += 1
        return await super().list(
            run_id=run_id, status=status, limit=limit, newest_first=newest_first
        )


async def test_one_poll_of_the_store_serves_every_stream() -> None:
    store = CountedStore()
    live = LiveUpdates(store, refunds_only, poll=3600)  # polls only when woken
    reviewers = [f"r{n}@example.com" for n in range(5)]
    streams = [live.stream(who) for who in reviewers]
    first = []
    for stream in streams:
        assert await anext(stream) == "retry: 5000\n\n"
        first.append(await anext(stream))

    async def polled_once() -> bool:
        return store.lists == len(streams) + 1  # each stream's first version, and the poll

    await eventually(polled_once, "the first poll")
    store.lists = 0
    await store.create(ask("c1"))
    live.wake()
    changed = [await asyncio.wait_for(anext(s), 10) for s in streams]
    assert all(c.startswith("event: pending") and c not in first for c in changed)
    assert store.lists == 1  # one read for five streams of five reviewers
    live.close()
    for stream in streams:
        await collect(stream, within=2)
