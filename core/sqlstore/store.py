"""`SqlApprovalStore`: the `ApprovalStore` in SQL, for SQLite files and PostgreSQL.

Every operation is one transaction, and every rule is enforced by the database itself, never
by reading then writing: create-if-absent by a unique index on the active record of a call,
first-decision-wins and consume-once by conditional UPDATEs. Several processes may share the
database. Refused attempts are committed to the events table before the error is raised.

The schema is described with SQLAlchemy and created by Alembic migrations; the operations
themselves go straight to the drivers (`sqlite.py`, `postgres.py`), because they are the hot
path of every approval and the async SQLAlchemy adapters cost 10 to 50 times more than the
database work (see docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Awaitable, Callable, Collection, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeAlias, TypeVar, cast
from urllib.parse import urlencode

from pydantic import TypeAdapter
from sqlalchemy.engine import URL

from nodbot.core.audit import EventHasher
from nodbot.core.calls import new_id
from nodbot.core.decisions import Decision
from nodbot.core.errors import (
    ApprovalAlreadyConsumed,
    ApprovalAlreadyDecided,
    ApprovalAlreadyVoted,
    ApprovalError,
    ApprovalNotDecided,
    ApprovalNotFound,
    DeliveryLost,
    RunConflict,
    RunNotFound,
)
from nodbot.core.loop import Message
from nodbot.core.outbox import (
    ORPHANED,
    Announcement,
    Announcer,
    Delivery,
    NewDelivery,
    Opened,
    Stage,
)
from nodbot.core.ports import Spent
from nodbot.core.runs import DEFAULT_LEASE, RunRecord, RunStatus
from nodbot.core.sqlstore.backend import (
    STAGES,
    Act,
    Announcing,
    Backend,
    Change,
    EventValues,
    KeyTaken,
    Repeat,
    Row,
    refusal_once,
)
from nodbot.core.sqlstore.delegations import SqlDelegations
from nodbot.core.sqlstore.drafts import Draft, Drafts
from nodbot.core.sqlstore.engine import (
    normalize_url,
    open_engine,
    redact,
    translate_errors,
)
from nodbot.core.sqlstore.migrate import ensure_schema
from nodbot.core.sqlstore.notices import Listening
from nodbot.core.sqlstore.postgres import PostgresBackend
from nodbot.core.sqlstore.remembered import SqlRememberedApprovals
from nodbot.core.sqlstore.run_states import SqlRunStates
from nodbot.core.sqlstore.sessions import SqlSessionRevocations
from nodbot.core.sqlstore.sqlite import SqliteBackend
from nodbot.core.store import (
    ApprovalEvent,
    ApprovalRecord,
    ApprovalRequest,
    ApprovalStatus,
    Claim,
    EventKind,
    Evidence,
    IdempotencyKey,
    IdempotencyKeyUsed,
    KeptKey,
    KeptResult,
    MessageAlreadyProcessed,
    message_of,
    refusal_detail,
    timeout_decision,
    utc_now,
)
from nodbot.core.tools import canonical_json

__all__ = ["DEFAULT_LOCK_TIMEOUT", "SqlApprovalStore"]

DEFAULT_LOCK_TIMEOUT = 30.0
"""Seconds a SQLite write waits for another process's write lock before it fails."""
TAKEN_KEPT = 4096
"""How many taken, unfinished records a store keeps to finish without reading them back."""
KEYS_KEPT = timedelta(days=1)
"""How long idempotency keys are kept at least: a repeat within it answers what the first
request made. Older ones are deleted by a keyed write, at most every `KEYS_PRUNED_EVERY`."""
KEYS_PRUNED_EVERY = timedelta(minutes=10)
"""How often a store deletes the keys past `KEYS_KEPT` at most (before a keyed write)."""

Clock: TypeAlias = Callable[[], datetime]
_MESSAGES: TypeAdapter[list[Message]] = TypeAdapter(list[Message])
_TIMEOUT_DECISIONS = {
    outcome: timeout_decision(outcome).model_dump_json() for outcome in ("approve", "deny")
}
_Problems: TypeAlias = list[str]
_Records: TypeAlias = list[ApprovalRecord]
_Deliveries: TypeAlias = list[Delivery]
_Announcements: TypeAlias = list[Announcement]
_Events: TypeAlias = list[ApprovalEvent]
_Runs: TypeAlias = list[RunRecord]
K = TypeVar("K")
V = TypeVar("V")
T = TypeVar("T")


