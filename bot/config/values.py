"""The value types the file is written in: durations, counts, reviewers, Slack post
targets, names and import paths, each validated into a problem at its key; and `ConfigModel`,
the settings every configuration model shares."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Annotated, ClassVar, Literal, TypeAlias

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, PlainValidator

from nodbot.bot.config.errors import problem, shown

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
        raise ValueError(f"{expected}, not {shown(value)}")
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
        raise problem(str(exc)) from None


Duration: TypeAlias = Annotated[int, PlainValidator(_duration)]
"""Seconds, written in the file as `30s`, `15m`, `2h`, `1d` (or `1h30m`)."""


def _no_bool(value: object) -> object:
    if isinstance(value, bool):
        raise problem(f"expected a whole number, not {value!r}")
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
        raise ValueError(f"{_REVIEWER_EXPECTED}, not {shown(text)}")
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
        raise problem(str(exc)) from None


ReviewerEntry: TypeAlias = Annotated[Reviewer, PlainValidator(_reviewer)]
"""A reviewer, written as a string in the file."""

_SLACK_USER = re.compile(rf"[UW]{_SLACK_ID}")


def normalize_handle(handle: str) -> str:
    """A handle (a Slack user id, an email address, a name) as the bot compares it: Slack
    user ids as they are, anything else lowercased."""
    text = handle.strip()
    return text if _SLACK_USER.fullmatch(text) else text.lower()


_TEAMS_TARGET = re.compile(r"teams:[^\s]{1,512}")
_DISCORD_TARGET = re.compile(r"discord:[0-9]{5,25}")


def _post_target(value: object) -> str:
    if value == "dm":
        return "dm"
    if isinstance(value, str) and (
        _TEAMS_TARGET.fullmatch(value) or _DISCORD_TARGET.fullmatch(value)
    ):
        return value
    try:
        reviewer = parse_reviewer(value)
    except ValueError:
        reviewer = None
    if reviewer is None or reviewer.kind != "slack_channel":
        raise problem(
            "expected a Slack channel (#name or C...), dm, teams:<a conversation of "
            f"teams.post_to> or discord:<channel id>, not {shown(value)}"
        ) from None
    return reviewer.text


PostTarget: TypeAlias = Annotated[str, PlainValidator(_post_target)]
"""Where a review is posted: a Slack channel (`#name` or `C...`), `dm` (Slack direct
messages to the reviewers), `teams:<name or id>` (a conversation of `teams.post_to`) or
`discord:<channel id>`."""


def chat_of(target: str) -> str:
    """The chat a `post_to` entry is for: `teams`, `discord`, or `slack` (the rest)."""
    chat = target.split(":", 1)[0]
    return chat if chat in ("teams", "discord") else "slack"


# --- names and import paths -----------------------------------------------------------------

_NAME = re.compile(r"[A-Za-z0-9_\-]+")
_IMPORT_PATH = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")


def _name(value: str) -> str:
    if not _NAME.fullmatch(value):
        raise problem(f"expected a name of letters, digits, - and _, not {value!r}")
    return value


Name: TypeAlias = Annotated[str, AfterValidator(_name)]
"""An agent or reviewer group name: letters, digits, `-` and `_`."""

_PRINCIPAL = re.compile(r"[A-Za-z0-9_.+@-]+")


def _principal(value: str) -> str:
    if not _PRINCIPAL.fullmatch(value):
        raise problem(
            "expected a principal of letters, digits and - _ . + @ (a name, a Slack user id or "
            f"an email address), not {value!r}"
        )
    return value


Principal: TypeAlias = Annotated[str, AfterValidator(_principal)]
"""Who an API token stands for: a name, a Slack user id or an email address."""


def _import_path(value: str) -> str:
    if not _IMPORT_PATH.fullmatch(value):
        raise problem(f"expected an import path such as package.module:attribute, not {value!r}")
    return value


ImportPath: TypeAlias = Annotated[str, AfterValidator(_import_path)]
"""`package.module:attribute`, naming a `core.Agent` or a zero-argument callable returning
one."""


# --- addresses to listen on -----------------------------------------------------------------

_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")


def listen_host(value: str) -> str:
    """An address to listen on, as written: an IPv4 address, an IPv6 address (in brackets or
    not; returned without them) or a host name (letters, digits and `-` in dot-separated
    labels). Raises `ValueError` saying so for anything else; whether a name resolves, and
    to an address of this machine, is only known when the bot listens."""
    text = value.strip()
    refused = ValueError(f"{value!r} is not a host name or an IP address")
    bracketed = text.startswith("[") and text.endswith("]")
    if bracketed or ":" in text:
        try:
            return str(ipaddress.IPv6Address(text[1:-1] if bracketed else text))
        except ValueError:
            raise refused from None
    with_dot = text.removesuffix(".")
    labels = with_dot.split(".")
    if all(label.isdigit() for label in labels):  # numbers only: an IPv4 address or nothing
        try:
            return str(ipaddress.IPv4Address(text))
        except ValueError:
            raise refused from None
    if len(with_dot) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        raise refused
    return text


def _listen_host(value: str) -> str:
    try:
        return listen_host(value)
    except ValueError as exc:
        raise problem(str(exc)) from None


ListenHost: TypeAlias = Annotated[str, AfterValidator(_listen_host)]
"""An IP address or a host name to listen on (`listen_host`)."""


# --- the models' shared settings ------------------------------------------------------------


class ConfigModel(BaseModel):
    """The settings every configuration model shares: unknown keys are errors, the models
    cannot be changed once read, and each field's docstring is its description."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    key_noun: ClassVar[str] = "key"
    """What an unknown key of this model is called in an error ("key", "predicate")."""
