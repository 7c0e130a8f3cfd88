"""The Teams channel's parts on their own: the check of the Bot Framework's tokens (against
the local fake's published keys, fetched over HTTP), the reading of invoke activities, and
the cards' escaping of what a call says.

The token check is tested as a property: a token signed by the published key verifies
exactly when its issuer, audience, service URL and expiry are the right ones, and any change
to a signed token's bytes that changes what it says makes it fail.
"""

from __future__ import annotations

import asyncio
import base64
import importlib.util
import json
import threading
import zipfile
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from nodbot.bot.forms import edit_fields
from nodbot.bot.teams.auth import (
    KEYS_TTL,
    LEEWAY,
    REFETCH_EVERY,
    RETRY_FAILED,
    TokenCheck,
    Unverified,
)
from nodbot.bot.teams.cards import edit_card, plain, review_card
from nodbot.bot.teams.reviews import MAX_FIELD, parse_action
from nodbot.core import ApprovalRecord, ApprovalRequest, Decision, arguments_digest
from nodbot.core.store import TIMEOUT_DECIDER
from tests.fakes.botframework import ISSUER, BotFrameworkFake, botframework_fake, new_key

APP_ID = "00000000-0000-4000-8000-00000000b07a"
PASSWORD = "password-of-the-teams-unit-tests-01"
SERVICE_URL = "https://smba.trafficmanager.net/amer/"
ACTIVITY = {"type": "invoke", "channelId": "msteams", "serviceUrl": SERVICE_URL}

HYPOTHESIS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@pytest.fixture(scope="module")
def fake() -> Iterator[BotFrameworkFake]:
    """The Bot Framework fake, served from a thread of its own for the module: each check
    below runs in an event loop of its own, as hypothesis runs examples one by one."""
    ready = threading.Event()
    held: dict[str, Any] = {}

    async def serve() -> None:
        async with botframework_fake(app_id=APP_ID, password=PASSWORD) as bf:
            held.update(bf=bf, loop=asyncio.get_running_loop(), stop=asyncio.Event())
            ready.set()
            await held["stop"].wait()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    assert ready.wait(10), "the Bot Framework fake did not start"
    yield held["bf"]
    held["loop"].call_soon_threadsafe(held["stop"].set)
    thread.join(10)


def verify(bf: BotFrameworkFake, token: str, activity: dict[str, Any] = ACTIVITY) -> dict[str, Any]:
    """The claims a fresh `TokenCheck` finds in `token`. Raises `Unverified`."""

    async def check() -> dict[str, Any]:
        async with aiohttp.ClientSession() as session:
            checker = TokenCheck(session, app_id=APP_ID, openid_url=bf.openid_url)
            return await checker.claims(f"Bearer {token}", activity)

    return asyncio.run(check())


def test_a_token_signed_as_the_bot_framework_signs_verifies(fake: BotFrameworkFake) -> None:
    claims = verify(fake, fake.sign(ACTIVITY))
    assert (claims["aud"], claims["iss"], claims["serviceUrl"]) == (APP_ID, ISSUER, SERVICE_URL)


@HYPOTHESIS
@given(
    audience=st.sampled_from([APP_ID, APP_ID.upper(), "", "other-bot", APP_ID + " "]),
    issuer=st.sampled_from([ISSUER, ISSUER + "/", "https://sts.windows.net/x/", "x"]),
    service_url=st.sampled_from([SERVICE_URL, SERVICE_URL.rstrip("/"), "https://evil.example/"]),
    expires_in=st.integers(min_value=-3 * LEEWAY, max_value=3600),
)
def test_a_token_verifies_exactly_when_every_claim_is_right(
    fake: BotFrameworkFake, audience: str, issuer: str, service_url: str, expires_in: int
) -> None:
    # Keep clear of the leeway's edge, which the seconds of the check itself may cross.
    assume(abs(expires_in + LEEWAY) > 5)
    token = fake.sign(
        ACTIVITY,
        audience=audience or "none",
        issuer=issuer,
        service_url=service_url,
        expires_in=expires_in,
    )
    right = (
        audience == APP_ID
        and issuer == ISSUER
        and service_url == SERVICE_URL
        and expires_in > -LEEWAY
    )
    if right:
        verify(fake, token)
    else:
        with pytest.raises(Unverified):
            verify(fake, token)


def _decoded(token: str) -> list[bytes]:
    def part(segment: str) -> bytes:
        try:
            return base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))
        except ValueError:
            return b"\x00not base64:" + segment.encode()

    return [part(segment) for segment in token.split(".")]


