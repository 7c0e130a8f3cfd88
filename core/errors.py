"""The errors nodbot raises, in one hierarchy.

```
NodbotError
├── ToolUsageError                 a call that cannot be run as given (fails closed)
│   ├── UnknownToolError           no tool of that name is registered
│   ├── InvalidArgumentsError      the arguments (or an edit of them) fail validation
│   └── ApprovalMismatchError      a stored approval belongs to another call
├── ToolExecutionError             the tool itself raised
├── ApprovalError                  the outcome of a review, or a misuse of the store
│   ├── ApprovalPending            the call waits for a reviewer; nothing ran
│   │   └── QuestionPending        the call (or run) waits for a person's answer (`ctx.ask`)
│   ├── ApprovalDenied             a reviewer (or a default) refused the call; nothing ran
│   ├── QuestionUnanswered         a question was declined, timed out or cannot be put
│   ├── ApprovalNotFound           no approval has that id
│   ├── ApprovalAlreadyDecided     the first decision wins; this one came second
│   ├── ApprovalAlreadyVoted       this reviewer has voted on this approval already
│   ├── MessageAlreadyProcessed    the message (an email reply) acted once already
│   ├── ApprovalNotDecided         consume() on an approval nobody has decided yet
│   └── ApprovalAlreadyConsumed    the decision was spent by another call
├── RunError                       a durable run cannot be found or saved
│   ├── RunNotFound                no run has that id
│   └── RunConflict                the run was saved by someone else since it was read
├── DeliveryLost                   the outbox delivery is no longer this worker's to settle
├── InvalidDecisionError           an answer of no known form, or a malformed one
├── InvalidQuestionError           a question that cannot be asked (text, choices, id, place)
├── StoreError                     the approval store's database cannot be used
│   ├── StoreUnavailableError      it cannot be reached, opened or written
│   ├── StoreSchemaError           its schema is missing, older or newer than this nodbot's
│   └── CallInFlight               a run's call is in flight elsewhere: its result may come
├── ConfigurationError             a tool, rule, predicate or port is set up wrongly
└── ResumeError                    a paused run cannot take this resume; nothing was recorded
    ├── NotPendingError            an answer for a key no call of the run waits on
    └── RunPausedError             new input on a run whose calls wait for review
```

Every error carries structured, keyword-only attributes (`tool`, `approval_id`, `reason`,
...) beside its message, so callers never parse text. Errors that a tool call can end in
also carry a `kind`, the string that `ToolResult.error.kind` reports for them.
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = [
    "ApprovalAlreadyConsumed",
    "ApprovalAlreadyDecided",
    "ApprovalAlreadyVoted",
    "ApprovalDenied",
    "ApprovalError",
    "ApprovalMismatchError",
    "ApprovalNotDecided",
    "ApprovalNotFound",
    "ApprovalPending",
    "CallInFlight",
    "ConfigurationError",
    "DeliveryLost",
    "InvalidArgumentsError",
    "InvalidDecisionError",
    "MessageAlreadyProcessed",
    "NodbotError",
    "NotPendingError",
    "ResumeError",
    "RunConflict",
    "RunError",
    "RunNotFound",
    "RunPausedError",
    "StoreError",
    "StoreSchemaError",
    "StoreUnavailableError",
    "ToolExecutionError",
    "ToolUsageError",
    "UnknownToolError",
]


class NodbotError(Exception):
    """The base of every error nodbot raises on purpose."""

    kind: ClassVar[str] = "error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def details(self) -> dict[str, Any]:
        """The structured attributes of the error, as JSON-ready values."""
        return {}


class ToolUsageError(NodbotError):
    """A call that cannot be run as given. Nothing ran and nothing was recorded."""

    kind = "usage-error"

    def __init__(self, message: str, *, tool: str) -> None:
        super().__init__(message)
        self.tool = tool

    def details(self) -> dict[str, Any]:
        return {"tool": self.tool}


class UnknownToolError(ToolUsageError):
    """No tool of that name is registered."""

    kind = "unknown-tool"

    def __init__(self, *, tool: str, known: list[str]) -> None:
        listed = ", ".join(repr(name) for name in known) or "none"
        super().__init__(f"unknown tool {tool!r}; registered tools: {listed}", tool=tool)
        self.known = known

    def details(self) -> dict[str, Any]:
        return {"tool": self.tool, "known": self.known}


class InvalidArgumentsError(ToolUsageError):
    """The arguments of a call, or a reviewer's edit of them, fail the tool's validation.

    `errors` lists one entry per offending field: `{"field": "amount", "message": ...}`.
    """

    kind = "invalid-arguments"

    def __init__(self, *, tool: str, errors: list[dict[str, str]], source: str = "arguments"):
        listed = "; ".join(f"{error['field']}: {error['message']}" for error in errors)
        super().__init__(f"invalid {source} for tool {tool!r}: {listed}", tool=tool)
        self.errors = errors
        self.source = source

    def details(self) -> dict[str, Any]:
        return {"tool": self.tool, "errors": self.errors, "source": self.source}


class ApprovalMismatchError(ToolUsageError):
    """A stored approval for this run and call id was made for another tool or arguments.

    The call fails closed: an approval never carries over to a call it was not given for.
    """

    kind = "approval-mismatch"

    def __init__(self, *, tool: str, approval_id: str, reason: str) -> None:
        super().__init__(
            f"approval {approval_id} does not match this call of {tool!r}: {reason}", tool=tool
        )
        self.approval_id = approval_id
        self.reason = reason

    def details(self) -> dict[str, Any]:
        return {"tool": self.tool, "approval_id": self.approval_id, "reason": self.reason}


class ToolExecutionError(NodbotError):
    """The tool raised. The original exception is the `__cause__` (none when the failure
    was kept by an earlier step, `message` then says it as it was said)."""

    kind = "tool-failed"

    def __init__(
        self, *, tool: str, error: BaseException | None = None, message: str | None = None
    ) -> None:
        if message is None:
            message = f"tool {tool!r} failed: {type(error).__name__}: {error}"
        super().__init__(message)
        self.tool = tool
        self.error_type = type(error).__name__ if error is not None else "kept"

    def details(self) -> dict[str, Any]:
        return {"tool": self.tool, "error_type": self.error_type}


class ApprovalError(NodbotError):
    """An outcome of a review, or a misuse of an approval store."""

    kind = "approval-error"

    def __init__(self, message: str, *, approval_id: str | None) -> None:
        super().__init__(message)
        self.approval_id = approval_id

    def details(self) -> dict[str, Any]:
        return {"approval_id": self.approval_id}


class ApprovalPending(ApprovalError):
    """The call waits for a reviewer. Nothing ran; resume with the same run and call id."""

    kind = "approval-pending"

    def __init__(
        self, *, tool: str, approval_id: str, arguments: dict[str, Any] | None = None
    ) -> None:
        super().__init__(f"approval pending for tool {tool!r}", approval_id=approval_id)
        self.tool = tool
        self.arguments = arguments
        """The validated arguments the reviewer is shown."""

    def details(self) -> dict[str, Any]:
        return {"approval_id": self.approval_id, "tool": self.tool}


class ApprovalDenied(ApprovalError):
    """The call was refused (by a reviewer, a port or a default). Nothing ran."""

    kind = "approval-denied"

    def __init__(
        self,
        *,
        tool: str,
        reason: str | None,
        approval_id: str | None = None,
        decided_by: str | None = None,
    ) -> None:
        message = f"approval denied for tool {tool!r}"
        super().__init__(f"{message}: {reason}" if reason else message, approval_id=approval_id)
        self.tool = tool
        self.reason = reason
        self.decided_by = decided_by

    def details(self) -> dict[str, Any]:
        return {
            "approval_id": self.approval_id,
            "tool": self.tool,
            "reason": self.reason,
            "decided_by": self.decided_by,
        }


class QuestionPending(ApprovalPending):
    """A question put to a person (`ToolContext.ask`) waits for its answer: the call that
    asked (or the run, for a question asked outside a tool) pauses, as for a review. Resume
    with the same run id and call id: the tool runs again from the top and `ask` returns the
    answer. `approval_id` is the question's review; `key` its id within the call."""

    kind = "question-pending"

    def __init__(
        self,
        *,
        tool: str,
        approval_id: str,
        key: str,
        question: str,
        arguments: dict[str, Any] | None = None,
    ) -> None:
        ApprovalError.__init__(
            self, f"question {key!r} waits for an answer: {question[:200]}", approval_id=approval_id
        )
        self.tool = tool
        self.arguments = arguments
        self.key = key
        self.question = question

    def details(self) -> dict[str, Any]:
        return {
            "approval_id": self.approval_id,
            "tool": self.tool,
            "key": self.key,
            "question": self.question,
        }


