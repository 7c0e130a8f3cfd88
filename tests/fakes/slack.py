"""A local fake of Slack for tests.

It serves the Web API, response URLs and Socket Mode over real HTTP and WebSocket on
127.0.0.1, so the real slack_sdk and slack_bolt code runs against it unchanged: point an
`AsyncWebClient(token=slack.bot_token, base_url=slack.api_url)` at it. It answers the way
Slack does (HTTP 200 with `{"ok": false, "error": ...}`, 429 with `Retry-After`), refuses
Block Kit payloads past Slack's limits, keeps everything the app did for the test to read,
and fails on demand.

    async with slack_fake() as slack:
        alice = slack.add_user("alice", "alice@example.com")
        ops = slack.add_channel("ops", members=[alice])
        ...  # run the code under test against slack.api_url
        [message] = slack.messages(ops)

The module also builds interactive payloads as Slack sends them and signs requests with a
signing secret (`signed_headers`, `block_actions_payload`, `view_submission_payload`,
`send_interactive`). Events API events go to the app as Slack sends them (`send_event`):
signed JSON to its `events_url`, or over its Socket Mode connection; `invite` sends
`member_joined_channel` so, and `open_home` sends `app_home_opened`.

App Home: `views.publish` keeps the last Home view published for each user (`home_view`,
checked as Slack checks it: type `home`, at most 100 blocks), and `home_click` builds the
`block_actions` payload of a button pressed on it. Slash commands: `slash_command_payload` and
`command_request` build and sign the form-encoded request Slack sends, `send_command` sends it
(to `events_url`, or over Socket Mode), and what the app sends to the command's
`response_url` is kept (`responses`) and shown as Slack shows it: an ephemeral message to the
user who typed the command (`ephemerals`), whose buttons `ephemeral_click` presses.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import itertools
import json
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import parse_qsl, urlencode

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

JSON = dict[str, Any]

BOT_TOKEN = "xoxb-1000000001-2000000002-fakebottoken0000000000"
APP_TOKEN = "xapp-1-A0000000001-3000000003-fakeapptoken000000000000"
SIGNING_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
VERIFICATION_TOKEN = "fakeverificationtoken000"
TEAM_DOMAIN = "nodbot-test"

# Slack's limits, as documented for Block Kit and chat.postMessage and as slack_sdk's models
# enforce them (slack_sdk.models.blocks / .views).
MAX_MESSAGE_BLOCKS = 50
MAX_VIEW_BLOCKS = 100
MAX_MESSAGE_TEXT = 40_000
MAX_SECTION_TEXT = 3000
MAX_SECTION_FIELDS = 10
MAX_FIELD_TEXT = 2000
MAX_HEADER_TEXT = 150
MAX_MARKDOWN_TEXT = 12_000  # per markdown block, and for all markdown blocks of a message
MAX_BUTTON_TEXT = 75
MAX_BUTTON_VALUE = 2000
MAX_URL = 3000
MAX_ACTION_ID = 255
MAX_BLOCK_ID = 255
MAX_ACTIONS_ELEMENTS = 25
MAX_CONTEXT_ELEMENTS = 10
MAX_PLACEHOLDER = 150
MAX_OPTIONS = 100
MAX_OPTION_TEXT = 75
MAX_OPTION_VALUE = 150
MAX_INPUT_LABEL = 2000
MAX_ALT_TEXT = 2000
MAX_VIEW_TITLE = 24  # also submit and close
MAX_PRIVATE_METADATA = 3000
MAX_CALLBACK_ID = 255

BLOCK_TYPES = frozenset(
    {
        "actions", "alert", "call", "card", "carousel", "container", "context", "context_actions",
        "divider", "file", "header", "image", "input", "markdown", "plan", "rich_text", "section",
        "table", "task_card", "video",
    }
)  # fmt: skip

TokenKind = Literal["bot", "app"]


# --------------------------------------------------------------------------------------------
# What the test sets up and what the fake keeps


@dataclass
class User:
    """A member of the fake workspace."""

    id: str
    name: str
    email: str | None
    real_name: str
    team_id: str
    is_bot: bool = False
    deleted: bool = False
    tz: str = "Europe/London"

    def to_api(self) -> JSON:
        """The user object of users.info and users.lookupByEmail."""
        profile: JSON = {
            "real_name": self.real_name,
            "real_name_normalized": self.real_name,
            "display_name": self.name,
            "display_name_normalized": self.name,
            "team": self.team_id,
        }
        if self.email is not None:
            profile["email"] = self.email
        return {
            "id": self.id,
            "team_id": self.team_id,
            "name": self.name,
            "deleted": self.deleted,
            "real_name": self.real_name,
            "tz": self.tz,
            "tz_label": "Greenwich Mean Time",
            "tz_offset": 0,
            "profile": profile,
            "is_admin": False,
            "is_owner": False,
            "is_bot": self.is_bot,
            "is_app_user": False,
            "updated": 1700000000,
        }


@dataclass
class Channel:
    """A channel, private channel, DM (`D...`) or group DM, with its members' ids."""

    id: str
    name: str
    members: list[str]
    is_private: bool = False
    is_im: bool = False
    is_mpim: bool = False
    user: str | None = None  # the other side of a DM

    def to_api(self) -> JSON:
        channel: JSON = {"id": self.id, "created": 1700000000, "is_im": self.is_im}
        if self.is_im:
            channel.update({"user": self.user, "is_org_shared": False, "priority": 0})
        else:
            channel.update(
                {
                    "name": self.name,
                    "is_channel": not self.is_private and not self.is_mpim,
                    "is_group": self.is_private,
                    "is_mpim": self.is_mpim,
                    "is_private": self.is_private or self.is_mpim,
                    "is_archived": False,
                }
            )
        return channel


@dataclass
class UserGroup:
    """A user group (`S...`), mentioned as @handle."""

    id: str
    handle: str
    name: str
    users: list[str]


@dataclass(frozen=True)
class MessageVersion:
    """One state of a message: as posted, then after each update."""

    text: str
    blocks: list[JSON]
    at: float
    via: str  # the method that produced it: chat.postMessage, chat.update or response_url


@dataclass
class Message:
    """A message in a channel; `versions` holds every state, the last one current."""

    channel: str
    ts: str
    user: str
    bot_id: str
    app_id: str
    team_id: str
    versions: list[MessageVersion]
    thread_ts: str | None = None
    attachments: list[JSON] | None = None
    metadata: JSON | None = None
    deleted: bool = False

    @property
    def text(self) -> str:
        return self.versions[-1].text

    @property
    def blocks(self) -> list[JSON]:
        return self.versions[-1].blocks

    @property
    def updates(self) -> list[MessageVersion]:
        """The versions after the first, one per update, oldest first."""
        return self.versions[1:]

    def to_api(self) -> JSON:
        """The message object Slack returns and puts in interactive payloads."""
        message: JSON = {
            "type": "message",
            "user": self.user,
            "bot_id": self.bot_id,
            "app_id": self.app_id,
            "team": self.team_id,
            "text": self.text,
            "blocks": self.blocks,
            "ts": self.ts,
        }
        if self.thread_ts is not None:
            message["thread_ts"] = self.thread_ts
        if self.attachments is not None:
            message["attachments"] = self.attachments
        if self.metadata is not None:
            message["metadata"] = self.metadata
        if self.updates:
            message["edited"] = {"user": self.user, "ts": self.ts}
        return message

    def action(self, action_id: str) -> tuple[str, JSON]:
        """The block id and element of the interactive element `action_id` in this message."""
        found = find_action(self.blocks, action_id)
        if found is None:
            ids = action_ids(self.blocks)
            raise AssertionError(f"no element {action_id!r} in message {self.ts}; it has {ids}")
        return found


@dataclass
class Ephemeral:
    """A message shown to one user only (chat.postEphemeral, or a response URL's default)."""

    channel: str
    user: str
    message_ts: str
    text: str
    blocks: list[JSON]
    thread_ts: str | None = None
    earlier: list[tuple[str, list[JSON]]] = field(default_factory=list)
    """Its text and blocks before each `replace_original` through a response URL."""
    deleted: bool = False
    """Deleted through a response URL (`delete_original`)."""

    def action(self, action_id: str, value: str | None = None) -> tuple[str, JSON]:
        """The block id and element of the interactive element `action_id` (with `value`, when
        given) in this message."""
        found = find_action(self.blocks, action_id, value)
        if found is None:
            ids = action_ids(self.blocks)
            raise AssertionError(
                f"no element {action_id!r} in this ephemeral message; it has {ids}"
            )
        return found


@dataclass
class HomeView:
    """The App Home tab of one user, as the app published it (views.publish); `versions`
    holds every view published, the last one shown."""

    id: str
    user: str
    team_id: str
    app_id: str
    bot_id: str
    hash: str
    versions: list[JSON]

    @property
    def view(self) -> JSON:
        return self.versions[-1]

    @property
    def blocks(self) -> list[JSON]:
        blocks = self.view.get("blocks", [])
        return blocks if isinstance(blocks, list) else []

    def action(self, action_id: str, value: str | None = None) -> tuple[str, JSON]:
        """The block id and element of the button `action_id` (with `value`, when given)."""
        found = find_action(self.blocks, action_id, value)
        if found is None:
            ids = action_ids(self.blocks)
            raise AssertionError(f"no element {action_id!r} ({value}) in the Home; it has {ids}")
        return found

    def to_api(self) -> JSON:
        """The view object of views.publish, and of the payloads of clicks on it."""
        view = self.view
        return {
            "id": self.id,
            "team_id": self.team_id,
            "type": "home",
            "blocks": self.blocks,
            "private_metadata": view.get("private_metadata", ""),
            "callback_id": view.get("callback_id", ""),
            "state": {"values": {}},
            "hash": self.hash,
            "title": {"type": "plain_text", "text": "View Title"},
            "clear_on_close": False,
            "notify_on_close": False,
            "close": None,
            "submit": None,
            "previous_view_id": None,
            "root_view_id": self.id,
            "app_id": self.app_id,
            "external_id": str(view.get("external_id", "")),
            "app_installed_team_id": self.team_id,
            "bot_id": self.bot_id,
        }


@dataclass
class View:
    """A modal opened with views.open; `versions` holds the view as opened, then updated."""

    id: str
    team_id: str
    app_id: str
    bot_id: str
    trigger_id: str
    user: str | None  # who caused the trigger, when the fake minted it
    hash: str
    versions: list[JSON]
    external_id: str = ""

    @property
    def view(self) -> JSON:
        return self.versions[-1]

    @property
    def callback_id(self) -> str:
        return str(self.view.get("callback_id", ""))

    @property
    def private_metadata(self) -> str:
        return str(self.view.get("private_metadata", ""))

    @property
    def blocks(self) -> list[JSON]:
        blocks = self.view.get("blocks", [])
        return blocks if isinstance(blocks, list) else []

    def to_api(self, state: JSON | None = None) -> JSON:
        """The view object of views.open and of view_submission payloads."""
        view = self.view
        return {
            "id": self.id,
            "team_id": self.team_id,
            "type": view.get("type", "modal"),
            "blocks": self.blocks,
            "private_metadata": view.get("private_metadata", ""),
            "callback_id": view.get("callback_id", ""),
            "state": {"values": state or {}},
            "hash": self.hash,
            "title": view.get("title"),
            "clear_on_close": bool(view.get("clear_on_close", False)),
            "notify_on_close": bool(view.get("notify_on_close", False)),
            "close": view.get("close"),
            "submit": view.get("submit"),
            "previous_view_id": None,
            "root_view_id": self.id,
            "app_id": self.app_id,
            "external_id": self.external_id,
            "app_installed_team_id": self.team_id,
            "bot_id": self.bot_id,
        }


