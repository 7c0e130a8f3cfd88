"""The `nodbot` command."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from nodbot.bot import DOCS_URL
from nodbot.bot.cli.approvals import (
    add_approvals_commands,
    bulk_mistake,
    run_approvals_command,
    run_bulk_command,
)
from nodbot.bot.cli.audit import (
    AuditCommandError,
    add_audit_commands,
    key_from_environment,
    run_audit_command,
)
from nodbot.bot.cli.delegate import add_delegate_command, run_delegate_command
from nodbot.bot.cli.init import InitError, add_init_command, run_init_command
from nodbot.bot.cli.questions import NotAQuestionError, answer_mistake
from nodbot.bot.cli.rules import add_rules_commands, run_rules_command
from nodbot.bot.cli.runs import add_runs_commands, run_runs_command
from nodbot.bot.cli.sessions import add_sessions_commands, run_sessions_command
from nodbot.bot.config import ConfigError, load_config, trust_warnings
from nodbot.bot.config.agents import report_agents
from nodbot.bot.config.models import store_url_problem
from nodbot.bot.config.values import listen_host
from nodbot.bot.serve import CannotListen, serve
from nodbot.bot.web import SignInLinkError, sign_in_link
from nodbot.core import (
    ConfigurationError,
    InvalidArgumentsError,
    InvalidDecisionError,
    NodbotError,
    SqlApprovalStore,
    __version__,
)
from nodbot.core.decisions import response_problem
from nodbot.core.sqlstore import head_revision

DEFAULT_STORE = "sqlite:///nodbot.db"

USAGE_ERROR = 2
"""The exit status of a bad input: a mistake in the command line (argparse's own), or in the
configuration file or another file it names (missing, unreadable, not YAML, refused by the
schema, an unset variable), or a value the command refuses (a host, an agent, a store URL)."""

FAILED = 1
"""The exit status of a command that was given good input and failed while running: the store
cannot be used, a run or an approval that is not there, a decision refused, an audit chain
that does not verify."""

EXIT_STATUSES = (
    "exit status: 0 done; 1 failed while running (the store cannot be used, no such run or "
    "approval, a decision refused, an audit chain that does not verify); 2 a bad input (the "
    "command line, the configuration file or a file it names, a value refused)"
)

BAD_INPUT: tuple[type[Exception], ...] = (
    CannotListen,
    ConfigurationError,
    InvalidArgumentsError,
    InvalidDecisionError,
    NotAQuestionError,
    AuditCommandError,
    InitError,
    SignInLinkError,
)
"""The errors of a bad input (exit status 2): a `ConfigError` of the file, an edit whose
arguments the tool refuses (`approvals decide ... edit --arguments`), a decision the
approval does not take (an answer that is none of a question's choices, an approve of a
question), `approvals answer` of a call's review, an unset key variable."""


class _Parser(argparse.ArgumentParser):
    """argparse's parser, saying a mistake in one line (and where to read more), exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_ERROR, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def port_number(text: str) -> int:
    """A TCP port: 0 (pick a free one) to 65535."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(
            f"{port} is not a port: use 0 to 65535 (0 picks a free one)"
        )
    return port


