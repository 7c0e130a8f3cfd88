"""A local fake of Discord for tests: its REST API over real HTTP on 127.0.0.1, and a signer
of interactions as Discord signs them.

The fake serves what nodbot's Discord channel calls (`/api/v10` under its `api_url`):
posting a message to a channel (honouring `nonce` with `enforce_nonce`, as Discord does:
the same nonce from the same author returns the first message; a reply, `message_reference`,
to a message not in the channel refused as Discord refuses it), editing one, reading a
channel's latest messages (a reply with its `message_reference`), and an interaction's
follow-up messages. It checks the bot's
token (`Authorization: Bot <token>`), keeps every message with its edits for the test to
read, and fails on demand (`fail_next`; `lose_next_answers`: posted, but answered as failed).

    async with discord_fake() as discord:
        ...  # run nodbot with discord.api_url, discord.bot_token, discord.public_key
        [message] = discord.messages(CHANNEL)
        body, headers = discord.sign(click(discord, message, "approve", user=ANA))

`Signer` holds a test Ed25519 key: `sign(body)` gives the `X-Signature-Ed25519` and
`X-Signature-Timestamp` headers of a body, over the timestamp and the body, as Discord
signs them. `button_click`, `select_choice` (a pick in a select menu) and `modal_submit`
build the interactions Discord sends; `modal_problem` says what Discord would refuse in a
form (a modal) the bot answers a click with.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

JSON = dict[str, Any]

APPLICATION_ID = "1100000000000000001"
BOT_TOKEN = "fake-discord-bot-token-0000000000000000"
GUILD_ID = "1200000000000000002"
MAX_CONTENT = 2000
MAX_CUSTOM_ID = 100
MAX_NONCE = 25
MAX_MENTIONS = 100
"""Ids of users (or roles) a message's `allowed_mentions` may list at most."""
MAX_OPTIONS = 25
MAX_OPTION = 100
MAX_TITLE = 45
"""Characters of a modal's title, and of a text input's label, at most."""
MAX_INPUT = 4000
"""Characters of a modal text input's value at most."""


class Signer:
    """Signs interactions with a test Ed25519 key, as Discord signs them."""

    def __init__(self) -> None:
        self.key = Ed25519PrivateKey.generate()

    @property
    def public_key(self) -> str:
        """The public key as the developer portal shows it (hex)."""
        return self.key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw).hex()

    def headers(self, body: bytes, *, timestamp: int | None = None) -> dict[str, str]:
        """The headers Discord sends with `body`."""
        stamp = str(int(time.time()) if timestamp is None else timestamp)
        signature = self.key.sign(stamp.encode() + body).hex()
        return {
            "X-Signature-Ed25519": signature,
            "X-Signature-Timestamp": stamp,
            "Content-Type": "application/json",
        }

    def sign(self, interaction: JSON, *, timestamp: int | None = None) -> tuple[bytes, JSON]:
        """`interaction` as Discord posts it: its body and headers."""
        body = json.dumps(interaction, separators=(",", ":")).encode()
        return body, self.headers(body, timestamp=timestamp)


@dataclass
class Message:
    """A message the bot posted, as it stands now, and its earlier versions."""

    id: str
    channel_id: str
    body: JSON
    edits: list[JSON] = field(default_factory=list)

    @property
    def content(self) -> str:
        return str(self.body.get("content") or "")

    @property
    def options(self) -> list[JSON]:
        """The options of the message's select menus."""
        return [
            dict(option)
            for row in self.body.get("components") or []
            for component in row.get("components") or []
            for option in component.get("options") or []
        ]

    @property
    def custom_ids(self) -> list[str]:
        """The custom ids of the message's components (buttons, select menus)."""
        return [
            str(button["custom_id"])
            for row in self.body.get("components") or []
            for button in row.get("components") or []
        ]

    @property
    def replies_to(self) -> str | None:
        """The id of the message this one replies to (its `message_reference`), or None."""
        reference = self.body.get("message_reference")
        return str(reference.get("message_id")) if isinstance(reference, dict) else None

    @property
    def pings(self) -> JSON:
        """Whom the message may ping (its `allowed_mentions`; Discord's default, everyone
        its content mentions, when absent)."""
        found = self.body.get("allowed_mentions")
        return dict(found) if isinstance(found, dict) else {"parse": ["users", "roles", "everyone"]}

    def to_api(self) -> JSON:
        found: JSON = {
            "id": self.id,
            "channel_id": self.channel_id,
            "author": {"id": APPLICATION_ID, "bot": True},
            "content": self.content,
            "components": self.body.get("components") or [],
        }
        if self.replies_to is not None:  # a reply, as Discord shows one (type 19)
            found["type"] = 19
            found["message_reference"] = {
                "message_id": self.replies_to,
                "channel_id": self.channel_id,
                "guild_id": GUILD_ID,
            }
        return found


