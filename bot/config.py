"""The bot's configuration: one YAML file (`nodbot.yml`) read into pydantic models.

```python
config = load_config("nodbot.yml")          # raises ConfigError listing every problem
problems = check_agents(config)             # imports the agents; [] when all is well
rule = config.first_matching_rule("refund", {"order_id": "A-1", "amount": 120.0})
```

Every problem is reported as `<file>:<line>: <dotted.key.path>: <message>`. String values
may name environment variables (`${SLACK_BOT_TOKEN}`, `${PORT:-8080}`; `$${` writes a
literal `${`), so secrets stay out of the file. Loading never imports an agent: that is
`check_agents`'s job.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib
import inspect
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, ClassVar, Literal, TypeAlias, Union, get_args, get_origin

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails, PydanticCustomError

import core
from core import Agent, ConfigurationError, InterruptRule, Predicate

__all__ = [
    "AllOf",
    "AnyOf",
    "Config",
    "ConfigError",
    "PredicateSpec",
    "Reviewer",
    "Rule",
    "ServerConfig",
    "StoreConfig",
    "check_agents",
    "load_agents",
    "load_config",
    "parse_duration",
    "parse_reviewer",
]

KeyPath: TypeAlias = tuple[str | int, ...]
"""Where a value sits in the file: `("rules", 1, "timeout")` is `rules.1.timeout`."""

_MAX_NODES = 100_000  # more values than any real config has: an alias bomb, refused


class ConfigError(ConfigurationError):
    """The configuration file cannot be used. `problems` lists every problem found, each as
    `<file>:<line>: <dotted.key.path>: <message>`; nothing was started or recorded."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems

    def details(self) -> dict[str, Any]:
        return {"problems": self.problems}


# --- problems raised inside validators ------------------------------------------------------


def _problems(*found: tuple[KeyPath, str]) -> PydanticCustomError:
    """A validation error carrying several problems, each at a path below the validated value,
    so that the file's line of each can be reported."""
    message = "; ".join(text for _, text in found)
    return PydanticCustomError("nodbot", "{message}", {"message": message, "problems": found})


def _problem(message: str, *at: str | int) -> PydanticCustomError:
    """One problem, at `at` below the validated value."""
    return _problems((tuple(at), message))


# --- where things are in the file -----------------------------------------------------------


@dataclass
class _Source:
    """The file a configuration came from, and the line of each key and list item in it."""

    file: str
    lines: dict[KeyPath, int]
    substituted: set[KeyPath] = field(default_factory=set)
    """Paths whose value came from the environment: their values are never shown."""

    def line(self, path: KeyPath) -> int:
        """The line of `path`, or of its closest enclosing key when it is not in the file."""
        for end in range(len(path), -1, -1):
            found = self.lines.get(path[:end])
            if found is not None:
                return found
        return 1

    def locate(self, path: KeyPath, *, line: int | None = None) -> str:
        """`<file>:<line>: <dotted.path>`; `line` overrides the recorded one."""
        return f"{self.file}:{line or self.line(path)}: {_dotted(path)}"

    def problem(self, path: KeyPath, message: str, *, line: int | None = None) -> str:
        """`<file>:<line>: <dotted.path>: <message>`."""
        return f"{self.locate(path, line=line)}: {message}"


def _dotted(path: KeyPath) -> str:
    return ".".join(str(part) for part in path) or "(top level)"


def _shown(value: object) -> str:
    """A value as an error shows it: its type for containers, itself for scalars."""
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "null"
    return repr(value)


# --- durations ------------------------------------------------------------------------------

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"(?:\d+[smhd])+")
_DURATION_PART = re.compile(r"(\d+)([smhd])")


def parse_duration(value: object) -> int:
    """Seconds in a duration such as `30s`, `15m`, `2h`, `1d` or `1h30m`.

    Raises `ValueError` (with what was expected) for anything else, or for zero.
    """
    expected = "expected a duration such as 30s, 15m, 2h or 1d"
    if not isinstance(value, str):
        raise ValueError(f"{expected}, not {_shown(value)}")
    text = value.strip()
    if not _DURATION.fullmatch(text):
        raise ValueError(f"{expected}, not {value!r}")
    seconds = sum(int(number) * _UNITS[unit] for number, unit in _DURATION_PART.findall(text))
    if seconds <= 0:
        raise ValueError(f"{expected}, longer than zero, not {value!r}")
    return seconds


def _duration(value: object) -> int:
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise _problem(str(exc)) from None


Duration: TypeAlias = Annotated[int, PlainValidator(_duration)]
"""Seconds, written in the file as `30s`, `15m`, `2h`, `1d` (or `1h30m`)."""


def _no_bool(value: object) -> object:
    if isinstance(value, bool):
        raise _problem(f"expected a whole number, not {value!r}")
    return value


Count: TypeAlias = Annotated[int, BeforeValidator(_no_bool)]
"""A whole number; `true` and `false` are refused rather than read as 1 and 0."""


# --- reviewers ------------------------------------------------------------------------------

