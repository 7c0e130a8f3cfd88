"""`GET /metrics`: the bot's figures in Prometheus' text format (no token: they name no
person and no argument; tools and rules are named as the configuration names them).

Two kinds of series. What this process did (`bot.metrics`: decisions and their waits,
deliveries, refusals, time-outs, escalations, HTTP requests, and the older counters), which
Prometheus sums over the replicas; and what the store holds, read at each scrape (approvals by
status, pending reviews by tool and rule and the oldest one's age), the same on every replica
that shares the store: aggregate those with `max`, not `sum`. The rules' timeouts come from
the configuration and the workers' state from this process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from nodbot.bot.metrics import METRICS, Metrics, escape
from nodbot.bot.service import UNHEALTHY_AFTER, BotService, WorkerHealth
from nodbot.core import ApprovalStore

if TYPE_CHECKING:
    from nodbot.bot.config import Config

__all__ = ["metrics_endpoint"]

CONTENT_TYPE = "text/plain; version=0.0.4"


def metrics_endpoint(
    store: ApprovalStore,
    counters: Callable[[], dict[str, int]],
    service: BotService | None = None,
    *,
    metrics: Metrics = METRICS,
) -> Callable[[Request], object]:
    """The route handler; `counters()` gives this process's older counters, by name; with
    a `service`, its rules' timeouts and its workers' state are told too."""

    async def endpoint(request: Request) -> Response:
        lines = [
            "# HELP nodbot_approvals Approvals in the store, by status (the same on every "
            "replica).",
            "# TYPE nodbot_approvals gauge",
        ]
        for status, number in (await store.counts()).items():
            lines.append(f'nodbot_approvals{{status="{status}"}} {number}')
        config = service.config if service is not None else None
        lines += await _pending(store, metrics, config)
        if config is not None:
            lines += _timeouts(config)
        if service is not None:
            lines += _workers(service.health)
        for name, number in sorted(counters().items()):
            what = name.replace("_", " ").capitalize()
            lines += [
                f"# HELP nodbot_{name}_total {what} by this process.",
                f"# TYPE nodbot_{name}_total counter",
                f"nodbot_{name}_total {number}",
            ]
        lines += metrics.render()
        return PlainTextResponse("\n".join(lines) + "\n", media_type=CONTENT_TYPE)

    return endpoint


async def _pending(store: ApprovalStore, metrics: Metrics, config: Config | None) -> list[str]:
    """Pending reviews by tool and rule, and the age of the oldest of each, from the store;
    a rule of the configuration that names its tool and has nothing pending says 0."""
    now = metrics.clock()
    found: dict[tuple[str, str], tuple[int, float]] = {}
    if config is not None:
        for number, rule in enumerate(config.rules):
            if rule.tool != "*" and rule.decision is None:
                found[(metrics.tool(rule.tool), str(number))] = (0, 0.0)
    for record in await store.list(status="pending"):
        key = (metrics.tool(record.request.tool), metrics.rule(record.request.policy))
        count, oldest = found.get(key, (0, 0.0))
        age = max(0.0, (now - record.created_at).total_seconds())
        found[key] = (count + 1, max(oldest, age))
    lines = [
        "# HELP nodbot_pending_reviews Reviews waiting for a decision, by tool and rule (from "
        "the store: the same on every replica).",
        "# TYPE nodbot_pending_reviews gauge",
    ]
    lines += [
        f'nodbot_pending_reviews{{tool="{escape(tool)}",rule="{escape(rule)}"}} {count}'
        for (tool, rule), (count, _) in sorted(found.items())
    ]
    lines += [
        "# HELP nodbot_oldest_pending_seconds Age in seconds of the oldest review waiting for a "
        "decision, by tool and rule; 0 when none waits (from the store).",
        "# TYPE nodbot_oldest_pending_seconds gauge",
    ]
    lines += [
        f'nodbot_oldest_pending_seconds{{tool="{escape(tool)}",rule="{escape(rule)}"}} '
        f"{round(age, 3)}"
        for (tool, rule), (_, age) in sorted(found.items())
    ]
    return lines


def _timeouts(config: Config) -> list[str]:
    """Each rule's `timeout` (and the defaults'), to compare the oldest pending ages with."""
    lines = [
        "# HELP nodbot_rule_timeout_seconds The timeout of each rule that has one (from the "
        "configuration).",
        "# TYPE nodbot_rule_timeout_seconds gauge",
    ]
    rules: Iterable[tuple[str, float | None]] = (
        (str(number), rule.timeout) for number, rule in enumerate(config.rules)
    )
    if config.defaults is not None:
        rules = [*rules, ("defaults", config.defaults.timeout)]
    for name, timeout in rules:
        if timeout is not None:
            lines.append(f'nodbot_rule_timeout_seconds{{rule="{name}"}} {float(timeout):g}')
    return lines


def _workers(health: WorkerHealth) -> list[str]:
    """1 for each task of this process that works, 0 for one that is down: the workers (and
    their runs and outbox lanes, down after failing steps in a row), the database's notices
    where the store has them, and every supervised task that has been down once."""
    up = {"workers": health.running and "workers" not in health.down}
    for lane in ("runs", "outbox"):
        up[lane] = health.running and health.lanes.get(lane, (0, ""))[0] < UNHEALTHY_AFTER
    if health.listening is not None:
        up["notices"] = health.listening.connected
    for name in health.tasks:
        up[name] = name not in health.down
    lines = [
        "# HELP nodbot_worker_up Whether each task of this process works (1) or is down (0).",
        "# TYPE nodbot_worker_up gauge",
    ]
    lines += [
        f'nodbot_worker_up{{task="{escape(name)}"}} {int(ok)}' for name, ok in sorted(up.items())
    ]
    return lines
