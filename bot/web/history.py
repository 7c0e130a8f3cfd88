"""A review's history as the inbox shows it: each `ApprovalEvent` turned into who did what,
in a reviewer's terms, with the machinery behind a disclosure.

An event's `actor` is whatever handle acted: a reviewer's Slack user id, email address or
web sign-in, an API token's name, the bot's own work (`nodbot:timeout`, `nodbot:rules.2`,
the worker `host:pid` that delivered a message or consumed a decision), or nothing. The
history names people, and the bot as "nodbot":

| actor                                   | shown as                                      |
|-----------------------------------------|-----------------------------------------------|
| the event's person is `person:ana`      | ana (a `people:` entry)                       |
| the event's person is `email:a@b`       | a@b (a Slack id Slack holds that address for)  |
| a handle the caller knows a name for    | that name (`names`, e.g. from `People`)        |
| `nodbot:<what>`                         | nodbot, with what (`timeout`, `rules.2`)       |
| a worker (`host:pid`), or the actor of  | nodbot, the worker behind the disclosure      |
| a delivery or of the executor's events  |                                               |
| an API token's name (channel `api`)     | the name, marked as a token                    |
| anything else                           | the handle itself                              |

The handle behind a shown name is kept (`Who.handle`) for the disclosure. Only a few known
fields of an event's detail make its summary line (`EventView.summary`: the action, the
outcome, a reason, where a message went), each bounded, with any digest-like run of hex
shortened; everything else (the arguments' digest a decision is bound to, the channel's
evidence such as the inbox's session digest, Slack's click, an email's Message-ID, a kept
result) goes to `EventView.details`, which the page folds away. Every function here is pure
and total: a stored event of any shape is shown, never raised on.

A question's review (`core.questions`) is answered by a respond and declined by a deny, both
stored as a denial; its history says so in a person's terms (`event_view(question=...)`,
given where the question stands): its `decided` event is shown as "answered" (with the
answer), "declined" (with the reason), or "timed out" (decided by `nodbot:timeout`); the
store's action behind it (respond, deny) goes to the details, and its status (denied, for
all three) is not shown (nor the action on the line of the vote before it); the run taking
it (`finished`, outcome denied) says the question's outcome instead.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, TypeAlias

from nodbot.core import ApprovalEvent
from nodbot.core.store import TIMEOUT_DECIDER

__all__ = [
    "DETAIL_LIMIT",
    "SUMMARY_LIMIT",
    "EventView",
    "Who",
    "event_view",
    "handles_to_name",
    "is_worker",
    "name_of_person",
]

WhoKind: TypeAlias = Literal["person", "bot", "token", "unknown"]

SUMMARY_LIMIT = 160
"""The most characters of one field of the summary line (the whole is in the details)."""
DETAIL_LIMIT = 2_000
"""The most characters of one value in the details."""

_WORKER = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}:[0-9]{1,10}")
"""A worker's name as the service makes it (`socket.gethostname()`:pid): handles (token
names, addresses, Slack ids) never hold a colon."""
_BOT = "nodbot:"
_BOT_KINDS = frozenset({"delivered", "undelivered"})
"""Events whose actor is always the worker that did it."""
_EXECUTOR_KINDS = frozenset({"consumed", "kept", "finished", "refused"})
"""Events that, through the `executor` channel, are the bot's own work."""
_DIGEST_LIKE = re.compile(r"[0-9A-Fa-f]{16,}")
_SUMMARY_KEYS = ("status", "action", "edited_args", "result", "outcome", "kind", "target", "error",
                 "reason", "response")  # fmt: skip
"""Detail fields that may make the summary line (in this order), when they hold text."""


def _edited_names(value: Any) -> str:
    return ", ".join(str(name) for name in value) if isinstance(value, Mapping) else ""


def _result_status(value: Any) -> str:
    status = value.get("status") if isinstance(value, Mapping) else None
    return status if isinstance(status, str) else ""


_DERIVED: dict[str, Callable[[Any], str]] = {
    "edited_args": _edited_names,
    "result": _result_status,
}
"""Summary fields read from a value that is kept whole in the details: an edit's names, a
kept result's status."""


@dataclass(frozen=True)
class Who:
    """Who acted, as the history names them."""

    name: str
    """What is shown: a person's name or address, `nodbot`, a token's name, a handle."""
    kind: WhoKind
    handle: str | None = None
    """The handle (or the worker) behind `name`, when it is not `name` itself."""
    role: str | None = None
    """For `nodbot`: what acted (`timeout`, `rules.2`, `no-rule`), from `nodbot:<role>`."""