def build_parser() -> argparse.ArgumentParser:
    """The command line: subcommands are added here as the bot grows."""
    parser = _Parser(
        prog="nodbot",
        description="A self-hosted approval bot: risky tool calls wait for a person.",
        epilog=f"{EXIT_STATUSES}. Docs: {DOCS_URL}",
    )
    parser.add_argument("--version", action="version", version=f"nodbot {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    migrate = commands.add_parser(
        "migrate",
        help="create or upgrade the approval store's schema",
        description="Create or upgrade the schema of the approval store's database.",
    )
    migrate.add_argument(
        "--store",
        type=store_url,
        default=DEFAULT_STORE,
        metavar="URL",
        help=f"sqlite:///path.db or postgresql://user@host/db (default: {DEFAULT_STORE})",
    )
    migrate.add_argument(
        "--key-env",
        metavar="NAME",
        help="the environment variable holding the audit key, which the events already "
        "there are chained with when the upgrade adds the audit chain (as audit.key)",
    )
    check = commands.add_parser(
        "check-config",
        help="validate a configuration file and import its agents",
        description="Validate a configuration file (nodbot.yml) and import its agents; "
        "every problem is printed with its file, line and key.",
    )
    check.add_argument("file", metavar="FILE", help="the YAML file, e.g. nodbot.yml")
    serve = commands.add_parser(
        "serve",
        help="run the bot: the HTTP API and the workers that resume runs",
        description="Run the bot of a configuration file until stopped (Ctrl-C).",
    )
    serve.add_argument("--config", default="nodbot.yml", metavar="FILE", help="nodbot.yml")
    serve.add_argument(
        "--host",
        type=_host,
        help="listen address: an IP address or a host name of this machine, 0.0.0.0 for "
        "every interface (default: server.host of the file)",
    )
    serve.add_argument("--port", type=port_number, help="port (default: server.port; 0 picks one)")
    link = commands.add_parser(
        "inbox-link",
        help="print a link that signs a reviewer in to the web inbox",
        description="Print a sign-in link to the web inbox for one reviewer, valid for "
        "web.link_ttl; it is signed with web.secret, which the file must set.",
    )
    link.add_argument("--config", default="nodbot.yml", metavar="FILE", help="nodbot.yml")
    link.add_argument(
        "--reviewer",
        required=True,
        metavar="WHO",
        help="who signs in: a Slack user id or an email address, as in the rules' reviewers",
    )
    add_approvals_commands(commands)
    add_runs_commands(commands)
    add_rules_commands(commands)
    add_audit_commands(commands)
    add_sessions_commands(commands)
    add_delegate_command(commands)
    add_init_command(commands)
    _add_mcp_command(commands)
    _say_exit_statuses(parser)
    return parser