@dataclass
class Call:
    """One Web API request as the fake received and answered it."""

    method: str
    params: JSON  # query, form and JSON body merged; JSON-valued form fields decoded
    token: str | None
    at: float  # time.time()
    http_method: str
    content_type: str
    status: int = 200
    ok: bool = False
    error: str | None = None
    fault: bool = False  # answered by an injected failure
    held: bool = False  # its answer was held back (`SlackFake.hold`)


@dataclass
class ResponsePost:
    """A POST to a response_url the fake handed out."""

    url: str
    body: JSON
    at: float


@dataclass(frozen=True)
class Failure:
    """An injected answer: an HTTP status with `{"ok": false, "error": error}`."""

    status: int = 200
    error: str = "internal_error"
    retry_after: int | None = None  # seconds, sent as Retry-After

    @classmethod
    def of(cls, spec: int | str | Failure) -> Failure:
        """429, 500 or 503 as Slack answers them, or an `ok: false` error code."""
        if isinstance(spec, Failure):
            return spec
        if isinstance(spec, str):
            return cls(200, spec)
        if spec == 429:
            return cls(429, "ratelimited", retry_after=1)
        if spec == 503:
            return cls(503, "service_unavailable")
        return cls(spec, "internal_error")


@dataclass
class EventSent:
    """An Events API event the fake sent to the app (`send_event`), and the app's answer."""

    body: JSON
    """The `event_callback` envelope: `body["event"]` is the event."""
    via: Literal["http", "socket"]
    status: int | None = None
    """The HTTP status the app answered with (over HTTP), once it answered."""
    ack: JSON | None = None
    """The app's ack (over Socket Mode), once it acked."""

    @property
    def answered(self) -> bool:
        return self.status is not None or self.ack is not None


@dataclass
class CommandSent:
    """A slash command the fake sent to the app (`send_command`), and the app's answer."""

    payload: dict[str, str]
    """The command's fields, as Slack form-encodes them."""
    via: Literal["http", "socket"]
    status: int | None = None
    """The HTTP status the app answered with (over HTTP)."""
    body: str | None = None
    """The body of the app's HTTP answer: empty, or a message Slack shows the user."""
    ack: JSON | None = None
    """The app's ack (over Socket Mode)."""

    @property
    def response_url(self) -> str:
        return self.payload["response_url"]


@dataclass
class SocketConnection:
    """A Socket Mode WebSocket opened by the app with a ticket from apps.connections.open."""

    id: int
    ticket: str
    websocket: WebSocket
    opened_at: float
    open: bool = True
    received: list[JSON] = field(default_factory=list)


class Refusal(Exception):
    """A Web API method's `ok: false` answer."""

    def __init__(self, error: str, **extra: Any) -> None:
        super().__init__(error)
        self.error = error
        self.extra = extra


# --------------------------------------------------------------------------------------------
# Block Kit checks, reported as Slack reports them: "[ERROR] ... [json-pointer:/blocks/0/...]"


class BlockChecker:
    """Collects Slack-style error messages for blocks and views past Slack's limits."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.markdown_total = 0

    def error(self, message: str, pointer: str) -> None:
        self.errors.append(f"[ERROR] {message} [json-pointer:{pointer}]")

    def length(self, value: Any, limit: int, pointer: str, *, required: bool = False) -> None:
        if value is None:
            if required:
                self.error("missing required field", pointer)
            return
        if not isinstance(value, str):
            self.error("must be a string", pointer)
        elif len(value) > limit:
            self.error(f"must be less than {limit + 1} characters", pointer)

    def count(self, items: Any, limit: int, pointer: str, *, minimum: int = 0) -> list[Any]:
        if not isinstance(items, list):
            self.error("must be an array", pointer)
            return []
        if len(items) > limit:
            self.error(f"no more than {limit} items allowed", pointer)
        if len(items) < minimum:
            self.error(f"must have at least {minimum} items", pointer)
        return items

    def text(
        self, obj: Any, limit: int, pointer: str, *, plain: bool = False, required: bool = True
    ) -> None:
        """A text object: plain_text or mrkdwn, 1 to `limit` characters."""
        if obj is None:
            if required:
                self.error("missing required field", pointer)
            return
        if not isinstance(obj, dict):
            self.error("must provide an object", pointer)
            return
        kind = obj.get("type")
        if plain and kind != "plain_text":
            self.error("must be a plain_text text object", f"{pointer}/type")
        elif kind not in ("plain_text", "mrkdwn"):
            self.error("must be one of plain_text, mrkdwn", f"{pointer}/type")
        text = obj.get("text")
        if not isinstance(text, str):
            self.error("must be a string", f"{pointer}/text")
        elif not text:
            self.error("must be more than 0 characters", f"{pointer}/text")
        else:
            self.length(text, limit, f"{pointer}/text")

    def options(self, options: Any, pointer: str) -> None:
        for i, option in enumerate(self.count(options, MAX_OPTIONS, pointer)):
            if not isinstance(option, dict):
                self.error("must provide an object", f"{pointer}/{i}")
                continue
            self.text(option.get("text"), MAX_OPTION_TEXT, f"{pointer}/{i}/text")
            self.length(option.get("value"), MAX_OPTION_VALUE, f"{pointer}/{i}/value")

    def element(self, element: Any, pointer: str) -> str | None:
        """An interactive element; returns its action_id."""
        if not isinstance(element, dict):
            self.error("must provide an object", pointer)
            return None
        kind = element.get("type")
        if not isinstance(kind, str):
            self.error("missing required field: type", pointer)
            return None
        self.length(element.get("action_id"), MAX_ACTION_ID, f"{pointer}/action_id")
        if kind == "button":
            self.text(element.get("text"), MAX_BUTTON_TEXT, f"{pointer}/text", plain=True)
            self.length(element.get("value"), MAX_BUTTON_VALUE, f"{pointer}/value")
            self.length(element.get("url"), MAX_URL, f"{pointer}/url")
            style = element.get("style")
            if style is not None and style not in ("primary", "danger"):
                self.error("must be one of primary, danger", f"{pointer}/style")
            self.confirm(element.get("confirm"), f"{pointer}/confirm")
        elif kind == "image":
            self.length(element.get("image_url"), MAX_URL, f"{pointer}/image_url")
            self.length(element.get("alt_text"), MAX_ALT_TEXT, f"{pointer}/alt_text", required=True)
        else:
            if "placeholder" in element:
                self.text(element["placeholder"], MAX_PLACEHOLDER, f"{pointer}/placeholder")
            if "options" in element:
                self.options(element["options"], f"{pointer}/options")
            self.confirm(element.get("confirm"), f"{pointer}/confirm")
        action_id = element.get("action_id")
        return action_id if isinstance(action_id, str) else None

    def confirm(self, confirm: Any, pointer: str) -> None:
        if confirm is None:
            return
        if not isinstance(confirm, dict):
            self.error("must provide an object", pointer)
            return
        self.text(confirm.get("title"), 100, f"{pointer}/title", plain=True)
        self.text(confirm.get("text"), 300, f"{pointer}/text")
        self.text(confirm.get("confirm"), 30, f"{pointer}/confirm", plain=True)
        self.text(confirm.get("deny"), 30, f"{pointer}/deny", plain=True)

    def blocks(self, blocks: Any, limit: int, pointer: str) -> None:
        items = self.count(blocks, limit, pointer)
        block_ids: set[str] = set()
        for i, block in enumerate(items):
            self.block(block, f"{pointer}/{i}", block_ids)

    def block(self, block: Any, pointer: str, block_ids: set[str]) -> None:
        if not isinstance(block, dict):
            self.error("must provide an object", pointer)
            return
        kind = block.get("type")
        if kind not in BLOCK_TYPES:
            self.error(f"unsupported type: {kind}", f"{pointer}/type")
            return
        block_id = block.get("block_id")
        if block_id is not None:
            self.length(block_id, MAX_BLOCK_ID, f"{pointer}/block_id")
            if block_id in block_ids:
                self.error(f"duplicate block_id: {block_id}", f"{pointer}/block_id")
            if isinstance(block_id, str):
                block_ids.add(block_id)
        if kind == "section":
            if "text" not in block and "fields" not in block:
                self.error("must provide text or fields", pointer)
            if "text" in block:
                self.text(block["text"], MAX_SECTION_TEXT, f"{pointer}/text")
            if "fields" in block:
                fields = self.count(block["fields"], MAX_SECTION_FIELDS, f"{pointer}/fields")
                for j, text in enumerate(fields):
                    self.text(text, MAX_FIELD_TEXT, f"{pointer}/fields/{j}")
            if "accessory" in block:
                self.element(block["accessory"], f"{pointer}/accessory")
        elif kind == "header":
            self.text(block.get("text"), MAX_HEADER_TEXT, f"{pointer}/text", plain=True)
        elif kind == "markdown":
            text = block.get("text")
            self.length(text, MAX_MARKDOWN_TEXT, f"{pointer}/text", required=True)
            if isinstance(text, str):
                self.markdown_total += len(text)
                if self.markdown_total > MAX_MARKDOWN_TEXT and len(text) <= MAX_MARKDOWN_TEXT:
                    self.error(
                        f"markdown blocks must total less than {MAX_MARKDOWN_TEXT + 1} characters",
                        f"{pointer}/text",
                    )
        elif kind == "actions":
            elements = self.count(
                block.get("elements"), MAX_ACTIONS_ELEMENTS, f"{pointer}/elements", minimum=1
            )
            seen: set[str] = set()
            for j, element in enumerate(elements):
                action_id = self.element(element, f"{pointer}/elements/{j}")
                if action_id is not None and action_id in seen:
                    self.error(
                        f"duplicate action_id: {action_id}", f"{pointer}/elements/{j}/action_id"
                    )
                if action_id is not None:
                    seen.add(action_id)
        elif kind == "context":
            elements = self.count(
                block.get("elements"), MAX_CONTEXT_ELEMENTS, f"{pointer}/elements", minimum=1
            )
            for j, element in enumerate(elements):
                where = f"{pointer}/elements/{j}"
                if isinstance(element, dict) and element.get("type") in ("plain_text", "mrkdwn"):
                    self.text(element, MAX_SECTION_TEXT, where)
                else:
                    self.element(element, where)
        elif kind == "input":
            self.text(block.get("label"), MAX_INPUT_LABEL, f"{pointer}/label", plain=True)
            self.text(
                block.get("hint"), MAX_INPUT_LABEL, f"{pointer}/hint", plain=True, required=False
            )
            self.element(block.get("element"), f"{pointer}/element")
        elif kind == "image":
            if "image_url" not in block and "slack_file" not in block:
                self.error("must provide image_url or slack_file", pointer)
            self.length(block.get("image_url"), MAX_URL, f"{pointer}/image_url")
            self.length(block.get("alt_text"), MAX_ALT_TEXT, f"{pointer}/alt_text", required=True)
            self.text(block.get("title"), 2000, f"{pointer}/title", plain=True, required=False)


def block_errors(
    blocks: Any, *, limit: int = MAX_MESSAGE_BLOCKS, pointer: str = "/blocks"
) -> list[str]:
    """Slack's error messages for a message's blocks (empty when Slack would accept them)."""
    checker = BlockChecker()
    checker.blocks(blocks, limit, pointer)
    return checker.errors


def view_errors(view: Any, kind: Literal["modal", "home"] = "modal") -> list[str]:
    """Slack's error messages for a modal view, or with `kind` "home" for a Home tab view
    (empty when Slack would accept it)."""
    checker = BlockChecker()
    if not isinstance(view, dict):
        checker.error("must provide an object", "/view")
        return checker.errors
    if view.get("type") != kind:
        checker.error(f"must be one of {kind}", "/view/type")
    if kind == "modal":
        checker.text(view.get("title"), MAX_VIEW_TITLE, "/view/title", plain=True)
    for name in ("submit", "close") if kind == "modal" else ():
        checker.text(view.get(name), MAX_VIEW_TITLE, f"/view/{name}", plain=True, required=False)
    checker.length(view.get("private_metadata"), MAX_PRIVATE_METADATA, "/view/private_metadata")
    checker.length(view.get("callback_id"), MAX_CALLBACK_ID, "/view/callback_id")
    checker.length(view.get("external_id"), MAX_CALLBACK_ID, "/view/external_id")
    blocks = view.get("blocks")
    if blocks is None:
        checker.error("missing required field: blocks", "/view")
    else:
        checker.blocks(blocks, MAX_VIEW_BLOCKS, "/view/blocks")
    has_input = isinstance(blocks, list) and any(
        isinstance(b, dict) and b.get("type") == "input" for b in blocks
    )
    if has_input and view.get("submit") is None:
        checker.error("submit is required when a view has input blocks", "/view/submit")
    return checker.errors


def find_action(
    blocks: Iterable[Any], action_id: str, value: str | None = None
) -> tuple[str, JSON] | None:
    """The block id and element with `action_id` (and `value`, when given) among blocks, or
    None."""
    for block_id, element in _elements(blocks):
        if element.get("action_id") == action_id and value in (None, element.get("value")):
            return block_id, element
    return None


def action_ids(blocks: Iterable[Any]) -> list[str]:
    """The action ids of every interactive element among blocks, in order."""
    return [str(e["action_id"]) for _, e in _elements(blocks) if "action_id" in e]


def _elements(blocks: Iterable[Any]) -> Iterable[tuple[str, JSON]]:
    for block in blocks:
        if not isinstance(block, dict):
            continue
        block_id = str(block.get("block_id", ""))
        candidates: list[Any] = []
        if block.get("type") in ("actions", "context"):
            candidates = list(block.get("elements") or [])
        elif block.get("type") == "section":
            candidates = [block.get("accessory")]
        elif block.get("type") == "input":
            candidates = [block.get("element")]
        for element in candidates:
            if isinstance(element, dict):
                yield block_id, element


# --------------------------------------------------------------------------------------------
# Requests as Slack sends them to an app: payloads, form encoding, signatures


def slack_signature(secret: str, timestamp: str | int, body: bytes | str) -> str:
    """`v0=` + HMAC-SHA256 of `v0:{timestamp}:{body}` under the signing secret."""
    raw = body.encode() if isinstance(body, str) else body
    base = b"v0:" + str(timestamp).encode() + b":" + raw
    return "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()


def signed_headers(
    secret: str, body: bytes | str, timestamp: int | str | None = None
) -> dict[str, str]:
    """The headers Slack signs a request with (now, unless `timestamp` is given)."""
    stamp = str(int(time.time()) if timestamp is None else timestamp)
    return {
        "X-Slack-Request-Timestamp": stamp,
        "X-Slack-Signature": slack_signature(secret, stamp, body),
    }


def form_body(payload: JSON) -> bytes:
    """An interactive payload the way Slack posts it: `payload=<json>`, form-encoded."""
    return urlencode({"payload": json.dumps(payload, separators=(",", ":"))}).encode()


def interactive_request(
    payload: JSON, secret: str, timestamp: int | str | None = None
) -> tuple[bytes, dict[str, str]]:
    """The body and headers of Slack's POST of an interactive payload to an app."""
    body = form_body(payload)
    headers = {
        "Content-Type": "application/x-www-form-urlencoded",
        "User-Agent": "Slackbot 1.0 (+https://api.slack.com/robots)",
        **signed_headers(secret, body, timestamp),
    }
    return body, headers


