"""The Slack messages and modals of a review, rendered from `templates/slack/`.

Everything a model or a person wrote (arguments, the rule's description, who asked, the
reason) is escaped here before it reaches a template (`bot/slack/text.py`), and cut to Block
Kit's limits: 50 blocks a message, 3,000 characters a section, 2,000 a field, 150 a header,
24 a modal title. Arguments that do not fit whole are shown cut, and the channel posts them
in full in the message's thread (`full_arguments`).

With `web.public_url` set, every message links to the review's page in the web inbox
(`inbox_page`: `<public_url>/inbox/approvals/<id>`, which asks to sign in): the request has an
"Open in inbox" link button beside its decisions (`ACTION_OPEN`: Slack opens the address and
tells the app of the click, which is only acknowledged), the decided message a link in its
footer, a reminder a link in its text. Without it there is no link: Slack has no relative
addresses.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import quote

import jinja2

from nodbot.bot.forms import EditField
from nodbot.bot.policy.remember import scope_of
from nodbot.bot.slack.text import clip, code, escape, plain, shown_value
from nodbot.core import ApprovalRecord, Decision
from nodbot.core.decisions import MAX_RESPONSE

__all__ = [
    "ACTION_APPROVE",
    "ACTION_APPROVE_REMEMBER",
    "ACTION_DENY",
    "ACTION_EDIT",
    "ACTION_OPEN",
    "ACTION_RESPOND",
    "DENY_CALLBACK",
    "EDIT_CALLBACK",
    "RESPOND_CALLBACK",
    "Rendered",
    "answer_text",
    "decided_message",
    "decided_verb",
    "deny_modal",
    "edit_modal",
    "for_how_long",
    "full_arguments",
    "inbox_page",
    "link",
    "remember_confirm",
    "request_message",
    "respond_modal",
    "when",
    "who",
]

ACTION_APPROVE = "nodbot.approve"
ACTION_APPROVE_REMEMBER = "nodbot.approve_remember"
ACTION_EDIT = "nodbot.edit"
ACTION_DENY = "nodbot.deny"
ACTION_RESPOND = "nodbot.respond"
"""The "Respond" button, where the rule allows a respond: it opens the respond modal."""
ACTION_OPEN = "nodbot.open"
"""The "Open in inbox" link button: Slack opens its address; the click is only acknowledged."""
EDIT_CALLBACK = "nodbot.edit"
DENY_CALLBACK = "nodbot.deny"
RESPOND_CALLBACK = "nodbot.respond"

MAX_BLOCKS = 50
SECTION = 3000
INPUT_TEXT = 3000
"""The most characters a modal's text input holds (its `initial_value` too)."""
OPTIONS = 100
"""The most options of a select."""
BLOCK_ID = 255
MAX_INPUTS = 90
"""The most inputs of the Edit modal (a modal holds 100 blocks; the summary and a note)."""
FIELD = 2000
HEADER = 150
CONFIRM = 300
"""The most characters of a confirm dialog's text."""
TEXT = 40_000
THREAD_TEXT = 38_000
"""The full arguments in a thread reply: within `text`'s 40,000 with room to spare."""
_ARGUMENT_BLOCKS = MAX_BLOCKS - 6  # header, description, facts, note, actions, and one spare
_SLACK_ID = re.compile(r"[UW][A-Z0-9]{8,}")

_templates = jinja2.Environment(
    loader=jinja2.PackageLoader("nodbot", "templates/slack"),  # package data of `nodbot`
    autoescape=False,  # JSON, not HTML: values are escaped for Slack, then made JSON by tojson
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=False,
)


@dataclass(frozen=True)
class Rendered:
    """A message: its fallback `text` (notifications, screen readers) and its blocks."""

    text: str
    blocks: list[dict[str, Any]]
    cut: bool = False
    """Whether arguments were cut or left out: the full ones belong in the thread."""


def _render(name: str, **context: Any) -> Any:
    return json.loads(_templates.get_template(name).render(**context))


def who(principal: str | None) -> str:
    """A person as Slack shows them: a mention for a Slack user id (made here, from an id
    that can only be an id), the escaped text otherwise."""
    if principal is None:
        return "someone"
    if _SLACK_ID.fullmatch(principal):
        return f"<@{principal}>"
    return escape(principal)


