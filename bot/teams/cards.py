"""The Adaptive Cards of the Teams channel (templates in `templates/teams`): a review's
request (Approve / Edit / Deny as `Action.Execute`), its edit form (inputs typed from the
tool's schema, as `bot.forms` builds them for every channel), the decided card, and the
cards of the replies under it: a reminder (`reminder_card`) and an escalation
(`escalation_card`), without actions or `refresh`, naming reviewers by their handles. A
question's cards (`bot.teams.questions`) are built with the `render`, `plain` and `when` of
this module.

Every value a card shows comes from the call (tool arguments are untrusted), so it is
clipped and its Adaptive Card markdown escaped (`plain`): what an argument says is shown as
text, never as a link or formatting. Every card fits in a Teams message (`MAX_CARD`,
`fitted`): a larger one has its texts clipped further and says so (the whole review is in
the inbox); the edit form never holds a value cut short, it leaves a value too long for a
card to the inbox.
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
from nodbot.core.questions import is_question
from nodbot.core.store import TIMEOUT_DECIDER

__all__ = [
    "MAX_CARD",
    "decided_card",
    "edit_card",
    "escalation_card",
    "plain",
    "reminder_card",
    "render",
    "request_card",
    "review_card",
    "size",
    "when",
]

MAX_VALUE = 1_000
"""The most characters of one value a card shows (the inbox shows the rest)."""
MAX_ARGUMENTS = 30
"""The most arguments a card lists."""
MAX_CARD = 24_000
"""The most bytes (UTF-8 JSON, as the connector sends it) of a card: Teams refuses a message
over about 28 KB, and the activity around the card needs some. A card over it is shortened
(`fitted`): its texts clipped further, with a note that the whole review is in the inbox."""
MAX_EDIT_TEXT = 2_000
"""The longest value the edit form offers to edit; a longer one is edited in the inbox (an
input must hold the whole value, or saving it would cut it)."""
MAX_EDIT_OPTIONS = 100
"""The most options of a choice the edit form offers; a field with more is edited in the
inbox."""
MAX_NAMED = 20
"""The most reviewers a reminder or an escalation names (then: how many more)."""
_SHORTEST = 20
"""The shortest a shortened text is clipped to."""

_templates = jinja2.Environment(
    loader=jinja2.PackageLoader("nodbot", "templates/teams"),
    autoescape=False,  # JSON: every value goes through `tojson`
    undefined=jinja2.StrictUndefined,
)

_MARKDOWN = re.compile(r"([\\`*_\[\]()#>~|<{}])")
"""What Adaptive Card markdown makes formatting or a link anywhere in a text, and the braces
of its `{{DATE(...)}}` and `{{TIME(...)}}` (which would show a date the text does not say)."""
_LINE_START = re.compile(r"^(\s*)([-+=]+|\d+\.)(?=\s|$)", re.MULTILINE)
"""What makes a line a list item, a heading's underline or a rule."""


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
    if mark.endswith("."):
        return found[1] + mark[:-1] + "\\."
    return found[1] + "".join("\\" + char for char in mark)


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
    """The card of template `name` (of `templates/teams`), rendered with `values`, shortened
    to fit in a Teams message (`fitted`)."""
    return fitted(_rendered(name, **values))


def _rendered(name: str, **values: Any) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(_templates.get_template(name).render(**values))
    return found


def size(card: dict[str, Any]) -> int:
    """The bytes of `card` as the connector sends it (UTF-8 JSON)."""
    return len(json.dumps(card, ensure_ascii=False).encode())


def fitted(card: dict[str, Any]) -> dict[str, Any]:
    """`card` when it is at most `MAX_CARD` bytes; else the same card with its texts (text
    blocks, facts) clipped to the longest length that fits, and a note that it was shortened
    and the whole review is in the inbox. Inputs, actions and their data are never
    changed."""
    if size(card) <= MAX_CARD:
        return card
    body = card.get("body")
    if not isinstance(body, list):
        return card
    places = [place for element in body for place in _texts(element)]
    originals = [str(holder[key]) for holder, key in places]
    body.insert(1, _rendered("clipped.json.j2"))

    def clip_to(cap: int) -> None:
        for (holder, key), text in zip(places, originals, strict=True):
            holder[key] = _clipped(text, cap)

    low, high, best = _SHORTEST, max((len(text) for text in originals), default=0), _SHORTEST
    while low <= high:  # the longest cap that fits
        cap = (low + high) // 2
        clip_to(cap)
        if size(card) <= MAX_CARD:
            best, low = cap, cap + 1
        else:
            high = cap - 1
    clip_to(best)
    return card


def _texts(element: object) -> list[tuple[dict[str, Any], str]]:
    """Where `element` shows text: a text block's `text`, a fact's title and value."""
    if not isinstance(element, dict):
        return []
    if element.get("type") == "TextBlock" and isinstance(element.get("text"), str):
        return [(element, "text")]
    if element.get("type") == "FactSet":
        facts = [fact for fact in element.get("facts") or [] if isinstance(fact, dict)]
        return [(fact, key) for fact in facts for key in ("title", "value") if key in fact]
    return []


