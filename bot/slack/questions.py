"""The Slack messages and modals of a question (`core.questions`): what a person is asked, the
buttons that answer it, and the message once it is answered, declined or timed out.

A question's message goes where a review's request goes (`bot.slack.channel`: the same
places, the same outbox delivery). It is headed "Question" and shows the question, who asked
it (the tool that asks, or the run itself), for whom (the run's requester), the run and the
deadline; then its buttons, as the rule allows (`allowed_decisions`, `["respond", "deny"]`
for every question the rules route):

- a question with choices has one button per choice (`choice_action(i)`: `nodbot.answer.<i>`,
  each its own action id, as Block Kit wants them distinct in a block), whose value names the
  review and the choice (`choice_value`: `<approval id>:<i>`). What comes back is read by
  `chosen`, which accepts only a value whose index is the action id's; the choice is then
  looked up in the question itself, so a button's text never becomes the answer;
- a free-text question has an "Answer" button (`ACTION_ANSWER`) that opens a modal for the
  text (`answer_modal`, at most `MAX_RESPONSE` characters);
- "Decline" (`ACTION_DECLINE`) opens a modal for an optional reason (`decline_modal`), told to
  the agent;
- "Open in inbox", with `web.public_url`, as on a review.

Never Approve, Edit or Respond. Once decided, the message (`question_decided`) says "Answered
by <who>: <answer>", "Declined by <who>: <reason>" or "Nobody answered before the deadline",
with no buttons. A question too long for one section once escaped is shown cut, and whole in
the message's thread (`whole_question`).

Everything the agent wrote (the question, its choices, who asked) and the person typed (an
answer, a reason) is escaped here (`bot/slack/text.py`) before it reaches a template, and cut
to Block Kit's limits.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

import jinja2

from nodbot.bot.slack.messages import (
    ACTION_OPEN,
    FIELD,
    HEADER,
    SECTION,
    TEXT,
    THREAD_TEXT,
    Rendered,
    link,
    when,
    who,
)
from nodbot.bot.slack.text import clip, code, escape, plain
from nodbot.core import ApprovalRecord
from nodbot.core.decisions import MAX_RESPONSE
from nodbot.core.questions import MAX_CHOICES, Question, answer_of, question_of
from nodbot.core.store import TIMEOUT_DECIDER

__all__ = [
    "ACTION_ANSWER",
    "ACTION_CHOICE",
    "ACTION_DECLINE",
    "ANSWER_CALLBACK",
    "DECLINE_CALLBACK",
    "answer_modal",
    "choice_action",
    "choice_value",
    "chosen",
    "decline_modal",
    "question_decided",
    "question_message",
    "question_summary",
    "whole_question",
]

ACTION_CHOICE = re.compile(r"\Anodbot\.answer\.(?P<index>[0-9]{1,2})\Z")
"""The action ids of a question's choice buttons (`choice_action`)."""
ACTION_ANSWER = "nodbot.answer"
"""The "Answer" button of a free-text question: it opens the answer modal."""
ACTION_DECLINE = "nodbot.decline"
"""The "Decline" button of a question: it opens the decline modal."""
ANSWER_CALLBACK = "nodbot.answer"
DECLINE_CALLBACK = "nodbot.decline"

MAX_VALUE = 200
"""The most characters of a choice button's value read back (the bot's are far shorter)."""
UNREADABLE = (
    "This question cannot be read (it is stored in a form this bot does not know): decline "
    "it, or open it in the inbox."
)

_templates = jinja2.Environment(
    loader=jinja2.PackageLoader("nodbot", "templates/slack"),  # package data of `nodbot`
    autoescape=False,  # JSON, not HTML: values are escaped for Slack, then made JSON by tojson
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=False,
)


def _render(name: str, **context: Any) -> Any:
    return json.loads(_templates.get_template(name).render(**context))


def choice_action(index: int) -> str:
    """The action id of the button of choice `index` (from 0)."""
    return f"nodbot.answer.{index}"


def choice_value(approval_id: str, index: int) -> str:
    """The value of the button of choice `index` of the question `approval_id`."""
    return f"{approval_id}:{index}"


