"""The Discord messages of a question (`core.questions`): what a person is asked, the
components that answer it, its forms, and the message once it is answered, declined or timed
out.

A question's message goes where a review's request goes (`bot.discord.channel`: the same
channels, the same outbox delivery). It says "Question", the rule's description, the
question, its choices (numbered), who asked it (the tool that asks, or the run itself), for
whom (the run's requester) and by when; then, as the rule allows (`allowed_decisions`,
`["respond", "deny"]` for every question the rules route):

- a question with choices has a select menu (`nodbot:answer:<approval id>`) with one option
  per choice, whose value is the choice's index (`choice_of` reads it back); the answer is
  then looked up in the question itself, so no text a client sends becomes the answer;
- a free-text question has an "Answer" button (`nodbot:answer:<approval id>`) that opens a
  form for the text (`answer_modal`, at most `MAX_RESPONSE` characters);
- "Decline" (`nodbot:decline:<approval id>`) opens a form for an optional reason
  (`decline_modal`), told to the run.

A form's `custom_id` names the question and the message it was opened from
(`nodbot:<answer|decline>-form:<approval id>:<message id>`), as a review's forms do. Once
decided, the message (`question_decided`) says "Answered: <answer>", "Declined" or "Timed
out", who and when, the question, and has no components.

The question, its choices and who asked come from the run, and an answer or a reason from a
person: everything shown in a message is escaped for Discord's markdown
(`bot.discord.messages.escape`), cut before it is escaped so that no escape is left half,
and bounded so that the message stays within Discord's 2,000 characters. A choice's option
label is plain text to Discord (no markdown), cut to its 100 characters.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from nodbot.bot.discord.messages import clip, code, escape, render, when, who
from nodbot.core import ApprovalRecord
from nodbot.core.decisions import MAX_RESPONSE
from nodbot.core.questions import MAX_CHOICES, Question, answer_of, question_of
from nodbot.core.store import TIMEOUT_DECIDER

__all__ = [
    "MAX_TEXT",
    "answer_modal",
    "choice_of",
    "decline_modal",
    "question_decided",
    "question_message",
    "shown",
]

MAX_TEXT = 1000
"""Characters of the question a message shows at most, once escaped (the rest of the
message needs the room: Discord allows 2,000 in all)."""
MAX_CHOICES_SHOWN = 500
"""Characters of the numbered choices a message shows at most, once escaped."""
MAX_LABEL = 100
"""Characters of a select option's label at most (Discord's limit)."""
UNREADABLE = (
    "This question cannot be read (it is stored in a form this bot does not know): decline "
    "it, or open it in the inbox."
)


def shown(text: str, limit: int) -> str:
    """`text` escaped within `limit` characters, ending in "…" when cut (cut before it is
    escaped, so that no escape is left half)."""
    escaped = escape(text)
    if len(escaped) <= limit:
        return escaped
    raw = text
    while len(escape(raw)) + 1 > limit:
        raw = raw[: len(raw) - max(1, (len(escape(raw)) + 1 - limit) // 2)]
    return escape(raw) + "…"


def choice_of(question: Question | None, values: Sequence[str]) -> str | None:
    """The choice a select menu's `values` pick: one value, the index (from 0, ASCII digits)
    of one of the question's choices; None for anything else (a forged or stale value)."""
    if question is None or question.choices is None or len(values) != 1:
        return None
    value = values[0]
    if not (value.isascii() and value.isdigit() and len(value) <= 2):
        return None
    index = int(value)
    return question.choices[index] if index < len(question.choices) else None


def _asker(question: Question | None) -> str:
    """Who asked: the tool, or the run itself."""
    if question is None or question.asked_by is None:
        return "the run"
    return "the tool " + shown(question.asked_by, 100)


def _text(question: Question | None) -> str:
    return UNREADABLE if question is None else shown(question.text, MAX_TEXT)


def question_message(
    record: ApprovalRecord, *, allowed: Sequence[str], page: str | None
) -> dict[str, Any]:
    """The question's message: its choices as a select menu (or Answer, for free text)
    where `allowed` lists `respond`, Decline where it lists `deny`. A question that cannot
    be read offers Decline only."""
    request = record.request
    question = question_of(request)
    options: list[dict[str, str]] = []
    buttons: list[dict[str, Any]] = []
    if question is not None and "respond" in allowed:
        if question.choices is not None:
            options = [
                {"label": clip(choice, MAX_LABEL), "value": str(index)}
                for index, choice in enumerate(question.choices[:MAX_CHOICES])
            ]
        else:
            buttons.append(
                {"style": 1, "label": "Answer", "custom_id": f"nodbot:answer:{record.approval_id}"}
            )
    if "deny" in allowed:
        buttons.append(
            {"style": 4, "label": "Decline", "custom_id": f"nodbot:decline:{record.approval_id}"}
        )
    choices = None
    if question is not None and question.choices is not None:
        numbered = " · ".join(f"{i}. {c}" for i, c in enumerate(question.choices, 1))
        choices = shown(numbered, MAX_CHOICES_SHOWN)
    why = request.policy.get("description")
    deadline = request.deadline
    return render(
        "question.json.j2",
        why=shown(why, 200) if isinstance(why, str) and why else None,
        text=_text(question),
        choices=choices,
        asker=_asker(question),
        requested_by=who(request.requested_by) if request.requested_by else None,
        deadline=when(deadline) if deadline is not None else None,
        approval_id=escape(record.approval_id),
        review=record.approval_id,  # the components' ids: as it is
        page=page,
        options=options,
        buttons=buttons,
    )


def question_decided(record: ApprovalRecord, *, page: str | None) -> dict[str, Any]:
    """The question once decided: "Answered: <answer>", "Declined" (and the reason) or
    "Timed out", who and when, the question; no components. Raises `ValueError` when it is
    not decided."""
    decision = record.decision
    if decision is None:
        raise ValueError(f"question {record.approval_id} is not decided")
    moment = when(record.decided_at) if record.decided_at is not None else "just now"
    answer = answer_of(record)
    by: str | None = who(decision.decided_by)
    if answer is not None:
        verb = "answered"
        if "\n" in answer or len(escape(answer)) > 300:
            outcome = "Answered:\n" + code(answer, 700)
        else:
            outcome = "Answered: " + escape(answer)
    elif decision.decided_by == TIMEOUT_DECIDER:
        verb, by = "timed out", None
        outcome = "Timed out: nobody answered before the deadline; the question is declined."
    elif decision.approved:  # not an outcome a question is given: said as it is
        verb, outcome = "closed", "Closed, unanswered."
    else:
        verb = "declined"
        outcome = "Declined" + (": " + shown(decision.reason, 500) if decision.reason else ".")
    return render(
        "question_decided.json.j2",
        verb=verb,
        by=by,
        moment=moment,
        outcome=outcome,
        text=_text(question_of(record.request)),
        approval_id=escape(record.approval_id),
        page=page,
    )


def answer_modal(record: ApprovalRecord, message: str) -> dict[str, Any]:
    """The Answer form of the question opened from `message`: the answer, needed, at most
    `MAX_RESPONSE` characters."""
    return render(
        "answer_modal.json.j2",
        custom_id=f"nodbot:answer-form:{record.approval_id}:{message}",
        max_length=MAX_RESPONSE,
    )


def decline_modal(record: ApprovalRecord, message: str) -> dict[str, Any]:
    """The Decline form (an optional reason) of the question opened from `message`."""
    return render(
        "decline_modal.json.j2", custom_id=f"nodbot:decline-form:{record.approval_id}:{message}"
    )
