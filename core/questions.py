"""Questions to a person (seed 001's `interrupt()`): a run asks, pauses, and goes on with the
answer.

```python
@registry.tool()
async def ship(order_id: str, ctx: ToolContext) -> str:
    warehouse = await ctx.ask("Which warehouse ships it?", choices=["Leeds", "Porto"])
    return f"{order_id} ships from {warehouse}"
```

A question is stored as a review of the pseudo-tool `ask` (`QUESTION_TOOL`), with the
question as its arguments (`{"question", "choices", "asked_by"}`), so it has everything a
review has: it waits in the store (a restart loses nothing), goes to people on Slack, email
and the inbox, is authorized, audited in the review's hash chain, times out, and the first
answer wins. Its answer is a respond (`Decision.response`: the person's text, one of the
`choices` when there are choices); a denial declines it, and `ask` raises
`QuestionUnanswered` with its reason (so does a timeout).

```
ctx.ask(question) ─► the question's review (run id, "<call id>.ask_<key>")
                       ├─ pending ───────────► QuestionPending: the call (the run) pauses
                       ├─ answered ──────────► the answer (the call that asked runs again
                       │                        from the top on resume; ask returns it)
                       └─ declined, timed out ► QuestionUnanswered
```

The tool that asks runs again from the top when the run resumes, as a node does after
`interrupt()`: code before `ask` runs twice, so keep effects after it. A tool whose call a
reviewer approved may not ask (its approval covers one run of it): ask in a tool that needs
no review, before the call that does (`InvalidQuestionError` otherwise, nothing asked).

A question's id within its call (`key`) is yours to give (`id="warehouse"`); by default it
is a digest of the question and its choices, so the same question in the same call is one
question, however many times the call runs.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nodbot.core.decisions import MAX_RESPONSE
from nodbot.core.errors import InvalidQuestionError
from nodbot.core.store import ApprovalRecord, ApprovalRequest
from nodbot.core.tools import NOT_TEXT, arguments_digest, canonical_json, unencodable

__all__ = [
    "MAX_CHOICE",
    "MAX_CHOICES",
    "MAX_QUESTION",
    "QUESTION_TOOL",
    "Question",
    "answer_of",
    "answer_problem",
    "choice_for",
    "is_question",
    "make_question",
    "question_of",
    "question_request",
]

QUESTION_TOOL = "ask"
"""The tool name a question's review is stored under: rules name it (`tool: ask`) to say who
answers questions (`when` may look at `asked_by`, the tool that asks)."""
MAX_QUESTION = 2_000
"""The most characters of a question."""
MAX_CHOICES = 25
"""The most choices a question offers (Slack shows at most 25 buttons in one block)."""
MAX_CHOICE = 75
"""The most characters of one choice (Slack's limit for a button's text)."""
MAX_KEY = 40
"""The most characters of a question's id within its call."""
_KEY = re.compile(r"[A-Za-z0-9_-]{1,40}\Z")
_CALL_ID = 255
"""The most characters of a stored call id."""


@dataclass(frozen=True)
class Question:
    """A question put to a person."""

    text: str
    choices: tuple[str, ...] | None
    """The answers to choose from; None for a free-text answer."""
    key: str
    """Its id within the call that asks (letters, digits, `_`, `-`)."""
    asked_by: str | None = None
    """The tool that asks; None for a question of the run itself (or of the HTTP API)."""

    @property
    def arguments(self) -> dict[str, Any]:
        """The question as its review's arguments (what a person is shown)."""
        return {
            "question": self.text,
            "choices": None if self.choices is None else list(self.choices),
            "asked_by": self.asked_by,
        }


def _problem(field: str, message: str) -> InvalidQuestionError:
    return InvalidQuestionError(
        f"cannot ask this question: {field}: {message}",
        errors=[{"field": field, "message": message}],
    )


