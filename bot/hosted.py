"""Runs of the agents of other frameworks the bot hosts (`framework_agents:`): the bot's side
of `core.bridges.hosted`.

```
POST /runs ─► start: HostedAgent.start ──► HostedStep ──► settle
                                                          │ pending calls: one review each
                                                          │ (the rules, `RulesPort.open_review`),
                                                          │ run waiting; none: run finished
workers: claim_ready (no review pending) ──► advance ──► each decision taken once
                                             (consume) ──► HostedAgent.resume ──► settle
```

The framework's state (`HostedStep.state`) is kept in the store's `run_states` with the
pending calls, so any worker, after any restart, can take the run on. A call without a
native call id gets no review and is denied in the resume (`bridges.common.NO_CALL_ID`). A
decision is taken once: a step that dies after taking its decisions (the worker killed, the
framework raising) is not tried again, and the run fails, closed, rather than run a tool
twice. The run's `messages` hold the user's text only; what the framework said is its own.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from nodbot.bot.metrics import METRICS
from nodbot.bot.policy.rules import RulesPort
from nodbot.core import (
    ApprovalAlreadyConsumed,
    ApprovalNotDecided,
    ApprovalRecord,
    ApprovalRequest,
    HumanMessage,
    RunRecord,
    merge_edit,
)
from nodbot.core.bridges.common import NO_CALL_ID, PendingCall, Resolution
from nodbot.core.bridges.hosted import HostedAgent, HostedStep, RunStates
from nodbot.core.store import IdempotencyKey
from nodbot.core.tools import arguments_digest

__all__ = ["HostedRuns"]

log = logging.getLogger(__name__)

STATE_VERSION = 1
TAKEN_BEFORE = (
    "a step of this run took its decisions and did not finish (the bot stopped, or the "
    "framework failed): its calls are not run again"
)


class HostedRuns:
    """Starts and moves on the runs of hosted agents (see the module)."""

    def __init__(
        self,
        store: Any,
        states: RunStates,
        port: RulesPort,
        *,
        worker: str,
        lease: float,
    ) -> None:
        self.store = store
        self.states = states
        self.port = port
        self.worker = worker
        self.lease = lease

    async def start(
        self,
        name: str,
        agent: HostedAgent,
        text: str,
        requested_by: str | None,
        *,
        started_by: str | None = None,
        idempotency: IdempotencyKey | None = None,
    ) -> RunRecord:
        """Start a run of `agent`; with `idempotency`, its key is written with the run, in
        its transaction (`IdempotencyKeyUsed` when it is stored already: nothing started)."""
        run: RunRecord = await self.store.create_run(
            agent=name,
            messages=[HumanMessage(content=text)],
            worker=self.worker,
            requested_by=requested_by,
            lease=self.lease,
            started_by=started_by,
            idempotency=idempotency,
        )
        try:
            step = await agent.start(text, run_id=run.run_id)
        except Exception as exc:
            log.exception("hosted agent %s failed to start run %s", name, run.run_id)
            return await self._failed(run, f"the agent failed: {type(exc).__name__}: {exc}")
        return await self._settle(run, step)

    async def advance(self, run: RunRecord, agent: HostedAgent) -> RunRecord:
        """Take the run's decisions once and resume it; a run whose reviews are not all
        decided stays waiting."""
        saved = await self.states.get(run.run_id)
        if saved is None:
            return await self._failed(run, "the run's framework state is gone")
        try:
            framework, calls = _unwrap(saved)
        except ValueError as exc:
            return await self._failed(run, str(exc))
        records: list[ApprovalRecord | None] = []
        for call in calls:
            record = await self.store.find(run.run_id, call.call_id) if call.call_id else None
            if call.call_id and record is None:
                return await self._failed(run, f"the review of call {call.call_id} is gone")
            if record is not None and record.decision is None:
                return await self._save(run, "waiting")
            records.append(record)
        resolutions: list[Resolution] = []
        taken: list[ApprovalRecord] = []
        for call, record in zip(calls, records, strict=True):
            if record is None:
                resolutions.append(_denied(call, NO_CALL_ID))
                continue
            try:
                consumed = await self.store.consume(record.approval_id, actor=self.worker)
            except ApprovalAlreadyConsumed:
                await self._finish(taken, "not resumed")
                return await self._failed(run, TAKEN_BEFORE)
            except ApprovalNotDecided:  # cannot be: it was decided above
                return await self._save(run, "waiting")
            taken.append(consumed)
            METRICS.taken(consumed, "run")
            resolutions.append(_resolution(call, consumed))
        try:
            step = await agent.resume(framework, resolutions, run_id=run.run_id)
        except Exception as exc:
            log.exception("hosted agent %s failed to resume run %s", run.agent, run.run_id)
            await self._finish(taken, "error")
            return await self._failed(run, f"the agent failed: {type(exc).__name__}: {exc}")
        await self._finish(taken, "resumed")
        return await self._settle(run, step)

    async def _settle(self, run: RunRecord, step: HostedStep) -> RunRecord:
        calls = list(step.pending)
        await self.states.put(run.run_id, _wrap(step.state, calls))
        if not calls:
            return await self._save(run, "finished", final_text=step.final_text)
        for call in calls:
            if call.call_id:
                await self._review(run, call)
        return await self._save(run, "waiting")

    async def _review(self, run: RunRecord, call: PendingCall) -> None:
        policy: dict[str, Any] = {}
        if call.schema is not None:
            policy["schema"] = call.schema
        if call.description:
            policy["call_description"] = call.description
        assert call.call_id is not None
        request = ApprovalRequest(
            run_id=run.run_id,
            call_id=call.call_id,
            tool=call.tool,
            arguments=dict(call.arguments),
            digest=arguments_digest(call.arguments),
            requested_by=run.requested_by,
            policy=policy,
        )
        record, _ = await self.port.open_review(request)
        if record.request.digest != request.digest or record.request.tool != request.tool:
            # The framework reused a call id for another call: its review answers the first.
            log.warning(
                "hosted agent reused a call id",
                extra={"run_id": run.run_id, "call_id": call.call_id},
            )

    async def _finish(self, records: Sequence[ApprovalRecord], outcome: str) -> None:
        for record in records:
            if not record.finished:
                await self.store.finish(record.approval_id, outcome=outcome)

    async def _failed(self, run: RunRecord, error: str) -> RunRecord:
        saved: RunRecord = await self.store.save_run(
            run, status="failed", messages=run.messages, error=error
        )
        return saved

    async def _save(
        self, run: RunRecord, status: str, *, final_text: str | None = None
    ) -> RunRecord:
        saved: RunRecord = await self.store.save_run(
            run, status=status, messages=run.messages, final_text=final_text
        )
        return saved


def _resolution(call: PendingCall, record: ApprovalRecord) -> Resolution:
    decision = record.decision
    assert decision is not None
    final = call.arguments
    edited = False
    if decision.approved and decision.edited_args:
        final = merge_edit(dict(call.arguments), decision.edited_args)
        edited = final != call.arguments
    return Resolution(
        call=call,
        approved=decision.approved,
        arguments=dict(final) if decision.approved else dict(call.arguments),
        edited=edited,
        message=decision.reason,
        decided_by=decision.decided_by,
        consumed=None,
        response=decision.response,
    )


def _denied(call: PendingCall, message: str) -> Resolution:
    return Resolution(
        call=call,
        approved=False,
        arguments=dict(call.arguments),
        edited=False,
        message=message,
        decided_by=None,
        consumed=None,
    )


def _wrap(state: str, calls: Sequence[PendingCall]) -> str:
    return json.dumps(
        {"v": STATE_VERSION, "state": state, "calls": [asdict(call) for call in calls]},
        ensure_ascii=False,
    )


def _unwrap(text: str) -> tuple[str, list[PendingCall]]:
    try:
        saved = json.loads(text)
        if saved.get("v") != STATE_VERSION:
            raise ValueError(f"state version {saved.get('v')!r}")
        calls = [PendingCall(**call) for call in saved["calls"]]
        return str(saved["state"]), calls
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ValueError(f"the run's stored state cannot be read: {exc}") from exc
