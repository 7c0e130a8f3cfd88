"""Delegation (out of office), against bots served in-process: while ana's reviews are handed
to bob (`nodbot delegate`, the inbox's settings page, or `delegations:` in the file), bob
decides them through the API and the inbox, the audit saying "bob for ana"; never a call bob
asked for himself; ana still may; a delegator and their delegate count once in a quorum;
a past or ended delegation grants nothing, nor a delegate's delegate; a delegation that cannot
be read grants nothing; one made before a restart holds after it, and one made through one
replica holds on the other at once (PostgreSQL). Bad input to `nodbot delegate` exits 2."""

from __future__ import annotations

import asyncio
import contextlib
import io
import threading
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.engine import make_url

from nodbot.bot.cli.commands import main
from nodbot.bot.policy.authorize import NOT_A_REVIEWER, ONE_VOICE, Authorizer
from nodbot.bot.policy.delegation import Delegations
from nodbot.bot.policy.people import People
from nodbot.bot.policy.rules import SELF_APPROVAL_REASON
from nodbot.bot.serve import Served, serving
from nodbot.core import ApprovalRecord, ApprovalRequest, Decision, arguments_digest
from nodbot.core.sqlstore import SqlApprovalStore
from nodbot.core.sqlstore.delegations import SqlDelegations
from nodbot.core.store import utc_now
from tests.bot.test_web_inbox import csrf_of, text_of
from tests.support import eventually, postgres_database

ROOT = Path(__file__).resolve().parents[2]
ANA, BOB, CY, DEE, EVE = (f"{n}@example.com" for n in ("ana", "bob", "cy", "dee", "eve"))
REVIEWERS = (ANA, BOB, CY, DEE, EVE)


def token(name: str) -> str:
    return f"token-of-{name}-".ljust(40, "0")


def bearer(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token(name)}"}


CONFIG = """
store: {{url: "{url}"}}
server: {{host: 127.0.0.1, port: 0}}
workers: {{poll: 0.1}}
api:
  tokens:
{tokens}
external_tools: [payout, transfer]
rules:
  - tool: payout
    reviewers: [ana@example.com]
  - tool: transfer
    reviewers: [ana@example.com, cy@example.com, dee@example.com]
    approvals_required: 2
{extra}
"""


def write(path: Path, url: str, extra: str = "") -> Path:
    entries = [f'    - {{name: agent, token: "{token("agent")}", scopes: [approvals:request]}}']
    entries += [
        f'    - {{name: "{who}", token: "{token(who)}", '
        "scopes: [approvals:read, approvals:decide]}"
        for who in REVIEWERS
    ]
    path.write_text(CONFIG.format(url=url, tokens="\n".join(entries), extra=extra))
    return path


class Bot:
    """A served bot, an agent asking it, reviewers deciding through its API and inbox."""

    def __init__(self, served: Served, http: httpx.AsyncClient) -> None:
        self.served, self.http = served, http
        self.browsers: list[httpx.AsyncClient] = []

    async def ask(self, tool: str = "payout", **body: Any) -> str:
        request = {
            "tool": tool,
            "arguments": {"order_id": "M-1", "amount": 10},
            "run_id": "thread-1",
            "call_id": f"call_{utc_now().timestamp()}_{len(body)}_{id(body)}",
            **body,
        }
        answer = await self.http.post("/approvals", json=request, headers=bearer("agent"))
        assert answer.status_code == 201, answer.text
        assert answer.json()["status"] == "pending"
        approval_id: str = answer.json()["approval_id"]
        return approval_id

    async def decide(self, who: str, approval_id: str, action: str = "approve") -> httpx.Response:
        return await self.http.post(
            f"/approvals/{approval_id}/decide", json={"action": action}, headers=bearer(who)
        )

    async def signed_in(self, who: str) -> httpx.AsyncClient:
        browser = httpx.AsyncClient(base_url=self.served.url)
        self.browsers.append(browser)
        answer = await browser.get(self.served.sign_in_link(who))
        assert answer.status_code == 303, answer.text
        return browser

    async def decided_event(self, approval_id: str) -> Any:
        events = await self.served.service.store.events(approval_id)
        return next(e for e in events if e.kind in ("decided",))


@contextlib.asynccontextmanager
async def running(path: Path) -> AsyncIterator[Bot]:
    async with serving(str(path)) as served, httpx.AsyncClient(base_url=served.url) as http:
        bot = Bot(served, http)
        try:
            yield bot
        finally:
            for browser in bot.browsers:
                await browser.aclose()


@pytest.fixture(autouse=True)
def _at_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)


@pytest.fixture
def config(tmp_path: Path) -> Path:
    return write(tmp_path / "nodbot.yml", f"sqlite:///{tmp_path / 'nodbot.db'}")


