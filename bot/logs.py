"""The bot's logs: one line per record on stderr, as text or JSON (`log:` of the file).

```
text: 2026-12-01T13:53:20.123Z info nodbot.bot.http.access request method=POST path=/runs ...
json: {"time": "2026-12-01T13:53:20.123Z", "level": "info", "logger": "...", "message":
       "request", "method": "POST", "path": "/runs", "status": 201, "duration_ms": 3.1}
```

The bot logs with `logging` and `extra={...}`: those fields are the record's structured
part, top-level keys in JSON and `key=value` pairs in text. An exception is the `error`
field, on the same line. Every secret of the configuration (API tokens, `web.secret`, Slack's
tokens and signing secret, webhook secrets, `audit.key`, the store's password) is replaced by
`[secret]` in every line, whoever logged it: a library's debug line can hold a header. So is
every email reply token (`approvals+[secret]@example.com`, `<nodbot.7.[secret]@...>`): it
answers a review as its reviewer until it expires.

Libraries' chatter (`CHATTY`: the SMTP transcript of the email listener, each migration of
the store) is written at `level: debug` only.
"""

from __future__ import annotations

import json
import logging
import math
import re
import sys
import traceback
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import Any, cast
from urllib.parse import urlsplit

from pydantic import BaseModel, SecretStr

from nodbot.bot.config import Config, LogConfig
from nodbot.bot.email.tokens import TOKEN_LENGTH

__all__ = ["JsonFormatter", "TextFormatter", "config_secrets", "configure_logging"]

REDACTED = "[secret]"
MIN_SECRET = 8
"""Shorter values are not redacted: they would blank out ordinary words (the configuration
asks for at least 16 characters anyway)."""

QUIET = ("aiosqlite", "asyncio", "hpack", "httpcore", "multipart", "slack_bolt", "slack_sdk")
"""Libraries whose debug lines (every SQL statement, every HTTP frame and header) stay off
even at `level: debug`: that level is for the bot's own details."""
CHATTY = ("alembic.runtime.migration", "mail.log")
"""Loggers whose info lines are written at `level: debug` only: alembic's line per migration
(the store logs one line for them all) and aiosmtpd's SMTP transcript (a line per command of
every session, each reply address whole)."""
HUSHED = ("alembic.runtime.plugins", "httpx")
"""Loggers kept to warnings: httpx's info line has each URL whole, query included (a
webhook's address may hold a key), and the bot logs its deliveries itself."""

_REPLY_TOKEN = re.compile(rf"(?<=[+.])[A-Za-z2-7]{{{TOKEN_LENGTH}}}(?=@)")
"""An email reply token where the bot writes one: the +tag of a reply address, and in the
Message-IDs it sends (`nodbot.<delivery>.<token>@`); any case, as mail servers change it."""

# What every LogRecord has: anything else on a record came from `extra`.
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    """The structured fields of `record` (its `extra`)."""
    return {
        key: value
        for key, value in record.__dict__.items()
        if key not in _STANDARD and not key.startswith("_")
    }