ReviewerKind: TypeAlias = Literal[
    "slack_user", "slack_user_group", "slack_channel", "email", "group"
]

_SLACK_ID = r"[A-Z0-9]{8,}"
_REVIEWER_FORMS: tuple[tuple[ReviewerKind, re.Pattern[str]], ...] = (
    ("slack_user", re.compile(rf"[UW]{_SLACK_ID}")),
    ("slack_user_group", re.compile(rf"S{_SLACK_ID}")),
    ("slack_channel", re.compile(rf"[CG]{_SLACK_ID}")),
    ("slack_channel", re.compile(r"#[a-z0-9_\-]{1,80}")),
    ("email", re.compile(r"[^@\s<>,;:\"]+@[^@\s<>,;:\"]+")),
    ("group", re.compile(r"group:[A-Za-z0-9_\-]+")),
)
_REVIEWER_EXPECTED = (
    "expected a Slack user id (U... or W...), a user group id (S...), a channel (#name or "
    "C...), an email address (name@example.com) or group:<name> naming a reviewer group"
)


@dataclass(frozen=True)
class Reviewer:
    """One entry of `reviewers` or `escalate_to`, classified."""

    kind: ReviewerKind
    """What the entry names: a Slack user, user group or channel, an email address, or a
    reviewer group of the file."""
    value: str
    """The id, channel, address or group name, without its `group:` prefix."""
    text: str
    """The entry as written."""

    @property
    def is_individual(self) -> bool:
        """Whether the entry is one person (a Slack user or an email address)."""
        return self.kind in ("slack_user", "email")


def parse_reviewer(text: object) -> Reviewer:
    """Classify a reviewer entry. Raises `ValueError` saying what is accepted."""
    if not isinstance(text, str):
        raise ValueError(f"{_REVIEWER_EXPECTED}, not {_shown(text)}")
    for kind, pattern in _REVIEWER_FORMS:
        if pattern.fullmatch(text):
            value = text.removeprefix("group:") if kind == "group" else text
            if kind == "email":
                value = value.lower()
            return Reviewer(kind=kind, value=value, text=text)
    raise ValueError(f"{_REVIEWER_EXPECTED}, not {text!r}")


def _reviewer(value: object) -> Reviewer:
    try:
        return parse_reviewer(value)
    except ValueError as exc:
        raise _problem(str(exc)) from None


ReviewerEntry: TypeAlias = Annotated[Reviewer, PlainValidator(_reviewer)]
"""A reviewer, written as a string in the file."""


def _post_target(value: object) -> str:
    if value == "dm":
        return "dm"
    try:
        reviewer = parse_reviewer(value)
    except ValueError:
        reviewer = None
    if reviewer is None or reviewer.kind != "slack_channel":
        raise _problem(
            f"expected a Slack channel (#name or C...) or dm, not {_shown(value)}"
        ) from None
    return reviewer.text


PostTarget: TypeAlias = Annotated[str, PlainValidator(_post_target)]
"""A Slack channel (`#name` or `C...`) or `dm`."""


# --- names and import paths -----------------------------------------------------------------

_NAME = re.compile(r"[A-Za-z0-9_\-]+")
_IMPORT_PATH = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")


def _name(value: str) -> str:
    if not _NAME.fullmatch(value):
        raise _problem(f"expected a name of letters, digits, - and _, not {value!r}")
    return value


Name: TypeAlias = Annotated[str, AfterValidator(_name)]
"""An agent or reviewer group name: letters, digits, `-` and `_`."""


def _import_path(value: str) -> str:
    if not _IMPORT_PATH.fullmatch(value):
        raise _problem(f"expected an import path such as package.module:attribute, not {value!r}")
    return value


ImportPath: TypeAlias = Annotated[str, AfterValidator(_import_path)]
"""`package.module:attribute`, naming a `core.Agent` or a zero-argument callable returning
one."""


# --- predicates -----------------------------------------------------------------------------


@dataclass(frozen=True)
class AllOf(Predicate):
    """Every predicate matches. Each is tested, so one that raises (a missing argument)
    makes the whole raise, whatever the order: the rule then counts as a match."""

    predicates: tuple[Predicate, ...]

    def __call__(self, arguments: Mapping[str, Any]) -> bool:
        results = [predicate(arguments) for predicate in self.predicates]
        return all(results)

    def describe(self) -> str:
        return " and ".join(f"({predicate.describe()})" for predicate in self.predicates)


@dataclass(frozen=True)
class AnyOf(Predicate):
    """At least one predicate matches. Each is tested, so one that raises makes the whole
    raise, whatever the order: the rule then counts as a match."""

    predicates: tuple[Predicate, ...]

    def __call__(self, arguments: Mapping[str, Any]) -> bool:
        results = [predicate(arguments) for predicate in self.predicates]
        return any(results)

    def describe(self) -> str:
        return " or ".join(f"({predicate.describe()})" for predicate in self.predicates)


_COMPARISONS: dict[str, Callable[[str, Any], Predicate]] = {
    "gt": core.gt,
    "ge": core.ge,
    "lt": core.lt,
    "le": core.le,
    "eq": core.eq,
}


