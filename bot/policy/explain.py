"""What the rules of a configuration make of one call, and why (`nodbot rules explain`).

The outcome is not worked out here: `explain` puts the call to a real `RulesPort` (over an
empty memory store, so no remembered approval decides it), the port that decides the bot's
live calls, with the same judging of the arguments (`RulesPort.judged`: the tool's model of
the bot's agent, else the caller's JSON schema, else the values as given). What is added is
the account of the rules the call passed on its way (each asked with `Rule.judge` and
`Rule.takes`, as `Config.rule_for` asks them), and the review's plan as the channels will
read it from the review's policy: who, where, until when, with which bounds and quorum.

Nothing is recorded and nobody is asked: Slack user groups and channels are shown as the
file writes them (Slack says who is in them when someone decides), and persons are compared
by `people:` alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, TypeAlias

from nodbot.bot.config import Config
from nodbot.bot.config.models import ReviewPolicy, Rule
from nodbot.bot.policy.people import People
from nodbot.bot.policy.rules import Judged, RulesPort
from nodbot.core import (
    ApprovalRequest,
    InvalidArgumentsError,
    MemoryApprovalStore,
    ToolRegistry,
    arguments_digest,
)
from nodbot.core.arguments_schema import schema_errors
from nodbot.core.rules import Predicate

__all__ = ["Explanation", "Outcome", "Passed", "ReviewPlan", "explain", "format_duration"]

Outcome: TypeAlias = Literal["approve", "deny", "review"]
"""What happens to the call: approved at once, denied at once, or reviewed by a person."""

NO_RULE = "nodbot:no-rule"
EXPLAIN_RUN = "nodbot-rules-explain"
"""The run and call id of the call put to the rules (nothing is recorded under it)."""


@dataclass(frozen=True)
class Passed:
    """A rule the call was put to before the one that took it (or every rule, when none did)."""

    rule: int
    """Its position in the file, from 0."""
    tool: str
    """The tool it names (`*`: every tool)."""
    when: str | None
    """Its `when`, as a short text (`amount > 100`); None without one."""
    kind: Outcome
    """What it does with the calls it takes."""
    verdict: Literal["other-tool", "false", "cannot-judge"]
    """Why it did not take the call: it names another tool; its `when` is false; its `when`
    cannot judge the call, and it is an approve rule, which never approves what it cannot
    judge (the call is passed to the next rule)."""
    why: str
    """The same in words, with what the predicate could not judge."""


@dataclass(frozen=True)
class ReviewPlan:
    """How a reviewed call is reviewed: the review's policy as its rule makes it."""

    reviewers: list[str]
    """Who may decide, groups of the file expanded (Slack user groups and channels as
    written: Slack says their members when someone decides)."""
    reviewers_as_written: list[str]
    """The rule's `reviewers`, `group:<name>` included."""
    slack: list[str] | None
    """Where the request is posted in Slack (`channel:#name`, `dm:<handle>`); None when the
    file has no `slack:`."""
    email: list[str] | None
    """The addresses the request is emailed to; None when the file has no `email:`."""
    inbox: bool
    """The review is in the web inbox of each reviewer (always)."""
    webhooks: list[str]
    """The webhooks told of the review opening (`approval.pending`)."""
    allowed_decisions: list[str]
    editable: list[str] | None
    """The arguments a reviewer may edit; None: every one (when edit is allowed)."""
    edit_bounds: list[dict[str, Any]] | None
    """What every edit must meet, as the file writes it."""
    approvals_required: int
    """How many persons must approve (N of M); any deny denies."""
    allow_self_approval: bool
    """Whether whoever started the run may approve its calls."""
    requester_reviews: bool | None
    """Whether the requester is one of `reviewers` (persons by `people:`); None without a
    requester."""
    timeout: int | None
    """Seconds the review may stay open; None: no limit."""
    timeout_decision: str | None
    """What a review that timed out becomes (decided_by `nodbot:timeout`)."""
    escalate_after: int | None
    escalate_to: list[str] | None
    """Who is asked too after `escalate_after` seconds, groups expanded."""
    remember: int | None
    """Seconds a reviewer's "approve and remember" holds; None: nothing is remembered."""
    remember_by: list[str] | None
    remind_every: int | None = None
    """Seconds between reminders to the reviewers who have not acted (when the rule says)."""
    remind_limit: int | None = None
    teams: list[str] | None = None
    """The Teams conversations the request is posted to; None when the file has no
    `teams:`."""
    discord: list[str] | None = None
    """The Discord channels the request is posted to; None when the file has no
    `discord:`."""


