"""The file's sections as pydantic models: `StoreConfig`, `ServerConfig`, `ApiConfig`,
`LogConfig`, `Rule`, `Defaults` (both a `ReviewPolicy`) and the whole file, `Config`, with the
checks that span several keys (a rule's decision against its reviewers, reviewer groups, rules
that can never match, API tokens)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, date, datetime
from functools import cached_property
from typing import Annotated, Any, Literal, TypeAlias

from pydantic import (
    BeforeValidator,
    Field,
    PlainValidator,
    PrivateAttr,
    SecretStr,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from nodbot.bot.config.errors import KeyPath, Source, dotted, problem, problems, shown
from nodbot.bot.config.predicates import BoundSpec, PredicateSpec
from nodbot.bot.config.values import (
    ConfigModel,
    Count,
    Duration,
    ImportPath,
    ListenHost,
    Name,
    PostTarget,
    Principal,
    Reviewer,
    ReviewerEntry,
    normalize_handle,
)
from nodbot.core import InterruptRule

_STORE_SCHEMES = ("sqlite", "sqlite+aiosqlite", "postgresql", "postgres", "postgresql+asyncpg")


class StoreConfig(ConfigModel):
    """Where approvals are kept."""

    url: str = "sqlite:///nodbot.db"
    """`sqlite:///path.db` (relative to the working directory), a bare file path, or
    `postgresql://user:${DB_PASSWORD}@host:5432/db` (`postgres://`, the form many hosts give
    in `DATABASE_URL`, is taken too)."""
    auto_migrate: bool = True
    """Create or upgrade the database schema on first use; when false, a database that is
    not up to date is refused with the command to run (`nodbot migrate`)."""

    @field_validator("url")
    @classmethod
    def _scheme(cls, value: str) -> str:
        refused = store_url_problem(value)
        if refused is not None:
            raise problem(refused)
        return value


def store_url_problem(value: str) -> str | None:
    """What is wrong with a store URL (its scheme), or None; never shows the URL, which may
    hold a password."""
    if not value.strip():
        return "expected a database URL or a file path, not an empty string"
    if "://" in value and value.split("://", 1)[0] not in _STORE_SCHEMES:
        return (
            "expected sqlite:///path.db, postgresql://user@host/db or a file path; "
            f"the scheme {value.split('://', 1)[0]!r} is not supported"
        )
    return None


class ServerConfig(ConfigModel):
    """Where the bot's HTTP API and web inbox listen."""

    host: ListenHost = "127.0.0.1"
    """The address to listen on: an IP address or a host name of this machine; 0.0.0.0 for
    every IPv4 interface, :: for every IPv6 one."""
    port: Annotated[Count, Field(ge=0, le=65535)] = 8080
    """The TCP port, 1 to 65535; 0 lets the system pick a free one (the bot prints it)."""


class WorkersConfig(ConfigModel):
    """How the bot's workers continue runs."""

    poll: Annotated[float, Field(gt=0, le=60)] = 0.5
    """Seconds between two looks at the store when nothing wakes the workers (a decision
    recorded by this bot wakes them at once)."""
    lease: Duration = 300
    """How long a worker holds a run it continues; a run whose worker died is taken over
    when its lease runs out. Longer than any tool call takes."""


class LogConfig(ConfigModel):
    """What `nodbot serve` writes to stderr: one line per record."""

    level: Literal["debug", "info", "warning", "error"] = "info"
    """The least severe records written: `info` has a line per HTTP request, review opened,
    decision, run step and delivery; `warning` only what went wrong."""
    format: Literal["text", "json"] = "text"
    """`text`: `time level logger message key=value...`; `json`: one object per line, the
    structured fields (approval_id, run_id, ...) as top-level keys, for a log collector."""


ApiScope: TypeAlias = Literal[
    "approvals:read",
    "approvals:decide",
    "approvals:request",
    "runs:write",
    "runs:write-as",
    "email:ingest",
]
"""What an API token may do: read approvals, decide them, ask for them (`POST /approvals`,
for agents that run their tools themselves: read and take their decisions too), start runs
(requested by the token's name), start runs requested by someone else (`requested_by`: for a
front end that starts runs for its users; such a token may deny calls but never approve or
edit them), and hand reply emails to `POST /email/inbound` (`email:ingest`, for mail
providers' inbound webhooks)."""

_MIN_TOKEN_LENGTH = 16


def _secret(value: object) -> str:
    # Problems never show the value: it is a secret, even when written in the file.
    if isinstance(value, SecretStr):
        value = value.get_secret_value()
    if not isinstance(value, str):
        kind = "a number" if isinstance(value, (int, float)) else shown(value)
        raise problem(f"expected a secret string such as ${{NODBOT_TOKEN_ANA}}, not {kind}")
    if len(value) < _MIN_TOKEN_LENGTH:
        raise problem(f"a token needs at least {_MIN_TOKEN_LENGTH} characters")
    return value


Secret: TypeAlias = Annotated[SecretStr, BeforeValidator(_secret)]
"""A secret string of at least 16 characters; never shown in a problem or a repr."""


class ApiToken(ConfigModel):
    """One bearer token of the HTTP API and who it stands for."""

    name: Principal
    """The principal: recorded as `decided_by` for the decisions made with this token, and
    matched against the rules' reviewers (so name it after its holder's Slack user id or
    email address)."""
    token: Secret
    """The secret itself, at least 16 characters; write it as `${NODBOT_TOKEN_<NAME>}` so it
    stays out of the file."""
    scopes: list[ApiScope]
    """What the token may do: a non-empty subset of approvals:read, approvals:decide,
    runs:write (start runs requested by this token's name) and runs:write-as (with
    runs:write, start runs for the `requested_by` the body names; a token with it may deny
    calls over the API but not approve or edit them, since it may have started any run)."""

    @field_validator("scopes")
    @classmethod
    def _scopes(cls, value: list[ApiScope]) -> list[ApiScope]:
        if not value:
            raise problem(
                "expected at least one of approvals:read, approvals:decide, "
                "approvals:request, runs:write, runs:write-as, email:ingest"
            )
        if len(set(value)) != len(value):
            raise problem(f"each scope may be listed once, not {value}")
        return value


