"""What a reviewer is shown (`ToolInterrupt`) and what a reviewer answers (`Decision`).

Answers come in the vocabularies of the seeds, and `as_decision` normalizes each:

- approve: `True`, `ToolDecision(action="approve")`, `{"action": "approve"}`, and
  LangChain's `{"type": "approve"}`;
- edit (approve with the edit merged in): `ToolDecision(action="edit", arguments=...)`,
  `{"action": "edit", "arguments": ...}` or with `"edited_arguments"` (the HTTP API's name),
  and LangChain's `{"type": "edit", "edited_action": {"name": <the call's tool>, "args": ...}}`;
- deny, the message the reason: `ToolDecision(action="deny", message=...)`,
  `{"action": "deny", "message": ...}`, LangChain's `{"type": "reject", "message": ...}`;
- deny, no reason: `False`, `None`;
- respond, the reviewer answering in the tool's place, the message the answer:
  `ToolDecision(action="respond", message=...)`, `{"action": "respond", "message": ...}`,
  LangChain's `{"type": "respond", "message": ...}`;
- as given: `Decision(...)` and its dict `{"approved": ..., "edited_args": ..., "reason": ...,
  "response": ...}`;
- anything else (`"yes"`, `1`, `{"decision": "yes"}`) raises `InvalidDecisionError`.

An answer of no known form is refused, not read as a denial: a reviewer who meant to approve
would otherwise deny without knowing it. An `edited_action` naming another tool than the
call's is refused (an edit changes a call's arguments, never its tool). LangChain's edit
gives the whole `args`; they are merged like any edit, so an edit cannot remove an argument.

A respond is a `Decision` with `approved=False` and the reviewer's text as its `response`:
the tool does not run, and the call's result, for the model, is that text (a normal result,
not an error). It is recorded as a denial (nothing ran: the review's status is `denied`)
whose audit says `respond`. Its text is needed (not blank) and bounded (`MAX_RESPONSE`
characters), as it becomes what the model reads in the tool's place.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictStr,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from nodbot.core.errors import InvalidDecisionError
from nodbot.core.tools import canonical_json

__all__ = [
    "MAX_RESPONSE",
    "Decision",
    "ToolDecision",
    "ToolInterrupt",
    "approval_interrupt_id",
    "as_decision",
    "check_edit_arguments",
    "check_response",
    "merge_edit",
    "read_answer",
    "response_problem",
]


def approval_interrupt_id(tool_call_id: str) -> str:
    """`"approve_"` plus the call id; other characters than ASCII letters, digits, `_` and `-`
    are written as `.` and two hex digits per UTF-8 byte, so the id is always safe as a key."""
    escaped = []
    for char in tool_call_id:
        if char.isascii() and (char.isalnum() or char in "_-"):
            escaped.append(char)
        else:
            # surrogatepass: a lone surrogate (possible in JSON text) still gets an id.
            escaped.extend(f".{byte:02x}" for byte in char.encode("utf-8", "surrogatepass"))
    return "approve_" + "".join(escaped)


MAX_RESPONSE = 2_000
"""The most characters of a respond's text: as many as a reason may have over the bot's
channels (`bot.forms.MAX_REASON`)."""


def response_problem(response: str) -> str | None:
    """What is wrong with a respond's text (blank, or over `MAX_RESPONSE` characters), in
    words fit for the reviewer who wrote it; None when it may be given."""
    if not response.strip():
        return "a respond needs the text to give the model in the tool's place"
    if len(response) > MAX_RESPONSE:
        return f"the answer has {len(response)} characters; at most {MAX_RESPONSE} are allowed"
    return None


def check_response(response: str | None) -> str | None:
    """A respond's text, checked (`response_problem`). Raises `ValueError` (a pydantic
    validator's error)."""
    if response is not None and (problem := response_problem(response)) is not None:
        raise ValueError(problem)
    return response