@dataclass(frozen=True)
class EventView:
    """One line of the history."""

    at: datetime
    kind: str
    """The event's kind; a question's decision says what it did: answered, declined, timed
    out."""
    who: Who
    for_whom: str | None
    """Whom a delegate decided for (`bob for ana`), by name when known."""
    channel: str
    summary: tuple[tuple[str, str], ...]
    """(field, text) pairs of the summary line: `status`, `action`, `edited_args` (the names),
    `result` (its status), `outcome`, `kind` and `target` of a delivery, `error`, `reason`."""
    details: tuple[tuple[str, str], ...]
    """(field, text) pairs for the disclosure: the handle or worker, the digest, each piece
    of evidence (`evidence.session`, ...), voters, edited values, anything unknown."""


def name_of_person(person: str | None) -> str | None:
    """The name a person key gives (`person:ana` -> ana, `email:a@b` -> a@b), or None for
    keys that name no more than the handle (`slack:U...`, `name:...`)."""
    if not isinstance(person, str):
        return None
    kind, _, value = person.partition(":")
    return value or None if kind in ("person", "email") else None


def is_worker(actor: str | None) -> bool:
    """Whether `actor` is a worker's name (`host:pid`), not a person's handle."""
    return isinstance(actor, str) and _WORKER.fullmatch(actor) is not None


def handles_to_name(events: Iterable[ApprovalEvent]) -> list[str]:
    """The handles of `events` that no person key names: those worth asking a directory
    about (Slack user ids the event did not resolve, a requester), each once."""
    found: dict[str, None] = {}
    for event in events:
        for handle in _handles(event):
            found.setdefault(handle, None)
    return list(found)


def event_view(
    event: ApprovalEvent, names: Mapping[str, str] | None = None, *, question: str | None = None
) -> EventView:
    """`event` as the history shows it; `names` maps handles (lower case) to the names to
    show for them; `question`: for the event of a question's review, where the question
    stands (answered, declined, timed out, waiting; see the module). Never raises, whatever
    the event's detail holds."""
    names = names or {}
    detail: Mapping[Any, Any] = event.detail if isinstance(event.detail, Mapping) else {}
    evidence = _evidence(detail)
    who = _who(event, names)
    summary: list[tuple[str, str]] = []
    details: list[tuple[str, str]] = []
    if who.handle is not None:
        details.append(("worker" if who.kind == "bot" else "handle", _bounded(who.handle)))
    for key in _SUMMARY_KEYS:
        value = detail.get(key)
        if key in _DERIVED:
            text = _DERIVED[key](value)
            if text:
                summary.append((key, _summarized(text)[0]))
        elif isinstance(value, str) and value.strip():
            short, cut = _summarized(value)
            summary.append((key, short))
            if cut:
                details.append((key, _bounded(value)))
        elif value is not None and value != "":
            details.append((key, _text(value)))
    for key, value in detail.items():
        if (key in _SUMMARY_KEYS and key not in _DERIVED) or value is None or value == {}:
            continue
        if key == "evidence" and isinstance(value, Mapping):
            details += [(f"evidence.{k}", _text(v)) for k, v in evidence.items()]
        else:
            details.append((str(key), _text(value)))
    kind = str(event.kind)
    if question is not None:
        kind, summary, details = _as_question(question, event, detail, summary, details)
    return EventView(
        at=event.at,
        kind=kind,
        who=who,
        for_whom=_for_whom(evidence, names),
        channel=event.channel if isinstance(event.channel, str) else "",
        summary=tuple(summary),
        details=tuple(details),
    )


_Pairs: TypeAlias = list[tuple[str, str]]


def _as_question(
    state: str, event: ApprovalEvent, detail: Mapping[Any, Any], summary: _Pairs, details: _Pairs
) -> tuple[str, _Pairs, _Pairs]:
    """The kind, summary and details of an event of a question's review (`state`: where the
    question stands), in a person's terms (see the module)."""
    kind = str(event.kind)
    if kind == "finished":
        # The run took the question's outcome: a denial in store terms, whatever it was.
        summary = [(k, state if (k, t) == ("outcome", "denied") else t) for k, t in summary]
    if kind in ("voted", "decided"):
        if kind == "decided":
            kind = _question_outcome(event, detail)
        # Its line says what the person did; the store's verb (respond, deny) goes under
        # "more", and its status (a denial, whatever was done) is not shown at all.
        moved = [(key, text) for key, text in summary if key == "action"]
        summary = [(key, text) for key, text in summary if key not in ("status", "action")]
        details = moved + [(key, text) for key, text in details if key != "status"]
    return kind, summary, details


