"""The Teams channel attacked, and misused: what an attacker, or a confused member, might send
it, and what it must do then.

- tokens that say too little (no `exp`, no `kid`), too early (`nbf` ahead), or are signed
  otherwise (`alg` none, HS256 keyed by the published public key) are refused;
- only Teams' own activities (`channelId` `msteams`) are actions, even when the Bot
  Framework's key is endorsed for every channel;
- an action that names a connector other than the one its card was posted through is
  refused and recorded, and the bot's token is never sent there;
- a member lookup that fails (5xx, no such member) or says another AAD object refuses;
- a forged Save (an edit where the rule allows none, values of the wrong type, huge or
  deeply nested) decides nothing;
- what a call says is escaped (a heading's underline, a rule), and a review whose
  arguments are far larger than a Teams message is still posted, shortened, and replaced
  once decided; its edit form never holds a value cut short;
- the connector throttling (429 with Retry-After) or failing (5xx) delays a post and a
  replacement, never loses them; a card that was deleted does not keep the review's other
  cards from being replaced.

Actions are sent as Teams sends them, through `nodbot serve` in a process of its own, against
the local fake of the Bot Framework (tests/fakes/botframework.py).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest
from cryptography.hazmat.primitives import serialization

from nodbot.bot.forms import edit_fields
from nodbot.bot.teams.auth import LEEWAY, TokenCheck, Unverified
from nodbot.bot.teams.cards import MAX_CARD, edit_card, plain, review_card, size
from nodbot.bot.teams.reviews import parse_action
from nodbot.core import ApprovalRecord, ApprovalRequest, Decision, arguments_digest
from tests.bot.processes import Running, nodbot_serve
from tests.bot.test_email_end_to_end import until
from tests.bot.test_teams import invoke
from tests.fakes.botframework import BotFrameworkFake, Posted, botframework_fake

APP_ID = "00000000-0000-4000-8000-00000000b07c"
PASSWORD = "password-of-the-teams-attacks-bot0"
OPS, AUDIT = "19:ops@thread.tacv2", "19:audit@thread.tacv2"
TOKEN = "token-of-the-asker-of-the-attacks0"
ASKER = {"Authorization": f"Bearer {TOKEN}"}
ANA, MALLORY = "29:ana", "29:mallory"
ACTIVITY = {"type": "invoke", "channelId": "msteams", "serviceUrl": "https://smba.example/amer/"}

CONFIG = """
store: {{url: "sqlite:///{db}"}}
server: {{host: 127.0.0.1, port: 0}}
workers: {{poll: 0.2}}
api:
  tokens:
    - {{name: asker, token: {token}, scopes: [approvals:read, approvals:request]}}
external_tools: [refund, ship, wire]
teams:
  app_id: {app_id}
  app_password: ${{TEAMS_APP_PASSWORD}}
  openid_url: {openid_url}
  token_url: {token_url}
  post_to:
    - {{name: ops, conversation: "{ops}", service_url: {service_url}}}
    - {{name: audit, conversation: "{audit}", service_url: {service_url}}}
rules:
  - tool: ship
    reviewers: [ana@example.com]
    allowed_decisions: [approve, deny]
    post_to: [teams:ops]
  - tool: wire
    reviewers: [ana@example.com, bob@example.com]
    approvals_required: 2
    post_to: [teams:ops]
  - tool: refund
    reviewers: [ana@example.com]
