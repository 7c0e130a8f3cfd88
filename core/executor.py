"""The executor: validates a call, asks for review when a rule says so, and runs the tool.

```
run_call(call, ctx)
  ├─ unknown tool / invalid arguments ─────────────► error (nothing recorded)
  ├─ ctx.approval (the caller's, taken once) ──────► its decision, in place of the port's
  │                                                   (a token for another call: mismatch)
  ├─ no review needed ─────────────────────────────► the tool runs
  └─ review needed ─► port.request
                        ├─ Waiting ─────────────────► pending (nothing ran)
                        ├─ answered (respond) ──────► ok, the reviewer's text (nothing ran)
                        ├─ denied ──────────────────► approval-denied (nothing ran)
                        └─ approved ─► edit merged and validated again ─► the tool runs once
```

`run_call` reports every outcome in its `ToolResult` and never raises for them; `run`
returns the value or raises the matching `NodbotError`. A call a reviewer answered in the
tool's place (a respond, `Decision.response`) has that text as its value, and no arguments:
the tool did not run. A `StoreError` is no outcome of the call (the store could not be
asked or told): both raise it.

A caller's own approval (`ToolContext.approval`: a trusted `Decision`, or a `TokenApproval`
checked against the call) is taken off the context by the first call run with it; the tool
gets the context without it, so nothing it runs is covered. With a `DeferredApproval` port
it is recorded on the call's review (channel `context`) and taken from there.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from nodbot.core.approval_tokens import InvalidApprovalToken, TokenApproval
from nodbot.core.arguments_schema import schema_errors
from nodbot.core.calls import OneUseApproval, ToolCall, ToolContext, ToolError, ToolResult, new_id
from nodbot.core.decisions import Decision, as_decision, merge_edit, read_answer
from nodbot.core.errors import (
    ApprovalDenied,
    ApprovalMismatchError,
    ApprovalPending,
    ConfigurationError,
    InvalidArgumentsError,
    InvalidDecisionError,
    InvalidQuestionError,
    NodbotError,
    QuestionPending,
    QuestionUnanswered,
    StoreError,
    ToolExecutionError,
)
from nodbot.core.ports import (
    NO_PORT_REASON,
    ApprovalPort,
    Decided,
    DeferredApproval,
    PortAnswer,
    Spent,
    Waiting,
)
from nodbot.core.questions import (
    QUESTION_TOOL,
    answer_problem,
    choice_for,
    is_question,
    make_question,
    question_request,
)
from nodbot.core.rules import InterruptRule, should_interrupt
from nodbot.core.store import ApprovalRecord, ApprovalRequest, Evidence, KeptResult, action_of
from nodbot.core.tools import Tool, ToolRegistry, ValidatedArguments, arguments_digest

__all__ = ["CALLER_CHANNEL", "TOKENS_KEPT", "Executor"]

log = logging.getLogger(__name__)

CALLER_CHANNEL = "context"
"""The channel through which a caller's own approval (`ToolContext.approval`) is recorded."""
TOKENS_KEPT = 10_000
"""The approval tokens an executor remembers having run a call on, at most (newest kept)."""


