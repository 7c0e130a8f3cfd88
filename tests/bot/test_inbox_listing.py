"""The inbox's list with filters, search and pages (`bot.web.listing`): GET parameters, so a
filtered list is a link; bounded and validated; only reviews the reviewer may see. Over real
HTTP with the harness of tests/bot/test_web_inbox.py (uvicorn, httpx, SQLite)."""

from __future__ import annotations

import html
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodbot.bot.web.listing import (
    AGES,
    MAX_TEXT,
    PAGE_SIZE,
    ListQuery,
    QueryError,
    parse_query,
)
from tests.bot.test_web_inbox import (
    CAROL,
    LEAD,
    SLACK_LEAD,
    Inbox,
    csrf_of,
    served_inbox,
    text_of,
)

DAVE = "dave@example.com"


@pytest.fixture
async def web(tmp_path: Path) -> AsyncIterator[Inbox]:
    async with served_inbox(tmp_path) as harness:
        yield harness


def listed(page: httpx.Response) -> dict[str, list[str]]:
    """The ids the list shows, by section (pending, decided), in order."""
    assert page.status_code == 200, page.text
    found: dict[str, list[str]] = {"pending": [], "decided": []}
    for section, body in re.findall(r'<section id="(\w+)">(.*?)</section>', page.text, re.S):
        found[section] = re.findall(r'<tr data-id="([^"]+)"', body)
    return found


def every(page: httpx.Response) -> list[str]:
    shown = listed(page)
    return shown["pending"] + shown["decided"]


async def deny(client: httpx.AsyncClient, approval_id: str, reason: str = "no") -> None:
    page = await client.get(f"/inbox/approvals/{approval_id}")
    answer = await client.post(
        f"/inbox/approvals/{approval_id}/decide",
        data={"action": "deny", "csrf": csrf_of(page), "reason": reason},
    )
    assert answer.status_code == 303, answer.text


@dataclass(frozen=True)
class Made:
    """A review the tests made, and what the test expects of it."""

    approval_id: str
    tool: str
    rule: int
    requester: str
    arguments: dict[str, Any]
    description: str
    decided: bool
    seen_by_slack_lead: bool
    reason: str = ""


RULES = {"refund": 0, "send_email": 1, "configure": 2, "pay": 3, "ping": 4, "drop_table": 5}
DESCRIPTIONS = {"refund": "Refunds need a support lead.", "send_email": "Mail is read first."}


async def population(web: Inbox) -> list[Made]:
    """Reviews of several tools, requesters and rules, pending and decided; U0123LEADS may
    see those of refund and pay (their rules name them) and no other."""
    made: list[Made] = []

    async def make(tool: str, requester: str = CAROL, **arguments: Any) -> str:
        run = f"run_{len(made)}"
        _, _, approval_id = await web.pending(tool, run_id=run, requested_by=requester, **arguments)
        made.append(
            Made(
                approval_id,
                tool,
                RULES[tool],
                requester,
                arguments,
                DESCRIPTIONS.get(tool, ""),
                decided=False,
                seen_by_slack_lead=tool in ("refund", "pay"),
            )
        )
        return approval_id

    await make("refund", order_id="o-7", amount=500.0)
    await make("refund", order_id="O-8 Acme", amount=12.5)
    await make("refund", DAVE, order_id="o-9", amount=1.0)
    await make("send_email", to="acme@example.org", subject="Invoice o-7", body="Hello")
    await make("send_email", DAVE, to="x@example.org", subject="Hi", body="there")
    await make("pay", to="acme", amount=5.0)
    await make("ping", host="db-1")
    lead = await web.signed_in(LEAD)
    for index, reason in ((0, "duplicate order"), (3, "wrong recipient")):
        await deny(lead, made[index].approval_id, reason)
        made[index] = Made(**{**made[index].__dict__, "decided": True, "reason": reason})
    return made