@dataclass(frozen=True)
class Explanation:
    """What the rules make of one call, and why."""

    tool: str
    arguments: dict[str, Any]
    """As given."""
    judged_by: Literal["model", "schema", "as-given"]
    """What checked the arguments before the rules judged them: the model of the bot's own
    tool of that name, the JSON schema given, or nothing (a tool that runs elsewhere)."""
    judged: dict[str, Any] | None
    """The arguments as the rules judged them; None when they failed that check."""
    errors: list[dict[str, str]]
    """Why they failed it (`{"field", "message"}`); empty when they passed."""
    passed: list[Passed]
    """The rules before the one that took the call, each with why it did not."""
    outcome: Outcome
    rule: int | Literal["defaults"] | None
    """The rule that decided: its position, `defaults`, or None (no rule covers the call)."""
    decided_by: str | None
    """For a call decided at once: `nodbot:rules.<n>` or `nodbot:no-rule`."""
    reason: str | None
    """For a denied call: the reason its run is told."""
    fails_closed: bool
    """The rule took the call only because its `when` could not judge it."""
    description: str | None
    """The deciding rule's description."""
    when: str | None
    """The deciding rule's `when`, as a short text; None without one."""
    requested_by: str | None
    review: ReviewPlan | None = None
    """For a reviewed call: how."""
    notes: list[str] = field(default_factory=list)
    """What else the reader should know (the call would be refused before the rules, ...)."""

    def to_json(self) -> dict[str, Any]:
        """The explanation as JSON values (the keys of `nodbot rules explain --json`)."""
        return asdict(self)

    def summary(self) -> str:
        """One line: the outcome, the rule, and the reviewers or the reason."""
        where = (
            "no rule"
            if self.rule is None
            else "defaults"
            if self.rule == "defaults"
            else f"rules.{self.rule}"
        )
        closed = ", failing closed" if self.fails_closed else ""
        if self.outcome == "review" and self.review is not None:
            return f"review by {where}{closed}: {', '.join(self.review.reviewers)}"
        if self.outcome == "deny":
            return f"deny by {where}{closed}: {self.reason}"
        return f"approve by {where}"


async def explain(
    config: Config,
    tool: str,
    arguments: Mapping[str, Any],
    *,
    registry: ToolRegistry | None = None,
    schema: dict[str, Any] | None = None,
    requested_by: str | None = None,
) -> Explanation:
    """What the rules of `config` make of a call of `tool` with `arguments`: `registry`
    holds the bot's own tools (their models check the arguments, their `confirm` says
    whether a call no rule covers needs review); `schema` is the JSON schema a caller would
    send with a call of a tool that runs elsewhere."""
    port = RulesPort(config, MemoryApprovalStore(), registry=registry)
    given = dict(arguments)
    request = ApprovalRequest(
        run_id=EXPLAIN_RUN,
        call_id=EXPLAIN_RUN,
        tool=tool,
        arguments=given,
        digest=arguments_digest(given),
        requested_by=requested_by,
        policy={} if schema is None else {"schema": schema},
    )
    judged = port.judged(request)
    ruled = await port.rule(request, judged=judged)
    found = config.rule_for(tool, judged.values)  # the lookup `port.rule` made
    until = found[0] if found is not None else len(config.rules)
    passed = [_passed(number, config.rules[number], tool, judged) for number in range(until)]
    decision = ruled.decision
    policy = ruled.request.policy
    by_model = registry is not None and tool in registry
    outcome: Outcome = "review" if decision is None else "approve" if decision.approved else "deny"
    rule: int | Literal["defaults"] | None = None
    if found is not None:
        rule = found[0]
    elif decision is None and policy.get("rule") == "defaults":
        rule = "defaults"
    notes: list[str] = []
    errors = _errors(registry, tool, given, schema) if judged.values is None else []
    if errors and by_model:
        notes.append(
            "in a run of the bot's agent these arguments are refused before any rule (the "
            "model is told the errors); asked from outside (POST /approvals, MCP), the rules "
            "take them as shown"
        )
    policy_of: ReviewPolicy | None = None
    if rule == "defaults":
        policy_of = config.defaults
    elif isinstance(rule, int):
        policy_of = config.rules[rule]
    review = None
    if outcome == "review" and policy_of is not None:
        review = await _plan(config, policy, policy_of, requested_by)
    if rule is None and decision is not None and decision.approved:
        notes.append("no rule covers the call and its tool does not ask for review: it runs")
    return Explanation(
        tool=tool,
        arguments=given,
        judged_by="model" if by_model else "schema" if schema is not None else "as-given",
        judged=None if judged.values is None else dict(judged.values),
        errors=errors,
        passed=passed,
        outcome=outcome,
        rule=rule,
        decided_by=None if decision is None else decision.decided_by,
        reason=None if decision is None or decision.approved else decision.reason,
        fails_closed=found is not None and not found[2],
        description=None if policy_of is None else policy_of.description,
        when=None if not isinstance(rule, int) else _when(config.rules[rule]),
        requested_by=requested_by,
        review=review,
        notes=notes,
    )