def _say_exit_statuses(parser: argparse.ArgumentParser) -> None:
    """Every command's help ends with what its exit statuses mean (unless it says more)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command in action.choices.values():
                command.epilog = command.epilog or f"{EXIT_STATUSES}."
                _say_exit_statuses(command)


MCP_DEFAULT_BOT = "http://127.0.0.1:8080"
MCP_DEFAULT_TIMEOUT = 3600.0


def store_url(text: str) -> str:
    """`--store`: a store URL of a supported database, or a file path."""
    refused = store_url_problem(text)
    if refused is not None:
        raise argparse.ArgumentTypeError(refused)
    return text


def _host(text: str) -> str:
    """`--host`: an IP address (IPv6 maybe in brackets) or a host name."""
    try:
        return listen_host(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _command_words(text: str) -> list[str]:
    """A command line, split as a POSIX shell would (no shell runs it)."""
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc} in {text!r}") from None
    if not words:
        raise argparse.ArgumentTypeError("the command is empty")
    return words


def _host_port(text: str) -> tuple[str, int]:
    """HOST:PORT, the host maybe in brackets (IPv6)."""
    host, _, port = text.rpartition(":")
    host = host.strip("[]")
    if not host:
        raise argparse.ArgumentTypeError(f"HOST:PORT is needed, e.g. 127.0.0.1:8765, not {text!r}")
    return host, port_number(port)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"a number of seconds above 0 is needed, not {text!r}")
    return value


def _add_mcp_command(commands: Any) -> None:
    """`nodbot mcp`: the MCP gateway (`bot/mcp_gateway.py`)."""
    mcp = commands.add_parser(
        "mcp",
        help="an MCP server whose every tools/call waits for the bot's rules",
        description="An MCP server (stdio, or streamable HTTP with --http) in front of an "
        "upstream MCP server or a ToolRegistry: its tools pass through unchanged, and each "
        "tools/call is put to the bot's rules (a person reviews it when they say so) and "
        "runs once, as decided. Give exactly one of --upstream-command, --upstream-url, "
        "--tools.",
    )
    mcp.add_argument(
        "--upstream-command",
        type=_command_words,
        metavar="CMD",
        help='an MCP server to start and talk to over stdio, e.g. "python -m shop.server"',
    )
    mcp.add_argument("--upstream-url", metavar="URL", help="an MCP server over streamable HTTP")
    mcp.add_argument(
        "--tools",
        metavar="MODULE:NAME",
        help="a nodbot ToolRegistry to serve and run in this process, e.g. shop.tools:registry",
    )
    mcp.add_argument(
        "--bot",
        default=MCP_DEFAULT_BOT,
        metavar="URL",
        help=f"the bot serving the approval request API (default: {MCP_DEFAULT_BOT})",
    )
    mcp.add_argument(
        "--token-env",
        default="NODBOT_TOKEN",
        metavar="NAME",
        help="the environment variable holding the bot's bearer token, with the scope "
        "approvals:request (default: NODBOT_TOKEN)",
    )
    mcp.add_argument(
        "--run-id", metavar="ID", help="the run of every call (default: one per MCP session)"
    )
    mcp.add_argument(
        "--timeout",
        type=_seconds,
        default=MCP_DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help="how long a call waits for its decision; then it fails and nothing runs "
        f"(default: {MCP_DEFAULT_TIMEOUT:g})",
    )
    mcp.add_argument(
        "--http",
        type=_host_port,
        metavar="HOST:PORT",
        help="serve streamable HTTP at http://HOST:PORT/mcp instead of stdio (port 0 picks one)",
    )
    mcp.add_argument(
        "--client-approval",
        action="store_true",
        help="opt-in: the MCP client's user approves each call (MCP elicitation) instead of "
        "the bot; this hands the control to whoever drives the client",
    )


def _mcp_mistake(arguments: argparse.Namespace) -> str | None:
    """`mcp`: what is wrong with its command line, or None."""
    given = [
        option
        for option, value in (
            ("--upstream-command", arguments.upstream_command),
            ("--upstream-url", arguments.upstream_url),
            ("--tools", arguments.tools),
        )
        if value is not None
    ]
    if not given:
        return "say what to serve: --upstream-command, --upstream-url or --tools"
    if len(given) > 1:
        return f"serve one thing: {' and '.join(given)} were both given"
    if not arguments.client_approval and not os.environ.get(arguments.token_env):
        return (
            f"the environment variable {arguments.token_env} holds no token of the bot: set "
            "it, or name another with --token-env"
        )
    return None


async def _migrate(url: str, key_env: str | None) -> str:
    key = key_from_environment(key_env) if key_env else None
    store = SqlApprovalStore(url, auto_migrate=True, audit_key=key)
    try:
        await store.open()
    finally:
        await store.close()
    return f"the database {store.display_url} is at schema revision {head_revision()}"


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _check_config(file: str) -> int:
    """Validate `file` and import its agents: prints its warnings to stderr (what cannot be
    trusted, see `trust_warnings`, then the agents'), then `FILE: ok (...)`, and returns 0;
    or prints every problem to stderr and returns 2 (a bad input)."""
    warnings: list[str] = []
    try:
        config = load_config(file)
    except ConfigError as error:
        problems = error.problems
    else:
        report = report_agents(config)
        problems, warnings = report.problems, [*trust_warnings(config), *report.warnings]
    if problems:
        for problem in problems:
            print(problem, file=sys.stderr)
        return USAGE_ERROR
    for warning in warnings:
        print(warning, file=sys.stderr)
    counts = [_plural(len(config.rules), "rule"), _plural(len(config.agents), "agent")]
    if warnings:
        counts.append(_plural(len(warnings), "warning"))
    print(f"{file}: ok ({', '.join(counts)})")
    return 0


def _serve(config_file: str, host: str | None, port: int | None) -> None:
    def announce(line: str) -> None:
        print(line, flush=True)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(config_file, host=host, port=port, announce=announce))


def _decision_mistake(arguments: argparse.Namespace) -> str | None:
    """`approvals decide`: what is wrong with its decision (one of approve, edit, deny or
    `--respond`), `--respond` (a text, alone) and `--arguments` (a JSON object, given for
    an edit and only then), or None."""
    text, action, respond = arguments.arguments, arguments.decision, arguments.respond
    if respond is not None:
        if action is not None:
            return f"--respond answers in the tool's place: give it without {action}"
        if arguments.reason is not None:
            return "--respond is the one text the model gets: leave --reason out"
        if text is not None:
            return "--arguments is for edit only, not --respond"
        problem = response_problem(respond)
        return None if problem is None else f"argument --respond: {problem}"
    if action is None:
        return "say the decision: approve, edit or deny, or --respond TEXT"
    if action == "edit" and text is None:
        return "an edit needs --arguments, the values to change, e.g. '{\"amount\": 100}'"
    if text is None:
        return None
    if action != "edit":
        return f"--arguments is for edit only, not {action}"
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return f"argument --arguments: not valid JSON: {exc.msg} (column {exc.colno})"
    except RecursionError:
        return "argument --arguments: not valid JSON: nested too deeply"
    if not isinstance(value, dict):
        return f"argument --arguments: a JSON object is needed, not {type(value).__name__}"
    return None


def _approvals_mistake(arguments: argparse.Namespace) -> tuple[str, str | None]:
    """`approvals bulk`, `decide`, `answer` and `decline`: the command, and what is wrong
    with its input beyond what argparse checks (None: nothing)."""
    if arguments.action == "bulk":
        return "bulk", bulk_mistake(arguments)
    if arguments.action == "decide":
        return "decide", _decision_mistake(arguments)
    if arguments.action in ("answer", "decline"):
        return arguments.action, answer_mistake(arguments)
    return arguments.action, None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; returns the exit status."""
    parser = build_parser()
    arguments = parser.parse_args(argv)
    if arguments.command == "approvals":
        command, mistake = _approvals_mistake(arguments)
        if mistake is not None:
            prog = f"nodbot approvals {command}"
            parser.exit(USAGE_ERROR, f"{prog}: error: {mistake} (see {prog} --help)\n")
    if arguments.command is None:
        parser.print_help(sys.stdout)
        return 0
    if arguments.command == "mcp":
        mistake = _mcp_mistake(arguments)
        if mistake is not None:
            parser.exit(USAGE_ERROR, f"nodbot mcp: error: {mistake} (see nodbot mcp --help)\n")
        try:  # imported here: the gateway needs the optional `mcp` extra
            from nodbot.bot.mcp_gateway import run_mcp_command
        except ImportError as exc:
            print(f"nodbot mcp: {exc}", file=sys.stderr)
            return FAILED
        return run_mcp_command(arguments)
    if arguments.command == "check-config":
        return _check_config(arguments.file)
    try:
        if arguments.command == "serve":
            _serve(arguments.config, arguments.host, arguments.port)
        elif arguments.command == "approvals" and arguments.action == "bulk":
            return asyncio.run(run_bulk_command(arguments))
        elif arguments.command == "approvals":
            print(asyncio.run(run_approvals_command(arguments)))
        elif arguments.command == "runs":
            print(asyncio.run(run_runs_command(arguments)))
        elif arguments.command == "rules":
            return asyncio.run(run_rules_command(arguments))
        elif arguments.command == "init":
            print(run_init_command(arguments))
        elif arguments.command == "sessions":
            print(asyncio.run(run_sessions_command(arguments)))
        elif arguments.command == "delegate":
            print(asyncio.run(run_delegate_command(arguments)))
        elif arguments.command == "audit":
            return asyncio.run(run_audit_command(arguments))
        elif arguments.command == "inbox-link":
            print(sign_in_link(load_config(arguments.config), arguments.reviewer))
        else:
            print(asyncio.run(_migrate(arguments.store, arguments.key_env)))
    except ConfigError as error:
        for problem in error.problems:
            print(problem, file=sys.stderr)
        return USAGE_ERROR
    except BAD_INPUT as error:
        print(f"nodbot: {error}", file=sys.stderr)
        return USAGE_ERROR
    except NodbotError as error:
        print(f"nodbot: {error}", file=sys.stderr)
        return FAILED
    return 0


if __name__ == "__main__":
    sys.exit(main())
