"""What a reviewer is shown (`ToolInterrupt`) and what a reviewer answers (`Decision`).

Answers come in several forms and are normalized by `as_decision`:

| answer                                       | decision                                  |
|----------------------------------------------|-------------------------------------------|
| `True`, `ToolDecision(action="approve")`     | approve                                   |
| `ToolDecision(action="edit", arguments=...)` | approve with the edit merged in           |
| `ToolDecision(action="deny", message=...)`   | deny, the message is the reason           |
| `Decision(...)`                              | as given                                  |
| a dict with `action` (or `approved`)         | parsed as `ToolDecision` (or `Decision`)  |
| anything else (`False`, `"yes"`, `None`...)  | deny                                      |
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from nodbot.core.errors import InvalidDecisionError

__all__ = [
    "Decision",
    "ToolDecision",
    "ToolInterrupt",
    "approval_interrupt_id",
    "as_decision",
    "check_edit_arguments",
    "merge_edit",
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

    @field_validator("edited_args")
    @classmethod
    def _edit_only_when_approved(
        cls, edited_args: dict[str, Any] | None, info: ValidationInfo
    ) -> dict[str, Any] | None:
        if edited_args is not None and info.data.get("approved") is not True:
            raise ValueError("edited_args can only go with approved=True")
        return edited_args


class ToolDecision(BaseModel):
    """An answer in the approve / edit / deny form."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    action: Literal["approve", "edit", "deny"]
    """`approve` runs the call, `edit` runs it with changed arguments, `deny` refuses it."""
    arguments: dict[str, Any] | None = Field(default=None, validate_default=True)
    """For `edit`: the arguments to change. Their keys replace the call's; others are kept."""
    message: str | None = None
    """For `deny`: the reason the model is told. For the others: a note kept with the decision."""

    @field_validator("arguments")
    @classmethod
    def _arguments_only_for_edit(
        cls, arguments: dict[str, Any] | None, info: ValidationInfo
    ) -> dict[str, Any] | None:
        return check_edit_arguments(info.data.get("action"), arguments)

    def to_decision(self, decided_by: str | None = None) -> Decision:
        """The same answer as a `Decision`."""
        return Decision(
            approved=self.action != "deny",
            edited_args=self.arguments if self.action == "edit" else None,
            reason=self.message,
            decided_by=decided_by,
        )


def check_edit_arguments(action: object, arguments: dict[str, Any] | None) -> dict[str, Any] | None:
    """The arguments of an approve / edit / deny answer, checked: an edit needs them, the
    others take none. Raises `ValueError` (a pydantic validator's error)."""
    if action == "edit" and not arguments:
        raise ValueError("an edit needs the arguments to change")
    if action in ("approve", "deny") and arguments is not None:
        raise ValueError(f"arguments go with action 'edit', not {action!r}")
    return arguments


def as_decision(answer: object, *, decided_by: str | None = None) -> Decision:
    """Normalize any answer to a `Decision` (see the module's table).

    `decided_by` fills in a decision that does not name its decider. A dict that claims to be a
    `ToolDecision` or a `Decision` but is malformed raises `InvalidDecisionError`.
    """
    if isinstance(answer, Decision):
        if answer.decided_by is None and decided_by is not None:
            return answer.model_copy(update={"decided_by": decided_by})
        return answer
    if answer is True:
        return Decision(approved=True, decided_by=decided_by)
    if isinstance(answer, ToolDecision):
        return answer.to_decision(decided_by)
    if isinstance(answer, Mapping) and ("action" in answer or "approved" in answer):
        return as_decision(_parse_dict(answer), decided_by=decided_by)
    return Decision(approved=False, decided_by=decided_by)


def _parse_dict(answer: Mapping[Any, Any]) -> ToolDecision | Decision:
    model: type[ToolDecision] | type[Decision] = ToolDecision if "action" in answer else Decision
    try:
        return model.model_validate(dict(answer))
    except ValidationError as exc:
        errors = [
            {"field": ".".join(str(p) for p in e["loc"]) or "(decision)", "message": e["msg"]}
            for e in exc.errors(include_url=False)
        ]
        listed = "; ".join(f"{e['field']}: {e['message']}" for e in errors)
        raise InvalidDecisionError(
            f"not a valid {model.__name__}: {listed}", errors=errors
        ) from None


def merge_edit(arguments: Mapping[str, Any], edited: Mapping[str, Any] | None) -> dict[str, Any]:
    """An edit's keys replace the call's; the others keep their values (so nothing is removed)."""
    return {**arguments, **(edited or {})}
