"""The web inbox on a phone: headless Chromium lays the pages out 390 CSS pixels wide (a
phone's width), with the long unbroken values that push pages sideways (a 200-character
order id, a wide JSON argument, a digest in the history), and no page scrolls sideways, with
its folded values and history details opened (`test_inbox_layout.py` lays the list and
reviews out at a laptop's width too, folded and opened, and keeps the screenshots for CI).

Each page's screenshot is written to the test's folder, for a person to look at."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.bot.test_web_inbox import CAROL, LEAD, SLACK_LEAD, Inbox, decide, served_inbox
from tests.fakes.browser import Browser, Page, chromium, chromium_missing


@pytest.fixture(autouse=True)
def _needs_chromium() -> None:
    """Skips without Chromium, except under CI (which installs it), where that fails."""
    missing = chromium_missing()
    if missing is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but {missing}")
        pytest.skip(missing)


PHONE = 390
"""CSS pixels: the width of a common phone held upright."""
LONG_ORDER = "ORD-" + "7f3a9c" * 32 + "9c01"  # 200 characters, no break opportunity
WIDE_TAGS = ["region:" + "eu-west-" * 12 + str(n) for n in range(6)]


@pytest.fixture
async def web(tmp_path: Path) -> AsyncIterator[Inbox]:
    async with served_inbox(tmp_path) as harness:
        yield harness


@pytest.fixture
async def browser(tmp_path: Path) -> AsyncIterator[Browser]:
    async with chromium(tmp_path) as running:
        yield running


async def signed_in_phone(web: Inbox, browser: Browser, principal: str) -> Page:
    """A phone-sized tab signed in as `principal` by its sign-in link."""
    page = await browser.page(width=PHONE, height=844)
    await page.goto(web.link(principal))
    assert await page.evaluate("location.pathname") == "/inbox"
    return page


async def laid_out(page: Page, url: str, shot: Path) -> tuple[int, str]:
    """Open `url` and every disclosure on it (a folded value, a history line's details);
    how wide the page is laid out, and its text. The screenshot goes to `shot`."""
    await page.goto(url)
    await page.evaluate("document.querySelectorAll('details').forEach(d => d.open = true)")
    await page.screenshot(shot)
    width = await page.evaluate("document.documentElement.scrollWidth")
    text = await page.evaluate("document.body.innerText")
    return int(width), str(text)


async def test_the_inbox_and_an_approval_fit_a_phone_without_sideways_scrolling(
    web: Inbox, browser: Browser, tmp_path: Path
) -> None:
    _, _, refund = await web.pending("refund", order_id=LONG_ORDER, amount=125.5)
    _, _, configure = await web.pending(
        "configure",
        run_id="run_" + "b" * 120,
        level=3,
        enabled=True,
        mode="safe",
        name="n" * 150,
        tags=WIDE_TAGS,
    )
    _, _, pay = await web.pending("pay", run_id="run_p", to="payee-" + "q" * 120, amount=9.0)
    _, _, drop = await web.pending("drop_table", run_id="run_d", name="t_" + "z" * 180)
    _, _, denied = await web.pending("send_email", run_id="run_s", to=CAROL, subject="s" * 90,
                                     body="https://example.org/" + "p" * 300)  # fmt: skip
    lead = await web.signed_in(LEAD)
    answer = await decide(lead, denied, "deny", reason="no: " + "r" * 250)
    assert answer.status_code == 303, answer.text
    slack_lead = await web.signed_in(SLACK_LEAD)
    assert (await decide(slack_lead, pay, "approve")).status_code == 303

    page = await signed_in_phone(web, browser, LEAD)
    pages = {
        "inbox": "/inbox",
        "refund": f"/inbox/approvals/{refund}",
        "configure": f"/inbox/approvals/{configure}",
        "pay": f"/inbox/approvals/{pay}",
        "drop-table": f"/inbox/approvals/{drop}",
        "denied": f"/inbox/approvals/{denied}",
        "remembered": "/inbox/remembered",
    }
    widths = {}
    for name, path in pages.items():
        shot = tmp_path / f"{name}-{PHONE}px.png"
        widths[name], text = await laid_out(page, web.url + path, shot)
        assert shot.stat().st_size > 1000, f"no screenshot of {name}"
        if name == "refund":
            assert LONG_ORDER in text.replace("\n", "")  # shown whole, wrapped, not cut
    assert widths == dict.fromkeys(pages, PHONE), f"pages wider than {PHONE} px: {widths}"


async def test_the_pages_keep_their_desktop_layout_on_a_wide_screen(
    web: Inbox, browser: Browser, tmp_path: Path
) -> None:
    _, _, refund = await web.pending("refund", order_id="o-7", amount=10.0)
    page = await browser.page(width=1280, height=900, mobile=False)
    await page.goto(web.link(LEAD))
    width, _ = await laid_out(page, f"{web.url}/inbox", tmp_path / "inbox-1280px.png")
    assert width == 1280
    header = await page.evaluate("getComputedStyle(document.querySelector('table thead')).display")
    assert header == "table-header-group"  # the list is a table there, not cards
    assert refund in await page.evaluate("document.body.innerHTML")