@HYPOTHESIS
@given(st.data())
def test_any_change_to_what_a_token_says_makes_it_fail(
    fake: BotFrameworkFake, data: st.DataObject
) -> None:
    token = fake.sign(ACTIVITY)
    at = data.draw(st.integers(min_value=0, max_value=len(token) - 1), label="at")
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_."
    replacement = data.draw(st.sampled_from(alphabet), label="replacement")
    tampered = token[:at] + replacement + token[at + 1 :]
    # A base64url segment's last character has bits that say nothing: a change there alone
    # leaves the token as it was.
    assume(_decoded(tampered) != _decoded(token))
    with pytest.raises(Unverified):
        verify(fake, tampered)


@pytest.mark.parametrize(
    "header",
    [None, "", "Basic abc", "Bearer ", "Bearer not-a-jwt", "bearer x.y.z", "Bearer " + "a" * 9000],
)
def test_a_request_without_a_bot_framework_token_is_refused(
    fake: BotFrameworkFake, header: str | None
) -> None:
    async def check() -> None:
        async with aiohttp.ClientSession() as session:
            checker = TokenCheck(session, app_id=APP_ID, openid_url=fake.openid_url)
            await checker.claims(header, ACTIVITY)

    with pytest.raises(Unverified):
        asyncio.run(check())


def test_tokens_signed_otherwise_are_refused(fake: BotFrameworkFake) -> None:
    other = new_key()
    for signing in (
        {"key": other},  # the published kid, another key
        {"key": other, "kid": "not-published"},
        {"algorithm": "RS512"},
        {"algorithm": "HS256", "key": "a-shared-secret-nobody-should-accept"},
    ):
        with pytest.raises(Unverified):
            verify(fake, fake.sign(ACTIVITY, **signing))  # type: ignore[arg-type]
    # The key is endorsed for Teams only.
    with pytest.raises(Unverified, match="endorsed"):
        verify(fake, fake.sign(ACTIVITY), {**ACTIVITY, "channelId": "webchat"})


def test_keys_that_cannot_be_fetched_refuse() -> None:
    async def check() -> None:
        async with aiohttp.ClientSession() as session:
            closed = "http://127.0.0.1:9/v1/.well-known/openidconfiguration"
            checker = TokenCheck(session, app_id=APP_ID, openid_url=closed)
            await checker.claims("Bearer a.b.c", ACTIVITY)

    with pytest.raises(Unverified):
        asyncio.run(check())


async def test_keys_are_kept_and_fetched_again_for_a_new_key_at_most_once_a_minute() -> None:
    now = [1_000.0]
    async with (
        botframework_fake(app_id=APP_ID, password=PASSWORD) as bf,
        aiohttp.ClientSession() as session,
    ):
        checker = TokenCheck(session, app_id=APP_ID, openid_url=bf.openid_url, clock=lambda: now[0])
        for _ in range(3):
            await checker.claims(f"Bearer {bf.sign(ACTIVITY)}", ACTIVITY)
        assert bf.key_fetches == 1
        # Tokens naming keys nobody published: one fetch a minute at most, however many.
        for _ in range(5):
            with pytest.raises(Unverified):
                await checker.claims(f"Bearer {bf.sign(ACTIVITY, kid='forged')}", ACTIVITY)
        assert bf.key_fetches == 1
        # The Bot Framework rolls its key: a token of the new key is checked after a refetch.
        bf.key, bf.kid = new_key(), "rolled"
        with pytest.raises(Unverified):
            await checker.claims(f"Bearer {bf.sign(ACTIVITY)}", ACTIVITY)
        now[0] += REFETCH_EVERY
        await checker.claims(f"Bearer {bf.sign(ACTIVITY)}", ACTIVITY)
        assert bf.key_fetches == 2


