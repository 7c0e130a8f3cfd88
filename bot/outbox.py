"""The dispatcher: it turns reviews into deliveries and hands them to the channels.

Each `step` first announces what is new (a review opened: its request; a review decided: its
outcome), asking every channel which deliveries it wants (`Channel.targets`), then delivers
what is due (`Channel.deliver`). The deliveries an announcement makes due at once are made
claimed by the announcing worker, which delivers them without claiming them; the claims of
due deliveries are for the rest (failed attempts due again, deliveries due later, those of a
worker that died, those a channel made while delivering). A failed attempt is due again after
a backoff (1 s, doubling, at most `max_backoff`, or the channel's own `retry_after`); a
channel that says it never will deliver (`DeliveryError(permanent=True)`) gives the delivery
up, and the events say so. Nothing is lost: every delivery stays in the store until it is
sent or given up.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import random
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, Literal, Protocol, TypeAlias

from nodbot.bot.config.values import Reviewer, normalize_handle, parse_reviewer
from nodbot.bot.metrics import METRICS
from nodbot.core import (
    Announcement,
    ApprovalNotFound,
    ApprovalRecord,
    ApprovalStore,
    Delivery,
    DeliveryLost,
    NewDelivery,
    Outbox,
    StoreError,
)
from nodbot.core.outbox import Opened
from nodbot.core.retrying import until_written
from nodbot.core.store import utc_now

__all__ = [
    "Channel",
    "DeliveryError",
    "Dispatcher",
    "Moment",
    "OutboxStore",
    "acted",
    "approvals_needed",
    "backoff",
    "reminder_skipped",
    "reminder_step",
    "reminder_steps",
    "reminder_target",
    "retry_after",
    "stored_reviewers",
]

log = logging.getLogger(__name__)


ANNOUNCE_BATCH = 100
"""Reviews announced per read of the store."""
DELIVERY_BATCH = 50
"""Deliveries claimed at once, and delivered side by side (at most `concurrency` at a time)."""
CLAIM_EVERY = 0.5
"""Seconds at most between the claims of the workers' outbox lane (`start_step`) when this
process knows of nothing to claim: what other processes left due is found that soon."""


class DeliveryError(Exception):
    """A delivery that did not go through: tried again later, unless `permanent`."""

    def __init__(
        self, message: str, *, permanent: bool = False, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.permanent = permanent
        self.retry_after = retry_after


def retry_after(value: object) -> float | None:
    """The seconds of a `Retry-After` header (None when absent or not a number)."""
    try:
        return max(0.0, float(str(value))) if value is not None else None
    except ValueError:
        return None


class Channel(Protocol):
    """Somewhere reviews are told: webhooks here; Slack and email plug in the same way."""

    name: str
    """The channel part of its targets (`webhook` in `webhook:ops`)."""
    answers: bool
    """Whether it tells a finished run's answer (asked only of channels that do)."""
    makes_deliveries: bool
    """Whether a delivery of it may make deliveries of its own (`Outbox.announce`, as Slack's
    request to a user group makes one for each member): after one, the outbox lane claims."""
    tells_outcomes: bool
    """Whether it may want deliveries at a review's `outcome` (a bot none of whose channels
    does leaves the store no outcome stage to announce: `SqlApprovalStore.outcome_stage`)."""

    def targets(self, record: ApprovalRecord, stage: Moment) -> list[NewDelivery]:
        """The deliveries this channel wants for the review at this moment: it opened
        (`request`), it was decided (`outcome`), its run finished (`answer`)."""
        ...

    async def deliver(self, delivery: Delivery, record: ApprovalRecord) -> dict[str, Any] | None:
        """Deliver; returns what to keep about it (kept as the delivery's `ref`). A delivery
        of several steps may keep its progress on the way (`Outbox.delivery_progress`, as
        `delivery.claimed_by`), and finds it in `delivery.ref` on the next attempt. Raises
        `DeliveryError`, or `DeliveryLost` when its progress could not be kept."""
        ...

    async def close(self) -> None:
        """Let go of connections."""
        ...


Moment: TypeAlias = Literal["request", "outcome", "answer"]
"""When channels are asked what to deliver about a review."""


