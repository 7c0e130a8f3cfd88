"""`GET /metrics` after a scripted day of reviews on a real bot (SQLite store, the ledger
agent, the API, a recording channel) whose store runs on a clock the test moves: each series
has the value the day makes. The dashboard's and the alerts' queries name only series the bot
exposes."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from nodbot.bot.config import load_agents, load_config
from nodbot.bot.config.models import ApiToken
from nodbot.bot.http import create_app
from nodbot.bot.metrics import METRICS, escape, refusal_reason
from nodbot.bot.outbox import DeliveryError, Moment
from nodbot.bot.service import BotService
from nodbot.core import ApprovalRecord, Decision, Delivery, NewDelivery, SqlApprovalStore
from nodbot.core.store import utc_now
from tests.support import eventually

ROOT = Path(__file__).resolve().parents[2]
LEAD, REVIEWER, APP = "U0123LEADS", "U0777REVIEW", "app-billing"
TOKENS = {
    LEAD: "t-lead-0123456789abcdef",
    REVIEWER: "t-reviewer-0123456789abcdef",
    APP: "t-app-0123456789abcdef",
}
SCOPES = {
    LEAD: ["runs:write", "approvals:read", "approvals:decide"],
    REVIEWER: ["approvals:read", "approvals:decide"],
    APP: ["approvals:request"],
}

CONFIG = """
workers: {{poll: 0.05}}
store: {{url: "{url}"}}
agents:
  ledger: tests.bot.ledger_agent:agent
rules:
  - tool: refund                      # rule 0
    when: {{gt: {{amount: 1000}}}}
    decision: deny
  - tool: refund                      # rule 1
    when: {{ge: {{amount: 10}}}}
    reviewers: [U0777REVIEW]
    timeout: 8h
    escalate_after: 2h
    escalate_to: [U0999BOSS]
  - tool: refund                      # rule 2
    reviewers: [U0777REVIEW]
"""


class Recording:
    """A channel that posts each review, and its escalation when the rule has one; the
    request of a refund of 20 cannot be delivered, ever."""

    name = "rec"
    answers = False
    makes_deliveries = False
    tells_outcomes = False

    def __init__(self) -> None:
        self.posted: list[tuple[str, str]] = []

    def targets(self, record: ApprovalRecord, stage: Moment) -> list[NewDelivery]:
        if stage != "request" or record.decision is not None:
            return []  # a call decided as it was asked opened no review
        found = [NewDelivery("request", "rec:ops")]
        escalate_at = record.request.policy.get("escalate_at")
        if escalate_at:
            at = datetime.fromisoformat(escalate_at)
            found.append(NewDelivery("escalation", "rec:boss", at))
        return found

    async def deliver(self, delivery: Delivery, record: ApprovalRecord) -> dict[str, Any] | None:
        if delivery.kind == "escalation" and record.decision is not None:
            return {"skipped": "decided before the escalation"}
        if record.request.arguments.get("amount") == 20:
            raise DeliveryError("the channel refuses this one", permanent=True)
        self.posted.append((delivery.kind, record.approval_id))
        return None

    async def close(self) -> None:
        return None


@dataclass
class Day:
    """The bot, its clock and an API client per token."""

    service: BotService
    channel: Recording
    url: str
    start: datetime
    now: list[datetime]
    clients: dict[str, httpx.AsyncClient] = field(default_factory=dict)

    def at(self, **elapsed: float) -> None:
        """Move the store's (and the metrics') clock to `start` + `elapsed`."""
        self.now[0] = self.start + timedelta(**elapsed)
        self.service.decided()  # the lanes look (for time-outs, due deliveries) at once

    async def run(self, order: str, amount: float) -> dict[str, Any]:
        answer = await self.clients[LEAD].post(
            "/runs", json={"agent": "ledger", "input": f"refund {order} {amount}"}
        )
        assert answer.status_code == 201, answer.text
        run: dict[str, Any] = answer.json()
        return run

    async def decide(self, who: str, approval_id: str, **body: Any) -> httpx.Response:
        return await self.clients[who].post(f"/approvals/{approval_id}/decide", json=body)

    async def finished(self, run_id: str) -> None:
        async def done() -> bool:
            answer = await self.clients[LEAD].get(f"/runs/{run_id}")
            return bool(answer.json()["status"] == "finished")

        await eventually(done, f"run {run_id} finished")

    async def scrape(self) -> Scrape:
        answer = await self.clients[LEAD].get("/metrics")
        assert answer.status_code == 200
        return Scrape.parse(answer.text)


@pytest.fixture
def metrics_clock() -> Iterator[list[datetime]]:
    """This process's series from nothing, on a clock the test holds; as before after."""
    now = [utc_now()]
    clock = METRICS.clock
    METRICS.reset()
    METRICS.clock = lambda: now[0]
    yield now
    METRICS.clock = clock


