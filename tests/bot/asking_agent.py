"""An agent for the bot's tests whose tool asks a person before it does anything.

Every run ships one order: its input is `ship <order>` (a question with choices: which
warehouse) or `note <order>` (a free-text question: what to write on the parcel). The tool
asks (`ctx.ask`), the run pauses until a person answers, and then the tool runs again from
the top and returns. Each time a tool returns, it appends `<order> <answer>` to the file
named by `NODBOT_TEST_LEDGER` (when set) and to `SHIPPED`, so a test sees how many times,
and with which answer, it got past its question.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from nodbot.core import (
    Agent,
    AssistantMessage,
    ChatResponse,
    HumanMessage,
    Message,
    ToolCall,
    ToolContext,
    ToolRegistry,
    ToolSpec,
)

WAREHOUSES = ["Leeds", "Porto"]
SHIPPED: list[tuple[str, str]] = []

tools = ToolRegistry()


def _shipped(order_id: str, answer: str) -> None:
    SHIPPED.append((order_id, answer))
    ledger = os.environ.get("NODBOT_TEST_LEDGER")
    if ledger:
        with open(ledger, "a") as file:
            file.write(f"{order_id} {answer}\n")


@tools.tool()
async def ship(order_id: str, ctx: ToolContext) -> str:
    """Ship an order from the warehouse a person picks."""
    warehouse = await ctx.ask(f"Which warehouse ships order {order_id}?", choices=WAREHOUSES)
    _shipped(order_id, warehouse)
    return f"{order_id} ships from {warehouse}"


@tools.tool()
async def note(order_id: str, ctx: ToolContext) -> str:
    """Write the note a person gives on an order's parcel."""
    text = await ctx.ask(f"What should the parcel of order {order_id} say?", id="parcel_note")
    _shipped(order_id, text)
    return f"{order_id}: {text}"


class AskingChat:
    """Calls the tool its run's input names, then says what the tool answered."""

    async def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> ChatResponse:
        answered = [m for m in messages if m.role == "tool"]
        if answered:
            return ChatResponse(content=f"done: {answered[-1].content}")
        if any(isinstance(message, AssistantMessage) for message in messages):
            return ChatResponse(content="done")
        [asked] = [m for m in messages if isinstance(m, HumanMessage)]
        name, order_id = asked.content.split()
        call = ToolCall(id="call_1", name=name, arguments={"order_id": order_id})
        return ChatResponse(tool_calls=[call])


agent = Agent(AskingChat(), tools)
