"""What makes a valid configuration unsafe to trust: secrets written in the file (or as the
default of a `${VAR:-default}`), the store URL's password among them, weak secrets, one
secret used in two places, and a bot listening beyond loopback over plain http.
`trust_warnings` finds them; `nodbot check-config` prints them and `nodbot serve` logs them
at start. No warning shows a secret's value."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from pydantic import BaseModel, SecretStr

from nodbot.bot.config.errors import KeyPath, Source, dotted
from nodbot.bot.config.models import Config
from nodbot.bot.config.reader import _REFERENCE, _VARIABLE

__all__ = [
    "MIN_SECRET_LENGTH",
    "trust_warnings",
    "undecidable_warning",
    "unread_replies_warning",
]

MIN_SECRET_LENGTH = 32
"""Below this a secret is warned of as weak (the file is refused below 16)."""
_MIN_VARIETY = 8
"""A secret of fewer distinct characters is warned of as weak."""
_LOOPBACK_NAMES = ("localhost", "localhost.", "ip6-localhost")
_MAKE_ONE = "python -c 'import secrets; print(secrets.token_urlsafe(32))'"


def trust_warnings(config: Config, *, host: str | None = None) -> list[str]:
    """The warnings of a configuration that is valid but should not be trusted as it is,
    in the order of the file, each `<file>:<line>: <dotted.key>: warning: <what and what to
    do>`. `host` is the address `serve` was told to listen on instead of `server.host`.

    Whether a secret was written in the file is known only of a configuration read by
    `load_config`; the other checks apply to any."""
    source: Source | None = config._source
    secrets = list(_secrets(config))
    found: list[tuple[int, str]] = []

    def add(path: KeyPath, message: str) -> None:
        line = source.line(path) if source is not None else 0
        found.append((line, f"{config.location(path)}: warning: {message}"))

    first_place: dict[str, KeyPath] = {}
    for path, value in secrets:
        if source is not None:
            literal = _literal(source, path, config)
            if literal is not None:
                add(path, literal)
        weakness = _weakness(value)
        if weakness is not None:
            add(
                path,
                f"a weak secret ({weakness}): use at least {MIN_SECRET_LENGTH} random "
                f"characters, such as the output of {_MAKE_ONE}",
            )
        earlier = first_place.setdefault(value, path)
        if earlier != path:
            where = dotted(earlier)
            if source is not None:
                where = f"{where} (line {source.line(earlier)})"
            add(
                path,
                f"the same secret as {where}: give each its own, so that one that leaks "
                "does not give the other away",
            )
    if source is not None:
        store = _store_password(config.store.url, source)
        if store is not None:
            add(_STORE_URL, store)
    plain = _plain_http(config, host, source)
    if plain is not None:
        add(("server", "host"), plain)
    found.sort(key=lambda pair: pair[0])
    return [text for _, text in found]


def undecidable_warning(config: Config) -> str | None:
    """`nodbot serve`'s warning when reviews can open but nobody has a way to decide them:
    no token with approvals:decide, no `web.secret` (without it `nodbot inbox-link` cannot
    sign anyone in: the inbox's secret is made at start and known to that process alone),
    and no chat (Slack, Teams, Discord). None when a reviewer has a way, or no rule asks for
    review."""
    deciding = any("approvals:decide" in token.scopes for token in config.api.tokens)
    chats = config.slack or config.teams or config.discord
    if not config.rules or deciding or config.web.secret is not None or chats:
        return None
    return (
        f"{config.location(())}: warning: nobody can decide a review: no API token has the "
        "scope approvals:decide, web.secret is not set (so `nodbot inbox-link` cannot sign "
        "anyone in) and no slack:, teams: or discord: section is configured; add one of them "
        "(`nodbot init` writes a bot with the first two)"
    )


def unread_replies_warning(config: Config) -> str | None:
    """`nodbot serve`'s warning when no email reply can decide anything: senders must be
    authenticated (the default) but no `trusted_authserv_id` says whose word counts, so every
    reply is refused (and recorded so) however it comes in."""
    email = config.email
    if email is None or not email.require_authenticated_sender or email.trusted_authserv_id:
        return None
    return (
        f"{config.location(('email',))}: warning: no email reply can decide: "
        "require_authenticated_sender is on (the default) and trusted_authserv_id is not set; "
        "set it to the authserv-id your mail server writes in Authentication-Results"
    )


# --- the secrets of a configuration ---------------------------------------------------------


def _secrets(config: Config) -> Iterator[tuple[KeyPath, str]]:
    """Every secret of the file with its key path, in the order of the models: each
    `SecretStr` field (API tokens, web.secret, Slack's tokens, webhook secrets, audit.key,
    the mail servers' passwords): the models say which values are secrets."""
    for path, value in _walk(config, ()):
        if isinstance(value, SecretStr):
            yield path, value.get_secret_value()


def _walk(value: Any, path: KeyPath) -> Iterator[tuple[KeyPath, Any]]:
    if isinstance(value, BaseModel):
        for name in type(value).model_fields:
            yield from _walk(getattr(value, name), (*path, name))
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _walk(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _walk(item, (*path, index))
    else:
        yield path, value


def _literal(source: Source, path: KeyPath, config: Config) -> str | None:
    """Why the secret at `path` is in the file, or None when it comes from the environment."""
    variable = _variable_for(path, config)
    defaulted = source.defaulted.get(path)
    if defaulted:
        names = ", ".join(f"${{{name}:-...}}" for name in defaulted)
        return (
            f"the secret has a default, {names}: a default is written in the file, so it is "
            f"a secret written in the file; write ${{{defaulted[0]}}} without a default and "
            f"set {defaulted[0]} in the environment"
        )
    if path not in source.from_environment:
        return (
            "a secret written in the file: whoever reads the file (or its history) has it; "
            f"write ${{{variable}}} and set {variable} in the environment"
        )
    return None


_VARIABLES: Mapping[KeyPath, str] = {
    ("web", "secret"): "NODBOT_WEB_SECRET",
    ("slack", "bot_token"): "SLACK_BOT_TOKEN",
    ("slack", "signing_secret"): "SLACK_SIGNING_SECRET",
    ("slack", "app_token"): "SLACK_APP_TOKEN",
    ("audit", "key"): "NODBOT_AUDIT_KEY",
}


def _variable_for(path: KeyPath, config: Config) -> str:
    """A name for the environment variable to hold the secret at `path`."""
    known = _VARIABLES.get(path)
    if known is not None:
        return known
    if path[:2] == ("api", "tokens") and isinstance(path[2], int):
        return _variable_name("NODBOT_TOKEN_", config.api.tokens[path[2]].name)
    if path[:1] == ("webhooks",) and isinstance(path[1], int):
        return _variable_name("NODBOT_WEBHOOK_SECRET_", config.webhooks[path[1]].name)
    if path[:1] == ("email",):
        return _variable_name("", "_".join(str(part) for part in path[1:]))
    return _variable_name("NODBOT_", "_".join(str(part) for part in path))


def _variable_name(prefix: str, name: str) -> str:
    return prefix + re.sub(r"\W+", "_", name).strip("_").upper()


def _weakness(value: str) -> str | None:
    """Why the secret is weak, or None. Says nothing of the value but its shortness and
    variety."""
    reasons = []
    if len(value) < MIN_SECRET_LENGTH:
        reasons.append(f"shorter than {MIN_SECRET_LENGTH} characters")
    distinct = len(set(value))
    if distinct <= 1:
        reasons.append("one character repeated")
    elif value.isdigit():
        reasons.append("only digits")
    elif distinct < _MIN_VARIETY:
        reasons.append(f"fewer than {_MIN_VARIETY} different characters")
    return ", ".join(reasons) or None


# --- the store URL's password ---------------------------------------------------------------

_STORE_URL: KeyPath = ("store", "url")
_STORE_FIX = "postgresql://user:${DB_PASSWORD}@host/db"
# SQLAlchemy's reading of a URL (`sqlalchemy.engine.url._parse_url`), which the store's is: the
# password runs from the first ":" of the user part to the next "@"; libpq also takes one as
# the query's `password`.
_URL = re.compile(
    r"[^:/?#]+://(?:[^:/]*(?::(?P<password>[^@]*))?@)?[^?]*(?:\?(?P<query>.*))?", re.DOTALL
)


@dataclass(frozen=True)
class _Reference:
    """A `${name}` or `${name:-default}` as written in the file."""

    name: str
    default: str | None


_Written: TypeAlias = "Sequence[str | _Reference]"
"""A value as written: its literal text and its references, in order."""


def _store_password(url: str, source: Source) -> str | None:
    """Why the password of the store URL `url` is in the file, or None: it has none, or it
    comes from `${VAR}`s only. Says nothing of the password but where it comes from."""
    written = _written_url(url, source)
    if written is None:
        # Not read from a file by the reader: only the value's origin is known.
        defaulted = source.defaulted.get(_STORE_URL)
        return _store_default(defaulted[0]) if defaulted else None
    literal, defaulted = _password_origin(written)
    if literal:
        return (
            "a password written in the file: whoever reads the file (or its history) has it; "
            f"write {_STORE_FIX} and set DB_PASSWORD in the environment"
        )
    return _store_default(defaulted[0]) if defaulted else None


def _store_default(name: str) -> str:
    return (
        f"the store URL's password has a default, ${{{name}:-...}}: a default is written in "
        f"the file, so it is a password written in the file; write ${{{name}}} without a "
        f"default and set {name} in the environment"
    )


def _written_url(url: str, source: Source) -> _Written | None:
    """The store URL `url` as the file writes it, or None when that is not known."""
    text = source.written.get(_STORE_URL)
    if text is None:
        return None if _STORE_URL in source.substituted else [url]
    written = _references(text)
    pattern = "".join(re.escape(part) if isinstance(part, str) else "(.*)" for part in written)
    if re.fullmatch(pattern, url, re.DOTALL) is None:
        return None
    return written


def _references(text: str) -> list[str | _Reference]:
    """`text` split as the reader substitutes it: literal text and `${...}` references (a
    `$${` writes `${` itself)."""
    parts: list[str | _Reference] = []
    at = 0
    for found in _REFERENCE.finditer(text):
        parts.append(text[at : found.start()])
        at = found.end()
        reference = _VARIABLE.fullmatch(found.group(2) or "")
        if found.group(1) or reference is None:
            parts.append(found.group(0)[1:] if found.group(1) else found.group(0))
        else:
            parts.append(_Reference(reference.group(1), reference.group(2)))
    parts.append(text[at:])
    return [part for part in parts if part != ""]


def _password_origin(written: _Written) -> tuple[bool, list[str]]:
    """Whether the URL's password (its user part's, or its query's `password`) has text
    written in the file, and the names of the `${VAR:-default}`s it is made of."""
    literal_text = "".join(part for part in written if isinstance(part, str))
    # Each reference stands as one character the text does not hold, so that the URL can be
    # read with its references in place, and each part of the password told by its origin.
    free = (chr(code) for code in range(0xE000, 0xF900) if chr(code) not in literal_text)
    marks: dict[str, _Reference] = {}
    marked = ""
    for part in written:
        if isinstance(part, str):
            marked += part
        else:
            mark = next(free)
            marks[mark] = part
            marked += mark
    found = _URL.match(marked)
    if found is None:
        return False, []
    passwords = [found.group("password") or ""]
    for pair in (found.group("query") or "").split("&"):
        name, _, value = pair.partition("=")
        if name == "password":
            passwords.append(value)
    characters = "".join(passwords)
    literal = any(character not in marks for character in characters)
    defaulted = [
        marks[character].name
        for character in characters
        if character in marks and marks[character].default is not None
    ]
    return literal, defaulted


# --- where the bot listens ------------------------------------------------------------------


def _plain_http(config: Config, host: str | None, source: Source | None) -> str | None:
    """Why listening where the bot listens is unsafe, or None: beyond loopback, reviewers'
    tokens, sign-in links and sessions must not cross the network over plain http."""
    listening = host or config.server.host
    if _is_loopback(listening):
        return None
    public_url = config.web.public_url
    if public_url is not None and public_url.startswith("https://"):
        return None
    hidden = host is None and source is not None and ("server", "host") in source.substituted
    where = "beyond loopback" if hidden else f"on {listening} (beyond loopback)"
    if host is not None:
        where += ", as --host says,"
    why = "web.public_url is not set" if public_url is None else f"web.public_url is {public_url}"
    return (
        f"the bot listens {where} over plain http ({why}): API tokens, sign-in links and "
        "sessions cross the network readable; put it behind a TLS proxy and set "
        "web.public_url to the proxy's https:// address (or listen on 127.0.0.1)"
    )


def _is_loopback(host: str) -> bool:
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
