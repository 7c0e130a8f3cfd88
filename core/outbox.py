"""The outbox: what must be told to whom about each review, kept in the store with it.

A review is *announced* twice: when it opens (its request: post it to the reviewers) and when
it is decided (its outcome: update those posts, tell whoever waits). Announcing turns a review
into deliveries, one per target (`channel:address`, e.g. `webhook:ops`), and a dispatcher
delivers them:

```
review opens ──► unannounced ──announce(request)──► deliveries due ──claim──► delivered
review decided ─► unannounced ──announce(outcome)─►       ▲                  │ failed: due
                                                          └────── retry_at ◄─┘   again later
```

Every step is an atomic store operation, so several bot replicas can share the work: a
delivery is made once per (review, kind, target) however many of them announce it, claimed
by one of them at a time (until its lease runs out), and only the claimant may settle it. A
delivery whose claimant died is claimed again once the lease has run out: delivery is
at least once, and receivers tell repeats apart by the delivery id. A delivery of several
steps records each step's progress as it goes (`delivery_progress`), so that the next attempt
goes on from the step that failed.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, Protocol, TypeAlias, runtime_checkable

from nodbot.core.store import ApprovalRecord

__all__ = [
    "ORPHANED",
    "Announcement",
    "Announcer",
    "Delivery",
    "DeliveryKind",
    "DeliveryStatus",
    "NewDelivery",
    "Opened",
    "Outbox",
    "Stage",
]

ORPHANED = 5.0
"""Seconds after which a delivery a worker claimed and is not sending is taken to be lost
track of (`claim_deliveries`' `sending`): far longer than a claim takes to be started."""

Stage: TypeAlias = Literal["request", "outcome"]
"""What is announced about a review: that it opened, or how it was decided."""
DeliveryKind: TypeAlias = Literal["request", "escalation", "reminder", "outcome", "answer"]
"""What a delivery tells: the request, the request again to those it escalates to (due at
the escalation time), a reminder to those who have not acted yet (one delivery per step of
the rule's `remind_every`, each due at its step's time, the step's number in its target), the
outcome, the run's final answer (once the run has finished)."""
DeliveryStatus: TypeAlias = Literal["due", "sent", "failed"]
"""`due` until delivered (`sent`) or given up (`failed`: the channel said it never will)."""


@dataclass(frozen=True)
class Announcement:
    """A review with something still to announce."""

    record: ApprovalRecord
    stage: Stage


@dataclass(frozen=True)
class NewDelivery:
    """A delivery to make when announcing."""

    kind: DeliveryKind
    target: str
    """`channel:address`, such as `webhook:ops` or `slack:C0123`."""
    due_at: datetime | None = None
    """Not before then (default: at once)."""


@dataclass(frozen=True)
class Delivery:
    """One thing to tell one target about one review, and how far it got."""

    delivery_id: int
    approval_id: str
    kind: DeliveryKind
    target: str
    status: DeliveryStatus
    attempts: int
    due_at: datetime
    created_at: datetime
    sent_at: datetime | None = None
    ref: dict[str, Any] | None = None
    """What the channel keeps about what it posted (a Slack message's channel and ts, say),
    so that it can update it later; while the delivery is due, how far its attempts got
    (`Outbox.delivery_progress`)."""
    error: str | None = None
    """Why the last attempt failed."""
    claimed_by: str | None = None
    lease_until: datetime | None = None

    @property
    def channel(self) -> str:
        """The channel part of the target: `webhook` for `webhook:ops`."""
        return self.target.partition(":")[0]

    @property
    def address(self) -> str:
        """The address part of the target: `ops` for `webhook:ops`."""
        return self.target.partition(":")[2]


class Announcer(Protocol):
    """Who announces the reviews a new run's first step opens, in the transaction that
    writes them (`RunStore.draft_run`): the deliveries it wants of each, those due at once
    made claimed by `worker` for `lease` seconds (the bot's `Dispatcher`)."""

    worker: str
    lease: float

    def opening(self, record: ApprovalRecord) -> list[NewDelivery]:
        """The deliveries the review `record`, just opened, wants (its `request` stage)."""
        ...


@dataclass(frozen=True)
class Opened:
    """The reviews a new run's first save wrote, as written (`RunStore.opened_reviews`)."""

    reviews: list[ApprovalRecord]
    """All pending then, in the order they were opened."""
    deliveries: list[Delivery] | None = None
    """The deliveries made for them in the same transaction (`Announcer`); None when they
    were not announced so (left to the outbox: `Outbox.announce`)."""


@runtime_checkable
class Outbox(Protocol):
    """The outbox operations of a store (`SqlApprovalStore`)."""

    async def unannounced(self, *, limit: int = 100) -> list[Announcement]:
        """Reviews with something to announce, oldest first: the request of a review not
        announced yet, or the outcome of a decided review whose request was announced."""
        ...

    async def announce(
        self,
        approval_id: str,
        stage: Stage | None,
        deliveries: Sequence[NewDelivery],
        *,
        worker: str | None = None,
        lease: float = 60.0,
    ) -> list[Delivery]:
        """Make `deliveries` (those not made before) and mark `stage` as announced (None:
        no stage, deliveries only), in one transaction; returns the deliveries made. With
        `worker`, those due at once are made claimed by it for `lease` seconds, as
        `claim_deliveries` would claim them: the worker delivers them without a claim of
        its own (and if it cannot, they are claimed again once the lease runs out)."""
        ...

    async def claim_deliveries(
        self,
        *,
        worker: str,
        lease: float,
        limit: int = 50,
        sending: Collection[int] | None = None,
    ) -> list[Delivery]:
        """Claim up to `limit` due deliveries for `lease` seconds, soonest due first. With
        `sending` (the ids of the deliveries `worker` is sending now), also those claimed by
        `worker` at least `ORPHANED` seconds ago that it is not sending: claims it lost
        track of (an answer lost as the store committed them, an announcement that failed
        beside them), which would otherwise wait for their lease to run out."""
        ...

    async def delivered(
        self, delivery_id: int, *, worker: str, ref: dict[str, Any] | None = None
    ) -> Delivery:
        """Settle a claimed delivery as sent. Raises `DeliveryLost` when `worker` no longer
        holds it (its lease ran out and another worker took it)."""
        ...

    async def delivery_failed(
        self, delivery_id: int, *, worker: str, error: str, retry_at: datetime | None
    ) -> Delivery:
        """Record a failed attempt: due again at `retry_at`, or given up (`failed`) when
        None; the ref its progress left is kept. Raises `DeliveryLost` as `delivered` does."""
        ...

    async def delivery_progress(
        self, delivery_id: int, *, worker: str, ref: dict[str, Any]
    ) -> Delivery:
        """Keep `ref` as the progress of a delivery `worker` holds, without settling it: it
        stays claimed and due, and the next attempt (after a failure, or by another worker
        once the lease has run out) starts from that ref instead of from nothing. Raises
        `DeliveryLost` as `delivered` does."""
        ...

    async def retry_deliveries_now(self, targets: Collection[str]) -> int:
        """Make the deliveries to `targets` that failed and wait for their next attempt due
        now, for the next claim to take: a channel has learnt that what stopped them is
        fixed (Slack: the bot was invited to the channel that refused its post). Deliveries
        never tried (due later, such as an escalation), claimed ones (their lease still
        runs), sent ones and given up ones are left as they are. Returns how many changed."""
        ...

    async def deliveries(self, approval_id: str) -> list[Delivery]:
        """The deliveries of one review, in the order they were made."""
        ...