class Executor:
    """Runs tool calls from `registry`, pausing the ones that need review.

    A call needs review when its tool's `confirm` says so or when one of `rules` matches it.
    Without an `approval` port every such call is denied ("no approval port configured").
    """

    def __init__(
        self,
        registry: ToolRegistry,
        *,
        approval: ApprovalPort | None = None,
        rules: Sequence[InterruptRule] = (),
    ) -> None:
        self.registry = registry
        self.approval = approval
        self.rules = tuple(rules)
        self._tokens_run: dict[str, None] = {}
        """The approvals whose tokens (`ToolContext.approval`) calls of this executor have
        taken, oldest first (`TOKENS_KEPT` at most): each covers one call."""

    def context(
        self,
        run_id: str | None = None,
        *,
        requested_by: str | None = None,
        metadata: dict[str, Any] | None = None,
        spent: list[Spent] | None = None,
        approval: Decision | TokenApproval | None = None,
    ) -> ToolContext:
        """A context for one run. Keep its `run_id`: a resume must use the same one. With
        `spent`, the approvals its calls spend are collected there instead of recorded
        finished one by one (`ToolContext.spent`). With `approval`, your own `Decision` or
        an adapter-issued `TokenApproval` covers the first call run with it, and only that
        one (`ToolContext.approval`)."""
        return ToolContext(
            run_id=run_id or new_id("run_"),
            executor=self,
            requested_by=requested_by,
            metadata=dict(metadata or {}),
            spent=spent,
            approval=OneUseApproval(approval) if approval is not None else None,
        )

    async def run_call(self, call: ToolCall, ctx: ToolContext) -> ToolResult:
        """Run one call; every outcome, pending included, comes back as a `ToolResult`."""
        try:
            value, arguments = await self._execute(call, ctx)
        except ApprovalPending as pending:
            return ToolResult("pending", error=_error(pending), arguments=pending.arguments)
        except StoreError:
            # Not the call's outcome: the store could not say or record it. The run step
            # fails as a whole and is tried again; the model never sees the outage.
            raise
        except NodbotError as error:
            return ToolResult("error", error=_error(error))
        return ToolResult("ok", value=value, arguments=arguments)

    async def run(self, call: ToolCall, ctx: ToolContext) -> Any:
        """Run one call and return the tool's value.

        Raises `ApprovalPending` (with `.approval_id`), `ApprovalDenied`, `UnknownToolError`,
        `InvalidArgumentsError`, `ApprovalMismatchError` or `ToolExecutionError`.
        """
        value, _ = await self._execute(call, ctx)
        return value

    async def decide(
        self,
        approval_id: str,
        answer: object,
        *,
        decided_by: str | None = None,
        channel: str | None = None,
        person: str | None = None,
        evidence: Evidence | None = None,
    ) -> ApprovalRecord:
        """Record a reviewer's answer (any form `as_decision` takes) on a stored approval, as
        that reviewer's vote: it decides at once unless the review needs several approvals.
        `person` is who the reviewer's handle resolved to (votes are distinct by it) and
        `evidence` what the channel knows of the act; both go into the audit log.

        An edit is merged and validated with the tool's model first (for a tool of another
        process, with the JSON schema its caller kept with the review, `policy["schema"]`);
        an invalid one raises `InvalidArgumentsError` and nothing is recorded. Raises
        `ApprovalNotFound`, `ApprovalAlreadyDecided`, `ApprovalAlreadyVoted`,
        `InvalidDecisionError` (for an answer of no known form, a malformed one, an
        `edited_action` naming another tool than the call's, a vote without `decided_by`,
        and a respond to a question (`core.questions`) that is none of its choices; nothing
        is recorded), and `ConfigurationError` when the executor has no
        `DeferredApproval` port.
        """
        if not isinstance(self.approval, DeferredApproval):
            raise ConfigurationError("decide() needs an executor with a DeferredApproval port")
        store = self.approval.store
        decision, named = read_answer(answer, decided_by=decided_by)
        if decision.edited_args is not None or named is not None or decision.response is not None:
            # An edit is checked against its call, which is read for it, and so is a respond
            # (which may answer a question); every other answer is recorded without a read.
            # A LangChain edit must name its tool.
            record = await store.get(approval_id)
            if named is not None:
                decision = as_decision(answer, decided_by=decided_by, tool=record.request.tool)
            if decision.response is not None and is_question(record.request):
                decision = _answer(record, decision)
        if decision.edited_args is not None:
            merged = merge_edit(record.request.arguments, decision.edited_args)
            name, schema = record.request.tool, record.request.policy.get("schema")
            if name not in self.registry and isinstance(schema, dict):
                # A tool that runs elsewhere: its caller's schema of the arguments.
                errors = schema_errors(schema, merged)
                if errors:
                    raise InvalidArgumentsError(tool=name, errors=errors, source="edited arguments")
            else:
                self.registry.get(name).validate(merged, source="edited arguments")
        record = await store.vote(
            approval_id, decision, channel=channel, person=person, evidence=evidence
        )
        # Logged here, where every channel's decisions are recorded: once each.
        action = action_of(decision)
        log.info(
            "decision",
            extra={
                "approval_id": approval_id,
                "run_id": record.request.run_id,
                "tool": record.request.tool,
                "decided_by": decision.decided_by,
                "person": person,
                "action": action,
                "channel": channel,
                "approval_status": record.status,
            },
        )
        return record

    async def needs_review(self, tool: Tool, call: ToolCall, ctx: ToolContext) -> bool:
        """Whether the call must wait for a decision. A rule that raises means yes."""
        if should_interrupt(self.rules, tool.name, call.arguments):
            return True
        if isinstance(tool.confirm, bool):
            return tool.confirm
        try:
            verdict = tool.confirm(call, ctx)
            if inspect.isawaitable(verdict):
                verdict = await verdict
            return bool(verdict)
        except Exception:
            log.exception("confirm rule of %s raised; the call is reviewed", tool.name)
            return True

    async def _needs_review(
        self, tool: Tool, call: ToolCall, validated: ValidatedArguments, ctx: ToolContext
    ) -> bool:
        if isinstance(tool.confirm, bool) and not self.rules:
            return tool.confirm  # the common case, without building the checked call
        # Rules see the validated arguments; the copy skips validation (they just passed it).
        checked = ToolCall.model_construct(
            name=call.name, arguments=validated.canonical, id=call.id
        )
        return await self.needs_review(tool, checked, ctx)

    def _caller_decision(
        self, given: Decision | TokenApproval, tool: Tool, call: ToolCall, ctx: ToolContext
    ) -> tuple[Decision, Evidence | None] | None:
        """The decision the caller's approval (`ToolContext.approval`) makes for `call`, and
        what the audit keeps of it; None for a token this executor has taken already (the
        call then goes to the port, as without one). Raises `ApprovalMismatchError` for a
        token that does not verify or is for another call."""
        if isinstance(given, Decision):
            return given, None
        try:
            claims, decision = given.decision_for(
                run_id=ctx.run_id, call_id=call.id, tool=tool.name, arguments=call.arguments
            )
        except InvalidApprovalToken as refused:
            raise ApprovalMismatchError(
                tool=tool.name, approval_id="(token)", reason=refused.message
            ) from None
        if claims.approval_id in self._tokens_run:
            return None  # spent: it covers one call
        self._tokens_run[claims.approval_id] = None
        while len(self._tokens_run) > TOKENS_KEPT:
            del self._tokens_run[next(iter(self._tokens_run))]
        return decision, {"approval_token": claims.approval_id}

    async def _decided_by_caller(
        self, request: ApprovalRequest, decision: Decision, evidence: Evidence | None
    ) -> PortAnswer:
        """The caller's decision for the call of `request`, instead of the port's: recorded
        on the call's review when the port is a `DeferredApproval` (channel `context`) and
        taken from there as any decision is, else logged. Raises `ApprovalMismatchError`
        when the call's active review was made for another call, and
        `ApprovalAlreadyDecided` when someone decided it first (nothing runs then)."""
        log.info(
            "decision",
            extra={
                "run_id": request.run_id,
                "call_id": request.call_id,
                "tool": request.tool,
                "decided_by": decision.decided_by,
                "action": action_of(decision),
                "channel": CALLER_CHANNEL,
            },
        )
        port = self.approval
        if not isinstance(port, DeferredApproval):
            return Decided(decision)  # no store to record it in
        record = await port.store.create(request)
        stored = record.request
        if stored.tool != request.tool or stored.digest != request.digest:
            made_for = "another tool" if stored.tool != request.tool else "other arguments"
            raise ApprovalMismatchError(
                tool=request.tool,
                approval_id=record.approval_id,
                reason=f"the call's review was made for {made_for}",
            )
        await port.store.decide(
            record.approval_id, decision, channel=CALLER_CHANNEL, evidence=evidence
        )
        # Taken as the store's deferred approvals are, past any rules of the port: the
        # caller decided. The port's own `request` might decide otherwise without taking it.
        return await DeferredApproval.request(port, request)

    async def _execute(self, call: ToolCall, ctx: ToolContext) -> tuple[Any, dict[str, Any] | None]:
        given, ctx = _taken(ctx)  # the caller's approval covers this call only
        tool = self.registry.get(call.name)
        validated = tool.validate(call.arguments)
        by_caller = self._caller_decision(given, tool, call, ctx) if given is not None else None
        if by_caller is None and not await self._needs_review(tool, call, validated, ctx):
            return await self._invoke(tool, validated, ctx, call), validated.canonical
        request = ApprovalRequest(
            run_id=ctx.run_id,
            call_id=call.id,
            tool=tool.name,
            arguments=validated.canonical,
            digest=arguments_digest(validated.canonical),
            requested_by=ctx.requested_by,
        )
        answer: PortAnswer
        if by_caller is not None:
            answer = await self._decided_by_caller(request, *by_caller)
        elif self.approval is not None:
            answer = await self.approval.request(request)
        else:
            raise ApprovalDenied(tool=tool.name, reason=NO_PORT_REASON, decided_by="nodbot")
        if isinstance(answer, Waiting):
            raise ApprovalPending(
                tool=tool.name, approval_id=answer.approval_id, arguments=validated.canonical
            )
        decision = answer.decision
        if decision.response is not None:
            # A reviewer answered in the tool's place: the text is the call's result, and
            # the tool does not run (so no arguments). A denial: its taking spent it.
            return decision.response, None
        if not decision.approved:
            raise ApprovalDenied(
                tool=tool.name,
                reason=decision.reason,
                approval_id=answer.approval_id,
                decided_by=decision.decided_by,
            )
        return await self._run_approved(tool, validated, answer, ctx, call)

    async def _run_approved(
        self,
        tool: Tool,
        validated: ValidatedArguments,
        answer: Decided,
        ctx: ToolContext,
        call: ToolCall,
    ) -> tuple[Any, dict[str, Any]]:
        outcome = "cancelled"
        result: KeptResult | None = None
        try:
            if answer.kept is not None:
                result = answer.kept  # kept again if this step cannot be saved either
                value, arguments = _kept(tool, answer.kept)  # an earlier step ran it
                outcome = "ok"
                return value, arguments
            edited = answer.decision.edited_args
            if edited is not None:
                merged = merge_edit(validated.canonical, edited)
                validated = tool.validate(merged, source="edited arguments")
            try:
                reviewed = answer.approval_id is not None
                value = await self._invoke(tool, validated, ctx, call, reviewed=reviewed)
            except ToolExecutionError as failed:
                result = {"status": "error", "message": failed.message}
                result["arguments"] = validated.canonical
                raise
            outcome = "ok"
            result = {"status": "ok", "value": value}  # made JSON only if it is kept
            result["arguments"] = validated.canonical
            return value, validated.canonical
        except NodbotError as error:
            outcome = error.kind
            raise
        finally:
            # The decision is spent whatever happened: it must never run a second call.
            if ctx.spent is not None and isinstance(self.approval, DeferredApproval):
                spent = self.approval.spent(answer, outcome=outcome, result=result)
                if spent is not None:
                    ctx.spent.append(spent)  # recorded by whoever collects them
            elif self.approval is not None:  # none: the caller's own decision ran it
                await self.approval.settle(answer, outcome=outcome)

    async def _invoke(
        self,
        tool: Tool,
        validated: ValidatedArguments,
        ctx: ToolContext,
        call: ToolCall,
        *,
        reviewed: bool = False,
    ) -> Any:
        # The tool's own context (its questions are its call's), for a tool that takes one.
        own = ctx if tool.context_parameter is None else replace(ctx, call=call, reviewed=reviewed)
        try:
            return await tool.invoke(validated.values, own)
        except QuestionPending as asked:
            # The tool asked a person (`ctx.ask`): the call waits, as for a review.
            if asked.arguments is None and asked.tool == tool.name:
                asked.arguments = validated.canonical
            raise
        except (QuestionUnanswered, InvalidQuestionError):
            raise  # the call ends in the question's outcome, named as such
        except Exception as exc:
            raise ToolExecutionError(tool=tool.name, error=exc) from exc

    async def ask(
        self,
        ctx: ToolContext,
        question: str,
        *,
        choices: Sequence[str] | None = None,
        key: str | None = None,
    ) -> str:
        """`ctx.ask`: put `question` to a person through the approval port, as the review
        of the pseudo-tool `ask` (`core.questions`), and return the answer. Raises
        `QuestionPending` while nobody has answered, `QuestionUnanswered` for a question
        declined, timed out or with nobody to ask (no port), and `InvalidQuestionError` for
        a question that cannot be asked (also inside a call a reviewer approved)."""
        call = ctx.call
        asked = make_question(
            question, choices=choices, key=key, asked_by=None if call is None else call.name
        )
        if ctx.reviewed:
            raise InvalidQuestionError(
                f"tool {call.name if call else '?'!r} asks a question after a reviewer "
                "approved its call, whose approval covers one run of it: ask in a tool that "
                "needs no review, before the call that does",
                errors=[{"field": "ask", "message": "inside a reviewed call"}],
            )
        request = question_request(
            asked,
            run_id=ctx.run_id,
            call_id=None if call is None else call.id,
            requested_by=ctx.requested_by,
        )
        if self.approval is None:
            raise QuestionUnanswered(key=asked.key, reason=NO_PORT_REASON, decided_by="nodbot")
        answer = await self.approval.request(request)
        if isinstance(answer, Waiting):
            raise QuestionPending(
                tool=QUESTION_TOOL if call is None else call.name,
                approval_id=answer.approval_id,
                key=asked.key,
                question=asked.text,
            )
        decision = answer.decision
        response = decision.response
        if response is not None and asked.choices is not None:
            response = choice_for(asked.choices, response)
        if decision.approved:
            # An approval is no answer (a port that approves everything, a rule): spent,
            # and the question stays unanswered.
            await self.approval.settle(answer, outcome="not-an-answer")
            response = None
        if response is None:
            reason = decision.reason
            if decision.response is not None:
                reason = f"the answer {decision.response[:100]!r} is none of the choices"
            elif decision.approved:
                reason = "it was approved, not answered"
            raise QuestionUnanswered(
                key=asked.key,
                reason=reason,
                approval_id=answer.approval_id,
                decided_by=decision.decided_by,
            )
        return response