@pytest.fixture
async def bot(config: Path) -> AsyncIterator[Bot]:
    async with running(config) as bot:
        yield bot


def delegate(config: Path, *words: str) -> int:
    """`nodbot delegate --config FILE WORDS...`'s exit status (argparse's own too)."""
    try:
        return main(["delegate", "--config", str(config), *words])
    except SystemExit as exc:
        return int(exc.code or 0)


async def delegated(config: Path, *words: str) -> int:
    """`delegate`, from a test that serves a bot (the command runs a loop of its own)."""
    return await asyncio.to_thread(delegate, config, *words)


def capture_show(config: Path, approval_id: str) -> str:
    """`nodbot approvals show ID`'s output."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["approvals", "show", "--config", str(config), approval_id]) == 0
    return out.getvalue()


def tomorrow() -> str:
    return (utc_now() + timedelta(days=1)).isoformat()


# --- deciding for someone -------------------------------------------------------------------


async def test_a_delegate_decides_the_delegators_reviews_through_the_api(
    bot: Bot, config: Path
) -> None:
    first = await bot.ask()
    refused = await bot.decide(BOB, first)
    assert refused.status_code == 403 and refused.json()["error"] == NOT_A_REVIEWER
    assert await delegated(config, "--from", ANA, "--to", BOB, "--until", tomorrow()) == 0
    approved = await bot.decide(BOB, first)
    assert approved.status_code == 200, approved.text
    event = await bot.decided_event(first)
    assert (event.actor, event.person) == (BOB, f"email:{BOB}")
    assert event.detail["evidence"]["for"] == ANA  # the audit says "bob for ana"
    shown = await asyncio.to_thread(capture_show, config, first)
    assert f"approved by {BOB}" in shown and f" {BOB} for {ANA} api " in shown
    # The delegator still decides their reviews.
    second = await bot.ask()
    assert (await bot.decide(ANA, second, "deny")).status_code == 200


async def test_a_delegate_decides_in_the_inbox_and_the_history_says_for_whom(
    bot: Bot, config: Path
) -> None:
    assert await delegated(config, "--from", ANA, "--to", BOB, "--until", tomorrow()) == 0
    approval_id = await bot.ask()
    browser = await bot.signed_in(BOB)
    inbox = await browser.get("/inbox")
    assert f"/inbox/approvals/{approval_id}" in inbox.text  # ana's review, bob's to decide
    page = await browser.get(f"/inbox/approvals/{approval_id}")
    answer = await browser.post(
        f"/inbox/approvals/{approval_id}/decide",
        data={"csrf": csrf_of(page), "action": "deny", "reason": "not today"},
    )
    assert answer.status_code == 303, answer.text
    event = await bot.decided_event(approval_id)
    assert (event.actor, event.person) == (BOB, f"email:{BOB}")
    assert event.detail["evidence"]["for"] == ANA
    assert event.detail["evidence"]["for_person"] == f"email:{ANA}"
    history = text_of(await browser.get(f"/inbox/approvals/{approval_id}"))
    assert f"{BOB} for {ANA}" in history


async def test_a_delegate_never_approves_a_call_they_asked_for(bot: Bot, config: Path) -> None:
    assert await delegated(config, "--from", ANA, "--to", BOB, "--until", tomorrow()) == 0
    own = await bot.ask(requested_by=BOB)
    refused = await bot.decide(BOB, own)
    assert refused.status_code == 403 and refused.json()["error"] == SELF_APPROVAL_REASON
    assert (await bot.decide(ANA, own)).status_code == 200
    # Nor one the delegator asked for: bob decides only what ana could.
    hers = await bot.ask(requested_by=ANA)
    assert (await bot.decide(BOB, hers)).status_code == 403


async def test_a_delegator_and_their_delegate_count_once_in_a_quorum(
    bot: Bot, config: Path
) -> None:
    assert await delegated(config, "--from", ANA, "--to", BOB, "--until", tomorrow()) == 0
    assert await delegated(config, "--from", CY, "--to", BOB, "--until", tomorrow()) == 0
    # bob for ana, then ana: one voice.
    first = await bot.ask("transfer")
    assert (await bot.decide(BOB, first)).status_code == 200
    again = await bot.decide(ANA, first)
    assert again.status_code == 403 and again.json()["error"] == ONE_VOICE
    # bob again (he holds cy's reviews too): still one person.
    assert (await bot.decide(BOB, first)).status_code == 409
    assert (await bot.served.service.store.get(first)).status == "pending"
    assert (await bot.decide(DEE, first)).status_code == 200
    assert (await bot.served.service.store.get(first)).status == "approved"
    # ana, then bob for ana: one voice the other way round.
    second = await bot.ask("transfer")
    assert (await bot.decide(ANA, second)).status_code == 200
    late = await bot.decide(BOB, second)
    assert late.status_code == 403 and late.json()["error"] == ONE_VOICE


async def test_a_past_or_ended_delegation_grants_nothing(bot: Bot, config: Path) -> None:
    store: Any = bot.served.service.store
    now = utc_now()
    await store.delegations.add(
        delegator=ANA, delegate=BOB, since=now - timedelta(days=2), until=now - timedelta(days=1)
    )
    approval_id = await bot.ask()
    assert (await bot.decide(BOB, approval_id)).status_code == 403
    assert await delegated(config, "--from", ANA, "--to", BOB, "--until", tomorrow()) == 0
    (live,) = await store.delegations.list()
    assert await delegated(config, "end", live.delegation_id) == 0
    refused = await bot.decide(BOB, approval_id)
    assert refused.status_code == 403 and refused.json()["error"] == NOT_A_REVIEWER


async def test_delegations_do_not_chain(bot: Bot, config: Path) -> None:
    assert await delegated(config, "--from", ANA, "--to", BOB, "--until", tomorrow()) == 0
    assert await delegated(config, "--from", BOB, "--to", EVE, "--until", tomorrow()) == 0
    approval_id = await bot.ask()
    assert (await bot.decide(EVE, approval_id)).status_code == 403


async def test_a_standing_delegation_of_the_file(tmp_path: Path) -> None:
    extra = f"delegations:\n  - {{from: {ANA}, to: {BOB}, reason: deputy}}"
    path = write(tmp_path / "nodbot.yml", f"sqlite:///{tmp_path / 'nodbot.db'}", extra)
    async with running(path) as bot:
        approval_id = await bot.ask()
        assert (await bot.decide(BOB, approval_id)).status_code == 200


async def test_a_delegation_that_cannot_be_read_grants_nothing(tmp_path: Path) -> None:
    async def ready() -> None:
        return None

    unreadable = SqlDelegations(
        make_url(f"sqlite+aiosqlite:///{tmp_path}/missing/dir/x.db"), ready=ready
    )
    people = People()
    authorizer = Authorizer(people, delegations=Delegations(people, stored=unreadable))
    arguments = {"amount": 10}
    request = ApprovalRequest(
        "run_1",
        "call_1",
        "payout",
        arguments,
        arguments_digest(arguments),
        policy={"reviewers": [ANA]},
    )
    record = ApprovalRecord(approval_id="apr_1", request=request, created_at=utc_now())
    try:
        verdict = await authorizer.check(BOB, record, Decision(approved=True))
        assert verdict.refusal is not None
        assert verdict.refusal.startswith("could not check whose reviews are handed to you")
        assert (await authorizer.check(ANA, record, Decision(approved=True))).allowed
    finally:
        await unreadable.close()
        await aiosqlite_threads_ended()


async def aiosqlite_threads_ended() -> None:
    """Wait until aiosqlite's connection threads have ended: one whose connection failed to
    open stops on its own thread and then tells the loop, which must still be open then (a
    test's loop closes when the test ends)."""

    async def ended() -> bool:
        return not any("_connection_worker_thread" in t.name for t in threading.enumerate())

    await eventually(ended, "aiosqlite's threads ending")


# --- across a restart and on two replicas ---------------------------------------------------


async def test_a_delegation_made_before_a_restart_holds_after_it(config: Path) -> None:
    async with running(config) as bot:
        approval_id = await bot.ask()
        browser = await bot.signed_in(ANA)
        page = await browser.get("/inbox/settings")
        assert page.status_code == 200, page.text
        made = await browser.post(
            "/inbox/settings/delegate",
            data={"csrf": csrf_of(page), "to": BOB, "until": tomorrow(), "reason": "holiday"},
        )
        assert made.status_code == 303, made.text
        assert BOB in text_of(await browser.get("/inbox/settings"))
    async with running(config) as bot:
        assert (await bot.decide(BOB, approval_id)).status_code == 200


@pytest.mark.postgres
async def test_a_delegation_made_on_one_replica_holds_on_the_other_at_once(
    tmp_path: Path,
) -> None:
    async with postgres_database() as url, contextlib.AsyncExitStack() as stack:
        one = await stack.enter_async_context(running(write(tmp_path / "one.yml", url)))
        two = await stack.enter_async_context(running(write(tmp_path / "two.yml", url)))
        approval_id = await one.ask()
        assert (await two.decide(BOB, approval_id)).status_code == 403
        browser = await one.signed_in(ANA)
        page = await browser.get("/inbox/settings")
        made = await browser.post(
            "/inbox/settings/delegate",
            data={"csrf": csrf_of(page), "to": BOB, "until": tomorrow()},
        )
        assert made.status_code == 303, made.text
        # Checked at the decision: the other replica sees it at once, with no cache to expire.
        probe = await two.ask()
        assert (await two.decide(BOB, probe, "deny")).status_code == 200
        # Ended on one, refused on the other at once.
        page = await browser.get("/inbox/settings")
        store = SqlApprovalStore(url)
        try:
            (live,) = await store.delegations.list()
        finally:
            await store.close()
        ended = await browser.post(
            f"/inbox/settings/delegations/{live.delegation_id}/end", data={"csrf": csrf_of(page)}
        )
        assert ended.status_code == 303, ended.text
        assert (await two.decide(BOB, approval_id)).status_code == 403


# --- the settings page and the command ------------------------------------------------------


async def test_the_settings_page_refuses_a_bad_form_and_anothers_delegation(
    bot: Bot, config: Path
) -> None:
    store: Any = bot.served.service.store
    browser = await bot.signed_in(ANA)
    page = await browser.get("/inbox/settings")
    forged = await browser.post("/inbox/settings/delegate", data={"to": BOB, "until": tomorrow()})
    assert forged.status_code == 403
    for fields in (
        {"to": BOB, "until": "next week"},
        {"to": BOB, "until": "2001-01-01"},
        {"to": ANA.upper(), "until": tomorrow()},
        {"to": "bob <bob@example.com>", "until": tomorrow()},
    ):
        refused = await browser.post(
            "/inbox/settings/delegate", data={"csrf": csrf_of(page), **fields}
        )
        assert refused.status_code == 422, (fields, refused.text)
    assert await store.delegations.list(live=False) == []
    assert await delegated(config, "--from", CY, "--to", BOB, "--until", tomorrow()) == 0
    (theirs,) = await store.delegations.list()
    gone = await browser.post(
        f"/inbox/settings/delegations/{theirs.delegation_id}/end", data={"csrf": csrf_of(page)}
    )
    assert gone.status_code == 404
    assert [d.ended_at for d in await store.delegations.list()] == [None]


def test_delegate_lists_and_ends(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert delegate(config, "--from", ANA, "--to", BOB, "--until", "2999-01-10") == 0
    made = capsys.readouterr().out
    assert ANA in made and BOB in made and "2999-01-10" in made
    assert delegate(config, "list") == 0
    listed = capsys.readouterr().out
    assert f"{ANA} -> {BOB}" in listed
    delegation_id = listed.split()[0]
    assert delegate(config, "end", delegation_id) == 0
    assert delegate(config, "list") == 0
    assert "no delegations" in capsys.readouterr().out
    assert delegate(config, "end", "dlg_unknown") == 1


@pytest.mark.parametrize(
    "words",
    [
        ["--from", ANA, "--until", "2999-01-10"],  # no --to
        ["--from", ANA, "--to", BOB],  # no --until
        ["--from", ANA, "--to", BOB, "--until", "soon"],
        ["--from", ANA, "--to", BOB, "--until", "2001-01-10"],  # past
        ["--from", ANA, "--to", ANA.upper(), "--until", "2999-01-10"],
        ["--from", "ana example", "--to", BOB, "--until", "2999-01-10"],
        ["--from", ANA, "--to", BOB, "--until", "2999-01-10", "--reason", "two\nlines"],
        ["end"],
        ["lst"],
    ],
)
def test_delegate_refuses_bad_input_with_exit_status_2(
    config: Path, words: list[str], tmp_path: Path
) -> None:
    assert delegate(config, *words) == 2
    assert not (tmp_path / "nodbot.db").exists()  # nothing was written, not even a store


async def test_the_served_bots_email_channel_reaches_the_delegates_it_decides_with(
    tmp_path: Path,
) -> None:
    """`nodbot serve` hands its channels the delegations its authorizer reads: a delegation
    made with the command is the one an escalation or a reminder of the running bot sends to."""
    email = (
        "email:\n  from: nodbot@example.com\n  reply_to: approvals@example.com\n"
        "  smtp: {host: 127.0.0.1, port: 2525, tls: none}\n"
        "web:\n  secret: a-web-secret-of-the-delegation-test-0000\n"
    )
    config = write(tmp_path / "nodbot.yml", f"sqlite:///{tmp_path / 'nodbot.db'}", email)
    async with running(config) as bot:
        [channel] = [
            c for c in bot.served.service.dispatcher.channels.values() if c.name == "email"
        ]
        delegations: Any = getattr(channel, "delegations", None)
        assert delegations is not None
        ana = await delegations.people.person(ANA)
        assert await delegations.delegates_of(ana) == []
        assert await delegated(config, "--from", ANA, "--to", BOB, "--until", tomorrow()) == 0
        [bob] = await delegations.delegates_of(ana)
        assert bob.key == f"email:{BOB}"
