"""The agent of `bench/bot.py`: its refund tool writes down when it runs, and how often.

Every run asks for one refund (of the order and amount in its input, written
`refund <order> <amount>`) and then answers "done". When the tool runs it records
`time.perf_counter()` in `RAN_AT[order_id]` and counts the run in `RUNS[order_id]`; the bot
runs in the benchmark's process, so the benchmark reads both directly, on the same clock.
Order ids must be unique per run for the figures to mean anything.

The refund is a plain `def`, as a user writes it: it runs in a thread of the tool pool
(`core.threads`), as any tool that may block does. `async_agent` and `nonblocking_agent` run
the same refund as an `async def` and as a `def` declared `blocking=False` (on the bot's
loop): `bench/bot.py --tool` picks one.

The bot imports it as `bench.bot_agent:agent` (from the repository's root); the benchmark must
import it under the same name to see the same dictionaries.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence

from nodbot.core import (
    Agent,
    AssistantMessage,
    ChatResponse,
    HumanMessage,
    Message,
    ToolCall,
    ToolRegistry,
    ToolSpec,
)

__all__ = ["RAN_AT", "RUNS", "agent", "async_agent", "forget", "nonblocking_agent", "tools"]

RAN_AT: dict[str, float] = {}
"""order_id -> `time.perf_counter()` when the refund of that order ran (the last time)."""
RUNS: Counter[str] = Counter()
"""order_id -> how many times the refund of that order ran."""


def refund(order_id: str, amount: float) -> str:
    """Refund an amount on an order."""
    RAN_AT[order_id] = time.perf_counter()
    RUNS[order_id] += 1
    return f"refunded {amount} on {order_id}"


async def refund_async(order_id: str, amount: float) -> str:
    """Refund an amount on an order."""
    return refund(order_id, amount)


tools = ToolRegistry()
tools.tool(name="refund", effects="destructive")(refund)
async_tools = ToolRegistry()
async_tools.tool(name="refund", effects="destructive")(refund_async)
nonblocking_tools = ToolRegistry()
nonblocking_tools.tool(name="refund", effects="destructive", blocking=False)(refund)


def forget() -> None:
    """Clear what the tool has recorded."""
    RAN_AT.clear()
    RUNS.clear()


class RefundChat:
    """Asks for the refund named in the run's input, then says it is done."""

    async def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> ChatResponse:
        if any(isinstance(message, AssistantMessage) for message in messages):
            return ChatResponse(content="done")
        [asked] = [m for m in messages if isinstance(m, HumanMessage)]
        _, order_id, amount = asked.content.split()
        call = ToolCall(
            id="call_1", name="refund", arguments={"order_id": order_id, "amount": amount}
        )
        return ChatResponse(tool_calls=[call])


agent = Agent(RefundChat(), tools)
async_agent = Agent(RefundChat(), async_tools)
nonblocking_agent = Agent(RefundChat(), nonblocking_tools)
