"""Approval ports: how the executor gets a decision for a call that needs review.

| port                     | use when                                                      |
|--------------------------|---------------------------------------------------------------|
| `AutoDeny(reason=...)`   | no reviewer exists (read-only mode, batch jobs)               |
| `CallbackApproval(fn)`   | the decision is made in-process, now (a prompt, a policy)     |
| `DeferredApproval(store)`| a person decides later, elsewhere (Slack, email, a web page)  |
| none                     | every call that needs review is denied                        |
"""

from __future__ import annotations

import functools
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, TypeAlias, runtime_checkable

from pydantic_core import to_jsonable_python

from nodbot.core.decisions import Decision, as_decision
from nodbot.core.errors import ApprovalMismatchError, CallInFlight, StoreError
from nodbot.core.retrying import until_written
from nodbot.core.store import (
    CONCURRENT_USE_REASON,
    ApprovalRecord,
    ApprovalRequest,
    ApprovalStore,
    KeptResult,
)

__all__ = [
    "NO_PORT_REASON",
    "ApprovalPort",
    "AutoDeny",
    "CallbackApproval",
    "Decided",
    "DeferredApproval",
    "PortAnswer",
    "Spent",
    "Waiting",
]

log = logging.getLogger(__name__)

NO_PORT_REASON = "no approval port configured"
UNANSWERED_KEPT = 10_000
"""Calls whose claim's answer was lost that a `DeferredApproval` remembers at most."""


@dataclass(frozen=True)
class Decided:
    """The port has a decision for the call, to apply now."""

    decision: Decision
    approval_id: str | None = None
    """The stored approval the decision came from, if any."""
    kept: KeptResult | None = None
    """The result of the call's run, kept with the consumed approval by a process that ran
    it and could not save its run (`ApprovalStore.keep_results`): the call is answered with
    it, and the tool is not run again."""
    decided_at: datetime | None = None
    """When the stored approval was decided (None without one)."""


@dataclass(frozen=True)
class Waiting:
    """Nobody has decided yet; the call pauses."""

    approval_id: str


PortAnswer: TypeAlias = Decided | Waiting


@dataclass(frozen=True)
class Spent:
    """A stored approval whose call has ended: to be recorded as finished, with its outcome
    (`ok`, or the kind of the error). A durable run's step records those of its calls with
    its save (`RunStore.save_run`), in one transaction."""

    approval_id: str
    outcome: str
    result: KeptResult | None = None
    """What the call gave (`KeptResult`, its value as the tool returned it: made JSON only
    if it is kept), kept with the approval when the step that ran it cannot be saved
    (`DeferredApproval.keep_spent`); None where nobody needs it."""


@runtime_checkable
class ApprovalPort(Protocol):
    """Answers review requests for an executor."""

    async def request(self, request: ApprovalRequest) -> PortAnswer:
        """A decision for the call, or `Waiting`. May raise `ApprovalMismatchError`."""
        ...

    async def settle(self, answer: Decided, *, outcome: str) -> None:
        """Called once an approved call has ended (`ok`, `error`, `cancelled`, ...)."""
        ...


def _denied(reason: str, decided_by: str) -> Decision:
    return Decision(approved=False, reason=reason, decided_by=decided_by)


class AutoDeny:
    """Denies every call that needs review, with `reason`."""

    def __init__(self, reason: str = "calls that need review are denied here") -> None:
        self.reason = reason

    async def request(self, request: ApprovalRequest) -> PortAnswer:
        return Decided(_denied(self.reason, "nodbot:auto-deny"))

    async def settle(self, answer: Decided, *, outcome: str) -> None:
        return None


ApprovalCallback: TypeAlias = Callable[[ApprovalRequest], object | Awaitable[object]]


