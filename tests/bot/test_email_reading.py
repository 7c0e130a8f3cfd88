"""Reading reply emails: every file of the hand-written corpus in `email_corpus/` goes through
`screen`, `sender` and `reply_command` as the inbound door runs them, and ends in
exactly the decision its reviewer wrote, or in a refusal whose reason says why."""

from __future__ import annotations

import email
import email.policy
from email.message import EmailMessage
from pathlib import Path

import pytest

from nodbot.bot.email.reading import (
    MARKER,
    Approve,
    Deny,
    Edit,
    Refused,
    Sender,
    Unclear,
    command,
    reply_command,
    reply_text,
    screen,
    sender,
)

CORPUS = Path(__file__).parent / "email_corpus"
TRUSTED = "mx.nodbot.example.org"
EDITABLE = ("amount", "memo")
REVIEWER = "alice@example.com"

Outcome = Approve | Deny | Edit | tuple[str, str]
"""A decision, or (stage, words the reason contains) with stage screened/refused/unclear."""

EXPECTED: dict[str, Outcome] = {
    "gmail_web.eml": Approve(),
    "gmail_wrapped_header.eml": Deny("the invoice was already paid in November"),
    "gmail_android.eml": Edit({"amount": "1150", "memo": "Invoice 2026-114 (discounted)"}),
    "outlook_desktop.eml": Deny(
        "Please route this through the supplier portal instead.\n\nAlice Martin\nFinance"
    ),
    "outlook_web.eml": Approve(),
    "apple_mail.eml": Deny(
        "we are in the year-end freeze until the 5th, please resubmit after that."
    ),
    "iphone.eml": Approve(),
    "thunderbird.eml": Edit({"memo": "Invoice 2026-114, paid early"}),
    "html_only.eml": Deny("the amount does not match the PO (1\u202f150).\n\nAlice"),
    "top_posted_whole_request.eml": Approve(),
    "forwarded.eml": ("unclear", "unknown: The reply starts with"),
    "out_of_office.eml": ("screened", "Auto-Submitted: auto-replied"),
    "out_of_office_subject_only.eml": ("screened", "Abwesenheitsnotiz"),
    "bounce_dsn.eml": ("screened", "Return-Path is empty"),
    "forged_dmarc_fail.eml": ("refused", "dmarc=fail"),
    "display_name_spoof.eml": ("refused", "alice.martin.finance@mail.example.net"),
    "two_from_addresses.eml": ("refused", "names 2 addresses"),
    "untrusted_authserv.eml": ("refused", "did not authenticate example.com"),
    "approve_and_deny.eml": ("unclear", "two_commands: The reply names more than one decision"),
    "edit_not_editable.eml": (
        "unclear",
        "not_editable: These arguments cannot be edited: recipient",
    ),
    "approve_only_in_quote.eml": ("unclear", "empty: The reply had no text above the quoted"),
}


def read(name: str) -> EmailMessage:
    message = email.message_from_bytes((CORPUS / name).read_bytes(), policy=email.policy.default)
    assert isinstance(message, EmailMessage)
    return message


def outcome(message: EmailMessage) -> Outcome:
    """What the inbound door makes of `message`, the token's reviewer being `REVIEWER` (the
    comparison with the token is the door's; it is modelled here so a spoof shows as one)."""
    dropped = screen(message)
    if dropped is not None:
        return ("screened", dropped)
    who = sender(message, trusted_authserv_id=TRUSTED, require_authenticated=True)
    if isinstance(who, Refused):
        return ("refused", who.reason)
    if who.address != REVIEWER:
        return ("refused", f"{who.address} is not the reviewer")
    decided = reply_command(message, editable=EDITABLE)
    if isinstance(decided, Unclear):
        return ("unclear", f"{decided.problem}: {decided.reason}")
    return decided


def test_the_table_covers_the_corpus() -> None:
    assert sorted(EXPECTED) == sorted(path.name for path in CORPUS.glob("*.eml"))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_corpus(name: str) -> None:
    got = outcome(read(name))
    expected = EXPECTED[name]
    if isinstance(expected, tuple):
        assert isinstance(got, tuple), got
        assert got[0] == expected[0], got
        assert expected[1] in got[1], got
    else:
        assert got == expected


def test_the_display_name_is_ignored() -> None:
    who = sender(
        read("display_name_spoof.eml"), trusted_authserv_id=TRUSTED, require_authenticated=True
    )
    assert who == Sender("alice.martin.finance@mail.example.net")


def test_without_authentication_only_the_from_address_counts() -> None:
    who = sender(
        read("forged_dmarc_fail.eml"), trusted_authserv_id=None, require_authenticated=False
    )
    assert who == Sender(REVIEWER)


def test_dkim_aligned_with_the_from_domain_is_enough() -> None:
    message = read("iphone.eml")
    del message["Authentication-Results"]
    message["Authentication-Results"] = (
        f"{TRUSTED} (a comment; with a semicolon); dkim=pass (2048-bit key) "
        'header.i="@mail.example.com" header.s=s1; dmarc=none'
    )
    assert sender(message, trusted_authserv_id=TRUSTED, require_authenticated=True) == Sender(
        REVIEWER
    )