@dataclass(frozen=True)
class ToolInterrupt:
    """A paused call, as a reviewer sees it."""

    tool_name: str
    tool_call_id: str
    arguments: dict[str, Any]
    """The validated arguments the call would run with."""

    @property
    def key(self) -> str:
        """The interrupt id of the call: `approve_<call id>`."""
        return approval_interrupt_id(self.tool_call_id)


class Decision(BaseModel):
    """A reviewer's decision on one pending call."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    approved: StrictBool
    """Whether the call may run. Only a real boolean counts: `"yes"` or `1` are refused."""
    edited_args: dict[str, Any] | None = Field(default=None, validate_default=True)
    """Arguments to change, merged over the call's own; validated again before the call."""
    reason: str | None = None
    """Why; for a denial the model is told this reason."""
    decided_by: str | None = None
    """Who decided: a user id, an email address, or `nodbot:<policy>` for automatic ones."""
    response: str | None = Field(default=None, exclude_if=lambda value: value is None)
    """A respond: the reviewer's answer, given to the model as the call's result in the
    tool's place (only with `approved=False`: the tool does not run). Not blank, at most
    `MAX_RESPONSE` characters. Left out of the decision's JSON when None, so that the other
    decisions are stored as they always were."""

    @field_validator("edited_args")
    @classmethod
    def _edit_only_when_approved(
        cls, edited_args: dict[str, Any] | None, info: ValidationInfo
    ) -> dict[str, Any] | None:
        if edited_args is not None and info.data.get("approved") is not True:
            raise ValueError("edited_args can only go with approved=True")
        return edited_args

    @field_validator("response")
    @classmethod
    def _response_only_when_denied(cls, response: str | None, info: ValidationInfo) -> str | None:
        if response is not None and info.data.get("approved") is not False:
            raise ValueError("a response can only go with approved=False: the tool does not run")
        return check_response(response)


class ToolDecision(BaseModel):
    """An answer in the approve / edit / deny / respond form."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    action: Literal["approve", "edit", "deny", "respond"]
    """`approve` runs the call, `edit` runs it with changed arguments, `deny` refuses it,
    `respond` answers in the tool's place (the tool does not run)."""
    arguments: dict[str, Any] | None = Field(default=None, validate_default=True)
    """For `edit`: the arguments to change. Their keys replace the call's; others are kept."""
    message: str | None = Field(default=None, validate_default=True)
    """For `deny`: the reason the model is told. For `respond` (needed): the answer the model
    gets as the call's result. For the others: a note kept with the decision."""

    @field_validator("arguments")
    @classmethod
    def _arguments_only_for_edit(
        cls, arguments: dict[str, Any] | None, info: ValidationInfo
    ) -> dict[str, Any] | None:
        return check_edit_arguments(info.data.get("action"), arguments)

    @field_validator("message")
    @classmethod
    def _answer_of_respond(cls, message: str | None, info: ValidationInfo) -> str | None:
        if info.data.get("action") != "respond":
            return message
        if message is None:
            raise ValueError("a respond needs the message: the text the model gets instead")
        return check_response(message)

    def to_decision(self, decided_by: str | None = None) -> Decision:
        """The same answer as a `Decision`."""
        if self.action == "respond":
            return Decision(approved=False, response=self.message, decided_by=decided_by)
        return Decision(
            approved=self.action != "deny",
            edited_args=self.arguments if self.action == "edit" else None,
            reason=self.message,
            decided_by=decided_by,
        )


def check_edit_arguments(action: object, arguments: dict[str, Any] | None) -> dict[str, Any] | None:
    """The arguments of an approve / edit / deny / respond answer, checked: an edit needs
    them, the others take none. Raises `ValueError` (a pydantic validator's error)."""
    if action == "edit" and not arguments:
        raise ValueError("an edit needs the arguments to change")
    if action in ("approve", "deny", "respond") and arguments is not None:
        raise ValueError(f"arguments go with action 'edit', not {action!r}")
    return arguments


_SHOWN_KEYS = 5
"""How many keys of a dict of no known form its error shows."""
_SHOWN_TEXT = 40
"""How many characters of a value of the answer an error shows."""
_LISTED = 10
"""How many problems of a malformed answer its error lists."""


