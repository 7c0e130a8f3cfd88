"""A local fake of the Bot Framework for tests: what a Teams bot talks to, over real HTTP on
127.0.0.1.

- the OpenID metadata (`/v1/.well-known/openidconfiguration`) naming its `jwks_uri`
  (`/v1/keys`), which lists the public half of a test RSA key, endorsed for `msteams`;
- the token endpoint (`/token`): client credentials of the one registered bot, answering a
  bearer token the connector then wants;
- the connector (`service_url`, under `/connector`): posts of activities to a conversation
  and their replacements are kept (`posts`, `cards`), replies to a posted activity too
  (`replies`, `replies_to`: Reply to Activity, a POST to the activity's own address), and
  members are read back as Teams answers them (`add_member`).

`BotFrameworkFake.sign` makes the JWT the Bot Framework puts in the `Authorization` header of
each activity it sends to the bot (RS256, issuer `https://api.botframework.com`, audience the
app id, `serviceUrl` claim), and `invoke` builds the `adaptiveCard/action` invoke activity
Teams sends for an `Action.Execute` on a card.

    async with botframework_fake(app_id="...", password="...") as bf:
        bf.add_member("29:ana", "ana@example.com")
        ...  # point teams.openid_url, token_url and post_to's service_url at it
        [card] = bf.cards("19:ops@thread.tacv2")
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import secrets
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import jwt
import uvicorn
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

__all__ = [
    "ISSUER",
    "BotFrameworkFake",
    "Posted",
    "botframework_fake",
    "new_key",
]

ISSUER = "https://api.botframework.com"
CARD = "application/vnd.microsoft.card.adaptive"
MAX_ACTIVITY = 28 * 1024
"""About the most bytes of a message Teams takes (it answers 413 past it)."""


def new_key() -> rsa.RSAPrivateKey:
    """A fresh RSA key for signing test tokens."""
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@dataclass
class Posted:
    """An activity the bot posted, with each replacement of it since."""

    conversation: str
    id: str
    versions: list[dict[str, Any]] = field(default_factory=list)
    reply_to: str | None = None
    """For a reply: the id of the activity it replies to (the address it was posted to)."""

    @property
    def activity(self) -> dict[str, Any]:
        """The activity as it stands."""
        return self.versions[-1]

    @property
    def card(self) -> dict[str, Any]:
        """Its Adaptive Card as it stands."""
        [attachment] = self.activity["attachments"]
        assert attachment["contentType"] == CARD
        content: dict[str, Any] = attachment["content"]
        return content


class BotFrameworkFake:
    """The Bot Framework's login, token endpoint and connector (see the module)."""

    def __init__(self, *, app_id: str, password: str) -> None:
        self.app_id = app_id
        self.password = password
        self.key = new_key()
        self.kid = f"test-key-{secrets.token_hex(4)}"
        self.base_url = ""
        self.posts: list[Posted] = []
        self.replies: list[Posted] = []
        """The replies the bot posted under its activities, in order."""
        self.members: dict[str, dict[str, Any]] = {}
        self.tokens: set[str] = set()
        self.updates: list[tuple[str, str]] = []
        """(conversation, activity id) of every replacement asked for."""
        self.key_fetches = 0
        self.token_requests = 0
        self.member_lookups = 0
        self.failing_members = False
        """When set, member lookups answer HTTP 500."""
        self.failing_keys = False
        """When set, the OpenID metadata answers HTTP 503."""
        self.metadata_fetches = 0
        self.endorsements: list[str] | None = ["msteams"]
        """The channels its key is endorsed for (None: the key lists none)."""
        self.max_activity = MAX_ACTIVITY
        """The most bytes of an activity the connector takes (Teams answers 413 past it)."""
        self.failures: list[tuple[int, dict[str, str]]] = []
        """Answers (status, headers) the next posts and replacements get instead of being
        done, first first: Teams throttling (429) or failing (5xx)."""
        self.attempts = 0
        """Posts and replacements asked for, done or not."""
        self.bearers: list[str] = []
        """Every `Authorization` header the connector was sent."""
        self._ids = itertools.count(1)
        self.app = Starlette(
            routes=[
                Route("/v1/.well-known/openidconfiguration", self._metadata),
                Route("/v1/keys", self._keys),
                Route("/token", self._token, methods=["POST"]),
                Route(
                    "/connector/v3/conversations/{conversation}/activities",
                    self._post,
                    methods=["POST"],
                ),
                Route(
                    "/connector/v3/conversations/{conversation}/activities/{activity}",
                    self._update,
                    methods=["PUT"],
                ),
                Route(
                    "/connector/v3/conversations/{conversation}/activities/{activity}",
                    self._reply,
                    methods=["POST"],
                ),
                Route(
                    "/connector/v3/conversations/{conversation}/members/{user}",
                    self._member,
                    methods=["GET"],
                ),
            ]
        )

    # --- where things are ----------------------------------------------------------------------

    @property
    def openid_url(self) -> str:
        return f"{self.base_url}/v1/.well-known/openidconfiguration"

    @property
    def token_url(self) -> str:
        return f"{self.base_url}/token"

    @property
    def service_url(self) -> str:
        return f"{self.base_url}/connector"

    # --- the test's side ---------------------------------------------------------------------

    def add_member(self, user: str, email: str | None, *, aad_object_id: str | None = None) -> str:
        """A Teams user (id `29:...`) whom the connector says has `email`; their AAD id."""
        aad = aad_object_id or str(uuid.uuid4())
        found: dict[str, Any] = {"id": user, "name": user, "aadObjectId": aad}
        if email is not None:
            found |= {"email": email, "userPrincipalName": email}
        self.members[user] = found
        return aad

    def cards(self, conversation: str) -> list[Posted]:
        """What the bot posted to `conversation`, in order."""
        return [posted for posted in self.posts if posted.conversation == conversation]

    def replies_to(self, posted: Posted) -> list[Posted]:
        """The replies the bot posted under `posted`, in order."""
        return [
            reply
            for reply in self.replies
            if reply.conversation == posted.conversation and reply.reply_to == posted.id
        ]

    def sign(
        self,
        activity: dict[str, Any],
        *,
        key: rsa.RSAPrivateKey | None = None,
        kid: str | None = None,
        audience: str | None = None,
        issuer: str = ISSUER,
        service_url: str | None = None,
        expires_in: int = 3600,
        algorithm: str = "RS256",
        claims: dict[str, Any] | None = None,
        without: tuple[str, ...] = (),
    ) -> str:
        """The JWT the Bot Framework sends with `activity` (each part can be made wrong:
        `claims` changed, those named `without` left out, `kid` "" for none)."""
        now = int(time.time())
        said = {
            "iss": issuer,
            "aud": audience or self.app_id,
            "serviceUrl": service_url if service_url is not None else activity["serviceUrl"],
            "nbf": now - 5,
            "iat": now - 5,
            "exp": now + expires_in,
        } | (claims or {})
        headers = {} if kid == "" else {"kid": kid or self.kid}
        return jwt.encode(
            {name: value for name, value in said.items() if name not in without},
            key or self.key,
            algorithm=algorithm,
            headers=headers,
        )

    def invoke(
        self,
        posted: Posted,
        user: str,
        verb: str,
        *,
        inputs: dict[str, Any] | None = None,
        approval_id: str | None = None,
        shown: dict[str, Any] | None = None,
        title: str | None = None,
    ) -> dict[str, Any]:
        """The `adaptiveCard/action` invoke Teams sends when `user` takes the action `verb` of
        the card `posted` (as `shown` to them, when the bot answered an action of theirs with
        a card of its own: an edit form), with the card's `inputs` (the data of the action
        merged with them, as Teams merges them). `title` picks the action among several of
        the same verb (a question's choices)."""
        member = self.members.get(user, {"id": user})
        data: dict[str, Any] = {}
        card = shown or posted.card
        refresh = (card.get("refresh") or {}).get("action")
        for action in [*card.get("actions", []), *([refresh] if refresh else [])]:
            if action.get("verb") == verb and title in (None, action.get("title")):
                data = dict(action.get("data") or {})
        if approval_id is not None:
            data["approval_id"] = approval_id
        return {
            "type": "invoke",
            "name": "adaptiveCard/action",
            "id": f"f:{secrets.token_hex(8)}",
            "channelId": "msteams",
            "serviceUrl": self.service_url,
            "from": {"id": user, "aadObjectId": member.get("aadObjectId")},
            "conversation": {"id": posted.conversation},
            "recipient": {"id": f"28:{self.app_id}"},
            "replyToId": posted.id,
            "channelData": {"tenant": {"id": "tenant-of-the-tests"}},
            "value": {
                "action": {"type": "Action.Execute", "verb": verb, "data": data | (inputs or {})},
                "trigger": "manual",
            },
        }

    # --- the Bot Framework's side -------------------------------------------------------------

    async def _metadata(self, request: Request) -> Response:
        self.metadata_fetches += 1
        if self.failing_keys:
            return JSONResponse({"error": "unavailable"}, status_code=503)
        return JSONResponse(
            {
                "issuer": ISSUER,
                "jwks_uri": f"{self.base_url}/v1/keys",
                "id_token_signing_alg_values_supported": ["RS256"],
            }
        )

    async def _keys(self, request: Request) -> Response:
        self.key_fetches += 1
        jwk = json.loads(RSAAlgorithm.to_jwk(self.key.public_key()))
        jwk |= {"kid": self.kid, "use": "sig"}
        if self.endorsements is not None:
            jwk["endorsements"] = self.endorsements
        return JSONResponse({"keys": [jwk]})

    async def _token(self, request: Request) -> Response:
        self.token_requests += 1
        form = await request.form()
        if (
            form.get("grant_type") != "client_credentials"
            or form.get("client_id") != self.app_id
            or form.get("client_secret") != self.password
            or form.get("scope") != "https://api.botframework.com/.default"
        ):
            return JSONResponse({"error": "invalid_client"}, status_code=401)
        token = secrets.token_urlsafe(24)
        self.tokens.add(token)
        return JSONResponse({"token_type": "Bearer", "expires_in": 3600, "access_token": token})

    def _authorized(self, request: Request) -> bool:
        header = request.headers.get("authorization", "")
        self.bearers.append(header)
        return header.removeprefix("Bearer ") in self.tokens

    async def _refused(self, request: Request) -> Response | None:
        """How Teams answers a post or a replacement it does not take, if it does not."""
        self.attempts += 1
        if not self._authorized(request):
            return JSONResponse({"error": {"code": "Unauthorized"}}, status_code=401)
        if self.failures:
            status, headers = self.failures.pop(0)
            return JSONResponse({"error": {"code": "Failing"}}, status, headers=headers)
        if len(await request.body()) > self.max_activity:
            return JSONResponse({"error": {"code": "RequestEntityTooLarge"}}, status_code=413)
        return None

    async def _post(self, request: Request) -> Response:
        refused = await self._refused(request)
        if refused is not None:
            return refused
        activity = await request.json()
        posted = Posted(request.path_params["conversation"], f"1{next(self._ids):012d}")
        posted.versions.append(activity)
        self.posts.append(posted)
        return JSONResponse({"id": posted.id}, status_code=201)

    async def _update(self, request: Request) -> Response:
        refused = await self._refused(request)
        if refused is not None:
            return refused
        conversation = request.path_params["conversation"]
        self.updates.append((conversation, request.path_params["activity"]))
        for posted in self.cards(conversation):
            if posted.id == request.path_params["activity"]:
                posted.versions.append(await request.json())
                return JSONResponse({"id": posted.id})
        return JSONResponse({"error": {"code": "ActivityNotFound"}}, status_code=404)

    async def _reply(self, request: Request) -> Response:
        refused = await self._refused(request)
        if refused is not None:
            return refused
        conversation, replied = request.path_params["conversation"], request.path_params["activity"]
        if not any(posted.id == replied for posted in self.cards(conversation)):
            return JSONResponse({"error": {"code": "ActivityNotFound"}}, status_code=404)
        reply = Posted(conversation, f"1{next(self._ids):012d}", reply_to=replied)
        reply.versions.append(await request.json())
        self.replies.append(reply)
        return JSONResponse({"id": reply.id}, status_code=201)

    async def _member(self, request: Request) -> Response:
        self.member_lookups += 1
        if not self._authorized(request):
            return JSONResponse({"error": {"code": "Unauthorized"}}, status_code=401)
        if self.failing_members:
            return JSONResponse({"error": {"code": "ServiceError"}}, status_code=500)
        found = self.members.get(request.path_params["user"])
        if found is None:
            return JSONResponse({"error": {"code": "MemberNotFound"}}, status_code=404)
        return JSONResponse(found)


@contextlib.asynccontextmanager
async def botframework_fake(*, app_id: str, password: str) -> AsyncIterator[BotFrameworkFake]:
    """A BotFrameworkFake served by uvicorn on a free 127.0.0.1 port for the block."""
    fake = BotFrameworkFake(app_id=app_id, password=password)
    config = uvicorn.Config(fake.app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        for _ in range(500):  # bounded: at most 5 s
            if server.started or task.done():
                break
            await asyncio.sleep(0.01)
        assert server.started, "the Bot Framework fake did not start"
        port = server.servers[0].sockets[0].getsockname()[1]
        fake.base_url = f"http://127.0.0.1:{port}"
        yield fake
    finally:
        server.should_exit = True
        await task