def chosen(
    action_id: str, value: str, pattern: re.Pattern[str] = ACTION_CHOICE
) -> tuple[str, int] | None:
    """The review and the choice (its index, from 0) a choice button's click names; None when
    the action id is not a choice button's (`pattern`: a message's by default, the App
    Home's have their own), the value is not `<approval id>:<index>` (or is longer than
    `MAX_VALUE`), or the two disagree on the index. Whether the index is one of the
    question's is for the caller to check, against the question."""
    found = pattern.fullmatch(action_id)
    if found is None or len(value) > MAX_VALUE:
        return None
    approval_id, colon, index = value.rpartition(":")
    if not colon or not approval_id or index != found["index"]:
        return None
    return approval_id, int(index)


def _shown(text: str, limit: int) -> tuple[str, bool]:
    """`text` escaped within `limit` characters, and whether it was cut (cut before it is
    escaped, so that no escape is left half)."""
    shown = escape(text)
    if len(shown) <= limit:
        return shown, False
    raw = text
    while len(escape(raw)) + 1 > limit:
        raw = raw[: len(raw) - (len(escape(raw)) + 1 - limit)]
    return escape(raw) + "…", True


def _asker(question: Question | None) -> str:
    """Who asked: the tool, as code, or the run itself."""
    if question is None or question.asked_by is None:
        return "the run"
    name = escape(clip(question.asked_by, 100)).replace("`", "'")
    return f"the tool `{name}`"


def _facts(record: ApprovalRecord, question: Question | None) -> list[str]:
    request = record.request
    facts = [f"*Asked by*\n{_asker(question)}"]
    if request.requested_by is not None:
        facts.append(f"*For*\n{who(request.requested_by)}")
    facts.append(f"*Run*\n`{escape(clip(request.run_id, 200))}`")
    if request.deadline is not None:
        facts.append(f"*Answer by*\n{when(request.deadline)} (then: declined)")
    return [clip(fact, FIELD) for fact in facts]


def _text(question: Question | None) -> tuple[str, bool]:
    """The question as the message shows it, and whether it was cut."""
    if question is None:
        return UNREADABLE, False
    return _shown(question.text, SECTION)


def question_message(
    record: ApprovalRecord, *, allowed: Sequence[str], page: str | None = None
) -> Rendered:
    """The question's request: the rule's description, the question, who asked, for whom,
    the run and the deadline;
    one button per choice (or "Answer" for free text) where `allowed` lists `respond`,
    "Decline" where it lists `deny`, and "Open in inbox" when `page` is given. A question
    that cannot be read offers Decline only."""
    question = question_of(record.request)
    text, cut = _text(question)
    answers: list[dict[str, Any]] = []
    buttons: list[dict[str, Any]] = []
    if question is not None and "respond" in allowed:
        if question.choices is not None:
            answers = [
                {
                    "action_id": choice_action(index),
                    "label": plain(choice, 75),
                    "value": choice_value(record.approval_id, index),
                }
                for index, choice in enumerate(question.choices[:MAX_CHOICES])
            ]
        else:
            buttons.append(
                {
                    "action_id": ACTION_ANSWER,
                    "label": "Answer",
                    "style": "primary",
                    "value": record.approval_id,
                    "url": None,
                }
            )
    if "deny" in allowed:
        buttons.append(
            {
                "action_id": ACTION_DECLINE,
                "label": "Decline",
                "style": None,
                "value": record.approval_id,
                "url": None,
            }
        )
    if page is not None:
        buttons.append(
            {"action_id": ACTION_OPEN, "label": "Open in inbox", "style": None, "value": None,
             "url": page}
        )  # fmt: skip
    description = record.request.policy.get("description")
    blocks = _render(
        "question.json.j2",
        header="Question",
        description=clip(escape(description), SECTION) if isinstance(description, str) else None,
        text=text,
        facts=_facts(record, question),
        note="The question is long: it is whole in this message's thread." if cut else None,
        answers=answers,
        buttons=buttons,
    )
    fallback = "a question" if question is None else clip(escape(question.text), 200)
    return Rendered(
        clip(f"Question: {fallback} (run {escape(record.request.run_id)})", TEXT), blocks, cut
    )


