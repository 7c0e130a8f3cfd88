"""The Teams channel end to end, through `nodbot serve` in a process of its own, against the
local fake of the Bot Framework (tests/fakes/botframework.py): the bot fetches the fake's
OpenID metadata and keys to check each activity's JWT, gets its own token from the fake's
token endpoint, and posts and replaces cards through the fake's connector. Actions are sent
as Teams sends them: `adaptiveCard/action` invokes, signed as the Bot Framework signs them.

A review is posted once, as a card, to the conversation of `teams.post_to`; approved,
edited (with an invalid value first, shown on the form) and denied from its card, each
time the run going on as decided and the card replaced for everyone; a request that is
unsigned, signed with another key, for another audience or another service URL is refused
with 401 and changes nothing; a member who is no reviewer is refused, the refusal recorded
and nothing decided; and a review decided over the HTTP API has its card replaced too.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.bot.processes import Running, nodbot_serve
from tests.bot.test_email_end_to_end import ledger, until
from tests.fakes.botframework import BotFrameworkFake, Posted, botframework_fake, new_key

APP_ID = "00000000-0000-4000-8000-00000000b07a"
PASSWORD = "password-of-the-teams-test-bot-0001"
CONVERSATION = "19:ops@thread.tacv2"
TOKEN = "token-of-the-starter-000000000000"
CAROL_TOKEN = "token-of-carol-the-lead-0000000000"
ANA_TOKEN = "token-of-ana-the-lead-000000000000"
STARTER = {"Authorization": f"Bearer {TOKEN}"}
ANA, BOB, DAVE = "29:ana", "29:bob", "29:dave"

CONFIG = """
store: {{url: "sqlite:///{db}"}}
server: {{host: 127.0.0.1, port: 0}}
workers: {{poll: 0.2}}
api:
  tokens:
    - {{name: starter, token: {token}, scopes: [runs:write, approvals:read]}}
    - {{name: carol@example.com, token: {carol}, scopes: [approvals:read, approvals:decide]}}
    - {{name: ana@example.com, token: {ana}, scopes: [approvals:read, approvals:decide]}}
people:
  dave: [starter, dave@example.com]
agents:
  ledger: tests.bot.ledger_agent:agent
teams:
  app_id: {app_id}
  app_password: ${{TEAMS_APP_PASSWORD}}
  openid_url: {openid_url}
  token_url: {token_url}
  post_to:
    - {{conversation: "{conversation}", service_url: {service_url}}}
rules:
  - tool: refund
    when: {{ge: {{amount: 1000}}}}
    reviewers: [ana@example.com, carol@example.com, dave@example.com]
    approvals_required: 2
  - tool: refund
    description: Refunds are reviewed by the ledger's leads.
    reviewers: [ana@example.com, carol@example.com, dave@example.com]