def _question_outcome(event: ApprovalEvent, detail: Mapping[Any, Any]) -> str:
    """What a question's `decided` event did: answered (a respond), timed out, declined."""
    action = detail.get("action")
    if action == "respond" or isinstance(detail.get("response"), str):
        return "answered"
    if event.actor == TIMEOUT_DECIDER:
        return "timed out"
    if action == "deny" or detail.get("status") == "denied":
        return "declined"
    return "decided"


def _who(event: ApprovalEvent, names: Mapping[str, str]) -> Who:
    actor = event.actor if isinstance(event.actor, str) else ""
    if actor.startswith(_BOT):
        return Who("nodbot", "bot", role=actor.removeprefix(_BOT) or None)
    by_the_bot = event.kind in _BOT_KINDS or (
        event.channel == "executor" and event.kind in _EXECUTOR_KINDS
    )
    if by_the_bot or is_worker(actor):
        return Who("nodbot", "bot", handle=actor or None)
    if not actor:
        return Who("nodbot", "bot") if event.channel in ("executor", "timer") else _UNKNOWN
    # A quorum's decision is recorded with its voters' handles, joined.
    parts = [part.strip() for part in actor.split(",") if part.strip()]
    if len(parts) > 1:
        shown = ", ".join(_name(part, None, names) or part for part in parts)
        return Who(shown, "person", handle=actor if shown != actor else None)
    name = _name(actor, event.person, names)
    token = event.channel == "api" and name is None
    shown = name or actor
    return Who(shown, "token" if token else "person", handle=actor if shown != actor else None)


_UNKNOWN = Who("", "unknown")


def _name(handle: str, person: str | None, names: Mapping[str, str]) -> str | None:
    return name_of_person(person) or names.get(handle.lower())


def _evidence(detail: Mapping[Any, Any]) -> Mapping[Any, Any]:
    evidence = detail.get("evidence")
    return evidence if isinstance(evidence, Mapping) else {}


def _for_whom(evidence: Mapping[Any, Any], names: Mapping[str, str]) -> str | None:
    handle = evidence.get("for")
    if not isinstance(handle, str) or not handle:
        return None
    person = evidence.get("for_person")
    found = _name(handle, person if isinstance(person, str) else None, names)
    return _summarized(found or handle)[0]


def _handles(event: ApprovalEvent) -> list[str]:
    actor = event.actor if isinstance(event.actor, str) else ""
    if not actor or actor.startswith(_BOT) or _who(event, {}).kind == "bot":
        return []
    found = []
    if name_of_person(event.person) is None:
        found += [part.strip() for part in actor.split(",") if part.strip()]
    evidence = _evidence(event.detail if isinstance(event.detail, Mapping) else {})
    handle, person = evidence.get("for"), evidence.get("for_person")
    if isinstance(handle, str) and handle and name_of_person(person) is None:
        found.append(handle)
    return found


def _summarized(text: str) -> tuple[str, bool]:
    """`text` for the summary line: its first line, at most `SUMMARY_LIMIT` characters, runs
    of hex that may be digests shortened; and whether anything was left out."""
    first = text.strip().split("\n", 1)[0]
    short = _DIGEST_LIKE.sub(lambda found: found.group()[:8] + "…", first)
    if len(short) > SUMMARY_LIMIT:
        short = short[: SUMMARY_LIMIT - 1].rstrip() + "…"
    return short, short != text


def _text(value: Any) -> str:
    """A value of the details as text: strings as they are, the rest as JSON; bounded."""
    if isinstance(value, str):
        return _bounded(value)
    try:
        found = json.dumps(value, ensure_ascii=False, sort_keys=True, default=repr)
    except (TypeError, ValueError, RecursionError):
        found = repr(value)
    return _bounded(found)


def _bounded(text: str) -> str:
    return text if len(text) <= DETAIL_LIMIT else text[: DETAIL_LIMIT - 1] + "…"
