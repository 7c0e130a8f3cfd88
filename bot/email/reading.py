"""Reading a reviewer's reply email: parsing it within limits (`parse`, or only its own header
fields with `parse_head`), whether to drop it unread (`screen`), who sent it
(`sender`), what they wrote above the quoted request (`reply_text`), which decision that
text asks for (`command`), and which decision the message asks for (`reply_command`: a
message whose text and HTML parts ask for different ones asks for none).

Everything here is a pure function of the message: no network, no store, no token. The inbound
door calls them in that order and stops at the first refusal; the token and the rule's policy
are checked by the caller.

Quote detection: the multilingual "On <date>, <name> wrote:" / "From: ... Sent: ..." headers
are found by `mail-parser-reply` (maintained, MIT, no dependencies, 14 languages), which is the
hard part to keep up to date by hand. It does not know our marker line, `>` quoted lines,
forwarded-message separators or mobile signatures such as "Get Outlook for iOS", and it keeps a
body that is all quote; those are cut here, before and after it. Its regular expressions take
quadratic time on long hostile lines, so it only ever sees the first `_MAX_READ` characters.

HTML to text is `html_text.visible_text`: what a mail client shows, with hidden elements,
comments and the like left out, up to the first quote container (`blockquote`, Gmail's
`gmail_quote`, Outlook's `divRplyFwdMsg`, Thunderbird's `moz-cite-prefix`), since only the
text above the quote counts. `html2text` writes Markdown (escapes, `**`, link syntax) that
would have to be undone, and does not judge what is hidden.

Parsing is the standard library's feed parser, held to `limits.EMAIL_PARTS` parts nested
`EMAIL_DEPTH` deep, `EMAIL_HEADERS` header fields a part and `EMAIL_HEADERS_TOTAL` in all,
and `EMAIL_HEADER_BYTES` of the fields anything here parses (`PARSED_FIELDS`), each with at
most `EMAIL_HEADER_COMMENTS` comments: the message class it builds counts them as they are
made and raises `MessageTooComplex` at the first one over, so the parse stops there. Without
them, 3,000 nested parts raise `RecursionError`, 25,000 parts take 4 s of CPU to parse (and
more to walk), and a 900 KB To field takes 10 s to read.

Every function here is pure Python over a message of at most `limits.EMAIL_BODY` bytes, in
time linear in its size; the inbound door runs them off the event loop.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from email import policy
from email.headerregistry import Address
from email.message import EmailMessage, MIMEPart
from email.parser import BytesParser
from typing import Any, Literal, TypeAlias

from mailparser_reply import EmailReplyParser  # type: ignore[import-untyped]
from mailparser_reply.constants import MAIL_LANGUAGES  # type: ignore[import-untyped]

from nodbot.bot.email.html_text import visible_text
from nodbot.bot.http.limits import (
    EMAIL_DEPTH,
    EMAIL_HEADER_BYTES,
    EMAIL_HEADER_COMMENTS,
    EMAIL_HEADERS,
    EMAIL_HEADERS_TOTAL,
    EMAIL_PARTS,
)

__all__ = [
    "MARKER",
    "PARSED_FIELDS",
    "Approve",
    "Command",
    "Deny",
    "Edit",
    "MessageTooComplex",
    "Problem",
    "Refused",
    "Respond",
    "Sender",
    "Unclear",
    "command",
    "parse",
    "parse_head",
    "reply_command",
    "reply_parts",
    "reply_text",
    "screen",
    "sender",
]

MARKER = "-- reply above this line --"
"""The line the review request carries above its own text; everything from this line down in a
reply is the quoted request. Compared case-insensitively, anywhere in a line (clients quote it
as `> -- reply above this line --`)."""

_MAX_READ = 3_000
"""The most characters of a reply read for a command: a decision's reason is at most
`forms.MAX_REASON` (2,000) characters, and it bounds the quote detector's running time."""

# --- parse --------------------------------------------------------------------------------

PARSED_FIELDS = frozenset(
    {
        *("from", "to", "cc", "delivered-to", "return-path"),
        *("subject", "message-id", "in-reply-to", "references", "authentication-results"),
        *("auto-submitted", "precedence", "x-autoreply", "x-autorespond", "x-autoresponder"),
        *("content-type", "content-disposition", "content-transfer-encoding", "content-id"),
    }
)
"""The header fields the bot parses (here, in `inbound` and in `answers`, and the standard
library's `get_body` and `get_content`), lowercased: the ones `EMAIL_HEADER_BYTES` and
`EMAIL_HEADER_COMMENTS` bound. A field read anew belongs here."""


