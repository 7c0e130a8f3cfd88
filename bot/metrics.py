"""What this process has seen happen, as Prometheus series: how long reviews wait for their
decision, how long a decision waits for its call, deliveries, refusals, time-outs,
escalations and HTTP requests (`GET /metrics` renders them with the store's gauges).

The series are the process's own, from its start, as a Prometheus client library keeps them:
each replica counts what it did, and Prometheus sums over them. They live in one registry per
process (`METRICS`), which the places where things happen tell in one line each
(`METRICS.decided(record, "slack")`): a decision is recorded once, by the process that made
it, so it is counted once.

Label values are bounded: a tool is named as the configuration knows it (its agents' tools
and the tools its rules name), any other as `other`; a rule by its position in the file
(`0`, `1`, ...), `defaults`, or `none` when no rule holds the call; a channel, a refusal's
reason and a route from fixed sets. No argument, person or free text becomes a label.

A decision's `outcome` is `approved`, `edited`, `denied`, `responded` (a reviewer answered in
the tool's place: recorded as a denial, since nothing ran, but counted as its own outcome) or
`expired` (decided by the timeout). A question to a person is a review of the pseudo-tool
`ask` (`core.questions`), always a tool the label names: its answer is `responded` on tool
`ask`, its decline `denied`, its timeout `expired`.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from nodbot.core import QUESTION_TOOL, ApprovalRecord, ApprovalRequest, Decision, Delivery
from nodbot.core.ports import Decided, PortAnswer
from nodbot.core.store import TIMEOUT_DECIDER, utc_now

if TYPE_CHECKING:
    from nodbot.bot.config import Config

__all__ = [
    "DECISION_BUCKETS",
    "METRICS",
    "OUTCOMES",
    "RUN_BUCKETS",
    "Metrics",
    "escape",
    "outcome_of",
    "refusal_reason",
]

RULE_DECIDES = "nodbot:rules."
"""The `decided_by` of a rule's decision starts so, its position after."""
OTHER = "other"
"""The label value of what the configuration does not name."""

DECISION_BUCKETS: tuple[float, ...] = (
    5, 15, 30, 60, 120, 300, 600, 900, 1800, 3600,
    7200, 14400, 28800, 43200, 86400, 172800, 345600, 604800,
)  # fmt: skip
"""Seconds from a review's opening to its decision: people answer in seconds to days."""
RUN_BUCKETS: tuple[float, ...] = (
    0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 14400, 86400,
)  # fmt: skip
"""Seconds from a decision to its call: the bot's own queue (milliseconds) to a caller that
asks for its decision much later (hours)."""

CHANNELS = frozenset(
    {"api", "web", "slack", "teams", "discord", "email", "cli", "rules", "remembered", "timeout"}
)
"""Where a decision may come from (`channel` of the decision histogram)."""
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

REFUSALS: tuple[tuple[str, str], ...] = (
    ("you started this run", "self_approval"),
    ("runs:write-as", "starts_for_others"),
    ("not one of the reviewers", "not_a_reviewer"),
    ("may not be decided with", "decision_not_allowed"),
    ("may not be edited here", "not_editable"),
    ("edited arguments are not valid", "invalid_edit"),
    ("edits of ", "invalid_edit"),
    ("bound", "edit_out_of_bounds"),
    ("the edit ", "edit_out_of_bounds"),
    ("already decided", "already_decided"),
    ("voted on this", "already_voted"),
    ("could not check", "check_unavailable"),
    ("slack could not be reached", "check_unavailable"),
    ("slack answered", "check_unavailable"),
    ("reply token", "unverified_message"),
    ("message-id", "unverified_message"),
    ("automatic message", "unverified_message"),
    ("does not belong to this review", "wrong_message"),
)
"""How a refusal's words (the authorizer's, the rules', the channels') map to its reason
label: the first phrase found wins; anything else is `other`."""


OUTCOMES = frozenset({"approved", "edited", "denied", "responded", "expired"})
"""What a decision did (`outcome` of the decision histogram)."""


def outcome_of(decision: Decision) -> str:
    """The `outcome` label of `decision`: a respond (`Decision.response`, a question's answer
    too) is `responded`, not the denial it is stored as; a timeout's decision `expired`."""
    if decision.decided_by == TIMEOUT_DECIDER:
        return "expired"
    if decision.response is not None:
        return "responded"
    if not decision.approved:
        return "denied"
    return "edited" if decision.edited_args else "approved"


def refusal_reason(text: str) -> str:
    """The bounded reason label of a refusal's words."""
    lowered = text.lower()
    for phrase, reason in REFUSALS:
        if phrase in lowered:
            return reason
    return OTHER