@pytest.fixture
async def day(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, metrics_clock: list[datetime]
) -> AsyncIterator[Day]:
    monkeypatch.chdir(ROOT)  # where tests.bot.ledger_agent is imported from
    path = tmp_path / "nodbot.yml"
    path.write_text(CONFIG.format(url=f"sqlite:///{tmp_path / 'nodbot.db'}"))
    config = load_config(path)
    agents, problems = load_agents(config)
    assert not problems
    channel = Recording()
    now = metrics_clock
    async with SqlApprovalStore(config.store.url, clock=lambda: now[0]) as store:
        service = BotService(config, store, agents, channels=[channel])
        tokens = [ApiToken(name=n, token=t, scopes=SCOPES[n]) for n, t in TOKENS.items()]
        app = create_app(store=store, registry=service.registry, tokens=tokens, service=service)
        stop = asyncio.Event()
        working = asyncio.create_task(service.work(stop))
        day = Day(service, channel, config.store.url, now[0], now)
        transport = httpx.ASGITransport(app=app)
        try:
            for name, token in TOKENS.items():
                day.clients[name] = httpx.AsyncClient(
                    transport=transport,
                    base_url="http://bot",
                    headers={"Authorization": f"Bearer {token}"},
                )
            yield day
        finally:
            for client in day.clients.values():
                await client.aclose()
            stop.set()
            await working


Labels = frozenset[tuple[str, str]]


@dataclass
class Scrape:
    """A scrape, parsed: each sample's value by name and labels, and each family's type."""

    samples: dict[tuple[str, Labels], float]
    types: dict[str, str]

    @classmethod
    def parse(cls, text: str) -> Scrape:
        samples: dict[tuple[str, Labels], float] = {}
        types: dict[str, str] = {}
        sample = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)")
        label = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)",?')
        for line in text.splitlines():
            if line.startswith("# TYPE "):
                _, _, name, kind = line.split(" ")
                types[name] = kind
                continue
            if not line or line.startswith("#"):
                continue
            matched = sample.fullmatch(line)
            assert matched is not None, f"not a sample: {line!r}"
            name, raw, value = matched.groups()
            pairs = label.findall(raw or "")
            assert "".join(f'{k}="{v}",' for k, v in pairs).rstrip(",") == (raw or ""), line
            unescaped = {
                k: v.replace("\\n", "\n").replace('\\"', '"').replace("\\\\", "\\")
                for k, v in pairs
            }
            key = (name, frozenset(unescaped.items()))
            assert key not in samples, f"twice: {line!r}"
            samples[key] = float(value)
        return cls(samples, types)

    def value(self, name: str, **labels: str) -> float | None:
        return self.samples.get((name, frozenset(labels.items())))

    def total(self, name: str, **labels: str) -> float:
        """The sum over the samples of `name` whose labels include `labels`."""
        wanted = set(labels.items())
        return sum(v for (n, ls), v in self.samples.items() if n == name and wanted <= ls)

    def names(self) -> set[str]:
        return {name for name, _ in self.samples}

    def label_values(self, name: str, label: str) -> set[str]:
        return {dict(ls)[label] for n, ls in self.samples if n == name and label in dict(ls)}

    def buckets(self, name: str, **labels: str) -> dict[str, float]:
        """The cumulative counts of a histogram's series, by `le`."""
        wanted = set(labels.items())
        return {
            dict(ls)["le"]: v
            for (n, ls), v in self.samples.items()
            if n == f"{name}_bucket" and {*wanted, ("le", dict(ls)["le"])} == set(ls)
        }


