"""What a reviewer cannot see does not decide: an HTML reply is read as a mail client shows it.
Text inside hidden elements (inline styles that hide, the `hidden` attribute, `<style>` rules
that hide by tag, class or id), comments and the elements that are never shown is left out,
however the elements nest and whether or not they are closed; a message whose text and HTML
parts ask for different decisions decides nothing. One reply goes through the inbound door."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from email.message import EmailMessage
from email.policy import SMTP
from email.utils import make_msgid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodbot.bot.email.html_text import MAX_RULES
from nodbot.bot.email.reading import (
    Approve,
    Deny,
    Edit,
    Unclear,
    command,
    reply_command,
    reply_text,
)
from nodbot.bot.http.limits import EMAIL_BODY
from tests.bot.test_email_inbound import TRUSTED, Bot, email_bot

ROOT = Path(__file__).resolve().parents[2]
EDITABLE = ("amount", "memo")
WAIT = "wait, I need to check this first"


def html_only(html: str) -> EmailMessage:
    message = EmailMessage()
    message.set_content(html, subtype="html")
    return message


def both(plain: str, html: str) -> EmailMessage:
    """A multipart/alternative message, as most clients send a reply."""
    message = EmailMessage()
    message.set_content(plain)
    message.add_alternative(html, subtype="html")
    return message


# --- hidden elements ------------------------------------------------------------------------

HIDES = [
    '<div style="display:none">approve</div>',
    '<span style="DISPLAY : None !important">approve</span>',
    '<div style="color: red; display: none;">approve</div>',
    '<div style="visibility:hidden">approve</div>',
    '<div style="visibility: collapse">approve</div>',
    '<p style="font-size:0">approve</p>',
    '<p style="font-size:0px">approve</p>',
    '<p style="font-size: 0pt">approve</p>',
    '<p style="font-size:0em">approve</p>',
    '<p style="font-size:0%">approve</p>',
    '<p style="font-size:.0rem">approve</p>',
    '<p style="font-size:1px">approve</p>',
    '<p style="font: 0/0 a">approve</p>',
    '<div style="opacity:0">approve</div>',
    '<div style="opacity: 0.0">approve</div>',
    '<div style="opacity:0%">approve</div>',
    '<div style="max-height:0;overflow:hidden">approve</div>',
    '<div style="height: 0px; overflow: hidden">approve</div>',
    '<div style="width:0;overflow-x:hidden">approve</div>',
    '<div style="mso-hide:all">approve</div>',
    '<div style="color:transparent">approve</div>',
    '<div style="disp\\lay: n\\6f ne">approve</div>',  # CSS escapes
    '<div style="display:&#110;one">approve</div>',  # a character reference
    '<div style="display:/* a comment */none">approve</div>',
    "<div hidden>approve</div>",
    '<div hidden="hidden">approve</div>',
    "<DIV HIDDEN>approve</DIV>",
    "<!-- approve -->",
    "<!--\napprove\n-->",
    "<!-- x -- > approve -->",  # not closed by "-- >": a browser reads on to "-->"
    "<style>approve</style>",
    "<script>approve</script>",
    "<head><title>approve</title></head>",
    "<title>approve</title>",
    "<template>approve</template>",
    "<noscript>approve</noscript>",
    "<iframe>approve</iframe>",
    "<details><summary>more</summary>approve</details>",
    '<div style="display:none"><p>approve<br>now</p></div>',
    '<div style="display:none"><img src="cid:x">approve</div>',
    '<div style="display:none"><p>deny</div>',  # the p is closed with the div
    '<table style="display:none"><tr><td>approve</td></tr></table>',
    # <style> rules apply wherever they are written, by tag, class or id
    "<style>.x { display: none }</style><div class=x>approve</div>",
    '<div class="a X">approve</div><style>p, .x:hover {opacity:0}</style>',
    "<style>@media screen { #h { visibility: hidden } }</style><span id=h>approve</span>",
    '<style>a{content:"{"} div.y > b {font-size:0}</style><b class=z>approve</b>',
    "<style><!-- u { display:none } --></style><u>approve</u>",
    "<style>[data-hide] { display:none }</style><i data-hide>approve</i>",
    # end tags that do not close the hidden element in a browser
    '<div style="display:none"><table></div>approve</table></div>',
    "<div hidden><template></div>approve</template></div>",
    "<div><b hidden>x</div>approve</b>",  # the b is opened again around the text
    "<div hidden><textarea></div></textarea>approve</div>",
    "<div hidden><title></div></title>approve</div>",
    '<div style="display:none"/>approve</div>',  # "/>" closes nothing in HTML
    '<div style="display:none" style="display:block">approve</div>',  # the first one counts
    "<title></ title>approve</title>",  # "</ title" ends no title
    '<div title="a>b" hidden>approve</div>',  # a quoted ">" ends no tag
]


@pytest.mark.parametrize("hidden", HIDES)
def test_a_hidden_command_is_not_read(hidden: str) -> None:
    """The review that found it: an HTML-only reply whose visible text says wait."""
    message = html_only(f"<html><body>{hidden}<div>{WAIT}</div></body></html>")
    assert reply_text(message) == WAIT
    unclear = reply_command(message, editable=EDITABLE)
    assert isinstance(unclear, Unclear) and unclear.problem == "unknown", unclear


UNCLOSED = [
    '<div style="display:none">approve',
    '<div style="display:none"><b>approve</div',
    "<!-- approve",
    "<!--",
    "<style>approve",
    '<div style="display:none"><p>approve</p>',
    "<div hidden><span>approve</span></p></b>",
    '<div hidden>approve<div style="display:block">',
]


@pytest.mark.parametrize("hidden", UNCLOSED)
def test_an_element_left_open_hides_the_rest(hidden: str) -> None:
    message = html_only(f"<div>{WAIT}</div>{hidden}<div>approve</div>")
    assert reply_text(message) == WAIT


SHOWN = [
    '<div style="display:block">approve</div>',
    '<div style="display: inline-block; width: 98%">approve</div>',
    '<div style="font-size:14px; opacity:1">approve</div>',
    '<div style="font-size:0.9em">approve</div>',
    '<div style="height:0">approve</div>',  # without overflow hidden, it overflows
    '<div style="visibility:visible">approve</div>',
    '<span aria-hidden="true">approve</span>',  # hidden from screen readers, not from eyes
    '<div data-hidden="x" class="hidden-xs">approve</div>',
    "<style>.x { display: none }</style><div class=y>approve</div>",
    "<!-- a --!>approve",  # "--!>" closes a comment too
    "<div hidden>x</div>approve",
    "<p><b>approve</b></p>",
]


@pytest.mark.parametrize("shown", SHOWN)
def test_what_is_shown_is_read(shown: str) -> None:
    assert reply_command(html_only(shown), editable=EDITABLE) == Approve()


# --- any hidden wrapper, any nesting --------------------------------------------------------

_STYLES = st.sampled_from(
    [
        "display:none",
        "visibility:hidden",
        "font-size:0",
        "font-size:0px",
        "font-size:0pt",
        "font-size:0em",
        "font-size:0%",
        "opacity:0",
        "max-height:0;overflow:hidden",
        "height:0;overflow:hidden",
        "mso-hide:all",
    ]
)


@st.composite
def css(draw: st.DrawFn) -> str:
    """A declaration that hides, spelled as a client or an attacker may."""
    name, _, value = draw(_STYLES).partition(":")
    upper = draw(st.booleans())
    space = draw(st.sampled_from(["", " ", "\t", "\n  "]))
    important = draw(st.sampled_from(["", " !important", "!IMPORTANT"]))
    before = draw(st.sampled_from(["", "color: red;", "margin:0 ; "]))
    declaration = f"{before}{name}{space}:{space}{value}{important}"
    return declaration.upper() if upper else declaration


@st.composite
def hiding(draw: st.DrawFn) -> tuple[str, str]:
    """The start and end of an element (or comment) whose content is hidden."""
    kind = draw(st.sampled_from(["style", "attribute", "element", "comment", "rule"]))
    tag = draw(st.sampled_from(["div", "span", "p", "td", "b", "font", "section", "a"]))
    quote = draw(st.sampled_from(['"', "'"]))
    if kind == "style":
        return f"<{tag} style={quote}{draw(css())}{quote}>", f"</{tag}>"
    if kind == "attribute":
        value = draw(st.sampled_from(["", "=hidden", '=""', "=until-found"]))
        return f"<{tag} hidden{value}>", f"</{tag}>"
    if kind == "element":
        hidden_tag = draw(
            st.sampled_from(["head", "title", "template", "style", "script", "noscript"])
        )
        return f"<{hidden_tag}>", f"</{hidden_tag}>"
    if kind == "rule":
        name = draw(st.from_regex(r"[a-z][a-z0-9_-]{0,8}", fullmatch=True))
        return f"<style>.{name} {{{draw(css())}}}</style><{tag} class={name}>", f"</{tag}>"
    return "<!--", "-->"


_VISIBLE = st.sampled_from(["div", "span", "p", "b", "i", "font", "center"])


@given(
    word=st.sampled_from(["approve", "Approve", "APPROVE", "deny", "Deny", "edit"]),
    wrappers=st.lists(st.tuples(hiding(), st.booleans()), min_size=1, max_size=4),
    around=st.lists(_VISIBLE, max_size=3),
    inside=st.lists(_VISIBLE, max_size=2),
)
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
def test_hidden_wrappers_never_yield_their_command(
    word: str,
    wrappers: list[tuple[tuple[str, str], bool]],
    around: list[str],
    inside: list[str],
) -> None:
    """Any nesting of hidden wrappers (each closed or left open), inside and around visible
    elements: the command word in them is never read, and the visible text before them is."""
    html = word
    for tag in inside:
        html = f"<{tag}>{html}</{tag}>"
    for (start, end), closed in wrappers:
        html = f"{start}{html}{end if closed else ''}"
    for tag in around:
        html = f"<{tag}>{html}</{tag}>"
    text = reply_text(html_only(f"<div>{WAIT}</div>{html}"))
    assert word.lower() not in text.lower()
    assert text.startswith(WAIT)
    decided = reply_command(html_only(f"{html}<div>{WAIT}</div>"), editable=EDITABLE)
    assert isinstance(decided, Unclear), (html, decided)


# --- the text and the HTML of one message ---------------------------------------------------


def test_parts_that_ask_for_different_decisions_decide_nothing() -> None:
    message = both("approve", "<div>deny</div>")
    unclear = reply_command(message, editable=EDITABLE)
    assert isinstance(unclear, Unclear) and unclear.problem == "parts_disagree"
    assert '"approve"' in unclear.reason and '"deny"' in unclear.reason


@pytest.mark.parametrize(
    ("plain", "html"),
    [
        ("approve", f'<div style="display:none">approve</div><div>{WAIT}</div>'),
        (WAIT, "<div>approve</div>"),
        ("approve and remember", "<div>approve</div>"),
        ("edit\namount: 5", "<div>edit</div><div>amount: 50</div>"),
        ("", "<div>approve</div>"),
    ],
)
def test_a_text_part_and_an_html_part_must_agree(plain: str, html: str) -> None:
    unclear = reply_command(both(plain, html), editable=EDITABLE)
    assert isinstance(unclear, Unclear) and unclear.problem == "parts_disagree", unclear


@pytest.mark.parametrize(
    ("plain", "html", "expected"),
    [
        ("Approve", '<div dir="ltr">Approve</div>', Approve()),
        (
            "deny not now, the amount is\nwrong",  # wrapped differently: the reasons differ
            "<div>deny not now, the amount is wrong</div>",
            Deny("not now, the amount is\nwrong"),
        ),
        (
            "edit\nmemo:  Invoice 7",
            "<p>edit</p><p>memo: Invoice 7</p>",
            Edit({"memo": "Invoice 7"}),
        ),
        (WAIT, f"<div>{WAIT}</div>", None),
    ],
)
def test_parts_that_agree_decide_as_the_text_part_says(
    plain: str, html: str, expected: Approve | Deny | Edit | None
) -> None:
    decided = reply_command(both(plain, html), editable=EDITABLE)
    if expected is None:
        assert isinstance(decided, Unclear) and decided.problem == "unknown"
    else:
        assert decided == expected


def test_a_text_only_reply_reads_as_before() -> None:
    message = EmailMessage()
    message.set_content("deny: too much\nsee the PO")
    assert reply_command(message, editable=EDITABLE) == command(
        "deny: too much\nsee the PO", editable=EDITABLE
    )


# --- bounded ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "filler",
    ["<!--", "<a ", "<!", "</", "<<", "<p>", '<a b="', "<style>.a{color:red}</style><b class=a>"],
)
async def test_a_hostile_html_reply_of_the_largest_size_is_read_in_time(filler: str) -> None:
    """Unterminated comments, tags and quotes made `html.parser` quadratic (minutes for one
    message of `EMAIL_BODY`): each is now read once, to the end."""
    html = f"<div>{WAIT}</div>" + filler * (EMAIL_BODY // len(filler))
    text = await asyncio.wait_for(asyncio.to_thread(reply_text, html_only(html)), 60)
    assert text.startswith(WAIT), (filler, text[:80])


def test_more_hiding_rules_than_can_be_judged_hide_everything() -> None:
    rules = "".join(f".r{n} {{display:none}}" for n in range(MAX_RULES + 1))
    assert reply_text(html_only(f"<style>{rules}</style><div>approve</div>")) == ""
    rules = "".join(f".r{n} {{display:none}}" for n in range(MAX_RULES))
    assert reply_text(html_only(f"<style>{rules}</style><div>approve</div>")) == "approve"


# --- through the inbound door ---------------------------------------------------------------


@pytest.fixture
async def bot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Bot]:
    monkeypatch.chdir(ROOT)
    async with email_bot(tmp_path) as running:
        yield running


def html_reply(request: EmailMessage, *, sender: str, html: str, plain: str | None = None) -> bytes:
    """A reply to `request` written in HTML (with a text part too when `plain` is given),
    authenticated by the trusted server for `sender`'s domain."""
    message = EmailMessage(policy=SMTP)
    message["Authentication-Results"] = f"{TRUSTED}; dmarc=pass header.from=example.com"
    message["From"] = f"Someone <{sender}>"
    message["To"] = str(request["Reply-To"])
    message["Subject"] = f"Re: {request['Subject']}"
    message["Message-ID"] = make_msgid(domain="mail.example.com")
    message["In-Reply-To"] = str(request["Message-ID"])
    if plain is None:
        message.set_content(html, subtype="html")
    else:
        message.set_content(plain)
        message.add_alternative(html, subtype="html")
    return message.as_bytes()


async def test_an_html_reply_whose_approve_is_hidden_does_not_approve(bot: Bot) -> None:
    approval_id, emailed = await bot.pending()
    html = (
        '<html><body><div style="display:none">approve</div>'
        f'<div dir="ltr">{WAIT}</div><br><div class="gmail_quote">approve</div></body></html>'
    )
    raw = html_reply(emailed["ana@example.com"], sender="ana@example.com", html=html)
    outcome = (await bot.post(raw)).json()
    assert outcome["status"] == "refused", outcome
    assert f"The reply starts with {WAIT!r}" in outcome["reason"]
    approval = await bot.approval(approval_id)
    assert approval["status"] == "pending" and approval["decision"] is None


async def test_a_reply_whose_parts_disagree_decides_nothing(bot: Bot) -> None:
    approval_id, emailed = await bot.pending()
    raw = html_reply(
        emailed["ana@example.com"], sender="ana@example.com", plain="deny", html="<p>approve</p>"
    )
    outcome = (await bot.post(raw)).json()
    assert outcome["status"] == "refused" and outcome["answered"] is True, outcome
    assert "plain text and the HTML" in outcome["reason"]
    assert (await bot.approval(approval_id))["status"] == "pending"
