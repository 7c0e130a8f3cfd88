"""Durable runs: an agent's conversation kept in a store, so that a run paused for review is
continued by whichever process claims it next, with the same run id and call ids.

```
create_run ─► running ──(calls wait for review)──► waiting
                 ▲                                    │ every approval of the run decided
                 └───────────── claim_ready ◄─────────┘
running ──(the model answers)──► finished        running ──(an error)──► failed
```

A worker calls `claim_ready`, then `advance_run` on each run it got. A claim is a lease: a
run whose worker died is claimed again once the lease has run out. Saves are
compare-and-set on the run's version, so a worker whose lease ran out cannot overwrite the
work of the one that took over (`RunConflict`).

Calls that need review run at most once whatever happens (their decision is spent once).
Calls that need none are repeated if a worker dies after running them and before saving:
keep leases longer than a run's longest step.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Literal, Protocol, TypeAlias, runtime_checkable

from nodbot.core.calls import new_id
from nodbot.core.errors import RunConflict, RunNotFound, StoreError, StoreUnavailableError
from nodbot.core.executor import Executor
from nodbot.core.loop import Agent, Message, run_tool_loop
from nodbot.core.outbox import Announcer, Opened
from nodbot.core.ports import DeferredApproval, Spent
from nodbot.core.retrying import until_written
from nodbot.core.store import (
    IdempotencyKey,
    IdempotencyKeyUsed,
    KeptKey,
    MemoryApprovalStore,
    utc_now,
)

__all__ = [
    "DEFAULT_LEASE",
    "MemoryRunStore",
    "RunRecord",
    "RunStatus",
    "RunStore",
    "advance_run",
]

RunStatus: TypeAlias = Literal["running", "waiting", "finished", "failed"]
Clock: TypeAlias = Callable[[], datetime]

DEFAULT_LEASE = 300.0
"""Seconds a worker holds a claimed run before another may take it over."""
KEEP_TRYING = 3600.0
"""Seconds a worker goes on trying to write what its step's tools did (the results kept,
then the save) through an outage of the store, past its claim: while the process lives."""


@dataclass(frozen=True)
class RunRecord:
    """A stored run."""

    run_id: str
    agent: str
    """The name of the agent (as configured) that runs it."""
    status: RunStatus
    messages: list[Message]
    """The whole conversation: the run's state."""
    version: int
    """Bumped by every save; a save names the version it read."""
    created_at: datetime
    updated_at: datetime
    requested_by: str | None = None
    final_text: str | None = None
    error: str | None = None
    claimed_by: str | None = None
    """The worker that holds the run, while `status` is running."""
    lease_until: datetime | None = None
    started_by: str | None = None
    """Who started the run for `requested_by`, when someone else did (a token with
    `runs:write-as`): they may not approve its calls either."""
    pending: int | None = field(default=None, compare=False)
    """How many reviews of its calls were pending when the store read the run (`get_run` of a
    SQL store); None when not read with it. Not compared: it is a reading, not the run."""


_Runs: TypeAlias = list[RunRecord]


@runtime_checkable
class RunStore(Protocol):
    """Where durable runs live, beside the approvals of their calls."""

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
        """A new run, running and claimed by `worker` (who starts it), requested by
        `requested_by`, and `started_by` another (a front end starting runs for its users).
        With `idempotency`, the key is stored with the run, in its transaction: raises
        `IdempotencyKeyUsed`, and writes nothing, when the key is stored already."""
        ...

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
        """A new run with a new id, as `create_run` makes it, that the store may keep to
        itself until its first `save_run`, and write then in one transaction with the
        reviews its first step opened (`SqlApprovalStore`; the memory store writes it at
        once), announced by `announcer` where the store can. A draft that will not be saved
        is dropped with `forget_draft`. A run with `idempotency` is written at once, with
        its key, as `create_run` writes it: a repeat finds it before its first step ends."""
        ...

    async def find_key(self, key: IdempotencyKey) -> KeptKey | None:
        """What `key` (its token, route and key; not its digest) names, if it is stored."""
        ...

    async def keep_key(self, key: IdempotencyKey, target_id: str) -> None:
        """Store `key` as naming `target_id` (a run or an approval written already). Raises
        `IdempotencyKeyUsed` when it is stored already."""
        ...

    def forget_draft(self, run_id: str) -> None:
        """Drop the draft of `run_id`, if the store kept one unwritten."""
        ...

    def opened_reviews(self, run_id: str) -> Opened | None:
        """The reviews the first save of the draft of `run_id` wrote, as written (all
        pending then), and the deliveries it announced them with, if it did; asked once.
        None when the store does not know them so (the memory store, which writes a draft
        at once): list the run's reviews then."""
        ...

    async def get_run(self, run_id: str) -> RunRecord:
        """The run. Raises `RunNotFound`."""
        ...

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
        """Store the run's progress and release its claim, if it is still at `run.version`;
        record the approvals its step `spent` as finished in the same transaction, whether
        or not the run could be saved (their calls have run).

        Raises `RunNotFound`, `RunConflict`.
        """
        ...

    async def claim_ready(
        self, *, worker: str, lease: float = DEFAULT_LEASE, limit: int = 10
    ) -> _Runs:
        """Claim up to `limit` runs `worker` may continue now, oldest first: waiting runs
        none of whose approvals is pending, and running runs whose lease has run out."""
        ...

    async def renew_claim(self, run: RunRecord, *, lease: float = DEFAULT_LEASE) -> RunRecord:
        """Extend the claim `run` holds, if nobody took the run over since.

        Raises `RunNotFound`, `RunConflict`.
        """
        ...