def escape(value: str) -> str:
    """A label value as Prometheus' text format writes it: backslash, quote and newline
    escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(names: Sequence[str], values: Sequence[str], extra: str = "") -> str:
    pairs = [f'{name}="{escape(value)}"' for name, value in zip(names, values, strict=True)]
    if extra:
        pairs.append(extra)
    return "{" + ",".join(pairs) + "}" if pairs else ""


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if value != int(value) else str(int(value))


@dataclass
class Counter:
    """A counter per combination of label values."""

    name: str
    help: str
    labels: tuple[str, ...]
    values: dict[tuple[str, ...], float] = field(default_factory=dict)

    def inc(self, *labels: str, by: float = 1) -> None:
        self.values[labels] = self.values.get(labels, 0) + by

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} counter"]
        for key, value in sorted(self.values.items()):
            lines.append(f"{self.name}{_labels(self.labels, key)} {_number(value)}")
        return lines


@dataclass
class _Observed:
    buckets: list[int]
    sum: float = 0.0
    count: int = 0


@dataclass
class Histogram:
    """A histogram per combination of label values, with fixed upper bounds (`le`)."""

    name: str
    help: str
    labels: tuple[str, ...]
    bounds: tuple[float, ...]
    values: dict[tuple[str, ...], _Observed] = field(default_factory=dict)

    def observe(self, seconds: float, *labels: str) -> None:
        seconds = max(0.0, seconds)  # clocks of two hosts may disagree a little
        found = self.values.get(labels)
        if found is None:
            found = self.values[labels] = _Observed([0] * len(self.bounds))
        index = bisect.bisect_left(self.bounds, seconds)
        if index < len(self.bounds):
            found.buckets[index] += 1
        found.sum += seconds
        found.count += 1

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        for key, seen in sorted(self.values.items()):
            below = 0
            for bound, number in zip(self.bounds, seen.buckets, strict=True):
                below += number
                le = f'le="{_number(bound)}"'
                lines.append(f"{self.name}_bucket{_labels(self.labels, key, le)} {below}")
            every = _labels(self.labels, key, 'le="+Inf"')
            lines.append(f"{self.name}_bucket{every} {seen.count}")
            lines.append(f"{self.name}_sum{_labels(self.labels, key)} {_number(seen.sum)}")
            lines.append(f"{self.name}_count{_labels(self.labels, key)} {seen.count}")
        return lines


class Metrics:
    """This process's series. `configure` tells it the tools and rules label values may
    name; until then every tool is `other` and every rule is kept as its position."""

    def __init__(self, *, clock: Callable[[], datetime] = utc_now) -> None:
        self.clock = clock
        """Now, for the ages of pending reviews (`GET /metrics`)."""
        self.tools: frozenset[str] = frozenset()
        self.rules: frozenset[str] = frozenset()
        self.reset()

    def reset(self) -> None:
        """Every series back to nothing (a process starts so; tests start so too)."""
        self.decision_seconds = Histogram(
            "nodbot_review_decision_seconds",
            "Seconds from a review's opening to its decision, for the decisions this process "
            "recorded.",
            ("tool", "rule", "channel", "outcome"),
            DECISION_BUCKETS,
        )
        self.run_seconds = Histogram(
            "nodbot_decision_to_run_seconds",
            "Seconds from a decision to the call taking it (the tool about to run), for the "
            "calls this process resumed or handed their decision to.",
            ("tool", "rule", "consumer"),
            RUN_BUCKETS,
        )
        self.deliveries = Counter(
            "nodbot_deliveries_total",
            "Delivery attempts of this process, by channel, kind and result.",
            ("channel", "kind", "result"),
        )
        self.refusals = Counter(
            "nodbot_refusals_total",
            "Decisions refused (and recorded as refused attempts) by this process, by channel "
            "and reason.",
            ("channel", "reason"),
        )
        self.timeouts = Counter(
            "nodbot_timeouts_total",
            "Reviews this process decided by their timeout.",
            ("tool", "rule"),
        )
        self.escalations = Counter(
            "nodbot_escalations_total",
            "Escalation messages this process sent (one per target told).",
            ("tool", "rule"),
        )
        self.http = Counter(
            "nodbot_http_requests_total",
            "HTTP requests this process answered, by route template, method and status.",
            ("route", "method", "status"),
        )

    def configure(self, config: Config, tools: Iterable[str]) -> None:
        """The label values of `config`: its agents' `tools`, the tools its rules name, its
        rules' positions and `defaults`."""
        named = {rule.tool for rule in config.rules if rule.tool != "*"}
        # Questions are reviews of `ask` whichever rule takes them (`*`, `defaults`).
        self.tools = frozenset({*tools, *named, QUESTION_TOOL})
        self.rules = frozenset({*(str(n) for n in range(len(config.rules))), "defaults"})
        # Said 0 from the start for each rule that can time out or escalate: a series that
        # appears at its first event hides that event from `increase()` and `rate()`.
        for number, rule in enumerate(config.rules):
            if rule.tool != "*" and rule.decision is None:
                labels = (self.tool(rule.tool), str(number))
                if rule.timeout is not None:
                    self.timeouts.inc(*labels, by=0)
                if rule.escalate_after is not None:
                    self.escalations.inc(*labels, by=0)

    def tool(self, name: str) -> str:
        return name if name in self.tools else OTHER

    def rule(self, policy: Mapping[str, Any]) -> str:
        found = policy.get("rule")
        if found is None:
            return "none"
        text = str(found)
        return text if text in self.rules else OTHER

    def decided(self, record: ApprovalRecord, channel: str) -> None:
        """A decision this process recorded on `record` (as the store returned it), made on
        `channel`. A vote that left the review pending is not a decision yet."""
        decision, at = record.decision, record.decided_at
        if decision is None or at is None:
            return
        outcome = outcome_of(decision)
        if outcome == "expired":
            channel = "timeout"
        request = record.request
        rule = self.rule(request.policy)
        by = decision.decided_by or ""
        if "rule" not in request.policy and by.startswith(RULE_DECIDES):
            rule = self.rule({"rule": by.removeprefix(RULE_DECIDES)})  # decided as it was asked
        self.decision_seconds.observe(
            (at - record.created_at).total_seconds(),
            self.tool(request.tool),
            rule,
            channel if channel in CHANNELS else OTHER,
            outcome,
        )

    def timed_out(self, records: Iterable[ApprovalRecord]) -> None:
        """Reviews this process decided by their timeout (`expire_due`)."""
        for record in records:
            self.decided(record, "timeout")
            self.timeouts.inc(self.tool(record.request.tool), self.rule(record.request.policy))

    def taken(self, record: ApprovalRecord, consumer: str) -> None:
        """A decision taken by its call now: by a run of this bot (`run`), or handed to a
        caller that runs the tool itself (`api`)."""
        if record.decided_at is None:
            return
        at = record.consumed_at or self.clock()
        self.run_seconds.observe(
            (at - record.decided_at).total_seconds(),
            self.tool(record.request.tool),
            self.rule(record.request.policy),
            consumer,
        )

    def taken_by_run(self, request: ApprovalRequest, answer: PortAnswer) -> PortAnswer:
        """`answer` as is, once an approval a run of this bot took now (for `request`) is
        observed: from when it was decided, which the port's answer carries."""
        if (
            isinstance(answer, Decided)
            and answer.decided_at is not None
            and answer.kept is None
            and answer.decision.approved
        ):
            self.run_seconds.observe(
                (self.clock() - answer.decided_at).total_seconds(),
                self.tool(request.tool),
                self.rule(request.policy),
                "run",
            )
        return answer

    def ruled(self, tool: str, decision: Decision) -> None:
        """A decision the rules made as the call was asked, recorded nowhere (the bot's own
        agents): no review waited, so 0 seconds."""
        by = decision.decided_by or ""
        rule = by.removeprefix(RULE_DECIDES) if by.startswith(RULE_DECIDES) else "none"
        rule = rule if rule in self.rules or rule == "none" else OTHER
        self.decision_seconds.observe(0.0, self.tool(tool), rule, "rules", outcome_of(decision))

    def delivered(self, channel: str, kind: str, result: str, *, known: Iterable[str]) -> None:
        """A delivery attempt's `result`: sent, skipped (nothing to tell any more), failed
        (tried again later) or given_up. `known`: the channels configured."""
        self.deliveries.inc(channel if channel in set(known) else OTHER, kind, result)

    def sent(
        self,
        delivery: Delivery,
        record: ApprovalRecord,
        ref: Mapping[str, Any] | None,
        *,
        known: Iterable[str],
    ) -> None:
        """A delivery sent, or settled without sending (`{"skipped": why}`: an escalation or
        reminder of a review decided meanwhile); a sent escalation is an escalation."""
        skipped = ref is not None and "skipped" in ref
        self.delivered(
            delivery.channel, delivery.kind, "skipped" if skipped else "sent", known=known
        )
        if delivery.kind == "escalation" and not skipped:
            self.escalations.inc(self.tool(record.request.tool), self.rule(record.request.policy))

    def refused(self, channel: str, reason: str) -> None:
        """A refused attempt to decide, recorded on `channel`; `reason` in words."""
        self.refusals.inc(channel if channel in CHANNELS else OTHER, refusal_reason(reason))

    def request(self, route: str, method: str, status: int) -> None:
        self.http.inc(route, method if method in METHODS else OTHER, str(status))

    def render(self) -> list[str]:
        """Every series, in Prometheus' text format (one line each)."""
        lines: list[str] = []
        for series in (
            self.decision_seconds,
            self.run_seconds,
            self.deliveries,
            self.refusals,
            self.timeouts,
            self.escalations,
            self.http,
        ):
            lines += series.render()
        return lines


METRICS = Metrics()
"""This process's series."""