DECISION = "nodbot_review_decision_seconds"


async def test_a_scripted_day_of_reviews_makes_each_series(day: Day) -> None:
    # 09:00: six runs ask for refunds; a call of 5000 is denied by rule 0 at once.
    runs = {order: await day.run(order, amount) for order, amount in REFUNDS.items()}
    denied = runs.pop("o-f")
    assert denied["status"] == "finished" and not denied["pending"]
    review = {order: run["pending"][0]["approval_id"] for order, run in runs.items()}
    # An app that runs its tools itself asks about a refund (rule 1) and a tool no rule names.
    asked = await day.clients[APP].post(
        "/approvals",
        json={
            "tool": "refund",
            "arguments": {"order_id": "o-x", "amount": 30},
            "run_id": "x",
            "call_id": "c1",
        },
    )
    assert asked.status_code == 201, asked.text
    external = asked.json()["approval_id"]
    unknown = await day.clients[APP].post(
        "/approvals",
        json={
            "tool": "wire_everything",
            "arguments": {"to": "ACME"},
            "run_id": "y",
            "call_id": "c1",
        },
    )
    assert unknown.json()["status"] == "denied"

    # 09:01:30: A approved. The one who started the runs may not approve B (refused).
    day.at(seconds=90)
    assert (await day.decide(REVIEWER, review["o-a"], action="approve")).status_code == 200
    await day.finished(runs["o-a"]["run_id"])
    refused = await day.decide(LEAD, review["o-b"], action="approve")
    assert refused.status_code == 403
    # 09:20: the app's refund approved; 09:30: B denied, the app takes its decision.
    day.at(minutes=20)
    assert (await day.decide(REVIEWER, external, action="approve")).status_code == 200
    day.at(minutes=30)
    assert (await day.decide(REVIEWER, review["o-b"], action="deny")).status_code == 200
    consumed = await day.clients[APP].post(f"/approvals/{external}/consume")
    assert consumed.status_code == 200, consumed.text
    # 10:00: C edited (and run with the edit).
    day.at(hours=1)
    edit = {"action": "edit", "arguments": {"amount": 25}}
    assert (await day.decide(REVIEWER, review["o-c"], **edit)).status_code == 200
    await day.finished(runs["o-c"]["run_id"])
    await day.finished(runs["o-b"]["run_id"])
    # 11:10: D and E are escalated (the others were decided: their escalations skipped).
    day.at(hours=2, minutes=10)

    async def escalated() -> bool:
        return sorted(p for k, p in day.channel.posted if k == "escalation") == sorted(
            [review["o-d"], review["o-e"]]
        )

    await eventually(escalated, "D and E escalated")
    # 15:00: G asks for a refund of 5 (rule 2: no timeout); 17:10: D and E time out.
    day.at(hours=6)
    runs["o-g"] = await day.run("o-g", 5)
    review["o-g"] = runs["o-g"]["pending"][0]["approval_id"]
    day.at(hours=8, minutes=10)
    await day.finished(runs["o-d"]["run_id"])
    await day.finished(runs["o-e"]["run_id"])

    async def all_settled() -> bool:
        scrape = await day.scrape()
        return scrape.total("nodbot_deliveries_total", kind="escalation") == 6

    await eventually(all_settled, "every escalation settled")
    assert (await day.clients[LEAD].get("/no/such/page/123")).status_code == 404
    scrape = await day.scrape()

    # Time to decision: one series per tool, rule, channel and outcome, in seconds.
    expected = {
        ("refund", "1", "api", "approved"): [90, 1200],  # A, the app's refund
        ("refund", "1", "api", "denied"): [1800],  # B
        ("refund", "1", "api", "edited"): [3600],  # C
        ("refund", "1", "timeout", "expired"): [29400, 29400],  # D, E
        ("refund", "0", "rules", "denied"): [0],  # F, by rule 0 as it was asked
        ("other", "none", "rules", "denied"): [0],  # a tool no rule or agent names
    }
    seen = {
        (dict(ls)["tool"], dict(ls)["rule"], dict(ls)["channel"], dict(ls)["outcome"])
        for n, ls in scrape.samples
        if n == f"{DECISION}_count"
    }
    assert seen == set(expected)
    for (tool, rule, channel, outcome), seconds in expected.items():
        labels = {"tool": tool, "rule": rule, "channel": channel, "outcome": outcome}
        assert scrape.value(f"{DECISION}_count", **labels) == len(seconds)
        assert scrape.value(f"{DECISION}_sum", **labels) == pytest.approx(sum(seconds))
        buckets = scrape.buckets(DECISION, **labels)
        assert buckets["+Inf"] == len(seconds)
        for le, count in buckets.items():
            assert count == sum(1 for s in seconds if le == "+Inf" or s <= float(le)), le
    approved = scrape.buckets(DECISION, tool="refund", rule="1", channel="api", outcome="approved")
    assert (approved["60"], approved["120"], approved["1800"]) == (0, 1, 2)

    # Decision to run: the bot's own runs at once (A, C), the app 10 minutes later.
    run = "nodbot_decision_to_run_seconds"
    assert scrape.value(f"{run}_count", tool="refund", rule="1", consumer="run") == 2
    assert scrape.value(f"{run}_sum", tool="refund", rule="1", consumer="run") < 1
    assert scrape.value(f"{run}_count", tool="refund", rule="1", consumer="api") == 1
    assert scrape.value(f"{run}_sum", tool="refund", rule="1", consumer="api") == 600
    assert scrape.buckets(run, tool="refund", rule="1", consumer="api")["300"] == 0
    assert scrape.buckets(run, tool="refund", rule="1", consumer="api")["900"] == 1

    # What waits: G, since 15:00, under rule 2; nothing under rule 1 (said as 0).
    assert scrape.value("nodbot_pending_reviews", tool="refund", rule="2") == 1
    assert scrape.value("nodbot_pending_reviews", tool="refund", rule="1") == 0
    assert scrape.value("nodbot_oldest_pending_seconds", tool="refund", rule="2") == 7800
    assert scrape.value("nodbot_oldest_pending_seconds", tool="refund", rule="1") == 0
    assert scrape.value("nodbot_rule_timeout_seconds", rule="1") == 28800
    assert scrape.label_values("nodbot_rule_timeout_seconds", "rule") == {"1"}
    assert scrape.value("nodbot_approvals", status="pending") == 1
    assert scrape.value("nodbot_approvals", status="approved") == 3  # A, C, the app's
    assert scrape.value("nodbot_approvals", status="denied") == 4  # B, D, E, the unknown

    # Deliveries, refusals, time-outs, escalations.
    deliveries = "nodbot_deliveries_total"
    assert scrape.value(deliveries, channel="rec", kind="request", result="sent") == 6
    assert scrape.value(deliveries, channel="rec", kind="request", result="given_up") == 1
    assert scrape.value(deliveries, channel="rec", kind="escalation", result="sent") == 2
    assert scrape.value(deliveries, channel="rec", kind="escalation", result="skipped") == 4
    assert scrape.total(deliveries) == 13
    assert scrape.value("nodbot_refusals_total", channel="api", reason="self_approval") == 1
    assert scrape.total("nodbot_refusals_total") == 1
    assert scrape.value("nodbot_timeouts_total", tool="refund", rule="1") == 2
    assert scrape.total("nodbot_timeouts_total") == 2
    assert scrape.value("nodbot_escalations_total", tool="refund", rule="1") == 2
    assert scrape.total("nodbot_escalations_total") == 2

    # HTTP requests by route template, never by path.
    http = "nodbot_http_requests_total"
    decide = "/approvals/{approval_id}/decide"
    assert scrape.value(http, route="/runs", method="POST", status="201") == 7
    assert scrape.value(http, route=decide, method="POST", status="200") == 4
    assert scrape.value(http, route=decide, method="POST", status="403") == 1
    assert scrape.value(http, route="/approvals", method="POST", status="201") == 2
    assert scrape.value(http, route="unmatched", method="GET", status="404") == 1
    routes = scrape.label_values(http, "route")
    assert not any(review_id in route for route in routes for review_id in review.values())

    # The workers, and the families' types.
    for task in ("workers", "runs", "outbox"):
        assert scrape.value("nodbot_worker_up", task=task) == 1
    assert scrape.types[DECISION] == "histogram"
    assert scrape.types["nodbot_pending_reviews"] == "gauge"
    assert scrape.types[deliveries] == "counter"


