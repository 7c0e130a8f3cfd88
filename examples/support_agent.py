"""A support agent for `nodbot.example.yml`: `agents: {support: examples.support_agent:agent}`.

Its scripted model asks for a refund of 120.0 on order A-1001, then answers. The tools
only return text: nothing leaves the machine.
"""

from __future__ import annotations

from nodbot.core import Agent, ChatResponse, ScriptedChat, ToolCall, ToolRegistry

tools = ToolRegistry()


@tools.tool(effects="destructive")
def refund(order_id: str, amount: float) -> str:
    """Refund an amount on an order."""
    return f"refunded {amount} on {order_id}"


@tools.tool(effects="read")
def lookup_order(order_id: str) -> str:
    """Look an order up: its status and total."""
    return f"order {order_id}: delivered, total 120.0"


@tools.tool(effects="write")
def send_email(to: str, subject: str, body: str) -> str:
    """Send an email to a customer or a colleague."""
    return f"sent {subject!r} to {to}"


chat = ScriptedChat(
    [
        ChatResponse(
            tool_calls=[
                ToolCall(
                    id="call_1",
                    name="refund",
                    arguments={"order_id": "A-1001", "amount": 120.0},
                )
            ]
        ),
        "I asked for the refund of order A-1001; the reviewer's decision is in its result.",
    ]
)

agent = Agent(
    chat,
    tools,
    system_prompt="You are a support agent. Look orders up, refund them, email customers.",
)