class _Model(BaseModel):
    """The settings every configuration model shares: unknown keys are errors, the models
    cannot be changed once read, and each field's docstring is its description."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    key_noun: ClassVar[str] = "key"
    """What an unknown key of this model is called in an error ("key", "predicate")."""


class PredicateSpec(_Model):
    """A test on a call's arguments, written as a mapping with exactly one key:
    `{gt: {amount: 100}}`, `{matches: {to: '@ext\\.com$'}}`, `{all: [..., ...]}`."""

    key_noun: ClassVar[str] = "predicate"

    gt: dict[str, Any] | None = None
    """`{argument: value}`: the argument is greater than the value."""
    ge: dict[str, Any] | None = None
    """`{argument: value}`: the argument is greater than or equal to the value."""
    lt: dict[str, Any] | None = None
    """`{argument: value}`: the argument is less than the value."""
    le: dict[str, Any] | None = None
    """`{argument: value}`: the argument is less than or equal to the value."""
    eq: dict[str, Any] | None = None
    """`{argument: value}`: the argument equals the value (same type)."""
    matches: dict[str, str] | None = None
    """`{argument: regex}`: the string argument contains a match (anchor with ^ and $)."""
    all_fields: dict[str, str] | None = None
    """`{argument: regex, ...}`: every named argument matches its regex."""
    any_field: dict[str, str] | None = None
    """`{argument: regex, ...}`: at least one named argument matches its regex."""
    all: list[PredicateSpec] | None = None
    """Every listed predicate matches."""
    any: list[PredicateSpec] | None = None
    """At least one listed predicate matches."""

    @model_validator(mode="before")
    @classmethod
    def _one_key(cls, data: Any) -> Any:
        known = ", ".join(cls.model_fields)
        example = "such as {gt: {amount: 100}}"
        if not isinstance(data, Mapping):
            raise _problem(f"expected a predicate mapping {example}, not {_shown(data)}")
        if not data:
            raise _problem(f"an empty predicate; expected one of: {known}")
        if len(data) > 1:
            names = ", ".join(str(key) for key in data)
            raise _problem(
                f"a predicate has exactly one key, found {names}; "
                "combine several with all: [...] or any: [...]"
            )
        return data

    @field_validator(*_COMPARISONS)
    @classmethod
    def _comparison(
        cls, value: dict[str, Any] | None, info: ValidationInfo
    ) -> dict[str, Any] | None:
        if value is None:
            return value
        _one_argument(value)
        argument, expected = next(iter(value.items()))
        if info.field_name == "eq":
            allowed: tuple[type, ...] = (int, float, str, bool, type(None))
            kinds = "a number, a string, a boolean or null"
        else:  # an order: Python would compare True with 1, and None with nothing
            allowed, kinds = (int, float, str), "a number or a string"
        if not isinstance(expected, allowed) or (
            isinstance(expected, bool) and bool not in allowed
        ):
            raise _problem(
                f"expected {kinds} to compare with, not {_shown(expected)}{_date_hint(expected)}",
                argument,
            )
        if isinstance(expected, float) and expected != expected:
            raise _problem("expected a number, not NaN (it compares false with all)", argument)
        return value

    @field_validator("matches")
    @classmethod
    def _matches(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is not None:
            _one_argument(value)
            _check_patterns(value)
        return value

    @field_validator("all_fields", "any_field")
    @classmethod
    def _fields(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is not None:
            if not value:
                raise _problem("expected at least one {argument: regex}")
            _check_patterns(value)
        return value

    @field_validator("all", "any")
    @classmethod
    def _combined(cls, value: list[PredicateSpec] | None) -> list[PredicateSpec] | None:
        if value is not None and not value:
            raise _problem("expected a list of at least one predicate")
        return value

    @model_validator(mode="after")
    def _buildable(self) -> PredicateSpec:
        if getattr(self, self.name) is None:
            raise _problem("expected a value, not null", self.name)
        try:  # whatever core refuses is refused now, not when the first call is tested
            self.to_predicate()
        except ConfigurationError as exc:
            raise _problem(exc.message, self.name) from None
        return self

    @property
    def name(self) -> str:
        """The predicate's key: `gt`, `matches`, `all`, ..."""
        return next(iter(self.model_fields_set))

    def arguments_of(self, name: str) -> dict[str, Any]:
        """The `{argument: value}` mapping of a field predicate (not of `all` / `any`)."""
        value = getattr(self, name)
        return dict(value) if isinstance(value, dict) else {}

    def to_predicate(self) -> Predicate:
        """The core predicate this stands for."""
        name = self.name
        if name in _COMPARISONS:
            argument, expected = next(iter(self.arguments_of(name).items()))
            return _COMPARISONS[name](argument, expected)
        if name == "matches":
            argument, pattern = next(iter(self.arguments_of(name).items()))
            return core.matches(argument, pattern)
        if name == "all_fields":
            return core.all_fields(self.arguments_of(name))
        if name == "any_field":
            return core.any_field(self.arguments_of(name))
        parts = tuple(spec.to_predicate() for spec in getattr(self, name))
        return AllOf(parts) if name == "all" else AnyOf(parts)

    def argument_names(self) -> set[str]:
        """Every argument the predicate reads, through `all` and `any` too."""
        if self.name in ("all", "any"):
            specs: list[PredicateSpec] = getattr(self, self.name)
            return set().union(*(spec.argument_names() for spec in specs))
        return set(self.arguments_of(self.name))