def _passed(number: int, rule: Rule, tool: str, judged: Judged) -> Passed:
    """Why rule `number` did not take the call (asked as `Config.rule_for` asks it)."""
    verdict = rule.judge(tool, judged.values)
    assert not rule.takes(verdict)  # `rule_for` went past it
    when = _when(rule)
    kind: Outcome = "review" if rule.decision is None else rule.decision
    if verdict is False and not rule.interrupt_rule.applies_to(tool):
        return Passed(number, rule.tool, when, kind, "other-tool", f"names {rule.tool}")
    if verdict is False:
        return Passed(number, rule.tool, when, kind, "false", f"when is false: {when}")
    return Passed(
        number,
        rule.tool,
        when,
        kind,
        "cannot-judge",
        f"cannot judge ({_undecided(rule, judged)}): an approve rule never approves what it "
        "cannot judge, so the call is passed to the next rule (fails closed)",
    )


def _when(rule: Rule) -> str | None:
    match = rule.interrupt_rule.match
    return match.describe() if isinstance(match, Predicate) else None


def _undecided(rule: Rule, judged: Judged) -> str:
    """What the rule's `when` could not judge: the predicate's own complaint."""
    if judged.values is None:
        return "the arguments fail validation"
    match = rule.interrupt_rule.match
    try:
        if match is not None:
            match(judged.values)
    except KeyError as exc:
        return f"{exc.args[0]} is missing"
    except Exception as exc:  # what `core.judge` turned into None
        return str(exc) or type(exc).__name__
    return "it raised"  # not reached: judge said None, so it raises


def _errors(
    registry: ToolRegistry | None,
    tool: str,
    arguments: dict[str, Any],
    schema: dict[str, Any] | None,
) -> list[dict[str, str]]:
    """Why the arguments failed the check the rules put them to (for the reader)."""
    if registry is not None and tool in registry:
        try:
            registry.get(tool).validate(arguments)
        except InvalidArgumentsError as exc:
            return [dict(error) for error in exc.errors]
        return []
    if schema is not None:
        return schema_errors(schema, arguments)
    return []


async def _plan(
    config: Config, policy: Mapping[str, Any], rule: ReviewPolicy, requested_by: str | None
) -> ReviewPlan:
    """The review's plan, read from the policy the port made for it as the channels read it
    (`SlackChannel.targets`, `EmailChannel.targets`, and Teams' and Discord's)."""
    # Imported here: the channels' modules bring their clients' packages.
    from nodbot.bot.config import parse_reviewer
    from nodbot.bot.discord.channel import discord_places
    from nodbot.bot.email.channel import email_addresses
    from nodbot.bot.slack.channel import places
    from nodbot.bot.teams.channel import teams_places

    reviewers = [str(r) for r in policy.get("reviewers", [])]
    parsed = [parse_reviewer(text) for text in reviewers]
    requester_reviews = None
    if requested_by is not None:
        people = People(config.people)
        requester_reviews = False
        for reviewer in reviewers:
            if await people.same(requested_by, reviewer):
                requester_reviews = True
    escalate_to = policy.get("escalate_to")
    post_to = policy.get("post_to")
    return ReviewPlan(
        reviewers=reviewers,
        reviewers_as_written=[r.text for r in rule.reviewers or []],
        slack=None if config.slack is None else places(parsed, post_to),
        email=None if config.email is None else email_addresses(reviewers),
        inbox=True,
        webhooks=[hook.name for hook in config.webhooks if "approval.pending" in hook.events],
        allowed_decisions=list(policy.get("allowed_decisions", [])),
        editable=policy.get("editable"),
        edit_bounds=policy.get("edit_bounds"),
        approvals_required=int(policy.get("approvals_required", 1)),
        allow_self_approval=bool(policy.get("allow_self_approval", False)),
        requester_reviews=requester_reviews,
        timeout=rule.timeout,
        timeout_decision=None if rule.timeout is None else rule.timeout_decision,
        escalate_after=rule.escalate_after if escalate_to else None,
        escalate_to=None if escalate_to is None else list(escalate_to),
        remember=rule.remember,
        remember_by=None if rule.remember_by is None else list(rule.remember_by),
        # Read when the configuration has them (reminders are a newer key).
        remind_every=getattr(rule, "remind_every", None),
        remind_limit=getattr(rule, "remind_limit", None),
        teams=None if config.teams is None else teams_places(config.teams, post_to),
        discord=None if config.discord is None else discord_places(config.discord, post_to),
    )


def format_duration(seconds: int) -> str:
    """`1800` as `30m`, `90` as `90s`: the largest unit that divides it."""
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
