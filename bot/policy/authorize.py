"""Who may decide a review: the policy its rule left with it, with every handle resolved to a
person first (`bot.people`), the same on every channel (Slack, the web inbox, the API, the CLI).

`Authorizer.check(handle, record, decision)` answers a `Verdict`: the person the handle
stands for, and the reason to refuse (None to allow). In order:

1. the handle is resolved to a person; a lookup that fails refuses ("try again");
2. self-approval: the run's requester, whoever started the run for them (a token with
   `runs:write-as`, kept as the run's `started_by`) and the API token that asked for a call
   of an external tool (`POST /approvals`, kept as `requested_with`), resolved too, may deny
   but not approve or edit, unless the rule allows it; when the run cannot be read, the
   approval is refused ("try again");
3. the rule's reviewers (and, from `escalate_after` on, `escalate_to`): Slack users and email
   addresses match by person; user groups by the person's Slack users among the group's
   members; channels by membership of a channel the review was posted to. A check of a
   reviewer that cannot be made (Slack failing) refuses with a reason saying so, unless
   another reviewer entry matched;
4. delegation (`bot.policy.delegation`): someone who is no reviewer of the call may decide
   it for a reviewer who handed them their reviews, by a delegation live now, when that
   reviewer could (steps 2 and 3 for the delegator: their reviews, never their own runs);
   the verdict then names whom for (`Verdict.for_person`), and the channel records it with
   the decision (`Verdict.evidence`). Delegations do not chain. When they cannot be read
   (the store failing), a delegate may not decide;
5. the rest of the rule, the same for everyone (`bot.policy.rule_refusal`): allowed
   decisions, editable arguments, bounds of edits;
6. quorum by person: on a review that needs several approvals, an approval by a delegate
   for someone, or by someone whose delegate (or delegator) approved already, is refused:
   a delegator and their delegate are one voice while a delegation joins them (one
   person's own approvals under two handles are the store's to refuse, `ALREADY_VOTED`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeAlias

from aiohttp import ClientError
from slack_sdk.errors import SlackApiError

from nodbot.bot.config import Config, parse_reviewer
from nodbot.bot.config.values import Reviewer
from nodbot.bot.policy.delegation import Delegations, Handed
from nodbot.bot.policy.people import IdentityUnavailable, People, Person
from nodbot.bot.policy.rules import SELF_APPROVAL_REASON, Authorize, rule_refusal
from nodbot.bot.slack.directory import Directory
from nodbot.core import (
    ApprovalEvent,
    ApprovalRecord,
    Decision,
    RunNotFound,
    RunStore,
    StoreError,
)

if TYPE_CHECKING:
    from nodbot.bot.slack.channel import SlackChannel
from nodbot.core.questions import is_question
from nodbot.core.store import utc_now

__all__ = [
    "NOT_ASKED",
    "NOT_A_REVIEWER",
    "AuthorizeDecision",
    "Authorizer",
    "PostedChannels",
    "StartedBy",
    "Verdict",
    "authorizer_for",
]

log = logging.getLogger(__name__)

NOT_A_REVIEWER = "you are not one of the reviewers of this call"
NOT_ASKED = "you are not one of the reviewers of this question"
"""`NOT_A_REVIEWER` for a question (`core.questions`)."""

ONE_VOICE = (
    "an approval of this call counts already for you or for whom you decide (a delegation "
    "joins you): one person's approval counts once"
)

Events = Callable[[str], Awaitable[Sequence[ApprovalEvent]]]
"""`(approval id) -> its events`. Raises `StoreError`."""

StartedBy = Callable[[ApprovalRecord], Awaitable[str | None]]
"""`(record) -> who started its run for its requester`, None when nobody else did. Raises
`StoreError` when that cannot be read."""

AuthorizeDecision: TypeAlias = Authorize
"""`(handle, record, decision) -> Verdict`: what every channel asks before recording a
decision (an `Authorizer`, or a test's own)."""

PostedChannels = Callable[[ApprovalRecord, str], Awaitable[set[str]]]
"""`(record, channel reviewer as written) -> ids of the channels the review was posted to for
it`."""


@dataclass(frozen=True)
class Verdict:
    """What `Authorizer.check` found."""

    person: str | None
    """The key of the person the handle stands for; None when it could not be told."""
    refusal: str | None
    """Why the decision is refused, or None when it is allowed."""
    for_person: str | None = None
    """The key of the person the decider decides for by a delegation; None when they decide
    as themselves."""
    for_handle: str | None = None
    """That person's handle, as their delegation names it."""

    @property
    def allowed(self) -> bool:
        """Whether the decision may be recorded."""
        return self.refusal is None

    def evidence(self, evidence: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The channel's `evidence` of the decision, with whom it is made for when the
        decider decides for someone else (`for`, `for_person`): the audit says "bob for
        ana"."""
        found = dict(evidence or {})
        if self.for_person is not None:
            found["for"] = self.for_handle or self.for_person
            found["for_person"] = self.for_person
        return found


class Authorizer:
    """Checks deciders against reviews' policies, person by person (see the module)."""

    def __init__(
        self,
        people: People | None = None,
        *,
        posted_channels: PostedChannels | None = None,
        started_by: StartedBy | None = None,
        delegations: Delegations | None = None,
        events: Events | None = None,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self.people = people or People()
        self.posted_channels = posted_channels
        self.started_by = started_by
        self.delegations = delegations
        """Who decides for whom (`bot.policy.delegation`); None: nobody for anyone."""
        self.events = events
        """Reads a review's votes, for quorum by person across delegations."""
        self._clock = clock

    @property
    def directory(self) -> Directory | None:
        """Slack's directory, when the bot has Slack."""
        return self.people.directory

    async def __call__(self, handle: str, record: ApprovalRecord, decision: Decision) -> Verdict:
        return await self.check(handle, record, decision)

    async def check(self, handle: str, record: ApprovalRecord, decision: Decision) -> Verdict:
        """Whether `handle` may make `decision` on `record` (see the module)."""
        try:
            person = await self.people.person(handle)
        except IdentityUnavailable as exc:
            return Verdict(None, str(exc))
        handed: Handed | None = None
        try:
            refusal, handed = await self._refusal(person, record, decision)
            if refusal is None:
                refusal = await self._quorum_refusal(person, handed, record, decision)
        except IdentityUnavailable as exc:
            refusal = str(exc)
        if handed is None or refusal is not None:
            return Verdict(person.key, refusal)
        return Verdict(
            person.key,
            None,
            for_person=handed.delegator.key,
            for_handle=handed.delegation.delegator,
        )

    async def _refusal(
        self, person: Person, record: ApprovalRecord, decision: Decision
    ) -> tuple[str | None, Handed | None]:
        """Why `person` may not make `decision`, and the delegation they make it by (None:
        as themselves)."""
        own = await self._self_refusal(person, record, decision)
        if own is not None:
            return own, None
        listed = self._listed_now(record)
        handed: Handed | None = None
        if listed:
            refusal = await self._reviewer_refusal(person, record, listed)
            if refusal is not None:
                handed, why = await self._for_whom(person, record, decision, listed)
                if handed is None:
                    return why or refusal, None
        return rule_refusal(record, decision), handed

    async def _self_refusal(
        self, person: Person, record: ApprovalRecord, decision: Decision
    ) -> str | None:
        """Why `person` may not approve a call they asked for (step 2), or None."""
        policy = record.request.policy
        if decision.approved and not policy.get("allow_self_approval", False):
            try:
                starter = await self.started_by(record) if self.started_by else None
            except StoreError as exc:
                return f"could not check who started this run ({exc.kind}); try again in a moment"
            asker = policy.get("requested_with")
            for handle in (record.request.requested_by, starter, asker):
                if not isinstance(handle, str) or not handle:
                    continue
                if (await self.people.person(handle)).key == person.key:
                    return SELF_APPROVAL_REASON
        return None

    def _listed_now(self, record: ApprovalRecord) -> list[str]:
        """The review's reviewers now: its rule's, and `escalate_to` once it escalated."""
        policy = record.request.policy
        listed = [str(text) for text in policy.get("reviewers") or []]
        escalate_at = policy.get("escalate_at")
        if escalate_at and self._clock() >= datetime.fromisoformat(escalate_at):
            listed += [str(text) for text in policy.get("escalate_to") or []]
        return listed

    async def _reviewer_refusal(
        self, person: Person, record: ApprovalRecord, listed: list[str]
    ) -> str | None:
        """Why `person` is not among the `listed` reviewers (step 3), or None."""
        unchecked: list[str] = []
        if await self._listed(person, record, listed, unchecked):
            return None
        if unchecked:
            return (
                f"could not check whether you are among the reviewers "
                f"({'; '.join(unchecked)}); try again in a moment"
            )
        return NOT_ASKED if is_question(record.request) else NOT_A_REVIEWER

    async def _for_whom(
        self, person: Person, record: ApprovalRecord, decision: Decision, listed: list[str]
    ) -> tuple[Handed | None, str | None]:
        """The live delegation by which `person` may make `decision` for its delegator (step
        4), or None and, when delegations could not be read, why."""
        if self.delegations is None or not self.delegations.any_possible:
            return None, None
        try:
            handed = await self.delegations.delegators_of(person, self._clock())
        except StoreError as exc:
            why = f"could not check whose reviews are handed to you ({exc.kind})"
            return None, f"{why}; try again in a moment"
        for found in handed:
            delegator = found.delegator
            try:
                if await self._self_refusal(delegator, record, decision) is not None:
                    continue
                if await self._reviewer_refusal(delegator, record, listed) is None:
                    return found, None
            except IdentityUnavailable:
                continue  # not checked: not granted
        return None, None

    async def _quorum_refusal(
        self, person: Person, handed: Handed | None, record: ApprovalRecord, decision: Decision
    ) -> str | None:
        """Why the approval would count a person twice (step 6), or None."""
        if not decision.approved or record.request.approvals_required <= 1:
            return None
        if self.events is None or (handed is None and self.delegations is None):
            return None
        try:
            events = await self.events(record.approval_id)
            votes = [e for e in events if e.kind == "voted" and e.detail.get("action") != "deny"]
            if not votes:
                return None
            linked = await self.delegations.linked(self._clock()) if self.delegations else set()
        except StoreError as exc:
            return f"could not check the approvals so far ({exc.kind}); try again in a moment"
        mine = {person.key} | ({handed.delegator.key} if handed else set())
        for pair in linked:
            if pair & mine:
                mine |= pair
        for vote in votes:
            evidence = vote.detail.get("evidence")
            theirs = {vote.person} if vote.person else set()
            if isinstance(evidence, dict) and isinstance(evidence.get("for_person"), str):
                theirs.add(evidence["for_person"])
            if vote.person == person.key:
                continue  # their second vote, whoever for: the store refuses it (`ALREADY_VOTED`)
            if theirs & mine:
                return ONE_VOICE
        return None

    async def _listed(
        self, person: Person, record: ApprovalRecord, listed: list[str], unchecked: list[str]
    ) -> bool:
        """Whether `person` is one of the `listed` reviewers; the entries that could not be
        checked are added to `unchecked`."""
        for text in listed:
            reviewer = _reviewer(text)
            if reviewer is None:
                continue
            try:
                if await self._matches(person, reviewer, record):
                    return True
            except IdentityUnavailable as exc:
                unchecked.append(exc.why)
            except SlackApiError as exc:
                unchecked.append(f"Slack answered {exc.response.get('error')} for {text}")
            except (TimeoutError, ClientError, OSError) as exc:
                unchecked.append(f"Slack could not be reached for {text}: {exc!r}")
        return False

    async def _matches(self, person: Person, reviewer: Reviewer, record: ApprovalRecord) -> bool:
        if reviewer.kind in ("slack_user", "email"):
            return (await self.people.person(reviewer.value)).key == person.key
        directory = self.directory
        if directory is None:
            return False  # user groups and channels are Slack's to say
        if reviewer.kind == "slack_user_group":
            members = set(await directory.group_members(reviewer.value))
            return bool(members & await self.people.slack_ids(person))
        if reviewer.kind == "slack_channel" and self.posted_channels is not None:
            users = await self.people.slack_ids(person)
            if not users:
                return False
            for channel in sorted(await self.posted_channels(record, reviewer.text)):
                if users & set(await directory.channel_members(channel)):
                    return True
        return False


def authorizer_for(
    config: Config, slack: SlackChannel | None = None, *, runs: RunStore | None = None
) -> Authorizer:
    """The authorizer of a bot with `config`: its `people:`, Slack's directory and posts
    when it has the Slack channel, the starters of the runs in `runs` and, when `runs` is
    the store, its delegations (with the configuration's) and votes."""
    started_by = _starter_in(runs) if runs is not None else None
    events = getattr(runs, "events", None)
    if slack is None:
        people = People(config.people)
        delegations = Delegations.of(config, people, runs)
        return Authorizer(people, started_by=started_by, delegations=delegations, events=events)
    people = People(config.people, directory=slack.directory, ttl=slack.config.cache_ttl)
    return Authorizer(
        people,
        posted_channels=slack.posted_channels,
        started_by=started_by,
        delegations=Delegations.of(config, people, runs),
        events=events,
    )


def _starter_in(runs: RunStore) -> StartedBy:
    async def started_by(record: ApprovalRecord) -> str | None:
        try:
            run = await runs.get_run(record.request.run_id)
        except RunNotFound:
            return None  # a run of an app of its own: nobody but its requester started it
        return run.started_by

    return started_by


def _reviewer(text: str) -> Reviewer | None:
    try:
        return parse_reviewer(text)
    except ValueError:
        log.warning("reviewer %r of a stored review is not understood; skipped", text)
        return None