class QuestionUnanswered(ApprovalError):
    """A question got no answer: the person declined it (with `reason`), nobody answered
    before its deadline, or nobody could be asked (no rule names people for it, no approval
    port). Nothing after the `ask` ran."""

    kind = "question-unanswered"

    def __init__(
        self,
        *,
        key: str,
        reason: str | None,
        approval_id: str | None = None,
        decided_by: str | None = None,
    ) -> None:
        message = f"question {key!r} was not answered"
        super().__init__(f"{message}: {reason}" if reason else message, approval_id=approval_id)
        self.key = key
        self.reason = reason
        self.decided_by = decided_by

    def details(self) -> dict[str, Any]:
        return {
            "approval_id": self.approval_id,
            "key": self.key,
            "reason": self.reason,
            "decided_by": self.decided_by,
        }


class ApprovalNotFound(ApprovalError):
    """No approval has that id."""

    kind = "approval-not-found"

    def __init__(self, *, approval_id: str) -> None:
        super().__init__(f"no approval with id {approval_id!r}", approval_id=approval_id)


class ApprovalAlreadyDecided(ApprovalError):
    """The approval was decided before: the first decision wins and this one is refused."""

    kind = "approval-already-decided"

    def __init__(self, *, approval_id: str, decided_by: str | None) -> None:
        by = f" by {decided_by}" if decided_by else ""
        super().__init__(f"approval {approval_id} was already decided{by}", approval_id=approval_id)
        self.decided_by = decided_by

    def details(self) -> dict[str, Any]:
        return {"approval_id": self.approval_id, "decided_by": self.decided_by}