class ApiConfig(ConfigModel):
    """Who may call the HTTP API."""

    tokens: list[ApiToken] = Field(default_factory=list)
    """The accepted bearer tokens; names and tokens are unique. Without any, every request
    that needs a token is refused."""

    @field_validator("tokens")
    @classmethod
    def _unique(cls, value: list[ApiToken]) -> list[ApiToken]:
        found: list[tuple[KeyPath, str]] = []
        names: dict[str, int] = {}
        secrets: dict[str, int] = {}
        for index, entry in enumerate(value):
            first = names.setdefault(entry.name, index)
            if first != index:
                found.append(
                    ((index, "name"), f"the name {entry.name!r} is taken by api.tokens.{first}")
                )
            first = secrets.setdefault(entry.token.get_secret_value(), index)
            if first != index:
                found.append(
                    ((index, "token"), f"the same token as api.tokens.{first}; give each its own")
                )
        if found:
            raise problems(*found)
        return value


class WebConfig(ConfigModel):
    """The web inbox, where reviewers see and decide approvals in a browser. They sign in
    with a link the bot makes for them (`nodbot inbox-link`); the link, their session and
    each form are signed with `secret`."""

    secret: Secret | None = None
    """Signs sign-in links, sessions and forms; at least 16 characters, written as
    `${NODBOT_WEB_SECRET}`. Without one, a random secret is made at each start, so links and
    sessions stop working when the bot restarts."""
    public_url: str | None = None
    """The address reviewers open, such as https://nodbot.example.com, used in links; by
    default http://<server.host>:<server.port>."""
    link_ttl: Duration = 86_400
    """How long a sign-in link works (default 1d)."""
    session_ttl: Duration = 43_200
    """How long a reviewer stays signed in (default 12h)."""

    @field_validator("public_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"https?://[^\s/]+(/[^\s]*)?", value):
            raise problem(f"expected an http:// or https:// address, not {value!r}")
        return None if value is None else value.rstrip("/")


class SlackConfig(ConfigModel):
    """The Slack channel: the app's tokens, and how Slack reaches the bot (docs: Slack setup)."""

    mode: Literal["http", "socket"] = "http"
    """`http`: Slack sends clicks to https://<host>/slack/events (signed with
    `signing_secret`); `socket`: the bot opens a Socket Mode connection (`app_token`), for
    hosts Slack cannot reach."""
    bot_token: Secret
    """The bot token (xoxb-...), written as `${SLACK_BOT_TOKEN}`."""
    signing_secret: Secret | None = None
    """Checks that requests come from Slack (http mode), `${SLACK_SIGNING_SECRET}`."""
    app_token: Secret | None = None
    """The app-level token (xapp-..., scope connections:write) of Socket Mode,
    `${SLACK_APP_TOKEN}`."""
    api_url: str | None = None
    """The Web API's base URL; by default Slack's own (https://slack.com/api/). Set it to a
    local stand-in of Slack to try the bot without a workspace."""
    cache_ttl: Duration = 300
    """How long user group members and email lookups are kept (default 5m)."""

    @field_validator("api_url")
    @classmethod
    def _api_url(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"https?://[^\s/]+(/[^\s]*)?", value):
            raise problem(f"expected an http:// or https:// address, not {value!r}")
        return None if value is None else value.rstrip("/") + "/"

    @model_validator(mode="after")
    def _mode_needs(self) -> SlackConfig:
        if self.mode == "http" and self.signing_secret is None:
            raise problems((("signing_secret",), "http mode needs the app's signing secret"))
        if self.mode == "socket" and self.app_token is None:
            raise problems((("app_token",), "socket mode needs an app-level token (xapp-...)"))
        return self


_DISCORD_HANDLE = re.compile(r"discord:[0-9]{5,25}")


def _person_handle(value: object) -> str:
    if isinstance(value, str) and _DISCORD_HANDLE.fullmatch(value):
        return value
    if not isinstance(value, str):
        raise problem(f"expected a handle, not {shown(value)}")
    try:
        principal: str = TypeAdapter(Principal).validate_python(value)
    except ValidationError as exc:
        raise problem(str(exc.errors()[0]["msg"]).removeprefix("Value error, ")) from None
    return principal


PersonHandle: TypeAlias = Annotated[str, PlainValidator(_person_handle)]
"""A handle of a `people:` entry: a principal (a name, a Slack user id, an email address) or
`discord:<user id>`, a Discord user (Discord ids are not addresses)."""


class DiscordConfig(ConfigModel):
    """The Discord channel: reviews posted to Discord channels with Approve / Edit / Deny
    buttons, clicks sent by Discord to https://<host>/discord/interactions (docs: Discord
    setup)."""

    application_id: Annotated[str, Field(pattern=r"^[0-9]{5,25}$")]
    """The application's id (General Information in the developer portal)."""
    public_key: Annotated[str, Field(pattern=r"^[0-9a-fA-F]{64}$")]
    """The application's public key (hex): interactions are checked against it (Ed25519)."""
    bot_token: Secret
    """The bot's token, written as `${DISCORD_BOT_TOKEN}`: it posts and edits the messages."""
    channels: Annotated[list[Annotated[str, Field(pattern=r"^[0-9]{5,25}$")]], Field(min_length=1)]
    """The ids of the Discord channels a review is posted to when its rule has no `post_to`
    (a rule with it names its own, `discord:<channel id>`); who may decide it is its rule's
    say (Discord users are matched to reviewers through `people:`)."""
    api_url: str | None = None
    """The REST API's base URL; by default Discord's own (https://discord.com/api/v10). Set
    it to a local stand-in of Discord to try the bot without a server."""

    @field_validator("api_url")
    @classmethod
    def _api_url(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"https?://[^\s/]+(/[^\s]*)?", value):
            raise problem(f"expected an http:// or https:// address, not {value!r}")
        return None if value is None else value.rstrip("/")


class TeamsConversation(ConfigModel):
    """A Microsoft Teams conversation reviews are posted to (docs: Microsoft Teams setup)."""

    name: Name | None = None
    """What a rule's `post_to` calls it (`teams:<name>`); a rule may name it by its id too."""
    conversation: Annotated[str, Field(min_length=1, max_length=512)]
    """Its id: a channel's (19:...@thread.tacv2) or a personal chat's (a:1...), as Teams
    says it in the activities it sends the bot."""
    service_url: str
    """The Bot Framework connector that serves it (the `serviceUrl` of its activities, such
    as https://smba.trafficmanager.net/amer/)."""

    @field_validator("service_url")
    @classmethod
    def _service_url(cls, value: str) -> str:
        if not re.fullmatch(r"https?://[^\s/]+(/[^\s]*)?", value):
            raise problem(f"expected an http:// or https:// address, not {value!r}")
        return value.rstrip("/")


class TeamsConfig(ConfigModel):
    """The Microsoft Teams channel: the Azure bot's app id and password, and where reviews
    are posted (docs: Microsoft Teams setup). Teams sends clicks to
    https://<host>/teams/messages, each signed by the Bot Framework (a JWT checked against
    its published keys)."""

    app_id: Annotated[str, Field(min_length=1, max_length=200)]
    """The bot's Microsoft app id (a GUID): the audience its inbound tokens must name."""
    app_password: Secret
    """The bot's client secret, written as `${TEAMS_APP_PASSWORD}`."""
    post_to: list[TeamsConversation] = Field(default_factory=list)
    """The conversations review requests are posted to, as an Adaptive Card (Approve, Edit,
    Deny), each updated once the review is decided: every one of them for a rule without
    `post_to`, and those the rule names (`teams:<name or id>`) for a rule with it."""
    openid_url: str = "https://login.botframework.com/v1/.well-known/openidconfiguration"
    """The Bot Framework's OpenID metadata, whose `jwks_uri` lists the keys inbound tokens
    are signed with; change it only to point at a local stand-in of the Bot Framework."""
    token_url: str = "https://login.microsoftonline.com/botframework.com/oauth2/v2.0/token"
    """Where the bot gets its own token (client credentials) to post to the connector; a
    single-tenant bot puts its tenant id in place of botframework.com."""
    issuer: str = "https://api.botframework.com"
    """The issuer inbound tokens must name."""
    cache_ttl: Duration = 300
    """How long a Teams user's address (looked up to tell who they are) is kept (default 5m)."""

    @field_validator("post_to")
    @classmethod
    def _names(cls, value: list[TeamsConversation]) -> list[TeamsConversation]:
        found: list[tuple[KeyPath, str]] = []
        seen: set[str] = set()
        for index, entry in enumerate(value):
            for said in sorted({entry.conversation, entry.name or entry.conversation}):
                if said in seen:
                    found.append(((index,), f"{said!r} names another conversation already"))
                seen.add(said)
        if found:
            raise problems(*found)
        return value

    @field_validator("openid_url", "token_url")
    @classmethod
    def _urls(cls, value: str) -> str:
        if not re.fullmatch(r"https?://[^\s/]+(/[^\s]*)?", value):
            raise problem(f"expected an http:// or https:// address, not {value!r}")
        return value


WebhookEvent: TypeAlias = Literal["approval.pending", "approval.escalated", "approval.decided"]
"""What a webhook is told of: a review opened, still open at its rule's `escalate_after`,
decided."""
WEBHOOK_EVENTS: tuple[WebhookEvent, ...] = (
    "approval.pending",
    "approval.escalated",
    "approval.decided",
)


class Webhook(ConfigModel):
    """An HTTP endpoint told of reviews: a JSON body, signed with HMAC-SHA256 over the
    timestamp and the body (docs: Webhooks), retried with backoff until it answers
    2xx. An app that runs its own executor against the bot's database resumes its run when it
    is told `approval.decided`."""

    name: Name
    """Names the webhook in logs and in the outbox."""
    url: str
    """Where to POST, http:// or https://."""
    secret: Secret
    """The signing key, at least 16 characters, written as `${NODBOT_WEBHOOK_SECRET}`."""
    events: list[WebhookEvent] = Field(default_factory=lambda: list(WEBHOOK_EVENTS))
    """Which events to send (default all three)."""
    timeout: Annotated[float, Field(gt=0, le=60)] = 10
    """Seconds to wait for an answer before the attempt counts as failed."""

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        if not re.fullmatch(r"https?://[^\s/]+(/[^\s]*)?", value):
            raise problem(f"expected an http:// or https:// address, not {value!r}")
        return value

    @field_validator("events")
    @classmethod
    def _events(cls, value: list[WebhookEvent]) -> list[WebhookEvent]:
        if not value or len(set(value)) != len(value):
            raise problem(
                "expected some of approval.pending, approval.escalated, approval.decided, each once"
            )
        return value


ReviewDecision: TypeAlias = Literal["approve", "edit", "deny", "respond"]
"""What a reviewer may answer; `respond` (answer in the tool's place) only where a rule
lists it."""


def _all_decisions() -> list[ReviewDecision]:
    return ["approve", "edit", "deny"]


_REVIEW_KEYS = (
    "reviewers",
    "post_to",
    "allowed_decisions",
    "editable",
    "edit_bounds",
    "approvals_required",
    "allow_self_approval",
    "timeout",
    "timeout_decision",
    "escalate_after",
    "escalate_to",
    "remind_every",
    "remind_limit",
    "remember",
    "remember_by",
)
_TOOL_NAME = re.compile(r"[A-Za-z_]\w*")


MIN_REMIND_EVERY = 300
"""Seconds between reminders at least: a nudge, not a stream of messages."""
MAX_REMINDERS = 10
"""Reminders of one review at most (`remind_limit`)."""


class ReviewPolicy(ConfigModel):
    """How a call is reviewed: who decides, what they may answer, by when. The keys a review
    rule and `defaults:` share."""

    description: str | None = None
    """Why the rule exists, shown to reviewers."""
    reviewers: list[ReviewerEntry] | None = None
    """Who may decide: Slack users (U..., W...), user groups (S...), channels (#name, C...),
    email addresses, or group:<name> for a reviewer group of this file."""
    post_to: list[PostTarget] | None = None
    """Where the review request is posted, in every chat: Slack channels (#name, C...)
    and/or `dm` (a Slack direct message to each reviewer), Teams conversations of
    `teams.post_to` (`teams:<name or id>`), Discord channels (`discord:<channel id>`); a chat
    none of whose places is listed gets nothing. Absent: in Slack the reviewers that are
    channels get it there and the people (user ids, user groups, addresses) by direct
    message; in Teams every conversation of `teams.post_to`; in Discord every channel of
    `discord.channels`."""
    allowed_decisions: list[ReviewDecision] = Field(default_factory=_all_decisions)
    """What reviewers may answer: a non-empty subset of approve, edit, deny and respond.
    `respond` (the reviewer's text becomes the call's result for the agent, and the tool does
    not run) is allowed only where it is listed: the default leaves it out."""
    editable: list[str] | None = None
    """The arguments a reviewer may edit; absent means all of them."""
    edit_bounds: list[BoundSpec] | None = None
    """What every edited call must meet, each written like `when` and tested on the edit
    merged into the call's arguments; a value may be `{original: <argument>}`, that argument
    as the call asked for it: `[{gt: {amount: 0}}, {le: {amount: {original: amount}}}]`. A
    bound that cannot be tested (a missing argument, values that do not compare) refuses the
    edit."""
    approvals_required: Annotated[Count, Field(ge=1)] = 1
    """How many distinct reviewers must approve (N of M); any deny denies."""
    allow_self_approval: bool = False
    """Whether the person who started the run may approve its calls."""
    timeout: Duration | None = None
    """How long a review may stay open (30s, 15m, 2h, 1d); absent means no limit."""
    timeout_decision: Literal["deny", "approve"] = "deny"
    """What a review that timed out becomes, recorded as a timeout with decided_by
    `nodbot:timeout`."""
    escalate_after: Duration | None = None
    """How long before `escalate_to` is asked too; shorter than `timeout`."""
    escalate_to: list[ReviewerEntry] | None = None
    """Who is asked after `escalate_after`; written like `reviewers`."""
    remind_every: Duration | None = None
    """How often the reviewers who have not acted yet are reminded while the review waits
    (at least 5m): on the channel that reached them, a reply in the review's thread."""
    remind_limit: Annotated[Count, Field(ge=1, le=MAX_REMINDERS)] = 3
    """How many reminders at most (1 to 10), each `remind_every` after the one before."""
    remember: Duration | None = None
    """How long a reviewer's "approve, and remember" holds (such as 1d): a later call of the
    same tool with the same arguments (those of `remember_by`) under this rule, unchanged,
    is approved at once as that reviewer's decision. Without it, nothing is remembered."""
    remember_by: list[str] | None = None
    """The arguments a remembered approval is scoped to (by default all of them): with
    `[recipient]`, approving one email to a recipient approves the later ones to them."""

    @field_validator("allowed_decisions")
    @classmethod
    def _decisions(cls, value: list[ReviewDecision]) -> list[ReviewDecision]:
        if not value:
            raise problem("expected at least one of approve, edit, deny, respond")
        if len(set(value)) != len(value):
            raise problem(f"each decision may be listed once, not {value}")
        return value

    @field_validator("reviewers", "escalate_to")
    @classmethod
    def _some_reviewers(cls, value: list[Reviewer] | None) -> list[Reviewer] | None:
        if value is not None and not value:
            raise problem("expected at least one reviewer")
        return value

    @field_validator("edit_bounds")
    @classmethod
    def _some_bounds(cls, value: list[BoundSpec] | None) -> list[BoundSpec] | None:
        if value is not None and not value:
            raise problem("expected at least one bound, such as {gt: {amount: 0}}")
        return value

    def _reminder_problems(self) -> Iterator[tuple[KeyPath, str]]:
        every, timeout = self.remind_every, self.timeout
        if every is None:
            if "remind_limit" in self.model_fields_set:
                yield ("remind_limit",), "has no effect without remind_every"
            return
        if every < MIN_REMIND_EVERY:
            yield ("remind_every",), "must be at least 5m: a reminder is a nudge, not a stream"
        if timeout is not None and every >= timeout:
            yield ("remind_every",), "must be shorter than timeout (no reminder would be sent)"

    def _review_problems(self) -> Iterator[tuple[KeyPath, str]]:
        if (self.escalate_after is None) != (self.escalate_to is None):
            given, missing = (
                ("escalate_after", "escalate_to")
                if self.escalate_after is not None
                else ("escalate_to", "escalate_after")
            )
            yield (given,), f"needs {missing} too (give both or neither)"
        after, timeout = self.escalate_after, self.timeout
        if after is not None and timeout is not None and after >= timeout:
            yield ("escalate_after",), "must be shorter than timeout"
        yield from self._reminder_problems()
        if "timeout_decision" in self.model_fields_set and self.timeout is None:
            yield ("timeout_decision",), "has no effect without timeout"
        if self.remember_by is not None and self.remember is None:
            yield ("remember_by",), "has no effect without remember"
        if self.remember is not None and self.approvals_required > 1:
            yield ("remember",), "one reviewer's approval cannot stand for several"
        for key in ("editable", "edit_bounds"):
            if getattr(self, key) is not None and "edit" not in self.allowed_decisions:
                yield (key,), "has no effect unless allowed_decisions includes edit"
        if self.editable == [] and "edit" in self.allowed_decisions:
            instead = "remove edit from allowed_decisions instead"
            yield ("editable",), f"an empty list allows no edit: {instead}"
        reviewers = self.reviewers or []
        if reviewers and all(reviewer.is_individual for reviewer in reviewers):
            people = len({reviewer.value for reviewer in reviewers})
            if self.approvals_required > people:
                message = f"cannot come from {people} listed reviewer(s)"
                yield ("approvals_required",), f"{self.approvals_required} approvals {message}"


class _CoveredCalls(ConfigModel):
    """The keys of a rule that say which calls it covers and whether it decides them itself
    (a base of `Rule`, so that they come first)."""

    tool: str
    """The tool's name, or `*` for every tool."""
    when: PredicateSpec | None = None
    """A predicate on the call's arguments (as the tool's model validated them); without it
    every call of the tool matches. A predicate that cannot judge a call (a missing argument,
    a value of another type, NaN) fails closed by the rule's outcome: a review or deny rule
    matches, an approve rule does not (the call goes on to the next rule), and a remembered
    approval does not decide it."""
    decision: Literal["approve", "deny"] | None = None
    """Decide without a person. A rule has either `decision` or `reviewers`."""

    @field_validator("tool")
    @classmethod
    def _tool(cls, value: str) -> str:
        if value != "*" and not _TOOL_NAME.fullmatch(value):
            raise problem(f"expected a tool name (a Python identifier) or '*', not {value!r}")
        return value


class Rule(ReviewPolicy, _CoveredCalls):
    """Which calls it covers (`tool`, `when`) and what happens to them: an automatic
    `decision`, or a review by `reviewers`. Rules are tried in order; the first match wins."""

    @model_validator(mode="after")
    def _consistent(self) -> Rule:
        found = list(self._decision_problems())
        if self.decision is None:
            found.extend(self._review_problems())
        if found:
            raise problems(*found)
        return self

    def _decision_problems(self) -> Iterator[tuple[KeyPath, str]]:
        if self.decision is None:
            if self.reviewers is None:
                needed = "reviewers (who decides) or decision: approve | deny"
                yield (), f"a rule needs {needed} (decided without a person)"
            return
        refused = f"not allowed with decision: {self.decision}"
        for key in _REVIEW_KEYS:
            if key in self.model_fields_set:
                yield (key,), f"{refused} (a rule either decides by itself or names reviewers)"

    @cached_property
    def interrupt_rule(self) -> InterruptRule:
        """The core rule that matches the same calls (built once)."""
        match = self.when.to_predicate() if self.when is not None else None
        return InterruptRule(tool=self.tool, match=match, description=self.description)

    def to_interrupt_rule(self) -> InterruptRule:
        """The core `InterruptRule` matching the calls this rule covers.

        It says only which calls match: whether a match means a review (`reviewers`) or an
        automatic decision (`decision`) is this rule's to say.
        """
        return self.interrupt_rule

    def judge(self, tool: str, arguments: Mapping[str, Any] | None) -> bool | None:
        """Whether the call is one this rule is about: False for another tool; for its own,
        whether `when` holds, or None when that cannot be judged (a predicate cannot judge
        the arguments, or they failed the tool's validation: `arguments` None)."""
        rule = self.interrupt_rule
        if not rule.applies_to(tool):
            return False
        if arguments is None:
            return None  # invalid arguments: not even a rule without `when` judges them
        return rule.judge(arguments)

    def covers(self, tool: str, arguments: Mapping[str, Any] | None) -> bool:
        """Whether this rule takes the call, failing closed by its outcome (`takes`)."""
        return self.takes(self.judge(tool, arguments))

    def takes(self, verdict: bool | None) -> bool:
        """Whether this rule takes a call it judged so (`judge`): one it cannot judge is
        taken by a review or deny rule and left by an approve rule."""
        return verdict is True or (verdict is None and self.decision != "approve")


class Defaults(ReviewPolicy):
    """How a call is reviewed when its tool asks for review (`confirm=True`, or a confirm
    rule that says so) and no rule covers it; without `defaults:` such a call is denied.
    Written like a review rule, without `tool`, `when` or `decision`; its reviews' policy
    names `defaults` as their rule."""

    @model_validator(mode="after")
    def _consistent(self) -> Defaults:
        found = list(self._review_problems())
        if self.reviewers is None:
            found.insert(0, ((), "defaults need reviewers: who decides the calls no rule covers"))
        if found:
            raise problems(*found)
        return self


# --- email ----------------------------------------------------------------------------------

_LOCAL_PART = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~.-]+"
_DOMAIN = r"[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?"
_ADDRESS = re.compile(f"{_LOCAL_PART}@{_DOMAIN}")
TOKEN_ROOM = 46
"""Characters a reply token takes in a plus address (`+` and the token, `bot/email/tokens.py`):
the rest of the local part of `reply_to` must leave room for it within RFC 5321's 64."""