@dataclass
class FollowUp:
    """A message sent after an interaction (to its webhook)."""

    token: str
    body: JSON


class DiscordFake:
    """The fake's state and its REST API (see the module)."""

    def __init__(self) -> None:
        self.signer = Signer()
        self.bot_token = BOT_TOKEN
        self.application_id = APPLICATION_ID
        self.base_url = ""
        self._messages: dict[str, Message] = {}
        self._nonces: dict[str, str] = {}
        self._ids = itertools.count(1_300_000_000_000_000_000)
        self.follow_ups: list[FollowUp] = []
        self.requests: list[tuple[str, str]] = []
        """Every call, (method, path)."""
        self._failures: list[tuple[int, JSON]] = []
        self._lost = 0
        """Posts still to be made but answered as failed (`lose_next_answers`)."""
        self.held: asyncio.Event | None = None
        """When set to an event: a post is made (its message is in the channel) but answered
        only once the event is set, as a slow Discord answers."""
        self.app = Starlette(
            routes=[
                Route("/api/v10/channels/{channel}/messages", self._post, methods=["POST"]),
                Route("/api/v10/channels/{channel}/messages", self._recent, methods=["GET"]),
                Route(
                    "/api/v10/channels/{channel}/messages/{message}", self._edit, methods=["PATCH"]
                ),
                Route("/api/v10/webhooks/{application}/{token}", self._follow_up, methods=["POST"]),
            ]
        )

    @property
    def api_url(self) -> str:
        return f"{self.base_url}/api/v10"

    @property
    def public_key(self) -> str:
        return self.signer.public_key

    def messages(self, channel: str) -> list[Message]:
        """The messages posted to `channel`, oldest first."""
        return [m for m in self._messages.values() if m.channel_id == channel]

    def delete(self, message_id: str) -> None:
        """Delete a message as a moderator would: an edit of it is then answered 404."""
        self._messages.pop(message_id, None)

    def forget_nonces(self) -> None:
        """Forget the nonces of the posts so far, as Discord does after a few minutes: a post
        with one of them is then a new message."""
        self._nonces.clear()

    def lose_next_answers(self, count: int = 1) -> None:
        """The next `count` posts are made (each message is in its channel) but answered
        500, as when Discord's answer is lost on the way: the bot cannot know it posted."""
        self._lost += count

    def fail_next(self, status: int, body: JSON | None = None) -> None:
        """The next call to the bot's API answers `status` with `body`."""
        self._failures.append((status, body or {"message": "failed on purpose", "code": 0}))

    # --- the API -----------------------------------------------------------------------------

    def _refusal(self, request: Request, *, bot: bool = True) -> Response | None:
        self.requests.append((request.method, request.url.path))
        if bot and request.headers.get("authorization") != f"Bot {self.bot_token}":
            return JSONResponse({"message": "401: Unauthorized", "code": 0}, status_code=401)
        if self._failures:
            status, body = self._failures.pop(0)
            headers = {"Retry-After": "0"} if status == 429 else {}
            return JSONResponse(body, status_code=status, headers=headers)
        return None

    async def _post(self, request: Request) -> Response:
        refused = self._refusal(request)
        if refused is not None:
            return refused
        body = await request.json()
        problem = _problem(body)
        if problem is not None:
            return JSONResponse({"message": problem, "code": 50035}, status_code=400)
        nonce = body.get("nonce")
        if body.get("enforce_nonce") and nonce in self._nonces:
            return JSONResponse(self._messages[self._nonces[nonce]].to_api())
        channel = request.path_params["channel"]
        unknown = self._unknown_reference(body, channel)
        if unknown is not None:
            return JSONResponse({"message": unknown, "code": 50035}, status_code=400)
        message = Message(str(next(self._ids)), channel, body)
        self._messages[message.id] = message
        if isinstance(nonce, str):
            self._nonces[nonce] = message.id
        if self.held is not None:  # posted, and seen in the channel, but not answered yet
            await self.held.wait()
        if self._lost:
            self._lost -= 1
            return JSONResponse({"message": "answer lost on purpose", "code": 0}, status_code=500)
        return JSONResponse(message.to_api())

    def _unknown_reference(self, body: JSON, channel: str) -> str | None:
        """What Discord says of a reply to a message that is not in the channel (deleted, or
        never there), unless the reply says to post anyway (`fail_if_not_exists: false`)."""
        reference = body.get("message_reference")
        if not isinstance(reference, dict):
            return None
        replied = self._messages.get(str(reference.get("message_id")))
        if replied is not None and replied.channel_id == channel:
            return None
        if reference.get("fail_if_not_exists", True) is False:
            return None
        return "message_reference: Unknown message"

    async def _edit(self, request: Request) -> Response:
        refused = self._refusal(request)
        if refused is not None:
            return refused
        message = self._messages.get(request.path_params["message"])
        if message is None or message.channel_id != request.path_params["channel"]:
            return JSONResponse({"message": "Unknown Message", "code": 10008}, status_code=404)
        body = await request.json()
        problem = _problem(body)
        if problem is not None:
            return JSONResponse({"message": problem, "code": 50035}, status_code=400)
        message.edits.append(message.body)
        message.body = {**message.body, **body}
        return JSONResponse(message.to_api())

    async def _recent(self, request: Request) -> Response:
        refused = self._refusal(request)
        if refused is not None:
            return refused
        limit = int(request.query_params.get("limit", "50"))
        found = self.messages(request.path_params["channel"])[::-1][:limit]
        return JSONResponse([m.to_api() for m in found])

    async def _follow_up(self, request: Request) -> Response:
        refused = self._refusal(request, bot=False)
        if refused is not None:
            return refused
        if request.path_params["application"] != self.application_id:
            return JSONResponse({"message": "Unknown Webhook", "code": 10015}, status_code=404)
        self.follow_ups.append(FollowUp(request.path_params["token"], await request.json()))
        return JSONResponse({"id": str(next(self._ids))})


