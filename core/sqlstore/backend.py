"""What the SQL store asks of a database backend, and the values they trade.

Each write operation is one transaction that either changes the record and appends its
events, or, when the record is not in the state the change needs, appends a `refused` event
(for decide and consume) and returns the record as it is. `SqlApprovalStore` turns that into
records and errors. The rules for which events an operation appends live here, once.

An act by a message (`Act.once`: its evidence carries a message id, `core.store.MESSAGE_ID`)
is one transaction too, that first locks the review and inserts the id into
`processed_messages`, whose primary key is the check: an insert that meets the id (processed
before, by this store or another, on any review) appends the `refused` event of a repeat
instead and returns a `Repeat`; one that does not goes on to the act, all or nothing.

A run's `pending` column counts its pending reviews: the transaction that creates a review
adds one, the one that decides it (decide, the vote that decides, a timeout) takes one off,
so that `claim_ready` finds the ready runs through the `runs_claimable` index alone, at the
same cost however many reviews are open.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, NamedTuple, Protocol, TypeAlias

from nodbot.core.decisions import Decision
from nodbot.core.sqlstore.notices import Listening
from nodbot.core.store import (
    CONCURRENT_USE_REASON,
    ApprovalRequest,
    ApprovalStatus,
    Evidence,
    check_vote,
    decided_person,
    decision_detail,
    message_of,
    processed_reason,
    refusal_detail,
    tally,
    timeout_decision,
)
from nodbot.core.tools import canonical_json

__all__ = [
    "ALREADY_DECIDED",
    "COLUMNS",
    "COLUMN_NAMES",
    "DELIVERY_COLUMNS",
    "DELIVERY_COLUMN_NAMES",
    "NOT_DECIDED",
    "RUN_COLUMNS",
    "RUN_COLUMN_NAMES",
    "STAGES",
    "Act",
    "Backend",
    "Change",
    "Claimed",
    "Counted",
    "DigestBound",
    "EventRow",
    "EventValues",
    "KeyTaken",
    "Once",
    "Repeat",
    "Row",
    "VoteResult",
    "claim_step",
    "consume_refusal",
    "consumed_events",
    "created_event",
    "delivered_event",
    "detail",
    "digest_bound",
    "refusal_once",
    "timeout_detail",
    "undelivered_event",
]

COLUMN_NAMES = (
    "approval_id",
    "run_id",
    "call_id",
    "tool",
    "arguments",
    "digest",
    "requested_by",
    "status",
    "decision",
    "created_at",
    "decided_at",
    "consumed_at",
    "finished_at",
    "outcome",
    "deadline",
    "on_timeout",
    "policy",
    "approvals_required",
)
"""The columns of `approvals` that make a record (`seq` only orders them)."""
COLUMNS = ", ".join(COLUMN_NAMES)

RUN_COLUMN_NAMES = (
    "run_id",
    "agent",
    "status",
    "messages",
    "version",
    "created_at",
    "updated_at",
    "requested_by",
    "final_text",
    "error",
    "claimed_by",
    "lease_until",
    "started_by",
)
"""The columns of `runs` that make a run record."""
RUN_COLUMNS = ", ".join(RUN_COLUMN_NAMES)
DELIVERY_COLUMN_NAMES = (
    "seq",
    "approval_id",
    "kind",
    "target",
    "status",
    "attempts",
    "due_at",
    "created_at",
    "sent_at",
    "ref",
    "error",
    "claimed_by",
    "lease_until",
)
"""The columns of `deliveries`."""
DELIVERY_COLUMNS = ", ".join(DELIVERY_COLUMN_NAMES)
STAGES = {"request": 1, "outcome": 2}
"""The `announced` value of each stage."""


Row: TypeAlias = dict[str, Any]
"""One `approvals` row: column name to value, timestamps as aware UTC datetimes."""


class EventValues(NamedTuple):
    """An event to append (its time is the operation's, its chain link the backend's)."""

    kind: str
    actor: str | None
    channel: str | None
    detail: str
    """A JSON object."""
    person: str | None = None


def created_event(row: Row) -> EventValues:
    """A new review's first event."""
    return EventValues("created", row["requested_by"], None, "{}")