def _one_argument(value: Mapping[str, Any]) -> None:
    if len(value) != 1:
        names = ", ".join(value) or "none"
        raise _problem(f"expected exactly one {{argument: value}}, found {names}")


def _check_patterns(value: Mapping[str, str]) -> None:
    found = []
    for argument, pattern in value.items():
        try:
            re.compile(pattern)
        except re.error as exc:
            found.append(((argument,), f"not a valid regular expression: {exc}"))
    if found:
        raise _problems(*found)


def _date_hint(value: object) -> str:
    if isinstance(value, datetime.date):
        return " (YAML reads an unquoted date as a date: quote it)"
    return ""


# --- the file's sections --------------------------------------------------------------------

_STORE_SCHEMES = ("sqlite", "sqlite+aiosqlite", "postgresql", "postgresql+asyncpg")


class StoreConfig(_Model):
    """Where approvals are kept."""

    url: str = "sqlite:///nodbot.db"
    """`sqlite:///path.db` (relative to the working directory), a bare file path, or
    `postgresql://user:${DB_PASSWORD}@host:5432/db`."""
    auto_migrate: bool = True
    """Create or upgrade the database schema on first use; when false, a database that is
    not up to date is refused with the command to run (`nodbot migrate`)."""

    @field_validator("url")
    @classmethod
    def _scheme(cls, value: str) -> str:
        if not value.strip():
            raise _problem("expected a database URL or a file path, not an empty string")
        if "://" in value and value.split("://", 1)[0] not in _STORE_SCHEMES:
            # The URL itself is not shown: it may hold a password.
            raise _problem(
                "expected sqlite:///path.db, postgresql://user@host/db or a file path; "
                f"the scheme {value.split('://', 1)[0]!r} is not supported"
            )
        return value


class ServerConfig(_Model):
    """Where the bot's HTTP API and web inbox listen."""

    host: str = "127.0.0.1"
    """The address to listen on; 0.0.0.0 for every interface."""
    port: Annotated[Count, Field(ge=1, le=65535)] = 8080
    """The TCP port, 1 to 65535."""


ReviewDecision: TypeAlias = Literal["approve", "edit", "deny"]
"""What a reviewer may answer."""


def _all_decisions() -> list[ReviewDecision]:
    return ["approve", "edit", "deny"]


_REVIEW_KEYS = (
    "reviewers",
    "post_to",
    "allowed_decisions",
    "editable",
    "approvals_required",
    "allow_self_approval",
    "timeout",
    "timeout_decision",
    "escalate_after",
    "escalate_to",
)
_TOOL_NAME = re.compile(r"[A-Za-z_]\w*")


class Rule(_Model):
    """Which calls it covers (`tool`, `when`) and what happens to them: an automatic
    `decision`, or a review by `reviewers`. Rules are tried in order; the first match wins."""

    tool: str
    """The tool's name, or `*` for every tool."""
    when: PredicateSpec | None = None
    """A predicate on the call's arguments; without it every call of the tool matches. A
    predicate that cannot decide (a missing argument, a wrong type) counts as a match."""
    description: str | None = None
    """Why the rule exists, shown to reviewers."""
    decision: Literal["approve", "deny"] | None = None
    """Decide without a person. A rule has either `decision` or `reviewers`."""
    reviewers: list[ReviewerEntry] | None = None
    """Who may decide: Slack users (U..., W...), user groups (S...), channels (#name, C...),
    email addresses, or group:<name> for a reviewer group of this file."""
    post_to: list[PostTarget] | None = None
    """Where the review request is posted: Slack channels (#name, C...) and/or dm. Read by
    the Slack channel, in a later version."""
    allowed_decisions: list[ReviewDecision] = Field(default_factory=_all_decisions)
    """What reviewers may answer: a non-empty subset of approve, edit, deny."""
    editable: list[str] | None = None
    """The arguments a reviewer may edit; absent means all of them."""
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

    @field_validator("tool")
    @classmethod
    def _tool(cls, value: str) -> str:
        if value != "*" and not _TOOL_NAME.fullmatch(value):
            raise _problem(f"expected a tool name (a Python identifier) or '*', not {value!r}")
        return value

    @field_validator("allowed_decisions")
    @classmethod
    def _decisions(cls, value: list[ReviewDecision]) -> list[ReviewDecision]:
        if not value:
            raise _problem("expected at least one of approve, edit, deny")
        if len(set(value)) != len(value):
            raise _problem(f"each decision may be listed once, not {value}")
        return value

    @field_validator("reviewers", "escalate_to")
    @classmethod
    def _some_reviewers(cls, value: list[Reviewer] | None) -> list[Reviewer] | None:
        if value is not None and not value:
            raise _problem("expected at least one reviewer")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Rule:
        found = list(self._decision_problems())
        if self.decision is None:
            found.extend(self._review_problems())
        if found:
            raise _problems(*found)
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
        if "timeout_decision" in self.model_fields_set and self.timeout is None:
            yield ("timeout_decision",), "has no effect without timeout"
        if self.editable is not None and "edit" not in self.allowed_decisions:
            yield ("editable",), "has no effect unless allowed_decisions includes edit"
        if self.editable == [] and "edit" in self.allowed_decisions:
            instead = "remove edit from allowed_decisions instead"
            yield ("editable",), f"an empty list allows no edit: {instead}"
        reviewers = self.reviewers or []
        if reviewers and all(reviewer.is_individual for reviewer in reviewers):
            people = len({reviewer.value for reviewer in reviewers})
            if self.approvals_required > people:
                message = f"cannot come from {people} listed reviewer(s)"
                yield ("approvals_required",), f"{self.approvals_required} approvals {message}"

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

    def covers(self, tool: str, arguments: Mapping[str, Any]) -> bool:
        """Whether this rule matches the call; a predicate that raises counts as a match."""
        rule = self.interrupt_rule
        return rule.applies_to(tool) and rule.matches(arguments)