class SqlApprovalStore:
    """An `ApprovalStore` in a SQL database.

    `url` is `sqlite:///path.db` (the embedded default), `postgresql://user:pass@host/db`, or
    a bare file path for SQLite. The schema is created or upgraded on first use; with
    `auto_migrate=False` a store refuses a database that is not up to date and names the
    command to run. On SQLite, a write waits up to `lock_timeout` seconds for another
    process's write to finish (without blocking the event loop), then fails with
    `StoreUnavailableError`. Errors name the URL without its password. One store serves one event
    loop; use one store per process (they may share the database).

    Every event is chained to the one before it in its review (`core.audit`): its hash is an
    HMAC-SHA256 with `audit_key` when given, else a plain SHA-256, which anyone who can write
    to the database can recompute. Every process writing to one database must use the same
    key; `nodbot audit verify` checks the chains with it.
    """

    def __init__(
        self,
        url: str | URL,
        *,
        auto_migrate: bool = True,
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
        clock: Clock = utc_now,
        audit_key: str | None = None,
        outcome_stage: bool = True,
    ) -> None:
        self.url = normalize_url(url)
        self.outcome_stage = outcome_stage
        """Whether a decision leaves the review's outcome for the outbox to announce (its
        second stage: a Slack message updated, an email, an `approval.decided` webhook).
        A bot none of whose channels tells outcomes sets it False (`nodbot serve` does):
        the vote that decides a review whose request has gone out then marks the outcome
        announced in its own statement, a write transaction less an approval. A decision
        made otherwise (`decide`, a timeout, the last of several votes) still leaves the
        stage to the outbox, which then makes nothing and marks it, as before."""
        self.auto_migrate = auto_migrate
        self.lock_timeout = lock_timeout
        self._clock = clock
        self._audit_key = audit_key or None
        self._backend: Backend | None = None
        self._opening = asyncio.Lock()
        self._drafts = Drafts()
        self._pending: dict[str, ApprovalRecord] = {}
        """The records this store made pending lately, as made: a pending record changes no
        more until it is decided, so a decision made here records it without reading it back
        (at most `TAKEN_KEPT`); one decided since is decided as if it were not here."""
        self._decided: dict[tuple[str, str], ApprovalRecord] = {}
        """The records this store decided lately, by their call (run id, call id), as
        decided: a decided record changes no more until a claim takes it, so the call's next
        claim takes it without reading it back (at most `TAKEN_KEPT`); a claim that finds it
        changed since claims as if it were not here."""
        self._taken: dict[str, ApprovalRecord] = {}
        """The records this store's claims took lately and no call has finished, as taken: a
        taken record changes no more but for its finish, so `finish` records it without
        reading it back (at most `TAKEN_KEPT`, the oldest forgotten first)."""
        self._opened: dict[str, Opened] = {}
        """Per run whose draft a first save wrote with reviews, those reviews as written,
        until `opened_reviews` asks for them (at most `TAKEN_KEPT` runs)."""
        self._keys_pruned: datetime | None = None
        """When this store last deleted the idempotency keys past `KEYS_KEPT`."""
        self.sessions = SqlSessionRevocations(self.url, ready=self.open, clock=clock)
        """The web inbox's ended sessions, in this database (`core.sqlstore.sessions`)."""
        self.remembered = SqlRememberedApprovals(self.url, ready=self.open, clock=clock)
        """Reviewers' remembered approvals, in this database (`core.sqlstore.remembered`)."""
        self.run_states = SqlRunStates(self.url, ready=self.open, clock=clock)
        """Hosted agents' states between their steps (`core.sqlstore.run_states`)."""
        self.delegations = SqlDelegations(self.url, ready=self.open, clock=clock)
        """Reviewers' reviews handed to others for a while (`core.sqlstore.delegations`)."""

    @property
    def display_url(self) -> str:
        """The URL with any password hidden, for logs and errors."""
        return redact(self.url)

    async def open(self) -> SqlApprovalStore:
        """Check the schema and connect now (otherwise done on first use); returns the store."""
        await self._ready()
        return self

    async def close(self) -> None:
        """Close the connections. The store opens them again if it is used after."""
        await self.sessions.close()
        await self.remembered.close()
        await self.run_states.close()
        await self.delegations.close()
        backend, self._backend = self._backend, None
        if backend is not None:
            with self._errors():
                await backend.close()

    async def __aenter__(self) -> SqlApprovalStore:
        return await self.open()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def create(self, request: ApprovalRequest) -> ApprovalRecord:
        await self._undraft(run_id=request.run_id)
        backend = await self._ready()
        now = self._clock()
        if request.idempotency is not None:
            return await self._create_keyed(backend, request, request.idempotency, now)
        with self._errors():
            return _record(await backend.create(_new_row(request, now), now))

    async def claim(self, request: ApprovalRequest, *, actor: str | None = None) -> Claim:
        backend = await self._ready()
        now = self._clock()
        draft = self._drafts.get(request.run_id) if self._drafts else None
        if draft is not None:  # kept until the run's first save (see drafts.py)
            new = _pending_row(request, now)
            step, row = self._drafts.claim(draft, request, new)
            if row is new:
                return Claim(self._made_here(_made(row, request)), "pending")
            return Claim(_record(row), step)
        decided = self._decided.pop((request.run_id, request.call_id), None)
        if decided is not None and decided.request.digest == request.digest:
            taken = await self._take_known(backend, decided, request, now, actor)
            if taken is not None:
                return Claim(taken, "taken")
        with self._errors():
            claimed = await backend.claim(request, lambda: _new_row(request, now), now, actor)
        if claimed.created:
            return Claim(self._made_here(_made(claimed.row, request)), "pending")
        record = _record(claimed.row)
        if claimed.outcome == "taken" and record.finished_at is None:
            _keep(self._taken, record.approval_id, record)
        if claimed.outcome == "in_use":  # an earlier step's call: with its result kept?
            with self._errors():
                kept = await backend.kept_result(record.approval_id)
            if kept is not None:
                return Claim(record, "ran", json.loads(kept)["result"])
        return Claim(record, claimed.outcome)

    async def keep_results(self, kept: Sequence[tuple[str, KeptResult]]) -> None:
        if not kept:
            return
        backend = await self._ready()
        rows = [(approval_id, canonical_json({"result": result})) for approval_id, result in kept]
        with self._errors():
            await backend.keep_results(rows, self._clock())

    async def _take_known(
        self,
        backend: Backend,
        decided: ApprovalRecord,
        request: ApprovalRequest,
        now: datetime,
        actor: str | None,
    ) -> ApprovalRecord | None:
        """The record `decided`, as this store decided it, taken for `request` without
        reading it back; None when the backend did not take it so (`claim` then)."""
        assert decided.decision is not None
        status = "approved" if decided.decision.approved else "denied"
        if decided.request.tool != request.tool:
            return None
        with self._errors():
            at = await backend.take_known(decided.approval_id, status, request, now, actor)
        if at is None:
            return None
        if status == "denied":  # a denial runs nothing: finished when it is taken
            return _moved(
                decided, decided.decision, consumed_at=at, finished_at=at, outcome="denied"
            )
        taken = _moved(decided, decided.decision, consumed_at=at)
        _keep(self._taken, taken.approval_id, taken)
        return taken

    async def _decide_known(
        self, backend: Backend, approval_id: str, act: Act, now: datetime, *, vote: bool
    ) -> ApprovalRecord | None:
        """The review `approval_id` as this store made it pending, decided by `act` (with
        `vote`: a vote, which decides a review that needs one approval) without reading it
        back; None when it is not known here, or was not decided so (`decide` or `vote`
        then, which say why)."""
        pending = self._pending.pop(approval_id, None)
        if pending is None or (vote and pending.request.approvals_required != 1):
            return None
        if act.once is not None:
            return None  # an act by a message is processed with it (see backend.py)
        request = pending.request
        known = {
            "approval_id": approval_id,
            "run_id": request.run_id,
            "call_id": request.call_id,
            "digest": request.digest,
        }
        with self._errors():
            at = await backend.decide_known(
                known, act, now, vote=vote, outcome_stage=self.outcome_stage
            )
        if at is None:
            return None
        decision = act.decision
        if decision.edited_args is not None:  # the edit as stored, JSON values as JSON gives them
            decision = Decision.model_validate_json(decision.model_dump_json())
        return self._decided_here(_moved(pending, decision, decided_at=at))

    def made_pending(self, approval_id: str) -> ApprovalRecord | None:
        """The review `approval_id` as this store made it pending, while it keeps it (until
        it decides it, or lets it go), without a read; None otherwise. Its request never
        changes; its status may have moved on in another process since, which a decision
        finds out by its write (`decide`, `vote`)."""
        return self._pending.get(approval_id)

    def _made_here(self, record: ApprovalRecord) -> ApprovalRecord:
        """Remember `record`, just made pending by this store, for its decision; return it."""
        if record.decision is None:
            _keep(self._pending, record.approval_id, record)
        return record

    def _decided_here(self, record: ApprovalRecord) -> ApprovalRecord:
        """Remember `record`, just decided by this store, for the call's next claim; return
        it."""
        if record.decision is not None and record.consumed_at is None:
            _keep(self._decided, (record.request.run_id, record.request.call_id), record)
        return record

    async def get(self, approval_id: str) -> ApprovalRecord:
        await self._undraft(approval_id=approval_id)
        backend = await self._ready()
        with self._errors():
            row = await backend.get(approval_id)
        if row is None:
            raise ApprovalNotFound(approval_id=approval_id)
        return _record(row)

    async def find(self, run_id: str, call_id: str) -> ApprovalRecord | None:
        await self._undraft(run_id=run_id)
        backend = await self._ready()
        with self._errors():
            row = await backend.find(run_id, call_id)
        return None if row is None else _record(row)

    async def list(
        self,
        *,
        run_id: str | None = None,
        status: ApprovalStatus | None = None,
        limit: int | None = None,
        newest_first: bool = False,
    ) -> _Records:
        await self._undraft(run_id=run_id)
        backend = await self._ready()
        with self._errors():
            rows = await backend.list_rows(run_id, status, limit, newest_first)
        return [_record(row) for row in rows]

    async def decide(
        self,
        approval_id: str,
        decision: Decision,
        *,
        channel: str | None = None,
        person: str | None = None,
        evidence: Evidence | None = None,
    ) -> ApprovalRecord:
        await self._undraft(approval_id=approval_id)
        backend = await self._ready()
        act = Act(decision, channel, person, evidence)
        now = self._clock()
        decided = await self._decide_known(backend, approval_id, act, now, vote=False)
        if decided is not None:
            return decided
        with self._errors():
            change = await backend.decide(approval_id, act, now)
        if isinstance(change, Repeat):
            raise _repeated(approval_id, change)
        if change.changed is not None:
            return self._decided_here(_record(change.changed))
        if change.existing is None:
            raise ApprovalNotFound(approval_id=approval_id)
        earlier = _record(change.existing).decision
        raise ApprovalAlreadyDecided(
            approval_id=approval_id, decided_by=earlier.decided_by if earlier else None
        )

    async def vote(
        self,
        approval_id: str,
        decision: Decision,
        *,
        channel: str | None = None,
        person: str | None = None,
        evidence: Evidence | None = None,
    ) -> ApprovalRecord:
        await self._undraft(approval_id=approval_id)
        backend = await self._ready()
        act = Act(decision, channel, person, evidence)
        now = self._clock()
        decided = await self._decide_known(backend, approval_id, act, now, vote=True)
        if decided is not None:
            return decided
        with self._errors():
            outcome = await backend.vote(approval_id, act, now, outcome_stage=self.outcome_stage)
        if isinstance(outcome, Repeat):
            raise _repeated(approval_id, outcome)
        if outcome.row is None:
            raise ApprovalNotFound(approval_id=approval_id)
        record = _record(outcome.row)
        if outcome.result == "decided_before":
            first = record.decision.decided_by if record.decision else None
            raise ApprovalAlreadyDecided(approval_id=approval_id, decided_by=first)
        if outcome.result == "voted_before":
            raise ApprovalAlreadyVoted(approval_id=approval_id, voter=act.voter)
        return self._decided_here(record) if outcome.result == "decided" else record

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
        message_id = message_of(evidence)
        if record_message and message_id is None:
            raise ValueError("record_message needs evidence with a message id")
        await self._undraft(approval_id=approval_id)
        backend = await self._ready()
        detail = canonical_json(refusal_detail(reason, evidence))
        event = EventValues("refused", actor, channel, detail, person)
        once = refusal_once(message_id, event, evidence) if record_message and message_id else None
        with self._errors():
            found = await backend.refuse(approval_id, self._clock(), event, once)
        if isinstance(found, Repeat):
            raise _repeated(approval_id, found)
        if not found:
            raise ApprovalNotFound(approval_id=approval_id)

    async def consume(self, approval_id: str, *, actor: str | None = None) -> ApprovalRecord:
        await self._undraft(approval_id=approval_id)
        backend = await self._ready()
        with self._errors():
            change = await backend.consume(approval_id, self._clock(), actor)
        if change.changed is not None:
            return _record(change.changed)
        if change.existing is None:
            raise ApprovalNotFound(approval_id=approval_id)
        if change.existing["decided_at"] is None:
            raise ApprovalNotDecided(approval_id=approval_id)
        raise ApprovalAlreadyConsumed(approval_id=approval_id)

    async def finish(self, approval_id: str, *, outcome: str) -> ApprovalRecord:
        await self._undraft(approval_id=approval_id)
        backend = await self._ready()
        now = self._clock()
        taken = self._taken.pop(approval_id, None)
        if taken is not None:  # as this store took it: only its finish can have changed
            with self._errors():
                finished_at = await backend.finish_known(approval_id, now, outcome)
            if finished_at is not None:
                return _moved(taken, taken.decision, finished_at=finished_at, outcome=outcome)
        with self._errors():
            change = await backend.finish(approval_id, now, outcome)
        if change.changed is not None:
            return _record(change.changed)
        if change.existing is None:
            raise ApprovalNotFound(approval_id=approval_id)
        if change.existing["finished_at"] is not None:
            return _record(change.existing)  # finishing twice changes nothing
        raise ApprovalError(
            f"approval {approval_id} cannot finish: no call has consumed it",
            approval_id=approval_id,
        )

    async def events(self, approval_id: str | None = None) -> _Events:
        await self._undraft(approval_id=approval_id)
        backend = await self._ready()
        with self._errors():
            rows = await backend.event_rows(approval_id)
        return [
            ApprovalEvent(
                seq=row.seq,
                approval_id=row.approval_id,
                kind=cast(EventKind, row.kind),
                at=row.at,
                actor=row.actor,
                channel=row.channel,
                detail=json.loads(row.detail),
                person=row.person,
            )
            for row in rows
        ]

    async def expire_due(self, *, limit: int = 100) -> _Records:
        backend = await self._ready()
        with self._errors():
            rows = await backend.expire_due(self._clock(), _TIMEOUT_DECISIONS, limit)
        return [_record(row) for row in rows]

    async def create_run(
        self,
        *,
        agent: str,
        messages: Sequence[Message],
        worker: str,
        requested_by: str | None = None,
        run_id: str | None = None,
        lease: float = DEFAULT_LEASE,
        started_by: str | None = None,
        idempotency: IdempotencyKey | None = None,
    ) -> RunRecord:
        row = self._new_run(agent, messages, worker, requested_by, run_id, lease, started_by)
        await self._undraft(run_id=row["run_id"])
        backend = await self._ready()
        with self._errors():
            if idempotency is None:
                created = await backend.insert_run(row)
            else:
                keyed = _key_row(idempotency, row["run_id"], row["created_at"])
                created = await self._keyed(idempotency, lambda: backend.insert_run(row, key=keyed))
            if created is None:
                existing = await backend.get_run(row["run_id"])
        if created is None:
            found = existing["version"] if existing else 0
            raise RunConflict(
                run_id=row["run_id"], expected=0, found=found, reason="a run with this id exists"
            )
        return _run(created, list(messages))

    async def draft_run(
        self,
        *,
        agent: str,
        messages: Sequence[Message],
        worker: str,
        requested_by: str | None = None,
        lease: float = DEFAULT_LEASE,
        started_by: str | None = None,
        announcer: Announcer | None = None,
        idempotency: IdempotencyKey | None = None,
    ) -> RunRecord:
        """A new run, as `create_run` makes it, kept in this process until its first
        `save_run`: that writes it, the reviews its first step opened and the save in one
        transaction. Until then no other process sees it, nor its reviews; an operation of
        this one that names the run or one of those reviews writes the draft first
        (`core.sqlstore.drafts`). Its id is new, so nobody else can know it meanwhile.

        With `announcer`, the first save announces those reviews too, in its transaction,
        where the backend can (SQLite; `opened_reviews` says whether it did).

        With `idempotency`, no draft: the run is written at once with its key, as
        `create_run` writes it, so that a repeat of its request (another process's too)
        finds it while its first step goes on, and no second run starts."""
        if idempotency is not None:
            return await self.create_run(
                agent=agent,
                messages=messages,
                worker=worker,
                requested_by=requested_by,
                lease=lease,
                started_by=started_by,
                idempotency=idempotency,
            )
        await self._ready()  # the schema is checked now, as create_run would
        row = self._new_run(agent, messages, worker, requested_by, None, lease, started_by)
        self._drafts.add(row, announcer)
        return RunRecord(
            run_id=row["run_id"],
            agent=agent,
            status="running",
            messages=list(messages),
            version=1,
            created_at=row["created_at"],
            updated_at=row["updated_at"],
            requested_by=requested_by,
            claimed_by=worker,
            lease_until=row["lease_until"],
            started_by=started_by,
        )

    def forget_draft(self, run_id: str) -> None:
        """Drop the draft of a run that will not be saved (its start was cancelled): it was
        never written, nor were its reviews."""
        self._drafts.forget(run_id)

    async def find_key(self, key: IdempotencyKey) -> KeptKey | None:
        backend = await self._ready()
        with self._errors():
            row = await backend.find_key(key.token_name, key.route, key.key)
        if row is None:
            return None
        return KeptKey(row["body_digest"], row["target_id"], row["created_at"])

    async def keep_key(self, key: IdempotencyKey, target_id: str) -> None:
        backend = await self._ready()
        keyed = _key_row(key, target_id, self._clock())
        await self._keyed(key, lambda: backend.insert_key(keyed))

    async def _create_keyed(
        self, backend: Backend, request: ApprovalRequest, key: IdempotencyKey, now: datetime
    ) -> ApprovalRecord:
        """`create` of a request with its idempotency key: written with the record it makes,
        in its transaction, or (the call had an active record, for the same tool and
        arguments) on its own, naming that; a record of another call is named by no key."""
        new = _new_row(request, now)
        keyed = _key_row(key, new["approval_id"], now)
        row = await self._keyed(key, lambda: backend.create(new, now, keyed))
        same = row["tool"] == request.tool and row["digest"] == request.digest
        if row["approval_id"] != new["approval_id"] and same:
            await self.keep_key(key, row["approval_id"])
        return _record(row)

    async def _keyed(self, key: IdempotencyKey, write: Callable[[], Awaitable[T]]) -> T:
        """`write()`, which writes `key` with what it names. Raises `IdempotencyKeyUsed` when
        the key is stored already. The keys past `KEYS_KEPT` are deleted first, at most
        every `KEYS_PRUNED_EVERY` (one indexed statement)."""
        backend = await self._ready()
        now = self._clock()
        if self._keys_pruned is None or now - self._keys_pruned >= KEYS_PRUNED_EVERY:
            with self._errors():
                await backend.prune_keys(now - KEYS_KEPT)
            self._keys_pruned = now
        try:
            with self._errors():
                return await write()
        except KeyTaken:
            raise IdempotencyKeyUsed(key=key, kept=await self.find_key(key)) from None

    def _new_run(
        self,
        agent: str,
        messages: Sequence[Message],
        worker: str,
        requested_by: str | None,
        run_id: str | None,
        lease: float,
        started_by: str | None,
    ) -> Row:
        now = self._clock()
        return {
            "run_id": run_id or new_id("run_"),
            "agent": agent,
            "status": "running",
            "messages": _MESSAGES.dump_json(list(messages)).decode(),
            "version": 1,
            "created_at": now,
            "updated_at": now,
            "requested_by": requested_by,
            "claimed_by": worker,
            "lease_until": now + timedelta(seconds=lease),
            "started_by": started_by,
        }

    async def _undraft(self, *, run_id: str | None = None, approval_id: str | None = None) -> None:
        """Write the draft an operation names, by its run or one of its reviews (if any)."""
        if not self._drafts:
            return
        if run_id is None and approval_id is not None:
            run_id = self._drafts.run_of(approval_id)
        if run_id is not None:
            await self._drafts.write(run_id, self._write_draft)

    async def _write_draft(
        self, draft: Draft, row: Row | None = None, announcing: Announcing | None = None
    ) -> Row:
        """Write a draft: its run as `row` has it (as drafted, by default) and its reviews,
        announced so with `announcing`."""
        backend = await self._ready()
        with self._errors():
            written = await backend.insert_run(row or draft.run, draft.reviews, announcing)
            if written is None:
                # Its id is this draft's own (new, random): an earlier attempt of this write
                # committed and its answer was lost. It stands, as read back.
                written = await backend.get_run(draft.run["run_id"])
        if written is None:  # cannot be: it was there a statement ago, and runs stay
            run_id = draft.run["run_id"]
            raise RunConflict(run_id=run_id, expected=0, found=0, reason="the run went away")
        return written

    async def get_run(self, run_id: str) -> RunRecord:
        await self._undraft(run_id=run_id)
        backend = await self._ready()
        with self._errors():
            row = await backend.get_run(run_id)
        if row is None:
            raise RunNotFound(run_id=run_id)
        return _run(row)

    async def save_run(
        self,
        run: RunRecord,
        *,
        status: RunStatus,
        messages: Sequence[Message],
        final_text: str | None = None,
        error: str | None = None,
        spent: Sequence[Spent] = (),
    ) -> RunRecord:
        backend = await self._ready()
        values = {
            "status": status,
            "messages": _MESSAGES.dump_json(list(messages)).decode(),
            "final_text": final_text,
            "error": error,
            "updated_at": self._clock(),
        }
        draft = self._drafts.get(run.run_id) if self._drafts and not spent else None
        if draft is not None:  # its first save: the run and its reviews, written at once
            if draft.run["version"] != run.version:
                raise RunConflict(run_id=run.run_id, expected=run.version, found=1)
            saved = {
                **draft.run,
                **values,
                "version": run.version + 1,
                "claimed_by": None,
                "lease_until": None,
            }
            written = await self._drafts.write(run.run_id, lambda d: self._write_first(d, saved))
            if written is not None:
                return _run(written, list(messages))
        await self._undraft(run_id=run.run_id)  # written meanwhile, or saved with spent ones
        finished = [(each.approval_id, each.outcome) for each in spent]
        with self._errors():
            change = await backend.save_run(run.run_id, run.version, values, finished)
        return _run(_changed_run(change, run), list(messages))

    async def _write_first(self, draft: Draft, row: Row) -> Row:
        """Write a draft by its first save (`row`, the run as saved), its reviews announced
        with it when it has an announcer, and keep those reviews for `opened_reviews`."""
        records = [self._pending.get(review["approval_id"]) for review in draft.reviews]
        known = cast(_Records, records) if records and all(records) else None
        announcing = None if known is None else self._announcing(draft.announcer, known)
        written = await self._write_draft(draft, row, announcing)
        if known is not None:
            made = written.pop("deliveries", None)
            deliveries = None if made is None else [_delivery(each) for each in made]
            _keep(self._opened, row["run_id"], Opened(known, deliveries))
        return written

    def _announcing(self, announcer: Announcer | None, records: _Records) -> Announcing | None:
        """How `announcer` announces the new reviews `records`, or None: no announcer, or
        one that could not say (a channel's bug: the outbox's lane announces them then, and
        says what failed)."""
        if announcer is None:
            return None
        try:
            wanted = {
                record.approval_id: [
                    {"kind": d.kind, "target": d.target, "due_at": d.due_at}
                    for d in announcer.opening(record)
                ]
                for record in records
            }
        except Exception:
            return None
        now = self._clock()
        claim = (announcer.worker, now + timedelta(seconds=announcer.lease))
        return Announcing(STAGES["request"], wanted, now, claim)

    def opened_reviews(self, run_id: str) -> Opened | None:
        """The reviews the first save of the draft of `run_id` (`draft_run`) wrote with it,
        as written, all pending then, in the order they were opened, and the deliveries it
        announced them with; asked once (the answer is let go of). None when this store
        wrote no such draft with reviews, or has let it go: `list` then. A caller that shows
        the run as its first save left it needs no read of what that save wrote
        (`BotService.begin_run`)."""
        return self._opened.pop(run_id, None)

    async def renew_claim(self, run: RunRecord, *, lease: float = DEFAULT_LEASE) -> RunRecord:
        await self._undraft(run_id=run.run_id)
        backend = await self._ready()
        now = self._clock()
        with self._errors():
            change = await backend.renew_claim(
                run.run_id, run.version, now, now + timedelta(seconds=lease)
            )
        return _run(_changed_run(change, run), run.messages)  # a renewal leaves them be

    async def claim_ready(
        self, *, worker: str, lease: float = DEFAULT_LEASE, limit: int = 10
    ) -> _Runs:
        backend = await self._ready()
        now = self._clock()
        with self._errors():
            rows = await backend.claim_ready(worker, now, now + timedelta(seconds=lease), limit)
        return [_run(row) for row in rows]

    # --- the outbox (see core.outbox) ---------------------------------------------------

    async def unannounced(self, *, limit: int = 100) -> _Announcements:
        backend = await self._ready()
        with self._errors():
            rows = await backend.unannounced(limit)
        return [
            Announcement(_record(row), "request" if row["announced"] == 0 else "outcome")
            for row in rows
        ]

    async def announce(
        self,
        approval_id: str,
        stage: Stage | None,
        deliveries: Sequence[NewDelivery],
        *,
        worker: str | None = None,
        lease: float = 60.0,
    ) -> _Deliveries:
        await self._undraft(approval_id=approval_id)
        backend = await self._ready()
        wanted = [{"kind": d.kind, "target": d.target, "due_at": d.due_at} for d in deliveries]
        now = self._clock()
        claim = None if worker is None else (worker, now + timedelta(seconds=lease))
        with self._errors():
            level = 0 if stage is None else STAGES[stage]  # 0: no stage is raised
            made = await backend.announce(approval_id, level, wanted, now, claim)
        return [_delivery(row) for row in made]

    async def claim_deliveries(
        self,
        *,
        worker: str,
        lease: float = 60.0,
        limit: int = 50,
        sending: Collection[int] | None = None,
    ) -> _Deliveries:
        backend = await self._ready()
        now = self._clock()
        lost = None
        if sending is not None:  # claimed ORPHANED seconds ago or more, with this lease
            lost = (now + timedelta(seconds=lease - ORPHANED), sorted(sending))
        with self._errors():
            rows = await backend.claim_deliveries(
                worker, now, now + timedelta(seconds=lease), limit, lost
            )
        return [_delivery(row) for row in rows]

    async def delivered(
        self, delivery_id: int, *, worker: str, ref: dict[str, Any] | None = None
    ) -> Delivery:
        text = None if ref is None else canonical_json(ref)
        return await self._settle(delivery_id, worker, ("sent", text, None))

    async def delivery_failed(
        self, delivery_id: int, *, worker: str, error: str, retry_at: datetime | None
    ) -> Delivery:
        return await self._settle(delivery_id, worker, ("failed", error, retry_at))

    async def delivery_progress(
        self, delivery_id: int, *, worker: str, ref: dict[str, Any]
    ) -> Delivery:
        backend = await self._ready()
        with self._errors():
            change = await backend.delivery_progress(delivery_id, worker, canonical_json(ref))
        if change.changed is None:
            raise _lost(delivery_id, worker, change.existing)
        return _delivery(change.changed)

    async def retry_deliveries_now(self, targets: Collection[str]) -> int:
        wanted = sorted(set(targets))
        if not wanted:
            return 0
        backend = await self._ready()
        with self._errors():
            return await backend.retry_deliveries_now(wanted, self._clock())

    async def deliveries(self, approval_id: str) -> _Deliveries:
        await self._undraft(approval_id=approval_id)
        backend = await self._ready()
        with self._errors():
            rows = await backend.delivery_rows(approval_id)
        return [_delivery(row) for row in rows]

    async def _settle(
        self, delivery_id: int, worker: str, outcome: tuple[str, str | None, datetime | None]
    ) -> Delivery:
        backend = await self._ready()
        with self._errors():
            change = await backend.settle_delivery(delivery_id, worker, self._clock(), outcome)
        if change.changed is not None:
            return _delivery(change.changed)
        raise _lost(delivery_id, worker, change.existing)

    async def counts(self) -> dict[ApprovalStatus, int]:
        backend = await self._ready()
        with self._errors():
            found = await backend.counts()
        return {
            status: found.get(status, 0)
            for status in cast(tuple[ApprovalStatus, ...], ("pending", "approved", "denied"))
        }

    @property
    def backlogged(self) -> bool:
        """Whether the store's operations wait for a database connection now (PostgreSQL:
        every connection of its pool is in use); never on SQLite, whose one connection is
        used without waiting, nor before the store is open. The bot starts new runs only
        while it is not (see `BotService`)."""
        return self._backend is not None and self._backend.backlogged

    def problems(self) -> _Problems:
        """What keeps the store from working well though it answers, in words (`/healthz`
        says it): the WAL checkpoints of a SQLite file failing."""
        checkpointer = getattr(self._backend, "checkpointer", None)
        failing = getattr(checkpointer, "failing", None)
        return [] if failing is None else [f"the SQLite log cannot be checkpointed: {failing}"]

    async def listen(
        self, woken: Callable[[], None], moved: Callable[[str], None] | None = None
    ) -> Listening:
        """Call `woken()` whenever any process decides an approval in this database
        (PostgreSQL: this store's decisions in this process, other stores' by LISTEN/NOTIFY;
        on SQLite only polling finds other processes' decisions), and `moved(run_id)`
        whenever another process saves a run that stops there: it waits, finished or failed
        (PostgreSQL only). Returns what stops listening: a lost connection is made again,
        and `woken()` called once it is, so nothing decided meanwhile is missed."""
        backend = await self._ready()
        with self._errors():
            return await backend.listen(woken, moved)

    async def _ready(self) -> Backend:
        if self._backend is not None:
            return self._backend
        async with self._opening:
            if self._backend is None:
                self._backend = await self._connect()
        return self._backend

    async def _connect(self) -> Backend:
        engine = open_engine(self.url)
        try:
            await ensure_schema(
                engine, self.url, auto_migrate=self.auto_migrate, audit_key=self._audit_key
            )
        finally:
            await engine.dispose()
        with self._errors():
            if self.url.get_backend_name() == "sqlite":
                target, uri = _sqlite_target(self.url)
                hasher = EventHasher(self._audit_key)
                return SqliteBackend(target, uri=uri, busy_timeout=self.lock_timeout, hasher=hasher)
            dsn = self.url.set(drivername="postgresql").render_as_string(hide_password=False)
            return await PostgresBackend.connect(dsn, audit_key=self._audit_key)

    def _errors(self) -> translate_errors:
        return translate_errors(self.url)


