"""`nodbot mcp`: an MCP server in front of your tools, where every `tools/call` waits for the
bot's rules (and, when they say so, a person) before it runs.

```
nodbot mcp --upstream-command "python -m shop.mcp_server" --bot http://127.0.0.1:8080
nodbot mcp --upstream-url http://127.0.0.1:9000/mcp --http 127.0.0.1:8765
nodbot mcp --tools shop.tools:registry --timeout 600
nodbot mcp --upstream-command "python -m shop.mcp_server" --client-approval
```

Point an MCP client (a desktop assistant, an agent framework's MCP client) at the gateway
instead of the server it fronts. The gateway speaks MCP over stdio (the default) or, with
`--http HOST:PORT`, streamable HTTP at `http://HOST:PORT/mcp` (the address it listens on is
printed to stderr; port 0 picks a free one).

What it serves, one of:
- `--upstream-command "CMD ARGS"`: an MCP server it starts as a child and talks to over
  stdio; the child inherits the gateway's environment, except the token variable;
- `--upstream-url URL`: an MCP server over streamable HTTP;
- `--tools package.module:registry`: the tools of a `nodbot.core.ToolRegistry`, run in the
  gateway's process (arguments validated by each tool's model before the review, and the
  edited ones again after it; the tools' own `confirm` is not consulted: the bot's rules are).

The upstream's tool list passes through unchanged (names, descriptions, input schemas, with
its pagination); only tools pass through (no resources, prompts, sampling or elicitation of
the upstream).

How a call maps to a review: each `tools/call` is put to the bot (`--bot URL`, default
http://127.0.0.1:8080) through its approval request API with the bearer token held in the
environment variable named by `--token-env` (default `NODBOT_TOKEN`; a token is never given
on the command line). The run id is `--run-id`, or else one per MCP session: one per gateway
process over stdio, one per `Mcp-Session-Id` over HTTP (a client with no session gets a new
run per call). The call id is the JSON-RPC id of the `tools/call` request; a request without
one gets a fresh id (so a replay of it is a new review). The tool's input schema goes with
the review as its `schema` (reviewers get a typed edit form, and edits are checked against
it), its description as the review's description. Then:
- allowed (by a rule at once, or by a reviewer): the call runs once, upstream, with the
  arguments of the decision (a reviewer's edit merged in), and its result is returned as is;
- denied: an error result (`isError: true`) with the reviewer's reason; nothing runs;
- a review waits for its decision, at most `--timeout` seconds (default 3600); after that the
  call returns an error result saying nobody decided in time, and nothing runs (the review
  stays open; the client's retry, a new request id, is a new review).
Every decision is taken once, as the one-use token the bot hands out for that run, call id,
tool and arguments (`core.client.ApprovalClient.consume`); nothing an MCP client says counts
as an approval.

`--client-approval` (opt-in, off by default) hands the control to the MCP client: instead of
the bot, the client's user approves each call through MCP elicitation (accept runs it with
the arguments as called, decline or cancel returns an error result). Whoever drives the
client decides, with no rules, reviewers or audit trail of the bot: leave it off where a
server-side reviewer is the control. It needs a client that declares the elicitation
capability and can be asked during a call (the handshake protocol versions); with any other
client every call is refused.

Limits: calls are not retried upstream (a failure upstream is the call's error result); an
unknown tool is refused before any review; with a fixed `--run-id`, request ids repeat
across sessions and restarts, so a repeated id with other arguments is refused by the bot
(give `--run-id` to a gateway serving one session).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import os
import socket
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import uvicorn

try:
    import mcp_types as types
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.server.context import ServerRequestContext
    from mcp.server.lowlevel import Server
    from mcp.server.stdio import stdio_server
except ImportError as exc:  # pragma: no cover - only without the extra
    raise ImportError("the MCP gateway needs the mcp extra: pip install 'nodbot[mcp]'") from exc

from nodbot.core import NodbotError, ToolRegistry, __version__
from nodbot.core.bridges.common import PendingCall, resolve_calls
from nodbot.core.calls import new_id
from nodbot.core.client import ApprovalClient, ApprovalClientError, DecisionTimeout
from nodbot.core.executor import Executor

__all__ = [
    "Allowed",
    "BotApproval",
    "ClientApproval",
    "Gateway",
    "McpUpstream",
    "RegistryUpstream",
    "gateway_server",
    "run_mcp_command",
]

MAX_DESCRIPTION = 2_000
"""The longest description the bot keeps with a review."""
_EMPTY_FORM: dict[str, Any] = {"type": "object", "properties": {}}


def _error(message: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=message)], is_error=True)


# --- what the gateway fronts ------------------------------------------------------------


class Upstream(Protocol):
    """The tools behind the gateway."""

    async def list_tools(
        self, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        """One page of the tools, unchanged."""
        ...

    async def find(self, name: str) -> types.Tool | None:
        """The tool called `name`, or None."""
        ...

    def prepare(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """The arguments as the reviewer sees them; raises `NodbotError` for invalid ones."""
        ...

    async def call(self, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        """Run the tool once."""
        ...


class McpUpstream:
    """An MCP server, through the `mcp` SDK's `ClientSession`."""

    def __init__(self, session: ClientSession) -> None:
        self._session = session
        self._tools: dict[str, types.Tool] = {}

    async def list_tools(
        self, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        listed = await self._session.list_tools(params=params)
        self._tools.update((tool.name, tool) for tool in listed.tools)
        return types.ListToolsResult(tools=listed.tools, next_cursor=listed.next_cursor)

    async def find(self, name: str) -> types.Tool | None:
        if name not in self._tools:  # not listed yet, or added since: read every page
            cursor: str | None = None
            while True:
                params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
                cursor = (await self.list_tools(params)).next_cursor
                if not cursor:
                    break
        return self._tools.get(name)

    def prepare(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return arguments  # the upstream validates them

    async def call(self, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        return await self._session.call_tool(name, arguments)


class RegistryUpstream:
    """The tools of a `ToolRegistry`, run in this process."""

    def __init__(self, registry: ToolRegistry, run_id: str) -> None:
        self._registry = registry
        self._context = Executor(registry).context(run_id=run_id)
        self._tools = {
            spec.name: types.Tool(
                name=spec.name, description=spec.description, input_schema=spec.parameters
            )
            for spec in registry.specs()
        }

    async def list_tools(
        self, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=list(self._tools.values()))

    async def find(self, name: str) -> types.Tool | None:
        return self._tools.get(name)

    def prepare(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return self._registry.get(name).validate(arguments).canonical

    async def call(self, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        tool = self._registry.get(name)
        try:
            values = tool.validate(arguments, source="edited arguments").values
        except NodbotError as error:
            return _error(f"{error}; nothing ran")
        try:
            value = await tool.invoke(values, self._context)
        except Exception as exc:
            return _error(f"tool {name!r} failed: {type(exc).__name__}: {exc}")
        if isinstance(value, str):
            return types.CallToolResult(content=[types.TextContent(text=value)])
        text = json.dumps(value, ensure_ascii=False, default=str)
        structured = value if isinstance(value, dict) else None
        return types.CallToolResult(
            content=[types.TextContent(text=text)], structured_content=structured
        )


# --- who approves -------------------------------------------------------------------------


@dataclass(frozen=True)
class Allowed:
    """The call may run, with these arguments."""

    arguments: dict[str, Any]


Verdict = Allowed | types.CallToolResult
"""Run the call (`Allowed`), or answer with this error result and run nothing."""


class Approver(Protocol):
    """Decides one call: `BotApproval` or `ClientApproval`."""

    async def __call__(
        self,
        ctx: ServerRequestContext[Any, Any],
        tool: types.Tool,
        arguments: dict[str, Any],
        run_id: str,
        call_id: str,
    ) -> Verdict: ...


@dataclass(frozen=True)
class BotApproval:
    """The bot's rules and reviewers decide, through its approval request API."""

    client: ApprovalClient
    within: float

    async def __call__(
        self,
        ctx: ServerRequestContext[Any, Any],
        tool: types.Tool,
        arguments: dict[str, Any],
        run_id: str,
        call_id: str,
    ) -> Verdict:
        description = (tool.description or "")[:MAX_DESCRIPTION] or None
        call = PendingCall(tool.name, arguments, call_id, tool.input_schema, description)
        try:
            [resolution] = await resolve_calls(self.client, run_id, [call], within=self.within)
        except (DecisionTimeout, TimeoutError):
            return _error(
                f"nobody decided the call of {tool.name!r} within {self.within:g} s; nothing ran"
            )
        except ApprovalClientError as error:
            return _error(f"the approval bot did not allow the call: {error}; nothing ran")
        if not resolution.approved:
            reason = resolution.message or "no reason given"
            return _error(f"the call of {tool.name!r} was denied: {reason}")
        return Allowed(resolution.arguments)


@dataclass(frozen=True)
class ClientApproval:
    """The MCP client's user decides, through MCP elicitation (`--client-approval`)."""

    within: float

    async def __call__(
        self,
        ctx: ServerRequestContext[Any, Any],
        tool: types.Tool,
        arguments: dict[str, Any],
        run_id: str,
        call_id: str,
    ) -> Verdict:
        capabilities = ctx.session.client_capabilities
        if capabilities is None or capabilities.elicitation is None:
            return _error(
                "this gateway needs its client's user to approve each call, and the client "
                "cannot ask (no elicitation capability); nothing ran"
            )
        shown = json.dumps(arguments, ensure_ascii=False, sort_keys=True)
        message = f"Allow the tool {tool.name!r} to run with {shown}?"
        try:
            async with asyncio.timeout(self.within):
                answer = await ctx.session.elicit_form(
                    message, _EMPTY_FORM, related_request_id=ctx.request_id
                )
        except TimeoutError:
            return _error(f"nobody answered within {self.within:g} s; nothing ran")
        except Exception as exc:  # the client could not be asked: fail closed
            return _error(f"the client's user could not be asked ({exc}); nothing ran")
        if answer.action != "accept":
            return _error(f"the user did not approve the call of {tool.name!r} ({answer.action})")
        return Allowed(arguments)


# --- the server ---------------------------------------------------------------------------


@dataclass
class Gateway:
    """The handlers of the gateway's MCP server."""

    upstream: Upstream
    approve: Approver
    run_id: str | None = None
    """`--run-id`; None: one per MCP session."""
    process_run: str = ""
    """The run id of this process's stdio session (and the prefix of the HTTP sessions');
    a fresh one when empty."""

    def __post_init__(self) -> None:
        self.process_run = self.process_run or new_id("mcp_")

    def run_of(self, ctx: ServerRequestContext[Any, Any]) -> str:
        """The run id of a request: `--run-id`, the process's (stdio), or its HTTP session's."""
        if self.run_id:
            return self.run_id
        if ctx.request is None:
            return self.process_run
        headers = getattr(ctx.request, "headers", None)
        session = headers.get("mcp-session-id") if headers is not None else None
        return f"{self.process_run}.{session}" if session else new_id("mcp_")

    async def list_tools(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return await self.upstream.list_tools(params)

    async def call_tool(
        self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        tool = await self.upstream.find(params.name)
        if tool is None:
            return _error(f"no tool is named {params.name!r}; nothing ran")
        try:
            arguments = self.upstream.prepare(tool.name, dict(params.arguments or {}))
        except NodbotError as error:
            return _error(f"{error}; nothing ran")
        call_id = str(ctx.request_id) if ctx.request_id is not None else new_id("call_")
        verdict = await self.approve(ctx, tool, arguments, self.run_of(ctx), call_id)
        if not isinstance(verdict, Allowed):
            return verdict
        try:
            return await self.upstream.call(tool.name, verdict.arguments)
        except Exception as exc:  # it may have run: say so, never retry
            return _error(f"the upstream call of {tool.name!r} failed: {exc}")


def gateway_server(gateway: Gateway) -> Server[Any]:
    """The gateway's low-level MCP server: `tools/list` and `tools/call` only."""
    return Server(
        "nodbot-mcp-gateway",
        version=__version__,
        on_list_tools=gateway.list_tools,
        on_call_tool=gateway.call_tool,
    )


# --- the command (its options are defined in `bot/cli/commands.py`) ----------------------------


def _registry(spec: str) -> ToolRegistry | str:
    """The registry named `module:attribute`, or what is wrong with the name."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        return f"argument --tools: module:name is needed, e.g. shop.tools:registry, not {spec!r}"
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        return f"argument --tools: cannot import {module_name}: {type(exc).__name__}: {exc}"
    found = getattr(module, attribute, None)
    if not isinstance(found, ToolRegistry):
        return f"argument --tools: {spec} is not a nodbot ToolRegistry"
    return found


def run_mcp_command(arguments: argparse.Namespace) -> int:
    """`nodbot mcp` (options as `bot/cli/commands.py` parses them): serve until the client goes away
    (stdio) or the process is stopped (HTTP); returns the exit status. A `--tools` that names
    no registry is a mistake (exit 2, one line)."""
    registry = None
    if arguments.tools is not None:
        found = _registry(arguments.tools)
        if isinstance(found, str):
            print(f"nodbot mcp: error: {found} (see nodbot mcp --help)", file=sys.stderr)
            return 2
        registry = found
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_run(arguments, registry))
    return 0


@contextlib.asynccontextmanager
async def _upstream(
    arguments: argparse.Namespace, registry: ToolRegistry | None, run_id: str
) -> AsyncIterator[Upstream]:
    if registry is not None:
        yield RegistryUpstream(registry, run_id)
        return
    async with contextlib.AsyncExitStack() as stack:
        if arguments.upstream_command is not None:
            words: list[str] = arguments.upstream_command
            # The child gets the gateway's environment, never the bot's token.
            env = {k: v for k, v in os.environ.items() if k != arguments.token_env}
            server = StdioServerParameters(command=words[0], args=words[1:], env=env)
            read, write = await stack.enter_async_context(stdio_client(server))
        else:
            read, write = await stack.enter_async_context(
                streamable_http_client(arguments.upstream_url)
            )
        session = await stack.enter_async_context(ClientSession(read, write))
        await session.initialize()
        yield McpUpstream(session)


async def _run(arguments: argparse.Namespace, registry: ToolRegistry | None) -> None:
    process_run = arguments.run_id or new_id("mcp_")
    async with contextlib.AsyncExitStack() as stack:
        upstream = await stack.enter_async_context(_upstream(arguments, registry, process_run))
        approve: Approver
        if arguments.client_approval:
            approve = ClientApproval(arguments.timeout)
        else:
            token = os.environ[arguments.token_env]
            client = await stack.enter_async_context(ApprovalClient(arguments.bot, token=token))
            approve = BotApproval(client, arguments.timeout)
        gateway = Gateway(upstream, approve, run_id=arguments.run_id, process_run=process_run)
        server = gateway_server(gateway)
        if arguments.http is None:
            async with stdio_server() as (read, write):
                await server.run(read, write, server.create_initialization_options())
        else:
            host, port = arguments.http
            await _serve_http(server, host, port, announce=_announce)


def _announce(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


async def _serve_http(
    server: Server[Any], host: str, port: int, *, announce: Callable[[str], None]
) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listening = socket.create_server((host, port), family=family)
    bound_port = listening.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    app = server.streamable_http_app(host=host)
    config = uvicorn.Config(app, log_level="warning", access_log=False)
    announce(f"nodbot mcp: serving MCP at http://{shown}:{bound_port}/mcp")
    await uvicorn.Server(config).serve(sockets=[listening])