class Config(_Model):
    """The whole `nodbot.yml`."""

    store: StoreConfig = Field(default_factory=StoreConfig)
    """Where approvals are kept."""
    server: ServerConfig = Field(default_factory=ServerConfig)
    """Where the HTTP API and web inbox listen."""
    agents: dict[Name, ImportPath] = Field(default_factory=dict)
    """Agent name -> `package.module:attribute` of a `core.Agent` or of a zero-argument
    callable returning one."""
    reviewer_groups: dict[Name, list[ReviewerEntry]] = Field(default_factory=dict)
    """Group name -> reviewers (not other groups); rules name a group as group:<name>."""
    rules: list[Rule] = Field(default_factory=list)
    """Tried in order for each call; the first that matches decides what happens."""
    slack: dict[str, Any] | None = None
    """Read by the Slack channel, in a later version."""
    email: dict[str, Any] | None = None
    """Read by the email channel, in a later version."""

    _source: _Source | None = PrivateAttr(default=None)

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
            raise _problems(*found)
        return value

    @model_validator(mode="after")
    def _references(self) -> Config:
        found = [*self._group_problems(), *self._shadowed_rules()]
        if found:
            raise _problems(*found)
        return self

    def _group_problems(self) -> Iterator[tuple[KeyPath, str]]:
        defined = ", ".join(self.reviewer_groups) or "none"
        for number, rule in enumerate(self.rules):
            for key in ("reviewers", "escalate_to"):
                entries: list[Reviewer] = getattr(rule, key) or []
                for index, entry in enumerate(entries):
                    if entry.kind == "group" and entry.value not in self.reviewer_groups:
                        unknown = f"no reviewer group named {entry.value!r}"
                        yield ("rules", number, key, index), f"{unknown}; defined: {defined}"
            expanded = self.expand(rule.reviewers or [])
            groups = any(entry.kind == "group" for entry in rule.reviewers or [])
            if groups and expanded and all(entry.is_individual for entry in expanded):
                people = len({entry.value for entry in expanded})
                if rule.approvals_required > people:
                    required = f"{rule.approvals_required} approvals"
                    yield (
                        ("rules", number, "approvals_required"),
                        (f"{required} cannot come from {people} reviewer(s), groups expanded"),
                    )

    def _shadowed_rules(self) -> Iterator[tuple[KeyPath, str]]:
        catch_all: dict[str, int] = {}  # tool (or "*") -> the first rule without `when`
        for number, rule in enumerate(self.rules):
            earlier = catch_all.get("*", catch_all.get(rule.tool))
            if earlier is not None:
                first = self.rules[earlier]
                what = "every call" if first.tool == "*" else f"every call of {rule.tool!r}"
                hidden = f"rules.{earlier} (without when) matches {what} first"
                yield ("rules", number), f"this rule is never used: {hidden}"
            elif rule.when is None:
                catch_all.setdefault(rule.tool, number)

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

    def first_matching_rule(self, tool: str, arguments: Mapping[str, Any]) -> Rule | None:
        """The first rule that covers this call, or None when no rule does. A predicate
        that raises counts as a match, as in core."""
        for rule in self.rules:
            if rule.covers(tool, arguments):
                return rule
        return None

    @property
    def source_file(self) -> str | None:
        """The file the configuration was read from, if any."""
        return self._source.file if self._source is not None else None

    def location(self, path: KeyPath) -> str:
        """`<file>:<line>: <dotted.path>` for a key of the file (`<config>` when the
        configuration was not read from a file)."""
        if self._source is None:
            return f"<config>: {_dotted(path)}"
        return self._source.locate(path)


# --- reading YAML ---------------------------------------------------------------------------