async def send_interactive(
    url: str, payload: JSON, secret: str, *, timestamp: int | str | None = None
) -> httpx.Response:
    """POST an interactive payload to an app's endpoint (e.g. /slack/events), signed."""
    body, headers = interactive_request(payload, secret, timestamp)
    async with httpx.AsyncClient(timeout=10.0) as client:
        return await client.post(url, content=body, headers=headers)


def new_trigger_id() -> str:
    """A trigger id in Slack's format; views.open accepts it only when a fake minted it."""
    return f"{int(time.time())}.{uuid.uuid4().int % 10**10}.{uuid.uuid4().hex}"


def _user(user_id: str, user_name: str, team_id: str) -> JSON:
    return {"id": user_id, "username": user_name, "name": user_name, "team_id": team_id}


def block_actions_payload(
    *,
    action_id: str,
    block_id: str,
    value: str | None,
    user_id: str,
    user_name: str,
    team_id: str,
    channel_id: str,
    message_ts: str,
    trigger_id: str | None = None,
    api_app_id: str = "A0000000001",
    team_domain: str = TEAM_DOMAIN,
    channel_name: str = "",
    message: JSON | None = None,
    action: JSON | None = None,
    response_url: str | None = None,
) -> JSON:
    """A `block_actions` payload: `user_id` pressed the button `action_id` on a message.

    `action` is the element pressed (its text and style are copied); `message` the message
    object as Slack includes it (a bare one with `message_ts` when not given).
    """
    pressed = _pressed(action_id, block_id, value, action)
    payload: JSON = {
        "type": "block_actions",
        "user": _user(user_id, user_name, team_id),
        "api_app_id": api_app_id,
        "token": VERIFICATION_TOKEN,
        "container": {
            "type": "message",
            "message_ts": message_ts,
            "channel_id": channel_id,
            "is_ephemeral": False,
        },
        "trigger_id": trigger_id or new_trigger_id(),
        "team": {"id": team_id, "domain": team_domain},
        "enterprise": None,
        "is_enterprise_install": False,
        "channel": {"id": channel_id, "name": channel_name},
        "message": message or {"type": "message", "ts": message_ts, "text": "", "blocks": []},
        "state": {"values": {}},
        "actions": [pressed],
    }
    if response_url is not None:
        payload["response_url"] = response_url
    return payload


def _pressed(action_id: str, block_id: str, value: str | None, action: JSON | None) -> JSON:
    """The `actions` entry of a pressed element (its text and style copied)."""
    element = action or {"type": "button", "text": {"type": "plain_text", "text": action_id}}
    pressed: JSON = {
        "action_id": action_id,
        "block_id": block_id,
        "text": element.get("text"),
        "type": element.get("type", "button"),
        "action_ts": f"{time.time():.6f}",
    }
    if value is not None:
        pressed["value"] = value
    if "style" in element:
        pressed["style"] = element["style"]
    return pressed


def home_actions_payload(
    *,
    action_id: str,
    block_id: str,
    value: str | None,
    user_id: str,
    user_name: str,
    team_id: str,
    view: JSON,
    trigger_id: str | None = None,
    api_app_id: str = "A0000000001",
    team_domain: str = TEAM_DOMAIN,
    action: JSON | None = None,
) -> JSON:
    """A `block_actions` payload of `user_id` pressing `action_id` on their App Home tab:
    its container is the view (`view` is the Home's view object), and it has no channel, no
    message and no response_url, as Slack sends it."""
    return {
        "type": "block_actions",
        "user": _user(user_id, user_name, team_id),
        "api_app_id": api_app_id,
        "token": VERIFICATION_TOKEN,
        "container": {"type": "view", "view_id": view["id"]},
        "trigger_id": trigger_id or new_trigger_id(),
        "team": {"id": team_id, "domain": team_domain},
        "enterprise": None,
        "is_enterprise_install": False,
        "view": view,
        "actions": [_pressed(action_id, block_id, value, action)],
    }


def slash_command_payload(
    *,
    command: str,
    text: str,
    user_id: str,
    user_name: str,
    team_id: str,
    channel_id: str,
    response_url: str,
    channel_name: str = "directmessage",
    trigger_id: str | None = None,
    api_app_id: str = "A0000000001",
    team_domain: str = TEAM_DOMAIN,
) -> dict[str, str]:
    """The fields of a slash command as Slack sends them (every value a string)."""
    return {
        "token": VERIFICATION_TOKEN,
        "team_id": team_id,
        "team_domain": team_domain,
        "channel_id": channel_id,
        "channel_name": channel_name,
        "user_id": user_id,
        "user_name": user_name,
        "command": command,
        "text": text,
        "api_app_id": api_app_id,
        "is_enterprise_install": "false",
        "response_url": response_url,
        "trigger_id": trigger_id or new_trigger_id(),
    }


def command_request(
    payload: Mapping[str, str], secret: str, timestamp: int | str | None = None
) -> tuple[bytes, dict[str, str]]:
    """The body and headers of Slack's POST of a slash command to an app: the fields
    form-encoded (not as `payload=`), signed like every request of Slack."""
    body = urlencode(dict(payload)).encode()
    headers = {
        "Content-Type": "application/x-www-form-urlencoded",
        "User-Agent": "Slackbot 1.0 (+https://api.slack.com/robots)",
        **signed_headers(secret, body, timestamp),
    }
    return body, headers


def _view_object(
    *,
    view_id: str,
    team_id: str,
    callback_id: str,
    private_metadata: str,
    values: JSON,
    api_app_id: str,
    view_hash: str,
    title: str,
    blocks: list[JSON],
) -> JSON:
    return {
        "id": view_id,
        "team_id": team_id,
        "type": "modal",
        "blocks": blocks,
        "private_metadata": private_metadata,
        "callback_id": callback_id,
        "state": {"values": values},
        "hash": view_hash,
        "title": {"type": "plain_text", "text": title, "emoji": True},
        "clear_on_close": False,
        "notify_on_close": False,
        "close": None,
        "submit": None,
        "previous_view_id": None,
        "root_view_id": view_id,
        "app_id": api_app_id,
        "external_id": "",
        "app_installed_team_id": team_id,
        "bot_id": "B0000000001",
    }


def view_submission_payload(
    *,
    view_id: str,
    callback_id: str,
    values: Mapping[str, Mapping[str, JSON]],
    user_id: str,
    user_name: str,
    team_id: str,
    private_metadata: str = "",
    trigger_id: str | None = None,
    api_app_id: str = "A0000000001",
    team_domain: str = TEAM_DOMAIN,
    view_hash: str = "1700000000.abcdef12",
    title: str = "Review",
    blocks: list[JSON] | None = None,
    view: JSON | None = None,
) -> JSON:
    """A `view_submission` payload; `values` is state.values: {block_id: {action_id: state}},
    e.g. {"reason": {"reason_input": {"type": "plain_text_input", "value": "no receipt"}}}.
    `view` (a full view object) replaces the one built from the other arguments."""
    state = {block: dict(actions) for block, actions in values.items()}
    if view is None:
        view = _view_object(
            view_id=view_id,
            team_id=team_id,
            callback_id=callback_id,
            private_metadata=private_metadata,
            values=state,
            api_app_id=api_app_id,
            view_hash=view_hash,
            title=title,
            blocks=blocks or [],
        )
    return {
        "type": "view_submission",
        "team": {"id": team_id, "domain": team_domain},
        "user": _user(user_id, user_name, team_id),
        "api_app_id": api_app_id,
        "token": VERIFICATION_TOKEN,
        "trigger_id": trigger_id or new_trigger_id(),
        "view": view,
        "response_urls": [],
        "is_enterprise_install": False,
        "enterprise": None,
    }