class MemoryRunStore:
    """A `RunStore` in memory, beside a `MemoryApprovalStore` that holds the approvals."""

    def __init__(self, approvals: MemoryApprovalStore, *, clock: Clock = utc_now) -> None:
        self.approvals = approvals
        self._clock = clock
        self._lock = threading.Lock()
        self._runs: dict[str, RunRecord] = {}
        self._keys: dict[tuple[str, str, str], KeptKey] = {}
        """The idempotency keys of runs (and of approvals, by `keep_key`), by token, route
        and key."""

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
        now = self._clock()
        run = RunRecord(
            run_id=run_id or new_id("run_"),
            agent=agent,
            status="running",
            messages=list(messages),
            version=1,
            created_at=now,
            updated_at=now,
            requested_by=requested_by,
            claimed_by=worker,
            lease_until=now + timedelta(seconds=lease),
            started_by=started_by,
        )
        with self._lock:
            if run.run_id in self._runs:
                raise RunConflict(
                    run_id=run.run_id, expected=0, found=self._runs[run.run_id].version
                )
            if idempotency is not None:
                self._keep_key(idempotency, run.run_id, now)
            self._runs[run.run_id] = run
        return run

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
        return await self.create_run(
            agent=agent,
            messages=messages,
            worker=worker,
            requested_by=requested_by,
            lease=lease,
            started_by=started_by,
            idempotency=idempotency,
        )

    async def find_key(self, key: IdempotencyKey) -> KeptKey | None:
        with self._lock:
            return self._keys.get((key.token_name, key.route, key.key))

    async def keep_key(self, key: IdempotencyKey, target_id: str) -> None:
        with self._lock:
            self._keep_key(key, target_id, self._clock())

    def _keep_key(self, key: IdempotencyKey, target_id: str, at: datetime) -> None:
        """Store `key` (the lock held). Kept as long as the store: it lives in memory."""
        stored = (key.token_name, key.route, key.key)
        kept = self._keys.get(stored)
        if kept is not None:
            raise IdempotencyKeyUsed(key=key, kept=kept)
        self._keys[stored] = KeptKey(key.body_digest, target_id, at)

    def forget_draft(self, run_id: str) -> None:
        return None  # written at once: nothing to drop

    def opened_reviews(self, run_id: str) -> Opened | None:
        return None  # written at once, by claims: the approvals store lists them

    async def get_run(self, run_id: str) -> RunRecord:
        with self._lock:
            return self._get(run_id)

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
        with self._lock:
            stored = self._get(run.run_id)
            if stored.version != run.version:
                raise RunConflict(run_id=run.run_id, expected=run.version, found=stored.version)
        for each in spent:  # only with a save that holds (as the SQL stores, in its transaction)
            await self.approvals.finish(each.approval_id, outcome=each.outcome)
        with self._lock:
            stored = self._get(run.run_id)
            if stored.version != run.version:
                raise RunConflict(run_id=run.run_id, expected=run.version, found=stored.version)
            saved = replace(
                stored,
                status=status,
                messages=list(messages),
                final_text=final_text,
                error=error,
                version=stored.version + 1,
                updated_at=self._clock(),
                claimed_by=None,
                lease_until=None,
            )
            self._runs[run.run_id] = saved
            return saved

    async def claim_ready(
        self, *, worker: str, lease: float = DEFAULT_LEASE, limit: int = 10
    ) -> _Runs:
        now = self._clock()
        waiting_on = {
            record.request.run_id for record in await self.approvals.list(status="pending")
        }
        with self._lock:
            ready = [
                run
                for run in self._runs.values()
                if (run.status == "waiting" and run.run_id not in waiting_on)
                or (
                    run.status == "running"
                    and run.lease_until is not None
                    and run.lease_until <= now
                )
            ][:limit]
            claimed = []
            for run in ready:
                taken = replace(
                    run,
                    status="running",
                    version=run.version + 1,
                    updated_at=now,
                    claimed_by=worker,
                    lease_until=now + timedelta(seconds=lease),
                )
                self._runs[run.run_id] = taken
                claimed.append(taken)
        return claimed

    async def renew_claim(self, run: RunRecord, *, lease: float = DEFAULT_LEASE) -> RunRecord:
        now = self._clock()
        with self._lock:
            stored = self._get(run.run_id)
            if stored.version != run.version or stored.lease_until is None:
                raise RunConflict(run_id=run.run_id, expected=run.version, found=stored.version)
            if stored.lease_until <= now:
                # Expired: whoever claims it next may already be working on it.
                raise RunConflict(
                    run_id=run.run_id,
                    expected=run.version,
                    found=stored.version,
                    reason=f"the claim of {stored.claimed_by} has expired",
                )
            renewed = replace(
                stored,
                version=stored.version + 1,
                updated_at=now,
                lease_until=now + timedelta(seconds=lease),
            )
            self._runs[run.run_id] = renewed
            return renewed

    def _get(self, run_id: str) -> RunRecord:
        try:
            return self._runs[run_id]
        except KeyError:
            raise RunNotFound(run_id=run_id) from None