def _address(value: object) -> str:
    # One bare address: what goes into an envelope and a header, so nothing that could
    # smuggle a second address or a header in (no display name, commas, spaces, CR/LF).
    if not isinstance(value, str):
        raise problem(f"expected an email address such as nodbot@example.com, not {shown(value)}")
    if not _ADDRESS.fullmatch(value):
        raise problem(
            "expected one email address such as nodbot@example.com (no display name, no "
            "spaces or line breaks)"
        )
    return value


Address: TypeAlias = Annotated[str, PlainValidator(_address)]
"""One email address, `name@example.com`."""


def _one_line(value: object) -> object:
    if isinstance(value, str) and ("\r" in value or "\n" in value):
        raise problem("expected one line, without line breaks")
    return value


OneLine: TypeAlias = Annotated[str, BeforeValidator(_one_line)]
"""A string without CR or LF (it may end up in a protocol line)."""


def _password(value: object) -> object:
    if isinstance(value, SecretStr):
        value = value.get_secret_value()
    if not isinstance(value, str) or not value:
        raise problem("expected a password string such as ${SMTP_PASSWORD}")
    return _one_line(value)


MailPassword: TypeAlias = Annotated[SecretStr, BeforeValidator(_password)]
"""A mail server's password (whatever length the provider gives); never shown."""

