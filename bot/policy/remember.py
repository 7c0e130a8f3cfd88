"""Remembered approvals in the bot: a rule's `remember:` lets a reviewer approve "and
remember", and the rules then approve a later identical call at once (`policy.RulesPort`).

A remembered approval is scoped to the tool, the rule's text (`rule_digest`: a changed rule
forgets everything it remembered) and the call's arguments, or the ones the rule lists in
`remember_by`. The later call it approves is recorded as a review of its own, decided by the
reviewer who remembered (channel `remembered`), whose `decided` event names the remembered
approval and the review it was made in. `nodbot approvals remembered` lists them and
`nodbot approvals forget <id>` (or the inbox) ends one.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta
from typing import Any

from nodbot.bot.config.models import ReviewPolicy
from nodbot.core import ApprovalRecord, ApprovalRequest, Decision
from nodbot.core.remembered import RememberedApproval, RememberedApprovals, remember_scope
from nodbot.core.store import utc_now
from nodbot.core.tools import canonical_json

__all__ = [
    "CHANNEL",
    "NOT_REMEMBERED",
    "remember_decision",
    "remembered_decision",
    "remembered_of",
    "rule_digest",
    "scope_of",
]

CHANNEL = "remembered"
NOT_REMEMBERED = "this call's rule does not remember approvals (it has no remember:)"


def rule_digest(rule: ReviewPolicy) -> str:
    """The digest of the rule's text, as the configuration holds it."""
    # warnings=False: reviewer entries are dumped as their fields, which is all a digest needs.
    text = canonical_json(rule.model_dump(mode="json", exclude_unset=True, warnings=False))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def scope_of(request: ApprovalRequest) -> str | None:
    """The scope a remembered approval of `request` has (its policy says how), None when its
    rule remembers nothing."""
    policy = request.policy
    digest = policy.get("rule_digest")
    if not policy.get("remember") or not isinstance(digest, str):
        return None
    return remember_scope(request.tool, digest, _covered(request))


def remembered_of(store: object) -> RememberedApprovals | None:
    """The store's remembered approvals, when it keeps them."""
    found = getattr(store, "remembered", None)
    return found if isinstance(found, RememberedApprovals) else None


async def remember_decision(
    store: object, record: ApprovalRecord, *, person: str | None, now: datetime | None = None
) -> RememberedApproval:
    """Remember the approval `record` was decided with. Raises `ValueError` saying why it
    cannot be (no `remember:` on its rule, not approved, edited, a store without them)."""
    kept = remembered_of(store)
    scope = scope_of(record.request)
    decision = record.decision
    if scope is None:
        raise ValueError(NOT_REMEMBERED)
    if kept is None:
        raise ValueError("this store does not keep remembered approvals")
    if decision is None or not decision.approved or not decision.decided_by:
        raise ValueError("only an approval is remembered")
    if decision.edited_args:
        raise ValueError("an edited approval is not remembered: approve the call as it is")
    seconds = float(record.request.policy["remember"])
    return await kept.remember(
        scope=scope,
        tool=record.request.tool,
        arguments=_covered(record.request),
        rule=str(record.request.policy["rule_digest"]),
        decided_by=decision.decided_by,
        person=person,
        approval_id=record.approval_id,
        until=(now or utc_now()) + timedelta(seconds=seconds),
    )


async def remembered_decision(
    store: object, request: ApprovalRequest
) -> tuple[Decision, dict[str, Any]] | None:
    """The decision a live remembered approval makes of `request`, and the evidence its
    `decided` event keeps; None when none covers it."""
    scope = scope_of(request)  # first: most rules remember nothing, and that is cheap to see
    if scope is None:
        return None
    kept = remembered_of(store)  # an isinstance of a Protocol: tens of microseconds
    if kept is None:
        return None
    found = await kept.find(scope)
    if found is None:
        return None
    reason = f"remembered approval {found.remember_id}, from review {found.approval_id}"
    decision = Decision(approved=True, reason=reason, decided_by=found.decided_by)
    evidence = {"remembered": found.remember_id, "from_review": found.approval_id}
    return decision, evidence


def _covered(request: ApprovalRequest) -> dict[str, Any]:
    names = request.policy.get("remember_by")
    arguments = request.arguments
    if not isinstance(names, list):
        return dict(arguments)
    return {str(name): arguments.get(str(name)) for name in names}