_REFERENCE = re.compile(r"\$(\$)?\{([^}]*)\}|\$\{")
_VARIABLE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(?::-(.*))?", re.DOTALL)
_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"
_MERGE_TAG = "tag:yaml.org,2002:merge"


class _TooLarge(Exception):
    """The document expands to more values than a configuration has (an alias bomb)."""


class _Reader:
    """Turns the composed YAML node tree into plain values, recording the line of every key
    and list item, substituting environment variables and collecting problems."""

    def __init__(self, source: _Source, loader: yaml.SafeLoader, environ: Mapping[str, str]):
        self.source = source
        self.loader = loader
        self.environ = environ
        self.problems: list[str] = []
        self._open: set[int] = set()
        self._count = 0

    def add(self, path: KeyPath, message: str, *, line: int | None = None) -> None:
        self.problems.append(self.source.problem(path, message, line=line))

    def value(self, node: yaml.Node, path: KeyPath) -> Any:
        self._count += 1
        if self._count > _MAX_NODES:
            raise _TooLarge
        if isinstance(node, yaml.ScalarNode):
            return self._scalar(node, path)
        if id(node) in self._open:
            self.add(path, "an alias refers to a value that contains it")
            return None
        self._open.add(id(node))
        try:
            if isinstance(node, yaml.SequenceNode):
                return self._sequence(node, path)
            assert isinstance(node, yaml.MappingNode)  # the composer makes no other node
            return self._mapping(node, path)
        finally:
            self._open.discard(id(node))

    def _scalar(self, node: yaml.ScalarNode, path: KeyPath) -> Any:
        try:
            value = self.loader.construct_object(node, deep=True)
        except yaml.YAMLError as exc:
            self.add(path, f"cannot read this value: {_yaml_problem(exc)}")
            return None
        if isinstance(value, str) and "$" in value:
            return self._substitute(value, path)
        return value

    def _sequence(self, node: yaml.SequenceNode, path: KeyPath) -> list[Any]:
        if node.tag != _SEQ_TAG:
            self.add(path, f"the YAML tag {node.tag} is not supported here")
        items = []
        for index, item in enumerate(node.value):
            self.source.lines.setdefault((*path, index), _line(item))
            items.append(self.value(item, (*path, index)))
        return items

    def _mapping(self, node: yaml.MappingNode, path: KeyPath) -> dict[Any, Any]:
        if node.tag != _MAP_TAG:
            self.add(path, f"the YAML tag {node.tag} is not supported here")
        seen: dict[tuple[str, str], int] = {}  # (resolved tag, text) -> line: 1 and "1" differ
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG or not isinstance(key_node, yaml.ScalarNode):
                continue
            written = (key_node.tag, key_node.value)
            if written in seen:
                first = f"duplicate key (first given on line {seen[written]})"
                self.add((*path, key_node.value), first, line=_line(key_node))
            else:
                seen[written] = _line(key_node)
        try:
            self.loader.flatten_mapping(node)
        except yaml.YAMLError as exc:
            self.add(path, f"cannot merge (<<) here: {_yaml_problem(exc)}")
            return {}
        result: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                self.add(path, f"a key must be a plain value, not a {_kind(key_node)}")
                continue
            key = self._key(key_node, path)
            self.source.lines.setdefault((*path, key), _line(key_node))
            result[key] = self.value(value_node, (*path, key))
        return result

    def _key(self, node: yaml.ScalarNode, path: KeyPath) -> str | int:
        """The key as Python reads it: a string or an integer. Other scalars (`yes`, `1.5`,
        `null`, dates) keep the text they were written with."""
        try:
            key = self.loader.construct_object(node)
        except yaml.YAMLError as exc:
            self.add((*path, node.value), f"cannot read this key: {_yaml_problem(exc)}")
            return str(node.value)
        if isinstance(key, (str, int)) and not isinstance(key, bool):
            return key
        return str(node.value)

    def _substitute(self, text: str, path: KeyPath) -> str:
        def replace(found: re.Match[str]) -> str:
            if found.group(2) is None:
                self.add(path, "unclosed ${: expected ${NAME} or ${NAME:-default}")
                return found.group(0)
            if found.group(1):  # `$${...}` writes `${...}` itself
                return found.group(0)[1:]
            reference = _VARIABLE.fullmatch(found.group(2))
            if reference is None:
                self.add(
                    path,
                    f"bad variable reference {found.group(0)!r}: expected ${{NAME}} or "
                    "${NAME:-default}, NAME made of letters, digits and _",
                )
                return found.group(0)
            name, default = reference.group(1), reference.group(2)
            value = self.environ.get(name)
            if value is None or (value == "" and default is not None):
                if default is None:
                    self.add(
                        path,
                        f"the environment variable {name} is not set; set it, or give a "
                        f"default with ${{{name}:-default}}",
                    )
                    return ""
                value = default
            self.source.substituted.add(path)
            return value

        return _REFERENCE.sub(replace, text)


def _line(node: yaml.Node) -> int:
    return int(node.start_mark.line) + 1


def _kind(node: yaml.Node) -> str:
    return "mapping" if isinstance(node, yaml.MappingNode) else "list"