def view_closed_payload(
    *,
    view_id: str,
    callback_id: str,
    user_id: str,
    user_name: str,
    team_id: str,
    private_metadata: str = "",
    api_app_id: str = "A0000000001",
    team_domain: str = TEAM_DOMAIN,
    view: JSON | None = None,
) -> JSON:
    """A `view_closed` payload (sent only for views opened with notify_on_close)."""
    if view is None:
        view = _view_object(
            view_id=view_id,
            team_id=team_id,
            callback_id=callback_id,
            private_metadata=private_metadata,
            values={},
            api_app_id=api_app_id,
            view_hash="1700000000.abcdef12",
            title="Review",
            blocks=[],
        )
    return {
        "type": "view_closed",
        "team": {"id": team_id, "domain": team_domain},
        "user": _user(user_id, user_name, team_id),
        "api_app_id": api_app_id,
        "token": VERIFICATION_TOKEN,
        "view": view,
        "is_cleared": False,
        "is_enterprise_install": False,
        "enterprise": None,
    }


_SELECTED_ONE = {
    "users_select": "selected_user",
    "conversations_select": "selected_conversation",
    "channels_select": "selected_channel",
    "datepicker": "selected_date",
    "timepicker": "selected_time",
}
_SELECTED_MANY = {
    "multi_users_select": "selected_users",
    "multi_conversations_select": "selected_conversations",
    "multi_channels_select": "selected_channels",
}


def _option(element: JSON, value: str) -> JSON:
    options = list(element.get("options") or [])
    for group in element.get("option_groups") or []:
        options.extend(group.get("options") or [])
    for option in options:
        if option.get("value") == value:
            return dict(option)
    raise AssertionError(f"{element.get('action_id')!r} has no option with value {value!r}")


def _initial(element: JSON) -> Any:
    """What an input an opened view shows holds before anyone types or picks: its initial
    value (a text or number input), the value of its initial option (a select), else None."""
    if "initial_value" in element:
        return element["initial_value"]
    option = element.get("initial_option")
    return option.get("value") if isinstance(option, dict) else None


def state_value(element: JSON, value: Any) -> JSON:
    """The state.values entry Slack sends for `element` holding `value` (a dict is taken as
    the entry itself; None is an empty field)."""
    if isinstance(value, dict):
        return value
    kind = str(element.get("type"))
    if kind in ("static_select", "external_select", "radio_buttons"):
        return {"type": kind, "selected_option": None if value is None else _option(element, value)}
    if kind in ("checkboxes", "multi_static_select", "multi_external_select"):
        chosen = [_option(element, v) for v in value or []]
        return {"type": kind, "selected_options": chosen}
    if kind in _SELECTED_ONE:
        return {"type": kind, _SELECTED_ONE[kind]: value}
    if kind in _SELECTED_MANY:
        return {"type": kind, _SELECTED_MANY[kind]: list(value or [])}
    return {"type": kind, "value": value}


# --------------------------------------------------------------------------------------------
# The fake


