"""The inbox's list: which reviews one page of `/inbox` shows, from the page's query.

A list page is a GET with query parameters, so that a filtered page can be bookmarked, shared
and reloaded, and works without a script:

| parameter   | what it keeps                                              | values             |
|-------------|------------------------------------------------------------|--------------------|
| `status`    | pending reviews, decided ones, or both (pending first)     | pending, decided,  |
|             |                                                            | all (the default)  |
| `tool`      | reviews of this tool (`ask`: questions to a person)        | its name           |
| `requester` | reviews asked for by this handle (case-insensitive)        | a handle           |
| `rule`      | reviews of the rule at this position in the configuration  | 0, 1, ... defaults |
| `age`       | reviews asked for within, or more than, an hour, day, week | newer-1h, newer-1d |
|             |                                                            | newer-7d, older-1h |
|             |                                                            | older-1d, older-7d |
| `q`         | reviews with every word of it in their tool, ids,          | free text          |
|             | description, requester, arguments (a question's text and   |                    |
|             | choices) or decision (any case; an answer too)             |                    |
| `page`      | the page, `PAGE_SIZE` reviews each                         | 1, 2, ...          |

An empty value is no filter (a form sends its empty fields). A value that is not understood
(an unknown status or age, a rule that is not a position, a text over `MAX_TEXT` characters
or with control characters, a parameter given twice, a page that is not a number) makes the
whole query refused (`QueryError`, a 422 page naming each problem): a page that quietly
dropped a filter would list reviews the reviewer did not ask for. A parameter the list does
not know is ignored, and the page says so.

The work of one page is bounded: it reads at most the newest `PENDING_WINDOW` pending reviews
and the newest `DECIDED_WINDOW` approved and denied ones (the store's `list` has no offset or
filters of its own), filters them here, then asks whether the reviewer may see each in the
order shown, only until the page is full and the next one is known to exist. A page says when
a window was full: older reviews are then beyond this list's reach (narrow it, or use the API).
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal, TypeAlias
from urllib.parse import urlencode

from nodbot.core import ApprovalRecord, ApprovalStore

__all__ = [
    "AGES",
    "DECIDED_WINDOW",
    "MAX_TEXT",
    "PAGE_SIZE",
    "PENDING_WINDOW",
    "ListPage",
    "ListQuery",
    "QueryError",
    "list_page",
    "matches",
    "parse_query",
]

PAGE_SIZE = 25
"""Reviews on one page of the list."""
PENDING_WINDOW = 500
"""The most pending reviews one page reads (the newest)."""
DECIDED_WINDOW = 500
"""The most approved, and the most denied, reviews one page reads (the newest decided)."""
MAX_TEXT = 200
"""The longest value of a text parameter (`q`, `tool`, `requester`), in characters."""
MAX_WORDS = 10
"""The most words of a search."""
MAX_PAGE = 1000
"""The highest page number understood."""
MAX_PARAMETERS = 30
"""The most query parameters one list page reads."""

Status: TypeAlias = Literal["pending", "decided", "all"]
STATUSES: tuple[Status, ...] = ("all", "pending", "decided")

AGES: dict[str, tuple[Literal["newer", "older"], timedelta, str]] = {
    "newer-1h": ("newer", timedelta(hours=1), "asked in the last hour"),
    "newer-1d": ("newer", timedelta(days=1), "asked in the last day"),
    "newer-7d": ("newer", timedelta(days=7), "asked in the last week"),
    "older-1h": ("older", timedelta(hours=1), "asked over an hour ago"),
    "older-1d": ("older", timedelta(days=1), "asked over a day ago"),
    "older-7d": ("older", timedelta(days=7), "asked over a week ago"),
}
"""The age filters: when a review was asked for, against the inbox's clock."""

_NAMES = ("status", "tool", "requester", "rule", "age", "q", "page")
_RULE = re.compile(r"defaults|[0-9]{1,4}")
_PAGE = re.compile(r"[0-9]{1,4}")