def delivered_event(row: Row, worker: str) -> EventValues:
    """The event of a delivery made: who delivered it, through which channel, what."""
    channel = row["target"].partition(":")[0]
    return EventValues(
        "delivered",
        worker,
        channel,
        canonical_json({"kind": row["kind"], "target": row["target"]}),
    )


def undelivered_event(row: Row, worker: str, error: str) -> EventValues:
    """The event of a delivery given up."""
    channel = row["target"].partition(":")[0]
    detail = {"kind": row["kind"], "target": row["target"], "error": error}
    return EventValues("undelivered", worker, channel, canonical_json(detail))


ALREADY_DECIDED = "already decided"
NOT_DECIDED = "not decided"


def consume_refusal(existing: Row) -> str:
    """Why a consume was refused, as the event's detail."""
    reason = NOT_DECIDED if existing["decided_at"] is None else CONCURRENT_USE_REASON
    return detail("reason", reason)


@functools.cache
def detail(key: str, value: str) -> str:
    """The JSON object `{key: value}`, made once per pair: details repeat a few values."""
    return canonical_json({key: value})


def consumed_events(row: Row, actor: str | None) -> list[EventValues]:
    """The events of a consume: `consumed`, and `finished` for a denial."""
    events = [EventValues("consumed", actor, "executor", "{}")]
    if row["status"] == "denied":
        events.append(EventValues("finished", None, "executor", detail("outcome", "denied")))
    return events


@dataclass(frozen=True)
class DigestBound:
    """A detail whose `digest` only the database knows (it is the review's): the JSON text
    before the digest and after it, for a statement that splices the digest in."""

    before: str
    after: str

    def text(self, digest: str) -> str:
        """The detail with `digest` in its place."""
        return self.before + digest + self.after


_DIGEST_SLOT = '"digest":""'


def digest_bound(fields: dict[str, Any]) -> DigestBound:
    """`fields` (a `decision_detail`) as a `DigestBound`. Keys are sorted and only `action`
    (approve, edit, deny or respond) comes before `digest`, so the first slot found is the
    digest's."""
    text = canonical_json({**fields, "digest": ""})
    cut = text.index(_DIGEST_SLOT) + len(_DIGEST_SLOT) - 1
    return DigestBound(text[:cut], text[cut:])


@functools.lru_cache(maxsize=256)
def _plain_detail(approved: bool, reason: str | None, status: ApprovalStatus | None) -> DigestBound:
    """The detail of a `decided` event (`status`) or a `voted` one (None) of a decision with
    no edit and no evidence: made once for each such decision (most decisions are one of a
    few: approved or denied, with one of a few reasons)."""
    decision = Decision(approved=approved, reason=reason)
    return digest_bound(decision_detail(decision, digest="", status=status))


@functools.cache
def timeout_detail(on_timeout: str) -> DigestBound:
    """The detail of the `decided` event of a review that timed out with `on_timeout`."""
    decision = timeout_decision(on_timeout)
    status: ApprovalStatus = "approved" if decision.approved else "denied"
    return digest_bound(decision_detail(decision, digest="", status=status))


class Counted(NamedTuple):
    """The decision the votes made: its JSON, the review's status, its `decided` event."""

    decision: str
    status: str
    event: EventValues


@dataclass(frozen=True)
class Once:
    """The message an act is made by, which is processed once."""

    message_id: str
    refusal: Callable[[str], EventValues]
    """The `refused` event of a repeat, given the review the message was processed on."""


@dataclass(frozen=True)
class Repeat:
    """An act refused because its message was processed before, on the review `first` (the
    act's `refused` event is appended)."""

    message_id: str
    first: str