MailTls: TypeAlias = Literal["none", "starttls", "tls"]
_DEFAULT_PORTS: dict[str, int] = {"none": 25, "starttls": 587, "tls": 465}


class _MailServer(ConfigModel):
    """How to reach a mail server: the keys SMTP and IMAP share."""

    host: OneLine
    """The server's name or address."""
    port: Annotated[Count, Field(ge=1, le=65535)] | None = None
    """Its TCP port; by default the usual one for `tls`."""
    tls: MailTls = "starttls"
    """`none` (plain text: only on a trusted network), `starttls` (upgrade a plain connection,
    the default) or `tls` (TLS from the start)."""
    username: OneLine | None = None
    """Who to sign in as; without it, no sign-in."""
    password: MailPassword | None = None
    """Written as `${SMTP_PASSWORD}` so it stays out of the file; needs `username`."""
    timeout: Annotated[float, Field(gt=0, le=300)] = 30
    """Seconds to wait for the server before the attempt counts as failed."""

    @model_validator(mode="after")
    def _sign_in(self) -> _MailServer:
        if (self.username is None) != (self.password is None):
            missing = "password" if self.password is None else "username"
            raise problems(((missing,), "username and password go together"))
        return self


class SmtpConfig(_MailServer):
    """The server review emails are sent through."""

    @property
    def port_or_default(self) -> int:
        """The port given, or 25 / 587 / 465 for `tls` none / starttls / tls."""
        return self.port if self.port is not None else _DEFAULT_PORTS[self.tls]