def inbox_page(public_url: str | None, approval_id: str) -> str | None:
    """The address of the review's page in the web inbox, under `web.public_url`; None
    without one (Slack has no relative links)."""
    if public_url is None:
        return None
    return f"{public_url.rstrip('/')}/inbox/approvals/{quote(approval_id, safe='')}"


def decided_verb(decision: Decision) -> str:
    """What a decided review became, as every chat's message says it (Slack, Teams,
    Discord): Answered, Denied, Edited and approved, Approved."""
    if decision.response is not None:
        return "Answered"
    if not decision.approved:
        return "Denied"
    return "Edited and approved" if decision.edited_args else "Approved"


def link(url: str, label: str) -> str:
    """A mrkdwn link to one of the bot's own addresses (`label` is the bot's text)."""
    return f"<{escape(url).replace('|', '%7C')}|{label}>"


def when(moment: datetime) -> str:
    """A time each reader sees in their own zone, with a fallback in UTC."""
    fallback = moment.strftime("%Y-%m-%d %H:%M UTC")
    return f"<!date^{int(moment.timestamp())}^{{date_short_pretty}} {{time}}|{fallback}>"


_UNITS = (("day", 86_400), ("hour", 3_600), ("minute", 60), ("second", 1))


def for_how_long(seconds: int) -> str:
    """A duration in words: `1 day`, `1 hour 30 minutes`."""
    parts = []
    for name, size in _UNITS:
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count} {name}{'' if count == 1 else 's'}")
    return " ".join(parts) or "0 seconds"


def _names(names: Sequence[str]) -> str:
    """Argument names as code, joined: `to`, `to` and `cc`, `a`, `b` and `c`."""
    # A backtick in a name would end its code span early.
    shown = ["`" + escape(clip(name, 100)).replace("`", "'") + "`" for name in names]
    if len(shown) <= 1:
        return "".join(shown)
    return ", ".join(shown[:-1]) + " and " + shown[-1]


def remember_confirm(record: ApprovalRecord) -> str | None:
    """What "Approve & remember" asks to confirm: for how long, and for which arguments;
    None when the review's rule remembers nothing (no button then)."""
    request = record.request
    seconds = request.policy.get("remember")
    if scope_of(request) is None or not isinstance(seconds, int) or isinstance(seconds, bool):
        return None
    names = request.policy.get("remember_by")
    if not isinstance(names, list):
        which = "the same arguments"
    elif names:
        which = f"the same {_names([str(name) for name in names])}"
    else:  # remember_by: [] covers every call of the tool
        which = "any arguments"
    return (
        f"Approve this call, and for the next {for_how_long(seconds)} approve at once, as "
        f"your decision, every call of *{escape(request.tool)}* with {which}."
    )


def _arguments(record: ApprovalRecord) -> tuple[list[str], bool]:
    """One section text per argument, and whether any was cut or left out."""
    shown: list[str] = []
    cut = False
    items = list(record.request.arguments.items())
    for name, value in items[:_ARGUMENT_BLOCKS]:
        label = f"*{escape(clip(name, 200))}*\n"
        text = shown_value(value)
        block = label + code(text, SECTION - len(label))
        cut = cut or len(block) >= SECTION - 1 or "characters in all" in block
        shown.append(block)
    if len(items) > _ARGUMENT_BLOCKS:
        cut = True
    return shown, cut


def _facts(record: ApprovalRecord) -> list[str]:
    request = record.request
    facts = [
        f"*Asked by*\n{who(request.requested_by)}",
        f"*Run*\n`{escape(clip(request.run_id, 200))}`",
    ]
    if request.deadline is not None:
        facts.append(f"*Decide by*\n{when(request.deadline)} (then: {request.on_timeout})")
    if request.approvals_required > 1:
        facts.append(f"*Approvals needed*\n{request.approvals_required}")
    return [clip(fact, FIELD) for fact in facts]


