"""Deciding several reviews in one act: approve or deny a list of them, each one authorized,
recorded and answered on its own.

Every channel that decides in bulk (the inbox's "approve selected", `POST /approvals/decide`,
`nodbot approvals bulk`, Slack's `/nodbot approve`) goes through `Decider`: for each review,
in the order given,

1. the review is read; an unknown id is answered `not_found` (and nothing is recorded);
2. the decision is checked as a single one would be (`AuthorizeDecision`: the rule's
   reviewers, self-approval, delegation, the rest of the rule), then by the channel's own
   `check` if it has one (a `runs:write-as` token may not approve); a refusal is recorded in
   the review's events with the decider's person and evidence, as a refused click is, and
   answered `refused` with its reason;
3. the decision is recorded through `Executor.decide` (its own event and audit record, its own
   transaction): answered `decided`, or `already_decided` (by whom), `already_voted`, or
   `invalid` (a decision the executor does not accept).

One item that fails does not stop the rest: each is answered, and the items that could not be
decided say why. A store that cannot be used stops the act (`StoreError` propagates): the items
before it are recorded, the answer of those after is not known, and the caller says so.

Edits stay one at a time: an edit needs its own values, checked against one call's tool. A bulk
decision is an approve or a deny with one optional reason for all. At most `MAX_ITEMS` reviews
are decided in one act.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from nodbot.bot.metrics import METRICS
from nodbot.bot.policy.authorize import AuthorizeDecision, Verdict
from nodbot.core import (
    ApprovalAlreadyDecided,
    ApprovalAlreadyVoted,
    ApprovalNotFound,
    ApprovalRecord,
    ApprovalStore,
    Decision,
    DeferredApproval,
    Executor,
    InvalidArgumentsError,
    InvalidDecisionError,
    ToolRegistry,
    UnknownToolError,
)

__all__ = ["MAX_ITEMS", "Check", "Decider", "ItemOutcome", "ItemStatus", "bulk_problem"]

log = logging.getLogger(__name__)

MAX_ITEMS = 100
"""The most reviews one bulk act decides: a longer list is refused whole, before anything is
recorded (split it)."""

ItemStatus: TypeAlias = Literal[
    "decided", "refused", "not_found", "already_decided", "already_voted", "invalid"
]

Check: TypeAlias = Callable[[ApprovalRecord, Decision, Verdict], Verdict]
"""A channel's own check after the rules' (`Verdict` in, `Verdict` out): it may refuse more,
never allow what the rules refused."""


@dataclass(frozen=True)
class ItemOutcome:
    """What became of one review of a bulk act."""

    approval_id: str
    status: ItemStatus
    error: str | None = None
    """Why it was not decided (None when it was)."""
    record: ApprovalRecord | None = None
    """The review after the act: decided (or, with several approvals, voted on), or as it
    was read when it was not decided; None for an unknown id."""

    @property
    def ok(self) -> bool:
        """Whether this item's decision (or vote) was recorded."""
        return self.status == "decided"


def bulk_problem(approval_ids: Sequence[str]) -> str | None:
    """What is wrong with a list of ids to decide in one act (None: nothing): empty, longer
    than `MAX_ITEMS`, an empty id, or an id listed twice."""
    if not approval_ids:
        return "no reviews are listed"
    if len(approval_ids) > MAX_ITEMS:
        return f"{len(approval_ids)} reviews are listed; at most {MAX_ITEMS} are decided at once"
    seen: set[str] = set()
    for index, approval_id in enumerate(approval_ids):
        if not approval_id.strip():
            return f"item {index} is an empty id"
        if approval_id in seen:
            return f"{approval_id!r} is listed twice"
        seen.add(approval_id)
    return None