class _EditedAction(BaseModel):
    """LangChain's `edited_action`: the tool and the arguments the reviewer would run."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: StrictStr
    args: dict[str, Any]

    @field_validator("args")
    @classmethod
    def _some_arguments(cls, args: dict[str, Any]) -> dict[str, Any]:
        if not args:
            raise ValueError("an edit needs the arguments to change")
        return args


class _LangChainDecision(BaseModel):
    """A decision of LangChain's `HumanInTheLoopMiddleware` (approve, edit, reject or
    respond)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["approve", "edit", "reject", "respond"]
    edited_action: _EditedAction | None = Field(default=None, validate_default=True)
    message: str | None = Field(default=None, validate_default=True)
    """For `reject`: the reason the model is told. For `respond` (needed): the answer the
    model gets as the call's result. For the others: a note, as `ToolDecision`'s."""

    @field_validator("edited_action")
    @classmethod
    def _edited_action_only_for_edit(
        cls, edited: _EditedAction | None, info: ValidationInfo
    ) -> _EditedAction | None:
        kind = info.data.get("type")
        if kind == "edit" and edited is None:
            raise ValueError("an edit needs edited_action: {name, args}")
        if kind in ("approve", "reject", "respond") and edited is not None:
            raise ValueError(f"edited_action goes with type 'edit', not {kind!r}")
        return edited

    @field_validator("message")
    @classmethod
    def _answer_of_respond(cls, message: str | None, info: ValidationInfo) -> str | None:
        if info.data.get("type") != "respond":
            return message
        if message is None:
            raise ValueError("a respond needs the message: the text the model gets instead")
        return check_response(message)

    def to_decision(self, decided_by: str | None) -> Decision:
        if self.type == "respond":
            return Decision(approved=False, response=self.message, decided_by=decided_by)
        return Decision(
            approved=self.type != "reject",
            edited_args=self.edited_action.args if self.edited_action is not None else None,
            reason=self.message,
            decided_by=decided_by,
        )


def as_decision(
    answer: object, *, decided_by: str | None = None, tool: str | None = None
) -> Decision:
    """Normalize an answer of any known form to a `Decision` (see the module).

    `decided_by` fills in a decision that does not name its decider; `tool` is the call's
    tool, which a LangChain `edited_action` must name. Raises `InvalidDecisionError` (its
    `errors` name each field at fault) for an answer of no known form, a malformed one, and an
    `edited_action` naming another tool, or any tool when `tool` is not given (it cannot be
    checked then).
    """
    decision, named = read_answer(answer, decided_by=decided_by)
    if named is not None and named != tool:
        if tool is None:
            problem = (
                f"names the tool {_shown(named)}, which cannot be checked without the call's "
                "tool (as_decision(..., tool=...))"
            )
        else:
            problem = (
                f"names the tool {_shown(named)}, but the call is of {_shown(tool)}: an edit "
                "changes a call's arguments, never its tool"
            )
        raise _invalid("LangChain decision", [("edited_action.name", problem)])
    return decision


def read_answer(answer: object, *, decided_by: str | None = None) -> tuple[Decision, str | None]:
    """The decision `answer` says, and the tool its LangChain `edited_action` names (None
    for the other forms), not yet checked against the call's: `as_decision` checks it.
    Raises `InvalidDecisionError` as `as_decision` does."""
    if isinstance(answer, Decision):
        if answer.decided_by is None and decided_by is not None:
            return answer.model_copy(update={"decided_by": decided_by}), None
        return answer, None
    if answer is True or answer is False or answer is None:
        return Decision(approved=answer is True, decided_by=decided_by), None
    if isinstance(answer, ToolDecision):
        return answer.to_decision(decided_by), None
    if isinstance(answer, Mapping):
        return _read_mapping(answer, decided_by)
    raise _no_form(
        f"a {type(answer).__name__} is no decision: answer True, False, None, a ToolDecision, "
        "a Decision, or a dict of one of the forms"
    )