class QueryError(ValueError):
    """A list query that is not understood; `problems` says each thing wrong, by parameter."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = list(problems)


@dataclass(frozen=True)
class ListQuery:
    """What one list page asks for (`parse_query`); None: no such filter."""

    status: Status = "all"
    tool: str | None = None
    requester: str | None = None
    rule: str | None = None
    """A rule's position in the configuration ("0", "1", ...) or "defaults"."""
    age: str | None = None
    """A key of `AGES`."""
    q: str | None = None
    page: int = 1
    ignored: tuple[str, ...] = field(default=(), compare=False)
    """Parameters the list does not know, as given (cut short), ignored."""

    @property
    def words(self) -> list[str]:
        """The search's words, case-folded."""
        return (self.q or "").casefold().split()

    @property
    def filtered(self) -> bool:
        """Whether anything but the page narrows the list."""
        return self != ListQuery(page=self.page)

    def link(self, page: int | None = None) -> str:
        """The address of this query's list (at `page`, by default its own): only the
        parameters that narrow it, so that a link stays short and reads as it filters."""
        params: list[tuple[str, str]] = []
        if self.status != "all":
            params.append(("status", self.status))
        for name in ("tool", "requester", "rule", "age", "q"):
            value = getattr(self, name)
            if value is not None:
                params.append((name, value))
        number = self.page if page is None else page
        if number != 1:
            params.append(("page", str(number)))
        return "/inbox" + (f"?{urlencode(params)}" if params else "")


def parse_query(pairs: Iterable[tuple[str, str]]) -> ListQuery:
    """The list query of a page's parameters (name, value pairs, in order). Raises
    `QueryError` naming every problem (see the module)."""
    given: dict[str, str] = {}
    problems: list[str] = []
    ignored: list[str] = []
    for count, (name, value) in enumerate(pairs, start=1):
        if count > MAX_PARAMETERS:
            problems.append(f"more than {MAX_PARAMETERS} parameters are given")
            break
        if name not in _NAMES:
            if len(ignored) < 5:
                ignored.append(_cut(name))
            continue
        if name in given:
            problems.append(f"{name} is given more than once")
            continue
        given[name] = value
    found: dict[str, Any] = {}
    for name, value in given.items():
        problem = _text_problem(name, value)
        if problem is not None:
            problems.append(problem)
            continue
        value = value.strip()
        if not value:
            continue  # an empty field of the filter form: no filter
        checked = _checked(name, value)
        if isinstance(checked, _Problem):
            problems.append(checked.text)
        else:
            found[name] = checked
    if problems:
        raise QueryError(problems)
    return ListQuery(**found, ignored=tuple(ignored))


@dataclass(frozen=True)
class _Problem:
    text: str


def _checked(name: str, value: str) -> Any:
    """The value of one parameter, or the `_Problem` with it."""
    if name == "status":
        if value not in STATUSES:
            return _Problem(f"status {_cut(value)!r} is not one of {', '.join(STATUSES)}")
        return value
    if name == "age":
        if value not in AGES:
            return _Problem(f"age {_cut(value)!r} is not one of {', '.join(AGES)}")
        return value
    if name == "rule":
        if not _RULE.fullmatch(value):
            return _Problem(
                f"rule {_cut(value)!r} is not a rule's position (0 for the first rule of the "
                "configuration, 1 for the second, ...) nor defaults"
            )
        return value if value == "defaults" else str(int(value))
    if name == "page":
        if not _PAGE.fullmatch(value) or not 1 <= int(value) <= MAX_PAGE:
            return _Problem(f"page {_cut(value)!r} is not a number from 1 to {MAX_PAGE}")
        return int(value)
    if name == "q" and len(value.split()) > MAX_WORDS:
        return _Problem(f"q has more than {MAX_WORDS} words")
    return value


def _text_problem(name: str, value: str) -> str | None:
    """What is wrong with a parameter's text whatever its name: too long, or a control
    character (a line break, a NUL), which no filter needs and no page should echo."""
    if len(value) > MAX_TEXT:
        return f"{name} is longer than {MAX_TEXT} characters"
    if any(unicodedata.category(char) in ("Cc", "Cs") for char in value):
        return f"{name} holds a control character"
    return None


def _cut(text: str) -> str:
    """A given text as a message may quote it: at most 40 characters."""
    return text if len(text) <= 40 else text[:39] + "…"


def matches(query: ListQuery, record: ApprovalRecord, now: datetime) -> bool:
    """Whether `record` passes the query's filters, all but who may see it (cheap: no store
    read, no authorizer)."""
    request = record.request
    if query.tool is not None and request.tool != query.tool:
        return False
    if query.requester is not None:
        requester = request.requested_by or ""
        if requester.casefold() != query.requester.casefold():
            return False
    if query.rule is not None and str(request.policy.get("rule")) != query.rule:
        return False
    if query.age is not None:
        way, span, _ = AGES[query.age]
        asked = now - record.created_at
        if (asked > span) if way == "newer" else (asked <= span):
            return False
    words = query.words
    if words:
        text = searched_text(record)
        if not all(word in text for word in words):
            return False
    return True


