"""Approval stores: where pending calls wait, decisions are recorded and spent once.

One Protocol, `ApprovalStore`, with one implementation per backend; every implementation
passes the same conformance suite. The life of a record:

```
create ──► pending ──decide──► approved / denied ──consume──► in flight ──finish──► finished
                                                   (a denial is finished when consumed)
```

- `create` is create-if-absent: a call (run id, call id) has at most one *active* (not
  finished) record, and `create` returns it when it exists.
- `claim` is what a call asking for review does: create-if-absent, and when the active record
  is decided, consume it, in one atomic step (so a resume costs one transaction).
- `decide` records the first decision; a second raises `ApprovalAlreadyDecided`.
- `consume` spends the decision once; a second raises `ApprovalAlreadyConsumed`.
- Once finished, a record is history: the same call asked again gets a new review.

Every change, and every refused attempt, appends an `ApprovalEvent`; none is changed later.

A message a reviewer acts by (an email reply) is processed once, whatever review it names:
the `vote` or `decide` whose evidence carries its id (`MESSAGE_ID`), or the `refuse` asked to
(`record_message`), records the id in the same transaction as its own events, and every later
act by the same id, on any review, changes nothing but a `refused` event on the review it
names, and raises `MessageAlreadyProcessed`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Literal, Protocol, TypeAlias, runtime_checkable

from nodbot.core.calls import new_id
from nodbot.core.decisions import Decision, ToolInterrupt
from nodbot.core.delegations import MemoryDelegations
from nodbot.core.errors import (
    ApprovalAlreadyConsumed,
    ApprovalAlreadyDecided,
    ApprovalAlreadyVoted,
    ApprovalError,
    ApprovalNotDecided,
    ApprovalNotFound,
    InvalidDecisionError,
    MessageAlreadyProcessed,
    NodbotError,
)
from nodbot.core.remembered import MemoryRememberedApprovals

__all__ = [
    "ALREADY_VOTED",
    "CONCURRENT_USE_REASON",
    "MESSAGE_ID",
    "MESSAGE_ID_BYTES",
    "TIMEOUT_DECIDER",
    "TIMEOUT_REASON",
    "ApprovalEvent",
    "ApprovalRecord",
    "ApprovalRequest",
    "ApprovalStatus",
    "ApprovalStore",
    "Claim",
    "ClaimOutcome",
    "DecisionAction",
    "EventKind",
    "Evidence",
    "IdempotencyKey",
    "IdempotencyKeyUsed",
    "KeptKey",
    "KeptResult",
    "MemoryApprovalStore",
    "MemorySessionRevocations",
    "MessageAlreadyProcessed",
    "SessionRevocations",
    "action_of",
    "check_vote",
    "decided_person",
    "decision_detail",
    "message_of",
    "processed_reason",
    "refusal_detail",
    "tally",
    "timeout_decision",
]

ApprovalStatus: TypeAlias = Literal["pending", "approved", "denied"]
EventKind: TypeAlias = Literal[
    "created",
    "voted",
    "decided",
    "consumed",
    "kept",
    "finished",
    "refused",
    "delivered",
    "undelivered",
]
Clock: TypeAlias = Callable[[], datetime]
ClaimOutcome: TypeAlias = Literal["pending", "mismatch", "taken", "in_use", "ran"]
KeptResult: TypeAlias = dict[str, Any]
"""What a call that ran gave, as JSON (`{"status": "ok", "value": ..., "arguments": {...}}`
or `{"status": "error", "message": ..., "arguments": {...}}`), kept with its consumed
approval when the step that ran it could not be saved (`ApprovalStore.keep_results`)."""
DecisionAction: TypeAlias = Literal["approve", "edit", "deny", "respond"]
Evidence: TypeAlias = Mapping[str, Any]
"""What a channel knows of who acted (JSON values): Slack `{"user", "team", "action_ts"}`,
the web inbox `{"session"}`, the API `{"token"}`, the command line `{"os_user"}`."""

CONCURRENT_USE_REASON = "approval already used by a concurrent request"
"""The reason given to a call that lost the race for a decision."""

TIMEOUT_DECIDER = "nodbot:timeout"
"""Who decided a review that nobody decided before its deadline."""
TIMEOUT_REASON = "nobody decided before the deadline"


ALREADY_VOTED = "already voted"

MESSAGE_ID = "message_id"
"""The evidence key of the id of the message a reviewer acted by (an email's Message-ID):
it is processed once (see the module). At most `MESSAGE_ID_BYTES` bytes in UTF-8."""
MESSAGE_ID_BYTES = 998
"""The longest message id a store records (RFC 5322's longest line)."""


def processed_reason(message_id: str, first: str) -> str:
    """The reason of the `refused` event of an act by a message processed before on the
    review `first` (`MessageAlreadyProcessed.reason`)."""
    return MessageAlreadyProcessed.reason(message_id, first)


def message_of(evidence: Evidence | None) -> str | None:
    """The id of the message `evidence` says an act was made by (`MESSAGE_ID`), or None."""
    found = None if evidence is None else evidence.get(MESSAGE_ID)
    return found if isinstance(found, str) and found else None


def check_vote(decision: Decision, required: int) -> str:
    """The voter of `decision` ("" for an unnamed decision on a review that needs one
    approval). Raises `InvalidDecisionError` for an unnamed vote on a review that needs
    several, or an edit there (whose edit would win is unclear)."""
    if required > 1 and not decision.decided_by:
        raise InvalidDecisionError(
            "a vote needs decided_by: who votes",
            errors=[{"field": "decided_by", "message": "missing"}],
        )
    if required > 1 and decision.edited_args is not None:
        raise InvalidDecisionError(
            f"this review needs {required} approvals, so its arguments cannot be edited: "
            "approve or deny",
            errors=[{"field": "edited_args", "message": "not with several approvals"}],
        )
    return decision.decided_by or ""


def tally(votes: Sequence[Decision], required: int) -> Decision | None:
    """The decision the votes make, or None yet: the first deny denies; `required` approvals
    approve, decided by every approver."""
    for vote in votes:
        if not vote.approved:
            return vote
    if len(votes) < required:
        return None
    if required == 1:
        return votes[-1]
    voters = ", ".join(vote.decided_by or "" for vote in votes)
    return Decision(approved=True, reason=f"approved by {voters}", decided_by=voters)


def timeout_decision(on_timeout: str) -> Decision:
    """The decision a review that timed out gets."""
    return Decision(
        approved=on_timeout == "approve", reason=TIMEOUT_REASON, decided_by=TIMEOUT_DECIDER
    )


def action_of(decision: Decision) -> DecisionAction:
    """What the reviewer did: `approve`, `edit` (approve with changed arguments), `deny`, or
    `respond` (a denial that answers in the tool's place)."""
    if not decision.approved:
        return "respond" if decision.response is not None else "deny"
    return "approve" if decision.edited_args is None else "edit"


def decision_detail(
    decision: Decision,
    *,
    digest: str,
    status: ApprovalStatus | None = None,
    evidence: Evidence | None = None,
    voters: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The detail of a `voted` event (no `status`) or a `decided` one: the action, reason and
    edit, a respond's answer (`response`, left out of the others), the digest of the
    arguments the decision is bound to, the channel's evidence (left out when there is none)
    and, for a review that needs several approvals, its voters."""
    found: dict[str, Any] = {
        "action": action_of(decision),
        "reason": decision.reason,
        "edited_args": decision.edited_args,
        "digest": digest,
    }
    if decision.response is not None:
        found["response"] = decision.response
    if status is not None:
        found["status"] = status
    if evidence is not None:
        found["evidence"] = dict(evidence)
    if voters is not None:
        found["voters"] = list(voters)
    return found


def decided_person(outcome: Decision, required: int, person: str | None) -> str | None:
    """The person the `decided` event of a vote names: the voter's, unless the decision is
    several approvers' (their keys are then the detail's `voters`)."""
    return None if required > 1 and outcome.approved else person


def refusal_detail(reason: str, evidence: Evidence | None = None) -> dict[str, Any]:
    """The detail of a `refused` event: why, and the channel's evidence (if any)."""
    found: dict[str, Any] = {"reason": reason}
    if evidence is not None:
        found["evidence"] = dict(evidence)
    return found


def utc_now() -> datetime:
    """The current time, timezone-aware, in UTC."""
    return datetime.now(UTC)


@dataclass(frozen=True)
class IdempotencyKey:
    """A client's `Idempotency-Key` on one route (`POST /runs`, `POST /approvals`): the
    request it names is made once, however many times it is sent."""

    token_name: str
    """The API token that sent it: keys are scoped to it (two tokens may use one key)."""
    route: str
    """The route it was sent to, such as `POST /runs`."""
    key: str
    body_digest: str
    """SHA-256 of the request's canonical JSON body: a repeat has the same."""


@dataclass(frozen=True)
class KeptKey:
    """What a stored `IdempotencyKey` names."""

    body_digest: str
    """The digest of the body it was first sent with."""
    target_id: str
    """The run (`POST /runs`) or the approval (`POST /approvals`) it made or answered with."""
    created_at: datetime


class IdempotencyKeyUsed(NodbotError):
    """A write that carried an idempotency key found the key stored already: nothing was
    written. `kept` is what the key names (None when it expired meanwhile)."""

    kind = "idempotency-key-used"

    def __init__(self, *, key: IdempotencyKey, kept: KeptKey | None) -> None:
        super().__init__(f"the idempotency key {key.key!r} of {key.route} was used already")
        self.key = key
        self.kept = kept

    def details(self) -> dict[str, Any]:
        return {"route": self.key.route, "target_id": self.kept and self.kept.target_id}


@dataclass(frozen=True)
class ApprovalRequest:
    """One call that waits for review: what is stored and what binds a decision to it."""

    run_id: str
    call_id: str
    tool: str
    arguments: dict[str, Any]
    """The validated arguments (JSON values), as the reviewer sees them."""
    digest: str
    """SHA-256 of the canonical arguments; a decision only answers a call with this digest."""
    requested_by: str | None = None
    """Who started the run."""
    deadline: datetime | None = None
    """When nobody has decided by then, `expire_due` decides with `on_timeout`."""
    on_timeout: Literal["approve", "deny"] = "deny"
    """What a review that timed out becomes (recorded as decided by `nodbot:timeout`)."""
    approvals_required: int = 1
    """How many distinct reviewers must approve (any deny denies)."""
    policy: dict[str, Any] = field(default_factory=dict)
    """What the bot's rules say about this review (who may decide, which decisions, which
    arguments may be edited); JSON values, stored as given and read by the channels."""
    idempotency: IdempotencyKey | None = field(default=None, compare=False)
    """The key of the API request that asks (`POST /approvals`): a SQL store's `create`
    writes it with the record it makes, in the same transaction, and raises
    `IdempotencyKeyUsed` (making nothing) when it is stored already. Not part of the call,
    and not read back."""

    @property
    def interrupt(self) -> ToolInterrupt:
        """The call as a reviewer sees it."""
        return ToolInterrupt(self.tool, self.call_id, self.arguments)


@dataclass(frozen=True)
class ApprovalRecord:
    """A stored approval: the request, the decision, and how far it has been used."""

    approval_id: str
    request: ApprovalRequest
    created_at: datetime
    decision: Decision | None = None
    decided_at: datetime | None = None
    consumed_at: datetime | None = None
    """When a call took the decision (a decision is taken once)."""
    finished_at: datetime | None = None
    """When the call that took the decision ended; the record is then history."""
    outcome: str | None = None
    """How that call ended: `ok`, `error`, `denied`, ..."""

    @property
    def status(self) -> ApprovalStatus:
        """`pending` until decided, then `approved` or `denied`."""
        if self.decision is None:
            return "pending"
        return "approved" if self.decision.approved else "denied"

    @property
    def consumed(self) -> bool:
        """Whether the decision has been spent."""
        return self.consumed_at is not None

    @property
    def finished(self) -> bool:
        """Whether the call that spent the decision has ended."""
        return self.finished_at is not None


@dataclass(frozen=True)
class Claim:
    """What `ApprovalStore.claim` did with a call's request for review.

    - `pending`: the active record waits for a decision (it may have just been created).
    - `mismatch`: the active record was made for another tool or other arguments (by digest);
      nothing changed.
    - `taken`: the decision was consumed by this claim; `record` is the consumed record.
    - `in_use`: another call consumed the decision and has not finished; the refused attempt
      is in the events.
    - `ran`: a call consumed the decision, ran and kept its result (`result`), and has not
      finished: an earlier step of the same run whose save failed. The call is answered with
      the result, and the tool does not run again.
    """

    record: ApprovalRecord
    outcome: ClaimOutcome
    result: KeptResult | None = None
    """The kept result, for `ran`."""


@dataclass(frozen=True)
class ApprovalEvent:
    """One line of the audit log. Events are appended and never changed."""

    seq: int
    approval_id: str
    kind: EventKind
    at: datetime
    actor: str | None = None
    """Who acted: the decider, or the process that consumed."""
    channel: str | None = None
    """Through which channel: `api`, `slack`, `email`, `web`, `executor`, ..."""
    detail: dict[str, Any] = field(default_factory=dict)
    """For `voted` and `decided`: `decision_detail` (`{"action", "reason", "edited_args",
    "digest", "evidence"}`, and `status` for `decided`); for `refused`: `refusal_detail`
    (`{"reason", "evidence"}`); for `finished`: `{"outcome"}`."""
    person: str | None = None
    """The person the actor's handle resolved to (`person:ana`, `email:ana@example.com`,
    `slack:U0123`), when the channel resolved one; `actor` keeps the handle used."""


_Records: TypeAlias = list[ApprovalRecord]
_Events: TypeAlias = list[ApprovalEvent]


@runtime_checkable
class ApprovalStore(Protocol):
    """Where approvals live. Every method is atomic; none reads then writes unguarded."""

    async def create(self, request: ApprovalRequest) -> ApprovalRecord:
        """The active record of the request's call, created pending if there is none."""
        ...

    async def claim(self, request: ApprovalRequest, *, actor: str | None = None) -> Claim:
        """`create`, then, when the active record is decided and was made for the request's
        tool and digest, `consume` it (by `actor`), as one atomic step. See `Claim`."""
        ...

    async def get(self, approval_id: str) -> ApprovalRecord:
        """The record with this id. Raises `ApprovalNotFound`."""
        ...

    async def find(self, run_id: str, call_id: str) -> ApprovalRecord | None:
        """The newest record of this call, finished or not, or None."""
        ...

    async def list(
        self,
        *,
        run_id: str | None = None,
        status: ApprovalStatus | None = None,
        limit: int | None = None,
        newest_first: bool = False,
    ) -> _Records:
        """Records in creation order (newest first if asked), filtered by run and status;
        at most `limit` of them."""
        ...

    async def decide(
        self,
        approval_id: str,
        decision: Decision,
        *,
        channel: str | None = None,
        person: str | None = None,
        evidence: Evidence | None = None,
    ) -> ApprovalRecord:
        """Record the decision (its `decided` event names `person`, the person the decider's
        handle resolved to, and keeps the channel's `evidence`; a message id there is processed
        once, see the module). Raises `ApprovalNotFound`, `MessageAlreadyProcessed`,
        `ApprovalAlreadyDecided`."""
        ...

    async def vote(
        self,
        approval_id: str,
        decision: Decision,
        *,
        channel: str | None = None,
        person: str | None = None,
        evidence: Evidence | None = None,
    ) -> ApprovalRecord:
        """Record one reviewer's vote (`decision.decided_by` votes, as `person` when given).
        A deny decides at once; approvals decide once `approvals_required` distinct reviewers
        approved: distinct by `person` when given, else by `decided_by`, so one person voting
        under two handles is refused. With one approval required, a vote is a decision.
        A message id in `evidence` is processed once (see the module): a vote refused as
        decided already, or voted already, has processed it too.

        Raises `ApprovalNotFound`, `InvalidDecisionError` (nothing recorded),
        `MessageAlreadyProcessed`, `ApprovalAlreadyDecided`, `ApprovalAlreadyVoted`.
        """
        ...

    async def refuse(
        self,
        approval_id: str,
        *,
        actor: str | None,
        channel: str | None,
        reason: str,
        person: str | None = None,
        evidence: Evidence | None = None,
        record_message: bool = False,
    ) -> None:
        """Record an attempt that a channel refused before it reached the store (a click by
        someone who is not a reviewer, say) as a `refused` event. With `record_message`, the
        message id of `evidence` is processed by it, once (see the module): a channel asks
        so for the messages whose sender it verified. Raises `ApprovalNotFound`,
        `MessageAlreadyProcessed`, and `ValueError` for `record_message` without a message
        id."""
        ...

    async def consume(self, approval_id: str, *, actor: str | None = None) -> ApprovalRecord:
        """Spend the decision, once. A denial is finished at once.

        Raises `ApprovalNotFound`, `ApprovalNotDecided`, `ApprovalAlreadyConsumed`.
        """
        ...

    async def finish(self, approval_id: str, *, outcome: str) -> ApprovalRecord:
        """Mark the call that consumed the decision as ended. Finishing twice changes nothing."""
        ...

    async def keep_results(self, kept: Sequence[tuple[str, KeptResult]]) -> None:
        """Keep each call's result with its approval, consumed and not finished (others are
        left alone): a later `claim` of the call answers `ran` with it. Keeping again
        replaces nothing (the first result stands)."""
        ...

    async def events(self, approval_id: str | None = None) -> _Events:
        """The audit log, oldest first, for one approval or all."""
        ...

    async def counts(self) -> dict[ApprovalStatus, int]:
        """How many approvals have each status."""
        ...

    async def expire_due(self, *, limit: int = 100) -> _Records:
        """Decide up to `limit` pending approvals whose deadline has passed, each with its
        `on_timeout` decision (decided by `nodbot:timeout`, channel `timer`); returns them."""
        ...


class MemoryApprovalStore:
    """An `ApprovalStore` in this process's memory: for tests, examples and single runs."""

    def __init__(self, *, clock: Clock = utc_now) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._records: dict[str, ApprovalRecord] = {}
        self._active: dict[tuple[str, str], str] = {}
        self._newest: dict[tuple[str, str], str] = {}
        self._events: _Events = []
        self._votes: dict[str, list[tuple[str, Decision]]] = {}  # (voter, vote)
        self._messages: dict[str, str] = {}  # message id -> the review it was processed on
        self._kept: dict[str, KeptResult] = {}  # approval id -> the result its call kept
        self.sessions = MemorySessionRevocations(clock=clock)
        """The web inbox's ended sessions (`SessionRevocations`), in this process only."""
        self.remembered = MemoryRememberedApprovals(clock=clock)
        """Reviewers' remembered approvals (`core.remembered`), in this process only."""
        self.delegations = MemoryDelegations(clock=clock)
        """Reviewers' reviews handed to others for a while (`core.delegations`), in this
        process only."""

    async def create(self, request: ApprovalRequest) -> ApprovalRecord:
        with self._lock:
            return self._create(request)

    async def claim(self, request: ApprovalRequest, *, actor: str | None = None) -> Claim:
        with self._lock:
            record = self._create(request)
            stored = record.request
            if stored.tool != request.tool or stored.digest != request.digest:
                return Claim(record, "mismatch")
            if record.decision is None:
                return Claim(record, "pending")
            if record.consumed:
                kept = self._kept.get(record.approval_id)
                if kept is not None:
                    return Claim(record, "ran", kept)
                self._refuse(record.approval_id, CONCURRENT_USE_REASON, actor, "executor")
                return Claim(record, "in_use")
            return Claim(self._consume(record, actor), "taken")

    async def get(self, approval_id: str) -> ApprovalRecord:
        with self._lock:
            return self._get(approval_id)

    async def find(self, run_id: str, call_id: str) -> ApprovalRecord | None:
        with self._lock:
            newest = self._newest.get((run_id, call_id))
            return None if newest is None else self._records[newest]

    async def list(
        self,
        *,
        run_id: str | None = None,
        status: ApprovalStatus | None = None,
        limit: int | None = None,
        newest_first: bool = False,
    ) -> _Records:
        with self._lock:
            found = [
                record
                for record in self._records.values()
                if (run_id is None or record.request.run_id == run_id)
                and (status is None or record.status == status)
            ]
        if newest_first:
            found.reverse()
        return found if limit is None else found[:limit]

    async def decide(
        self,
        approval_id: str,
        decision: Decision,
        *,
        channel: str | None = None,
        person: str | None = None,
        evidence: Evidence | None = None,
    ) -> ApprovalRecord:
        with self._lock:
            record = self._get(approval_id)
            self._process(approval_id, evidence, decision.decided_by, channel, person)
            if record.decision is not None:
                self._refuse(
                    approval_id, "already decided", decision.decided_by, channel, person, evidence
                )
                raise ApprovalAlreadyDecided(
                    approval_id=approval_id, decided_by=record.decision.decided_by
                )
            record = replace(record, decision=decision, decided_at=self._clock())
            self._records[approval_id] = record
            detail = decision_detail(
                decision, digest=record.request.digest, status=record.status, evidence=evidence
            )
            self._log(
                approval_id,
                "decided",
                actor=decision.decided_by,
                channel=channel,
                detail=detail,
                person=person,
            )
            return record

    async def vote(
        self,
        approval_id: str,
        decision: Decision,
        *,
        channel: str | None = None,
        person: str | None = None,
        evidence: Evidence | None = None,
    ) -> ApprovalRecord:
        with self._lock:
            record = self._get(approval_id)
            required = record.request.approvals_required
            voter = check_vote(decision, required)
            self._process(approval_id, evidence, decision.decided_by, channel, person)
            if record.decision is not None:
                self._refuse(approval_id, "already decided", voter, channel, person, evidence)
                raise ApprovalAlreadyDecided(
                    approval_id=approval_id, decided_by=record.decision.decided_by
                )
            votes = self._votes.setdefault(approval_id, [])
            key = person or voter
            if any(earlier == key for earlier, _ in votes):
                self._refuse(approval_id, ALREADY_VOTED, voter, channel, person, evidence)
                raise ApprovalAlreadyVoted(approval_id=approval_id, voter=key)
            votes.append((key, decision))
            digest = record.request.digest
            self._log(
                approval_id,
                "voted",
                actor=voter,
                channel=channel,
                detail=decision_detail(decision, digest=digest, evidence=evidence),
                person=person,
            )
            outcome = tally([vote for _, vote in votes], required)
            if outcome is None:
                return record
            record = replace(record, decision=outcome, decided_at=self._clock())
            self._records[approval_id] = record
            detail = decision_detail(
                outcome,
                digest=digest,
                status=record.status,
                evidence=evidence,
                voters=[key for key, _ in votes] if required > 1 else None,
            )
            self._log(
                approval_id,
                "decided",
                actor=outcome.decided_by,
                channel=channel,
                detail=detail,
                person=decided_person(outcome, required, person),
            )
            return record

    async def refuse(
        self,
        approval_id: str,
        *,
        actor: str | None,
        channel: str | None,
        reason: str,
        person: str | None = None,
        evidence: Evidence | None = None,
        record_message: bool = False,
    ) -> None:
        if record_message and message_of(evidence) is None:
            raise ValueError("record_message needs evidence with a message id")
        with self._lock:
            self._get(approval_id)
            if record_message:
                self._process(approval_id, evidence, actor, channel, person)
            self._refuse(approval_id, reason, actor, channel, person, evidence)

    async def consume(self, approval_id: str, *, actor: str | None = None) -> ApprovalRecord:
        with self._lock:
            record = self._get(approval_id)
            if record.decision is None:
                self._refuse(approval_id, "not decided", actor, "executor")
                raise ApprovalNotDecided(approval_id=approval_id)
            if record.consumed:
                self._refuse(approval_id, CONCURRENT_USE_REASON, actor, "executor")
                raise ApprovalAlreadyConsumed(approval_id=approval_id)
            return self._consume(record, actor)

    async def keep_results(self, kept: Sequence[tuple[str, KeptResult]]) -> None:
        with self._lock:
            for approval_id, result in kept:
                record = self._records.get(approval_id)
                if record is None or not record.consumed or record.finished:
                    continue
                if approval_id not in self._kept:
                    self._kept[approval_id] = dict(result)
                    self._log(approval_id, "kept", channel="executor", detail={"result": result})

    async def finish(self, approval_id: str, *, outcome: str) -> ApprovalRecord:
        with self._lock:
            record = self._get(approval_id)
            if record.finished:
                return record
            if not record.consumed:
                raise ApprovalError(
                    f"approval {approval_id} cannot finish: no call has consumed it",
                    approval_id=approval_id,
                )
            record = self._finish(record, outcome, self._clock())
            self._records[approval_id] = record
            return record

    async def events(self, approval_id: str | None = None) -> _Events:
        with self._lock:
            return [e for e in self._events if approval_id in (None, e.approval_id)]

    async def counts(self) -> dict[ApprovalStatus, int]:
        with self._lock:
            found: dict[ApprovalStatus, int] = {"pending": 0, "approved": 0, "denied": 0}
            for record in self._records.values():
                found[record.status] += 1
            return found

    async def expire_due(self, *, limit: int = 100) -> _Records:
        now = self._clock()
        expired: _Records = []
        with self._lock:
            for record in list(self._records.values()):
                deadline = record.request.deadline
                if len(expired) == limit:
                    break
                if record.decision is not None or deadline is None or deadline > now:
                    continue
                decision = timeout_decision(record.request.on_timeout)
                record = replace(record, decision=decision, decided_at=now)
                self._records[record.approval_id] = record
                detail = decision_detail(
                    decision, digest=record.request.digest, status=record.status
                )
                self._log(
                    record.approval_id,
                    "decided",
                    actor=TIMEOUT_DECIDER,
                    channel="timer",
                    detail=detail,
                )
                expired.append(record)
        return expired

    def _create(self, request: ApprovalRequest) -> ApprovalRecord:
        key = (request.run_id, request.call_id)
        active = self._active.get(key)
        if active is not None:
            return self._records[active]
        record = ApprovalRecord(new_id("apr_"), request, created_at=self._clock())
        self._records[record.approval_id] = record
        self._active[key] = self._newest[key] = record.approval_id
        self._log(record.approval_id, "created", actor=request.requested_by)
        return record

    def _process(
        self,
        approval_id: str,
        evidence: Evidence | None,
        actor: str | None,
        channel: str | None,
        person: str | None,
    ) -> None:
        """Record the message of `evidence`, if any, as processed by an act on the review;
        one processed before raises `MessageAlreadyProcessed`, its refusal logged."""
        message_id = message_of(evidence)
        if message_id is None:
            return
        first = self._messages.get(message_id)
        if first is None:
            self._messages[message_id] = approval_id
            return
        reason = processed_reason(message_id, first)
        self._refuse(approval_id, reason, actor, channel, person, evidence)
        raise MessageAlreadyProcessed(approval_id=approval_id, message_id=message_id, first=first)

    def _get(self, approval_id: str) -> ApprovalRecord:
        try:
            return self._records[approval_id]
        except KeyError:
            raise ApprovalNotFound(approval_id=approval_id) from None

    def _consume(self, record: ApprovalRecord, actor: str | None) -> ApprovalRecord:
        now = self._clock()
        record = replace(record, consumed_at=now)
        self._log(record.approval_id, "consumed", actor=actor, channel="executor")
        if record.status == "denied":
            record = self._finish(record, "denied", now)
        self._records[record.approval_id] = record
        return record

    def _finish(self, record: ApprovalRecord, outcome: str, now: datetime) -> ApprovalRecord:
        key = (record.request.run_id, record.request.call_id)
        if self._active.get(key) == record.approval_id:
            del self._active[key]
        self._log(record.approval_id, "finished", channel="executor", detail={"outcome": outcome})
        return replace(record, finished_at=now, outcome=outcome)

    def _refuse(
        self,
        approval_id: str,
        reason: str,
        actor: str | None,
        channel: str | None,
        person: str | None = None,
        evidence: Evidence | None = None,
    ) -> None:
        detail = refusal_detail(reason, evidence)
        self._log(
            approval_id, "refused", actor=actor, channel=channel, detail=detail, person=person
        )

    def _log(
        self,
        approval_id: str,
        kind: EventKind,
        *,
        actor: str | None = None,
        channel: str | None = None,
        detail: dict[str, Any] | None = None,
        person: str | None = None,
    ) -> None:
        event = ApprovalEvent(
            seq=len(self._events) + 1,
            approval_id=approval_id,
            kind=kind,
            at=self._clock(),
            actor=actor,
            channel=channel,
            detail=detail or {},
            person=person,
        )
        self._events.append(event)


@runtime_checkable
class SessionRevocations(Protocol):
    """The web inbox's sessions ended before their expiry (a sign-out, or every session of a
    person), held where every process of the bot looks (a store's `sessions`), so that a
    restart or another replica does not take an ended session for a live one. Each is kept
    until `until`, when the sessions it ends have expired anyway, then pruned."""

    async def revoke_session(
        self, session_id: str, *, until: datetime, at: datetime | None = None
    ) -> None:
        """End the session `session_id` (at `at`, by default now), which expires at `until`.
        Raises `StoreError`."""
        ...

    async def revoke_principal(
        self, principal: str, *, until: datetime, at: datetime | None = None
    ) -> None:
        """End every session of `principal` (in any case) issued at or before `at`, by
        default now; `until` is when the last of them expires. Raises `StoreError`."""
        ...

    async def session_revoked(
        self, session_id: str, principal: str, issued_at: datetime | None
    ) -> bool:
        """Whether the session was ended: itself, or by a revocation of its principal at or
        after `issued_at` (None, for a session that does not say: by any). Raises
        `StoreError` when it cannot be told, which must not count as live."""
        ...


class MemorySessionRevocations:
    """`SessionRevocations` in this process's memory (`MemoryApprovalStore.sessions`)."""

    def __init__(self, *, clock: Clock = utc_now) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._sessions: dict[str, datetime] = {}  # session id -> until
        self._principals: list[tuple[str, datetime, datetime]] = []  # who, before, until

    async def revoke_session(
        self, session_id: str, *, until: datetime, at: datetime | None = None
    ) -> None:
        with self._lock:
            self._prune(at or self._clock())
            self._sessions[session_id] = max(until, self._sessions.get(session_id, until))

    async def revoke_principal(
        self, principal: str, *, until: datetime, at: datetime | None = None
    ) -> None:
        now = at or self._clock()
        with self._lock:
            self._prune(now)
            self._principals.append((principal.lower(), now, until))

    async def session_revoked(
        self, session_id: str, principal: str, issued_at: datetime | None
    ) -> bool:
        who = principal.lower()
        with self._lock:
            if session_id in self._sessions:
                return True
            return any(
                name == who and (issued_at is None or before >= issued_at)
                for name, before, _ in self._principals
            )

    def _prune(self, now: datetime) -> None:
        self._sessions = {sid: until for sid, until in self._sessions.items() if until > now}
        self._principals = [entry for entry in self._principals if entry[2] > now]