def request_message(
    record: ApprovalRecord,
    *,
    destructive: bool,
    can_edit: bool,
    allowed: Sequence[str],
    page: str | None = None,
) -> Rendered:
    """The review request: the tool, the rule's description, the arguments, who asked, the
    run, the deadline, and the buttons the rule allows (Approve asks to confirm when the tool
    is destructive; "Approve & remember", when the rule remembers, says for how long and for
    which arguments; Respond, where the rule lists `respond`, opens a modal for the answer
    the agent gets in the tool's place), then "Open in inbox" when `page` (`inbox_page`) is
    given."""
    request = record.request
    tool = escape(request.tool)
    description = request.policy.get("description")
    arguments, cut = _arguments(record)
    buttons: list[dict[str, Any]] = []
    if "approve" in allowed:
        confirm = f"*{tool}* changes things that may not be undone." if destructive else None
        buttons.append(
            {
                "action_id": ACTION_APPROVE,
                "label": "Approve",
                "style": "primary",
                "confirm": confirm,
            }
        )
        remember = remember_confirm(record)
        if remember is not None:
            text = f"{confirm} {remember}" if confirm else remember
            buttons.append(
                {
                    "action_id": ACTION_APPROVE_REMEMBER,
                    "label": "Approve & remember",
                    "style": "primary",
                    "confirm": clip(text, CONFIRM),
                }
            )
    if "edit" in allowed and can_edit:
        buttons.append({"action_id": ACTION_EDIT, "label": "Edit", "style": None, "confirm": None})
    if "deny" in allowed:
        buttons.append(
            {"action_id": ACTION_DENY, "label": "Deny", "style": "danger", "confirm": None}
        )
    if "respond" in allowed:
        buttons.append(
            {"action_id": ACTION_RESPOND, "label": "Respond", "style": None, "confirm": None}
        )
    note = "Some arguments are long: they are in full in this message's thread." if cut else None
    blocks = _render(
        "request.json.j2",
        header=plain(f"Review: {request.tool}", HEADER),
        description=clip(escape(description), SECTION) if isinstance(description, str) else None,
        facts=_facts(record),
        arguments=arguments,
        note=note,
        buttons=buttons,
        approval_id=record.approval_id,
        page=page,
        open_action=ACTION_OPEN,
    )
    text = clip(f"Review needed: {tool} (run {escape(request.run_id)})", TEXT)
    return Rendered(text, blocks, cut)


def decided_message(
    record: ApprovalRecord, *, remembered_until: datetime | None = None, page: str | None = None
) -> Rendered:
    """The request after its decision: the outcome, who decided and when (and until when the
    approval is remembered), the edited arguments or a respond's answer, no buttons, and a
    link to `page` (`inbox_page`) in the footer when it is given. A respond is "Answered"
    (the tool did not run; the agent got the answer)."""
    decision = record.decision
    request = record.request
    tool = escape(request.tool)
    arguments, _ = _arguments(record)
    if decision is None:
        raise ValueError(f"approval {record.approval_id} is not decided")
    verb = decided_verb(decision)
    moment = when(record.decided_at) if record.decided_at is not None else "just now"
    outcome = f"*{verb}* by {who(decision.decided_by)}, {moment}"
    if remembered_until is not None:
        outcome += (
            f"\nRemembered until {when(remembered_until)}: the calls it covers are approved "
            "at once until then."
        )
    if decision.reason:
        outcome += "\n" + code(decision.reason, SECTION - len(outcome) - 1)
    if decision.response is not None:
        label = "\n*Answer given to the agent in the tool's place*\n"
        room = max(SECTION - len(outcome) - len(label), 100)  # clipped below if over
        outcome += label + code(decision.response, room)
    edited = None
    if decision.edited_args:
        label = "*Edited arguments*\n"
        edited = label + code(
            json.dumps(decision.edited_args, ensure_ascii=False, sort_keys=True),
            SECTION - len(label),
        )
    blocks = _render(
        "decided.json.j2",
        header=plain(f"{verb}: {request.tool}", HEADER),
        outcome=clip(outcome, SECTION),
        edited=edited,
        facts=_facts(record),
        arguments=arguments,
        footer=f"Approval `{escape(record.approval_id)}`"
        + (f" · {link(page, 'Open in inbox')}" if page is not None else ""),
    )
    text = clip(f"{verb}: {tool} (run {escape(request.run_id)})", TEXT)
    return Rendered(text, blocks)


def full_arguments(record: ApprovalRecord) -> str:
    """The whole arguments as JSON, for the thread reply under a request that cut them."""
    text = json.dumps(record.request.arguments, ensure_ascii=False, indent=2, sort_keys=True)
    return "Full arguments:\n" + code(text, THREAD_TEXT)


