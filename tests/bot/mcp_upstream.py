"""A small MCP server for the gateway's tests (run as `python tests/bot/mcp_upstream.py`): a
`refund` tool that appends one JSON line per run to the file named by `MCP_UPSTREAM_RUNS`,
so a test can count what really ran, and with which arguments. `registry` holds the same
`refund` as a nodbot `ToolRegistry`, for the gateway's `--tools`."""

from __future__ import annotations

import json
import os

from mcp.server.mcpserver import MCPServer

from nodbot.core import ToolRegistry

server = MCPServer("shop")
registry = ToolRegistry()


def refund(order_id: str, amount: float) -> str:
    """Refund an order."""
    with open(os.environ["MCP_UPSTREAM_RUNS"], "a", encoding="utf-8") as runs:
        runs.write(json.dumps({"order_id": order_id, "amount": amount}) + "\n")
    return f"refunded {amount} on {order_id}"


def lookup(order_id: str) -> str:
    """Look an order up."""
    return f"order {order_id}: paid"


server.tool()(refund)
server.tool()(lookup)
registry.add(refund, confirm=True, effects="destructive")

if __name__ == "__main__":
    server.run()