def _yaml_problem(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.MarkedYAMLError):
        parts = [part for part in (exc.context, exc.problem) if part]
        return ", ".join(parts) or str(exc)
    return str(exc)


def _read_yaml(file: str, text: str, environ: Mapping[str, str]) -> tuple[Any, _Source]:
    """Compose and read the document. Raises `ConfigError` for malformed YAML and for the
    problems found while reading (duplicate keys, missing variables, alias bombs)."""
    source = _Source(file=file, lines={})
    loader = yaml.SafeLoader(text)
    try:
        try:
            root = loader.get_single_node()
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            line = int(mark.line) + 1 if mark is not None else 1
            problem = exc.problem or "cannot be parsed"
            if exc.context:
                started = exc.context_mark
                since = f" (line {started.line + 1})" if started is not None else ""
                problem = f"{exc.context}{since}: {problem}"
            raise ConfigError([f"{file}:{line}: malformed YAML: {problem}"]) from None
        except yaml.YAMLError as exc:
            raise ConfigError([f"{file}:1: malformed YAML: {exc}"]) from None
        if root is None:
            raise ConfigError(
                [f"{file}:1: (top level): the file is empty; expected a mapping of {_TOP}"]
            )
        source.lines[()] = _line(root)
        reader = _Reader(source, loader, environ)
        try:
            data = reader.value(root, ())
        except _TooLarge:
            raise ConfigError(
                [f"{file}:1: (top level): the document expands to more than {_MAX_NODES} values"]
            ) from None
    finally:
        loader.dispose()
    if reader.problems:
        raise ConfigError(reader.problems)
    if not isinstance(data, dict):
        raise ConfigError([source.problem((), f"expected a mapping of {_TOP}, not {_shown(data)}")])
    return data, source


_TOP = ", ".join(Config.model_fields)


# --- reporting validation errors ------------------------------------------------------------


def _validation_problems(error: ValidationError, source: _Source) -> list[str]:
    """One line per problem, each naming the file, the line and the dotted key."""
    found: list[tuple[int, str]] = []
    for detail in error.errors(include_url=False):
        loc: KeyPath = tuple(part for part in detail["loc"] if part != "[key]")
        for path, message in _messages(detail, loc, source):
            found.append((source.line(path), source.problem(path, message)))
    found.sort(key=lambda pair: pair[0])
    return [text for _, text in found]


def _messages(detail: ErrorDetails, loc: KeyPath, source: _Source) -> Iterator[tuple[KeyPath, str]]:
    kind = detail["type"]
    context = detail.get("ctx") or {}
    if kind == "nodbot":
        for below, message in context["problems"]:
            yield loc + tuple(below), message
    elif kind == "extra_forbidden":
        yield loc, _unknown_key(loc)
    elif kind == "missing":
        yield loc, f"the required key {loc[-1]!r} is missing"
    else:
        message = detail["msg"].removeprefix("Value error, ")
        value = detail.get("input")
        if loc not in source.substituted and isinstance(value, (str, int, float, bool)):
            message = f"{message}, not {value!r}"
        yield loc, message


def _unknown_key(loc: KeyPath) -> str:
    model = _model_at(loc[:-1])
    if model is None:  # not reached: every model is reachable from Config; kept as a fallback
        return "unknown key"
    known = ", ".join(model.model_fields)
    return f"unknown {model.key_noun} {loc[-1]!r}; expected one of: {known}"


def _model_at(loc: KeyPath) -> type[_Model] | None:
    """The configuration model that validates the value at `loc`, if any."""
    current: Any = Config
    for part in loc:
        current = _unwrap(current)
        if isinstance(current, type) and issubclass(current, BaseModel):
            found = current.model_fields.get(str(part))
            if found is None:
                return None
            current = found.annotation
        elif get_origin(current) is list:
            current = get_args(current)[0]
        elif get_origin(current) is dict:
            current = get_args(current)[1]
        else:
            return None
    current = _unwrap(current)
    return current if isinstance(current, type) and issubclass(current, _Model) else None


def _unwrap(annotation: Any) -> Any:
    """`X` for `X | None` and `Annotated[X, ...]`."""
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            annotation = get_args(annotation)[0]
        elif origin in (Union, UnionType):
            members = [arg for arg in get_args(annotation) if arg is not type(None)]
            annotation = members[0]
        else:
            return annotation


# --- loading --------------------------------------------------------------------------------


def load_config(
    path: str | os.PathLike[str], *, environ: Mapping[str, str] | None = None
) -> Config:
    """Read and validate a configuration file; `${VAR}` come from `environ` (default:
    `os.environ`). Imports no agent (see `check_agents`).

    Raises `ConfigError` listing every problem, each with the file, line and key.
    """
    file = os.fspath(path)
    try:
        raw = Path(file).read_bytes()
    except OSError as exc:
        raise ConfigError([f"{file}: cannot read the file: {exc.strerror or exc}"]) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError([f"{file}:{line}: (top level): the file is not UTF-8 text"]) from None
    data, source = _read_yaml(file, text, os.environ if environ is None else environ)
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_validation_problems(exc, source)) from None
    config._source = source
    return config