class ApprovalAlreadyVoted(ApprovalError):
    """A review that needs several approvals counts each reviewer once."""

    kind = "approval-already-voted"

    def __init__(self, *, approval_id: str, voter: str) -> None:
        super().__init__(
            f"{voter} has already voted on approval {approval_id}", approval_id=approval_id
        )
        self.voter = voter

    def details(self) -> dict[str, Any]:
        return {"approval_id": self.approval_id, "voter": self.voter}


class MessageAlreadyProcessed(ApprovalError):
    """The message an act was made by (an email reply's Message-ID) was processed before, on
    this review or another: the act changed nothing but a `refused` event on `approval_id`,
    which says so."""

    kind = "message-already-processed"

    def __init__(self, *, approval_id: str, message_id: str, first: str) -> None:
        super().__init__(self.reason(message_id, first), approval_id=approval_id)
        self.message_id = message_id
        self.first = first
        """The review the message was processed on first."""

    @staticmethod
    def reason(message_id: str, first: str) -> str:
        """The reason of the `refused` event of an act by `message_id`, processed before on
        the review `first`."""
        return f"the message {message_id} was processed already, on review {first}"

    def details(self) -> dict[str, Any]:
        return {"approval_id": self.approval_id, "message_id": self.message_id}


class ApprovalNotDecided(ApprovalError):
    """consume() was called on an approval that is still pending."""

    kind = "approval-not-decided"

    def __init__(self, *, approval_id: str) -> None:
        super().__init__(f"approval {approval_id} is not decided yet", approval_id=approval_id)


class ApprovalAlreadyConsumed(ApprovalError):
    """The decision was already spent by a call: a decision is used at most once."""

    kind = "approval-already-consumed"

    def __init__(self, *, approval_id: str) -> None:
        super().__init__(f"approval {approval_id} was already used", approval_id=approval_id)


class RunError(NodbotError):
    """A durable run cannot be found or saved."""

    kind = "run-error"

    def __init__(self, message: str, *, run_id: str) -> None:
        super().__init__(message)
        self.run_id = run_id

    def details(self) -> dict[str, Any]:
        return {"run_id": self.run_id}


class RunNotFound(RunError):
    """No run has that id."""

    kind = "run-not-found"

    def __init__(self, *, run_id: str) -> None:
        super().__init__(f"no run with id {run_id!r}", run_id=run_id)


class RunConflict(RunError):
    """The run changed since it was read (another worker saved it): this save is refused."""

    kind = "run-conflict"

    def __init__(self, *, run_id: str, expected: int, found: int, reason: str | None = None):
        super().__init__(
            f"run {run_id}: {reason}"
            if reason
            else f"run {run_id} was saved by someone else (version {found}, expected {expected})",
            run_id=run_id,
        )
        self.expected = expected
        self.found = found

    def details(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "expected": self.expected, "found": self.found}


class DeliveryLost(NodbotError):
    """An outbox delivery this worker claimed is not its own to settle any more: its lease
    ran out and another worker took it, or it was settled already."""

    kind = "delivery-lost"

    def __init__(self, *, delivery_id: int, reason: str) -> None:
        super().__init__(f"delivery {delivery_id}: {reason}")
        self.delivery_id = delivery_id

    def details(self) -> dict[str, Any]:
        return {"delivery_id": self.delivery_id}


class InvalidDecisionError(NodbotError):
    """An answer of no form of decision nodbot knows, or one that is not well formed (a
    malformed `ToolDecision`, `Decision` or LangChain decision dict, an `edited_action` naming
    another tool). Nothing is recorded."""

    kind = "invalid-decision"

    def __init__(self, message: str, *, errors: list[dict[str, str]]) -> None:
        super().__init__(message)
        self.errors = errors

    def details(self) -> dict[str, Any]:
        return {"errors": self.errors}


