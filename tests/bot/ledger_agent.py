"""An agent for the bot's tests whose refund tool writes down every time it really runs.

Every run asks for one refund (of the amount in its input, as `refund <order> <amount>`)
and then answers. `RUNS` is shared by every bot of the process, so replicas can be counted.
"""

from __future__ import annotations

from collections.abc import Sequence

from core import (
    Agent,
    AssistantMessage,
    ChatResponse,
    HumanMessage,
    Message,
    ToolCall,
    ToolRegistry,
    ToolSpec,
)

RUNS: list[tuple[str, float]] = []

tools = ToolRegistry()


@tools.tool(effects="destructive")
def refund(order_id: str, amount: float) -> str:
    """Refund an amount on an order."""
    RUNS.append((order_id, amount))
    return f"refunded {amount} on {order_id}"


class LedgerChat:
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


agent = Agent(LedgerChat(), tools)