@dataclass
class Decider:
    """Decides reviews one by one or in bulk, on one channel, the way that channel's single
    decisions go (`authorize`, then `check`, then `Executor.decide`)."""

    store: ApprovalStore
    registry: ToolRegistry
    authorize: AuthorizeDecision
    channel: str
    on_decided: Callable[[], None] | None = None
    """Called once after an act that recorded anything: the runs may go on."""
    check: Check | None = None
    executor: Executor = field(init=False)

    def __post_init__(self) -> None:
        self.executor = Executor(self.registry, approval=DeferredApproval(self.store))

    async def decide_many(
        self,
        approval_ids: Sequence[str],
        *,
        approved: bool,
        who: str,
        reason: str | None = None,
        evidence: Mapping[str, Any] | None = None,
        response: str | None = None,
    ) -> list[ItemOutcome]:
        """Approve (or deny, or answer with `response`) each review of `approval_ids` as
        `who`, in order; one outcome each. Raises `ValueError` (with `bulk_problem`'s reason)
        for a list that is not accepted, before anything is recorded, and `StoreError` when
        the store fails."""
        problem = bulk_problem(approval_ids)
        if problem is not None:
            raise ValueError(problem)
        outcomes: list[ItemOutcome] = []
        try:
            for approval_id in approval_ids:
                outcomes.append(
                    await self._decide(
                        approval_id, approved, who, reason, dict(evidence or {}), response
                    )
                )
        finally:
            if self.on_decided is not None and any(o.ok for o in outcomes):
                self.on_decided()
        decided = sum(o.ok for o in outcomes)
        log.info(
            "bulk %s by %s on %s: %d of %d recorded",
            "approve" if approved else "deny",
            who,
            self.channel,
            decided,
            len(outcomes),
        )
        return outcomes

    async def decide_one(
        self,
        approval_id: str,
        *,
        approved: bool,
        who: str,
        reason: str | None = None,
        evidence: Mapping[str, Any] | None = None,
        response: str | None = None,
    ) -> ItemOutcome:
        """Approve (or deny) one review as `who`: a bulk act of one; with `response` (and
        `approved` False), answer it in the tool's place (a question's answer)."""
        [outcome] = await self.decide_many(
            [approval_id],
            approved=approved,
            who=who,
            reason=reason,
            evidence=evidence,
            response=response,
        )
        return outcome

    async def _decide(
        self,
        approval_id: str,
        approved: bool,
        who: str,
        reason: str | None,
        evidence: dict[str, Any],
        response: str | None = None,
    ) -> ItemOutcome:
        try:
            record = await self.store.get(approval_id)
        except ApprovalNotFound:
            return ItemOutcome(approval_id, "not_found", "no approval has this id")
        decision = Decision(approved=approved, reason=reason, response=response, decided_by=who)
        if record.decision is not None:
            # Said before the policy is asked, which would refuse it as decided and record
            # that refusal for nothing. Who decided is told to a decider who may not have: the
            # inbox answers only the reviews its reviewer may see, and an id is known only to
            # those who were shown it.
            return _already_decided(record, record.decision.decided_by)
        verdict = await self.authorize(who, record, decision)
        if verdict.refusal is None and self.check is not None:
            verdict = self.check(record, decision, verdict)
        if verdict.refusal is not None:
            METRICS.refused(self.channel, verdict.refusal)
            await self.store.refuse(
                record.approval_id,
                actor=who,
                channel=self.channel,
                reason=verdict.refusal,
                person=verdict.person,
                evidence=verdict.evidence(evidence),
            )
            return ItemOutcome(approval_id, "refused", verdict.refusal, record)
        try:
            decided = await self.executor.decide(
                record.approval_id,
                decision,
                decided_by=who,
                channel=self.channel,
                person=verdict.person,
                evidence=verdict.evidence(evidence),
            )
        except ApprovalAlreadyDecided as exc:
            return _already_decided(record, exc.decided_by)
        except ApprovalAlreadyVoted:
            return ItemOutcome(
                approval_id, "already_voted", "you have voted on this approval already", record
            )
        except (InvalidDecisionError, InvalidArgumentsError, UnknownToolError) as exc:
            return ItemOutcome(approval_id, "invalid", str(exc), record)
        METRICS.decided(decided, self.channel)
        return ItemOutcome(approval_id, "decided", None, decided)


def _already_decided(record: ApprovalRecord, decided_by: str | None) -> ItemOutcome:
    first = f" by {decided_by}" if decided_by else ""
    return ItemOutcome(
        record.approval_id, "already_decided", f"this approval was already decided{first}", record
    )