async def test_keys_that_cannot_be_fetched_are_asked_for_again_seconds_later_not_at_once() -> None:
    now = [1_000.0]
    async with (
        botframework_fake(app_id=APP_ID, password=PASSWORD) as bf,
        aiohttp.ClientSession() as session,
    ):
        checker = TokenCheck(session, app_id=APP_ID, openid_url=bf.openid_url, clock=lambda: now[0])
        bf.failing_keys = True
        for _ in range(5):
            with pytest.raises(Unverified):
                await checker.claims(f"Bearer {bf.sign(ACTIVITY)}", ACTIVITY)
        assert bf.metadata_fetches == 1
        bf.failing_keys = False
        now[0] += RETRY_FAILED
        await checker.claims(f"Bearer {bf.sign(ACTIVITY)}", ACTIVITY)
        # A day on, the keys are fetched again; while that fails, they are not used.
        now[0] += KEYS_TTL + 1
        bf.failing_keys = True
        for _ in range(3):
            with pytest.raises(Unverified):
                await checker.claims(f"Bearer {bf.sign(ACTIVITY)}", ACTIVITY)
        assert bf.metadata_fetches == 3
        bf.failing_keys = False
        now[0] += RETRY_FAILED
        await checker.claims(f"Bearer {bf.sign(ACTIVITY)}", ACTIVITY)
        assert bf.metadata_fetches == 4


# --- activities ------------------------------------------------------------------------------


def invoke(**changes: Any) -> dict[str, Any]:
    activity: dict[str, Any] = {
        "type": "invoke",
        "name": "adaptiveCard/action",
        "id": "f:1",
        "channelId": "msteams",
        "serviceUrl": SERVICE_URL,
        "from": {"id": "29:ana", "aadObjectId": "aad-1"},
        "conversation": {"id": "19:ops@thread.tacv2;messageid=1700000000000"},
        "replyToId": "1700000000001",
        "channelData": {"tenant": {"id": "tenant-1"}},
        "value": {
            "action": {
                "type": "Action.Execute",
                "verb": "approve",
                "data": {"approval_id": "apr_1", "reason": "x"},
            },
            "trigger": "manual",
        },
    }
    return {**activity, **changes}


def test_an_action_is_read_from_its_invoke() -> None:
    action = parse_action(invoke())
    assert action is not None
    assert (action.verb, action.approval_id, action.user) == ("approve", "apr_1", "29:ana")
    # A channel thread's conversation id is the channel's, with the thread after `;`.
    assert (action.conversation, action.card_id) == ("19:ops@thread.tacv2", "1700000000001")
    assert action.aad_object_id == "aad-1"
    assert action.evidence == {
        "user": "29:ana",
        "aad_object_id": "aad-1",
        "tenant": "tenant-1",
        "conversation": "19:ops@thread.tacv2",
        "card": "1700000000001",
        "activity": "f:1",
        "verb": "approve",
    }


@pytest.mark.parametrize(
    "changes",
    [
        {"type": "message"},
        {"name": "composeExtension/query"},
        {"value": None},
        {"value": {"action": {"type": "Action.Submit", "verb": "approve", "data": {}}}},
        {"value": {"action": {"type": "Action.Execute", "verb": "delete", "data": {}}}},
        {"value": {"action": {"type": "Action.Execute", "verb": "approve", "data": {}}}},
        {"value": {"action": {"type": "Action.Execute", "verb": "approve", "data": []}}},
        {"from": None},
        {"from": {"id": 7}},
        {"conversation": {"id": ""}},
        {"replyToId": None},
        {"serviceUrl": None},
    ],
)
def test_what_is_not_a_whole_action_is_none(changes: dict[str, Any]) -> None:
    assert parse_action(invoke(**changes)) is None


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(
    key=st.sampled_from(
        ["type", "name", "from", "conversation", "replyToId", "serviceUrl", "value", "id"]
    ),
    value=JSON,
    long=st.text(min_size=MAX_FIELD + 1, max_size=MAX_FIELD + 50),
)
def test_any_activity_is_read_without_failing_and_ids_are_bounded(
    key: str, value: Any, long: str
) -> None:
    parse_action(invoke(**{key: value}))
    action = parse_action(invoke(replyToId=long, **{"from": {"id": long}}))
    assert action is not None
    assert len(action.card_id) == MAX_FIELD and len(action.user) == MAX_FIELD


# --- cards -----------------------------------------------------------------------------------


@given(st.text(max_size=200))
def test_what_a_call_says_is_shown_as_text(text: str) -> None:
    shown = plain(text, limit=10_000)
    # Every markdown character is escaped: none follows an unescaped position bare.
    unescaped = []
    escaped = False
    for char in shown:
        if escaped:
            escaped = False
            continue
        if char == "\\":
            escaped = True
            continue
        unescaped.append(char)
    assert not set("*_[]()`~#>|<") & set(unescaped)
    assert json.loads(json.dumps(shown)) == shown


def test_long_values_are_clipped() -> None:
    assert len(plain("x" * 5000, limit=100)) == 100