def _json_response(
    body: JSON, status: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    return Response(
        json.dumps(body),
        status_code=status,
        headers=dict(headers or {}),
        media_type="application/json; charset=utf-8",
    )


def _flag(value: Any) -> bool:
    return value is True or str(value).lower() in ("1", "true")


def _text(params: JSON, name: str) -> str | None:
    value = params.get(name)
    if value is None:
        return None
    return value if isinstance(value, str) else str(value)


class SlackFake:
    """Slack's Web API, response URLs and Socket Mode for one test, with a workspace the test
    fills in (`add_user`, `add_channel`, `add_usergroup`) and a record of everything the app
    did (`calls`, `messages()`, `ephemerals`, `views`, `response_posts`, `socket_messages`).

    IDs are Slack-shaped and deterministic per instance (`U...`, `C...`, `D...`, `S...`,
    `T...`, `B...`, `A...`, `V...`); message ts are Slack-shaped, unique and increasing.
    """

    def __init__(
        self,
        *,
        bot_token: str = BOT_TOKEN,
        app_token: str = APP_TOKEN,
        signing_secret: str = SIGNING_SECRET,
        team_domain: str = TEAM_DOMAIN,
        bot_name: str = "nodbot",
    ) -> None:
        self._counters: dict[str, itertools.count[int]] = {}
        self.bot_token = bot_token
        self.app_token = app_token
        self.signing_secret = signing_secret
        # Which tokens authenticate, and as what; a test may add or remove some.
        self.tokens: dict[str, TokenKind] = {bot_token: "bot", app_token: "app"}
        self.team_id = self.new_id("T")
        self.team_domain = team_domain
        self.team_name = "nodbot test"
        self.app_id = self.new_id("A")
        self.bot_id = self.new_id("B")
        self.users: dict[str, User] = {}
        self.channels: dict[str, Channel] = {}
        self.usergroups: dict[str, UserGroup] = {}
        self.bot_user = self.add_user(bot_name, None, "nodbot", is_bot=True)

        self.calls: list[Call] = []
        self._messages: dict[str, list[Message]] = {}
        self.ephemerals: list[Ephemeral] = []
        self.views: list[View] = []
        self.response_posts: list[ResponsePost] = []
        self._response_urls: dict[str, tuple[str, str] | None] = {}
        # Response URLs of slash commands -> (channel, user), and of ephemeral messages.
        self._command_urls: dict[str, tuple[str, str]] = {}
        self._ephemeral_urls: dict[str, Ephemeral] = {}
        self.homes: dict[str, HomeView] = {}  # user id -> their App Home, as published
        self.commands: list[CommandSent] = []  # every slash command sent to the app

        # Trigger ids the fake minted (for click/submit payloads) -> (user, minted at).
        self._triggers: dict[str, tuple[str | None, float]] = {}
        self._used_triggers: set[str] = set()
        self.strict_triggers = True  # views.open refuses trigger ids the fake did not mint
        self.trigger_ttl: float | None = None  # Slack's is 3 s; None never expires

        self._failures: dict[str, deque[tuple[Failure, Callable[[JSON], bool] | None]]] = {}
        self._holds: dict[str, asyncio.Event] = {}  # method -> released
        self._rate_every: int | None = None
        self._rate_retry_after = 1
        self._rate_methods: frozenset[str] | None = None
        self._rate_count = 0

        # Where Slack sends the app's events (its Event Subscriptions' Request URL); None:
        # over Socket Mode while the app has a connection open, else nowhere.
        self.events_url: str | None = None
        self.events: list[EventSent] = []  # every event sent to the app
        self._sending: set[asyncio.Task[EventSent]] = set()

        self._tickets: dict[str, bool] = {}  # ticket -> used
        self.socket_connections: list[SocketConnection] = []
        self.socket_messages: list[JSON] = []  # every message an app sent over Socket Mode
        self.envelopes: list[JSON] = []  # every envelope the fake pushed
        self._acks: dict[str, asyncio.Future[JSON]] = {}

        self._last_ts = 0
        self._changed = asyncio.Event()
        self.base_url = ""  # http://127.0.0.1:PORT, once serving
        self.app = Starlette(
            routes=[
                Route("/api/{method}", self._api, methods=["GET", "POST"]),
                Route("/actions/{key}", self._response_url, methods=["POST"]),
                WebSocketRoute("/link/", self._socket),
            ]
        )
        self._handlers: dict[str, tuple[TokenKind, Callable[[JSON], JSON]]] = {
            "auth.test": ("bot", self._auth_test),
            "chat.postMessage": ("bot", self._chat_post_message),
            "chat.update": ("bot", self._chat_update),
            "chat.postEphemeral": ("bot", self._chat_post_ephemeral),
            "views.open": ("bot", self._views_open),
            "views.update": ("bot", self._views_update),
            "views.publish": ("bot", self._views_publish),
            "conversations.open": ("bot", self._conversations_open),
            "conversations.members": ("bot", self._conversations_members),
            "conversations.info": ("bot", self._conversations_info),
            "usergroups.users.list": ("bot", self._usergroups_users_list),
            "users.lookupByEmail": ("bot", self._users_lookup_by_email),
            "users.info": ("bot", self._users_info),
            "conversations.history": ("bot", self._conversations_history),
            "conversations.replies": ("bot", self._conversations_replies),
            "apps.connections.open": ("app", self._apps_connections_open),
        }

    # -- addresses ---------------------------------------------------------------------------

    @property
    def api_url(self) -> str:
        """The Web API base URL, for `AsyncWebClient(base_url=...)`."""
        return f"{self.base_url}/api/"

    # -- ids ---------------------------------------------------------------------------------

    def new_id(self, prefix: str) -> str:
        """The next Slack-shaped id with `prefix` (U, C, D, G, S, T, B, A, V)."""
        counter = self._counters.setdefault(prefix, itertools.count(1))
        return f"{prefix}{next(counter):010X}"

    def new_ts(self) -> str:
        """A message ts: now, in microseconds, unique and increasing."""
        now = int(time.time() * 1_000_000)
        self._last_ts = max(now, self._last_ts + 1)
        return f"{self._last_ts // 1_000_000}.{self._last_ts % 1_000_000:06d}"

    def mint_trigger(self, user: User | str | None = None) -> str:
        """A trigger id views.open accepts once (as Slack issues with an interaction)."""
        n = next(self._counters.setdefault("trigger", itertools.count(1)))
        digest = hashlib.sha256(f"{self.team_id}:{n}".encode()).hexdigest()[:32]
        trigger = f"{1700000000 + n}.{int(self.team_id[1:], 16)}.{digest}"
        self._triggers[trigger] = (_user_id(user) if user is not None else None, time.time())
        return trigger

    # -- workspace set-up --------------------------------------------------------------------

    def add_user(
        self,
        name: str,
        email: str | None = None,
        real_name: str | None = None,
        *,
        is_bot: bool = False,
    ) -> User:
        user = User(
            id=self.new_id("U"),
            name=name,
            email=email,
            real_name=real_name or name.capitalize(),
            team_id=self.team_id,
            is_bot=is_bot,
        )
        self.users[user.id] = user
        return user

    def add_channel(
        self,
        name: str,
        members: Iterable[User | str] = (),
        *,
        bot_member: bool = True,
        private: bool = False,
    ) -> Channel:
        """A channel with these members; the bot is one unless `bot_member` is False."""
        ids = [_user_id(m) for m in members]
        if bot_member and self.bot_user.id not in ids:
            ids.append(self.bot_user.id)
        channel = Channel(
            id=self.new_id("G" if private else "C"), name=name, members=ids, is_private=private
        )
        self.channels[channel.id] = channel
        return channel

    def invite(
        self,
        channel: Channel | str,
        user: User | str | None = None,
        *,
        inviter: User | str | None = None,
    ) -> None:
        """Add `user` (by default the bot: `/invite @nodbot` in the channel) to `channel`'s
        members: from now on the bot may post there and read its history. As Slack does,
        the app is then sent `member_joined_channel` when the bot is a member of the channel
        (it joined, or another joined a channel it is in) and the app can be reached
        (`send_event`): in a task of its own, which `events_answered` waits for."""
        found = self.channels[channel.id if isinstance(channel, Channel) else channel]
        member = _user_id(user) if user is not None else self.bot_user.id
        if member in found.members:
            return
        found.members.append(member)
        self._touch()
        reachable = self.events_url is not None or bool(self.open_sockets)
        if self.bot_user.id in found.members and reachable:
            event = self.member_joined_event(found, member, inviter=inviter)
            task = asyncio.get_running_loop().create_task(self.send_event(event))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    def add_usergroup(
        self, handle: str, members: Iterable[User | str] = (), name: str | None = None
    ) -> UserGroup:
        group = UserGroup(
            id=self.new_id("S"),
            handle=handle,
            name=name or handle,
            users=[_user_id(m) for m in members],
        )
        self.usergroups[group.id] = group
        return group

    # -- fault injection ---------------------------------------------------------------------

    def fail(
        self,
        method: str,
        *failures: int | str | Failure,
        where: Callable[[JSON], bool] | None = None,
    ) -> None:
        """Answer the next calls of `method` ("*" for any) with these failures, in order:
        429 (ratelimited, Retry-After 1), 500, 503, an `ok: false` error code, or a Failure.
        With `where`, only calls whose params it accepts are failed (a thread reply, say:
        `where=lambda params: "thread_ts" in params`); the others are answered as usual."""
        queue = self._failures.setdefault(method, deque())
        queue.extend((Failure.of(f), where) for f in failures)

    def hold(self, method: str) -> None:
        """Do what each call of `method` does (a message posted is there to read), but hold
        its HTTP answer back until `release`: what Slack did that the app never heard of,
        when the app dies (or times out) before the answer arrives."""
        self._holds.setdefault(method, asyncio.Event())

    def release(self, method: str | None = None) -> None:
        """Send the answers held back for `method` (None: every method), and stop holding."""
        for name in [method] if method is not None else list(self._holds):
            gate = self._holds.pop(name, None)
            if gate is not None:
                gate.set()

    @property
    def held(self) -> list[Call]:
        """The calls whose answer was held back."""
        return [c for c in self.calls if c.held]

    def rate_limit_every(
        self, n: int | None, *, retry_after: int = 1, methods: Iterable[str] | None = None
    ) -> None:
        """Answer every `n`th call (of `methods`, or of any method) with 429; None stops it.

        slack_sdk's async retry handler reads only the first digit of Retry-After: keep it
        below 10 seconds."""
        self._rate_every = n
        self._rate_retry_after = retry_after
        self._rate_methods = frozenset(methods) if methods is not None else None
        self._rate_count = 0

    def _next_failure(self, method: str, params: JSON) -> Failure | None:
        for key in (method, "*"):
            queue = self._failures.get(key) or deque()
            for entry in queue:
                failure, where = entry
                if where is None or where(params):
                    queue.remove(entry)
                    return failure
        if self._rate_every and (self._rate_methods is None or method in self._rate_methods):
            self._rate_count += 1
            if self._rate_count % self._rate_every == 0:
                return Failure(429, "ratelimited", retry_after=self._rate_retry_after)
        return None

    @property
    def faults(self) -> list[Call]:
        """The calls answered by an injected failure."""
        return [c for c in self.calls if c.fault]

    # -- reading what happened ---------------------------------------------------------------

    def calls_to(self, method: str, *, ok: bool | None = None) -> list[Call]:
        """The calls of `method`, optionally only the successful (or failed) ones."""
        return [c for c in self.calls if c.method == method and (ok is None or c.ok == ok)]

    def messages(self, channel: Channel | User | str | None = None) -> list[Message]:
        """The messages of a channel (a user means their DM with the bot), or of all channels,
        in the order they were posted."""
        if channel is None:
            every = [m for ms in self._messages.values() for m in ms]
            return sorted(every, key=lambda m: m.ts)
        if isinstance(channel, User) or (isinstance(channel, str) and channel in self.users):
            dm = self.dm(channel)
            return [] if dm is None else list(self._messages.get(dm.id, []))
        channel_id = channel.id if isinstance(channel, Channel) else channel
        return list(self._messages.get(channel_id, []))

    def message(self, channel: Channel | str, ts: str) -> Message:
        channel_id = channel.id if isinstance(channel, Channel) else channel
        for message in self._messages.get(channel_id, []):
            if message.ts == ts:
                return message
        raise KeyError(f"no message {ts} in {channel_id}")

    def dm(self, user: User | str) -> Channel | None:
        """The bot's DM with `user`, if it was opened."""
        user_id = _user_id(user)
        for channel in self.channels.values():
            if channel.is_im and channel.user == user_id:
                return channel
        return None

    def open_dm(self, user: User | str) -> Channel:
        """The bot's DM with `user`, opened now if it was not (as conversations.open does)."""
        return self._open_dm(self._user(user))[0]

    def view(self, view_id: str) -> View:
        for view in self.views:
            if view.id == view_id:
                return view
        raise KeyError(f"no view {view_id}")

    def home_view(self, user: User | str) -> HomeView | None:
        """The App Home the app published for `user` (None: none yet)."""
        return self.homes.get(_user_id(user))

    async def wait_for_home(
        self, user: User | str, count: int = 1, within: float = 5.0
    ) -> HomeView:
        """Until the app has published `user`'s Home `count` times; returns it."""
        user_id = _user_id(user)

        def published() -> int:
            home = self.homes.get(user_id)
            return 0 if home is None else len(home.versions)

        await self.wait_until(
            lambda: published() >= count, within, f"{count} Home view(s) of {user_id}"
        )
        return self.homes[user_id]

    def responses(self, to: CommandSent | Ephemeral | str) -> list[ResponsePost]:
        """What the app sent to a response URL: a command's (`CommandSent`), an ephemeral
        message's (the URL its clicks carried), or any URL the fake handed out."""
        if isinstance(to, CommandSent):
            url = to.response_url
        elif isinstance(to, Ephemeral):
            urls = {f"/actions/{k}" for k, e in self._ephemeral_urls.items() if e is to}
            return [p for p in self.response_posts if _path(p.url) in urls]
        else:
            url = to
        return [p for p in self.response_posts if _path(p.url) == _path(url)]

    async def wait_for_responses(
        self, to: CommandSent | Ephemeral | str, count: int = 1, within: float = 5.0
    ) -> list[ResponsePost]:
        """Until the app sent `count` responses to `to`'s response URL (see `responses`)."""
        await self.wait_until(
            lambda: len(self.responses(to)) >= count, within, f"{count} response(s)"
        )
        return self.responses(to)

    async def wait_until(
        self, condition: Callable[[], bool], within: float = 5.0, what: str = "condition"
    ) -> None:
        """Until `condition()` holds; it is checked after each thing the app does."""
        deadline = time.monotonic() + within
        while not condition():
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{what} did not happen within {within} s")
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(left, 0.1))

    async def wait_for_calls(self, method: str, count: int = 1, within: float = 5.0) -> list[Call]:
        """Until `method` was called `count` times; returns those calls."""
        await self.wait_until(
            lambda: len(self.calls_to(method)) >= count, within, f"{count} {method} call(s)"
        )
        return self.calls_to(method)

    # -- the Events API ----------------------------------------------------------------------

    def member_joined_event(
        self, channel: Channel | str, user: User | str, *, inviter: User | str | None = None
    ) -> JSON:
        """The `member_joined_channel` event of `user` joining `channel`."""
        found = self.channels[channel.id if isinstance(channel, Channel) else channel]
        event: JSON = {
            "type": "member_joined_channel",
            "user": _user_id(user),
            "channel": found.id,
            "channel_type": "G" if found.is_private else "C",
            "team": self.team_id,
            "event_ts": self.new_ts(),
        }
        if inviter is not None:
            event["inviter"] = _user_id(inviter)
        return event

    def app_home_opened_event(self, user: User | str, *, tab: str = "home") -> JSON:
        """The `app_home_opened` event of `user` opening the app's `tab` ("home" or
        "messages"); with the view last published for them, as Slack includes it."""
        member = self._user(user)
        event: JSON = {
            "type": "app_home_opened",
            "user": member.id,
            "channel": self.open_dm(member).id,
            "tab": tab,
            "event_ts": self.new_ts(),
        }
        home = self.homes.get(member.id)
        if home is not None and tab == "home":
            event["view"] = home.to_api()
        return event

    async def open_home(
        self, user: User | str, *, tab: str = "home", within: float = 5.0
    ) -> EventSent:
        """`user` opens the app's Home (or Messages) tab: Slack sends `app_home_opened`."""
        return await self.send_event(self.app_home_opened_event(user, tab=tab), within=within)

    def event_callback(self, event: JSON) -> JSON:
        """The envelope Slack sends an event to an app in (over HTTP, or as the payload of a
        Socket Mode `events_api` envelope)."""
        return {
            "token": VERIFICATION_TOKEN,
            "team_id": self.team_id,
            "api_app_id": self.app_id,
            "event": event,
            "type": "event_callback",
            "event_id": "Ev" + self.new_id("E")[1:],
            "event_time": int(time.time()),
            "authorizations": [
                {
                    "enterprise_id": None,
                    "team_id": self.team_id,
                    "user_id": self.bot_user.id,
                    "is_bot": True,
                    "is_enterprise_install": False,
                }
            ],
            "is_ext_shared_channel": False,
        }

    async def send_event(self, event: JSON, *, within: float = 5.0) -> EventSent:
        """Send `event` to the app as Slack does: POSTed as signed JSON to `events_url` when
        it is set, else over the app's Socket Mode connection; kept in `events` with the
        app's answer. Raises AssertionError when the app cannot be reached, or does not
        answer within `within` seconds (Slack waits 3)."""
        body = self.event_callback(event)
        if self.events_url is None and not self.open_sockets:
            raise AssertionError("the app is not reachable: no events_url, no Socket Mode")
        sent = EventSent(body, "http" if self.events_url is not None else "socket")
        self.events.append(sent)
        if self.events_url is not None:
            raw = json.dumps(body, separators=(",", ":")).encode()
            headers = {
                "Content-Type": "application/json",
                "User-Agent": "Slackbot 1.0 (+https://api.slack.com/robots)",
                **signed_headers(self.signing_secret, raw),
            }
            async with httpx.AsyncClient(timeout=within) as client:
                answer = await client.post(self.events_url, content=raw, headers=headers)
            sent.status = answer.status_code
        else:
            sent.ack = await self.socket_send("events_api", body, within=within)
        self._touch()
        return sent

    async def events_answered(self, count: int, within: float = 5.0) -> list[EventSent]:
        """Until `count` events were sent and answered; returns every event sent."""
        await self.wait_until(
            lambda: sum(e.answered for e in self.events) >= count,
            within,
            f"{count} event(s) answered by the app",
        )
        return list(self.events)

    async def _drain_events(self) -> None:
        """Stop sending events still under way (the test is over)."""
        for task in list(self._sending):
            task.cancel()
        await asyncio.gather(*self._sending, return_exceptions=True)

    def _touch(self) -> None:
        self._changed.set()

    # -- interactions as Slack builds them ---------------------------------------------------

    def response_url(self, message: Message | None = None) -> str:
        """A response_url served by the fake; posts to it are kept in `response_posts` and
        can replace or delete `message`."""
        key = self.new_id("R")[1:] + uuid.uuid4().hex[:8]
        self._response_urls[key] = None if message is None else (message.channel, message.ts)
        return f"{self.base_url}/actions/{key}"

    def click(
        self, message: Message, action_id: str, user: User | str, *, value: str | None = None
    ) -> JSON:
        """The `block_actions` payload of `user` pressing the element `action_id` of a posted
        message (it must be there), with a fresh trigger id and response_url."""
        block_id, element = message.action(action_id)
        member = self._user(user)
        channel = self.channels.get(message.channel)
        return block_actions_payload(
            action_id=action_id,
            block_id=block_id,
            value=value if value is not None else element.get("value"),
            user_id=member.id,
            user_name=member.name,
            team_id=self.team_id,
            channel_id=message.channel,
            message_ts=message.ts,
            trigger_id=self.mint_trigger(member),
            api_app_id=self.app_id,
            team_domain=self.team_domain,
            channel_name="directmessage" if channel is None or channel.is_im else channel.name,
            message=message.to_api(),
            action=element,
            response_url=self.response_url(message),
        )

    def submit(
        self,
        view: View,
        user: User | str,
        values: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> JSON:
        """The `view_submission` payload of `user` submitting an opened view. `values` is
        {block_id: {action_id: value}} for its input blocks (a string for a text input, an
        option value for a select, a list for multi-selects, or the state entry itself);
        inputs left out are sent as they were opened, as Slack does: with their initial value
        or option, else empty."""
        given = {b: dict(a) for b, a in (values or {}).items()}
        state: JSON = {}
        for block in view.blocks:
            if block.get("type") != "input" or not isinstance(block.get("element"), dict):
                continue
            element = block["element"]
            block_id, action_id = str(block.get("block_id")), str(element.get("action_id"))
            value = given.get(block_id, {}).pop(action_id, None)
            if value is None:
                value = _initial(element)
            state[block_id] = {action_id: state_value(element, value)}
        unknown = {b: list(a) for b, a in given.items() if a}
        if unknown:
            raise AssertionError(f"view {view.id} has no inputs {unknown}")
        member = self._user(user)
        return view_submission_payload(
            view_id=view.id,
            callback_id=view.callback_id,
            values=state,
            user_id=member.id,
            user_name=member.name,
            team_id=self.team_id,
            private_metadata=view.private_metadata,
            trigger_id=self.mint_trigger(member),
            api_app_id=self.app_id,
            team_domain=self.team_domain,
            view=view.to_api(state),
        )

    def close(self, view: View, user: User | str) -> JSON:
        """The `view_closed` payload of `user` closing an opened view."""
        member = self._user(user)
        return view_closed_payload(
            view_id=view.id,
            callback_id=view.callback_id,
            user_id=member.id,
            user_name=member.name,
            team_id=self.team_id,
            api_app_id=self.app_id,
            team_domain=self.team_domain,
            view=view.to_api(),
        )

    def home_click(self, user: User | str, action_id: str, *, value: str | None = None) -> JSON:
        """The `block_actions` payload of `user` pressing the button `action_id` (the one
        whose value is `value`, when given) on the Home the app published for them (it must be
        there), with a fresh trigger id."""
        member = self._user(user)
        home = self.homes.get(member.id)
        if home is None:
            raise AssertionError(f"no Home was published for {member.id}")
        block_id, element = home.action(action_id, value)
        return home_actions_payload(
            action_id=action_id,
            block_id=block_id,
            value=element.get("value"),
            user_id=member.id,
            user_name=member.name,
            team_id=self.team_id,
            view=home.to_api(),
            trigger_id=self.mint_trigger(member),
            api_app_id=self.app_id,
            team_domain=self.team_domain,
            action=element,
        )

    def ephemeral_click(
        self, ephemeral: Ephemeral, action_id: str, *, value: str | None = None
    ) -> JSON:
        """The `block_actions` payload of its user pressing the element `action_id` of an
        ephemeral message: no message object (Slack sends none for an ephemeral one), and a
        response_url that can replace or delete it."""
        block_id, element = ephemeral.action(action_id, value)
        member = self._user(ephemeral.user)
        key = self.new_id("R")[1:] + uuid.uuid4().hex[:8]
        self._ephemeral_urls[key] = ephemeral
        channel = self.channels.get(ephemeral.channel)
        payload = block_actions_payload(
            action_id=action_id,
            block_id=block_id,
            value=element.get("value"),
            user_id=member.id,
            user_name=member.name,
            team_id=self.team_id,
            channel_id=ephemeral.channel,
            message_ts=ephemeral.message_ts,
            trigger_id=self.mint_trigger(member),
            api_app_id=self.app_id,
            team_domain=self.team_domain,
            channel_name="directmessage" if channel is None or channel.is_im else channel.name,
            action=element,
            response_url=f"{self.base_url}/actions/{key}",
        )
        payload["container"]["is_ephemeral"] = True
        del payload["message"]
        return payload

    def slash_command(
        self,
        user: User | str,
        text: str,
        *,
        channel: Channel | str | None = None,
        command: str = "/nodbot",
    ) -> dict[str, str]:
        """The fields of `user` typing `command text` in `channel` (by default their DM with
        the bot), with a fresh trigger id and a response_url whose messages are shown to
        `user` only (`responses`, `ephemerals`)."""
        member = self._user(user)
        where = (
            self.open_dm(member)
            if channel is None
            else self._channel(channel.id if isinstance(channel, Channel) else channel)
        )
        key = self.new_id("R")[1:] + uuid.uuid4().hex[:8]
        self._command_urls[key] = (where.id, member.id)
        return slash_command_payload(
            command=command,
            text=text,
            user_id=member.id,
            user_name=member.name,
            team_id=self.team_id,
            channel_id=where.id,
            channel_name="directmessage" if where.is_im else where.name,
            response_url=f"{self.base_url}/actions/{key}",
            trigger_id=self.mint_trigger(member),
            api_app_id=self.app_id,
            team_domain=self.team_domain,
        )

    async def send_command(
        self,
        user: User | str | None = None,
        text: str = "",
        *,
        channel: Channel | str | None = None,
        command: str = "/nodbot",
        payload: Mapping[str, str] | None = None,
        url: str | None = None,
        secret: str | None = None,
        timestamp: int | str | None = None,
        within: float = 5.0,
    ) -> CommandSent:
        """Send a slash command to the app as Slack does: `payload` (by default
        `slash_command(user, text, ...)`) form-encoded and signed (with `secret`, by default
        the fake's signing secret) to `url` (by default `events_url`, where the manifest
        points the command), else over the app's Socket Mode connection (a `slash_commands`
        envelope). Kept in `commands` with the app's answer."""
        if payload is None:
            if user is None:
                raise AssertionError("send_command needs a user or a payload")
            payload = self.slash_command(user, text, channel=channel, command=command)
        target = url or self.events_url
        if target is None and not self.open_sockets:
            raise AssertionError("the app is not reachable: no events_url, no Socket Mode")
        sent = CommandSent(dict(payload), "http" if target is not None else "socket")
        self.commands.append(sent)
        if target is not None:
            body, headers = command_request(payload, secret or self.signing_secret, timestamp)
            async with httpx.AsyncClient(timeout=within) as client:
                answer = await client.post(target, content=body, headers=headers)
            sent.status, sent.body = answer.status_code, answer.text
        else:
            sent.ack = await self.socket_send("slash_commands", dict(payload), within=within)
        self._touch()
        return sent

    def _user(self, user: User | str) -> User:
        user_id = _user_id(user)
        if user_id not in self.users:
            raise AssertionError(f"no user {user_id} in the fake workspace")
        return self.users[user_id]

    # -- Socket Mode -------------------------------------------------------------------------

    @property
    def open_sockets(self) -> list[SocketConnection]:
        return [c for c in self.socket_connections if c.open]

    async def wait_for_socket(self, count: int = 1, within: float = 5.0) -> SocketConnection:
        """Until `count` Socket Mode connections were opened; returns the latest open one."""
        await self.wait_until(
            lambda: len(self.socket_connections) >= count and bool(self.open_sockets),
            within,
            f"{count} Socket Mode connection(s)",
        )
        return self.open_sockets[-1]

    async def socket_send(
        self,
        type: str = "interactive",
        payload: JSON | None = None,
        *,
        envelope_id: str | None = None,
        accepts_response_payload: bool | None = None,
        retry_attempt: int | None = None,
        retry_reason: str | None = None,
        within: float = 5.0,
    ) -> JSON:
        """Push an envelope to the app over its newest connection and return its ack: the
        message the app sends back with the same envelope_id (and perhaps a `payload`).
        Fails if the app does not ack within `within` (Slack waits 3 s)."""
        connection = await self.wait_for_socket(within=within)
        envelope_id = envelope_id or str(uuid.uuid4())
        if accepts_response_payload is None:
            kind = (payload or {}).get("type")
            accepts_response_payload = type == "slash_commands" or kind in (
                "view_submission",
                "block_suggestion",
            )
        envelope: JSON = {
            "envelope_id": envelope_id,
            "payload": payload or {},
            "type": type,
            "accepts_response_payload": accepts_response_payload,
        }
        if type == "events_api":
            envelope["retry_attempt"] = retry_attempt or 0
            envelope["retry_reason"] = retry_reason or ""
        ack: asyncio.Future[JSON] = asyncio.get_running_loop().create_future()
        self._acks[envelope_id] = ack
        try:
            self.envelopes.append(envelope)
            await connection.websocket.send_text(json.dumps(envelope))
            try:
                return await asyncio.wait_for(ack, within)
            except TimeoutError:
                raise AssertionError(
                    f"the app did not ack envelope {envelope_id} within {within} s"
                ) from None
        finally:
            self._acks.pop(envelope_id, None)

    async def socket_disconnect(self, reason: str = "refresh_requested") -> None:
        """Tell the app to reconnect, as Slack does before it refreshes a connection."""
        connection = await self.wait_for_socket()
        message = {"type": "disconnect", "reason": reason, "debug_info": {"host": "applink-fake"}}
        await connection.websocket.send_text(json.dumps(message))

    async def _socket(self, websocket: WebSocket) -> None:
        ticket = websocket.query_params.get("ticket", "")
        if self._tickets.get(ticket, True):  # unknown or used
            await websocket.close(code=1008)
            return
        self._tickets[ticket] = True
        await websocket.accept()
        number = len(self.socket_connections) + 1
        connection = SocketConnection(number, ticket, websocket, time.time())
        self.socket_connections.append(connection)
        hello = {
            "type": "hello",
            "num_connections": len(self.open_sockets),
            "debug_info": {
                "host": f"applink-fake-{number}",
                "build_number": 1,
                "approximate_connection_time": 18060,
            },
            "connection_info": {"app_id": self.app_id},
        }
        await websocket.send_text(json.dumps(hello))
        self._touch()
        try:
            while True:
                raw = await websocket.receive_text()
                try:
                    message = json.loads(raw)
                except ValueError:
                    message = {"unparsed": raw}
                connection.received.append(message)
                self.socket_messages.append(message)
                waiter = self._acks.get(str(message.get("envelope_id")))
                if waiter is not None and not waiter.done():
                    waiter.set_result(message)
                self._touch()
        except WebSocketDisconnect:
            pass
        finally:
            connection.open = False
            self._touch()

    async def close_sockets(self) -> None:
        """Close every open Socket Mode connection from Slack's side."""
        for connection in self.open_sockets:
            connection.open = False
            with contextlib.suppress(Exception):
                await connection.websocket.close(code=1001)

    # -- the Web API -------------------------------------------------------------------------

    async def _api(self, request: Request) -> Response:
        method = request.path_params["method"]
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        params: JSON = dict(request.query_params)
        refusal: Refusal | None = None
        try:
            params.update(await _body_params(request, content_type))
        except Refusal as refused:
            refusal = refused
        token = _bearer(request.headers.get("authorization"))
        form_token = params.pop("token", None)
        if token is None and content_type != "application/json" and form_token is not None:
            token = str(form_token)
        call = Call(method, params, token, time.time(), request.method, content_type)
        self.calls.append(call)
        status, headers, body = self._answer(call, refusal)
        call.status, call.ok, call.error = status, bool(body.get("ok")), body.get("error")
        self._touch()
        gate = self._holds.get(method)
        if gate is not None:
            call.held = True
            self._touch()
            await gate.wait()
        return _json_response(body, status, headers)

    def _answer(self, call: Call, refusal: Refusal | None) -> tuple[int, dict[str, str], JSON]:
        if call.method not in self._handlers:
            return 200, {}, {"ok": False, "error": "unknown_method", "req_method": call.method}
        failure = self._next_failure(call.method, call.params)
        if failure is not None:
            call.fault = True
            headers = {}
            if failure.retry_after is not None:
                headers["Retry-After"] = str(failure.retry_after)
            return failure.status, headers, {"ok": False, "error": failure.error}
        if refusal is not None:
            return 200, {}, {"ok": False, "error": refusal.error, **refusal.extra}
        if call.token is None:
            return 200, {}, {"ok": False, "error": "not_authed"}
        kind = self.tokens.get(call.token)
        if kind is None:
            return 200, {}, {"ok": False, "error": "invalid_auth"}
        needed, handler = self._handlers[call.method]
        if kind != needed:
            return 200, {}, {"ok": False, "error": "not_allowed_token_type"}
        try:
            return 200, {}, {"ok": True, **handler(call.params)}
        except Refusal as refused:
            return 200, {}, {"ok": False, "error": refused.error, **refused.extra}

    def _auth_test(self, params: JSON) -> JSON:
        return {
            "url": f"https://{self.team_domain}.slack.com/",
            "team": self.team_name,
            "user": self.bot_user.name,
            "team_id": self.team_id,
            "user_id": self.bot_user.id,
            "bot_id": self.bot_id,
            "is_enterprise_install": False,
        }

    def _channel(self, reference: Any) -> Channel:
        """A channel by id or name; a user id means the bot's DM with them (opened if needed),
        as chat.postMessage allows."""
        if not isinstance(reference, str) or not reference:
            raise Refusal("channel_not_found")
        if reference in self.channels:
            return self.channels[reference]
        if reference in self.users:
            return self._open_dm(self.users[reference])[0]
        name = reference.lstrip("#")
        for channel in self.channels.values():
            if not channel.is_im and channel.name == name:
                return channel
        raise Refusal("channel_not_found")

    def _open_dm(self, user: User) -> tuple[Channel, bool]:
        existing = self.dm(user)
        if existing is not None:
            return existing, True
        members = [user.id, self.bot_user.id]
        channel = Channel(self.new_id("D"), user.id, members, is_im=True, user=user.id)
        self.channels[channel.id] = channel
        return channel, False

    def _content(self, params: JSON) -> tuple[str | None, list[JSON] | None]:
        """The text and blocks of a message, checked against Slack's limits."""
        text = _text(params, "text")
        blocks = _json_field(params, "blocks", "invalid_blocks_format")
        attachments = _json_field(params, "attachments", "invalid_attachments")
        if not text and not blocks and not attachments:
            raise Refusal("no_text")
        if text is not None and len(text) > MAX_MESSAGE_TEXT:
            raise Refusal("msg_too_long")
        if blocks is not None:
            errors = block_errors(blocks)
            if errors:
                raise Refusal(
                    "invalid_blocks",
                    errors=[e.removeprefix("[ERROR] ") for e in errors],
                    response_metadata={"messages": errors},
                )
        return text, blocks

    def _chat_post_message(self, params: JSON) -> JSON:
        channel = self._channel(params.get("channel"))
        if not channel.is_im and self.bot_user.id not in channel.members:
            # A private channel is hidden from a bot that is not in it, as Slack hides it.
            raise Refusal("channel_not_found" if channel.is_private else "not_in_channel")
        text, blocks = self._content(params)
        thread_ts = _text(params, "thread_ts")
        message = Message(
            channel=channel.id,
            ts=self.new_ts(),
            user=self.bot_user.id,
            bot_id=self.bot_id,
            app_id=self.app_id,
            team_id=self.team_id,
            versions=[MessageVersion(text or "", blocks or [], time.time(), "chat.postMessage")],
            thread_ts=thread_ts,
            attachments=_json_field(params, "attachments", "invalid_attachments"),
            metadata=_json_field(params, "metadata", "invalid_metadata_format"),
        )
        self._messages.setdefault(channel.id, []).append(message)
        return {"channel": channel.id, "ts": message.ts, "message": message.to_api()}

    def _chat_update(self, params: JSON) -> JSON:
        channel_id = params.get("channel")
        if not isinstance(channel_id, str) or channel_id not in self.channels:
            raise Refusal("channel_not_found")
        ts = _text(params, "ts")
        try:
            message = self.message(channel_id, ts or "")
        except KeyError:
            raise Refusal("message_not_found") from None
        if message.deleted:
            raise Refusal("message_not_found")
        if message.user != self.bot_user.id:
            raise Refusal("cant_update_message")
        text, blocks = self._content(params)
        version = MessageVersion(
            text if text is not None else message.text,
            blocks if blocks is not None else message.blocks,
            time.time(),
            "chat.update",
        )
        message.versions.append(version)
        return {
            "channel": channel_id,
            "ts": message.ts,
            "text": message.text,
            "message": message.to_api(),
        }

    def _chat_post_ephemeral(self, params: JSON) -> JSON:
        channel = self._channel(params.get("channel"))
        user_id = _text(params, "user")
        if user_id is None or user_id not in self.users:
            raise Refusal("user_not_found")
        if user_id not in channel.members:
            raise Refusal("user_not_in_channel")
        if not channel.is_im and self.bot_user.id not in channel.members:
            raise Refusal("not_in_channel")
        text, blocks = self._content(params)
        ephemeral = Ephemeral(
            channel=channel.id,
            user=user_id,
            message_ts=self.new_ts(),
            text=text or "",
            blocks=blocks or [],
            thread_ts=_text(params, "thread_ts"),
        )
        self.ephemerals.append(ephemeral)
        return {"message_ts": ephemeral.message_ts}

    def _views_open(self, params: JSON) -> JSON:
        trigger = _text(params, "trigger_id") or _text(params, "interactivity_pointer")
        if not trigger:
            raise Refusal(
                "invalid_arguments",
                response_metadata={"messages": ["[ERROR] missing required field: trigger_id"]},
            )
        if trigger in self._used_triggers:
            raise Refusal("exchanged_trigger_id")
        minted = self._triggers.get(trigger)
        if minted is None and self.strict_triggers:
            raise Refusal("invalid_trigger_id")
        ttl = self.trigger_ttl
        if minted is not None and ttl is not None and time.time() - minted[1] > ttl:
            raise Refusal("expired_trigger_id")
        view = _json_field(params, "view", "invalid_arguments")
        errors = view_errors(view)
        if errors:
            raise Refusal("invalid_arguments", response_metadata={"messages": errors})
        assert isinstance(view, dict)
        self._used_triggers.add(trigger)
        opened = View(
            id=self.new_id("V"),
            team_id=self.team_id,
            app_id=self.app_id,
            bot_id=self.bot_id,
            trigger_id=trigger,
            user=minted[0] if minted is not None else None,
            hash=self._view_hash(),
            versions=[view],
            external_id=str(view.get("external_id", "")),
        )
        self.views.append(opened)
        return {"view": opened.to_api()}

    def _views_update(self, params: JSON) -> JSON:
        view_id, external_id = _text(params, "view_id"), _text(params, "external_id")
        found = [
            v
            for v in self.views
            if v.id == view_id or (external_id and v.external_id == external_id)
        ]
        if not found:
            raise Refusal("not_found")
        opened = found[0]
        given_hash = _text(params, "hash")
        if given_hash is not None and given_hash != opened.hash:
            raise Refusal("hash_conflict")
        view = _json_field(params, "view", "invalid_arguments")
        errors = view_errors(view)
        if errors:
            raise Refusal("invalid_arguments", response_metadata={"messages": errors})
        assert isinstance(view, dict)
        opened.versions.append(view)
        opened.hash = self._view_hash()
        return {"view": opened.to_api()}

    def _views_publish(self, params: JSON) -> JSON:
        """A user's App Home: kept per user (its id stays), checked as a Home view."""
        user_id = _text(params, "user_id")
        if not user_id or user_id not in self.users:
            raise Refusal(
                "invalid_arguments", response_metadata={"messages": ["invalid `user_id`"]}
            )
        view = _json_field(params, "view", "invalid_arguments")
        errors = view_errors(view, "home")
        if errors:
            raise Refusal("invalid_arguments", response_metadata={"messages": errors})
        assert isinstance(view, dict)
        home = self.homes.get(user_id)
        given_hash = _text(params, "hash")
        if home is not None and given_hash is not None and given_hash != home.hash:
            raise Refusal("hash_conflict")
        if home is None:
            home = HomeView(
                id=self.new_id("V"),
                user=user_id,
                team_id=self.team_id,
                app_id=self.app_id,
                bot_id=self.bot_id,
                hash=self._view_hash(),
                versions=[view],
            )
            self.homes[user_id] = home
        else:
            home.versions.append(view)
            home.hash = self._view_hash()
        return {"view": home.to_api()}

    def _view_hash(self) -> str:
        n = next(self._counters.setdefault("hash", itertools.count(1)))
        return f"{1700000000 + n}.{hashlib.sha256(str(n).encode()).hexdigest()[:8]}"

    def _conversations_open(self, params: JSON) -> JSON:
        channel_id = _text(params, "channel")
        if channel_id:
            if channel_id not in self.channels:
                raise Refusal("channel_not_found")
            return {"channel": self.channels[channel_id].to_api()}
        users = [u for u in (_text(params, "users") or "").split(",") if u.strip()]
        if not users:
            raise Refusal("users_list_not_supplied")
        for user_id in users:
            if user_id.strip() not in self.users:
                raise Refusal("user_not_found")
        if len(users) == 1:
            channel, existed = self._open_dm(self.users[users[0].strip()])
        else:
            ids = sorted({u.strip() for u in users} | {self.bot_user.id})
            existing = [c for c in self.channels.values() if c.is_mpim and sorted(c.members) == ids]
            existed = bool(existing)
            if existing:
                channel = existing[0]
            else:
                name = "mpdm-" + "--".join(self.users[u].name for u in ids) + "-1"
                channel = Channel(self.new_id("G"), name, ids, is_private=True, is_mpim=True)
                self.channels[channel.id] = channel
        answer: JSON = {
            "channel": channel.to_api() if _flag(params.get("return_im")) else {"id": channel.id}
        }
        if existed:
            answer.update({"no_op": True, "already_open": True})
        return answer

    def _conversations_info(self, params: JSON) -> JSON:
        """A channel by id; a private one only to a member (else hidden, as Slack hides it)."""
        channel_id = _text(params, "channel")
        if channel_id is None or channel_id not in self.channels:
            raise Refusal("channel_not_found")
        channel = self.channels[channel_id]
        private = channel.is_private or channel.is_mpim or channel.is_im
        if private and not channel.is_im and self.bot_user.id not in channel.members:
            raise Refusal("channel_not_found")
        return {"channel": channel.to_api()}

    def _conversations_members(self, params: JSON) -> JSON:
        channel_id = _text(params, "channel")
        if channel_id is None or channel_id not in self.channels:
            raise Refusal("channel_not_found")
        members = self.channels[channel_id].members
        try:
            limit = max(1, min(int(params.get("limit") or 100), 1000))
            start = _decode_cursor(_text(params, "cursor"))
        except ValueError:
            raise Refusal("invalid_cursor") from None
        if start > len(members):
            raise Refusal("invalid_cursor")
        page = members[start : start + limit]
        following = start + limit
        cursor = _encode_cursor(following) if following < len(members) else ""
        return {"members": page, "response_metadata": {"next_cursor": cursor}}

    def _conversations_history(self, params: JSON) -> JSON:
        """The channel's messages, newest first; thread replies are left out, as Slack does,
        and metadata is included only with `include_all_metadata`."""
        channel = self._readable(params)
        found = [m for m in self._messages.get(channel.id, []) if m.thread_ts in (None, m.ts)]
        return self._page(params, sorted(found, key=lambda m: float(m.ts), reverse=True), 100)

    def _conversations_replies(self, params: JSON) -> JSON:
        """A thread, oldest first: its parent message, then its replies."""
        channel = self._readable(params)
        ts = _text(params, "ts")
        messages = self._messages.get(channel.id, [])
        parent = [m for m in messages if m.ts == ts and m.thread_ts in (None, ts)]
        if not parent or parent[0].deleted:
            raise Refusal("thread_not_found")
        replies = [m for m in messages if m.thread_ts == ts and m.ts != ts]
        return self._page(params, parent + sorted(replies, key=lambda m: float(m.ts)), 1000)

    def _readable(self, params: JSON) -> Channel:
        """A channel whose history the bot may read: by id only, and one it is in."""
        channel_id = _text(params, "channel")
        if channel_id is None or channel_id not in self.channels:
            raise Refusal("channel_not_found")
        channel = self.channels[channel_id]
        if not channel.is_im and self.bot_user.id not in channel.members:
            raise Refusal("not_in_channel")
        return channel

    def _page(self, params: JSON, messages: list[Message], default: int) -> JSON:
        """One page of messages between `oldest` and `latest`, with Slack's cursor."""
        inclusive = _flag(params.get("inclusive"))
        try:
            oldest = float(_text(params, "oldest") or 0)
            latest = float(_text(params, "latest") or time.time() + 1)
            limit = max(1, min(int(params.get("limit") or default), 999))
            start = _decode_cursor(_text(params, "cursor"))
        except ValueError:
            raise Refusal("invalid_arguments") from None

        def within(message: Message) -> bool:
            ts = float(message.ts)
            if inclusive:
                return oldest <= ts <= latest
            return oldest < ts < latest

        chosen = [m for m in messages if not m.deleted and within(m)]
        page = chosen[start : start + limit]
        following = start + limit
        metadata = _flag(params.get("include_all_metadata"))
        found = []
        for message in page:
            shown = message.to_api()
            if not metadata:
                shown.pop("metadata", None)
            found.append(shown)
        more = following < len(chosen)
        cursor = _encode_cursor(following) if more else ""
        return {"messages": found, "has_more": more, "response_metadata": {"next_cursor": cursor}}

    def _usergroups_users_list(self, params: JSON) -> JSON:
        group_id = _text(params, "usergroup")
        if group_id is None or group_id not in self.usergroups:
            raise Refusal("no_such_subteam")
        return {"users": list(self.usergroups[group_id].users)}

    def _users_lookup_by_email(self, params: JSON) -> JSON:
        email = (_text(params, "email") or "").strip().lower()
        for user in self.users.values():
            if user.email is not None and user.email.lower() == email and not user.deleted:
                return {"user": user.to_api()}
        raise Refusal("users_not_found")

    def _users_info(self, params: JSON) -> JSON:
        user_id = _text(params, "user")
        if user_id is None or user_id not in self.users:
            raise Refusal("user_not_found")
        return {"user": self.users[user_id].to_api()}

    def _apps_connections_open(self, params: JSON) -> JSON:
        ticket = uuid.uuid4().hex
        self._tickets[ticket] = False
        host = self.base_url.removeprefix("http://")
        return {"url": f"ws://{host}/link/?ticket={ticket}&app_id={self.app_id}"}

    # -- response URLs -----------------------------------------------------------------------

    async def _response_url(self, request: Request) -> Response:
        key = request.path_params["key"]
        known = (self._response_urls, self._command_urls, self._ephemeral_urls)
        if not any(key in urls for urls in known):
            return Response("no_service", status_code=404, media_type="text/plain")
        try:
            body = json.loads(await request.body())
        except ValueError:
            return Response("invalid_payload", status_code=400, media_type="text/plain")
        if not isinstance(body, dict):
            return Response("invalid_payload", status_code=400, media_type="text/plain")
        self.response_posts.append(ResponsePost(str(request.url), body, time.time()))
        self._touch()
        blocks = body.get("blocks")
        if blocks is not None and block_errors(blocks):
            return Response("invalid_blocks", status_code=400, media_type="text/plain")
        if key in self._command_urls:
            return self._command_response(self._command_urls[key], body)
        if key in self._ephemeral_urls:
            return self._ephemeral_response(self._ephemeral_urls[key], body)
        target = self._response_urls[key]
        message = self.message(*target) if target is not None else None
        if message is not None and _flag(body.get("delete_original")):
            message.deleted = True
        elif message is not None and _flag(body.get("replace_original")):
            message.versions.append(
                MessageVersion(
                    str(body.get("text", message.text)),
                    blocks if isinstance(blocks, list) else message.blocks,
                    time.time(),
                    "response_url",
                )
            )
        elif message is not None and body.get("response_type") == "in_channel":
            try:
                self._chat_post_message({**body, "channel": message.channel})
            except Refusal as refused:
                return Response(refused.error, status_code=400, media_type="text/plain")
        elif message is not None:
            self.ephemerals.append(
                Ephemeral(
                    channel=message.channel,
                    user="",
                    message_ts=self.new_ts(),
                    text=str(body.get("text", "")),
                    blocks=blocks if isinstance(blocks, list) else [],
                )
            )
        return Response("ok", media_type="text/plain")

    def _command_response(self, target: tuple[str, str], body: JSON) -> Response:
        """A response to a slash command: shown to its user only (`ephemeral`, the default),
        or posted in the channel (`in_channel`)."""
        channel, user = target
        if body.get("response_type") == "in_channel":
            try:
                self._chat_post_message({**body, "channel": channel})
            except Refusal as refused:
                return Response(refused.error, status_code=400, media_type="text/plain")
            return Response("ok", media_type="text/plain")
        blocks = body.get("blocks")
        self.ephemerals.append(
            Ephemeral(
                channel=channel,
                user=user,
                message_ts=self.new_ts(),
                text=str(body.get("text", "")),
                blocks=blocks if isinstance(blocks, list) else [],
            )
        )
        return Response("ok", media_type="text/plain")

    def _ephemeral_response(self, ephemeral: Ephemeral, body: JSON) -> Response:
        """A response to a click on an ephemeral message: it replaces or deletes that
        message, or shows another one to the same user."""
        blocks = body.get("blocks")
        if _flag(body.get("delete_original")):
            ephemeral.deleted = True
        elif _flag(body.get("replace_original")):
            ephemeral.earlier.append((ephemeral.text, ephemeral.blocks))
            ephemeral.text = str(body.get("text", ephemeral.text))
            ephemeral.blocks = blocks if isinstance(blocks, list) else []
        else:
            self.ephemerals.append(
                Ephemeral(
                    channel=ephemeral.channel,
                    user=ephemeral.user,
                    message_ts=self.new_ts(),
                    text=str(body.get("text", "")),
                    blocks=blocks if isinstance(blocks, list) else [],
                )
            )
        return Response("ok", media_type="text/plain")


def _user_id(user: User | str) -> str:
    return user.id if isinstance(user, User) else user


def _path(url: str) -> str:
    """The path of a URL the fake handed out (the same whatever host name reaches it)."""
    return "/" + url.split("://", 1)[-1].partition("/")[2]


def _encode_cursor(offset: int) -> str:
    """An opaque cursor, base64 as Slack's are, so callers cannot treat it as a number."""
    return base64.b64encode(f"offset:{offset}".encode()).decode()


def _decode_cursor(cursor: str | None) -> int:
    if not cursor:
        return 0
    kind, _, offset = base64.b64decode(cursor.encode(), validate=True).decode().partition(":")
    if kind != "offset" or not offset.isdigit():
        raise ValueError(cursor)
    return int(offset)


def _bearer(header: str | None) -> str | None:
    if header and header[:7].lower() == "bearer ":
        return header[7:].strip() or None
    return None


async def _body_params(request: Request, content_type: str) -> JSON:
    body = await request.body()
    if not body:
        return {}
    if content_type == "application/json":
        try:
            data = json.loads(body)
        except ValueError:
            raise Refusal("invalid_json") from None
        if not isinstance(data, dict):
            raise Refusal("invalid_json")
        return data
    if content_type in ("application/x-www-form-urlencoded", ""):
        return dict(parse_qsl(body.decode(), keep_blank_values=True))
    raise Refusal("invalid_form_data")


def _json_field(params: JSON, name: str, error: str) -> Any:
    """A JSON-valued argument: as sent in a JSON body, or a JSON string in a form."""
    value = params.get(name)
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise Refusal(error) from None
        params[name] = value
    return value


@contextlib.asynccontextmanager
async def slack_fake(**options: Any) -> AsyncIterator[SlackFake]:
    """A SlackFake served by uvicorn on a free 127.0.0.1 port for the duration of the block.

    Close Socket Mode clients before the block ends; the fake closes any it still holds."""
    fake = SlackFake(**options)
    config = uvicorn.Config(
        fake.app,
        host="127.0.0.1",
        port=0,
        log_level="warning",
        ws="websockets-sansio",
        lifespan="off",
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        for _ in range(500):  # bounded: at most 5 s
            if server.started or task.done():
                break
            await asyncio.sleep(0.01)
        assert server.started, "the Slack fake did not start"
        port = server.servers[0].sockets[0].getsockname()[1]
        fake.base_url = f"http://127.0.0.1:{port}"
        yield fake
    finally:
        fake.release()  # held answers, so that the server can stop
        await fake._drain_events()
        await fake.close_sockets()
        server.should_exit = True
        await task
