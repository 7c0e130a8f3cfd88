"""Delegation (out of office): a reviewer hands their reviews to another person for a period.

Delegations come from two places, read again at each use so that every replica and every
restart agrees: standing ones in the configuration (`delegations:`), and those kept in the
store (`nodbot delegate`, the inbox's settings page; `core.delegations`). Both name handles;
`Delegations` resolves them to persons (`bot.policy.people`) at the moment they are used.

What a delegation grants (`bot.policy.authorize`): while it lasts, the delegate may decide
what the delegator could (the rules' reviewers, user groups and channels, through the
delegator), never a run the delegate asked for themselves, and the delegator still may.
Delegations do not chain: the delegate of a delegate gets nothing of the first delegator.
A past or ended delegation grants nothing; one that cannot be read (the store failing)
grants nothing either.

For escalation and reminders, `delegates_of(person, at)` says who decides for a reviewer now.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from pydantic import ValidationError

from nodbot.bot.config import Config
from nodbot.bot.config.models import StandingDelegation
from nodbot.bot.config.values import normalize_handle
from nodbot.bot.policy.people import People, Person
from nodbot.core.delegations import Delegation
from nodbot.core.delegations import Delegations as StoredDelegations
from nodbot.core.store import utc_now

__all__ = [
    "Delegations",
    "Handed",
    "NewDelegation",
    "checked_delegation",
    "delegations_of",
    "standing_delegations",
]

MAX_REASON = 200
"""The longest reason a delegation keeps."""


@dataclass(frozen=True)
class NewDelegation:
    """A delegation as asked for (`checked_delegation`), handles normalized."""

    delegator: str
    delegate: str
    until: datetime
    reason: str | None


def checked_delegation(
    delegator: str, delegate: str, until: str, reason: str | None, *, now: datetime
) -> NewDelegation:
    """A delegation from the words of a command line or a form, checked as the file's
    `delegations:` are (handles, not to oneself, a date or a time), ending after `now`.
    Raises `ValueError` saying what is wrong, in which field."""
    fields = {"from": delegator.strip(), "to": delegate.strip(), "until": until.strip()}
    if reason is not None and reason.strip():
        fields["reason"] = reason.strip()
    try:
        entry = StandingDelegation.model_validate(fields)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        raise ValueError(f"{where}: {error['msg']}" if where else error["msg"]) from None
    assert entry.until is not None
    if entry.until <= now:
        raise ValueError(f"until: {until.strip()} has passed already: give a later date")
    if entry.reason is not None and len(entry.reason) > MAX_REASON:
        raise ValueError(f"reason: at most {MAX_REASON} characters")
    return NewDelegation(
        delegator=normalize_handle(entry.delegator),
        delegate=normalize_handle(entry.delegate),
        until=entry.until,
        reason=entry.reason,
    )


def delegations_of(store: object) -> StoredDelegations | None:
    """The store's delegations, when it keeps them."""
    found = getattr(store, "delegations", None)
    return found if isinstance(found, StoredDelegations) else None


def standing_delegations(config: Config) -> list[Delegation]:
    """The configuration's `delegations:`, as delegations (`config:<n>`, from 0)."""
    epoch = datetime.min.replace(tzinfo=utc_now().tzinfo)
    return [
        Delegation(
            delegation_id=f"config:{index}",
            delegator=normalize_handle(entry.delegator),
            delegate=normalize_handle(entry.delegate),
            since=entry.since or epoch,
            until=entry.until,
            reason=entry.reason,
            created_by="config",
        )
        for index, entry in enumerate(config.delegations)
    ]


@dataclass(frozen=True)
class Handed:
    """One live delegation, its handles resolved."""

    delegation: Delegation
    delegator: Person
    delegate: Person


class Delegations:
    """The delegations that hold now: the `standing` ones and those of `stored`, their
    handles resolved by `people`."""

    def __init__(
        self,
        people: People,
        *,
        standing: Sequence[Delegation] = (),
        stored: StoredDelegations | None = None,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self.people = people
        self.standing = list(standing)
        self.stored = stored
        self._clock = clock

    @classmethod
    def of(cls, config: Config, people: People, store: object) -> Delegations:
        """The delegations of a bot with `config`, `people` and `store`."""
        return cls(people, standing=standing_delegations(config), stored=delegations_of(store))

    @property
    def any_possible(self) -> bool:
        """Whether any delegation could hold (some standing one, or a store that keeps them)."""
        return bool(self.standing) or self.stored is not None

    async def live(self, at: datetime | None = None) -> list[Handed]:
        """Those that hold at `at` (now by default), handles resolved. Raises `StoreError`
        (the store cannot be read) and `IdentityUnavailable`."""
        moment = at or self._clock()
        found = [d for d in self.standing if d.live(moment)]
        if self.stored is not None:
            found += list(await self.stored.live(moment))
        handed: list[Handed] = []
        for delegation in found:
            delegator = await self.people.person(delegation.delegator)
            delegate = await self.people.person(delegation.delegate)
            if delegator.key != delegate.key:
                handed.append(Handed(delegation, delegator, delegate))
        return handed

    async def delegators_of(self, person: Person, at: datetime | None = None) -> list[Handed]:
        """Those who handed their reviews to `person`, as live delegations (each delegator
        once, the first delegation found). Raises `StoreError`, `IdentityUnavailable`."""
        seen: set[str] = set()
        found: list[Handed] = []
        for handed in await self.live(at):
            if handed.delegate.key == person.key and handed.delegator.key not in seen:
                seen.add(handed.delegator.key)
                found.append(handed)
        return found

    async def delegates_of(self, person: Person, at: datetime | None = None) -> list[Person]:
        """Who decides for `person` at `at` (now by default): the delegates of their live
        delegations, for escalations and reminders to reach while they are away. Raises
        `StoreError`, `IdentityUnavailable`."""
        seen: set[str] = set()
        found: list[Person] = []
        for handed in await self.live(at):
            if handed.delegator.key == person.key and handed.delegate.key not in seen:
                seen.add(handed.delegate.key)
                found.append(handed.delegate)
        return found

    async def linked(self, at: datetime | None = None) -> set[frozenset[str]]:
        """The pairs of person keys one live delegation joins (delegator and delegate): for a
        review's quorum the two are one voice while it lasts. Raises `StoreError`,
        `IdentityUnavailable`."""
        return {
            frozenset((handed.delegator.key, handed.delegate.key)) for handed in await self.live(at)
        }