REFUNDS = {"o-a": 10, "o-b": 20, "o-c": 30, "o-d": 40, "o-e": 50, "o-f": 5000}


def test_label_values_are_escaped_and_refusals_bounded() -> None:
    assert escape('a"b\\c\nd') == 'a\\"b\\\\c\\nd'
    assert refusal_reason("you started this run, so you may not approve its calls") == (
        "self_approval"
    )
    assert refusal_reason("you are not one of the reviewers of this call") == "not_a_reviewer"
    assert refusal_reason("amount 5000 > 10; whatever free text a reviewer made") == "other"


DASHBOARD = ROOT / "deploy" / "grafana-dashboard.json"
ALERTS = ROOT / "deploy" / "prometheus-alerts.yml"

PROMQL_WORDS = frozenset(
    {
        *("sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values"),
        *("bottomk", "topk", "quantile", "limitk", "limit_ratio"),
        *("by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset"),
        *("and", "or", "unless", "atan2", "inf", "nan"),
    }
)
"""PromQL's aggregations, modifiers and operators written as words: not metric names."""


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: its identifiers, once its strings, label
    matchers, ranges and label lists are taken out, except functions (a name followed by
    `(`) and PromQL's words."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)
    text = re.sub(r"\{[^}]*\}", "{}", text)
    text = re.sub(r"\[[^\]]*\]", "[]", text)
    lists = r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)"
    text = re.sub(lists, r"\1", text)
    found = set()
    for matched in re.finditer(r"(?<![\w.$:])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", text):
        word, called = matched.groups()
        if not called and word.lower() not in PROMQL_WORDS:
            found.add(word)
    return found