class MessageTooComplex(ValueError):
    """An email over one of the limits of `parse` (`limits.EMAIL_PARTS` and the ones after
    it); parsing stopped there."""

    def __init__(self, reason: str, *, head: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        """Which limit, in words fit for the review's events and the reviewer's answer."""
        self.head = head
        """The message's own header fields passed it: `parse_head` would fail too."""


def parse(raw: bytes) -> EmailMessage:
    """`raw` (one RFC 5322 message) parsed with `policy.default`, in time linear in its size
    and at most `limits.EMAIL_PARTS` parts, `EMAIL_DEPTH` levels, `EMAIL_HEADERS` fields a
    part, `EMAIL_HEADERS_TOTAL` in all, `EMAIL_HEADER_BYTES` of `PARSED_FIELDS` and
    `EMAIL_HEADER_COMMENTS` comments a parsed field. Raises `MessageTooComplex` as soon as
    one is passed: the parser stops there, having read no further."""
    return _parse(raw, headers_only=False)


def parse_head(raw: bytes) -> EmailMessage:
    """Only the message's own header fields, parsed as `parse` does (its body is left out,
    unread). Raises `MessageTooComplex` when they alone pass a limit."""
    end = _HEAD_END.search(raw)
    return _parse(raw if end is None else raw[: end.end()], headers_only=True)


_HEAD_END = re.compile(rb"\n\r?\n")


def _parse(raw: bytes, *, headers_only: bool) -> EmailMessage:
    budget = _Budget()
    limited = policy.default.clone(message_factory=functools.partial(_Counted, budget=budget))
    try:
        parsed = BytesParser(policy=limited).parsebytes(raw, headersonly=headers_only)
    finally:
        budget.spent = True  # the messages may be changed after: nothing counts any more
    assert isinstance(parsed, EmailMessage)  # the factory makes _Counted ones
    return parsed


class _Budget:
    """What one parse has used of the limits."""

    def __init__(self) -> None:
        self.parts = 0
        self.fields = 0
        self.parsed_bytes = 0
        self.spent = False


class _Counted(EmailMessage):
    """A message that counts itself, its header fields and its depth against its parse's
    `_Budget` as the parser builds it (`message_factory`, `attach`, `set_raw`: the calls the
    standard library's feed parser makes for each part, each child and each field)."""

    def __init__(self, policy: Any = None, *, budget: _Budget | None = None) -> None:
        super().__init__(policy)
        self._budget = budget
        self._depth = 0
        self._fields = 0
        if budget is not None and not budget.spent:
            budget.parts += 1
            if budget.parts > EMAIL_PARTS:
                reason = f"the message has more than {EMAIL_PARTS} MIME parts"
                raise MessageTooComplex(reason, head=False)

    def attach(self, payload: Any) -> None:
        if isinstance(payload, _Counted) and self._counting():
            payload._depth = self._depth + 1
            if payload._depth > EMAIL_DEPTH:
                reason = f"the message's MIME parts nest more than {EMAIL_DEPTH} levels deep"
                raise MessageTooComplex(reason, head=False)
        super().attach(payload)

    def set_raw(self, name: str, value: Any) -> None:
        budget = self._budget
        if budget is not None and not budget.spent:
            self._fields += 1
            budget.fields += 1
            _check_field(budget, self._fields, self._depth, name, str(value))
        super().set_raw(name, value)

    def _counting(self) -> bool:
        return self._budget is not None and not self._budget.spent


def _check_field(budget: _Budget, fields: int, depth: int, name: str, value: str) -> None:
    """Raises `MessageTooComplex` when a part's `fields`-th field, `name: value`, passes a
    limit (`depth` 0: the message's own field)."""
    whose = "the message" if depth == 0 else "a part of the message"
    reason = None
    if fields > EMAIL_HEADERS:
        reason = f"{whose} has more than {EMAIL_HEADERS} header fields"
    elif budget.fields > EMAIL_HEADERS_TOTAL:
        reason = f"the message and its parts have more than {EMAIL_HEADERS_TOTAL} header fields"
    elif name.strip().lower() in PARSED_FIELDS:
        budget.parsed_bytes += len(value)
        if budget.parsed_bytes > EMAIL_HEADER_BYTES:
            reason = (
                f"the message's address, subject, Message-ID and MIME header fields are over "
                f"{EMAIL_HEADER_BYTES // 1024} KB"
            )
        elif value.count("(") > EMAIL_HEADER_COMMENTS:
            reason = f"a header field of {whose} has more than {EMAIL_HEADER_COMMENTS} comments"
    if reason is not None:
        # The message's own fields come before any part's: over a limit at depth 0, they
        # alone passed it.
        raise MessageTooComplex(reason, head=depth == 0)


# --- screen -------------------------------------------------------------------------------

_PRECEDENCE = {"bulk", "junk", "list", "auto_reply"}
_AUTOMATIC_SUBJECT = re.compile(
    r"^\s*(?:"
    r"out of (?:the )?office|automatic reply|auto(?:matic)?[- ]?reply|autoreply|auto:|"
    r"away from (?:the )?office|on vacation|vacation reply|"
    r"undeliverable|undelivered mail|delivery status notification|mail delivery fail|"
    r"returned mail|failure notice|"
    r"abwesenheitsnotiz|automatische antwort|abwesend|"  # de
    r"r[ée]ponse automatique|absence du bureau|absent du bureau|"  # fr
    r"respuesta autom[áa]tica|fuera de la oficina|"  # es
    r"risposta automatica|fuori (?:sede|ufficio)|"  # it
    r"automatisch antwoord|afwezig|"  # nl
    r"resposta autom[áa]tica|fora do escrit[óo]rio|"  # pt
    r"automatiskt svar|fr[åa]nvarande|"  # sv
    r"automatisk svar|frav[æe]rende|"  # da, no
    r"odpowied[źz] automatyczna|"  # pl
    r"自動返信|不在|自动回复|자동 응답"  # ja, zh, ko
    r")",
    re.IGNORECASE,
)
_DAEMON = re.compile(r"^(?:mailer-daemon|postmaster)@", re.IGNORECASE)


def screen(message: EmailMessage) -> str | None:
    """Why `message` is a bounce or an automatic reply and must be dropped before anything
    else (and never answered: answering an auto-responder loops), or None.

    Checked by headers first (RFC 3834 `Auto-Submitted`, DSNs of RFC 3464, the de facto
    `X-Autoreply` and `Precedence`), then by subject for the responders that set none.
    """
    return_path = message.get("Return-Path")
    if return_path is not None and str(return_path).strip().replace(" ", "") == "<>":
        return "a bounce: its Return-Path is empty (<>)"
    if message.get_content_type() == "multipart/report":
        report = str(message.get_param("report-type", "") or "").lower()
        return f"a delivery or read report (multipart/report; report-type={report or 'none'})"
    auto = message.get("Auto-Submitted")
    if auto is not None and str(auto).split(";")[0].strip().lower() != "no":
        return f"an automatic message (Auto-Submitted: {str(auto).strip()})"
    for name in ("X-Autoreply", "X-Autorespond", "X-Autoresponder"):
        if message.get(name) is not None:
            return f"an automatic reply ({name} is set)"
    precedence = message.get("Precedence")
    if precedence is not None and str(precedence).strip().lower() in _PRECEDENCE:
        return f"an automatic or list message (Precedence: {str(precedence).strip()})"
    if _DAEMON.search(_bare_from(message)):
        return "a bounce: it comes from a mail daemon"
    subject = str(message.get("Subject", ""))
    if _AUTOMATIC_SUBJECT.search(subject):
        return f"an automatic reply (subject {subject.strip()[:80]!r})"
    return None


def _bare_from(message: EmailMessage) -> str:
    """The first From address, or "" (only for the daemon check: `sender` is the strict one)."""
    header = message.get("From")
    addresses = getattr(header, "addresses", ())
    return str(addresses[0].addr_spec) if addresses else ""


# --- sender -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sender:
    """The verified author of a reply."""

    address: str
    """The From address, its domain lowercased; the display name is never part of it."""
    kind: Literal["sender"] = "sender"


@dataclass(frozen=True)
class Refused:
    """A message that must decide nothing and get no answer."""

    reason: str
    """Why, in words, for the review's events."""
    kind: Literal["refused"] = "refused"


def sender(
    message: EmailMessage, *, trusted_authserv_id: str | None, require_authenticated: bool
) -> Sender | Refused:
    """Who sent `message`: its single From address, authenticated (with
    `require_authenticated`) by the topmost `Authentication-Results` header whose authserv-id
    is `trusted_authserv_id`.

    Only the topmost such header counts: headers are prepended in transit, so it is the one
    our own border server wrote; the RFC 8601 section 5 duty to delete look-alikes that
    arrived from outside is that server's. Headers from any other authserv-id are ignored,
    since anyone can write them.
    """
    headers = message.get_all("From") or []
    if len(headers) != 1:
        return Refused(f"the message has {len(headers)} From headers; exactly one is needed")
    header = headers[0]
    defects = list(getattr(header, "defects", ()))
    addresses: tuple[Address, ...] = tuple(getattr(header, "addresses", ()))
    groups = getattr(header, "groups", ())
    if defects:
        return Refused(f"the From header does not parse cleanly ({defects[0]})")
    if any(group.display_name is not None for group in groups):
        return Refused("the From header is a group; exactly one address is needed")
    if len(addresses) != 1:
        return Refused(f"the From header names {len(addresses)} addresses; exactly one is needed")
    (address,) = addresses
    if not address.username or not address.domain:
        return Refused("the From address has no user or no domain")
    domain = address.domain.lower().rstrip(".")
    found = Sender(f"{address.username}@{domain}")
    if not require_authenticated:
        return found
    if not trusted_authserv_id:
        return Refused("authenticated senders are required but no trusted_authserv_id is set")
    results = _trusted_results(message, trusted_authserv_id.lower())
    if results is None:
        return Refused(f"no Authentication-Results from the trusted server {trusted_authserv_id}")
    if _authenticated(results, domain):
        return found
    said = ", ".join(f"{method}={result}" for method, result, _ in results) or "nothing"
    return Refused(
        f"the trusted server {trusted_authserv_id} did not authenticate {domain} "
        f"(it says {said}; dmarc=pass or dkim=pass aligned with the From domain is needed)"
    )


_Result: TypeAlias = tuple[str, str, dict[str, str]]
"""(method, result, properties) of one `resinfo` of an Authentication-Results header."""


def _trusted_results(message: EmailMessage, authserv_id: str) -> list[_Result] | None:
    """The results of the topmost Authentication-Results header from `authserv_id`, or None."""
    for raw in message.get_all("Authentication-Results") or []:
        parts = _split_semicolons(_uncomment(str(raw)))
        head = parts[0].split()
        if head and head[0].strip('"').lower() == authserv_id:
            return [result for part in parts[1:] if (result := _resinfo(part)) is not None]
    return None


def _uncomment(value: str) -> str:
    """`value` without its RFC 5322 comments (nested parentheses), quoted strings kept."""
    out: list[str] = []
    depth = 0
    quoted = escaped = False
    for char in value:
        if escaped:
            escaped = False
            if depth == 0:
                out.append(char)
            continue
        if char == "\\":
            escaped = True
            if depth == 0:
                out.append(char)
        elif quoted:
            quoted = char != '"'
            out.append(char)
        elif char == "(":
            depth += 1
        elif char == ")" and depth:
            depth -= 1
        elif depth == 0:
            quoted = char == '"'
            out.append(char)
    return "".join(out)


def _split_semicolons(value: str) -> list[str]:
    """`value` split at the semicolons outside quoted strings."""
    parts = [""]
    quoted = False
    for char in value:
        if char == '"':
            quoted = not quoted
        if char == ";" and not quoted:
            parts.append("")
        else:
            parts[-1] += char
    return [part.strip() for part in parts]


def _resinfo(part: str) -> _Result | None:
    """One `methodspec [reasonspec] *propspec` (RFC 8601 section 2.2), or None if it is not."""
    tokens = re.sub(r"\s*=\s*", "=", part).split()
    if not tokens or "=" not in tokens[0]:
        return None
    method, result = tokens[0].split("=", 1)
    properties = {}
    for token in tokens[1:]:
        name, equals, value = token.partition("=")
        if equals:
            properties[name.lower()] = value.strip('"')
    return method.split("/")[0].lower(), result.lower(), properties


def _authenticated(results: list[_Result], domain: str) -> bool:
    """Whether `results` vouch for `domain`: DMARC passed for it (a `header.from`, when given,
    must be it), or a DKIM signature passed with its `header.d` (or `header.i`'s domain) aligned.
    """
    for method, result, properties in results:
        if result != "pass":
            continue
        if method == "dmarc" and properties.get("header.from", domain).lower() == domain:
            return True
        if method == "dkim":
            signer = properties.get("header.d") or properties.get("header.i", "").rpartition("@")[2]
            if signer and _aligned(signer.lower().rstrip("."), domain):
                return True
    return False


def _aligned(signer: str, domain: str) -> bool:
    """Relaxed DMARC alignment without the Public Suffix List: the same domain, or one a
    subdomain of the other (a public suffix cannot pass DKIM, as nobody can sign for it)."""
    return signer == domain or domain.endswith("." + signer) or signer.endswith("." + domain)


# --- reply_text ---------------------------------------------------------------------------

_STOP_LINE = re.compile(
    r"^\s*(?:"
    r">.*|"  # a quoted line
    r"-- ?|"  # the signature separator ("-- ", often sent without its space)
    r"-{2,}\s*(?:original message|forwarded message|mensaje original|message d'origine|"
    r"ursprüngliche nachricht|messaggio originale|oorspronkelijk bericht)\s*-{2,}|"
    r"-{2,} ?forwarded message ?-{2,}|begin forwarded message:|"
    r"_{10,}|"  # Outlook's rule above its From:/Sent: block
    r"sent from my .*|sent from (?:outlook|mail for windows|yahoo mail)\b.*|get outlook for .*|"
    r"on .{1,200}\bwrote:"  # a header the detector missed (it sees only the top)
    r")\s*$",
    re.IGNORECASE,
)
_PARSER = EmailReplyParser(languages=list(MAIL_LANGUAGES))


def reply_text(message: EmailMessage) -> str:
    """What the reviewer wrote above the quoted request in `message`: its text part (or its
    HTML part as a mail client shows it, `html_text.visible_text`), cut at the marker line,
    the first quote header, quoted (`>`) line, forwarded message or signature. "" if there
    is nothing above the quote."""
    return _part_text(message.get_body(preferencelist=("plain", "html")))


def reply_parts(message: EmailMessage) -> tuple[str, str | None]:
    """`reply_text` of each part a reader may have seen: the text part's (the HTML part's
    when there is no text part), and the HTML part's when there are both (else None)."""
    plain = message.get_body(preferencelist=("plain",))
    html = message.get_body(preferencelist=("html",))
    said = _part_text(plain if plain is not None else html)
    return said, (_part_text(html) if plain is not None and html is not None else None)


def _part_text(part: MIMEPart | None) -> str:
    """`reply_text` of one body part (None: no part, so "")."""
    if part is None:
        return ""
    content = part.get_content()
    if not isinstance(content, str):
        return ""
    if part.get_content_type() == "text/html":
        text = visible_text(content, limit=_MAX_READ)
    elif str(part.get_param("format", "") or "").lower() == "flowed":
        text = _unflow(content, delsp=str(part.get_param("delsp", "")).lower() == "yes")
    else:
        text = content
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\xa0", " ")
    return _above_quote(text)


def _above_quote(text: str) -> str:
    """`text` cut at the marker, then at what the detector and `_STOP_LINE` call a quote."""
    position = text.lower().find(MARKER)
    if position >= 0:
        text = text[: text.rfind("\n", 0, position) + 1]
    text = _cut_lines(text)[:_MAX_READ]
    found = _PARSER.parse_reply(text)
    return _cut_lines(found if isinstance(found, str) else "").strip()


def _cut_lines(text: str) -> str:
    """`text` up to its first line that `_STOP_LINE` matches."""
    kept: list[str] = []
    for line in text.split("\n"):
        if _STOP_LINE.match(line):
            break
        kept.append(line.rstrip())
    return "\n".join(kept)


def _unflow(text: str, *, delsp: bool) -> str:
    """A `format=flowed` (RFC 3676) text with its soft line breaks joined."""
    out: list[str] = []
    joining = False
    for line in text.replace("\r\n", "\n").split("\n"):
        flowed = line.endswith(" ") and line != "-- "
        piece = line[:-1] if flowed and delsp else line
        if joining:
            out[-1] += piece
        else:
            out.append(piece)
        joining = flowed
    return "\n".join(out)


# --- command ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Approve:
    """The reviewer approves the call as it is."""

    remember: bool = False
    """`approve and remember`: later identical calls under a rule with `remember:` are
    approved at once as this decision (`bot.remember`)."""
    kind: Literal["approve"] = "approve"


@dataclass(frozen=True)
class Deny:
    """The reviewer denies the call."""

    reason: str | None = None
    """The rest of the `deny` line and the lines below it, or None if there is none."""
    kind: Literal["deny"] = "deny"


@dataclass(frozen=True)
class Respond:
    """The reviewer answers in the tool's place: the tool does not run, and the agent gets
    `text` as the call's result (where the rule allows `respond`)."""

    text: str
    """The rest of the `respond` line and the lines below it (not blank)."""
    kind: Literal["respond"] = "respond"


@dataclass(frozen=True)
class Edit:
    """The reviewer approves the call with some arguments changed."""

    arguments: dict[str, str] = field(default_factory=dict)
    """Argument name -> the value as written (text); the caller types it by the tool's schema
    (`forms.parse_edit`) and validates the whole edit with the tool's model."""
    kind: Literal["edit"] = "edit"


Problem: TypeAlias = Literal[
    "empty",
    "unknown",
    "two_commands",
    "approve_text",
    "edit_line",
    "edit_twice",
    "edit_empty",
    "not_editable",
    "parts_disagree",
    "respond_empty",
    "not_a_choice",
]
"""Why a reply decided nothing (`not_a_choice`: a question's reply, `bot.email.questions`)."""


@dataclass(frozen=True)
class Unclear:
    """A reply that decides nothing; the reviewer is told why and how to answer."""

    problem: Problem
    """What was wrong, for the answer's template and the review's event."""
    reason: str
    """What was wrong and how to reply, in words fit for an answer to the reviewer."""
    not_editable: tuple[str, ...] = ()
    """For an edit: the names it tried to change that the rule does not let be edited."""
    kind: Literal["unclear"] = "unclear"


Command: TypeAlias = Approve | Deny | Edit | Respond
"""A decision a reply asks for."""


_HOW = (
    'Reply with "approve", "deny" (optionally followed by a reason), "edit" followed by '
    '"name: value" lines, or, where the review allows it, "respond" followed by the answer to '
    "give in the tool's place, as the first line above the quoted request."
)
_WORDS = ("approve", "deny", "edit", "respond")
_FREE_TEXT = ("deny", "respond")
"""The words whose text runs on below their line (so a later line may start with a word)."""
_FIRST = re.compile(
    r"^(approve|deny|edit|respond)\b[\s.,:;!\-\u2013\u2014]*(.*)$", re.IGNORECASE | re.DOTALL
)
_PAIR = re.compile(r"^([A-Za-z_][\w.\-]*)\s*[:=]\s*(.*)$")


def command(text: str, *, editable: Sequence[str]) -> Command | Unclear:
    """The decision `text` (a `reply_text`) asks for: its first non-empty line, read
    case-insensitively with trailing punctuation ignored. A reply naming two decisions, an
    unknown word, or an edit of arguments outside `editable` is `Unclear`."""
    lines = [line.strip() for line in text.split("\n")]
    while lines and not lines[0]:
        lines.pop(0)
    if not lines:
        return Unclear("empty", f"The reply had no text above the quoted request. {_HOW}")
    match = _FIRST.match(lines[0])
    if match is None:
        return Unclear(
            "unknown", f"The reply starts with {lines[0][:60]!r}, which is not a decision. {_HOW}"
        )
    word, rest = match.group(1).lower(), match.group(2).strip()
    below = lines[1:]
    others = sorted({other for line in below if (other := _command_word(line, word)) is not None})
    if others:
        return Unclear(
            "two_commands",
            f'The reply names more than one decision ("{word}" and "{others[0]}"); '
            f"send only one. {_HOW}",
        )
    if word == "approve":
        return _approve(rest)
    if word == "deny":
        reason = "\n".join([rest, *below]).strip()
        return Deny(reason or None)
    if word == "respond":
        answer = "\n".join([rest, *below]).strip()
        if not answer:
            return Unclear(
                "respond_empty",
                f'"respond" needs the answer after it (on its line or below). {_HOW}',
            )
        return Respond(answer)
    return _edit([rest, *below] if rest else below, editable)


def reply_command(message: EmailMessage, *, editable: Sequence[str]) -> Command | Unclear:
    """The decision `message` asks for: `command` of its `reply_text`. A message with a text
    part and an HTML part is read in both, and when they ask for different decisions it is
    `Unclear` ("parts_disagree"): which one its reviewer saw depends on their mail client, and
    text hidden in one of them (see `html_text`) must not decide. They agree when they make
    the same decision (approve, approve and remember, deny, or the same edit), a denial's
    reason aside (the two parts wrap and sign it differently), or both respond (the answer
    aside, for the same reason); the text part's is taken."""
    plain = message.get_body(preferencelist=("plain",))
    html = message.get_body(preferencelist=("html",))
    said = command(_part_text(plain if plain is not None else html), editable=editable)
    if plain is None or html is None:
        return said
    shown = command(_part_text(html), editable=editable)
    if _same(said, shown):
        return said
    return Unclear(
        "parts_disagree",
        f"The plain text and the HTML of the reply ask for different decisions "
        f'("{_named(said)}" and "{_named(shown)}"), so which one you saw is not clear. {_HOW}',
    )


def _same(one: Command | Unclear, other: Command | Unclear) -> bool:
    """Whether two readings of one reply make the same decision (see `reply_command`)."""
    if isinstance(one, Unclear) or isinstance(other, Unclear):
        return isinstance(one, Unclear) and isinstance(other, Unclear)
    if isinstance(one, Approve) and isinstance(other, Approve):
        return one.remember == other.remember
    if isinstance(one, Edit) and isinstance(other, Edit):
        return _spaced(one.arguments) == _spaced(other.arguments)
    if isinstance(one, Respond) and isinstance(other, Respond):
        return True
    return isinstance(one, Deny) and isinstance(other, Deny)


def _spaced(arguments: dict[str, str]) -> dict[str, str]:
    return {name: " ".join(value.split()) for name, value in arguments.items()}


def _named(said: Command | Unclear) -> str:
    """A reading as a reviewer would write it (an edit's values cut short)."""
    if isinstance(said, Unclear):
        return "no decision"
    if isinstance(said, Approve):
        return "approve and remember" if said.remember else "approve"
    if isinstance(said, Deny):
        return "deny"
    if isinstance(said, Respond):
        return "respond"
    edits = ", ".join(f"{name}: {value}" for name, value in said.arguments.items())
    return f"edit {edits[:60]}"


def _command_word(line: str, first: str) -> str | None:
    """The decision a later line names: a line that is only a decision word, or (after
    approve or edit, which take no free text) one that starts with one. After deny or
    respond, a line that starts with one is part of their text."""
    words = line.lower().split()
    if not words:
        return None
    head = words[0].rstrip(".,:;!-")
    if head not in _WORDS:
        return None
    if len(words) == 1 or first not in _FREE_TEXT:
        return head
    return None


def _approve(rest: str) -> Approve | Unclear:
    if " ".join(rest.lower().rstrip(".!,; ").split()) == "and remember":
        return Approve(remember=True)
    if rest.rstrip(".!,; "):
        return Unclear(
            "approve_text",
            f'"approve" takes nothing after it on its line but "and remember" (found '
            f"{rest[:60]!r}). {_HOW}",
        )
    return Approve()


def _edit(lines: Sequence[str], editable: Sequence[str]) -> Edit | Unclear:
    """The `name: value` lines after `edit`, up to the first blank line after one of them."""
    arguments: dict[str, str] = {}
    for line in lines:
        if not line:
            if arguments:
                break
            continue
        pair = _PAIR.match(line)
        if pair is None:
            return Unclear(
                "edit_line", f'After "edit", {line[:60]!r} is not a "name: value" line. {_HOW}'
            )
        name, value = pair.group(1), pair.group(2).strip()
        if name in arguments:
            return Unclear(
                "edit_twice", f'The edit sets "{name}" twice; set each argument once. {_HOW}'
            )
        arguments[name] = value
    if not arguments:
        return Unclear(
            "edit_empty", f'"edit" needs at least one "name: value" line below it. {_HOW}'
        )
    refused = tuple(name for name in arguments if name not in editable)
    if refused:
        allowed = ", ".join(editable) or "none"
        return Unclear(
            "not_editable",
            f"These arguments cannot be edited: {', '.join(refused)} (editable: {allowed}). {_HOW}",
            not_editable=refused,
        )
    return Edit(arguments)