def _repeated(approval_id: str, repeat: Repeat) -> MessageAlreadyProcessed:
    return MessageAlreadyProcessed(
        approval_id=approval_id, message_id=repeat.message_id, first=repeat.first
    )


def _moved(
    record: ApprovalRecord,
    decision: Decision | None,
    *,
    decided_at: datetime | None = None,
    consumed_at: datetime | None = None,
    finished_at: datetime | None = None,
    outcome: str | None = None,
) -> ApprovalRecord:
    """`record` moved on a step: `decision`, and each time given in place of the record's
    (what `dataclasses.replace` does, made directly: it is on every step of a cycle)."""
    return ApprovalRecord(
        record.approval_id,
        record.request,
        record.created_at,
        decision,
        decided_at or record.decided_at,
        consumed_at or record.consumed_at,
        finished_at or record.finished_at,
        outcome or record.outcome,
    )


def _keep(kept: dict[K, V], key: K, record: V) -> None:
    """Keep `record` in `kept` under `key`, and at most `TAKEN_KEPT` records (the oldest are
    forgotten first)."""
    kept[key] = record
    while len(kept) > TAKEN_KEPT:
        del kept[next(iter(kept))]


def _key_row(key: IdempotencyKey, target_id: str, at: datetime) -> Row:
    """The `idempotency_keys` row of `key`, naming `target_id` (a run or an approval)."""
    return {
        "token_name": key.token_name,
        "route": key.route,
        "key": key.key,
        "body_digest": key.body_digest,
        "target_id": target_id,
        "created_at": at,
    }