def dashboard_queries() -> list[str]:
    def walk(node: object) -> Iterator[str]:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "expr" and isinstance(value, str):
                    yield value
                else:
                    yield from walk(value)
        elif isinstance(node, list):
            for item in node:
                yield from walk(item)

    return list(walk(json.loads(DASHBOARD.read_text())))


def alert_rules() -> list[dict[str, Any]]:
    """The rules of the alerts file, once its shape is Prometheus' rule groups'."""
    document = yaml.safe_load(ALERTS.read_text())
    assert set(document) == {"groups"}
    rules = []
    for group in document["groups"]:
        assert set(group) <= {"name", "interval", "rules", "limit"}
        assert isinstance(group["name"], str) and group["rules"]
        for rule in group["rules"]:
            assert set(rule) <= {"alert", "expr", "for", "keep_firing_for", "labels", "annotations"}
            assert re.fullmatch(r"[A-Z][A-Za-z0-9]+", rule["alert"]), rule
            assert isinstance(rule["expr"], str) and rule["expr"].strip()
            if "for" in rule:
                assert re.fullmatch(r"\d+[smhdwy]", rule["for"]), rule["for"]
            for part in ("labels", "annotations"):
                assert all(isinstance(v, str) for v in rule.get(part, {}).values()), rule
            assert rule["labels"]["severity"] in {"warning", "critical"}
            rules.append(rule)
    return rules


