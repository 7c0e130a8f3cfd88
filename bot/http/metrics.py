"""`GET /metrics`: a few figures in Prometheus' text format (no token: they name no person,
tool or argument). Approvals by status come from the store, the rest from this process."""

from __future__ import annotations

from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from nodbot.core import ApprovalStore

__all__ = ["metrics_endpoint"]

CONTENT_TYPE = "text/plain; version=0.0.4"


def metrics_endpoint(
    store: ApprovalStore, counters: Callable[[], dict[str, int]]
) -> Callable[[Request], object]:
    """The route handler; `counters()` gives this process's counters, by name."""

    async def metrics(request: Request) -> Response:
        lines = [
            "# HELP nodbot_approvals Approvals in the store, by status.",
            "# TYPE nodbot_approvals gauge",
        ]
        for status, number in (await store.counts()).items():
            lines.append(f'nodbot_approvals{{status="{status}"}} {number}')
        for name, number in sorted(counters().items()):
            what = name.replace("_", " ").capitalize()
            lines += [
                f"# HELP nodbot_{name}_total {what} by this process.",
                f"# TYPE nodbot_{name}_total counter",
                f"nodbot_{name}_total {number}",
            ]
        return PlainTextResponse("\n".join(lines) + "\n", media_type=CONTENT_TYPE)

    return metrics