class InvalidQuestionError(NodbotError):
    """A question that cannot be asked: blank or too long text, too many or malformed
    choices, an id of other characters than letters, digits, `_` and `-`, or an `ask` made
    where it cannot pause (inside a call a reviewer approved: its approval covers one run
    of the tool). `errors` name each field at fault. Nothing is recorded."""

    kind = "invalid-question"

    def __init__(self, message: str, *, errors: list[dict[str, str]]) -> None:
        super().__init__(message)
        self.errors = errors

    def details(self) -> dict[str, Any]:
        return {"errors": self.errors}


class StoreError(NodbotError):
    """The approval store's database cannot be used. `url` never shows a password.

    Nothing was written: every store operation is one transaction.
    """

    kind = "store-error"

    def __init__(self, message: str, *, url: str) -> None:
        super().__init__(message)
        self.url = url

    def details(self) -> dict[str, Any]:
        return {"url": self.url}


class StoreUnavailableError(StoreError):
    """The database cannot be reached, opened or written (down, wrong URL, read-only file)."""

    kind = "store-unavailable"


class StoreSchemaError(StoreError):
    """The database's schema does not fit this nodbot: not created yet with auto-migration
    off, older with auto-migration off, or newer than this nodbot knows."""

    kind = "store-schema"


class CallInFlight(StoreError):
    """A durable run's call whose decision an earlier step consumed, with no result kept
    yet: that step's worker may be alive and keeping it through an outage, so the step that
    found it is tried again later (`DeferredApproval`'s `in_flight_wait`), as after any
    store failure; nothing ran."""

    kind = "call-in-flight"

    def __init__(self, *, approval_id: str, left: float) -> None:
        super().__init__(
            f"the call of approval {approval_id} is in flight in an earlier step; its result "
            f"is waited for {left:.1f} s more before the call is denied",
            url="",
        )
        self.approval_id = approval_id

    def details(self) -> dict[str, Any]:
        return {"approval_id": self.approval_id}


class ConfigurationError(NodbotError):
    """A tool, rule, predicate or port is set up wrongly (raised where it is set up)."""

    kind = "configuration-error"


class ResumeError(NodbotError):
    """A paused run cannot take this resume: the answers name a call it does not wait on, or
    the resume brings new input. It is raised before anything runs or is recorded.

    A resume that leaves some of the run's pending calls unanswered is no error: those calls
    stay pending (the run pauses again on them), and the others go on.
    """

    kind = "resume-error"

    def __init__(self, message: str, *, run_id: str) -> None:
        super().__init__(message)
        self.run_id = run_id

    def details(self) -> dict[str, Any]:
        return {"run_id": self.run_id}


class NotPendingError(ResumeError):
    """An answer given on resume for a key (`approve_<call id>`, `LoopResult.interrupts`) that
    is not pending in the run: no open call of its paused turn has that key, or that call's
    review is decided already. `keys` are the keys at fault, `pending` the run's pending
    ones. No answer was recorded."""

    kind = "not-pending"

    def __init__(self, *, run_id: str, keys: list[str], pending: list[str]) -> None:
        named = ", ".join(_shown(key) for key in keys[:5])
        waits = ", ".join(_shown(key) for key in pending[:20]) or "none"
        super().__init__(
            f"run {run_id} has no pending call with key {named} (pending: {waits})",
            run_id=run_id,
        )
        self.keys = keys
        self.pending = pending

    def details(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "keys": self.keys, "pending": self.pending}


class RunPausedError(ResumeError):
    """New input on a paused run: messages after the turn whose calls wait for review, or a
    new start (`Agent.run` with text) under the run id of a run whose reviews no call has
    taken yet (pending, or decided and waiting for the resume).
    While a run is paused it takes only answers; start another run for new input. `waiting`
    are the keys (`approve_<call id>`) of the calls it waits on, when known."""

    kind = "run-paused"

    def __init__(self, *, run_id: str, waiting: list[str], reason: str) -> None:
        waits = ", ".join(_shown(key) for key in waiting[:20])
        on = f" on {waits}" if waits else ""
        super().__init__(
            f"run {run_id} is paused{on}: {reason}; answer its calls, or start another run",
            run_id=run_id,
        )
        self.waiting = waiting

    def details(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "waiting": self.waiting}


def _shown(key: str) -> str:
    """A key as an error message shows it: quoted, and cut to 100 characters (keys may come
    from a request)."""
    return repr(key if len(key) <= 100 else key[:100] + "...")