# --- the app package -------------------------------------------------------------------------


def _recipe() -> Any:
    path = Path(__file__).resolve().parents[2] / "deploy" / "teams" / "make_package.py"
    spec = importlib.util.spec_from_file_location("make_package", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_app_package_carries_the_filled_manifest_and_its_icons(tmp_path: Path) -> None:
    out = tmp_path / "nodbot-teams.zip"
    _recipe().main(["--app-id", APP_ID, "--host", "bot.example.com", "--out", str(out)])
    with zipfile.ZipFile(out) as package:
        assert sorted(package.namelist()) == ["color.png", "manifest.json", "outline.png"]
        manifest = json.loads(package.read("manifest.json"))
        assert package.read("color.png").startswith(b"\x89PNG")
    assert "{{" not in json.dumps(manifest)
    assert manifest["id"] == APP_ID and manifest["bots"][0]["botId"] == APP_ID
    assert manifest["validDomains"] == ["bot.example.com"]
    assert manifest["icons"] == {"color": "color.png", "outline": "outline.png"}


@pytest.mark.parametrize(
    ("app_id", "host"),
    [("not-a-guid", "bot.example.com"), (APP_ID, 'bot.example.com", "x": "'), (APP_ID, "")],
)
def test_the_app_package_refuses_values_that_are_not_an_id_and_a_host(
    app_id: str, host: str
) -> None:
    with pytest.raises(ValueError, match=r"GUID|host name"):
        _recipe().manifest(app_id, host, "Example Ltd")


def _record(arguments: dict[str, Any], **policy: Any) -> ApprovalRecord:
    asked = ApprovalRequest(
        "run", "c1", "ship", arguments, arguments_digest(arguments), policy=policy
    )
    return ApprovalRecord("apr_1", asked, datetime.now(UTC))


def test_the_edit_form_is_typed_from_the_tools_schema() -> None:
    schema = {
        "properties": {
            "count": {"type": "integer"},
            "express": {"type": "boolean"},
            "speed": {"enum": ["slow", "fast"]},
            "note": {"type": "string"},
            "items": {"type": "array", "items": {"type": "string"}},
        }
    }
    arguments = {"count": 2, "express": True, "speed": "slow", "note": "[x](http://e)", "items": []}
    record = _record(arguments)
    card = edit_card(record, edit_fields(schema, arguments, None))
    inputs = {e["id"]: e for e in card["body"] if e["type"].startswith("Input.")}
    assert {name: e["type"] for name, e in inputs.items()} == {
        "arg.count": "Input.Text",
        "arg.express": "Input.ChoiceSet",
        "arg.speed": "Input.ChoiceSet",
        "arg.note": "Input.Text",
        "arg.items": "Input.Text",
    }
    assert [c["value"] for c in inputs["arg.speed"]["choices"]] == ['"slow"', '"fast"']
    assert inputs["arg.items"]["isMultiline"] is True
    # An input's value is what the reviewer edits: the text as it is, not escaped.
    assert inputs["arg.note"]["value"] == "[x](http://e)"
    assert [a["verb"] for a in card["actions"]] == ["save", "refresh"]


def test_the_card_shows_how_the_review_ended() -> None:
    record = _record({"to": "*everyone*"}, allowed_decisions=["approve", "deny"])
    card = review_card(record, allowed=["approve", "deny"], can_edit=True)
    assert [a["verb"] for a in card["actions"]] == ["approve", "deny"]  # not edit: not allowed
    facts = [f for e in card["body"] if e["type"] == "FactSet" for f in e["facts"]]
    assert {"title": "to", "value": "\\*everyone\\*"} in facts  # shown, not formatted
    timed_out = replace(
        record,
        decision=Decision(approved=False, decided_by=TIMEOUT_DECIDER),
        decided_at=datetime(2026, 1, 2, 3, 4, tzinfo=UTC),
    )
    card = review_card(timed_out, allowed=["approve"], can_edit=False)
    assert card["actions"] == []
    assert "Timed out: denied, 2026-01-02 03:04 UTC" in json.dumps(card)
    edited = replace(
        record,
        decision=Decision(approved=True, edited_args={"to": "ops"}, decided_by="ana@example.com"),
        decided_at=datetime(2026, 1, 2, 3, 4, tzinfo=UTC),
    )
    shown = json.dumps(review_card(edited, allowed=[], can_edit=False))
    assert "Edited and approved by ana@example.com" in shown and '"value": "ops"' in shown
