"""Questions by email (`core.questions`): how a reply answers a question, and what its
emails show of it.

A reply to a question is read as a review's reply is (`reading.reply_text`: the text above
the quoted request, quotes and signatures cut, hidden HTML left out), and its first line
that is not blank says what it does (`answer_command`):

```
first line                       choices: Leeds, Porto            free text
──────────────────────────────── ──────────────────────────────── ────────────────────────
"2", "porto", "Porto.", "2. Porto" answers Porto                   answers with the line
"decline" [reason]               declines (reason: the rest of the line and the lines below)
"answer: <text>"                 answers with <text> (an answer that starts with "decline")
"Paris", "7", "approve", ""      Unclear: nothing is recorded     (free text: answers)
```

For a question with choices, a line that names a choice (`choice_for`: its number from 1 or
its text, case and surrounding blanks aside; a full stop or an exclamation mark after it, or
its number before it as the request lists it, "2. Porto") is that choice, as the question
spells it, even when the choice is itself "Decline"; to decline such a question, give a
reason ("decline: no time"). Anything else names none, and the reply is `Unclear`
("not_a_choice"), with what to send: a reply never answers with anything but a choice.

For a free-text question the answer is that one line (a signature or a greeting below it is
no part of it); a line over `MAX_RESPONSE` characters is refused by the inbound door
(`core.questions.answer_problem`), as every answer is checked there again.

A reply with a text part and an HTML part is read in both (`reply_answer`), as
`reading.reply_command` does: they must give the same choice, or both decline, or (free
text) both answer, and the text part's answer is taken; otherwise nothing is recorded
("parts_disagree").
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from email.message import EmailMessage
from typing import Any

from nodbot.bot.email.reading import Deny, Respond, Unclear, reply_parts
from nodbot.core.questions import Question, choice_for

__all__ = ["Answered", "answer_command", "first_line", "how_to_answer", "reply_answer", "shown"]

Answered = Respond | Deny | Unclear
"""What a reply to a question does: answers (`Respond`, the answer its `text`), declines
(`Deny`, the reason its `reason`), or nothing (`Unclear`)."""

FIRST_LINE = 100
"""Characters of a question's first line at most, where a subject names it."""

_DECLINE = re.compile(r"^decline\b[\s.,:;!\-\u2013\u2014]*(.*)$", re.IGNORECASE | re.DOTALL)
_ANSWER = re.compile(r"^answer\s*:\s*(.*)$", re.IGNORECASE | re.DOTALL)
_NUMBERED = re.compile(r"^([0-9]{1,2})\s*[.)]\s*(.+)$", re.DOTALL)
_ENDING = ".!"


def how_to_answer(choices: Sequence[str] | None) -> str:
    """How to answer a question, in a sentence for the person who replied."""
    if choices is None:
        return (
            "Reply with your answer on the first line above the quoted question (only that "
            'line counts), or "decline" followed by a reason. An answer that starts with the '
            'word "decline" is written after "answer:".'
        )
    listed = ", ".join(f"{number}. {choice}" for number, choice in enumerate(choices, 1))
    return (
        f'Reply with the number or the text of one choice ({listed}), or "decline" followed '
        "by a reason, as the first line above the quoted question."
    )


def answer_command(text: str, *, choices: Sequence[str] | None) -> Answered:
    """What `text` (a `reading.reply_text`) does to a question with `choices` (None: free
    text); see the module."""
    lines = [line.strip() for line in text.split("\n")]
    while lines and not lines[0]:
        lines.pop(0)
    if not lines:
        return Unclear(
            "empty", f"The reply had no text above the quoted question. {how_to_answer(choices)}"
        )
    first, below = lines[0], lines[1:]
    if choices is not None:
        chosen = _choice(first, choices)
        if chosen is not None:
            return Respond(chosen)
    declined = _DECLINE.match(first)
    if declined is not None:
        reason = "\n".join([declined.group(1).strip(), *below]).strip()
        return Deny(reason or None)
    given = _ANSWER.match(first)
    answer = first if given is None else given.group(1).strip()
    if choices is None:
        if not answer:
            return Unclear(
                "empty", f'"answer:" needs the answer after it. {how_to_answer(choices)}'
            )
        return Respond(answer)
    chosen = _choice(answer, choices) if given is not None else None
    if chosen is not None:
        return Respond(chosen)
    return Unclear(
        "not_a_choice",
        f"The reply starts with {first[:60]!r}, which names none of the choices. "
        f"{how_to_answer(choices)}",
    )


def _choice(line: str, choices: Sequence[str]) -> str | None:
    """The choice `line` names (see the module), or None."""
    found = choice_for(choices, line) or choice_for(choices, line.rstrip(_ENDING))
    if found is not None:
        return found
    numbered = _NUMBERED.match(line)
    if numbered is None:
        return None
    by_number = choice_for(choices, numbered.group(1))
    named = numbered.group(2)
    by_text = choice_for(choices, named) or choice_for(choices, named.rstrip(_ENDING))
    return by_number if by_number is not None and by_number == by_text else None


def reply_answer(message: EmailMessage, *, choices: Sequence[str] | None) -> Answered:
    """What `message` does to a question with `choices`: `answer_command` of its
    `reply_text`, read in its text and its HTML part, which must agree (see the module)."""
    plain, html = reply_parts(message)
    said = answer_command(plain, choices=choices)
    if html is None:
        return said
    shown_as = answer_command(html, choices=choices)
    if _same(said, shown_as, free_text=choices is None):
        return said
    return Unclear(
        "parts_disagree",
        f"The plain text and the HTML of the reply say different things ({_named(said)} and "
        f"{_named(shown_as)}), so which one you saw is not clear. {how_to_answer(choices)}",
    )


def _same(one: Answered, other: Answered, *, free_text: bool) -> bool:
    if isinstance(one, Respond) and isinstance(other, Respond):
        return free_text or one.text == other.text
    return type(one) is type(other)


def _named(said: Answered) -> str:
    if isinstance(said, Respond):
        return f'"{said.text[:60]}"'
    if isinstance(said, Deny):
        return '"decline"'
    return "no answer"


def first_line(question: Question) -> str:
    """The question's first line that is not blank, at most `FIRST_LINE` characters (for a
    subject: the channel still makes it one line, `channel.one_line`)."""
    line = next((line for line in question.text.splitlines() if line.strip()), "")
    line = " ".join(line.split())
    return line if len(line) <= FIRST_LINE else line[: FIRST_LINE - 1].rstrip() + "\u2026"


def shown(question: Question) -> dict[str, Any]:
    """A question as the email templates show it."""
    return {
        "question": question.text,
        "first_line": first_line(question),
        "choices": None if question.choices is None else list(question.choices),
        "asked_by": question.asked_by,
    }
