"""A question to a person (`core.questions`) as the inbox shows it: never as a call.

A question is stored as a review of the pseudo-tool `ask`, answered by a respond and
declined by a deny, so that in store terms an answered question is "denied". The inbox
says what happened to it in a person's terms instead:

| the review                                        | shown as    |
|---------------------------------------------------|-------------|
| pending                                           | waiting     |
| a respond (`decision.response` set)               | answered    |
| a deny by `nodbot:timeout` (its deadline passed)  | timed out   |
| any other deny (a person's, or nobody to ask)     | declined    |

and it is never offered Approve or Edit: its page has an answer form (the choices as radio
buttons, or a text for a free answer) and a Decline form; the list has no box to tick for
it (selected reviews are approved or denied, which a question is not). Every function here
is pure: the question's text and answer come from an agent and a person, and the templates
escape them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias

from nodbot.core import ApprovalRecord
from nodbot.core.questions import answer_of, is_question, question_of
from nodbot.core.store import TIMEOUT_DECIDER

__all__ = ["QuestionView", "outcome_class", "outcome_word", "question_view"]

State: TypeAlias = Literal["waiting", "answered", "declined", "timed out"]

UNREADABLE = "(this question cannot be read: it was stored in another shape)"
"""What a question's page says of a question it cannot read: it may then only be declined."""


@dataclass(frozen=True)
class QuestionView:
    """A question's review as the inbox shows it."""

    text: str
    """The question, as asked (escaped wherever shown)."""
    choices: tuple[str, ...] | None
    """The answers to choose from; None for a free-text answer."""
    asked_by: str | None
    """The tool that asks; None for a question of the run itself."""
    state: State
    answer: str | None
    """The answer given; None while it waits, or once declined or timed out."""
    readable: bool = True
    """False for a stored question of another shape: it is shown so, and only declined."""

    @property
    def answerable(self) -> bool:
        """Whether an answer form may be offered (it waits, and can be read)."""
        return self.state == "waiting" and self.readable


def question_view(record: ApprovalRecord) -> QuestionView | None:
    """The question `record` asks, as the inbox shows it; None for a call's review."""
    if not is_question(record.request):
        return None
    found = question_of(record.request)
    state = _state(record)
    if found is None:
        return QuestionView(UNREADABLE, None, None, state, answer_of(record), readable=False)
    return QuestionView(found.text, found.choices, found.asked_by, state, answer_of(record))


def outcome_word(record: ApprovalRecord) -> str:
    """The word for where a review stands, as the list and the page say it: a question's
    state (`question_view`), a respond's "answered", an edit's "edited and approved", else
    the store's status."""
    if is_question(record.request):
        return _state(record)
    decision = record.decision
    if decision is not None and decision.response is not None:
        return "answered"
    if decision is not None and decision.edited_args:
        return "edited and approved"
    return record.status


def outcome_class(record: ApprovalRecord) -> str:
    """The style of where a review stands (`.status.<class>` in `base.html`): `answered`,
    `declined` and `timed-out` for a question, `answered` for a respond, else the store's
    status (an edit is approved)."""
    if is_question(record.request):
        state = _state(record)
        return "pending" if state == "waiting" else state.replace(" ", "-")
    decision = record.decision
    if decision is not None and decision.response is not None:
        return "answered"
    return record.status


def _state(record: ApprovalRecord) -> State:
    decision = record.decision
    if decision is None:
        return "waiting"
    if decision.response is not None:
        return "answered"
    if decision.decided_by == TIMEOUT_DECIDER:
        return "timed out"
    return "declined"
