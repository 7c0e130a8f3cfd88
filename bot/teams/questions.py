"""The Adaptive Cards of a question (`core.questions`) in Teams (templates in
`templates/teams`): what a person is asked, the actions that answer it, and the card once it
is answered, declined or timed out.

A question's card goes where a review's card goes (`bot.teams.channel`: the same
conversations, the same outbox deliveries, replaced for everyone once decided). It shows the
rule's description, the question, who asked it (the tool that asks, or the run itself), for
whom, the run and the deadline; then its actions, as the rule allows (`allowed_decisions`,
`["respond", "deny"]` for every question the rules route), each an `Action.Execute`:

- a question with choices: one button per choice (verb `answer`, its data the choice's index,
  `choice`) when they fit beside Decline (`MAX_BUTTONS`), else a list of them
  (`Input.ChoiceSet` `choice`, the indexes as values; not marked required, as Teams would
  then hold back Decline too) and one Answer button. What comes back
  is an index, looked up in the question itself (`chosen`), so the answer is recorded as the
  question spells it and a title never becomes the answer;
- a free-text question: an answer box (`answer`, at most `MAX_RESPONSE` characters) and an
  Answer button;
- Decline (verb `decline`), with the optional reason typed in its box (`reason`).

Never Approve, Edit or Deny. Once decided, the card says "Answered: <answer>", "Declined" (and
the reason) or "Timed out", who decided and when, with no actions.

The question, its choices and who asked are the agent's (untrusted): clipped, and escaped for
Adaptive Card markdown (`cards.plain`) wherever a card renders markdown (a `TextBlock`).
Button and choice titles are plain text in Adaptive Cards, so they are clipped only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from nodbot.bot.forms import MAX_REASON
from nodbot.bot.teams.cards import plain, render, when
from nodbot.core import ApprovalRecord
from nodbot.core.decisions import MAX_RESPONSE
from nodbot.core.questions import (
    MAX_CHOICE,
    MAX_CHOICES,
    MAX_QUESTION,
    Question,
    answer_of,
    question_of,
)
from nodbot.core.store import TIMEOUT_DECIDER

__all__ = [
    "MAX_BUTTONS",
    "QUESTION_VERBS",
    "UNREADABLE",
    "chosen",
    "question_card",
    "question_decided_card",
]

MAX_BUTTONS = 5
"""The most choices shown as buttons of their own (Teams shows six actions, Decline is the
sixth); a question with more offers them as a list."""
QUESTION_VERBS = frozenset({"answer", "decline"})
"""The verbs of a question's card."""
UNREADABLE = (
    "This question cannot be read (it is stored in a form this bot does not know): decline "
    "it, or open it in the inbox."
)


def chosen(question: Question | None, value: object) -> str | None:
    """The choice an action's `choice` names (its index, from 0, as the card writes it, or
    that number), as the question spells it; None when it names none of the question's
    choices (or the question has none)."""
    if question is None or question.choices is None:
        return None
    text = str(value) if isinstance(value, str | int) and not isinstance(value, bool) else ""
    # Only an index as the card writes it ("0", "1", ...): no other spelling names a choice.
    offered = {str(index): choice for index, choice in enumerate(question.choices)}
    return offered.get(text)


def _asker(question: Question | None) -> str:
    if question is None or question.asked_by is None:
        return "the run"
    return f"the tool {plain(question.asked_by, 100)}"


def _about(record: ApprovalRecord, question: Question | None) -> list[tuple[str, str]]:
    request = record.request
    about = [("Asked by", _asker(question))]
    if request.requested_by is not None:
        about.append(("For", plain(request.requested_by, 200)))
    about.append(("Run", plain(request.run_id, 200)))
    if request.deadline is not None:
        about.append(("Answer by", f"{when(request.deadline)} (then: declined)"))
    return about


def _text(question: Question | None) -> str:
    return UNREADABLE if question is None else plain(question.text, MAX_QUESTION)


def question_card(
    record: ApprovalRecord, *, allowed: Sequence[str], error: str | None = None
) -> dict[str, Any]:
    """The question's card while it waits (see the module): the answer actions where
    `allowed` lists `respond`, Decline where it lists `deny`, and `error` (why the last
    action was refused) shown on it. A question that cannot be read offers Decline only."""
    question = question_of(record.request)
    answering = question is not None and "respond" in allowed
    choices = [] if question is None or question.choices is None else question.choices
    titles = [choice[:MAX_CHOICE] for choice in choices[:MAX_CHOICES]]
    description = record.request.policy.get("description")
    return render(
        "question.json.j2",
        approval_id=record.approval_id,
        description=plain(description) if isinstance(description, str) else None,
        text=_text(question),
        about=_about(record, question),
        buttons=titles if answering and len(titles) <= MAX_BUTTONS else [],
        listed=titles if answering and len(titles) > MAX_BUTTONS else [],
        free_text=answering and question is not None and question.choices is None,
        decline="deny" in allowed,
        error=None if error is None else plain(error, 500),
        max_response=MAX_RESPONSE,
        max_reason=MAX_REASON,
    )


def question_decided_card(record: ApprovalRecord, *, note: str | None = None) -> dict[str, Any]:
    """The question's card once decided: "Answered: <answer>", "Declined" (with its reason)
    or "Timed out", who decided and when, the question; no actions. `note`: what to tell the
    person whose action came too late."""
    decision = record.decision
    if decision is None:
        raise ValueError(f"question {record.approval_id} is not decided")
    question = question_of(record.request)
    moment = when(record.decided_at) if record.decided_at is not None else "just now"
    by = plain(decision.decided_by or "someone", 200)
    answer = answer_of(record)
    reason = None
    if answer is not None:
        outcome, color = f"Answered: {plain(answer, MAX_RESPONSE)}", "Good"
        done = f"By {by}, {moment}"
    elif decision.decided_by == TIMEOUT_DECIDER:
        outcome, color = "Timed out: nobody answered before the deadline", "Attention"
        done = f"Declined, {moment}"
    elif decision.approved:  # not an outcome a question is given: said as it is
        outcome, color, done = "Closed, unanswered", "Attention", f"By {by}, {moment}"
    else:
        outcome, color, done = "Declined", "Attention", f"By {by}, {moment}"
        reason = plain(decision.reason) if decision.reason else None
    return render(
        "question_decided.json.j2",
        approval_id=record.approval_id,
        outcome=outcome,
        color=color,
        done=done,
        reason=reason,
        text=_text(question),
        about=_about(record, question),
        note=None if note is None else plain(note, 500),
    )