class _Formatter(logging.Formatter):
    """Common to both formats: the time, the exception on one line, the secrets redacted."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        # Longest first: a secret that contains another is redacted whole.
        self.secrets = sorted({s for s in secrets if len(s) >= MIN_SECRET}, key=len, reverse=True)

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            **_fields(record),
        }
        if record.exc_info and record.exc_info[1] is not None:
            entry["error"] = "".join(traceback.format_exception(record.exc_info[1])).strip()
        line = self.render(entry)
        for secret in self.secrets:
            line = line.replace(secret, REDACTED)
        if "@" in line:
            line = _REPLY_TOKEN.sub(REDACTED, line)
        return line

    def render(self, entry: dict[str, Any]) -> str:
        raise NotImplementedError


_JSON_LINE = json.JSONEncoder(default=str, ensure_ascii=False)
"""One encoder for every line (`json.dumps` with options makes a new one each time)."""


class JsonFormatter(_Formatter):
    """One JSON object per line."""

    def render(self, entry: dict[str, Any]) -> str:
        entry["time"] = entry["time"].replace("+00:00", "Z")
        return _JSON_LINE.encode(entry)


class TextFormatter(_Formatter):
    """`time level logger message key=value...`, values with spaces or quotes quoted as JSON
    strings (so a line splits back unambiguously, and newlines stay escaped)."""

    def render(self, entry: dict[str, Any]) -> str:
        time = entry.pop("time").replace("+00:00", "Z")
        head = [time, entry.pop("level"), entry.pop("logger"), _one_line(entry.pop("message"))]
        return " ".join([*head, *(f"{key}={_value(value)}" for key, value in entry.items())])


def _one_line(text: str) -> str:
    return text.replace("\r", "\\r").replace("\n", "\\n")


_QUOTED = re.compile(r"[\s\"'=\\]")
"""What makes a text value quoted: whitespace (as `str.isspace` has it), a quote, `=` or a
backslash."""
_CONSTANTS = {None: "null", True: "true", False: "false"}


def _value(value: object) -> str:
    # Every field of every line comes here: the common types without a call to json.
    if value is None or value is True or value is False:
        return _CONSTANTS[value]
    kind = type(value)
    if kind is str:
        text = cast(str, value)
        return text if text and not _QUOTED.search(text) else json.dumps(text, ensure_ascii=False)
    if kind is int:
        return str(value)
    if kind is float and math.isfinite(cast(float, value)):
        return repr(value)  # as json writes a float
    if isinstance(value, bool | int | float):
        return json.dumps(value)
    if isinstance(value, str):  # a subclass: its text as such
        return _value(str.__str__(value))
    return json.dumps(value, default=str, ensure_ascii=False, separators=(",", ":"))


class _BotHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler `configure_logging` installs (and replaces when called again)."""


def _chatter_as_debug(record: logging.LogRecord) -> bool:
    """The info lines of `CHATTY` loggers are written as the debug lines they are here."""
    if record.levelno == logging.INFO and record.name.startswith(CHATTY):
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
    return True


def configure_logging(config: LogConfig, *, secrets: Iterable[str] = ()) -> None:
    """Send every log record of the process to stderr, one line each, in the format and from
    the level of `config`, with each of `secrets` redacted. Called again, it replaces what it
    installed before."""
    # What no line of either format shows is not gathered for every record: the caller's
    # file and line (a walk up the stack), the thread, the process and its name.
    logging._srcfile = None  # as the logging HOWTO suggests
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, _BotHandler)]:
        root.removeHandler(handler)
    handler = _BotHandler(sys.stderr)
    formatter = JsonFormatter if config.format == "json" else TextFormatter
    handler.setFormatter(formatter(secrets))
    handler.addFilter(_chatter_as_debug)
    root.addHandler(handler)
    level = logging.getLevelNamesMapping()[config.level.upper()]
    root.setLevel(level)
    for name in QUIET:
        logging.getLogger(name).setLevel(max(level, logging.INFO))
    for name in HUSHED:
        logging.getLogger(name).setLevel(max(level, logging.WARNING))
    for name in CHATTY:
        logging.getLogger(name).setLevel(
            logging.DEBUG if level <= logging.DEBUG else logging.WARNING
        )


def config_secrets(config: Config) -> list[str]:
    """Every secret value of `config`: its `SecretStr` fields, and the store URL's password."""
    found = list(_secrets_in(config))
    password = urlsplit(config.store.url).password if "://" in config.store.url else None
    if password:
        found.append(password)
    return found


def _secrets_in(value: object) -> Iterator[str]:
    if isinstance(value, SecretStr):
        yield value.get_secret_value()
    elif isinstance(value, BaseModel):
        for name in type(value).model_fields:
            yield from _secrets_in(getattr(value, name))
    elif isinstance(value, list | tuple | set):
        for item in value:
            yield from _secrets_in(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _secrets_in(item)