_OUTCOMES: dict[str, RunStatus] = {"stop": "finished", "pending": "waiting", "max_turns": "failed"}


async def advance_run(
    run: RunRecord,
    *,
    agent: Agent,
    executor: Executor,
    runs: RunStore,
    max_turns: int = 20,
    lease: float = DEFAULT_LEASE,
) -> RunRecord:
    """Continue a claimed run's tool loop, with its own run id, and save where it stopped:
    finished (the model answered), waiting (calls wait for review) or failed.

    The claim is renewed first (for `lease` seconds) unless more than half of it is left (a
    claim just made), so a worker whose lease ran out runs nothing: nobody else can have
    claimed a run whose lease has not run out. Raises `RunConflict` when the run was taken
    over, before or while it ran.
    """
    left = (run.lease_until - utc_now()).total_seconds() if run.lease_until else 0.0
    if left < lease / 2:
        run = await runs.renew_claim(run, lease=lease)
    # The approvals the step's calls spend are recorded finished with the step's save, in
    # its transaction: then a review is finished exactly when its call's result is saved.
    spent: list[Spent] = []
    ctx = executor.context(run.run_id, requested_by=run.requested_by, spent=spent)
    try:
        result = await run_tool_loop(agent.chat, run.messages, ctx, max_turns=max_turns)
    except StoreError:
        # The store failed, not the run: the step is tried again from the run as saved. A
        # call that ran keeps its result with its approval, which answers the call then: it
        # is not run again.
        await _keep(executor, spent)
        raise
    except Exception as exc:
        # The conversation as last saved is kept: a failed run can be looked at, or retried.
        failure = f"{type(exc).__name__}: {exc}"
        return await _save(
            runs,
            run,
            lease,
            executor,
            spent=spent,
            status="failed",
            messages=run.messages,
            error=failure,
        )
    cut_off = f"stopped after {max_turns} model turns" if result.finish == "max_turns" else None
    return await _save(
        runs,
        run,
        lease,
        executor,
        spent=spent,
        status=_OUTCOMES[result.finish],
        messages=result.messages,
        final_text=result.final_text,
        error=cut_off,
    )


async def _save(
    runs: RunStore,
    run: RunRecord,
    lease: float,
    executor: Executor,
    *,
    spent: list[Spent],
    status: RunStatus,
    messages: Sequence[Message],
    final_text: str | None = None,
    error: str | None = None,
) -> RunRecord:
    """Save the step, with the approvals it spent (finished in the save's transaction, and
    only by a save that holds).

    The calls this step ran are spent, and their results live only in `messages` until
    saved; so a save the store cannot take is tried again while this worker's claim holds,
    then the results are kept with their approvals (`DeferredApproval.keep_spent`), and the
    save is tried on for as long as this process lives (`KEEP_TRYING`). A save refused with
    `RunConflict` (another worker took the run over once the claim ran out) keeps the
    results too, and raises: whichever worker resumes the run answers those calls with
    them, and finishes their approvals."""
    held = (run.lease_until - utc_now()).total_seconds() if run.lease_until else 0.0

    def save() -> Awaitable[RunRecord]:
        return runs.save_run(
            run, status=status, messages=messages, final_text=final_text, error=error, spent=spent
        )

    what = f"saving run {run.run_id}"
    try:
        try:
            return await until_written(save, what=what, within=max(held, lease / 2))
        except StoreUnavailableError:
            await _keep(executor, spent)
            return await until_written(save, what=what, within=KEEP_TRYING)
    except RunConflict:
        await _keep(executor, spent)
        raise


async def _keep(executor: Executor, spent: list[Spent]) -> None:
    """Keep the results of the calls a step ran with their approvals, when the step itself
    is not saved: trying for as long as this process lives."""
    if spent and isinstance(executor.approval, DeferredApproval):
        await executor.approval.keep_spent(spent, within=KEEP_TRYING)