def answer_text(final_text: str) -> str:
    """The run's final answer, for the thread of its review's messages (the model wrote it:
    escaped like the arguments)."""
    return "The run finished. Its answer:\n" + code(final_text, THREAD_TEXT)


def _summary(record: ApprovalRecord) -> str:
    request = record.request
    return clip(
        f"*{escape(request.tool)}*, asked by {who(request.requested_by)}"
        f" in run `{escape(request.run_id)}`",
        SECTION,
    )


def deny_modal(record: ApprovalRecord) -> dict[str, Any]:
    """The Deny modal: an optional reason."""
    view: dict[str, Any] = _render(
        "deny_modal.json.j2", approval_id=record.approval_id, summary=_summary(record)
    )
    return view


def respond_modal(record: ApprovalRecord) -> dict[str, Any]:
    """The Respond modal: the answer (needed, at most `MAX_RESPONSE` characters) the agent
    gets as the call's result; the tool does not run."""
    view: dict[str, Any] = _render(
        "respond_modal.json.j2",
        approval_id=record.approval_id,
        summary=_summary(record),
        max_length=MAX_RESPONSE,
    )
    return view


def modal_fields(fields: Sequence[EditField]) -> tuple[list[EditField], list[EditField]]:
    """The editable arguments an Edit modal holds, and those it leaves out. An input shows
    a value whole or not at all: a text longer than an input holds (`INPUT_TEXT`) would be
    shown cut and come back cut, the edit of a reviewer who changed another input; a select
    of more than `OPTIONS` choices could not show the current one. So could an argument whose
    name makes a block id over `BLOCK_ID`, or one past `MAX_INPUTS`. What is left out keeps
    its value (the web inbox edits it)."""
    shown: list[EditField] = []
    left: list[EditField] = []
    for spec in fields:
        fits = (
            len(spec.text) <= INPUT_TEXT
            and len(spec.options) <= OPTIONS
            and len(spec.input_name) <= BLOCK_ID
            and len(shown) < MAX_INPUTS
        )
        (shown if fits else left).append(spec)
    return shown, left


def edit_modal(record: ApprovalRecord, fields: Sequence[EditField]) -> dict[str, Any]:
    """The Edit modal: one input per editable argument (`bot.forms.edit_fields`) it can
    hold (`modal_fields`), typed: numbers, a select for booleans and enums, text, and JSON
    for the rest; a line names those left out, which keep their values."""
    shown, left = modal_fields(fields)
    names = ", ".join(f"`{escape(plain(spec.name, 100))}`" for spec in left)
    view: dict[str, Any] = _render(
        "edit_modal.json.j2",
        approval_id=record.approval_id,
        title=plain(f"Edit {record.request.tool}", 24),
        summary=_summary(record),
        inputs=[_input(spec) for spec in shown],
        left_out=clip(f"Too long to edit here, so kept as they are: {names}", SECTION)
        if left
        else None,
    )
    return view


def _input(spec: EditField) -> dict[str, Any]:
    """An input block of the edit modal; its block id names the argument."""
    element: dict[str, Any]
    if spec.kind in ("number", "integer"):
        element = {
            "type": "number_input",
            "action_id": "value",
            "is_decimal_allowed": spec.kind == "number",
        }
        if spec.text:
            element["initial_value"] = spec.text
    elif spec.kind in ("boolean", "enum"):
        options = [
            {"text": {"type": "plain_text", "text": plain(label or "(none)", 75)}, "value": value}
            for value, label in spec.options
        ]
        element = {"type": "static_select", "action_id": "value", "options": options}
        chosen = [option for option in options if option["value"] == spec.text]
        if chosen:
            element["initial_option"] = chosen[0]
    else:
        element = {
            "type": "plain_text_input",
            "action_id": "value",
            "multiline": spec.kind == "json" or spec.multiline,
        }
        if spec.text:
            element["initial_value"] = spec.text  # whole: `modal_fields`
    return {
        "block_id": "arg." + spec.name,
        "optional": spec.nullable,
        "label": plain(spec.name, 2000),
        "hint": plain(spec.description, 2000) if spec.description else None,
        "element": element,
    }
