"""`nodbot init`: a bot that works from the first `nodbot serve`, in the current folder.

It writes three files, and never overwrites one that exists (it says which it left):

- `nodbot.yml`: SQLite beside it, the inbox, two API tokens (`ops` starts runs, the lead
  decides), and one rule: the agent's refunds wait for the lead;
- `.env`: the secrets that file names (`${NODBOT_...}`), freshly generated, readable by its
  owner only; load it into the shell (`set -a && . ./.env && set +a`) or a service manager;
- `agent.py`: an agent to begin with, whose model is scripted (no key, nothing leaves the
  machine) and asks for one refund; replace it with your own model and tools.
"""

from __future__ import annotations

import argparse
import os
import secrets
from pathlib import Path
from typing import Any

__all__ = ["add_init_command", "run_init_command"]

CONFIG = """\
# The bot `nodbot init` wrote. Every knob: nodbot.example.yml and the README.
store:
  url: "sqlite:///nodbot.db"
server:
  host: 127.0.0.1
  port: {port}
web:
  secret: ${{NODBOT_WEB_SECRET}}
  public_url: http://127.0.0.1:{port}
audit:
  key: ${{NODBOT_AUDIT_KEY}}
api:
  tokens:
    - name: ops
      token: ${{NODBOT_TOKEN_OPS}}
      scopes: [runs:write, approvals:read]
    - name: {reviewer}
      token: ${{NODBOT_TOKEN_LEAD}}
      scopes: [approvals:read, approvals:decide]
agents:
  support: agent:agent
rules:
  - tool: refund
    description: Refunds wait for a lead.
    reviewers: [{reviewer}]
    editable: [amount]
"""

AGENT = '''\
"""The agent `nodbot init` wrote: `agents: {support: agent:agent}` in nodbot.yml.

Its model is scripted: it asks for a refund of the order named in the run's input, then
answers. Replace `ScriptedRefunds` with a real model, e.g.

    from nodbot import ChatCompletionsModel
    chat = ChatCompletionsModel(base_url="https://api.openai.com/v1", model="gpt-4o-mini",
                                api_key=os.environ["OPENAI_API_KEY"])

and the tools with yours.
"""

from __future__ import annotations

from collections.abc import Sequence

from nodbot import Agent, AssistantMessage, ChatResponse, HumanMessage, ToolCall, ToolRegistry

tools = ToolRegistry()


@tools.tool(effects="destructive")
def refund(order_id: str, amount: float) -> str:
    """Refund an amount on an order."""
    return f"refunded {amount} on {order_id}"


class ScriptedRefunds:
    """Asks for a refund of 120.0 on the last word of the input, then says it is done."""

    async def respond(self, messages: Sequence[object], tools: Sequence[object]) -> ChatResponse:
        if any(isinstance(message, AssistantMessage) for message in messages):
            return ChatResponse(content="The refund was decided; its result is above.")
        asked = [m.content for m in messages if isinstance(m, HumanMessage)][-1]
        order = asked.split()[-1] if asked.split() else "A-1001"
        arguments = {"order_id": order, "amount": 120.0}
        return ChatResponse(tool_calls=[ToolCall(id="call_1", name="refund", arguments=arguments)])


agent = Agent(ScriptedRefunds(), tools, system_prompt="You are a support agent.")
'''

SECRETS = ("NODBOT_WEB_SECRET", "NODBOT_AUDIT_KEY", "NODBOT_TOKEN_OPS", "NODBOT_TOKEN_LEAD")


def add_init_command(commands: Any) -> None:
    """`nodbot init [--dir D] [--port N] [--reviewer WHO]`."""
    from nodbot.bot.cli.commands import port_number  # the command's own port check

    init = commands.add_parser(
        "init",
        help="write a working nodbot.yml, .env (generated secrets) and agent.py",
        description="Write nodbot.yml, .env with freshly generated secrets and tokens, and "
        "a starter agent.py into a folder; files that exist are left as they are.",
    )
    init.add_argument("--dir", default=".", metavar="DIR", help="where (default: here)")
    init.add_argument("--port", type=port_number, default=8080, help="server.port (8080)")
    init.add_argument(
        "--reviewer",
        default="lead@example.com",
        metavar="WHO",
        help="who reviews refunds: an email address or a Slack user id",
    )


def run_init_command(arguments: argparse.Namespace) -> str:
    """Write the files that are missing; returns what was done, a line each."""
    folder = Path(arguments.dir)
    folder.mkdir(parents=True, exist_ok=True)
    environment = "".join(f"{name}={secrets.token_urlsafe(32)}\n" for name in SECRETS)
    files = {
        "nodbot.yml": CONFIG.format(port=arguments.port, reviewer=arguments.reviewer),
        ".env": environment,
        "agent.py": AGENT,
    }
    said = []
    for name, text in files.items():
        path = folder / name
        try:
            # Created, never replaced (O_EXCL); the secrets readable by their owner alone.
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            said.append(f"kept {path} (it exists; nothing in it was changed)")
            continue
        with os.fdopen(descriptor, "w") as file:
            file.write(text)
        if name != ".env":
            path.chmod(0o644)
        said.append(f"wrote {path}")
    said.append(
        "next: set -a && . ./.env && set +a, then nodbot serve (see the README, Running the bot)"
    )
    return "\n".join(said)
