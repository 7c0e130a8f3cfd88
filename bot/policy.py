"""The configuration's rules as the executor's approval port.

Every call is put to `RulesPort`, and the first rule of the file that matches it decides:

| first matching rule     | the call                                                    |
|-------------------------|-------------------------------------------------------------|
| none                    | runs without review, unless its tool asks for review        |
|                         | (`confirm`): then it is reviewed under `defaults:`, or       |
|                         | denied (decided by `nodbot:no-rule`) without them            |
| `decision: approve`     | runs, decided by `nodbot:rules.<n>`                         |
| `decision: deny`        | is denied, with the rule's description as the reason        |
| `reviewers: [...]`      | waits in the store for a person (`DeferredApproval`), until  |
|                         | the rule's `timeout`, when `expire_due` applies its          |
|                         | `timeout_decision`                                          |

`<n>` is the rule's position in the file (from 0), as in the configuration's error messages.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from nodbot.bot.bounds import edit_refusal
from nodbot.bot.config import Config
from nodbot.bot.config.models import ReviewPolicy
from nodbot.bot.remember import CHANNEL as REMEMBERED
from nodbot.bot.remember import remembered_decision, rule_digest
from nodbot.core import (
    ApprovalAlreadyDecided,
    ApprovalRecord,
    ApprovalRequest,
    ApprovalStore,
    Decided,
    Decision,
    DeferredApproval,
    Executor,
    InterruptRule,
    PortAnswer,
    ToolCall,
    ToolRegistry,
    merge_edit,
)
from nodbot.core.store import utc_now

__all__ = [
    "SELF_APPROVAL_REASON",
    "Ruled",
    "RulesPort",
    "authorize_by_rules",
    "rule_refusal",
    "rules_executor",
]

SELF_APPROVAL_REASON = "you started this run, so you may not approve its calls"

NO_RULE = "nodbot:no-rule"
"""Who `decided` a call that no rule covers: nobody had to."""


@dataclass(frozen=True)
class Ruled:
    """What the rules made of a call (`RulesPort.rule`)."""

    request: ApprovalRequest
    """The call as it is recorded: with its rule's policy, deadline and approvals required
    when it is reviewed."""
    decision: Decision | None = None
    """The decision made at once (by a rule, or by a remembered approval); None: the call
    waits for review."""
    evidence: dict[str, Any] | None = None
    """For a remembered approval: which one and the review it came from (the decision is then
    recorded as a review of its own, channel `remembered`)."""


class RulesPort(DeferredApproval):
    """A deferred approval port with the rules of `config` in front: reviews wait in `store`
    (so `Executor.decide` works as with `DeferredApproval`), the rest is decided at once.
    `registry` holds the tools, whose `confirm` says whether a call no rule covers needs a
    review; without it, every such call is taken to need one."""

    def __init__(
        self,
        config: Config,
        store: ApprovalStore,
        *,
        clock: Callable[[], datetime] = utc_now,
        registry: ToolRegistry | None = None,
    ) -> None:
        super().__init__(store)
        self.config = config
        self._clock = clock
        self.registry = registry

    async def request(self, request: ApprovalRequest) -> PortAnswer:
        ruled = await self.rule(request)
        if ruled.decision is None:
            return await super().request(ruled.request)
        if ruled.evidence is None:
            return Decided(ruled.decision)
        # Remembered: recorded as a review of its own, decided at once, then taken.
        record = await self.store.create(ruled.request)
        if record.decision is None:
            with contextlib.suppress(ApprovalAlreadyDecided):
                await self.store.decide(
                    record.approval_id,
                    ruled.decision,
                    channel=REMEMBERED,
                    evidence=ruled.evidence,
                )
        return await super().request(ruled.request)

    async def open_review(self, request: ApprovalRequest) -> tuple[ApprovalRecord, bool]:
        """The stored record of a call of a tool that runs elsewhere (`POST /approvals`, a
        hosted agent's pause), as the rules make it: decided at once (and recorded so) or
        pending a review; and whether it was decided here. The call's active record is kept
        when there is one: the caller checks it is for the same tool and arguments."""
        ruled = await self.rule(request)
        record = await self.store.create(ruled.request)
        if ruled.decision is None or record.decision is not None:
            return record, False
        channel = "rules" if ruled.evidence is None else REMEMBERED
        with contextlib.suppress(ApprovalAlreadyDecided):  # the same rule, in a race
            await self.store.decide(
                record.approval_id, ruled.decision, channel=channel, evidence=ruled.evidence
            )
        return await self.store.get(record.approval_id), True

    async def rule(self, request: ApprovalRequest) -> Ruled:
        """What the rules make of a call: a decision at once (by a rule, or by a reviewer's
        remembered approval), or the request as it is to wait for review (with its rule's
        policy, deadline and approvals required)."""
        for index, rule in enumerate(self.config.rules):
            if not rule.covers(request.tool, request.arguments):
                continue
            by = f"nodbot:rules.{index}"
            if rule.decision == "approve":
                return Ruled(
                    request, Decision(approved=True, reason=rule.description, decided_by=by)
                )
            if rule.decision == "deny":
                reason = rule.description or f"denied by rule {index} of the configuration"
                return Ruled(request, Decision(approved=False, reason=reason, decided_by=by))
            return await self._reviewed(request, index, rule)
        asks = await self._asks_for_review(request)
        if asks is None:
            return Ruled(request, Decision(approved=True, decided_by=NO_RULE))
        if self.config.defaults is not None:
            return await self._reviewed(request, "defaults", self.config.defaults)
        file = self.config.source_file or "the configuration"
        reason = (
            f"{request.tool} asks for review ({asks}) and no rule of {file} covers it: "
            f"add a rule for {request.tool} or a defaults: section"
        )
        return Ruled(request, Decision(approved=False, reason=reason, decided_by=NO_RULE))

    async def _reviewed(
        self, request: ApprovalRequest, index: int | str, rule: ReviewPolicy
    ) -> Ruled:
        """The call under a review rule: approved by a remembered approval it matches, else
        waiting for review."""
        waiting = self._review(request, index, rule)
        remembered = await remembered_decision(self.store, waiting)
        if remembered is not None:
            return Ruled(waiting, remembered[0], remembered[1])
        return Ruled(waiting)

    def _review(
        self, request: ApprovalRequest, index: int | str, rule: ReviewPolicy
    ) -> ApprovalRequest:
        """The call as it waits in the store under `rule` (a rule of the file, or the
        defaults). What the caller said of the call (`call_description`, from a tool that
        runs elsewhere) is the description reviewers see when the rule has none."""
        policy = {**request.policy, **self._policy(index, rule)}
        if not policy.get("description") and request.policy.get("call_description"):
            policy["description"] = request.policy["call_description"]
        request = replace(request, policy=policy, approvals_required=rule.approvals_required)
        if rule.timeout is not None:
            # Only a new review takes this deadline: an existing one keeps its own.
            deadline = self._clock() + timedelta(seconds=rule.timeout)
            request = replace(request, deadline=deadline, on_timeout=rule.timeout_decision)
        return request

    async def _asks_for_review(self, request: ApprovalRequest) -> str | None:
        """Why the call's tool asks for review (its `confirm`), or None when it does not.
        Fails closed: no registry, an unknown tool or a confirm rule that raises asks. A
        confirm rule is asked as `Executor.needs_review` asks it, with the run's id and
        requester in its context (no metadata: the port does not see it)."""
        if self.registry is None or request.tool not in self.registry:
            return "its confirm cannot be read here"
        tool = self.registry.get(request.tool)
        if isinstance(tool.confirm, bool):
            return "confirm=True" if tool.confirm else None
        probe = Executor(self.registry)  # no rules: it asks the tool's confirm alone
        call = ToolCall.model_construct(
            name=request.tool, arguments=dict(request.arguments), id=request.call_id
        )
        ctx = probe.context(request.run_id, requested_by=request.requested_by)
        if await probe.needs_review(tool, call, ctx):
            return "its confirm rule asks for this call"
        return None

    def _policy(self, index: int | str, rule: ReviewPolicy) -> dict[str, Any]:
        """What the rule (or the defaults, `index` "defaults") says about the review, kept
        with it for the channels."""
        reviewers = self.config.expand(rule.reviewers or [])
        escalation: dict[str, Any] = {}
        if rule.escalate_after is not None and rule.escalate_to is not None:
            at = self._clock() + timedelta(seconds=rule.escalate_after)
            escalation = {
                "escalate_at": at.isoformat(),
                "escalate_to": [r.text for r in self.config.expand(rule.escalate_to)],
            }
        bounds: dict[str, Any] = {}
        if rule.edit_bounds is not None:
            bounds = {"edit_bounds": [bound.to_json() for bound in rule.edit_bounds]}
        remembering: dict[str, Any] = {}
        if rule.remember is not None:
            remembering = {
                "remember": rule.remember,
                "remember_by": None if rule.remember_by is None else list(rule.remember_by),
                "rule_digest": rule_digest(rule),
            }
        return {
            **escalation,
            **remembering,
            "rule": index,
            "description": rule.description,
            "reviewers": [reviewer.text for reviewer in reviewers],
            "post_to": None if rule.post_to is None else list(rule.post_to),
            "allowed_decisions": list(rule.allowed_decisions),
            "editable": None if rule.editable is None else list(rule.editable),
            "approvals_required": rule.approvals_required,
            "allow_self_approval": rule.allow_self_approval,
            **bounds,
        }


def authorize_by_rules(
    principal: str,
    record: ApprovalRecord,
    decision: Decision,
    *,
    now: datetime | None = None,
) -> str | None:
    """Whether `principal` may make `decision` on `record`, by the policy its rule left with
    it, comparing handles as written: None to allow, or the reason to refuse. The bot's
    channels use `bot.authorize.Authorizer`, which compares persons instead (a Slack user id
    and the address Slack holds for it are one reviewer) and asks Slack about user groups and
    channels; this is the check for code that has no directory of people. From the rule's
    `escalate_after` on, its `escalate_to` reviewers may decide too."""
    policy = record.request.policy
    requester = record.request.requested_by
    own = requester is not None and requester.lower() == principal.lower()
    if decision.approved and own and not policy.get("allow_self_approval", False):
        return SELF_APPROVAL_REASON
    listed = list(policy.get("reviewers", []))
    escalate_at = policy.get("escalate_at")
    if escalate_at and (now or utc_now()) >= datetime.fromisoformat(escalate_at):
        listed += policy.get("escalate_to", [])
    reviewers = [str(reviewer).lower() for reviewer in listed]
    if reviewers and principal.lower() not in reviewers:
        return "you are not one of the reviewers of this call"
    return rule_refusal(record, decision)


def rule_refusal(record: ApprovalRecord, decision: Decision) -> str | None:
    """What the review's rule says of `decision` whoever makes it: None to allow, or the
    reason to refuse (a decision the rule does not allow, an argument it keeps, an edit out
    of its bounds)."""
    policy = record.request.policy
    action = "deny" if not decision.approved else "edit" if decision.edited_args else "approve"
    allowed = policy.get("allowed_decisions")
    if allowed is not None and action not in allowed:
        return f"this call may not be decided with {action!r}; allowed: {', '.join(allowed)}"
    editable = policy.get("editable")
    if action == "edit" and editable is not None and decision.edited_args:
        fixed = sorted(set(decision.edited_args) - set(editable))
        if fixed:
            may = ", ".join(editable) or "nothing"
            return f"{', '.join(fixed)} may not be edited here (editable: {may})"
    original = record.request.arguments
    # Bounds hold what an edit changes: one that changes nothing runs the call as asked, as
    # an approval would (and the inbox probes with such an edit whether editing is open).
    changes = action == "edit" and merge_edit(original, decision.edited_args or {}) != original
    if changes and (out := edit_refusal(policy, original, decision.edited_args)):
        return out
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
    port = RulesPort(config, store, clock=clock, registry=registry)
    return Executor(registry, approval=port, rules=every_call)
