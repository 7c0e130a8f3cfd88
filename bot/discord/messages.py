"""The Discord messages of a review, and the buttons' and forms' ids.

A review is one message (`request_message`): the call, why, by when, its arguments in a code
block, and the Approve / Edit / Deny buttons its rule allows, whose `custom_id` is
`nodbot:<action>:<approval id>`. Once decided, it becomes `decided_message` (no buttons).
Edit and Deny open a modal (`edit_modal`, `deny_modal`) whose `custom_id` names the review
and the message it was opened from (`nodbot:<action>-form:<approval id>:<message id>`),
checked again on submission. A question's message (`bot.discord.questions`) uses the same
shapes with its own actions: `nodbot:answer:<approval id>` (its menu of choices, or its
Answer button) and `nodbot:decline:<approval id>`, and their forms
`nodbot:<answer|decline>-form:...`.

A reminder or an escalation is a reply to the review's message (`reminder_message`,
`escalation_message`): it mentions Discord users by id (`<@id>`), as many as fit (at most
`MAX_MENTIONS`), and lets those alone be pinged (`allowed_mentions: {users: [...]}`); anyone
else it names is shown escaped. Its last line (the review and the step) is never cut: a
retry finds an earlier post by it.

Tool arguments come from a model: everything shown is escaped for Discord's markdown
(`escape`), argument values are shown in code blocks whose fences cannot be closed early
(`code`), with every invisible or reordering character (a bidirectional override, a
zero-width space) written as its escape (`visible`; in a tool's name, why, who and a reason
too, and why and who kept on their line, `one_line`), every message carries `allowed_mentions:
{parse: []}` (no `@everyone` in an argument pings anyone; a reminder or an escalation, the
list of the users it mentions instead), and lengths are cut to stay within Discord's 2,000
characters: the arguments' block to the room the rest leaves, saying how long they are in
all, so that the block is never cut open by the message's limit.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any, Literal

import jinja2

from nodbot.bot.forms import EditField
from nodbot.bot.slack.messages import decided_verb
from nodbot.core import ApprovalRecord
from nodbot.core.questions import is_question

__all__ = [
    "Action",
    "button_of",
    "code",
    "decided_message",
    "deny_modal",
    "edit_modal",
    "escalation_message",
    "escape",
    "form_fields",
    "form_of",
    "reminder_message",
    "render",
    "request_message",
    "told",
    "visible",
    "who",
]

Action = Literal["approve", "edit", "deny", "answer", "decline"]
"""What a component does: a review's Approve / Edit / Deny; a question's answer (its select
menu of choices, or its Answer button) and Decline (`bot.discord.questions`)."""

MAX_CONTENT = 2000
"""Characters of a message's content at most (Discord's limit)."""
MAX_FIELDS = 5
"""Inputs of a modal at most (Discord's limit): the first five editable arguments."""
MAX_INPUT = 4000
"""Characters of a modal text input's value at most (Discord's limit)."""
MAX_CUSTOM_ID = 100
"""Characters of a component's `custom_id` at most (Discord's limit)."""
MAX_MENTIONS = 50
"""Users a reminder or an escalation mentions at most (Discord pings 100 a message at most);
the rest are counted ("and 3 more")."""
MAX_NAMED = 10
"""Others (not Discord users) an escalation names at most; the rest are counted."""
_SMALLEST_BLOCK = 60
"""Characters a code block is given at least (its fences and how long it is in all)."""
_FENCE = "```"
_LINE_BREAKS = re.compile("\r\n|[\n\r\v\f\x1c-\x1e\x85\u2028\u2029]")
"""What Discord (or the reader's eye) may take for the end of a line."""
_ZERO_WIDTH = "\u200b"
_MARKDOWN = re.compile(r"([\\*_~`|>#\-\[\]()<@:!])")
_APPROVAL = r"[A-Za-z0-9_\-]{1,64}"
_SNOWFLAKE = r"[0-9]{5,25}"
_BUTTON = re.compile(rf"nodbot:(approve|edit|deny|answer|decline):({_APPROVAL})")
_FORM = re.compile(rf"nodbot:(edit|deny|answer|decline)-form:({_APPROVAL}):({_SNOWFLAKE})")

_templates = jinja2.Environment(
    loader=jinja2.PackageLoader("nodbot", "templates/discord"),  # package data of `nodbot`
    autoescape=False,  # Discord markdown: values are escaped before they get here
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=False,
)


def escape(text: str) -> str:
    """`text` with Discord's markdown characters escaped: shown as written, no formatting,
    link, mention or timestamp made of it."""
    return _MARKDOWN.sub(r"\\\1", text)


def clip(text: str, limit: int, *, marker: str = "…") -> str:
    """`text` cut to at most `limit` characters, ending in `marker` when cut."""
    return text if len(text) <= limit else text[: max(0, limit - len(marker))] + marker


def code(text: str, limit: int) -> str:
    """`text` as a code block of at most `limit` characters, its backticks broken (a
    zero-width space after each) so that nothing in it ends the block."""
    body = text.replace("`", "`" + _ZERO_WIDTH)
    room = limit - 2 * len(_FENCE) - 2
    if len(body) > room:
        body = clip(body, room, marker=f"… ({len(text):,} characters in all)")
    return f"{_FENCE}\n{body}\n{_FENCE}"


def visible(text: str) -> str:
    """`text` with every character that is not printable but a line break (a bidirectional
    override, a zero-width space, a control) written as its `\\uXXXX` escape: what a name,
    a description or a reason says is what a reader sees, not text reordered or hidden."""
    return "".join(char if char.isprintable() or char == "\n" else _escaped(char) for char in text)


def one_line(text: str) -> str:
    """`text` with its line breaks as spaces: a text shown within a line of a message (why,
    who) cannot start lines of its own that pass for the message's (a second "Arguments:")."""
    return _LINE_BREAKS.sub(" ", text)


def who(handle: str | None) -> str:
    """A decider as the message names them: a Discord user as a mention (which pings nobody:
    `allowed_mentions` is empty), anyone else by their handle, escaped."""
    if handle is None:
        return "someone"
    kind, _, user = handle.partition(":")
    if kind == "discord" and re.fullmatch(_SNOWFLAKE, user):
        return f"<@{user}>"
    return escape(clip(visible(one_line(handle)), 200))


def when(moment: datetime) -> str:
    """A moment as Discord shows it in each reader's own time zone."""
    return f"<t:{int(moment.timestamp())}:f>"


def _json(value: Any) -> str:
    """`value` as indented JSON, every character that is not printable (a control, a
    bidirectional override, a zero-width or other invisible character) written as its JSON
    escape: the reviewer reads the arguments' own characters, never text reordered or hidden
    by them, and the block still reads back as the same JSON."""
    return visible(json.dumps(value, ensure_ascii=False, indent=2, sort_keys=True, default=str))


def _escaped(char: str) -> str:
    """`char` as a JSON string escape (a surrogate pair beyond the Basic Multilingual Plane)."""
    point = ord(char)
    if point < 0x10000:
        return f"\\u{point:04x}"
    point -= 0x10000
    return f"\\u{0xD800 + (point >> 10):04x}\\u{0xDC00 + (point & 0x3FF):04x}"


def _fitted(
    name: str, values: dict[str, Any], blocks: dict[str, tuple[Any, int]]
) -> dict[str, Any]:
    """Template `name` rendered with `values` and the JSON code blocks `blocks` (name ->
    (value, most characters)), each block cut, in order, to the room the rest of the message
    leaves within `MAX_CONTENT`: the blocks are cut (saying so) rather than the message, so
    that no block is left open and nothing after them is lost."""
    probe = render(name, **values, **dict.fromkeys(blocks, "·"))
    room = MAX_CONTENT - (len(str(probe.get("content") or "")) - len(blocks))
    shown: dict[str, str] = {}
    for index, (key, (value, most)) in enumerate(blocks.items()):
        later = len(blocks) - index - 1
        limit = min(most, max(_SMALLEST_BLOCK, room - later * _SMALLEST_BLOCK))
        shown[key] = code(_json(value), limit)
        room -= len(shown[key])
    return render(name, **values, **shown)


def request_message(
    record: ApprovalRecord,
    *,
    can_edit: bool,
    can_deny: bool,
    page: str | None,
    can_approve: bool = True,
) -> dict[str, Any]:
    """The review's message with the buttons of the decisions its rule allows (see the
    module); with none, no action row (Discord refuses an empty one) and a line saying to
    decide in the inbox."""
    request, policy = record.request, record.request.policy
    buttons = [
        {"style": style, "label": label, "custom_id": f"nodbot:{action}:{record.approval_id}"}
        for action, label, style, shown in (
            ("approve", "Approve", 3, can_approve),
            ("edit", "Edit", 1, can_edit),
            ("deny", "Deny", 4, can_deny),
        )
        if shown
    ]
    why = policy.get("description")
    deadline = request.deadline
    values = {
        "tool": escape(clip(visible(request.tool), 100)),
        "why": escape(clip(visible(one_line(why)), 300)) if isinstance(why, str) and why else None,
        "requested_by": who(request.requested_by) if request.requested_by else None,
        "deadline": when(deadline) if deadline is not None else None,
        "approvals": request.approvals_required,
        "approval_id": escape(record.approval_id),
        "page": page,
        "buttons": buttons,
    }
    return _fitted("request.json.j2", values, {"arguments": (request.arguments, 1200)})


def decided_message(record: ApprovalRecord, *, page: str | None) -> dict[str, Any]:
    """The review's message once decided: the outcome, who and when, no buttons."""
    decision, request = record.decision, record.request
    if decision is None:
        raise ValueError(f"approval {record.approval_id} is not decided")
    values = {
        "verb": decided_verb(decision),
        "tool": escape(clip(visible(request.tool), 100)),
        "by": who(decision.decided_by),
        "moment": when(record.decided_at) if record.decided_at is not None else "just now",
        "reason": escape(clip(visible(decision.reason), 300)) if decision.reason else None,
        "approval_id": escape(record.approval_id),
        "page": page,
    }
    blocks: dict[str, tuple[Any, int]] = {}
    if decision.edited_args:
        blocks["edited"] = (decision.edited_args, 500)
    else:
        values["edited"] = None
    blocks["arguments"] = (request.arguments, 900)
    return _fitted("decided.json.j2", values, blocks)


def reminder_message(
    record: ApprovalRecord,
    *,
    step: int,
    limit: int,
    needed: int,
    users: list[str],
    page: str | None,
) -> dict[str, Any]:
    """Reminder `step` of `limit` of a review that still waits (`needed` approvals still
    needed), as a reply (`reminder.json.j2`): it mentions `users` (Discord user ids) and pings
    them alone (`allowed_mentions`), and says the review waits when there is none."""
    values = _waiting(record, needed=needed, page=page)
    return _replying("reminder.json.j2", {**values, "step": step, "limit": limit}, users, [])


def escalation_message(
    record: ApprovalRecord,
    *,
    needed: int,
    users: list[str],
    named: list[str],
    page: str | None,
) -> dict[str, Any]:
    """The escalation of a review that still waits, as a reply (`escalation.json.j2`): who
    may now decide it too, `users` (Discord user ids) mentioned and pinged alone
    (`allowed_mentions`), `named` (handles of others) shown escaped."""
    values = {**_waiting(record, needed=needed, page=page), "since": when(record.created_at)}
    return _replying("escalation.json.j2", values, users, named)


def _waiting(record: ApprovalRecord, *, needed: int, page: str | None) -> dict[str, Any]:
    """What a reply about a review still waiting says of it, made safe for Discord."""
    deadline = record.request.deadline
    return {
        "question": is_question(record.request),
        "tool": escape(clip(visible(record.request.tool), 100)),
        "needed": needed,
        "deadline": when(deadline) if deadline is not None else None,
        "approval_id": escape(record.approval_id),
        "page": page,
    }


def _replying(
    name: str, values: dict[str, Any], users: list[str], named: list[str]
) -> dict[str, Any]:
    """Template `name` with `values`, mentioning the Discord users `users` (ids; anything else
    is left out) and naming `named`, as many of them as fit within `MAX_CONTENT` (at most
    `MAX_MENTIONS` and `MAX_NAMED`), the rest counted: the message is never cut, so that its
    last line stays whole (a retry finds the message by it). Only the users mentioned are
    pinged (`allowed_mentions: {"users": [...]}`): never a role, never `@everyone`."""
    ids = [user for user in dict.fromkeys(users) if re.fullmatch(_SNOWFLAKE, user)]
    others = [escape(clip(visible(one_line(handle)), 80)) for handle in dict.fromkeys(named)]
    shown_ids, shown_others = ids[:MAX_MENTIONS], others[:MAX_NAMED]
    while True:
        mentions = [f"<@{user}>" for user in shown_ids]
        more = len(ids) + len(others) - len(shown_ids) - len(shown_others)
        rendered: dict[str, Any] = json.loads(
            _templates.get_template(name).render(
                **values,
                mentions=mentions,
                named=mentions + shown_others,
                users=shown_ids,
                more=more,
            )
        )
        content = str(rendered.get("content") or "")
        if len(content) <= MAX_CONTENT or not (shown_ids or shown_others):
            rendered["content"] = clip(content, MAX_CONTENT)
            return rendered
        if shown_others:
            shown_others = shown_others[:-1]
        else:
            shown_ids = shown_ids[:-1]


def form_fields(fields: list[EditField]) -> list[EditField]:
    """The inputs an edit form holds: the first `MAX_FIELDS` whose value fits a text input
    whole and whose name makes an input Discord takes. A value longer than `MAX_INPUT` is
    left out rather than shown cut: what the form shows comes back on submission, and a cut
    value would be the edit of a reviewer who changed another input (the inbox edits it)."""
    fitting = [
        field
        for field in fields
        if field.name and len(field.input_name) <= MAX_CUSTOM_ID and len(field.text) <= MAX_INPUT
    ]
    return fitting[:MAX_FIELDS]


def edit_modal(record: ApprovalRecord, fields: list[EditField], message: str) -> dict[str, Any]:
    """The edit form of the review opened from `message` (its inputs: `form_fields`)."""
    return render(
        "edit_modal.json.j2",
        custom_id=f"nodbot:edit-form:{record.approval_id}:{message}",
        tool=record.request.tool,
        fields=form_fields(fields),
    )


def deny_modal(record: ApprovalRecord, message: str) -> dict[str, Any]:
    """The deny form (an optional reason) of the review opened from `message`."""
    return render(
        "deny_modal.json.j2", custom_id=f"nodbot:deny-form:{record.approval_id}:{message}"
    )


def told(kind: str, **values: Any) -> str:
    """What the clicker alone is told (`told.txt.j2`), cut to a message's length."""
    return clip(_templates.get_template("told.txt.j2").render(kind=kind, **values), MAX_CONTENT)


def button_of(custom_id: str) -> tuple[Action, str] | None:
    """The action and approval id a button's `custom_id` names; None for any other."""
    found = _BUTTON.fullmatch(custom_id)
    if found is None:
        return None
    action: Action = found[1]  # type: ignore[assignment]
    return action, found[2]


def form_of(custom_id: str) -> tuple[Action, str, str] | None:
    """The action, approval id and message id a modal's `custom_id` names; None for any
    other."""
    found = _FORM.fullmatch(custom_id)
    if found is None:
        return None
    action: Action = found[1]  # type: ignore[assignment]
    return action, found[2], found[3]


def render(name: str, **values: Any) -> dict[str, Any]:
    """The message or form of template `name` with `values` (already made safe), its content
    cut to a message's length."""
    rendered: dict[str, Any] = json.loads(_templates.get_template(name).render(**values))
    content = rendered.get("content")
    if isinstance(content, str):
        rendered["content"] = clip(content, MAX_CONTENT)
    return rendered