"""


@dataclass
class Desk:
    """The bot serving, the Bot Framework fake, and an HTTP client of the bot."""

    bot: Running
    client: httpx.AsyncClient
    bf: BotFrameworkFake
    tmp_path: Path

    async def start(self, order: str, amount: str) -> tuple[str, str]:
        """A run asking for a refund: its run id and its review."""
        body = {"agent": "ledger", "input": f"refund {order} {amount}"}
        answer = await self.client.post("/runs", json=body, headers=STARTER)
        assert answer.status_code == 201, answer.text
        run = answer.json()
        [pending] = run["pending"]
        return str(run["run_id"]), str(pending["approval_id"])

    async def approval(self, approval_id: str) -> dict[str, Any]:
        found = await self.client.get(f"/approvals/{approval_id}", headers=STARTER)
        assert found.status_code == 200, found.text
        approval: dict[str, Any] = found.json()
        return approval

    async def finished(self, run_id: str) -> dict[str, Any]:
        async def done() -> dict[str, Any] | None:
            found = (await self.client.get(f"/runs/{run_id}", headers=STARTER)).json()
            return found if found["status"] == "finished" else None

        run: dict[str, Any] = await until(f"run {run_id} finishes", done)
        return run

    async def card(self, approval_id: str) -> Posted:
        """The review's card in the conversation, once posted."""

        def found() -> Posted | None:
            for posted in self.bf.cards(CONVERSATION):
                if approval_id in json.dumps(posted.versions[0]):
                    return posted
            return None

        posted: Posted = await until(f"the card of {approval_id}", found)
        return posted

    async def send(self, activity: dict[str, Any], **signing: Any) -> httpx.Response:
        """`activity`, posted to the bot as the Bot Framework does (signed), or as
        `signing` makes it wrong."""
        token = self.bf.sign(activity, **signing)
        headers = {"Authorization": f"Bearer {token}"}
        return await self.client.post("/teams/messages", json=activity, headers=headers)

    async def act(
        self,
        posted: Posted,
        user: str,
        verb: str,
        inputs: dict[str, Any] | None = None,
        shown: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """`user` takes action `verb` on the card (as `shown` to them): the card Teams is
        answered to show."""
        answer = await self.send(self.bf.invoke(posted, user, verb, inputs=inputs, shown=shown))
        assert answer.status_code == 200, answer.text
        found: dict[str, Any] = answer.json()
        assert (found["statusCode"], found["type"]) == (
            200,
            "application/vnd.microsoft.card.adaptive",
        )
        card: dict[str, Any] = found["value"]
        return card

    async def replaced(self, posted: Posted, outcome: str) -> dict[str, Any]:
        """The card, once the outbox has replaced it with the decided one saying `outcome`."""

        def done() -> dict[str, Any] | None:
            card = posted.card
            return card if not card["actions"] and outcome in json.dumps(card) else None

        try:
            card: dict[str, Any] = await until(f"the card says {outcome}", done)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; it says {json.dumps(posted.card)}") from None
        return card


@contextlib.asynccontextmanager
async def desk(tmp_path: Path) -> AsyncIterator[Desk]:
    async with botframework_fake(app_id=APP_ID, password=PASSWORD) as bf:
        bf.add_member(ANA, "Ana@Example.com")
        bf.add_member(BOB, "bob@example.com")
        bf.add_member(DAVE, "dave@example.com")
        config = tmp_path / "nodbot.yml"
        config.write_text(
            CONFIG.format(
                db=tmp_path / "nodbot.db",
                token=TOKEN,
                carol=CAROL_TOKEN,
                ana=ANA_TOKEN,
                app_id=APP_ID,
                openid_url=bf.openid_url,
                token_url=bf.token_url,
                conversation=CONVERSATION,
                service_url=bf.service_url,
            )
        )
        environment = {
            "TEAMS_APP_PASSWORD": PASSWORD,
            "NODBOT_TEST_LEDGER": str(tmp_path / "ledger.txt"),
        }
        async with (
            nodbot_serve(config, **environment) as bot,
            httpx.AsyncClient(base_url=bot.url, timeout=30) as client,
        ):
            yield Desk(bot, client, bf, tmp_path)


def _verbs(card: dict[str, Any]) -> list[str]:
    return [action["verb"] for action in card.get("actions", [])]


def _errors(card: dict[str, Any]) -> list[str]:
    return [
        block["text"]
        for block in card["body"]
        if block.get("type") == "TextBlock" and block.get("color") == "Attention"
    ]


async def test_a_review_in_teams_is_posted_once_and_decided_from_its_card(tmp_path: Path) -> None:
    async with desk(tmp_path) as d:
        run_id, approval_id = await d.start("A-1", "50")
        posted = await d.card(approval_id)
        card = posted.card
        assert card["version"] == "1.5" and _verbs(card) == ["approve", "edit", "deny"]
        assert all(a["type"] == "Action.Execute" for a in card["actions"])
        assert card["refresh"]["action"]["verb"] == "refresh"
        shown = json.dumps(card)
        assert "refund" in shown and "A-1" in shown
        assert "reviewed by the ledger" in shown

        # Refused with 401, and nothing recorded: unsigned, another key, another audience,
        # another service URL.
        activity = d.bf.invoke(posted, ANA, "approve")
        unsigned = await d.client.post("/teams/messages", json=activity)
        assert unsigned.status_code == 401
        other_key = new_key()
        for signing in (
            {"key": other_key},
            {"key": other_key, "kid": "a-key-nobody-published"},
            {"audience": "00000000-0000-4000-8000-0000000000ff"},
            {"issuer": "https://login.example.com"},
            {"service_url": "https://evil.example.com/connector"},
            {"expires_in": -3600},
        ):
            refused = await d.send(activity, **signing)
            assert refused.status_code == 401, signing
        approval = await d.approval(approval_id)
        assert approval["status"] == "pending"
        assert [e["kind"] for e in approval["events"]] == ["created", "delivered"]

        # Bob is no reviewer: refused, recorded, nothing decided; the card says why.
        answer = await d.act(posted, BOB, "approve")
        assert any("not one of the reviewers" in text for text in _errors(answer))
        approval = await d.approval(approval_id)
        assert approval["status"] == "pending" and approval["decision"] is None
        [refusal] = [e for e in approval["events"] if e["kind"] == "refused"]
        assert (refusal["actor"], refusal["channel"]) == ("bob@example.com", "teams")
        assert refusal["detail"]["evidence"]["user"] == BOB

        # Ana approves: the run goes on, the refund runs once, the card is replaced.
        answer = await d.act(posted, ANA, "approve")
        assert _verbs(answer) == [] and "Approved by ana@example.com" in json.dumps(answer)
        run = await d.finished(run_id)
        assert [r["status"] for r in run["tool_results"]] == ["ok"]
        assert ledger(tmp_path) == ["A-1 50.0"]
        approval = await d.approval(approval_id)
        [decided] = [e for e in approval["events"] if e["kind"] == "decided"]
        assert decided["actor"] == "ana@example.com" and decided["channel"] == "teams"
        assert decided["person"] == "email:ana@example.com"
        assert decided["detail"]["evidence"]["conversation"] == CONVERSATION
        assert decided["detail"]["evidence"]["card"] == posted.id
        await d.replaced(posted, "Approved by ana@example.com")
        # A click from a card shown before the update changes nothing: it gets the decision.
        stale = d.bf.invoke(posted, ANA, "deny", approval_id=approval_id)
        again = await d.send(stale)
        assert again.status_code == 200 and _verbs(again.json()["value"]) == []
        assert "Approved by ana@example.com" in again.text
        assert ledger(tmp_path) == ["A-1 50.0"]

        # Denied, with the reason typed on the card.
        run_id, approval_id = await d.start("A-2", "70")
        posted = await d.card(approval_id)
        answer = await d.act(posted, ANA, "deny", {"reason": "not this order"})
        assert "Denied by ana@example.com" in json.dumps(answer)
        await d.finished(run_id)
        approval = await d.approval(approval_id)
        assert approval["status"] == "denied"
        assert approval["decision"]["reason"] == "not this order"
        assert ledger(tmp_path) == ["A-1 50.0"]
        await d.replaced(posted, "not this order")

        # Edited: the form is typed from the tool's schema; an invalid value is shown on it.
        run_id, approval_id = await d.start("A-3", "90")
        posted = await d.card(approval_id)
        form = await d.act(posted, ANA, "edit")
        inputs = {e["id"]: e for e in form["body"] if e["type"].startswith("Input.")}
        assert set(inputs) == {"arg.order_id", "arg.amount"}
        assert inputs["arg.amount"]["value"] == "90.0"
        assert _verbs(form) == ["save", "refresh"]
        wrong = await d.act(
            posted, ANA, "save", {"arg.order_id": "A-3", "arg.amount": "lots"}, shown=form
        )
        assert _errors(wrong) and _verbs(wrong) == ["save", "refresh"]
        assert (await d.approval(approval_id))["status"] == "pending"
        saved = await d.act(
            posted, ANA, "save", {"arg.order_id": "A-3", "arg.amount": "20"}, shown=wrong
        )
        assert "Edited and approved by ana@example.com" in json.dumps(saved)
        await d.finished(run_id)
        assert ledger(tmp_path) == ["A-1 50.0", "A-3 20.0"]
        await d.replaced(posted, "Edited and approved")

        # Decided on another channel (the HTTP API): the card is replaced all the same.
        run_id, approval_id = await d.start("A-4", "10")
        posted = await d.card(approval_id)
        decided_elsewhere = await d.client.post(
            f"/approvals/{approval_id}/decide",
            json={"action": "approve"},
            headers={"Authorization": f"Bearer {CAROL_TOKEN}"},
        )
        assert decided_elsewhere.status_code == 200, decided_elsewhere.text
        await d.replaced(posted, "Approved by carol@example.com")
        await d.finished(run_id)

        # Each review was posted once; the keys and the bot's token were fetched once.
        assert len(d.bf.cards(CONVERSATION)) == 4
        assert d.bf.key_fetches == 1 and d.bf.token_requests == 1


async def test_teams_actions_honour_every_identity_rule(tmp_path: Path) -> None:
    async with desk(tmp_path) as d:
        # A conversation update is acknowledged (and logged for the operator), nothing more.
        update = {
            "type": "conversationUpdate",
            "channelId": "msteams",
            "serviceUrl": d.bf.service_url,
            "conversation": {"id": CONVERSATION},
            "membersAdded": [{"id": f"28:{APP_ID}"}],
        }
        assert (await d.send(update)).status_code == 200
        # A body that is no activity is refused as unverified; one past 64 KB as too large.
        headers = {"Authorization": f"Bearer {d.bf.sign(update)}"}
        for garbage in (b"{", b"[" * 100 + b"]" * 100, b'{"type": 1, "type": 2}', b"\xff"):
            answer = await d.client.post("/teams/messages", content=garbage, headers=headers)
            assert answer.status_code == 401, garbage
        huge = json.dumps({**update, "text": "x" * 70_000})
        answer = await d.client.post("/teams/messages", content=huge, headers=headers)
        assert answer.status_code == 413

        first_run, first = await d.start("B-1", "30")
        _, second = await d.start("B-2", "40")
        card_of_first = await d.card(first)
        await d.card(second)

        # An action naming another review than its card's: refused on that review.
        forged = d.bf.invoke(card_of_first, ANA, "approve", approval_id=second)
        answer = await d.send(forged)
        assert answer.status_code == 200 and "does not belong" in answer.text
        approval = await d.approval(second)
        assert approval["status"] == "pending"
        [refusal] = [e for e in approval["events"] if e["kind"] == "refused"]
        assert refusal["detail"]["reason"] == "this card does not belong to this review"

        # Dave started the run (he is `starter`, by the people: entry): he may not approve.
        answer = await d.act(card_of_first, DAVE, "approve")
        assert any("approve" in text.lower() for text in _errors(answer)), answer
        assert (await d.approval(first))["status"] == "pending"

        # Teams cannot say who Ana is: refused, recorded, nothing decided.
        d.bf.failing_members = True
        answer = await d.act(card_of_first, ANA, "approve")
        assert any("could not say who you are" in text for text in _errors(answer))
        approval = await d.approval(first)
        assert approval["status"] == "pending"
        assert [e["actor"] for e in approval["events"] if e["kind"] == "refused"] == [
            "dave@example.com",
            "teams:29:ana",
        ]
        d.bf.failing_members = False

        # Refresh shows the card as it stands, to anyone in the conversation.
        refreshed = await d.act(card_of_first, BOB, "refresh")
        assert _verbs(refreshed) == ["approve", "edit", "deny"]
        answer = await d.act(card_of_first, ANA, "approve")
        assert "Approved by ana@example.com" in json.dumps(answer)
        await d.finished(first_run)

        # Two approvals needed: Ana's counts once, whether in Teams or over the API.
        run_id, big = await d.start("B-3", "5000")
        posted = await d.card(big)
        assert _verbs(posted.card) == ["approve", "deny"]  # no edit of a vote of several
        answer = await d.act(posted, ANA, "approve")
        assert any("2 are needed" in text for text in _errors(answer))
        again = await d.client.post(
            f"/approvals/{big}/decide",
            json={"action": "approve"},
            headers={"Authorization": f"Bearer {ANA_TOKEN}"},
        )
        assert again.status_code == 409, again.text
        assert (await d.approval(big))["status"] == "pending"
        by_carol = await d.client.post(
            f"/approvals/{big}/decide",
            json={"action": "approve"},
            headers={"Authorization": f"Bearer {CAROL_TOKEN}"},
        )
        assert by_carol.status_code == 200, by_carol.text
        await d.replaced(posted, "Approved by ana@example.com, carol@example.com")
        await d.finished(run_id)
        assert ledger(tmp_path) == ["B-1 30.0", "B-3 5000.0"]