def refusal_once(message_id: str, event: EventValues, evidence: Evidence | None) -> Once:
    """The `Once` of a refusal (`event`) by the message `message_id`."""
    return Once(
        message_id,
        lambda first: event._replace(
            detail=canonical_json(refusal_detail(processed_reason(message_id, first), evidence))
        ),
    )


@dataclass(frozen=True)
class Act:
    """A reviewer's decision or vote as the backends record it: the decision, through which
    channel, by whom (`person`, the handle's person), and the channel's evidence."""

    decision: Decision
    channel: str | None = None
    person: str | None = None
    evidence: Evidence | None = None

    @property
    def status(self) -> ApprovalStatus:
        """The status the decision gives a review."""
        return "approved" if self.decision.approved else "denied"

    @property
    def voter(self) -> str:
        """What votes are distinct by: the person, else the handle (`decided_by`)."""
        return self.person or self.decision.decided_by or ""

    @property
    def once(self) -> Once | None:
        """The message the act is made by, if its evidence names one."""
        message_id = message_of(self.evidence)
        if message_id is None:
            return None
        actor = self.decision.decided_by
        return Once(
            message_id, lambda first: self.refused(processed_reason(message_id, first), actor)
        )

    def refused(self, reason: str, actor: str | None) -> EventValues:
        """The `refused` event of this act."""
        text = canonical_json(refusal_detail(reason, self.evidence))
        return EventValues("refused", actor, self.channel, text, self.person)

    def decided(self) -> DigestBound:
        """The detail of the `decided` event of `decide`, but for the digest."""
        decision = self.decision
        if decision.edited_args is None and decision.response is None and self.evidence is None:
            return _plain_detail(decision.approved, decision.reason, self.status)
        return digest_bound(
            decision_detail(decision, digest="", status=self.status, evidence=self.evidence)
        )

    def decided_event(self, digest: str) -> EventValues:
        """The `decided` event of `decide`."""
        text = self.decided().text(digest)
        return EventValues("decided", self.decision.decided_by, self.channel, text, self.person)

    def voted(self) -> DigestBound:
        """The detail of this vote's `voted` event, but for the digest."""
        decision = self.decision
        if decision.edited_args is None and decision.response is None and self.evidence is None:
            return _plain_detail(decision.approved, decision.reason, None)
        return digest_bound(decision_detail(decision, digest="", evidence=self.evidence))

    def voted_event(self, digest: str) -> EventValues:
        """The `voted` event of this vote."""
        actor = self.decision.decided_by or ""
        return EventValues("voted", actor, self.channel, self.voted().text(digest), self.person)

    # A vote on a review that needs one approval decides it as `decide` would: the decision
    # is the vote's (`tally`), its `decided` event `decided_event`'s (`decided_person` names
    # the voter). The backends write it so, without reading the votes (there are none).

    def count(self, earlier: Sequence[str], voters: Sequence[str], row: Row) -> Counted | None:
        """The decision this vote and the `earlier` votes (Decisions as JSON) make on the
        review `row`, or None yet; `voters` are every voter, this one last.

        Raises `InvalidDecisionError` for a vote `check_vote` refuses: inside the
        transaction, which then records nothing."""
        required = row["approvals_required"]
        check_vote(self.decision, required)
        votes = [Decision.model_validate_json(ballot) for ballot in earlier]
        outcome = tally([*votes, self.decision], required)
        if outcome is None:
            return None
        status: ApprovalStatus = "approved" if outcome.approved else "denied"
        fields = decision_detail(
            outcome,
            digest=row["digest"],
            status=status,
            evidence=self.evidence,
            voters=voters if required > 1 else None,
        )
        person = decided_person(outcome, required, self.person)
        event = EventValues(
            "decided", outcome.decided_by, self.channel, canonical_json(fields), person
        )
        return Counted(outcome.model_dump_json(), status, event)


@dataclass(frozen=True)
class VoteResult:
    """What became of a vote."""

    result: Literal["missing", "decided_before", "voted_before", "recorded", "decided"]
    row: Row | None