class ImapConfig(_MailServer):
    """A mailbox replies are read from: new messages are read as they arrive (IDLE where the
    server has it, else every `poll` seconds) and each is moved to `processed_mailbox`, or
    flagged seen, once processed, so a restart never decides one twice nor skips one."""

    tls: MailTls = "tls"
    """`tls` (TLS from the start, port 993: the default) or `none` (plain text, port 143:
    only on a trusted network); `starttls` is not offered for IMAP."""
    mailbox: OneLine = "INBOX"
    """The folder replies arrive in."""
    processed_mailbox: OneLine | None = None
    """Where a processed reply is moved (it must exist); without it, it is flagged as seen.
    Moving is the safer choice: a person reading the mailbox cannot mark a reply seen before
    the bot has read it."""
    poll: Annotated[float, Field(gt=0, le=3600)] = 30
    """Seconds between looks at the mailbox when the server has no IDLE; with IDLE, the
    longest wait before looking again anyway."""

    @field_validator("tls")
    @classmethod
    def _no_starttls(cls, value: str) -> str:
        if value == "starttls":
            raise problem("IMAP is read over tls (port 993) or none; starttls is not offered")
        return value


class InboundConfig(ConfigModel):
    """How replies reach the bot: any of a listener, a mailbox, and (always, when `email:` is
    set) `POST /email/inbound` for mail providers' webhooks."""

    listen: OneLine | None = None
    """`host:port` the bot listens on for a mail server to hand replies to (port 0 picks a
    free one). Only mail to `reply_to` is taken, so it is no relay; keep it on an address
    only your mail server reaches."""
    protocol: Literal["smtp", "lmtp"] = "smtp"
    """What is spoken on `listen`."""
    imap: ImapConfig | None = None
    """A mailbox to read replies from."""

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str | None) -> str | None:
        if value is not None:
            host, _, port = value.rpartition(":")
            if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
                raise problem(f"expected host:port such as 127.0.0.1:2525, not {value!r}")
        return value


