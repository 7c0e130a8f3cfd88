"""`nodbot init`: a bot that works from the first `nodbot serve`, in the current folder.

It writes three files, and never overwrites one that exists (it says which it left):

- `nodbot.yml`: SQLite beside it, the inbox, two API tokens (`ops` starts runs, the lead
  decides), and one rule: the agent's refunds wait for the lead; with `--full`, the
  annotated example instead (`nodbot.example.yml`, shipped in the package), every section
  written out and explained, for the agent below;
- `.env`: the secrets that file names (`${NODBOT_...}`), freshly generated, readable by its
  owner only; load it into the shell (`set -a && . ./.env && set +a`) or a service manager;
- `agent.py`: an agent to begin with, whose model is scripted (no key, nothing leaves the
  machine) and asks for one refund; replace it with your own model and tools. With
  `--full` it also has the example's other tools (`lookup_order`, `send_email`).
"""

from __future__ import annotations

import argparse
import importlib.resources
import os
import secrets
from pathlib import Path
from typing import Any

from nodbot.bot import DOCS_URL
from nodbot.core import NodbotError

__all__ = ["InitError", "add_init_command", "run_init_command"]


class InitError(NodbotError):
    """`nodbot init` cannot write where it was asked to (a folder it cannot make or write)."""

    kind = "init-error"


CONFIG = """\
# The bot `nodbot init` wrote. Every key, explained: nodbot init --full, and {docs}
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

MORE_TOOLS = '''

@tools.tool(effects="read")
def lookup_order(order_id: str) -> str:
    """Look an order up."""
    return f"order {order_id}: shipped"


@tools.tool(effects="write")
def send_email(to: str, subject: str, body: str) -> str:
    """Send an email to a customer."""
    return f"sent to {to}"
'''
"""The other tools of the annotated example's support agent (its rules name them)."""

EXAMPLE_AGENT = "examples.support_agent:agent"
"""The agent the annotated example names: in a folder of its own, the `agent.py` written."""

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
    init.add_argument(
        "--full",
        action="store_true",
        help="write the annotated example as nodbot.yml (every section, explained) and an "
        "agent.py with its tools, instead of the short file",
    )


def run_init_command(arguments: argparse.Namespace) -> str:
    """Write the files that are missing; returns what was done, a line each. Raises
    `InitError` when the folder cannot be made or a file cannot be written."""
    folder = Path(arguments.dir)
    environment = "".join(f"{name}={secrets.token_urlsafe(32)}\n" for name in SECRETS)
    if arguments.full:
        config, agent = (
            full_example(arguments.port),
            AGENT.replace(REFUND_END, REFUND_END + MORE_TOOLS),
        )
    else:
        config = CONFIG.format(port=arguments.port, reviewer=arguments.reviewer, docs=DOCS_URL)
        agent = AGENT
    files = {"nodbot.yml": config, ".env": environment, "agent.py": agent}
    try:
        folder.mkdir(parents=True, exist_ok=True)
        said = [_written(folder / name, text) for name, text in files.items()]
    except OSError as exc:
        where = exc.filename or folder
        raise InitError(f"cannot write {where}: {exc.strerror or exc}") from None
    said.append(f"next: set -a && . ./.env && set +a, then nodbot serve (the docs: {DOCS_URL})")
    return "\n".join(said)


def _written(path: Path, text: str) -> str:
    """Write `path` unless it exists; what was done."""
    try:
        # Created, never replaced (O_EXCL); the secrets readable by their owner alone.
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return f"kept {path} (it exists; nothing in it was changed)"
    with os.fdopen(descriptor, "w") as file:
        file.write(text)
    if path.name != ".env":
        path.chmod(0o644)
    return f"wrote {path}"


REFUND_END = """    return f"refunded {amount} on {order_id}"
"""


def full_example(port: int) -> str:
    """The annotated example the package ships (`nodbot.example.yml`), for a folder of its
    own: its agent is the `agent.py` beside it, and it listens on `port` by default."""
    text = importlib.resources.files("nodbot").joinpath("nodbot.example.yml").read_text("utf-8")
    text = text.replace(EXAMPLE_AGENT, "agent:agent", 1)
    return text.replace("${NODBOT_PORT:-8080}", f"${{NODBOT_PORT:-{port}}}", 1)
