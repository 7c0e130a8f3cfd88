"""The inbox laid out by headless Chromium at a phone's width (390 CSS pixels) and a laptop's
(1280): the list, and reviews with what pushes pages sideways (a 200-character order id, a
wide JSON argument, an edited value of 200 unbroken characters, a long history with digests
and refusals). No page scrolls sideways, and no element reaches past the window's right edge,
with its disclosures closed (as it opens) and all opened (as a reviewer reads them).

Every screenshot is kept for CI to publish: under `$NODBOT_ARTIFACTS/inbox/` (by default
`build/artifacts/inbox/` in the repository), named by page, state and width
(`list-390.png`, `review-history-open-1280.png`, ...).

Questions to a person (`ctx.ask`) have pages of their own: their choices as radio buttons or
a text to answer, and once answered the answer; they are laid out the same way, with a
question, choices and an answer of unbroken characters (`question-choices-390.png`, ...)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from nodbot.core import QuestionPending
from tests.bot.test_inbox_phone import LONG_ORDER, WIDE_TAGS
from tests.bot.test_inbox_questions import asked, served_questions
from tests.bot.test_web_inbox import CAROL, LEAD, SLACK_LEAD, Inbox, decide, served_inbox
from tests.fakes.browser import Browser, Page, chromium, chromium_missing

ROOT = Path(__file__).resolve().parents[2]
WIDTHS = (390, 1280)
"""CSS pixels: a phone held upright, a laptop's window."""
LONG_NAME = "m" * 200  # an edit with no break opportunity


@pytest.fixture(autouse=True)
def _needs_chromium() -> None:
    """Skips without Chromium, except under CI (which installs it), where that fails."""
    missing = chromium_missing()
    if missing is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but {missing}")
        pytest.skip(missing)


def artifacts() -> Path:
    """Where the screenshots go (made when missing)."""
    base = os.environ.get("NODBOT_ARTIFACTS") or str(ROOT / "build" / "artifacts")
    folder = Path(base) / "inbox"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
async def web(tmp_path: Path) -> AsyncIterator[Inbox]:
    async with served_inbox(tmp_path) as harness:
        yield harness


@pytest.fixture
async def browser(tmp_path: Path) -> AsyncIterator[Browser]:
    async with chromium(tmp_path) as running:
        yield running


OVERFLOW = """(() => {
  const width = document.documentElement.clientWidth;
  const wide = [];
  for (const element of document.querySelectorAll("body *")) {
    const box = element.getBoundingClientRect();
    if (box.width === 0 && box.height === 0) continue;
    // A visually hidden heading (the phone's list keeps its table head for screen
    // readers) is clipped to one pixel: what it holds is not laid out on the page.
    if (element.closest("thead") && getComputedStyle(element.closest("thead")).position
        === "absolute") continue;
    if (box.right > width + 0.5 || box.left < -0.5 || box.width > width + 0.5) {
      wide.push(`${element.tagName.toLowerCase()}.${element.className} `
                + `${Math.round(box.left)}..${Math.round(box.right)}`);
    }
  }
  return {scroll: document.documentElement.scrollWidth, client: width,
          wide: wide.slice(0, 12)};
})()"""


async def fits(page: Page, width: int, shot: Path) -> dict[str, Any]:
    """The page's widths and what pokes out, after its screenshot is written to `shot`."""
    await page.screenshot(shot)
    size = (await asyncio.to_thread(shot.stat)).st_size
    assert size > 1000, f"no screenshot in {shot}"
    found: dict[str, Any] = await page.evaluate(OVERFLOW)
    found["expected"] = width
    return found


async def reviews(web: Inbox) -> dict[str, str]:
    """The pages to lay out: the list, and reviews with long values and a long history."""
    _, _, refund = await web.pending("refund", order_id=LONG_ORDER, amount=125.5)
    call, ctx, configure = await web.pending(
        "configure",
        run_id="run_" + "b" * 120,
        level=3,
        enabled=True,
        mode="safe",
        name="n" * 150,
        tags=WIDE_TAGS,
    )
    _, _, pay = await web.pending("pay", run_id="run_p", to="payee-" + "q" * 120, amount=9.0)
    await web.pending("drop_table", run_id="run_d", name="t_" + "z" * 180)
    requester = await web.signed_in(CAROL)
    for _ in range(6):  # the requester may not approve their own refund: refused, recorded
        refused = await decide(requester, refund, "approve")
        assert refused.status_code == 403, refused.text
    lead = await web.signed_in(LEAD)
    edited = await decide(lead, refund, "edit", **{"arg.amount": "99.5"}, reason="r" * 250)
    assert edited.status_code == 303, edited.text
    changed = await decide(lead, configure, "edit", **{"arg.name": LONG_NAME})
    assert changed.status_code == 303, changed.text
    assert (await web.executor.run_call(call, ctx)).status == "ok"  # consumed, finished
    slack_lead = await web.signed_in(SLACK_LEAD)
    assert (await decide(slack_lead, pay, "approve")).status_code == 303  # one vote of two
    return {
        "list": "/inbox",
        "review-history": f"/inbox/approvals/{refund}",
        "review-json": f"/inbox/approvals/{configure}",
        "review-votes": f"/inbox/approvals/{pay}",
    }


