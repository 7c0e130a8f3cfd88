"""The configuration's rules as the executor's approval port.

Every call is put to `RulesPort`, and the first rule of the file that matches it decides.
Rules judge the call's arguments as its tool's model validated them (`Judged`): the bot's
own tools' models, else the JSON schema the caller sent (checked strictly, defaults filled
in), else the values as given. A rule whose `when` cannot judge the call (a missing
argument, a value of another type, arguments that fail validation) fails closed by its
outcome: a review or deny rule matches, an approve rule does not (the next rule is tried),
and a remembered approval does not decide it.

| first matching rule     | the call                                                    |
|-------------------------|-------------------------------------------------------------|
| none                    | runs without review, unless its tool asks for review        |
|                         | (`confirm`): then it is reviewed under `defaults:`, or       |
|                         | denied (decided by `nodbot:no-rule`) without them            |
| `decision: approve`     | runs, decided by `nodbot:rules.<n>`                         |
| `decision: deny`        | is denied, with the rule's description as the reason        |
| `reviewers: [...]`      | waits in the store for a person (`DeferredApproval`), until  |
|                         | the rule's `timeout`, when `expire_due` applies its          |
|                         | `timeout_decision`; or is approved at once by a remembered   |
|                         | approval, when the reviewer who remembered it may still      |
|                         | approve this call (checked now, as a click would be)         |

`<n>` is the rule's position in the file (from 0), as in the configuration's error messages.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from nodbot.bot.config import Config
from nodbot.bot.config.models import ReviewPolicy
from nodbot.bot.metrics import METRICS
from nodbot.bot.policy.bounds import edit_refusal
from nodbot.bot.policy.remember import CHANNEL as REMEMBERED
from nodbot.bot.policy.remember import remembered_decision, rule_digest
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
    InvalidArgumentsError,
    PortAnswer,
    RunStore,
    ToolCall,
    ToolRegistry,
    merge_edit,
)
from nodbot.core.arguments_schema import judged_arguments
from nodbot.core.questions import QUESTION_TOOL, is_question
from nodbot.core.store import utc_now

if TYPE_CHECKING:
    from nodbot.bot.policy.authorize import Verdict

__all__ = [
    "SELF_APPROVAL_REASON",
    "Judged",
    "Ruled",
    "RulesPort",
    "authorize_by_rules",
    "rule_refusal",
    "rules_executor",
]

SELF_APPROVAL_REASON = "you started this run, so you may not approve its calls"

NO_RULE = "nodbot:no-rule"
"""Who `decided` a call that no rule covers: nobody had to."""

log = logging.getLogger(__name__)

Authorize = Callable[[str, ApprovalRecord, Decision], Awaitable["Verdict"]]
"""`(handle, record, decision) -> Verdict`: `bot.authorize.AuthorizeDecision`."""


@dataclass(frozen=True)
class Judged:
    """A call's arguments as the rules judge them (`RulesPort.judged`)."""

    values: Mapping[str, Any] | None
    """As the tool's model validated them (types coerced, defaults filled in); for a tool
    that runs elsewhere, as its caller's JSON schema checked them (defaults filled in), or as
    given without one. None when they failed that validation: no rule approves them."""


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
        authorize: Authorize | None = None,
        in_flight_wait: float | None = None,
        actor: str | None = None,
    ) -> None:
        super().__init__(store, actor=actor, in_flight_wait=in_flight_wait)
        self.config = config
        self._clock = clock
        self.registry = registry
        self._authorize = authorize
        """Checks the reviewer of a remembered approval before it decides a call (the bot's
        `Authorizer`); by default one of `config`'s `people:`, without Slack."""

    async def request(self, request: ApprovalRequest) -> PortAnswer:
        # The executor's: its arguments are the tool's model's validated ones already.
        ruled = await self.rule(request, judged=Judged(request.arguments))
        if ruled.decision is None:
            return METRICS.taken_by_run(ruled.request, await super().request(ruled.request))
        if ruled.evidence is None:
            # Recorded nowhere else (the outbox logs the decisions it records); a call that
            # needs no review is not one: the run's step says it ran.
            decision = ruled.decision
            if not (decision.decided_by == NO_RULE and decision.approved):
                METRICS.ruled(request.tool, decision)
                log.info(
                    "decision",
                    extra={
                        "run_id": request.run_id,
                        "tool": request.tool,
                        "call_id": request.call_id,
                        "action": "approve" if decision.approved else "deny",
                        "decided_by": decision.decided_by,
                        "channel": "rules",
                    },
                )
            return Decided(decision)
        # Remembered: recorded as a review of its own, decided at once, then taken.
        record = await self.store.create(ruled.request)
        if record.decision is None:
            with contextlib.suppress(ApprovalAlreadyDecided):
                decided = await self.store.decide(
                    record.approval_id,
                    ruled.decision,
                    channel=REMEMBERED,
                    evidence=ruled.evidence,
                )
                METRICS.decided(decided, REMEMBERED)
        return METRICS.taken_by_run(ruled.request, await super().request(ruled.request))

    async def open_review(
        self, request: ApprovalRequest, *, judged: Judged | None = None
    ) -> tuple[ApprovalRecord, bool]:
        """The stored record of a call of a tool that runs elsewhere (`POST /approvals`, a
        hosted agent's pause), as the rules make it: decided at once (and recorded so) or
        pending a review; and whether it was decided here. The call's active record is kept
        when there is one: the caller checks it is for the same tool and arguments. The
        rules judge `judged`, by default `judged(request)`."""
        ruled = await self.rule(request, judged=judged)
        record = await self.store.create(ruled.request)
        if ruled.decision is None or record.decision is not None:
            return record, False
        channel = "rules" if ruled.evidence is None else REMEMBERED
        with contextlib.suppress(ApprovalAlreadyDecided):  # the same rule, in a race
            decided = await self.store.decide(
                record.approval_id, ruled.decision, channel=channel, evidence=ruled.evidence
            )
            METRICS.decided(decided, channel)
        return await self.store.get(record.approval_id), True

    def judged(self, request: ApprovalRequest) -> Judged:
        """The call's arguments as the rules judge them (see `Judged`): validated by the
        model of the bot's own tool of that name, else checked against the JSON schema the
        caller kept with the review (`policy["schema"]`), else as given."""
        if self.registry is not None and request.tool in self.registry:
            try:
                validated = self.registry.get(request.tool).validate(request.arguments)
            except InvalidArgumentsError:
                return Judged(None)
            return Judged(validated.canonical)
        schema = request.policy.get("schema")
        if isinstance(schema, dict):
            return Judged(judged_arguments(schema, request.arguments))
        return Judged(dict(request.arguments))

    async def rule(self, request: ApprovalRequest, *, judged: Judged | None = None) -> Ruled:
        """What the rules make of a call: a decision at once (by a rule, or by a reviewer's
        remembered approval), or the request as it is to wait for review (with its rule's
        policy, deadline and approvals required). The rules judge `judged`, by default
        `judged(request)`."""
        if is_question(request):
            return self._question(request)
        arguments = (judged or self.judged(request)).values
        found = self.config.rule_for(request.tool, arguments)
        if found is not None:
            index, rule, certain = found
            by = f"nodbot:rules.{index}"
            if rule.decision == "approve":  # `certain`: an approve rule takes no other
                return Ruled(
                    request, Decision(approved=True, reason=rule.description, decided_by=by)
                )
            if rule.decision == "deny":
                reason = rule.description or f"denied by rule {index} of the configuration"
                return Ruled(request, Decision(approved=False, reason=reason, decided_by=by))
            # A call the rule holds only by failing closed is not one a reviewer approved
            # before: no remembered approval decides it.
            return await self._reviewed(request, index, rule, remembered=certain)
        if arguments is None:
            asks: str | None = "its arguments fail validation"
        else:
            asks = await self._asks_for_review(request, arguments)
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

    def _question(self, request: ApprovalRequest) -> Ruled:
        """A question (`core.questions`) waits for the people of the first review rule that
        covers the pseudo-tool `ask` (`tool: ask` or `*`; its `when` judges the question's
        `question`, `choices` and `asked_by`), else of `defaults:`. Rules that decide at
        once are passed over: a question needs a person. With nobody to ask, it is declined
        at once (decided by `nodbot:no-rule`), and `ask` raises with the reason."""
        for index, rule in enumerate(self.config.rules):
            if rule.decision is None and rule.covers(QUESTION_TOOL, request.arguments):
                return Ruled(self._asked(request, index, rule))
        if self.config.defaults is not None:
            return Ruled(self._asked(request, "defaults", self.config.defaults))
        file = self.config.source_file or "the configuration"
        reason = (
            f"nobody can be asked: no rule of {file} names reviewers for questions (add a "
            f"rule with tool: {QUESTION_TOOL} and reviewers, or a defaults: section)"
        )
        return Ruled(request, Decision(approved=False, reason=reason, decided_by=NO_RULE))

    def _asked(
        self, request: ApprovalRequest, index: int | str, rule: ReviewPolicy
    ) -> ApprovalRequest:
        """A question as it waits under `rule`: its people and places, deadline and
        escalation; answered once, by one person (one answer wins), with an answer or a
        decline (`respond`, `deny`); a timeout declines it. Nothing is remembered or
        edited."""
        waiting = self._review(request, index, rule)
        kept = ("remember", "remember_by", "rule_digest", "edit_bounds")
        policy = {key: value for key, value in waiting.policy.items() if key not in kept}
        policy.update(allowed_decisions=["respond", "deny"], editable=[], approvals_required=1)
        return replace(waiting, policy=policy, approvals_required=1, on_timeout="deny")

    async def _reviewed(
        self,
        request: ApprovalRequest,
        index: int | str,
        rule: ReviewPolicy,
        *,
        remembered: bool = True,
    ) -> Ruled:
        """The call under a review rule: approved by a remembered approval it matches (when
        `remembered`, and its reviewer may approve this call now), else waiting for
        review."""
        waiting = self._review(request, index, rule)
        found = await remembered_decision(self.store, waiting) if remembered else None
        if found is None:
            return Ruled(waiting)
        decision, evidence = found
        refusal = await self._remembered_refusal(waiting, decision, evidence)
        if refusal is None:
            return Ruled(waiting, decision, evidence)
        log.warning(
            "a remembered approval was not used: %s",
            refusal,
            extra={
                "run_id": request.run_id,
                "tool": request.tool,
                "decided_by": decision.decided_by,
                "remembered": evidence.get("remembered"),
            },
        )
        # Kept with the review, so that its reviewers and the audit trail see why it waits.
        unused = {"remembered": evidence.get("remembered"), "reason": refusal}
        return Ruled(replace(waiting, policy={**waiting.policy, "remembered_unused": unused}))

    async def _remembered_refusal(
        self, waiting: ApprovalRequest, decision: Decision, evidence: Mapping[str, Any]
    ) -> str | None:
        """Why the reviewer who remembered an approval may not approve this call now, as
        if they clicked Approve on it (self-approval, the rule's reviewers as the file has
        them now, people, groups, channels): None when they may. Channels are checked
        against where the review they remembered it in was posted: the same rule's
        places."""
        assert decision.decided_by is not None
        record = ApprovalRecord(
            approval_id=str(evidence.get("from_review", "")),
            request=waiting,
            created_at=self._clock(),
        )
        verdict = await self._authorizer()(decision.decided_by, record, decision)
        return verdict.refusal

    def _authorizer(self) -> Authorize:
        if self._authorize is None:
            # Imported here: `bot.authorize` imports this module.
            from nodbot.bot.policy.authorize import authorizer_for

            runs = self.store if isinstance(self.store, RunStore) else None
            self._authorize = authorizer_for(self.config, runs=runs)
        return self._authorize

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

    async def _asks_for_review(
        self, request: ApprovalRequest, arguments: Mapping[str, Any]
    ) -> str | None:
        """Why the call's tool asks for review (its `confirm`), or None when it does not.
        Fails closed: no registry, an unknown tool or a confirm rule that raises asks. A
        confirm rule is asked as `Executor.needs_review` asks it, with the validated
        `arguments`, the run's id and requester in its context (no metadata: the port does
        not see it)."""
        if self.registry is None or request.tool not in self.registry:
            return "its confirm cannot be read here"
        tool = self.registry.get(request.tool)
        if isinstance(tool.confirm, bool):
            return "confirm=True" if tool.confirm else None
        probe = Executor(self.registry)  # no rules: it asks the tool's confirm alone
        call = ToolCall.model_construct(
            name=request.tool, arguments=dict(arguments), id=request.call_id
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
        reminding: dict[str, Any] = {}
        if rule.remind_every is not None:
            reminding = {"remind_every": rule.remind_every, "remind_limit": rule.remind_limit}
        return {
            **escalation,
            **remembering,
            **reminding,
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
    `escalate_after` on, its `escalate_to` reviewers may decide too. Whoever asked for the
    call (its requester, and the API token that asked for it, `requested_with`) may not
    approve it unless the rule allows self-approval."""
    policy = record.request.policy
    asked_by = (record.request.requested_by, policy.get("requested_with"))
    own = any(isinstance(who, str) and who.lower() == principal.lower() for who in asked_by)
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
    of its bounds). A respond (an answer in the tool's place) is allowed only by a rule that
    lists it: a review whose policy names no `allowed_decisions` refuses it."""
    policy = record.request.policy
    action = "deny" if not decision.approved else "edit" if decision.edited_args else "approve"
    if decision.response is not None:
        action = "respond"
    allowed = policy.get("allowed_decisions")
    if is_question(record.request):
        # Whatever policy it was stored with: a question is answered or declined.
        if decision.approved:
            return f"a question is answered or declined, not decided with {action!r}"
        allowed = ["respond", "deny"]
    listed = allowed is not None or action == "respond"
    if listed and action not in (allowed or []):
        may = ", ".join(allowed or ["approve", "edit", "deny"])
        return f"this call may not be decided with {action!r}; allowed: {may}"
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
    authorize: Authorize | None = None,
    worker: str | None = None,
) -> Executor:
    """An executor over `registry` that puts every call to the rules of `config`, for the
    steps of durable runs; `clock` dates the deadlines of new reviews, `authorize` checks
    the reviewers of remembered approvals (`RulesPort`). A call found in flight (an earlier
    step of its run consumed its decision and kept no result yet) is waited for for one
    `workers.lease` before it is denied (`DeferredApproval`'s `in_flight_wait`); `worker`
    (unique to the process) consumes the decisions, so that a claim whose answer was lost
    is known for this worker's own."""
    every_call: Sequence[InterruptRule] = (InterruptRule(tool="*"),)
    port = RulesPort(
        config,
        store,
        clock=clock,
        registry=registry,
        authorize=authorize,
        in_flight_wait=float(config.workers.lease),
        actor=worker,
    )
    return Executor(registry, approval=port, rules=every_call)