def expected(made: list[Made], query: dict[str, str], *, viewer: str) -> list[str]:
    """What the list should show `viewer` for `query`: pending (oldest first), then
    decided, each filter as the docs say it; written out apart from `bot.web.listing`."""
    status = query.get("status") or "all"
    words = (query.get("q") or "").casefold().split()

    def keeps(item: Made) -> bool:
        if viewer == SLACK_LEAD and not item.seen_by_slack_lead:
            return False
        if query.get("tool") and item.tool != query["tool"]:
            return False
        if query.get("requester") and item.requester.casefold() != query["requester"].casefold():
            return False
        if query.get("rule") and str(item.rule) != query["rule"]:
            return False
        text = " ".join(
            [
                item.tool,
                item.approval_id,
                item.requester,
                item.description,
                json.dumps(item.arguments),
                item.reason,
                LEAD if item.decided else "",
            ]
        ).casefold()
        return all(word in text for word in words)

    pending = [i.approval_id for i in made if not i.decided and keeps(i)]
    decided = [i.approval_id for i in reversed(made) if i.decided and keeps(i)]
    return (pending if status != "decided" else []) + (decided if status != "pending" else [])


async def test_filters_narrow_the_list_and_are_kept_in_the_form(web: Inbox) -> None:
    made = await population(web)
    client = await web.signed_in(LEAD)
    ids = [item.approval_id for item in made]
    assert every(await client.get("/inbox")) == expected(made, {}, viewer=LEAD)
    cases: list[dict[str, str]] = [
        {"tool": "refund"},
        {"tool": "send_email", "status": "pending"},
        {"requester": "DAVE@example.com"},
        {"rule": "1"},
        {"status": "decided"},
        {"status": "pending", "tool": "refund", "requester": CAROL},
        {"tool": "nothing_like_it"},
    ]
    for query in cases:
        page = await client.get("/inbox?" + urlencode(query))
        assert every(page) == expected(made, query, viewer=LEAD), query
        for name, value in query.items():
            if name in ("tool", "requester"):
                assert f'name="{name}" value="{html.escape(value)}"' in page.text
            else:
                assert f'<option value="{value}" selected>' in page.text
    assert every(await client.get("/inbox?tool=refund&status=decided")) == [ids[0]]
    assert "Nothing that waits for you matches these filters." in text_of(
        await client.get("/inbox?tool=nothing_like_it&status=pending")
    )


async def test_search_finds_words_in_arguments_ids_descriptions_and_decisions(
    web: Inbox,
) -> None:
    made = await population(web)
    client = await web.signed_in(LEAD)
    ids = [item.approval_id for item in made]
    searches = {
        "acme": [ids[1], ids[5], ids[3]],  # an argument, in any case; the denied email too
        "o-7 refund": [ids[0]],  # every word
        "SUPPORT lead o-9": [ids[2]],
        ids[6][-10:]: [ids[6]],  # a piece of an id
        "recipient": [ids[3]],  # the deny's reason
        "nowhere-at-all": [],
    }
    for q, found in searches.items():
        page = await client.get("/inbox?" + urlencode({"q": q}))
        assert every(page) == found, q
        assert every(page) == expected(made, {"q": q}, viewer=LEAD)


async def test_another_reviewer_sees_only_their_own_whatever_the_filters(web: Inbox) -> None:
    made = await population(web)
    client = await web.signed_in(SLACK_LEAD)
    for query in ({}, {"q": "acme"}, {"tool": "send_email"}, {"status": "decided"}, {"rule": "4"}):
        page = await client.get("/inbox?" + urlencode(query))
        assert every(page) == expected(made, query, viewer=SLACK_LEAD), query


async def test_ages_count_from_the_inboxs_clock(web: Inbox) -> None:
    made = await population(web)
    client = await web.signed_in(LEAD)
    everything = expected(made, {}, viewer=LEAD)
    assert every(await client.get("/inbox?age=newer-1h")) == everything
    assert every(await client.get("/inbox?age=older-1h")) == []
    web.clock.now += 90 * 60
    later = await web.signed_in(LEAD)  # a fresh session: the first may have ended
    assert every(await later.get("/inbox?age=newer-1h")) == []
    assert every(await later.get("/inbox?age=older-1h")) == everything
    assert every(await later.get("/inbox?age=newer-1d")) == everything
    assert every(await later.get("/inbox?age=older-1d")) == []
    page = await later.get("/inbox")
    for value, (_, _, label) in AGES.items():
        assert f'<option value="{value}">{label}</option>' in page.text


