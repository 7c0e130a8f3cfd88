"""The Adaptive Cards of the Teams channel (templates in `templates/teams`): a review's
request (Approve / Edit / Deny as `Action.Execute`), its edit form (inputs typed from the
tool's schema, as `bot.forms` builds them for every channel), and the decided card. A
question's cards (`bot.teams.questions`) are built with the `render`, `plain` and `when` of
this module.

Every value a card shows comes from the call (tool arguments are untrusted), so it is
clipped and its Adaptive Card markdown escaped (`plain`): what an argument says is shown as
text, never as a link or formatting.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import jinja2

from nodbot.bot.forms import MAX_REASON, EditField, shown
from nodbot.bot.slack.messages import decided_verb
from nodbot.core import ApprovalRecord
from nodbot.core.store import TIMEOUT_DECIDER

__all__ = [
    "decided_card",
    "edit_card",
    "plain",
    "render",
    "request_card",
    "review_card",
    "when",
]

MAX_VALUE = 1_000
"""The most characters of one value a card shows (the inbox shows the rest)."""
MAX_ARGUMENTS = 30
"""The most arguments a card lists."""

_templates = jinja2.Environment(
    loader=jinja2.PackageLoader("nodbot", "templates/teams"),
    autoescape=False,  # JSON: every value goes through `tojson`
    undefined=jinja2.StrictUndefined,
)

_MARKDOWN = re.compile(r"([\\`*_\[\]()#>~|<])")
"""What Adaptive Card markdown makes formatting or a link anywhere in a text."""
_LINE_START = re.compile(r"^(\s*)([-+]|\d+\.)(?=\s|$)", re.MULTILINE)
"""What makes a line a list item."""


def plain(text: object, limit: int = MAX_VALUE) -> str:
    """`text` as an Adaptive Card shows it as written: clipped to `limit` characters and
    its markdown escaped."""
    value = str(text)
    if len(value) > limit:
        value = value[: limit - 1] + "…"
    value = _MARKDOWN.sub(r"\\\1", value)
    return _LINE_START.sub(_unlisted, value)


def _unlisted(found: re.Match[str]) -> str:
    mark = found[2]
    return found[1] + (mark[:-1] + "\\." if mark.endswith(".") else "\\" + mark)


def when(moment: datetime) -> str:
    """`moment` as a card shows it."""
    return moment.strftime("%Y-%m-%d %H:%M UTC")


def _arguments(arguments: dict[str, Any]) -> list[tuple[str, str]]:
    items = list(arguments.items())
    found = [(plain(name, 100), plain(shown(value))) for name, value in items[:MAX_ARGUMENTS]]
    if len(items) > MAX_ARGUMENTS:
        found.append(("…", f"{len(items) - MAX_ARGUMENTS} more"))
    return found


def render(name: str, **values: Any) -> dict[str, Any]:
    """The card of template `name` (of `templates/teams`), rendered with `values`."""
    card: dict[str, Any] = json.loads(_templates.get_template(name).render(**values))
    return card


def request_card(
    record: ApprovalRecord,
    *,
    allowed: Sequence[str],
    can_edit: bool,
    error: str | None = None,
) -> dict[str, Any]:
    """The review's request card, with the actions `allowed` (Edit only when `can_edit`),
    and `error` (why the last action was refused) shown on it."""
    request = record.request
    description = request.policy.get("description")
    about = [("Asked by", plain(request.requested_by or "unknown", 200))]
    about.append(("Run", plain(request.run_id, 200)))
    if request.deadline is not None:
        about.append(("Decide by", f"{when(request.deadline)} (then: {request.on_timeout})"))
    if request.approvals_required > 1:
        about.append(("Approvals needed", str(request.approvals_required)))
    return render(
        "request.json.j2",
        approval_id=record.approval_id,
        tool=plain(request.tool, 200),
        description=plain(description) if isinstance(description, str) else None,
        arguments=_arguments(request.arguments),
        about=about,
        approve="approve" in allowed,
        edit="edit" in allowed and can_edit,
        deny="deny" in allowed,
        error=None if error is None else plain(error, 500),
        max_reason=MAX_REASON,
    )


def decided_card(record: ApprovalRecord) -> dict[str, Any]:
    """The card of a decided review: the outcome, who decided and when, no actions."""
    decision = record.decision
    if decision is None:
        raise ValueError(f"approval {record.approval_id} is not decided")
    verb = decided_verb(decision)
    by = decision.decided_by or "someone"
    moment = when(record.decided_at) if record.decided_at is not None else "just now"
    outcome = (
        f"Timed out: {verb.lower()}, {moment}"
        if by == TIMEOUT_DECIDER
        else f"{verb} by {plain(by, 200)}, {moment}"
    )
    arguments = {**record.request.arguments, **(decision.edited_args or {})}
    return render(
        "decided.json.j2",
        approval_id=record.approval_id,
        tool=plain(record.request.tool, 200),
        outcome=outcome,
        color="Good" if decision.approved else "Attention",
        reason=plain(decision.reason) if decision.reason else None,
        edited=bool(decision.edited_args),
        arguments=_arguments(arguments),
    )


def edit_card(
    record: ApprovalRecord, fields: Sequence[EditField], *, error: str | None = None
) -> dict[str, Any]:
    """The edit form of the review: an input per field, each with its error."""
    return render(
        "edit.json.j2",
        approval_id=record.approval_id,
        tool=plain(record.request.tool, 200),
        fields=[element for spec in fields for element in _inputs(spec)],
        error=None if error is None else plain(error, 500),
    )


def review_card(
    record: ApprovalRecord, *, allowed: Sequence[str], can_edit: bool, error: str | None = None
) -> dict[str, Any]:
    """The card of the review as it stands: its request, or once decided the outcome."""
    if record.decision is not None:
        return decided_card(record)
    return request_card(record, allowed=allowed, can_edit=can_edit, error=error)


def _inputs(spec: EditField) -> list[dict[str, Any]]:
    """The card elements of one field: its input, and its error under it."""
    label = spec.name + (f" ({spec.description})" if spec.description else "")
    common: dict[str, Any] = {"id": spec.input_name, "label": plain(label, 200)}
    if spec.kind in ("number", "integer"):
        element = {"type": "Input.Text", **common, "value": spec.text, "style": "text"}
    elif spec.kind in ("boolean", "enum"):
        choices = [{"title": title, "value": value} for value, title in spec.options]
        element = {
            "type": "Input.ChoiceSet",
            **common,
            "value": spec.text,
            "choices": choices,
            "isRequired": not spec.nullable,
        }
    else:
        multiline = spec.multiline or spec.kind == "json"
        element = {"type": "Input.Text", **common, "value": spec.text, "isMultiline": multiline}
    found: list[dict[str, Any]] = [element]
    if spec.error is not None:
        found.append(
            {"type": "TextBlock", "wrap": True, "color": "Attention", "text": plain(spec.error)}
        )
    return found