def _read_mapping(answer: Mapping[Any, Any], decided_by: str | None) -> tuple[Decision, str | None]:
    if "action" in answer:
        return _tool_decision(answer).to_decision(decided_by), None
    if "approved" in answer:
        return read_answer(_validated(Decision, dict(answer), "Decision"), decided_by=decided_by)
    if "type" in answer:
        said = _validated(_LangChainDecision, dict(answer), "LangChain decision")
        named = said.edited_action.name if said.edited_action is not None else None
        return said.to_decision(decided_by), named
    keys = ", ".join(_shown(key) for key in itertools.islice(answer, _SHOWN_KEYS))
    more = ", ..." if len(answer) > _SHOWN_KEYS else ""
    found = f"a dict with the keys {keys}{more}" if answer else "an empty dict"
    hint = ""
    if "decisions" in answer:
        hint = (
            "; a LangChain resume's `decisions` holds one decision per call: give each to "
            "its own approval"
        )
    raise _no_form(
        f"{found} names no form of decision: it needs `action` (approve, edit, deny, "
        f"respond), `type` (LangChain's approve, edit, reject, respond) or `approved` (a "
        f"Decision){hint}"
    )


def _tool_decision(answer: Mapping[Any, Any]) -> ToolDecision:
    """The dict form of `ToolDecision`, its edit named `arguments` or `edited_arguments`."""
    data = dict(answer)
    if "edited_arguments" not in data:
        return _validated(ToolDecision, data, "ToolDecision")
    edited = data.pop("edited_arguments")
    if "arguments" in data and not _same(data["arguments"], edited):
        raise _invalid(
            "ToolDecision",
            [("edited_arguments", "differs from arguments: they are one field, give one")],
        )
    data["arguments"] = edited
    try:
        return ToolDecision.model_validate(data)
    except ValidationError as exc:
        # Name the field as the answer did.
        found = [
            ("edited_" + f if f == "arguments" or f.startswith("arguments.") else f, m)
            for f, m in _problems(exc)
        ]
        raise _invalid("ToolDecision", found) from None


_M = TypeVar("_M", bound=BaseModel)


def _validated(model: type[_M], data: dict[Any, Any], label: str) -> _M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _invalid(label, _problems(exc)) from None


def _problems(exc: ValidationError) -> list[tuple[str, str]]:
    """Each problem as (field, message), the fields (keys of the answer: untrusted) bounded,
    and at most `_LISTED` of them."""
    found = exc.errors(include_url=False)
    problems = [
        (
            ".".join(_bounded(str(part)) for part in e["loc"]) or "(decision)",
            e["msg"].removeprefix("Value error, "),
        )
        for e in found[:_LISTED]
    ]
    if len(found) > _LISTED:
        problems.append(("(decision)", f"and {len(found) - _LISTED} more problems"))
    return problems


def _invalid(label: str, problems: list[tuple[str, str]]) -> InvalidDecisionError:
    errors = [{"field": field, "message": message} for field, message in problems]
    listed = "; ".join(f"{field}: {message}" for field, message in problems)
    return InvalidDecisionError(f"not a valid {label}: {listed}", errors=errors)


def _no_form(message: str) -> InvalidDecisionError:
    return InvalidDecisionError(
        f"not a decision: {message}", errors=[{"field": "(decision)", "message": message}]
    )


def _shown(value: object) -> str:
    """A value of the answer (untrusted) as an error shows it: quoted, and bounded."""
    return _bounded(repr(value))


def _bounded(text: str) -> str:
    return text if len(text) <= _SHOWN_TEXT else text[: _SHOWN_TEXT - 3] + "..."


def _same(one: object, other: object) -> bool:
    """Whether two edits are the same JSON (`1` and `True` are not)."""
    try:
        return canonical_json(one) == canonical_json(other)
    except (TypeError, ValueError):
        return False


def merge_edit(arguments: Mapping[str, Any], edited: Mapping[str, Any] | None) -> dict[str, Any]:
    """An edit's keys replace the call's; the others keep their values (so nothing is removed)."""
    return {**arguments, **(edited or {})}