def _sqlite_target(url: URL) -> tuple[str, bool]:
    """What sqlite3.connect() takes for this URL: a path, or a `file:` URI with its query."""
    database = url.database or ""
    query = {key: value for key, value in url.query.items() if key != "uri"}
    if url.query.get("uri") in ("true", "1") or database.startswith("file:"):
        return (f"{database}?{urlencode(query, doseq=True)}" if query else database), True
    return database, False


def _changed_run(change: Change, run: RunRecord) -> Row:
    """The changed row, or the error saying why the run did not change."""
    if change.changed is not None:
        return change.changed
    if change.existing is None:
        raise RunNotFound(run_id=run.run_id)
    found = change.existing["version"]
    reason = None
    if found == run.version:  # same version, so only the lease stood in the way
        reason = f"the claim of {change.existing['claimed_by']} has expired"
    raise RunConflict(run_id=run.run_id, expected=run.version, found=found, reason=reason)


def _run(row: Row, messages: list[Message] | None = None) -> RunRecord:
    """The run of `row`; with `messages`, the conversation the caller just wrote into it, not
    parsed again from its JSON (a save's, or one it left alone)."""
    return RunRecord(
        run_id=row["run_id"],
        agent=row["agent"],
        status=row["status"],
        messages=_MESSAGES.validate_json(row["messages"]) if messages is None else messages,
        version=row["version"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        requested_by=row["requested_by"],
        final_text=row["final_text"],
        error=row["error"],
        claimed_by=row["claimed_by"],
        lease_until=row["lease_until"],
        started_by=row["started_by"],
        pending=row.get("pending"),
    )


def _lost(delivery_id: int, worker: str, existing: Row | None) -> DeliveryLost:
    """Why `worker` may not settle (or record the progress of) a delivery any more."""
    if existing is None:
        reason = "there is no such delivery"
    elif existing["status"] != "due":
        reason = f"it is {existing['status']} already"
    else:
        reason = f"it is held by {existing['claimed_by'] or 'nobody'}, not {worker}"
    return DeliveryLost(delivery_id=delivery_id, reason=reason)


def _delivery(row: Row) -> Delivery:
    return Delivery(
        delivery_id=row["seq"],
        approval_id=row["approval_id"],
        kind=row["kind"],
        target=row["target"],
        status=row["status"],
        attempts=row["attempts"],
        due_at=row["due_at"],
        created_at=row["created_at"],
        sent_at=row["sent_at"],
        ref=None if row["ref"] is None else json.loads(row["ref"]),
        error=row["error"],
        claimed_by=row["claimed_by"],
        lease_until=row["lease_until"],
    )


def _new_row(request: ApprovalRequest, now: datetime) -> Row:
    """The row of a new pending record for `request`."""
    return {
        "approval_id": new_id("apr_"),
        "run_id": request.run_id,
        "call_id": request.call_id,
        "tool": request.tool,
        "arguments": canonical_json(request.arguments),
        "digest": request.digest,
        "requested_by": request.requested_by,
        "status": "pending",
        "created_at": now,
        "deadline": request.deadline,
        "on_timeout": request.on_timeout,
        "policy": canonical_json(request.policy),
        "approvals_required": request.approvals_required,
    }


def _pending_row(request: ApprovalRequest, now: datetime) -> Row:
    """The whole row of a new pending record, as the database would return it."""
    return {
        **_new_row(request, now),
        "decision": None,
        "decided_at": None,
        "consumed_at": None,
        "finished_at": None,
        "outcome": None,
    }


def _made(row: Row, request: ApprovalRequest) -> ApprovalRecord:
    """The record of the review `row` just made from `request`, as `_record` would parse it
    back from the row: the request's arguments and policy as their stored JSON gives them
    (keys in order, sequences as lists), so that a record answered without a read shows
    them as every read does."""
    stored = dataclasses.replace(
        request, arguments=_as_stored(request.arguments), policy=_as_stored(request.policy)
    )
    return ApprovalRecord(row["approval_id"], stored, row["created_at"])


_PLAIN = frozenset({str, int, float, bool, type(None)})


def _as_stored(value: Any) -> Any:
    """`value` as its stored JSON (`canonical_json`) parses back: objects with their keys in
    order, arrays as lists. Made directly for plain JSON values (a few microseconds for a
    call's arguments and its policy), through JSON for anything else."""
    kind = type(value)
    if kind in _PLAIN:
        return value
    if kind is dict and all(type(key) is str for key in value):
        return {key: _as_stored(value[key]) for key in sorted(value)}
    if kind is list or kind is tuple:
        return [_as_stored(item) for item in value]
    return json.loads(canonical_json(value))


def _record(row: Row) -> ApprovalRecord:
    return ApprovalRecord(
        approval_id=row["approval_id"],
        request=ApprovalRequest(
            run_id=row["run_id"],
            call_id=row["call_id"],
            tool=row["tool"],
            arguments=json.loads(row["arguments"]),
            digest=row["digest"],
            requested_by=row["requested_by"],
            deadline=row["deadline"],
            on_timeout=row["on_timeout"],
            policy={} if row["policy"] == "{}" else json.loads(row["policy"]),
            approvals_required=row["approvals_required"],
        ),
        created_at=row["created_at"],
        decision=None if row["decision"] is None else Decision.model_validate_json(row["decision"]),
        decided_at=row["decided_at"],
        consumed_at=row["consumed_at"],
        finished_at=row["finished_at"],
        outcome=row["outcome"],
    )