def question_decided(record: ApprovalRecord, *, page: str | None = None) -> Rendered:
    """The question once decided: "Answered by <who>: <answer>", "Declined by <who>:
    <reason>" or "Nobody answered before the deadline", then the question, no buttons, and
    a link to `page` in the footer when it is given."""
    decision = record.decision
    if decision is None:
        raise ValueError(f"question {record.approval_id} is not decided")
    question = question_of(record.request)
    moment = when(record.decided_at) if record.decided_at is not None else "just now"
    answer = answer_of(record)
    if answer is not None:
        verb, outcome = "answered", f"*Answered* by {who(decision.decided_by)}, {moment}:"
        one_line = question is not None and question.choices is not None and "\n" not in answer
        if one_line:
            outcome += " *" + _shown(answer, 200)[0] + "*"
        else:
            outcome += "\n" + code(answer, SECTION - len(outcome) - 1)
    elif decision.decided_by == TIMEOUT_DECIDER:
        verb = "timed out"
        outcome = f"*Nobody answered before the deadline* ({moment}): the question is declined."
    elif decision.approved:  # not an outcome a question is given: said as it is
        verb, outcome = "closed", f"*Closed* by {who(decision.decided_by)}, {moment}, unanswered."
    else:
        verb, outcome = "declined", f"*Declined* by {who(decision.decided_by)}, {moment}"
        if decision.reason:
            outcome += ":\n" + code(decision.reason, SECTION - len(outcome) - 2)
    text, _ = _text(question)
    footer = f"Question `{escape(record.approval_id)}`"
    if page is not None:
        footer += f" · {link(page, 'Open in inbox')}"
    blocks = _render(
        "question_decided.json.j2",
        header=plain(f"Question {verb}", HEADER),
        outcome=clip(outcome, SECTION),
        text=text,
        facts=_facts(record, question),
        footer=footer,
    )
    fallback = f"Question {verb} (run {escape(record.request.run_id)})"
    return Rendered(clip(fallback, TEXT), blocks)


def whole_question(record: ApprovalRecord) -> str:
    """The whole question, for the thread reply under a message that shows it cut."""
    question = question_of(record.request)
    text = question.text if question is not None else json.dumps(record.request.arguments)
    return "The whole question:\n" + code(text, THREAD_TEXT)


def _summary(record: ApprovalRecord, limit: int) -> str:
    """Who asks what, for a modal: the asker, the run, the question (cut to `limit`)."""
    question = question_of(record.request)
    head = f"*Question* from {_asker(question)} in run `{escape(clip(record.request.run_id, 100))}`"
    text = UNREADABLE if question is None else _shown(question.text, limit)[0]
    return clip(f"{head}:\n{text}", SECTION)


def answer_modal(record: ApprovalRecord) -> dict[str, Any]:
    """The Answer modal: the answer (needed, at most `MAX_RESPONSE` characters; one of the
    choices, or its number, for a question that has choices), given to the agent."""
    question = question_of(record.request)
    choices = None if question is None else question.choices
    hint = (
        "One of: " + ", ".join(choices) + " (or its number)."
        if choices is not None
        else f"At most {MAX_RESPONSE:,} characters."
    )
    view: dict[str, Any] = _render(
        "answer_modal.json.j2",
        approval_id=record.approval_id,
        summary=_summary(record, 2500),
        hint=plain(hint, 2000),
        max_length=MAX_RESPONSE,
    )
    return view


def decline_modal(record: ApprovalRecord) -> dict[str, Any]:
    """The Decline modal: an optional reason, told to the agent."""
    view: dict[str, Any] = _render(
        "decline_modal.json.j2", approval_id=record.approval_id, summary=_summary(record, 2500)
    )
    return view


def question_summary(record: ApprovalRecord, *, inbox: bool = False) -> str:
    """A question in a few lines of mrkdwn (at most 3,000 characters), for the App Home and
    `/nodbot pending`: who asks, for whom and when, the question, its choices, its id, run
    and deadline, and how to answer it (`inbox`: in the web inbox too)."""
    request = record.request
    question = question_of(request)
    head = f"*Question* from {_asker(question)}, for {who(request.requested_by)}, "
    head += when(record.created_at)
    text = UNREADABLE if question is None else _shown(question.text, 1500)[0]
    lines = [head, text]
    if question is not None and question.choices is not None:
        numbered = " · ".join(
            f"{index}. {escape(choice)}" for index, choice in enumerate(question.choices, 1)
        )
        lines.append(clip(f"Choices: {numbered}", 800))
    facts = f"Question `{escape(record.approval_id)}` · run `{escape(clip(request.run_id, 100))}`"
    if request.deadline is not None:
        facts += f" · answer by {when(request.deadline)}"
    lines.append(facts)
    inbox_too = ", or in the inbox" if inbox else ""
    lines.append(f"Answer it with the buttons of its message{inbox_too}.")
    return clip("\n".join(lines), 3000)