def _answer(record: ApprovalRecord, decision: Decision) -> Decision:
    """A respond to a question, checked (`answer_problem`) and with a choice named as the
    question spells it. Raises `InvalidDecisionError` (nothing is recorded)."""
    assert decision.response is not None
    problem = answer_problem(record.request, decision.response)
    if problem is not None:
        raise InvalidDecisionError(
            f"not an answer to this question: {problem}",
            errors=[{"field": "response", "message": problem}],
        )
    choices = record.request.arguments.get("choices")
    if isinstance(choices, list):
        chosen = choice_for(choices, decision.response)
        decision = decision.model_copy(update={"response": chosen})
    return decision


def _taken(ctx: ToolContext) -> tuple[Decision | TokenApproval | None, ToolContext]:
    """The approval the caller set on `ctx`, taken (it covers this call only; None when
    there is none or it is spent), and the context the call goes on with: without it, so
    that whatever the call runs (its tool, a nested call with the tool's context) is never
    covered by it."""
    if ctx.approval is None:
        return None, ctx
    return ctx.approval.take(), replace(ctx, approval=None)


def _kept(tool: Tool, kept: KeptResult) -> tuple[Any, dict[str, Any]]:
    """The value and arguments of a call an earlier step ran (`Decided.kept`), or the
    error it ended in, raised again."""
    arguments = kept.get("arguments")
    arguments = dict(arguments) if isinstance(arguments, dict) else {}
    if kept.get("status") == "ok":
        return kept.get("value"), arguments
    message = str(kept.get("message") or f"tool {tool.name!r} failed")
    raise ToolExecutionError(tool=tool.name, message=message)


def _error(error: NodbotError) -> ToolError:
    return ToolError(kind=error.kind, message=error.message, details=error.details())
