"""The `nodbot` command."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from collections.abc import Sequence
from typing import NoReturn

from nodbot.bot.approvals_cli import add_approvals_commands, run_approvals_command
from nodbot.bot.audit_cli import add_audit_commands, key_from_environment, run_audit_command
from nodbot.bot.config import ConfigError, load_config, trust_warnings
from nodbot.bot.config.agents import report_agents
from nodbot.bot.init_cli import add_init_command, run_init_command
from nodbot.bot.runs_cli import add_runs_commands, run_runs_command
from nodbot.bot.serve import CannotListen, serve
from nodbot.bot.sessions_cli import add_sessions_commands, run_sessions_command
from nodbot.bot.web import sign_in_link
from nodbot.core import NodbotError, SqlApprovalStore, __version__
from nodbot.core.sqlstore import head_revision

DEFAULT_STORE = "sqlite:///nodbot.db"

USAGE_ERROR = 2
"""The exit status of a mistake in the command line (argparse's own)."""


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
    serve.add_argument("--host", help="listen address (default: server.host of the file)")
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
    add_audit_commands(commands)
    add_sessions_commands(commands)
    add_init_command(commands)
    return parser


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
    or prints every problem to stderr and returns 1."""
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
        return 1
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
    """`approvals decide`: what is wrong with `--arguments` (a JSON object, given for an
    edit and only then), or None."""
    text, action = arguments.arguments, arguments.action
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


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; returns the exit status."""
    parser = build_parser()
    arguments = parser.parse_args(argv)
    if arguments.command == "approvals" and getattr(arguments, "principal", None) is not None:
        mistake = _decision_mistake(arguments)
        if mistake is not None:
            prog = "nodbot approvals decide"
            parser.exit(USAGE_ERROR, f"{prog}: error: {mistake} (see {prog} --help)\n")
    if arguments.command is None:
        parser.print_help(sys.stdout)
        return 0
    if arguments.command == "check-config":
        return _check_config(arguments.file)
    try:
        if arguments.command == "serve":
            _serve(arguments.config, arguments.host, arguments.port)
        elif arguments.command == "approvals":
            print(asyncio.run(run_approvals_command(arguments)))
        elif arguments.command == "runs":
            print(asyncio.run(run_runs_command(arguments)))
        elif arguments.command == "init":
            print(run_init_command(arguments))
        elif arguments.command == "sessions":
            print(asyncio.run(run_sessions_command(arguments)))
        elif arguments.command == "audit":
            return asyncio.run(run_audit_command(arguments))
        elif arguments.command == "inbox-link":
            print(sign_in_link(load_config(arguments.config), arguments.reviewer))
        else:
            print(asyncio.run(_migrate(arguments.store, arguments.key_env)))
    except ConfigError as error:
        for problem in error.problems:
            print(problem, file=sys.stderr)
        return 1
    except CannotListen as error:
        print(f"nodbot: {error}", file=sys.stderr)
        return USAGE_ERROR
    except NodbotError as error:
        print(f"nodbot: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