# --- agents ---------------------------------------------------------------------------------


def load_agents(config: Config) -> tuple[dict[str, Agent], list[str]]:
    """Import every agent of the configuration: the agents that loaded, and one problem per
    agent that did not (bad import path, import failure, not an Agent), each naming the
    file and line of its entry. Never raises for an agent's fault.

    The directory of the configuration file and the working directory are put on
    `sys.path` while importing, so `examples.support_agent:agent` is found beside the file.
    """
    agents: dict[str, Agent] = {}
    problems: list[str] = []
    with _import_path_beside(config.source_file):
        for name, target in config.agents.items():
            try:
                agents[name] = _load_agent(target)
            except _AgentError as exc:
                problems.append(f"{config.location(('agents', name))}: {exc}")
    return agents, problems


def check_agents(config: Config) -> list[str]:
    """Every problem found by importing the agents and checking the rules against their
    tools: a rule naming a tool no agent registers, an `editable` or `when` naming an
    argument the tool does not take. Returns [] when all is well; never raises for a
    problem of the file.

    The rules are checked only when every agent loaded (a missing agent could hold the tool).
    """
    agents, problems = load_agents(config)
    if problems:
        return problems
    for number, rule in enumerate(config.rules):
        if rule.tool == "*":
            continue
        holders = {name: agent for name, agent in agents.items() if rule.tool in agent.tools}
        if not holders:
            registered = sorted({tool.name for agent in agents.values() for tool in agent.tools})
            listed = ", ".join(registered) or "none"
            problems.append(
                f"{config.location(('rules', number, 'tool'))}: no agent registers a tool "
                f"named {rule.tool!r}; registered tools: {listed}"
            )
            continue
        for name, agent in holders.items():
            problems.extend(_argument_problems(config, number, rule, name, agent))
    return problems


def _argument_problems(
    config: Config, number: int, rule: Rule, agent_name: str, agent: Agent
) -> Iterator[str]:
    model = agent.tools.get(rule.tool).model
    arguments = [info.alias or name for name, info in model.model_fields.items()]
    what = f"tool {rule.tool!r} (agent {agent_name!r}) takes {', '.join(arguments) or 'none'}"
    for index, argument in enumerate(rule.editable or []):
        if argument not in arguments:
            at = config.location(("rules", number, "editable", index))
            yield f"{at}: {argument!r} is not an argument: {what}"
    if rule.when is not None:
        for argument in sorted(rule.when.argument_names() - set(arguments)):
            at = config.location(("rules", number, "when"))
            yield f"{at}: {argument!r} is not an argument: {what}"


class _AgentError(Exception):
    """Why an agent entry could not be loaded."""


def _load_agent(target: str) -> Agent:
    module_name, _, attribute = target.partition(":")
    try:
        found: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise _AgentError(f"cannot import {module_name!r}: {exc}") from None
    except (Exception, SystemExit) as exc:
        raise _AgentError(f"importing {module_name!r} raised {type(exc).__name__}: {exc}") from None
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise _AgentError(f"{module_name!r} has no attribute {attribute!r}")
        found = getattr(found, part)
    if isinstance(found, Agent):
        return found
    if not callable(found):
        raise _AgentError(
            f"{target} is {_described(found)}, not a core.Agent or a zero-argument "
            "callable returning one"
        )
    return _call_factory(target, found)


def _call_factory(target: str, factory: Callable[..., Any]) -> Agent:
    with contextlib.suppress(TypeError, ValueError):  # builtins without a signature
        parameters = inspect.signature(factory).parameters.values()
        required = [
            p.name
            for p in parameters
            if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
        if required:
            raise _AgentError(
                f"{target} takes arguments ({', '.join(required)}); expected a core.Agent "
                "or a zero-argument callable returning one"
            )
    try:
        made = factory()
    except Exception as exc:
        raise _AgentError(f"calling {target}() raised {type(exc).__name__}: {exc}") from None
    if inspect.iscoroutine(made):
        made.close()
        raise _AgentError(f"{target} is async; expected a plain callable returning a core.Agent")
    if not isinstance(made, Agent):
        raise _AgentError(f"{target}() returned {_described(made)}, not a core.Agent")
    return made


def _described(value: object) -> str:
    if isinstance(value, type):
        return f"the class {value.__name__}"
    article = "an" if type(value).__name__[:1].lower() in "aeiou" else "a"
    return f"{article} {type(value).__name__}"


@contextlib.contextmanager
def _import_path_beside(file: str | None) -> Iterator[None]:
    """Put the configuration file's directory and the working directory on `sys.path`
    for the duration of the imports."""
    folders = [str(Path(file).resolve().parent)] if file is not None else []
    folders.append(os.getcwd())
    added = [folder for folder in dict.fromkeys(folders) if folder not in sys.path]
    sys.path[:0] = added
    try:
        yield
    finally:
        for folder in added:
            with contextlib.suppress(ValueError):
                sys.path.remove(folder)
