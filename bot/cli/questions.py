"""Questions (`core.questions`) from a shell: `nodbot approvals answer ID TEXT` and
`nodbot approvals decline ID`, and how `approvals list` and `show` give a question.

A question is a review of the pseudo-tool `ask`; answering it is a respond (one of its
choices, when it has choices), declining it a deny, each a vote over channel `cli` allowed
by its rule as on every other channel. `list` and `show` give a question as a question:
where it stands (`answered`, `declined`, `timed out`; the store's status of each is
`denied`), its text and choices, and its answer. Every text a person or an agent wrote (the
question, the answer, a reason) is shown with its control and format characters escaped, so
none of it acts on the terminal.
"""

from __future__ import annotations

import argparse
from datetime import UTC
from typing import Any

from nodbot.bot.forms import MAX_REASON
from nodbot.bot.http.schemas import question_state
from nodbot.core import ApprovalRecord, NodbotError
from nodbot.core.decisions import MAX_RESPONSE
from nodbot.core.questions import answer_of, question_of
from nodbot.core.store import TIMEOUT_DECIDER

__all__ = [
    "NotAQuestionError",
    "add_question_commands",
    "answer_mistake",
    "describe_question",
    "question_row",
    "shown",
]

STATES = {"waiting": "pending", "answered": "answered", "declined": "declined"}
"""How `list` writes where a question stands (`timed_out` as `timed out`)."""


class NotAQuestionError(NodbotError):
    """`approvals answer` or `decline` named a call's review, not a question (a bad input:
    decide it with `approvals decide`)."""

    kind = "not-a-question"


def add_question_commands(actions: Any) -> None:
    """Add `approvals answer ID TEXT` and `approvals decline ID` to the `approvals` group."""
    answer = actions.add_parser(
        "answer",
        help="answer a question put to a person",
        description="Answer a question (a review of the tool ask) as WHO: one of its "
        "choices (the choice itself, any case, or its number from 1) when it has choices, "
        "else free text. Allowed by the question's rule as on every channel; recorded "
        "with channel cli. An answer that is none of the choices is refused (exit 2), "
        "and nothing is recorded.",
    )
    answer.add_argument("approval_id", metavar="ID", help="the question's approval id")
    answer.add_argument("text", metavar="TEXT", help="the answer")
    decline = actions.add_parser(
        "decline",
        help="decline a question put to a person",
        description="Decline a question (a review of the tool ask) as WHO, with an "
        "optional reason: the run that asked is told it was not answered.",
    )
    decline.add_argument("approval_id", metavar="ID", help="the question's approval id")
    decline.add_argument("--reason", help="why (the run that asked is told)")
    for parser in (answer, decline):
        parser.add_argument(
            "--as",
            dest="principal",
            required=True,
            metavar="WHO",
            help="who answers: a Slack user id or an email address, as in the rules' reviewers",
        )
        parser.add_argument("--config", default="nodbot.yml", metavar="FILE")


def answer_mistake(arguments: argparse.Namespace) -> str | None:
    """`approvals answer` and `decline`: what is wrong with the answer or the reason (blank,
    too long), or None. Checked before the configuration is read; whether the answer is one
    of the choices is checked against the question."""
    if arguments.action == "answer":
        text = arguments.text
        if not text.strip():
            return "an answer is needed"
        if len(text) > MAX_RESPONSE:
            return f"the answer has {len(text)} characters; at most {MAX_RESPONSE} are allowed"
        return None
    reason = arguments.reason
    if reason is not None and len(reason) > MAX_REASON:
        return f"argument --reason: at most {MAX_REASON} characters, not {len(reason)}"
    return None


def shown(text: str, limit: int | None = None) -> str:
    """`text` as a terminal may show it: characters that are not printable (controls,
    format characters such as bidirectional overrides, line breaks) escaped; cut to `limit`
    characters with `…`."""
    if limit is not None and len(text) > limit:
        text = text[:limit] + "…"
    return "".join(
        char if char.isprintable() else char.encode("unicode_escape").decode("ascii")
        for char in text
    )


def question_row(record: ApprovalRecord) -> tuple[str, str] | None:
    """A question's STATUS and ARGUMENTS cells in `approvals list`; None for a call's
    review."""
    question = question_of(record.request)
    if question is None:
        return None
    state = question_state(record)
    cell = shown(question.text, 60)
    answer = answer_of(record)
    if answer is not None:
        cell += f"  answer: {shown(answer, 60)}"
    return STATES.get(state, "timed out"), cell


def describe_question(record: ApprovalRecord) -> list[str] | None:
    """The lines `approvals show` (and `decide`, `answer`, `decline`) print for a question;
    None for a call's review."""
    question = question_of(record.request)
    if question is None:
        return None
    decision = record.decision
    state = question_state(record)
    if decision is None:
        header = "waiting for an answer"
    elif state == "answered":
        header = f"answered by {decision.decided_by}"
    elif state == "timed_out":
        header = "timed out: nobody answered before the deadline"
    else:
        header = f"declined by {decision.decided_by}"
        if decision.reason:
            header += f": {shown(decision.reason)}"
    request = record.request
    asked_by = f", by the tool {question.asked_by}" if question.asked_by else ""
    lines = [
        f"question {record.approval_id} ({header})",
        f"  run {request.run_id}, call {request.call_id}, "
        f"asked for {request.requested_by or 'nobody known'}{asked_by}",
        f"  asks: {shown(question.text)}",
    ]
    if question.choices is not None:
        lines.append("  choices: " + ", ".join(shown(choice) for choice in question.choices))
    answer = answer_of(record)
    if answer is not None:
        lines.append(f"  answer: {shown(answer)}")
    lines.append(_deadline(record))
    return lines


def _deadline(record: ApprovalRecord) -> str:
    deadline = record.request.deadline
    if deadline is None:
        return "  no deadline: it waits until someone answers or declines it"
    when = f"  deadline {deadline.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"
    if record.status != "pending":
        return when
    return f"{when}, then declined by {TIMEOUT_DECIDER} if nobody answers"