class OutboxStore(ApprovalStore, Outbox, Protocol):
    """A store of approvals with its outbox (`SqlApprovalStore`)."""


# --- reminders ------------------------------------------------------------------------------
#
# A rule's `remind_every` (seconds) and `remind_limit`, kept in the review's policy, make
# reminders: step k due at the review's opening + k * remind_every, before its deadline, at
# most remind_limit of them. A channel that reminds wants one delivery (kind `reminder`,
# target `<channel>:reminder:<k>`) per step when the review opens, so each step is claimed,
# sent and recorded once however many replicas announce it; who is reminded is decided when
# it is sent (those the channel reached who have not voted by then).

DEFAULT_REMINDERS = 3
"""Reminders of a review whose policy says `remind_every` but no `remind_limit`."""
MAX_REMINDERS = 10
"""Reminders of one review at most, whatever its policy says."""


def reminder_steps(record: ApprovalRecord) -> list[tuple[int, datetime]]:
    """The review's reminders, `(k, due at)`, from its policy's `remind_every` and
    `remind_limit`: none without them (or with values that are not whole numbers above 0),
    and none due at or after its deadline."""
    policy = record.request.policy
    every, limit = policy.get("remind_every"), policy.get("remind_limit", DEFAULT_REMINDERS)
    if not isinstance(every, int) or not isinstance(limit, int) or not _whole(every, limit):
        return []
    deadline = record.request.deadline
    steps = []
    for k in range(1, min(limit, MAX_REMINDERS) + 1):
        at = record.created_at + timedelta(seconds=k * every)
        if deadline is not None and at >= deadline:
            break
        steps.append((k, at))
    return steps


def _whole(*values: int) -> bool:
    return all(not isinstance(value, bool) and value > 0 for value in values)


def reminder_target(channel: str, step: int) -> str:
    """The target of a channel's reminder number `step`: `slack:reminder:2`."""
    return f"{channel}:reminder:{step}"


def reminder_step(delivery: Delivery) -> int | None:
    """The number of a reminder delivery (`reminder_target`); None for any other."""
    kind, _, number = delivery.address.partition(":")
    if delivery.kind != "reminder" or kind != "reminder" or not number.isdigit():
        return None
    return int(number)


def reminder_skipped(record: ApprovalRecord, delivery: Delivery, now: datetime) -> str | None:
    """Why reminder `delivery` is not sent (it is settled so, `{"skipped": why}`), or None to
    send it: the review is decided, or past its deadline; the step is not one its policy asks
    for; or the next step is due too (the bot was stopped through this one's time), so that
    the reviewers get one reminder, the later one, not two at once."""
    step = reminder_step(delivery)
    if record.decision is not None:
        return f"decided before reminder {step}"
    deadline = record.request.deadline
    if deadline is not None and now >= deadline:
        return f"timed out before reminder {step}"
    steps = dict(reminder_steps(record))
    if step not in steps:
        return f"reminder {step} is not one the review's rule asks for"
    following = steps.get(step + 1)
    if following is not None and now >= following:
        return f"reminder {step + 1} is due too: it is sent instead"
    return None


async def acted(store: ApprovalStore, approval_id: str) -> frozenset[str]:
    """Who has voted on the review: the handles they voted with and the persons those
    resolved to (`person:ana`, `email:ana@example.com`, and their handle part), compared as
    `normalize_handle` writes them. A reviewer found here is not reminded."""
    found: set[str] = set()
    for event in await store.events(approval_id):
        if event.kind not in ("voted", "decided"):
            continue
        for handle in (event.actor, event.person):
            if handle:
                found.add(normalize_handle(handle))
                found.add(normalize_handle(handle.partition(":")[2] or handle))
    return frozenset(found)


async def approvals_needed(store: ApprovalStore, record: ApprovalRecord) -> int:
    """The approvals an undecided review still needs (at least one): those its rule asks
    for, less the persons who have voted (every vote on an undecided review is an approval:
    a deny decides), for what a reminder or an escalation says."""
    events = await store.events(record.approval_id)
    voters = {event.person or event.actor for event in events if event.kind == "voted"}
    return max(1, record.request.approvals_required - len(voters))