class CallbackApproval:
    """Asks `fn(request)` (sync or async) now; its answer goes through `as_decision`.

    A callback that raises, or answers with no known form of decision, denies the call: a
    failed check must not let a call through.
    """

    def __init__(self, fn: ApprovalCallback, *, name: str = "callback") -> None:
        self.fn = fn
        self.name = name

    async def request(self, request: ApprovalRequest) -> PortAnswer:
        decided_by = f"nodbot:{self.name}"
        try:
            answer = self.fn(request)
            if inspect.isawaitable(answer):
                answer = await answer
            return Decided(as_decision(answer, decided_by=decided_by, tool=request.tool))
        except Exception as exc:
            log.exception(
                "approval callback failed for %s (call %s)", request.tool, request.call_id
            )
            return Decided(_denied(f"approval callback failed: {type(exc).__name__}", decided_by))

    async def settle(self, answer: Decided, *, outcome: str) -> None:
        return None


class DeferredApproval:
    """Stores the request and pauses; a later call with the same run and call id takes the
    decision, once.

    - No active record: one is created, pending, and the call waits.
    - A record for another tool or other arguments: `ApprovalMismatchError` (fail closed).
    - Decided: the decision is consumed. A call that loses the race for it, or comes while
      the winner still runs, is denied with "approval already used by a concurrent request".
    - Consumed by a call that ran and kept its result (`keep_spent`: its step could not be
      saved): answered with that result; the tool does not run again.
    - Finished: history; the same call asked again opens a new review.

    With an `actor` unique to its process (a durable run's worker), a call whose claim
    failed as the store answered, and that finds its decision consumed by that actor, takes
    it: the lost claim took it, and nothing ran.

    With `in_flight_wait` (a durable run's worker: its lease), a call found in use with no
    result kept is not denied at once: for that many seconds after this port first found
    it so, asking raises `CallInFlight` (a `StoreError`: the step is tried again later),
    since the worker whose step consumed the decision may be alive, its tool done, and its
    result on the way through an outage. Then it is denied as above (that worker died with
    its tool running: nobody can tell whether it ran).
    """

    def __init__(
        self,
        store: ApprovalStore,
        *,
        actor: str | None = None,
        settle_within: float = 60.0,
        in_flight_wait: float | None = None,
    ) -> None:
        self.store = store
        self.actor = actor
        self.settle_within = settle_within
        """How long `settle` tries again while the store is unavailable: the tool has run,
        and its decision must be recorded as spent."""
        self.in_flight_wait = in_flight_wait
        self._unanswered: dict[tuple[str, str], None] = {}
        """Calls (run id, call id) whose last claim failed as the store answered (oldest
        first, `UNANSWERED_KEPT` at most): it may have taken their decisions."""
        self._in_flight: dict[str, float] = {}
        """Calls found in flight, by approval id: when (`time.monotonic`) first."""

    async def request(self, request: ApprovalRequest) -> PortAnswer:
        call = (request.run_id, request.call_id)
        if call in self._unanswered:
            taken = await self._taken_unanswered(request)
            if taken is not None:
                return taken
        try:
            claim = await self.store.claim(request, actor=self.actor)
        except StoreError:
            if self.actor is not None:  # it may have taken the decision: see `_took_it`
                self._unanswered[call] = None
                while len(self._unanswered) > UNANSWERED_KEPT:
                    del self._unanswered[next(iter(self._unanswered))]
            raise
        self._unanswered.pop(call, None)
        record = claim.record
        if claim.outcome == "mismatch":
            raise _mismatch(record, request)
        if claim.outcome == "pending":
            return Waiting(record.approval_id)
        if claim.outcome == "in_use":
            self._wait_in_flight(record.approval_id)
            return Decided(_denied(CONCURRENT_USE_REASON, "nodbot"), record.approval_id)
        assert record.decision is not None  # a claim only takes decided records
        if claim.outcome == "ran":
            self._in_flight.pop(record.approval_id, None)
            return Decided(
                record.decision,
                record.approval_id,
                kept=claim.result,
                decided_at=record.decided_at,
            )
        return Decided(record.decision, record.approval_id, decided_at=record.decided_at)

    async def _taken_unanswered(self, request: ApprovalRequest) -> Decided | None:
        """The decision this port took for the call by a claim whose answer was lost (the
        store failed as it answered), if it took one: the call's newest record was consumed
        by this port's `actor` (unique to its process) and, if approved, has not finished.
        Nothing ran, since nothing runs before a claim has answered: the call takes the
        decision as that claim would have (a denial, which its taking finished, included).
        None: nothing was taken (or not by this port), and the call claims as ever."""
        record = await self.store.find(request.run_id, request.call_id)
        if record is None or record.decision is None or not record.consumed:
            return None
        if record.decision.approved and record.finished:
            return None  # spent by a call that ended: not what a lost claim left
        if record.request.digest != request.digest or record.request.tool != request.tool:
            return None  # another call's: the claim says so
        consumed = [e for e in await self.store.events(record.approval_id) if e.kind == "consumed"]
        if not consumed or consumed[-1].actor != self.actor:
            return None
        self._unanswered.pop((request.run_id, request.call_id), None)
        log.warning(
            "approval %s was taken by a claim whose answer was lost; its call takes it now",
            record.approval_id,
        )
        return Decided(record.decision, record.approval_id, decided_at=record.decided_at)

    def _wait_in_flight(self, approval_id: str) -> None:
        """Raise `CallInFlight` while the call found in use may yet get its result kept."""
        if self.in_flight_wait is None:
            return
        now = time.monotonic()
        first = self._in_flight.setdefault(approval_id, now)
        left = first + self.in_flight_wait - now
        if left > 0:
            raise CallInFlight(approval_id=approval_id, left=left)
        del self._in_flight[approval_id]  # waited long enough: denied

    async def settle(self, answer: Decided, *, outcome: str) -> None:
        spent = self.spent(answer, outcome=outcome)
        if spent is not None:
            await self.settle_spent([spent])

    def spent(
        self, answer: Decided, *, outcome: str, result: KeptResult | None = None
    ) -> Spent | None:
        """What `settle` records for `answer`: its approval finished, when an approval of the
        store decided the call (a denial is finished when it is taken); with the call's
        `result`, for `keep_spent`."""
        if answer.approval_id is not None and answer.decision.approved:
            return Spent(answer.approval_id, outcome, result)
        return None

    async def keep_spent(self, spent: Sequence[Spent], *, within: float) -> None:
        """Keep the results of calls that ran with their approvals (`keep_results`), for a
        step that cannot be saved: trying again for up to `within` seconds while the store
        is unavailable. Whoever resumes the run then answers those calls with the results
        kept, and finishes their approvals with its save."""
        kept = [
            (each.approval_id, to_jsonable_python(each.result, fallback=str))
            for each in spent
            if each.result is not None
        ]
        if kept:
            await until_written(
                functools.partial(self.store.keep_results, kept),
                what=f"keeping the results of approvals {', '.join(k[0] for k in kept)}",
                within=within,
            )
        await self.settle_spent([each for each in spent if each.result is None])

    async def settle_spent(self, spent: Sequence[Spent]) -> None:
        """Record each approval as finished, one by one, trying again while the store is
        unavailable (the tools have run: their decisions must be recorded as spent)."""
        for each in spent:
            await until_written(
                functools.partial(self.store.finish, each.approval_id, outcome=each.outcome),
                what=f"recording that the call of approval {each.approval_id} ended",
                within=self.settle_within,
            )


def _mismatch(record: ApprovalRecord, request: ApprovalRequest) -> ApprovalMismatchError:
    """The error for a request whose call has an active record made for another call."""
    stored = record.request
    if stored.tool != request.tool:
        reason = f"it was made for tool {stored.tool!r}"
    else:
        reason = "it was made for other arguments"
    return ApprovalMismatchError(tool=request.tool, approval_id=record.approval_id, reason=reason)