def test_dkim_of_another_domain_is_not() -> None:
    message = read("iphone.eml")
    del message["Authentication-Results"]
    message["Authentication-Results"] = f"{TRUSTED}; dkim=pass header.d=example.com.evil"
    assert isinstance(
        sender(message, trusted_authserv_id=TRUSTED, require_authenticated=True), Refused
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("APPROVE.", Approve()),
        ("  \n Deny!", Deny(None)),
        ("deny: too much\nsee the PO", Deny("too much\nsee the PO")),
        ("deny\nI do not approve of this", Deny("I do not approve of this")),
        ("edit amount: 5", Edit({"amount": "5"})),
        ("edit\namount: 5\n\nThanks, Alice", Edit({"amount": "5"})),
    ],
)
def test_commands(text: str, expected: Approve | Deny | Edit) -> None:
    assert command(text, editable=EDITABLE) == expected


@pytest.mark.parametrize(
    ("text", "problem", "words"),
    [
        ("approved", "unknown", "not a decision"),
        ("approve, thanks", "approve_text", "takes nothing after it"),
        ("deny\napprove", "two_commands", "more than one decision"),
        ("edit\namount: 5\ndeny", "two_commands", "more than one decision"),
        ("edit\namount 5", "edit_line", 'not a "name: value" line'),
        ("edit\namount: 5\namount: 6", "edit_twice", "twice"),
        ("edit", "edit_empty", "at least one"),
    ],
)
def test_unclear_commands(text: str, problem: str, words: str) -> None:
    unclear = command(text, editable=EDITABLE)
    assert isinstance(unclear, Unclear)
    assert unclear.problem == problem
    assert words in unclear.reason
    assert "Reply with" in unclear.reason


def test_the_marker_cuts_even_when_quoted() -> None:
    message = read("iphone.eml")
    assert MARKER in message.get_body(preferencelist=("plain",)).get_content()  # type: ignore[union-attr]
    assert reply_text(message) == "Approve"


def test_the_html_part_alone_reads_the_same() -> None:
    """Gmail's HTML alternative, as an HTML-only client would send it: the gmail_quote is cut."""
    message = read("gmail_web.eml")
    html = message.get_body(preferencelist=("html",))
    assert html is not None
    alone = EmailMessage()
    alone.set_content(html.get_content(), subtype="html")
    assert reply_text(alone) == "Approve"


def test_not_editable_names_are_listed() -> None:
    unclear = command("edit\nrecipient: x\namount: 1", editable=EDITABLE)
    assert isinstance(unclear, Unclear)
    assert unclear.not_editable == ("recipient",)


@pytest.mark.parametrize(
    ("name", "remove", "words"),
    [
        ("bounce_dsn.eml", ["Return-Path"], "multipart/report; report-type=delivery-status"),
        ("bounce_dsn.eml", ["Return-Path", "Content-Type"], "Auto-Submitted: auto-replied"),
        (
            "bounce_dsn.eml",
            ["Return-Path", "Content-Type", "Auto-Submitted"],
            "from a mail daemon",
        ),
        ("out_of_office.eml", ["Auto-Submitted"], "subject 'Automatic reply"),
    ],
)
def test_each_sign_of_an_automatic_message_is_enough(
    name: str, remove: list[str], words: str
) -> None:
    message = read(name)
    for header in remove:
        del message[header]
    reason = screen(message)
    assert reason is not None and words in reason


@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("Auto-Submitted", "auto-generated"),
        ("X-Autoreply", "yes"),
        ("X-Autorespond", "Vacation"),
        ("Precedence", "bulk"),
        ("Precedence", "auto_reply"),
        ("Subject", "Réponse automatique : Review: send_payment"),
        ("Subject", "Out of Office: Review: send_payment"),
    ],
)
def test_automatic_headers_and_subjects(header: str, value: str) -> None:
    message = read("iphone.eml")
    del message[header]
    message[header] = value
    assert screen(message) is not None


def test_a_genuine_reply_passes_the_screen() -> None:
    message = read("iphone.eml")
    message["Auto-Submitted"] = "no"
    assert screen(message) is None


def test_two_from_headers_are_refused() -> None:
    raw = (CORPUS / "iphone.eml").read_bytes()
    message = email.message_from_bytes(
        b"From: Mallory <mallory@attacker.example>\n" + raw, policy=email.policy.default
    )
    assert isinstance(message, EmailMessage)
    refused = sender(message, trusted_authserv_id=TRUSTED, require_authenticated=False)
    assert refused == Refused("the message has 2 From headers; exactly one is needed")


@pytest.mark.parametrize(
    "value",
    [
        "Alice <alice@example.com",
        "undisclosed-recipients:;",
        "Team: alice@example.com;",
        "alice",
        "<@example.com>",
    ],
)
def test_a_from_that_does_not_parse_cleanly_is_refused(value: str) -> None:
    raw = (
        (CORPUS / "iphone.eml")
        .read_bytes()
        .replace(b"From: Alice Martin <alice@example.com>", b"From: " + value.encode())
    )
    message = email.message_from_bytes(raw, policy=email.policy.default)
    assert isinstance(message, EmailMessage)
    got = sender(message, trusted_authserv_id=TRUSTED, require_authenticated=False)
    assert isinstance(got, Refused), got


def test_the_domain_is_lowercased_and_the_local_part_kept() -> None:
    message = read("iphone.eml")
    del message["From"]
    message["From"] = "Alice <Alice.M@Example.COM>"
    got = sender(message, trusted_authserv_id=None, require_authenticated=False)
    assert got == Sender("Alice.M@example.com")


def test_a_long_hostile_reply_is_read_in_a_bounded_prefix() -> None:
    """The quote detector is quadratic on long lines; only the top of a reply reaches it."""
    message = EmailMessage()
    message.set_content("deny\n" + "On x wrote " * 20_000)
    got = command(reply_text(message), editable=EDITABLE)
    assert isinstance(got, Deny) and got.reason is not None and len(got.reason) < 3_000