def stored_reviewers(texts: object) -> list[Reviewer]:
    """The reviewer entries of a stored policy's list (`reviewers`, `escalate_to`), those
    understood; one that is not is logged and skipped."""
    found = []
    for text in texts if isinstance(texts, list) else []:
        try:
            found.append(parse_reviewer(text))
        except ValueError:
            log.warning("reviewer %r of a stored review is not understood; skipped", text)
    return found


def backoff(attempts: int, *, base: float = 1.0, cap: float = 300.0) -> float:
    """Seconds before the next attempt after `attempts` failed ones: doubling from `base`,
    at most `cap`, with up to 10% jitter so that replicas do not retry in step."""
    delay = min(cap, base * float(2 ** max(0, attempts - 1)))
    return delay * (1 + random.random() / 10)


class Dispatcher:
    """Announces reviews and delivers what is due, for the channels given."""

    def __init__(
        self,
        store: OutboxStore,
        channels: Sequence[Channel],
        *,
        worker: str,
        lease: float = 60.0,
        concurrency: int = 16,
        min_backoff: float = 1.0,
        max_backoff: float = 300.0,
        claim_every: float = CLAIM_EVERY,
        clock: Callable[[], datetime] = utc_now,
        counters: dict[str, int] | None = None,
    ) -> None:
        self.store = store
        self.channels = {channel.name: channel for channel in channels}
        self.tells_outcomes = any(channel.tells_outcomes for channel in channels)
        """Whether a channel may want deliveries at a review's outcome."""
        self.answers = any(channel.answers for channel in channels)
        """Whether a channel tells a finished run's answer."""
        self.worker = worker
        self.lease = lease
        self.min_backoff = min_backoff
        self.max_backoff = max_backoff
        self.claim_every = claim_every
        self._slots = asyncio.Semaphore(concurrency)
        self._clock = clock
        self.counters = counters if counters is not None else {}
        """Deliveries sent and failed by this process, for /metrics."""
        self.counters.update(deliveries_sent=0, deliveries_failed=0)
        self._sending: set[asyncio.Task[bool]] = set()
        """The deliveries started that are still going."""
        self._sending_ids: set[int] = set()
        """The ids of the deliveries started that are still going (a claim passes them: it
        takes back the others this worker holds and lost track of)."""
        self._last: dict[str, asyncio.Task[bool]] = {}
        """The last delivery started of each review that has one still going."""
        self._claim_wanted = True
        """Whether the lane's next step claims, however long ago its last claim was: that
        claim was full, or a delivery since may have made deliveries, or answers were made."""
        self._claimed_at = -claim_every
        """The event loop's time of the last claim."""
        self._later: list[datetime] = []
        """When deliveries this process made, or failed, are due (a heap): the lane claims
        once the soonest is."""

    async def step(self) -> int:
        """Announce what is new, then deliver what is due; how many were delivered."""
        held = await self._announce_all()
        delivered = sum(await asyncio.gather(*(self._start(d, r) for d, r in held)))
        # A failed delivery is due again only after a backoff, so this ends.
        while claimed := await self._claim():
            delivered += sum(await asyncio.gather(*(self._start(d) for d in claimed)))
            if len(claimed) < DELIVERY_BATCH:
                break  # that was all that was due: no need to ask again
        return delivered

    async def start_step(self) -> int:
        """Announce what is new, then start delivering what is due, each delivery in a task
        of its own that goes on after this returns (`drain` waits for them); how many were
        started. The workers' outbox lane steps so: a review opened while others are being
        delivered is announced and sent at once, not after the slowest of them.

        The deliveries it announces come claimed, so it claims only when something else may
        be due (`_should_claim`): not at every step, where on PostgreSQL each claim is a
        round trip, and under load most find nothing."""
        held = await self._announce_all()
        for delivery, record in held:
            self._start(delivery, record)
        started = len(held)
        if not self._should_claim():
            return started
        while claimed := await self._claim():  # claimed: no later claim takes them again
            for delivery in claimed:
                self._start(delivery)
            started += len(claimed)
            if len(claimed) < DELIVERY_BATCH:
                break  # that was all that was due: no need to ask again
        return started

    async def drain(self) -> None:
        """Wait for the deliveries `start_step` started."""
        while self._sending:
            await asyncio.wait(list(self._sending))

    def _start(
        self, delivery: Delivery, record: ApprovalRecord | None = None
    ) -> asyncio.Task[bool]:
        """Deliver in a task of its own, after the deliveries of the same review started
        before it: a review's outcome follows its request (a channel may need the request's
        message to answer in its thread), while other reviews' deliveries go side by side.
        `record`: the review as its announcement just read it, delivered as it is unless an
        earlier delivery of the review is still going (then it is read again after that)."""
        before = self._last.get(delivery.approval_id)
        known = record if before is None else None
        task = asyncio.get_running_loop().create_task(self._deliver_after(before, delivery, known))
        self._last[delivery.approval_id] = task
        self._sending.add(task)
        self._sending_ids.add(delivery.delivery_id)
        task.add_done_callback(lambda done: self._ended(delivery, done))
        return task

    async def _deliver_after(
        self,
        before: asyncio.Task[bool] | None,
        delivery: Delivery,
        record: ApprovalRecord | None,
    ) -> bool:
        """The task of one delivery: it never ends in an exception nobody looks at. What the
        store could not record is left as it stands, claimed by this worker until its lease
        runs out, and then claimed again (by this process or another): logged, not lost."""
        if before is not None:
            await asyncio.wait([before])
        try:
            return await self._deliver(delivery, record)
        except StoreError as exc:
            log.warning(
                "delivery %s left for a later attempt: the store failed (%s)",
                delivery.delivery_id,
                exc,
            )
        except Exception:
            log.exception("delivery %s could not be handled", delivery.delivery_id)
        self._due_later(self._clock() + timedelta(seconds=self.lease))
        return False

    def _ended(self, delivery: Delivery, task: asyncio.Task[bool]) -> None:
        self._sending.discard(task)
        self._sending_ids.discard(delivery.delivery_id)
        if self._last.get(delivery.approval_id) is task:
            del self._last[delivery.approval_id]

    def _should_claim(self) -> bool:
        """Whether the lane claims at this step: its last claim was full, or a delivery may
        have made deliveries since, or one this process made or failed is due now, or
        `claim_every` has gone by (what other processes left due)."""
        if self._claim_wanted or (self._later and self._later[0] <= self._clock()):
            return True
        return asyncio.get_running_loop().time() - self._claimed_at >= self.claim_every

    def due_now(self) -> None:
        """Deliveries were made due now in the store (a channel asked for it): the lane's next
        step claims, however soon after its last claim."""
        self._claim_wanted = True

    def _due_later(self, at: datetime) -> None:
        heapq.heappush(self._later, at)

    async def _claim(self) -> list[Delivery]:
        self._claimed_at = asyncio.get_running_loop().time()
        now = self._clock()
        while self._later and self._later[0] <= now:
            heapq.heappop(self._later)  # due by now: this claim finds it
        claimed = await self.store.claim_deliveries(
            worker=self.worker, lease=self.lease, limit=DELIVERY_BATCH, sending=self._sending_ids
        )
        self._claim_wanted = len(claimed) >= DELIVERY_BATCH
        return claimed

    def opening(self, record: ApprovalRecord) -> list[NewDelivery]:
        """The deliveries the channels want of a review just opened (its `request` stage):
        this dispatcher announces new runs' reviews as their first save writes them
        (`core.outbox.Announcer`)."""
        return self._wanted(record, "request")

    def _wanted(self, record: ApprovalRecord, stage: Moment) -> list[NewDelivery]:
        """What every channel wants of the review at `stage`."""
        return [d for c in self.channels.values() for d in c.targets(record, stage)]

    def start_opened(self, opened: Opened) -> int:
        """Start delivering what the reviews a new run opened were announced with, in the
        transaction that wrote them (`opening`): the deliveries claimed by this worker, each
        with its review as written; those due later are claimed when they are due. How
        many were started."""
        records = {record.approval_id: record for record in opened.reviews}
        for record in opened.reviews:
            _log_opened(record)
        started = 0
        for delivery in opened.deliveries or ():
            if delivery.claimed_by == self.worker:
                self._start(delivery, records[delivery.approval_id])
                started += 1
            else:
                self._due_later(delivery.due_at)
        return started

    async def announce_opened(self, records: Sequence[ApprovalRecord]) -> int:
        """Announce reviews this process has just opened, as the caller read them (no read of
        what is unannounced), and start delivering what that makes due at once; how many
        deliveries were started. A review announced meanwhile by another step is not
        announced twice (the store makes a review's deliveries once). Raises what the store
        raises; what is left unannounced, the lane's next step finds."""
        made = await asyncio.gather(
            *(self._announce(Announcement(record, "request"), True) for record in records),
            return_exceptions=True,
        )
        return self._start_made(made)

    def _start_made(
        self, made: Sequence[list[tuple[Delivery, ApprovalRecord]] | BaseException]
    ) -> int:
        """Start the deliveries that announcements side by side made claimed by this worker,
        each with its review; then raise the first failure among them, if any. Those that
        succeeded are started all the same: claimed by this worker, nobody else would send
        them before their lease ran out."""
        started = 0
        for outcome in made:
            if not isinstance(outcome, BaseException):
                for delivery, record in outcome:
                    self._start(delivery, record)
                    started += 1
        for outcome in made:
            if isinstance(outcome, BaseException):
                raise outcome
        return started

    async def announce(self) -> int:
        """Make the deliveries of every review with something to announce, none of them
        claimed; how many."""
        return len(await self._announce_all(claim=False))

    async def _announce_all(self, *, claim: bool = True) -> list[tuple[Delivery, ApprovalRecord]]:
        """Announce every review with something to announce; the deliveries made claimed by
        this worker (`claim`), which the caller delivers, each with its review as read."""
        held: list[tuple[Delivery, ApprovalRecord]] = []
        while announcements := await self.store.unannounced(limit=ANNOUNCE_BATCH):
            # Side by side: each is its own statement, and on PostgreSQL its own round trip.
            made = await asyncio.gather(
                *(self._announce(a, claim) for a in announcements), return_exceptions=True
            )
            failed = [outcome for outcome in made if isinstance(outcome, BaseException)]
            if failed:
                # What was made before the failure is started here (the caller gets the
                # failure, not the list): claimed by this worker, it would wait for its lease.
                for delivery, record in held:
                    self._start(delivery, record)
                self._start_made(made)  # raises the first failure
            for outcome in made:
                assert not isinstance(outcome, BaseException)
                held.extend(outcome)
            if len(announcements) < ANNOUNCE_BATCH:
                break  # that was all: no need to ask again
        return held

    async def _announce(
        self, announcement: Announcement, claim: bool
    ) -> list[tuple[Delivery, ApprovalRecord]]:
        record, stage = announcement.record, announcement.stage
        if stage == "request":
            _log_opened(record)
        wanted = self._wanted(record, stage)
        worker = self.worker if claim else None
        made = await self.store.announce(
            record.approval_id, stage, wanted, worker=worker, lease=self.lease
        )
        held = [(d, record) for d in made if claim and d.claimed_by == self.worker]
        for delivery in made:
            if delivery.claimed_by is None:
                self._due_later(delivery.due_at)
        return held

    async def answer(self, run_id: str) -> int:
        """Make the deliveries of a finished run's answer, for each of its reviews."""
        answering = [c for c in self.channels.values() if c.answers]
        if not answering:
            return 0  # no read of the run's reviews for nothing
        made = 0
        for record in await self.store.list(run_id=run_id):
            wanted = [d for c in answering for d in c.targets(record, "answer")]
            if wanted:
                made += len(await self.store.announce(record.approval_id, None, wanted))
        if made:
            self._claim_wanted = True  # made unclaimed: the lane's next step claims them
        return made

    async def close(self) -> None:
        for channel in self.channels.values():
            await channel.close()

    async def _deliver(self, delivery: Delivery, record: ApprovalRecord | None = None) -> bool:
        channel = self.channels.get(delivery.channel)
        try:
            return await self._deliver_to(channel, delivery, record)
        finally:
            if channel is None or channel.makes_deliveries:
                self._claim_wanted = True  # what it made is claimed at the lane's next step

    async def _deliver_to(
        self, channel: Channel | None, delivery: Delivery, known: ApprovalRecord | None
    ) -> bool:
        async with self._slots:
            try:
                record = known or await self.store.get(delivery.approval_id)
                if channel is None:
                    raise DeliveryError(
                        f"no {delivery.channel} channel is configured", permanent=True
                    )
                ref = await channel.deliver(delivery, record)
            except DeliveryLost as exc:
                # Its progress could not be kept: another worker holds it now and goes on.
                log.warning("delivery %s stopped: %s", delivery.delivery_id, exc)
                return False
            except (DeliveryError, ApprovalNotFound) as exc:
                return await self._failed(delivery, exc)
            except StoreError:
                raise  # not the delivery's failure: it is tried again (`_deliver_after`)
            except Exception as exc:
                log.exception("delivery %s to %s failed", delivery.delivery_id, delivery.target)
                return await self._failed(delivery, DeliveryError(f"{type(exc).__name__}: {exc}"))
            try:
                # Sent: the record is tried again while the store is unavailable, for as long
                # as the claim holds (after that another worker may take the delivery over and
                # send it again). A first attempt that landed though its answer was lost makes
                # the next one find the delivery settled (`DeliveryLost`): sent once.
                await until_written(
                    lambda: self.store.delivered(delivery.delivery_id, worker=self.worker, ref=ref),
                    what=f"recording delivery {delivery.delivery_id} sent",
                    within=self.lease,
                )
            except DeliveryLost as exc:
                log.warning("delivered, but %s", exc)  # another worker took it over: it repeats
                return False
            self.counters["deliveries_sent"] += 1
            METRICS.sent(delivery, record, ref, known=self.channels)
            log.info("delivery sent", extra=_delivery_fields(delivery))
            return True

    async def _failed(self, delivery: Delivery, exc: Exception) -> bool:
        permanent = isinstance(exc, ApprovalNotFound) or getattr(exc, "permanent", False)
        retry_at = None
        if not permanent:
            wait = backoff(delivery.attempts + 1, base=self.min_backoff, cap=self.max_backoff)
            retry_after = getattr(exc, "retry_after", None)
            if retry_after is not None:
                wait = max(wait, retry_after)
            retry_at = self._clock() + timedelta(seconds=wait)
            self._due_later(retry_at)
        log.warning(
            "delivery given up" if retry_at is None else "delivery failed",
            extra={
                **_delivery_fields(delivery),
                "error": str(exc),
                "retry_at": None if retry_at is None else retry_at.isoformat(),
            },
        )
        self.counters["deliveries_failed"] += 1
        result = "given_up" if retry_at is None else "failed"
        METRICS.delivered(delivery.channel, delivery.kind, result, known=self.channels)
        try:  # a StoreError: the claim runs out and the delivery is tried again (`_deliver_after`)
            await self.store.delivery_failed(
                delivery.delivery_id, worker=self.worker, error=str(exc), retry_at=retry_at
            )
        except DeliveryLost as lost:
            log.warning("could not record the failure: %s", lost)
        return False