def test_the_tokenizer_finds_metric_names_only() -> None:
    expr = (
        'histogram_quantile(0.9, sum by (tool, le) (rate(a_seconds_bucket{channel!~"x|y"}'
        "[$__rate_interval]))) > on (rule) group_left 0.5 * max by (rule) (b_seconds) "
        "and absent(c_up offset 5m) or 1e3 < bool d:recorded"
    )
    assert metric_names(expr) == {"a_seconds_bucket", "b_seconds", "c_up", "d:recorded"}


async def test_the_dashboard_and_alerts_query_only_series_the_bot_exposes(day: Day) -> None:
    run = await day.run("o-a", 10)
    approval_id = run["pending"][0]["approval_id"]
    assert (await day.decide(LEAD, approval_id, action="approve")).status_code == 403
    day.at(seconds=30)
    assert (await day.decide(REVIEWER, approval_id, action="approve")).status_code == 200
    await day.finished(run["run_id"])
    # Another replica approves a review: this one resumes its run, and reads when it was
    # decided (it was not recorded here).
    other_run = await day.run("o-b", 11)
    other_review = other_run["pending"][0]["approval_id"]
    day.at(seconds=45)
    async with SqlApprovalStore(day.url, clock=lambda: day.now[0]) as replica:
        await replica.decide(other_review, Decision(approved=True, decided_by=REVIEWER))
    day.at(seconds=50)  # it resumes at 45 s (found by the workers' poll) or 50 s (woken)
    await day.finished(other_run["run_id"])
    scrape = await day.scrape()
    run_seconds = "nodbot_decision_to_run_seconds"
    assert scrape.value(f"{run_seconds}_count", tool="refund", rule="1", consumer="run") == 2
    assert scrape.value(f"{run_seconds}_sum", tool="refund", rule="1", consumer="run") in (0, 5)
    exposed = scrape.names()
    for family, kind in scrape.types.items():  # declared, with or without samples yet
        suffixes = ("_bucket", "_sum", "_count") if kind == "histogram" else ("",)
        exposed |= {family + suffix for suffix in suffixes}
    # Every family the bot declares has samples after this much, but the ones of events
    # that did not happen (time-outs, escalations, ...).
    assert {"nodbot_review_decision_seconds_bucket", "nodbot_refusals_total"} <= scrape.names()

    queries = dashboard_queries()
    rules = alert_rules()
    assert len(queries) >= 6 and len(rules) >= 3
    named: set[str] = set()
    for expr in [*queries, *(rule["expr"] for rule in rules)]:
        names = metric_names(expr)
        assert names, f"no metric in {expr!r}"
        assert names <= exposed, f"{expr!r} names {sorted(names - exposed)}, not exposed"
        named |= names
    # What the issue asks to see: each is on the dashboard or in an alert.
    for wanted in (
        "nodbot_pending_reviews",
        "nodbot_oldest_pending_seconds",
        "nodbot_rule_timeout_seconds",
        "nodbot_review_decision_seconds_bucket",
        "nodbot_deliveries_total",
        "nodbot_http_requests_total",
        "nodbot_worker_up",
    ):
        assert wanted in named, wanted
    alerts = {rule["alert"] for rule in rules}
    assert {"NodbotReviewWaitingPastHalfItsTimeout", "NodbotDeliveriesFailing"} <= alerts
    assert "NodbotWorkerDown" in alerts