def searched_text(record: ApprovalRecord) -> str:
    """What a search looks through, case-folded: the tool, the approval, run and call ids,
    the requester, the rule's description, the arguments (as JSON: a question's text and
    choices), and the decision's decider, reason and answer (a respond's text)."""
    request = record.request
    decision = record.decision
    parts = [
        request.tool,
        record.approval_id,
        request.run_id,
        request.call_id,
        request.requested_by or "",
        str(request.policy.get("description") or ""),
        json.dumps(request.arguments, ensure_ascii=False, default=str),
    ]
    if decision is not None:
        parts += [decision.decided_by or "", decision.reason or "", decision.response or ""]
    return "\n".join(parts).casefold()


Visible: TypeAlias = Callable[[ApprovalRecord], Awaitable[bool]]
"""Whether the reviewer may see a review in this list (asked of the store and authorizer)."""


@dataclass(frozen=True)
class ListPage:
    """One page of the list: its pending reviews (oldest first), then its decided ones
    (newest decision first)."""

    query: ListQuery
    pending: list[ApprovalRecord]
    decided: list[ApprovalRecord]
    has_next: bool
    pending_capped: bool
    """The pending window was full: older pending reviews are not looked through."""
    decided_capped: bool
    """A decided window was full: older decisions are not looked through."""
    tools: list[str]
    """The tools of the reviews read (for the filter form's suggestions)."""
    rules: list[tuple[str, str]]
    """The rules (position, description) of the reviews read, for the same."""

    @property
    def number(self) -> int:
        return self.query.page

    @property
    def previous(self) -> str | None:
        """The address of the page before, if there is one."""
        return self.query.link(self.number - 1) if self.number > 1 else None

    @property
    def next(self) -> str | None:
        """The address of the page after, if there is one."""
        return self.query.link(self.number + 1) if self.has_next else None


async def list_page(
    store: ApprovalStore,
    query: ListQuery,
    *,
    now: datetime,
    may_decide: Visible,
    involved: Visible,
) -> ListPage:
    """The page of `query`: pending reviews the reviewer `may_decide`, then decided ones
    they were `involved` in, filtered by the query, `PAGE_SIZE` of them from its page on.
    Raises `StoreError` when the store cannot be read."""
    pending: list[ApprovalRecord] = []
    decided: list[ApprovalRecord] = []
    pending_capped = decided_capped = False
    if query.status in ("pending", "all"):
        newest = await store.list(status="pending", limit=PENDING_WINDOW, newest_first=True)
        pending_capped = len(newest) >= PENDING_WINDOW
        pending = sorted(newest, key=lambda record: (record.created_at, record.approval_id))
    if query.status in ("decided", "all"):
        for status in ("approved", "denied"):
            found = await store.list(status=status, limit=DECIDED_WINDOW, newest_first=True)
            decided_capped = decided_capped or len(found) >= DECIDED_WINDOW
            decided += found
        decided.sort(key=lambda record: record.decided_at or record.created_at, reverse=True)
    read = [*pending, *decided]
    ordered = [(record, True) for record in pending if matches(query, record, now)]
    ordered += [(record, False) for record in decided if matches(query, record, now)]
    first = (query.page - 1) * PAGE_SIZE
    shown: list[tuple[ApprovalRecord, bool]] = []
    seen = 0
    has_next = False
    for record, waiting in ordered:
        if not await (may_decide if waiting else involved)(record):
            continue
        if seen >= first + PAGE_SIZE:
            has_next = True
            break
        if seen >= first:
            shown.append((record, waiting))
        seen += 1
    return ListPage(
        query=query,
        pending=[record for record, waiting in shown if waiting],
        decided=[record for record, waiting in shown if not waiting],
        has_next=has_next,
        pending_capped=pending_capped,
        decided_capped=decided_capped,
        tools=sorted({record.request.tool for record in read}),
        rules=_rules_of(read),
    )


def _rules_of(records: Sequence[ApprovalRecord]) -> list[tuple[str, str]]:
    """Each rule the records name (position, description), in the configuration's order."""
    found: dict[str, str] = {}
    for record in records:
        rule = record.request.policy.get("rule")
        if isinstance(rule, int) or rule == "defaults":
            found.setdefault(str(rule), str(record.request.policy.get("description") or ""))
    return sorted(found.items(), key=lambda item: _position(item[0]))


def _position(rule: str) -> tuple[int, int]:
    """Where a rule comes in the configuration: the rules in order, then the defaults."""
    return (0, int(rule)) if rule.isdigit() else (1, 0)
