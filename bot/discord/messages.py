"""The Discord messages of a review, and the buttons' and forms' ids.

A review is one message (`request_message`): the call, why, by when, its arguments in a code
block, and Approve / Edit / Deny buttons whose `custom_id` is `nodbot:<action>:<approval
id>`. Once decided, it becomes `decided_message` (no buttons). Edit and Deny open a modal
(`edit_modal`, `deny_modal`) whose `custom_id` names the review and the message it was opened
from (`nodbot:<action>-form:<approval id>:<message id>`), checked again on submission. A
question's message (`bot.discord.questions`) uses the same shapes with its own actions:
`nodbot:answer:<approval id>` (its menu of choices, or its Answer button) and
`nodbot:decline:<approval id>`, and their forms `nodbot:<answer|decline>-form:...`.

Tool arguments come from a model: everything shown is escaped for Discord's markdown
(`escape`), argument values are shown in code blocks whose fences cannot be closed early
(`code`), every message carries `allowed_mentions: {parse: []}` (no `@everyone` in an
argument pings anyone), and lengths are cut to stay within Discord's 2,000 characters.
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

__all__ = [
    "Action",
    "button_of",
    "code",
    "decided_message",
    "deny_modal",
    "edit_modal",
    "escape",
    "form_of",
    "render",
    "request_message",
    "told",
    "who",
]

Action = Literal["approve", "edit", "deny", "answer", "decline"]
"""What a component does: a review's Approve / Edit / Deny; a question's answer (its select
menu of choices, or its Answer button) and Decline (`bot.discord.questions`)."""

MAX_CONTENT = 2000
"""Characters of a message's content at most (Discord's limit)."""
MAX_FIELDS = 5
"""Inputs of a modal at most (Discord's limit): the first five editable arguments."""
_FENCE = "```"
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


def who(handle: str | None) -> str:
    """A decider as the message names them: a Discord user as a mention (which pings nobody:
    `allowed_mentions` is empty), anyone else by their handle, escaped."""
    if handle is None:
        return "someone"
    kind, _, user = handle.partition(":")
    if kind == "discord" and re.fullmatch(_SNOWFLAKE, user):
        return f"<@{user}>"
    return escape(clip(handle, 200))


def when(moment: datetime) -> str:
    """A moment as Discord shows it in each reader's own time zone."""
    return f"<t:{int(moment.timestamp())}:f>"


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=2, sort_keys=True, default=str)


def request_message(
    record: ApprovalRecord, *, can_edit: bool, can_deny: bool, page: str | None
) -> dict[str, Any]:
    """The review's message with its buttons (see the module)."""
    request, policy = record.request, record.request.policy
    why = policy.get("description")
    deadline = request.deadline
    return render(
        "request.json.j2",
        tool=escape(clip(request.tool, 100)),
        why=escape(clip(why, 300)) if isinstance(why, str) and why else None,
        requested_by=who(request.requested_by) if request.requested_by else None,
        deadline=when(deadline) if deadline is not None else None,
        approvals=request.approvals_required,
        arguments=code(_json(request.arguments), 1200),
        approval_id=escape(record.approval_id),
        review=record.approval_id,  # the buttons' ids: as it is
        page=page,
        can_edit=can_edit,
        can_deny=can_deny,
    )


def decided_message(record: ApprovalRecord, *, page: str | None) -> dict[str, Any]:
    """The review's message once decided: the outcome, who and when, no buttons."""
    decision, request = record.decision, record.request
    if decision is None:
        raise ValueError(f"approval {record.approval_id} is not decided")
    verb = decided_verb(decision)
    return render(
        "decided.json.j2",
        verb=verb,
        tool=escape(clip(request.tool, 100)),
        by=who(decision.decided_by),
        moment=when(record.decided_at) if record.decided_at is not None else "just now",
        reason=escape(clip(decision.reason, 300)) if decision.reason else None,
        edited=code(_json(decision.edited_args), 500) if decision.edited_args else None,
        arguments=code(_json(request.arguments), 900),
        approval_id=escape(record.approval_id),
        page=page,
    )


def edit_modal(record: ApprovalRecord, fields: list[EditField], message: str) -> dict[str, Any]:
    """The edit form of the review opened from `message` (its first `MAX_FIELDS` inputs)."""
    return render(
        "edit_modal.json.j2",
        custom_id=f"nodbot:edit-form:{record.approval_id}:{message}",
        tool=record.request.tool,
        fields=fields[:MAX_FIELDS],
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