async def test_pages_hold_a_fixed_number_with_links_that_keep_the_filters(web: Inbox) -> None:
    pending = [
        (await web.pending("refund", run_id=f"run_{n:02d}", order_id=f"o-{n}", amount=1.0))[2]
        for n in range(PAGE_SIZE + 3)
    ]
    lead = await web.signed_in(LEAD)
    for approval_id in pending[:2]:
        await deny(lead, approval_id)
    waiting = pending[2:]  # oldest first
    first = await lead.get("/inbox?tool=refund")
    assert listed(first) == {"pending": waiting[:PAGE_SIZE], "decided": []}
    assert 'href="/inbox?tool=refund&amp;page=2" rel="next"' in first.text
    assert 'rel="prev"' not in first.text
    second = await lead.get("/inbox?tool=refund&page=2")
    assert listed(second) == {
        "pending": waiting[PAGE_SIZE:],
        "decided": [pending[1], pending[0]],  # the newest decision first
    }
    assert 'href="/inbox?tool=refund" rel="prev"' in second.text
    assert 'rel="next"' not in second.text
    assert f"Page 2, {PAGE_SIZE} a page" in text_of(second)
    beyond = await lead.get("/inbox?page=9")
    assert every(beyond) == [] and 'href="/inbox?page=8" rel="prev"' in beyond.text


@pytest.mark.parametrize(
    ("query", "said"),
    [
        ("status=maybe", "status &#39;maybe&#39; is not one of all, pending, decided"),
        ("age=yesterday", "age &#39;yesterday&#39; is not one of newer-1h"),
        ("rule=first", "rule &#39;first&#39; is not a rule&#39;s position"),
        ("page=0", "page &#39;0&#39; is not a number from 1 to 1000"),
        ("page=two", "page &#39;two&#39; is not a number"),
        ("tool=a&tool=b", "tool is given more than once"),
        (f"q={'x' * (MAX_TEXT + 1)}", f"q is longer than {MAX_TEXT} characters"),
        ("requester=a%0Ab", "requester holds a control character"),
        ("q=" + "+".join("w" * 11), "q has more than 10 words"),
    ],
)
async def test_a_parameter_not_understood_is_a_422_naming_it(
    web: Inbox, query: str, said: str
) -> None:
    _, _, approval_id = await web.pending()
    client = await web.signed_in(LEAD)
    page = await client.get(f"/inbox?{query}")
    assert page.status_code == 422
    assert "Filters not understood" in page.text and said in page.text
    assert approval_id not in page.text
    assert 'href="/inbox"' in page.text  # back to the list without them


async def test_an_unknown_parameter_is_ignored_and_said(web: Inbox) -> None:
    _, _, approval_id = await web.pending()
    client = await web.signed_in(LEAD)
    page = await client.get("/inbox?" + urlencode({"utm_source": "mail", "<b>x</b>": "1"}))
    assert every(page) == [approval_id]
    assert "Not understood, so ignored: utm_source, &lt;b&gt;x&lt;/b&gt;." in page.text


async def test_what_the_list_shows_and_echoes_is_escaped(web: Inbox) -> None:
    script = "<script>alert(1)</script>"
    _, _, approval_id = await web.pending("refund", order_id=script, amount=1.0)
    client = await web.signed_in(LEAD)
    q = f'"><img src=x onerror=alert(1)> {script}'
    page = await client.get("/inbox?" + urlencode({"q": script, "requester": q[:40]}))
    assert page.status_code == 200
    for shown in (page, await client.get("/inbox")):
        assert "<img" not in shown.text and script not in shown.text
        assert shown.text.count("<script") == 1  # the page's own, with its nonce
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page.text
    assert 'value="&#34;&gt;&lt;img src=x onerror=alert(1)&gt; &lt;script&gt;a"' in page.text
    assert every(await client.get("/inbox?" + urlencode({"q": script}))) == [approval_id]