def _log_opened(record: ApprovalRecord) -> None:
    """Logged when the review is first announced: once per review, whichever process made it.
    A call the bot decided as it was asked (a rule's `decision`, recorded for a caller that
    runs the tool itself: `POST /approvals`, a hosted agent) opened no review: its line is the
    decision, as a reviewer's is."""
    request, decision = record.request, record.decision
    if decision is not None and (decision.decided_by or "").startswith(BOT_DECIDES):
        action = "deny" if not decision.approved else "edit" if decision.edited_args else "approve"
        log.info(
            "decision",
            extra={
                "approval_id": record.approval_id,
                "run_id": request.run_id,
                "tool": request.tool,
                "call_id": request.call_id,
                "action": action,
                "decided_by": decision.decided_by,
                "channel": "rules",
            },
        )
        return
    log.info(
        "review opened",
        extra={
            "approval_id": record.approval_id,
            "run_id": request.run_id,
            "tool": request.tool,
            "requested_by": request.requested_by,
            "reviewers": request.policy.get("reviewers"),
        },
    )


BOT_DECIDES = ("nodbot:rules.", "nodbot:no-rule")
"""The `decided_by` of the decisions the rules make as a call is asked about."""


def _delivery_fields(delivery: Delivery) -> dict[str, Any]:
    return {
        "delivery_id": delivery.delivery_id,
        "approval_id": delivery.approval_id,
        "kind": delivery.kind,
        "target": delivery.target,
        "attempt": delivery.attempts + 1,
    }