ClaimStep: TypeAlias = Literal["pending", "mismatch", "take", "in_use"]


def claim_step(active: Row, wanted: ApprovalRequest) -> ClaimStep:
    """What a claim does with the call's active record: leave it (`pending`, or `mismatch`
    when it was made for another tool or other arguments), consume it (`take`), or refuse
    (`in_use`: another call consumed it and has not finished)."""
    if active["tool"] != wanted.tool or active["digest"] != wanted.digest:
        return "mismatch"
    if active["decided_at"] is None:
        return "pending"
    return "take" if active["consumed_at"] is None else "in_use"


@dataclass(frozen=True)
class Claimed:
    """The outcome of a claim, as `core.store.Claim` has it, with the row."""

    outcome: Literal["pending", "mismatch", "taken", "in_use"]
    row: Row
    created: bool = False
    """Whether the claim made the record (`pending`) from the request, just now: the record
    is then the request as given, nothing to read back from `row`, which may hold only the
    record's `approval_id` and `created_at`."""


@dataclass(frozen=True)
class Announcing:
    """Reviews announced in the transaction that writes them (`Backend.insert_run`), as
    `Backend.announce` would announce each of them at `stage`."""

    stage: int
    deliveries: dict[str, list[Row]]
    """Per review's approval id, the deliveries it wants (kind, target, due_at)."""
    at: datetime
    claim: tuple[str, datetime] | None = None
    """A worker, and when its lease ends: the deliveries due by `at` are made claimed."""


@dataclass(frozen=True)
class Change:
    """The outcome of a conditional write."""

    changed: Row | None
    """The row after the change, or None when the condition did not hold."""
    existing: Row | None
    """When nothing changed: the row as it is (None if there is no such approval)."""


class KeyTaken(Exception):
    """A write's idempotency key (an `idempotency_keys` row) is stored already: the
    transaction wrote nothing."""


@dataclass(frozen=True)
class EventRow:
    """One `events` row."""

    seq: int
    approval_id: str
    kind: str
    at: datetime
    actor: str | None
    channel: str | None
    detail: str
    person: str | None