# --- any query ------------------------------------------------------------------------------

NAMES = ["status", "tool", "requester", "rule", "age", "q", "page"]
VALUES = {
    "status": st.sampled_from(["", "all", "pending", "decided"]),
    "tool": st.sampled_from(["", "refund", "send_email", "pay", "ping", "nope"]),
    "requester": st.sampled_from(["", CAROL, DAVE.upper(), "someone"]),
    "rule": st.sampled_from(["", "0", "1", "3", "4", "007"]),
    "q": st.lists(
        st.sampled_from(["acme", "O-7", "refund", "support", "lead", "zzz", "hello"]), max_size=3
    ).map(" ".join),
}


@given(
    query=st.fixed_dictionaries({}, optional=VALUES),
    viewer=st.sampled_from([LEAD, SLACK_LEAD]),
)
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
async def test_any_filters_list_exactly_the_visible_reviews_that_match(
    web: Inbox, query: dict[str, str], viewer: str
) -> None:
    made = await cached_population(web)
    client = await signed(web, viewer)
    page = await client.get("/inbox?" + urlencode(query))
    wanted = {name: value.lstrip("0") or "0" if name == "rule" and value else value
              for name, value in query.items()}  # fmt: skip
    assert every(page) == expected(made, wanted, viewer=viewer), query


@given(
    pairs=st.lists(
        st.tuples(
            st.one_of(st.sampled_from(NAMES), st.text(max_size=8)),
            st.text(max_size=MAX_TEXT + 20),
        ),
        max_size=8,
    )
)
@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
async def test_any_query_string_is_answered_and_never_lists_what_is_not_visible(
    web: Inbox, pairs: list[tuple[str, str]]
) -> None:
    made = await cached_population(web)
    client = await signed(web, SLACK_LEAD)
    page = await client.get("/inbox?" + urlencode(pairs))
    assert page.status_code in (200, 422), page.text
    if page.status_code == 200:
        visible = {item.approval_id for item in made if item.seen_by_slack_lead}
        assert set(every(page)) <= visible
    else:
        assert "Filters not understood" in page.text


@given(pairs=st.lists(st.tuples(st.text(max_size=12), st.text(max_size=MAX_TEXT + 5)), max_size=40))
@settings(max_examples=300, deadline=None)
def test_a_query_is_read_or_refused_naming_each_problem(pairs: list[tuple[str, str]]) -> None:
    try:
        query = parse_query(pairs)
    except QueryError as exc:
        problems = exc.problems
    else:
        problems = []
    if problems:
        assert all(isinstance(p, str) and p for p in problems)
        return
    assert isinstance(query, ListQuery) and query.page >= 1
    # The query's own link reads back as the same query.
    link = query.link()
    again = parse_query(
        [] if link == "/inbox" else httpx.URL(link, params=None).params.multi_items()
    )
    assert again == query


_MADE: list[tuple[Inbox, list[Made]]] = []
_SIGNED: list[tuple[Inbox, str, httpx.AsyncClient]] = []


async def cached_population(web: Inbox) -> list[Made]:
    """The population of this test's inbox, made at its first example (the examples of one
    test share its inbox; they only read it)."""
    for inbox, made in _MADE:
        if inbox is web:
            return made
    _MADE[:] = [(web, await population(web))]
    return _MADE[0][1]


async def signed(web: Inbox, viewer: str) -> httpx.AsyncClient:
    """A browser of this test's inbox signed in as `viewer`, made at its first use."""
    for inbox, who, client in _SIGNED:
        if inbox is web and who == viewer:
            return client
    _SIGNED[:] = [entry for entry in _SIGNED if entry[0] is web]
    client = await web.signed_in(viewer)
    _SIGNED.append((web, viewer, client))
    return client