"""

REFUND_SCHEMA = {
    "type": "object",
    "properties": {"order_id": {"type": "string"}, "amount": {"type": "integer"}},
    "required": ["order_id", "amount"],
    "additionalProperties": False,
}


# --- tokens ----------------------------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unsigned(bf: BotFrameworkFake, header: dict[str, Any], secret: bytes | None) -> str:
    """A token with the claims the Bot Framework would sign, but `header`, and an HMAC
    keyed by `secret` (or no signature at all)."""
    claims = json.loads(base64.urlsafe_b64decode(bf.sign(ACTIVITY).split(".")[1] + "=="))
    signed = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
    signature = (
        b"" if secret is None else hmac.new(secret, signed.encode(), hashlib.sha256).digest()
    )
    return f"{signed}.{_b64(signature)}"


async def test_tokens_that_say_too_little_too_early_or_are_signed_otherwise_are_refused() -> None:
    async with (
        botframework_fake(app_id=APP_ID, password=PASSWORD) as bf,
        aiohttp.ClientSession() as session,
    ):
        check = TokenCheck(session, app_id=APP_ID, openid_url=bf.openid_url)
        await check.claims(f"Bearer {bf.sign(ACTIVITY)}", ACTIVITY)  # as signed: verifies
        public = bf.key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        later = int(datetime.now(UTC).timestamp()) + LEEWAY + 120
        forged = [
            _unsigned(bf, {"alg": "none", "kid": bf.kid, "typ": "JWT"}, None),
            _unsigned(bf, {"alg": "HS256", "kid": bf.kid, "typ": "JWT"}, public),
            bf.sign(ACTIVITY, kid=""),  # names no key
            bf.sign(ACTIVITY, kid="a-key-nobody-published"),
            bf.sign(ACTIVITY, without=("exp",)),
            bf.sign(ACTIVITY, claims={"nbf": later}),
            bf.sign(ACTIVITY, without=("serviceUrl",)),
            bf.sign(ACTIVITY, expires_in=-LEEWAY - 60),
        ]
        for token in forged:
            with pytest.raises(Unverified):
                await check.claims(f"Bearer {token}", ACTIVITY)


def test_only_teams_activities_are_actions() -> None:
    # A key endorsed for every channel (or none listed) would let Web Chat or Direct Line,
    # whose clients write `from` themselves, through the token check: their activities are
    # no actions.
    assert parse_action(invoke()) is not None
    for channel in ("webchat", "directline", "emulator", "", None, ["msteams"]):
        assert parse_action(invoke(channelId=channel)) is None


# --- cards -----------------------------------------------------------------------------------


def _record(arguments: dict[str, Any], **policy: Any) -> ApprovalRecord:
    asked = ApprovalRequest(
        "run", "c1", "ship", arguments, arguments_digest(arguments), policy=policy
    )
    return ApprovalRecord("apr_1", asked, datetime.now(UTC))


def test_a_heading_underline_or_a_rule_in_a_value_is_shown_as_text() -> None:
    for text in ("total\n---", "total\n===", "---", "a\n  +++ b"):
        shown = plain(text)
        assert shown.replace("\\", "") == text
        for line in shown.splitlines():
            stripped = line.lstrip()
            assert not stripped or stripped[0] not in "-+=", shown


def test_a_date_function_in_a_value_is_shown_as_written() -> None:
    # Adaptive Cards turn {{DATE(...)}} and {{TIME(...)}} in a text into a local date.
    for text in ("{{DATE(2030-01-01T00:00:00Z, SHORT)}}", "due {{TIME(2030-01-01T09:00:00Z)}}"):
        shown = plain(text)
        assert "{{" not in shown and "}}" not in shown
        assert shown.replace("\\", "") == text


def _huge_arguments() -> dict[str, Any]:
    # Characters that grow as JSON or escaped (é, *, an emoji), far over a Teams message.
    return {f"field_{n:02}": ("é*_🚚[x](http://e) " * 700) for n in range(40)}


def test_a_card_of_large_arguments_fits_a_teams_message_shortened() -> None:
    arguments = _huge_arguments()
    record = _record(arguments)
    card = review_card(record, allowed=["approve", "edit", "deny"], can_edit=True)
    assert size(card) <= MAX_CARD
    assert [a["verb"] for a in card["actions"]] == ["approve", "edit", "deny"]
    texts = json.dumps(card, ensure_ascii=False)
    assert "Shortened to fit in Teams" in texts and "web inbox" in texts
    # Clipped, still escaped: no clip leaves a backslash escaping the ellipsis.
    facts = [f for e in card["body"] if e["type"] == "FactSet" for f in e["facts"]]
    assert facts and all(not f["value"].endswith("\\…") for f in facts)
    assert all(f["value"].endswith("…") for f in facts if f["title"].startswith("field"))
    decided = ApprovalRecord(
        "apr_1",
        record.request,
        record.created_at,
        decision=Decision(approved=False, reason="no *way* " * 200, decided_by="ana@example.com"),
        decided_at=datetime.now(UTC),
    )
    card = review_card(decided, allowed=[], can_edit=False)
    assert size(card) <= MAX_CARD and card["actions"] == []
    assert "Denied by ana@example.com" in json.dumps(card)


def test_the_edit_form_never_holds_a_value_cut_short() -> None:
    arguments = {"note": "x" * 9_000, "count": 3, **{f"tag_{n}": "t" * 1_500 for n in range(20)}}
    properties: dict[str, Any] = {name: {"type": "string"} for name in arguments}
    schema = {"properties": properties}
    schema["properties"]["count"] = {"type": "integer"}
    schema["properties"]["size"] = {"enum": [f"s{n}" for n in range(500)]}
    card = edit_card(_record(arguments), edit_fields(schema, arguments, None))
    assert size(card) <= MAX_CARD
    inputs = {e["id"]: e for e in card["body"] if e["type"].startswith("Input.")}
    assert "arg.count" in inputs and inputs["arg.count"]["value"] == "3"
    assert "arg.note" not in inputs and "arg.size" not in inputs  # too long for a card
    for name, element in inputs.items():
        value = arguments.get(name.removeprefix("arg."))
        if isinstance(value, str):
            assert element["value"] == value  # whole, or not offered at all
    said = json.dumps(card)
    assert "note: too long to edit in Teams" in said and "size: too long to edit in Teams" in said


# --- end to end ------------------------------------------------------------------------------


@dataclass
class Desk:
    """The bot serving, the Bot Framework fake, an evil connector, and an HTTP client."""

    bot: Running
    client: httpx.AsyncClient
    bf: BotFrameworkFake
    evil: BotFrameworkFake

    async def ask(self, tool: str, arguments: dict[str, Any], call_id: str) -> str:
        """A call of an external tool put to review (`POST /approvals`): its review."""
        body = {
            "tool": tool,
            "arguments": arguments,
            "schema": None if tool == "ship" else REFUND_SCHEMA,
            "run_id": f"run-{call_id}",
            "call_id": call_id,
        }
        answer = await self.client.post("/approvals", json=body, headers=ASKER)
        assert answer.status_code == 201, answer.text
        return str(answer.json()["approval_id"])

    async def approval(self, approval_id: str) -> dict[str, Any]:
        found = await self.client.get(f"/approvals/{approval_id}", headers=ASKER)
        assert found.status_code == 200, found.text
        approval: dict[str, Any] = found.json()
        return approval

    async def card(self, approval_id: str, conversation: str = OPS) -> Posted:
        def found() -> Posted | None:
            for posted in self.bf.cards(conversation):
                if approval_id in json.dumps(posted.versions[0]):
                    return posted
            return None

        posted: Posted = await until(f"the card of {approval_id} in {conversation}", found)
        return posted

    async def send(self, activity: dict[str, Any]) -> dict[str, Any]:
        """`activity`, signed as the Bot Framework signs it: the card Teams is answered."""
        token = self.bf.sign(activity)
        answer = await self.client.post(
            "/teams/messages", json=activity, headers={"Authorization": f"Bearer {token}"}
        )
        assert answer.status_code == 200, answer.text
        card: dict[str, Any] = answer.json()["value"]
        return card

    async def refusals(self, approval_id: str) -> list[str]:
        approval = await self.approval(approval_id)
        return [e["detail"]["reason"] for e in approval["events"] if e["kind"] == "refused"]


@contextlib.asynccontextmanager
async def desk(tmp_path: Path) -> AsyncIterator[Desk]:
    async with (
        botframework_fake(app_id=APP_ID, password=PASSWORD) as bf,
        botframework_fake(app_id=APP_ID, password=PASSWORD) as evil,
    ):
        bf.add_member(ANA, "ana@example.com", aad_object_id="aad-ana")
        evil.add_member(MALLORY, "ana@example.com", aad_object_id="aad-ana")
        config = tmp_path / "nodbot.yml"
        config.write_text(
            CONFIG.format(
                db=tmp_path / "nodbot.db",
                token=TOKEN,
                app_id=APP_ID,
                openid_url=bf.openid_url,
                token_url=bf.token_url,
                ops=OPS,
                audit=AUDIT,
                service_url=bf.service_url,
            )
        )
        async with (
            nodbot_serve(config, TEAMS_APP_PASSWORD=PASSWORD) as bot,
            httpx.AsyncClient(base_url=bot.url, timeout=30) as client,
        ):
            yield Desk(bot, client, bf, evil)


def _errors(card: dict[str, Any]) -> list[str]:
    return [
        block["text"]
        for block in card.get("body", [])
        if block.get("type") == "TextBlock" and block.get("color") == "Attention"
    ]


async def test_the_bot_s_token_goes_only_to_the_connector_its_card_was_posted_through(
    tmp_path: Path,
) -> None:
    async with desk(tmp_path) as d:
        review = await d.ask("refund", {"order_id": "o-1", "amount": 10}, "call_a")
        posted = await d.card(review)
        # An activity naming another connector (its token's claim says the same): the bot
        # asks that connector nothing, so it never sees the bot's token; refused, recorded.
        activity = d.bf.invoke(posted, MALLORY, "approve")
        activity["serviceUrl"] = d.evil.service_url
        card = await d.send(activity)
        assert any("did not come through the Teams connector" in e for e in _errors(card))
        assert d.evil.bearers == [] and d.evil.member_lookups == 0
        assert (await d.approval(review))["status"] == "pending"
        assert await d.refusals(review) == [
            "this action did not come through the Teams connector its card was posted to"
        ]
        # A Teams user the connector does not know (404), the connector failing (5xx), or a
        # member whose AAD object is not the activity's: who acted cannot be told.
        for user, aad, failing in (
            ("29:nobody", "aad-x", False),
            (ANA, "aad-ana", True),
            (ANA, "aad-someone-else", False),
            (ANA, 42, False),
        ):
            d.bf.failing_members = failing
            activity = d.bf.invoke(posted, user, "approve")
            activity["from"]["aadObjectId"] = aad
            card = await d.send(activity)
            if aad == 42:  # not an id: the lookup alone says who acted
                assert "Approved by ana@example.com" in json.dumps(card)
                break
            assert any("could not say who you are" in e for e in _errors(card)), card
            assert (await d.approval(review))["status"] == "pending"
        assert (await d.approval(review))["decision"]["decided_by"] == "ana@example.com"


async def test_a_forged_save_decides_nothing(tmp_path: Path) -> None:
    async with desk(tmp_path) as d:
        # Edit is not allowed on a call of `ship`: a Save sent anyway is refused.
        shipped = await d.ask("ship", {"order_id": "o-2", "amount": 5}, "call_b")
        posted = await d.card(shipped)
        assert [a["verb"] for a in posted.card["actions"]] == ["approve", "deny"]
        await d.send(
            d.bf.invoke(posted, ANA, "save", inputs={"arg.amount": "5000"}, approval_id=shipped)
        )
        assert (await d.approval(shipped))["status"] == "pending"
        # Nor on a review of several approvals (whose edit would win is unclear): neither
        # the form nor a Save sent anyway.
        wired = await d.ask("wire", {"order_id": "o-9", "amount": 5}, "call_w")
        posted = await d.card(wired)
        assert [a["verb"] for a in posted.card["actions"]] == ["approve", "deny"]
        card = await d.send(d.bf.invoke(posted, ANA, "edit", approval_id=wired))
        assert [a["verb"] for a in card["actions"]] == ["approve", "deny"]
        assert _errors(card) == ["Not done: this call may not be edited; approve or deny it"]
        inputs = {"arg.amount": "5000"}
        card = await d.send(d.bf.invoke(posted, ANA, "save", inputs=inputs, approval_id=wired))
        assert _errors(card) == ["Not done: this call may not be edited; approve or deny it"]
        approval = await d.approval(wired)
        assert approval["status"] == "pending"
        assert await d.refusals(wired) == ["this call may not be edited; approve or deny it"]
        # On a call that may be edited: values of the wrong type, huge or nested deep.
        review = await d.ask("refund", {"order_id": "o-3", "amount": 10}, "call_c")
        posted = await d.card(review)
        forged: list[dict[str, Any]] = [
            {"arg.amount": "ten"},
            {"arg.amount": {"$gt": 1}},
            {"arg.amount": [1, 2]},
            {"arg.order_id": "x" * 20_000},
            {"arg.amount": "10", "arg.extra": "not an argument"},
        ]
        for inputs in forged:
            card = await d.send(d.bf.invoke(posted, ANA, "save", inputs=inputs, approval_id=review))
            assert size(card) <= MAX_CARD
            assert (await d.approval(review))["status"] == "pending", inputs
        # JSON nested deeper than any activity: refused before it is read as one.
        activity = d.bf.invoke(posted, ANA, "save", approval_id=review)
        activity["value"]["action"]["data"]["arg.amount"] = json.loads("[" * 300 + "]" * 300)
        token = d.bf.sign(activity)
        answer = await d.client.post(
            "/teams/messages", json=activity, headers={"Authorization": f"Bearer {token}"}
        )
        assert answer.status_code in (401, 413), answer.text
        assert (await d.approval(review))["status"] == "pending"
        card = await d.send(
            d.bf.invoke(posted, ANA, "save", inputs={"arg.amount": "12"}, approval_id=review)
        )
        assert "Edited and approved by ana@example.com" in json.dumps(card)


async def test_a_review_larger_than_a_teams_message_is_posted_shortened_and_replaced(
    tmp_path: Path,
) -> None:
    async with desk(tmp_path) as d:
        arguments = {"order_id": "o-4", "amount": 10, "note": "é*🚚 " * 1_000}
        # Markdown to escape, and characters of four bytes in UTF-8 (twelve as JSON escapes).
        arguments |= {f"line_{n:02}": "[x](🚚) " * 100 for n in range(25)}
        review = await d.ask("refund", arguments, "call_d")
        posted = await d.card(review)
        assert "Shortened to fit in Teams" in json.dumps(posted.card, ensure_ascii=False)
        card = await d.send(d.bf.invoke(posted, ANA, "deny", inputs={"reason": "too *big*"}))
        assert "Denied by ana@example.com" in json.dumps(card)
        await until("the card is replaced", lambda: posted.card["actions"] == [])
        assert (await d.approval(review))["status"] == "denied"


async def test_a_throttled_or_failing_connector_delays_cards_and_loses_none(
    tmp_path: Path,
) -> None:
    async with desk(tmp_path) as d:
        d.bf.failures = [(429, {"Retry-After": "1"}), (503, {}), (502, {})]
        review = await d.ask("refund", {"order_id": "o-5", "amount": 10}, "call_e")
        ops, audit = await d.card(review, OPS), await d.card(review, AUDIT)
        assert len(d.bf.posts) == 2  # each once, after the failures
        # The card in one conversation was deleted meanwhile (404 on replace), and Teams
        # throttles the first replacement: the other card is still replaced.
        d.bf.posts.remove(ops)
        d.bf.failures = [(429, {"Retry-After": "1"})]
        card = await d.send(d.bf.invoke(audit, ANA, "approve"))
        assert "Approved by ana@example.com" in json.dumps(card)
        await until("the card is replaced", lambda: audit.card["actions"] == [])
        assert ops.card["actions"] != []
