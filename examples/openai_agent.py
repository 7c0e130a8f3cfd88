"""A support agent on a real model: `agents: {support: examples.openai_agent:agent}`.

Any OpenAI-compatible chat-completions API serves: OpenAI, or a model server on this machine
(vLLM, llama.cpp's `llama-server`, Ollama's `/v1`). It reads

- `OPENAI_BASE_URL`: the API's root, `/v1` included (default `https://api.openai.com/v1`);
- `OPENAI_API_KEY`: sent as a bearer token (local servers usually need none);
- `OPENAI_MODEL`: the model's name on that server (default `gpt-4o-mini`).

The refund needs a reviewer; the lookup runs at once. The tools only return text.

    OPENAI_API_KEY=sk-... python examples/openai_agent.py "Refund order A-1001, please."
"""

from __future__ import annotations

import asyncio
import os
import sys

from nodbot.core import Agent, ChatCompletionsModel, ToolRegistry

tools = ToolRegistry()


@tools.tool(confirm=True, effects="destructive")
def refund(order_id: str, amount: float) -> str:
    """Refund an amount on an order."""
    return f"refunded {amount} on {order_id}"


@tools.tool(effects="read")
def lookup_order(order_id: str) -> str:
    """Look an order up: its status and total."""
    return f"order {order_id}: delivered, total 120.0"


chat = ChatCompletionsModel(
    base_url=os.environ.get("OPENAI_BASE_URL", "https://api.openai.com/v1"),
    model=os.environ.get("OPENAI_MODEL", "gpt-4o-mini"),
    api_key=os.environ.get("OPENAI_API_KEY") or None,
    temperature=0.0,
)

agent = Agent(
    chat,
    tools,
    system_prompt=(
        "You are a support agent. Look orders up before refunding them; "
        "refund at most the order's total."
    ),
)


async def main(text: str) -> None:
    """One run in this process: every call that needs review is denied (no reviewers here)."""
    async with chat:
        executor = agent.executor()
        result = await agent.run(text, executor.context())
    for message in result.messages[1:]:
        print(message.model_dump_json(exclude_defaults=True))
    print(result.finish, result.final_text or "")


if __name__ == "__main__":
    asyncio.run(main(" ".join(sys.argv[1:]) or "What is the status of order A-1001?"))