class EmailConfig(ConfigModel):
    """The email channel: each review is emailed to its email reviewers (docs: Email setup)."""

    sender: Address = Field(alias="from")
    """`from`: the bot's address, the sender of every email."""
    reply_to: Address
    """The mailbox replies go to, such as approvals@example.com; each reviewer gets a plus
    address of it naming the review and them (`approvals+<token>@example.com`), so its
    server must deliver plus addresses to it."""
    smtp: SmtpConfig
    """The server emails are sent through."""
    inbound: InboundConfig | None = None
    """How replies come back (`POST /email/inbound` needs nothing here)."""
    trusted_authserv_id: OneLine | None = None
    """The authserv-id of your mail server's `Authentication-Results` headers: the only ones
    believed when a reply is checked (any server can write the header; yours is the one
    that removes forged copies of its own)."""
    require_authenticated_sender: bool = True
    """Whether a reply must have passed DMARC (or DKIM aligned with its From domain) at
    `trusted_authserv_id`. Turn it off only where nobody else can reach the inbound doors
    (the demo's loopback listener): without it, a From header is believed as written."""
    reply_ttl: Duration = 604_800
    """How long a reply token works at most (default 7d); it ends with its review's timeout
    when that comes first."""

    @field_validator("reply_to")
    @classmethod
    def _room_for_token(cls, value: str) -> str:
        local = value.rpartition("@")[0]
        if "+" in local:
            raise problem("expected the mailbox itself, without a +tag: the bot adds its own")
        if len(local) + TOKEN_ROOM > 64:
            room = 64 - TOKEN_ROOM
            raise problem(f"at most {room} characters before the @: reply tokens need room")
        return value


class AuditConfig(ConfigModel):
    """The audit trail: every event is hash-chained per review (`nodbot audit verify`)."""

    key: Secret | None = None
    """Keys the chain's hashes (HMAC-SHA256), so that only who holds it can write events that
    verify; at least 16 characters, written as `${NODBOT_AUDIT_KEY}`, the same for every
    process that writes to the store. Without one the hashes are plain SHA-256: they show
    changes, but anyone who can write to the database can recompute them."""

    @property
    def secret(self) -> str | None:
        """The key itself, for the store; None without one."""
        return None if self.key is None else self.key.get_secret_value()