class Backend(Protocol):
    """One database's implementation of the store's atomic operations."""

    async def create(self, row: Row, event_at: datetime, key: Row | None = None) -> Row:
        """Insert `row` unless the call has an active record; return the active record.
        With `key` (an `idempotency_keys` row naming `row`), the key is inserted with the
        row it names, in its transaction (none with an active record found): raises
        `KeyTaken`, inserting neither, when it is there already."""
        ...

    async def refuse(
        self, approval_id: str, at: datetime, event: EventValues, once: Once | None = None
    ) -> bool | Repeat:
        """Append the `refused` event (with `once`, processing its message); False when
        there is no such approval."""
        ...

    async def claim(
        self,
        request: ApprovalRequest,
        new_row: Callable[[], Row],
        event_at: datetime,
        actor: str | None,
    ) -> Claimed:
        """In one transaction: the request's call's active record, else `create(new_row())`;
        when the active record is decided (and `claim_step` says take), consume it as
        `consume` does, or refuse as it does."""
        ...

    async def get(self, approval_id: str) -> Row | None:
        """The row, or None."""
        ...

    async def find(self, run_id: str, call_id: str) -> Row | None:
        """The newest row of the call, or None."""
        ...

    async def list_rows(
        self, run_id: str | None, status: str | None, limit: int | None, newest_first: bool
    ) -> list[Row]:
        """Rows in creation order, or newest first."""
        ...

    async def decide(self, approval_id: str, act: Act, at: datetime) -> Change | Repeat:
        """Record the decision if there is none yet, with its `decided` event
        (`act.decided_event`); else append `act.refused(ALREADY_DECIDED, ...)`. An act by a
        message processed before: a `Repeat` (see the module)."""
        ...

    async def vote(
        self, approval_id: str, act: Act, at: datetime, *, outcome_stage: bool = True
    ) -> VoteResult | Repeat:
        """In one transaction: refuse a vote on a decided approval or a second vote of the
        same voter (`act.voter`; logging `refused`), else record the vote (its Decision as
        JSON) with a `voted` event and, when `act.count` of all the votes is a decision,
        record that (`decided`). Without `outcome_stage`, a sole vote that decides a review
        whose request stage is announced marks its outcome announced too (`announced` 1 ->
        2; see `SqlApprovalStore.outcome_stage`). An act by a message processed before: a
        `Repeat` (see the module)."""
        ...

    async def decide_known(
        self, known: Row, act: Act, at: datetime, *, vote: bool = False, outcome_stage: bool = True
    ) -> datetime | None:
        """`decide` (or, with `vote`, a sole vote that decides: `vote` on a review that needs
        one approval) for a caller that knows the record pending: `known` holds its
        `approval_id`, `run_id`, `call_id` and `digest`, and it is not read back. The time it
        was decided, as stored; None when nothing was decided so (it was decided since, or
        needs more votes, or the backend has no such shortcut): `decide` or `vote` then."""
        ...

    async def consume(self, approval_id: str, at: datetime, actor: str | None) -> Change:
        """Take a decided, unconsumed decision; a denial is finished at once."""
        ...

    async def finish(self, approval_id: str, at: datetime, outcome: str) -> Change:
        """Finish a consumed, unfinished record."""
        ...

    async def take_known(
        self,
        approval_id: str,
        status: str,
        request: ApprovalRequest,
        at: datetime,
        actor: str | None,
    ) -> datetime | None:
        """The part of `claim` that takes the call's active record, for a caller that knows
        it decided (`status`) and made for the request's tool and arguments: the record is
        not read back. The time it was consumed, as stored; None when it was not taken this
        way (it was not so any more, or the backend has no such shortcut): `claim` then."""
        ...

    async def keep_results(self, kept: Sequence[tuple[str, str]], at: datetime) -> None:
        """Append a `kept` event (detail: the result, JSON) to each consumed, unfinished
        review that has none yet; the others are left alone."""
        ...

    async def kept_result(self, approval_id: str) -> str | None:
        """The detail of the review's first `kept` event, if it has one."""
        ...

    async def finish_known(self, approval_id: str, at: datetime, outcome: str) -> datetime | None:
        """`finish` for a caller that knows the record (it took it): the record is not read
        back. The finish time as stored, or None when nothing was finished (`finish` then
        says why)."""
        ...

    async def event_rows(self, approval_id: str | None) -> list[EventRow]:
        """Events in order, of one approval or all."""
        ...

    async def expire_due(self, at: datetime, decisions: dict[str, str], limit: int) -> list[Row]:
        """Decide pending rows whose deadline is at or before `at` with
        `decisions[on_timeout]` (a Decision as JSON), and log their `decided` events."""
        ...

    async def insert_run(
        self,
        row: Row,
        reviews: Sequence[Row] = (),
        announcing: Announcing | None = None,
        key: Row | None = None,
    ) -> Row | None:
        """Insert a run, and the new rows of its pending `reviews` as `create` would (each
        with its `created` event, at its `created_at`, and counted in the run's `pending`),
        in one transaction; None, and nothing written, when a run with its id exists.
        With `announcing`, a backend may announce those reviews in the same transaction: the
        run's row then has the deliveries made under `deliveries` (none: not announced, as
        PostgreSQL, whose insert is one statement, leaves them to `announce`). With `key`
        (an `idempotency_keys` row naming the run; a run without `reviews` only), the key is
        inserted in the same transaction: raises `KeyTaken`, inserting nothing, when it is
        there already."""
        ...

    async def find_key(self, token_name: str, route: str, key: str) -> Row | None:
        """The `idempotency_keys` row of this token, route and key, or None."""
        ...

    async def insert_key(self, row: Row) -> None:
        """Insert an `idempotency_keys` row. Raises `KeyTaken` when it is there already."""
        ...

    async def prune_keys(self, before: datetime) -> None:
        """Delete the idempotency keys created before `before`."""
        ...

    async def get_run(self, run_id: str) -> Row | None:
        """The run, or None."""
        ...

    async def save_run(
        self, run_id: str, version: int, values: Row, spent: Sequence[tuple[str, str]] = ()
    ) -> Change:
        """Set `values` (status, messages, final_text, error, updated_at), bump the version and
        release the claim, if the run is still at `version`; in the same transaction, and
        either way, finish each approval of `spent` (approval id, outcome) as `finish` does.
        The changed row has `pending` (as `get_run`'s) where the backend counts it so
        (SQLite)."""
        ...

    async def renew_claim(
        self, run_id: str, version: int, at: datetime, lease_until: datetime
    ) -> Change:
        """Move the lease to `lease_until` if the run is at `version` and its lease runs
        past `at`."""
        ...

    async def claim_ready(
        self, worker: str, at: datetime, lease_until: datetime, limit: int
    ) -> list[Row]:
        """Claim waiting runs with no pending approval (`pending` = 0) and running runs whose
        lease ran out before `at`, oldest first."""
        ...

    async def counts(self) -> dict[str, int]:
        """How many approvals have each status (statuses with none are left out)."""
        ...

    async def listen(
        self, woken: Callable[[], None], moved: Callable[[str], None] | None = None
    ) -> Listening:
        """Call `woken()` when any process decides an approval, and `moved(run_id)` when
        another process saves a run that stops (where the database can say so); returns the
        function that stops listening."""
        ...

    @property
    def backlogged(self) -> bool:
        """Whether operations wait for a connection to the database now."""
        ...

    async def unannounced(self, limit: int) -> list[Row]:
        """Rows (with `announced`) of reviews with something to announce, oldest first."""
        ...

    async def announce(
        self,
        approval_id: str,
        stage: int,
        deliveries: list[Row],
        at: datetime,
        claim: tuple[str, datetime] | None = None,
    ) -> list[Row]:
        """Insert the deliveries (kind, target, due_at) not made before and raise the
        review's `announced` to `stage`, in one transaction; the inserted rows. With
        `claim` (a worker, and when its lease ends), those due by `at` are inserted claimed."""
        ...

    async def claim_deliveries(
        self,
        worker: str,
        at: datetime,
        lease_until: datetime,
        limit: int,
        lost: tuple[datetime, list[int]] | None = None,
    ) -> list[Row]:
        """Claim due deliveries (unclaimed, or whose lease ran out), soonest due first; with
        `lost` (a time, and ids), also those `worker` holds until that time or before, but
        those ids (the claims it lost track of: see `Outbox.claim_deliveries`)."""
        ...

    async def settle_delivery(
        self,
        delivery_id: int,
        worker: str,
        at: datetime,
        outcome: tuple[str, str | None, datetime | None],
    ) -> Change:
        """Settle a delivery `worker` holds: outcome is ("sent", ref JSON, None) or
        ("failed", error, retry_at or None to give up); a failure (or a None ref) keeps the
        ref the delivery's progress left. Appends `delivered_event` or, when given up,
        `undelivered_event`."""
        ...

    async def delivery_progress(self, delivery_id: int, worker: str, ref: str) -> Change:
        """Replace the ref (JSON) of a delivery `worker` holds, leaving it due and claimed."""
        ...

    async def retry_deliveries_now(self, targets: list[str], at: datetime) -> int:
        """Set `due_at` to `at` on the deliveries to `targets` that are due after `at`
        having failed before (`attempts` > 0) and that nobody holds; how many."""
        ...

    async def delivery_rows(self, approval_id: str) -> list[Row]:
        """The deliveries of one review, in the order they were made."""
        ...

    async def close(self) -> None:
        """Release the connection(s)."""
        ...
