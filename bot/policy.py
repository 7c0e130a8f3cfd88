"""The configuration's rules as the executor's approval port.

Every call is put to `RulesPort`, and the first rule of the file that matches it decides:

| first matching rule     | the call                                                    |
|-------------------------|-------------------------------------------------------------|
| none                    | runs without review                                         |
| `decision: approve`     | runs, decided by `nodbot:rules.<n>`                         |
| `decision: deny`        | is denied, with the rule's description as the reason        |
| `reviewers: [...]`      | waits in the store for a person (`DeferredApproval`), until  |
|                         | the rule's `timeout`, when `expire_due` applies its          |
|                         | `timeout_decision`                                          |

`<n>` is the rule's position in the file (from 0), as in the configuration's error messages.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from bot.config import Config, Rule
from core import (
    ApprovalRecord,
    ApprovalRequest,
    ApprovalStore,
    Decided,
    Decision,
    DeferredApproval,
    Executor,
    InterruptRule,
    PortAnswer,
    ToolRegistry,
)
from core.store import utc_now

__all__ = ["SELF_APPROVAL_REASON", "RulesPort", "authorize_by_rules", "rules_executor"]

SELF_APPROVAL_REASON = "you started this run, so you may not approve its calls"

NO_RULE = "nodbot:no-rule"
"""Who `decided` a call that no rule covers: nobody had to."""


class RulesPort(DeferredApproval):
    """A deferred approval port with the rules of `config` in front: reviews wait in `store`
    (so `Executor.decide` works as with `DeferredApproval`), the rest is decided at once."""

    def __init__(
        self, config: Config, store: ApprovalStore, *, clock: Callable[[], datetime] = utc_now
    ) -> None:
        super().__init__(store)
        self.config = config
        self._clock = clock

    async def request(self, request: ApprovalRequest) -> PortAnswer:
        for index, rule in enumerate(self.config.rules):
            if not rule.covers(request.tool, request.arguments):
                continue
            by = f"nodbot:rules.{index}"
            if rule.decision == "approve":
                return Decided(Decision(approved=True, reason=rule.description, decided_by=by))
            if rule.decision == "deny":
                reason = rule.description or f"denied by rule {index} of the configuration"
                return Decided(Decision(approved=False, reason=reason, decided_by=by))
            request = replace(
                request,
                policy=self._policy(index, rule),
                approvals_required=rule.approvals_required,
            )
            if rule.timeout is not None:
                # Only a new review takes this deadline: an existing one keeps its own.
                deadline = self._clock() + timedelta(seconds=rule.timeout)
                request = replace(request, deadline=deadline, on_timeout=rule.timeout_decision)
            return await super().request(request)
        return Decided(Decision(approved=True, decided_by=NO_RULE))

    def _policy(self, index: int, rule: Rule) -> dict[str, Any]:
        """What the rule says about the review, kept with it for the channels."""
        reviewers = self.config.expand(rule.reviewers or [])
        escalation: dict[str, Any] = {}
        if rule.escalate_after is not None and rule.escalate_to is not None:
            at = self._clock() + timedelta(seconds=rule.escalate_after)
            escalation = {
                "escalate_at": at.isoformat(),
                "escalate_to": [r.text for r in self.config.expand(rule.escalate_to)],
            }
        return {
            **escalation,
            "rule": index,
            "description": rule.description,
            "reviewers": [reviewer.text for reviewer in reviewers],
            "post_to": None if rule.post_to is None else list(rule.post_to),
            "allowed_decisions": list(rule.allowed_decisions),
            "editable": None if rule.editable is None else list(rule.editable),
            "approvals_required": rule.approvals_required,
            "allow_self_approval": rule.allow_self_approval,
        }


def authorize_by_rules(
    principal: str,
    record: ApprovalRecord,
    decision: Decision,
    *,
    now: datetime | None = None,
) -> str | None:
    """Whether `principal` may make `decision` on `record`, by the policy its rule left with
    it: None to allow, or the reason to refuse. Reviewers are matched by their id or address
    (case-insensitively); members of Slack channels and user groups are checked in Slack.
    From the rule's `escalate_after` on, its `escalate_to` reviewers may decide too."""
    policy = record.request.policy
    action = "deny" if not decision.approved else "edit" if decision.edited_args else "approve"
    own = record.request.requested_by == principal
    if action != "deny" and own and not policy.get("allow_self_approval", False):
        return SELF_APPROVAL_REASON
    listed = list(policy.get("reviewers", []))
    escalate_at = policy.get("escalate_at")
    if escalate_at and (now or utc_now()) >= datetime.fromisoformat(escalate_at):
        listed += policy.get("escalate_to", [])
    reviewers = [str(reviewer).lower() for reviewer in listed]
    if reviewers and principal.lower() not in reviewers:
        return "you are not one of the reviewers of this call"
    allowed = policy.get("allowed_decisions")
    if allowed is not None and action not in allowed:
        return f"this call may not be decided with {action!r}; allowed: {', '.join(allowed)}"
    editable = policy.get("editable")
    if action == "edit" and editable is not None and decision.edited_args:
        fixed = sorted(set(decision.edited_args) - set(editable))
        if fixed:
            may = ", ".join(editable) or "nothing"
            return f"{', '.join(fixed)} may not be edited here (editable: {may})"
    return None


def rules_executor(
    registry: ToolRegistry,
    config: Config,
    store: ApprovalStore,
    *,
    clock: Callable[[], datetime] = utc_now,
) -> Executor:
    """An executor over `registry` that puts every call to the rules of `config`; `clock`
    dates the deadlines of new reviews."""
    every_call: Sequence[InterruptRule] = (InterruptRule(tool="*"),)
    return Executor(registry, approval=RulesPort(config, store, clock=clock), rules=every_call)