def moment(value: object) -> object:
    """A date (its first moment, UTC) or a date and time (UTC when no zone is written)."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.strip())
        except ValueError:
            raise problem(
                f"expected a date such as 2027-01-10 or a time such as 2027-01-10T09:00+01:00, "
                f"not {value!r}"
            ) from None
    if isinstance(value, date) and not isinstance(value, datetime):
        value = datetime(value.year, value.month, value.day, tzinfo=UTC)
    if isinstance(value, datetime) and value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value


Moment: TypeAlias = Annotated[datetime, BeforeValidator(moment)]
"""A date (from its first moment, UTC) or an ISO date and time."""


class StandingDelegation(ConfigModel):
    """A reviewer's reviews handed to another person (out of office, a standing deputy):
    while it lasts, `to` may decide what `from` could, never a run `to` asked for."""

    delegator: Principal = Field(alias="from")
    """`from`: whose reviews, a handle of theirs (an email address, a Slack user id, a
    name of `people:`)."""
    delegate: Principal = Field(alias="to")
    """`to`: who decides them meanwhile, a handle of theirs."""
    since: Moment | None = None
    """When it starts (a date is its first moment, UTC); by default at once."""
    until: Moment | None = None
    """When it ends (a date is its first moment, UTC: the day they are back); by default
    it lasts as long as the file names it."""
    reason: OneLine | None = None
    """Why, shown with it (`nodbot delegate list`)."""

    @model_validator(mode="after")
    def _two_people(self) -> StandingDelegation:
        if normalize_handle(self.delegator) == normalize_handle(self.delegate):
            raise problem("a reviewer cannot hand their reviews to themselves")
        if self.since is not None and self.until is not None and self.until <= self.since:
            raise problem("until must come after since")
        return self


class Config(ConfigModel):
    """The whole `nodbot.yml`."""

    store: StoreConfig = Field(default_factory=StoreConfig)
    """Where approvals are kept."""
    server: ServerConfig = Field(default_factory=ServerConfig)
    """Where the HTTP API and web inbox listen."""
    workers: WorkersConfig = Field(default_factory=WorkersConfig)
    """How runs are continued."""
    agents: dict[Name, ImportPath] = Field(default_factory=dict)
    """Agent name -> `package.module:attribute` of a `core.Agent` or of a zero-argument
    callable returning one."""
    framework_agents: dict[Name, ImportPath] = Field(default_factory=dict)
    """Agent name -> `package.module:attribute` of an agent of another framework (a
    `core.bridges.hosted.HostedAgent`: see the bridges, e.g. `HostedPydanticAI`, or a
    zero-argument callable returning one), run by the bot like its own: started by
    `POST /runs`, its calls put to the rules (name its tools in `external_tools`), resumed
    by the workers, its framework's state kept in the store between steps."""
    external_tools: list[Name] = Field(default_factory=list)
    """Tools that programs outside the bot run themselves and ask about (`POST /approvals`,
    the client, the bridges, the MCP gateway): rules may name them though no agent of the
    bot registers them. A call of a tool no rule covers is reviewed under `defaults:`, or
    denied without them."""
    reviewer_groups: dict[Name, list[ReviewerEntry]] = Field(default_factory=dict)
    """Group name -> reviewers (not other groups); rules name a group as group:<name>."""
    people: dict[Name, list[PersonHandle]] = Field(default_factory=dict)
    """Person name -> their handles (Slack user ids, email addresses, API token names,
    inbox sign-ins, `discord:<user id>`): one person however they act. A Slack user and the
    address Slack holds for them are one person without an entry."""
    delegations: list[StandingDelegation] = Field(default_factory=list)
    """Standing delegations: a reviewer's reviews handed to another person, as
    `nodbot delegate` hands them for a while (docs: People and handles)."""
    rules: list[Rule] = Field(default_factory=list)
    """Tried in order for each call; the first that matches decides what happens."""
    defaults: Defaults | None = None
    """How a call is reviewed when its tool asks for review (`confirm`) and no rule covers
    it; without `defaults:` such a call is denied."""
    slack: SlackConfig | None = None
    """The Slack channel; without it, nothing is posted to Slack."""
    teams: TeamsConfig | None = None
    """The Microsoft Teams channel; without it, nothing is posted to Teams."""
    discord: DiscordConfig | None = None
    """The Discord channel; without it, nothing is posted to Discord."""
    email: EmailConfig | None = None
    """The email channel; without it, nothing is emailed. Needs `web.secret` (it signs the
    reply tokens)."""
    api: ApiConfig = Field(default_factory=ApiConfig)
    """Who may call the HTTP API (bearer tokens and their scopes)."""
    web: WebConfig = Field(default_factory=WebConfig)
    """The web inbox: how its links and sessions are signed."""
    webhooks: list[Webhook] = Field(default_factory=list)
    """HTTP endpoints told of reviews opened and decided."""
    audit: AuditConfig = Field(default_factory=AuditConfig)
    """The audit trail's key."""
    log: LogConfig = Field(default_factory=LogConfig)
    """What `nodbot serve` logs, and how."""

    @field_validator("webhooks")
    @classmethod
    def _webhook_names(cls, value: list[Webhook]) -> list[Webhook]:
        seen: dict[str, int] = {}
        found: list[tuple[KeyPath, str]] = []
        for index, hook in enumerate(value):
            first = seen.setdefault(hook.name, index)
            if first != index:
                found.append(
                    ((index, "name"), f"the name {hook.name!r} is taken by webhooks.{first}")
                )
        if found:
            raise problems(*found)
        return value

    _source: Source | None = PrivateAttr(default=None)

    @field_validator("reviewer_groups")
    @classmethod
    def _groups(cls, value: dict[str, list[Reviewer]]) -> dict[str, list[Reviewer]]:
        found: list[tuple[KeyPath, str]] = []
        for name, members in value.items():
            if not members:
                found.append(((name,), "expected at least one reviewer"))
            for index, member in enumerate(members):
                if member.kind == "group":
                    found.append(((name, index), "a reviewer group cannot name another group"))
        if found:
            raise problems(*found)
        return value

    @field_validator("people")
    @classmethod
    def _people(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        found: list[tuple[KeyPath, str]] = []
        owner: dict[str, str] = {}
        for name, handles in value.items():
            if not handles:
                found.append(((name,), "expected at least one handle"))
            for index, handle in enumerate(handles):
                # Compared as the bot compares them: addresses and names case-insensitively.
                first = owner.setdefault(normalize_handle(handle), name)
                if first != name:
                    found.append(((name, index), f"{handle!r} is a handle of {first!r} already"))
        if found:
            raise problems(*found)
        return value

    @model_validator(mode="after")
    def _email_needs_a_secret(self) -> Config:
        # Fail closed: reply tokens signed with a secret made at each start would stop
        # verifying at the next restart, and with none at all anyone could forge one.
        if self.email is not None and self.web.secret is None:
            raise problems((("email",), "the email channel needs web.secret: it signs replies"))
        return self

    @model_validator(mode="after")
    def _references(self) -> Config:
        found = [*self._group_problems(), *self._shadowed_rules(), *self._post_to_problems()]
        if found:
            raise problems(*found)
        return self

    def _group_problems(self) -> Iterator[tuple[KeyPath, str]]:
        defined = ", ".join(self.reviewer_groups) or "none"
        for at, rule in self._review_policies():
            for key in ("reviewers", "escalate_to"):
                entries: list[Reviewer] = getattr(rule, key) or []
                for index, entry in enumerate(entries):
                    if entry.kind == "group" and entry.value not in self.reviewer_groups:
                        unknown = f"no reviewer group named {entry.value!r}"
                        yield (*at, key, index), f"{unknown}; defined: {defined}"
            expanded = self.expand(rule.reviewers or [])
            groups = any(entry.kind == "group" for entry in rule.reviewers or [])
            if groups and expanded and all(entry.is_individual for entry in expanded):
                people = len({entry.value for entry in expanded})
                if rule.approvals_required > people:
                    required = f"{rule.approvals_required} approvals"
                    yield (
                        (*at, "approvals_required"),
                        (f"{required} cannot come from {people} reviewer(s), groups expanded"),
                    )

    def _post_to_problems(self) -> Iterator[tuple[KeyPath, str]]:
        """A rule's `post_to` may name only chats the bot has, and Teams conversations it
        knows the connector of (`teams.post_to`, by name or id)."""
        known: set[str] = set()
        for entry in self.teams.post_to if self.teams is not None else []:
            known.add(entry.conversation)
            if entry.name is not None:
                known.add(entry.name)
        for at, rule in self._review_policies():
            for index, target in enumerate(rule.post_to or []):
                chat, _, place = target.partition(":")
                if chat == "teams" and self.teams is None:
                    yield (*at, "post_to", index), "no teams: section is configured"
                elif chat == "teams" and place not in known:
                    names = ", ".join(sorted(known)) or "none"
                    yield (
                        (*at, "post_to", index),
                        f"no conversation of teams.post_to is named {place!r}; known: {names}",
                    )
                elif chat == "discord" and self.discord is None:
                    yield (*at, "post_to", index), "no discord: section is configured"

    def _review_policies(self) -> Iterator[tuple[KeyPath, ReviewPolicy]]:
        """The rules and the defaults, each with its place in the file."""
        for number, rule in enumerate(self.rules):
            yield ("rules", number), rule
        if self.defaults is not None:
            yield ("defaults",), self.defaults

    def _shadowed_rules(self) -> Iterator[tuple[KeyPath, str]]:
        # tool (or "*") -> the first rule without `when` that takes every call: not an
        # approve rule, which leaves the calls whose arguments fail validation to the next.
        catch_all: dict[str, int] = {}
        for number, rule in enumerate(self.rules):
            earlier = catch_all.get("*", catch_all.get(rule.tool))
            if earlier is not None:
                first = self.rules[earlier]
                what = "every call" if first.tool == "*" else f"every call of {rule.tool!r}"
                hidden = f"rules.{earlier} (without when) matches {what} first"
                yield ("rules", number), f"this rule is never used: {hidden}"
            elif rule.when is None and rule.decision != "approve":
                catch_all.setdefault(rule.tool, number)
        if self.defaults is not None and "*" in catch_all:
            every = f"rules.{catch_all['*']} (tool '*', without when) matches every call first"
            yield ("defaults",), f"never used: {every}"

    def expand(self, reviewers: Sequence[Reviewer]) -> list[Reviewer]:
        """The reviewers with each `group:<name>` replaced by the group's members (an
        unknown group expands to nothing)."""
        expanded: list[Reviewer] = []
        for reviewer in reviewers:
            if reviewer.kind == "group":
                expanded.extend(self.reviewer_groups.get(reviewer.value, []))
            else:
                expanded.append(reviewer)
        return expanded

    def first_matching_rule(self, tool: str, arguments: Mapping[str, Any] | None) -> Rule | None:
        """The first rule that covers this call (`Rule.covers`), or None when no rule does."""
        found = self.rule_for(tool, arguments)
        return None if found is None else found[1]

    def rule_for(
        self, tool: str, arguments: Mapping[str, Any] | None
    ) -> tuple[int, Rule, bool] | None:
        """The first rule that covers this call (`Rule.covers`: one that cannot judge it
        covers it unless it approves), its position in the file, and whether it judged the
        call (False: its `when` could not, so it holds it by failing closed); None when no
        rule covers it. `arguments` are the call's as the tool's model validated them, None
        when they failed that validation."""
        for number, rule in enumerate(self.rules):
            verdict = rule.judge(tool, arguments)
            if rule.takes(verdict):
                return number, rule, verdict is True
        return None

    @property
    def source_file(self) -> str | None:
        """The file the configuration was read from, if any."""
        return self._source.file if self._source is not None else None

    def location(self, path: KeyPath) -> str:
        """`<file>:<line>: <dotted.path>` for a key of the file (`<config>` when the
        configuration was not read from a file)."""
        if self._source is None:
            return f"<config>: {dotted(path)}"
        return self._source.locate(path)