def _problem(body: Any) -> str | None:
    """What Discord would refuse in a message's body (the limits nodbot may reach)."""
    if not isinstance(body, dict):
        return "not a JSON object"
    if len(str(body.get("content") or "")) > MAX_CONTENT:
        return "content: must be 2000 or fewer in length"
    nonce = body.get("nonce")
    if nonce is not None and (not isinstance(nonce, str) or len(nonce) > MAX_NONCE):
        return "nonce: must be 25 or fewer in length"
    problem = _mentions_problem(body.get("allowed_mentions"))
    if problem is not None:
        return problem
    for row in body.get("components") or []:
        if row.get("type") != 1 or not 1 <= len(row.get("components") or []) <= 5:
            return "components: an action row of 1 to 5 components"
        components = row.get("components") or []
        for button in components:
            if len(str(button.get("custom_id") or "")) > MAX_CUSTOM_ID:
                return "custom_id: must be 100 or fewer in length"
            if button.get("type") == 3:
                problem = _select_problem(button, alone=len(components) == 1)
                if problem is not None:
                    return problem
    return None


def _mentions_problem(allowed: Any) -> str | None:
    """What Discord would refuse in a message's `allowed_mentions`."""
    if allowed is None:
        return None
    if not isinstance(allowed, dict):
        return "allowed_mentions: not an object"
    parse = allowed.get("parse") or []
    for kind in ("users", "roles"):
        listed = allowed.get(kind)
        if listed is None:
            continue
        if not isinstance(listed, list) or len(listed) > MAX_MENTIONS:
            return f"allowed_mentions.{kind}: a list of at most 100 ids"
        if kind in parse:
            return f"allowed_mentions: parse {kind} and a list of {kind} are mutually exclusive"
    return None


def _select_problem(select: JSON, *, alone: bool) -> str | None:
    """What Discord would refuse in a string select menu."""
    options = select.get("options") or []
    if not alone:
        return "components: a select menu is alone in its action row"
    if not 1 <= len(options) <= MAX_OPTIONS:
        return "options: between 1 and 25"
    for option in options:
        label, value = option.get("label"), option.get("value")
        if not isinstance(label, str) or not 1 <= len(label) <= MAX_OPTION:
            return "options.label: between 1 and 100 in length"
        if not isinstance(value, str) or not 1 <= len(value) <= MAX_OPTION:
            return "options.value: between 1 and 100 in length"
    if len({option.get("value") for option in options}) != len(options):
        return "options.value: must be unique"
    return None