async def test_the_list_and_reviews_fit_a_phone_and_a_laptop_without_sideways_scrolling(
    web: Inbox, browser: Browser
) -> None:
    pages = await reviews(web)
    folder = artifacts()
    measured: dict[str, dict[str, Any]] = {}
    for width in WIDTHS:
        tab = await browser.page(width=width, height=900, mobile=width < 600)
        await tab.goto(web.link(LEAD))
        assert await tab.evaluate("location.pathname") == "/inbox"
        for name, path in pages.items():
            await tab.goto(web.url + path)
            measured[f"{name}-{width}"] = await fits(tab, width, folder / f"{name}-{width}.png")
            opened = await tab.evaluate(
                "document.querySelectorAll('details').forEach(d => d.open = true) || "
                "document.querySelectorAll('details[open]').length"
            )
            if opened:
                shot = folder / f"{name}-open-{width}.png"
                measured[f"{name}-open-{width}"] = await fits(tab, width, shot)
    assert {"review-history-open-390", "review-json-open-1280"} <= measured.keys()
    wrong = {
        name: found
        for name, found in measured.items()
        if found["client"] != found["expected"]
        or found["scroll"] > found["client"]
        or found["wide"]
    }
    assert not wrong, f"pages wider than their window: {wrong}"


async def test_a_folded_value_shows_its_start_and_opens_to_the_whole(
    web: Inbox, browser: Browser
) -> None:
    pages = await reviews(web)
    tab = await browser.page(width=390, height=844)
    await tab.goto(web.link(LEAD))
    await tab.goto(web.url + pages["review-history"])
    closed = str(await tab.evaluate("document.querySelector('table.arguments').innerText"))
    assert LONG_ORDER[:40] in closed and LONG_ORDER not in closed.replace("\n", "")
    await tab.evaluate("document.querySelectorAll('details').forEach(d => d.open = true)")
    opened = str(await tab.evaluate("document.querySelector('table.arguments').innerText"))
    assert LONG_ORDER in opened.replace("\n", "")  # whole, wrapped, not cut
    row = await tab.evaluate("getComputedStyle(document.querySelector('table.list tr')).display")
    assert row == "block"  # the history is cards on a phone, not a table
    wide = await browser.page(width=1280, height=900, mobile=False)
    await wide.goto(web.link(LEAD))
    await wide.goto(web.url + pages["list"])
    header = await wide.evaluate("getComputedStyle(document.querySelector('table thead')).display")
    assert header == "table-header-group"  # the list is a table there, not cards


LONG_CHOICES = ["c" * 75, "Porto " + "p" * 69, "Leeds"]
"""Choices as long as a question may have them (75 characters), one with no break."""


async def questions(web: Inbox) -> dict[str, str]:
    """The pages of questions to lay out: choices (long ones, on a long question), free
    text, an answered question with a long answer, and the list with them."""
    _, _, choices = await asked(web, "ship", order_id=LONG_ORDER, run_id="run_1")
    _, _, free = await asked(web, "note", order_id=LONG_ORDER, run_id="run_2")
    _, _, answered = await asked(web, "note", order_id="A3", run_id="run_3")
    ctx = web.executor.context(run_id="run_" + "r" * 120, requested_by=CAROL)
    with pytest.raises(QuestionPending) as waiting:
        await ctx.ask("Which of these? " + "q" * 300, choices=LONG_CHOICES)
    lead = await web.signed_in(LEAD)
    page = await lead.get(f"/inbox/approvals/{answered}")
    csrf = page.text.split('name="csrf" value="', 1)[1].split('"', 1)[0]
    sent = await lead.post(
        f"/inbox/approvals/{answered}/decide",
        data={"csrf": csrf, "action": "respond", "response": "a" * 400 + "\nsecond line"},
    )
    assert sent.status_code == 303, sent.text
    return {
        "list-questions": "/inbox",
        "question-choices": f"/inbox/approvals/{choices}",
        "question-long-choices": f"/inbox/approvals/{waiting.value.approval_id}",
        "question-text": f"/inbox/approvals/{free}",
        "question-answered": f"/inbox/approvals/{answered}",
    }


async def test_questions_fit_a_phone_and_a_laptop_without_sideways_scrolling(
    tmp_path: Path, browser: Browser
) -> None:
    async with served_questions(tmp_path / "questions") as web:
        pages = await questions(web)
        folder = artifacts()
        measured: dict[str, dict[str, Any]] = {}
        for width in WIDTHS:
            tab = await browser.page(width=width, height=900, mobile=width < 600)
            await tab.goto(web.link(LEAD))
            for name, path in pages.items():
                await tab.goto(web.url + path)
                await tab.evaluate(
                    "document.querySelectorAll('details').forEach(d => d.open = true)"
                )
                measured[f"{name}-{width}"] = await fits(tab, width, folder / f"{name}-{width}.png")
        choices = await tab.evaluate(
            "document.querySelectorAll('#decide-answer input[type=radio]').length"
        )
        assert choices == 0  # the last page is the answered one: no form left
    assert {"question-choices-390", "question-text-1280"} <= measured.keys()
    wrong = {
        name: found
        for name, found in measured.items()
        if found["client"] != found["expected"]
        or found["scroll"] > found["client"]
        or found["wide"]
    }
    assert not wrong, f"pages wider than their window: {wrong}"