def _clipped(text: str, cap: int) -> str:
    """Escaped `text` clipped to `cap` characters, not between a backslash and what it
    escapes."""
    if len(text) <= cap:
        return text
    cut = text[: cap - 1]
    trailing = len(cut) - len(cut.rstrip("\\"))
    if trailing % 2:
        cut = cut[:-1]
    return cut + "…"


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


def reminder_card(
    record: ApprovalRecord,
    *,
    step: int,
    limit: int,
    waiting: Sequence[str],
    needed: int,
) -> dict[str, Any]:
    """The card of reminder `step` of `limit`, a reply under the review's card: it still
    waits (`needed` approvals more, the deadline), and who has not acted yet (`waiting`,
    handles as the rules write them, escaped: nobody is @mentioned)."""
    return render(
        "reminder.json.j2",
        step=step,
        limit=limit,
        waiting=_named(waiting),
        **_waiting(record, needed),
    )


def escalation_card(
    record: ApprovalRecord, *, escalated_to: Sequence[str], needed: int
) -> dict[str, Any]:
    """The card of the review's escalation, a reply under its card: who may now decide too
    (`escalated_to`, handles escaped), `needed` approvals more, the deadline."""
    return render(
        "escalated.json.j2",
        escalated_to=_named(escalated_to) or "more reviewers",
        **_waiting(record, needed),
    )


def _waiting(record: ApprovalRecord, needed: int) -> dict[str, Any]:
    """What a reminder and an escalation say of the review itself."""
    request = record.request
    deadline = None
    if request.deadline is not None:
        deadline = f"{when(request.deadline)} (then: {plain(request.on_timeout, 50)})"
    return {
        "question": is_question(request),
        "tool": plain(request.tool, 200),
        "needed": max(1, needed),
        "deadline": deadline,
    }


def _named(handles: Sequence[str]) -> str:
    """`handles` as a card names them: escaped, at most `MAX_NAMED`, then how many more."""
    shown = [plain(handle, 200) for handle in handles[:MAX_NAMED]]
    if len(handles) > MAX_NAMED:
        shown.append(f"{len(handles) - MAX_NAMED} more")
    return ", ".join(shown)


def edit_card(
    record: ApprovalRecord, fields: Sequence[EditField], *, error: str | None = None
) -> dict[str, Any]:
    """The edit form of the review: an input per field, each with its error."""
    shown = [_inputs(spec) for spec in fields]
    values = {
        "approval_id": record.approval_id,
        "tool": plain(record.request.tool, 200),
        "error": None if error is None else plain(error, 500),
    }

    def card() -> dict[str, Any]:
        elements = [element for found in shown for element in found]
        return _rendered("edit.json.j2", fields=elements, **values)

    built = card()
    # Inputs are never clipped (saving would cut the value): the largest are left to the
    # inbox, one by one, until the form fits.
    while size(built) > MAX_CARD:
        inputs = [n for n, found in enumerate(shown) if found[0]["type"].startswith("Input.")]
        if not inputs:
            break
        largest = max(inputs, key=lambda n: size({"found": shown[n]}))
        shown[largest] = [_not_editable(fields[largest])]
        built = card()
    return fitted(built)


def review_card(
    record: ApprovalRecord, *, allowed: Sequence[str], can_edit: bool, error: str | None = None
) -> dict[str, Any]:
    """The card of the review as it stands: its request, or once decided the outcome."""
    if record.decision is not None:
        return decided_card(record)
    return request_card(record, allowed=allowed, can_edit=can_edit, error=error)


def _inputs(spec: EditField) -> list[dict[str, Any]]:
    """The card elements of one field: its input, and its error under it."""
    options = [text for pair in spec.options for text in pair]
    if len(spec.text) > MAX_EDIT_TEXT or len(spec.options) > MAX_EDIT_OPTIONS:
        return [_not_editable(spec)]
    if any(len(text) > MAX_EDIT_TEXT for text in options):
        return [_not_editable(spec)]
    common: dict[str, Any] = {"id": spec.input_name, "label": plain(_label(spec), 200)}
    if spec.kind in ("number", "integer"):
        element = {"type": "Input.Text", **common, "value": spec.text, "style": "text"}
    elif spec.kind in ("boolean", "enum"):
        choices = [{"title": title[:200], "value": value} for value, title in spec.options]
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


def _label(spec: EditField) -> str:
    return spec.name + (f" ({spec.description})" if spec.description else "")


def _not_editable(spec: EditField) -> dict[str, Any]:
    """What the edit form shows of a field too long to edit on a card."""
    return _rendered("not_editable.json.j2", label=plain(_label(spec), 200))