def modal_problem(answer: JSON) -> str | None:
    """What Discord would refuse in a modal answered to an interaction (type 9), or None."""
    data = answer.get("data") or {}
    if answer.get("type") != 9 or not isinstance(data, dict):
        return "not a modal"
    if not 1 <= len(str(data.get("custom_id") or "")) <= MAX_CUSTOM_ID:
        return "custom_id: between 1 and 100 in length"
    if not 1 <= len(str(data.get("title") or "")) <= MAX_TITLE:
        return "title: between 1 and 45 in length"
    rows = data.get("components") or []
    if not 1 <= len(rows) <= 5:
        return "components: between 1 and 5 action rows"
    for row in rows:
        inputs = row.get("components") or []
        if row.get("type") != 1 or len(inputs) != 1 or inputs[0].get("type") != 4:
            return "components: an action row holds one text input"
        text_input = inputs[0]
        if not 1 <= len(str(text_input.get("custom_id") or "")) <= MAX_CUSTOM_ID:
            return "custom_id: between 1 and 100 in length"
        if not 1 <= len(str(text_input.get("label") or "")) <= MAX_TITLE:
            return "label: between 1 and 45 in length"
        most = text_input.get("max_length", MAX_INPUT)
        if not isinstance(most, int) or not 1 <= most <= MAX_INPUT:
            return "max_length: between 1 and 4000"
        if len(str(text_input.get("value") or "")) > most:
            return "value: longer than max_length"
    return None


def _snowflake() -> str:
    return str(1_400_000_000_000_000_000 + secrets.randbelow(10**17))


def button_click(
    fake: DiscordFake, message: Message, custom_id: str, *, user: str, token: str | None = None
) -> JSON:
    """The interaction Discord sends when `user` clicks the button `custom_id` of `message`."""
    return {
        "id": _snowflake(),
        "application_id": fake.application_id,
        "type": 3,
        "token": token or f"interaction-token-{secrets.token_hex(8)}",
        "version": 1,
        "guild_id": GUILD_ID,
        "channel_id": message.channel_id,
        "member": {"user": {"id": user, "username": f"user{user[-4:]}"}, "roles": []},
        "message": message.to_api(),
        "data": {"custom_id": custom_id, "component_type": 2},
    }


def select_choice(
    fake: DiscordFake,
    message: Message,
    custom_id: str,
    values: list[str],
    *,
    user: str,
    token: str | None = None,
) -> JSON:
    """The interaction Discord sends when `user` picks `values` (the options' values) in the
    string select menu `custom_id` of `message`."""
    interaction = button_click(fake, message, custom_id, user=user, token=token)
    interaction["data"] = {"custom_id": custom_id, "component_type": 3, "values": list(values)}
    return interaction


def modal_submit(
    fake: DiscordFake,
    message: Message,
    custom_id: str,
    values: dict[str, str],
    *,
    user: str,
    token: str | None = None,
) -> JSON:
    """The interaction Discord sends when `user` submits the modal `custom_id`, opened from a
    button of `message`, with `values` (input custom id -> text)."""
    rows = [
        {"type": 1, "components": [{"type": 4, "custom_id": key, "value": value}]}
        for key, value in values.items()
    ]
    return {
        "id": _snowflake(),
        "application_id": fake.application_id,
        "type": 5,
        "token": token or f"interaction-token-{secrets.token_hex(8)}",
        "version": 1,
        "guild_id": GUILD_ID,
        "channel_id": message.channel_id,
        "member": {"user": {"id": user, "username": f"user{user[-4:]}"}, "roles": []},
        "message": message.to_api(),
        "data": {"custom_id": custom_id, "components": rows},
    }


@contextlib.asynccontextmanager
async def discord_fake() -> AsyncIterator[DiscordFake]:
    """A DiscordFake served by uvicorn on a free 127.0.0.1 port for the block."""
    fake = DiscordFake()
    config = uvicorn.Config(fake.app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        for _ in range(500):  # bounded: at most 5 s
            if server.started or task.done():
                break
            await asyncio.sleep(0.01)
        assert server.started, "the Discord fake did not start"
        port = server.servers[0].sockets[0].getsockname()[1]
        fake.base_url = f"http://127.0.0.1:{port}"
        yield fake
    finally:
        server.should_exit = True
        await task