def make_question(
    text: object,
    *,
    choices: Sequence[object] | None = None,
    key: object = None,
    asked_by: str | None = None,
) -> Question:
    """A checked question. Raises `InvalidQuestionError` naming the field at fault: text
    that is not a string, blank or over `MAX_QUESTION` characters; choices that are not a
    list of 2 to `MAX_CHOICES` distinct, non-blank strings of at most `MAX_CHOICE`
    characters; a key of other characters, or longer than `MAX_KEY`."""
    if not isinstance(text, str):
        raise _problem("question", f"expected text, not {type(text).__name__}")
    if unencodable(text) is not None:
        raise _problem("question", NOT_TEXT)
    if not text.strip():
        raise _problem("question", "it is blank")
    if len(text) > MAX_QUESTION:
        raise _problem("question", f"{len(text)} characters; at most {MAX_QUESTION}")
    found: tuple[str, ...] | None = None
    if choices is not None:
        if isinstance(choices, str | bytes) or not isinstance(choices, Sequence):
            raise _problem("choices", "expected a list of strings")
        if not 2 <= len(choices) <= MAX_CHOICES:
            raise _problem("choices", f"{len(choices)} given; between 2 and {MAX_CHOICES}")
        texts: list[str] = []
        for index, choice in enumerate(choices):
            if not isinstance(choice, str) or not choice.strip():
                raise _problem(f"choices.{index}", "expected non-blank text")
            if len(choice) > MAX_CHOICE or "\n" in choice:
                raise _problem(f"choices.{index}", f"one line of at most {MAX_CHOICE} characters")
            if unencodable(choice) is not None:
                raise _problem(f"choices.{index}", NOT_TEXT)
            texts.append(choice.strip())
        if len({each.casefold() for each in texts}) != len(texts):
            raise _problem("choices", "two choices are the same")
        found = tuple(texts)
    if key is None:
        digest = hashlib.sha256(canonical_json([text, found]).encode()).hexdigest()
        key = "q" + digest[:16]
    if not isinstance(key, str) or not _KEY.match(key):
        raise _problem("id", f"letters, digits, '_' and '-', 1 to {MAX_KEY} of them")
    return Question(text=text, choices=found, key=key, asked_by=asked_by)


def question_call_id(call_id: str | None, key: str) -> str:
    """The call id a question's review is stored under: `<call id>.ask_<key>` for a
    question a tool asks, `ask_<key>` for one of the run itself. A call id too long to
    carry the suffix is replaced by its digest."""
    suffix = f"ask_{key}"
    if call_id is None:
        return suffix
    if len(call_id) + 1 + len(suffix) > _CALL_ID:
        call_id = "sha256-" + hashlib.sha256(call_id.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{call_id}.{suffix}"


def question_request(
    question: Question,
    *,
    run_id: str,
    call_id: str | None,
    requested_by: str | None,
) -> ApprovalRequest:
    """The review a question is stored as (see the module)."""
    arguments = question.arguments
    return ApprovalRequest(
        run_id=run_id,
        call_id=question_call_id(call_id, question.key),
        tool=QUESTION_TOOL,
        arguments=arguments,
        digest=arguments_digest(arguments),
        requested_by=requested_by,
        policy={"question": {"key": question.key}},
    )


def is_question(request: ApprovalRequest) -> bool:
    """Whether the review is a question (`question_request`), not a call's."""
    return request.tool == QUESTION_TOOL and isinstance(request.policy.get("question"), dict)


def question_of(request: ApprovalRequest) -> Question | None:
    """The question a review asks; None for a call's review (or one unreadable as a
    question)."""
    if not is_question(request):
        return None
    arguments = request.arguments
    text, choices = arguments.get("question"), arguments.get("choices")
    key = request.policy["question"].get("key")
    asked_by = arguments.get("asked_by")
    if not isinstance(text, str) or not isinstance(key, str):
        return None
    if choices is not None and not (
        isinstance(choices, list) and all(isinstance(c, str) for c in choices)
    ):
        return None
    return Question(
        text=text,
        choices=None if choices is None else tuple(choices),
        key=key,
        asked_by=asked_by if isinstance(asked_by, str) else None,
    )


def choice_for(choices: Sequence[str], text: str) -> str | None:
    """The choice `text` names: the choice itself (case and surrounding blanks aside), or
    its number from 1; None when it names none."""
    wanted = text.strip().casefold()
    for choice in choices:
        if choice.casefold() == wanted:
            return choice
    if wanted.isdigit() and wanted.isascii() and 1 <= int(wanted) <= len(choices):
        return choices[int(wanted) - 1]
    return None


def answer_problem(request: ApprovalRequest, text: str) -> str | None:
    """What is wrong with `text` as the answer to the question of `request`, in words fit
    for the person who wrote it; None when it may be given. (A choice is named as
    `choice_for` reads it.)"""
    if not text.strip():
        return "an answer is needed"
    if len(text) > MAX_RESPONSE:
        return f"the answer has {len(text)} characters; at most {MAX_RESPONSE} are allowed"
    question = question_of(request)
    choices = None if question is None else question.choices
    if choices is not None and choice_for(choices, text) is None:
        return "answer with one of: " + ", ".join(choices)
    return None


def answer_of(record: ApprovalRecord) -> str | None:
    """The answer a question's review was given; None while it waits, or when it was
    declined or timed out (or for a call's review)."""
    if not is_question(record.request) or record.decision is None:
        return None
    return record.decision.response
